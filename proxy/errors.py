"""Every error headroom sends, in one place.

Each failure is a `HeadroomError` built by one of the constructors below; the
HTTP envelope is made only by `HeadroomError.body()` / `.response()`.  The
envelope is OpenAI's, `{"error": {"message", "type", "param", "code"}}`, so the
official `openai` client raises the right exception class (it picks the class
from the HTTP status and reads `error.message`).  Headroom adds a `headroom`
object beside those four keys with the numbers behind the message (and, for an
upstream error, the upstream's original message), for programs that want more
than prose.

Mapping an *upstream* error body to one of these lives in
`proxy.upstream_errors`; this module only knows headroom's vocabulary.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping

from starlette.responses import Response

# OpenAI's `type` values by HTTP status (what api.openai.com sends).
_TYPE_BY_STATUS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


@dataclass
class HeadroomError(Exception):
    """An error response: status, OpenAI envelope fields and structured details."""

    status: int
    message: str
    code: str | int | None = None
    param: str | None = None
    type: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        super().__init__(self.message)
        if self.type is None:
            self.type = _TYPE_BY_STATUS.get(self.status, "invalid_request_error")

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": self.type,
            "param": self.param,
            "code": self.code,
        }
        if self.details:
            error["headroom"] = self.details
        return {"error": error}

    def body_bytes(self) -> bytes:
        return json.dumps(self.body(), ensure_ascii=False).encode("utf-8")

    def response(self, extra_headers: Mapping[str, str] | None = None) -> Response:
        headers = dict(self.headers)
        if extra_headers:
            headers.update(extra_headers)
        return Response(
            self.body_bytes(), status_code=self.status, headers=headers, media_type="application/json"
        )

    def sse_event(self) -> bytes:
        """The error as vLLM reports a failure after a stream started: an event, then [DONE]."""
        return b"data: " + self.body_bytes() + b"\n\ndata: [DONE]\n\n"


# ---------------------------------------------------------------------------
# Bad input (400 / 404 / 413 / 415)
# ---------------------------------------------------------------------------

def invalid_json(detail: str) -> HeadroomError:
    return HeadroomError(
        400,
        f"The request body is not valid JSON ({detail}). Send a JSON object such as "
        '{"model": "...", "messages": [{"role": "user", "content": "Hello"}]}.',
        code="invalid_json",
    )


def body_not_object(kind: str) -> HeadroomError:
    return HeadroomError(
        400,
        f"The request body must be a JSON object, got a JSON {kind}.",
        code="invalid_request_body",
    )


def body_too_large(size: int, limit: int) -> HeadroomError:
    return HeadroomError(
        413,
        f"The request body is {size} bytes, more than the {limit} bytes this headroom accepts "
        "(limits.max_body_bytes in the configuration).",
        code="request_too_large",
        details={"body_bytes": size, "max_body_bytes": limit},
    )


def invalid_field(param: str, problem: str, value: Any = None) -> HeadroomError:
    """A field headroom reads has the wrong type or an impossible value."""
    shown = _short_repr(value)
    return HeadroomError(
        400,
        f"Invalid value for '{param}': {problem}" + (f" (got {shown})." if value is not None else "."),
        code="invalid_value",
        param=param,
    )


def missing_field(param: str, hint: str) -> HeadroomError:
    return HeadroomError(400, f"Missing required field '{param}': {hint}", code="missing_field", param=param)


def invalid_prompt(message: str, param: str = "messages") -> HeadroomError:
    """The prompt cannot be rendered or tokenized the way vLLM would (vLLM answers 400 too)."""
    return HeadroomError(400, message, code="invalid_prompt", param=param)


def model_not_found(model: str, available: list[str]) -> HeadroomError:
    """Same wording, status and fields as vLLM 0.32 (captures/a_model_unknown_chat.json)."""
    return HeadroomError(
        404,
        f"The model `{model}` does not exist. Valid aliases: {', '.join(available)}.",
        code=404,
        param="model",
        type="NotFoundError",
    )


def no_model_known(upstream: str) -> HeadroomError:
    return HeadroomError(
        503,
        f"headroom does not know which models the upstream {upstream} serves yet: its /v1/models "
        "has not answered. vLLM takes tens of seconds to minutes to load weights before it serves; "
        "retry shortly.",
        code="upstream_not_ready",
        headers={"Retry-After": "5"},
    )


def unauthorized() -> HeadroomError:
    return HeadroomError(
        401,
        "Missing or invalid API key. Send 'Authorization: Bearer <key>' with one of the keys "
        "configured in headroom (auth.api_keys).",
        code="invalid_api_key",
    )


# ---------------------------------------------------------------------------
# Admission (headroom's own length decisions)
# ---------------------------------------------------------------------------

def prompt_too_long(prompt_tokens: int, max_model_len: int, model: str, param: str) -> HeadroomError:
    over = prompt_tokens - max_model_len + 1
    return HeadroomError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt is "
        f"{prompt_tokens} tokens (counted with {model}'s own tokenizer and chat template), which "
        f"leaves no room for any output. Remove at least {over} tokens from the prompt (or serve the "
        f"model with a larger --max-model-len).",
        code="context_length_exceeded",
        param=param,
        details={
            "prompt_tokens": prompt_tokens,
            "max_model_len": max_model_len,
            "tokens_to_remove": over,
        },
    )


def not_enough_room(
    prompt_tokens: int,
    max_model_len: int,
    margin: int,
    available: int,
    min_completion: int,
    model: str,
    param: str,
) -> HeadroomError:
    need_cut = min_completion - available
    return HeadroomError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. Your prompt is "
        f"{prompt_tokens} tokens, so after headroom's safety margin of {margin} tokens only "
        f"{available} tokens are left for the completion, fewer than the minimum of "
        f"{min_completion} this deployment allows. Remove at least {need_cut} tokens from the prompt.",
        code="context_length_exceeded",
        param=param,
        details={
            "prompt_tokens": prompt_tokens,
            "max_model_len": max_model_len,
            "margin_tokens": margin,
            "available_completion_tokens": available,
            "min_completion_tokens": min_completion,
            "tokens_to_remove": need_cut,
        },
    )


def completion_too_long(
    requested: int,
    field_name: str,
    prompt_tokens: int,
    max_model_len: int,
    margin: int,
    available: int,
) -> HeadroomError:
    """Policy `reject`: the client asked for more than fits and the operator chose not to clamp."""
    return HeadroomError(
        400,
        f"This model's maximum context length is {max_model_len} tokens. Your prompt is "
        f"{prompt_tokens} tokens and you requested {requested} completion tokens ({field_name}), "
        f"{prompt_tokens + requested} in total. At most {available} completion tokens fit "
        f"(after a safety margin of {margin}): set {field_name} to {available} or less.",
        code="context_length_exceeded",
        param=field_name,
        details={
            "prompt_tokens": prompt_tokens,
            "max_model_len": max_model_len,
            "requested_max_tokens": requested,
            "margin_tokens": margin,
            "available_completion_tokens": available,
        },
    )


# ---------------------------------------------------------------------------
# Upstream unavailable (502 / 503 / 504)
# ---------------------------------------------------------------------------

def upstream_unreachable(upstream: str, detail: str) -> HeadroomError:
    return HeadroomError(
        502,
        f"headroom could not connect to the upstream {upstream} ({detail}). Is vLLM running and "
        "listening there? A vLLM that is still starting refuses connections until its API server is up.",
        code="upstream_unreachable",
        details={"upstream": upstream, "cause": detail},
    )


def upstream_broken(upstream: str, detail: str) -> HeadroomError:
    return HeadroomError(
        502,
        f"The upstream {upstream} broke the connection ({detail}). It may have crashed or been "
        "restarted; check its logs.",
        code="upstream_connection_error",
        details={"upstream": upstream, "cause": detail},
    )


def upstream_not_ready(upstream: str, status: int, detail: str) -> HeadroomError:
    return HeadroomError(
        503,
        f"The upstream {upstream} is not ready (HTTP {status}: {detail}). vLLM answers 503 while it "
        "loads weights or after its engine died; loading takes tens of seconds to minutes. Retry shortly.",
        code="upstream_not_ready",
        details={"upstream": upstream, "upstream_status": status, "upstream_message": detail},
        headers={"Retry-After": "5"},
    )


def upstream_busy(upstream: str, limit: int, waited: float) -> HeadroomError:
    """Back-pressure (proxy.gate): every request slot to this upstream stayed taken."""
    return HeadroomError(
        503,
        f"The upstream {upstream} already has {limit} requests in flight, the most headroom sends it "
        f"(upstream.max_concurrent_requests), and no slot freed within {waited:g} s "
        "(upstream.queue_timeout). Retry shortly; if vLLM has spare capacity, raise the limit.",
        code="upstream_busy",
        details={"upstream": upstream, "max_concurrent_requests": limit, "queue_timeout_s": waited},
        headers={"Retry-After": "1"},
    )


def internal_error(request_id: str) -> HeadroomError:
    """A bug in headroom: still answered in the OpenAI shape, never a bare 500 page."""
    return HeadroomError(
        500,
        f"headroom hit an unexpected internal error and did not complete the request. This is a bug in "
        f"headroom, not in your request: please report it with the request id {request_id}.",
        code="internal_error",
    )


def shutting_down(deadline: float) -> HeadroomError:
    return HeadroomError(
        503,
        f"headroom is shutting down (SIGTERM) and this stream was still running when the {deadline:g} s "
        "drain deadline passed (server.shutdown_timeout); the answer is incomplete. Retry the request.",
        code="server_shutting_down",
        details={"shutdown_timeout_s": deadline},
        headers={"Retry-After": "1"},
    )


def upstream_timeout(upstream: str, phase: str, seconds: float) -> HeadroomError:
    return HeadroomError(
        504,
        f"The upstream {upstream} did not answer within {seconds:g} s ({phase}). A long generation can "
        "be legitimately slow: raise the timeout (headroom serve --upstream-timeout) or request fewer "
        "tokens; if every request times out, the server is overloaded or stuck.",
        code="upstream_timeout",
        details={"upstream": upstream, "phase": phase, "timeout_s": seconds},
    )


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit - 1` characters and an ellipsis: at most `limit` characters."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _short_repr(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return clip(text, limit)
