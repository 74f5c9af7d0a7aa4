"""Every error brimful sends or records, in one place.

`ErrorCode` is the whole vocabulary: every code brimful answers with, maps an
upstream failure to, or writes into a length record and a metric label is one
of its members, so the list of failures reads on one screen (as TGI's
`ValidationError` does).  Each failure is a `BrimfulError` built by one of the
constructors below (admission's own decisions, transport faults) or by
`proxy.upstream.explain` (an upstream's answer, explained).

The error carries data only: status, message, code, param and the numbers
behind the message.  Each API surface renders it in the envelope its clients
expect (`proxy.admitted.surfaces`); `openai_body` is OpenAI's envelope,
`{"error": {"message", "type", "param", "code"}}`, which the official `openai`
client turns into its usual exception class (it picks the class from the HTTP
status and reads `error.message`).  brimful adds a `brimful` object beside
those four keys with the numbers behind the message (and, for an upstream
error, the upstream's original message), for programs that want more than
prose.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class ErrorCode(StrEnum):
    """Every error code brimful emits or records."""

    # the request itself (4xx)
    INVALID_JSON = "invalid_json"                          # body is not JSON / not UTF-8 / nested too deeply
    INVALID_REQUEST_BODY = "invalid_request_body"          # JSON, but not an object
    REQUEST_TOO_LARGE = "request_too_large"                # over server.max_body_bytes (413)
    INVALID_VALUE = "invalid_value"                        # a field brimful reads has a bad type or value
    INVALID_PROMPT = "invalid_prompt"                      # cannot be rendered or tokenized (vLLM refuses it too)
    INVALID_MEDIA = "invalid_media"                        # a media part (image, audio, video) that cannot be counted
    INVALID_API_KEY = "invalid_api_key"                    # 401
    MODEL_NOT_FOUND = "model_not_found"                    # 404, worded as vLLM words it
    NOT_FOUND = "not_found"                                # 404: a path this listener does not serve
    CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"    # brimful's or the upstream's length refusal
    # the connection (answered by proxy.serving.server, before any app code runs)
    INVALID_HTTP_REQUEST = "invalid_http_request"          # 400: not parseable HTTP/1.1
    REQUEST_TIMEOUT = "request_timeout"                    # 408: head or body too slow
    REQUEST_HEADER_TOO_LARGE = "request_header_too_large"  # 431: over server.max_header_bytes
    TOO_MANY_CONNECTIONS = "too_many_connections"          # 503: server.max_connections, none idle
    # the upstream (5xx), and what an upstream's answer was mapped to
    UPSTREAM_NOT_READY = "upstream_not_ready"              # 503: loading, or no /v1/models yet
    UPSTREAM_ENGINE_DEAD = "upstream_engine_dead"          # 503: vLLM's EngineDeadError
    UPSTREAM_BUSY = "upstream_busy"                        # 503: back-pressure gate full
    COUNTING_BUSY = "counting_busy"                        # 503: tokenizers.count_memory_bytes in use
    UPSTREAM_UNREACHABLE = "upstream_unreachable"          # 502: connection refused
    UPSTREAM_CONNECTION_ERROR = "upstream_connection_error"  # 502: broke mid-exchange
    UPSTREAM_TIMEOUT = "upstream_timeout"                  # 504
    UPSTREAM_KV_CACHE = "upstream_kv_cache"                # 502: KV cache cannot hold max_model_len
    UPSTREAM_BAD_REQUEST = "upstream_bad_request"          # the upstream's own 4xx, relayed with its words
    UPSTREAM_NOT_FOUND = "upstream_not_found"              # 404 for a route
    UPSTREAM_ERROR = "upstream_error"                      # any other upstream fault or unreadable answer
    UPSTREAM_STREAM_ERROR = "upstream_stream_error"        # an error event inside a started stream
    UPSTREAM_INVALID_RESPONSE = "upstream_invalid_response"  # 502: a success whose body is not whole JSON
    UPSTREAM_INVALID_OUTPUT = "upstream_invalid_output"    # the upstream could not convert what it generated
    # brimful itself
    SERVER_SHUTTING_DOWN = "server_shutting_down"          # SIGTERM drain deadline passed
    INTERNAL_ERROR = "internal_error"                      # a bug in brimful
    # recorded only (never sent: nobody is left to receive it)
    CLIENT_DISCONNECTED = "client_disconnected"


# OpenAI's `type` values by HTTP status (what api.openai.com sends).
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "timeout_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    431: "invalid_request_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}

# Anthropic's error `type` values by HTTP status (docs.anthropic.com, "Errors").
_ANTHROPIC_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
    529: "overloaded_error",
}


@dataclass
class BrimfulError(Exception):
    """An error answer: status, code, message, the field at fault and the numbers behind it.

    `wire_code` and `type` override what the envelope shows, for the answers
    that copy vLLM's own (an unknown model is `"code": 404` there).
    """

    status: int
    message: str
    code: ErrorCode
    param: str | None = None
    type: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)
    wire_code: str | int | None = None
    # A length refusal's figures in the words Anthropic's clients match (`anthropic_lead`):
    # (prompt tokens, the longest prompt that fits), or (prompt, max_tokens, context).
    too_long: tuple[int, int] | None = None
    exceeds: tuple[int, int, int] | None = None

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.type is None:
            self.type = _TYPE_BY_STATUS.get(self.status, "invalid_request_error")

    @property
    def envelope_code(self) -> str | int:
        """The `code` clients see: the vocabulary's, unless the answer copies vLLM's own."""
        return self.wire_code if self.wire_code is not None else self.code.value

    def body(self) -> dict[str, Any]:
        """OpenAI's error envelope (plus brimful's numbers)."""
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.envelope_code,
        }
        if self.details:
            error["brimful"] = self.details
        return {"error": error}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode("utf-8")

    def response_headers(self, extra: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The answer's headers: JSON, vLLM's `vary: Origin` (its CORS middleware puts it on every
        answer, errors included: captures m03, c09), the error's own (Retry-After), then `extra`."""
        headers = [(b"content-type", b"application/json"), (b"vary", b"Origin")]
        headers += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        return headers + extra

    def sse_event(self) -> bytes:
        """The error as vLLM reports a failure after a stream started: an event, then [DONE]."""
        return b"data: " + self.body_bytes() + b"\n\ndata: [DONE]\n\n"

    # -- Anthropic's envelope (/v1/messages) ------------------------------------

    def anthropic_body(self) -> dict[str, Any]:
        """Anthropic's error envelope, `{"type": "error", "error": {"type", "message"}}`, which the
        `anthropic` client turns into its usual exception class (chosen by the HTTP status);
        brimful's code, param and numbers ride in `error.brimful`."""
        lead = self.anthropic_lead()
        error: dict[str, Any] = {"type": _ANTHROPIC_TYPE_BY_STATUS.get(self.status, "api_error"),
                                 "message": f"{lead}. {self.message}" if lead else self.message}
        extra: dict[str, Any] = {"code": self.code.value}
        if self.param is not None:
            extra["param"] = self.param
        error["brimful"] = {**extra, **self.details}
        return {"type": "error", "error": error}

    def anthropic_lead(self) -> str:
        """Anthropic's own wording of a length refusal, which its clients match on: Claude Code
        compacts on `prompt is too long: N tokens > M maximum` (its pattern `prompt is too
        long[^0-9]*(\\d+)\\s*tokens?\\s*>\\s*(\\d+)`) and lowers max_tokens on `input length and
        `max_tokens` exceed context limit: X + Y > Z`; any other text is a generic API error to it."""
        if self.too_long is not None:
            return f"prompt is too long: {self.too_long[0]} tokens > {self.too_long[1]} maximum"
        if self.exceeds is not None:
            prompt, asked, context = self.exceeds
            return (f"input length and `max_tokens` exceed context limit: {prompt} + {asked} > {context}, "
                    "decrease input length or `max_tokens` and try again")
        return ""

    def anthropic_body_bytes(self) -> bytes:
        return json.dumps(self.anthropic_body(), ensure_ascii=False).encode("utf-8")

    def anthropic_event(self) -> bytes:
        """The error as Anthropic ends a stream that failed: `event: error` (no message_stop follows)."""
        return b"event: error\ndata: " + self.anthropic_body_bytes() + b"\n\n"

    # -- the Responses API's stream failure (/v1/responses) ---------------------

    def responses_event(self, sequence_number: int) -> bytes:
        """The Responses API's `error` event (`type`, `code`, `message`, `param`, `sequence_number`),
        with OpenAI's error object beside it: the `openai` client raises `APIError` with
        brimful's message on a stream event that carries `error`, and the Agents SDK ends the
        run on an `error` event."""
        event: dict[str, Any] = {"type": "error", "code": self.envelope_code, "message": self.message,
                                 "param": self.param, "sequence_number": sequence_number}
        event.update(self.body())
        data = json.dumps(event, ensure_ascii=False).encode("utf-8")
        return b"event: error\ndata: " + data + b"\n\n"


