"""Demand: what each request asked for, not only what it was served — and the max_model_len that serves it.

The served lengths are censored at exactly the value under question: a request
refused for its prompt or clamped to the room left never shows its real
length, so a percentile of served lengths cannot rise above the current
`max_model_len` (issue 16).  This module reads the same length records
(`proxy.recording.record.LengthRecord`, as the dicts of the JSONL log, or a record's
`vars()`) and states the demand of each one.  Pure functions: `brimful report`
(`proxy.sizing.report`) and `/stats` (`proxy.recording.stats`) both reduce demands to a
`DemandTally`.  Agents ask 32,000 or 65,535 out of habit, so `brimful report` recommends
from what requests needed (`proxy.sizing.need`) and keeps `recommend_from_demand` as a
column; its tally still gives the refusals at each length exactly (admission refuses by the
ask).  `/stats` still recommends from the asks.

Definitions:

* prompt = `proxy.sizing.lengths.effective_prompt_tokens` (the upstream's count, else
  brimful's; refused requests have only the latter).  For a batched
  completions request the record holds the sum over its prompts, so its
  demand is an upper bound.
* **demanded sequence length** (what `max_model_len` must hold; vLLM checks
  each sequence, not the sum of the choices):
  - prompt + the completion limit the client asked for (`requested_max_tokens`)
    — including refused and clamped requests;
  - nothing asked: `proxy.sizing.lengths.sequence_tokens`, prompt + what was
    generated (for n > 1 an upper bound); a finish reason "length" makes it a
    lower bound (`lower_bound`);
  - nothing asked and nothing generated (refused, failed): the surface's
    implicit limit (vLLM's 16 on `/v1/completions`), else prompt + 1 — the
    least a request needs (vLLM refuses a prompt of max_model_len tokens), a
    lower bound.
* **demanded KV tokens** (what the cache holds for it; seed 000, docs/vllm-behaviour.md:
  "프롬프트 1벌 + 출력 n벌", one prompt plus n outputs): prompt + n × the
  per-choice completion asked for, or prompt + the completion tokens generated
  (usage already sums the choices).
* **outcome at L** for a demand, with brimful in front of vLLM 0.32
  (`proxy.admitted.admission`, policy `clamp`): refused when prompt ≥ L, or when the
  sequence does not fit and the room L − prompt is below the minimum
  completion; served in full when the sequence ≤ L; clamped otherwise.  A
  margin only shortens a clamped completion, it never refuses one.  Under
  `on_overflow = "reject"` every "clamped" demand is refused instead: the
  share that does not fit in full is the same.
* Percentiles are `proxy.sizing.histogram.Histogram`'s (numpy's linear method, the
  definition in `proxy.sizing.lengths`); a recommendation is rounded with
  `proxy.sizing.lengths.round_to_blocks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

from proxy.errors import ErrorCode
from proxy.sizing.histogram import Histogram
from proxy.sizing.lengths import (
    BLOCK_SIZE,
    IMPLICIT_MAX_TOKENS,
    effective_prompt_tokens,
    round_to_blocks,
    sequence_tokens,
)

Source = Literal["requested", "generated", "engine_default", "prompt_only"]
Outcome = Literal["fits", "clamped", "refused"]
Reason = Literal[
    "prompt_too_long", "no_room_left", "invalid_media", "invalid_prompt", "bad_request", "unauthorized",
    "upstream_failure", "client_gone", "other",
]
LimitedBy = Literal["demand", "model_context", "kv_cache"]


def _int(rec: Mapping[str, Any], key: str) -> int | None:
    value = rec.get(key)
    return value if type(value) is int and value >= 0 else None


class Demand(NamedTuple):
    """One request's demand (see the module docstring); a tuple: a report makes one per record."""

    model: str | None
    action: str
    n: int
    prompt: int
    completion: int | None      # per sequence; None when only the prompt is known
    sequence: int               # → max_model_len
    kv_tokens: int              # → the KV cache
    source: Source
    lower_bound: bool           # the real need may be larger
    max_model_len: int | None   # the limit in force when it arrived


