"""The `Recorder` every finished request is reported to, and the recent window behind /stats.

The exchange calls `Recorder.record(rec)` once per request, from the event
loop, after the response ended.  On the loop the record is applied with the
others that end in the same turn of the loop (one `call_soon` for the lot):
applied one at a time between requests, the records cost a 197-byte chat
~19 µs more of the proxy's CPU (236 against 217 µs, docs/performance.md).  Every reader
(`stats`, `render_metrics`, `demand_kv_percentile`, `close`, the workers' shares) applies
what is pending first, so nothing read misses a finished request.  Applying fans out to:

* Prometheus metrics (`proxy.recording.metrics`): long-term, aggregated by Prometheus;
* a recent window per model, kept in memory as numbers only, for `/stats` and
  the dashboard (`proxy.recording.stats`): "what does traffic look like right now", with
  exact percentiles instead of bucket interpolation;
* the record file (`proxy.recording.lengthlog`), if configured: the raw data for
  `proxy.sizing.report`'s offline sizing.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from proxy.recording.lengthlog import LengthLog
from proxy.recording.metrics import OTHER_MODEL, Metrics, safe_label
from proxy.recording.otel import Telemetry
from proxy.recording.record import LengthRecord
from proxy.recording.stats import Sample, model_stats, sample_of
from proxy.sizing.lengths import percentile
from proxy.sizing.live import ModelSizing

logger = logging.getLogger("brimful.recorder")

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

    def samples(self, model: str, now: float) -> list[Sample]:
        """One model's samples (a copy of its window only)."""
        cutoff = -math.inf if self.max_age_s is None else now - self.max_age_s
        with self._lock:
            window = self._windows.get(model)
            copy = list(window) if window is not None else []
        return [s for s in copy if s.ts >= cutoff]

    def _expire(self, window: deque[Sample], now: float) -> None:
        # Records end out of arrival order, so this trims approximately; snapshot() filters exactly.
        if self.max_age_s is None:
            return
        cutoff = now - self.max_age_s
        while window and window[0].ts < cutoff:
            window.popleft()


def demand_kv_percentile(samples: Iterable[Sample], p: float = 95.0) -> float | None:
    """The p-th percentile of the demanded KV tokens per request among `samples` (None: no demand)."""
    values = sorted(s.demanded_kv for s in samples if s.demanded_kv is not None)
    return percentile(values, p) if values else None


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
        # How each model is counted (proxy.admitted.trust), for /stats; set by the app.
        self.counting: Callable[[], dict[str, dict[str, Any]]] = dict
        # What bounds each model's recommendation beyond its traffic (proxy.sizing.live); set by the app.
        self.sizing: Callable[[str], ModelSizing] = lambda model: ModelSizing()
        self.records = 0        # finished requests recorded since start (/stats per worker)
        self._pending: deque[tuple[LengthRecord, str | None]] = deque()   # recorded, not yet applied
        self._flush_scheduled = False
        self._apply_lock = threading.Lock()
        self.telemetry: Telemetry | None = None     # [otel] enabled: set at start-up, in the serving process
        if lengthlog is not None:
            self.attach_lengthlog(lengthlog)

    def attach_lengthlog(self, lengthlog: LengthLog) -> None:
        """Start writing records to a file (done at start-up, inside the serving process)."""
        self.lengthlog = lengthlog
        self.metrics.attach_lengthlog(lengthlog.stats)

    def record(self, rec: LengthRecord, count_source: str | None = None) -> None:
        """Account one finished request.  Cheap and non-blocking: safe on the event loop.

        On a running loop the record waits for the end of this turn of the loop
        (`flush`, scheduled once for all that end in it); elsewhere it is applied
        at once.  `count_source` (local | upstream | margin) is for the telemetry.
        """
        self._pending.append((rec, count_source))
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()
            return
        if not self._flush_scheduled:
            self._flush_scheduled = True
            loop.call_soon(self.flush)

    def flush(self) -> None:
        """Apply every record still pending (from any thread; one at a time)."""
        self._flush_scheduled = False
        pending = self._pending
        with self._apply_lock:
            while pending:
                rec, count_source = pending.popleft()
                try:
                    self._apply(rec, count_source)
                except Exception:  # recording must never fail a request, nor lose the records after it
                    logger.exception("could not record a request's length figures")

    def _apply(self, rec: LengthRecord, count_source: str | None) -> None:
        """The record file first: a fault in the aggregates must not lose the raw record as well."""
        if self.lengthlog is not None:
            self.lengthlog.enqueue(rec)
        if self.telemetry is not None:
            self.telemetry.observe(rec, count_source)
        self.metrics.observe(rec)
        self.records += 1
        self.window.add(safe_label(rec.model), sample_of(rec), self.clock())

    def render_metrics(self, accept: str | None = None) -> tuple[bytes, str]:
        """GET /metrics' body and content type, with every finished request in it."""
        self.flush()
        return self.metrics.render(accept)

    def count_length_retry(self, model: str | None) -> None:
        self.metrics.count_length_retry(model)

    def count_pool_route(self, model: str, upstream: str, max_model_len: int) -> None:
        self.metrics.count_pool_route(model, upstream, max_model_len)

    def count_pool_fallback(self, model: str, from_upstream: str, to_upstream: str) -> None:
        self.metrics.count_pool_fallback(model, from_upstream, to_upstream)

    def stats(self, snapshot: Mapping[str, Sequence[Sample]] | None = None,
              counting: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
        """The /stats document: per model, the recent window's figures.

        `snapshot` and `counting` replace this process's window and counting
        state (the merge of every worker's, proxy.workers.pages).
        """
        self.flush()
        now = self.clock()
        if snapshot is None:
            snapshot = self.window.snapshot(now)
        return {
            "generated_at": now,
            "window": {"max_records": self.window.max_records, "max_age_s": self.window.max_age_s},
            "models": [model_stats(m, snapshot[m], self.sizing(m)) for m in sorted(snapshot) if snapshot[m]],
            "counting": self.counting() if counting is None else counting,
        }

    def demand_kv_percentile(self, model: str, p: float = 95.0) -> float | None:
        """The p-th percentile of the demanded KV tokens per request in the recent window (None: no demand)."""
        self.flush()
        return demand_kv_percentile(self.window.samples(safe_label(model), self.clock()), p)

    def close(self) -> None:
        self.flush()
        if self.lengthlog is not None:
            self.lengthlog.close()
        if self.telemetry is not None:
            self.telemetry.close()
