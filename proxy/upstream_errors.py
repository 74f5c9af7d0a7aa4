"""Upstream error bodies → typed failures → explained OpenAI-shaped errors.

vLLM, SGLang, TGI and llama.cpp each word a context-length rejection their own
way, and vLLM alone has changed its wording half a dozen times (every known
text is in `shared/vllm/error_texts.md`, the verbatim 0.32.0 responses in
`shared/vllm/captures/`).  Apps cannot act on prose like "your prompt contains
at least 2049 input tokens": it is a lower bound, names no fix, and differs by
engine.  This module turns any upstream error body into one `UpstreamFailure`
(kind + the numbers the text carries), and then into a `HeadroomError` that
uses headroom's *exact* prompt count, says how many tokens to cut, and names
the field to change.

Two pure functions do the work, so both are cheap to test exhaustively:

* `parse_upstream_error(status, body, content_type)` never raises, whatever the
  bytes: an unknown shape becomes kind "unparseable" with an excerpt.
* `explain_upstream_error(failure, upstream=..., prompt_tokens=..., ...)` picks
  the client-facing status (400 for length/validation, 404 kept, 503 with
  Retry-After while the engine loads or after it died, 502 for other upstream
  faults) and keeps the upstream's own message and parsed numbers under
  `error.headroom` in the envelope.

`is_length_failure` / `corrected_max_tokens` tell the proxy when one retry with
a smaller completion limit can succeed, and with which limit.
"""

from __future__ import annotations

import html
import json
import re
from dataclasses import asdict, dataclass
from typing import Any, Callable

from proxy.errors import HeadroomError, clip, upstream_not_ready

# Error bodies are small; anything beyond this is an HTML page or a runaway
# echo of the request.  Parsing stops here so a hostile body costs nothing.
MAX_PARSE_BYTES = 64 * 1024
# How much of the upstream's message is kept in the failure and the envelope.
MAX_MESSAGE_CHARS = 2000
# Every known wording fits in a few hundred characters at the start of the
# message; only this much is searched, which bounds the cost of a long echo.
MAX_RULE_CHARS = 8 * 1024
# How much of a body that is not a JSON error is quoted back.
EXCERPT_CHARS = 200

KINDS = frozenset({
    "prompt_too_long",       # the prompt alone does not fit the context
    "context_length",        # prompt + requested output does not fit
    "max_tokens_too_large",  # the requested output alone is above the limit
    "max_tokens_invalid",    # "max_tokens must be at least 1, got N"
    "input_chars",           # vLLM's character pre-check, before tokenizing
    "kv_cache",              # start-up KV-cache sizing errors, if relayed
    "bad_request",           # any other 4xx validation answer
    "not_found",             # 404: unknown model or route
    "not_ready",             # 503, engine loading, engine dead
    "server_error",          # any other 5xx
    "unparseable",           # not a JSON error object (HTML, empty, garbage)
})

_ENGINE_NAMES = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "tgi": "TGI",
    "llama.cpp": "llama.cpp",
    "openai-like": "OpenAI-compatible server",
}


@dataclass(frozen=True)
class UpstreamFailure:
    """What an upstream error body says, as data.

    Every number is the upstream's own figure, parsed from its text or fields;
    None when the text does not carry it.  `status` is the HTTP status, except
    for an error sent inside a 200 stream (vLLM's `data: {"error": ...}`), where
    it is the error object's own `code`.
    """

    kind: str
    status: int
    message: str                                # the upstream's own message, or an excerpt of the body
    engine: str | None                          # "vllm", "sglang", "tgi", "llama.cpp", "openai-like"
    max_model_len: int | None = None            # context size (TGI: max_total_tokens, llama.cpp: n_ctx)
    prompt_tokens: int | None = None
    prompt_tokens_is_lower_bound: bool = False  # vLLM's "at least N": it stops tokenizing at the limit
    requested_tokens: int | None = None         # output tokens the upstream says were requested
    param: str | None = None                    # the field the upstream blames ("body." stripped)
    chars: int | None = None                    # prompt characters (vLLM's character pre-check)
    max_chars: int | None = None                # the character bound it was checked against
    max_input_tokens: int | None = None         # input-token bound (vLLM max_input, TGI max_input_tokens, SGLang)
    max_output_tokens: int | None = None        # output-token bound (TGI, OpenAI "supports at most N")
    total_tokens: int | None = None             # prompt + output as the upstream states it
    estimated_max_model_len: int | None = None  # KV-cache errors: the length that would fit
    numbers_are_approximate: bool = False       # OpenRouter's "about N tokens"
    engine_dead: bool = False                   # vLLM EngineDeadError: the server shuts down after it
    upstream_type: str | None = None            # error.type / TGI error_type
    upstream_code: str | int | None = None      # error.code
    body_format: str = "json"                   # json | html | text | empty | invalid_json | wrong_shape


