"""One vLLM deployment as `brimful plan` sees it: resolved per GPU, judged, and fixed when it does not fit.

`DeploymentSpec` holds what the operator chose (model, GPU, every vLLM option
that moves memory); `resolve` turns it into per-GPU figures (`Hardware`);
`assess` says whether vLLM would start and serve with it, lists the problems
in the order vLLM would hit them, and — when something is wrong — evaluates
the seed's remedies (fp8 KV cache, a shorter max_model_len, quantised
weights, tensor parallelism; seed 000's "용량이 모자라면 fp8 KV → max_model_len
조정 → 텐서 병렬" and "32B 이상을 GPU 한 장에: 가중치 양자화 또는 텐서 병렬 2장", in
English in docs/vllm-behaviour.md) with full figures for each.  Everything is pure: no I/O, no printing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import Any, Literal

from proxy.sizing import capacity as cap
from proxy.sizing.kv_groups import KvGroups
from proxy.sizing.model_context import ContextBound, model_context_bound
from proxy.sizing.scheduler_limits import SchedulerLimits, scheduler_limits
from proxy.sizing.weights import WeightsEstimate, estimate_weights, weight_scheme

# vLLM 0.32, vllm/v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`, verbatim.
VLLM_NO_KV_MEMORY = (
    "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
    "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
    "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details."
)
MAX_TP_PER_NODE = 8

ProblemKind = Literal[
    "tensor_parallel", "max_model_len_over_model", "weights_exceed_gpu", "no_kv_memory",
    "max_model_len_over_kv", "request_over_kv", "scheduler",
]


@dataclass(frozen=True)
class DeploymentSpec:
    """The operator's choices; sizes in bytes, `weights_memory_bytes` = the whole checkpoint."""

    config: Mapping[str, Any]
    model_label: str
    gpu_label: str
    gpu_memory_bytes: int
    gpu_name: str | None = None
    params: int | None = None
    weights_memory_bytes: int | None = None
    weights_dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    utilization: float = cap.DEFAULT_UTILIZATION
    activation_bytes: int = cap.DEFAULT_ACTIVATION_BYTES
    block_size: int = cap.DEFAULT_BLOCK_SIZE
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool = True
    target_concurrency: int | None = None
    gpu_hourly_usd: float | None = None
    # vLLM's --disable-hybrid-kv-cache-manager, inverted; None = vLLM's default (on, except for models
    # with chunked local attention unless VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1)
    hybrid_kv_cache_manager: bool | None = None
    chunked_local_hybrid: bool = False
    # vLLM's --async-scheduling: on by default on GPUs (two batches in flight), off on the CPU backend
    async_scheduling: bool = True
    # vLLM's --mamba-ssm-cache-dtype and --mamba-cache-mode ("align" is its default with prefix caching)
    mamba_ssm_cache_dtype: str = "auto"
    mamba_cache_mode: str = "align"


@dataclass(frozen=True)
class Hardware:
    """Model and GPU resolved per GPU (no request length yet); `weights_bytes` is one GPU's share."""

    model_label: str
    layout: cap.KvLayout
    gpu_label: str
    gpu_memory_bytes: int
    weights_bytes: int
    utilization: float
    activation_bytes: int
    block_size: int
    target_concurrency: int | None
    gpu_hourly_usd: float | None
    tensor_parallel_size: int = 1
    weights: WeightsEstimate | None = None      # None: --weights-memory was given
    context: ContextBound | None = None         # None: the config has no length field
    max_num_seqs: int | None = None
    spec: DeploymentSpec | None = None
    kv_groups: KvGroups | None = None           # vLLM's KV-cache groups (None: one full-attention group)
    max_num_batched_tokens: int | None = None   # vLLM's default for this GPU, or the one given
    concurrent_batches: int = 1                 # 2 with async scheduling (`max_concurrent_batches`)

    def in_flight_tokens(self, max_num_batched_tokens: int | None = None) -> int | None:
        """`VllmConfig.max_in_flight_tokens`: batched tokens × batches in flight."""
        tokens = max_num_batched_tokens or self.max_num_batched_tokens
        return None if tokens is None else tokens * self.concurrent_batches

    def inputs(self, tokens_per_request: int, max_model_len: int | None,
               max_num_batched_tokens: int | None = None) -> cap.PlanInputs:
        return cap.PlanInputs(
            kv_groups=self.kv_groups, in_flight_tokens=self.in_flight_tokens(max_num_batched_tokens),
            bytes_per_token=self.layout.bytes_per_token,
            gpu_memory_bytes=self.gpu_memory_bytes, weights_bytes=self.weights_bytes,
            utilization=self.utilization, activation_bytes=self.activation_bytes,
            block_size=self.block_size, tokens_per_request=tokens_per_request,
            max_model_len=max_model_len, target_concurrency=self.target_concurrency,
            gpu_hourly_usd=self.gpu_hourly_usd, max_num_seqs=self.max_num_seqs,
            tensor_parallel_size=self.tensor_parallel_size,
        )


