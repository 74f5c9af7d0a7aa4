"""The Responses, Messages and pooling surfaces through proxy.admitted.exchange, in-process (no sockets).

The upstream is `tests.support.transport.MockTransport` answering with the
shapes a real vLLM 0.32 sends (tests/data/vllm032_surfaces/); each test checks
what the upstream received, what the client got, and the one length record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.admitted import surfaces
from proxy.app import BrimfulApp
from tests.support.stack import MODEL, ListRecorder, call_app, make_config
from tests.support.transport import MockResponse, MockTransport, SentRequest

MML = 2048
SURFACE_CAPTURES = Path(__file__).resolve().parents[1] / "data" / "vllm032_surfaces"


class Upstream:
    """/v1/models plus one queue of answers per path (a callable answer gets the request)."""

    def __init__(self, **answers: list[Any]) -> None:
        self.answers = {"/" + path.replace("__", "/"): list(queue) for path, queue in answers.items()}
        self.transport = MockTransport(self.handle)

    def handle(self, sent: SentRequest) -> MockResponse:
        if sent.path == "/v1/models":
            return MockResponse.json({"object": "list", "data": [
                {"id": MODEL, "object": "model", "max_model_len": MML}]})
        queue = self.answers.get(sent.path)
        if not queue:
            return MockResponse.json({"detail": "Not Found"}, status=404)
        answer = queue.pop(0)
        return answer(sent) if callable(answer) else answer

    def sent(self, path: str) -> list[SentRequest]:
        return [s for s in self.transport.sent if s.path == path]


def app_for(upstream: Upstream, tokenizer_dir: Path | None, **policy: Any) -> tuple[BrimfulApp, ListRecorder]:
    recorder = ListRecorder()
    config = make_config("http://upstream.test", tokenizer_dir, policy=policy)
    return BrimfulApp(config, recorder, transport_for=lambda url: upstream.transport), recorder


def body(**fields: Any) -> bytes:
    return json.dumps({"model": MODEL, **fields}).encode()


def sse(*events: tuple[str, dict[str, Any]]) -> MockResponse:
    chunks = [f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode() for name, data in events]
    return MockResponse(200, [("content-type", "text/event-stream; charset=utf-8")], chunks)


def sse_events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n") if ": " in line)
        if "data" in lines:
            out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


WORDS_2100 = " ".join(["hello"] * 2100)


# ---------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------

def response_object(prompt: int, output: int, status: str = "incomplete") -> dict[str, Any]:
    return {"id": "resp_1", "object": "response", "model": MODEL, "status": status,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "output": [], "usage": {"input_tokens": prompt, "output_tokens": output,
                                    "total_tokens": prompt + output}}


async def test_responses_max_output_tokens_is_clamped_and_recorded(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_responses({"input": "Hello!"})
    upstream = Upstream(v1__responses=[lambda s: MockResponse.json(response_object(prompt, 5))])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input="Hello!", max_output_tokens=65535))

    assert answer.status == 200
    assert upstream.sent("/v1/responses")[0].json()["max_output_tokens"] == MML - prompt
    assert (answer.headers["x-brimful-action"], answer.headers["x-brimful-prompt-tokens"]) == ("clamped", str(prompt))
    [rec] = recorder.records
    assert (rec.endpoint, rec.action, rec.prompt_tokens, rec.upstream_prompt_tokens) == (
        "responses", "clamped", prompt, prompt)
    assert (rec.requested_max_tokens, rec.granted_max_tokens, rec.completion_tokens) == (65535, MML - prompt, 5)
    assert rec.finish_reasons == ["length"]


async def test_a_responses_prompt_that_cannot_fit_is_refused_in_openais_envelope(qwen3_dir: Path) -> None:
    upstream = Upstream()
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input=WORDS_2100, max_output_tokens=4))

    assert answer.status == 400 and upstream.sent("/v1/responses") == []
    error = json.loads(answer.body)["error"]
    assert (error["code"], error["param"], error["brimful"]["prompt_tokens"]) == (
        "context_length_exceeded", "input", 2108)
    assert recorder.records[0].action == "rejected"


async def test_a_responses_stream_is_relayed_and_its_completed_event_read(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_responses({"input": "Hello!"})
    stream = sse(
        ("response.created", {"response": {**response_object(prompt, 0, "in_progress"), "usage": None},
                              "sequence_number": 0, "type": "response.created"}),
        ("response.output_text.delta", {"delta": "hi", "sequence_number": 1, "type": "response.output_text.delta"}),
        ("response.completed", {"response": response_object(prompt, 1), "sequence_number": 2,
                                "type": "response.completed"}))
    upstream = Upstream(v1__responses=[stream])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input="Hello!", max_output_tokens=3, stream=True))

    assert [name for name, _ in sse_events(answer.body)] == [
        "response.created", "response.output_text.delta", "response.completed"]
    assert len(answer.chunks) >= 3           # relayed as the events arrived, not gathered
    [rec] = recorder.records
    assert (rec.stream, rec.action, rec.upstream_prompt_tokens, rec.completion_tokens, rec.finish_reasons) == (
        True, "pass", prompt, 1, ["length"])


async def test_a_responses_stream_that_breaks_off_ends_with_an_error_event(qwen3_dir: Path) -> None:
    """vLLM 0.32 closes a Responses stream without a terminal event when its engine dies (capture x02)."""
    stream = sse(("response.created", {"sequence_number": 0, "type": "response.created"}),
                 ("response.output_text.delta", {"delta": "hi", "sequence_number": 4,
                                                 "type": "response.output_text.delta"}))
    upstream = Upstream(v1__responses=[stream])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input="Hello!", max_output_tokens=3, stream=True))

    name, last = sse_events(answer.body)[-1]
    assert name == "error" and last["type"] == "error" and last["sequence_number"] == 5
    assert last["code"] == "upstream_connection_error" and "'response.completed' event" in last["message"]
    assert last["error"]["message"] == last["message"]        # what the openai client raises APIError with
    [rec] = recorder.records
    assert (rec.action, rec.error_code) == ("upstream_error", "upstream_connection_error")


async def test_a_stored_conversation_is_forwarded_uncounted(qwen3_dir: Path) -> None:
    upstream = Upstream(v1__responses=[MockResponse.json(response_object(40, 3))])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input=WORDS_2100, previous_response_id="resp_0",
                                                               max_output_tokens=65535))

    assert answer.status == 200
    assert upstream.sent("/v1/responses")[0].json()["max_output_tokens"] == MML   # vLLM refuses > max_model_len
    assert answer.headers["x-brimful-action"] == "uncounted"
    assert answer.headers["x-brimful-uncounted"] == "previous_response_id"
    assert "x-brimful-prompt-tokens" not in answer.headers
    [rec] = recorder.records
    assert (rec.action, rec.prompt_tokens, rec.upstream_prompt_tokens, rec.granted_max_tokens) == (
        "uncounted", None, 40, MML)


async def test_responses_are_counted_by_the_upstreams_tokenize_without_a_local_tokenizer(qwen3: Any) -> None:
    prompt = qwen3.count_responses({"input": [{"type": "message", "role": "user",
                                               "content": [{"type": "input_text", "text": "Hello!"}]}]})
    upstream = Upstream(tokenize=[lambda s: MockResponse.json({"count": qwen3.count_chat(s.json()),
                                                               "max_model_len": MML, "tokens": []})],
                        v1__responses=[MockResponse.json(response_object(prompt, 3))])
    app, recorder = app_for(upstream, None)

    answer = await call_app(app, "POST", "/v1/responses", body(
        input=[{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello!"}]}],
        max_output_tokens=65535))

    assert answer.status == 200 and answer.headers["x-brimful-count"] == "upstream"
    tokenize = upstream.sent("/tokenize")[0].json()
    assert tokenize["messages"][0]["content"] == [{"type": "text", "text": "Hello!"}]
    assert tokenize["add_special_tokens"] is True
    assert recorder.records[0].prompt_tokens == prompt


async def test_responses_the_tokenize_route_refuses_goes_to_vllms_own_route(qwen3: Any) -> None:
    """/tokenize takes other fields than /v1/responses: its refusal is no verdict on the request, which
    goes uncounted to the route whose vLLM serves it or words its own refusal."""
    tokenize_refusal = MockResponse.json({"error": {"message": "1 validation error: body.prompt Field required",
                                                    "type": "Bad Request", "param": "body.prompt", "code": 400}},
                                         status=400)
    upstream = Upstream(tokenize=[tokenize_refusal], v1__responses=[MockResponse.json(response_object(9, 3))])
    app, recorder = app_for(upstream, None)
    sent = body(input="Hello!", max_output_tokens=100)

    answer = await call_app(app, "POST", "/v1/responses", sent)

    assert answer.status == 200 and upstream.sent("/v1/responses")[0].body == sent
    assert answer.headers["x-brimful-uncounted"] == "tokenize_refused"
    assert recorder.records[0].action == "uncounted"


INSTRUCTED = {"instructions": "Be brief.", "input": [{"role": "user", "content": "a"},
                                                     {"role": "assistant", "content": "b"}]}


@pytest.mark.parametrize("extra,param", [
    ([{"role": "user", "content": None}], "input[2].content"),
    ([{"role": "user", "content": [{"type": "input_text", "text": None}]}], "input[2].content[0].text"),
    ([{"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
      {"type": "function_call_output", "call_id": "c1", "output": 5}], "input[3].output"),
])
async def test_a_responses_refusal_names_the_requests_own_fields(
        qwen3_dir: Path, extra: list[Any], param: str) -> None:
    """The conversion's chat paths (`messages[3].content`, shifted by the instructions) are not the client's."""
    app, _ = app_for(Upstream(), qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(**{**INSTRUCTED,
                                                                  "input": INSTRUCTED["input"] + extra}))

    error = json.loads(answer.body)["error"]
    assert answer.status == 400 and error["param"] == param
    assert "messages[" not in error["message"], error["message"]


@pytest.mark.parametrize("tools,param", [
    ([{"type": "function", "name": "f", "description": 5}], "tools[0].description"),
    ([{"type": "web_search"}, {"type": "function", "name": "f", "description": 5}], "tools[1].description"),
    ([{"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "ok", "description": "d"},
                                                   {"type": "function", "name": "g", "description": 5}]}],
     "tools[0].tools[1].description"),
])
async def test_a_responses_tool_refusal_names_the_responses_tool_field(
        qwen3_dir: Path, tools: list[Any], param: str) -> None:
    """The chat's tools are the function tools only, namespaces flattened: their index is not the request's."""
    app, _ = app_for(Upstream(), qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input="hi", tools=tools))

    error = json.loads(answer.body)["error"]
    assert answer.status == 400 and error["param"] == param


async def test_a_responses_prompt_template_is_refused_as_vllm_refuses_it(qwen3_dir: Path) -> None:
    """ResponsesRequest.validate_prompt (vLLM 0.32): "prompt template is not supported", param prompt."""
    app, _ = app_for(Upstream(), qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(prompt={"id": "pmpt_1"}))

    error = json.loads(answer.body)["error"]
    assert (answer.status, error["param"], error["message"]) == (400, "prompt", "prompt template is not supported")


# ---------------------------------------------------------------------------
# Anthropic Messages
# ---------------------------------------------------------------------------

def message_object(prompt: int, output: int) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "x"}],
            "model": MODEL, "stop_reason": "max_tokens", "usage": {"input_tokens": prompt, "output_tokens": output}}


MESSAGE = [{"role": "user", "content": "Hello!"}]


async def test_messages_max_tokens_is_clamped_and_recorded(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_messages({"messages": MESSAGE})
    upstream = Upstream(v1__messages=[MockResponse.json(message_object(prompt, 4))])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages", body(messages=MESSAGE, max_tokens=65535))

    assert answer.status == 200 and answer.headers["x-brimful-action"] == "clamped"
    assert upstream.sent("/v1/messages")[0].json()["max_tokens"] == MML - prompt
    [rec] = recorder.records
    assert (rec.endpoint, rec.prompt_tokens, rec.upstream_prompt_tokens, rec.completion_tokens) == (
        "messages", prompt, prompt, 4)
    assert (rec.granted_max_tokens, rec.finish_reasons) == (MML - prompt, ["length"])


@pytest.mark.parametrize("words,max_tokens,budget", [
    (600, 2000, 1500),          # the grant leaves room for a budget: the budget goes under it
    (600, 2000, 1500.0),        # pydantic's lax int: vLLM reads 1500.0 and "1500" as 1500
    (600, 2000, "1500"),
    (600, 32000, 31999),        # Claude Code's ask (vLLM alone refuses 32,000 > 2,048): saved the same way
    (1200, 2000, 1024),         # no room for vLLM's least budget (1,024): the least valid limit, vLLM clamps
])
async def test_a_clamp_keeps_the_thinking_budget_below_max_tokens_as_vllm_requires(
        qwen3_dir: Path, qwen3: Any, words: int, max_tokens: int, budget: int) -> None:
    """vLLM 0.32 refuses budget_tokens >= max_tokens and budget_tokens < 1,024 (anthropic/protocol.py)."""
    messages = [{"role": "user", "content": " ".join(["hello"] * words)}]
    thinking = {"type": "enabled", "budget_tokens": budget}
    prompt = qwen3.count_messages({"messages": messages, "thinking": thinking})
    upstream = Upstream(v1__messages=[MockResponse.json(message_object(prompt, 4))])
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages", body(messages=messages, max_tokens=max_tokens,
                                                                 thinking=thinking))

    sent = upstream.sent("/v1/messages")[0].json()
    assert 1024 <= int(sent["thinking"]["budget_tokens"]) < sent["max_tokens"] <= MML
    room = MML - prompt
    if room - 1 >= 1024:
        assert (sent["max_tokens"], sent["thinking"]) == (room, {"type": "enabled", "budget_tokens": room - 1})
    else:
        assert (sent["max_tokens"], sent["thinking"]) == (int(budget) + 1, thinking)
    assert answer.headers["x-brimful-granted-max-tokens"] == str(sent["max_tokens"])


async def test_the_operators_ceiling_is_not_raised_for_a_thinking_budget(qwen3_dir: Path, qwen3: Any) -> None:
    messages = [{"role": "user", "content": " ".join(["hello"] * 1200)}]
    thinking = {"type": "enabled", "budget_tokens": 1500}
    upstream = Upstream(v1__messages=[MockResponse.json(message_object(1208, 4))])
    app, _ = app_for(upstream, qwen3_dir, max_tokens_ceiling=1000)

    await call_app(app, "POST", "/v1/messages", body(messages=messages, max_tokens=2000, thinking=thinking))

    assert upstream.sent("/v1/messages")[0].json()["max_tokens"] <= 1000


async def test_a_messages_refusal_is_in_anthropics_envelope(qwen3_dir: Path) -> None:
    upstream = Upstream()
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages", body(
        messages=[{"role": "user", "content": WORDS_2100}], max_tokens=4))

    assert answer.status == 400
    error = json.loads(answer.body)
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert "2108 tokens" in error["error"]["message"]
    assert error["error"]["brimful"] == {"code": "context_length_exceeded", "param": "messages",
                                          "prompt_tokens": 2108, "max_model_len": MML, "tokens_to_remove": 61}
    assert recorder.records[0].action == "rejected"


async def test_an_unauthorized_messages_request_is_refused_in_anthropics_envelope(qwen3_dir: Path) -> None:
    upstream = Upstream()
    recorder = ListRecorder()
    config = make_config("http://upstream.test", qwen3_dir)
    config.server.api_keys = ["secret"]
    app = BrimfulApp(config, recorder, transport_for=lambda url: upstream.transport)

    answer = await call_app(app, "POST", "/v1/messages", body(messages=MESSAGE, max_tokens=4))

    assert answer.status == 401
    assert json.loads(answer.body)["error"]["type"] == "authentication_error"


def messages_stream(prompt: int, output: int, *, end: bool = True) -> MockResponse:
    events = [
        ("message_start", {"type": "message_start", "message": {
            "id": "m", "type": "message", "role": "assistant", "content": [], "model": MODEL,
            "usage": {"input_tokens": prompt, "output_tokens": 0}}}),
        ("content_block_start", {"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                                 "index": 0}),
        ("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": "x"},
                                 "index": 0}),
    ]
    if end:
        events += [("content_block_stop", {"type": "content_block_stop", "index": 0}),
                   ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "max_tokens"},
                                      "usage": {"input_tokens": prompt, "output_tokens": output}}),
                   ("message_stop", {"type": "message_stop"})]
    return sse(*events)


async def test_a_messages_stream_is_relayed_and_its_usage_read(qwen3_dir: Path, qwen3: Any) -> None:
    prompt = qwen3.count_messages({"messages": MESSAGE})
    upstream = Upstream(v1__messages=[messages_stream(prompt, 1)])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages", body(messages=MESSAGE, max_tokens=1, stream=True))

    assert [n for n, _ in sse_events(answer.body)][-1] == "message_stop"
    [rec] = recorder.records
    assert (rec.action, rec.upstream_prompt_tokens, rec.completion_tokens, rec.finish_reasons) == (
        "pass", prompt, 1, ["length"])


async def test_a_messages_stream_that_breaks_off_ends_with_anthropics_error_event(qwen3_dir: Path, qwen3: Any) -> None:
    upstream = Upstream(v1__messages=[messages_stream(10, 0, end=False)])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages", body(messages=MESSAGE, max_tokens=5, stream=True))

    name, last = sse_events(answer.body)[-1]
    assert name == "error" and last["type"] == "error" and last["error"]["type"] == "api_error"
    assert "'message_stop' event" in last["error"]["message"]
    [rec] = recorder.records
    assert (rec.action, rec.error_code) == ("upstream_error", "upstream_connection_error")


async def test_vllms_own_messages_error_event_is_relayed_and_recorded(qwen3_dir: Path) -> None:
    """Capture x03: vLLM's Messages stream ends with `event: error` when its engine dies."""
    failed = sse(("message_start", {"type": "message_start", "message": {"usage": {"input_tokens": 10}}}),
                 ("error", {"type": "error", "error": {"type": "internal_error", "message": "engine died"}}))
    upstream = Upstream(v1__messages=[failed])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages", body(messages=MESSAGE, max_tokens=5, stream=True))

    assert b"engine died" in answer.body and answer.body.count(b"event: error") == 1
    [rec] = recorder.records
    assert (rec.action, rec.error_code) == ("upstream_error", "upstream_stream_error")


