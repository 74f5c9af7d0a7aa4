"""An `UpstreamFailure` → the explained error the client sees, and the one retry a drift allows.

Apps cannot act on prose like "your prompt contains at least 2049 input
tokens": it is a lower bound, names no fix, and differs by engine.
`explain_upstream_error(failure, upstream=..., prompt_tokens=..., ...)` uses
brimful's *exact* prompt count, says how many tokens to cut and names the
field to change; it picks the client-facing status (400 for
length/validation, 404 kept, 503 with Retry-After while the engine loads or
after it died, 502 for other upstream faults) and keeps the upstream's own
message and parsed numbers under `error.brimful` in the envelope.

Whether a smaller completion limit can fix the failure is admission's rule
(`proxy.admitted.admission.retry_limit`).  Pure.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from proxy.errors import BrimfulError, ErrorCode, upstream_not_ready
from proxy.upstream.failure import UpstreamFailure

_ENGINE_NAMES = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "tgi": "TGI",
    "llama.cpp": "llama.cpp",
    "openai-like": "OpenAI-compatible server",
}

# ---------------------------------------------------------------------------
# Explaining: UpstreamFailure → BrimfulError the client sees
# ---------------------------------------------------------------------------

def explain_upstream_error(
    failure: UpstreamFailure,
    *,
    upstream: str | None,
    prompt_tokens: int | None = None,
    max_model_len: int | None = None,
    requested_max_tokens: int | None = None,
    granted_max_tokens: int | None = None,
    prompt_param: str = "messages",
    max_tokens_param: str | None = None,
    surface: str = "chat",
) -> BrimfulError:
    """Turn an upstream failure into the error the client receives.

    `prompt_tokens`, `max_model_len`, `requested_max_tokens` (the client's ask)
    and `granted_max_tokens` (what brimful forwarded) are brimful's own exact
    figures when it counted the request; they take precedence over the
    upstream's, which may be a lower bound.  `prompt_param` is "messages" for
    chat and "prompt" for completions; `max_tokens_param` is the field the
    client used ("max_tokens" or "max_completion_tokens"); `surface` the admitted route's name.
    """
    ctx = _Context(
        failure=failure,
        upstream=upstream,
        prompt_tokens=prompt_tokens,
        max_model_len=max_model_len,
        requested=requested_max_tokens,
        granted=granted_max_tokens,
        prompt_param=prompt_param,
        max_tokens_param=max_tokens_param,
        surface=surface,
    )
    explain = _EXPLAINERS.get(failure.kind, _explain_server_error)
    error = explain(ctx)
    # Every explanation carries the upstream's own words and figures.
    error.details = {**_upstream_details(ctx), **error.details}
    return error


@dataclass
class _Context:
    failure: UpstreamFailure
    upstream: str | None          # the URL clients may see (server.show_upstream_url), else None
    prompt_tokens: int | None
    max_model_len: int | None
    requested: int | None
    granted: int | None
    prompt_param: str
    max_tokens_param: str | None
    surface: str = "chat"

    @property
    def who(self) -> str:
        """'the upstream vLLM' (or '... at http://…' when clients may see the URL) — who said no."""
        name = _ENGINE_NAMES.get(self.failure.engine or "", "")
        where = f" at {self.upstream}" if self.upstream else ""
        if name:
            return f"the upstream {name}{where}"
        return f"the upstream {self.upstream}" if self.upstream else "the upstream"

    @property
    def limit(self) -> int | None:
        """The context size: the upstream's stated figure (it is the one enforced), else brimful's."""
        return self.failure.max_model_len if self.failure.max_model_len is not None else self.max_model_len

    @property
    def exact_prompt(self) -> int | None:
        """An exact prompt count: brimful's, else the upstream's if it is not a lower bound."""
        if self.prompt_tokens is not None:
            return self.prompt_tokens
        f = self.failure
        if f.prompt_tokens is not None and not f.prompt_tokens_is_lower_bound and not f.numbers_are_approximate:
            return f.prompt_tokens
        return None

    @property
    def asked(self) -> int | None:
        """Completion tokens asked for: the client's value, else what the upstream says it got."""
        for value in (self.requested, self.failure.requested_tokens, self.granted):
            if value is not None:
                return value
        return None

    @property
    def sent(self) -> int | None:
        """Completion tokens the upstream was asked for: what brimful forwarded, else the client's value."""
        for value in (self.granted, self.requested, self.failure.requested_tokens):
            if value is not None:
                return value
        return None

    @property
    def output_param(self) -> str:
        if self.max_tokens_param:
            return self.max_tokens_param
        if self.failure.param in ("max_tokens", "max_completion_tokens"):
            return self.failure.param
        return "max_tokens"

    def source(self) -> str:
        return f" (Rejected by {self.who} with HTTP {self.failure.status}.)"


def _upstream_details(ctx: _Context) -> dict[str, Any]:
    f = ctx.failure
    details: dict[str, Any] = {
        **({"upstream": ctx.upstream} if ctx.upstream else {}),
        "upstream_status": f.status,
        "upstream_message": f.message,
        "engine": f.engine,
        "upstream_kind": f.kind,
    }
    skip = {"kind", "status", "message", "engine", "body_format"}
    for key, value in asdict(f).items():
        if key in skip or value is None or value is False:
            continue
        details[key if key.startswith("upstream_") else f"upstream_{key}"] = value
    if f.body_format != "json":
        details["upstream_body_format"] = f.body_format
    return details


def _brimful_numbers(ctx: _Context) -> dict[str, Any]:
    numbers = {
        "prompt_tokens": ctx.prompt_tokens,
        "max_model_len": ctx.limit,
        "requested_max_tokens": ctx.requested,
        "granted_max_tokens": ctx.granted,
    }
    return {k: v for k, v in numbers.items() if v is not None}


def _length_error(ctx: _Context, message: str, param: str | None, *, too_long: tuple[int, int] | None = None,
                  exceeds: tuple[int, int, int] | None = None, **numbers: Any) -> BrimfulError:
    """A length refusal; `too_long` / `exceeds` give Anthropic's clients their own wording of it."""
    return BrimfulError(
        400, message, code=ErrorCode.CONTEXT_LENGTH_EXCEEDED, param=param,
        details={**_brimful_numbers(ctx), **{k: v for k, v in numbers.items() if v is not None}},
        too_long=too_long, exceeds=exceeds,
    )


def _prompt_over(ctx: _Context, n: int, limit: int, note: str = "") -> BrimfulError:
    """The prompt alone fills the context: say by how much, exactly."""
    cut = n - limit + 1
    asked = ctx.asked
    also = ""
    cut_for_asked = None
    if asked is not None and asked > 1:
        cut_for_asked = n + asked - limit
        also = f"; cut {cut_for_asked} to leave room for the {asked} completion tokens requested"
    return _length_error(
        ctx,
        f"This model's maximum context length is {limit} tokens. However, your prompt is {n} tokens, which "
        f"leaves no room for any output. Shorten the prompt by {_tokens(cut)} or more for even one completion "
        f"token to fit{also} (or serve the model with a larger --max-model-len).{note}{ctx.source()}",
        ctx.prompt_param,
        too_long=(n, limit - 1),
        tokens_to_remove=cut,
        tokens_to_remove_for_requested=cut_for_asked,
    )


def _over_total(ctx: _Context, n: int, limit: int, asked: int) -> BrimfulError:
    """Prompt fits, prompt + output does not: name the limit that fits."""
    over = n + asked - limit
    room = limit - n
    param = ctx.output_param
    return _length_error(
        ctx,
        f"This model's maximum context length is {limit} tokens. Your prompt is {n} tokens and you requested "
        f"{asked} completion tokens ({param}), {n + asked} in total, {over} more than fit. Set {param} to "
        f"{room} or less, or shorten the prompt by {_tokens(over)}.{ctx.source()}",
        param,
        exceeds=(n, asked, limit),
        available_completion_tokens=room,
        tokens_over=over,
    )


def _ran_out(ctx: _Context, n: int, limit: int) -> BrimfulError:
    """No completion limit was sent and the generation ran past the context (llama.cpp's 500)."""
    room = limit - n
    param = ctx.output_param
    return _length_error(
        ctx,
        f"This model's maximum context length is {limit} tokens. Your prompt is {n} tokens, which leaves {room} "
        f"for the completion, and no completion limit was set, so the generation ran out of context. Set {param} "
        f"to {room} or less.{ctx.source()}",
        param,
        available_completion_tokens=room,
    )


def _counts_disagree(ctx: _Context, n: int, limit: int, what: str) -> BrimfulError:
    """brimful's numbers say it fits, the upstream's say no: a tokenizer/template or limit mismatch."""
    f = ctx.failure
    theirs = ""
    if f.prompt_tokens is not None and f.prompt_tokens_is_lower_bound:
        # Never "at least" next to brimful's exact count: say where the upstream stopped.
        theirs = f" The upstream stopped counting the prompt at {f.prompt_tokens} tokens, past its limit."
    elif f.prompt_tokens is not None:
        theirs = f" The upstream counted {f.prompt_tokens} prompt tokens."
    elif f.kind == "max_tokens_invalid" and f.requested_tokens is not None and f.requested_tokens <= 0:
        theirs = (f" The upstream left {f.requested_tokens} tokens for the output, so by its count the prompt "
                  f"is {limit - f.requested_tokens} tokens.")
    sent = ctx.granted if ctx.granted is not None else ctx.requested
    sent_text = f" and {sent} completion tokens" if sent is not None else ""
    if ctx.max_model_len is not None and ctx.max_model_len != limit:
        theirs += f" Its context length is {limit} tokens, while brimful knows it as {ctx.max_model_len}."
    return _length_error(
        ctx,
        f"The request does not fit {what}, although brimful counted {n} prompt tokens{sent_text} against a "
        f"context length of {limit} tokens.{theirs} brimful's tokenizer or chat template for this model, or "
        f"its max_model_len, does not match the upstream's; shorten the prompt or request fewer completion "
        f"tokens, and tell the operator.{ctx.source()}",
        ctx.prompt_param,
        counts_disagree=True,
    )


def _explain_length(ctx: _Context) -> BrimfulError:
    """prompt_too_long and context_length: one decision on the best numbers available."""
    f = ctx.failure
    limit, n, asked, sent = ctx.limit, ctx.exact_prompt, ctx.asked, ctx.sent
    cap = f.max_input_tokens
    if f.kind == "prompt_too_long" and cap is not None and n is not None and n > cap and (
            limit is None or n < limit):
        # TGI's max_input_tokens / SGLang's max_req_input_len: a prompt bound below the context.
        return _length_error(
            ctx,
            f"{_cap(ctx.who)} accepts prompts of at most {cap} tokens (its input limit, below the context "
            f"length). Your prompt is {n} tokens: shorten it by {_tokens(n - cap)}.{ctx.source()}",
            ctx.prompt_param,
            max_input_tokens=cap,
            tokens_to_remove=n - cap,
        )
    if limit is not None and n is not None:
        if n >= limit:
            return _prompt_over(ctx, n, limit)
        if sent is not None and n + sent > limit:
            return _over_total(ctx, n, limit, sent)
        if sent is None and f.kind == "context_length":
            return _ran_out(ctx, n, limit)
        return _counts_disagree(ctx, n, limit, "the upstream's context")
    if limit is not None and f.prompt_tokens is not None:
        # Only vLLM's lower bound (or OpenRouter's estimate): say so, and no more than that.
        low = f.prompt_tokens
        about = "about" if f.numbers_are_approximate else "at least"
        if f.kind == "prompt_too_long" or low >= limit:
            return _length_error(
                ctx,
                f"This model's maximum context length is {limit} tokens. However, your prompt has {about} {low} "
                f"tokens (the upstream stops counting once the limit is passed), which leaves no room for any "
                f"output. Shorten the prompt by {about} {_tokens(max(low - limit + 1, 1))}.{ctx.source()}",
                ctx.prompt_param, too_long=(max(low, limit), limit - 1),
                tokens_to_remove_at_least=max(low - limit + 1, 1),
            )
        asked_text = f" and you requested {asked} completion tokens" if asked is not None else ""
        most = limit - low
        return _length_error(
            ctx,
            f"This model's maximum context length is {limit} tokens. However, your prompt has {about} {low} tokens"
            f"{asked_text}, more than fit together: {ctx.output_param} can be {most} at the very most. Request "
            f"fewer completion tokens or shorten the prompt.{ctx.source()}",
            ctx.output_param,
            max_available_completion_tokens=most,
        )
    limit_text = f" of {limit} tokens" if limit is not None else ""
    return _length_error(
        ctx,
        f"The prompt and the requested completion do not fit the model's context{limit_text}: "
        f"{_quote(f.message)}. Shorten the prompt or request fewer completion tokens "
        f"({ctx.output_param}).{ctx.source()}",
        ctx.prompt_param if f.kind == "prompt_too_long" else ctx.output_param,
    )


def _explain_max_tokens_too_large(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    param = ctx.output_param
    asked = f.requested_tokens if f.requested_tokens is not None else ctx.asked
    limit, n = ctx.limit, ctx.exact_prompt
    cap = f.max_output_tokens
    asked_text = f"{asked} completion tokens" if asked is not None else "more completion tokens than allowed"
    if cap is not None:
        head = f"You requested {asked_text} ({param}), more than the {cap} {ctx.who} allows."
    elif limit is not None:
        head = (f"You requested {asked_text} ({param}), more than the model's whole context of {limit} tokens "
                f"(prompt and completion together).")
    else:
        head = f"You requested {asked_text} ({param}), more than the model allows: {_quote(f.message)}."
    room = None
    if limit is not None and n is not None:
        if n >= limit:
            return _prompt_over(ctx, n, limit)
        room = limit - n if cap is None else min(cap, limit - n)
        fix = f" Your prompt is {n} tokens, so at most {room} completion tokens fit: set {param} to {room} or less."
    elif cap is not None:
        room = cap
        fix = f" Set {param} to {cap} or less."
    elif limit is not None:
        fix = f" Set {param} to {limit} minus the prompt's length or less."
    else:
        fix = " Request fewer completion tokens."
    return _length_error(ctx, head + fix + ctx.source(), param, available_completion_tokens=room)


def _explain_max_tokens_invalid(ctx: _Context) -> BrimfulError:
    """'max_tokens must be at least 1, got N': the client's value, or the room vLLM computed?"""
    f = ctx.failure
    got = f.requested_tokens
    sent = ctx.granted if ctx.granted is not None else ctx.requested
    param = ctx.max_tokens_param or f.param or "max_tokens"
    computed = got is not None and got <= 0 and (sent is None or sent != got)
    if computed:
        # vLLM set max_tokens = min(sent, max_model_len - prompt) itself: the prompt fills the context.
        limit = ctx.limit
        n = ctx.prompt_tokens
        if limit is not None and got is not None:
            if n is None:
                n = limit - got   # exact: min(sent, limit - n) == got with sent > got
            if n >= limit:
                return _prompt_over(ctx, n, limit)
            return _counts_disagree(ctx, n, limit, "the upstream's context")
        return _length_error(
            ctx,
            f"The prompt fills the model's whole context: the upstream computed {got} tokens of room for the "
            f"completion. Shorten the prompt.{ctx.source()}",
            ctx.prompt_param,
        )
    return BrimfulError(
        400,
        f"Invalid value for '{param}': it must be at least 1"
        + (f" (got {got})." if got is not None else ".") + ctx.source(),
        code=ErrorCode.INVALID_VALUE,
        param=param,
    )


def _explain_input_chars(ctx: _Context) -> BrimfulError:
    """vLLM refuses very long texts by characters before tokenizing them."""
    f = ctx.failure
    limit, n = ctx.limit, ctx.exact_prompt
    chars_text = f"{f.chars} characters" if f.chars is not None else "too many characters"
    bound = (f" more than the {f.max_chars} characters it accepts for {f.max_input_tokens} input tokens"
             if f.max_chars is not None and f.max_input_tokens is not None else "")
    note = f" The upstream rejected the prompt by length in characters ({chars_text},{bound}) before tokenizing it."
    if limit is not None and n is not None:
        if n >= limit:
            return _prompt_over(ctx, n, limit, note)
        asked = ctx.sent
        if asked is not None and asked > 0 and n + asked > limit:
            room = limit - n
            param = ctx.output_param
            return _length_error(
                ctx,
                f"This model's maximum context length is {limit} tokens. Your prompt is {n} tokens; with {asked} "
                f"completion tokens requested ({param}) too little room was left for it.{note} Set {param} to "
                f"{room} or less.{ctx.source()}",
                param, available_completion_tokens=room,
            )
        return _counts_disagree(ctx, n, limit, "the upstream's character bound")
    limit_text = f"This model's maximum context length is {limit} tokens. " if limit is not None else ""
    more = " or request fewer completion tokens" if (f.requested_tokens or 0) > 0 else ""
    if (f.requested_tokens or 0) > 0 and f.max_input_tokens is not None:
        bound = (f" which is over the bound of {f.max_chars} characters for the {f.max_input_tokens} tokens left "
                 f"for the prompt after the {f.requested_tokens} completion tokens requested ({ctx.output_param})")
    return _length_error(
        ctx,
        f"{limit_text}Your prompt is {chars_text},{bound or ' more than fit'}; the upstream rejects such a "
        f"prompt by its length in characters before tokenizing it. Shorten the prompt{more}.{ctx.source()}",
        ctx.prompt_param,
        chars_to_remove=(f.chars - f.max_chars) if f.chars is not None and f.max_chars is not None else None,
    )


def _explain_kv_cache(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    est = f.estimated_max_model_len
    fix = (f"restart it with --max-model-len {est} or less, or give it more memory (--gpu-memory-utilization)"
           if est is not None else
           "restart it with a smaller --max-model-len or a higher --gpu-memory-utilization")
    limit_text = f" of {f.max_model_len} tokens" if f.max_model_len is not None else ""
    return BrimfulError(
        502,
        f"{_cap(ctx.who)} cannot hold one request of its max_model_len{limit_text} in its KV cache: "
        f"{_quote(f.message)}. The operator must {fix}.",
        code=ErrorCode.UPSTREAM_KV_CACHE,
    )


# str(json.JSONDecodeError): "Expecting value: line 1 column 1 (char 0)", "Unterminated string starting at: ...".
_JSON_DECODE_ERROR = re.compile(r": line \d+ column \d+ \(char \d+\)$")


def _output_conversion_failed(ctx: _Context) -> bool:
    """vLLM's /v1/messages turns the generated chat answer into a Message after generating it,
    json.loads-ing each tool call's arguments (`messages_full_converter`); arguments the model
    wrote that are not JSON come back as HTTP 400 with the decoder's message, though the request
    was fine.  A Messages request carries tool inputs as JSON objects, so it cannot cause that."""
    f = ctx.failure
    return ctx.surface == "messages" and f.status == 400 and bool(_JSON_DECODE_ERROR.search(f.message))


def _explain_bad_request(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    if _output_conversion_failed(ctx):
        return BrimfulError(
            400,
            f"{_cap(ctx.who)} generated an answer but could not turn it into a Message: the model wrote "
            f"tool-call arguments that are not valid JSON ({f.message}). The request itself is fine; a retry "
            f"may generate valid arguments. (HTTP {f.status} from the upstream, kept as it sent it.)",
            code=ErrorCode.UPSTREAM_INVALID_OUTPUT,
        )
    status = 400 if f.status in (400, 422) or not 400 <= f.status < 500 else f.status
    tgi = (" (TGI answers HTTP 422 for invalid requests; brimful reports it as 400.)"
           if f.status == 422 and f.engine == "tgi" else "")
    what = "rejected the request" if f.status != 401 else "refused the request as unauthorized"
    message = f"{_cap(ctx.who)} {what} (HTTP {f.status}): {f.message}{tgi}"
    if f.status == 401:
        message += (" vLLM started with --api-key expects 'Authorization: Bearer <key>'; check the key the "
                    "client or brimful sends upstream.")
    return BrimfulError(status, message, code=ErrorCode.UPSTREAM_BAD_REQUEST, param=f.param)


def _explain_not_found(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    if "model" in f.message.lower():
        # Same fields as vLLM's own answer (and errors.model_not_found): the message is kept as is.
        return BrimfulError(404, f.message, code=ErrorCode.MODEL_NOT_FOUND, param="model", type="NotFoundError",
                             wire_code=404)
    return BrimfulError(
        404,
        f"{_cap(ctx.who)} has no such route (HTTP 404: {f.message or 'Not Found'}). Check that it is an "
        f"OpenAI-compatible server and that brimful's upstream URL is right.",
        code=ErrorCode.UPSTREAM_NOT_FOUND,
    )


def _explain_not_ready(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    if f.engine_dead:
        return BrimfulError(
            503,
            f"{_cap(ctx.who)} reports that its engine died (HTTP {f.status}: {f.message}). vLLM shuts its API "
            f"server down after that; it must be restarted, and loading weights takes tens of seconds to "
            f"minutes. Its log names the root cause. Retry later.",
            code=ErrorCode.UPSTREAM_ENGINE_DEAD,
            headers={"Retry-After": "30"},
        )
    return upstream_not_ready(ctx.upstream, f.status, f.message or "no message")


def _explain_server_error(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    return BrimfulError(
        502,
        f"{_cap(ctx.who)} failed with HTTP {f.status}: {f.message}. This is a fault of the upstream server, "
        f"not of the request; its log has the cause.",
        code=ErrorCode.UPSTREAM_ERROR,
    )


_FORMAT_NAMES = {
    "html": "an HTML page",
    "empty": "an empty body",
    "invalid_json": "invalid JSON",
    "wrong_shape": "JSON that is not an error object",
    "text": "plain text",
}


def _explain_unparseable(ctx: _Context) -> BrimfulError:
    f = ctx.failure
    what = _FORMAT_NAMES.get(f.body_format, "an unreadable body")
    client_side = 400 <= f.status < 500
    status = (400 if f.status == 422 else f.status) if client_side else 502
    return BrimfulError(
        status,
        f"{_cap(ctx.who)} answered HTTP {f.status} with {what} instead of an OpenAI-style error: "
        f"{_quote(f.message)}." + ("" if client_side else " Is something other than the model server (a reverse "
                                    "proxy, a load balancer) answering at that address?"),
        code=ErrorCode.UPSTREAM_ERROR,
    )


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else '""'


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


_EXPLAINERS: dict[str, Callable[[_Context], BrimfulError]] = {
    "prompt_too_long": _explain_length,
    "context_length": _explain_length,
    "max_tokens_too_large": _explain_max_tokens_too_large,
    "max_tokens_invalid": _explain_max_tokens_invalid,
    "input_chars": _explain_input_chars,
    "kv_cache": _explain_kv_cache,
    "bad_request": _explain_bad_request,
    "not_found": _explain_not_found,
    "not_ready": _explain_not_ready,
    "server_error": _explain_server_error,
    "unparseable": _explain_unparseable,
}
