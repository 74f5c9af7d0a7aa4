"""`brimful report`: per-model length percentiles, need, and a `max_model_len` that would serve it.

Definitions (percentiles, total vs. sequence length, n > 1, served vs.
asked vs. needed) are in `proxy.sizing.report`, `proxy.sizing.demand` and `proxy.sizing.need`.
The recommendation is the estimated percentile of need (censored data: cut and
refused requests bounded, not guessed), capped at the model's own context when `--model-config`
/ `--preset` gives its `config.json` (`proxy.sizing.model_context`) and at what the KV
cache holds: the running vLLM's pool with `--upstream URL`, else the plan's
with the GPU options of `brimful plan`.  With those GPU options it also prints
what the recommendation buys on that GPU: KV tokens, concurrent requests at the
mean and p95 of the need, and GPUs for `--target-concurrency`; with `--target-rate`
one pool against two pools routed by length (`proxy.sizing.pools`).

`--upstream URL` reads that vLLM's `/metrics` once and prints, per model it
serves, its real KV pool against the plan for the configuration (the
difference explained), the concurrency the pool allows at the p95 of demand,
and the "time to add capacity" signals one scrape can show, each with the
action seed 000 recommends (`proxy.sizing.live`; docs/vllm-behaviour.md).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

from proxy.commands.plan import Hardware, add_capacity_arguments, capacity_from_args
from proxy.sizing import capacity as cap
from proxy.sizing import need as nd
from proxy.sizing import pools as pl
from proxy.sizing import report as rep
from proxy.sizing import vllm_metrics as vm
from proxy.sizing.live import UpstreamSection, UpstreamView, upstream_section
from proxy.sizing.model_context import ContextBound, model_context_bound

SCRAPE_TIMEOUT_S = 10.0


def _percentile_arg(text: str) -> float:
    value = float(text)
    if not 0 < value <= 100:
        raise argparse.ArgumentTypeError(f"percentile must be in (0, 100], got {text}")
    return value


def register(subparsers: Any) -> None:
    """Add the `report` sub-command to a `parser.add_subparsers()` object."""
    p = subparsers.add_parser(
        "report", help="length percentiles per model and a max_model_len recommendation",
        description="Summarise brimful length logs (JSONL, one LengthRecord per line, or Parquet files with "
                    "the record's fields as columns; several files = several replicas, merged; globs, .gz and - "
                    "for stdin accepted).",
    )
    p.add_argument("files", nargs="*", metavar="FILE")
    p.add_argument("--model", help="only this served model name")
    p.add_argument("--since", help="only records from this time: 24h, 7d, unix seconds or ISO time (UTC if no zone)")
    p.add_argument("--percentile", type=_percentile_arg, default=99.0,
                   help="percentile of sequence length the recommendation covers (default 99)")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.add_argument("--engine", choices=["auto", "duckdb", "python"], default="auto",
                   help="who reads the files: DuckDB (all cores; JSON lines, .gz and Parquet) or Python line by "
                        "line; auto (default) takes DuckDB when installed and no FILE is -. Same output either way")
    p.add_argument("--upstream", action="append", default=[], metavar="URL",
                   help="a running vLLM (e.g. http://127.0.0.1:8000): read its /metrics once, compare its KV pool "
                        "with the plan, cap the recommendation at it; repeatable")
    p.add_argument("--target-rate", type=float, default=None, metavar="REQ_PER_S",
                   help="requests per second to size one pool and two pools routed by length for (needs the KV "
                        "cache: --upstream URL or the GPU options)")
    add_capacity_arguments(p, required=False)
    p.set_defaults(func=run)


def capacity_for(hw: Hardware, model: dict[str, Any], need: nd.NeedModel) -> dict[str, Any] | None:
    """What the recommended max_model_len buys on `hw`, at the mean and p95 of the estimated need.

    Each need counts with at most the recommended max_model_len: a longer one is cut to it (exact for
    n = 1; a request with n > 1 choices may hold more).
    """
    rec = model["recommendation"]
    if rec is None or need.tally.n <= 0:
        return None
    limit = rec["max_model_len"]
    q95 = need.quantile(95)
    assert q95 is not None
    mean_len = max(1, math.ceil(need.clipped_mean(limit)))
    p95_len = max(1, min(q95.value, limit))
    at_mean = cap.make_plan(hw.inputs(mean_len, rec["max_model_len"]))
    at_p95 = cap.make_plan(hw.inputs(p95_len, rec["max_model_len"]))
    startup = at_mean.startup
    assert startup is not None
    return {
        "model_config": hw.model_label,
        "gpu": hw.gpu_label,
        "kv_bytes_per_token": hw.layout.bytes_per_token,
        "kv_memory_bytes": max(0, at_mean.memory.kv_memory_bytes),
        "kv_tokens": at_mean.kv_tokens,
        "mean_demand_kv_tokens": mean_len,
        "concurrent_at_mean": at_mean.concurrent_requests,
        "p95_demand_kv_tokens": p95_len,
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


def pools_for(stats: rep.ModelStats, m: dict[str, Any], kv_tokens: int, kv_source: str | None,
              args: argparse.Namespace, hw: Hardware | None) -> dict[str, Any] | None:
    """The one-pool answer and the short/long split beside it (`proxy.sizing.pools`), for the target rate."""
    rate = args.target_rate
    if rate is None or rate <= 0:
        return None
    rec = m["recommendation"]
    need = stats.need.model()
    long_len = rec["max_model_len"]
    outcome = nd.outcome_at(need, stats.demand, long_len)
    cap_ = pl.Capacity(kv_tokens, args.block_size, hw.tensor_parallel_size if hw is not None else 1,
                       args.max_num_seqs)
    advice = pl.advise_split(stats.routes, need, outcome, long_len, cap_, rate)
    if advice is None:
        return None
    return {**advice.to_dict(), "kv_source": kv_source}


def metrics_url(url: str) -> str:
    """`URL` → `URL/metrics` (a URL already ending in /metrics is kept)."""
    base = url.rstrip("/")
    return base if base.endswith("/metrics") else base + "/metrics"


def fetch_metrics(url: str, timeout: float = SCRAPE_TIMEOUT_S) -> str:
    """One GET of a vLLM's /metrics, as Prometheus does it: no proxy from the environment."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(urllib.request.Request(url, headers={"Accept": "text/plain"}), timeout=timeout) as response:
        data: bytes = response.read()
    return data.decode("utf-8", "replace")


