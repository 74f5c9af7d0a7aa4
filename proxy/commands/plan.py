"""`brimful plan`: how many tokens and concurrent requests a GPU's KV cache holds.

The maths is in `proxy.sizing.capacity` and the judgement (does vLLM start? what
would fit instead?) in `proxy.sizing.deploy`; this module only turns options into a
`DeploymentSpec` and an `Assessment` into text or JSON.  `add_capacity_arguments` and
`capacity_from_args` are shared with `brimful report`, which prints what its
recommended `max_model_len` buys on the same hardware.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from proxy.sizing import capacity as cap
from proxy.sizing.deploy import Assessment, DeploymentSpec, Hardware, assess, resolve
from proxy.sizing.gpus import lookup_gpu
from proxy.sizing.kv_groups import KvGroups
from proxy.sizing.weights import WEIGHT_DTYPES

__all__ = ["Hardware", "add_capacity_arguments", "capacity_from_args", "main", "register", "run", "spec_from_args"]


def _size(text: str) -> int:
    try:
        return cap.parse_bytes(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def add_capacity_arguments(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """Model + GPU options shared by `plan` and `report` (all optional for report)."""
    g = parser.add_argument_group("model and GPU")
    model = g.add_mutually_exclusive_group(required=required)
    model.add_argument("--model-config", metavar="CONFIG_JSON",
                       help="the model's HF config.json (or its directory)")
    model.add_argument("--preset", metavar="NAME",
                       help=f"the article's models: {', '.join(cap.PRESETS)}")
    gpu = g.add_mutually_exclusive_group()
    gpu.add_argument("--gpu-memory", type=_size, metavar="SIZE",
                     help="GPU memory, e.g. 80GiB, 80GB (10^9), 85899345920 (bytes)")
    gpu.add_argument("--gpu", metavar="NAME", help="named GPU, e.g. H100-80GB, A10-24GB (sizes read as GiB)")
    g.add_argument("--gpu-memory-utilization", type=float, default=cap.DEFAULT_UTILIZATION,
                   help="vLLM's gpu_memory_utilization (default 0.92)")
    g.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bf16", "fp16", "fp8"],
                   help="vLLM's --kv-cache-dtype (auto = the model's dtype)")
    g.add_argument("--activation-memory", type=_size, default=cap.DEFAULT_ACTIVATION_BYTES,
                   metavar="SIZE", help="activations + CUDA graphs (default 4GiB, the article's figure)")
    weights = g.add_mutually_exclusive_group()
    weights.add_argument("--weights-memory", type=_size, metavar="SIZE",
                         help="the checkpoint's weights, e.g. 14.2GiB (split over --tensor-parallel-size GPUs)")
    weights.add_argument("--params", type=_positive_int, metavar="N",
                         help="parameter count; weights = N × the bytes per parameter of --weights-dtype")
    g.add_argument("--weights-dtype", default="auto", choices=list(WEIGHT_DTYPES),
                   help="auto = config.json's quantization_config, else the model dtype; fp8/int8/int4 = a "
                        "quantised checkpoint (embeddings stay at the model dtype)")
    g.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1, metavar="N",
                   help="vLLM's --tensor-parallel-size: weights and KV heads split over N GPUs (default 1)")
    g.add_argument("--max-num-seqs", type=_positive_int, metavar="N",
                   help="vLLM's --max-num-seqs (default: vLLM's for the GPU, 1024 on H100, 256 on A100/L4)")
    g.add_argument("--block-size", type=_positive_int, default=cap.DEFAULT_BLOCK_SIZE,
                   help="vLLM KV block size in tokens (default 16; vLLM's CPU backend uses 128, and 16 for MLA)")
    g.add_argument("--disable-hybrid-kv-cache-manager", action=argparse.BooleanOptionalAction, default=None,
                   help="vLLM's flag: allocate sliding-window and chunked layers as full attention (default: "
                        "vLLM's choice, on only for chunked local attention)")
    g.add_argument("--chunked-local-attn-with-hybrid-kv-cache", action="store_true",
                   help="as VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1: keep the hybrid manager for "
                        "chunked local attention (Llama 4)")
    g.add_argument("--mamba-ssm-cache-dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help="vLLM's flag for linear-attention state (auto = the model dtype, or Qwen3.5's "
                        "mamba_ssm_dtype; vLLM's CPU backend forces float32 on AVX-512-BF16 machines)")
    g.add_argument("--mamba-cache-mode", default="align", choices=["align", "none"],
                   help="vLLM's flag: align (its default with prefix caching) keeps 2 state pages per request")
    g.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM's async scheduling (default on, as on GPUs; off on vLLM's CPU backend): two "
                        "batches in flight, which sliding-window layers hold beyond their window")
    g.add_argument("--target-concurrency", type=_positive_int, metavar="C",
                   help="concurrent requests to serve: prints the GPUs needed")
    g.add_argument("--gpu-hourly-cost", type=float, metavar="USD", help="price of one GPU per hour")


def spec_from_args(args: argparse.Namespace) -> DeploymentSpec:
    """The operator's choices from the options; ValueError/KeyError with a clear message otherwise."""
    params: int | None = args.params
    if args.preset:
        preset = cap.lookup_preset(args.preset)
        config: dict[str, Any] = dict(preset.config)
        model_label = f"{preset.name} (preset)"
        if params is None and args.weights_memory is None:
            params = preset.params
    else:
        config = cap.load_model_config(args.model_config)
        model_label = args.model_config
    gpu_name: str | None = None
    if args.gpu:
        gpu = lookup_gpu(args.gpu)
        gpu_label, gpu_bytes, gpu_name = gpu.name, gpu.memory_bytes, gpu.name
    elif args.gpu_memory is not None:
        gpu_label, gpu_bytes = "custom", args.gpu_memory
    else:
        raise ValueError("give the GPU: --gpu NAME or --gpu-memory SIZE")
    return DeploymentSpec(
        config=config, model_label=model_label, gpu_label=gpu_label, gpu_memory_bytes=gpu_bytes,
        gpu_name=gpu_name, params=params, weights_memory_bytes=args.weights_memory,
        weights_dtype=args.weights_dtype, kv_cache_dtype=args.kv_cache_dtype,
        tensor_parallel_size=args.tensor_parallel_size, utilization=args.gpu_memory_utilization,
        activation_bytes=args.activation_memory, block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None),
        enable_chunked_prefill=getattr(args, "enable_chunked_prefill", True),
        target_concurrency=args.target_concurrency, gpu_hourly_usd=args.gpu_hourly_cost,
        hybrid_kv_cache_manager=_inverted(getattr(args, "disable_hybrid_kv_cache_manager", None)),
        chunked_local_hybrid=getattr(args, "chunked_local_attn_with_hybrid_kv_cache", False),
        async_scheduling=getattr(args, "async_scheduling", True),
        mamba_ssm_cache_dtype=getattr(args, "mamba_ssm_cache_dtype", "auto"),
        mamba_cache_mode=getattr(args, "mamba_cache_mode", "align"),
    )


