"""The counting budget shared fairly (issue 25 item 4): a request of very many inputs is counted
in slices, each holding its own share of `tokenizers.count_memory_bytes`, so an ordinary long
chat is counted beside it instead of waiting for it and getting 503 counting_busy."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from proxy.admitted.surfaces import EMBEDDINGS
from proxy.app import BrimfulApp
from tests.support.stack import CHAT, MODEL, ListRecorder, call_app, make_config
from tests.support.transport import MockResponse, MockTransport, SentRequest
from tokenizer_cache import ModelTokenizer, load_model_tokenizer

MML = 8192
MARK = "BIG-REQUEST-FIRST-INPUT"


def _answer(sent: SentRequest) -> MockResponse:
    if sent.path == "/v1/models":
        return MockResponse.json({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": MML}]})
    if sent.path == "/v1/embeddings":
        count = len(sent.json()["input"])
        return MockResponse.json({"object": "list", "data": [], "usage": {"prompt_tokens": count,
                                                                          "total_tokens": count}})
    if sent.path == CHAT:
        return MockResponse.json({"id": "c", "object": "chat.completion", "model": MODEL, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    return MockResponse.json({"detail": "Not Found"}, status=404)


@pytest.mark.slow      # loads the Qwen3 tokenizer and counts 250,000 inputs
async def test_many_inputs_do_not_hold_the_whole_budget(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entered, finish = threading.Event(), threading.Event()
    real = ModelTokenizer.count_completion

    def count_completion(self: ModelTokenizer, body: dict[str, Any], **kw: Any) -> list[int]:
        prompt = body.get("prompt")
        if prompt == MARK or (isinstance(prompt, list) and MARK in prompt):
            entered.set()
            finish.wait(30)             # the big request's first piece of counting, held open
        return real(self, body, **kw)

    monkeypatch.setattr(ModelTokenizer, "count_completion", count_completion)
    config = make_config("http://upstream.test", qwen3_dir)
    config.tokenizers.parity_check = False
    config.tokenizers.count_memory_bytes = 64 * 1024 * 1024
    config.upstream.queue_timeout = 1.0
    transport = MockTransport(_answer)
    app = BrimfulApp(config, ListRecorder(), transport_for=lambda url: transport)
    big = json.dumps({"model": MODEL, "input": [MARK] + ["a"] * 250_000}).encode()       # 1.25 MB
    chat = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * 4000}],  # 20 KB
                       "max_tokens": 5}).encode()
    await app.startup()
    assert await app.counter.tokenizer(MODEL) is not None      # loaded (seconds) before anything is timed
    try:
        first = asyncio.ensure_future(call_app(app, "POST", "/v1/embeddings", big))
        assert await asyncio.to_thread(entered.wait, 30)
        held = app.counter.budget.used
        assert 0 < held < config.tokenizers.count_memory_bytes // 2
        answer = await call_app(app, "POST", CHAT, chat)       # counted beside it, not after it
        assert answer.status == 200, answer.body
        finish.set()
        assert (await first).status == 200
    finally:
        finish.set()
        await app.shutdown()
    assert app.counter.budget.used == 0


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> ModelTokenizer:
    return load_model_tokenizer(qwen3_dir)


def test_slices_weigh_their_own_inputs_and_count_as_the_whole(qwen3: ModelTokenizer) -> None:
    body: dict[str, Any] = {"model": MODEL, "input": ["x" * 9000] + ["hello world"] * 3000 + [[1, 2, 3]] * 10}
    slices = EMBEDDINGS.count_slices(body, 8192)
    assert slices is not None and len(slices) > 2
    assert slices[0].size == 9003                      # the long input alone: it weighs what it is
    assert all(s.size <= 8192 for s in slices[1:])
    assert [n for s in slices for n in s.count(qwen3)] == EMBEDDINGS.count(qwen3, body)
    assert EMBEDDINGS.count_slices({"input": ["a", "b"]}, 8192) is None


# -- item 5: the character-bound render is budgeted and stops past the bound --------------------

def test_the_rendered_length_stops_past_the_cap(qwen3: ModelTokenizer) -> None:
    small = {"messages": [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "hi"}]}
    assert qwen3.render_chat_length(small, 10_000) == len(qwen3.render_chat(small))
    many = {"messages": [{"role": "user", "content": ""}] * 20_000}
    measured = qwen3.render_chat_length(many, 1000)
    assert 1000 < measured < 2000 < len(qwen3.render_chat(many))


async def test_a_conversation_over_the_bound_is_refused_within_the_budget(qwen3_dir: Path) -> None:
    config = make_config("http://upstream.test", qwen3_dir)
    config.tokenizers.parity_check = False
    transport = MockTransport(_answer)
    app = BrimfulApp(config, ListRecorder(), transport_for=lambda url: transport)
    taken: list[int] = []
    acquire = app.counter.budget.acquire

    async def recording(weight: int) -> int:
        taken.append(weight)
        return await acquire(weight)

    app.counter.budget.acquire = recording  # type: ignore[method-assign]
    body = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": ""}] * 200_000}).encode()
    await app.startup()
    try:
        answer = await call_app(app, "POST", CHAT, body)
    finally:
        await app.shutdown()
    error = json.loads(answer.body)["error"]
    assert answer.status == 400 and "your prompt contains at least" in error["message"]
    assert taken and taken[0] >= len(body) * 16          # the render's memory was weighed first
    assert [r.path for r in transport.sent if r.path == CHAT] == []


@pytest.mark.parametrize("path", [CHAT, "/v1/messages"])
async def test_a_conversation_over_the_bound_by_its_roles_is_refused_unprepared(
        qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    """50,000 empty user messages: Qwen3's template writes at least 28 characters for each, 1.4 M in
    all, over the 1,048,576 of 8,192 tokens; refused with that floor, no message prepared."""
    from tokenizer_cache import _chat
    prepare = _chat.parse_messages

    def small_only(body: Any, *args: Any) -> Any:     # the model's one-time probes render tiny chats
        assert len(body["messages"]) < 10, "the long conversation's messages were prepared"
        return prepare(body, *args)

    monkeypatch.setattr(_chat, "parse_messages", small_only)
    config = make_config("http://upstream.test", qwen3_dir)
    config.tokenizers.parity_check = False
    transport = MockTransport(_answer)
    app = BrimfulApp(config, ListRecorder(), transport_for=lambda url: transport)
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": ""}] * 50_000}
    if path != CHAT:
        body["max_tokens"] = 16
    await app.startup()
    try:
        answer = await call_app(app, "POST", path, json.dumps(body).encode())
    finally:
        await app.shutdown()
    assert answer.status == 400, answer.body
    text = answer.body.decode()
    assert "your prompt contains at least 1400000 characters (more than 1048576 characters" in text
    assert [r.path for r in transport.sent if r.path in (CHAT, path)] == []
