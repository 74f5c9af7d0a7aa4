"""Demand: what each request asked for, not only what it was served — and the max_model_len that serves it.

The served lengths are censored at exactly the value under question: a request
refused for its prompt or clamped to the room left never shows its real
length, so a percentile of served lengths cannot rise above the current
`max_model_len` (issue 16).  This module reads the same length records
(`proxy.record.LengthRecord`, as the dicts of the JSONL log) and states the
demand of each one.  Pure functions; nothing here is wired into the proxy yet.

Definitions:

* prompt = `proxy.lengths.effective_prompt_tokens` (the upstream's count, else
  headroom's; refused requests have only the latter).  For a batched
  completions request the record holds the sum over its prompts, so its
  demand is an upper bound.
* **demanded sequence length** (what `max_model_len` must hold; vLLM checks
  each sequence, not the sum of the choices):
  - prompt + the completion limit the client asked for (`requested_max_tokens`)
    — including refused and clamped requests;
  - nothing asked: `proxy.lengths.sequence_tokens`, prompt + what was
    generated (for n > 1 an upper bound); a finish reason "length" makes it a
    lower bound (`lower_bound`);
  - nothing asked and nothing generated (refused, failed): the surface's
    implicit limit (vLLM's 16 on `/v1/completions`), else prompt + 1 — the
    least a request needs (vLLM refuses a prompt of max_model_len tokens), a
    lower bound.
* **demanded KV tokens** (what the cache holds for it; seed 000: "프롬프트 1벌 +
  출력 n벌"): prompt + n × the per-choice completion asked for, or prompt + the
  completion tokens generated (usage already sums the choices).
* **outcome at L** for a demand, with headroom in front of vLLM 0.32: refused
  when prompt ≥ L, or when the room left after the margin is below the minimum
  completion; served in full when the sequence ≤ L; clamped otherwise.
* Percentiles are `proxy.report.Histogram`'s (numpy's linear method, the
  definition in `proxy.lengths`); a recommendation is rounded with
  `proxy.lengths.round_to_blocks`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy.errors import ErrorCode
from proxy.lengths import BLOCK_SIZE, effective_prompt_tokens, round_to_blocks, sequence_tokens
from proxy.report import Histogram
from proxy.surfaces import CHAT, COMPLETIONS

# what the engine applies when a surface's request sends no limit (None: the whole room)
_IMPLICIT_LIMIT = {s.name: s.implicit_max_tokens for s in (CHAT, COMPLETIONS)}

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


@dataclass(frozen=True)
class Demand:
    """One request's demand (see the module docstring)."""

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


def record_demand(rec: Mapping[str, Any]) -> Demand | None:
    """The demand of one length record (a `LengthRecord.to_dict()`); None without a prompt count."""
    prompt = effective_prompt_tokens(_int(rec, "prompt_tokens"), _int(rec, "upstream_prompt_tokens"))
    if prompt is None:
        return None
    n = rec.get("n")
    n = n if type(n) is int and n >= 1 else 1
    requested = _int(rec, "requested_max_tokens")
    generated = _int(rec, "completion_tokens")
    reasons = rec.get("finish_reasons")
    cut = isinstance(reasons, list) and "length" in reasons
    model = rec.get("model")
    action = str(rec.get("action", "pass"))
    limit = _int(rec, "max_model_len")

    def make(completion: int | None, kv: int, source: Source, lower: bool) -> Demand:
        sequence = prompt + (completion if completion is not None else 1)
        return Demand(model if isinstance(model, str) else None, action, n, prompt, completion, sequence, kv,
                      source, lower, limit)

    if requested is not None and requested > 0:
        return make(requested, prompt + n * requested, "requested", False)
    if generated is not None:
        sequence = sequence_tokens(prompt, generated, n, _int(rec, "granted_max_tokens"))
        assert sequence is not None
        return make(sequence - prompt, prompt + generated, "generated", cut)
    implicit = _IMPLICIT_LIMIT.get(str(rec.get("endpoint")))
    if implicit is not None:
        return make(implicit, prompt + n * implicit, "engine_default", False)
    return make(None, prompt + n, "prompt_only", True)


def demands(records: Iterable[Mapping[str, Any]]) -> list[Demand]:
    return [d for d in map(record_demand, records) if d is not None]