def _inverted(flag: bool | None) -> bool | None:
    return None if flag is None else not flag


def capacity_from_args(args: argparse.Namespace) -> Hardware:
    """Resolve model, GPU and weights per GPU (shared with `brimful report`)."""
    return resolve(spec_from_args(args))


def register(subparsers: Any) -> None:
    """Add the `plan` sub-command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "plan", help="KV-cache capacity: tokens, concurrent requests, GPUs, cost",
        description="Size the KV cache of one vLLM instance (one GPU, or --tensor-parallel-size GPUs) for a "
                    "model; say whether vLLM would start, and what would fit when it would not.",
    )
    add_capacity_arguments(p)
    p.add_argument("--tokens-per-request", type=_positive_int, default=1500,
                   help="prompt + completion tokens of a typical request (default 1500)")
    p.add_argument("--max-model-len", type=_positive_int, metavar="L",
                   help="vLLM's max_model_len (default: what vLLM derives from config.json): checks vLLM would "
                        "start, and the cost of reserving L per request")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, metavar="N",
                   help="vLLM's --max-num-batched-tokens (default: vLLM's for the GPU, 8192 on H100)")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=True,
                   help="vLLM's chunked prefill (default on); off requires max_num_batched_tokens ≥ max_model_len")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Exit 0 when vLLM would start and serve; 1 when it would not (the reasons first); 2 on bad options."""
    try:
        spec = spec_from_args(args)
        result = assess(spec, args.tokens_per_request, args.max_model_len)
    except (ValueError, KeyError, OSError) as e:
        print(f"brimful plan: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(assessment_to_dict(result), indent=2))
    else:
        print(format_assessment(result))
    return 0 if result.fits else 1


def plan_to_dict(hw: Hardware, plan: cap.Plan) -> dict[str, Any]:
    """The plan's figures; a missing KV cache shows as 0 plus a shortfall, never as a negative size."""
    out: dict[str, Any] = {
        "model": hw.model_label,
        "gpu": hw.gpu_label,
        "kv_layout": asdict(hw.layout),
        "kv_bytes_per_token": hw.layout.bytes_per_token,
        "kv_kib_per_token": hw.layout.bytes_per_token / cap.KIB,
        "kv_memory_gib": max(0, plan.memory.kv_memory_bytes) / cap.GIB,
        "kv_memory_shortfall_bytes": plan.memory.shortfall_bytes,
        **{k: v for k, v in asdict(plan).items()},
    }
    out["memory"]["kv_memory_bytes"] = max(0, plan.memory.kv_memory_bytes)
    return out


def assessment_to_dict(a: Assessment) -> dict[str, Any]:
    out: dict[str, Any] = {
        "fits": a.fits,
        "problems": [asdict(p) for p in a.problems],
        "alternatives": [asdict(alt) for alt in a.alternatives],
        "tensor_parallel_size": a.spec.tensor_parallel_size,
        "max_model_len": a.max_model_len,
        "max_model_len_source": a.max_model_len_source,
        "scheduler": asdict(a.scheduler) if a.scheduler is not None else None,
    }
    hw = a.hardware
    if hw is not None:
        out["weights_per_gpu_bytes"] = hw.weights_bytes
        out["weights"] = asdict(hw.weights) if hw.weights is not None else None
        out["model_context"] = asdict(hw.context) if hw.context is not None else None
        if a.plan is not None:
            out.update(plan_to_dict(hw, a.plan))
    return out


def _n(x: int) -> str:
    return f"{x:,}"


def _alternative_line(alt: Any, block: int) -> str:
    figures = (f"{alt.gpus_per_replica} GPU(s) per replica, weights {cap.format_bytes(alt.weights_per_gpu_bytes)}"
               f"/GPU, KV {cap.format_bytes(alt.kv_memory_bytes)} = {_n(alt.kv_tokens)} tokens, "
               f"{_n(alt.concurrency)} concurrent")
    if alt.fits:
        mml = f", max_model_len {_n(alt.max_model_len)} fits" if alt.max_model_len else ""
        line = f"  {' '.join(alt.flags)}: {alt.change} → {figures}{mml}"
    elif alt.kv_memory_bytes > 0:
        line = (f"  {' '.join(alt.flags)}: {alt.change} → {figures}; starts only with --max-model-len "
                f"{_n(alt.longest_max_model_len)} or less")
    else:
        line = f"  {' '.join(alt.flags)}: {alt.change} → still does not fit"
    return line + (f"  ({alt.note})" if alt.note else "")


def format_assessment(a: Assessment) -> str:
    """The verdict first (what stops vLLM, what would fit), then the figures."""
    lines: list[str] = []
    if a.problems:
        lines.append("DOES NOT FIT: " + a.problems[0].message)
        for problem in a.problems[1:]:
            lines.append("also: " + problem.message)
        for problem in a.problems:
            if problem.vllm_error and problem.kind not in ("max_model_len_over_kv",):
                lines.append(f"vLLM says: {problem.vllm_error}")
        fitting = [alt for alt in a.alternatives if alt.fits]
        partial = [alt for alt in a.alternatives if not alt.fits]
        if fitting:
            lines.append("would fit:")
            lines.extend(_alternative_line(alt, a.spec.block_size) for alt in fitting)
        else:
            lines.append("nothing tried fits on up to 8 GPUs per replica with fp8 weights and KV"
                         if a.alternatives else "no remedy applies: use a bigger GPU")
        if partial:
            lines.append("would not be enough on its own:")
            lines.extend(_alternative_line(alt, a.spec.block_size) for alt in partial)
        lines.append("")
    if a.hardware is not None and a.plan is not None:
        lines.append(format_plan(a.hardware, a.plan, a))
    return "\n".join(lines).rstrip("\n")


def _group_text(groups: KvGroups) -> str:
    """'6 groups (5 × sliding window 256, 1 × full) of 1 layer, one pool block = 32,768 B'."""
    kinds: dict[str, int] = {}
    for g in groups.groups:
        spec = g.spec
        name = {"sliding": "sliding window", "chunked": "chunked local"}.get(spec.kind, spec.kind)
        if spec.window is not None:
            name += f" {spec.window:,}"
        kinds[name] = kinds.get(name, 0) + 1
    widest = max(len(g.layers) for g in groups.groups)
    text = (f"{len(groups.groups)} group(s) ({', '.join(f'{n} × {k}' for k, n in kinds.items())}) of up to "
            f"{widest} layer(s), one pool block = {_n(groups.bytes_per_block)} B")
    if groups.padding_layers:
        text += f"; {groups.padding_layers} padding layer(s)"
    if groups.promoted:
        text += "; hybrid manager off: local layers allocated as full attention"
    return text


def _kv_rows(plan: cap.Plan) -> list[tuple[str, str]]:
    """KV tokens, vLLM's groups and start-up figures, and what one request takes."""
    inp = plan.inputs
    groups = inp.groups()
    block = groups.block_size
    local = any(g.spec.kind in ("sliding", "chunked") for g in groups.groups)
    rows: list[tuple[str, str]] = []
    if len(groups.groups) > 1 or local or groups.promoted:
        rows.append(("KV cache groups", _group_text(groups)))
    if len(groups.groups) > 1 or local:
        rows.append(("KV tokens", f"{_n(plan.kv_tokens)} at {_n(inp.max_model_len or inp.tokens_per_request)} "
                                  f"tokens per request  (vLLM allocates {_n(plan.kv_blocks)} blocks)"))
    else:
        rows.append(("KV tokens", f"{_n(plan.kv_tokens)}  (vLLM allocates {_n(plan.kv_blocks)} blocks of "
                                  f"{block} = {_n(plan.kv_blocks * block)} tokens)"))
    starts = plan.startup is not None and plan.startup.fits
    if starts and plan.vllm_kv_cache_tokens is not None and plan.vllm_max_concurrency is not None:
        rows.append(("vLLM logs", f"KV cache size: {_n(plan.vllm_kv_cache_tokens)} tokens, Maximum concurrency "
                                  f"for {_n(inp.max_model_len or 0)} tokens per request: "
                                  f"{plan.vllm_max_concurrency:.2f}x"))
    slots = "" if local or len(groups.groups) > 1 else f" = {_n(plan.slots_per_request)} slots"
    rows.append(("per request", f"{_n(inp.tokens_per_request)} tokens → {_n(plan.blocks_per_request)} blocks "
                                f"({cap.format_bytes(plan.blocks_per_request * groups.bytes_per_block)}){slots}"))
    return rows


def format_plan(hw: Hardware, plan: cap.Plan, a: Assessment | None = None) -> str:
    """Aligned 'label  value' lines; units spelled out (GiB = 2^30, GB = 10^9); no negative figure."""
    rows = [*_model_rows(hw), *_memory_rows(hw, plan), *_kv_rows(plan), *_concurrency_rows(hw, plan),
            *_startup_rows(hw, plan, a), *_margin_rows(plan)]
    width = max(len(label) for label, _ in rows)
    return "\n".join([f"{label:<{width}}  {value}" for label, value in rows] + _notes(hw, plan, a))


def _model_rows(hw: Hardware) -> list[tuple[str, str]]:
    lay, tp = hw.layout, hw.tensor_parallel_size
    per_gpu = " per GPU" if tp > 1 else ""
    if lay.attention == "mla":
        shape = f"mla: {lay.kv_layers} layers × {lay.elements_per_layer}-element latent × {lay.dtype_bytes} B"
    else:
        shape = (f"{lay.attention}: 2 × {lay.kv_layers} layers × {lay.kv_heads} KV heads{per_gpu} × "
                 f"head_dim {lay.head_dim} × {lay.dtype_bytes} B")
    rows = [("model", f"{hw.model_label}  [{shape}]")]
    if tp > 1:
        heads = (f"{lay.kv_heads_total} → {lay.kv_heads} KV heads per GPU" if lay.kv_heads_total
                 else "latent on every GPU")
        rows.append(("tensor parallel", f"{tp} GPUs per replica: 1/{tp} of the weights and {heads}"))
    rows.append((f"KV per token{per_gpu}", f"{_n(lay.bytes_per_token)} B = {lay.bytes_per_token / cap.KIB:g} KiB"))
    return rows


def _memory_rows(hw: Hardware, plan: cap.Plan) -> list[tuple[str, str]]:
    """GPU memory × utilization − weights − activations = the KV cache."""
    mem, tp, w = plan.memory, hw.tensor_parallel_size, hw.weights
    rows = [("GPU memory", f"{cap.format_both(mem.gpu_memory_bytes)}  [{hw.gpu_label}]"),
            ("× utilization", f"{mem.utilization:g} → {cap.format_both(mem.usable_bytes)}")]
    how = ""
    if w is not None:
        how = f"  [{w.scheme.detail}"
        if w.kept_params:
            how += f"; {_n(w.kept_params)} embedding params at {w.kept_bytes_per_param} B"
        how += f"; {_n(w.params)} params" + (f" ÷ TP {tp}" if tp > 1 else "") + "]"
    rows.append((f"− weights{' per GPU' if tp > 1 else ''}", cap.format_both(mem.weights_bytes) + how))
    rows.append(("− activations", cap.format_both(mem.activation_bytes)))
    if mem.kv_memory_bytes > 0:
        rows.append(("= KV memory", cap.format_both(mem.kv_memory_bytes)))
    else:
        rows.append(("= KV memory", f"none: short by {cap.format_both(mem.shortfall_bytes)}"))
    return rows


def _concurrency_rows(hw: Hardware, plan: cap.Plan) -> list[tuple[str, str]]:
    inp, tp = plan.inputs, hw.tensor_parallel_size
    conc = f"{_n(plan.concurrent_requests)} (memory bound)"
    if inp.max_num_seqs is not None:
        if plan.limited_by == "max_num_seqs":
            conc += f"; vLLM runs at most max_num_seqs = {_n(inp.max_num_seqs)} at once"
        else:
            conc += f"; max_num_seqs {_n(inp.max_num_seqs)} does not bind"
    rows = [("concurrent requests", conc)]
    if plan.gpus_for_target is not None or inp.target_concurrency is not None:
        gpus = "none fit on one replica" if plan.gpus_for_target is None else f"{_n(plan.gpus_for_target)} GPU(s)"
        if plan.gpus_for_target is not None and tp > 1:
            gpus += f" ({plan.gpus_for_target // tp} replicas × {tp})"
        rows.append((f"for {_n(inp.target_concurrency or 0)} concurrent", gpus))
    if plan.monthly_cost_usd is not None:
        rows.append(("monthly cost", f"${plan.monthly_cost_usd:,.2f}  ({plan.gpus_for_target} × "
                                     f"${inp.gpu_hourly_usd:g}/h × {cap.HOURS_PER_MONTH} h)"))
    return rows


def _startup_rows(hw: Hardware, plan: cap.Plan, a: Assessment | None) -> list[tuple[str, str]]:
    """Whether vLLM starts with this max_model_len, the model's own bound, the scheduler's limits."""
    inp, rows = plan.inputs, []
    if plan.startup is not None:
        s = plan.startup
        source = f" ({a.max_model_len_source})" if a is not None and a.max_model_len_source != "given" else ""
        rows.append((f"max_model_len {_n(s.max_model_len)}",
                     ("fits" if s.fits else "DOES NOT FIT") + f"{source}: one request needs "
                     f"{cap.format_bytes(s.needed_bytes)}; longest that fits {_n(s.estimated_max_model_len)}"))
        if plan.concurrent_at_max_model_len is not None:
            line = f"{_n(plan.concurrent_at_max_model_len)} concurrent"
            if plan.gpus_at_max_model_len is not None:
                line += f", {_n(plan.gpus_at_max_model_len)} GPU(s) for {_n(inp.target_concurrency or 0)}"
            if plan.monthly_cost_at_max_model_len_usd is not None:
                line += f", ${plan.monthly_cost_at_max_model_len_usd:,.2f}/month"
            rows.append((f"reserving {_n(s.max_model_len)}/request", line))
    if hw.context is not None:
        rows.append(("model context", f"{_n(hw.context.max_model_len)} ({hw.context.key}"
                                      + (f" × {hw.context.scaling_factor:g}" if hw.context.scaling_factor != 1 else "")
                                      + "): the largest --max-model-len vLLM accepts"))
    if a is not None and a.scheduler is not None:
        sc = a.scheduler
        why = f" (vLLM's defaults: {sc.defaults_from})" if sc.defaults_from else ""
        rows.append(("scheduler", f"max_num_seqs {_n(sc.max_num_seqs)}, max_num_batched_tokens "
                                  f"{_n(sc.max_num_batched_tokens)}, chunked prefill "
                                  f"{'on' if sc.chunked_prefill else 'off'}{why}"))
    return rows


def _margin_rows(plan: cap.Plan) -> list[tuple[str, str]]:
    """What one more step of utilization buys, and what the last block wastes."""
    mem, inp, step, rows = plan.memory, plan.inputs, plan.utilization_step, []
    if mem.kv_memory_bytes > 0:
        rows.append((f"+{step.step:g} utilization", f"+{step.bytes / cap.GIB:.2f} GiB "
                     f"({cap.format_bytes(step.bytes, binary=False)}) = +{_n(step.tokens)} tokens"))
    waste = plan.mean_last_block_waste
    share = 100 * waste / inp.tokens_per_request
    rows.append(("mean last-block waste",
                 f"{waste:g} tokens per request ({share:.2f}% of {_n(inp.tokens_per_request)})"))
    return rows


def _notes(hw: Hardware, plan: cap.Plan, a: Assessment | None) -> list[str]:
    notes = [*hw.layout.notes, *(hw.weights.notes if hw.weights is not None else ()),
             *(hw.context.notes if hw.context is not None else ()),
             *(a.scheduler.notes if a is not None and a.scheduler is not None else ())]
    lines = [f"note: {note}" for note in notes] + [f"WARNING: {warning}" for warning in plan.warnings]
    if plan.startup is not None and not plan.startup.fits and plan.memory.kv_memory_bytes > 0:
        lines.append(f"vLLM would fail with: {plan.startup.message}")
        lines.append(f"fix: {plan.startup.fix}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run `plan` on its own: `python -m proxy.commands.plan --preset Qwen3-8B --gpu H100-80GB`."""
    parser = argparse.ArgumentParser(prog="brimful")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["plan", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