def _model_config(args: argparse.Namespace) -> dict[str, Any] | None:
    if args.preset:
        return dict(cap.lookup_preset(args.preset).config)
    if args.model_config:
        return cap.load_model_config(args.model_config)
    return None


def _context(config: Mapping[str, Any] | None) -> ContextBound | None:
    if config is None:
        return None
    bound = model_context_bound(config)
    return bound if bound.key is not None else None


def upstream_report(url: str, metrics: vm.VllmMetrics, models: dict[str, dict[str, Any]],
                    config: Mapping[str, Any] | None, hw: Hardware | None,
                    max_num_seqs: int | None) -> dict[str, Any]:
    """One scraped vLLM: per model it serves, its pool against the plan, concurrency at p95 demand, signals."""
    view = UpstreamView(name=url, url=metrics_url(url), metrics=metrics, scrapes=1,
                        signals=vm.current_signals(metrics, max_num_seqs=max_num_seqs))
    sections: list[tuple[str, UpstreamSection]] = []
    for name in sorted(metrics.models) or ["-"]:
        report = models.get(name)
        p95 = report["demand_kv_tokens"]["p95"] if report and report["demand_kv_tokens"]["count"] else None
        demand = None if p95 is None else math.ceil(p95)
        plan = basis = None
        if hw is not None:
            plan = cap.make_plan(hw.inputs(demand or 1500, None))
            basis = (f"plan for {hw.model_label} on {hw.gpu_label}: utilization {hw.utilization:g}, weights "
                     f"{cap.format_bytes(hw.weights_bytes)}/GPU, activations {cap.format_bytes(hw.activation_bytes)}")
        sections.append((name, upstream_section(view, name, config=config, plan=plan, plan_basis=basis,
                                                demand_kv_tokens=demand)))
    pool = sections[0][1].pool if sections else None
    return {"url": url, "metrics_url": view.url, "engines": len(metrics.cache),
            "pool": None if pool is None else pool.to_dict(),
            "models": [{"model": name, **section.to_dict()} for name, section in sections]}