# ---------------------------------------------------------------------------
# Parsing: bytes → UpstreamFailure
# ---------------------------------------------------------------------------

def parse_upstream_error(status: int, body: bytes, content_type: str | None = None) -> UpstreamFailure:
    """Classify an upstream error response.  Pure; never raises on any input."""
    try:
        return _parse(status, body, content_type)
    except Exception as exc:  # a bug here must not turn an upstream error into a crash
        return UpstreamFailure(
            kind="not_ready" if status == 503 else "unparseable",
            status=status if isinstance(status, int) else 502,
            message=f"(headroom could not parse the upstream error body: {type(exc).__name__})",
            engine=None,
            body_format="invalid_json",
        )


@dataclass
class _Fields:
    """The parts of an error body that matter, whatever its shape."""

    message: str
    type: str | None = None
    param: str | None = None
    code: str | int | None = None
    engine: str | None = None
    n_prompt_tokens: int | None = None   # llama.cpp puts the numbers beside the message
    n_ctx: int | None = None


def _parse(status: int, body: bytes, content_type: str | None) -> UpstreamFailure:
    raw = bytes(body[:MAX_PARSE_BYTES]) if body else b""
    text = raw.decode("utf-8", errors="replace")
    fields, body_format = _read_body(text, content_type, truncated=len(body or b"") > MAX_PARSE_BYTES)

    if fields is None:
        # Not an error object: an HTML page from a reverse proxy, uvicorn's
        # plain "Internal Server Error", an empty body.  Only the status speaks.
        excerpt = _excerpt(text, body_format)
        kind = "not_ready" if status == 503 else "not_found" if status == 404 else "unparseable"
        hit = _match_rules(text[:EXCERPT_CHARS * 4]) if body_format == "text" else None
        if hit is not None:   # a plain-text body can still say what happened
            return _failure_from_rule(hit, status, _Fields(message=text.strip()), body_format)
        return UpstreamFailure(kind=kind, status=status, message=excerpt, engine=None, body_format=body_format)

    effective = status
    if status < 400 and isinstance(fields.code, int) and 400 <= fields.code <= 599:
        effective = fields.code   # an error event inside a 200 stream

    hit = _match_rules(fields.message)
    if hit is not None:
        return _failure_from_rule(hit, effective, fields, body_format)
    return _failure_by_status(effective, fields, body_format)


def _read_body(text: str, content_type: str | None, truncated: bool) -> tuple[_Fields | None, str]:
    stripped = text.strip()
    if not stripped:
        return None, "empty"
    ctype = (content_type or "").lower()
    if "html" in ctype or stripped[:1] == "<":
        return None, "html"
    try:
        data = json.loads(stripped)
    except (ValueError, RecursionError):
        if truncated or stripped[:1] in "{[\"":
            return None, "invalid_json"
        return None, "text"
    fields = _fields_from_json(data)
    return (fields, "json") if fields is not None else (None, "wrong_shape")


def _fields_from_json(data: Any) -> _Fields | None:
    """Read the error shapes engines use; None for any other shape."""
    if not isinstance(data, dict):
        return None
    err = data.get("error")
    if isinstance(err, dict):
        # OpenAI / vLLM / llama.cpp / OpenRouter: {"error": {"message", "type", "param", "code", ...}}
        msg = err.get("message")
        if msg is None and "detail" in err:
            msg = err.get("detail")
        if msg is None:
            return None
        fields = _Fields(
            message=_as_text(msg),
            type=_as_label(err.get("type")),
            param=_as_label(err.get("param")),
            code=_as_code(err.get("code")),
            n_prompt_tokens=_as_int(err.get("n_prompt_tokens")),
            n_ctx=_as_int(err.get("n_ctx")),
        )
        if fields.type == "exceed_context_size_error" or fields.n_ctx is not None:
            fields.engine = "llama.cpp"
        elif isinstance(fields.code, str) or fields.type in ("invalid_request_error", "server_error"):
            fields.engine = "openai-like"
        elif fields.type and fields.type.endswith("Error") and isinstance(fields.code, int):
            fields.engine = "vllm"   # vLLM names the type after the exception class
        elif fields.type == "Bad Request" and (fields.param or "").startswith("body"):
            fields.engine = "vllm"   # vLLM's pydantic validation answer
        return fields
    if isinstance(err, str):
        # TGI: {"error": "...", "error_type": "validation"}; vLLM's auth middleware: {"error": "Unauthorized"}
        fields = _Fields(message=err, type=_as_label(data.get("error_type")), code=_as_code(data.get("code")))
        if "error_type" in data:
            fields.engine = "tgi"
        return fields
    if "message" in data:
        # Older vLLM / FastChat / SGLang: {"object": "error", "message", "type", "param", "code"}
        fields = _Fields(
            message=_as_text(data.get("message")),
            type=_as_label(data.get("type")),
            param=_as_label(data.get("param")),
            code=_as_code(data.get("code")),
        )
        if data.get("object") == "error" and fields.type and fields.type.endswith("Error"):
            fields.engine = "vllm"
        return fields
    if "detail" in data:
        # FastAPI: {"detail": "Not Found"} or {"detail": [{"loc": [...], "msg": ..., "type": ...}]}
        return _fields_from_detail(data["detail"])
    return None


