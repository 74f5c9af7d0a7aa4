"""Need: what each request really needed of the context — censored data, estimated with a product limit.

A client's completion limit says little about what it needs: agents and SDKs
send 32,000 or 65,535 on every turn and stop by themselves after a few hundred
tokens (issue 24).  What a request needed (prompt + the completion it would
have generated with room enough; `max_model_len` bounds each sequence) is
known or bounded from its length record:

* **exact** — it finished by itself (`stop`, `tool_calls`, `end_turn`, …), or
  at a limit it asked for itself: prompt + completion, whatever it asked;
* **cut** — it ended at `length` at a limit below its ask (clamped, or given
  the room to the window with no ask): right-censored, *at least* prompt +
  granted, at most prompt + the ask (no ask: no upper bound);
* **unknown** — it was refused, or failed before usage: at least prompt + 1;
  its completion is *estimated* from what the model's served requests
  generated (their own product-limit estimate), spread over `IMPUTE_POINTS`
  quantiles, each capped at the request's ask.  Every figure built on these
  says so (`NeedTally.imputed`).

The percentiles are a product-limit (Kaplan–Meier) estimate over exact and
imputed values as events and cut ones as right-censored, with the usual tie
rule (at a value, events happen before censorings).  Percentile p is the
smallest value whose estimated share at or below it reaches p (the
inverse-CDF; it equals the plain percentile of the values without
censoring).  Where censoring reaches past the last event the estimate stops:
the percentile is then the largest censoring point, a lower bound
(`Quantile.beyond_data`).  Its bounds: `low` takes every cut request at its
censoring point and every unknown one at prompt + 1, `high` every cut one at
its ask and every unknown one at prompt + its ask (None: some of that mass
has no upper bound).

A `NeedTally` holds only value → count dicts, so the report's Python reader
and any other aggregator (a SQL `GROUP BY`) can feed it the same way
(`add_values` / `add_counts`), and its size is the number of distinct lengths.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from proxy.sizing.lengths import BLOCK_SIZE, IMPLICIT_MAX_TOKENS, round_to_blocks

if TYPE_CHECKING:
    from proxy.sizing.demand import DemandTally

Kind = Literal["exact", "cut", "unknown"]
# The quantiles of the served completions an unknown request's completion is spread over.
IMPUTE_POINTS = 32
_EPS = 1e-12


class NeedFigures(NamedTuple):
    """One request's need: its kind, the value (exact, or the least it needed), the most it could need."""

    kind: Kind
    prompt: int            # the sequence's prompt (a batch's longest)
    value: int             # exact: the need; cut: prompt + granted; unknown: prompt + 1
    upper: int | None      # cut / unknown: prompt + the ask (None: nothing asked, no bound); exact: = value


def need_figures(prompt: int, n: int, requested: int | None, generated: int | None, granted: int | None,
                 finish_reasons: list[str] | None, endpoint: str, longest: int | None = None,
                 max_model_len: int | None = None) -> NeedFigures:
    """The need of a request with these (already valid) fields: the rules of the module docstring.

    `generated` None means nothing was served (refused, failed, a stream without usage): unknown.
    Without finish reasons a completion that reached its limit, or the window (`max_model_len`), counts as cut.
    """
    single = longest if longest is not None else prompt
    asked = requested if requested is not None and requested > 0 else IMPLICIT_MAX_TOKENS.get(endpoint)
    upper = None if asked is None else single + asked
    if generated is None:
        return NeedFigures("unknown", single, single + 1, upper)
    per_choice = generated if n == 1 and longest is None else min(generated, granted or generated)
    value = single + per_choice
    if finish_reasons:
        cut = "length" in finish_reasons
    else:
        limit = granted if granted is not None else asked
        cut = (limit is not None and per_choice >= limit) or (max_model_len is not None and value >= max_model_len)
    if not cut or (asked is not None and per_choice >= asked):
        return NeedFigures("exact", single, value, value)   # stopped by itself, or at its own limit
    return NeedFigures("cut", single, value, upper)


