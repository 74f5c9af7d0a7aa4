"""Two pools of one model routed by length, end to end: two fake vLLMs, brimful, the official openai SDK."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, ModelConfig, UpstreamConfig, UpstreamEntry
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tests.support.stack import fake_counter, started_up
from tokenizer_cache import load_model_tokenizer

MODEL = "tiny-qwen"


@pytest.fixture(scope="module")
def pools(qwen3_dir: Path) -> Iterator[tuple[FakeVLLM, FakeVLLM, str]]:
    """A short pool whose card says 2,048 but that enforces 1,536 (a drifted card) and a long pool of 8,192."""
    counter = fake_counter(load_model_tokenizer(qwen3_dir))
    with FakeVLLM(model=MODEL, max_model_len=1536, card={"max_model_len": 2048}, count_prompt=counter) as short, \
            FakeVLLM(model=MODEL, max_model_len=8192, count_prompt=counter) as long:
        config = Config(upstream=UpstreamConfig(url=short.base_url, timeout=10.0),
                        upstreams=[UpstreamEntry(name="long", url=long.base_url)])
        config.models[MODEL] = ModelConfig(tokenizer=str(qwen3_dir))
        app = BrimfulApp(config)
        with serve_in_thread(app, settle=functools.partial(started_up, app)) as base:
            yield short, long, base


def chats(fake: FakeVLLM) -> list[dict]:
    return [r.json for r in fake.requests if r.path == "/v1/chat/completions"]


def words(n: int) -> list[dict]:
    return [{"role": "user", "content": " ".join(["alpha"] * n)}]


def test_each_request_goes_to_the_smallest_pool_that_holds_it(pools) -> None:
    short, long, base = pools
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    cases = [  # (messages, max_tokens, the pool that must serve it)
        (words(5), 100, short),          # a short ask after a short prompt
        (words(5), 3000, long),          # the ask does not fit 2,048
        (words(5), None, long),          # nothing asked: vLLM would give the whole room of 8,192
        (words(2100), 10, long),         # the prompt alone is past the short window
    ]
    for messages, max_tokens, pool in cases:
        before = {id(f): len(chats(f)) for f in (short, long)}
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages, **extra)
        completion = raw.parse()
        # the deployment's window is the longest pool's, and the grant is what it would give
        assert raw.headers["x-brimful-max-model-len"] == "8192"
        if max_tokens is not None:
            assert completion.usage.completion_tokens == max_tokens
        other = long if pool is short else short
        assert len(chats(pool)) == before[id(pool)] + 1 and len(chats(other)) == before[id(other)]


def test_a_prompt_no_pool_holds_is_refused_with_the_longest_window(pools) -> None:
    short, long, base = pools
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    before = len(chats(short)) + len(chats(long))
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=words(8200), max_tokens=10)
    assert "8192" in info.value.message.replace(",", "")
    assert len(chats(short)) + len(chats(long)) == before      # neither pool saw it


def test_a_short_pool_refusing_for_length_falls_back_to_the_long_one(pools) -> None:
    short, long, base = pools
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    refused_before = len(chats(short))
    served_before = len(chats(long))
    # ≈ 1,700 prompt tokens + 100: fits the 2,048 the short card claims, not the 1,536 it enforces
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=words(1700), max_tokens=100)
    assert raw.parse().usage.completion_tokens == 100           # served in full, not clamped
    assert raw.headers["x-brimful-action"] == "pass"
    assert len(chats(short)) == refused_before + 1 and len(chats(long)) == served_before + 1
    assert chats(long)[-1]["max_tokens"] == 100


def test_per_pool_metrics(pools) -> None:
    short, long, base = pools
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    client.chat.completions.create(model=MODEL, messages=words(3), max_tokens=5)
    client.chat.completions.create(model=MODEL, messages=words(3), max_tokens=5000)
    text = httpx.get(base + "/metrics").text
    assert f'brimful_pool_requests_total{{max_model_len="2048",model="{MODEL}",upstream="default"}}' in text
    assert f'brimful_pool_requests_total{{max_model_len="8192",model="{MODEL}",upstream="long"}}' in text
    # the fallback test moved one request from the short pool to the long one
    assert f'brimful_pool_fallbacks_total{{from_upstream="default",model="{MODEL}",to_upstream="long"}} 1.0' in text
    for line in text.splitlines():
        assert (short.base_url not in line and long.base_url not in line) or line.startswith("#")
