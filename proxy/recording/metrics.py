"""Prometheus metrics for brimful's length decisions, one registry per app.

Every app instance owns a `Metrics` with its own `CollectorRegistry` (tests
build many apps in one process; the global default registry would refuse the
second set of names).  `Metrics.observe(rec)` turns one `LengthRecord` into
metric updates; `render()` is the body of `GET /metrics`.

Cost matters: `observe` runs on the event loop once per request.  With
prometheus_client's `Histogram` (a linear scan of ~60 bounds under a lock, plus
a locked `.labels()` lookup) one record cost ~40 µs; the `TokenHistogram` below
(bisect + list increment, counted at scrape time) and cached counter children
bring it to a few µs.

The token histograms use much finer buckets than vLLM's own
`vllm:request_prompt_tokens` / `vllm:request_generation_tokens`, whose
`build_1_2_5_buckets` ladder (1, 2, 5, 10, 20, 50, …, 10000, 20000, 50000, …)
has only 6 bounds between 1k and 128k: a p99 that falls between 20,000 and
50,000 can only be interpolated across a 30,000-token gap, useless for sizing
`max_model_len`.  See `token_buckets()` for the ladder used here.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from proxy.errors import ErrorCode
from proxy.recording.lengthlog import LengthLogStats
from proxy.recording.record import Action, LengthRecord
from proxy.sizing.lengths import UNKNOWN_MODEL, effective_prompt_tokens, total_tokens

# Context sizes operators actually configure as --max-model-len (powers of two,
# Qwen3's 40960, the "128k" of model cards): having them as exact bucket bounds
# makes "share of requests that fit in N" a bucket read, not an interpolation.
CONTEXT_SIZES: tuple[int, ...] = (
    1024, 2048, 4096, 8192, 16384, 32768, 40960, 65536, 128000, 131072, 262144,
)

# brimful count − upstream usage count: 0 when the counts agree (the goal);
# small offsets show a template/special-token mismatch, large ones a wrong tokenizer.
DRIFT_BUCKETS: tuple[float, ...] = (
    -1024, -256, -64, -16, -8, -4, -2, -1, 0, 1, 2, 4, 8, 16, 64, 256, 1024,
)

# Upstream error codes (as mapped by proxy.upstream.explain) that mean "too long".
LENGTH_ERROR_CODES: frozenset[ErrorCode] = frozenset({ErrorCode.CONTEXT_LENGTH_EXCEEDED})

# The largest magnitude observed as it is (2**53: every integer up to it is an exact
# float).  A client may send max_tokens = 10**400, which no float holds: such a
# value is observed as this bound, so count and sum stay in step and finite.
MAX_OBSERVED = float(2**53)

MAX_LABEL_CHARS = 128
OTHER_MODEL = "other"


def token_buckets(
    start: int = 16,
    stop: int = 131072,
    ratio: float = 1.25,
    extra: Iterable[float] = (1, 2, 4, 8, *CONTEXT_SIZES),
) -> tuple[float, ...]:
    """Histogram bounds: a geometric ladder ×`ratio` from `start` to `stop`, plus `extra`.

    Why ×1.25: Prometheus' `histogram_quantile` interpolates linearly inside a
    bucket, so its error is at most the bucket's width.  With ×1.25 steps that
    is ≤ 25 % of the value anywhere on the ladder (≤ ~12 % typically), where a
    1-2-5 ladder can be off by 150 %.  From 1k to 128k this gives ~22 ladder
    bounds plus the `CONTEXT_SIZES`, ~33 in all versus vLLM's 6, at a cost of
    ~60 series per histogram and model, which a Prometheus server shrugs off.
    """
    if start <= 0 or ratio <= 1 or stop < start:
        raise ValueError("token_buckets needs start > 0, ratio > 1 and stop >= start")
    bounds = set(float(x) for x in extra)
    value = float(start)
    while value <= stop * (1 + 1e-9):
        bounds.add(float(round(value)))
        value *= ratio
    bounds.add(float(stop))
    return tuple(sorted(bounds))


DEFAULT_TOKEN_BUCKETS: tuple[float, ...] = token_buckets()


def safe_label(value: object, limit: int = MAX_LABEL_CHARS) -> str:
    """A label value that cannot break the exposition or a query: no control characters, capped."""
    if value is None:
        return UNKNOWN_MODEL
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else "_" for ch in text)
    return text[:limit] if text else UNKNOWN_MODEL



def bounded(value: float) -> float:
    """`value` within ±MAX_OBSERVED (an int of any size in, never an OverflowError out)."""
    if -MAX_OBSERVED <= value <= MAX_OBSERVED:
        return value
    return MAX_OBSERVED if value > 0 else -MAX_OBSERVED


def record_prompt_tokens(rec: LengthRecord) -> int | None:
    """The prompt length of a record, by `proxy.sizing.lengths`' one definition."""
    return effective_prompt_tokens(rec.prompt_tokens, rec.upstream_prompt_tokens)


