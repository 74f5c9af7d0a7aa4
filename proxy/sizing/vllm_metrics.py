"""Reading a running vLLM's `/metrics`: its real KV pool, usage, preemptions and queue — and what they mean.

Seed 000's checklist: compare the KV cache size vLLM reports with the computed
one ("크게 다르면 활성값 가정이나 단위(GiB/GB)가 틀린 거예요"), and watch the
operating metrics: "KV 사용률이 피크에 붙어 있거나 선점 횟수가 늘면 용량을 늘릴
때예요".  Families read (vLLM 0.32, vllm/v1/metrics/loggers.py):

* `vllm:cache_config_info` — a gauge fixed at 1 whose labels are the engine's
  CacheConfig: `num_gpu_blocks`, `block_size`, `cache_dtype`,
  `gpu_memory_utilization`, `kv_cache_memory_bytes`, `kv_cache_size_tokens`,
  `kv_cache_max_concurrency`, … and `engine`; it has **no** `model_name`
  label (one vLLM serves one model).
* per `model_name` and `engine`: `vllm:kv_cache_usage_perc` (0..1; vLLM < 0.10
  called it `vllm:gpu_cache_usage_perc`), `vllm:num_preemptions_total`
  (counter), `vllm:num_requests_waiting`, `vllm:num_requests_running`.

vLLM keeps one block of the pool as its null block: `kv_cache_usage_perc` is
used ÷ (num_gpu_blocks − 1), so at most (num_gpu_blocks − 1) × block_size
tokens are ever held (vllm/v1/core/block_pool.py `get_usage`).

Everything here is pure except `UpstreamMetricsScraper`, which only calls the
fetch function it is given (`proxy.upstream_metrics` gives it each upstream's
own connection pool and runs one per upstream).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from prometheus_client.parser import text_string_to_metric_families

from proxy.sizing import capacity as cap

SignalKind = Literal["kv_usage_pinned", "preemptions_rising", "requests_waiting"]
DEFAULT_PINNED_AT = 0.9
DEFAULT_MIN_SCRAPES = 2


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    try:
        return int(labels[key])
    except (KeyError, ValueError):
        return None


def _float_label(labels: Mapping[str, str], key: str) -> float | None:
    try:
        return float(labels[key])
    except (KeyError, ValueError):
        return None


@dataclass(frozen=True)
class CacheConfigInfo:
    """One engine's KV pool, as `vllm:cache_config_info` states it."""

    engine: str
    num_gpu_blocks: int | None
    block_size: int | None
    cache_dtype: str | None
    gpu_memory_utilization: float | None
    kv_cache_memory_bytes: int | None      # set when vLLM ran with --kv-cache-memory-bytes
    kv_cache_size_tokens: int | None       # what vLLM logs as "KV cache size: N tokens"
    kv_cache_max_concurrency: float | None  # its "Maximum concurrency for max_model_len tokens per request"
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def pool_tokens(self) -> int | None:
        """num_gpu_blocks × block_size: the pool vLLM allocated."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return self.num_gpu_blocks * self.block_size

    @property
    def usable_tokens(self) -> int | None:
        """The pool without vLLM's null block."""
        if self.num_gpu_blocks is None or self.block_size is None:
            return None
        return max(0, self.num_gpu_blocks - 1) * self.block_size

    @classmethod
    def from_labels(cls, labels: Mapping[str, str]) -> CacheConfigInfo:
        dtype = labels.get("cache_dtype")
        return cls(
            engine=labels.get("engine", ""), num_gpu_blocks=_int_label(labels, "num_gpu_blocks"),
            block_size=_int_label(labels, "block_size"), cache_dtype=dtype,
            gpu_memory_utilization=_float_label(labels, "gpu_memory_utilization"),
            kv_cache_memory_bytes=_int_label(labels, "kv_cache_memory_bytes"),
            kv_cache_size_tokens=_int_label(labels, "kv_cache_size_tokens"),
            kv_cache_max_concurrency=_float_label(labels, "kv_cache_max_concurrency"),
            labels=dict(labels),
        )