def _fields_from_detail(detail: Any) -> _Fields:
    if isinstance(detail, list):
        parts: list[str] = []
        param = None
        for item in detail[:20]:
            if isinstance(item, dict):
                loc = item.get("loc")
                where = ".".join(str(p) for p in loc) if isinstance(loc, (list, tuple)) else _as_text(loc)
                if param is None and where:
                    param = where
                parts.append(f"{where}: {_as_text(item.get('msg'))}" if where else _as_text(item.get("msg")))
            else:
                parts.append(_as_text(item))
        return _Fields(message="; ".join(parts), param=param)
    return _Fields(message=_as_text(detail))


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if value is None:
        return ""
    try:
        return json.dumps(value, ensure_ascii=False)[:MAX_MESSAGE_CHARS]
    except (TypeError, ValueError, RecursionError):
        return repr(value)[:MAX_MESSAGE_CHARS]


def _as_label(value: Any) -> str | None:
    return value[:200] if isinstance(value, str) else None


def _as_code(value: Any) -> str | int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if -10**9 < value < 10**9 else None
    if isinstance(value, str):
        return value[:200]
    return None


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if -10**15 < value < 10**15 else None


_TITLE_RE = re.compile(r"<title[^>]{0,100}>(.{0,300}?)</title>", re.I | re.S)
_TAG_RE = re.compile(r"<[^>]{0,1000}>")
_SPACE_RE = re.compile(r"\s+")


def _excerpt(text: str, body_format: str) -> str:
    if body_format == "empty":
        return "(empty body)"
    if body_format == "html":
        title = _TITLE_RE.search(text)
        shown = title.group(1) if title else _TAG_RE.sub(" ", text)
        shown = html.unescape(shown)
    else:
        shown = text
    shown = _SPACE_RE.sub(" ", shown).strip()
    return clip(shown, EXCERPT_CHARS)


# ---------------------------------------------------------------------------
# The wordings.  One rule per known text; the first that matches wins, so the
# specific variants come before the looser ones they contain.  Named groups:
# L max_model_len, n prompt tokens, q "at least " marker, M requested output,
# T total, C chars, X max chars, I max input tokens, O max output tokens,
# E estimated max model len, P param.  Quantifiers are bounded so a 64 KiB
# message cannot make a pattern backtrack for long.
# ---------------------------------------------------------------------------

_N = r"(\d[\d,]{0,20})"


def _g(name: str) -> str:
    return _N.replace("(", f"(?P<{name}>", 1)


@dataclass(frozen=True)
class _Rule:
    name: str
    kind: str
    engine: str | None   # None: take the engine the body's shape suggests
    pattern: re.Pattern[str]
    extra: Callable[[re.Match[str]], dict[str, Any]] | None = None


def _rule(name: str, kind: str, engine: str | None, pattern: str,
          extra: Callable[[re.Match[str]], dict[str, Any]] | None = None) -> _Rule:
    return _Rule(name, kind, engine, re.compile(pattern, re.I), extra)


def _openrouter_parts(m: re.Match[str]) -> dict[str, Any]:
    # "(102961 of text input, 10400 of tool input, 943718 in the output)"
    parts = m.group("parts")
    inputs = [_to_int(x) for x in re.findall(r"(\d[\d,]{0,20}) of [a-z ]{1,40}?input", parts, re.I)]
    output = re.search(r"(\d[\d,]{0,20}) in the output", parts, re.I)
    return {
        "prompt_tokens": sum(x for x in inputs if x is not None) if inputs else None,
        "requested_tokens": _to_int(output.group(1)) if output else None,
        "numbers_are_approximate": True,
    }


def _engine_dead(m: re.Match[str]) -> dict[str, Any]:
    return {"engine_dead": True}


def _kv_tokens(m: re.Match[str]) -> dict[str, Any]:
    return {"estimated_max_model_len": _to_int(m.group("K"))}


_CTX = r"maximum context length is " + _g("L") + r" tokens\.\s*However, "