async def test_count_tokens_is_answered_by_brimful_without_the_upstream(qwen3_dir: Path, qwen3: Any) -> None:
    upstream = Upstream()
    app, recorder = app_for(upstream, qwen3_dir)
    long = [{"role": "user", "content": WORDS_2100}]

    answer = await call_app(app, "POST", "/v1/messages/count_tokens", body(messages=long))

    assert answer.status == 200
    assert json.loads(answer.body) == {"input_tokens": 2108, "context_management": {"original_input_tokens": 2108}}
    assert answer.headers["x-brimful-prompt-tokens"] == "2108"
    # (the start-up parity probes' /tokenize may run in the background: they are not this request)
    assert [s.path for s in upstream.transport.sent if s.path.startswith("/v1/messages")] == []
    assert recorder.records == []                 # nothing was generated: no length record


async def test_count_tokens_asks_vllms_own_route_without_a_local_tokenizer() -> None:
    upstream = Upstream(v1__messages__count_tokens=[MockResponse.json({"input_tokens": 10})])
    app, _ = app_for(upstream, None)

    answer = await call_app(app, "POST", "/v1/messages/count_tokens", body(messages=MESSAGE, system="s"))

    assert json.loads(answer.body)["input_tokens"] == 10 and answer.headers["x-brimful-count"] == "upstream"
    assert upstream.sent("/v1/messages/count_tokens")[0].json() == {"model": MODEL, "messages": MESSAGE,
                                                                     "system": "s"}


