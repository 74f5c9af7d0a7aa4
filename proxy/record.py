"""The per-request length record: numbers and labels only, never prompt or completion text.

One `LengthRecord` is made for every request to the two admitted routes.  It is
written as one JSON line (see `proxy.lengthlog`) and read back by
`proxy.report`; the field names are that file format, so renaming one is a
format change.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

Action = Literal["pass", "clamped", "rejected", "upstream_error"]


@dataclass
class LengthRecord:
    ts: float                                   # unix time the request arrived
    model: str | None                           # the served model name the request resolved to
    endpoint: Literal["chat", "completions"]
    stream: bool = False
    request_id: str | None = None               # X-Request-Id (the client's, or generated)
    n: int = 1                                  # choices requested
    max_model_len: int | None = None
    prompt_tokens: int | None = None            # headroom's own count (sum over prompts for a batch)
    upstream_prompt_tokens: int | None = None   # usage.prompt_tokens as the upstream reported it
    requested_max_tokens: int | None = None     # what the client asked for (None: not sent)
    granted_max_tokens: int | None = None       # what was forwarded (None: nothing set)
    completion_tokens: int | None = None        # usage.completion_tokens (all choices)
    finish_reasons: list[str] = field(default_factory=list)
    action: Action = "pass"
    status: int = 0                             # HTTP status sent to the client
    error_code: str | None = None               # headroom's error code when status >= 400
    length_retries: int = 0                     # retries after an upstream length rejection (drift)
    latency_ms: float | None = None             # arrival to last byte sent
    ttfb_ms: float | None = None                # arrival to first body byte (streams)

    def to_dict(self) -> dict[str, Any]:
        # A shallow copy of the fields: dataclasses.asdict deep-copies every
        # value and was ~4 % of a busy proxy's CPU (py-spy); the only mutable
        # field, finish_reasons, is copied by hand.
        data = {name: getattr(self, name) for name in _FIELD_NAMES}
        data["finish_reasons"] = list(self.finish_reasons)
        return data


_FIELD_NAMES = tuple(f.name for f in fields(LengthRecord))
