"""A fake vLLM 0.32.0 OpenAI server for brimful's tests and benchmarks.

Why a fake: a real vLLM needs a 2.5 GB venv and ~30 s to start (docs/vllm-behaviour.md),
too slow for a unit-test run.  This fake answers the way the real server did in
`shared/vllm/captures/` -- same status codes, byte-identical error bodies, the
same JSON keys in the same order, the same headers (`server: uvicorn`,
`vary: Origin`, compact JSON) and the same SSE framing -- so brimful's tests
exercise brimful against vLLM's real behaviour, not against a guess.

What it does not do: tokenize.  Prompt token counts come from `count_prompt`
(brimful's tests pass brimful's real counter; the default is a crude counter,
see `crude_count_prompt`).  Generated text is `completion_text_token` repeated:
the fake always generates up to the effective limit with finish_reason
"length", like the captured random-weight model that never emits EOS.

It is a raw asyncio HTTP/1.1 server (not uvicorn) because the fault knobs need
the socket: closing or resetting a connection before the headers or in the
middle of a body cannot be done from inside an ASGI app.

Modes (`mode=`):
  "v0.32"  -- vLLM 0.32.0 as captured: `prompt + max_tokens > max_model_len` is
              clamped silently; `max_tokens > max_model_len` alone is rejected;
              a prompt over the limit is "at least max_model_len+1"; a text over
              max_model_len x 128 characters trips the character pre-check.
  "legacy" -- v0.10-v0.17 `_validate_input` wording: reject when
              `prompt + max_tokens > max_model_len`, and a prompt that fills the
              context with the "your request has N input tokens" text.
  "v0.5"   -- the early `serving_engine.py` wording ("you requested N tokens
              (P in the messages, C in the completion)").
The exact texts and their sources are in docs/vllm-behaviour.md; the
legacy conditions and the "(parameter=..., value=...)" suffix follow the
2026-era user reports quoted there.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from email.utils import formatdate
from http import HTTPStatus
from typing import Any
from urllib.parse import urlsplit

import pydantic

from tests.support import agent_replies

__all__ = [
    "FakeVLLM",
    "FaultSpec",
    "RecordedRequest",
    "VLLMError",
    "chatml_char_count",
    "crude_count_prompt",
]

_SCRIPTED = ("chat", "responses", "messages")
VLLM_VERSION = "0.32.0"
SYSTEM_FINGERPRINT = "vllm-0.32.0-4aaade95"    # as in every capture
MAX_CHARS_PER_TOKEN = 128                       # c09d/e: 2048 tokens -> 262144 characters
QWEN3_VOCAB_SIZE = 151_669                      # docs/vllm-behaviour.md: Qwen3 tokenizer incl. added tokens
COMPLETIONS_DEFAULT_MAX_TOKENS = 16             # c18
FAKE_MAX_N = 128                                # the fake's own cap on choices (memory), not vLLM's
ENGINE_DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."

CountPrompt = Callable[[str, dict], int]
CountChars = Callable[[str, dict], int]


# --------------------------------------------------------------------------- #
# Records and knobs
# --------------------------------------------------------------------------- #

@dataclass
class RecordedRequest:
    """One request as the fake received it, plus what became of it.

    Times are `time.monotonic()` values.  `disconnected_at` is set when the
    client closed the connection before the fake finished its response (what a
    disconnect test asserts); `closed_at` when the connection carrying the
    request closed for any reason.
    """

    method: str
    path: str
    query: str
    headers: dict[str, str]
    body: bytes
    json: Any
    received_at: float
    status: int | None = None
    prompt_tokens: int | None = None        # the fake's count (sum over a batch)
    max_tokens: int | None = None           # the effective per-choice limit it generated to
    completion_tokens: int | None = None    # tokens actually sent (all choices)
    fault: FaultSpec | None = None
    finished_at: float | None = None
    disconnected_at: float | None = None
    closed_at: float | None = None


@dataclass
class FaultSpec:
    """A one-shot misbehaviour for the next matching request (`FakeVLLM.fail_next`).

    kind:
      "respond"            answer `status`/`body`/`content_type`/`headers` instead of the real answer
      "close"              close the connection without any response bytes
      "reset"              reset (TCP RST) the connection without any response bytes
      "stall"              send 200 headers (SSE if the request streams) and then nothing, until
                           the client goes away or the fake stops
      "close_mid_body"     send the real response but close after `after_chunks` body pieces
      "reset_mid_body"     same, with a TCP RST
      "sse_error"          stream normally, then after `after_chunks` events send
                           `data: {"error": ...}` and `data: [DONE]` (vLLM's mid-stream error)
      "huge"               a 200 chat completion whose content is `size` bytes, written a
                           MiB at a time (never held whole by the fake)
      "long_line"          a 200 chat stream whose one content event is `size` bytes on a single
                           line, then the usage chunk and [DONE]
    `delay` seconds are waited before anything is sent; `gate` (a threading.Event)
    is waited for first, so a test can hold a request without sleeping.
    `trickle` (kind "respond"): send the headers and the first half of the body,
    wait that many seconds, then the rest (an answer still arriving after its headers).
    `cut_at` (kind "respond"): declare the whole body's length, send its first
    `cut_at` bytes, then close (an answer broken off mid-way).
    `path` limits the fault to one route (None: the next request of any path).
    """

    kind: str = "respond"
    status: int = 500
    body: bytes | dict | None = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    gate: threading.Event | None = None
    path: str | None = None
    after_chunks: int = 1
    trickle: float = 0.0
    cut_at: int | None = None
    size: int = 0

    def body_bytes(self) -> bytes:
        if self.body is None:
            return _dumps({"error": {"message": "injected fault", "type": "InternalServerError",
                                     "param": None, "code": self.status}})
        if isinstance(self.body, dict):
            return _dumps(self.body)
        return self.body


class VLLMError(Exception):
    """An error vLLM answers with: status + OpenAI-style envelope (vLLM's own `type` names)."""

    def __init__(self, status: int, message: str, type: str = "BadRequestError",
                 param: str | None = None, code: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = status if code is None else code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


class AnthropicVLLMError(Exception):
    """A VLLMError on the Messages routes, answered in Anthropic's envelope (`anthropic_error`)."""

    def __init__(self, error: VLLMError) -> None:
        super().__init__(error.message)
        self.error = error


def _validation_error(message: str, parameter: str, value: Any) -> VLLMError:
    """vLLM's `VLLMValidationError`: the str() appends "(parameter=..., value=...)"."""
    return VLLMError(400, f"{message} (parameter={parameter}, value={value})", param=parameter)


# --------------------------------------------------------------------------- #
# Pure helpers: counting, pydantic-style validation, decisions
# --------------------------------------------------------------------------- #

def _dumps(obj: Any) -> bytes:
    # vLLM's responses are compact with raw UTF-8 (every capture's content-length matches this).
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def _message_text(content: Any) -> str:
    """Content as vLLM flattens it: a list of text parts is joined with "\\n" (docs/vllm-behaviour.md)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def crude_count_prompt(endpoint: str, body: dict) -> int:
    """The default prompt counter: deterministic, cheap and only roughly like a real tokenizer.

    chat: per message 5 framing tokens (ChatML's `<|im_start|>role\\n ... <|im_end|>\\n`)
    plus one per whitespace-separated word, plus 3 for the generation prompt when
    `add_generation_prompt` (default true); tools add one per 4 characters of their JSON.
    completions: one per word of a string prompt (minimum 1); a list of ids counts as is.
    responses / messages: as the chat of their messages (`as_chat`).
    """
    if endpoint in ("responses", "messages"):
        return crude_count_prompt("chat", as_chat(endpoint, body))
    if endpoint == "chat":
        total = 0
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                total += 5 + len(_message_text(message.get("content")).split())
        if body.get("tools"):
            total += len(json.dumps(body["tools"])) // 4
        if body.get("add_generation_prompt", True):
            total += 3
        return total
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return len(prompt)
    return max(1, len(str(prompt or "").split()))


def _texts(content: Any) -> str:
    """The text of a Responses item's or a Messages block list's content, roughly."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    parts = []
    for part in content:
        if isinstance(part, dict):
            for key in ("text", "thinking", "arguments", "output"):
                if isinstance(part.get(key), str):
                    parts.append(part[key])
            if isinstance(part.get("input"), dict):
                parts.append(json.dumps(part["input"]))
            if part.get("content") is not None:
                parts.append(_texts(part["content"]))
    return "\n".join(parts)


def as_chat(endpoint: str, body: dict) -> dict:
    """A Responses or Messages body as a chat body, for the fake's crude counters only
    (brimful's tests count with the real conversion: tests/support/stack.py's `fake_counter`)."""
    messages: list[dict] = []
    if endpoint == "responses":
        if body.get("instructions"):
            messages.append({"role": "system", "content": str(body["instructions"])})
        items = body.get("input")
        items = [{"role": "user", "content": items}] if isinstance(items, str) else (items or [])
        for item in items:
            if isinstance(item, dict):
                messages.append({"role": item.get("role", "assistant"), "content": _texts([item])})
    else:
        system = body.get("system")
        if system:
            messages.append({"role": "system", "content": _texts(system) if isinstance(system, list) else system})
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                messages.append({"role": message.get("role"), "content": _texts(message.get("content"))})
    chat: dict = {"messages": messages}
    if body.get("tools"):
        chat["tools"] = body["tools"]
    return chat


def chatml_char_count(endpoint: str, body: dict) -> int:
    """Characters of the prompt text vLLM's character pre-check sees.

    chat: the length of the ChatML rendering (Qwen's template without tools):
    "<|im_start|>user\\n" + text + "<|im_end|>\\n" per message, plus
    "<|im_start|>assistant\\n" -- 300,000 characters of content render to 300,050,
    as in capture c09d.  completions: the prompt string's length.
    """
    if endpoint in ("responses", "messages"):
        return chatml_char_count("chat", as_chat(endpoint, body))
    if endpoint == "chat":
        n = 0
        for message in body.get("messages") or []:
            if isinstance(message, dict):
                n += len("<|im_start|>") + len(str(message.get("role", ""))) + 1
                n += len(_message_text(message.get("content"))) + len("<|im_end|>\n")
        if body.get("add_generation_prompt", True):
            n += len("<|im_start|>assistant\n")
        return n
    prompt = body.get("prompt")
    return len(prompt) if isinstance(prompt, str) else 0


def _short_input(value: Any) -> str:
    """How vLLM prints a rejected input in a validation message (c30-c32, c12)."""
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return str(value)


def _pydantic_error(errors: list[dict[str, Any]]) -> VLLMError:
    """FastAPI's RequestValidationError as vLLM 0.32 words it: type "Bad Request", param = loc."""
    count = len(errors)
    head = f"{count} validation error{'s' if count != 1 else ''}:"
    message = head + "".join("\n  " + repr(e) for e in errors)
    return VLLMError(400, message, type="Bad Request", param=errors[0]["loc"])


def _err(type_: str, loc: str, msg: str, value: Any) -> dict[str, Any]:
    return {"type": type_, "loc": loc, "msg": msg, "input": _short_input(value)}


def _coerce_int(body: dict, key: str, errors: list[dict], ge: int | None = None) -> int | None:
    """Pydantic v2 lax int, by pydantic itself (vLLM's request models): true -> 1, 2.0 -> 2,
    "10" -> 10, "1_000", "10.0"; 1.5, "abc", "+-5" are errors in pydantic's words (c12*)."""
    value = body.get(key)
    if value is None:
        return None
    try:
        number = _LAX_INT.validate_python(value)
    except pydantic.ValidationError as exc:
        found = exc.errors()[0]
        errors.append(_err(found["type"], f"body.{key}", found["msg"], value))
        return None
    if ge is not None and number < ge:
        errors.append(_err("greater_than_equal", f"body.{key}", f"Input should be greater than or equal to {ge}",
                           value))
        return None
    return int(number)


_LAX_INT: pydantic.TypeAdapter[int] = pydantic.TypeAdapter(int)
_TRUE = {"1", "on", "t", "true", "y", "yes"}
_FALSE = {"0", "off", "f", "false", "n", "no"}


def _coerce_bool(body: dict, key: str, errors: list[dict]) -> bool:
    value = body.get(key)
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE | _FALSE:
        return value.lower() in _TRUE
    errors.append(_err("bool_parsing", f"body.{key}", "Input should be a valid boolean, unable to interpret input",
                       value))
    return False


def _coerce_float(body: dict, key: str, errors: list[dict]) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    errors.append(_err("float_parsing", f"body.{key}",
                       "Input should be a valid number, unable to parse string as a number", value))
    return None


def parse_json_body(raw: bytes) -> dict:
    """Decode the body as FastAPI does, raising vLLM's 400 for bad JSON or a non-object (c30)."""
    if not raw.strip():
        raise _pydantic_error([_err("missing", "body", "Field required", None)])
    try:
        body = json.loads(raw)
    except json.JSONDecodeError as e:
        error = _err("json_invalid", f"body.{e.pos}", "JSON decode error", {})
        error["ctx"] = {"error": e.msg}
        raise _pydantic_error([error]) from None
    except UnicodeDecodeError:
        raise _pydantic_error([_err("json_invalid", "body", "JSON decode error", {})]) from None
    if not isinstance(body, dict):
        raise _pydantic_error([_err("model_attributes_type", "body",
                                    "Input should be a valid dictionary or object to extract fields from", body)])
    return body


@dataclass
class Plan:
    """A validated generation request: what the fake will send."""

    model: str
    prompts: list[int]          # prompt tokens per prompt (one for chat)
    max_tokens: int             # effective per-choice limit, same for all prompts unless listed
    per_prompt_max: list[int]
    n: int
    stream: bool
    include_usage: bool
    continuous_usage: bool
    stopped: bool = False       # Responses: a stop string matched the first token (1 token, no text)

    @property
    def prompt_tokens(self) -> int:
        return sum(self.prompts)


def _token_len_error(mode: str, mml: int, shown: int, exact: bool, requested: int | None) -> VLLMError:
    """The prompt-too-long error, in the wording of `mode`."""
    if mode == "v0.32":
        q = "at least " if not exact or shown == mml + 1 else ""
        return _validation_error(
            f"This model's maximum context length is {mml} tokens. However, your prompt contains "
            f"{q}{shown} input tokens, which exceeds this limit even without any output tokens. "
            f"Please reduce the length of the input prompt.", "input_tokens", shown)
    if mode == "legacy":
        return _validation_error(
            f"This model's maximum context length is {mml} tokens. However, your request has "
            f"{shown} input tokens. Please reduce the length of the input messages.", "input_tokens", shown)
    # v0.5: plain ValueError, no parameter
    if requested is None:
        return VLLMError(400, f"This model's maximum context length is {mml} tokens. However, you requested "
                              f"{shown} tokens in the messages, Please reduce the length of the messages.")
    return VLLMError(400, f"This model's maximum context length is {mml} tokens. However, you requested "
                          f"{shown + requested} tokens ({shown} in the messages, {requested} in the completion). "
                          f"Please reduce the length of the messages or completion.")


def decide_max_tokens(mode: str, mml: int, prompt_tokens: int, requested: int | None,
                      default: int | None) -> int:
    """The per-choice limit vLLM generates to, or its error.

    `requested` is the client's value (None: omitted), `default` the endpoint's
    default (None: the remaining room, as chat does; 16 for /v1/completions).
    v0.32 clamps to the remaining room (c01, c11c, c19, c24).  Older versions
    rejected `prompt + max_tokens > max_model_len`, and their completions
    protocol defaulted the field itself to 16, so it was checked like a sent one.
    """
    room = mml - prompt_tokens
    if mode == "v0.32":
        wanted = requested if requested is not None else (default if default is not None else room)
        effective = min(wanted, room)
    else:
        if requested is None and default is not None:
            requested = default
        if requested is not None and prompt_tokens + requested > mml:
            if mode == "legacy":
                raise _validation_error(
                    f"'max_tokens' or 'max_completion_tokens' is too large: {requested}. This model's "
                    f"maximum context length is {mml} tokens and your request has {prompt_tokens} input "
                    f"tokens ({requested} > {mml} - {prompt_tokens}).", "max_tokens", requested)
            raise _token_len_error("v0.5", mml, prompt_tokens, True, requested)
        effective = requested if requested is not None else room
    if effective < 1:
        # SamplingParams' own check; it names max_tokens even for max_completion_tokens (c12).
        raise _validation_error(f"max_tokens must be at least 1, got {effective}.", "max_tokens", effective)
    return effective


class Validator:
    """Request validation in vLLM 0.32's order, as pure functions of (body, config).

    Order (inferred from the captures and vLLM's pipeline): JSON/pydantic field
    errors -> unknown model (404) -> tool-choice support -> empty conversation ->
    output limit alone > max_model_len -> character pre-check -> prompt token
    check -> token ids in vocabulary -> SamplingParams (n, temperature, max_tokens >= 1).
    """

    def __init__(self, *, models: dict[str, int], default_model: str, mode: str,
                 count_prompt: CountPrompt, count_chars: CountChars, vocab_size: int,
                 enable_auto_tool_choice: bool) -> None:
        if mode not in ("v0.32", "legacy", "v0.5"):
            raise ValueError(f"unknown mode {mode!r}")
        self.models = models                  # served name -> max_model_len
        self.default_model = default_model
        self.mode = mode
        self.count_prompt = count_prompt
        self.count_chars = count_chars
        self.vocab_size = vocab_size
        self.enable_auto_tool_choice = enable_auto_tool_choice

    # -- shared steps ------------------------------------------------------- #

    def resolve_model(self, body: dict) -> tuple[str, int]:
        name = body.get("model")
        if name is None or name == "":
            name = self.default_model
        if name not in self.models:
            aliases = ", ".join(self.models)
            raise VLLMError(404, f"The model `{name}` does not exist. Valid aliases: {aliases}.",
                            type="NotFoundError", param="model")
        return name, self.models[name]

    def _limit_alone(self, mml: int, requested: int | None, param: str) -> None:
        # c03/c04/c08/c20: only vLLM 0.32's renderer has this check.
        if self.mode == "v0.32" and requested is not None and requested > mml:
            raise _validation_error(
                f"{param}={requested} cannot be greater than max_model_len={mml}. "
                f"Please request fewer output tokens.", param, requested)

    def _char_check(self, mml: int, chars: int) -> None:
        bound = mml * MAX_CHARS_PER_TOKEN
        if self.mode == "v0.32" and chars > bound:
            raise _validation_error(
                f"This model's maximum context length is {mml} tokens. However, your prompt contains "
                f"{chars} characters (more than {bound} characters, which is the upper bound for {mml} "
                f"input tokens). Please reduce the length of the input prompt.", "input_text", chars)

    def _token_check(self, mml: int, count: int, is_text: bool, requested: int | None) -> None:
        if self.mode == "v0.32":
            if count > mml:
                # text is tokenized only up to max_model_len + 1 tokens, so the count shown is capped
                shown = mml + 1 if is_text else count
                raise _token_len_error("v0.32", mml, shown, not is_text, requested)
        elif self.mode == "legacy":
            # `_validate_input`: "input length can be up to model context length - 1"
            if count >= mml:
                raise _token_len_error("legacy", mml, count, True, requested)
        elif requested is None and count >= mml:
            # v0.5 checks the prompt alone only when max_tokens was not sent
            raise _token_len_error("v0.5", mml, count, True, None)

    def _truncation(self, mml: int, truncate: int | None, output_limit: int | None) -> int | None:
        """The prompt tokens `truncate_prompt_tokens` keeps (renderers/params.py: TokenizeParams'
        check, then `_truncation_slice`; -1 is max_model_len less one when an output limit is set)."""
        if truncate is None:
            return None
        if truncate > mml:
            raise _validation_error(
                f"truncate_prompt_tokens={truncate} cannot be greater than max_model_len = {mml}. "
                f"Please request a smaller truncation size.", "truncate_prompt_tokens", truncate)
        if truncate == -1:
            return mml - 1 if output_limit else mml
        return truncate

    def _sampling_checks(self, n: int | None, temperature: float | None) -> None:
        if n is not None and n < 1:
            raise _validation_error(f"n must be at least 1, got {n}.", "n", n)
        if n is not None and n > FAKE_MAX_N:
            # Not a vLLM rule: the fake builds every choice in memory, and a fuzzed
            # n of 2**40 once took 21 GB before the OOM killer stopped the test run.
            raise _validation_error(f"n must be at most {FAKE_MAX_N} in the fake vLLM, got {n}.", "n", n)
        if temperature is not None and temperature < 0.0:
            raise _validation_error(f"temperature must be non-negative, got {temperature}.", "temperature", temperature)

    # -- endpoints ---------------------------------------------------------- #

    def chat(self, body: dict) -> Plan:
        errors: list[dict] = []
        messages = body.get("messages")
        if "messages" not in body:
            errors.append(_err("missing", "body.messages", "Field required", body))
        elif not isinstance(messages, list):
            errors.append(_err("list_type", "body.messages", "Input should be a valid list", messages))
        if body.get("model") is not None and not isinstance(body.get("model"), str):
            errors.append(_err("string_type", "body.model", "Input should be a valid string", body["model"]))
        max_tokens = _coerce_int(body, "max_tokens", errors)
        max_completion_tokens = _coerce_int(body, "max_completion_tokens", errors)
        n = _coerce_int(body, "n", errors)
        truncate = _coerce_int(body, "truncate_prompt_tokens", errors, ge=-1)
        temperature = _coerce_float(body, "temperature", errors)
        stream = _coerce_bool(body, "stream", errors)
        if errors:
            raise _pydantic_error(errors)

        model, mml = self.resolve_model(body)
        tools = body.get("tools")
        if tools and body.get("tool_choice") in (None, "auto") and not self.enable_auto_tool_choice:
            raise VLLMError(400, '"auto" tool choice requires --enable-auto-tool-choice and '
                                 '--tool-call-parser to be set')
        if not messages:
            raise VLLMError(400, "Cannot apply chat template to an empty conversation. "
                                 "Provide at least one message.")
        # c05-c08: max_completion_tokens wins and max_tokens is then not validated at all.
        if max_completion_tokens is not None:
            requested, param = max_completion_tokens, "max_completion_tokens"
        else:
            requested, param = max_tokens, "max_tokens"
        if self.mode != "v0.32":
            requested = max_completion_tokens or max_tokens   # the old `a or b` (0 falls through)
        self._limit_alone(mml, requested, param)
        keep = self._truncation(mml, truncate, requested)
        if keep is None:
            self._char_check(mml, self.count_chars("chat", body))
        count = self.count_prompt("chat", body)
        count = count if keep is None else min(count, keep)
        self._token_check(mml, count, True, requested)
        self._sampling_checks(n, temperature)
        effective = decide_max_tokens(self.mode, mml, count, requested, None)
        return self._plan(model, [count], [effective], n or 1, stream, body)

    def completions(self, body: dict) -> Plan:
        errors: list[dict] = []
        if body.get("prompt") is None:
            errors.append(_err("missing", "body.prompt", "Field required", body))
        max_tokens = _coerce_int(body, "max_tokens", errors)
        n = _coerce_int(body, "n", errors)
        truncate = _coerce_int(body, "truncate_prompt_tokens", errors, ge=-1)
        temperature = _coerce_float(body, "temperature", errors)
        stream = _coerce_bool(body, "stream", errors)
        if errors:
            raise _pydantic_error(errors)

        model, mml = self.resolve_model(body)
        prompts = _split_prompts(body["prompt"])
        self._limit_alone(mml, max_tokens, "max_tokens")
        # the protocol's default max_tokens is 16: only an explicit null leaves no output limit
        output_limit = max_tokens if max_tokens is not None or "max_tokens" in body else 16
        keep = self._truncation(mml, truncate, output_limit)
        # before v0.32 the protocol itself defaulted max_tokens to 16
        checked = max_tokens if max_tokens is not None or self.mode == "v0.32" else COMPLETIONS_DEFAULT_MAX_TOKENS
        counts: list[int] = []
        limits: list[int] = []
        for prompt in prompts:
            if isinstance(prompt, str):
                one = dict(body, prompt=prompt)
                if keep is None:
                    self._char_check(mml, self.count_chars("completions", one))
                count = self.count_prompt("completions", one)
                count = count if keep is None else min(count, keep)
                self._token_check(mml, count, True, checked)
            else:
                count = len(prompt) if keep is None else min(len(prompt), keep)
                self._token_check(mml, count, False, checked)
                for token_id in prompt:
                    if not isinstance(token_id, int) or token_id < 0 or token_id >= self.vocab_size:
                        raise VLLMError(400, f"Token id {token_id} is out of vocabulary")
            self._sampling_checks(n, temperature)
            default = COMPLETIONS_DEFAULT_MAX_TOKENS
            limits.append(decide_max_tokens(self.mode, mml, count, max_tokens, default))
            counts.append(count)
        return self._plan(model, counts, limits, n or 1, stream, body)

    def responses(self, body: dict, known_responses: set[str]) -> Plan:
        """/v1/responses, in OpenAIServingResponses' order (captures r01-r08)."""
        errors: list[dict] = []
        if "input" not in body:
            errors.append(_err("missing", "body.input", "Field required", body))
        max_output = _coerce_int(body, "max_output_tokens", errors)
        stream = _coerce_bool(body, "stream", errors)
        if errors:
            raise _pydantic_error(errors)
        model, mml = self.resolve_model(body)
        previous = body.get("previous_response_id")
        if previous is not None and previous not in known_responses:
            raise VLLMError(404, f"Response with id '{previous}' not found.", type="invalid_request_error",
                            param="response_id")
        self._limit_alone(mml, max_output, "max_output_tokens")
        truncate = "truncation" in body and body["truncation"] != "disabled"
        if not truncate:
            self._char_check(mml, self.count_chars("responses", body))
        count = self.count_prompt("responses", body)
        if truncate:     # build_tok_params: truncate_prompt_tokens=-1 keeps max_model_len (- 1 with a limit)
            count = min(count, mml - 1 if max_output else mml)
        self._token_check(mml, count, True, max_output)
        if count >= mml:
            raise VLLMError(400, f"The engine prompt length {count} exceeds the max_model_len {mml}. "
                                 "Please reduce prompt.", type="invalid_request_error", param="input")
        effective = decide_max_tokens(self.mode, mml, count, max_output, None)
        return self._plan(model, [count], [effective], 1, stream, body)

    def messages(self, body: dict) -> Plan:
        """/v1/messages: vLLM's chat path on the converted request (captures m01-m11); its
        errors are Anthropic-shaped except pydantic's (m06)."""
        errors: list[dict] = []
        if "messages" not in body:
            errors.append(_err("missing", "body.messages", "Field required", body))
        if "max_tokens" not in body:
            errors.append(_err("missing", "body.max_tokens", "Field required", body))
        max_tokens = _coerce_int(body, "max_tokens", errors)
        stream = _coerce_bool(body, "stream", errors)
        if errors:
            raise _pydantic_error(errors)
        model, mml = self.resolve_model(body)
        self._limit_alone(mml, max_tokens, "max_completion_tokens")
        self._char_check(mml, self.count_chars("messages", body))
        count = self.count_prompt("messages", body)
        self._token_check(mml, count, True, max_tokens)
        effective = decide_max_tokens(self.mode, mml, count, max_tokens, None)
        return self._plan(model, [count], [effective], 1, stream, body)

    def count_tokens(self, body: dict) -> int:
        """/v1/messages/count_tokens: the render's own length check applies (m09)."""
        if "messages" not in body:
            raise _pydantic_error([_err("missing", "body.messages", "Field required", body)])
        _, mml = self.resolve_model(body)
        self._char_check(mml, self.count_chars("messages", body))
        count = self.count_prompt("messages", body)
        self._token_check(mml, count, True, None)
        return count

    def pooling_inputs(self, path: str, body: dict) -> tuple[str, list[int]]:
        """The prompt tokens of each input a pooling request embeds (captures p01-p11)."""
        model, mml = self.resolve_model(body)
        truncate = body.get("truncate_prompt_tokens")
        if isinstance(truncate, int) and truncate > mml:
            raise VLLMError(400, "truncate_prompt_tokens value is greater than max_model_len. Please request a "
                                 "smaller truncation size.", param=None)
        if path in ("/score", "/v1/score", "/rerank", "/v1/rerank"):
            queries = body.get("query", body.get("queries"))
            documents = body.get("documents")
            texts = ([queries] if isinstance(queries, str) else list(queries or [])) + (
                [documents] if isinstance(documents, str) else list(documents or []))
            inputs: list[Any] = texts
        elif body.get("messages") is not None:
            inputs = [{"messages": body["messages"], "add_generation_prompt": False}]
        else:
            inputs = _split_prompts(body.get("input"))
        counts = []
        for item in inputs:
            if isinstance(item, dict):
                count, is_text = self.count_prompt("chat", item), True
            elif isinstance(item, list):
                count, is_text = len(item), False
            else:
                count, is_text = self.count_prompt("completions", dict(body, prompt=item)), True
            if truncate is not None and truncate != 0:
                count = min(count, mml if truncate == -1 else truncate)
            self._token_check(mml, count, is_text, None)
            counts.append(count)
        return model, counts

    def _plan(self, model: str, counts: list[int], limits: list[int], n: int, stream: bool,
              body: dict) -> Plan:
        options = body.get("stream_options") if stream else None
        options = options if isinstance(options, dict) else {}
        include_usage = _coerce_bool(options, "include_usage", [])     # lax, as vLLM reads it ("false" is False)
        return Plan(model=model, prompts=counts, max_tokens=limits[0], per_prompt_max=limits, n=n,
                    stream=stream, include_usage=include_usage,
                    continuous_usage=include_usage and _coerce_bool(options, "continuous_usage_stats", []))


def _split_prompts(prompt: Any) -> list[str | list[int]]:
    """A completions `prompt` as a list of single prompts (string, ids, batch of either)."""
    if isinstance(prompt, str):
        return [prompt]
    if isinstance(prompt, list):
        if not prompt or all(isinstance(p, int) and not isinstance(p, bool) for p in prompt):
            return [prompt]
        return [p for p in prompt]
    return [str(prompt)]


# --------------------------------------------------------------------------- #
# Response bodies (key order as in the captures)
# --------------------------------------------------------------------------- #

def _request_id() -> str:
    return f"{random.getrandbits(64):016x}"


def chat_completion_body(plan: Plan, rid: str, created: int, token: str) -> dict:
    choices = [{
        "index": i,
        "message": {"role": "assistant", "content": token * plan.max_tokens, "refusal": None,
                    "annotations": None, "audio": None, "function_call": None, "reasoning": None},
        "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None,
        "routed_experts": None,
    } for i in range(plan.n)]
    completion = plan.max_tokens * plan.n
    return {
        "id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": plan.model,
        "choices": choices, "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": _usage(plan.prompt_tokens, completion),
        "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    }


def completion_body(plan: Plan, rid: str, created: int, token: str) -> dict:
    choices = []
    for p, limit in enumerate(plan.per_prompt_max):
        for j in range(plan.n):
            choices.append({
                "index": p * plan.n + j, "text": token * limit, "logprobs": None,
                "finish_reason": "length", "stop_reason": None, "token_ids": None,
                "prompt_logprobs": None, "prompt_token_ids": None, "routed_experts": None,
            })
    completion = sum(plan.per_prompt_max) * plan.n
    return {
        "id": f"cmpl-{rid}", "object": "text_completion", "created": created, "model": plan.model,
        "choices": choices, "service_tier": None, "system_fingerprint": SYSTEM_FINGERPRINT,
        "usage": _usage(plan.prompt_tokens, completion),
        "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
    }


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "completion_tokens_details": None}


def _sse(obj: Any) -> bytes:
    return b"data: " + _dumps(obj) + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def stream_events(plan: Plan, chat: bool, rid: str, created: int, token: str) -> Iterable[tuple[str, bytes]]:
    """The SSE events of a streamed answer, one per generated token, framed as e01-e04/c29b.

    Chat: a role chunk per choice, then tokens round-robin over the choices (each
    choice's last token carries finish_reason "length"), then the usage chunk when
    `include_usage`; `system_fingerprint` rides on the usage chunk, or on the
    finish chunks when there is no usage chunk (e02).  Completions: no role chunk.
    Yields (kind, event bytes); kind is "step" for the first token of a decoding
    step (where pacing waits), "token" for the other choices' tokens of that
    step, "meta" for everything else.
    """
    head = {"id": ("chatcmpl-" if chat else "cmpl-") + rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created, "model": plan.model}
    prompt = plan.prompt_tokens
    choices: list[tuple[int, int]] = []          # (index, limit)
    for p, limit in enumerate(plan.per_prompt_max):
        for j in range(plan.n):
            choices.append((p * plan.n + j, limit))
    done = {index: 0 for index, _ in choices}
    cont = plan.continuous_usage

    def usage_now() -> dict:
        completion = sum(done.values())
        return {"prompt_tokens": prompt, "total_tokens": prompt + completion,
                "completion_tokens": completion, "completion_tokens_details": None}

    if chat:
        for index, _ in choices:
            event = dict(head, choices=[{"index": index, "delta": {"role": "assistant", "content": ""},
                                         "logprobs": None, "finish_reason": None}])
            if cont:
                event["usage"] = usage_now()
            event["prompt_token_ids"] = None
            event["prompt_text"] = None
            yield "meta", _sse(event)
    longest = max(limit for _, limit in choices)
    for step in range(longest):
        kind = "step"
        for index, limit in choices:
            if step >= limit:
                continue
            done[index] += 1
            last = step == limit - 1
            if chat:
                choice: dict[str, Any] = {"index": index, "delta": {"content": token}, "logprobs": None,
                                          "finish_reason": "length" if last else None}
                if last:
                    choice["stop_reason"] = None
                choice["token_ids"] = None
            else:
                choice = {"index": index, "text": token, "logprobs": None,
                          "finish_reason": "length" if last else None, "stop_reason": None,
                          "prompt_token_ids": None, "token_ids": None}
            event = dict(head, choices=[choice])
            if cont:
                event["usage"] = usage_now()
            if last and not plan.include_usage:
                event["system_fingerprint"] = SYSTEM_FINGERPRINT
            yield kind, _sse(event)
            kind = "token"
    if plan.include_usage:
        completion = sum(done.values())
        yield "meta", _sse(dict(head, choices=[], usage={"prompt_tokens": prompt, "total_tokens": prompt + completion,
                                                         "completion_tokens": completion},
                                system_fingerprint=SYSTEM_FINGERPRINT))
    yield "meta", SSE_DONE


# --------------------------------------------------------------------------- #
# Responses, Anthropic Messages and pooling bodies (key order as in
# tests/data/vllm032_surfaces/)
# --------------------------------------------------------------------------- #

def _responses_usage(prompt: int, completion: int) -> dict:
    return {"input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0, "input_tokens_per_turn": [],
                                     "cached_tokens_per_turn": []},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0, "tool_output_tokens": 0, "output_tokens_per_turn": [],
                                      "tool_output_tokens_per_turn": []},
            "total_tokens": prompt + completion}


def responses_object(plan: Plan, request: dict, rid: str, created: int, output: list, status: str,
                     usage: dict | None) -> dict:
    """A ResponsesResponse as vLLM dumps it (r01): `max_output_tokens` is the limit it generated to."""
    temperature = request.get("temperature")
    return {
        "id": f"resp_{rid}", "created_at": created,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": request.get("instructions"), "metadata": request.get("metadata"), "model": plan.model,
        "object": "response", "output": output, "parallel_tool_calls": True,
        "temperature": float(temperature) if isinstance(temperature, (int, float)) else 1.0,
        "tool_choice": "auto" if request.get("tools") else "none", "tools": request.get("tools") or [],
        "top_p": 1.0, "background": False, "max_output_tokens": plan.max_tokens, "max_tool_calls": None,
        "previous_response_id": request.get("previous_response_id"), "prompt": None, "reasoning": None,
        "service_tier": "auto", "status": status, "text": None, "top_logprobs": None, "truncation": "disabled",
        "usage": usage, "user": None, "presence_penalty": 0.0, "frequency_penalty": 0.0,
        "kv_transfer_params": None, "ec_transfer_params": None, "input_messages": None, "output_messages": None,
    }


def _output_message(mid: str, text: str, status: str, logprobs: Any) -> dict:
    content = [{"annotations": [], "text": text, "type": "output_text", "logprobs": logprobs}] if status else []
    return {"id": mid, "content": content, "role": "assistant", "status": status or "in_progress",
            "type": "message", "phase": None}


def _status(plan: Plan) -> str:
    return "completed" if plan.stopped else "incomplete"


def _generated(plan: Plan, token: str) -> str:
    return "" if plan.stopped else token * plan.max_tokens


def responses_body(plan: Plan, request: dict, rid: str, created: int, token: str) -> dict:
    output = [_output_message(f"msg_{rid}", _generated(plan, token), "completed", None)]
    return responses_object(plan, request, rid, created, output, _status(plan),
                            _responses_usage(plan.prompt_tokens, plan.max_tokens))


def _event(name: str, data: dict) -> bytes:
    return f"event: {name}\ndata: ".encode() + _dumps(data) + b"\n\n"


def responses_stream_events(plan: Plan, request: dict, rid: str, created: int,
                            token: str) -> Iterable[tuple[str, bytes]]:
    """r02: created, in_progress, the message item and its text part, a delta per token, the
    closing events and response.completed (also when the answer is incomplete)."""
    mid = f"msg_{rid}"
    seq = iter(range(1 << 30))
    initial = responses_object(plan, request, rid, created, [], "in_progress", None)
    yield "meta", _event("response.created", {"response": initial, "sequence_number": next(seq),
                                              "type": "response.created"})
    yield "meta", _event("response.in_progress", {"response": initial, "sequence_number": next(seq),
                                                  "type": "response.in_progress"})
    yield "meta", _event("response.output_item.added", {
        "item": _output_message(mid, "", "", None), "output_index": 0, "sequence_number": next(seq),
        "type": "response.output_item.added"})
    yield "meta", _event("response.content_part.added", {
        "content_index": 0, "item_id": mid, "output_index": 0,
        "part": {"annotations": [], "text": "", "type": "output_text", "logprobs": []},
        "sequence_number": next(seq), "type": "response.content_part.added"})
    for _ in range(0 if plan.stopped else plan.max_tokens):
        yield "step", _event("response.output_text.delta", {
            "content_index": 0, "delta": token, "item_id": mid, "logprobs": [], "output_index": 0,
            "sequence_number": next(seq), "type": "response.output_text.delta"})
    text = _generated(plan, token)
    yield "meta", _event("response.output_text.done", {
        "content_index": 0, "item_id": mid, "logprobs": [], "output_index": 0, "sequence_number": next(seq),
        "text": text, "type": "response.output_text.done"})
    yield "meta", _event("response.content_part.done", {
        "content_index": 0, "item_id": mid, "output_index": 0,
        "part": {"annotations": [], "text": text, "type": "output_text", "logprobs": None},
        "sequence_number": next(seq), "type": "response.content_part.done"})
    item = _output_message(mid, text, "completed", None)
    yield "meta", _event("response.output_item.done", {"item": item, "output_index": 0,
                                                       "sequence_number": next(seq),
                                                       "type": "response.output_item.done"})
    final = responses_object(plan, request, rid, created, [item], _status(plan),
                             _responses_usage(plan.prompt_tokens, plan.max_tokens))
    yield "meta", _event("response.completed", {"response": final, "sequence_number": next(seq),
                                                "type": "response.completed"})


def messages_body(plan: Plan, rid: str, token: str) -> dict:
    """m01 (vLLM's id is the chat completion's)."""
    return {"id": f"chatcmpl-{rid}", "type": "message", "role": "assistant",
            "content": [{"type": "text", "text": token * plan.max_tokens}], "model": plan.model,
            "stop_reason": "max_tokens", "usage": {"input_tokens": plan.prompt_tokens,
                                                   "output_tokens": plan.max_tokens}}


def messages_stream_events(plan: Plan, rid: str, token: str) -> Iterable[tuple[str, bytes]]:
    """m02: message_start, one text block with a delta per token, message_delta (usage), message_stop."""
    yield "meta", _event("message_start", {"type": "message_start", "message": {
        "id": f"chatcmpl-{rid}", "type": "message", "role": "assistant", "content": [], "model": plan.model,
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": 0}}})
    yield "meta", _event("content_block_start", {"type": "content_block_start",
                                                 "content_block": {"type": "text", "text": ""}, "index": 0})
    for _ in range(plan.max_tokens):
        yield "step", _event("content_block_delta", {"type": "content_block_delta",
                                                     "delta": {"type": "text_delta", "text": token}, "index": 0})
    yield "meta", _event("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield "meta", _event("message_delta", {
        "type": "message_delta", "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
        "usage": {"input_tokens": plan.prompt_tokens, "output_tokens": plan.max_tokens}})
    yield "meta", _event("message_stop", {"type": "message_stop"})


def anthropic_error(e: VLLMError) -> dict:
    """`translate_error_response`: vLLM's error type and message in Anthropic's envelope (m03-m07)."""
    return {"type": "error", "error": {"type": e.type, "message": e.message}}


def _pool_usage(prompt: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0,
            "prompt_tokens_details": None, "completion_tokens_details": None}


def _vector(i: int) -> list[float]:
    return [round(0.01 * (i + 1) * k, 6) for k in range(1, 5)]


def pooling_body(path: str, model: str, counts: list[int], body: dict, rid: str, created: int) -> dict:
    """p01 (embeddings), p08 (pooling), p09 (score), p10 (rerank); vectors are 4 made-up floats."""
    prompt = sum(counts)
    if path in ("/score", "/v1/score"):
        documents = body.get("documents")
        n = 1 if isinstance(documents, str) else len(documents or [])
        return {"id": f"score-{rid}", "object": "list", "created": created, "model": model,
                "data": [{"index": i, "object": "score", "score": -0.1 * (i + 1)} for i in range(n)],
                "usage": _pool_usage(prompt)}
    if path in ("/rerank", "/v1/rerank"):
        documents = body.get("documents") or []
        results = [{"index": i, "document": {"text": d, "multi_modal": None},
                    "relevance_score": -0.1 * (len(documents) - i)} for i, d in enumerate(documents)]
        results.sort(key=lambda r: -r["relevance_score"])    # best first, as vLLM ranks them
        return {"id": f"score-{rid}", "model": model, "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
                "results": results}
    if path == "/v1/embeddings":
        data = [{"index": i, "object": "embedding", "embedding": _vector(i)} for i in range(len(counts))]
        return {"id": f"embd-{rid}", "object": "list", "created": created, "model": model, "data": data,
                "usage": _pool_usage(prompt)}
    data = [{"index": i, "object": "pooling", "data": _vector(i)} for i in range(len(counts))]
    return {"id": f"pooling-{rid}", "object": "list", "created": created, "model": model, "data": data,
            "usage": _pool_usage(prompt)}


def model_card(card: dict, created: int) -> dict:
    """A /v1/models entry as vLLM dumps its `ModelCard` (a LoRA card has max_model_len null)."""
    return {
        "id": card["id"], "object": "model", "created": created, "owned_by": card.get("owned_by", "vllm"),
        "root": card.get("root", card["id"]), "parent": card.get("parent"),
        "max_model_len": card.get("max_model_len"),
        "permission": [{
            "id": f"modelperm-{_request_id()}", "object": "model_permission", "created": created,
            "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
            "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
            "organization": "*", "group": None, "is_blocking": False,
        }],
    }


# --------------------------------------------------------------------------- #
# HTTP plumbing
# --------------------------------------------------------------------------- #

class _Request:
    __slots__ = ("body", "headers", "method", "target")

    def __init__(self, method: str, target: str, headers: dict[str, str], body: bytes) -> None:
        self.method, self.target, self.headers, self.body = method, target, headers, body


class _Disconnected(Exception):
    """The client went away while the fake was answering."""


class _Connection(asyncio.Protocol):
    """One client connection: parses HTTP/1.1 requests one at a time and hands them to the app."""

    def __init__(self, fake: FakeVLLM) -> None:
        self.fake = fake
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.busy = False
        self.closed = False
        self.closed_event = asyncio.Event()
        self.current: RecordedRequest | None = None
        self.all: list[RecordedRequest] = []
        self._writable = asyncio.Event()
        self._writable.set()

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.fake._connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self._try_dispatch()
        if self.buffer:
            with self.fake._cond:      # a test may wait for a request to be under way
                self.fake._cond.notify_all()

    def eof_received(self) -> bool | None:
        # a half-close from the client means it will send nothing more: treat as gone
        self._lost()
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost()

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def _lost(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.closed_event.set()
        self._writable.set()
        self.fake._connections.discard(self)
        now = time.monotonic()
        with self.fake._cond:
            if self.buffer and not self.busy:
                self.fake.partial_requests.append(bytes(self.buffer[:200]))
            for rec in self.all:
                if rec.closed_at is None:
                    rec.closed_at = now
            if self.current is not None and self.current.finished_at is None:
                self.current.disconnected_at = now
            self.fake._cond.notify_all()
        if self.transport is not None:
            self.transport.close()

    # parsing
    def _try_dispatch(self) -> None:
        request = self._parse()
        if request is None:
            return
        self.busy = True
        asyncio.get_running_loop().create_task(self._serve(request))

    def _parse(self) -> _Request | None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return None
        head = bytes(self.buffer[:end]).decode("latin-1")
        lines = head.split("\r\n")
        try:
            method, target, _version = lines[0].split(" ", 2)
        except ValueError:
            self._bad_request()
            return None
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            key = name.strip().lower()
            headers[key] = f"{headers[key]}, {value.strip()}" if key in headers else value.strip()
        start = end + 4
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parsed = _parse_chunked(self.buffer, start)
            if parsed is None:
                return None
            body, consumed = parsed
        else:
            length = int(headers.get("content-length", "0") or 0)
            if len(self.buffer) < start + length:
                return None
            body, consumed = bytes(self.buffer[start:start + length]), start + length
        del self.buffer[:consumed]
        return _Request(method, target, headers, body)

    def _bad_request(self) -> None:
        if self.transport is not None:
            self.transport.write(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            self.transport.close()

    async def _serve(self, request: _Request) -> None:
        keep_alive = request.headers.get("connection", "").lower() != "close"
        try:
            await self.fake._handle(self, request)
        except _Disconnected:
            keep_alive = False
        except Exception as e:  # a bug in the fake must not hang the client; tests read fake.errors
            self.fake.errors.append(e)
            if not self.closed and self.transport is not None:
                self.write_response(500, b"Internal Server Error", "text/plain; charset=utf-8")
            keep_alive = False
        finally:
            if self.current is not None and self.current.finished_at is None and not self.closed:
                with self.fake._cond:
                    self.current.finished_at = time.monotonic()
                    self.fake._cond.notify_all()
            self.current = None
            self.busy = False
        if not keep_alive or self.closed:
            self.close()
        elif self.buffer:
            self._try_dispatch()

    # writing
    def _head(self, status: int, headers: list[tuple[str, str]]) -> bytes:
        phrase = HTTPStatus(status).phrase if status in HTTPStatus._value2member_map_ else ""
        lines = [f"HTTP/1.1 {status} {phrase}", f"date: {formatdate(usegmt=True)}", "server: uvicorn"]
        lines += [f"{k}: {v}" for k, v in headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def write_response(self, status: int, body: bytes, content_type: str | None,
                       extra: dict[str, str] | None = None) -> None:
        headers = [("content-length", str(len(body)))]
        if content_type:
            headers.append(("content-type", content_type))
        headers.append(("vary", "Origin"))
        headers += list((extra or {}).items())
        self.write(self._head(status, headers) + body)

    def start_stream(self, status: int, content_type: str) -> None:
        self.write(self._head(status, [("content-type", content_type), ("vary", "Origin"),
                                       ("transfer-encoding", "chunked")]))

    def write_chunk(self, data: bytes) -> None:
        self.write(b"%x\r\n%s\r\n" % (len(data), data))

    def end_stream(self) -> None:
        self.write(b"0\r\n\r\n")

    def write(self, data: bytes) -> None:
        if self.closed or self.transport is None:
            raise _Disconnected()
        self.transport.write(data)

    async def drain(self) -> None:
        if not self._writable.is_set():
            await self._writable.wait()
        if self.closed:
            raise _Disconnected()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()
        self._lost()

    def reset(self) -> None:
        """Close with a TCP RST (SO_LINGER 0), as a crashed server or proxy would."""
        if self.transport is not None:
            sock = self.transport.get_extra_info("socket")
            if sock is not None:
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except OSError:
                    pass
            self.transport.abort()
        self._lost()


def _parse_chunked(buffer: bytearray, start: int) -> tuple[bytes, int] | None:
    body = bytearray()
    pos = start
    while True:
        eol = buffer.find(b"\r\n", pos)
        if eol < 0:
            return None
        size = int(bytes(buffer[pos:eol]).split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            end = buffer.find(b"\r\n", pos)
            if end < 0:
                return None
            return bytes(body), end + 2
        if len(buffer) < pos + size + 2:
            return None
        body += buffer[pos:pos + size]
        pos += size + 2


# --------------------------------------------------------------------------- #
# The server
# --------------------------------------------------------------------------- #

_JSON = "application/json"
_SSE = "text/event-stream; charset=utf-8"
_NOT_FOUND = _dumps({"detail": "Not Found"})
_METHOD_NOT_ALLOWED = _dumps({"detail": "Method Not Allowed"})
POOLING_ROUTES = ("/v1/embeddings", "/pooling", "/score", "/v1/score", "/rerank", "/v1/rerank")
_ROUTES = {
    "/v1/models": "GET", "/health": "GET", "/ping": "GET", "/version": "GET", "/metrics": "GET",
    "/tokenize": "POST", "/detokenize": "POST", "/v1/chat/completions": "POST",
    "/v1/completions": "POST", "/v1/chat/completions/render": "POST", "/v1/completions/render": "POST",
    "/v1/responses": "POST", "/v1/messages": "POST", "/v1/messages/count_tokens": "POST",
    **{route: "POST" for route in POOLING_ROUTES},
}
# What a stream of each surface carries when the engine fails in the middle of it (the `sse_error`
# fault): chat and completions send `data: {"error": ...}` and [DONE] (None: that, with the fault's
# body); the others as captured in tests/data/vllm032_surfaces/x0*_engine_killed.json.
STREAM_FAILURE: dict[str, bytes | None] = {
    "chat": None, "completions": None,
    # x02: the Responses generator raises on the error and the connection closes without the last chunk
    "responses": b"",
    # x03: the Messages converter fails to parse chat's error event as a chunk and says so
    "messages": b'event: error\ndata: {"type":"error","error":{"type":"internal_error","message":"2 validation '
                b"errors for ChatCompletionStreamResponse\\nmodel\\n  Field required [type=missing, input_value="
                b"{'error': {'message': 'En...am': None, 'code': 500}}, input_type=dict]\\n    For further "
                b"information visit https://errors.pydantic.dev/2.14/v/missing\\nchoices\\n  Field required "
                b"[type=missing, input_value={'error': {'message': 'En...am': None, 'code': 500}}, input_type=dict]"
                b'\\n    For further information visit https://errors.pydantic.dev/2.14/v/missing"}}\n\n',
}


class FakeVLLM:
    """A fake vLLM OpenAI server on 127.0.0.1 (see the module docstring).

    Use `with FakeVLLM() as fake:` (server in a background thread, for sync
    tests) or `async with FakeVLLM() as fake:` (server in the running loop).
    `fake.base_url` is "http://127.0.0.1:PORT"; `fake.requests` records every
    request.  Knobs a test may flip while it runs: `fail_next` (list of
    `FaultSpec`, consumed in order), `ready`, `engine_dead`, `tokens_per_second`,
    `metrics_text` (the body of GET /metrics, Prometheus text; None: 404).

    `ready = False` emulates a vLLM that is not up yet: vLLM 0.32 opens its port
    only once the engine is loaded, so before that a client gets "connection
    refused" (not a 503).  The fake closes its listening socket (and drops idle
    keep-alive connections); `ready = True` listens again on the same port.
    `engine_dead = True` emulates a dead EngineCore (capture
    x_engine_dead_head_dim16.txt): /health answers 503 and generation 500 with
    "EngineCore encountered an issue...".

    Parameters beyond the obvious ones:
      count_prompt(endpoint, body) -> prompt tokens, endpoint "chat" or
        "completions".  Chat calls it with the request body (also for /tokenize
        with `messages`); completions once per text prompt, with the body whose
        `prompt` is that one string.  Token-id prompts are counted as their length.
        Default: `crude_count_prompt`.
      count_chars(endpoint, body) -> characters for the character pre-check
        (default `chatml_char_count`, the ChatML rendering length).
      extra_models: more /v1/models cards, merged over {"parent": model}; a card
        without "max_model_len" is dumped with null (as vLLM dumps a LoRA card)
        and uses the base model's limit.
      tokens_per_second: None answers at once; otherwise a stream waits 1/rate
        before each decoding step and a plain answer waits max_tokens/rate, both
        cut short when the client goes away (generation stops, as vLLM aborts).
      enable_auto_tool_choice: False answers requests with `tools` and an
        auto tool choice with vLLM's 400 (a server launched without a parser).
      vocab_size: token ids at or above it are "out of vocabulary" (c26).
      detokenize(ids) -> text for /detokenize (default: the completion token per id).
      record: False keeps `requests` empty (long benchmarks).
      card: fields shown in the main /v1/models card instead (the fake still enforces max_model_len).
      script(surface, body) -> Reply: chat, Responses and Messages answer this reply (text, tool
        calls; cut at the limit) instead of the run of `completion_text_token`, so an agent's loop
        goes on (tests/support/agent_replies.py).

    `stream_end_gate` (a threading.Event, None by default) holds every stream's end: its events
    are sent, the body's end only once the gate is set (or the client leaves). vLLM 0.32 leaves
    such a gap by itself, milliseconds long (9 ms between `response.completed` and the end of
    the body, measured on a first request), which a client that closes on its last event meets.
    """

    def __init__(self, *, model: str = "tiny-qwen", max_model_len: int = 2048,
                 root: str = "/models/tiny-qwen", count_prompt: CountPrompt | None = None,
                 mode: str = "v0.32", extra_models: list[dict] | None = None,
                 tokens_per_second: float | None = None, completion_text_token: str = " TObject",
                 count_chars: CountChars | None = None, vocab_size: int = QWEN3_VOCAB_SIZE,
                 enable_auto_tool_choice: bool = True,
                 detokenize: Callable[[list[int]], str] | None = None, record: bool = True,
                 card: dict[str, Any] | None = None, script: agent_replies.Script | None = None) -> None:
        self.model = model
        self.script = script
        self.max_model_len = max_model_len
        self.root = root
        self.mode = mode
        self.tokens_per_second = tokens_per_second
        self.completion_text_token = completion_text_token
        self.detokenize = detokenize
        self.metrics_text: str | None = None
        self.stream_end_gate: threading.Event | None = None
        self.record = record
        self.cards: list[dict] = [{"id": model, "root": root, "parent": None, "max_model_len": max_model_len}]
        for extra in extra_models or []:
            self.cards.append({"parent": model, **extra})
        limits = {c["id"]: (c.get("max_model_len") or max_model_len) for c in self.cards}
        self.cards[0].update(card or {})        # what the main card says (e.g. a broken max_model_len)
        self.validator = Validator(models=limits, default_model=model, mode=mode,
                                   count_prompt=count_prompt or crude_count_prompt,
                                   count_chars=count_chars or chatml_char_count, vocab_size=vocab_size,
                                   enable_auto_tool_choice=enable_auto_tool_choice)
        self.requests: list[RecordedRequest] = []
        self.stored_responses: set[str] = set()   # ids previous_response_id may name (vLLM's store)
        # The first bytes of each request a client left unfinished (the connection closed mid-request).
        self.partial_requests: list[bytes] = []
        self.errors: list[BaseException] = []     # exceptions inside the fake (a test may assert none)
        self.fail_next: list[FaultSpec] = []
        self.engine_dead = False
        self.port: int | None = None
        self._ready = True
        self._cond = threading.Condition()
        self._connections: set[_Connection] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None

    # -- lifecycle ---------------------------------------------------------- #

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("FakeVLLM is not started")
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> FakeVLLM:
        """Listen on a free loopback port in the running event loop."""
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        await self._listen(self._bind(0))
        return self

    async def stop(self) -> None:
        if self._stopping is not None:
            self._stopping.set()
        if self._server is not None:
            self._server.close()
            self._server = None
        for conn in list(self._connections):
            conn.close()
        with self._cond:
            self._cond.notify_all()

    async def __aenter__(self) -> FakeVLLM:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def __enter__(self) -> FakeVLLM:
        started = threading.Event()
        failure: list[BaseException] = []

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self.start())
            except BaseException as e:  # surface bind errors to the caller
                failure.append(e)
                started.set()
                return
            started.set()
            loop.run_until_complete(self._stopping.wait())  # type: ignore[union-attr]
            pending = [t for t in asyncio.all_tasks(loop)]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.close()

        self._thread = threading.Thread(target=run, name="fakevllm", daemon=True)
        self._thread.start()
        started.wait()
        if failure:
            raise failure[0]
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._thread is not None
        asyncio.run_coroutine_threadsafe(self.stop(), self._loop).result(timeout=10)
        self._thread.join(timeout=10)

    def _bind(self, port: int) -> socket.socket:
        # IPPROTO_TCP named, as getaddrinfo names it for uvicorn (vLLM's server): asyncio sets
        # TCP_NODELAY only on such sockets. Without it a response written in two parts waits
        # out the client's delayed ACK (~40 ms on Linux) before its second part is sent.
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(512)
        sock.setblocking(False)
        self.port = sock.getsockname()[1]
        return sock

    async def _listen(self, sock: socket.socket) -> None:
        assert self._loop is not None
        self._server = await self._loop.create_server(lambda: _Connection(self), sock=sock)

    def receiving(self) -> list[bytes]:
        """The first bytes of each request being received and not yet complete."""
        return [bytes(c.buffer[:200]) for c in list(self._connections) if c.buffer and not c.busy]

    @property
    def ready(self) -> bool:
        return self._ready

    @ready.setter
    def ready(self, value: bool) -> None:
        if value == self._ready:
            return
        self._ready = value
        if self._loop is None:
            return

        def apply() -> None:
            if not value:
                if self._server is not None:
                    self._server.close()
                    self._server = None
                for conn in list(self._connections):
                    if not conn.busy:
                        conn.close()
            else:
                # bind + listen now (connections queue in the backlog), serve once the task runs
                sock = self._bind(self.port or 0)
                self._loop.create_task(self._listen(sock))  # type: ignore[union-attr]

        if self._in_loop_thread():
            apply()
        else:
            done = threading.Event()
            self._loop.call_soon_threadsafe(lambda: (apply(), done.set()))
            done.wait(timeout=10)

    def _in_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self._loop
        except RuntimeError:
            return self._thread is None

    # -- waiting without sleeping ------------------------------------------ #

    def wait_until(self, predicate: Callable[[FakeVLLM], bool], timeout: float = 10.0) -> bool:
        """Block until `predicate(fake)` holds (re-checked on every request event)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cond.wait(remaining)
            return True

    async def wait_until_async(self, predicate: Callable[[FakeVLLM], bool], timeout: float = 10.0) -> bool:
        return await asyncio.to_thread(self.wait_until, predicate, timeout)

    # -- request handling --------------------------------------------------- #

    def _take_fault(self, path: str) -> FaultSpec | None:
        with self._cond:
            for i, spec in enumerate(self.fail_next):
                if spec.path is None or spec.path == path:
                    return self.fail_next.pop(i)
        return None

    async def _handle(self, conn: _Connection, request: _Request) -> None:
        if request.headers.get("expect", "").lower() == "100-continue":
            # uvicorn, which serves vLLM's API, answers this before the app reads the body.
            conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        split = urlsplit(request.target)
        path = split.path
        parsed: Any = None
        if request.body:
            try:
                parsed = json.loads(request.body)
            except (ValueError, UnicodeDecodeError):
                parsed = None
        record = RecordedRequest(method=request.method, path=path, query=split.query,
                                 headers=request.headers, body=request.body, json=parsed,
                                 received_at=time.monotonic())
        conn.current = record
        if self.record:
            conn.all.append(record)
        if self.record:
            with self._cond:
                self.requests.append(record)
                self._cond.notify_all()

        fault = self._take_fault(path)
        record.fault = fault
        if fault is not None:
            if fault.gate is not None:
                await asyncio.to_thread(fault.gate.wait)
            if fault.delay:
                await asyncio.sleep(fault.delay)
            if await self._pre_header_fault(conn, record, fault, parsed):
                return

        allowed = _ROUTES.get(path)
        if allowed is None and path != "/":
            # Starlette's redirect_slashes (vLLM 0.32 keeps FastAPI's default): a path that
            # matches a route once its trailing slashes are off (or one is added) gets a 307,
            # whatever the method, to a URL built from the request's Host header.
            other = path.rstrip("/") if path.endswith("/") else path + "/"
            if other in _ROUTES:
                target = f"http://{request.headers.get('host', '')}{other}" + (f"?{split.query}" if split.query else "")
                return self._send(conn, record, 307, b"", None, {"location": target})
        if allowed is None:
            return self._send(conn, record, 404, _NOT_FOUND, _JSON)
        if request.method != allowed:
            return self._send(conn, record, 405, _METHOD_NOT_ALLOWED, _JSON, {"allow": allowed})
        try:
            await self._route(conn, record, path, request.body, fault)
        except AnthropicVLLMError as e:
            self._send(conn, record, e.error.status, _dumps(anthropic_error(e.error)), _JSON)
        except VLLMError as e:
            self._send(conn, record, e.status, _dumps(e.body()), _JSON)

    async def _pre_header_fault(self, conn: _Connection, record: RecordedRequest, fault: FaultSpec,
                                parsed: Any) -> bool:
        """Apply a fault that replaces the whole answer; False when the real answer should follow."""
        if fault.kind == "respond" and fault.cut_at is not None:
            body = fault.body_bytes()
            record.status = fault.status
            headers = [("content-length", str(len(body))), ("content-type", fault.content_type)]
            conn.write(conn._head(fault.status, headers) + body[: fault.cut_at])
            await conn.drain()
            conn.close()
            raise _Disconnected()
        if fault.kind == "respond" and fault.trickle:
            body = fault.body_bytes()
            record.status = fault.status
            headers = [("content-length", str(len(body))), ("content-type", fault.content_type),
                       *fault.headers.items()]
            conn.write(conn._head(fault.status, headers) + body[: len(body) // 2])
            await asyncio.sleep(fault.trickle)
            conn.write(body[len(body) // 2:])
            with self._cond:
                record.finished_at = time.monotonic()
                self._cond.notify_all()
            return True
        if fault.kind == "respond":
            self._send(conn, record, fault.status, fault.body_bytes(), fault.content_type, fault.headers)
            return True
        if fault.kind == "close":
            conn.close()
            return True
        if fault.kind == "reset":
            conn.reset()
            return True
        if fault.kind == "stall":
            streaming = isinstance(parsed, dict) and parsed.get("stream") is True
            record.status = 200
            if streaming:
                conn.start_stream(200, _SSE)
            else:
                conn.write(conn._head(200, [("content-type", _JSON), ("vary", "Origin"),
                                            ("transfer-encoding", "chunked")]))
            await self._wait_gone(conn)
            return True
        if fault.kind == "huge":
            await self._huge(conn, record, fault.size)
            return True
        if fault.kind == "long_line":
            await self._long_line(conn, record, fault.size)
            return True
        if fault.kind in ("close_mid_body", "reset_mid_body", "sse_error"):
            return False
        raise ValueError(f"unknown fault kind {fault.kind!r}")

    async def _huge(self, conn: _Connection, record: RecordedRequest, size: int) -> None:
        head = b'{"id":"chatcmpl-huge","object":"chat.completion","created":1,"model":"%s","choices":[' \
               b'{"index":0,"message":{"role":"assistant","content":"' % self.model.encode()
        tail = (b'"},"logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":9,'
                b'"total_tokens":2009,"completion_tokens":2000}}')
        record.status = 200
        conn.write(conn._head(200, [("content-length", str(len(head) + size + len(tail))),
                                    ("content-type", _JSON)]) + head)
        piece = b"lorem ip" * (1 << 17)              # 1 MiB
        left = size
        while left > 0:
            conn.write(piece[:left])
            left -= len(piece)
            await conn.drain()
        conn.write(tail)
        with self._cond:
            record.finished_at = time.monotonic()
            self._cond.notify_all()

    async def _long_line(self, conn: _Connection, record: RecordedRequest, size: int) -> None:
        """A chat stream whose one content event is `size` bytes on one line (written a MiB at a
        time), then the usage chunk and [DONE]."""
        record.status = 200
        conn.start_stream(200, _SSE)
        conn.write_chunk(b'data: {"id":"chatcmpl-long","object":"chat.completion.chunk","created":1,"model":"%s",'
                         b'"choices":[{"index":0,"delta":{"content":"' % self.model.encode())
        piece = b"lorem ip" * (1 << 17)
        left = size
        while left > 0:
            conn.write_chunk(piece[:left])
            left -= len(piece)
            await conn.drain()
        conn.write_chunk(b'"},"finish_reason":"length"}]}\n\n'
                         b'data: {"id":"chatcmpl-long","object":"chat.completion.chunk","created":1,"model":"%s",'
                         b'"choices":[],"usage":{"prompt_tokens":9,"total_tokens":10,"completion_tokens":1}}\n\n'
                         b'data: [DONE]\n\n' % self.model.encode())
        conn.end_stream()
        with self._cond:
            record.finished_at = time.monotonic()
            self._cond.notify_all()

    async def _wait_gone(self, conn: _Connection) -> None:
        assert self._stopping is not None
        gone = asyncio.ensure_future(conn.closed_event.wait())
        stop = asyncio.ensure_future(self._stopping.wait())
        await asyncio.wait({gone, stop}, return_when=asyncio.FIRST_COMPLETED)
        for f in (gone, stop):
            f.cancel()
        raise _Disconnected()

    async def _hold(self, conn: _Connection, gate: threading.Event) -> None:
        """Until `gate` is set; the client leaving first is a disconnect."""
        await conn.drain()
        opened = asyncio.ensure_future(asyncio.to_thread(gate.wait))
        gone = asyncio.ensure_future(conn.closed_event.wait())
        await asyncio.wait({opened, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not opened.done():
            raise _Disconnected()

    def _send(self, conn: _Connection, record: RecordedRequest, status: int, body: bytes,
              content_type: str | None, extra: dict[str, str] | None = None) -> None:
        record.status = status
        conn.write_response(status, body, content_type, extra)
        with self._cond:
            record.finished_at = time.monotonic()
            self._cond.notify_all()

    async def _route(self, conn: _Connection, record: RecordedRequest, path: str, raw: bytes,
                     fault: FaultSpec | None) -> None:
        if path == "/health":
            return self._send(conn, record, 503 if self.engine_dead else 200, b"", None)
        if path == "/ping":
            return self._send(conn, record, 200, b"", None)
        if path == "/metrics":
            if self.metrics_text is None:
                return self._send(conn, record, 404, _NOT_FOUND, _JSON)
            return self._send(conn, record, 200, self.metrics_text.encode(), "text/plain; version=0.0.4; charset=utf-8")
        if path == "/version":
            return self._send(conn, record, 200, _dumps({"version": VLLM_VERSION}), _JSON)
        if path == "/v1/models":
            created = int(time.time())
            body = {"object": "list", "data": [model_card(c, created) for c in self.cards]}
            return self._send(conn, record, 200, _dumps(body), _JSON)
        if path.endswith("/render"):
            # b_render_chat: scale-out endpoints are off in a plain `vllm serve`
            raise VLLMError(403, "Scale-out endpoints are disabled. Restart vllm serve with "
                                 "--enable-scale-out to enable them.", type="PermissionDeniedError")
        body = parse_json_body(raw)
        if path == "/tokenize":
            return self._send(conn, record, 200, self._tokenize(body), _JSON)
        if path == "/detokenize":
            return self._send(conn, record, 200, self._detokenize(body), _JSON)
        if path in POOLING_ROUTES:
            model, counts = self.validator.pooling_inputs(path, body)
            record.prompt_tokens = sum(counts)
            answer = pooling_body(path, model, counts, body, _request_id(), int(time.time()))
            return self._send(conn, record, 200, _dumps(answer), _JSON)
        if path == "/v1/messages/count_tokens":
            try:
                count = self.validator.count_tokens(body)
            except VLLMError as e:
                raise AnthropicVLLMError(e) from None
            record.prompt_tokens = count
            answer = {"input_tokens": count, "context_management": {"original_input_tokens": count}}
            return self._send(conn, record, 200, _dumps(answer), _JSON)
        surface = {"/v1/chat/completions": "chat", "/v1/completions": "completions", "/v1/responses": "responses",
                   "/v1/messages": "messages"}[path]
        try:
            if surface == "responses":
                plan = self.validator.responses(body, self.stored_responses)
                stop = body.get("stop")
                stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []
                if any(isinstance(x, str) and x and x in self.completion_text_token for x in stops):
                    plan = replace(plan, max_tokens=1, per_prompt_max=[1], stopped=True)
            elif surface == "messages":
                plan = self.validator.messages(body)
            else:
                plan = self.validator.chat(body) if surface == "chat" else self.validator.completions(body)
            if self.engine_dead:
                raise VLLMError(500, ENGINE_DEAD_MESSAGE, type="InternalServerError")
        except VLLMError as e:
            if surface == "messages" and e.type != "Bad Request":   # pydantic's answer is OpenAI-shaped (m06)
                raise AnthropicVLLMError(e) from None
            raise
        record.prompt_tokens = plan.prompt_tokens
        record.max_tokens = plan.max_tokens
        if plan.stream:
            await self._stream(conn, record, plan, surface, body, fault)
        else:
            await self._complete(conn, record, plan, surface, body, fault)

    @staticmethod
    def _flush(conn: _Connection, pending: list[bytes]) -> None:
        if pending:
            conn.write(b"".join(pending))
            pending.clear()

    def _tokenize(self, body: dict) -> bytes:
        _, mml = self.validator.resolve_model(body)
        endpoint = "chat" if "messages" in body else "completions"
        if endpoint == "completions" and body.get("prompt") is None:
            raise _pydantic_error([_err("missing", "body.prompt", "Field required", body)])
        count = self.validator.count_prompt(endpoint, body)
        tokens = [(9707 + i) % QWEN3_VOCAB_SIZE for i in range(count)]
        token_strs = ["Ġtok"] * count if body.get("return_token_strs") else None
        return _dumps({"count": count, "max_model_len": mml,
                       "tokens": tokens, "token_strs": token_strs})

    def _detokenize(self, body: dict) -> bytes:
        self.validator.resolve_model(body)
        ids = [t for t in body.get("tokens") or [] if isinstance(t, int) and 0 <= t < self.validator.vocab_size]
        text = self.detokenize(ids) if self.detokenize else self.completion_text_token * len(ids)
        return _dumps({"prompt": text})

    async def _pace(self, conn: _Connection, tokens: int) -> None:
        """Wait as long as generating `tokens` tokens takes at `tokens_per_second`; stop on disconnect."""
        rate = self.tokens_per_second
        if not rate or tokens <= 0:
            return
        try:
            await asyncio.wait_for(conn.closed_event.wait(), tokens / rate)
        except TimeoutError:
            return
        raise _Disconnected()

    def _whole_body(self, plan: Plan, surface: str, request: dict, rid: str, created: int) -> dict:
        token = self.completion_text_token
        if self.script is not None and surface in _SCRIPTED:
            reply = self.script(surface, request)
            if surface == "messages":
                return agent_replies.messages_body(plan.model, plan.prompt_tokens, plan.max_tokens, reply, rid)
            build = agent_replies.chat_body if surface == "chat" else agent_replies.responses_body
            return build(plan.model, plan.prompt_tokens, plan.max_tokens, reply, rid, created)
        if surface == "responses":
            return responses_body(plan, request, rid, created, token)
        if surface == "messages":
            return messages_body(plan, rid, token)
        build = chat_completion_body if surface == "chat" else completion_body
        return build(plan, rid, created, token)

    def _events(self, plan: Plan, surface: str, request: dict, rid: str,
                created: int) -> Iterable[tuple[str, bytes]]:
        token = self.completion_text_token
        if self.script is not None and surface in _SCRIPTED:
            reply = self.script(surface, request)
            args = (plan.model, plan.prompt_tokens, plan.max_tokens, reply, rid)
            if surface == "messages":
                return agent_replies.messages_events(*args)
            if surface == "chat":
                return agent_replies.chat_events(*args, created, plan.include_usage)
            return agent_replies.responses_events(*args, created)
        if surface == "responses":
            return responses_stream_events(plan, request, rid, created, token)
        if surface == "messages":
            return messages_stream_events(plan, rid, token)
        return stream_events(plan, surface == "chat", rid, created, token)

    async def _complete(self, conn: _Connection, record: RecordedRequest, plan: Plan, surface: str,
                        request: dict, fault: FaultSpec | None) -> None:
        await self._pace(conn, max(plan.per_prompt_max))
        rid, created = _request_id(), int(time.time())
        body = _dumps(self._whole_body(plan, surface, request, rid, created))
        record.completion_tokens = sum(plan.per_prompt_max) * plan.n
        if fault is not None and fault.kind in ("close_mid_body", "reset_mid_body"):
            record.status = 200
            head = conn._head(200, [("content-length", str(len(body))), ("content-type", _JSON),
                                    ("vary", "Origin")])
            conn.write(head + body[: len(body) // 2])
            conn.reset() if fault.kind == "reset_mid_body" else conn.close()
            raise _Disconnected()
        self._send(conn, record, 200, body, _JSON)

    async def _stream(self, conn: _Connection, record: RecordedRequest, plan: Plan, surface: str,
                      request: dict, fault: FaultSpec | None) -> None:
        rid, created = _request_id(), int(time.time())
        record.status = 200
        record.completion_tokens = 0
        conn.start_stream(200, _SSE)
        cut = fault.after_chunks if fault is not None else -1
        paced = bool(self.tokens_per_second)
        pending: list[bytes] = []       # unpaced events go out in one write (one HTTP chunk each)
        for sent, (kind, event) in enumerate(self._events(plan, surface, request, rid, created)):
            if sent == cut:
                assert fault is not None
                self._flush(conn, pending)
                if fault.kind == "sse_error":
                    failure = STREAM_FAILURE.get(surface)
                    if failure is None:
                        conn.write_chunk(b"data: " + fault.body_bytes() + b"\n\n" + SSE_DONE)
                    elif failure:
                        conn.write_chunk(failure)
                    if failure is None or failure:
                        conn.end_stream()
                        break
                    # vLLM's Responses stream breaks off: the connection closes mid-body
                    conn.close()
                    raise _Disconnected()
                conn.reset() if fault.kind == "reset_mid_body" else conn.close()
                raise _Disconnected()
            if kind == "step" and paced:
                self._flush(conn, pending)
                await conn.drain()
                await self._pace(conn, 1)
            pending.append(b"%x\r\n%s\r\n" % (len(event), event))
            if kind != "meta":
                record.completion_tokens += 1
            if len(pending) >= 64:
                self._flush(conn, pending)
                await conn.drain()
        else:
            if self.stream_end_gate is not None:
                self._flush(conn, pending)
                await self._hold(conn, self.stream_end_gate)
            pending.append(b"0\r\n\r\n")
            self._flush(conn, pending)
        with self._cond:
            record.finished_at = time.monotonic()
            self._cond.notify_all()