# ---------------------------------------------------------------------------
# Bad input (400 / 404 / 413 / 415)
# ---------------------------------------------------------------------------

def invalid_json(detail: str) -> BrimfulError:
    return BrimfulError(
        400,
        f"The request body is not valid JSON ({detail}). Send a JSON object such as "
        '{"model": "...", "messages": [{"role": "user", "content": "Hello"}]}.',
        code=ErrorCode.INVALID_JSON,
    )


def body_not_object(kind: str) -> BrimfulError:
    return BrimfulError(
        400,
        f"The request body must be a JSON object, got a JSON {kind}.",
        code=ErrorCode.INVALID_REQUEST_BODY,
    )


def body_too_large(size: int, limit: int) -> BrimfulError:
    return BrimfulError(
        413,
        f"The request body is {size} bytes, more than the {limit} bytes this brimful accepts "
        "(server.max_body_bytes in the configuration).",
        code=ErrorCode.REQUEST_TOO_LARGE,
        details={"body_bytes": size, "max_body_bytes": limit},
    )


def invalid_field(param: str, problem: str, value: Any = None) -> BrimfulError:
    """A field brimful reads has the wrong type or an impossible value."""
    shown = _short_repr(value)
    return BrimfulError(
        400,
        f"Invalid value for '{param}': {problem}" + (f" (got {shown})." if value is not None else "."),
        code=ErrorCode.INVALID_VALUE,
        param=param,
    )