_RULES: tuple[_Rule, ...] = (
    # --- vLLM, current renderer (0.2x-0.32) -------------------------------------------------
    # 0.32: the prompt alone; captures/c09*.
    _rule("vllm_prompt_alone", "prompt_too_long", "vllm",
          _CTX + r"your prompt contains (?P<q>at least )?" + _g("n") + r" input tokens, which exceeds this "
          r"limit even without any output tokens"),
    # token check; "at least" when vLLM stopped tokenizing at max_input + 1.
    _rule("vllm_token_check", "context_length", "vllm",
          _CTX + r"you requested " + _g("M") + r" output tokens and your prompt contains (?P<q>at least )?"
          + _g("n") + r" input tokens(?:, for a total of (?:at least )?" + _g("T") + r" tokens)?"),
    # character pre-check, with (older) or without (0.32) the output part; captures/c09d, c09e.
    _rule("vllm_char_check", "input_chars", "vllm",
          _CTX + r"(?:you requested " + _g("M") + r" output tokens and )?your prompt contains " + _g("C")
          + r" characters \(more than " + _g("X") + r" characters, which is the upper bound for " + _g("I")
          + r" input tokens\)"),
    # "max_tokens=2049 cannot be greater than max_model_len=2048", incl. the f-string slip
    # "max_tokens=2049cannot be greater than max_model_len=max_total_tokens=2048".
    _rule("vllm_max_tokens_gt_len", "max_tokens_too_large", "vllm",
          r"(?<![a-z_])(?P<P>[a-z_]{1,40})\s?=\s?(?P<M>\d[\d,]{0,20})\s{0,3}cannot be greater than [a-z_]{1,40}\s?=\s?"
          r"(?:[a-z_]{1,40}\s?=\s?)?" + _g("L")),
    # earlier renderer (params.py @1aa021e / 017638d).
    _rule("vllm_renderer_early", "context_length", "vllm",
          r"You passed " + _g("n") + r" input tokens and requested " + _g("M") + r" output tokens\.\s*However, "
          r"the model's context length is only " + _g("L") + r" tokens, resulting in a maximum input length of "
          + _g("I") + r" tokens"),
    # v0.10-v0.17 _validate_input.
    _rule("vllm_validate_input_prompt", "prompt_too_long", "vllm",
          _CTX + r"your request has " + _g("n") + r" input tokens"),
    _rule("vllm_validate_input_max_tokens", "context_length", "vllm",
          r"'max_tokens' or 'max_completion_tokens' is too large: " + _g("M") + r"\.\s*This model's maximum "
          r"context length is " + _g("L") + r" tokens and your request has " + _g("n") + r" input tokens"),
    # v0.5-era serving_engine.py; OpenAI's classic text is the same sentence (engine from the shape).
    _rule("total_messages_completion", "context_length", None,
          _CTX + r"you requested " + _g("T") + r" tokens \(" + _g("n") + r" in the messages, " + _g("M")
          + r" in the completion\)"),
    _rule("vllm_v05_messages", "prompt_too_long", "vllm",
          _CTX + r"you requested " + _g("n") + r" tokens in the (?:messages|input)"),
    # get_max_tokens fallback (PR #36789).
    _rule("vllm_input_length", "prompt_too_long", "vllm",
          r"Input length \(" + _g("n") + r"\) exceeds model's maximum context length \(" + _g("L") + r"\)"),
    # prompt == max_model_len leaves 0: "max_tokens must be at least 1, got 0."; captures/c10, c12.
    _rule("vllm_max_tokens_min", "max_tokens_invalid", "vllm",
          r"(?P<P>max_[a-z_]{0,20}tokens) must be at least 1, got (?P<M>-?\d{1,20})"),
    # --- OpenAI (newer chat wording, max_tokens cap) ---------------------------------------
    _rule("openai_messages_resulted", "prompt_too_long", "openai-like",
          _CTX + r"your messages resulted in " + _g("n") + r" tokens"),
    _rule("openai_max_tokens_cap", "max_tokens_too_large", "openai-like",
          r"(?P<P>max_[a-z_]{0,20}tokens) is too large: " + _g("M") + r"\.\s*This model supports at most "
          + _g("O") + r" completion tokens"),
    # --- OpenRouter --------------------------------------------------------------------------
    _rule("openrouter", "context_length", "openai-like",
          r"This endpoint's maximum context length is " + _g("L") + r" tokens\.\s*However, you requested about "
          + _g("T") + r" tokens \((?P<parts>[^)]{0,400})\)", _openrouter_parts),
    # --- SGLang (tokenizer_manager._validate_one_request, managers/utils.validate_input_length)
    _rule("sglang_input_longer", "prompt_too_long", "sglang",
          r"The input \(" + _g("n") + r" tokens\) is longer than the model's context length \(" + _g("L")
          + r" tokens\)"),
    _rule("sglang_total", "context_length", "sglang",
          r"Requested token count exceeds the model's maximum context length of " + _g("L") + r" tokens\.\s*"
          r"You requested a total of " + _g("T") + r" tokens: " + _g("n") + r" tokens from the input messages "
          r"and " + _g("M") + r" tokens for the completion"),
    _rule("sglang_max_req_input", "prompt_too_long", "sglang",
          r"Input length \(" + _g("n") + r" tokens\) exceeds the maximum allowed length \(" + _g("I")
          + r" tokens\)"),
    # --- TGI (router/src/validation.rs; HTTP 422) -----------------------------------------------
    _rule("tgi_total", "context_length", "tgi",
          r"`inputs` tokens \+ `max_new_tokens` must be <= " + _g("L") + r"\.\s*Given: " + _g("n")
          + r" `inputs` tokens and " + _g("M") + r" `max_new_tokens`"),
    _rule("tgi_inputs", "prompt_too_long", "tgi",
          r"`inputs` must have less than " + _g("I") + r" tokens\.\s*Given: " + _g("n")),
    _rule("tgi_truncate", "bad_request", "tgi",
          r"`truncate` must be strictly positive and less than " + _g("I") + r"\.\s*Given: (?P<V>-?\d{1,20})"),
    _rule("tgi_max_new_tokens", "max_tokens_too_large", "tgi",
          r"`max_new_tokens` must be <= " + _g("O") + r"(?:\.\s*Given: " + _g("M") + r")?"),
    # --- llama.cpp server ------------------------------------------------------------------------
    _rule("llamacpp_request_exceeds", "prompt_too_long", "llama.cpp",
          r"request \(" + _g("n") + r" tokens\) exceeds the available context size \(" + _g("L") + r" tokens\)"),
    _rule("llamacpp_input_larger", "prompt_too_long", "llama.cpp",
          r"input \(" + _g("n") + r" tokens\) is larger than the max context size \(" + _g("L") + r" tokens\)"),
    _rule("llamacpp_context_exceeded", "context_length", "llama.cpp", r"Context size has been exceeded"),
    _rule("llamacpp_loading", "not_ready", "llama.cpp", r"^\s*Loading model"),
    # --- vLLM start-up KV-cache errors (kv_cache_utils.py; "models's" is in some sources) -------
    _rule("vllm_kv_too_small", "kv_cache", "vllm",
          r"To serve at least one request with the models?'s max seq len \(" + _g("L") + r"\), \((?P<need>[\d.]{1,20}) "
          r"GiB KV cache is needed, which is larger than the available KV cache memory \((?P<avail>[\d.]{1,20}) "
          r"GiB\)\.\s*Based on the available memory, the estimated maximum model length is " + _g("E")),
    _rule("vllm_kv_v0", "kv_cache", "vllm",
          r"The model's max seq len \(" + _g("L") + r"\) is larger than the maximum number of tokens that can be "
          r"stored in KV cache \(" + _g("K") + r"\)", _kv_tokens),
    _rule("vllm_kv_none", "kv_cache", "vllm", r"No available memory for the cache blocks"),
    # --- engine died (vLLM EngineDeadError; V0 AsyncEngineDeadError) ------------------------------
    _rule("vllm_engine_dead", "not_ready", "vllm",
          r"EngineCore encountered an issue|EngineDeadError|Background loop has errored already|"
          r"Engine loop is not running", _engine_dead),
)