@dataclass(frozen=True)
class Quantile:
    p: float
    value: int              # the product-limit estimate (a lower bound when beyond_data)
    beyond_data: bool       # censoring reaches past the last event: the estimate is only "at least"
    low: int                # every cut request at its censoring point, every unknown one at prompt + 1
    high: int | None        # every cut / unknown one at its ask; None: unbounded

    def to_dict(self) -> dict[str, Any]:
        return {"p": self.p, "value": self.value, "beyond_data": self.beyond_data, "low": self.low,
                "high": self.high}


def product_limit(events: Mapping[int, float], censored: Mapping[int, float]) -> list[tuple[int, float]]:
    """Kaplan–Meier: [(t, S(t))] at each event value t, S the estimated share needing more than t.

    Counts may be fractional (imputed requests).  Ties: events at t happen before censorings at t.
    """
    total = sum(events.values()) + sum(censored.values())
    at_risk = float(total)
    survival = 1.0
    steps: list[tuple[int, float]] = []
    for t in sorted(set(events) | set(censored)):
        d = events.get(t, 0.0)
        if d > 0 and at_risk > _EPS:
            survival *= max(0.0, 1.0 - d / at_risk)
            steps.append((t, survival))
        at_risk -= d + censored.get(t, 0.0)
    return steps


def survival_at(steps: list[tuple[int, float]], x: float) -> float:
    """S(x) from `product_limit`'s steps (1 before the first event)."""
    i = bisect.bisect_right([t for t, _ in steps], x)
    return steps[i - 1][1] if i else 1.0


def km_quantile(steps: list[tuple[int, float]], p: float) -> int | None:
    """The smallest event value t with 1 − S(t) ≥ p/100; None when the estimate never gets there."""
    target = p / 100.0
    for t, s in steps:
        if 1.0 - s >= target - _EPS:
            return t
    return None


def plain_quantile(counts: Mapping[int, float], unbounded: float, p: float) -> int | None:
    """The inverse-CDF percentile of value → count, with `unbounded` mass above every value (None there)."""
    total = sum(counts.values()) + unbounded
    if total <= 0:
        raise ValueError("percentile of nothing")
    target = p / 100.0 * total
    running = 0.0
    for v in sorted(counts):
        running += counts[v]
        if running >= target - _EPS * total:
            return v
    return None


def _bump(d: dict[int, float], key: int, count: float = 1) -> None:
    d[key] = d.get(key, 0) + count


class NeedTally:
    """Needs reduced to value → count dicts: everything the estimate, its bounds and the outcomes need."""

    __slots__ = ("completions", "cut", "exact", "unknown")

    def __init__(self, figures: Iterable[NeedFigures] = ()) -> None:
        self.exact: dict[int, float] = {}                     # need → count
        self.completions: dict[int, float] = {}               # the exact ones' completion → count
        self.cut: dict[tuple[int, int, int], float] = {}      # (prompt, prompt + granted, upper or -1) → count
        self.unknown: dict[tuple[int, int], float] = {}       # (prompt, upper or -1) → count
        for f in figures:
            self.add(f)

    def add(self, f: NeedFigures, count: float = 1) -> None:
        self.add_values(f.kind, f.prompt, f.value, f.upper, count)

    def add_values(self, kind: Kind, prompt: int, value: int, upper: int | None, count: float = 1) -> None:
        """One need (or `count` alike): the aggregate any reader of the records can feed."""
        up = -1 if upper is None else upper
        if kind == "exact":
            _bump(self.exact, value, count)
            _bump(self.completions, value - prompt, count)
        elif kind == "cut":
            key = (prompt, value, up)
            self.cut[key] = self.cut.get(key, 0) + count
        else:
            k2 = (prompt, up)
            self.unknown[k2] = self.unknown.get(k2, 0) + count

    def merge(self, other: NeedTally) -> None:
        for v, c in other.exact.items():
            _bump(self.exact, v, c)
        for v, c in other.completions.items():
            _bump(self.completions, v, c)
        for k, c in other.cut.items():
            self.cut[k] = self.cut.get(k, 0) + c
        for k2, c in other.unknown.items():
            self.unknown[k2] = self.unknown.get(k2, 0) + c

    @property
    def n(self) -> float:
        return sum(self.exact.values()) + sum(self.cut.values()) + sum(self.unknown.values())

    @property
    def imputed(self) -> float:
        return sum(self.unknown.values())

    @property
    def censored(self) -> float:
        return sum(self.cut.values())

    def model(self) -> NeedModel:
        return NeedModel(self)