class DemandFigures(NamedTuple):
    """The numbers of one demand (`demand_figures`): what the live window keeps per request."""

    completion: int | None
    sequence: int
    kv_tokens: int
    source: Source
    lower_bound: bool


def demand_figures(prompt: int, n: int, requested: int | None, generated: int | None, granted: int | None,
                   cut: bool, endpoint: str, longest: int | None = None) -> DemandFigures:
    """The demand of a request with these (already valid) fields: the definitions of the module docstring.

    `longest` is a batch's longest prompt (several prompts or pooling inputs): its sequences are its
    prompts one by one, its KV footprint all of them.
    """
    single = longest if longest is not None else prompt
    if requested is not None and requested > 0:
        return DemandFigures(requested, single + requested, prompt + n * requested, "requested", False)
    if generated is not None:
        sequence = sequence_tokens(prompt, generated, n, granted, longest)
        assert sequence is not None
        return DemandFigures(sequence - single, sequence, prompt + generated, "generated", cut)
    implicit = IMPLICIT_MAX_TOKENS.get(endpoint)
    if implicit is not None:
        return DemandFigures(implicit, single + implicit, prompt + n * implicit, "engine_default", False)
    return DemandFigures(None, single + 1, prompt + n, "prompt_only", True)


def record_demand(rec: Mapping[str, Any]) -> Demand | None:
    """The demand of one length record (a `LengthRecord.to_dict()`); None without a prompt count."""
    prompt = effective_prompt_tokens(_int(rec, "prompt_tokens"), _int(rec, "upstream_prompt_tokens"))
    if prompt is None:
        return None
    n = rec.get("n")
    n = n if type(n) is int and n >= 1 else 1
    reasons = rec.get("finish_reasons")
    longest = _int(rec, "longest_prompt_tokens")
    f = demand_figures(prompt, n, _int(rec, "requested_max_tokens"), _int(rec, "completion_tokens"),
                       _int(rec, "granted_max_tokens"), isinstance(reasons, list) and "length" in reasons,
                       str(rec.get("endpoint")), longest)
    model = rec.get("model")
    return Demand(model if isinstance(model, str) else None, str(rec.get("action", "pass")), n,
                  longest if longest is not None else prompt, f.completion, f.sequence, f.kv_tokens, f.source,
                  f.lower_bound, _int(rec, "max_model_len"))


def demands(records: Iterable[Mapping[str, Any]]) -> list[Demand]:
    return [d for d in map(record_demand, records) if d is not None]