# Loose fallbacks for a length error in a wording not listed above.
_GENERIC_CONTEXT_RE = re.compile(
    r"context (?:length|window|size)|max_model_len|too many tokens|prompt is too long", re.I)
_GENERIC_EXCEED_RE = re.compile(r"exceed|too long|longer than|larger than|greater than|maximum|reduce", re.I)
_GENERIC_LIMIT_RE = re.compile(r"(?:maximum context length|context (?:length|window|size)) (?:is|of) "
                               r"(\d[\d,]{0,20})", re.I)
_PARAM_SUFFIX_RE = re.compile(r"\(parameter=(?P<p>[A-Za-z_.]{1,80}), value=(?P<v>[^)]{0,80})\)")
_PYDANTIC_LOC_RE = re.compile(r"'loc': (?:'(?P<dotted>[\w.]{1,100})'|\((?P<tuple>[^)]{1,200})\))")


def _match_rules(message: str) -> tuple[_Rule, re.Match[str]] | None:
    head = message[:MAX_RULE_CHARS]
    for rule in _RULES:
        m = rule.pattern.search(head)
        if m is not None:
            return rule, m
    return None


def _to_int(text: str | None) -> int | None:
    if text is None:
        return None
    digits = text.replace(",", "")
    if not digits or len(digits) > 18:
        return None
    try:
        return int(digits)
    except ValueError:
        return None


