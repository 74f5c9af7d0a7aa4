"""Issue 25 (reliability round three), end to end: brimful in front of the fake vLLM, each
answer held against what vLLM itself answers (the fake mirrors vLLM 0.32's rules and texts)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.config import Config
from tests.support.stack import Stack, fake_counter, running_stack
from tokenizer_cache import ModelTokenizer, load_model_tokenizer

MML = 4096


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> ModelTokenizer:
    return load_model_tokenizer(qwen3_dir)


def _local_only(config: Config) -> None:
    """No start-up parity probes: the count stays local until usage says otherwise (margin when it
    drifts, there being no /tokenize to fall back on)."""
    config.tokenizers.parity_check = False


@pytest.fixture(scope="module")
def stack(qwen3: ModelTokenizer, qwen3_dir: Path) -> Iterator[Stack]:
    with running_stack(qwen3_dir, configure=_local_only,
                       fake_kwargs={"max_model_len": MML, "count_prompt": fake_counter(qwen3)}) as built:
        yield built


def user_of(qwen3: ModelTokenizer, tokens: int) -> list[dict[str, Any]]:
    """A one-message conversation of exactly `tokens` prompt tokens."""
    base = qwen3.count_chat({"messages": [{"role": "user", "content": ""}]})
    words = tokens - base
    messages = [{"role": "user", "content": "hi" + " hi" * (words - 1)}]
    assert qwen3.count_chat({"messages": messages}) == tokens
    return messages


def both(stack: Stack, path: str, body: dict[str, Any]) -> tuple[httpx.Response, httpx.Response]:
    """The same request through brimful and straight to the fake vLLM."""
    through = stack.http.post(path, json=body)
    direct = httpx.post(stack.fake.base_url + path, json=body, timeout=10)
    return through, direct


# -- item 7: truncate_prompt_tokens -----------------------------------------------------------

def test_a_truncated_long_chat_is_served_as_vllm_serves_it(stack: Stack, qwen3: ModelTokenizer) -> None:
    body = {"model": "tiny-qwen", "messages": user_of(qwen3, 5000), "truncate_prompt_tokens": 100,
            "max_tokens": 2}
    through, direct = both(stack, "/v1/chat/completions", body)
    assert direct.status_code == 200 and direct.json()["usage"]["prompt_tokens"] == 100
    assert through.status_code == 200, through.text
    assert through.json()["usage"]["prompt_tokens"] == 100
    assert through.headers["x-brimful-prompt-tokens"] == "100"


def test_a_truncated_prompt_gets_the_whole_limit_vllm_grants(stack: Stack, qwen3: ModelTokenizer) -> None:
    body = {"model": "tiny-qwen", "prompt": " ".join(["hi"] * 3000), "truncate_prompt_tokens": 100,
            "max_tokens": 3000}
    through, direct = both(stack, "/v1/completions", body)
    assert direct.json()["usage"] == through.json()["usage"]
    assert through.json()["usage"]["completion_tokens"] == 3000
    assert through.headers["x-brimful-action"] == "pass"


@pytest.mark.parametrize("value", [-1, "-1", 100.0])
def test_truncate_minus_one_keeps_max_model_len_less_one(stack: Stack, qwen3: ModelTokenizer, value: Any) -> None:
    body = {"model": "tiny-qwen", "messages": user_of(qwen3, 5000), "truncate_prompt_tokens": value,
            "max_tokens": 5}
    through, direct = both(stack, "/v1/chat/completions", body)
    assert through.status_code == direct.status_code == 200
    assert through.json()["usage"] == direct.json()["usage"]


@pytest.mark.parametrize("value", [MML + 1, -2, "abc", 1.5])
def test_a_truncation_vllm_refuses_is_left_to_vllm(stack: Stack, qwen3: ModelTokenizer, value: Any) -> None:
    body = {"model": "tiny-qwen", "messages": user_of(qwen3, 50), "truncate_prompt_tokens": value,
            "max_tokens": 5}
    through, direct = both(stack, "/v1/chat/completions", body)
    assert through.status_code == direct.status_code == 400
    assert direct.json()["error"]["message"] in through.json()["error"]["message"]


def test_truncated_answers_do_not_change_how_other_clients_are_counted(stack: Stack, qwen3: ModelTokenizer) -> None:
    stack.app.counter.forget(["tiny-qwen"])          # what earlier tests taught the trust, forgotten
    for prompt in (5000, 3000, 4000):
        stack.http.post("/v1/chat/completions", json={
            "model": "tiny-qwen", "messages": user_of(qwen3, prompt), "truncate_prompt_tokens": 100,
            "max_tokens": 2}).raise_for_status()
    trust = stack.app.counter.trust("tiny-qwen")
    assert (trust.mode, trust.drift_requests) == ("local", 0)
    other = stack.http.post("/v1/chat/completions", json={"model": "tiny-qwen", "messages": user_of(qwen3, 30),
                                                          "max_tokens": 5000})
    assert other.headers["x-brimful-count"] == "local"
    assert other.headers.get("x-brimful-margin-tokens") is None
    refused = stack.http.post("/v1/chat/completions", json={"model": "tiny-qwen",
                                                            "messages": user_of(qwen3, MML + 10)})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "context_length_exceeded"
    assert refused.headers["x-brimful-action"] == "rejected"


# -- item 1 (and the degraded "1_000" / "10.0"): limit strings read as vLLM's pydantic reads them ---

HELLO = [{"role": "user", "content": "Hello!"}]
LIMITS = {  # path -> (request without its limit, the limit field)
    "/v1/chat/completions": ({"model": "tiny-qwen", "messages": HELLO}, "max_tokens"),
    "/v1/completions": ({"model": "tiny-qwen", "prompt": "Hello"}, "max_tokens"),
    "/v1/responses": ({"model": "tiny-qwen", "input": "Hello"}, "max_output_tokens"),
    "/v1/messages": ({"model": "tiny-qwen", "messages": HELLO}, "max_tokens"),
}


def _error_message(path: str, answer: httpx.Response) -> str:
    """The error's text in the surface's own envelope (Anthropic's for Messages, OpenAI's elsewhere)."""
    body = answer.json()
    if path == "/v1/messages":
        assert body["type"] == "error"
    return str(body["error"]["message"])


@pytest.mark.parametrize("path", list(LIMITS))
@pytest.mark.parametrize("value", ["+-5", "--5", "-+5", "++5", "9" * 5000])
def test_odd_numeric_limit_strings_are_a_400_in_the_surface_shape(stack: Stack, path: str, value: str) -> None:
    request, field = LIMITS[path]
    through, direct = both(stack, path, {**request, field: value})
    assert direct.status_code == 400
    assert through.status_code == 400, through.text
    assert field in _error_message(path, through)


@pytest.mark.parametrize("path", list(LIMITS))
@pytest.mark.parametrize("value", ["1_0", "10.0", " +10 "])
def test_limit_strings_pydantic_accepts_are_served(stack: Stack, path: str, value: str) -> None:
    request, field = LIMITS[path]
    through, direct = both(stack, path, {**request, field: value})
    assert direct.status_code == 200
    assert through.status_code == 200, through.text
    assert through.headers["x-brimful-requested-max-tokens"] == "10"


# -- item 3: a trailing-slash redirect names brimful, never the upstream -------------------------

SLASHED = {  # vLLM's routes that a client may call with a trailing slash, and a body each serves
    "/v1/chat/completions/": {"model": "tiny-qwen", "messages": HELLO, "max_tokens": 99999},
    "/v1/completions/": {"model": "tiny-qwen", "prompt": "Hello", "max_tokens": 99999},
    "/v1/responses/": {"model": "tiny-qwen", "input": "Hello", "max_output_tokens": 99999},
    "/v1/messages/": {"model": "tiny-qwen", "messages": HELLO, "max_tokens": 99999},
    "/v1/messages/count_tokens/": {"model": "tiny-qwen", "messages": HELLO},
    "/v1/embeddings/": {"model": "tiny-qwen", "input": "Hello"},
}


@pytest.mark.parametrize("path", list(SLASHED))
def test_a_trailing_slash_redirect_points_at_brimful(stack: Stack, path: str) -> None:
    direct = httpx.post(stack.fake.base_url + path, json=SLASHED[path], timeout=10)
    assert direct.status_code == 307                         # what vLLM answers (Starlette redirect_slashes)
    through = stack.http.post(path, json=SLASHED[path])
    assert through.status_code == 307
    assert through.headers["location"] == path.rstrip("/")   # a reference to brimful, no upstream address
    assert f"127.0.0.1:{stack.fake.port}" not in through.text + str(through.headers)


@pytest.mark.parametrize("path", [p for p in SLASHED if "max_tokens" in str(SLASHED[p]) or "max_output" in str(
    SLASHED[p])])
def test_a_client_following_the_redirect_is_admitted(stack: Stack, path: str) -> None:
    with httpx.Client(base_url=stack.base_url, follow_redirects=True, timeout=10) as client:
        answer = client.post(path, json=SLASHED[path])
    assert answer.status_code == 200, answer.text
    assert [str(r.url) for r in answer.history] == [stack.base_url + path]
    assert answer.headers["x-brimful-action"] == "clamped"      # admitted: 99999 did not reach vLLM
    sent = [r for r in stack.fake.requests if r.path == path.rstrip("/")][-1].json
    assert 99999 not in sent.values()


def test_the_openai_sdk_following_the_redirect_is_admitted(stack: Stack) -> None:
    answer = stack.client.post("/chat/completions/", cast_to=httpx.Response, body=SLASHED["/v1/chat/completions/"])
    assert answer.status_code == 200
    assert answer.headers["x-brimful-action"] == "clamped"


# -- item 2: tool-call arguments nested past the recursion limit: a 400, never a 500 ----------

def _nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_deeply_nested_chat_tool_arguments_are_a_400(stack: Stack) -> None:
    messages = [{"role": "user", "content": "Weather?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": _nested(2000)}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    answer = stack.http.post("/v1/chat/completions", json={"model": "tiny-qwen", "messages": messages,
                                                           "max_tokens": 5})
    assert answer.status_code == 400, answer.text
    assert "nested too deeply" in answer.json()["error"]["message"]


def test_deeply_nested_responses_function_call_arguments_are_a_400(stack: Stack) -> None:
    items = [{"type": "message", "role": "user", "content": "Weather?"},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": _nested(100_000)},
             {"type": "function_call_output", "call_id": "c1", "output": "sunny"}]
    answer = stack.http.post("/v1/responses", json={"model": "tiny-qwen", "input": items, "max_output_tokens": 5})
    assert answer.status_code == 400, answer.text
    assert "nested too deeply" in answer.json()["error"]["message"]


# -- degraded: an unpaired surrogate in a field nothing tokenizes ---------------------------------

@pytest.mark.parametrize("max_tokens", [5, 99999])       # forwarded as sent, and rewritten (clamped)
def test_a_lone_surrogate_in_user_is_served_as_vllm_serves_it(stack: Stack, max_tokens: int) -> None:
    raw = (b'{"model": "tiny-qwen", "messages": [{"role": "user", "content": "Hello!"}], '
           b'"user": "a\\ud800b", "max_tokens": %d}' % max_tokens)
    headers = {"content-type": "application/json"}
    through = stack.http.post("/v1/chat/completions", content=raw, headers=headers)
    assert through.status_code == 200, through.text[:300]
    if max_tokens == 5:                                   # vLLM itself refuses 99999 (> max_model_len)
        direct = httpx.post(stack.fake.base_url + "/v1/chat/completions", content=raw, headers=headers, timeout=10)
        assert direct.status_code == 200
    assert [r for r in stack.fake.requests if r.path == "/v1/chat/completions"][-1].json["user"] == "a\ud800b"


def test_a_lone_surrogate_in_the_prompt_is_still_refused(stack: Stack) -> None:
    raw = b'{"model": "tiny-qwen", "messages": [{"role": "user", "content": "a\\ud800b"}], "max_tokens": 5}'
    through = stack.http.post("/v1/chat/completions", content=raw, headers={"content-type": "application/json"})
    assert through.status_code == 400 and "surrogate" in through.json()["error"]["message"]