async def test_count_tokens_for_a_name_no_list_holds_is_vllms_to_answer(qwen3_dir: Path) -> None:
    """As /v1/messages: vLLM with VLLM_SKIP_MODEL_NAME_VALIDATION counts for any name; else its 404,
    worded as brimful's (every upstream's models)."""
    missing = MockResponse.json({"error": {"message": "The model `claude-x` does not exist.",
                                           "type": "NotFoundError", "param": "model", "code": 404}}, status=404)
    upstream = Upstream(v1__messages__count_tokens=[MockResponse.json({"input_tokens": 42}), missing])
    app, _ = app_for(upstream, qwen3_dir)
    sent = json.dumps({"model": "claude-x", "messages": MESSAGE}).encode()

    counted = await call_app(app, "POST", "/v1/messages/count_tokens", sent)
    refused = await call_app(app, "POST", "/v1/messages/count_tokens", sent)

    assert (counted.status, json.loads(counted.body)) == (200, {"input_tokens": 42})
    assert upstream.sent("/v1/messages/count_tokens")[0].body == sent
    assert refused.status == 404 and json.loads(refused.body)["type"] == "error"
    said = json.loads(refused.body)["error"]["message"]
    assert said == f"The model `claude-x` does not exist. Valid aliases: {MODEL}."