class NeedModel:
    """A `NeedTally`'s estimate: the events and censorings once the unknown requests are imputed."""

    def __init__(self, tally: NeedTally) -> None:
        self.tally = tally
        self.events: dict[int, float] = dict(tally.exact)
        self.censored: dict[int, float] = {}
        for (_, value, _), c in tally.cut.items():
            _bump(self.censored, value, c)
        self.points = completion_quantiles(tally)
        if self.points:
            self._impute(tally.unknown)
        else:
            for (prompt, _), c in tally.unknown.items():
                _bump(self.censored, prompt + 1, c)    # nothing served to estimate from: only "at least"
        self.steps = product_limit(self.events, self.censored)
        self._times: list[int] | None = None

    def _impute(self, unknown: Mapping[tuple[int, int], float]) -> None:
        """Each unknown request as events at prompt + each point (at most its ask), 1/len(points) each, added
        in the order a `_bump` per point would: a fleet's day has ~70k of them per model, times 32 points, so
        the loop is written out (no call per point)."""
        lifted = [max(1, completion) for completion in self.points]
        events = self.events
        get = events.get
        for (prompt, up), c in unknown.items():
            share = c / len(lifted)
            for completion in lifted:
                need = prompt + completion
                if 0 <= up < need:
                    need = up
                events[need] = get(need, 0) + share

    def quantile(self, p: float) -> Quantile | None:
        t = self.tally
        if t.n <= 0:
            return None
        estimate = km_quantile(self.steps, p)
        beyond = estimate is None
        if estimate is None:
            estimate = max(self.censored)
        low_counts = dict(t.exact)
        high_counts = dict(t.exact)
        unbounded = 0.0
        for (_, value, up), c in t.cut.items():
            _bump(low_counts, value, c)
            if up < 0:
                unbounded += c
            else:
                _bump(high_counts, up, c)
        for (prompt, up), c in t.unknown.items():
            _bump(low_counts, prompt + 1, c)
            if up < 0:
                unbounded += c
            else:
                _bump(high_counts, up, c)
        low = plain_quantile(low_counts, 0.0, p)
        assert low is not None
        high = plain_quantile(high_counts, unbounded, p) if high_counts else None
        return Quantile(p, estimate, beyond, low, high)

    def summary(self, extra: Iterable[float] = ()) -> dict[str, float | int | None]:
        """The report's table row: count, p50/p90/p95/p99 (+ extra) of the estimate, the largest value seen."""
        from proxy.sizing.histogram import STANDARD_PERCENTILES, percentile_key

        out: dict[str, float | int | None] = {"count": round(self.tally.n), "mean": None}
        for p in sorted(set(STANDARD_PERCENTILES) | set(extra)):
            q = self.quantile(p) if self.tally.n > 0 else None
            out[percentile_key(p)] = None if q is None else q.value
        seen = [*self.events, *self.censored]
        out["max"] = max(seen) if seen else None
        return out

    def survival(self, x: float) -> float:
        """The estimated share of requests needing more than x tokens (`survival_at`, the steps' values listed
        once: a report asks at a few dozen lengths)."""
        if self._times is None:
            self._times = [t for t, _ in self.steps]
        i = bisect.bisect_right(self._times, x)
        return self.steps[i - 1][1] if i else 1.0

    def clipped_mean(self, limit: int) -> float:
        """The estimated mean of min(need, limit): what a request holds of the KV cache under `limit`.

        The share the estimate leaves beyond its last event (censored past it) counts at `limit`.
        """
        mean, before = 0.0, 1.0
        for t, s in self.steps:
            if t > limit:
                break
            mean += (before - s) * t
            before = s
        return mean + before * limit


