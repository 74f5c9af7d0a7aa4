"""Length report: percentiles of real traffic → a `max_model_len` recommendation.

Reads the JSONL files `proxy.recording.lengthlog` writes (one `LengthRecord` per line,
see `proxy.recording.record`), possibly several (one per replica), and summarises them
per model.  Memory stays bounded whatever the file size: a record is reduced
to a few integers at once and each length distribution is an exact histogram
(value → count).  Token counts are small integers with many repeats, so the
histogram is exact — no sketch, no sampling — and its size is the number of
distinct lengths, not the number of requests.

The definitions of prompt, completion, total and sequence length and of the
percentiles are `proxy.sizing.lengths`'; the histogram is `proxy.sizing.histogram`'s.

Two views of the same records:

* **served**: what each request got.  Requests without usage (rejected,
  upstream errors, streams without `include_usage`) count for the shares and
  the prompt distribution but not for completion / total / sequence, and a
  clamped request counts with the length it was cut to.  These lengths are
  censored at the current `max_model_len`: their percentile can never rise
  above it (`served_recommendation`, kept for comparison).
* **need**: what each request really needed (`proxy.sizing.need`): exactly
  prompt + completion when it stopped by itself, at least prompt + granted
  when it was cut below its ask (right-censored), at least prompt + 1 when it
  was refused (its completion estimated from the served ones).  The
  recommendation is the product-limit estimate of its percentile in whole
  blocks, bounded by the model's own context and by what the KV cache holds,
  with its bounds and what each candidate `max_model_len` would refuse or cut.
* **asked** (`proxy.sizing.demand`): prompt + the completion limit asked.
  Agents ask 32,000 or 65,535 out of habit, so it is a column for comparison,
  never the recommendation (`asked_recommendation`).
"""

from __future__ import annotations

import gzip
import json
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import IO, Any, Literal, NamedTuple