def spare_context_tokens(rec: LengthRecord) -> int | None:
    """Context room the request reserved but could never use: max_model_len − prompt − granted.

    None when no completion limit was forwarded: vLLM then allows the whole
    remaining room, so nothing is left unused by brimful's choice.
    """
    prompt = record_prompt_tokens(rec)
    if rec.max_model_len is None or prompt is None or rec.granted_max_tokens is None:
        return None
    return max(0, rec.max_model_len - prompt - rec.granted_max_tokens)


def clamped_tokens(rec: LengthRecord) -> int:
    """Completion tokens brimful took away from what the client asked for."""
    if rec.action != "clamped" or rec.requested_max_tokens is None or rec.granted_max_tokens is None:
        return 0
    return max(0, rec.requested_max_tokens - rec.granted_max_tokens)


def prompt_token_drift(rec: LengthRecord) -> int | None:
    """brimful's prompt count minus the upstream's usage.prompt_tokens (None: not both known)."""
    if rec.prompt_tokens is None or rec.upstream_prompt_tokens is None:
        return None
    return rec.prompt_tokens - rec.upstream_prompt_tokens


class Metrics:
    """brimful's Prometheus metrics over one private registry.

    `max_models` bounds the `model` label's cardinality: model names normally
    come from the upstream's model list, but a record for a request that named
    an unknown model must not create series forever; past the cap it is `other`.
    """

    def __init__(
        self,
        buckets: Sequence[float] | None = None,
        *,
        registry: CollectorRegistry | None = None,
        max_models: int = 64,
        length_error_codes: Iterable[ErrorCode] = LENGTH_ERROR_CODES,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.buckets = tuple(sorted(float(b) for b in (buckets or DEFAULT_TOKEN_BUCKETS)))
        self.max_models = max_models
        self.length_error_codes = frozenset(length_error_codes)
        self._models: set[str] = set()
        self._children: dict[tuple[Any, ...], Any] = {}   # (counter, *labels) → child: skips .labels()
        self._register_histograms()
        self._register_counters()
        self._register_gauges()

    def _hist(self, name: str, doc: str, bounds: Sequence[float] | None = None) -> TokenHistogram:
        h = TokenHistogram(name, doc, self.buckets if bounds is None else bounds)
        self.registry.register(h)
        return h

    def _register_histograms(self) -> None:
        hist = self._hist
        self.prompt_tokens = hist(
            "brimful_prompt_tokens",
            "Prompt tokens per request, counted with the model's tokenizer and chat template.")
        self.completion_tokens = hist(
            "brimful_completion_tokens", "Completion tokens per request (usage.completion_tokens, all choices).")
        self.total_tokens = hist(
            "brimful_total_tokens", "Prompt + completion tokens per request: the context a request really used.")
        self.requested_max_tokens = hist(
            "brimful_requested_max_tokens",
            "Completion limit the client asked for (max_tokens / max_completion_tokens).")
        self.spare_context_tokens = hist(
            "brimful_spare_context_tokens",
            "max_model_len - prompt - granted completion limit: context reserved but unusable.")
        # Not "brimful_prompt_token_drift": a counter owns its base name, and
        # brimful_prompt_token_drift_total below needs it.  The buckets go
        # negative, so (per OpenMetrics) only _bucket series are exposed.
        self.prompt_token_drift = hist(
            "brimful_prompt_token_drift_tokens",
            "brimful's prompt token count minus the upstream's usage.prompt_tokens.", DRIFT_BUCKETS)

    def _register_counters(self) -> None:
        self.requests = Counter(
            "brimful_requests_total", "Requests to the admitted routes by outcome.",
            ["model", "endpoint", "action", "status"], registry=self.registry,
        )
        self.clamped_tokens = Counter(
            "brimful_clamped_tokens_total", "Completion tokens removed by clamping (requested - granted).",
            ["model"], registry=self.registry,
        )
        self.rejections = Counter(
            "brimful_rejections_total", "Requests brimful rejected itself, by error code.",
            ["model", "reason"], registry=self.registry,
        )
        self.upstream_length_errors = Counter(
            "brimful_upstream_length_errors_total",
            "Context-length errors that still came back from the upstream (brimful's count was off or bypassed).",
            ["model"], registry=self.registry,
        )
        self.prompt_token_drift_requests = Counter(
            "brimful_prompt_token_drift_total",
            "Requests whose prompt token count differed from the upstream's usage.prompt_tokens.",
            ["model"], registry=self.registry,
        )
        self.unauthorized = Counter(
            "brimful_unauthorized_requests_total",
            "Requests refused for a missing or wrong API key, by route (admitted surface, pages, passthrough); "
            "never length records.",
            ["route"], registry=self.registry,
        )
        self.length_retries = Counter(
            "brimful_length_retries_total",
            "Requests re-sent with a smaller completion limit after an upstream length error.",
            ["model"], registry=self.registry,
        )
        self.pool_requests = Counter(
            "brimful_pool_requests_total",
            "Requests sent to each pool of a model served with several max_model_len (proxy.upstream.pools), "
            "by the pool's upstream name and window.",
            ["model", "upstream", "max_model_len"], registry=self.registry,
        )
        self.pool_fallbacks = Counter(
            "brimful_pool_fallbacks_total",
            "Requests a pool refused for length and brimful moved to the next larger pool.",
            ["model", "from_upstream", "to_upstream"], registry=self.registry,
        )

    def _register_gauges(self) -> None:
        self.tokenizer_parity = Gauge(
            "brimful_tokenizer_parity",
            "1 when brimful's count matched the upstream's /tokenize on the start-up probes, 0 when not.",
            ["model"], registry=self.registry,
        )
        self.count_mode = Gauge(
            "brimful_count_mode",
            "How each model's prompts are counted: 1 for the current mode (local: brimful's exact count; "
            "upstream: the upstream's /tokenize, after drift; margin: neither is exact, a margin is held back).",
            ["model", "mode"], registry=self.registry,
        )
        self.limit_unknown = Gauge(
            "brimful_model_limit_unknown",
            "1 for a served model whose /v1/models card gives no usable max_model_len (missing, 0, negative, "
            "a string): its requests are not clamped unless upstream.fallback_max_model_len or a per-model "
            "max_model_len says otherwise; 0 once it gives one. Per upstream: pools of one model are read apart.",
            ["model", "upstream"], registry=self.registry,
        )

    def model_label(self, model: str | None) -> str:
        label = safe_label(model)
        if label in self._models:
            return label
        if len(self._models) >= self.max_models:
            return OTHER_MODEL
        self._models.add(label)
        return label

    def _inc(self, counter: Counter, labels: tuple[str, ...], amount: float = 1) -> None:
        key = (id(counter), *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        child.inc(bounded(amount))

    def observe(self, rec: LengthRecord) -> None:
        """Update every metric one finished request touches."""
        model = self.model_label(rec.model)
        self._inc(self.requests, (model, safe_label(rec.endpoint), safe_label(rec.action), str(rec.status)))

        prompt = record_prompt_tokens(rec)
        if prompt is not None:
            self.prompt_tokens.observe(model, prompt)
        if rec.completion_tokens is not None:
            self.completion_tokens.observe(model, rec.completion_tokens)
        total = total_tokens(prompt, rec.completion_tokens)
        if total is not None:
            self.total_tokens.observe(model, total)
        if rec.requested_max_tokens is not None:
            self.requested_max_tokens.observe(model, rec.requested_max_tokens)
        unused = spare_context_tokens(rec)
        if unused is not None:
            self.spare_context_tokens.observe(model, unused)

        removed = clamped_tokens(rec)
        if removed:
            self._inc(self.clamped_tokens, (model,), removed)
        if rec.action == Action.REJECTED:
            self._inc(self.rejections, (model, safe_label(rec.error_code or "unknown")))
        if rec.action == Action.UPSTREAM_ERROR and rec.error_code in self.length_error_codes:
            self._inc(self.upstream_length_errors, (model,))

        drift = prompt_token_drift(rec)
        if drift is not None:
            self.prompt_token_drift.observe(model, drift)
            if drift != 0:
                self._inc(self.prompt_token_drift_requests, (model,))

    def set_tokenizer_parity(self, model: str | None, matches: bool) -> None:
        """Result of the start-up comparison with the upstream's /tokenize."""
        self.tokenizer_parity.labels(self.model_label(model)).set(1 if matches else 0)

    def set_count_mode(self, model: str, mode: str) -> None:
        """Which of proxy.admitted.trust's modes counts this model's prompts now."""
        label = self.model_label(model)
        for name in ("local", "upstream", "margin"):
            self.count_mode.labels(label, name).set(1 if name == mode else 0)

    def set_limit_unknown(self, model: str, upstream: str, unknown: bool) -> None:
        """Whether `upstream`'s card for `model` lacks a usable max_model_len (proxy.upstream.models)."""
        self.limit_unknown.labels(self.model_label(model), upstream).set(1 if unknown else 0)

    def count_unauthorized(self, route: str) -> None:
        """A 401 answered by brimful (its route is one of a few fixed names)."""
        self._inc(self.unauthorized, (route,))

    def count_length_retry(self, model: str | None) -> None:
        """The app retried a request after an upstream length error (not visible in a record)."""
        self._inc(self.length_retries, (self.model_label(model),))

    def count_pool_route(self, model: str, upstream: str, max_model_len: int) -> None:
        """A request routed to the pool `upstream` (a configured name, never an address)."""
        self._inc(self.pool_requests, (self.model_label(model), upstream, str(max_model_len)))

    def count_pool_fallback(self, model: str, from_upstream: str, to_upstream: str) -> None:
        self._inc(self.pool_fallbacks, (self.model_label(model), from_upstream, to_upstream))

    def attach_piece_cache(self, stats: Callable[[], Any]) -> None:
        """Export the per-piece count cache's hits, misses, evictions and size."""
        self.registry.register(_CountCacheCollector(
            stats, "piece_cache",
            lookups="Prompt pieces looked up in the count cache: a hit skips encoding that piece.",
            evictions="Pieces dropped from the full count cache.",
            entries="Pieces in the count cache."))
        self.registry.register(_CountCacheCollector(
            lambda: _PrefixStats.of(stats()), "prefix_cache",
            lookups="Long prompts looked up by their prefixes at proven cuts: a hit counts that prefix whole.",
            entries="Prompt prefixes in the prefix table beside the piece cache."))
        self.registry.register(_CountCacheCollector(
            lambda: _MemoStats.of(stats()), "render_memo",
            lookups="Iterations of a chat template's message loop in chats rendered through the memo: a hit "
                    "was skipped (the same reads rendered it before), a miss was rendered and recorded.",
            evictions="Iteration traces dropped from the full render memo: the conversations coming back "
                      "no longer fit it (its size follows piece_cache_entries).",
            entries="Iteration traces in the render memo beside the piece cache."))

    def attach_chat_cache(self, stats: Callable[[], Any]) -> None:
        """Export the chat-count cache's hits, misses and size."""
        self.registry.register(_CountCacheCollector(
            stats, "chat_cache",
            lookups="Chats looked up in the chat-count cache by their exact template inputs: a hit renders nothing.",
            entries="Chats in the chat-count cache."))

    def attach_engines(self, engines: Callable[[], Mapping[str, Any]]) -> None:
        """Export which engine counts each model and the texts the fast one fell back on.

        `engines()` maps a model to an object with `engine` and `failures`
        (`proxy.admitted.counting.EngineState`), read at scrape time.
        """
        self.registry.register(_EngineCollector(engines, self.model_label))

    def attach_gates(self, gates: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        """Export each upstream's in-flight and queued requests (`proxy.upstream.gate.UpstreamGate`)."""
        self.registry.register(_GateCollector(gates))

    def attach_lengthlog(self, stats: LengthLogStats) -> None:
        """Export the record file's written / dropped / failed counts."""
        self.registry.register(_LengthLogCollector(stats))

    def render(self, accept: str | None = None) -> tuple[bytes, str]:
        """Body and content type for GET /metrics.

        Prometheus text format by default; OpenMetrics when the scraper's Accept
        header asks for it (prometheus_client's own negotiation).
        """
        encoder, content_type = choose_encoder(accept or "")
        return encoder(self.registry), content_type


class TokenHistogram(Collector):
    """A histogram labelled by model: O(log n) observe, cumulated only at scrape time.

    Same exposition as prometheus_client's `Histogram` (`_bucket{le}`, `_count`,
    `_sum`; only buckets when bounds go negative, as OpenMetrics requires), without
    its per-observation lock and linear bucket scan.  Observations come from the
    event loop only; a scrape from another thread reads copies and at worst sees
    one in-flight observation in `_count` but not yet in `_sum`.
    """

    def __init__(self, name: str, documentation: str, bounds: Sequence[float]) -> None:
        self.name = name
        self.documentation = documentation
        self.bounds = tuple(sorted(float(b) for b in bounds if b != float("inf")))
        self._les = [str(floatToGoString(b)) for b in self.bounds] + ["+Inf"]  # type: ignore[no-untyped-call]
        self._with_sum = not self.bounds or self.bounds[0] >= 0
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, model: str, value: float) -> None:
        value = bounded(value)
        counts = self._counts.get(model)
        if counts is None:
            counts = self._counts[model] = [0] * (len(self.bounds) + 1)
            self._sums[model] = 0.0
        counts[bisect.bisect_left(self.bounds, value)] += 1   # first bound >= value: "le"
        self._sums[model] += value

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = self._family()
        for model, counts in list(self._counts.items()):
            cumulative, acc = [], 0
            for le, c in zip(self._les, list(counts), strict=True):
                acc += c
                cumulative.append((le, acc))
            family.add_metric([model], cumulative, self._sums[model] if self._with_sum else None)
        yield family

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield self._family()

    def _family(self) -> HistogramMetricFamily:
        return HistogramMetricFamily(self.name, self.documentation, labels=["model"])


class _LengthLogCollector(Collector):
    """Reads `LengthLogStats` at scrape time (the writer thread owns the numbers)."""

    def __init__(self, stats: LengthLogStats) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "brimful_length_records",
            "Length records by fate: written to the file, dropped (queue full) or lost (write error).",
            labels=["outcome"],
        )
        family.add_metric(["written"], self._stats.written)
        family.add_metric(["dropped"], self._stats.dropped)
        family.add_metric(["write_error"], self._stats.write_errors)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("brimful_length_records", "", labels=["outcome"])


@dataclass(frozen=True)
class _PrefixStats:
    """The prefix table's figures of a `PieceCacheStats`, named as `_CountCacheCollector` reads them."""

    hits: int
    misses: int
    entries: int

    @classmethod
    def of(cls, stats: Any) -> _PrefixStats:
        return cls(stats.prefix_hits, stats.prefix_misses, stats.prefix_entries)


@dataclass(frozen=True)
class _MemoStats:
    """The render memo's figures of a `PieceCacheStats`, named as `_CountCacheCollector` reads them."""

    hits: int
    misses: int
    entries: int
    evictions: int

    @classmethod
    def of(cls, stats: Any) -> _MemoStats:
        return cls(stats.memo_skipped, stats.memo_rendered, stats.memo_entries, stats.memo_evictions)


class _CountCacheCollector(Collector):
    """A count cache's lookups (and evictions, where it counts them) and size, read at scrape time."""

    def __init__(self, stats: Callable[[], Any], name: str, *, lookups: str, entries: str,
                 evictions: str | None = None) -> None:
        self._stats = stats
        self._name = name            # brimful_<name>_lookups, _evictions, _entries
        self._lookups_help, self._evictions_help, self._entries_help = lookups, evictions, entries

    def collect(self) -> Iterator[Any]:
        stats = self._stats()
        lookups = CounterMetricFamily(f"brimful_{self._name}_lookups", self._lookups_help, labels=["result"])
        lookups.add_metric(["hit"], stats.hits)
        lookups.add_metric(["miss"], stats.misses)
        yield lookups
        if self._evictions_help is not None:
            yield CounterMetricFamily(f"brimful_{self._name}_evictions", self._evictions_help, value=stats.evictions)
        yield GaugeMetricFamily(f"brimful_{self._name}_entries", self._entries_help, value=stats.entries)

    def describe(self) -> Iterator[Any]:
        yield CounterMetricFamily(f"brimful_{self._name}_lookups", "", labels=["result"])
        if self._evictions_help is not None:
            yield CounterMetricFamily(f"brimful_{self._name}_evictions", "")
        yield GaugeMetricFamily(f"brimful_{self._name}_entries", "")


class _EngineCollector(Collector):
    """Per loaded model: 1 for the engine that counts it; the texts fastokens raised on."""

    def __init__(self, engines: Callable[[], Mapping[str, Any]], label: Callable[[str], str]) -> None:
        self._engines = engines
        self._label = label

    def collect(self) -> Iterator[Any]:
        engine, failures = self._families()
        for model, state in sorted(self._engines().items()):
            label = self._label(model)
            engine.add_metric([label, safe_label(state.engine)], 1)
            failures.add_metric([label], state.failures)
        yield engine
        yield failures

    def describe(self) -> Iterator[Any]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, CounterMetricFamily]:
        return (
            GaugeMetricFamily(
                "brimful_count_engine",
                "1 for the engine that turns the model's text into tokens: fastokens where it passed its "
                "self-check against tokenizers at load, else tokenizers (mistral-common for Mistral-format models).",
                labels=["model", "engine"]),
            CounterMetricFamily(
                "brimful_count_engine_failures",
                "Texts fastokens raised on since the tokenizer loaded, each counted by tokenizers instead.",
                labels=["model"]),
        )


