"""The admission decision: pass, clamp or reject — a pure function of numbers.

Input: the prompt token counts (exact, one per prompt), the model's
`max_model_len`, what the client asked for, and the operator's policy.
Output: a `Decision` saying what to forward (which completion-limit fields to
rewrite, and to what) or which error to answer with.  No I/O and no globals,
so every branch is a cheap unit test (tests/test_admission.py).

Rules (README "How clamping works"):
- a prompt of `max_model_len` tokens or more cannot be saved → reject with the
  exact count (vLLM would say "at least N" or "max_tokens must be at least 1");
- room = max_model_len − prompt; a request whose completion limit fits in the
  room is forwarded untouched: the margin never turns a fitting request into a
  rejection;
- a limit larger than the room (this includes a limit above `max_model_len`,
  which even vLLM 0.32 rejects) is rewritten to room − margin, or rejected
  under policy `reject`, or rejected when room − margin is below the minimum
  completion the operator allows;
- an operator ceiling lowers any larger limit; an operator default fills an
  absent limit; `/v1/completions` without a limit gets vLLM's implicit 16,
  which is checked like an explicit one (older vLLM rejects it when it overflows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from . import errors
from .errors import HeadroomError

Endpoint = Literal["chat", "completions"]
LIMIT_FIELDS = ("max_completion_tokens", "max_tokens")

# vLLM's default completion limit for /v1/completions when max_tokens is omitted
# (vllm/entrypoints/openai/completion/protocol.py: `max_tokens: int | None = 16`;
# captures/c18_completions_string_no_max_tokens.json).
COMPLETIONS_DEFAULT_MAX_TOKENS = 16


@dataclass
class Policy:
    """What the operator allows: the `[policy]` configuration table, and per model after
    `[models."name"]` overrides are applied (`Config.policy_for`)."""

    margin_tokens: int = 16
    margin_fraction: float = 0.0
    min_completion_tokens: int = 1
    on_overflow: Literal["clamp", "reject"] = "clamp"
    default_max_tokens: int | None = None
    max_tokens_ceiling: int | None = None

    def margin(self, prompt_tokens: int) -> int:
        return self.margin_tokens + math.ceil(self.margin_fraction * prompt_tokens)


@dataclass(frozen=True)
class RequestedLimit:
    """The completion limit a client sent, already validated as integers."""

    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    @property
    def value(self) -> int | None:
        """The effective limit: max_completion_tokens wins when both are given (as in vLLM)."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    @property
    def field(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"

    def present_fields(self) -> list[str]:
        return [f for f in LIMIT_FIELDS if getattr(self, f) is not None]


@dataclass(frozen=True)
class Decision:
    action: Literal["pass", "clamped", "rejected"]
    requested: int | None                       # the client's effective limit (None: not sent)
    granted: int | None = None                  # the limit forwarded (None: nothing set)
    rewrite: Mapping[str, int] | None = None    # body fields to set; None → forward bytes as they came
    error: HeadroomError | None = None
    margin: int = 0


def parse_limit_field(name: str, value: Any) -> int | None:
    """Read `max_tokens` / `max_completion_tokens` the way vLLM's pydantic model accepts it.

    vLLM 0.32 (captures/c12_*) accepts ints, integral floats (2.0), numeric
    strings ("10") and booleans (true → 1) and answers 400 for 1.5, "abc" and
    values below 1; null means "not sent".  Raises the 400 for anything else.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        number = int(value)
    elif isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise errors.invalid_field(name, "must be a whole number of tokens", value)
        number = int(value)
    elif isinstance(value, str):
        text = value.strip()
        if not (text.lstrip("+-").isdigit() and text.isascii()):
            raise errors.invalid_field(name, "must be a whole number of tokens", value)
        number = int(text)
    else:
        raise errors.invalid_field(name, "must be a whole number of tokens", value)
    if number < 1:
        raise errors.invalid_field(name, "must be at least 1", value)
    return number


def read_requested_limit(body: Mapping[str, Any], endpoint: Endpoint) -> RequestedLimit:
    """Both completion-limit fields of a request body, validated (400 on bad values)."""
    max_tokens = parse_limit_field("max_tokens", body.get("max_tokens"))
    max_completion = None
    if endpoint == "chat":
        max_completion = parse_limit_field("max_completion_tokens", body.get("max_completion_tokens"))
    return RequestedLimit(max_tokens=max_tokens, max_completion_tokens=max_completion)


def decide(
    prompt_tokens: list[int],
    max_model_len: int,
    requested: RequestedLimit,
    policy: Policy,
    *,
    endpoint: Endpoint,
    model: str,
) -> Decision:
    """Admit, clamp or reject one request.  `prompt_tokens` has one count per prompt."""
    longest = max(prompt_tokens)
    prompt_param = "messages" if endpoint == "chat" else "prompt"
    asked = requested.value

    if longest >= max_model_len:
        return Decision(
            "rejected", asked, error=errors.prompt_too_long(longest, max_model_len, model, prompt_param)
        )

    room = max_model_len - longest
    margin = policy.margin(longest)
    safe_room = room - margin

    # What the upstream will use as the limit, and where it came from.
    effective = asked
    source: Literal["client", "operator", "engine"] = "client"
    if effective is None and policy.default_max_tokens is not None:
        effective, source = policy.default_max_tokens, "operator"
    elif effective is None and endpoint == "completions":
        effective, source = COMPLETIONS_DEFAULT_MAX_TOKENS, "engine"

    if effective is None:
        # Chat without a limit: vLLM grants max_model_len − prompt itself, which always fits.
        if policy.max_tokens_ceiling is not None and policy.max_tokens_ceiling < room:
            granted = min(policy.max_tokens_ceiling, room)
            return Decision("pass", None, granted, {"max_tokens": granted}, margin=margin)
        return Decision("pass", None, margin=margin)

    target = effective
    if policy.max_tokens_ceiling is not None:
        target = min(target, policy.max_tokens_ceiling)

    if target > room:
        if policy.on_overflow == "reject" and source == "client":
            error = errors.completion_too_long(
                target, requested.field, longest, max_model_len, margin, max(safe_room, 0)
            )
            return Decision("rejected", asked, error=error, margin=margin)
        if safe_room < policy.min_completion_tokens:
            error = errors.not_enough_room(
                longest, max_model_len, margin, max(safe_room, 0), policy.min_completion_tokens, model, prompt_param
            )
            return Decision("rejected", asked, error=error, margin=margin)
        target = safe_room

    if target == effective and source == "client":
        return Decision("pass", asked, asked, None, margin=margin)
    if target == effective and source == "engine":
        return Decision("pass", None, None, None, margin=margin)

    fields = requested.present_fields() or ["max_tokens"]
    action: Literal["pass", "clamped"] = "clamped" if target < effective else "pass"
    return Decision(action, asked, target, {f: target for f in fields}, margin=margin)