def _context(config: Mapping[str, Any]) -> ContextBound | None:
    """The model's own bound, or None when config.json names no length (vLLM would assume 2048)."""
    bound = model_context_bound(config)
    return bound if bound.key is not None else None


def hybrid_kv_cache_manager(spec: DeploymentSpec) -> bool:
    """Whether vLLM 0.32 runs its hybrid KV-cache manager (`VllmConfig.__post_init__`, vllm/config/vllm.py).

    On by default; off for a model with `attention_chunk_size` (Llama 4) unless
    VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1, and then asking for it is vLLM's ValueError.
    """
    chunked = cap.text_config(spec.config).get("attention_chunk_size") is not None
    needs_off = chunked and not spec.chunked_local_hybrid
    if spec.hybrid_kv_cache_manager is None:
        return not needs_off
    if spec.hybrid_kv_cache_manager and needs_off:
        raise ValueError(
            "Hybrid KV cache manager was explicitly enabled but is not supported in this configuration. "
            "Consider omitting the --no-disable-hybrid-kv-cache-manager flag to let vLLM decide automatically."
        )
    return spec.hybrid_kv_cache_manager


def resolve(spec: DeploymentSpec) -> Hardware:
    """Per-GPU layout and weights; TensorParallelError / UnsupportedConfigError / ValueError otherwise."""
    tp = spec.tensor_parallel_size
    layout = cap.kv_layout(spec.config, spec.kv_cache_dtype, tp, spec.mamba_ssm_cache_dtype)
    groups = layout.kv_groups(spec.block_size, hybrid_kv_cache_manager(spec), spec.mamba_cache_mode)
    estimate: WeightsEstimate | None = None
    if spec.weights_memory_bytes is not None:
        total = spec.weights_memory_bytes
    elif spec.params is not None:
        estimate = estimate_weights(spec.params, spec.config, weight_scheme(spec.config, spec.weights_dtype))
        total = estimate.total_bytes
    else:
        raise ValueError("give the weights: --weights-memory SIZE or --params N")
    limits = scheduler_limits(None, gpu_memory_bytes=spec.gpu_memory_bytes, gpu_name=spec.gpu_name,
                              max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens)
    seqs = limits.max_num_seqs
    return Hardware(
        model_label=spec.model_label, layout=layout, gpu_label=spec.gpu_label,
        gpu_memory_bytes=spec.gpu_memory_bytes, weights_bytes=-(-total // tp),
        utilization=spec.utilization, activation_bytes=spec.activation_bytes, block_size=spec.block_size,
        target_concurrency=spec.target_concurrency, gpu_hourly_usd=spec.gpu_hourly_usd,
        tensor_parallel_size=tp, weights=estimate, context=_context(spec.config), max_num_seqs=seqs, spec=spec,
        kv_groups=groups, max_num_batched_tokens=limits.max_num_batched_tokens,
        concurrent_batches=2 if spec.async_scheduling else 1,
    )


@dataclass(frozen=True)
class Problem:
    kind: ProblemKind
    message: str                  # brimful's sentence, with the figures
    vllm_error: str | None = None  # what vLLM itself prints, when known
    fix: str | None = None


@dataclass(frozen=True)
class Alternative:
    """One remedy, evaluated in full."""

    change: str                   # what changes, in words
    flags: tuple[str, ...]        # the vLLM options that make it
    fits: bool                    # vLLM starts and serves tokens_per_request with it
    gpus_per_replica: int
    weights_per_gpu_bytes: int
    kv_memory_bytes: int          # ≥ 0
    kv_tokens: int
    concurrency: int              # at tokens_per_request, max_num_seqs applied
    max_model_len: int | None
    longest_max_model_len: int    # the longest that fits this KV cache (whole blocks)
    problems: tuple[str, ...] = ()  # why it does not fit, when it does not
    note: str = ""


@dataclass(frozen=True)
class Assessment:
    spec: DeploymentSpec
    hardware: Hardware | None     # None when vLLM refuses the tensor-parallel split
    plan: cap.Plan | None
    scheduler: SchedulerLimits | None
    max_model_len: int | None     # the one judged: given, or vLLM's default for the model
    max_model_len_source: str     # "given", "model default (<key>)" or "unknown"
    problems: tuple[Problem, ...]
    alternatives: tuple[Alternative, ...] = field(default=())

    @property
    def fits(self) -> bool:
        return not self.problems


def _gib(n: int) -> str:
    return f"{n / cap.GIB:.2f} GiB"


def _evaluate(spec: DeploymentSpec, tokens_per_request: int, max_model_len: int | None
              ) -> tuple[Hardware | None, cap.Plan | None, SchedulerLimits | None, int | None, str, list[Problem]]:
    problems: list[Problem] = []
    try:
        hw = resolve(spec)
    except cap.TensorParallelError as e:
        valid = cap.valid_tensor_parallel_sizes(spec.config, max(MAX_TP_PER_NODE, spec.tensor_parallel_size))
        problems.append(Problem(
            "tensor_parallel",
            f"vLLM refuses --tensor-parallel-size {spec.tensor_parallel_size} for this model: {e} "
            f"Sizes it accepts: {', '.join(map(str, valid))}.",
            vllm_error=str(e),
        ))
        return None, None, None, max_model_len, "given" if max_model_len else "unknown", problems
    context = hw.context
    if max_model_len is not None:
        mml: int | None = max_model_len
        source = "given"
        if context is not None and not context.accepts(max_model_len):
            problems.append(Problem(
                "max_model_len_over_model",
                f"--max-model-len {max_model_len:,} is above the model's own context of "
                f"{context.max_model_len:,} ({context.key}): vLLM refuses to start.",
                vllm_error=context.refusal(max_model_len),
                fix=f"--max-model-len {context.max_model_len} or less",
            ))
    elif context is not None:
        mml, source = context.default_max_model_len, f"model default ({context.key})"
    else:
        mml, source = None, "unknown"
    sched = scheduler_limits(mml, gpu_memory_bytes=spec.gpu_memory_bytes, gpu_name=spec.gpu_name,
                             max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
                             enable_chunked_prefill=spec.enable_chunked_prefill)
    plan = cap.make_plan(hw.inputs(tokens_per_request, mml, sched.max_num_batched_tokens))
    mem = plan.memory
    if hw.weights_bytes > spec.gpu_memory_bytes:
        problems.append(Problem(
            "weights_exceed_gpu",
            f"the weights alone take {_gib(hw.weights_bytes)} per GPU, more than the GPU's "
            f"{_gib(spec.gpu_memory_bytes)}: loading them fails (CUDA out of memory) before any KV cache.",
        ))
    elif mem.kv_memory_bytes <= 0:
        problems.append(Problem(
            "no_kv_memory",
            f"weights ({_gib(mem.weights_bytes)}) + activations ({_gib(mem.activation_bytes)}) exceed the "
            f"usable {_gib(mem.usable_bytes)} (GPU × {mem.utilization:g}) by {_gib(mem.shortfall_bytes)}: "
            "no KV cache is left.",
            vllm_error=VLLM_NO_KV_MEMORY,
        ))
    elif plan.startup is not None and not plan.startup.fits:
        s = plan.startup
        problems.append(Problem(
            "max_model_len_over_kv",
            f"one request of max_model_len {s.max_model_len:,} ({source}) needs {_gib(s.needed_bytes)} of KV "
            f"cache, more than the {_gib(s.available_bytes)} left ({plan.kv_tokens:,} tokens): vLLM refuses "
            "to start.",
            vllm_error=s.message, fix=s.fix,
        ))
    elif plan.concurrent_requests == 0:
        problems.append(Problem(
            "request_over_kv",
            f"a request of {tokens_per_request:,} tokens needs {plan.slots_per_request:,} slots, more than the "
            f"{plan.kv_tokens:,} tokens the KV cache holds.",
        ))
    if sched.error is not None:
        fix = ("raise --max-num-batched-tokens to max_model_len or more, or keep chunked prefill on"
               if "max_model_len" in sched.error else "raise --max-num-batched-tokens to max_num_seqs or more")
        problems.append(Problem("scheduler", "vLLM refuses the scheduler limits.", vllm_error=sched.error, fix=fix))
    return hw, plan, sched, mml, source, problems


def _alternative(spec: DeploymentSpec, change: str, flags: tuple[str, ...], tokens_per_request: int,
                 max_model_len: int | None, note: str = "") -> Alternative:
    hw, plan, _, mml, _, problems = _evaluate(spec, tokens_per_request, max_model_len)
    if hw is None or plan is None:
        return Alternative(change, flags, False, spec.tensor_parallel_size, 0, 0, 0, 0, max_model_len, 0,
                           tuple(p.message for p in problems), note)
    longest = plan.startup.estimated_max_model_len if plan.startup is not None else max(
        0, plan.kv_blocks - 1) * spec.block_size
    return Alternative(
        change=change, flags=flags, fits=not problems, gpus_per_replica=spec.tensor_parallel_size,
        weights_per_gpu_bytes=hw.weights_bytes, kv_memory_bytes=max(0, plan.memory.kv_memory_bytes),
        kv_tokens=plan.kv_tokens, concurrency=plan.concurrency, max_model_len=mml,
        longest_max_model_len=longest, problems=tuple(p.message for p in problems), note=note,
    )


def _sixteen_bit_params(spec: DeploymentSpec) -> int | None:
    """The parameter count behind the weights: given, or --weights-memory read as a 16-bit checkpoint."""
    if spec.params is not None:
        return spec.params
    if spec.weights_memory_bytes is not None and weight_scheme(spec.config, spec.weights_dtype).bits == 16:
        return spec.weights_memory_bytes // 2
    return None


def _needed_utilization(spec: DeploymentSpec, hw: Hardware, plan: cap.Plan) -> float | None:
    """The gpu_memory_utilization (to 0.01) that would leave room for one request of max_model_len."""
    need_tokens = plan.inputs.max_model_len or plan.inputs.tokens_per_request
    groups = plan.inputs.groups()
    # one request's blocks from every group, plus the block the pool holds back
    kv = (groups.blocks_per_request(need_tokens, plan.inputs.in_flight()) + 1) * groups.bytes_per_block
    total = hw.weights_bytes + hw.activation_bytes + kv
    value = math.ceil(Decimal(total) / Decimal(spec.gpu_memory_bytes) * 100) / 100
    return value if spec.utilization < value <= 1.0 else None


def propose(spec: DeploymentSpec, tokens_per_request: int, max_model_len: int | None,
            hw: Hardware | None, plan: cap.Plan | None, problems: list[Problem]) -> tuple[Alternative, ...]:
    """The seed's remedies that apply here, each evaluated: fully fitting ones first."""
    kinds = {p.kind for p in problems}
    out: list[Alternative] = []
    weights_problem = bool(kinds & {"weights_exceed_gpu", "no_kv_memory"})
    kv_problem = bool(kinds & {"max_model_len_over_kv", "request_over_kv"})
    kv16 = hw is not None and hw.layout.dtype_bytes > 1

    if kv_problem and kv16:
        out.append(_alternative(replace(spec, kv_cache_dtype="fp8"), "store the KV cache in fp8 (half the bytes)",
                                ("--kv-cache-dtype fp8",), tokens_per_request, max_model_len,
                                "re-run your quality evaluation: uncalibrated fp8 uses scales of 1.0"))
    if "max_model_len_over_kv" in kinds and plan is not None and plan.startup is not None:
        est = plan.startup.estimated_max_model_len
        if est > 0:
            out.append(_alternative(spec, f"lower max_model_len to {est:,} (the longest that fits)",
                                    (f"--max-model-len {est}",), tokens_per_request, est))
    if (kv_problem or "no_kv_memory" in kinds) and hw is not None and plan is not None:
        util = _needed_utilization(spec, hw, plan)
        if util is not None:
            out.append(_alternative(replace(spec, utilization=util), f"raise gpu_memory_utilization to {util:g}",
                                    (f"--gpu-memory-utilization {util:g}",), tokens_per_request, max_model_len,
                                    "only if nothing else uses this GPU" if util > 0.95 else ""))
    params = _sixteen_bit_params(spec)
    wide = weight_scheme(spec.config, spec.weights_dtype).bits > 8
    if (weights_problem or kv_problem) and params is not None and wide:
        fp8w = replace(spec, weights_dtype="fp8", params=params, weights_memory_bytes=None)
        note = "serve an FP8-quantised checkpoint of the model"
        if spec.params is None:
            note += f"; --weights-memory read as a 16-bit checkpoint of {params:,} parameters"
        alt = _alternative(fp8w, "fp8 weights (half the bytes of bf16)", ("--weights-dtype fp8",),
                           tokens_per_request, max_model_len, note)
        out.append(alt)
        if not alt.fits and kv16:
            out.append(_alternative(replace(fp8w, kv_cache_dtype="fp8"), "fp8 weights and fp8 KV cache",
                                    ("--weights-dtype fp8", "--kv-cache-dtype fp8"), tokens_per_request,
                                    max_model_len, note))
    if weights_problem or kv_problem or "tensor_parallel" in kinds:
        current = spec.tensor_parallel_size
        sizes = cap.valid_tensor_parallel_sizes(spec.config, max(MAX_TP_PER_NODE, current))
        larger = [t for t in sizes if t > current and t <= MAX_TP_PER_NODE]
        if "tensor_parallel" in kinds:
            smaller = [t for t in sizes if t < current]
            larger = smaller[-1:] + [t for t in sizes if t > current and t <= MAX_TP_PER_NODE]
        first_start: Alternative | None = None
        for t in larger:
            alt = _alternative(replace(spec, tensor_parallel_size=t), f"tensor parallel over {t} GPUs",
                               (f"--tensor-parallel-size {t}",), tokens_per_request, max_model_len)
            if alt.fits:
                out.append(alt)
                break
            if first_start is None and alt.kv_memory_bytes > 0:
                first_start = alt
                out.append(alt)
    out.sort(key=lambda a: not a.fits)   # stable: fitting first, each group in the seed's order
    return tuple(out)


def assess(spec: DeploymentSpec, tokens_per_request: int, max_model_len: int | None = None) -> Assessment:
    """Would vLLM start and serve with this deployment? Problems in vLLM's order, remedies with figures."""
    hw, plan, sched, mml, source, problems = _evaluate(spec, tokens_per_request, max_model_len)
    alternatives = propose(spec, tokens_per_request, max_model_len, hw, plan, problems) if problems else ()
    return Assessment(spec, hw, plan, sched, mml, source, tuple(problems), alternatives)
