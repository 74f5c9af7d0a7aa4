"""The live view's figures: pure functions over the recent window's samples.

`/stats` answers from `model_stats`, and the dashboard draws exactly the bins
it returns; percentiles and the recommendation use `proxy.lengths`' one
definition, so `/stats` and `headroom report` agree on the same traffic.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from .lengths import effective_prompt_tokens, percentile, round_to_blocks, sequence_tokens, total_tokens
from .record import Action, LengthRecord

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
    endpoint: str = "chat"       # the surface: chat, completions, responses, messages, embeddings, ...


def sample_of(rec: LengthRecord) -> Sample:
    reasons = rec.finish_reasons
    prompt = effective_prompt_tokens(rec.prompt_tokens, rec.upstream_prompt_tokens)
    return Sample(
        ts=rec.ts,
        prompt=prompt,
        completion=rec.completion_tokens,
        total=total_tokens(prompt, rec.completion_tokens),
        sequence=sequence_tokens(prompt, rec.completion_tokens, rec.n, rec.granted_max_tokens,
                                 rec.longest_prompt_tokens),
        action=rec.action,
        finish_length=("length" in reasons) if reasons else None,
        max_model_len=rec.max_model_len,
        endpoint=rec.endpoint,
    )


def model_stats(model: str, samples: Sequence[Sample]) -> dict[str, Any]:
    """The /stats entry for one model over its recent samples."""
    prompts = [s.prompt for s in samples if s.prompt is not None]
    completions = [s.completion for s in samples if s.completion is not None]
    totals = [s.total for s in samples if s.total is not None]
    sequences = sorted(s.sequence for s in samples if s.sequence is not None)
    actions = {a.value: 0 for a in Action}
    endpoints: dict[str, int] = {}
    for s in samples:
        actions[s.action] = actions.get(s.action, 0) + 1
        endpoints[s.endpoint] = endpoints.get(s.endpoint, 0) + 1
    finished = [s.finish_length for s in samples if s.finish_length is not None]
    cut = sum(finished)
    limits = [s.max_model_len for s in samples if s.max_model_len is not None]
    total = summarize(totals)
    return {
        "model": model,
        "count": len(samples),
        "endpoints": dict(sorted(endpoints.items(), key=lambda e: -e[1])),
        "actions": actions,
        "clamped": actions["clamped"],
        "rejected": actions["rejected"],
        "upstream_errors": actions["upstream_error"],
        # Requests with at least one choice cut by the completion limit, among those that finished.
        "finish_length": {"requests": cut, "finished": len(finished),
                          "share": round(cut / len(finished), 4) if finished else None},
        "max_model_len": limits[-1] if limits else None,
        "prompt_tokens": summarize(prompts),
        "completion_tokens": summarize(completions),
        "total_tokens": total,
        "recommended_max_model_len": round_to_blocks(percentile(sequences, 99) if sequences else None),
    }