class DemandTally:
    """Demands reduced to 1-D histograms: all the recommendation and the outcome shares need, in bounded memory.

    With a minimum completion m, a demand is refused at L exactly when
    L < prompt + min(completion, m) (the prompt fills the context, or it does
    not fit and the room is below m), and fits when sequence ≤ L; everything
    else is clamped.  So the outcome at any L is two histogram reads, and the
    size is the number of distinct lengths, not of requests.  m is fixed when
    the tally is made (the admission policy's `min_completion_tokens`).
    """

    __slots__ = ("_sorted", "kv", "limits", "lower_bounds", "min_completion", "refused_below", "sequence")

    def __init__(self, ds: Iterable[Demand] = (), min_completion: int = 1) -> None:
        if min_completion < 1:
            raise ValueError("min_completion must be at least 1")
        self.min_completion = min_completion
        self.sequence: dict[int, int] = {}        # demanded sequence → count
        self.kv: dict[int, int] = {}              # demanded KV tokens → count
        self.refused_below: dict[int, int] = {}   # prompt + min(completion, m) → count
        self.limits: dict[int, int] = {}          # max_model_len in force → count
        self.lower_bounds = 0
        self._sorted: tuple[tuple[int, ...], Histogram, Histogram] | None = None
        for d in ds:
            self.add(d)

    def add(self, d: Demand) -> None:
        self.add_values(d.prompt, d.sequence, d.kv_tokens, d.lower_bound, d.max_model_len)

    def add_values(self, prompt: int, sequence: int, kv: int, lower_bound: bool, limit: int | None) -> None:
        # Dict updates written out: this runs once per record of a report.
        c = self.sequence
        c[sequence] = c.get(sequence, 0) + 1
        c = self.kv
        c[kv] = c.get(kv, 0) + 1
        key = prompt + min(sequence - prompt, self.min_completion)
        c = self.refused_below
        c[key] = c.get(key, 0) + 1
        if limit is not None:
            c = self.limits
            c[limit] = c.get(limit, 0) + 1
        self.lower_bounds += lower_bound

    @property
    def n(self) -> int:
        return sum(self.sequence.values())

    @property
    def sequence_histogram(self) -> Histogram:
        return Histogram.of_counts(self.sequence)

    @property
    def kv_histogram(self) -> Histogram:
        return Histogram.of_counts(self.kv)

    def _histograms(self) -> tuple[Histogram, Histogram]:
        """refused_below and sequence as histograms sorted once for every `shares` (a report asks at a few
        dozen lengths, each sort ~0.05 s on a fleet's day), sorted again when the counts changed: they only
        grow, so their sizes and sums tell (the dicts are also filled directly, not only through `add`)."""
        key = (len(self.refused_below), sum(self.refused_below.values()), len(self.sequence), self.n)
        if self._sorted is None or self._sorted[0] != key:
            self._sorted = (key, Histogram.of_counts(self.refused_below), Histogram.of_counts(self.sequence))
        return self._sorted[1], self._sorted[2]

    def shares(self, max_model_len: int) -> OutcomeShares:
        refused_below, sequence = self._histograms()
        n = sequence.n
        refused = refused_below.count_above(max_model_len)
        fits = n - sequence.count_above(max_model_len)
        return OutcomeShares(max_model_len, n, fits, n - fits - refused, refused)


def _tally(ds: Iterable[Demand] | DemandTally, min_completion: int | None = None) -> DemandTally:
    if isinstance(ds, DemandTally):
        if min_completion is not None and min_completion != ds.min_completion:
            raise ValueError(f"this tally was made for min_completion {ds.min_completion}, not {min_completion}")
        return ds
    return DemandTally(ds, min_completion or 1)


def sequence_histogram(ds: Iterable[Demand] | DemandTally) -> Histogram:
    return _tally(ds).sequence_histogram


def kv_histogram(ds: Iterable[Demand] | DemandTally) -> Histogram:
    return _tally(ds).kv_histogram


# ---------------------------------------------------------------------------
# what a max_model_len would do with that demand


def outcome_of(prompt: int, sequence: int, max_model_len: int, min_completion: int = 1) -> Outcome:
    """Served in full, clamped, or refused at `max_model_len` (`proxy.admitted.admission`'s rules, policy clamp)."""
    if prompt >= max_model_len:
        return "refused"
    if sequence <= max_model_len:
        return "fits"
    if max_model_len - prompt < min_completion:
        return "refused"
    return "clamped"


def outcome(d: Demand, max_model_len: int, min_completion: int = 1) -> Outcome:
    return outcome_of(d.prompt, d.sequence, max_model_len, min_completion)


@dataclass(frozen=True)
class OutcomeShares:
    max_model_len: int
    total: int
    fits: int
    clamped: int
    refused: int

    def share(self, what: Outcome) -> float:
        return getattr(self, what) / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"max_model_len": self.max_model_len, "total": self.total, "fits": self.fits,
                "clamped": self.clamped, "refused": self.refused,
                "clamped_share": self.share("clamped"), "refused_share": self.share("refused")}


def outcome_shares(ds: Iterable[Demand] | DemandTally, max_model_len: int,
                   min_completion: int | None = None) -> OutcomeShares:
    """How many demands fit, are clamped, are refused at `max_model_len` (a tally keeps its own minimum)."""
    return _tally(ds, min_completion).shares(max_model_len)