from proxy.sizing import demand as dm
from proxy.sizing import engine
from proxy.sizing import need as nd
from proxy.sizing import pools as pl
from proxy.sizing.histogram import Histogram, percentile_key
from proxy.sizing.lengths import (
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
    endpoint: str = "chat"


def _opt_int(rec: Mapping[str, Any], key: str) -> int | None:
    v = rec.get(key)
    if v is None:
        return None
    if type(v) is not int or not 0 <= v <= MAX_PLAUSIBLE_TOKENS:
        raise MalformedRecord(f"{key} is not a plausible token count")
    return v


def _lenient_int(rec: Mapping[str, Any], key: str) -> int | None:
    """A non-negative integer field, else None (as `proxy.sizing.demand` reads records)."""
    v = rec.get(key)
    return v if type(v) is int and v >= 0 else None


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
    # brimful's own count is read (and checked) only where the upstream reported none.
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
    longest = _opt_int(rec, "longest_prompt_tokens")
    granted = _opt_int(rec, "granted_max_tokens") if n > 1 or longest is not None else None
    sequence = sequence_tokens(prompt, completion, n, granted, longest)
    assert isinstance(ts, (int, float))
    endpoint = rec.get("endpoint", "chat")
    if not isinstance(endpoint, str):
        raise MalformedRecord("endpoint is not a string")
    return Lengths(model, float(ts), action, prompt, completion, total, sequence,
                   ("length" in reasons) if reasons else None, n, endpoint)


# ---------------------------------------------------------------------------
# aggregation


@dataclass
class ModelStats:
    model: str
    requests: int = 0
    actions: dict[str, int] = field(default_factory=dict)
    endpoints: dict[str, int] = field(default_factory=dict)
    with_finish_reasons: int = 0
    finished_length: int = 0
    parallel_sampling: int = 0        # requests with n > 1
    max_model_len_seen: dict[int, int] = field(default_factory=dict)
    # value -> count; read them as `Histogram`s through the properties below
    prompt_counts: dict[int, int] = field(default_factory=dict)
    completion_counts: dict[int, int] = field(default_factory=dict)
    total_counts: dict[int, int] = field(default_factory=dict)
    sequence_counts: dict[int, int] = field(default_factory=dict)
    demand: dm.DemandTally = field(default_factory=dm.DemandTally)
    need: nd.NeedTally = field(default_factory=nd.NeedTally)
    routes: pl.RouteTally = field(default_factory=pl.RouteTally)
    reasons: dict[str, int] = field(default_factory=dict)     # not served, by proxy.sizing.demand's reason

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
        endpoints = self.endpoints
        endpoints[r.endpoint] = endpoints.get(r.endpoint, 0) + 1
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

    def add_demand(self, r: Lengths, rec: Mapping[str, Any]) -> None:
        """`proxy.sizing.demand`'s demand and reason of one record, from the fields `record_lengths` checked."""
        limit = _lenient_int(rec, "max_model_len")
        if r.prompt is not None:
            longest = _lenient_int(rec, "longest_prompt_tokens")
            asked = _lenient_int(rec, "requested_max_tokens")
            granted = _lenient_int(rec, "granted_max_tokens")
            endpoint = str(rec.get("endpoint"))
            f = dm.demand_figures(r.prompt, r.n, asked, r.completion, granted, bool(r.finished_length), endpoint,
                                  longest)
            self.demand.add_values(longest if longest is not None else r.prompt, f.sequence, f.kv_tokens,
                                   f.lower_bound, limit)
            reasons = rec.get("finish_reasons")
            kind, prompt, value, upper = nd.need_figures(r.prompt, r.n, asked, r.completion, granted,
                                                         reasons if isinstance(reasons, list) else None, endpoint,
                                                         longest, limit)
            self.need.add_values(kind, prompt, value, upper)
            latency = rec.get("latency_ms")
            seconds = latency / 1000 if isinstance(latency, (int, float)) and latency >= 0 else None
            self.routes.add(pl.route_key(prompt, asked), None if kind == "unknown" else value, prompt, seconds)
        status = rec.get("status")
        reason = dm.reason_of(rec.get("error_code"), r.action, status if type(status) is int else None,
                              _lenient_int(rec, "prompt_tokens"), limit)
        if reason is not None:
            self.reasons[reason] = self.reasons.get(reason, 0) + 1

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
        try:
            rec = json.loads(line)
        except (ValueError, RecursionError):   # JSONDecodeError is a ValueError
            self.stats.lines += 1
            self.stats.malformed += 1
            return
        self.add_record(rec)

    def add_record(self, rec: Any) -> None:
        """One decoded record (a JSON line's object, or a Parquet row as a dict)."""
        self.stats.lines += 1
        try:
            r = record_lengths(rec)
        except (ValueError, RecursionError):   # MalformedRecord is a ValueError
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
        stats.add_demand(r, rec)

    def add_file(self, path: str, progress: Callable[[str, int], None] | None = None) -> None:
        self.stats.files.append(path)
        if engine.is_parquet(path):
            for i, rec in enumerate(_parquet_rows(path), 1):
                self.add_record(rec)
                if progress is not None and i % 100_000 == 0:
                    progress(path, i)
            return
        with _open(path) as f:
            for i, line in enumerate(f, 1):
                self.add_line(line)
                if progress is not None and i % 100_000 == 0:
                    progress(path, i)


def _parquet_rows(path: str) -> Iterator[dict[str, Any]]:
    """A Parquet file's rows as dicts of plain Python values (pyarrow), batch by batch."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise OSError(f"{path}: reading Parquet needs duckdb or pyarrow: pip install 'brimful[duckdb]'") from None
    names = set(engine.FIELDS)
    pf = pq.ParquetFile(path)
    columns = [name for name in pf.schema_arrow.names if name in names]
    for batch in pf.iter_batches(columns=columns, batch_size=65_536):
        yield from batch.to_pylist()


def _open(path: str) -> IO[bytes]:
    if path == "-":
        return sys.stdin.buffer
    if path.endswith(".gz"):
        return gzip.open(path, "rb")  # type: ignore[return-value]  # typeshed: a GzipFile is no IO[bytes]
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


def model_report(stats: ModelStats, p: float = 99.0, block_size: int = BLOCK_SIZE, *,
                 model_bound: int | None = None, kv_bound: int | None = None,
                 min_completion: int = 1) -> dict[str, Any]:
    """Everything the report prints for one model, as plain data (JSON-ready).

    `model_bound` / `kv_bound` cap the recommendation (`proxy.sizing.demand.recommend_from_demand`).
    """
    extra = (p,)
    prompt, completion, total, sequence = stats.prompt, stats.completion, stats.total, stats.sequence
    served = recommend_max_model_len(sequence, p, block_size)
    seen = stats.max_model_len_seen    # the limit most records arrived under; a tie goes to the larger
    current = max(seen, key=lambda v: (seen[v], v)) if seen else None
    tally = stats.demand
    asked = dm.recommend_from_demand(tally, p, block_size, model_bound=model_bound, kv_bound=kv_bound,
                                     current=current, min_completion=min_completion)
    need = stats.need.model()       # once: imputing the unknown requests is most of the report's own time
    rec = nd.recommend_from_need(stats.need, tally, p, block_size, model_bound=model_bound, kv_bound=kv_bound,
                                 current=current, model=need)
    length_refused = stats.reasons.get("prompt_too_long", 0) + stats.reasons.get("no_room_left", 0)
    beyond = sum(c for v, c in tally.sequence.items() if current is not None and v > current)
    return {
        "model": stats.model,
        "requests": stats.requests,
        "completed": total.n,
        "actions": dict(sorted(stats.actions.items())),
        "endpoints": dict(sorted(stats.endpoints.items(), key=lambda e: (-e[1], e[0]))),
        "clamped_share": stats.share("clamped"),
        "rejected_share": stats.share("rejected"),
        "upstream_error_share": stats.share("upstream_error"),
        "rejections": dict(sorted(stats.reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        "length_finish_share": (stats.finished_length / stats.with_finish_reasons
                                if stats.with_finish_reasons else None),
        "parallel_sampling_requests": stats.parallel_sampling,
        "max_model_len_current": current,
        "prompt_tokens": prompt.summary(extra),
        "completion_tokens": completion.summary(extra),
        "total_tokens": total.summary(extra),
        "sequence_tokens": sequence.summary(extra),
        "demand_tokens": tally.sequence_histogram.summary(extra),
        "need_tokens": need.summary(extra),
        "demand_kv_tokens": tally.kv_histogram.summary(extra),
        "demand_lower_bounds": tally.lower_bounds,
        "beyond_max_model_len": beyond,
        # what the records show happened: refused for length, clamped, and really cut short
        "recorded": {"length_refused_share": length_refused / stats.requests if stats.requests else 0.0,
                     "clamped_share": stats.share("clamped"),
                     "cut_share": stats.need.censored / stats.requests if stats.requests else 0.0},
        "recommendation": None if rec is None else rec.to_dict(),
        # the old view, prompt + the completion limit asked: a column, never the recommendation
        "asked_recommendation": None if asked is None else asked.to_dict(),
        "served_recommendation": None if served is None else {
            "percentile": served.percentile,
            "sequence_tokens_at_percentile": served.value,
            "max_model_len": served.max_model_len,
            "block_size": served.block_size,
            "would_clamp": served.clamped_count,
            "would_clamp_fraction": served.clamped_fraction,
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


Engine = Literal["auto", "duckdb", "python"]


def build_report(paths: Sequence[str], model: str | None = None, since: float | None = None,
                 progress: Callable[[str, int], None] | None = None, engine_name: Engine = "python") -> ReportBuilder:
    """Read `paths` (globs expanded) with DuckDB (`proxy.sizing.engine`) or line by line in Python.

    "auto" takes DuckDB when it is installed and no path is standard input; both give the same builder.
    """
    files = engine.expand(paths)
    use_duckdb = bool(files) and (engine_name == "duckdb"
                                  or (engine_name == "auto" and engine.available() and "-" not in files))
    if use_duckdb:
        if not engine.available():
            raise OSError("--engine duckdb needs duckdb: pip install 'brimful[duckdb]'")
        if "-" in files:
            raise OSError("--engine duckdb cannot read standard input: give files, or --engine python")
        return builder_from_aggregates(engine.run_query(files, model=model, since=since), files, model, since)
    builder = ReportBuilder(model=model, since=since)
    for path in files:
        builder.add_file(path, progress)
    return builder


# ModelStats' value → count dicts by the name the engine's histogram sets feed (proxy.sizing.engine.HistogramSet)
_DICTS: dict[str, Callable[[ModelStats], dict[int, Any]]] = {
    "prompt": lambda s: s.prompt_counts, "completion": lambda s: s.completion_counts,
    "total": lambda s: s.total_counts, "sequence": lambda s: s.sequence_counts,
    "d_seq": lambda s: s.demand.sequence, "d_kv": lambda s: s.demand.kv, "d_refused": lambda s: s.demand.refused_below,
    "need_exact": lambda s: s.need.exact, "need_completion": lambda s: s.need.completions,
}


def _bump(counts: dict[Any, Any], key: Any, count: int) -> None:
    if key is not None:
        counts[key] = counts.get(key, 0) + count


def _add_small(stats: ModelStats, row: dict[str, Any], count: int) -> None:
    """One group of the engine's state set: its share of ModelStats' counters and low-cardinality dicts."""
    stats.requests += count
    _bump(stats.actions, row["action"], count)
    _bump(stats.endpoints, row["endpoint"], count)
    _bump(stats.max_model_len_seen, row["mml_seen"], count)
    _bump(stats.demand.limits, row["d_limit"], count)
    if row["reason"] is not None:
        _bump(stats.reasons, engine.REASONS[row["reason"]], count)
    stats.with_finish_reasons += count * row["has_reasons"]
    stats.finished_length += count * row["finished_length"]
    stats.parallel_sampling += count * row["parallel"]
    stats.demand.lower_bounds += count * row["d_lower"]


def _add_route(stats: ModelStats, row: dict[str, Any], count: int) -> None:
    """One group of the engine's route set: `RouteTally`'s sums, as `add_demand` makes them record by record."""
    stats.routes.add_sums(int(row["route"]), count, int(row["known_need"] or 0), int(row["unknowns"]),
                          int(row["unknown_need"] or 0), float(row["lat"] or 0.0), int(row["nlat"]))


def _model_stats(builder: ReportBuilder, name: str | None) -> ModelStats:
    name = UNKNOWN_MODEL if name is None else name      # a NULL model and "unknown" are one
    stats = builder.models.get(name)
    if stats is None:
        stats = builder.models[name] = ModelStats(name)
    return stats


def _add_state(builder: ReportBuilder, row: dict[str, Any], count: int) -> None:
    """One group of the state set, with the record's state (0 kept, 1 malformed, 2 filtered)."""
    builder.stats.lines += count
    if row["state"] == 1:
        builder.stats.malformed += count
    elif row["state"] == 2:
        builder.stats.filtered += count
    else:
        builder.stats.records += count
        _add_small(_model_stats(builder, row["model"]), row, count)


def _model_of(agg: engine.Aggregates, mc: Any) -> str | None:
    """The model of a group's `mc`: its index in the models, or the model itself."""
    return mc if agg.models is None else agg.models[int(mc)]


def _add_shared(builder: ReportBuilder, agg: engine.Aggregates, h: engine.HistogramSet,
                rows: list[tuple[Any, ...]]) -> None:
    """A shared set's groups, each of its counts into the histogram it feeds at the key + shift; the key
    packed (value × len(models) + the model's index) or the value beside the model.  Most of the engine's
    groups are these (~700k on a fleet's day), so the rows stay tuples and each feed's dicts are looked up
    once per model."""
    col = {name: i for i, name in enumerate(agg.columns)}
    k = col["k"]
    for j, (name, shift, _) in enumerate(h.feeds):
        c = col[f"c{j}"]
        counts: dict[Any, dict[int, Any]] = {}
        for row in rows:
            count = row[c]
            if not count:
                continue
            if agg.models is None:
                value, model = int(row[k]), row[col["mc"]]
            else:
                value, index = divmod(row[k], len(agg.models))
                model = agg.models[index]
            d = counts.get(model)
            if d is None:
                d = counts[model] = _DICTS[name](_model_stats(builder, model))
            key = value + shift
            d[key] = d.get(key, 0) + count


def _add_need(stats: ModelStats, row: dict[str, Any], count: int) -> None:
    """One group of the need's cut (kind 1) or unknown (kind 2) requests: `NeedTally.add_values`' tuples."""
    single, upper = int(row["single"]), int(row["need_upper"])
    if row["need_kind"] == 1:
        _bump(stats.need.cut, (single, int(row["need_value"]), upper), count)
    else:
        _bump(stats.need.unknown, (single, upper), count)


def builder_from_aggregates(agg: engine.Aggregates, files: Sequence[str], model: str | None,
                            since: float | None) -> ReportBuilder:
    """The `ReportBuilder` the Python reader would have built from the same records, from DuckDB's counts."""
    builder = ReportBuilder(model=model, since=since)
    builder.stats.files.extend(files)
    shared = engine.shared_sets(agg.min_completion)
    keyed: list[list[tuple[Any, ...]]] = [[] for _ in shared]
    g_at = agg.columns.index("g")
    for values in agg.rows:
        g = values[g_at]
        if g >= engine.SHARED:
            keyed[g - engine.SHARED].append(values)
            continue
        row = dict(zip(agg.columns, values, strict=True))
        if g == engine.STATE:
            _add_state(builder, row, row["c0"])
        elif g == engine.ROUTE:
            _add_route(_model_stats(builder, _model_of(agg, row["mc"])), row, row["c0"])
        elif g == engine.NEED:
            _add_need(_model_stats(builder, _model_of(agg, row["mc"])), row, row["c0"])
        elif g == engine.REST:
            stats = _model_stats(builder, _model_of(agg, row["mc"]))
            for i, (name, _, _) in enumerate(engine.rest_sets(agg.min_completion)):
                for value, count in (row[f"h{i}"] or {}).items():
                    _bump(_DICTS[name](stats), int(value), count)
    for h, rows in zip(shared, keyed, strict=True):
        _add_shared(builder, agg, h, rows)
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
