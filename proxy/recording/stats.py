"""The live view's figures: pure functions over the recent window's samples.

`/stats` answers from `model_stats`, and the dashboard draws exactly the bins
it returns; percentiles use `proxy.sizing.lengths`' one definition, and the demand
(what each request asked for, refused and clamped ones included), the
recommendation and the rejection reasons are `proxy.sizing.demand`'s, so `/stats`
and `brimful report` agree on the same traffic.  What bounds the
recommendation beyond the traffic (the model's own context, the running
vLLM's KV pool) and the check of that pool come in a `proxy.sizing.live.ModelSizing`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from proxy.recording.record import Action, LengthRecord
from proxy.sizing import demand as dm
from proxy.sizing.lengths import effective_prompt_tokens, percentile, round_to_blocks, sequence_tokens, total_tokens
from proxy.sizing.live import ModelSizing, upstream_section

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def _display_edges(top_exponent: int = 21) -> tuple[int, ...]:
    """Bin edges for the dashboard: 0, 1, 2, 4, 8, then 2^k and 1.5·2^k up to 2^21.

    Token lengths span five orders of magnitude, so equal-width bins would put
    all traffic into one bar; doubling bins with a midpoint keep ~2 bars per
    octave and edges a human reads at a glance (1024, 1536, 2048, …).
    """
    edges = [0, 1, 2, 4, 8]
    for k in range(4, top_exponent):
        edges += [2**k, 3 * 2 ** (k - 1)]
    edges.append(2**top_exponent)
    return tuple(sorted(set(edges)))


DISPLAY_EDGES: tuple[int, ...] = _display_edges()


# ---------------------------------------------------------------------------
# Pure functions
# ---------------------------------------------------------------------------

def histogram(values: Iterable[float], edges: Sequence[float] = DISPLAY_EDGES) -> dict[str, list[Any]]:
    """Counts per bin [edges[i], edges[i+1]), trimmed to the first..last non-empty bin.

    The last bin is open-ended (its upper edge is null): a value beyond every
    edge is still counted, never lost.  Returns {"edges": [...], "counts": [...]}
    with len(edges) == len(counts) + 1.
    """
    counts = [0] * len(edges)
    for v in values:
        counts[max(0, bisect.bisect_right(edges, v) - 1)] += 1
    used = [i for i, c in enumerate(counts) if c]
    if not used:
        return {"edges": [], "counts": []}
    first, last = used[0], used[-1]
    uppers = [*edges[first + 1 : last + 1], edges[last + 1] if last + 1 < len(edges) else None]
    return {"edges": [edges[first], *uppers], "counts": counts[first : last + 1]}


def summarize(values: Sequence[float]) -> dict[str, Any]:
    """count, p50/p90/p95/p99, max and the display histogram of one length series."""
    ordered = sorted(values)
    summary: dict[str, Any] = {"count": len(ordered)}
    for q in PERCENTILES:
        summary[f"p{q}"] = _number(percentile(ordered, q)) if ordered else None
    summary["max"] = ordered[-1] if ordered else None
    summary["histogram"] = histogram(ordered)
    return summary


def _number(x: float) -> float | int:
    """Keep integral results integral in JSON (2048, not 2048.0)."""
    return int(x) if float(x).is_integer() else round(x, 3)


class Sample(NamedTuple):
    """What the recent window keeps of a record: numbers and flags, never text."""

    ts: float
    prompt: int | None
    completion: int | None
    total: int | None
    sequence: int | None
    action: str
    finish_length: bool | None   # None: no finish reason known (error, rejection)
    max_model_len: int | None
    demanded: int | None = None     # the demanded sequence length (proxy.sizing.demand), None without a prompt count
    demanded_kv: int | None = None  # the demanded KV tokens
    demand_lower: bool = False      # the demand is only a lower bound
    reason: str | None = None       # why it was not served (proxy.sizing.demand.rejection_reason)
    endpoint: str = "chat"          # the surface: chat, completions, responses, messages, embeddings, ...
    longest: int | None = None      # a batch's longest prompt (None: one prompt)


def sample_of(rec: LengthRecord) -> Sample:
    """Runs per request on the event loop: positional arguments (keywords cost twice as much here)."""
    reasons = rec.finish_reasons
    completion = rec.completion_tokens
    prompt = effective_prompt_tokens(rec.prompt_tokens, rec.upstream_prompt_tokens)
    cut = "length" in reasons
    demanded = demanded_kv = None
    lower = False
    longest = rec.longest_prompt_tokens
    if prompt is not None:
        _, demanded, demanded_kv, _, lower = dm.demand_figures(
            prompt, rec.n, rec.requested_max_tokens, completion, rec.granted_max_tokens, cut, rec.endpoint, longest)
    return Sample(
        rec.ts, prompt, completion, total_tokens(prompt, completion),
        sequence_tokens(prompt, completion, rec.n, rec.granted_max_tokens, longest), rec.action,
        cut if reasons else None, rec.max_model_len, demanded, demanded_kv, lower,
        dm.reason_of(rec.error_code, rec.action, rec.status, rec.prompt_tokens, rec.max_model_len),
        rec.endpoint, longest,
    )


def model_stats(model: str, samples: Sequence[Sample], sizing: ModelSizing | None = None,
                p: float = 99.0) -> dict[str, Any]:
    """The /stats entry for one model over its recent samples."""
    sizing = sizing or ModelSizing()
    prompts = [s.prompt for s in samples if s.prompt is not None]
    completions = [s.completion for s in samples if s.completion is not None]
    totals = [s.total for s in samples if s.total is not None]
    sequences = sorted(s.sequence for s in samples if s.sequence is not None)
    actions = {a.value: 0 for a in Action}
    reasons: dict[str, int] = {}
    endpoints: dict[str, int] = {}
    tally = dm.DemandTally(min_completion=sizing.min_completion)
    for s in samples:
        actions[s.action] = actions.get(s.action, 0) + 1
        endpoints[s.endpoint] = endpoints.get(s.endpoint, 0) + 1
        if s.reason is not None:
            reasons[s.reason] = reasons.get(s.reason, 0) + 1
        if s.demanded is not None and s.prompt is not None and s.demanded_kv is not None:
            tally.add_values(s.longest if s.longest is not None else s.prompt, s.demanded, s.demanded_kv,
                             s.demand_lower, s.max_model_len)
    finished = [s.finish_length for s in samples if s.finish_length is not None]
    cut = sum(finished)
    limits = [s.max_model_len for s in samples if s.max_model_len is not None]
    current = limits[-1] if limits else None
    total = summarize(totals)
    demanded = [s.demanded for s in samples if s.demanded is not None and s.prompt is not None]
    kv = tally.kv_histogram
    demand_kv_p95 = math.ceil(kv.percentile(95)) if kv.n else None
    context = sizing.context
    recommendation = dm.recommend_from_demand(
        tally, p, model_bound=context.max_model_len if context else None, kv_bound=sizing.kv_bound,
        current=current)
    beyond = sum(c for v, c in tally.sequence.items() if current is not None and v > current)
    upstream = None
    if sizing.upstream is not None:
        upstream = upstream_section(sizing.upstream, model, config=sizing.config,
                                    demand_kv_tokens=demand_kv_p95).to_dict()
    return {
        "model": model,
        "count": len(samples),
        "endpoints": dict(sorted(endpoints.items(), key=lambda e: -e[1])),
        "actions": actions,
        "clamped": actions["clamped"],
        "rejected": actions["rejected"],
        "upstream_errors": actions["upstream_error"],
        # Not served, by reason (proxy.sizing.demand.rejection_reason), largest first.
        "rejections": dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))),
        # Requests with at least one choice cut by the completion limit, among those that finished.
        "finish_length": {"requests": cut, "finished": len(finished),
                          "share": round(cut / len(finished), 4) if finished else None},
        "max_model_len": current,
        "prompt_tokens": summarize(prompts),
        "completion_tokens": summarize(completions),
        "total_tokens": total,
        # What the requests asked for: prompt + the completion limit asked (refused and clamped included).
        "demand_tokens": summarize(demanded),
        "demand_lower_bounds": tally.lower_bounds,
        "demand_kv_p95": demand_kv_p95,
        "beyond_max_model_len": {"count": beyond, "share": round(beyond / tally.n, 4) if tally.n else None},
        "model_context": None if context is None else {
            "max_model_len": context.max_model_len, "key": context.key, "source": sizing.config_source},
        "recommendation": None if recommendation is None else recommendation.to_dict(),
        "recommended_max_model_len": recommendation.max_model_len if recommendation is not None else None,
        # The p99 of served sequences alone: censored at the current max_model_len, for comparison.
        "served_recommended_max_model_len": round_to_blocks(percentile(sequences, 99) if sequences else None),
        "upstream": upstream,
    }
