"""proxy.upstream.models.ModelRegistry: what the operator is told while waiting for an upstream, and after."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from proxy.config import Config, ModelConfig, UpstreamConfig
from proxy.errors import BrimfulError, ErrorCode
from proxy.upstream import models as limits
from proxy.upstream.models import ModelRegistry, waiting_message

MODELS = {"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "root": "/models/q", "max_model_len": 8192}]}
REFUSED = BrimfulError(502, "brimful could not connect to the upstream http://vllm:8000 (Connection refused).",
                        code=ErrorCode.UPSTREAM_UNREACHABLE)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Upstream:
    """The registry's fetch: answers or fails as the test says."""

    def __init__(self) -> None:
        self.up = False

    async def fetch(self) -> Any:
        if not self.up:
            raise REFUSED
        return MODELS


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    c = Clock()
    monkeypatch.setattr(limits.time, "monotonic", c)
    return c


def messages(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "brimful.models"]


async def test_waiting_is_explained_once_then_reminded_once_a_minute(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "brimful.models")
    upstream = Upstream()
    registry = ModelRegistry(Config(upstream=UpstreamConfig(url="http://vllm:8000")), upstream.fetch)
    for _ in range(5):                       # the background loop's quick retries
        assert await registry.refresh() is False
        clock.now += 2
    said = messages(caplog)
    assert said == [(logging.WARNING, waiting_message("default", "http://vllm:8000", str(REFUSED)))]
    text = said[0][1]
    assert "waiting for the upstream at http://vllm:8000 to answer GET /v1/models." in text
    assert "Connection refused" in text and "BrimfulError" not in text
    assert "--upstream URL, BRIMFUL_UPSTREAM_URL=URL, or url in the [upstream] section" in text

    clock.now += 60
    await registry.refresh()
    reminder = f"still no answer from the upstream at http://vllm:8000 after 70 s: {REFUSED}"
    assert messages(caplog)[1] == (logging.WARNING, reminder)

    upstream.up = True
    clock.now += 5
    assert await registry.refresh() is True
    assert (logging.INFO, "the upstream at http://vllm:8000 answered GET /v1/models, after 75 s of waiting") \
        in messages(caplog)


async def test_an_outage_and_the_recovery_are_logged_once_each(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    upstream = Upstream()
    upstream.up = True
    registry = ModelRegistry(Config(), upstream.fetch, url="http://10.0.0.2:8000", name="big")
    assert await registry.refresh() is True
    caplog.clear()
    caplog.set_level(logging.INFO, "brimful.models")
    upstream.up = False
    for _ in range(3):
        await registry.refresh()
        clock.now += 10
    assert messages(caplog) == [(logging.WARNING, (
        "the upstream at http://10.0.0.2:8000 stopped answering GET /v1/models. "
        f"{REFUSED} brimful keeps its last model list and retries in the background."))]
    assert registry.get("Qwen/Qwen3-8B") is not None            # the last list is kept
    upstream.up = True
    await registry.refresh()
    assert messages(caplog)[-1] == (
        logging.INFO, "the upstream at http://10.0.0.2:8000 answers GET /v1/models again, after 30 s")
    await registry.refresh()
    assert len(messages(caplog)) == 2                           # nothing more while it answers


def test_a_named_upstream_is_pointed_at_its_config_entry() -> None:
    text = waiting_message("big", "http://10.0.0.2:8000", "ValueError: the /v1/models answer has no 'data' list")
    assert "no 'data' list. brimful retries" in text
    assert "the url of the [[upstreams]] entry named 'big' in the config file." in text


def test_backends_name_each_registry_after_its_upstream() -> None:
    from proxy.config import UpstreamEntry
    from proxy.upstream.backends import Backends

    config = Config(upstream=UpstreamConfig(url="http://a:8000"),
                    upstreams=[UpstreamEntry(name="big", url="http://b:8000")])
    backends = Backends(config)
    assert [(b.registry.name, b.registry.url) for b in backends.items] == [
        ("default", "http://a:8000"), ("big", "http://b:8000")]



# -- a card without a usable max_model_len ------------------------------------------------

@pytest.mark.parametrize("value", [0, -5, "4096", 4096.0, True, None, [4096]])
def test_a_card_without_a_usable_limit_says_why_and_takes_the_fallback(value: Any) -> None:
    card = {"id": "m", "max_model_len": value} if value is not None else {"id": "m"}
    [info] = limits.parse_models({"data": [card]}).values()
    assert info.max_model_len is None and info.limit_problem is not None
    assert ("no max_model_len" in info.limit_problem) is (value is None)
    [fell_back] = limits.parse_models({"data": [card]}, fallback=8192).values()
    assert (fell_back.max_model_len, fell_back.source) == (8192, "fallback")
    assert "fallback_max_model_len = 8192" in limits.limit_warning("http://vllm:8000", fell_back)
    assert 'models."m".max_model_len' in limits.limit_warning("http://vllm:8000", info)


def test_lora_adapters_inherit_and_good_cards_have_no_problem() -> None:
    payload = {"data": [{"id": "base", "max_model_len": 4096}, {"id": "lora", "parent": "base", "max_model_len": None}]}
    models = limits.parse_models(payload, fallback=99)
    assert (models["base"].max_model_len, models["base"].limit_problem) == (4096, None)
    assert (models["lora"].max_model_len, models["lora"].source, models["lora"].limit_problem) == (4096, "parent", None)


def test_a_lora_adapter_takes_its_base_models_configured_window() -> None:
    """The adapter runs in the base model's engine: the window set for the base is its window too."""
    carded = {"data": [{"id": "base", "max_model_len": 8192}, {"id": "lora", "parent": "base"}]}
    models = limits.parse_models(carded, {"base": ModelConfig(max_model_len=4096)})
    assert (models["lora"].max_model_len, models["lora"].source) == (4096, "parent")
    cardless = {"data": [{"id": "base"}, {"id": "lora", "parent": "base"}]}
    models = limits.parse_models(cardless, {"base": ModelConfig(max_model_len=32768)}, fallback=2048)
    assert (models["lora"].max_model_len, models["lora"].source) == (32768, "parent")
    own = limits.parse_models(cardless, {"base": ModelConfig(max_model_len=32768),
                                         "lora": ModelConfig(max_model_len=1024)}, fallback=2048)
    assert (own["lora"].max_model_len, own["lora"].source) == (1024, "config")
    neither = limits.parse_models(cardless, {}, fallback=2048)
    assert [(i.max_model_len, i.source) for i in neither.values()] == [(2048, "fallback")] * 2