def invalid_prompt(message: str, param: str = "messages") -> BrimfulError:
    """The prompt cannot be rendered or tokenized the way vLLM would (vLLM answers 400 too)."""
    return BrimfulError(400, message, code=ErrorCode.INVALID_PROMPT, param=param)


def model_not_found(model: str, available: list[str]) -> BrimfulError:
    """Same wording, status and fields as vLLM 0.32 (captures/a_model_unknown_chat.json)."""
    return BrimfulError(
        404,
        f"The model `{model}` does not exist. Valid aliases: {', '.join(available)}.",
        code=ErrorCode.MODEL_NOT_FOUND,
        param="model",
        type="NotFoundError",
        wire_code=404,
    )


def no_model_known(upstream: str | None) -> BrimfulError:
    return BrimfulError(
        503,
        f"brimful does not know which models {_the(upstream)} serves yet: its /v1/models "
        "has not answered. vLLM takes tens of seconds to minutes to load weights before it serves; "
        "retry shortly.",
        code=ErrorCode.UPSTREAM_NOT_READY,
        headers={"Retry-After": "5"},
    )


def malformed_request(detail: str) -> BrimfulError:
    return BrimfulError(
        400,
        f"The request is not valid HTTP/1.1 ({detail.rstrip('.')}); nothing was forwarded.",
        code=ErrorCode.INVALID_HTTP_REQUEST,
    )


def request_timeout(part: str, seconds: float) -> BrimfulError:
    """The client started a request and stopped sending it (server.header_timeout / body_timeout)."""
    key = "server.header_timeout" if part == "request head" else "server.body_timeout"
    return BrimfulError(
        408,
        f"The {part} did not arrive within {seconds:g} s ({key}); the connection is closed and nothing "
        "was forwarded.",
        code=ErrorCode.REQUEST_TIMEOUT,
        details={"timeout_s": seconds},
    )


def header_too_large(limit: int) -> BrimfulError:
    return BrimfulError(
        431,
        f"The request line and headers are larger than the {limit} bytes this brimful accepts "
        "(server.max_header_bytes); nothing was forwarded.",
        code=ErrorCode.REQUEST_HEADER_TOO_LARGE,
        details={"max_header_bytes": limit},
    )


