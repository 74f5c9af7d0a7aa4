"""Length report: percentiles of real traffic → a `max_model_len` recommendation.

Reads the JSONL files `proxy.lengthlog` writes (one `LengthRecord` per line,
see `proxy.record`), possibly several (one per replica), and summarises them
per model.  Memory stays bounded whatever the file size: a record is reduced
to a few integers at once and each length distribution is an exact histogram
(value → count).  Token counts are small integers with many repeats, so the
histogram is exact — no sketch, no sampling — and its size is the number of
distinct lengths, not the number of requests.

The definitions of prompt, completion, total and sequence length, of the
percentiles and of the recommendation are `proxy.lengths`'.  The
`clamped_fraction` of a recommendation is the share of the completed requests
whose sequence exceeds it: those would have been clamped (or rejected,
without headroom) at that setting.

Requests without usage (rejected, upstream errors, streams without
`include_usage`) count for the shares and the prompt distribution but not for
completion / total / sequence.  Clamped requests count with the lengths they
actually had, which understates what their clients wanted; the clamped share
and the share finishing with "length" say how much that matters.
"""

from __future__ import annotations

import bisect
import gzip
import json
import math
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, NamedTuple

from .lengths import (
    BLOCK_SIZE,
    MAX_PLAUSIBLE_TOKENS,
    UNKNOWN_MODEL,
    effective_prompt_tokens,
    percentile,
    round_to_blocks,
    round_up,
    sequence_tokens,
    total_tokens,
)

STANDARD_PERCENTILES = (50.0, 90.0, 95.0, 99.0)




class Histogram:
    """An exact multiset of integer lengths: value → count.

    Only the dict is updated per value (the hot path of a million-line
    report); sorted order, count and sum are derived once when asked for.
    """

    __slots__ = ("_index_cache", "counts")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self.counts: dict[int, int] = {}
        self._index_cache: tuple[list[int], list[int], int] | None = None
        for v in values:
            self.add(v)

    @classmethod
    def of_counts(cls, counts: dict[int, int]) -> Histogram:
        """A view of an existing value → count dict (not copied)."""
        h = cls()
        h.counts = counts
        return h

    def add(self, value: int, count: int = 1) -> None:
        self.counts[value] = self.counts.get(value, 0) + count
        self._index_cache = None

    def merge(self, other: Histogram) -> None:
        for value, count in other.counts.items():
            self.add(value, count)

    def _index(self) -> tuple[list[int], list[int], int]:
        """Sorted distinct values, the cumulative count up to each, and the sum."""
        cache = self._index_cache
        if cache is None:
            values = sorted(self.counts)
            cumulative: list[int] = []
            running = total = 0
            for v in values:
                c = self.counts[v]
                running += c
                total += v * c
                cumulative.append(running)
            cache = self._index_cache = (values, cumulative, total)
        return cache

    @property
    def n(self) -> int:
        cumulative = self._index()[1]
        return cumulative[-1] if cumulative else 0

    @property
    def total(self) -> int:
        return self._index()[2]

    def value_at(self, rank: int) -> int:
        """The value at 0-based position `rank` of the sorted multiset."""
        values, cumulative, _ = self._index()
        return values[bisect.bisect_right(cumulative, rank)]

    def percentile(self, p: float) -> float:
        """Same definition as `percentile` (numpy linear), without expanding the values."""
        n = self.n
        if n == 0:
            raise ValueError("percentile of an empty histogram")
        if not 0 <= p <= 100:
            raise ValueError(f"percentile must be within [0, 100], got {p}")
        h = (n - 1) * p / 100
        lo = math.floor(h)
        a = self.value_at(lo)
        b = self.value_at(min(lo + 1, n - 1))
        return a + (h - lo) * (b - a)

    def count_above(self, threshold: float) -> int:
        values, cumulative, _ = self._index()
        i = bisect.bisect_right(values, threshold)
        return self.n - (cumulative[i - 1] if i else 0)

    @property
    def mean(self) -> float:
        n = self.n
        return self.total / n if n else 0.0

    @property
    def max(self) -> int:
        return max(self.counts) if self.counts else 0

    def summary(self, extra: Sequence[float] = ()) -> dict[str, float | int | None]:
        """count, mean, p50/p90/p95/p99 (+ extra), max — None when empty."""
        keys = sorted(set(STANDARD_PERCENTILES) | set(extra))
        out: dict[str, float | int | None] = {"count": self.n}
        out["mean"] = self.mean if self.n else None
        for p in keys:
            out[percentile_key(p)] = self.percentile(p) if self.n else None
        out["max"] = self.max if self.n else None
        return out


def percentile_key(p: float) -> str:
    """'p99', 'p99.9': the JSON key of a percentile."""
    return f"p{p:g}"


@dataclass(frozen=True)
class Recommendation:
    percentile: float
    value: float              # the percentile of sequence lengths
    max_model_len: int        # rounded up to the block size
    block_size: int
    clamped_count: int        # past requests longer than max_model_len
    clamped_fraction: float