def current_max_model_len(ds: Iterable[Demand] | DemandTally) -> int | None:
    """The limit most records arrived under (None when none recorded one)."""
    seen = _tally(ds).limits
    return max(seen, key=lambda v: (seen[v], v)) if seen else None


@dataclass(frozen=True)
class DemandRecommendation:
    percentile: float
    demand_at_percentile: float   # the percentile of demanded sequence lengths
    wanted: int                   # rounded up to whole blocks
    max_model_len: int            # after the model's and the KV cache's bounds
    limited_by: LimitedBy
    block_size: int
    model_bound: int | None
    kv_bound: int | None
    lower_bounds: int             # demands that are only lower bounds
    current: OutcomeShares | None
    recommended: OutcomeShares
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "percentile": self.percentile, "demand_at_percentile": self.demand_at_percentile,
            "wanted": self.wanted, "max_model_len": self.max_model_len, "limited_by": self.limited_by,
            "block_size": self.block_size, "model_bound": self.model_bound, "kv_bound": self.kv_bound,
            "lower_bounds": self.lower_bounds,
            "current": None if self.current is None else self.current.to_dict(),
            "recommended": self.recommended.to_dict(), "reason": self.reason,
        }


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def recommend_from_demand(
    ds: Iterable[Demand] | DemandTally,
    p: float = 99.0,
    block_size: int = BLOCK_SIZE,
    *,
    model_bound: int | None = None,
    kv_bound: int | None = None,
    current: int | None = None,
    min_completion: int | None = None,
) -> DemandRecommendation | None:
    """max_model_len = the p-th percentile of demand, whole blocks, within the model's context and the KV cache.

    `model_bound`: `proxy.sizing.model_context.model_context_bound(...).max_model_len`.
    `kv_bound`: the longest max_model_len the KV cache holds (`StartupCheck.estimated_max_model_len`, or
    num_gpu_blocks × block_size from the running vLLM).  `current`: the deployed value (default: the one
    most records arrived under).  `min_completion`: the policy's minimum completion (a tally keeps its own).
    """
    tally = _tally(ds, min_completion)
    hist = tally.sequence_histogram
    if hist.n == 0:
        return None
    value = hist.percentile(p)
    wanted = round_to_blocks(value, block_size)
    assert wanted is not None
    chosen = wanted
    limited_by: LimitedBy = "demand"
    if model_bound is not None and chosen > model_bound:
        chosen, limited_by = model_bound, "model_context"
    if kv_bound is not None and chosen > kv_bound:
        chosen, limited_by = kv_bound, "kv_cache"
    if current is None:
        current = current_max_model_len(tally)
    now = tally.shares(current) if current is not None else None
    rec = tally.shares(chosen)
    head = f"p{p:g} of demanded sequence length is {value:,.0f} tokens → {wanted:,} in whole blocks of {block_size}"
    if limited_by == "model_context":
        head += f", capped at the model's own context of {chosen:,}"
    elif limited_by == "kv_cache":
        head += (f", capped at {chosen:,}, the longest the KV cache holds (more needs fp8 KV, quantised weights "
                 "or tensor parallelism)")
    tail = (f"; at {chosen:,}, {_pct(rec.share('clamped'))} of past requests would be clamped and "
            f"{_pct(rec.share('refused'))} refused")
    if now is not None:
        tail += (f" (at the current {current:,}: {_pct(now.share('clamped'))} clamped, "
                 f"{_pct(now.share('refused'))} refused)")
    return DemandRecommendation(
        percentile=p, demand_at_percentile=value, wanted=wanted, max_model_len=chosen, limited_by=limited_by,
        block_size=block_size, model_bound=model_bound, kv_bound=kv_bound, lower_bounds=tally.lower_bounds,
        current=now, recommended=rec, reason=head + tail,
    )


# ---------------------------------------------------------------------------
# why requests were not served

