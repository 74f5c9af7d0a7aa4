"""Drift caught, never shipped: usage comparison, hidden usage chunks, retry, start-up parity."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os

import httpx
import pytest

from proxy.admitted import counting
from proxy.admitted.counting import PromptCounter
from proxy.app import BrimfulApp
from proxy.config import Config
from proxy.upstream.backends import Backends
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tests.support.stack import fake_counter, make_config

HELLO = [{"role": "user", "content": "Hello!"}]


def local_only(config: Config) -> Config:
    """No start-up parity check: the model stays counted locally whatever the upstream counts,
    so a test sees brimful's own count meet the upstream's answers."""
    config.tokenizers.parity_check = False
    return config


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.split("\n") if line.startswith("data: ")]


def metric_value(metrics: str, name: str, model: str = "tiny-qwen") -> float | None:
    for line in metrics.splitlines():
        if line.startswith(f'{name}{{model="{model}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_stream_usage_is_requested_upstream_and_hidden_from_the_client(qwen3, qwen3_dir) -> None:
    with FakeVLLM(count_prompt=fake_counter(qwen3, 0)) as fake:
        app = BrimfulApp(make_config(fake.base_url, qwen3_dir))
        with serve_in_thread(app) as base:
            body = {"model": "tiny-qwen", "messages": HELLO, "max_tokens": 3, "stream": True}
            through = httpx.post(base + "/v1/chat/completions", json=body, timeout=10).text
            direct = httpx.post(fake.base_url + "/v1/chat/completions", json=body, timeout=10).text
            stats = httpx.get(base + "/stats").json()
    sent = next(r for r in fake.requests if r.path == "/v1/chat/completions").json
    assert sent["stream_options"] == {"include_usage": True}
    events = sse_events(through)
    assert all('"usage"' not in e for e in events[:-1]), "the client did not ask for usage"
    assert len(events) == len(sse_events(direct))   # same events as vLLM sends without usage
    assert events[-1] == "[DONE]"
    model = stats["models"][0]
    assert model["completion_tokens"]["max"] == 3    # recorded from the hidden usage chunk


def test_stream_usage_kept_when_the_client_asked(qwen3, qwen3_dir) -> None:
    with (
        FakeVLLM(count_prompt=fake_counter(qwen3, 0)) as fake,
        serve_in_thread(BrimfulApp(make_config(fake.base_url, qwen3_dir))) as base,
    ):
        body = {"model": "tiny-qwen", "messages": HELLO, "max_tokens": 2, "stream": True,
                "stream_options": {"include_usage": True}}
        raw = json.dumps(body).encode()
        events = sse_events(httpx.post(base + "/v1/chat/completions", content=raw,
                                       headers={"content-type": "application/json"}).text)
    assert json.loads(events[-2])["usage"]["prompt_tokens"] == 10
    assert next(r for r in fake.requests if r.path == "/v1/chat/completions").body == raw


def test_drift_is_exported_and_logged_without_text(qwen3, qwen3_dir, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="brimful")
    with (
        FakeVLLM(count_prompt=fake_counter(qwen3, 3)) as fake,
        serve_in_thread(BrimfulApp(local_only(make_config(fake.base_url, qwen3_dir)))) as base,
    ):
        response = httpx.post(base + "/v1/chat/completions",
                              json={"model": "tiny-qwen", "messages": [{"role": "user", "content": "SECRET-MARKER"}],
                                    "max_tokens": 2})
        assert response.status_code == 200
        metrics = httpx.get(base + "/metrics").text
    assert metric_value(metrics, "brimful_prompt_token_drift_total") == 1.0
    drift_lines = [r.getMessage() for r in caplog.records if "drift" in r.getMessage()]
    assert drift_lines and "tiny-qwen" in drift_lines[0]
    assert all("SECRET-MARKER" not in r.getMessage() for r in caplog.records)


def test_upstream_length_rejection_after_clamp_is_retried_once(qwen3, qwen3_dir) -> None:
    # The fake counts 40 tokens more than brimful and rejects like old vLLM:
    # brimful's clamp is too generous, the upstream says so with its numbers,
    # and brimful retries once with the limit those numbers allow.
    with (
        FakeVLLM(mode="legacy", count_prompt=fake_counter(qwen3, 40)) as fake,
        serve_in_thread(BrimfulApp(local_only(make_config(fake.base_url, qwen3_dir)))) as base,
    ):
        response = httpx.post(base + "/v1/chat/completions",
                              json={"model": "tiny-qwen", "messages": HELLO, "max_tokens": 99999})
        metrics = httpx.get(base + "/metrics").text
    assert response.status_code == 200, response.text
    chats = [r for r in fake.requests if r.path == "/v1/chat/completions"]
    assert [r.json["max_tokens"] for r in chats] == [2048 - 10, 2048 - 50]
    assert response.headers["x-brimful-granted-max-tokens"] == str(2048 - 50)
    assert response.json()["usage"]["completion_tokens"] == 2048 - 50
    assert metric_value(metrics, "brimful_length_retries_total") == 1.0


@pytest.mark.parametrize("offset,expected", [(0, True), (1, False)])
async def test_startup_parity_check(qwen3, qwen3_dir, offset: int, expected: bool, caplog) -> None:
    caplog.set_level(logging.WARNING, logger="brimful")
    async with FakeVLLM(count_prompt=fake_counter(qwen3, offset)) as fake:
        config = make_config(fake.base_url, qwen3_dir)
        backends = Backends(config)
        try:
            counter = PromptCounter(config, backends)
            seen = []
            counter.on_parity.append(lambda model, ok: seen.append((model, ok)))
            await backends.default.registry.refresh()
            await counter.preload(["tiny-qwen"])
        finally:
            await backends.default.upstream.close()
    assert seen == [("tiny-qwen", expected)]
    warned = any("differ from the upstream's /tokenize" in r.getMessage() for r in caplog.records)
    assert warned is (not expected)


async def test_a_preload_cancelled_before_it_ran_keeps_no_request_waiting(
        qwen3_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """A list change cancels the previous list's preload, maybe before it started: requests for its
    models must not wait for probes that will never run."""
    monkeypatch.setattr(counting, "PROBE_WAIT_S", 3600.0)
    config = make_config("http://127.0.0.1:9", qwen3_dir)
    counter = PromptCounter(config, Backends(config))
    preload = counter.preload(["tiny-qwen"])
    preload.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await preload

    await asyncio.wait_for(counter.probed("tiny-qwen"), 60)      # a guard against a hang, not a wait


async def test_stalled_probes_hold_requests_only_until_probe_wait_after_they_began(
        qwen3_dir, monkeypatch: pytest.MonkeyPatch) -> None:
    """Probes an upstream never answers (each may take upstream.timeout) make requests wait until
    PROBE_WAIT_S after they began, not PROBE_WAIT_S each."""
    monkeypatch.setattr(counting, "PROBE_WAIT_S", 1.0)
    stalled = asyncio.Event()

    async def never(*_: object) -> None:
        await stalled.wait()

    config = make_config("http://127.0.0.1:9", qwen3_dir)
    counter = PromptCounter(config, Backends(config))
    monkeypatch.setattr(counter, "_preload_one", never)
    preload = counter.preload(["tiny-qwen"])
    try:
        await counter.probed("tiny-qwen")                       # waits out the 1 s
        await asyncio.wait_for(counter.probed("tiny-qwen"), 0.5)  # the next request does not wait again
        assert not preload.done()
    finally:
        preload.cancel()


def test_parity_result_reaches_metrics(qwen3_dir) -> None:
    app = BrimfulApp(Config())
    for callback in app.counter.on_parity:
        callback("tiny-qwen", False)
    body, _ = app.recorder.metrics.render()
    assert metric_value(body.decode(), "brimful_tokenizer_parity") == 0.0


def test_resent_conversation_hits_the_piece_cache(qwen3, qwen3_dir) -> None:
    """An agent resending its conversation: the second request's pieces come from the cache."""
    with (
        FakeVLLM(count_prompt=fake_counter(qwen3, 0)) as fake,
        serve_in_thread(BrimfulApp(make_config(fake.base_url, qwen3_dir))) as base,
    ):
        turn = [{"role": "user", "content": "Explain KV caches. " * 50},
                {"role": "assistant", "content": "They store keys and values. " * 50}]
        counts = []
        for extra in ("First follow-up?", "Second follow-up?"):
            body = {"model": "tiny-qwen", "messages": [*turn, {"role": "user", "content": extra}], "max_tokens": 2}
            counts.append(httpx.post(base + "/v1/chat/completions", json=body).headers["x-brimful-prompt-tokens"])
        metrics = httpx.get(base + "/metrics").text
    assert counts[0] == counts[1]                       # same length, different last question
    hits = [line for line in metrics.splitlines()
            if line.startswith('brimful_piece_cache_lookups_total{result="hit"}')]
    assert hits and float(hits[0].rsplit(" ", 1)[1]) >= 2


@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="SCHED_IDLE is Linux-only")
def test_long_prompts_are_counted_on_threads_that_yield_to_the_event_loop() -> None:
    """The offload pool's threads are SCHED_IDLE: a woken event loop preempts them at once."""
    from proxy.admitted.counting import _long_prompt_pool

    policy = _long_prompt_pool().submit(os.sched_getscheduler, 0).result(timeout=10)
    assert policy == os.SCHED_IDLE
    assert os.sched_getscheduler(0) != os.SCHED_IDLE        # the caller's thread is untouched