def too_many_connections(limit: int) -> BrimfulError:
    return BrimfulError(
        503,
        f"brimful already holds {limit} client connections (server.max_connections), each with a request "
        "under way. Retry shortly.",
        code=ErrorCode.TOO_MANY_CONNECTIONS,
        details={"max_connections": limit},
        headers={"Retry-After": "1"},
    )


def not_here(path: str) -> BrimfulError:
    """A path this listener does not serve (server.metrics_port splits brimful's pages from the API)."""
    return BrimfulError(404, f"Nothing is served at {path} on this port.", code=ErrorCode.NOT_FOUND)


def unauthorized() -> BrimfulError:
    return BrimfulError(
        401,
        "Missing or invalid API key. Send 'Authorization: Bearer <key>' with one of the keys "
        "configured in brimful (auth.api_keys).",
        code=ErrorCode.INVALID_API_KEY,
    )


# ---------------------------------------------------------------------------
# Admission (brimful's own length decisions)
# ---------------------------------------------------------------------------

def tokens_to_remove(prompt_tokens: int, max_model_len: int, min_completion: int) -> int:
    """How much shorter a prompt must be for `min_completion` completion tokens to fit."""
    return max(0, prompt_tokens + min_completion - max_model_len)


def prompt_too_long(
    prompt_tokens: int, max_model_len: int, model: str, param: str, min_completion: int = 1
) -> BrimfulError:
    cut = tokens_to_remove(prompt_tokens, max_model_len, min_completion)
    return BrimfulError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt is "
        f"{prompt_tokens} tokens (counted with {model}'s own tokenizer and chat template), which "
        f"leaves no room for any output. Remove at least {cut} tokens from the prompt (or serve the "
        f"model with a larger --max-model-len).",
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        param=param,
        details={
            "prompt_tokens": prompt_tokens,
            "max_model_len": max_model_len,
            "tokens_to_remove": cut,
            **({"min_completion_tokens": min_completion} if min_completion > 1 else {}),
        },
        too_long=(prompt_tokens, max_model_len - min_completion),
    )


def not_enough_room(
    prompt_tokens: int, max_model_len: int, min_completion: int, model: str, param: str
) -> BrimfulError:
    """The room left is below the operator's `policy.min_completion_tokens`."""
    room = max_model_len - prompt_tokens
    cut = tokens_to_remove(prompt_tokens, max_model_len, min_completion)
    return BrimfulError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. Your prompt is "
        f"{prompt_tokens} tokens (counted with {model}'s own tokenizer and chat template), so only "
        f"{room} tokens are left for the completion, fewer than the minimum of {min_completion} this "
        f"deployment allows (policy.min_completion_tokens). Remove at least {cut} tokens from the prompt.",
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        param=param,
        details={
            "prompt_tokens": prompt_tokens,
            "max_model_len": max_model_len,
            "available_completion_tokens": room,
            "min_completion_tokens": min_completion,
            "tokens_to_remove": cut,
        },
        too_long=(prompt_tokens, max_model_len - min_completion),
    )


def inputs_too_long(
    too_long: list[tuple[int, int]], max_model_len: int, model: str, param: str
) -> BrimfulError:
    """A pooling request (embeddings, score, rerank, …) with inputs longer than max_model_len.

    `too_long` is (index, tokens) per offending input.  vLLM refuses the whole
    request ("at least N input tokens", without saying which input); brimful
    names each one.
    """
    index, tokens = too_long[0]
    others = len(too_long) - 1
    more = f" ({others} more input{'s are' if others != 1 else ' is'} too long as well)" if others else ""
    return BrimfulError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, input {index} of "
        f"'{param}' is {tokens} tokens (counted with {model}'s own tokenizer){more}. Shorten it by at least "
        f"{tokens - max_model_len} tokens, or send truncate_prompt_tokens to let vLLM cut every input to "
        f"{max_model_len} tokens.",
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        param=param,
        details={
            "max_model_len": max_model_len,
            "inputs": [{"index": i, "prompt_tokens": n, "tokens_to_remove": n - max_model_len}
                       for i, n in too_long],
        },
    )