async def test_count_tokens_for_an_unlisted_name_keeps_vllms_cors_and_reads_a_bounded_answer(qwen3_dir: Path) -> None:
    refusal = json.dumps({"error": {"message": "The model `claude-x` does not exist.", "type": "NotFoundError",
                                    "param": "model", "code": 404}}).encode()
    missing = MockResponse(404, [("content-type", "application/json"),
                                 ("access-control-allow-origin", "https://app.example")], [refusal])
    huge = MockResponse(200, [("content-type", "application/json")], [b"[" + b"0," * 600_000 + b"0]"])
    upstream = Upstream(v1__messages__count_tokens=[missing, huge])
    app, _ = app_for(upstream, qwen3_dir)
    sent = json.dumps({"model": "claude-x", "messages": MESSAGE}).encode()

    refused = await call_app(app, "POST", "/v1/messages/count_tokens", sent)
    oversized = await call_app(app, "POST", "/v1/messages/count_tokens", sent)

    assert refused.status == 404 and refused.headers["access-control-allow-origin"] == "https://app.example"
    assert oversized.status == 502 and len(oversized.body) < 10_000


async def test_count_tokens_of_media_nobody_counted_is_the_upstreams_failure_never_zero(qwen3_dir: Path) -> None:
    """A chat whose image nothing counts is forwarded uncounted; a count of it cannot be answered
    at all: the upstream's own count failing is the answer, in Anthropic's shape."""
    busy = MockResponse.json({"error": {"message": "busy", "type": "ServiceUnavailable", "code": 503}}, status=503)
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    pictured = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image]}]
    upstream = Upstream(v1__messages__count_tokens=[busy, MockResponse.json({"input_tokens": 77})])
    app, _ = app_for(upstream, qwen3_dir)

    failed = await call_app(app, "POST", "/v1/messages/count_tokens", body(messages=pictured))
    counted = await call_app(app, "POST", "/v1/messages/count_tokens", body(messages=pictured))

    assert failed.status == 503, failed.body
    assert json.loads(failed.body)["type"] == "error" and "busy" in json.loads(failed.body)["error"]["message"]
    assert (counted.status, json.loads(counted.body)["input_tokens"]) == (200, 77)
    assert counted.headers["x-brimful-count"] == "upstream"


