"""Responses, Messages and embeddings with the official clients, through brimful and against a REAL vLLM 0.32.

The scenarios are tests/support/surface_scenarios.py's (also run against the
fake in tests/e2e/test_surfaces_fake.py).  Each sends the same request to vLLM
alone and through brimful: vLLM refuses `max_output_tokens` / `max_tokens`
65535 (it is above max_model_len) where brimful serves it, vLLM says "at
least 2049 input tokens" where brimful gives the exact count, and brimful's
count is the one vLLM reports in its usage.  brimful is given no tokenizer
configuration: it finds the tokenizer through the `root` vLLM's /v1/models
reports.  The pooling scenarios need vLLM as an embedding model: a second
server (tests/realvllm/fixture.py `real_vllm_pooling`), started for them only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, UpstreamConfig
from tests.support import surface_scenarios as scenario
from tests.support.servers import serve_in_thread
from tests.support.stack import ListRecorder
from tests.support.surface_scenarios import Target

pytestmark = pytest.mark.realvllm


def through(vllm: Any) -> Iterator[Target]:
    recorder = ListRecorder()
    app = BrimfulApp(Config(upstream=UpstreamConfig(url=vllm.base_url, timeout=120.0)), recorder)
    with serve_in_thread(app) as base:
        yield Target(base, vllm.base_url, vllm.model, vllm.max_model_len, recorder, timeout=120)


@pytest.fixture(scope="module")
def target(real_vllm: Any) -> Iterator[Target]:
    yield from through(real_vllm)


@pytest.fixture(scope="module")
def pooling_target(real_vllm_pooling: Any) -> Iterator[Target]:
    yield from through(real_vllm_pooling)


@pytest.mark.parametrize("run", scenario.GENERATION, ids=lambda f: f.__name__)
def test_scenario(run: Callable[[Target], None], target: Target) -> None:
    run(target)


async def test_the_agents_sdk_responses_model(target: Target) -> None:
    await scenario.agents_responses_model(target)


@pytest.mark.parametrize("run", scenario.POOLING, ids=lambda f: f.__name__)
def test_pooling_scenario(run: Callable[[Target], None], pooling_target: Target) -> None:
    run(pooling_target)


def test_nothing_drifted(target: Target) -> None:
    """Every answer's usage equalled brimful's count (the scenarios ran first, in this module)."""
    counted = [r for r in target.recorder.records if r.upstream_prompt_tokens is not None and r.prompt_tokens]
    assert len(counted) >= 8
    assert [(r.endpoint, r.prompt_tokens, r.upstream_prompt_tokens) for r in counted
            if r.prompt_tokens != r.upstream_prompt_tokens] == []
    assert {r.endpoint for r in counted} == {"responses", "messages"}