def _failure_from_rule(hit: tuple[_Rule, re.Match[str]], status: int, fields: _Fields,
                       body_format: str) -> UpstreamFailure:
    rule, m = hit
    groups = m.groupdict()
    nums: dict[str, Any] = {
        "max_model_len": _to_int(groups.get("L")),
        "prompt_tokens": _to_int(groups.get("n")),
        "prompt_tokens_is_lower_bound": bool(groups.get("q")),
        "requested_tokens": _to_int(groups.get("M")),
        "total_tokens": _to_int(groups.get("T")),
        "chars": _to_int(groups.get("C")),
        "max_chars": _to_int(groups.get("X")),
        "max_input_tokens": _to_int(groups.get("I")),
        "max_output_tokens": _to_int(groups.get("O")),
        "estimated_max_model_len": _to_int(groups.get("E")),
    }
    if rule.extra is not None:
        nums.update({k: v for k, v in rule.extra(m).items() if v is not None})
    # llama.cpp sends the numbers as fields too; they are authoritative.
    if fields.n_prompt_tokens is not None:
        nums["prompt_tokens"] = fields.n_prompt_tokens
    if fields.n_ctx is not None:
        nums["max_model_len"] = fields.n_ctx

    kind = rule.kind
    n, limit = nums["prompt_tokens"], nums["max_model_len"]
    if kind == "context_length" and n is not None and limit is not None and n >= limit:
        kind = "prompt_too_long"   # no completion limit can make this fit

    param = _param(fields, groups.get("P"), rule.name)
    engine = rule.engine or fields.engine or ("vllm" if fields.type == "BadRequestError" else "openai-like")
    return UpstreamFailure(
        kind=kind,
        status=status,
        message=clip(fields.message, MAX_MESSAGE_CHARS),
        engine=engine,
        param=param,
        upstream_type=fields.type,
        upstream_code=fields.code,
        body_format=body_format,
        **nums,
    )


def _param(fields: _Fields, from_text: str | None, rule_name: str) -> str | None:
    if fields.param:
        param = fields.param
    elif from_text:
        param = from_text
    elif (suffix := _PARAM_SUFFIX_RE.search(fields.message)) is not None:
        param = suffix.group("p")
    elif rule_name == "tgi_truncate":
        param = "truncate"
    elif rule_name.startswith("tgi_") and "max_new_tokens" in rule_name:
        param = "max_new_tokens"
    else:
        return None
    return param[5:] if param.startswith("body.") else param


def _failure_by_status(status: int, fields: _Fields, body_format: str) -> UpstreamFailure:
    message = fields.message
    kind: str
    if (fields.code == "context_length_exceeded" or fields.type == "exceed_context_size_error"
            or (_GENERIC_CONTEXT_RE.search(message) and _GENERIC_EXCEED_RE.search(message)
                and 400 <= status < 500)):
        limit = _GENERIC_LIMIT_RE.search(message)
        return UpstreamFailure(
            kind="context_length", status=status, message=clip(message, MAX_MESSAGE_CHARS),
            engine=fields.engine or "openai-like",
            max_model_len=fields.n_ctx if fields.n_ctx is not None else (_to_int(limit.group(1)) if limit else None),
            prompt_tokens=fields.n_prompt_tokens, param=_param(fields, None, ""),
            upstream_type=fields.type, upstream_code=fields.code, body_format=body_format,
        )
    if status == 404:
        kind = "not_found"
    elif status == 503:
        kind = "not_ready"
    elif status >= 500:
        kind = "server_error"
    elif status >= 400:
        kind = "bad_request"
    else:
        kind = "server_error"   # an error object with no usable status: the upstream failed somehow
    param = _param(fields, None, "")
    if param is None and kind == "bad_request":
        loc = _PYDANTIC_LOC_RE.search(message)
        if loc is not None:
            if loc.group("dotted"):
                param = loc.group("dotted")
            else:
                param = ".".join(p.strip(" '\"") for p in loc.group("tuple").split(",") if p.strip(" '\""))
            param = param[5:] if param.startswith("body.") else param
    return UpstreamFailure(
        kind=kind, status=status, message=clip(message, MAX_MESSAGE_CHARS), engine=fields.engine, param=param,
        upstream_type=fields.type, upstream_code=fields.code, body_format=body_format,
    )


# ---------------------------------------------------------------------------
# Retrying: which failures a smaller completion limit can fix
# ---------------------------------------------------------------------------

def is_length_failure(f: UpstreamFailure) -> bool:
    """True when one retry with a corrected completion limit can succeed.

    That is prompt + output over the context, or the output alone over it, or
    vLLM's character pre-check when it counted output tokens against the bound.
    A prompt that alone fills the context ("prompt_too_long") is *not* one: no
    completion limit makes it fit, and retrying only costs a round trip.
    """
    if f.kind in ("context_length", "max_tokens_too_large"):
        return True
    return f.kind == "input_chars" and (f.requested_tokens or 0) > 0