async def test_count_tokens_errors_are_anthropic_shaped(qwen3_dir: Path) -> None:
    app, _ = app_for(Upstream(), qwen3_dir)

    answer = await call_app(app, "POST", "/v1/messages/count_tokens", body(messages="not a list"))

    assert answer.status == 400 and json.loads(answer.body)["error"]["type"] == "invalid_request_error"


# ---------------------------------------------------------------------------
# Pooling
# ---------------------------------------------------------------------------

# ---------------------------------------------------------------------------
# Completions with prompt_embeds: served by vLLM, counted by nothing here
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("prompt", [None, "Hello there"])
async def test_prompt_embeds_are_forwarded_uncounted_and_their_usage_moves_no_trust(
        qwen3_dir: Path, prompt: str | None) -> None:
    """vLLM (--enable-prompt-embeds) serves the tensors as prompts of their own, beside any text
    prompt; brimful cannot read their lengths, so it neither refuses them nor counts the text alone."""
    def served(sent: SentRequest) -> MockResponse:
        return MockResponse.json({"id": "c", "object": "text_completion", "model": MODEL, "choices": [
            {"index": 0, "text": "x", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51}})

    upstream = Upstream(v1__completions=[served, served, served])
    app, recorder = app_for(upstream, qwen3_dir)
    fields = {"prompt_embeds": "UEsDBAAACAgAAAAAAAAAAAAAAAAAAAAAAAAQ", "max_tokens": 65535}
    if prompt is not None:
        fields["prompt"] = prompt

    answers = [await call_app(app, "POST", "/v1/completions", body(**fields)) for _ in range(3)]

    assert [a.status for a in answers] == [200] * 3
    assert answers[0].headers["x-brimful-uncounted"] == "prompt_embeds"
    assert upstream.sent("/v1/completions")[0].json() == {"model": MODEL, **fields, "max_tokens": MML}
    trust = app.counter.trust(MODEL)
    assert (trust.mode, trust.drift_requests) == ("local", 0)
    assert [r.action for r in recorder.records] == ["uncounted"] * 3


def embeddings(prompt: int, n: int) -> MockResponse:
    return MockResponse.json({"object": "list", "data": [{"index": i, "embedding": [0.1]} for i in range(n)],
                              "usage": {"prompt_tokens": prompt, "total_tokens": prompt, "completion_tokens": 0}})


@pytest.mark.parametrize("fields,said", [({}, "'input' is required"), ({"input": 5}, "'input' must be"),
                                          ({"input": {"a": 1}}, "'input' must be")])
async def test_an_embeddings_input_of_no_shape_is_refused_naming_input(
        qwen3_dir: Path, fields: dict[str, Any], said: str) -> None:
    upstream = Upstream()
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(**fields))

    error = json.loads(answer.body)["error"]
    assert (answer.status, error["param"]) == (400, "input") and said in error["message"]
    assert upstream.sent("/v1/embeddings") == []


async def test_embeddings_that_fit_pass_and_the_longest_input_is_recorded(qwen3_dir: Path) -> None:
    upstream = Upstream(v1__embeddings=[embeddings(4, 2)])
    app, recorder = app_for(upstream, qwen3_dir)
    sent = body(input=["Hello there", "second one"])

    answer = await call_app(app, "POST", "/v1/embeddings", sent)

    assert answer.status == 200 and upstream.sent("/v1/embeddings")[0].body == sent
    [rec] = recorder.records
    assert (rec.endpoint, rec.action, rec.prompt_tokens, rec.longest_prompt_tokens, rec.upstream_prompt_tokens) == (
        "embeddings", "pass", 4, 2, 4)


def vllm_input_too_long() -> MockResponse:
    """vLLM 0.32's answer to an embeddings input over its window (captures p02_embeddings_input_over)."""
    capture = json.loads((SURFACE_CAPTURES / "p02_embeddings_input_over.json").read_text())
    return MockResponse.json(capture["body"], status=capture["status"])


async def test_an_input_longer_than_max_model_len_is_named(qwen3_dir: Path) -> None:
    """vLLM may take longer embeddings than its card's window (the pooler's max_embed_len): the input is
    sent on, and where vLLM refuses it for length, the answer is brimful's, naming each input."""
    upstream = Upstream(v1__embeddings=[vllm_input_too_long()])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100, " ".join(["hi"] * 2048)]))

    assert answer.status == 400 and len(upstream.sent("/v1/embeddings")) == 1
    error = json.loads(answer.body)["error"]
    assert error["brimful"]["inputs"] == [{"index": 1, "prompt_tokens": 2100, "tokens_to_remove": 52}]
    assert "input 1 of 'input' is 2100 tokens" in error["message"]
    assert recorder.records[0].action == "rejected"


async def test_an_input_longer_than_the_cards_window_is_served_where_vllm_chunks_it(qwen3_dir: Path) -> None:
    """`--pooler-config '{"enable_chunked_processing": true, "max_embed_len": 8192}'`: vLLM embeds a
    2,100-token input on a 2,048-token card; brimful does not refuse it."""
    upstream = Upstream(v1__embeddings=[embeddings(2101, 2)])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100]))

    assert answer.status == 200 and answer.headers["x-brimful-action"] == "pass"
    assert recorder.records[0].action == "pass"


async def test_a_rerank_document_longer_than_the_window_is_refused_without_the_upstream(qwen3_dir: Path) -> None:
    """Scoring holds every input to max_model_len (no pooler override there): brimful's refusal stands."""
    upstream = Upstream()
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/rerank", body(query="q", documents=[WORDS_2100]))

    assert answer.status == 400 and upstream.sent("/v1/rerank") == []


