"""The per-request length record: numbers and labels only, never prompt or completion text.

One `LengthRecord` is made for every request to an admitted surface, once it is
finished, from what was asked, counted, decided and answered
(`proxy.admitted.request.length_record`); no field is written after.  It is written as
one JSON line (see `proxy.recording.lengthlog`) and read back by `proxy.sizing.report`; the
field names are that file format, so renaming one is a format change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any

from proxy.errors import ErrorCode


class Action(StrEnum):
    """What happened to a request, as the `x-brimful-action` header and the record say."""

    PASS = "pass"                      # forwarded with the client's own limit
    CLAMPED = "clamped"                # forwarded with a lower completion limit
    REJECTED = "rejected"              # refused by brimful itself (4xx)
    UNCOUNTED = "uncounted"            # forwarded without a count: media nothing here can count, or a
                                       # conversation stored upstream (Responses previous_response_id)
    TRUNCATED = "truncated"            # inputs cut to max_model_len (pooling, only when the operator opted in)
    TRIMMED = "trimmed"                # whole turns of the conversation dropped to fit (asked for)
    UPSTREAM_ERROR = "upstream_error"  # forwarded, and the upstream failed or refused it


@dataclass
class LengthRecord:
    ts: float                                   # unix time the request arrived
    model: str | None                           # the served model name the request resolved to
    endpoint: str                               # the surface's name: "chat", "completions", ...
    stream: bool = False
    request_id: str | None = None               # X-Request-Id (the client's, or generated)
    n: int = 1                                  # choices requested
    max_model_len: int | None = None
    prompt_tokens: int | None = None            # brimful's own count (sum over prompts for a batch)
    longest_prompt_tokens: int | None = None    # the longest prompt of a batch (None: one prompt)
    upstream_prompt_tokens: int | None = None   # the prompt count the upstream reported in its usage
    requested_max_tokens: int | None = None     # what the client asked for (None: not sent)
    granted_max_tokens: int | None = None       # what was forwarded (None: nothing set)
    completion_tokens: int | None = None        # the completion count the upstream reported (all choices)
    finish_reasons: list[str] = field(default_factory=list)
    action: Action = Action.PASS
    status: int = 0                             # HTTP status sent to the client
    error_code: ErrorCode | None = None         # why, when status >= 400 or the stream failed
    length_retries: int = 0                     # retries after an upstream length rejection (drift)
    latency_ms: float | None = None             # arrival to last byte sent
    ttfb_ms: float | None = None                # arrival to first body byte (streams)
    trimmed_messages: int | None = None         # messages / input items dropped (action "trimmed")
    trimmed_tokens: int | None = None           # ... and the prompt tokens they held (prompt_tokens is after)

    def to_dict(self) -> dict[str, Any]:
        # A shallow copy of the fields: dataclasses.asdict deep-copies every
        # value and was ~4 % of a busy proxy's CPU (py-spy); the only mutable
        # field, finish_reasons, is copied by hand.
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["finish_reasons"] = list(self.finish_reasons)
        return data


_FIELD_NAMES = tuple(f.name for f in fields(LengthRecord))
