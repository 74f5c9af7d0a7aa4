"""Upstream error mapping: every known wording, every real vLLM capture, the explanations, robustness."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.admitted.admission import corrected_max_tokens
from proxy.errors import BrimfulError
from proxy.upstream.explain import explain_upstream_error
from proxy.upstream.failure import (
    KINDS,
    MAX_PARSE_BYTES,
    UpstreamFailure,
    is_length_failure,
    parse_upstream_error,
)

try:  # openai >= 3 talks through httpx2; older releases through httpx
    import httpx2 as openai_httpx
except ImportError:  # pragma: no cover - depends on the installed openai
    import httpx as openai_httpx

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
CAPTURES = SHARED / "vllm" / "captures"
UPSTREAM = "http://127.0.0.1:8000"


# ---------------------------------------------------------------------------
# Body builders: the shapes each engine wraps its message in
# ---------------------------------------------------------------------------

def vllm(message: str, param: str | None = None, status: int = 400) -> bytes:
    """vLLM >= 0.6: {"error": {...}} with the exception class as type."""
    return json.dumps({"error": {"message": message, "type": "BadRequestError", "param": param,
                                 "code": status}}).encode()


def vllm_old(message: str) -> bytes:
    """Older vLLM / FastChat / SGLang: a flat object with "object": "error"."""
    return json.dumps({"object": "error", "message": message, "type": "BadRequestError", "param": None,
                       "code": 400}).encode()


def tgi(message: str) -> bytes:
    return json.dumps({"error": message, "error_type": "validation"}).encode()


def openai_like(message: str, code: Any = "context_length_exceeded", param: str | None = "messages") -> bytes:
    return json.dumps({"error": {"message": message, "type": "invalid_request_error", "param": param,
                                 "code": code}}).encode()


def parse(status: int, body: bytes, ctype: str | None = "application/json") -> UpstreamFailure:
    return parse_upstream_error(status, body, ctype)


# ---------------------------------------------------------------------------
# Every wording of docs/vllm-behaviour.md "Upstream error texts", with concrete numbers
# ---------------------------------------------------------------------------

SUFFIX = " (parameter=input_tokens, value={n})"
WORDINGS: list[tuple[str, int, bytes, dict[str, Any]]] = [
    # vLLM current renderer, token check: exact count
    ("vllm_renderer_exact", 400, vllm(
        "This model's maximum context length is 8192 tokens. However, you requested 4000 output tokens and your "
        "prompt contains 6000 input tokens, for a total of 10000 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens."),
     dict(kind="context_length", engine="vllm", max_model_len=8192, prompt_tokens=6000, requested_tokens=4000,
          total_tokens=10000, prompt_tokens_is_lower_bound=False)),
    # ... "at least" (count == max_input + 1) and the (parameter=..., value=...) suffix
    ("vllm_renderer_at_least_suffix", 400, vllm(
        "This model's maximum context length is 8192 tokens. However, you requested 4000 output tokens and your "
        "prompt contains at least 4193 input tokens, for a total of at least 8193 tokens. Please reduce the length "
        "of the input prompt or the number of requested output tokens." + SUFFIX.format(n=4193), "input_tokens"),
     dict(kind="context_length", max_model_len=8192, prompt_tokens=4193, prompt_tokens_is_lower_bound=True,
          requested_tokens=4000, total_tokens=8193, param="input_tokens")),
    # ... the same wording when the prompt alone is over: reclassified
    ("vllm_renderer_prompt_alone_exact", 400, vllm(
        "This model's maximum context length is 4096 tokens. However, you requested 16 output tokens and your "
        "prompt contains 5000 input tokens, for a total of 5016 tokens. Please reduce the length of the input "
        "prompt or the number of requested output tokens."),
     dict(kind="prompt_too_long", max_model_len=4096, prompt_tokens=5000, requested_tokens=16)),
    # 0.32: prompt alone, "which exceeds this limit even without any output tokens"
    ("vllm_032_prompt_alone", 400, vllm(
        "This model's maximum context length is 4096 tokens. However, your prompt contains at least 4097 input "
        "tokens, which exceeds this limit even without any output tokens. Please reduce the length of the input "
        "prompt." + SUFFIX.format(n=4097), "input_tokens"),
     dict(kind="prompt_too_long", max_model_len=4096, prompt_tokens=4097, prompt_tokens_is_lower_bound=True)),
    # character pre-check with the output part (0.30 wording, upper bound for 0 input tokens)
    ("vllm_char_check_with_output", 400, vllm(
        "This model's maximum context length is 32768 tokens. However, you requested 32768 output tokens and "
        "your prompt contains 31800 characters (more than 0 characters, which is the upper bound for 0 input "
        "tokens). Please reduce the length of the input prompt or the number of requested output tokens. "
        "(parameter=input_text, value=31800)", "input_text"),
     dict(kind="input_chars", max_model_len=32768, requested_tokens=32768, chars=31800, max_chars=0,
          max_input_tokens=0, param="input_text")),
    # character pre-check, 0.32 wording
    ("vllm_char_check_032", 400, vllm(
        "This model's maximum context length is 2048 tokens. However, your prompt contains 300050 characters "
        "(more than 262144 characters, which is the upper bound for 2048 input tokens). Please reduce the length "
        "of the input prompt. (parameter=input_text, value=300050)", "input_text"),
     dict(kind="input_chars", max_model_len=2048, chars=300050, max_chars=262144, max_input_tokens=2048,
          requested_tokens=None)),
    # max_tokens alone > max_model_len
    ("vllm_max_tokens_gt", 400, vllm(
        "max_tokens=2049 cannot be greater than max_model_len=2048. Please request fewer output tokens. "
        "(parameter=max_tokens, value=2049)", "max_tokens"),
     dict(kind="max_tokens_too_large", max_model_len=2048, requested_tokens=2049, param="max_tokens")),
    # ... the odd f-string "=max_total_tokens=" form, no space before "cannot", no JSON param
    ("vllm_max_tokens_gt_fstring", 400, vllm(
        "max_completion_tokens=5000cannot be greater than max_model_len=max_total_tokens=4096. Please request "
        "fewer output tokens."),
     dict(kind="max_tokens_too_large", max_model_len=4096, requested_tokens=5000, param="max_completion_tokens")),
    # earlier renderer
    ("vllm_renderer_early", 400, vllm(
        "You passed 3000 input tokens and requested 1500 output tokens. However, the model's context length is "
        "only 4096 tokens, resulting in a maximum input length of 2596 tokens. Please reduce the length of the "
        "input prompt."),
     dict(kind="context_length", max_model_len=4096, prompt_tokens=3000, requested_tokens=1500,
          max_input_tokens=2596)),
    ("vllm_renderer_early_prompt_over", 400, vllm(
        "You passed 5000 input tokens and requested 16 output tokens. However, the model's context length is "
        "only 4096 tokens, resulting in a maximum input length of 4080 tokens. Please reduce the length of the "
        "input prompt."),
     dict(kind="prompt_too_long", max_model_len=4096, prompt_tokens=5000, requested_tokens=16)),
    # v0.10 - v0.17 _validate_input, both messages
    ("vllm_validate_input_prompt", 400, vllm(
        "This model's maximum context length is 4096 tokens. However, your request has 5000 input tokens. "
        "Please reduce the length of the input messages."),
     dict(kind="prompt_too_long", max_model_len=4096, prompt_tokens=5000)),
    ("vllm_validate_input_max_tokens", 400, vllm(
        "'max_tokens' or 'max_completion_tokens' is too large: 3000. This model's maximum context length is "
        "4096 tokens and your request has 2000 input tokens (3000 > 4096 - 2000)."),
     dict(kind="context_length", max_model_len=4096, prompt_tokens=2000, requested_tokens=3000)),
    # v0.5-era, both messages (flat "object": "error" body of that time)
    ("vllm_v05_total", 400, vllm_old(
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (3000 in the "
        "messages, 2000 in the completion). Please reduce the length of the messages or completion."),
     dict(kind="context_length", engine="vllm", max_model_len=4096, total_tokens=5000, prompt_tokens=3000,
          requested_tokens=2000)),
    ("vllm_v05_messages", 400, vllm_old(
        "This model's maximum context length is 4096 tokens. However, you requested 5000 tokens in the "
        "messages, Please reduce the length of the messages."),
     dict(kind="prompt_too_long", engine="vllm", max_model_len=4096, prompt_tokens=5000)),
    # get_max_tokens fallback
    ("vllm_input_length", 400, vllm("Input length (9000) exceeds model's maximum context length (8192)."),
     dict(kind="prompt_too_long", max_model_len=8192, prompt_tokens=9000)),
    # the message PR #36789 replaced, and 0.32's prompt == max_model_len answer
    ("vllm_max_tokens_min_negative", 400, vllm("max_tokens must be at least 1, got -7584."),
     dict(kind="max_tokens_invalid", requested_tokens=-7584, param="max_tokens")),
    ("vllm_max_tokens_min_zero", 400, vllm(
        "max_tokens must be at least 1, got 0. (parameter=max_tokens, value=0)", "max_tokens"),
     dict(kind="max_tokens_invalid", requested_tokens=0, param="max_tokens")),
    # SGLang, three
    ("sglang_input_longer", 400, vllm_old(
        "The input (5000 tokens) is longer than the model's context length (4096 tokens)."),
     dict(kind="prompt_too_long", engine="sglang", max_model_len=4096, prompt_tokens=5000)),
    ("sglang_total", 400, vllm_old(
        "Requested token count exceeds the model's maximum context length of 4096 tokens. You requested a total "
        "of 5000 tokens: 3000 tokens from the input messages and 2000 tokens for the completion. Please reduce "
        "the number of tokens in the input messages or the completion to fit within the limit."),
     dict(kind="context_length", engine="sglang", max_model_len=4096, total_tokens=5000, prompt_tokens=3000,
          requested_tokens=2000)),
    ("sglang_max_req_input", 400, vllm_old(
        "Input length (5000 tokens) exceeds the maximum allowed length (4000 tokens). Use a shorter input or "
        "enable --allow-auto-truncate."),
     dict(kind="prompt_too_long", engine="sglang", prompt_tokens=5000, max_input_tokens=4000, max_model_len=None)),
    # TGI, four (HTTP 422)
    ("tgi_total", 422, tgi(
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. Given: 3000 `inputs` tokens "
        "and 2000 `max_new_tokens`"),
     dict(kind="context_length", engine="tgi", status=422, max_model_len=4096, prompt_tokens=3000,
          requested_tokens=2000, upstream_type="validation")),
    ("tgi_inputs", 422, tgi("Input validation error: `inputs` must have less than 4000 tokens. Given: 5000"),
     dict(kind="prompt_too_long", engine="tgi", max_input_tokens=4000, prompt_tokens=5000)),
    ("tgi_truncate", 422, tgi(
        "Input validation error: `truncate` must be strictly positive and less than 4000. Given: 5000"),
     dict(kind="bad_request", engine="tgi", max_input_tokens=4000, param="truncate")),
    ("tgi_max_new_tokens", 422, tgi("Input validation error: `max_new_tokens` must be <= 96. Given: 200"),
     dict(kind="max_tokens_too_large", engine="tgi", max_output_tokens=96, requested_tokens=200,
          param="max_new_tokens")),
    # llama.cpp: the 400 with numbers beside the message, the 500, the older wording
    ("llamacpp_exceed_context", 400, json.dumps({"error": {
        "code": 400, "message": "request (4390 tokens) exceeds the available context size (4096 tokens), try "
        "increasing it", "type": "exceed_context_size_error", "n_prompt_tokens": 4390, "n_ctx": 4096}}).encode(),
     dict(kind="prompt_too_long", engine="llama.cpp", prompt_tokens=4390, max_model_len=4096,
          upstream_type="exceed_context_size_error")),
    ("llamacpp_context_exceeded_500", 500, json.dumps({"error": {
        "code": 500, "message": "Context size has been exceeded.", "type": "server_error"}}).encode(),
     dict(kind="context_length", engine="llama.cpp", status=500)),
    ("llamacpp_input_larger", 400, json.dumps({"error": {
        "code": 400, "message": "input (5000 tokens) is larger than the max context size (4096 tokens). skipping",
        "type": "invalid_request_error"}}).encode(),
     dict(kind="prompt_too_long", engine="llama.cpp", prompt_tokens=5000, max_model_len=4096)),
    # OpenRouter: text + tool input, output, "about"
    ("openrouter", 400, json.dumps({"error": {"message": (
        "This endpoint's maximum context length is 1048576 tokens. However, you requested about 1057079 tokens "
        "(102961 of text input, 10400 of tool input, 943718 in the output). Please reduce the length of either "
        "one, or use the \"middle-out\" transform to compress your prompt automatically."), "code": 400}}).encode(),
     dict(kind="context_length", engine="openai-like", max_model_len=1048576, total_tokens=1057079,
          prompt_tokens=113361, requested_tokens=943718, numbers_are_approximate=True)),
    # OpenAI classic
    ("openai_classic", 400, openai_like(
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (5000 in the "
        "messages, 4000 in the completion). Please reduce the length of the messages or completion."),
     dict(kind="context_length", engine="openai-like", max_model_len=8192, total_tokens=9000, prompt_tokens=5000,
          requested_tokens=4000, upstream_code="context_length_exceeded", param="messages")),
    # vLLM start-up KV-cache errors, as a supervisor might relay them
    ("vllm_kv_too_small", 500, vllm(
        "To serve at least one request with the models's max seq len (4096), (0.5 GiB KV cache is needed, which "
        "is larger than the available KV cache memory (0.45 GiB). Based on the available memory, the estimated "
        "maximum model length is 3664. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` "
        "when initializing the engine.", status=500),
     dict(kind="kv_cache", max_model_len=4096, estimated_max_model_len=3664)),
    ("vllm_kv_v0", 500, vllm(
        "The model's max seq len (4096) is larger than the maximum number of tokens that can be stored in KV "
        "cache (3664). Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing "
        "the engine.", status=500),
     dict(kind="kv_cache", max_model_len=4096, estimated_max_model_len=3664)),
    ("vllm_kv_none", 500, vllm(
        "No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
        "the engine.", status=500),
     dict(kind="kv_cache")),
]


@pytest.mark.parametrize("status,body,expected", [w[1:] for w in WORDINGS], ids=[w[0] for w in WORDINGS])
def test_every_known_wording_parses_to_its_kind_and_numbers(status, body, expected):
    failure = parse(status, body)
    for field_name, value in expected.items():
        assert getattr(failure, field_name) == value, field_name
    assert failure.message  # the upstream's own text is kept


def test_the_kv_cache_capture_line_parses():
    """captures/f1: the start-up error vLLM 0.32 logged, spelled "model's", relayed as a 500 body."""
    line = next(text for text in (CAPTURES / "f1_kv_cache_too_small.txt").read_text().splitlines()
                if text.startswith("ValueError: To serve"))
    failure = parse(500, vllm(line.removeprefix("ValueError: "), status=500))
    assert (failure.kind, failure.max_model_len, failure.estimated_max_model_len) == ("kv_cache", 2048, 384)


# ---------------------------------------------------------------------------
# Other body shapes
# ---------------------------------------------------------------------------

def test_vllm_pydantic_400_keeps_the_field_without_body_prefix():
    body = json.dumps({"error": {
        "message": "1 validation error:\n  {'type': 'int_parsing', 'loc': 'body.max_tokens', 'msg': 'Input should "
                   "be a valid integer, unable to parse string as an integer', 'input': 'abc'}",
        "type": "Bad Request", "param": "body.max_tokens", "code": 400}}).encode()
    failure = parse(400, body)
    assert (failure.kind, failure.engine, failure.param) == ("bad_request", "vllm", "max_tokens")


def test_pydantic_message_without_param_still_names_the_field():
    body = vllm_old("1 validation error:\n"
                    "  [{'type': 'missing', 'loc': ('body', 'messages'), 'msg': 'Field required'}]")
    assert parse(400, body).param == "messages"


def test_fastapi_detail_string_and_list():
    assert parse(404, b'{"detail": "Not Found"}').kind == "not_found"
    detail = {"detail": [{"loc": ["body", "max_tokens"], "msg": "Input should be a valid integer", "type": "x"},
                         {"loc": ["body", "n"], "msg": "bad", "type": "y"}]}
    failure = parse(422, json.dumps(detail).encode())
    assert failure.kind == "bad_request"
    assert failure.param == "max_tokens"
    assert "body.max_tokens: Input should be a valid integer" in failure.message and "body.n: bad" in failure.message


def test_string_error_and_bare_message_shapes():
    unauthorized = parse(401, b'{"error": "Unauthorized"}')
    assert (unauthorized.kind, unauthorized.message) == ("bad_request", "Unauthorized")
    bare = parse(400, b'{"message": "This model\'s maximum context length is 100 tokens. However, your request '
                      b'has 150 input tokens. Please reduce the length of the input messages."}')
    assert (bare.kind, bare.prompt_tokens, bare.max_model_len) == ("prompt_too_long", 150, 100)
    flat = parse(400, vllm_old("Token id 999999 is out of vocabulary"))
    assert (flat.kind, flat.engine, flat.message) == ("bad_request", "vllm", "Token id 999999 is out of vocabulary")


def test_error_event_inside_a_200_stream_takes_the_status_from_its_code():
    """vLLM reports a failure after the stream started as data: {"error": {..., "code": 400}}."""
    failure = parse(200, vllm("max_tokens=4096 cannot be greater than max_model_len=2048."))
    assert (failure.kind, failure.status) == ("max_tokens_too_large", 400)


def test_unknown_length_wording_falls_back_on_code_and_context_words():
    failure = parse(400, openai_like("Your input exceeds the context window of this model.", param=None))
    assert failure.kind == "context_length"
    generic = parse(400, vllm("Prompt is too long for the maximum context length of 1024 tokens"))
    assert (generic.kind, generic.max_model_len) == ("context_length", 1024)


def test_non_json_bodies_by_status():
    html = b"<html><head><title>502 Bad Gateway</title></head><body><h1>502 Bad Gateway</h1>nginx</body></html>"
    f = parse(502, html, "text/html")
    assert (f.kind, f.body_format, f.message) == ("unparseable", "html", "502 Bad Gateway")
    assert parse(500, b"", None).body_format == "empty"
    assert parse(500, b'{"error": {"message": ', None).body_format == "invalid_json"
    assert parse(500, b"[1, 2, 3]").body_format == "wrong_shape"
    assert parse(500, b'{"ok": true}').body_format == "wrong_shape"
    text = parse(500, b"Internal Server Error", "text/plain")
    assert (text.kind, text.body_format, text.message) == ("unparseable", "text", "Internal Server Error")
    assert parse(503, b"<html>Service Unavailable</html>", "text/html").kind == "not_ready"
    assert parse(404, b"404 page not found", "text/plain").kind == "not_found"


def test_llamacpp_loading_and_engine_dead_are_not_ready():
    loading = parse(503, json.dumps({"error": {"code": 503, "message": "Loading model",
                                               "type": "unavailable_error"}}).encode())
    assert (loading.kind, loading.engine) == ("not_ready", "llama.cpp")
    body = (CAPTURES / "x_engine_dead_head_dim16.txt").read_text()
    event = next(text for text in body.splitlines() if text.startswith('{"error"'))
    dead = parse(500, event.encode())
    assert (dead.kind, dead.engine, dead.engine_dead) == ("not_ready", "vllm", True)


# ---------------------------------------------------------------------------
# Every error capture of the real vLLM 0.32.0
# ---------------------------------------------------------------------------

CAPTURE_KINDS = {
    "a_model_unknown_chat": "not_found",
    "b06_tools": "bad_request",
    "b10_tool_call_roundtrip": "bad_request",
    "b_render_chat": "bad_request",
    "c03_max_tokens_gt_max_model_len": "max_tokens_too_large",
    "c04_max_completion_tokens_gt_max_model_len": "max_tokens_too_large",
    "c08_both_mt_ok_mct_huge": "max_tokens_too_large",
    "c09_prompt_over_max_model_len": "prompt_too_long",
    "c09b_prompt_over_no_max_tokens": "prompt_too_long",
    "c09c_prompt_way_over_chars": "prompt_too_long",
    "c09d_chat_over_char_bound": "input_chars",
    "c09e_completions_over_char_bound": "input_chars",
    "c10_prompt_eq_max_model_len": "max_tokens_invalid",
    "c10b_prompt_eq_max_model_len_mt1": "max_tokens_invalid",
    "c12_max_completion_tokens_0": "max_tokens_invalid",
    "c12_max_completion_tokens_neg1": "max_tokens_invalid",
    "c12_max_tokens_0": "max_tokens_invalid",
    "c12_max_tokens_float1_5": "bad_request",
    "c12_max_tokens_neg1": "max_tokens_invalid",
    "c12_max_tokens_strabc": "bad_request",
    "c13_stream_max_tokens_gt_max_model_len": "max_tokens_too_large",
    "c14_stream_prompt_over": "prompt_too_long",
    "c15_stream_max_tokens_neg1": "max_tokens_invalid",
    "c16b_stream_unknown_model": "not_found",
    "c20_completions_string_max_tokens_gt_mml": "max_tokens_too_large",
    "c21_completions_string_prompt_over": "prompt_too_long",
    "c23_completions_ids_eq_mml": "max_tokens_invalid",
    "c23b_completions_ids_eq_mml_no_max": "max_tokens_invalid",
    "c25_completions_ids_over": "prompt_too_long",
    "c26_completions_ids_out_of_vocab": "bad_request",
    "c27_completions_stream_prompt_over": "prompt_too_long",
    "c27c_completions_batch_one_over": "prompt_too_long",
    "c30_invalid_json": "bad_request",
    "c31_missing_messages": "bad_request",
    "c32_messages_not_list": "bad_request",
    "c33_temperature_neg": "bad_request",
    "c36_empty_messages": "bad_request",
    "d10_tokenize_v1_path": "not_found",
}


def _error_captures() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(CAPTURES.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and isinstance(data.get("status"), int) and data["status"] >= 400:
            found.append((path.stem, data))
    return found


def test_every_error_capture_has_an_expected_kind():
    """A new error capture must be added to CAPTURE_KINDS, not silently skipped."""
    assert sorted(name for name, _ in _error_captures()) == sorted(CAPTURE_KINDS)


@pytest.mark.parametrize("name,capture", _error_captures(), ids=[n for n, _ in _error_captures()])
def test_real_vllm_capture_parses_to_expected_kind(name, capture):
    failure = parse(capture["status"], json.dumps(capture["body"]).encode(), capture["headers"].get("content-type"))
    assert failure.kind == CAPTURE_KINDS[name]
    assert failure.status == capture["status"]
    if "error" in capture["body"]:
        assert failure.engine == "vllm"
        assert failure.message == capture["body"]["error"]["message"]


def test_capture_numbers_c09_c09d_c03():
    def load(name: str) -> UpstreamFailure:
        c = json.loads((CAPTURES / f"{name}.json").read_text())
        return parse(c["status"], json.dumps(c["body"]).encode())

    c09 = load("c09_prompt_over_max_model_len")
    assert (c09.max_model_len, c09.prompt_tokens, c09.prompt_tokens_is_lower_bound) == (2048, 2049, True)
    c09d = load("c09d_chat_over_char_bound")
    assert (c09d.chars, c09d.max_chars, c09d.max_input_tokens, c09d.param) == (300050, 262144, 2048, "input_text")
    c03 = load("c03_max_tokens_gt_max_model_len")
    assert (c03.requested_tokens, c03.max_model_len, c03.param) == (2049, 2048, "max_tokens")


# ---------------------------------------------------------------------------
# Explanations
# ---------------------------------------------------------------------------

def capture_failure(name: str) -> UpstreamFailure:
    c = json.loads((CAPTURES / f"{name}.json").read_text())
    return parse(c["status"], json.dumps(c["body"]).encode())


def assert_openai_envelope(err: BrimfulError) -> dict[str, Any]:
    body = json.loads(err.body_bytes())
    assert set(body) == {"error"}
    e = body["error"]
    assert isinstance(e["message"], str) and e["message"]
    assert isinstance(e["type"], str) and e["type"]
    assert e["param"] is None or isinstance(e["param"], str)
    assert e["code"] is None or isinstance(e["code"], (str, int))
    assert {"message", "type", "param", "code"} <= set(e)
    return e


def test_prompt_over_uses_brimful_exact_count_never_at_least():
    """c09: vLLM says "at least 2049"; brimful counted 2109 (the HF count in the capture's note)."""
    err = explain_upstream_error(capture_failure("c09_prompt_over_max_model_len"), upstream=UPSTREAM,
                                 prompt_tokens=2109, max_model_len=2048, requested_max_tokens=4)
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "messages"
    assert "2109" in err.message and "2048" in err.message
    assert "at least" not in err.message
    assert "62 tokens" in err.message        # 2109 - 2048 + 1 for one completion token
    assert "cut 65" in err.message           # 2109 + 4 - 2048 for the 4 requested
    assert err.details["tokens_to_remove"] == 62
    assert err.details["tokens_to_remove_for_requested"] == 65
    assert err.details["upstream_message"].startswith("This model's maximum context length is 2048 tokens.")
    assert err.details["upstream_prompt_tokens"] == 2049
    assert err.details["upstream_prompt_tokens_is_lower_bound"] is True
    assert err.details["upstream_status"] == 400 and err.details["engine"] == "vllm"
    assert err.details["prompt_tokens"] == 2109
    e = assert_openai_envelope(err)
    assert e["brimful"]["upstream_message"] == err.details["upstream_message"]


def test_completions_prompt_param():
    err = explain_upstream_error(capture_failure("c21_completions_string_prompt_over"), upstream=UPSTREAM,
                                 prompt_tokens=2101, max_model_len=2048, prompt_param="prompt")
    assert err.param == "prompt" and "2101" in err.message and "54 tokens" in err.message


def test_lower_bound_only_says_at_least_when_brimful_did_not_count():
    err = explain_upstream_error(capture_failure("c14_stream_prompt_over"), upstream=UPSTREAM)
    assert err.status == 400 and err.code == "context_length_exceeded"
    assert "at least 2049" in err.message and "2048" in err.message
    assert err.details["tokens_to_remove_at_least"] == 2


def test_prompt_plus_output_over_names_the_limit_that_fits():
    failure = parse(400, vllm(
        "'max_tokens' or 'max_completion_tokens' is too large: 4000. This model's maximum context length is 8192 "
        "tokens and your request has 6000 input tokens (4000 > 8192 - 6000)."))
    err = explain_upstream_error(failure, upstream=UPSTREAM, prompt_tokens=6000, max_model_len=8192,
                                 requested_max_tokens=4000, max_tokens_param="max_completion_tokens")
    assert err.status == 400 and err.code == "context_length_exceeded"
    assert err.param == "max_completion_tokens"
    assert "Set max_completion_tokens to 2192 or less" in err.message   # 8192 - 6000
    assert "1808" in err.message                                          # 6000 + 4000 - 8192
    assert err.details["available_completion_tokens"] == 2192 and err.details["tokens_over"] == 1808


def test_upstream_limit_wins_and_a_mismatch_is_named():
    """brimful believes 4096, the upstream enforces 2048: the explanation uses 2048 and says so."""
    err = explain_upstream_error(capture_failure("c09_prompt_over_max_model_len"), upstream=UPSTREAM,
                                 prompt_tokens=2100, max_model_len=4096, requested_max_tokens=10)
    assert "maximum context length is 2048 tokens" in err.message and "53 tokens" in err.message
    assert err.details["max_model_len"] == 2048 and err.details["upstream_max_model_len"] == 2048
    disagree = explain_upstream_error(capture_failure("c09_prompt_over_max_model_len"), upstream=UPSTREAM,
                                      prompt_tokens=2000, max_model_len=4096, granted_max_tokens=10)
    assert "2048" in disagree.message and "4096" in disagree.message


def test_upstream_exact_numbers_are_used_when_brimful_did_not_count():
    err = explain_upstream_error(parse(400, openai_like(
        "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens (5000 in the "
        "messages, 4000 in the completion). Please reduce the length of the messages or completion.")),
        upstream=UPSTREAM)
    assert "Set max_tokens to 3192 or less" in err.message and "808" in err.message


def test_max_tokens_alone_too_large_with_prompt_count():
    err = explain_upstream_error(capture_failure("c04_max_completion_tokens_gt_max_model_len"), upstream=UPSTREAM,
                                 prompt_tokens=10, max_model_len=2048, requested_max_tokens=4096)
    assert err.status == 400 and err.code == "context_length_exceeded"
    assert err.param == "max_completion_tokens"
    assert "4096" in err.message and "set max_completion_tokens to 2038 or less" in err.message
    assert err.details["available_completion_tokens"] == 2038


def test_tgi_422_becomes_400_and_says_so():
    err = explain_upstream_error(parse(422, tgi("Input validation error: `max_new_tokens` must be <= 96. Given: 200")),
                                 upstream=UPSTREAM, prompt_tokens=100, max_model_len=4096)
    assert err.status == 400 and err.param == "max_tokens"
    assert "set max_tokens to 96 or less" in err.message
    bad = explain_upstream_error(parse(422, tgi("Input validation error: `temperature` must be strictly positive")),
                                 upstream=UPSTREAM)
    assert bad.status == 400 and "TGI answers HTTP 422" in bad.message and "`temperature`" in bad.message


def test_input_limit_below_the_context_tgi_and_sglang():
    tgi_inputs = parse(422, tgi("Input validation error: `inputs` must have less than 4000 tokens. Given: 5000"))
    err = explain_upstream_error(tgi_inputs, upstream=UPSTREAM, prompt_tokens=5000, max_model_len=8192)
    assert err.status == 400 and err.code == "context_length_exceeded" and err.param == "messages"
    assert "at most 4000" in err.message and "5000" in err.message and "1000 tokens" in err.message
    assert err.details["tokens_to_remove"] == 1000
    sglang = parse(400, vllm_old("Input length (5000 tokens) exceeds the maximum allowed length (4000 tokens). "
                                 "Use a shorter input or enable --allow-auto-truncate."))
    uncounted = explain_upstream_error(sglang, upstream=UPSTREAM)   # the upstream's count is exact here
    assert "upstream SGLang" in uncounted.message and uncounted.details["tokens_to_remove"] == 1000


def test_max_tokens_zero_from_a_full_prompt_is_a_length_error():
    """c10b: prompt == max_model_len, client asked 1, vLLM says "got 0"."""
    err = explain_upstream_error(capture_failure("c10b_prompt_eq_max_model_len_mt1"), upstream=UPSTREAM,
                                 prompt_tokens=2048, max_model_len=2048, requested_max_tokens=1, granted_max_tokens=1)
    assert err.code == "context_length_exceeded" and err.param == "messages"
    assert "your prompt is 2048 tokens" in err.message and "by 1 token or more" in err.message


def test_max_tokens_negative_gives_the_exact_prompt_from_vllm_arithmetic():
    """Older vLLM: max_tokens omitted, default max_model_len - prompt = -7584, so the prompt is 15776."""
    err = explain_upstream_error(parse(400, vllm("max_tokens must be at least 1, got -7584.")), upstream=UPSTREAM,
                                 max_model_len=8192)
    assert "15776" in err.message and "at least" not in err.message.replace("at least 1", "")
    assert err.details["tokens_to_remove"] == 7585


def test_max_tokens_zero_sent_by_client_is_an_invalid_value():
    err = explain_upstream_error(capture_failure("c12_max_completion_tokens_0"), upstream=UPSTREAM,
                                 requested_max_tokens=0, max_tokens_param="max_completion_tokens")
    assert (err.status, err.code, err.param) == (400, "invalid_value", "max_completion_tokens")
    assert "got 0" in err.message


def test_counts_disagree_is_reported_without_at_least():
    """brimful counted 2000 and forwarded 40, vLLM still found > 2048: a tokenizer/template mismatch."""
    err = explain_upstream_error(capture_failure("c09_prompt_over_max_model_len"), upstream=UPSTREAM,
                                 prompt_tokens=2000, max_model_len=2048, requested_max_tokens=100,
                                 granted_max_tokens=40)
    assert err.status == 400 and err.details["counts_disagree"] is True
    assert "2000" in err.message and "2049" in err.message and "at least" not in err.message


def test_char_precheck_explained_with_the_fix():
    with_output = parse(400, vllm(
        "This model's maximum context length is 32768 tokens. However, you requested 32768 output tokens and your "
        "prompt contains 31800 characters (more than 0 characters, which is the upper bound for 0 input tokens). "
        "Please reduce the length of the input prompt or the number of requested output tokens."))
    err = explain_upstream_error(with_output, upstream=UPSTREAM, prompt_tokens=7000, max_model_len=32768,
                                 requested_max_tokens=32768)
    assert err.code == "context_length_exceeded" and "Set max_tokens to 25768 or less" in err.message
    over = explain_upstream_error(capture_failure("c09d_chat_over_char_bound"), upstream=UPSTREAM,
                                  prompt_tokens=60011, max_model_len=2048)
    assert "60011" in over.message and "300050 characters" in over.message
    uncounted = explain_upstream_error(capture_failure("c09d_chat_over_char_bound"), upstream=UPSTREAM)
    assert "300050 characters" in uncounted.message and uncounted.details["chars_to_remove"] == 300050 - 262144


def test_llamacpp_ran_out_of_context_without_a_limit():
    failure = parse(500, json.dumps({"error": {"code": 500, "message": "Context size has been exceeded.",
                                               "type": "server_error"}}).encode())
    err = explain_upstream_error(failure, upstream=UPSTREAM, prompt_tokens=4000, max_model_len=4096)
    assert err.status == 400 and "Set max_tokens to 96 or less" in err.message


def test_engine_dead_is_503_with_retry_after():
    body = next(text for text in (CAPTURES / "x_engine_dead_head_dim16.txt").read_text().splitlines()
                if text.startswith('{"error"'))
    err = explain_upstream_error(parse(500, body.encode()), upstream=UPSTREAM)
    assert err.status == 503 and "Retry-After" in err.headers
    assert "engine died" in err.message and "tens of seconds to minutes" in err.message


def test_kv_cache_names_the_length_that_fits():
    failure = parse(500, vllm(WORDINGS_BY_ID["vllm_kv_too_small"], status=500))
    err = explain_upstream_error(failure, upstream=UPSTREAM)
    assert err.status == 502 and "--max-model-len 3664" in err.message


WORDINGS_BY_ID = {w[0]: json.loads(w[2])["error"]["message"] for w in WORDINGS
                  if isinstance(json.loads(w[2]).get("error"), dict)}


STATUS_TABLE = [
    # (upstream status, body, content type, client status, openai exception, text the message contains)
    ("length_400", 400, vllm("Input length (9000) exceeds model's maximum context length (8192)."), "application/json",
     400, openai.BadRequestError, "9000"),
    ("validation_400", 400, vllm("Token id 999999 is out of vocabulary"), "application/json",
     400, openai.BadRequestError, "Token id 999999 is out of vocabulary"),
    ("tgi_422", 422, tgi("Input validation error: `inputs` must have less than 4000 tokens. Given: 5000"),
     "application/json", 400, openai.BadRequestError, "upstream TGI"),
    ("model_404", 404, json.dumps({"error": {"message": "The model `x` does not exist. Valid aliases: tiny-qwen.",
                                             "type": "NotFoundError", "param": "model", "code": 404}}).encode(),
     "application/json", 404, openai.NotFoundError, "The model `x` does not exist. Valid aliases: tiny-qwen."),
    ("route_404", 404, b'{"detail": "Not Found"}', "application/json", 404, openai.NotFoundError, "no such route"),
    ("loading_503", 503, b'{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}',
     "application/json", 503, openai.InternalServerError, "tens of seconds to minutes"),
    ("html_503", 503, b"<html><title>503 Service Temporarily Unavailable</title></html>", "text/html",
     503, openai.InternalServerError, "503 Service Temporarily Unavailable"),
    ("other_500", 500, vllm("Something broke", status=500), "application/json",
     502, openai.InternalServerError, "HTTP 500: Something broke"),
    ("gateway_504", 504, b'{"message": "upstream timed out"}', "application/json",
     502, openai.InternalServerError, "HTTP 504"),
    ("html_502", 502, b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>", "text/html",
     502, openai.InternalServerError, '"502 Bad Gateway"'),
    ("empty_500", 500, b"", None, 502, openai.InternalServerError, "an empty body"),
    ("invalid_json_500", 500, b"{not json", "application/json", 502, openai.InternalServerError, "invalid JSON"),
    ("wrong_shape_500", 500, b'["a", "b"]', "application/json", 502, openai.InternalServerError,
     "JSON that is not an error object"),
    ("unauthorized_401", 401, b'{"error": "Unauthorized"}', "application/json", 401, openai.AuthenticationError,
     "Unauthorized"),
    ("forbidden_403", 403, json.dumps({"error": {"message": "Scale-out endpoints are disabled.",
                                                 "type": "PermissionDeniedError", "param": None,
                                                 "code": 403}}).encode(),
     "application/json", 403, openai.PermissionDeniedError, "Scale-out endpoints are disabled."),
    ("rate_429", 429, b'{"error": {"message": "slow down", "type": "rate_limit_error", "code": 429}}',
     "application/json", 429, openai.RateLimitError, "slow down"),
    ("method_405", 405, b'{"detail": "Method Not Allowed"}', "application/json", 405, openai.APIStatusError,
     "Method Not Allowed"),
]


@pytest.mark.parametrize("upstream_status,body,ctype,status,exc_class,text",
                         [row[1:] for row in STATUS_TABLE], ids=[row[0] for row in STATUS_TABLE])
def test_status_mapping_and_openai_client_exception(upstream_status, body, ctype, status, exc_class, text):
    err = explain_upstream_error(parse(upstream_status, body, ctype), upstream=UPSTREAM,
                                 max_model_len=8192, prompt_tokens=9000)
    assert err.status == status
    assert text in err.message
    assert err.details["upstream_status"] == upstream_status
    envelope = assert_openai_envelope(err)
    if status == 503:
        assert err.headers.get("Retry-After")
    if status == 502:
        assert UPSTREAM in err.message and f"HTTP {upstream_status}" in err.message

    def handler(request):
        return openai_httpx.Response(err.status, content=err.body_bytes(),
                                     headers={"content-type": "application/json", **err.headers})

    client = openai.OpenAI(api_key="k", base_url="http://brimful.test/v1", max_retries=0,
                           http_client=openai_httpx.Client(transport=openai_httpx.MockTransport(handler)))
    with pytest.raises(exc_class) as raised:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    assert type(raised.value) is exc_class
    assert raised.value.status_code == status
    assert raised.value.body["message"] == err.message == envelope["message"]
    assert raised.value.code == str(err.envelope_code)  # openai reads code as a str


def test_every_kind_explains_to_a_valid_envelope():
    samples = {
        "prompt_too_long": UpstreamFailure("prompt_too_long", 400, "too long", None),
        "context_length": UpstreamFailure("context_length", 400, "too long", None),
        "max_tokens_too_large": UpstreamFailure("max_tokens_too_large", 400, "too many", None),
        "max_tokens_invalid": UpstreamFailure("max_tokens_invalid", 400, "bad", None),
        "input_chars": UpstreamFailure("input_chars", 400, "chars", None),
        "kv_cache": UpstreamFailure("kv_cache", 500, "kv", "vllm"),
        "bad_request": UpstreamFailure("bad_request", 400, "bad", None),
        "not_found": UpstreamFailure("not_found", 404, "", None),
        "not_ready": UpstreamFailure("not_ready", 503, "", None),
        "server_error": UpstreamFailure("server_error", 500, "boom", None),
        "unparseable": UpstreamFailure("unparseable", 500, "(empty body)", None, body_format="empty"),
    }
    assert set(samples) == KINDS
    for kind, failure in samples.items():
        for kwargs in ({}, {"prompt_tokens": 100, "max_model_len": 50, "requested_max_tokens": 10},
                       {"prompt_tokens": 10, "max_model_len": 50, "requested_max_tokens": 10,
                        "granted_max_tokens": 10}):
            err = explain_upstream_error(failure, upstream=UPSTREAM, **kwargs)
            assert_openai_envelope(err)
            assert err.details["upstream_kind"] == kind


# ---------------------------------------------------------------------------
# Retry decision
# ---------------------------------------------------------------------------

def test_is_length_failure_and_corrected_limit():
    exact = parse(400, vllm(WORDINGS_BY_ID["vllm_renderer_exact"]))
    assert is_length_failure(exact) and corrected_max_tokens(exact) == 2192
    at_least = parse(400, vllm(
        "This model's maximum context length is 32768 tokens. However, you requested 32512 output tokens and your "
        "prompt contains at least 257 input tokens, for a total of at least 32769 tokens. Please reduce the "
        "length of the input prompt or the number of requested output tokens. (parameter=input_tokens, value=257)"))
    assert is_length_failure(at_least)
    assert corrected_max_tokens(at_least, prompt_tokens=300) == 32468       # brimful's exact count
    assert corrected_max_tokens(at_least, prompt_tokens=200) == 32511       # never below the upstream's bound
    too_large = capture_failure("c03_max_tokens_gt_max_model_len")
    assert is_length_failure(too_large)
    assert corrected_max_tokens(too_large, prompt_tokens=10) == 2038
    assert corrected_max_tokens(too_large) is None                          # prompt size unknown
    tgi_cap = parse(422, tgi("Input validation error: `max_new_tokens` must be <= 96. Given: 200"))
    assert corrected_max_tokens(tgi_cap) == 96
    chars_with_output = parse(400, vllm(WORDINGS_BY_ID["vllm_char_check_with_output"]))
    assert is_length_failure(chars_with_output)
    assert corrected_max_tokens(chars_with_output, prompt_tokens=7000) == 25768
    for name in ("c09_prompt_over_max_model_len", "c09d_chat_over_char_bound", "c10_prompt_eq_max_model_len",
                 "c12_max_tokens_strabc", "a_model_unknown_chat"):
        assert not is_length_failure(capture_failure(name)), name
        assert corrected_max_tokens(capture_failure(name), prompt_tokens=10, max_model_len=2048) is None
    full = parse(400, vllm(WORDINGS_BY_ID["vllm_renderer_exact"]))
    assert corrected_max_tokens(full, prompt_tokens=8192) is None           # nothing fits


# ---------------------------------------------------------------------------
# Robustness: nothing raises, whatever the bytes
# ---------------------------------------------------------------------------

def _random_json(rng: random.Random, depth: int = 0) -> Any:
    keys = ["error", "message", "detail", "code", "type", "param", "n_ctx", "n_prompt_tokens", "error_type",
            "object", "loc", "msg"]
    choice = rng.randrange(9 if depth < 4 else 6)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([True, False, 0, -1, 2**70, 1.5, float("1e308")])
    if choice == 2:
        return rng.randrange(-10**6, 10**6)
    if choice in (3, 4, 5):
        fragments = ["maximum context length is ", "tokens. However, ", "your prompt contains at least ",
                     "you requested ", " output tokens and ", "(", ")", "=", "cannot be greater than ",
                     "max_tokens", "Given: ", "`inputs`", str(rng.randrange(10**20)), "-", "\u00e9\u4e2d", "\x00"]
        return "".join(rng.choice(fragments) for _ in range(rng.randrange(8)))
    if choice in (6, 7):
        return {rng.choice(keys): _random_json(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def _explains(failure: UpstreamFailure) -> None:
    assert failure.kind in KINDS
    assert isinstance(failure.message, str) and len(failure.message) <= 2000
    for kwargs in ({}, {"prompt_tokens": 3000, "max_model_len": 2048, "requested_max_tokens": 5}):
        assert_openai_envelope(explain_upstream_error(failure, upstream=UPSTREAM, **kwargs))


def test_random_bytes_never_raise():
    rng = random.Random(1234)
    for _ in range(300):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(300)))
        status = rng.choice([200, 400, 401, 404, 413, 422, 429, 500, 502, 503, 504, 599])
        _explains(parse_upstream_error(status, body, rng.choice([None, "application/json", "text/html"])))


def test_random_json_shapes_never_raise():
    rng = random.Random(99)
    for _ in range(400):
        value = _random_json(rng)
        body = json.dumps(value if rng.random() < 0.5 else {"error": value}).encode()
        _explains(parse_upstream_error(rng.choice([400, 404, 422, 500, 503]), body, "application/json"))


def test_huge_and_pathological_bodies_are_capped():
    huge_message = "This model's maximum context length is 2048 tokens. " + "x" * (10 * 1024 * 1024)
    huge = parse_upstream_error(400, vllm(huge_message))
    assert huge.body_format == "invalid_json"    # cut at MAX_PARSE_BYTES, so no longer valid JSON
    assert len(huge.message) <= 2000
    _explains(huge)
    fits = parse_upstream_error(400, vllm("y" * (MAX_PARSE_BYTES // 2)))
    assert fits.kind == "bad_request" and len(fits.message) <= 2000
    _explains(fits)
    deep = b"[" * 100_000 + b"]" * 100_000
    _explains(parse_upstream_error(500, deep))
    long_number = parse_upstream_error(400, vllm("This model's maximum context length is " + "9" * 5000 + " tokens."))
    _explains(long_number)
    big_int_json = b'{"error": {"message": "x", "code": ' + b"1" * 5000 + b"}}"
    _explains(parse_upstream_error(500, big_int_json))
    _explains(parse_upstream_error(500, b"<html><title>" + b"<" * 70_000, "text/html"))