class _GateCollector(Collector):
    """Requests in flight to each upstream and queued for a slot, read at scrape time.

    `gates` yields (upstream name, gate) pairs; a gate is anything with
    `in_flight` and `waiting` counts.  The name is `default` for `[upstream]`
    and the `[[upstreams]]` entry's name otherwise: a bounded label set.
    """

    def __init__(self, gates: Callable[[], Iterable[tuple[str, Any]]]) -> None:
        self._gates = gates

    def collect(self) -> Iterator[GaugeMetricFamily]:
        in_flight = GaugeMetricFamily(
            "brimful_in_flight_requests",
            "Admitted requests (every surface) being counted or forwarded to the upstream and not finished "
            "(a stream until its last byte).",
            labels=["upstream"],
        )
        queued = GaugeMetricFamily(
            "brimful_queued_requests",
            "Requests waiting for a slot under upstream.max_concurrent_requests.",
            labels=["upstream"],
        )
        for name, gate in self._gates():
            in_flight.add_metric([safe_label(name)], gate.in_flight)
            queued.add_metric([safe_label(name)], gate.waiting)
        yield in_flight
        yield queued

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily("brimful_in_flight_requests", "", labels=["upstream"])
        yield GaugeMetricFamily("brimful_queued_requests", "", labels=["upstream"])