@dataclass(frozen=True)
class ModelGauges:
    """One served model's live figures, summed over engines (usage: the fullest engine)."""

    model: str
    engines: tuple[str, ...]
    kv_cache_usage: float | None
    preemptions_total: float | None
    waiting: float | None
    running: float | None


@dataclass(frozen=True)
class VllmMetrics:
    cache: tuple[CacheConfigInfo, ...]
    models: Mapping[str, ModelGauges]

    def cache_for(self, engine: str = "0") -> CacheConfigInfo | None:
        return next((c for c in self.cache if c.engine == engine), self.cache[0] if self.cache else None)


_GAUGES = {
    "vllm:kv_cache_usage_perc": "usage", "vllm:gpu_cache_usage_perc": "usage_pre_0_10",
    "vllm:num_preemptions_total": "preemptions", "vllm:num_preemptions": "preemptions",
    "vllm:num_requests_waiting": "waiting", "vllm:num_requests_running": "running",
}


def parse_vllm_metrics(text: str) -> VllmMetrics:
    """The families above from a Prometheus text exposition (prometheus_client's parser)."""
    cache: list[CacheConfigInfo] = []
    values: dict[str, dict[str, dict[str, float]]] = {}   # model → what → engine → value
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info":
                cache.append(CacheConfigInfo.from_labels(sample.labels))
                continue
            what = _GAUGES.get(sample.name)
            model = sample.labels.get("model_name")
            if what is None or model is None:
                continue
            values.setdefault(model, {}).setdefault(what, {})[sample.labels.get("engine", "")] = sample.value
    models: dict[str, ModelGauges] = {}
    for model, per in values.items():
        engines = sorted({e for v in per.values() for e in v})
        usage = per.get("usage") or per.get("usage_pre_0_10")   # the current name wins
        models[model] = ModelGauges(
            model=model, engines=tuple(engines),
            kv_cache_usage=max(usage.values()) if usage else None,
            preemptions_total=sum(per["preemptions"].values()) if "preemptions" in per else None,
            waiting=sum(per["waiting"].values()) if "waiting" in per else None,
            running=sum(per["running"].values()) if "running" in per else None,
        )
    cache.sort(key=lambda c: c.engine)
    return VllmMetrics(tuple(cache), models)


# ---------------------------------------------------------------------------
# the pool vLLM allocated against the plan


@dataclass(frozen=True)
class CrossCheck:
    block_size: int
    actual_blocks: int
    actual_tokens: int            # num_gpu_blocks × block_size
    usable_tokens: int            # without the null block
    planned_tokens: int           # the plan's KV memory in whole blocks of vLLM's block size
    difference_tokens: int        # |actual − planned|
    actual_above_plan: bool
    ratio: float                  # actual ÷ planned (0 when the plan holds none)
    actual_kv_bytes: int          # actual_tokens × the planned bytes per token
    implied_other_bytes: int | None  # usable GPU memory − weights − actual KV: activations etc. as measured
    explanation: tuple[str, ...]
    demand_tokens: int | None
    concurrency: int | None       # requests of demand_tokens the usable pool holds at once


def _tokens_in(memory: int, block_bytes: int, block: int) -> int:
    return max(0, memory) // block_bytes * block


def _block_bytes(plan: cap.Plan, block: int) -> int:
    """Bytes of one pool block: bytes per token × vLLM's block, or the plan's KV-cache groups' block
    when sliding, chunked or linear layers make vLLM group them (`proxy.sizing.kv_groups`)."""
    groups = plan.inputs.groups()
    if len(groups.groups) == 1 and groups.groups[0].spec.kind == "full":
        return plan.inputs.bytes_per_token * block
    return groups.bytes_per_block


