"""End to end with the real SDKs, used as apps use them, through brimful.

    SDK scenario (tests/clients/drivers.py, in its own process and venv)
      → tap (records brimful's answers and x-brimful-* headers)
      → brimful
      → scripted upstream (tests/clients/recorder.py: answers follow the
        scenario's script, so tool round trips happen; each generation request
        is also sent, completion limit 1, to the engine below for its count)
      → the engine: tests/fakevllm.py, or (slow, realvllm) a real vLLM 0.32

For every chat and completions request the SDK made, brimful answered 200,
its `x-brimful-prompt-tokens` equals the engine's `usage.prompt_tokens` for
the same body, and after each scenario brimful's drift counter is still 0.
Against the fake (which counts with brimful's own counter) this checks the
plumbing per SDK; against the real vLLM it checks the counts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, ModelConfig, UpstreamConfig
from tests.clients.drivers import SCENARIOS, Scenario
from tests.clients.envs import MissingEnv, python_for, run_scenario
from tests.clients.recorder import Recorder
from tests.clients.script import Script
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread

# Each SDK scenario starts its SDK (some in a second venv): seconds each, so the slow tier.
pytestmark = pytest.mark.slow

COUNTED = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
# CI sets this: a missing SDK or SDK venv is then an error, not a skip.
REQUIRE = os.environ.get("BRIMFUL_REQUIRE_CLIENTS", "").lower() in ("1", "true", "yes", "require")


class Chain:
    """tap → brimful → scripted upstream → engine, started once per module."""

    def __init__(self, tap: Recorder, scripted: Recorder, brimful: str) -> None:
        self.tap = tap
        self.scripted = scripted
        self.brimful = brimful

    def drift_total(self) -> float:
        metrics = httpx.get(self.brimful + "/metrics", timeout=30).text
        drift = re.findall(r"^brimful_prompt_token_drift_total\{[^}]*\} (\S+)$", metrics, re.MULTILINE)
        values = [float(m) for m in drift]
        return sum(values)

    def run(self, scenario: Scenario) -> str:
        try:
            python_for(scenario.env)
        except MissingEnv as missing:
            if REQUIRE:
                raise
            pytest.skip(str(missing))
        self.tap.exchanges.clear()
        self.scripted.exchanges.clear()
        self.scripted.script = scenario.script
        try:
            return run_scenario(scenario, self.tap.base_url)
        except RuntimeError as failure:
            if "ModuleNotFoundError" in str(failure) and not REQUIRE:
                pytest.skip(f"{scenario.distribution} is not installed here")
            raise


@pytest.fixture
def chain_factory() -> Iterator:
    opened: list = []

    def build(engine_url: str, tokenizer_dir: Path | None, count_paths: tuple[str, ...]) -> Chain:
        scripted = Recorder(Script(), count_via=engine_url, count_paths=count_paths).__enter__()
        opened.append(scripted)
        config = Config(upstream=UpstreamConfig(url=scripted.base_url, timeout=300.0))
        if tokenizer_dir is not None:
            config.models["tiny-qwen"] = ModelConfig(tokenizer=str(tokenizer_dir))
        context = serve_in_thread(BrimfulApp(config))
        brimful = context.__enter__()
        opened.append(context)
        tap = Recorder(forward_to=brimful).__enter__()
        opened.append(tap)
        return Chain(tap, scripted, brimful)

    yield build
    for item in reversed(opened):
        item.__exit__(None, None, None)


def check(chain: Chain, scenario: Scenario) -> None:
    client = chain.run(scenario)
    answered = [e for e in chain.tap.exchanges if e.path in COUNTED]
    assert answered, f"{client} sent nothing"
    assert all(e.status == 200 for e in answered), [(e.path, e.status, e.answer) for e in answered]
    through = [e for e in answered if e.path in COUNTED]
    counted = [e for e in chain.scripted.exchanges if e.path in COUNTED]
    # The SDK calls one after the other: the n-th request brimful answered is the
    # n-th the engine counted.
    assert len(through) == len(counted)
    for tapped, engine in zip(through, counted, strict=True):
        assert engine.upstream_prompt_tokens is not None
        assert tapped.headers.get("x-brimful-prompt-tokens") == str(engine.upstream_prompt_tokens), client
    assert chain.drift_total() == 0, client


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_sdk_through_brimful_in_front_of_the_fake(scenario: Scenario, chain_factory, qwen3, qwen3_dir) -> None:
    def count(endpoint: str, body: dict) -> int:
        if endpoint == "responses":
            return qwen3.count_responses(body)
        return qwen3.count_chat(body) if endpoint == "chat" else sum(qwen3.count_completion(body))

    with FakeVLLM(max_model_len=2048, count_prompt=count) as fake:
        chain = chain_factory(fake.base_url, qwen3_dir, COUNTED)
        check(chain, scenario)


@pytest.fixture(scope="module")
def real_chain(real_vllm) -> Iterator[Chain]:
    opened: list = []
    scripted = Recorder(Script(), count_via=real_vllm.base_url).__enter__()
    opened.append(scripted)
    # No tokenizer configured: brimful finds it through the root vLLM's /v1/models reports.
    context = serve_in_thread(BrimfulApp(Config(upstream=UpstreamConfig(url=scripted.base_url, timeout=300.0))))
    brimful = context.__enter__()
    opened.append(context)
    tap = Recorder(forward_to=brimful).__enter__()
    opened.append(tap)
    yield Chain(tap, scripted, brimful)
    for item in reversed(opened):
        item.__exit__(None, None, None)


@pytest.mark.slow
@pytest.mark.realvllm
@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_sdk_through_brimful_in_front_of_a_real_vllm(scenario: Scenario, real_chain: Chain) -> None:
    check(real_chain, scenario)
