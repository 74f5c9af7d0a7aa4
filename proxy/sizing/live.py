"""Sizing against the running vLLM: its real KV pool beside the plan, the concurrency it allows, the signals.

Pure functions over what is known about one model: its `config.json` (the
model's own context, KV bytes per token), the latest scrape of its upstream's
`/metrics` (`proxy.sizing.vllm_metrics`), and the demand seen (`proxy.sizing.demand`).
`/stats` (`proxy.recording.stats`), brimful's own gauges (`proxy.upstream_metrics`) and
`brimful report --upstream` all build their figures here, so the three agree.

What "the plan for the configuration" can be depends on what is known:

* `brimful report --upstream URL` with the model and GPU options of `plan`:
  the full plan (GPU memory × utilization − weights − activations), compared
  with `proxy.sizing.vllm_metrics.cross_check`, units and activations explained;
* a vLLM started with `--kv-cache-memory-bytes` (its `cache_config_info` then
  states the bytes): the plan is exactly those bytes ÷ the config's KV bytes
  per token, so the live view checks the pool with no GPU figures at all;
* otherwise the live view shows the pool and says what the plan needs.

vLLM's `/metrics` does not state `--tensor-parallel-size`: a plan made here
from `config.json` alone assumes one GPU, and a mismatch says so (the
cross-check names `--tensor-parallel-size` when the bytes per token disagree).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from proxy.sizing import capacity as cap
from proxy.sizing.model_context import ContextBound, model_context_bound
from proxy.sizing.vllm_metrics import CacheConfigInfo, Signal, VllmMetrics, concurrency_at, cross_check


@dataclass(frozen=True)
class UpstreamView:
    """What the scrapes of one upstream's `/metrics` say (a `proxy.sizing.vllm_metrics.UpstreamMetricsScraper`)."""

    name: str
    url: str
    metrics: VllmMetrics | None        # the latest successful scrape
    signals: tuple[Signal, ...] = ()
    scrapes: int = 0
    failures: int = 0                  # consecutive
    last_success: float | None = None
    last_error: str | None = None

    @property
    def cache(self) -> CacheConfigInfo | None:
        return self.metrics.cache_for("0") if self.metrics is not None else None


@dataclass(frozen=True)
class ModelSizing:
    """What the live view knows about one model beyond its traffic."""

    config: Mapping[str, Any] | None = None     # its config.json, when found
    config_source: str | None = None            # the file it was read from
    upstream: UpstreamView | None = None        # None: the scrape is off
    min_completion: int = 1                     # the admission policy's minimum completion

    @property
    def context(self) -> ContextBound | None:
        """The model's own bound (None without a config.json, or when it names no length)."""
        if self.config is None:
            return None
        bound = model_context_bound(self.config)
        return bound if bound.key is not None else None

    @property
    def kv_bound(self) -> int | None:
        """The longest max_model_len the running vLLM's pool holds: num_gpu_blocks × block_size."""
        cache = self.upstream.cache if self.upstream is not None else None
        return cache.pool_tokens if cache is not None else None


@dataclass(frozen=True)
class PoolCheck:
    """The running vLLM's KV pool against the plan, and what it holds at the demand seen."""

    engine: str
    engines: int
    num_gpu_blocks: int
    block_size: int
    cache_dtype: str | None
    actual_tokens: int                     # num_gpu_blocks × block_size
    usable_tokens: int                     # without vLLM's null block
    kv_cache_memory_bytes: int | None      # set when vLLM ran with --kv-cache-memory-bytes
    gpu_memory_utilization: float | None
    vllm_max_concurrency: float | None     # what vLLM logs: requests of max_model_len at once
    bytes_per_token: int | None
    planned_tokens: int | None             # None: no plan could be made (see `explanation`)
    difference_tokens: int | None
    ratio: float | None                    # actual ÷ planned
    plan_basis: str | None                 # what the plan was made from
    explanation: tuple[str, ...]
    demand_kv_tokens: int | None           # the p95 of demanded KV tokens per request
    concurrency: int | None                # such requests the usable pool holds at once

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["explanation"] = list(self.explanation)
        return out


def given_memory_plan(cache: CacheConfigInfo, bytes_per_token: int,
                      layout: cap.KvLayout | None = None) -> cap.Plan | None:
    """The plan of a vLLM given exactly `--kv-cache-memory-bytes` (None when it was not); with the
    model's `layout`, its KV-cache groups at vLLM's block size."""
    if cache.kv_cache_memory_bytes is None:
        return None
    block = cache.block_size or cap.DEFAULT_BLOCK_SIZE
    return cap.make_plan(cap.PlanInputs(
        bytes_per_token=bytes_per_token, gpu_memory_bytes=cache.kv_cache_memory_bytes, weights_bytes=0,
        utilization=1.0, activation_bytes=0, block_size=block,
        kv_groups=layout.kv_groups(block) if layout is not None else None))