def run(args: argparse.Namespace) -> int:
    try:
        if not args.files and not args.upstream:
            raise ValueError("give length record files, --upstream URL, or both")
        since = rep.parse_since(args.since, time.time()) if args.since else None
        config = _model_config(args)
        gpu_given = bool(args.gpu or args.gpu_memory is not None)
        if config is None and (gpu_given or args.target_concurrency):
            raise ValueError("the GPU options need the model: add --model-config CONFIG_JSON or --preset NAME")
        hw = capacity_from_args(args) if config is not None and gpu_given else None
    except (ValueError, KeyError, OSError) as e:
        print(f"brimful report: error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    scraped: list[tuple[str, vm.VllmMetrics]] = []
    for url in args.upstream:
        try:
            scraped.append((url, vm.parse_vllm_metrics(fetch_metrics(metrics_url(url)))))
        except (OSError, ValueError) as e:
            print(f"brimful report: error: cannot read {metrics_url(url)}: {e}", file=sys.stderr)
            return 2
    progress = rep.Progress()
    try:
        builder = rep.build_report(args.files, model=args.model, since=since, progress=progress,
                                   engine_name=args.engine)
    except OSError as e:
        progress.done()
        print(f"brimful report: error: {e}", file=sys.stderr)
        return 2
    progress.done()
    context = _context(config)
    plan_kv = None
    if hw is not None:
        # the longest length vLLM would start with: whole blocks, less the pool's null block
        probe = cap.make_plan(hw.inputs(1, 1))
        plan_kv = probe.startup.estimated_max_model_len if probe.startup is not None else None
    models = []
    for stats in rep.iter_models(builder):
        # the KV bound: the pool of the vLLM that serves this model, else the plan's
        pools = [(url, m.cache_for("0")) for url, m in scraped if stats.model in m.models]
        pool = next(((url, c.pool_tokens) for url, c in pools if c is not None and c.pool_tokens), None)
        kv_bound, kv_source = (pool[1], f"the KV pool of {pool[0]}") if pool else (
            (plan_kv, "the plan's KV cache") if plan_kv is not None else (None, None))
        m = rep.model_report(stats, args.percentile, args.block_size,
                             model_bound=context.max_model_len if context else None, kv_bound=kv_bound)
        m["model_context"] = None if context is None else {
            "max_model_len": context.max_model_len, "key": context.key, "scaling_factor": context.scaling_factor}
        m["kv_bound_source"] = kv_source
        if hw is not None:
            m["capacity"] = capacity_for(hw, m, stats.need.model())
        if kv_bound is not None and m["recommendation"] is not None and args.target_rate:
            m["pools"] = pools_for(stats, m, kv_bound, kv_source, args, hw)
        models.append(m)
    by_name = {m["model"]: m for m in models}
    st = builder.stats
    result = {
        "files": st.files, "lines": st.lines, "records": st.records,
        "malformed": st.malformed, "filtered": st.filtered,
        "percentile": args.percentile, "block_size": args.block_size,
        "models": models,
        "upstreams": [upstream_report(url, m, by_name, config, hw, args.max_num_seqs) for url, m in scraped],
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


REASON_LABELS = {
    "prompt_too_long": "prompt too long", "no_room_left": "no room left", "invalid_media": "invalid media",
    "invalid_prompt": "invalid prompt", "bad_request": "bad request", "unauthorized": "unauthorized",
    "upstream_failure": "upstream failure", "client_gone": "client gone", "other": "other",
}
TABLE_ROWS = (("prompt", "prompt_tokens"), ("completion", "completion_tokens"), ("total", "total_tokens"),
              ("sequence", "sequence_tokens"), ("demanded", "demand_tokens"), ("needed", "need_tokens"))


def format_report(result: dict[str, Any]) -> str:
    p = result["percentile"]
    lines = [
        f"{result['records']:,} records from {len(result['files'])} file(s) "
        f"({result['lines']:,} lines; {result['malformed']:,} malformed and skipped; "
        f"{result['filtered']:,} outside --model/--since)",
    ]
    if not result["models"] and result["files"]:
        lines.append("no records to report")
    cols = ["count", "mean", "p50", "p90", "p95", "p99"]
    if rep.percentile_key(p) not in cols:
        cols.append(rep.percentile_key(p))
    cols.append("max")
    for m in result["models"]:
        lines.append("")
        lines.extend(_model_lines(m, p, cols))
    for up in result.get("upstreams", []):
        lines.append("")
        lines.extend(_upstream_lines(up))
    return "\n".join(lines)


def _model_lines(m: dict[str, Any], p: float, cols: list[str]) -> list[str]:
    lines = [f"model {m['model']}: {m['requests']:,} requests, {m['completed']:,} with usage"]
    if len(m["endpoints"]) > 1 or set(m["endpoints"]) - {"chat"}:
        lines.append("  endpoints: " + ", ".join(f"{name} {n:,}" for name, n in m["endpoints"].items()))
    lines.append(f"  clamped {_pct(m['clamped_share'])}, rejected {_pct(m['rejected_share'])}, "
                 f"upstream errors {_pct(m['upstream_error_share'])}, "
                 f"finish_reason=length {_pct(m['length_finish_share'])}"
                 + (f", n>1: {m['parallel_sampling_requests']:,}" if m["parallel_sampling_requests"] else ""))
    if m["rejections"]:
        lines.append("  not served, by reason: " + ", ".join(
            f"{REASON_LABELS.get(k, k)} {v:,} ({_pct(v / m['requests'])})" for k, v in m["rejections"].items()))
    lines.append(f"  {'tokens':<11}" + "".join(f"{c:>10}" for c in cols))
    for label, key in TABLE_ROWS:
        s = m[key]
        lines.append(f"  {label:<11}" + "".join(f"{_num(s.get(c)):>10}" for c in cols))
    lines.append("  (demanded = prompt + the completion limit asked: what clients ask; needed = the estimate of "
                 "prompt + what they would generate, cut and refused requests included)")
    rec = m["recommendation"]
    if rec is None:
        lines.append("  recommended max_model_len: - (no request with a prompt count)")
        return lines
    lines.extend(_need_lines(m, rec, p))
    c = m.get("capacity")
    if c:
        lines.append(
            f"  on {c['gpu']} with {c['model_config']}: KV {cap.format_both(c['kv_memory_bytes'])} = "
            f"{c['kv_tokens']:,} tokens; concurrent at the mean need of {c['mean_demand_kv_tokens']:,} KV tokens "
            f"(each at most {rec['max_model_len']:,}): {c['concurrent_at_mean']:,}, at p95 "
            f"{c['p95_demand_kv_tokens']:,}: {c['concurrent_at_p95']:,}"
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
    if m.get("pools"):
        lines.extend(_pool_lines(m["pools"]))
    return lines


def _pool_line(label: str, pool: dict[str, Any]) -> str:
    replicas = "none: one replica cannot hold a request this long" if pool["replicas"] is None else (
        f"{pool['replicas']:,} replica(s), {pool['gpus']:,} GPU(s)")
    latency = "-" if pool["mean_latency_s"] is None else f"{pool['mean_latency_s']:.2f} s"
    worst = "none" if pool["replicas_worst"] is None else (
        f"{pool['replicas_worst']:,} replica(s), {pool['gpus_worst']:,} GPU(s)")
    return (f"    {label:<11}max_model_len {pool['max_model_len']:>7,}: {_pct(pool['share']):>6} of requests, "
            f"{pool['concurrency_needed']:,.1f} at once needed (mean latency {latency}); at the mean "
            f"{pool['mean_kv_tokens']:,} KV tokens {pool['concurrent_per_replica']:,} per replica → {replicas}; "
            f"at the worst case {pool['guaranteed_per_replica']:,} per replica → {worst}")


def _pool_lines(pools: dict[str, Any]) -> list[str]:
    """One pool against two pools routed by length (prompt + the ask; no ask → the long pool)."""
    lines = [f"  pools for {pools['rate']:,.2f} requests/s (--target-rate), each replica "
             f"{pools['gpus_per_replica']} GPU(s) with {pools['kv_tokens_per_replica']:,} KV tokens "
             f"({pools['kv_source']}):", _pool_line("one pool", pools["one_pool"])]
    if pools["short"] is None:
        lines.append("    two pools: no split by length needs fewer GPUs (routing sends every request that asks no "
                     "limit, or more than the short window, to the long pool)")
    else:
        lines.append(_pool_line("short pool", pools["short"]))
        lines.append(_pool_line("long pool", pools["long"]))
    o = pools["outcome"]
    lines.append(f"    either way {_pct(o['refused_share'])} refused, {_pct(o['cut_share'])} cut short: the long "
                 "pool's window, which every request may fall back to")
    return lines


def _need_lines(m: dict[str, Any], rec: dict[str, Any], p: float) -> list[str]:
    """The recommendation from the estimated need, its bounds, and what each candidate refuses or cuts."""
    q = rec["need"]
    high = "unbounded" if q["high"] is None else f"{q['high']:,}"
    why = (f"estimated p{p:g} of need = {q['value']:,}{' or more' if q['beyond_data'] else ''} tokens, bounds "
           f"{q['low']:,} … {high}; {rec['wanted']:,} in blocks of {rec['block_size']}")
    if rec["limited_by"] == "model_context":
        ctx = m.get("model_context") or {}
        why += f"; capped at the model's own context ({ctx.get('key', 'config.json')})"
    elif rec["limited_by"] == "kv_cache":
        why += (f"; capped at the longest the KV cache holds ({m.get('kv_bound_source') or 'KV cache'}): more "
                "needs fp8 KV, quantised weights or tensor parallelism")
    lines = [f"  recommended max_model_len: {rec['max_model_len']:,} ({why})"]
    lines.append(f"  need: {rec['exact']:,} exact (stopped by themselves), {rec['cut']:,} cut short (at least "
                 f"prompt + granted), {rec['imputed']:,} refused or without usage (at least prompt + 1; "
                 "completion estimated from the served requests)")
    r = m["recorded"]
    lines.append(f"  recorded: refused for length {_pct(r['length_refused_share'])}, clamped "
                 f"{_pct(r['clamped_share'])}, really cut short {_pct(r['cut_share'])}")
    current = m["max_model_len_current"]
    lines.append(f"  {'max_model_len':>15}{'refused':>10}   cut short (estimate; bounds)")
    for c in rec["candidates"]:
        mark = " ← recommended" if c["max_model_len"] == rec["max_model_len"] else (
            " ← current" if c["max_model_len"] == current else "")
        lines.append(f"  {c['max_model_len']:>15,}{_pct(c['refused_share']):>10}   {_pct(c['cut_share'])} "
                     f"({_pct(c['cut_share_low'])} … {_pct(c['cut_share_high'])}){mark}")
    asked = m.get("asked_recommendation")
    if asked is not None and asked["wanted"] != rec["wanted"]:
        lines.append(f"  the limits asked would say {asked['wanted']:,} (p{p:g} of prompt + the completion limit "
                     f"asked = {_num(asked['demand_at_percentile'])}): what clients ask, not what they use")
    served = m["served_recommendation"]
    if served is not None and served["max_model_len"] != rec["max_model_len"]:
        lines.append(f"  served lengths alone would say {served['max_model_len']:,} (p{p:g} of served sequence length "
                     f"= {_num(served['sequence_tokens_at_percentile'])}): censored at what was served"
                     + (f", never above the current {current:,}" if current else ""))
    return lines


def _upstream_lines(up: dict[str, Any]) -> list[str]:
    lines = [f"upstream {up['url']} (one read of {up['metrics_url']})"]
    pool = up["pool"]
    if pool is None:
        lines.append("  KV pool: - (no vllm:cache_config_info with num_gpu_blocks: not a vLLM, or older than 0.10)")
    else:
        vllm_says = "" if pool["vllm_max_concurrency"] is None else (
            f"; vLLM: {pool['vllm_max_concurrency']:g} requests of max_model_len at once")
        lines.append(f"  KV pool: {pool['num_gpu_blocks']:,} blocks of {pool['block_size']} = "
                     f"{pool['actual_tokens']:,} tokens (engine {pool['engine']} of {up['engines']}, KV cache "
                     f"{pool['cache_dtype'] or 'auto'}{vllm_says})")
        if pool["planned_tokens"] is not None:
            lines.append(f"  planned: {pool['planned_tokens']:,} tokens ({pool['plan_basis']}); difference "
                         f"{pool['difference_tokens']:,} tokens, actual ÷ planned = {pool['ratio']:.3f}")
        lines.extend(f"  why: {note}" for note in pool["explanation"])
    for m in up["models"]:
        facts = [f"KV usage {_pct(m['kv_cache_usage'])}", f"{_num(m['running'])} running",
                 f"{_num(m['waiting'])} waiting", f"{_num(m['preemptions_total'])} preemptions since vLLM started"]
        lines.append(f"  model {m['model']}: " + ", ".join(facts))
        mp = m["pool"]
        if mp is not None and mp["concurrency"] is not None:
            block = mp["block_size"]
            lines.append(f"    concurrency at the p95 demand of {mp['demand_kv_tokens']:,} KV tokens: "
                         f"{mp['concurrency']:,} at once at full length ({mp['usable_tokens'] // block:,} usable "
                         f"blocks of {block}, {-(-mp['demand_kv_tokens'] // block):,} per request)")
        elif mp is not None:
            lines.append("    concurrency: - (no demand recorded for this model in the files given)")
        if not m["signals"]:
            lines.append("    time to add capacity: no signal in this read (KV usage below the threshold, no "
                         "preemption, nothing waiting)")
        for sig in m["signals"]:
            lines.append(f"    SIGNAL {sig['kind']}: {sig['detail']}")
            lines.append(f"      → {sig['action']}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Run `report` on its own: `python -m proxy.commands.report lengths.jsonl`."""
    parser = argparse.ArgumentParser(prog="brimful")
    sub = parser.add_subparsers(dest="command", required=True)
    register(sub)
    args = parser.parse_args(["report", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