def completion_quantiles(tally: NeedTally) -> list[int]:
    """`IMPUTE_POINTS` quantiles of what served requests generated: exact ones as events, cut ones censored."""
    censored: dict[int, float] = {}
    for (prompt, value, _), c in tally.cut.items():
        _bump(censored, value - prompt, c)
    completions = tally.completions
    if not completions and not censored:
        return []
    steps = product_limit(completions, censored)
    last = max([*completions, *censored])
    points = []
    for k in range(IMPUTE_POINTS):
        q = km_quantile(steps, 100.0 * (k + 0.5) / IMPUTE_POINTS)
        points.append(last if q is None else q)
    return points


# ---------------------------------------------------------------------------
# what a max_model_len would do with that need


@dataclass(frozen=True)
class NeedOutcome:
    """At one max_model_len: requests refused (by admission's rule) and really cut short (estimated, bounded)."""

    max_model_len: int
    total: int
    refused: int
    cut: float            # the estimate: needing more than max_model_len, not refused
    cut_low: float        # every cut / unknown request at the least it needed
    cut_high: float       # every cut / unknown request at its ask (no ask: cut)

    def to_dict(self) -> dict[str, Any]:
        t = self.total or 1
        return {"max_model_len": self.max_model_len, "total": self.total, "refused": self.refused,
                "cut": round(self.cut, 3), "cut_low": round(self.cut_low, 3), "cut_high": round(self.cut_high, 3),
                "refused_share": self.refused / t, "cut_share": self.cut / t,
                "cut_share_low": self.cut_low / t, "cut_share_high": self.cut_high / t}


def _above(counts: Mapping[int, float], x: int) -> float:
    return sum(c for v, c in counts.items() if v > x)


def outcome_at(model: NeedModel, asked: DemandTally, max_model_len: int) -> NeedOutcome:
    """What `max_model_len` would have refused (the asks and prompts, exactly) and cut (the need, estimated)."""
    t = model.tally
    n = t.n
    refused = asked.shares(max_model_len).refused
    low = _above(t.exact, max_model_len) + sum(c for (_, v, _), c in t.cut.items() if v > max_model_len) + sum(
        c for (p, _), c in t.unknown.items() if p + 1 > max_model_len)
    high = _above(t.exact, max_model_len) + sum(
        c for (_, _, up), c in t.cut.items() if up < 0 or up > max_model_len) + sum(
        c for (p, up), c in t.unknown.items() if up < 0 or up > max_model_len)
    estimate = n * model.survival(max_model_len)
    return NeedOutcome(max_model_len, round(n), refused, max(0.0, estimate - refused), max(0.0, low - refused),
                       max(0.0, high - refused))


LimitedBy = Literal["need", "model_context", "kv_cache"]


@dataclass(frozen=True)
class NeedRecommendation:
    """max_model_len from the estimated need, with its bounds and what candidates would refuse or cut."""

    percentile: float
    need: Quantile
    wanted: int                 # the estimate in whole blocks
    wanted_low: int
    wanted_high: int | None
    max_model_len: int          # after the model's and the KV cache's bounds
    limited_by: LimitedBy
    block_size: int
    requests: int
    exact: int
    cut: int                    # right-censored
    imputed: int                # completion estimated from the served ones
    current: NeedOutcome | None
    recommended: NeedOutcome
    candidates: list[NeedOutcome]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "percentile": self.percentile, "need": self.need.to_dict(), "wanted": self.wanted,
            "wanted_low": self.wanted_low, "wanted_high": self.wanted_high, "max_model_len": self.max_model_len,
            "limited_by": self.limited_by, "block_size": self.block_size, "requests": self.requests,
            "exact": self.exact, "cut": self.cut, "imputed": self.imputed,
            "current": None if self.current is None else self.current.to_dict(),
            "recommended": self.recommended.to_dict(),
            "candidates": [c.to_dict() for c in self.candidates], "reason": self.reason,
        }