async def test_the_clients_truncation_is_counted_as_vllm_applies_it(qwen3_dir: Path) -> None:
    upstream = Upstream(v1__embeddings=[embeddings(2049, 2)])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100], truncate_prompt_tokens=-1))

    assert answer.status == 200 and "truncate_prompt_tokens" in upstream.sent("/v1/embeddings")[0].json()
    [rec] = recorder.records
    assert (rec.action, rec.prompt_tokens, rec.upstream_prompt_tokens) == ("pass", 2049, 2049)   # no drift


@pytest.mark.parametrize("value", ["-1", " 2048 ", 2048.0, "512"])
async def test_a_truncation_sent_as_text_or_float_is_read_as_vllm_reads_it(qwen3_dir: Path, value: Any) -> None:
    """vLLM 0.32's `truncate_prompt_tokens: Annotated[int, Field(ge=-1)]` is lax: "-1" and 2048.0 truncate."""
    upstream = Upstream(v1__embeddings=[embeddings(2049, 2)])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100], truncate_prompt_tokens=value))

    assert answer.status == 200 and upstream.sent("/v1/embeddings")[0].json()["truncate_prompt_tokens"] == value
    kept = 512 if value == "512" else MML
    assert recorder.records[0].prompt_tokens == 1 + kept


@pytest.mark.parametrize("value", ["-2", "1.5", None, [1]])
async def test_a_truncation_vllm_refuses_is_left_to_vllm(qwen3_dir: Path, value: Any) -> None:
    refusal = MockResponse.json({"error": {"message": "truncate_prompt_tokens: invalid", "type": "BadRequestError",
                                           "param": None, "code": 400}}, status=400)
    upstream = Upstream(v1__embeddings=[vllm_input_too_long() if value is None else refusal])
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100], truncate_prompt_tokens=value))

    assert len(upstream.sent("/v1/embeddings")) == 1
    assert answer.status == 400
    if value is None:       # null is "no truncation": the 2,100-token input is brimful's to refuse
        assert json.loads(answer.body)["error"]["code"] == "context_length_exceeded"


async def test_rerank_reads_a_per_document_limit_sent_as_text(qwen3_dir: Path) -> None:
    """ScoreRequestMixin's `max_tokens_per_doc: int = 0` is lax too: "100" truncates each document."""
    upstream = Upstream(v1__rerank=[MockResponse.json({"id": "rerank-1", "results": [],
                                                       "usage": {"prompt_tokens": 101, "total_tokens": 101}})])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/rerank", body(query="q", documents=[WORDS_2100],
                                                             max_tokens_per_doc="100"))

    assert answer.status == 200 and len(upstream.sent("/v1/rerank")) == 1
    assert recorder.records[0].prompt_tokens == 101


async def test_a_batch_of_conversations_in_input_is_counted_as_conversations(qwen3_dir: Path, qwen3: Any) -> None:
    """EmbeddingBatchChatInputRequest: lists of messages in `input` are conversations, not token ids."""
    batch = [[{"role": "user", "content": "Hello there, how are you?"}],
             [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]]
    counts = [qwen3.count_chat({"messages": c, "add_generation_prompt": False, "add_special_tokens": False})
              for c in batch]
    upstream = Upstream(v1__embeddings=[embeddings(sum(counts), 2)])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=batch))

    assert answer.status == 200
    [rec] = recorder.records
    assert (rec.prompt_tokens, rec.longest_prompt_tokens, rec.upstream_prompt_tokens) == (
        sum(counts), max(counts), sum(counts))
    assert min(counts) > 2          # a count of messages (1 and 2) would be taken for drift


async def test_a_pooling_plugins_data_is_forwarded_uncounted(qwen3_dir: Path) -> None:
    """vLLM 0.32's IOProcessorRequest: `/pooling` with the plugin's `data` and no `input`."""
    sent = body(data={"url": "https://example.test/tile.tiff", "out_format": "b64_json"}, task="plugin")
    upstream = Upstream(pooling=[MockResponse.json({"request_id": "p-1", "created_at": 1, "data": {"ok": 1}})])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/pooling", sent)

    assert answer.status == 200 and upstream.sent("/pooling")[0].body == sent
    assert recorder.records[0].action == "uncounted"


async def test_a_large_binary_embeddings_answer_reaches_the_client_whole(qwen3_dir: Path) -> None:
    """`encoding_format: "bytes"` answers are raw octets (vLLM 0.32 pooling/utils.py); past 1 MiB they are
    relayed as they come, and not being JSON does not cut them."""
    chunks = [bytes(range(256)) * 1024] * 6                  # 1.5 MiB of float32s
    octets = MockResponse(200, [("content-type", "application/octet-stream")], list(chunks))
    upstream = Upstream(v1__embeddings=[octets])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["hi"] * 384, encoding_format="bytes"))

    assert answer.status == 200 and answer.body == b"".join(chunks)
    assert recorder.records[0].error_code is None


async def test_a_large_json_answer_cut_short_is_still_cut(qwen3_dir: Path) -> None:
    whole = json.dumps({"object": "list", "data": [{"index": 0, "embedding": [0.5] * 400_000}]}).encode()
    cut = MockResponse(200, [("content-type", "application/json")], [whole[:1_200_000], whole[1_200_000:-3]])
    upstream = Upstream(v1__embeddings=[cut])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input="hi"))

    assert len(answer.body) < len(whole) - 3 and recorder.records[0].error_code is not None


async def test_the_operator_may_opt_into_truncation_and_it_is_flagged(qwen3_dir: Path) -> None:
    upstream = Upstream(v1__embeddings=[embeddings(2049, 2)])
    app, recorder = app_for(upstream, qwen3_dir, truncate_inputs=True)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100]))

    assert answer.status == 200 and answer.headers["x-brimful-action"] == "truncated"
    assert upstream.sent("/v1/embeddings")[0].json()["truncate_prompt_tokens"] == MML
    [rec] = recorder.records
    assert (rec.action, rec.prompt_tokens, rec.longest_prompt_tokens) == ("truncated", 2049, MML)