def recommend_max_model_len(lengths: Histogram, p: float = 99.0, block_size: int = BLOCK_SIZE) -> Recommendation | None:
    """max_model_len = p-th percentile of sequence lengths, rounded up to whole blocks."""
    if lengths.n == 0:
        return None
    value = lengths.percentile(p)
    mml = round_to_blocks(value, block_size)
    assert mml is not None
    above = lengths.count_above(mml)
    return Recommendation(p, value, mml, block_size, above, above / lengths.n)


# ---------------------------------------------------------------------------
# records


class MalformedRecord(ValueError):
    pass


class Lengths(NamedTuple):
    """The numbers of one record the report needs (a tuple: made a million times)."""

    model: str
    ts: float
    action: str
    prompt: int | None
    completion: int | None
    total: int | None
    sequence: int | None
    finished_length: bool | None   # None: no finish reasons recorded
    n: int


def _opt_int(rec: Mapping[str, Any], key: str) -> int | None:
    v = rec.get(key)
    if v is None:
        return None
    if type(v) is not int or not 0 <= v <= MAX_PLAUSIBLE_TOKENS:
        raise MalformedRecord(f"{key} is not a plausible token count")
    return v


def record_lengths(rec: Any) -> Lengths:
    """Reduce one decoded JSON line to `Lengths` (see the module docstring)."""
    if not isinstance(rec, dict):
        raise MalformedRecord("not a JSON object")
    ts = rec.get("ts")
    if type(ts) not in (int, float):
        raise MalformedRecord("ts is not a number")
    model = rec.get("model")
    if model is None:
        model = UNKNOWN_MODEL
    elif not isinstance(model, str):
        raise MalformedRecord("model is not a string")
    n = rec.get("n", 1)
    if n is None:
        n = 1
    if type(n) is not int or n < 1:
        raise MalformedRecord("n is not a positive integer")
    upstream_prompt = _opt_int(rec, "upstream_prompt_tokens")
    # headroom's own count is read (and checked) only where the upstream reported none.
    prompt = effective_prompt_tokens(
        _opt_int(rec, "prompt_tokens") if upstream_prompt is None else None, upstream_prompt
    )
    completion = _opt_int(rec, "completion_tokens")
    action = rec.get("action", "pass")
    if not isinstance(action, str):
        raise MalformedRecord("action is not a string")
    reasons = rec.get("finish_reasons") or []
    if not isinstance(reasons, list):
        raise MalformedRecord("finish_reasons is not a list")
    total = total_tokens(prompt, completion)
    sequence = sequence_tokens(prompt, completion, n, _opt_int(rec, "granted_max_tokens") if n > 1 else None)
    assert isinstance(ts, (int, float))
    return Lengths(model, float(ts), action, prompt, completion, total, sequence,
                   ("length" in reasons) if reasons else None, n)


# ---------------------------------------------------------------------------
# aggregation


@dataclass
class ModelStats:
    model: str
    requests: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    with_finish_reasons: int = 0
    finished_length: int = 0
    parallel_sampling: int = 0        # requests with n > 1
    max_model_len_seen: dict[int, int] = field(default_factory=dict)
    # value -> count; read them as `Histogram`s through the properties below
    prompt_counts: dict[int, int] = field(default_factory=dict)
    completion_counts: dict[int, int] = field(default_factory=dict)
    total_counts: dict[int, int] = field(default_factory=dict)
    sequence_counts: dict[int, int] = field(default_factory=dict)

    @property
    def prompt(self) -> Histogram:
        return Histogram.of_counts(self.prompt_counts)

    @property
    def completion(self) -> Histogram:
        return Histogram.of_counts(self.completion_counts)

    @property
    def total(self) -> Histogram:
        return Histogram.of_counts(self.total_counts)

    @property
    def sequence(self) -> Histogram:
        return Histogram.of_counts(self.sequence_counts)

    def add(self, r: Lengths, max_model_len: Any = None) -> None:
        # Dict updates written out (not Histogram.add): this runs per record.
        self.requests += 1
        actions = self.actions
        actions[r.action] = actions.get(r.action, 0) + 1
        if r.finished_length is not None:
            self.with_finish_reasons += 1
            self.finished_length += r.finished_length
        if r.n > 1:
            self.parallel_sampling += 1
        if type(max_model_len) is int:
            seen = self.max_model_len_seen
            seen[max_model_len] = seen.get(max_model_len, 0) + 1
        if r.prompt is not None:
            c = self.prompt_counts
            c[r.prompt] = c.get(r.prompt, 0) + 1
        if r.completion is not None:
            c = self.completion_counts
            c[r.completion] = c.get(r.completion, 0) + 1
        if r.total is not None and r.sequence is not None:   # both known exactly when prompt and completion are
            c = self.total_counts
            c[r.total] = c.get(r.total, 0) + 1
            c = self.sequence_counts
            c[r.sequence] = c.get(r.sequence, 0) + 1

    def share(self, action: str) -> float:
        return self.actions.get(action, 0) / self.requests if self.requests else 0.0