def prompt_over_char_bound(chars: int, max_chars: int, max_model_len: int, param: str, *,
                           at_least: bool = False) -> BrimfulError:
    """vLLM 0.32's character pre-check, word for word (captures/c09d_chat_over_char_bound.json): refused
    before tokenizing, since more characters than that cannot fit whatever they encode to.  `at_least`:
    the prompt was measured only this far (a render stopped far past the bound)."""
    shown = f"at least {chars}" if at_least else str(chars)
    return BrimfulError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt contains {shown} "
        f"characters (more than {max_chars} characters, which is the upper bound for {max_model_len} input "
        f"tokens). Please reduce the length of the input prompt. (parameter=input_text, value={chars})",
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        param=param,
        details={"prompt_chars": chars, "max_prompt_chars": max_chars, "max_model_len": max_model_len,
                 "chars_to_remove": chars - max_chars},
    )


def completion_too_long(
    requested: int, field_name: str, prompt_tokens: int, max_model_len: int
) -> BrimfulError:
    """Policy `reject`: the client asked for more than fits and the operator chose not to clamp."""
    room = max_model_len - prompt_tokens
    return BrimfulError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. Your prompt is "
        f"{prompt_tokens} tokens and you requested {requested} completion tokens ({field_name}), "
        f"{prompt_tokens + requested} in total. At most {room} completion tokens fit: set {field_name} "
        f"to {room} or less.",
        code=ErrorCode.CONTEXT_LENGTH_EXCEEDED,
        param=field_name,
        details={
            "prompt_tokens": prompt_tokens,
            "max_model_len": max_model_len,
            "requested_max_tokens": requested,
            "available_completion_tokens": room,
        },
        exceeds=(prompt_tokens, requested, max_model_len),
    )


# ---------------------------------------------------------------------------
# Upstream unavailable (502 / 503 / 504)
# ---------------------------------------------------------------------------

def upstream_unreachable(upstream: str | None, detail: str) -> BrimfulError:
    return BrimfulError(
        502,
        f"brimful could not connect to {_the(upstream)} ({detail}). Is vLLM running and "
        "listening there? A vLLM that is still starting refuses connections until its API server is up.",
        code=ErrorCode.UPSTREAM_UNREACHABLE,
        details={**_where(upstream), "cause": detail},
    )


def upstream_broken(upstream: str | None, detail: str) -> BrimfulError:
    return BrimfulError(
        502,
        f"{_the_cap(upstream)} broke the connection ({detail}). It may have crashed or been "
        "restarted; check its logs.",
        code=ErrorCode.UPSTREAM_CONNECTION_ERROR,
        details={**_where(upstream), "cause": detail},
    )


def upstream_invalid_answer(upstream: str | None, status: int, size: int, what: str) -> BrimfulError:
    """The upstream said success, but its body is not the complete JSON answer (cut short, or garbage)."""
    return BrimfulError(
        502,
        f"{_the_cap(upstream)} answered HTTP {status} with {what} ({size} bytes) instead of a complete "
        "JSON answer. The request may have run upstream, but its answer is lost; retry it. The upstream may "
        "have crashed mid-answer; check its logs.",
        code=ErrorCode.UPSTREAM_INVALID_RESPONSE,
        details={**_where(upstream), "upstream_status": status, "body_bytes": size},
    )


def upstream_not_ready(upstream: str | None, status: int, detail: str) -> BrimfulError:
    return BrimfulError(
        503,
        f"{_the_cap(upstream)} is not ready (HTTP {status}: {detail}). vLLM answers 503 while it "
        "loads weights or after its engine died; loading takes tens of seconds to minutes. Retry shortly.",
        code=ErrorCode.UPSTREAM_NOT_READY,
        details={**_where(upstream), "upstream_status": status, "upstream_message": detail},
        headers={"Retry-After": "5"},
    )


def upstream_busy(upstream: str | None, limit: int, waited: float) -> BrimfulError:
    """Back-pressure (proxy.upstream.gate): every request slot to this upstream stayed taken."""
    return BrimfulError(
        503,
        f"{_the_cap(upstream)} already has {limit} requests in flight, the most brimful sends it "
        f"(upstream.max_concurrent_requests), and no slot freed within {waited:g} s "
        "(upstream.queue_timeout). Retry shortly; if vLLM has spare capacity, raise the limit.",
        code=ErrorCode.UPSTREAM_BUSY,
        details={**_where(upstream), "max_concurrent_requests": limit, "queue_timeout_s": waited},
        headers={"Retry-After": "1"},
    )


