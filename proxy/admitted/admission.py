"""The admission decision: pass, clamp or reject — a pure function of numbers.

Input: the prompt token counts (exact, one per prompt), the model's
`max_model_len`, what the client asked for, and the operator's policy.
Output: a `Decision` saying what to forward (which completion-limit fields to
rewrite, and to what) or which error to answer with.  No I/O and no globals,
so every branch is a cheap unit test (tests/admitted/test_admission.py).

The rule that shapes every branch (docs/surfaces.md, "Clamping"): a
request vLLM would serve is served, with at least as many completion tokens as
vLLM would allow (vLLM 0.32 clamps prompt + limit > max_model_len to the
room itself; older versions refuse it); a request vLLM would refuse for length
is served whenever any completion fits, and refused otherwise with exact
numbers and advice that makes it pass.

- a prompt of `max_model_len` tokens or more cannot be saved → reject with the
  exact count (vLLM would say "at least N" or "max_tokens must be at least 1");
  only when the count is exact: an unverified count lets the upstream judge;
- room = max_model_len − prompt; a request whose completion limit fits in the
  room is forwarded untouched;
- a limit larger than the room (this includes a limit above `max_model_len`,
  which even vLLM 0.32 rejects) is rewritten to the room less the margin (but
  at least the floor), or rejected under policy `reject`;
- the floor (`Policy.floor(surface)`, `min_completion_tokens`): room below it
  is refused with the surface's prompt-too-long error, not clamped to a sliver
  no agent can use, but only where vLLM alone would refuse the request anyway
  (the client's limit above `max_model_len`, or an engine that refuses any
  overflow: `upstream_clamps_overflow` false); where vLLM would serve the
  sliver, so does brimful;
- the margin is 0 by default: the count is exact, and a count known to drift
  adds the drift seen (`drift_margin`); an operator may ask for more;
- an operator ceiling lowers any larger limit; an operator default fills an
  absent limit; a surface whose engine applies an implicit limit
  (`/v1/completions`: 16) has it checked like an explicit one (older vLLM
  rejects it when it overflows).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from proxy import errors
from proxy.config import Policy
from proxy.errors import BrimfulError
from proxy.recording.record import Action
from proxy.upstream.failure import UpstreamFailure, is_length_failure


@dataclass(frozen=True)
class RequestedLimit:
    """The completion-limit fields a client sent, validated, in the surface's order of precedence.

    `sent` holds only the fields present, the winning one first (chat:
    `max_completion_tokens` wins over `max_tokens`, as in vLLM);
    `default_field` is the one to set when the client sent none.
    """

    sent: tuple[tuple[str, int], ...] = ()
    default_field: str = "max_tokens"

    @classmethod
    def of(cls, *fields: tuple[str, int | None], default_field: str = "max_tokens") -> RequestedLimit:
        """From (name, value) pairs in order of precedence; None values are fields not sent."""
        return cls(tuple((name, value) for name, value in fields if value is not None), default_field)

    @property
    def value(self) -> int | None:
        """The effective limit (the winning field's value), None when none was sent."""
        return self.sent[0][1] if self.sent else None

    @property
    def field(self) -> str:
        """The winning field's name, or the default field when none was sent."""
        return self.sent[0][0] if self.sent else self.default_field

    def present_fields(self) -> list[str]:
        return [name for name, _ in self.sent]

    def fields_to_set(self) -> list[str]:
        """Every field the client sent (all are rewritten together), else the default one."""
        return self.present_fields() or [self.default_field]


@dataclass(frozen=True)
class Decision:
    action: Literal[Action.PASS, Action.CLAMPED, Action.REJECTED, Action.UNCOUNTED, Action.TRUNCATED,
                    Action.TRIMMED]
    requested: int | None                       # the client's effective limit (None: not sent)
    granted: int | None = None                  # the limit forwarded (None: nothing set)
    rewrite: Mapping[str, int] | None = None    # body fields to set; None → forward bytes as they came
    error: BrimfulError | None = None
    margin: int = 0
    counted: int | None = None                  # prompt tokens the upstream will see, when the decision cuts them


# pydantic-core 2.50's lax int, which vLLM 0.32's request models use (FastAPI validates
# the parsed JSON in Python mode): a string is read as a JSON integer, else "cleaned"
# first (pydantic-core src/input/shared.rs `clean_int_str`): stripped of Rust's Unicode
# White_Space (Python's str.strip would also take \x1c-\x1f), one sign, leading zeros
# (and underscores among them), a `.0...` tail, single underscores between digits.
_PYDANTIC_WS = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008" \
               "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_JSON_INT = re.compile(r"-?(?:0|[1-9][0-9]*)", re.ASCII)
_MAX_INT_DIGITS = 4300          # CPython's and jiter's bound on an int's decimal digits
_I64 = 2 ** 63
_NOT_WHOLE = "must be a whole number of tokens"


def lax_int(value: Any) -> int:
    """An int field's value as pydantic's lax mode reads it; ValueError (the reason) otherwise.

    Accepted (checked against pydantic itself, tests/admitted/test_admission.py):
    ints, booleans, integral finite floats inside int64, and strings such as
    " 10 ", "+5", "1_000", "10.0", "0010".  Refused: "1.5", "+-5", "--5", "1e3",
    "10.", "_1", non-ASCII digits, more than 4,300 digits.
    """
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(_NOT_WHOLE)
        if not -_I64 < value < _I64:
            raise ValueError("is too large a number")
        return int(value)
    if not isinstance(value, str):
        raise ValueError(_NOT_WHOLE)
    text = value if _JSON_INT.fullmatch(value) else _clean_int_str(value)
    if text is None or not _JSON_INT.fullmatch(text):
        raise ValueError(_NOT_WHOLE)
    if len(text.lstrip("-")) > _MAX_INT_DIGITS:
        raise ValueError("is too large a number")
    return int(text)


def _clean_int_str(text: str) -> str | None:
    """What pydantic-core makes of a string that is not a JSON integer as it stands (None: nothing)."""
    s = text.strip(_PYDANTIC_WS)
    if s.startswith("+"):
        if s.startswith("+-"):
            return None
        s = s[1:]
    sign = ""
    if s.startswith("-"):
        if s.startswith(("--", "-+")):
            return None
        sign, s = "-", s[1:]
    stripped = _strip_leading_zeros(s)
    if stripped is None:
        return None
    s = stripped
    dot = s.find(".")
    if dot >= 0 and s[dot + 1:] and not s[dot + 1:].strip("0"):
        s = s[:dot]
    if "_" in s and not s.startswith("_") and not s.endswith("_") and "__" not in s:
        return sign + s.replace("_", "")
    return None if len(s) == len(text) else sign + s


def _strip_leading_zeros(s: str) -> str | None:
    """Leading zeros (and underscores among them) off, one zero kept before a '.' or alone."""
    if not s or not (s[0] == "0" or s[0] in "123456789-"):
        return None
    if s[0] != "0":
        return s
    for i in range(1, len(s)):
        c = s[i]
        if c in "0_":
            continue
        if c in "123456789-":
            return s[i:]
        return s[i - 1:] if c == "." else None
    return s[-1]


def parse_limit_field(name: str, value: Any, *, in_force: bool = True) -> int | None:
    """Read `max_tokens` / `max_completion_tokens` the way vLLM's pydantic model accepts it.

    vLLM 0.32 (captures/c12_*) accepts what pydantic's lax int does (`lax_int`:
    2.0, "10", "1_000", "10.0", true → 1) and answers 400 for 1.5, "abc",
    "+-5" and, for the field in force, values below 1; null means "not sent".
    A field another one overrides (chat's `max_tokens` beside `max_completion_tokens`)
    is only typed: vLLM never reads its value.  Raises the 400 for anything else.
    """
    if value is None:
        return None
    try:
        number = lax_int(value)
    except ValueError as exc:
        raise errors.invalid_field(name, str(exc), value) from None
    if in_force and number < 1:
        raise errors.invalid_field(name, "must be at least 1", value)
    return number


def decide_uncounted(requested: RequestedLimit, max_model_len: int) -> Decision:
    """A request nothing here can count: forwarded as sent, except that a limit above
    max_model_len (which vLLM refuses whatever the prompt) is lowered to it."""
    asked = requested.value
    if asked is not None and asked > max_model_len:
        return Decision(Action.UNCOUNTED, asked, max_model_len,
                        {f: max_model_len for f in requested.fields_to_set()})
    return Decision(Action.UNCOUNTED, asked, asked)


def read_requested_limit(body: Mapping[str, Any], fields: tuple[str, ...], default_field: str) -> RequestedLimit:
    """A surface's completion-limit fields of a request body (precedence order), validated (400 on bad values)."""
    read: list[tuple[str, int | None]] = []
    for name in fields:
        in_force = all(value is None for _, value in read)
        read.append((name, parse_limit_field(name, body.get(name), in_force=in_force)))
    return RequestedLimit.of(*read, default_field=default_field)


def decide(
    prompt_tokens: list[int], max_model_len: int, requested: RequestedLimit, policy: Policy, *,
    model: str,
    prompt_param: str,
    implicit_max_tokens: int | None = None,
    count_exact: bool = True,
    drift_margin: int = 0,
    floor: int | None = None,
) -> Decision:
    """Admit, clamp or reject one request.  `prompt_tokens` has one count per prompt.

    `prompt_param` names the field holding the prompt (for the error);
    `implicit_max_tokens` is the limit the engine applies when the client sends
    none (vLLM's 16 on /v1/completions), checked like an explicit one.
    `count_exact` says the count is known to be the upstream's (verified, or
    never contradicted); when it is not, brimful refuses nothing on its own
    count and holds back `drift_margin` tokens, the drift it has seen.
    `floor`: the surface's minimum completion (default `policy.min_completion_tokens`).
    """
    least = completion_floor(policy.min_completion_tokens if floor is None else floor, max_model_len)
    longest = max(prompt_tokens)
    asked = requested.value
    margin = policy.margin(longest) + (0 if count_exact else drift_margin)

    effective, source = _effective_limit(asked, policy, implicit_max_tokens)
    target = effective
    if target is not None and policy.max_tokens_ceiling is not None:
        target = min(target, policy.max_tokens_ceiling)
    if longest >= max_model_len:
        if count_exact:
            # To be served after cutting: the floor where vLLM would refuse a sliver, else one token.
            needs = least if effective is not None and _upstream_refuses(effective, source, max_model_len,
                                                                         policy) else 1
            return Decision(Action.REJECTED, asked, error=errors.prompt_too_long(
                longest, max_model_len, model, prompt_param, needs))
        # The count may be off, so the upstream judges; a limit above max_model_len,
        # which vLLM refuses whatever the prompt, is lowered to it first.
        if target is not None and target > max_model_len:
            return Decision(Action.CLAMPED, asked, max_model_len,
                            {f: max_model_len for f in requested.fields_to_set()}, margin=margin)
        return Decision(Action.PASS, asked, asked, margin=margin)

    room = max_model_len - longest
    # vLLM 0.32 clamps each prompt of a batch to its own room: a limit that fits the shortest
    # prompt serves every prompt as vLLM alone would (an older engine refuses any overflow).
    fits = max_model_len - min(prompt_tokens) if policy.upstream_clamps_overflow else room
    if target is None or effective is None:
        # Chat without a limit: vLLM grants max_model_len − prompt itself, which always fits.
        if policy.max_tokens_ceiling is not None and policy.max_tokens_ceiling < room:
            granted = policy.max_tokens_ceiling
            return Decision(Action.PASS, None, granted, {requested.default_field: granted}, margin=margin)
        return Decision(Action.PASS, None, margin=margin)
    if target > room:
        if room < least and count_exact and _upstream_refuses(effective, source, max_model_len, policy):
            return Decision(Action.REJECTED, asked, margin=margin, error=errors.not_enough_room(
                longest, max_model_len, least, model, prompt_param))
        if policy.on_overflow == "reject" and source == "client":
            error = errors.completion_too_long(target, requested.field, longest, max_model_len)
            return Decision(Action.REJECTED, asked, error=error, margin=margin)
        # The whole room, less the margin; a margin shortens a completion, it never refuses one
        # (nor lowers it below the floor, nor below what vLLM alone would grant: the room).
        target = max(min(target, fits - margin) if target > fits else target, least if room >= least else 1)

    if target == effective and source == "client":
        return Decision(Action.PASS, asked, asked, None, margin=margin)
    if target == effective and source == "engine":
        return Decision(Action.PASS, None, None, None, margin=margin)

    action: Literal[Action.PASS, Action.CLAMPED] = Action.CLAMPED if target < effective else Action.PASS
    return Decision(action, asked, target, {f: target for f in requested.fields_to_set()}, margin=margin)


Source = Literal["client", "operator", "engine"]


def completion_floor(floor: int, max_model_len: int) -> int:
    """The floor in force: never more than an eighth of the context, so a small model still
    clamps what it can serve."""
    return min(floor, max(1, max_model_len // 8))


def _effective_limit(asked: int | None, policy: Policy, implicit: int | None) -> tuple[int | None, Source]:
    """What the upstream will use as the limit, and where it came from."""
    if asked is None and policy.default_max_tokens is not None:
        return policy.default_max_tokens, "operator"
    if asked is None and implicit is not None:
        return implicit, "engine"
    return asked, "client"


def _upstream_refuses(effective: int, source: str, max_model_len: int, policy: Policy) -> bool:
    """Would vLLM alone refuse this overflowing limit?  vLLM 0.32 clamps prompt + limit >
    max_model_len itself and refuses only a limit above max_model_len; an older engine refuses
    any overflow.  A limit brimful's operator filled in stands for none: vLLM grants the room."""
    if source == "operator":
        return False
    return effective > max_model_len or not policy.upstream_clamps_overflow


def decide_inputs(
    input_tokens: list[int],
    max_model_len: int,
    *,
    model: str,
    prompt_param: str,
    truncate_field: str,
    truncate: bool,
    count_exact: bool = True,
) -> Decision:
    """Admit or refuse a pooling request (embeddings, score, rerank): inputs, no completion.

    vLLM refuses the whole request when one input is longer than
    max_model_len (an input of exactly max_model_len tokens is served); `input_tokens` are
    the counts after any truncation the client asked for.  Too long → 400 naming
    each input, unless the operator opted into truncation (`truncate`): then
    the request is forwarded with `truncate_field` = max_model_len and marked truncated.
    On an inexact count nothing is refused: the upstream judges.
    """
    too_long = [(i, n) for i, n in enumerate(input_tokens) if n > max_model_len]
    if not too_long or not count_exact:
        return Decision(Action.PASS, None)
    if truncate:
        counted = sum(min(n, max_model_len) for n in input_tokens)
        return Decision(Action.TRUNCATED, None, rewrite={truncate_field: max_model_len}, counted=counted)
    return Decision(Action.REJECTED, None, error=errors.inputs_too_long(too_long, max_model_len, model, prompt_param))


# -- after an upstream length refusal: the one retry a drift allows -----------------------

def corrected_max_tokens(f: UpstreamFailure, *, prompt_tokens: int | None = None,
                         max_model_len: int | None = None) -> int | None:
    """The completion limit to retry with, from the upstream's figures and brimful's.

    The upstream's limit wins over brimful's (it is what it enforces); for the
    prompt the larger of the two counts is used, since either may be the one
    that is right and a retry that fails again helps nobody.  None when the
    numbers needed are missing or nothing fits.
    """
    if not is_length_failure(f):
        return None
    limit = f.max_model_len if f.max_model_len is not None else max_model_len
    counts = [c for c in (prompt_tokens, f.prompt_tokens) if c is not None]
    room: int | None = None
    if limit is not None and counts:
        room = limit - max(counts)
    if f.max_output_tokens is not None:
        room = f.max_output_tokens if room is None else min(room, f.max_output_tokens)
    if room is None or room < 1:
        return None
    return room


def retry_limit(f: UpstreamFailure, *, prompt_tokens: int | None, max_model_len: int | None,
                granted_max_tokens: int | None) -> int | None:
    """The limit to retry a refused request with once, or None when no retry can help.

    A retry is worth it only when the upstream refused for length, its own
    numbers give a limit that fits, and that limit is below what was sent (the
    upstream counted more than brimful did: a drift brimful did not foresee).
    """
    corrected = corrected_max_tokens(f, prompt_tokens=prompt_tokens, max_model_len=max_model_len)
    if corrected is None:
        return None
    if granted_max_tokens is not None and corrected >= granted_max_tokens:
        return None
    return corrected
