"""Never worse than vLLM alone: the sweep of prompt sizes × limits × surfaces, through brimful and direct.

Against the REAL vLLM 0.32 (it clamps prompt + max_tokens > max_model_len by
itself) and against the fake in legacy mode (older vLLM: it refuses that).
Every case is sent twice, once to the upstream alone and once through
brimful, and `tests.support.promise.judge` says whether brimful's outcome
is at least as good; a refusal's advice is followed and the request sent again.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, UpstreamConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.promise import CHAT, COMPLETIONS, MESSAGES, RESPONSES, Case, Outcome, judge, send, sweep_cases
from tests.support.servers import serve_in_thread
from tests.support.stack import fake_counter, make_config
from tokenizer_cache import load_model_tokenizer

CHAT_OVERHEAD = 8          # Qwen3's template around one user message, with the generation prompt


def body_for(case: Case, tokens: int, model: str = "tiny-qwen") -> dict[str, Any]:
    """A request whose prompt is exactly `tokens` long (Qwen3: one token per " hello"); a
    Responses input and a Messages message render like the chat message."""
    if case.endpoint == COMPLETIONS:
        return {"model": model, "prompt": " ".join(["hello"] * tokens)}
    text = " ".join(["hello"] * (tokens - CHAT_OVERHEAD))
    if case.endpoint == RESPONSES:
        return {"model": model, "input": text}
    return {"model": model, "messages": [{"role": "user", "content": text}]}


def run_sweep(direct_url: str, through_url: str, max_model_len: int) -> tuple[int, list[str]]:
    failures = []
    checked = 0
    with httpx.Client(timeout=300) as client:
        for case in sweep_cases(max_model_len):
            body = body_for(case, case.prompt_tokens)
            direct = send(client, direct_url, case, body)
            through = send(client, through_url, case, body)

            def resend(cut: int, case: Case = case) -> Outcome:
                return send(client, through_url, case, body_for(case, case.prompt_tokens - cut))

            verdict = judge(case, through, direct, max_model_len, resend)
            checked += 1
            if verdict is not None:
                failures.append(f"{case.name}: {verdict}")
    return checked, failures


def test_the_prompts_are_the_sizes_the_sweep_names(qwen3_dir: Path) -> None:
    qwen3 = load_model_tokenizer(qwen3_dir)
    count = {CHAT: qwen3.count_chat, RESPONSES: qwen3.count_responses, MESSAGES: qwen3.count_messages,
             COMPLETIONS: lambda body: qwen3.count_completion(body)[0]}
    for endpoint, tokens in ((CHAT, 2040), (COMPLETIONS, 2049), (RESPONSES, 2047), (MESSAGES, 2056)):
        case = Case(endpoint, tokens, None, False)
        assert count[endpoint](body_for(case, case.prompt_tokens)) == tokens


def test_never_worse_than_a_legacy_vllm_that_refuses_overflow(qwen3_dir: Path) -> None:
    qwen3 = load_model_tokenizer(qwen3_dir)
    with FakeVLLM(mode="legacy", count_prompt=fake_counter(qwen3)) as fake, \
            serve_in_thread(BrimfulApp(make_config(fake.base_url, qwen3_dir))) as base:
        checked, failures = run_sweep(fake.base_url, base, 2048)
    assert checked > 400 and failures == []


@pytest.fixture(scope="module")
def through_real(real_vllm: Any) -> Iterator[str]:
    config = Config(upstream=UpstreamConfig(url=real_vllm.base_url, timeout=300.0))
    with serve_in_thread(BrimfulApp(config)) as base:
        yield base


@pytest.mark.realvllm
def test_never_worse_than_the_real_vllm(real_vllm: Any, through_real: str) -> None:
    checked, failures = run_sweep(real_vllm.base_url, through_real, real_vllm.max_model_len)
    assert checked > 400 and failures == []
