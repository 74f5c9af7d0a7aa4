"""`headroom report`: per-model length percentiles and a `max_model_len` recommendation.

Definitions (percentiles, total vs. sequence length, n > 1) are in
`proxy.report`.  With `--model-config`/`--preset` and the GPU options of
`headroom plan`, also prints what the recommendation buys on that GPU: KV
tokens, concurrent requests at the observed mean and p95 total length, and
GPUs for `--target-concurrency`.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from typing import Any, Sequence

from proxy import capacity as cap
from proxy import report as rep
from proxy.plan_cli import Hardware, add_capacity_arguments, capacity_from_args


def _percentile_arg(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"percentile must be in (0, 100], got {text}")
    return value


def register(subparsers: Any) -> None:
    """Add the `report` sub-command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "report", help="length percentiles per model and a max_model_len recommendation",
        description="Summarise headroom length logs (JSONL, one LengthRecord per line; "
                    "several files = several replicas, merged; .gz and - for stdin accepted).",
    )
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--model", help="only this served model name")
    p.add_argument("--since", help="only records from this time: 24h, 7d, unix seconds or ISO time (UTC if no zone)")
    p.add_argument("--percentile", type=_percentile_arg, default=99.0,
                   help="percentile of sequence length the recommendation covers (default 99)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    add_capacity_arguments(p, required=False)
    p.set_defaults(func=run)


def capacity_for(hw: Hardware, model: dict[str, Any]) -> dict[str, Any] | None:
    """What the recommended max_model_len buys on `hw`, for one model's report."""
    total = model["total_tokens"]
    rec = model["recommendation"]
    if not total["count"] or rec is None:
        return None
    mean_len = max(1, math.ceil(total["mean"]))
    p95_len = max(1, math.ceil(total["p95"]))
    at_mean = cap.make_plan(hw.inputs(mean_len, rec["max_model_len"]))
    at_p95 = cap.make_plan(hw.inputs(p95_len, rec["max_model_len"]))
    startup = at_mean.startup
    assert startup is not None
    return {
        "model_config": hw.model_label,
        "gpu": hw.gpu_label,
        "kv_bytes_per_token": hw.layout.bytes_per_token,
        "kv_memory_bytes": at_mean.memory.kv_memory_bytes,
        "kv_tokens": at_mean.kv_tokens,
        "mean_total_tokens": mean_len,
        "concurrent_at_mean": at_mean.concurrent_requests,
        "p95_total_tokens": p95_len,
        "concurrent_at_p95": at_p95.concurrent_requests,
        "target_concurrency": hw.target_concurrency,
        "gpus_at_mean": at_mean.gpus_for_target,
        "gpus_at_p95": at_p95.gpus_for_target,
        "monthly_cost_at_p95_usd": at_p95.monthly_cost_usd,
        "recommended_max_model_len_fits": startup.fits,
        "longest_max_model_len_that_fits": startup.estimated_max_model_len,
        "vllm_startup_error": startup.message,
        "notes": list(hw.layout.notes),
    }


def run(args: argparse.Namespace) -> int:
    try:
        since = rep.parse_since(args.since, time.time()) if args.since else None
        hw = capacity_from_args(args) if (args.model_config or args.preset) else None
        if hw is None and (args.gpu or args.gpu_memory is not None or args.target_concurrency):
            raise ValueError("the GPU options need the model: add --model-config CONFIG_JSON or --preset NAME")
    except (ValueError, KeyError, OSError) as e:
        print(f"headroom report: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    progress = rep.Progress()
    try:
        builder = rep.build_report(args.files, model=args.model, since=since, progress=progress)
    except OSError as e:
        progress.done()
        print(f"headroom report: error: {e}", file=sys.stderr)
        return 2
    progress.done()
    models = [rep.model_report(s, args.percentile, args.block_size) for s in rep.iter_models(builder)]
    if hw is not None:
        for m in models:
            m["capacity"] = capacity_for(hw, m)
    st = builder.stats
    result = {
        "files": st.files, "lines": st.lines, "records": st.records,
        "malformed": st.malformed, "filtered": st.filtered,
        "percentile": args.percentile, "block_size": args.block_size,
        "models": models,
    }
    if args.format == "json":
        print(json.dumps(result, indent=2))
    else:
        print(format_report(result))
    return 0


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _num(x: float | int | None) -> str:
    if x is None:
        return "-"
    if isinstance(x, int) or float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:,.1f}"


def format_report(result: dict[str, Any]) -> str:
    p = result["percentile"]
    lines = [
        f"{result['records']:,} records from {len(result['files'])} file(s) "
        f"({result['lines']:,} lines; {result['malformed']:,} malformed and skipped; "
        f"{result['filtered']:,} outside --model/--since)",
    ]
    if not result["models"]:
        lines.append("no records to report")
    cols = ["count", "mean", "p50", "p90", "p95", "p99"]
    if rep.percentile_key(p) not in cols:
        cols.append(rep.percentile_key(p))
    cols.append("max")
    for m in result["models"]:
        lines.append("")
        lines.append(f"model {m['model']}: {m['requests']:,} requests, {m['completed']:,} with usage")
        if len(m["endpoints"]) > 1 or set(m["endpoints"]) - {"chat"}:
            lines.append("  endpoints: " + ", ".join(f"{name} {n:,}" for name, n in m["endpoints"].items()))
        lines.append(f"  clamped {_pct(m['clamped_share'])}, rejected {_pct(m['rejected_share'])}, "
                     f"upstream errors {_pct(m['upstream_error_share'])}, "
                     f"finish_reason=length {_pct(m['length_finish_share'])}"
                     + (f", n>1: {m['parallel_sampling_requests']:,}" if m["parallel_sampling_requests"] else ""))
        header = f"  {'tokens':<11}" + "".join(f"{c:>10}" for c in cols)
        lines.append(header)
        for label, key in (("prompt", "prompt_tokens"), ("completion", "completion_tokens"),
                           ("total", "total_tokens"), ("sequence", "sequence_tokens")):
            s = m[key]
            lines.append(f"  {label:<11}" + "".join(f"{_num(s.get(c)):>10}" for c in cols))
        rec = m["recommendation"]
        if rec is None:
            lines.append("  recommended max_model_len: - (no request with usage)")
        else:
            current = m["max_model_len_current"]
            lines.append(
                f"  recommended max_model_len: {rec['max_model_len']:,} "
                f"(p{p:g} of sequence length = {_num(rec['sequence_tokens_at_percentile'])}, "
                f"rounded up to blocks of {rec['block_size']}); would have clamped "
                f"{rec['would_clamp']:,} of {m['completed']:,} past requests ({_pct(rec['would_clamp_fraction'])})"
                + (f"; current max_model_len {current:,}" if current else "")
            )
        c = m.get("capacity")
        if c:
            lines.append(
                f"  on {c['gpu']} with {c['model_config']}: KV {cap.format_both(c['kv_memory_bytes'])} = "
                f"{c['kv_tokens']:,} tokens; concurrent at mean total {c['mean_total_tokens']:,}: "
                f"{c['concurrent_at_mean']:,}, at p95 {c['p95_total_tokens']:,}: {c['concurrent_at_p95']:,}"
            )
            if c["target_concurrency"] is not None:
                def g(x: int | None) -> str:
                    return "none fit on one GPU" if x is None else f"{x:,}"
                line = (f"  for {c['target_concurrency']:,} concurrent: {g(c['gpus_at_mean'])} GPU(s) at the mean, "
                        f"{g(c['gpus_at_p95'])} at p95")
                if c["monthly_cost_at_p95_usd"] is not None:
                    line += f" (${c['monthly_cost_at_p95_usd']:,.2f}/month at p95)"
                lines.append(line)
            if not c["recommended_max_model_len_fits"]:
                lines.append(f"  WARNING: vLLM would refuse to start with max_model_len {rec['max_model_len']:,}: "
                             f"{c['vllm_startup_error']}")
            for note in c["notes"]:
                lines.append(f"  note: {note}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run `report` on its own: `python -m proxy.report_cli lengths.jsonl`."""
    parser = argparse.ArgumentParser(prog="headroom")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