def cross_check(cache: CacheConfigInfo, plan: cap.Plan, demand_tokens: int | None = None) -> CrossCheck:
    """vLLM's real pool against `plan` (made for the same model, GPU and options), with the difference explained.

    The plan's figures are per GPU; vLLM's pool is per GPU too (each tensor-parallel rank holds its heads
    for every token).  `demand_tokens`: e.g. the p95 of demanded KV tokens per request.
    """
    if cache.num_gpu_blocks is None or cache.block_size is None:
        raise ValueError("vllm:cache_config_info has no num_gpu_blocks/block_size")
    inp = plan.inputs
    block, bpt = cache.block_size, inp.bytes_per_token
    block_bytes = _block_bytes(plan, block)
    actual = cache.num_gpu_blocks * block
    usable = max(0, cache.num_gpu_blocks - 1) * block
    notes: list[str] = []
    implied_other: int | None = None
    if cache.kv_cache_memory_bytes is not None:
        planned = _tokens_in(cache.kv_cache_memory_bytes, block_bytes, block)
        notes.append(f"vLLM was given exactly {cap.format_both(cache.kv_cache_memory_bytes)} of KV cache "
                     "(--kv-cache-memory-bytes): utilization, weights and activations do not enter")
        if actual != planned and actual:
            implied = cache.kv_cache_memory_bytes / actual
            notes.append(f"its pool implies {implied:,.0f} B per token against the planned {bpt:,}: check "
                         "--kv-cache-dtype, --tensor-parallel-size and the model's layer layout")
    else:
        planned = _tokens_in(plan.memory.kv_memory_bytes, block_bytes, block)
        implied_other = plan.memory.usable_bytes - plan.memory.weights_bytes - cache.num_gpu_blocks * block_bytes
        if abs(actual - planned) <= block:
            notes.append("matches the plan to a block")
        else:
            units = None
            # the same plan with the GPU size read in the other unit
            for factor, what in ((cap.GB / cap.GIB, "GB read as GiB"), (cap.GIB / cap.GB, "GiB read as GB")):
                other = int(inp.gpu_memory_bytes * factor)
                alt = cap.kv_memory(other, inp.utilization, inp.weights_bytes, inp.activation_bytes)
                alt_tokens = _tokens_in(alt.kv_memory_bytes, block_bytes, block)
                if alt_tokens and abs(actual - alt_tokens) <= max(block, actual // 100) < abs(actual - planned):
                    units = (f"units: the pool matches a GPU of {cap.format_both(other)} — the plan's GPU memory "
                             f"looks like {what} (GiB = 2^30, GB = 10^9 bytes)")
            if units is not None:
                notes.append(units)
            else:
                notes.append(
                    f"non-KV memory as measured: {cap.format_both(max(0, implied_other))} against the planned "
                    f"{cap.format_both(plan.memory.activation_bytes)} of activations: vLLM profiles activations, "
                    "CUDA graphs and other processes' memory at start-up; plan with --activation-memory "
                    f"{max(0, implied_other) / cap.GIB:.2f}GiB")
    return CrossCheck(
        block_size=block, actual_blocks=cache.num_gpu_blocks, actual_tokens=actual, usable_tokens=usable,
        planned_tokens=planned, difference_tokens=abs(actual - planned), actual_above_plan=actual > planned,
        ratio=actual / planned if planned else 0.0, actual_kv_bytes=cache.num_gpu_blocks * block_bytes,
        implied_other_bytes=None if implied_other is None else max(0, implied_other),
        explanation=tuple(notes), demand_tokens=demand_tokens, concurrency=concurrency_at(cache, demand_tokens),
    )


def concurrency_at(cache: CacheConfigInfo, demand_tokens: int | None) -> int | None:
    """Requests of `demand_tokens` tokens the usable pool holds at once (whole blocks each)."""
    usable = cache.usable_tokens
    if usable is None or cache.block_size is None or demand_tokens is None or demand_tokens <= 0:
        return None
    return usable // cap.slots_per_request(demand_tokens, cache.block_size)


# ---------------------------------------------------------------------------
# "time to add capacity": signals over consecutive scrapes


@dataclass(frozen=True)
class ModelTrend:
    pinned_scrapes: int = 0           # consecutive scrapes with KV usage ≥ the threshold
    waiting_scrapes: int = 0          # consecutive scrapes with requests waiting
    rising_scrapes: int = 0           # consecutive scrapes whose preemption count rose
    preemptions: float | None = None  # the last count seen
    last_rise: float = 0.0


@dataclass(frozen=True)
class CapacityState:
    """What the previous scrapes said, per model (start from `CapacityState()`)."""

    scrapes: int = 0
    models: Mapping[str, ModelTrend] = field(default_factory=dict)


@dataclass(frozen=True)
class Signal:
    model: str
    kind: SignalKind
    scrapes: int              # consecutive scrapes it has held
    detail: str               # the figures
    action: str               # what the seed recommends


ACTIONS: dict[str, str] = {
    "kv_usage_pinned": (
        "time to add KV capacity (seed 000): try --kv-cache-dtype fp8 first (re-run the quality evaluation), "
        "then set max_model_len to the demand's p99 instead of the model's maximum, then tensor parallelism "
        "or another replica"),
    "preemptions_rising": (
        "preempted requests recompute every token they had: raise --gpu-memory-utilization, or lower "
        "--max-num-seqs / --max-num-batched-tokens (vLLM's tuning guide); with KV usage pinned, add capacity"),
    "requests_waiting_memory": (
        "requests queue for KV cache blocks: add capacity (fp8 KV cache, a shorter max_model_len, tensor "
        "parallelism or another replica)"),
    "requests_waiting_scheduler": (
        "requests queue because max_num_seqs sequences already run: raise --max-num-seqs if the KV cache has "
        "room, or add a replica"),
    "requests_waiting": (
        "requests queue: if the running count sits at max_num_seqs, raise --max-num-seqs; otherwise they wait "
        "for KV cache blocks and it is time to add capacity (fp8 KV cache, a shorter max_model_len, tensor "
        "parallelism or another replica)"),
}


def observe(state: CapacityState, metrics: VllmMetrics, *, pinned_at: float = DEFAULT_PINNED_AT,
            min_scrapes: int = DEFAULT_MIN_SCRAPES, max_num_seqs: int | None = None
            ) -> tuple[CapacityState, tuple[Signal, ...]]:
    """Fold one scrape into the state; the signals that now hold, each with its action.

    Waiting requests are blamed on max_num_seqs only when the running count reaches it (vLLM's metrics do
    not expose the limit: pass it); KV usage alone cannot tell, because a request waits as soon as the
    free blocks are fewer than it needs (a real vLLM queued 4 requests at 80 % usage).  A preemption
    counter that went down means vLLM restarted: the new count is the baseline, no signal.
    """
    trends: dict[str, ModelTrend] = {}
    signals: list[Signal] = []
    for model, g in sorted(metrics.models.items()):
        prev = state.models.get(model, ModelTrend())
        pinned = prev.pinned_scrapes + 1 if g.kv_cache_usage is not None and g.kv_cache_usage >= pinned_at else 0
        waiting = prev.waiting_scrapes + 1 if g.waiting is not None and g.waiting > 0 else 0
        rising, rise = 0, 0.0
        if g.preemptions_total is not None and prev.preemptions is not None and g.preemptions_total > prev.preemptions:
            rising, rise = prev.rising_scrapes + 1, g.preemptions_total - prev.preemptions
        trends[model] = ModelTrend(pinned, waiting, rising, g.preemptions_total, rise)
        if pinned >= min_scrapes:
            signals.append(Signal(model, "kv_usage_pinned", pinned,
                                  f"KV cache {100 * (g.kv_cache_usage or 0):.1f} % used for {pinned} scrapes "
                                  f"(threshold {100 * pinned_at:g} %)", ACTIONS["kv_usage_pinned"]))
        if rising:
            signals.append(Signal(model, "preemptions_rising", rising,
                                  f"{rise:g} preemptions since the last scrape ({g.preemptions_total:g} in all)",
                                  ACTIONS["preemptions_rising"]))
        if waiting >= min_scrapes:
            signals.append(Signal(model, "requests_waiting", waiting,
                                  f"{g.waiting:g} requests waiting, {g.running or 0:g} running, for {waiting} scrapes",
                                  _waiting_action(g, max_num_seqs)))
    return CapacityState(state.scrapes + 1, trends), tuple(signals)


def current_signals(metrics: VllmMetrics, *, pinned_at: float = DEFAULT_PINNED_AT,
                    max_num_seqs: int | None = None) -> tuple[Signal, ...]:
    """The signals one scrape can show on its own (`brimful report --upstream`).

    A single scrape cannot tell whether usage stays pinned or preemptions are rising: usage at the
    threshold and requests waiting count now; preemptions count since vLLM started.
    """
    signals: list[Signal] = []
    for model, g in sorted(metrics.models.items()):
        if g.kv_cache_usage is not None and g.kv_cache_usage >= pinned_at:
            signals.append(Signal(model, "kv_usage_pinned", 1, f"KV cache {100 * g.kv_cache_usage:.1f} % used now "
                                  f"(threshold {100 * pinned_at:g} %)", ACTIONS["kv_usage_pinned"]))
        if g.preemptions_total:
            signals.append(Signal(model, "preemptions_rising", 1, f"{g.preemptions_total:g} preemptions since vLLM "
                                  "started", ACTIONS["preemptions_rising"]))
        if g.waiting:
            signals.append(Signal(model, "requests_waiting", 1,
                                  f"{g.waiting:g} requests waiting, {g.running or 0:g} running now",
                                  _waiting_action(g, max_num_seqs)))
    return tuple(signals)


def _waiting_action(g: ModelGauges, max_num_seqs: int | None) -> str:
    if max_num_seqs is None:
        return ACTIONS["requests_waiting"]
    if (g.running or 0) >= max_num_seqs:
        return ACTIONS["requests_waiting_scheduler"]
    return ACTIONS["requests_waiting_memory"]


# ---------------------------------------------------------------------------
# the scraper


class UpstreamMetricsScraper:
    """Scrape one upstream's /metrics every `interval` seconds through an injected `fetch`.

    `fetch()` returns the body text (raising on failure); the scraper keeps the latest parsed metrics, the
    capacity state and signals, and the last error — it never raises out of `scrape_once` or `run`.
    """

    def __init__(self, fetch: Callable[[], Awaitable[str]], *, interval: float = 15.0,
                 pinned_at: float = DEFAULT_PINNED_AT, min_scrapes: int = DEFAULT_MIN_SCRAPES,
                 max_num_seqs: int | None = None, clock: Callable[[], float] = time.time) -> None:
        self._fetch = fetch
        self.interval = interval
        self.max_num_seqs = max_num_seqs
        self.pinned_at = pinned_at
        self.min_scrapes = min_scrapes
        self._clock = clock
        self.latest: VllmMetrics | None = None
        self.state = CapacityState()
        self.signals: tuple[Signal, ...] = ()
        self.last_success: float | None = None
        self.last_error: str | None = None
        self.failures = 0               # consecutive
        self.on_scrape: list[Callable[[UpstreamMetricsScraper], None]] = []   # after each attempt

    async def scrape_once(self) -> bool:
        try:
            text = await self._fetch()
            metrics = parse_vllm_metrics(text)
        except Exception as exc:  # any failure of the upstream or of its body is reported, not raised
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {exc}"
            self._scraped()
            return False
        self.latest = metrics
        self.state, self.signals = observe(self.state, metrics, pinned_at=self.pinned_at,
                                           min_scrapes=self.min_scrapes, max_num_seqs=self.max_num_seqs)
        self.last_success = self._clock()
        self.last_error = None
        self.failures = 0
        self._scraped()
        return True

    def _scraped(self) -> None:
        for callback in self.on_scrape:
            callback(self)

    async def run(self, stop: asyncio.Event) -> None:
        """Scrape until `stop` is set (checked between scrapes and while waiting)."""
        while not stop.is_set():
            await self.scrape_once()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)

    def reset(self) -> None:
        """Forget the trend (e.g. after the upstream changed)."""
        self.state = replace(self.state, models={})
        self.signals = ()
