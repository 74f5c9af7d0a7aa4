"""proxy.serving.health: GET /ready turns 200 only once the upstream answered and the tokenizers are loaded."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, ServerConfig, TokenizersConfig, UpstreamConfig
from proxy.serving.health import UpstreamState, readiness
from tests.support.fakevllm import FakeVLLM

MODEL = "Qwen/Qwen3-8B"


# ----------------------------------------------------------------- pure

def test_not_ready_until_the_upstream_answered() -> None:
    ok, doc = readiness([UpstreamState("default", "http://vllm:8000", answered=False,
                                       last_error="connection refused")], {})
    assert not ok and doc["ready"] is False
    assert doc["missing"] == [
        "upstream default (http://vllm:8000) has not answered GET /v1/models yet: connection refused"
    ]


def test_not_ready_while_a_tokenizer_is_pending() -> None:
    up = UpstreamState("default", "http://vllm:8000", answered=True, max_model_len={"a": 4096, "b": 8192})
    ok, doc = readiness([up], {"a": "local"})
    assert not ok
    assert doc["missing"] == ["model b: its tokenizer is not loaded yet"]
    assert doc["models"]["a"] == {"upstream": "default", "max_model_len": 4096, "counted_by": "local"}
    assert doc["models"]["b"]["counted_by"] == "pending"


def test_ready_when_every_model_is_settled_locally_or_upstream() -> None:
    ups = [UpstreamState("default", "http://a:8000", answered=True, max_model_len={"a": 4096}),
           UpstreamState("big", "http://b:8000", answered=True, max_model_len={"a": 1, "b": None})]
    ok, doc = readiness(ups, {"a": "local", "b": "upstream"})
    assert ok and doc["missing"] == []
    assert doc["models"]["a"]["upstream"] == "default"        # served twice: the first upstream routes it
    assert doc["models"]["b"] == {"upstream": "big", "max_model_len": None, "counted_by": "upstream"}


def test_every_upstream_must_have_answered() -> None:
    ups = [UpstreamState("default", "http://a:8000", answered=True, max_model_len={"a": 4096}),
           UpstreamState("big", "http://b:8000", answered=False)]
    ok, doc = readiness(ups, {"a": "local"})
    assert not ok and len(doc["missing"]) == 1 and "upstream big (http://b:8000)" in doc["missing"][0]


# ----------------------------------------------------------------- the app, in-process

def make_config(url: str, tmp_path: Path, **server: Any) -> Config:
    # An empty HF cache: only the card's `root` (or nothing) can provide a tokenizer.
    return Config(server=ServerConfig(**server), upstream=UpstreamConfig(url=url, connect_timeout=2.0),
                  tokenizers=TokenizersConfig(hf_home=str(tmp_path)))


async def settle(app: BrimfulApp) -> None:
    """Read /v1/models now and wait for the tokenizer preloads it starts (no sleeping)."""
    await app.backends.refresh_all()
    while app._background:
        await asyncio.gather(*list(app._background), return_exceptions=True)


@pytest.fixture
async def started() -> AsyncIterator[list[BrimfulApp]]:
    apps: list[BrimfulApp] = []
    yield apps
    for app in apps:
        await app.shutdown()


def client(app: BrimfulApp) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://brimful")


async def test_ready_is_503_until_the_upstream_starts_then_200(
    qwen3_dir: Path, tmp_path: Path, started: list[BrimfulApp]
) -> None:
    async with FakeVLLM(model=MODEL, root=str(qwen3_dir), max_model_len=8192) as fake:
        fake.ready = False                                  # vLLM still loading: its port is closed
        app = BrimfulApp(make_config(fake.base_url, tmp_path))
        started.append(app)
        await app.startup()
        await app.backends.refresh_all()
        async with client(app) as http:
            response = await http.get("/ready")
            assert response.status_code == 503
            assert response.headers["cache-control"] == "no-store"
            body = response.json()
            assert body["ready"] is False and body["upstreams"][0]["answered"] is False
            assert body["missing"][0].startswith("upstream default has not answered")
            assert fake.base_url not in response.text
            assert body["upstreams"][0]["last_error"].startswith("brimful could not connect to the upstream")
            assert (await http.get("/live")).json() == {"live": True}     # alive all along

            fake.ready = True
            await settle(app)
            response = await http.get("/ready")
            assert response.status_code == 200, response.json()
            body = response.json()
            assert body["ready"] is True and body["missing"] == []
            assert body["models"] == {MODEL: {"upstream": "default", "max_model_len": 8192, "counted_by": "local"}}
            assert not any(r.path == "/ready" for r in fake.requests)     # answered by brimful itself


async def test_a_model_without_local_tokenizer_is_ready_counted_upstream(
    tmp_path: Path, started: list[BrimfulApp]
) -> None:
    async with FakeVLLM(model=MODEL, root="/nowhere/Qwen3-8B") as fake:
        app = BrimfulApp(make_config(fake.base_url, tmp_path))
        started.append(app)
        await app.startup()
        async with client(app) as http:
            await settle(app)
            response = await http.get("/ready")
            assert response.status_code == 200
            assert response.json()["models"][MODEL]["counted_by"] == "upstream"


async def test_ready_stays_200_through_an_outage_and_says_so(
    qwen3_dir: Path, tmp_path: Path, started: list[BrimfulApp]
) -> None:
    async with FakeVLLM(model=MODEL, root=str(qwen3_dir)) as fake:
        app = BrimfulApp(make_config(fake.base_url, tmp_path))
        started.append(app)
        await app.startup()
        async with client(app) as http:
            await settle(app)
            assert (await http.get("/ready")).status_code == 200
            fake.ready = False
            await app.backends.refresh_all()
            response = await http.get("/ready")
            assert response.status_code == 200
            assert response.json()["upstreams"][0]["last_error"] is not None     # the outage is shown
            fake.ready = True
            await app.backends.refresh_all()
            assert (await http.get("/ready")).json()["upstreams"][0]["last_error"] is None


async def test_probes_need_no_api_key(qwen3_dir: Path, tmp_path: Path, started: list[BrimfulApp]) -> None:
    async with FakeVLLM(model=MODEL, root=str(qwen3_dir)) as fake:
        app = BrimfulApp(make_config(fake.base_url, tmp_path, api_keys=["secret"]))
        started.append(app)
        await app.startup()
        async with client(app) as http:
            await settle(app)
            assert (await http.get("/ready")).status_code == 200
            assert (await http.get("/live")).status_code == 200
            assert (await http.get("/v1/models")).status_code == 401     # the API itself still asks