def check_pool(metrics: VllmMetrics, *, config: Mapping[str, Any] | None = None, plan: cap.Plan | None = None,
               plan_basis: str | None = None, demand_kv_tokens: int | None = None) -> PoolCheck | None:
    """The pool of engine 0 against `plan`, else against the plan `config` allows (see the module docstring).

    None when the scrape holds no `vllm:cache_config_info` with a pool (not a vLLM, or one too old).
    """
    cache = metrics.cache_for("0")
    if cache is None or cache.num_gpu_blocks is None or cache.block_size is None:
        return None
    notes: list[str] = []
    if plan is None and config is not None:
        try:
            layout = cap.kv_layout(config, cache.cache_dtype or "auto")
            bpt = layout.bytes_per_token
        except ValueError as exc:     # UnsupportedConfigError, or a cache dtype brimful does not know
            notes.append(f"no plan: {exc}")
        else:
            plan = given_memory_plan(cache, bpt, layout)
            if plan is not None:
                plan_basis = (f"--kv-cache-memory-bytes {cache.kv_cache_memory_bytes:,} ÷ {bpt:,} B per token "
                              f"from config.json, KV cache {cache.cache_dtype or 'auto'}")
            else:
                share = "" if cache.gpu_memory_utilization is None else f" {cache.gpu_memory_utilization:g}"
                notes.append(f"no plan: vLLM sized its pool from gpu_memory_utilization{share} of the GPU; the plan "
                             "needs the GPU and the weights: brimful report --upstream URL --model-config "
                             "config.json --gpu NAME")
    elif plan is None:
        notes.append("no plan: no config.json for this model (put one beside its tokenizer, or run brimful "
                     "report --upstream URL --model-config config.json --gpu NAME)")
    planned = difference = ratio = None
    bpt_used: int | None = None
    if plan is not None:
        x = cross_check(cache, plan, demand_kv_tokens)
        planned, difference, ratio = x.planned_tokens, x.difference_tokens, x.ratio
        bpt_used = plan.inputs.bytes_per_token
        notes[:0] = list(x.explanation)
        util = cache.gpu_memory_utilization
        if cache.kv_cache_memory_bytes is None and util is not None and abs(util - plan.inputs.utilization) > 1e-9:
            notes.append(f"vLLM runs with gpu_memory_utilization {util:g}, the plan with "
                         f"{plan.inputs.utilization:g}: plan with --gpu-memory-utilization {util:g}")
    return PoolCheck(
        engine=cache.engine, engines=len(metrics.cache), num_gpu_blocks=cache.num_gpu_blocks,
        block_size=cache.block_size, cache_dtype=cache.cache_dtype,
        actual_tokens=cache.num_gpu_blocks * cache.block_size,
        usable_tokens=cache.usable_tokens or 0, kv_cache_memory_bytes=cache.kv_cache_memory_bytes,
        gpu_memory_utilization=cache.gpu_memory_utilization, vllm_max_concurrency=cache.kv_cache_max_concurrency,
        bytes_per_token=bpt_used, planned_tokens=planned, difference_tokens=difference, ratio=ratio,
        plan_basis=plan_basis if plan is not None else None, explanation=tuple(notes),
        demand_kv_tokens=demand_kv_tokens, concurrency=concurrency_at(cache, demand_kv_tokens),
    )


@dataclass(frozen=True)
class UpstreamSection:
    """One model's part of its upstream's scrape: the pool check, the live figures, the signals."""

    upstream: str
    url: str
    scrapes: int
    failures: int
    last_success: float | None
    last_error: str | None
    pool: PoolCheck | None
    kv_cache_usage: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions_total: float | None = None
    signals: tuple[Signal, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        return {
            "upstream": self.upstream, "url": self.url, "scrapes": self.scrapes, "failures": self.failures,
            "last_success": self.last_success, "last_error": self.last_error,
            "pool": None if self.pool is None else self.pool.to_dict(),
            "kv_cache_usage": self.kv_cache_usage, "running": self.running, "waiting": self.waiting,
            "preemptions_total": self.preemptions_total,
            "signals": [{"kind": s.kind, "scrapes": s.scrapes, "detail": s.detail, "action": s.action}
                        for s in self.signals],
        }


def upstream_section(view: UpstreamView, model: str, *, config: Mapping[str, Any] | None = None,
                     plan: cap.Plan | None = None, plan_basis: str | None = None,
                     demand_kv_tokens: int | None = None) -> UpstreamSection:
    """What `view` says about `model` (its pool is the upstream's; gauges and signals are per model)."""
    pool = None
    gauges = None
    if view.metrics is not None:
        pool = check_pool(view.metrics, config=config, plan=plan, plan_basis=plan_basis,
                          demand_kv_tokens=demand_kv_tokens)
        gauges = view.metrics.models.get(model)
    return UpstreamSection(
        upstream=view.name, url=view.url, scrapes=view.scrapes, failures=view.failures,
        last_success=view.last_success, last_error=view.last_error, pool=pool,
        kv_cache_usage=gauges.kv_cache_usage if gauges else None, running=gauges.running if gauges else None,
        waiting=gauges.waiting if gauges else None, preemptions_total=gauges.preemptions_total if gauges else None,
        signals=tuple(s for s in view.signals if s.model == model),
    )
