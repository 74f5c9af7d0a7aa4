"""Several upstreams, each serving its own models, chosen by the request's `model`."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, ConfigError, ModelConfig, UpstreamConfig, UpstreamEntry, load_config
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tests.support.stack import MODEL, ListRecorder, fake_counter, make_config
from tests.support.transport import MockResponse, MockTransport, SentRequest
from tokenizer_cache import load_model_tokenizer

HELLO = [{"role": "user", "content": "Hello!"}]


@pytest.fixture
def two_upstreams(qwen3_dir: Path):
    counter = fake_counter(load_model_tokenizer(qwen3_dir))   # both count as vLLM would
    with FakeVLLM(model="alpha", max_model_len=2048, count_prompt=counter) as a, \
            FakeVLLM(model="beta", max_model_len=4096, count_prompt=counter) as b:
        config = Config(upstream=UpstreamConfig(url=a.base_url, timeout=10.0),
                        upstreams=[UpstreamEntry(name="big", url=b.base_url)])
        for name in ("alpha", "beta"):
            config.models[name] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(BrimfulApp(config)) as base:
            yield a, b, base


def test_requests_are_routed_by_model(two_upstreams) -> None:
    a, b, base = two_upstreams
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    for model, fake, other, mml in (("alpha", a, b, 2048), ("beta", b, a, 4096)):
        raw = client.chat.completions.with_raw_response.create(model=model, messages=HELLO, max_tokens=99999)
        assert raw.headers["x-brimful-max-model-len"] == str(mml)
        assert raw.headers["x-brimful-granted-max-tokens"] == str(mml - 10)
        assert raw.parse().model == model
        assert any(r.path == "/v1/chat/completions" and r.json["model"] == model for r in fake.requests)
        assert not any(r.path == "/v1/chat/completions" and r.json["model"] == model for r in other.requests)


def test_models_list_is_merged(two_upstreams) -> None:
    _, _, base = two_upstreams
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    assert [m.id for m in client.models.list().data] == ["alpha", "beta"]


def test_pass_through_is_routed_by_body_model(two_upstreams) -> None:
    a, b, base = two_upstreams
    response = httpx.post(base + "/tokenize", json={"model": "beta", "prompt": "Hello"})
    assert response.status_code == 200
    def mine(r) -> bool:   # not the start-up parity probes, which also call /tokenize
        return r.path == "/tokenize" and (r.json or {}).get("prompt") == "Hello"

    assert len([r for r in b.requests if mine(r)]) == 1
    assert not any(mine(r) for r in a.requests)


def test_unknown_model_lists_every_upstreams_models(two_upstreams) -> None:
    _, _, base = two_upstreams
    client = openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gamma", messages=HELLO, max_tokens=2)
    assert info.value.body["message"] == "The model `gamma` does not exist. Valid aliases: alpha, beta."


def test_one_upstream_down_does_not_stop_the_other(qwen3_dir: Path) -> None:
    with FakeVLLM(model="beta") as b:
        with FakeVLLM(model="alpha") as dead:
            dead_url = dead.base_url
        config = Config(upstream=UpstreamConfig(url=dead_url, connect_timeout=1.0, timeout=5.0),
                        upstreams=[UpstreamEntry(name="b", url=b.base_url)])
        config.models["beta"] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(BrimfulApp(config)) as base:
            response = httpx.post(base + "/v1/chat/completions",
                                  json={"model": "beta", "messages": HELLO, "max_tokens": 3})
            assert response.status_code == 200
            models = httpx.get(base + "/v1/models").json()
            assert [m["id"] for m in models["data"]] == ["beta"]


def test_upstreams_config_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "h.toml"
    path.write_text('[upstream]\nurl = "http://a:1"\n[[upstreams]]\nname = "big"\nurl = "http://b:2"\napi_key = "k"\n')
    config = load_config(path, env={})
    assert config.upstreams == [UpstreamEntry(name="big", url="http://b:2", api_key="k")]
    path.write_text('[[upstreams]]\nurl = "http://b:2"\n')
    with pytest.raises(ConfigError, match=r"'upstreams\[0\].name' is required"):
        load_config(path, env={})
    path.write_text('[[upstreams]]\nname = "x"\nurl = "b:2"\n')
    with pytest.raises(ConfigError, match=r"'upstreams\[0\].url' must start with http"):
        load_config(path, env={})
    path.write_text('[[upstreams]]\nname = "x"\nurll = "http://b"\n')
    with pytest.raises(ConfigError, match=r"did you mean 'upstreams\[0\].url'"):
        load_config(path, env={})


async def test_each_upstreams_card_has_its_own_limit_unknown_series() -> None:
    """Two pools of one model: the one whose card lacks max_model_len stays 1 whatever the other lists."""
    def lister(cards: list[dict[str, object]]) -> MockTransport:
        def handle(sent: SentRequest) -> MockResponse:
            if sent.path == "/v1/models":
                return MockResponse.json({"object": "list", "data": cards})
            return MockResponse.json({"detail": "Not Found"}, status=404)
        return MockTransport(handle)

    a_cards: list[dict[str, object]] = [{"id": MODEL, "object": "model", "max_model_len": 4096}]
    a, b = lister(a_cards), lister([{"id": MODEL, "object": "model"}])
    config = make_config("http://a.test", None)
    config.upstreams.append(UpstreamEntry(name="b", url="http://b.test"))
    recorder = ListRecorder()
    app = BrimfulApp(config, recorder, transport_for=lambda url: b if "b.test" in url else a)

    def series() -> dict[str, float]:
        return {s.labels["upstream"]: s.value for f in recorder.metrics.registry.collect() for s in f.samples
                if s.name == "brimful_model_limit_unknown"}

    try:
        await app.backends.items[0].registry.refresh()
        await app.backends.items[1].registry.refresh()
        assert series() == {"default": 0, "b": 1}
        a_cards.append({"id": "other", "object": "model", "max_model_len": 4096})
        await app.backends.items[0].registry.refresh()
        assert series() == {"default": 0, "b": 1}
    finally:
        await app.shutdown()
