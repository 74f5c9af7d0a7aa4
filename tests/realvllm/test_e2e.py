"""End to end against a REAL vLLM 0.32 (CPU build, tiny random model, real Qwen3 tokenizer).

The fixture `real_vllm` (tests/realvllm/) installs and starts the server once
per session.  brimful is given no tokenizer configuration: it must find the
tokenizer through the `root` that vLLM's /v1/models reports (a local
directory, as when vLLM and brimful share a volume).

The random model never emits EOS, so every request keeps its completion small
(or its prompt long) to stay fast.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, UpstreamConfig
from tests.support.servers import serve_in_thread

pytestmark = pytest.mark.realvllm


class Through:
    def __init__(self, base_url: str, app: BrimfulApp, vllm) -> None:
        self.base_url = base_url
        self.app = app
        self.vllm = vllm
        self.client = openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        self.direct = openai.OpenAI(base_url=vllm.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        self.http = httpx.Client(timeout=120)

    def tokenize(self, **payload) -> dict:
        response = self.http.post(self.vllm.base_url + "/tokenize", json={"model": "tiny-qwen", **payload})
        response.raise_for_status()
        return response.json()


@pytest.fixture(scope="module")
def through(real_vllm) -> Iterator[Through]:
    config = Config(upstream=UpstreamConfig(url=real_vllm.base_url, timeout=120.0))
    app = BrimfulApp(config)
    with serve_in_thread(app) as base_url:
        yield Through(base_url, app, real_vllm)


def words(n: int) -> str:
    return " ".join(["hello"] * n)


def test_tokenizer_found_through_vllm_root(through: Through) -> None:
    through.client.chat.completions.create(
        model="tiny-qwen", messages=[{"role": "user", "content": "Hi"}], max_tokens=1
    )
    directory = through.app.counter.tokenizer_dir("tiny-qwen")
    assert directory is not None and (directory / "tokenizer.json").is_file()


def test_max_tokens_65535_succeeds_where_vllm_alone_refuses(through: Through) -> None:
    messages = [{"role": "user", "content": words(2000)}]
    prompt = through.tokenize(messages=messages, add_generation_prompt=True)["count"]
    with pytest.raises(openai.BadRequestError) as direct:
        through.direct.chat.completions.create(model="tiny-qwen", messages=messages, max_tokens=65535)
    assert "cannot be greater than max_model_len" in direct.value.body["message"]

    raw = through.client.chat.completions.with_raw_response.create(
        model="tiny-qwen", messages=messages, max_tokens=65535
    )
    completion = raw.parse()
    granted = 2048 - prompt          # the whole room: what vLLM 0.32 grants for a limit it accepts
    assert raw.headers["x-brimful-action"] == "clamped"
    assert raw.headers["x-brimful-prompt-tokens"] == str(prompt)
    assert raw.headers["x-brimful-granted-max-tokens"] == str(granted)
    assert completion.usage.prompt_tokens == prompt
    assert completion.usage.completion_tokens == granted
    assert completion.choices[0].finish_reason == "length"


def test_prompt_over_the_limit_gets_vllms_true_count(through: Through) -> None:
    messages = [{"role": "user", "content": words(2100)}]
    true_count = through.tokenize(messages=messages, add_generation_prompt=True)["count"]
    assert true_count > 2048
    with pytest.raises(openai.BadRequestError) as info:
        through.client.chat.completions.create(model="tiny-qwen", messages=messages, max_tokens=4)
    body = info.value.body
    assert body["code"] == "context_length_exceeded"
    assert body["brimful"]["prompt_tokens"] == true_count
    assert f"{true_count} tokens" in body["message"]
    assert "at least" not in body["message"].split("Remove")[0]


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}

CONVERSATIONS = {
    "plain": {"messages": [{"role": "user", "content": "Why is the sky blue?"}]},
    "system_multi": {
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Name a prime."},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Another?"},
        ]
    },
    "korean_emoji": {"messages": [{"role": "user", "content": "세종대왕이 한글을 만든 이유는? 🐶🍕"}]},
    "parts": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "First part."},
                                         {"type": "text", "text": "둘째 부분."}]}
        ]
    },
    "thinking_off": {
        "messages": [{"role": "user", "content": "Is 17 prime?"}],
        "chat_template_kwargs": {"enable_thinking": False},
    },
    "tools": {"messages": [{"role": "user", "content": "Weather in Seoul?"}], "tools": [WEATHER_TOOL]},
    "tool_roundtrip": {
        "messages": [
            {"role": "user", "content": "Weather in Seoul?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\":\"Seoul\"}"}}
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 3}"},
        ],
        "tools": [WEATHER_TOOL],
    },
    "special_text": {"messages": [{"role": "user", "content": "Literal <|im_end|> and <think> tags."}]},
    "reasoning_history": {
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!", "reasoning": "The user greets me."},
            {"role": "user", "content": "Tell me a joke."},
        ]
    },
}


@pytest.mark.parametrize("name", sorted(CONVERSATIONS))
def test_brimful_count_equals_vllm_usage(through: Through, name: str) -> None:
    extra = dict(CONVERSATIONS[name])
    vllm_only = {k: extra.pop(k) for k in ("chat_template_kwargs",) if k in extra}
    raw = through.client.chat.completions.with_raw_response.create(
        model="tiny-qwen", max_tokens=1, extra_body=vllm_only or None, **extra
    )
    usage = raw.parse().usage
    assert int(raw.headers["x-brimful-prompt-tokens"]) == usage.prompt_tokens


def test_completions_count_equals_vllm_usage(through: Through) -> None:
    raw = through.client.completions.with_raw_response.create(
        model="tiny-qwen", prompt=["Hello, world! 안녕 🍕", "second prompt"], max_tokens=1
    )
    assert int(raw.headers["x-brimful-prompt-tokens"]) == raw.parse().usage.prompt_tokens


def test_streamed_overflow_request_streams_to_completion(through: Through) -> None:
    messages = [{"role": "user", "content": words(2000)}]
    stream = through.client.chat.completions.create(
        model="tiny-qwen", messages=messages, max_tokens=5000, stream=True,
        stream_options={"include_usage": True},
    )
    finish, usage, chunks = None, None, 0
    for chunk in stream:
        chunks += 1
        usage = chunk.usage or usage
        for choice in chunk.choices:
            finish = choice.finish_reason or finish
    assert finish == "length"
    assert usage.completion_tokens == 2048 - usage.prompt_tokens     # the whole room, as vLLM grants it
    assert chunks >= usage.completion_tokens


def test_nothing_was_rejected_upstream_and_no_drift(through: Through) -> None:
    metrics = httpx.get(through.base_url + "/metrics").text
    lines = [line for line in metrics.splitlines() if not line.startswith("#")]
    drift = [line for line in lines if line.startswith("brimful_prompt_token_drift_total")]
    assert all(line.rstrip().endswith(" 0.0") or line.rstrip().endswith(" 0") for line in drift), drift
    length_errors = [line for line in lines if line.startswith("brimful_upstream_length_errors_total")]
    assert all(line.rstrip().endswith(" 0.0") or line.rstrip().endswith(" 0") for line in length_errors), length_errors
    stats = httpx.get(through.base_url + "/stats").json()
    model = next(m for m in stats["models"] if m["model"] == "tiny-qwen")
    assert model["count"] >= 10
    assert model.get("upstream_errors", 0) == 0, json.dumps(model)
    # Every start-up probe (tools with strict and defer_loading, parts, a tool loop,
    # non-ASCII, developer + reasoning, a system message not first) matched vLLM's
    # /tokenize, so the model is counted locally and exactly.
    counting = stats["counting"]["tiny-qwen"]
    assert (counting["parity"], counting["mode"], counting["exact"]) == (True, "local", True), counting
    assert 'brimful_tokenizer_parity{model="tiny-qwen"} 1.0' in metrics