async def test_score_counts_each_query_and_document(qwen3_dir: Path) -> None:
    upstream = Upstream(score=[MockResponse.json({"data": [], "usage": {"prompt_tokens": 8, "total_tokens": 8}})])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/score", body(queries="what is it", documents=["one doc",
                                                                                        "another doc here"]))

    assert answer.status == 200
    assert recorder.records[0].prompt_tokens == 8 and recorder.records[0].endpoint == "score"


async def test_rerank_refuses_a_document_that_cannot_fit(qwen3_dir: Path) -> None:
    app, _ = app_for(Upstream(), qwen3_dir)

    answer = await call_app(app, "POST", "/v1/rerank", body(query="q", documents=["fine", WORDS_2100]))

    error = json.loads(answer.body)["error"]
    assert answer.status == 400 and error["param"] == "documents"
    assert error["brimful"]["inputs"][0]["index"] == 2          # the query is input 0


async def test_metrics_and_stats_name_each_surface(qwen3_dir: Path, qwen3: Any) -> None:
    from proxy.recording.metrics import Metrics
    from proxy.recording.recorder import Recorder

    prompt = qwen3.count_messages({"messages": MESSAGE})
    upstream = Upstream(v1__messages=[MockResponse.json(message_object(prompt, 4))],
                        v1__responses=[MockResponse.json(response_object(prompt, 4))],
                        v1__embeddings=[embeddings(2, 1)])
    recorder = Recorder(Metrics())
    app = BrimfulApp(make_config("http://upstream.test", qwen3_dir), recorder,
                      transport_for=lambda url: upstream.transport)

    await call_app(app, "POST", "/v1/messages", body(messages=MESSAGE, max_tokens=65535))
    await call_app(app, "POST", "/v1/responses", body(input="Hello!", max_output_tokens=5))
    await call_app(app, "POST", "/v1/embeddings", body(input="Hello there"))
    await call_app(app, "POST", "/v1/responses", body(input="x", previous_response_id="resp_0"))

    text = recorder.render_metrics()[0].decode()
    for endpoint, action, status in (("messages", "clamped", 200), ("responses", "pass", 200),
                                     ("embeddings", "pass", 200), ("responses", "upstream_error", 404)):
        assert (f'brimful_requests_total{{action="{action}",endpoint="{endpoint}",model="{MODEL}",'
                f'status="{status}"}} 1.0') in text
    [stats] = recorder.stats()["models"]
    assert stats["endpoints"] == {"responses": 2, "messages": 1, "embeddings": 1}


async def test_a_responses_prompt_vllm_truncates_is_served(qwen3_dir: Path) -> None:
    """truncation "auto": vLLM keeps max_model_len - 1 tokens of a prompt too long (never worse: no refusal)."""
    upstream = Upstream(v1__responses=[MockResponse.json(response_object(MML - 1, 1))])
    app, recorder = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/responses", body(input=WORDS_2100, truncation="auto",
                                                               max_output_tokens=100))

    assert answer.status == 200 and upstream.sent("/v1/responses")[0].json()["max_output_tokens"] == 1
    [rec] = recorder.records
    assert (rec.action, rec.prompt_tokens, rec.upstream_prompt_tokens, rec.granted_max_tokens) == (
        "clamped", MML - 1, MML - 1, 1)


# ---------------------------------------------------------------------------
# Completion limits read, and companions kept valid, as vLLM 0.32 reads them
# ---------------------------------------------------------------------------