def sequence_histogram(ds: Iterable[Demand]) -> Histogram:
    return Histogram(d.sequence for d in ds)


def kv_histogram(ds: Iterable[Demand]) -> Histogram:
    return Histogram(d.kv_tokens for d in ds)


# ---------------------------------------------------------------------------
# what a max_model_len would do with that demand


def outcome(d: Demand, max_model_len: int, margin: int = 0, min_completion: int = 1) -> Outcome:
    """Served in full, clamped, or refused at `max_model_len` (headroom's admission rules)."""
    if d.prompt >= max_model_len:
        return "refused"
    if d.sequence <= max_model_len:
        return "fits"
    if max_model_len - d.prompt - margin < min_completion:
        return "refused"
    return "clamped"


@dataclass(frozen=True)
class OutcomeShares:
    max_model_len: int
    total: int
    fits: int
    clamped: int
    refused: int

    def share(self, what: Outcome) -> float:
        return getattr(self, what) / self.total if self.total else 0.0


def outcome_shares(ds: Iterable[Demand], max_model_len: int, margin: int = 0, min_completion: int = 1
                   ) -> OutcomeShares:
    counts = {"fits": 0, "clamped": 0, "refused": 0}
    for d in ds:
        counts[outcome(d, max_model_len, margin, min_completion)] += 1
    return OutcomeShares(max_model_len, sum(counts.values()), counts["fits"], counts["clamped"], counts["refused"])


def current_max_model_len(ds: Iterable[Demand]) -> int | None:
    """The limit most records arrived under (None when none recorded one)."""
    seen: dict[int, int] = {}
    for d in ds:
        if d.max_model_len is not None:
            seen[d.max_model_len] = seen.get(d.max_model_len, 0) + 1
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


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def recommend_from_demand(
    ds: list[Demand],
    p: float = 99.0,
    block_size: int = BLOCK_SIZE,
    *,
    model_bound: int | None = None,
    kv_bound: int | None = None,
    current: int | None = None,
    margin: int = 0,
    min_completion: int = 1,
) -> DemandRecommendation | None:
    """max_model_len = the p-th percentile of demand, whole blocks, within the model's context and the KV cache.

    `model_bound`: `proxy.model_context.model_context_bound(...).max_model_len`.
    `kv_bound`: the longest max_model_len the KV cache holds (`StartupCheck.estimated_max_model_len`, or
    num_gpu_blocks × block_size from the running vLLM).  `current`: the deployed value (default: the one
    most records arrived under).
    """
    if not ds:
        return None
    hist = sequence_histogram(ds)
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
        current = current_max_model_len(ds)
    now = outcome_shares(ds, current, margin, min_completion) if current is not None else None
    rec = outcome_shares(ds, chosen, margin, min_completion)
    lower = sum(d.lower_bound for d in ds)
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
        block_size=block_size, model_bound=model_bound, kv_bound=kv_bound, lower_bounds=lower,
        current=now, recommended=rec, reason=head + tail,
    )


# ---------------------------------------------------------------------------
# why requests were not served

# Every errors.ErrorCode headroom emits or records.  Media parts are refused today as INVALID_PROMPT
# (tokenizer_cache.UnsupportedContent → errors.invalid_prompt), the same code as a template error; the
# "invalid_media" key is the code a distinct error would carry.
ERROR_CODE_REASONS: dict[str, Reason] = {
    ErrorCode.CONTEXT_LENGTH_EXCEEDED: "no_room_left",     # refined by the numbers: see rejection_reason
    "invalid_media": "invalid_media",
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
    ErrorCode.COUNTING_BUSY: "upstream_failure",      # headroom's own back-pressure, like upstream_busy
    # Answered by proxy.server before any app code: never in a record, listed for completeness.
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
    code = rec.get("error_code")
    status = rec.get("status")
    failed = rec.get("action") in ("rejected", "upstream_error") or (type(status) is int and status >= 400)
    if code is None and not failed:
        return None
    if code is None:
        return "other"
    reason = ERROR_CODE_REASONS.get(str(code), "other")
    if reason == "no_room_left":
        prompt, limit = _int(rec, "prompt_tokens"), _int(rec, "max_model_len")
        if prompt is not None and limit is not None and prompt >= limit:
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