@dataclass
class ReadStats:
    files: list[str] = field(default_factory=list)
    lines: int = 0
    records: int = 0
    malformed: int = 0
    filtered: int = 0          # valid records left out by --model / --since


class ReportBuilder:
    """Feed lines (from any number of files); read `stats` and `models` at the end."""

    def __init__(self, model: str | None = None, since: float | None = None) -> None:
        self.model = model
        self.since = since
        self.stats = ReadStats()
        self.models: dict[str, ModelStats] = {}

    def add_line(self, line: bytes | str) -> None:
        if line.isspace() or not line:
            return   # blank lines are not records
        self.stats.lines += 1
        try:
            rec = json.loads(line)
            r = record_lengths(rec)
        except (ValueError, RecursionError):   # JSONDecodeError and MalformedRecord are ValueErrors
            self.stats.malformed += 1
            return
        if (self.model is not None and r.model != self.model) or (self.since is not None and r.ts < self.since):
            self.stats.filtered += 1
            return
        self.stats.records += 1
        stats = self.models.get(r.model)
        if stats is None:
            stats = self.models[r.model] = ModelStats(r.model)
        stats.add(r, rec.get("max_model_len"))

    def add_file(self, path: str, progress: Callable[[str, int], None] | None = None) -> None:
        self.stats.files.append(path)
        with _open(path) as f:
            for i, line in enumerate(f, 1):
                self.add_line(line)
                if progress is not None and i % 100_000 == 0:
                    progress(path, i)


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    if path.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


# ---------------------------------------------------------------------------
# time filter


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_since(text: str, now: float) -> float:
    """--since: '24h' / '30m' / '7d' (relative to now), unix seconds, or an ISO time.

    An ISO time without a zone is read as UTC, because the records' `ts` are
    unix times and the report must not depend on the machine's zone.
    """
    s = text.strip()
    if len(s) >= 2 and s[-1].lower() in _UNITS:
        try:
            return now - float(s[:-1]) * _UNITS[s[-1].lower()]
        except ValueError:
            pass
    try:
        return float(s)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(s.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"cannot read --since {text!r}: use 24h, 7d, unix seconds or an ISO time") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


# ---------------------------------------------------------------------------
# result


def model_report(stats: ModelStats, p: float = 99.0, block_size: int = BLOCK_SIZE) -> dict[str, Any]:
    """Everything the report prints for one model, as plain data (JSON-ready)."""
    extra = (p,)
    prompt, completion, total, sequence = stats.prompt, stats.completion, stats.total, stats.sequence
    rec = recommend_max_model_len(sequence, p, block_size)
    current = max(stats.max_model_len_seen, key=stats.max_model_len_seen.__getitem__) \
        if stats.max_model_len_seen else None
    return {
        "model": stats.model,
        "requests": stats.requests,
        "completed": total.n,
        "actions": dict(sorted(stats.actions.items())),
        "clamped_share": stats.share("clamped"),
        "rejected_share": stats.share("rejected"),
        "upstream_error_share": stats.share("upstream_error"),
        "length_finish_share": (stats.finished_length / stats.with_finish_reasons
                                if stats.with_finish_reasons else None),
        "parallel_sampling_requests": stats.parallel_sampling,
        "max_model_len_current": current,
        "prompt_tokens": prompt.summary(extra),
        "completion_tokens": completion.summary(extra),
        "total_tokens": total.summary(extra),
        "sequence_tokens": sequence.summary(extra),
        "recommendation": None if rec is None else {
            "percentile": rec.percentile,
            "sequence_tokens_at_percentile": rec.value,
            "max_model_len": rec.max_model_len,
            "block_size": rec.block_size,
            "would_clamp": rec.clamped_count,
            "would_clamp_fraction": rec.clamped_fraction,
        },
    }


class Progress:
    """'\\r<file>: N lines' on stderr, only when stderr is a terminal."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self.started = time.monotonic()

    def __call__(self, path: str, lines: int) -> None:
        if self.enabled:
            self.stream.write(f"\r{path}: {lines:,} lines ({time.monotonic() - self.started:.1f} s)")
            self.stream.flush()

    def done(self) -> None:
        if self.enabled:
            self.stream.write("\r\033[K")
            self.stream.flush()


def build_report(paths: Sequence[str], model: str | None = None, since: float | None = None,
                 progress: Callable[[str, int], None] | None = None) -> ReportBuilder:
    builder = ReportBuilder(model=model, since=since)
    for path in paths:
        builder.add_file(path, progress)
    return builder


def iter_models(builder: ReportBuilder) -> Iterator[ModelStats]:
    """Models by request count, busiest first (ties by name)."""
    return iter(sorted(builder.models.values(), key=lambda s: (-s.requests, s.model)))


__all__ = [
    "Histogram", "Lengths", "MalformedRecord", "ModelStats", "Progress", "ReadStats",
    "Recommendation", "ReportBuilder", "build_report", "iter_models", "model_report",
    "parse_since", "percentile", "percentile_key", "recommend_max_model_len",
    "record_lengths", "round_up",
]