def served(sent: SentRequest) -> MockResponse:
    return MockResponse.json({"id": "x", "object": "text_completion", "model": MODEL, "choices": [
        {"index": 0, "text": "hi", "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


async def forwarded(qwen3_dir: Path, path: str, fields: dict[str, Any], **policy: Any) -> tuple[int, dict[str, Any]]:
    """The status brimful answered and the body it sent on."""
    upstream = Upstream(**{path.strip("/").replace("/", "__"): [served]})
    app, _ = app_for(upstream, qwen3_dir, **policy)
    answer = await call_app(app, "POST", path, body(**fields))
    sent = upstream.sent(path)
    return answer.status, sent[0].json() if sent else {}


@pytest.mark.parametrize("losing", [0, -3])
async def test_a_limit_field_another_overrides_is_never_range_checked(qwen3_dir: Path, losing: int) -> None:
    """Chat's max_completion_tokens wins; vLLM never reads the losing max_tokens' value."""
    status, sent = await forwarded(qwen3_dir, "/v1/chat/completions", {
        "messages": MESSAGE, "max_completion_tokens": 5, "max_tokens": losing})
    assert (status, sent["max_completion_tokens"], sent["max_tokens"]) == (200, 5, losing)


async def test_echo_with_max_tokens_zero_is_forwarded_as_vllms_echo_without_generation(qwen3_dir: Path) -> None:
    status, sent = await forwarded(qwen3_dir, "/v1/completions", {"prompt": "Hello there", "echo": True,
                                                                  "max_tokens": 0})
    assert (status, sent["max_tokens"]) == (200, 0)
    status, _ = await forwarded(qwen3_dir, "/v1/completions", {"prompt": "Hello there", "max_tokens": 0})
    assert status == 400                        # without echo vLLM refuses 0 too


async def test_a_null_completions_limit_is_vllms_16_so_truncating_to_the_window_leaves_it_room(
        qwen3_dir: Path) -> None:
    """normalize_null_max_tokens: null is 16; truncate_prompt_tokens -1 then keeps max_model_len - 1."""
    status, sent = await forwarded(qwen3_dir, "/v1/completions", {
        "prompt": WORDS_2100, "max_tokens": None, "truncate_prompt_tokens": -1})
    assert status == 200 and sent["truncate_prompt_tokens"] == -1


@pytest.mark.parametrize("fields,policy,limit", [
    ({"messages": [{"role": "user", "content": " ".join(["hello"] * 1900)}], "max_tokens": 1000,
      "min_tokens": 130}, {"margin_tokens": 16}, 2048 - 1908 - 16),
    ({"messages": MESSAGE, "min_tokens": 100}, {"max_tokens_ceiling": 50}, 50),
])
async def test_min_tokens_follows_a_limit_brimful_lowers_below_it(
        qwen3_dir: Path, fields: dict[str, Any], policy: dict[str, Any], limit: int) -> None:
    """vLLM's SamplingParams refuses min_tokens > max_tokens."""
    status, sent = await forwarded(qwen3_dir, "/v1/chat/completions", fields, **policy)
    assert (status, sent["max_tokens"], sent["min_tokens"]) == (200, limit, limit)
    status, sent = await forwarded(qwen3_dir, "/v1/chat/completions", {**fields, "min_tokens": 3}, **policy)
    assert sent["min_tokens"] == 3              # under the limit: untouched


# vLLM 0.32's TokenizeChatRequest (entrypoints/serve/tokenize/protocol.py): every other field is ignored.
TOKENIZE_CHAT_FIELDS = ("messages", "add_generation_prompt", "return_token_strs", "continue_final_message",
                        "add_special_tokens", "chat_template", "chat_template_kwargs", "media_io_kwargs",
                        "mm_processor_kwargs", "tools")


@pytest.mark.parametrize("fields", [
    {"reasoning_effort": "none"},
    {"reasoning_effort": "high"},
    {"reasoning_effort": "none", "chat_template_kwargs": {"enable_thinking": True}},
    {"reasoning_effort": "low", "chat_template_kwargs": {"reasoning_effort": "high", "x": 1}},
    {"chat_template_kwargs": {"enable_thinking": False}},
])
def test_the_tokenize_request_renders_what_the_chat_route_renders(qwen3: Any, fields: dict[str, Any]) -> None:
    """In `upstream` mode /tokenize's count is taken as exact: its body must carry what the chat route
    hands the template, reasoning_effort and documents included, though /tokenize has no such fields."""
    chat = {"messages": [{"role": "user", "content": "Hello!"}], **fields}
    [call] = surfaces.CHAT.tokenize_calls(MODEL, chat)
    assert isinstance(call, surfaces.UpstreamCount)
    as_vllm_reads_it = {k: v for k, v in call.body.items() if k in TOKENIZE_CHAT_FIELDS}

    assert qwen3.count_chat(as_vllm_reads_it) == qwen3.count_chat(chat)


def test_the_tokenize_request_carries_documents_and_the_processors_kwargs() -> None:
    documents = [{"title": "a", "text": "b"}]
    chat = {"messages": [{"role": "user", "content": "Hi"}], "documents": documents,
            "chat_template_kwargs": {"documents": [], "k": 1}, "mm_processor_kwargs": {"num_crops": 16},
            "media_io_kwargs": {"video": {"num_frames": 8}}}
    [call] = surfaces.CHAT.tokenize_calls(MODEL, chat)
    assert isinstance(call, surfaces.UpstreamCount)
    assert call.body["chat_template_kwargs"] == {"documents": documents, "k": 1}
    assert call.body["mm_processor_kwargs"] == {"num_crops": 16}
    assert call.body["media_io_kwargs"] == {"video": {"num_frames": 8}}
    assert set(call.body) <= {"model", *TOKENIZE_CHAT_FIELDS}


async def test_an_embeddings_input_over_the_cards_character_bound_goes_to_vllm(qwen3_dir: Path) -> None:
    """vLLM's character bound follows max_embed_len where the pooler sets one: brimful counts instead."""
    long_text = "hello " * 50_000             # 300,000 characters: over Qwen3's 2,048 x 128
    upstream = Upstream(v1__embeddings=[embeddings(50_000, 1)])
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=long_text))

    assert answer.status == 200 and len(upstream.sent("/v1/embeddings")) == 1


def vllm_input_too_long_for(window: int, tokens: int) -> MockResponse:
    """vLLM 0.32's words (captures p02) for an input over its pooler's window."""
    capture = json.loads((SURFACE_CAPTURES / "p02_embeddings_input_over.json").read_text())
    message = capture["body"]["error"]["message"].replace("2048", str(window)).replace("2049", str(tokens))
    return MockResponse.json({"error": {**capture["body"]["error"], "message": message}}, status=400)


async def test_a_confirmed_embeddings_refusal_uses_vllms_window_not_the_cards(qwen3_dir: Path) -> None:
    """max_embed_len 4096 on a 2,048 card: vLLM refuses for the 4,200-token input only, so the answer
    names that one, against 4,096, and never tells the client to cut the 2,100-token one."""
    upstream = Upstream(v1__embeddings=[vllm_input_too_long_for(4096, 4200)])
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=[WORDS_2100, " ".join(["hello"] * 4200)]))

    error = json.loads(answer.body)["error"]
    assert answer.status == 400 and error["code"] == "context_length_exceeded"
    assert error["brimful"]["inputs"] == [{"index": 1, "prompt_tokens": 4200, "tokens_to_remove": 104}]
    assert error["brimful"]["max_model_len"] == 4096


async def test_answers_built_from_vllms_refusal_keep_its_cors_headers(qwen3_dir: Path) -> None:
    capture = json.loads((SURFACE_CAPTURES / "p02_embeddings_input_over.json").read_text())
    refusal = MockResponse(400, [("content-type", "application/json"),
                                 ("access-control-allow-origin", "https://app.example")],
                           [json.dumps(capture["body"]).encode()])
    upstream = Upstream(v1__embeddings=[refusal])
    app, _ = app_for(upstream, qwen3_dir)

    answer = await call_app(app, "POST", "/v1/embeddings", body(input=["ok", WORDS_2100]))

    assert answer.status == 400 and answer.headers["access-control-allow-origin"] == "https://app.example"
