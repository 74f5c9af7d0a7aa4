"""Upstream error bodies → `UpstreamFailure`: what the upstream said, as data.

vLLM, SGLang, TGI and llama.cpp each word a context-length rejection their own
way, and vLLM alone has changed its wording half a dozen times (every known
text, with its source, is in docs/vllm-behaviour.md "Upstream error texts"; the
verbatim 0.32.0 responses are the captures the fake vLLM replays).
`parse_upstream_error(status, body, content_type)` turns any error body into
one `UpstreamFailure` (kind + the numbers the text carries); it is pure and
never raises, whatever the bytes: an unknown shape becomes kind "unparseable"
with an excerpt.  `proxy.upstream.explain` turns
the failure into the error the client sees.
"""

from __future__ import annotations

import html
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.errors import clip

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
            message=f"(brimful could not parse the upstream error body: {type(exc).__name__})",
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
    # "max_tokens=2049cannot be greater than max_model_len=max_total_tokens=2048"; a limit
    # field only (max_*), not "truncate_prompt_tokens=4097 cannot be greater than ...".
    _rule("vllm_max_tokens_gt_len", "max_tokens_too_large", "vllm",
          r"(?<![a-z_])(?P<P>max_[a-z_]{1,36})\s?=\s?(?P<M>\d[\d,]{0,20})\s{0,3}"
          r"cannot be greater than [a-z_]{1,40}\s?=\s?(?:[a-z_]{1,40}\s?=\s?)?" + _g("L")),
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
_TRUNCATION_PARAMS = ("truncate_prompt_tokens",)
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
    # vLLM's "truncate_prompt_tokens=4097 cannot be greater than max_model_len = 4096" names
    # the length but is a bad value of that field: relayed as vLLM words it.
    bad_truncation = _param(fields, None, "") in _TRUNCATION_PARAMS
    if (fields.code == "context_length_exceeded" or fields.type == "exceed_context_size_error"
            or (_GENERIC_CONTEXT_RE.search(message) and _GENERIC_EXCEED_RE.search(message)
                and 400 <= status < 500 and not bad_truncation)):
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