def corrected_max_tokens(f: UpstreamFailure, *, prompt_tokens: int | None = None,
                         max_model_len: int | None = None) -> int | None:
    """The completion limit to retry with, from the upstream's figures and headroom's.

    The upstream's limit wins over headroom's (it is what it enforces); for the
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


# ---------------------------------------------------------------------------
# Explaining: UpstreamFailure → HeadroomError the client sees
# ---------------------------------------------------------------------------

def explain_upstream_error(
    failure: UpstreamFailure,
    *,
    upstream: str,
    prompt_tokens: int | None = None,
    max_model_len: int | None = None,
    requested_max_tokens: int | None = None,
    granted_max_tokens: int | None = None,
    prompt_param: str = "messages",
    max_tokens_param: str | None = None,
) -> HeadroomError:
    """Turn an upstream failure into the error the client receives.

    `prompt_tokens`, `max_model_len`, `requested_max_tokens` (the client's ask)
    and `granted_max_tokens` (what headroom forwarded) are headroom's own exact
    figures when it counted the request; they take precedence over the
    upstream's, which may be a lower bound.  `prompt_param` is "messages" for
    chat and "prompt" for completions; `max_tokens_param` is the field the
    client used ("max_tokens" or "max_completion_tokens").
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
    )
    explain = _EXPLAINERS.get(failure.kind, _explain_server_error)
    error = explain(ctx)
    # Every explanation carries the upstream's own words and figures.
    error.details = {**_upstream_details(ctx), **error.details}
    return error


@dataclass
class _Context:
    failure: UpstreamFailure
    upstream: str
    prompt_tokens: int | None
    max_model_len: int | None
    requested: int | None
    granted: int | None
    prompt_param: str
    max_tokens_param: str | None

    @property
    def who(self) -> str:
        """'the upstream vLLM at http://…' — who said no."""
        name = _ENGINE_NAMES.get(self.failure.engine or "", "")
        return f"the upstream {name} at {self.upstream}" if name else f"the upstream {self.upstream}"

    @property
    def limit(self) -> int | None:
        """The context size: the upstream's stated figure (it is the one enforced), else headroom's."""
        return self.failure.max_model_len if self.failure.max_model_len is not None else self.max_model_len

    @property
    def exact_prompt(self) -> int | None:
        """An exact prompt count: headroom's, else the upstream's if it is not a lower bound."""
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
        """Completion tokens the upstream was asked for: what headroom forwarded, else the client's value."""
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
        "upstream": ctx.upstream,
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


def _headroom_numbers(ctx: _Context) -> dict[str, Any]:
    numbers = {
        "prompt_tokens": ctx.prompt_tokens,
        "max_model_len": ctx.limit,
        "requested_max_tokens": ctx.requested,
        "granted_max_tokens": ctx.granted,
    }
    return {k: v for k, v in numbers.items() if v is not None}


def _length_error(ctx: _Context, message: str, param: str | None, **numbers: Any) -> HeadroomError:
    return HeadroomError(
        400, message, code="context_length_exceeded", param=param,
        details={**_headroom_numbers(ctx), **{k: v for k, v in numbers.items() if v is not None}},
    )


def _prompt_over(ctx: _Context, n: int, limit: int, note: str = "") -> HeadroomError:
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
        tokens_to_remove=cut,
        tokens_to_remove_for_requested=cut_for_asked,
    )


def _over_total(ctx: _Context, n: int, limit: int, asked: int) -> HeadroomError:
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
        available_completion_tokens=room,
        tokens_over=over,
    )


def _ran_out(ctx: _Context, n: int, limit: int) -> HeadroomError:
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


def _counts_disagree(ctx: _Context, n: int, limit: int, what: str) -> HeadroomError:
    """headroom's numbers say it fits, the upstream's say no: a tokenizer/template or limit mismatch."""
    f = ctx.failure
    theirs = ""
    if f.prompt_tokens is not None and f.prompt_tokens_is_lower_bound:
        # Never "at least" next to headroom's exact count: say where the upstream stopped.
        theirs = f" The upstream stopped counting the prompt at {f.prompt_tokens} tokens, past its limit."
    elif f.prompt_tokens is not None:
        theirs = f" The upstream counted {f.prompt_tokens} prompt tokens."
    elif f.kind == "max_tokens_invalid" and f.requested_tokens is not None and f.requested_tokens <= 0:
        theirs = (f" The upstream left {f.requested_tokens} tokens for the output, so by its count the prompt "
                  f"is {limit - f.requested_tokens} tokens.")
    sent = ctx.granted if ctx.granted is not None else ctx.requested
    sent_text = f" and {sent} completion tokens" if sent is not None else ""
    if ctx.max_model_len is not None and ctx.max_model_len != limit:
        theirs += f" Its context length is {limit} tokens, while headroom knows it as {ctx.max_model_len}."
    return _length_error(
        ctx,
        f"The request does not fit {what}, although headroom counted {n} prompt tokens{sent_text} against a "
        f"context length of {limit} tokens.{theirs} headroom's tokenizer or chat template for this model, or "
        f"its max_model_len, does not match the upstream's; shorten the prompt or request fewer completion "
        f"tokens, and tell the operator.{ctx.source()}",
        ctx.prompt_param,
        counts_disagree=True,
    )