# Every errors.ErrorCode brimful emits or records.  Media parts are refused today as INVALID_PROMPT
# (tokenizer_cache.UnsupportedContent → errors.invalid_prompt), the same code as a template error;
# INVALID_MEDIA is the code a distinct media refusal carries.
ERROR_CODE_REASONS: dict[str, Reason] = {
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: "no_room_left",     # refined by the numbers: see rejection_reason
    ErrorCode.INVALID_MEDIA: "invalid_media",
    ErrorCode.INVALID_PROMPT: "invalid_prompt",
    ErrorCode.INVALID_JSON: "bad_request",
    ErrorCode.INVALID_REQUEST_BODY: "bad_request",
    ErrorCode.INVALID_VALUE: "bad_request",
    ErrorCode.REQUEST_TOO_LARGE: "bad_request",
    ErrorCode.MODEL_NOT_FOUND: "bad_request",
    ErrorCode.NOT_FOUND: "bad_request",
    ErrorCode.UPSTREAM_BAD_REQUEST: "bad_request",
    ErrorCode.UPSTREAM_NOT_FOUND: "bad_request",
    ErrorCode.INVALID_API_KEY: "unauthorized",
    ErrorCode.UPSTREAM_NOT_READY: "upstream_failure",
    ErrorCode.UPSTREAM_ENGINE_DEAD: "upstream_failure",
    ErrorCode.UPSTREAM_BUSY: "upstream_failure",
    ErrorCode.UPSTREAM_UNREACHABLE: "upstream_failure",
    ErrorCode.UPSTREAM_CONNECTION_ERROR: "upstream_failure",
    ErrorCode.UPSTREAM_TIMEOUT: "upstream_failure",
    ErrorCode.UPSTREAM_KV_CACHE: "upstream_failure",
    ErrorCode.UPSTREAM_ERROR: "upstream_failure",
    ErrorCode.UPSTREAM_STREAM_ERROR: "upstream_failure",
    ErrorCode.UPSTREAM_INVALID_RESPONSE: "upstream_failure",
    ErrorCode.UPSTREAM_INVALID_OUTPUT: "upstream_failure",
    ErrorCode.COUNTING_BUSY: "upstream_failure",      # brimful's own back-pressure, like upstream_busy
    # Answered by proxy.serving.server before any app code: never in a record, listed for completeness.
    ErrorCode.INVALID_HTTP_REQUEST: "bad_request",
    ErrorCode.REQUEST_TIMEOUT: "client_gone",
    ErrorCode.REQUEST_HEADER_TOO_LARGE: "bad_request",
    ErrorCode.TOO_MANY_CONNECTIONS: "upstream_failure",
    ErrorCode.SERVER_SHUTTING_DOWN: "upstream_failure",
    ErrorCode.INTERNAL_ERROR: "upstream_failure",
    ErrorCode.CLIENT_DISCONNECTED: "client_gone",
}


def rejection_reason(rec: Mapping[str, Any]) -> Reason | None:
    """Why a record was not served (None when it was).

    A length refusal is "prompt_too_long" when the prompt alone reaches
    max_model_len, else "no_room_left" (the prompt fits but the completion
    asked for, or the minimum after the safety margin, does not).
    """
    status = rec.get("status")
    return reason_of(rec.get("error_code"), rec.get("action"), status if type(status) is int else None,
                     _int(rec, "prompt_tokens"), _int(rec, "max_model_len"))


def reason_of(code: object, action: object, status: int | None, prompt: int | None,
              max_model_len: int | None) -> Reason | None:
    """`rejection_reason` over the fields themselves (brimful's own prompt count, not the upstream's)."""
    failed = action in ("rejected", "upstream_error") or (status is not None and status >= 400)
    if code is None and not failed:
        return None
    if code is None:
        return "other"
    reason = ERROR_CODE_REASONS.get(str(code), "other")
    if reason == "no_room_left" and prompt is not None and max_model_len is not None and prompt >= max_model_len:
        return "prompt_too_long"
    return reason


def rejection_breakdown(records: Iterable[Mapping[str, Any]]) -> dict[Reason, int]:
    """Count of records per reason they were not served, largest first."""
    counts: dict[Reason, int] = {}
    for rec in records:
        reason = rejection_reason(rec)
        if reason is not None:
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