def counting_busy(limit: int, waited: float) -> BrimfulError:
    """Long prompts already fill the memory set aside for counting them (proxy.upstream.gate.CountingBudget)."""
    return BrimfulError(
        503,
        f"brimful is already counting as many long prompts as {limit >> 20} MiB of memory allows "
        f"(tokenizers.count_memory_bytes), and none finished within {waited:g} s (upstream.queue_timeout). "
        "Retry shortly.",
        code=ErrorCode.COUNTING_BUSY,
        details={"count_memory_bytes": limit, "queue_timeout_s": waited},
        headers={"Retry-After": "1"},
    )


def internal_error(request_id: str) -> BrimfulError:
    """A bug in brimful: still answered in the OpenAI shape, never a bare 500 page."""
    return BrimfulError(
        500,
        f"brimful hit an unexpected internal error and did not complete the request. This is a bug in "
        f"brimful, not in your request: please report it with the request id {request_id}.",
        code=ErrorCode.INTERNAL_ERROR,
    )


def shutting_down(deadline: float) -> BrimfulError:
    return BrimfulError(
        503,
        f"brimful is shutting down (SIGTERM) and this request was still running when the {deadline:g} s "
        "drain deadline passed (server.shutdown_timeout); its answer is missing or incomplete. Retry the "
        "request.",
        code=ErrorCode.SERVER_SHUTTING_DOWN,
        details={"shutdown_timeout_s": deadline},
        headers={"Retry-After": "1"},
    )


def discovery_timeout(upstream: str | None, path: str, seconds: float) -> BrimfulError:
    """Model discovery (GET /v1/models) got no answer in upstream.models_timeout: not a slow generation."""
    return BrimfulError(
        503,
        f"{_the_cap(upstream)} did not answer GET {path} within {seconds:g} s (upstream.models_timeout). brimful "
        "needs that list to know the served models and their max_model_len; the upstream may still be starting, "
        "or be overloaded or stuck. Retry shortly.",
        code=ErrorCode.UPSTREAM_NOT_READY,
        details={**_where(upstream), "phase": f"GET {path}", "timeout_s": seconds},
        headers={"Retry-After": "5"},
    )


def request_deadline(upstream: str | None, seconds: float) -> BrimfulError:
    """upstream.total_timeout: one request's whole time, however steadily the upstream was answering."""
    return BrimfulError(
        504,
        f"The request ran longer than the {seconds:g} s brimful allows one request (upstream.total_timeout), so "
        f"brimful closed it, which stops {_the(upstream)}'s work on it; the answer is incomplete. Request fewer "
        "tokens, or ask the operator to raise the limit.",
        code=ErrorCode.UPSTREAM_TIMEOUT,
        details={**_where(upstream), "phase": "the whole request", "timeout_s": seconds},
    )


def upstream_timeout(upstream: str | None, phase: str, seconds: float) -> BrimfulError:
    return BrimfulError(
        504,
        f"{_the_cap(upstream)} did not answer within {seconds:g} s ({phase}). A long generation can "
        "be legitimately slow: raise the timeout (brimful serve --upstream-timeout) or request fewer "
        "tokens; if every request times out, the server is overloaded or stuck.",
        code=ErrorCode.UPSTREAM_TIMEOUT,
        details={**_where(upstream), "phase": phase, "timeout_s": seconds},
    )


def _the(upstream: str | None) -> str:
    """How a client-facing message names the upstream: its URL only when the operator lets clients
    see it (server.show_upstream_url); internal topology is otherwise for the logs."""
    return f"the upstream {upstream}" if upstream else "the upstream"


def _the_cap(upstream: str | None) -> str:
    """`_the`, starting a sentence."""
    text = _the(upstream)
    return text[:1].upper() + text[1:]


def _where(upstream: str | None) -> dict[str, str]:
    return {"upstream": upstream} if upstream else {}


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis: at most `limit` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_repr(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return clip(text, limit)
