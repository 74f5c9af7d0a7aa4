"""`headroom plan`: how many tokens and concurrent requests a GPU's KV cache holds.

The maths is in `proxy.capacity`; this module only turns options into
`PlanInputs` and a `Plan` into text or JSON.  `add_capacity_arguments` and
`capacity_from_args` are shared with `headroom report`, which prints what its
recommended `max_model_len` buys on the same hardware.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any, Sequence

from proxy import capacity as cap
from proxy.gpus import lookup_gpu


@dataclass(frozen=True)
class Hardware:
    """Model and GPU as resolved from the options (no request length yet)."""

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

    def inputs(self, tokens_per_request: int, max_model_len: int | None) -> cap.PlanInputs:
        return cap.PlanInputs(
            bytes_per_token=self.layout.bytes_per_token,
            gpu_memory_bytes=self.gpu_memory_bytes, weights_bytes=self.weights_bytes,
            utilization=self.utilization, activation_bytes=self.activation_bytes,
            block_size=self.block_size, tokens_per_request=tokens_per_request,
            max_model_len=max_model_len, target_concurrency=self.target_concurrency,
            gpu_hourly_usd=self.gpu_hourly_usd,
        )


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
    weights.add_argument("--weights-memory", type=_size, metavar="SIZE", help="weights in GPU memory, e.g. 14.2GiB")
    weights.add_argument("--params", type=_positive_int, metavar="N",
                         help="parameter count; weights = N × the model dtype's bytes")
    g.add_argument("--block-size", type=_positive_int, default=cap.DEFAULT_BLOCK_SIZE,
                   help="vLLM KV block size in tokens (default 16)")
    g.add_argument("--target-concurrency", type=_positive_int, metavar="C",
                   help="concurrent requests to serve: prints the GPUs needed")
    g.add_argument("--gpu-hourly-cost", type=float, metavar="USD", help="price of one GPU per hour")


def capacity_from_args(args: argparse.Namespace) -> Hardware:
    """Resolve model, GPU and weights; ValueError/KeyError with a clear message otherwise."""
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
    layout = cap.kv_layout(config, args.kv_cache_dtype)
    if args.gpu:
        gpu = lookup_gpu(args.gpu)
        gpu_label, gpu_bytes = gpu.name, gpu.memory_bytes
    elif args.gpu_memory is not None:
        gpu_label, gpu_bytes = "custom", args.gpu_memory
    else:
        raise ValueError("give the GPU: --gpu NAME or --gpu-memory SIZE")
    if args.weights_memory is not None:
        weights = args.weights_memory
    elif params is not None:
        weights = cap.weights_bytes(params, cap.dtype_bytes("auto", config))
    else:
        raise ValueError("give the weights: --weights-memory SIZE or --params N")
    return Hardware(
        model_label=model_label, layout=layout, gpu_label=gpu_label, gpu_memory_bytes=gpu_bytes,
        weights_bytes=weights, utilization=args.gpu_memory_utilization,
        activation_bytes=args.activation_memory, block_size=args.block_size,
        target_concurrency=args.target_concurrency, gpu_hourly_usd=args.gpu_hourly_cost,
    )


def register(subparsers: Any) -> None:
    """Add the `plan` sub-command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "plan", help="KV-cache capacity: tokens, concurrent requests, GPUs, cost",
        description="Size the KV cache of one GPU (one vLLM instance) for a model.",
    )
    add_capacity_arguments(p)
    p.add_argument("--tokens-per-request", type=_positive_int, default=1500,
                   help="prompt + completion tokens of a typical request (default 1500)")
    p.add_argument("--max-model-len", type=_positive_int, metavar="L",
                   help="vLLM's max_model_len: checks vLLM would start, and the cost of reserving L per request")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        hw = capacity_from_args(args)
        plan = cap.make_plan(hw.inputs(args.tokens_per_request, args.max_model_len))
    except (ValueError, KeyError, OSError) as e:
        print(f"headroom plan: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    if args.format == "json":
        print(json.dumps(plan_to_dict(hw, plan), indent=2))
    else:
        print(format_plan(hw, plan))
    return 1 if plan.startup is not None and not plan.startup.fits else 0


def plan_to_dict(hw: Hardware, plan: cap.Plan) -> dict[str, Any]:
    return {
        "model": hw.model_label,
        "gpu": hw.gpu_label,
        "kv_layout": asdict(hw.layout),
        "kv_bytes_per_token": hw.layout.bytes_per_token,
        "kv_kib_per_token": hw.layout.bytes_per_token / cap.KIB,
        "kv_memory_gib": plan.memory.kv_memory_bytes / cap.GIB,
        **{k: v for k, v in asdict(plan).items()},
    }


def _n(x: int) -> str:
    return f"{x:,}"


def format_plan(hw: Hardware, plan: cap.Plan) -> str:
    """Aligned 'label  value' lines; units spelled out (GiB = 2^30, GB = 10^9)."""
    lay, mem, inp = hw.layout, plan.memory, plan.inputs
    rows: list[tuple[str, str]] = []
    if lay.attention == "mla":
        shape = f"mla: {lay.kv_layers} layers × {lay.elements_per_layer}-element latent × {lay.dtype_bytes} B"
    else:
        shape = (f"{lay.attention}: 2 × {lay.kv_layers} layers × {lay.kv_heads} KV heads × "
                 f"head_dim {lay.head_dim} × {lay.dtype_bytes} B")
    rows.append(("model", f"{hw.model_label}  [{shape}]"))
    rows.append(("KV per token", f"{_n(lay.bytes_per_token)} B = {lay.bytes_per_token / cap.KIB:g} KiB"))
    rows.append(("GPU memory", f"{cap.format_both(mem.gpu_memory_bytes)}  [{hw.gpu_label}]"))
    rows.append(("× utilization", f"{mem.utilization:g} → {cap.format_both(mem.usable_bytes)}"))
    rows.append(("− weights", cap.format_both(mem.weights_bytes)))
    rows.append(("− activations", cap.format_both(mem.activation_bytes)))
    rows.append(("= KV memory", cap.format_both(mem.kv_memory_bytes)))
    rows.append(("KV tokens", f"{_n(plan.kv_tokens)}  (vLLM allocates {_n(plan.kv_blocks)} blocks of "
                              f"{inp.block_size} = {_n(plan.kv_blocks * inp.block_size)} tokens)"))
    rows.append(("per request", f"{_n(inp.tokens_per_request)} tokens → {_n(plan.slots_per_request)} slots "
                                f"({plan.slots_per_request // inp.block_size} blocks, "
                                f"{cap.format_bytes(plan.slots_per_request * lay.bytes_per_token)})"))
    rows.append(("concurrent requests", _n(plan.concurrent_requests)))
    if plan.gpus_for_target is not None or inp.target_concurrency is not None:
        gpus = "none fit on one GPU" if plan.gpus_for_target is None else f"{_n(plan.gpus_for_target)} GPU(s)"
        rows.append((f"for {_n(inp.target_concurrency or 0)} concurrent", gpus))
    if plan.monthly_cost_usd is not None:
        rows.append(("monthly cost", f"${plan.monthly_cost_usd:,.2f}  ({plan.gpus_for_target} × "
                                     f"${inp.gpu_hourly_usd:g}/h × {cap.HOURS_PER_MONTH} h)"))
    if plan.startup is not None:
        s = plan.startup
        rows.append((f"max_model_len {_n(s.max_model_len)}",
                     ("fits" if s.fits else "DOES NOT FIT") +
                     f": one request needs {cap.format_bytes(s.needed_bytes)}; longest that fits "
                     f"{_n(s.estimated_max_model_len)}"))
        if plan.concurrent_at_max_model_len is not None:
            line = f"{_n(plan.concurrent_at_max_model_len)} concurrent"
            if plan.gpus_at_max_model_len is not None:
                line += f", {_n(plan.gpus_at_max_model_len)} GPU(s) for {_n(inp.target_concurrency or 0)}"
            if plan.monthly_cost_at_max_model_len_usd is not None:
                line += f", ${plan.monthly_cost_at_max_model_len_usd:,.2f}/month"
            rows.append((f"reserving {_n(s.max_model_len)}/request", line))
    step = plan.utilization_step
    rows.append((f"+{step.step:g} utilization", f"+{step.bytes / cap.GIB:.2f} GiB ({cap.format_bytes(step.bytes, binary=False)}) = +{_n(step.tokens)} tokens"))
    waste = plan.mean_last_block_waste
    rows.append(("mean last-block waste", f"{waste:g} tokens per request "
                                          f"({100 * waste / inp.tokens_per_request:.2f}% of {_n(inp.tokens_per_request)})"))
    width = max(len(label) for label, _ in rows)
    lines = [f"{label:<{width}}  {value}" for label, value in rows]
    for note in lay.notes:
        lines.append(f"note: {note}")
    for warning in plan.warnings:
        lines.append(f"WARNING: {warning}")
    if plan.startup is not None and not plan.startup.fits:
        lines.append(f"vLLM would fail with: {plan.startup.message}")
        lines.append(f"fix: {plan.startup.fix}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `plan` on its own: `python -m proxy.plan_cli --preset Qwen3-8B --gpu H100-80GB`."""
    parser = argparse.ArgumentParser(prog="headroom")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["plan", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