def candidate_lengths(chosen: int, current: int | None, bound: int | None, extra: Iterable[int | None]) -> list[int]:
    """The recommendation, the current value, the bounds' values and the powers of two from 2,048 up to the bound."""
    top = max(v for v in (chosen, current, bound, *extra) if v is not None)
    out = {chosen, *(v for v in (current, bound, *extra) if v is not None)}
    k = 2048
    while k <= min(top, bound if bound is not None else top):
        out.add(k)
        k *= 2
    return sorted(out)


def _blocks(x: int, block_size: int) -> int:
    r = round_to_blocks(x, block_size)
    assert r is not None
    return r


def recommend_from_need(
    tally: NeedTally, asked: DemandTally, p: float = 99.0, block_size: int = BLOCK_SIZE, *,
    model_bound: int | None = None, kv_bound: int | None = None, current: int | None = None,
    model: NeedModel | None = None,
) -> NeedRecommendation | None:
    """max_model_len = the estimated p-th percentile of need in whole blocks, within the model and the KV cache.

    `asked` is the same records' `proxy.sizing.demand.DemandTally`: admission refuses by the ask and the
    prompt, so it gives the refusals at each candidate exactly.  `model`: `tally.model()` when the caller has
    it already (imputing the unknown requests is the estimate's costly part).
    """
    model = tally.model() if model is None else model
    q = model.quantile(p)
    if q is None:
        return None
    wanted = _blocks(q.value, block_size)
    chosen = wanted
    limited_by: LimitedBy = "need"
    if model_bound is not None and chosen > model_bound:
        chosen, limited_by = model_bound, "model_context"
    if kv_bound is not None and chosen > kv_bound:
        chosen, limited_by = kv_bound, "kv_cache"
    low = _blocks(q.low, block_size)
    high = None if q.high is None else _blocks(q.high, block_size)
    cap = model_bound if kv_bound is None else min(kv_bound, model_bound or kv_bound)
    cands = candidate_lengths(chosen, current, cap, [min(low, cap or low)])
    by_len = {c: outcome_at(model, asked, c) for c in cands}
    rec = by_len[chosen]
    now = by_len.get(current) if current is not None else None
    head = (f"estimated p{p:g} of need is {q.value:,} tokens{' or more' if q.beyond_data else ''} "
            f"(bounds {q.low:,} … {'unbounded' if q.high is None else f'{q.high:,}'}) → {wanted:,} in whole blocks")
    if limited_by == "model_context":
        head += f", capped at the model's own context of {chosen:,}"
    elif limited_by == "kv_cache":
        head += f", capped at {chosen:,}, the longest the KV cache holds"
    n = rec.total or 1
    tail = (f"; at {chosen:,}: {100 * rec.refused / n:.1f} % refused, {100 * rec.cut / n:.1f} % cut short "
            f"({100 * rec.cut_low / n:.1f} … {100 * rec.cut_high / n:.1f} %)")
    return NeedRecommendation(
        percentile=p, need=q, wanted=wanted, wanted_low=low, wanted_high=high, max_model_len=chosen,
        limited_by=limited_by, block_size=block_size, requests=round(tally.n), exact=round(sum(tally.exact.values())),
        cut=round(tally.censored), imputed=round(tally.imputed), current=now, recommended=rec,
        candidates=list(by_len.values()), reason=head + tail,
    )



def _int(rec: Mapping[str, Any], key: str) -> int | None:
    value = rec.get(key)
    return value if type(value) is int and value >= 0 else None


def record_need(rec: Mapping[str, Any]) -> NeedFigures | None:
    """The need of one length record (a `LengthRecord.to_dict()`); None without a prompt count."""
    upstream = _int(rec, "upstream_prompt_tokens")
    prompt = upstream if upstream is not None else _int(rec, "prompt_tokens")
    if prompt is None:
        return None
    n = rec.get("n")
    reasons = rec.get("finish_reasons")
    return need_figures(prompt, n if type(n) is int and n >= 1 else 1, _int(rec, "requested_max_tokens"),
                        _int(rec, "completion_tokens"), _int(rec, "granted_max_tokens"),
                        [str(r) for r in reasons] if isinstance(reasons, list) else None,
                        str(rec.get("endpoint")), _int(rec, "longest_prompt_tokens"), _int(rec, "max_model_len"))
