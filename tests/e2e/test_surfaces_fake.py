"""Responses, Messages and embeddings end to end with the official clients, against the fake vLLM.

The scenarios are tests/support/surface_scenarios.py's (the same run against a
real vLLM in tests/realvllm/test_surfaces.py); here also the faults a real
server cannot be made to show on demand: a stream of each surface failing
midway, as vLLM 0.32's streams fail when its engine dies
(tests/data/vllm032_surfaces/x0*_engine_killed.json).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import anthropic
import openai
import pytest

from tests.support import surface_scenarios as scenario
from tests.support.fakevllm import FaultSpec
from tests.support.stack import Stack, running_stack
from tests.support.surface_scenarios import Target, words


@pytest.fixture(scope="module")
def stack(qwen3_dir: Path) -> Iterator[Stack]:
    with running_stack(qwen3_dir) as running:
        yield running


@pytest.fixture
def target(stack: Stack) -> Target:
    assert stack.recorder is not None
    return Target(stack.base_url, stack.fake.base_url, "tiny-qwen", 2048, stack.recorder, timeout=10)


@pytest.mark.parametrize("run", scenario.GENERATION + scenario.POOLING, ids=lambda f: f.__name__)
def test_scenario(run: Callable[[Target], None], target: Target) -> None:
    run(target)


async def test_the_agents_sdk_responses_model(target: Target) -> None:
    await scenario.agents_responses_model(target)


def test_a_responses_stream_failing_midway_raises_the_clients_api_error(stack: Stack, target: Target) -> None:
    """x02: vLLM closes the stream; brimful ends it with an `error` event carrying its explanation."""
    stack.fake.fail_next.append(FaultSpec("sse_error", path="/v1/responses", after_chunks=6))
    error, rec = target.record_after(lambda: list(target.openai().responses.create(
        model="tiny-qwen", input="Hello!", max_output_tokens=50, stream=True)), raises=openai.APIError)
    assert "broke the connection" in error.message and error.body["code"] == "upstream_connection_error"
    assert (rec.endpoint, rec.action, rec.error_code) == ("responses", "upstream_error", "upstream_connection_error")


def stream_messages(target: Target) -> None:
    with target.anthropic().messages.stream(model="tiny-qwen", max_tokens=50,
                                            messages=[{"role": "user", "content": words(10)}]) as stream:
        for _ in stream:
            pass


def test_a_messages_stream_failing_midway_raises_the_clients_status_error(stack: Stack, target: Target) -> None:
    """x03: vLLM's own `event: error` reaches the client, which raises; the record says so."""
    stack.fake.fail_next.append(FaultSpec("sse_error", path="/v1/messages", after_chunks=6))
    error, rec = target.record_after(lambda: stream_messages(target), raises=anthropic.APIStatusError)
    assert "internal_error" in str(error)
    assert (rec.endpoint, rec.action, rec.error_code) == ("messages", "upstream_error", "upstream_stream_error")


def test_a_messages_stream_cut_without_an_error_event_gets_brimful_s(stack: Stack, target: Target) -> None:
    stack.fake.fail_next.append(FaultSpec("close_mid_body", path="/v1/messages", after_chunks=4))
    error, rec = target.record_after(lambda: stream_messages(target), raises=anthropic.APIStatusError)
    assert "broke the connection" in str(error) and "'type': 'api_error'" in str(error)
    assert rec.error_code == "upstream_connection_error"