def _explain_length(ctx: _Context) -> HeadroomError:
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
                ctx.prompt_param, tokens_to_remove_at_least=max(low - limit + 1, 1),
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


def _explain_max_tokens_too_large(ctx: _Context) -> HeadroomError:
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


def _explain_max_tokens_invalid(ctx: _Context) -> HeadroomError:
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
        if limit is not None:
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
    return HeadroomError(
        400,
        f"Invalid value for '{param}': it must be at least 1"
        + (f" (got {got})." if got is not None else ".") + ctx.source(),
        code="invalid_value",
        param=param,
    )


def _explain_input_chars(ctx: _Context) -> HeadroomError:
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


def _explain_kv_cache(ctx: _Context) -> HeadroomError:
    f = ctx.failure
    est = f.estimated_max_model_len
    fix = (f"restart it with --max-model-len {est} or less, or give it more memory (--gpu-memory-utilization)"
           if est is not None else
           "restart it with a smaller --max-model-len or a higher --gpu-memory-utilization")
    limit_text = f" of {f.max_model_len} tokens" if f.max_model_len is not None else ""
    return HeadroomError(
        502,
        f"{_cap(ctx.who)} cannot hold one request of its max_model_len{limit_text} in its KV cache: "
        f"{_quote(f.message)}. The operator must {fix}.",
        code="upstream_kv_cache",
    )


def _explain_bad_request(ctx: _Context) -> HeadroomError:
    f = ctx.failure
    status = 400 if f.status in (400, 422) or not 400 <= f.status < 500 else f.status
    tgi = (" (TGI answers HTTP 422 for invalid requests; headroom reports it as 400.)"
           if f.status == 422 and f.engine == "tgi" else "")
    what = "rejected the request" if f.status != 401 else "refused the request as unauthorized"
    message = f"{_cap(ctx.who)} {what} (HTTP {f.status}): {f.message}{tgi}"
    if f.status == 401:
        message += (" vLLM started with --api-key expects 'Authorization: Bearer <key>'; check the key the "
                    "client or headroom sends upstream.")
    return HeadroomError(status, message, code="upstream_bad_request", param=f.param)


def _explain_not_found(ctx: _Context) -> HeadroomError:
    f = ctx.failure
    if "model" in f.message.lower():
        # Same fields as vLLM's own answer (and errors.model_not_found): the message is kept as is.
        return HeadroomError(404, f.message, code=404, param="model", type="NotFoundError")
    return HeadroomError(
        404,
        f"{_cap(ctx.who)} has no such route (HTTP 404: {f.message or 'Not Found'}). Check that it is an "
        f"OpenAI-compatible server and that headroom's upstream URL is right.",
        code="upstream_not_found",
    )


def _explain_not_ready(ctx: _Context) -> HeadroomError:
    f = ctx.failure
    if f.engine_dead:
        return HeadroomError(
            503,
            f"{_cap(ctx.who)} reports that its engine died (HTTP {f.status}: {f.message}). vLLM shuts its API "
            f"server down after that; it must be restarted, and loading weights takes tens of seconds to "
            f"minutes. Its log names the root cause. Retry later.",
            code="upstream_engine_dead",
            headers={"Retry-After": "30"},
        )
    return upstream_not_ready(ctx.upstream, f.status, f.message or "no message")


def _explain_server_error(ctx: _Context) -> HeadroomError:
    f = ctx.failure
    return HeadroomError(
        502,
        f"{_cap(ctx.who)} failed with HTTP {f.status}: {f.message}. This is a fault of the upstream server, "
        f"not of the request; its log has the cause.",
        code="upstream_error",
    )


_FORMAT_NAMES = {
    "html": "an HTML page",
    "empty": "an empty body",
    "invalid_json": "invalid JSON",
    "wrong_shape": "JSON that is not an error object",
    "text": "plain text",
}


def _explain_unparseable(ctx: _Context) -> HeadroomError:
    f = ctx.failure
    what = _FORMAT_NAMES.get(f.body_format, "an unreadable body")
    client_side = 400 <= f.status < 500
    status = (400 if f.status == 422 else f.status) if client_side else 502
    return HeadroomError(
        status,
        f"{_cap(ctx.who)} answered HTTP {f.status} with {what} instead of an OpenAI-style error: "
        f"{_quote(f.message)}." + ("" if client_side else " Is something other than the model server (a reverse "
                                    "proxy, a load balancer) answering at that address?"),
        code="upstream_error",
    )


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False) if text else '""'


def _tokens(count: int) -> str:
    return f"{count} token" if count == 1 else f"{count} tokens"


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


_EXPLAINERS: dict[str, Callable[[_Context], HeadroomError]] = {
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
