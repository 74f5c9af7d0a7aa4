"""One admitted request as its surface reads it, once, and the length record built from it at the end.

The exchange works on values: the `AdmittedRequest` its surface reads from the
body (what is asked: stream, choices, the completion limit, whether the prompt
can be counted here), the `Counted` prompt, the admission `Decision`, and the
`Outcome` of forwarding it (status, failure, retries, the upstream's usage).
`length_record` turns them into the request's one `LengthRecord` when it is
finished; no field of a record is written anywhere else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.admitted.admission import Decision, RequestedLimit
from proxy.errors import ErrorCode
from proxy.recording.record import Action, LengthRecord


@dataclass(frozen=True)
class AdmittedRequest:
    """The fields of a request that admission and the record read, parsed once from its body."""

    body: bytes                   # the client's bytes
    fields: dict[str, Any]        # ... parsed
    stream: bool
    n: int                        # choices per prompt
    limit: RequestedLimit         # the completion limit the client sent, validated
    stored: str | None = None     # why the prompt lives upstream and cannot be counted here, if it does


@dataclass(frozen=True)
class Counted:
    """The prompt as counted: what the upstream will see, and how it was counted."""

    prompt_tokens: int | None = None            # the sum over prompts, after any cut the decision makes
    longest_prompt_tokens: int | None = None    # a batch's longest prompt (None: one prompt)
    prompts: int = 1                            # prompts the upstream's usage sums
    source: str | None = None                   # local | upstream | margin (None: not counted)
    uncounted: str | None = None                # why it could not be counted, if so
    trimmed_messages: int | None = None         # messages / input items trimming dropped
    trimmed_tokens: int | None = None           # ... and the prompt tokens they held
    trusted_usage: bool = False                 # the answer's usage may move the model's count trust


@dataclass
class Outcome:
    """What became of the request after its decision: the answer, a failure, a retry, the usage."""

    status: int = 0                             # the status sent to the client (0: none yet)
    action: Action | None = None                # when it differs from the decision's
    error_code: ErrorCode | None = None
    granted_max_tokens: int | None = None       # a retry's limit, when one was sent
    length_retries: int = 0
    ttfb_ms: float | None = None
    upstream_prompt_tokens: int | None = None
    completion_tokens: int | None = None
    finish_reasons: list[str] = field(default_factory=list)
    delivered: bool = False                     # the client was sent the stream's last event

    def fail(self, action: Action, code: ErrorCode | None) -> None:
        """The request ended in `action`; the first error code seen is kept."""
        self.action = action
        if self.error_code is None:
            self.error_code = code


def length_record(*, ts: float, endpoint: str, request_id: str, request: AdmittedRequest | None,
                  model: str | None, max_model_len: int | None, decision: Decision | None, counted: Counted,
                  outcome: Outcome, latency_ms: float) -> LengthRecord:
    """The request's record from what was asked, counted, decided and answered (numbers, never text)."""
    granted = outcome.granted_max_tokens
    if granted is None and decision is not None:
        granted = decision.granted
    action = outcome.action or (decision.action if decision is not None else Action.REJECTED)
    return LengthRecord(
        ts=ts, model=model, endpoint=endpoint, request_id=request_id,
        stream=request.stream if request is not None else False,
        n=request.n if request is not None else 1,
        max_model_len=max_model_len,
        prompt_tokens=counted.prompt_tokens,
        longest_prompt_tokens=counted.longest_prompt_tokens,
        upstream_prompt_tokens=outcome.upstream_prompt_tokens,
        requested_max_tokens=request.limit.value if request is not None else None,
        granted_max_tokens=granted,
        completion_tokens=outcome.completion_tokens,
        finish_reasons=list(outcome.finish_reasons),
        action=action, status=outcome.status, error_code=outcome.error_code,
        length_retries=outcome.length_retries, latency_ms=latency_ms, ttfb_ms=outcome.ttfb_ms,
        trimmed_messages=counted.trimmed_messages, trimmed_tokens=counted.trimmed_tokens,
    )
