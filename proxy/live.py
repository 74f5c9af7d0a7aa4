"""Live view of the traffic: the `Recorder` the app feeds, and /metrics, /stats, /dashboard.

The app calls `Recorder.record(rec)` once per request, from the event loop,
after the response ended.  That one call fans out to:

* Prometheus metrics (`proxy.metrics`) — long-term, aggregated by Prometheus;
* a recent window per model, kept in memory as numbers only, for `/stats` and
  the dashboard — "what does traffic look like right now", with exact
  percentiles instead of bucket interpolation;
* the record file (`proxy.lengthlog`), if configured — the raw data for
  `proxy.report`'s offline sizing.

The percentile and histogram code here is small and pure on purpose: `/stats`
answers from it, and the dashboard draws exactly the bins `/stats` returns.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable, Iterable, NamedTuple, Sequence

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from .lengthlog import LengthLog
from .metrics import OTHER_MODEL, Metrics, effective_prompt_tokens, safe_label
from .record import LengthRecord
from .report import percentile  # one definition of percentiles (numpy's "linear")

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)
KV_BLOCK_SIZE = 16          # vLLM's default block size: a max_model_len off this grid wastes slots
_NO_STORE = {"Cache-Control": "no-store"}


def _display_edges(top_exponent: int = 21) -> tuple[int, ...]:
    """Bin edges for the dashboard: 0, 1, 2, 4, 8, then 2^k and 1.5·2^k up to 2^21.

    Token lengths span five orders of magnitude, so equal-width bins would put
    all traffic into one bar; doubling bins with a midpoint keep ~2 bars per
    octave and edges a human reads at a glance (1024, 1536, 2048, …).
    """
    edges = [0, 1, 2, 4, 8]
    for k in range(4, top_exponent):
        edges += [2**k, 3 * 2 ** (k - 1)]
    edges.append(2**top_exponent)
    return tuple(sorted(set(edges)))


DISPLAY_EDGES: tuple[int, ...] = _display_edges()


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------

def histogram(values: Iterable[float], edges: Sequence[float] = DISPLAY_EDGES) -> dict[str, list[Any]]:
    """Counts per bin [edges[i], edges[i+1]), trimmed to the first..last non-empty bin.

    The last bin is open-ended (its upper edge is null): a value beyond every
    edge is still counted, never lost.  Returns {"edges": [...], "counts": [...]}
    with len(edges) == len(counts) + 1.
    """
    counts = [0] * len(edges)
    for v in values:
        counts[max(0, bisect.bisect_right(edges, v) - 1)] += 1
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return {"edges": [], "counts": []}
    first, last = used[0], used[-1]
    uppers = [*edges[first + 1 : last + 1], edges[last + 1] if last + 1 < len(edges) else None]
    return {"edges": [edges[first], *uppers], "counts": counts[first : last + 1]}


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """count, p50/p90/p95/p99, max and the display histogram of one length series."""
    ordered = sorted(values)
    summary: dict[str, Any] = {"count": len(ordered)}
    for q in PERCENTILES:
        summary[f"p{q}"] = _number(percentile(ordered, q)) if ordered else None
    summary["max"] = ordered[-1] if ordered else None
    summary["histogram"] = histogram(ordered)
    return summary


def recommend_max_model_len(p99_total: float | None, multiple: int = KV_BLOCK_SIZE) -> int | None:
    """The p99 of prompt + completion, rounded up to a whole number of KV blocks."""
    if p99_total is None:
        return None
    return max(multiple, math.ceil(p99_total / multiple) * multiple)


def _number(x: float) -> float | int:
    """Keep integral results integral in JSON (2048, not 2048.0)."""
    return int(x) if float(x).is_integer() else round(x, 3)


class Sample(NamedTuple):
    """What the recent window keeps of a record: numbers and flags, never text."""

    ts: float
    prompt: int | None
    completion: int | None
    action: str
    finish_length: bool | None   # None: no finish reason known (error, rejection)
    max_model_len: int | None


def sample_of(rec: LengthRecord) -> Sample:
    reasons = rec.finish_reasons
    return Sample(
        ts=rec.ts,
        prompt=effective_prompt_tokens(rec),
        completion=rec.completion_tokens,
        action=rec.action,
        finish_length=("length" in reasons) if reasons else None,
        max_model_len=rec.max_model_len,
    )


def model_stats(model: str, samples: Sequence[Sample]) -> dict[str, Any]:
    """The /stats entry for one model over its recent samples."""
    prompts = [s.prompt for s in samples if s.prompt is not None]
    completions = [s.completion for s in samples if s.completion is not None]
    totals = [s.prompt + s.completion for s in samples if s.prompt is not None and s.completion is not None]
    actions = {a: 0 for a in ("pass", "clamped", "rejected", "upstream_error")}
    for s in samples:
        actions[s.action] = actions.get(s.action, 0) + 1
    finished = [s.finish_length for s in samples if s.finish_length is not None]
    cut = sum(finished)
    limits = [s.max_model_len for s in samples if s.max_model_len is not None]
    total = summarize(totals)
    return {
        "model": model,
        "count": len(samples),
        "actions": actions,
        "clamped": actions["clamped"],
        "rejected": actions["rejected"],
        "upstream_errors": actions["upstream_error"],
        # Requests with at least one choice cut by the completion limit, among those that finished.
        "finish_length": {"requests": cut, "finished": len(finished),
                          "share": round(cut / len(finished), 4) if finished else None},
        "max_model_len": limits[-1] if limits else None,
        "prompt_tokens": summarize(prompts),
        "completion_tokens": summarize(completions),
        "total_tokens": total,
        "recommended_max_model_len": recommend_max_model_len(total["p99"]),
    }


# ---------------------------------------------------------------------------
# The recent window and the Recorder
# ---------------------------------------------------------------------------

class RecentWindow:
    """Per model, the last `max_records` samples no older than `max_age_s` seconds.

    Memory is bounded by max_models × max_records small tuples; models past
    `max_models` share one `other` window.
    """

    def __init__(self, max_records: int = 10_000, max_age_s: float | None = 3600.0, max_models: int = 64) -> None:
        self.max_records = max_records
        self.max_age_s = max_age_s
        self.max_models = max_models
        self._windows: dict[str, deque[Sample]] = {}
        self._lock = threading.Lock()   # /stats may be computed on another thread

    def add(self, model: str, sample: Sample, now: float) -> None:
        with self._lock:
            window = self._windows.get(model)
            if window is None:
                if len(self._windows) >= self.max_models:
                    model = OTHER_MODEL
                window = self._windows.setdefault(model, deque(maxlen=self.max_records))
            window.append(sample)
            self._expire(window, now)

    def snapshot(self, now: float) -> dict[str, list[Sample]]:
        cutoff = -math.inf if self.max_age_s is None else now - self.max_age_s
        with self._lock:
            copies = {m: list(w) for m, w in self._windows.items()}
        return {m: [s for s in samples if s.ts >= cutoff] for m, samples in copies.items()}

    def _expire(self, window: deque[Sample], now: float) -> None:
        # Records end out of arrival order, so this trims approximately; snapshot() filters exactly.
        if self.max_age_s is None:
            return
        cutoff = now - self.max_age_s
        while window and window[0].ts < cutoff:
            window.popleft()


class Recorder:
    """The one object the app reports finished requests to."""

    def __init__(
        self,
        metrics: Metrics | None = None,
        lengthlog: LengthLog | None = None,
        *,
        window_records: int = 10_000,
        window_seconds: float | None = 3600.0,
        max_models: int = 64,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.metrics = metrics if metrics is not None else Metrics(max_models=max_models)
        self.lengthlog = lengthlog
        self.window = RecentWindow(window_records, window_seconds, max_models)
        self.clock = clock
        if lengthlog is not None:
            self.attach_lengthlog(lengthlog)

    def attach_lengthlog(self, lengthlog: LengthLog) -> None:
        """Start writing records to a file (done at start-up, inside the serving process)."""
        self.lengthlog = lengthlog
        self.metrics.attach_lengthlog(lengthlog.stats)

    def record(self, rec: LengthRecord) -> None:
        """Account one finished request.  Cheap and non-blocking: safe on the event loop."""
        self.metrics.observe(rec)
        self.window.add(safe_label(rec.model), sample_of(rec), self.clock())
        if self.lengthlog is not None:
            self.lengthlog.enqueue(rec)

    def count_length_retry(self, model: str | None) -> None:
        self.metrics.count_length_retry(model)

    def stats(self) -> dict[str, Any]:
        """The /stats document: per model, the recent window's figures."""
        now = self.clock()
        snapshot = self.window.snapshot(now)
        return {
            "generated_at": now,
            "window": {"max_records": self.window.max_records, "max_age_s": self.window.max_age_s},
            "models": [model_stats(m, snapshot[m]) for m in sorted(snapshot) if snapshot[m]],
        }

    def close(self) -> None:
        if self.lengthlog is not None:
            self.lengthlog.close()

    def routes(self) -> list[Route]:
        return routes(self)


# ---------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------

_DASHBOARD_PATH = Path(__file__).with_name("dashboard.html")
_dashboard_html: str | None = None


def dashboard_html() -> str:
    """The self-contained dashboard page (read once; it has no external resources)."""
    global _dashboard_html
    if _dashboard_html is None:
        _dashboard_html = _DASHBOARD_PATH.read_text(encoding="utf-8")
    return _dashboard_html


def routes(recorder: Recorder) -> list[Route]:
    """GET /metrics, /stats and /dashboard for the app to mount."""

    async def metrics_endpoint(request: Request) -> Response:
        body, content_type = recorder.metrics.render(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    async def stats_endpoint(request: Request) -> Response:
        # Sorting a few full windows takes milliseconds: keep it off the event loop.
        return JSONResponse(await run_in_threadpool(recorder.stats), headers=_NO_STORE)

    async def dashboard_endpoint(request: Request) -> Response:
        return HTMLResponse(dashboard_html(), headers=_NO_STORE)

    return [
        Route("/metrics", metrics_endpoint, methods=["GET"], name="metrics"),
        Route("/stats", stats_endpoint, methods=["GET"], name="stats"),
        Route("/dashboard", dashboard_endpoint, methods=["GET"], name="dashboard"),
    ]
