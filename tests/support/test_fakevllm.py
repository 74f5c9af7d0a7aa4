"""The fake vLLM answers like the real vLLM 0.32.0 did in shared/vllm/captures.

Every capture the fake emulates is replayed: its request is sent to the fake,
which is told (through `count_prompt`) the prompt token count the real server
saw, and the answer is compared -- status, headers, error bodies byte for byte,
success bodies after blanking ids, timestamps and generated text, and SSE
streams event by event.  The rest tests the knobs brimful's tests rely on:
modes, faults, readiness, pacing, disconnects, recording.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import SHARED
from tests.support.fakevllm import (
    FakeVLLM,
    FaultSpec,
    chatml_char_count,
    crude_count_prompt,
)

CAPTURES = SHARED / "vllm" / "captures"
MML = 2048

_ABBREV = re.compile(r"\.\.\.\[abbreviated by probe\.py: (\d+) (characters|items) in all\]$")


# --------------------------------------------------------------------------- #
# Reading captures
# --------------------------------------------------------------------------- #

def _period(seq: Any) -> int:
    """Smallest p such that seq repeats with period p (for rebuilding abbreviated prompts)."""
    for p in range(1, len(seq) + 1):
        if all(seq[i] == seq[i % p] for i in range(len(seq))):
            return p
    return len(seq)


def expand(obj: Any) -> Any:
    """Undo probe.py's abbreviations: a long string or list is rebuilt to its full length
    by repeating its (periodic) visible start -- the length is what the server judged."""
    if isinstance(obj, str):
        m = _ABBREV.search(obj)
        if m and m.group(2) == "characters":
            head = obj[: m.start()]
            unit = head[: _period(head)]
            total = int(m.group(1))
            return (unit * (total // len(unit) + 1))[:total]
        return obj
    if isinstance(obj, list):
        if obj and isinstance(obj[-1], str) and (m := _ABBREV.search(obj[-1])) and m.group(2) == "items":
            head = obj[:-1]
            unit = head[: _period(head)]
            total = int(m.group(1))
            return (unit * (total // len(unit) + 1))[:total]
        return [expand(x) for x in obj]
    if isinstance(obj, dict):
        return {k: expand(v) for k, v in obj.items()}
    return obj


def load(name: str) -> dict:
    return json.loads((CAPTURES / f"{name}.json").read_text())


def emulated_captures() -> list[str]:
    names = []
    for path in sorted(CAPTURES.glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and "request" in data and "status" in data:
            names.append(path.stem)
    return names


def known_count(name: str, capture: dict) -> dict[str, int] | int | None:
    """The prompt token count the real server saw for this capture's request."""
    body = capture.get("body")
    if isinstance(body, dict) and isinstance(body.get("usage"), dict):
        usage_count = body["usage"]["prompt_tokens"]
    elif capture.get("sse_events"):
        usage_count = next((e["usage"]["prompt_tokens"] for e in capture["sse_events"]
                            if isinstance(e, dict) and e.get("usage")), None)
    else:
        usage_count = None
    if name == "c27b_completions_batch_prompts":       # "a b c" + "d e f g h" = 8 (Qwen3)
        return {"a b c": 3, "d e f g h": 5}
    if name == "c27c_completions_batch_one_over":
        return {"a b c": 3, "*": 2_500}
    if usage_count is not None:
        return usage_count
    if isinstance(body, dict) and "count" in body:
        return body["count"]
    m = re.search(r"HF count(?: of this prompt:)? (\d+)", capture.get("note") or "")
    if m:
        return int(m.group(1))
    if isinstance(body, dict) and "at least 2049 input tokens" in json.dumps(body):
        return 2_109                                    # any count over max_model_len
    return None


class Counter:
    """A `count_prompt` the test points at the capture being replayed."""

    def __init__(self) -> None:
        self.value: dict[str, int] | int | None = None
        self.calls: list[tuple[str, dict]] = []

    def __call__(self, endpoint: str, body: dict) -> int:
        self.calls.append((endpoint, body))
        if isinstance(self.value, dict):
            prompt = body.get("prompt")
            return self.value.get(prompt, self.value.get("*", 1))
        if self.value is None:
            return crude_count_prompt(endpoint, body)
        return self.value


_VOLATILE_ID = re.compile(r"^(chatcmpl-|cmpl-|modelperm-)[0-9a-f]{16}$")


def normalize(obj: Any, key: str | None = None) -> Any:
    """Blank what legitimately differs between two runs: ids, timestamps, generated text, token ids."""
    if isinstance(obj, dict):
        return {k: normalize(v, k) for k, v in obj.items()}
    if isinstance(obj, list):
        if key in ("tokens", "token_strs"):
            return f"<{len(obj)} items>"
        return [normalize(x) for x in obj]
    if key == "created" and isinstance(obj, int):
        return "<created>"
    if isinstance(obj, str):
        if key == "id" and _VOLATILE_ID.match(obj):
            return obj.split("-")[0] + "-<id>"
        if key in ("content", "text", "prompt") and obj:
            return "<text>"
    return obj


def sse_events(raw: str) -> list[Any]:
    assert raw.endswith("\n\n"), "an SSE stream ends with a blank line"
    events = []
    for block in raw[:-2].split("\n\n"):
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


# --------------------------------------------------------------------------- #
# Fixtures: two long-lived fakes, as the captures came from two server launches
# --------------------------------------------------------------------------- #

@pytest.fixture(scope="module")
def counter() -> Counter:
    return Counter()


@pytest.fixture(scope="module")
def fakes(counter: Counter):
    # The plain launch had no tool parser (b06/b10: 400); the *_hermes captures had one.
    with FakeVLLM(count_prompt=counter, enable_auto_tool_choice=False) as plain, \
            FakeVLLM(count_prompt=counter, enable_auto_tool_choice=True) as hermes:
        yield {"plain": plain, "hermes": hermes}
        assert not plain.errors and not hermes.errors


# verify=False: plain http on loopback; it skips loading the CA bundle (~80 ms per client).
def replay(fake: FakeVLLM, capture: dict) -> httpx.Response:
    request = capture["request"]
    if "raw_body" in request:
        content = request["raw_body"].encode()
    elif "json" in request:
        content = json.dumps(expand(request["json"]), ensure_ascii=False).encode()
    else:
        content = None
    headers = {"content-type": "application/json"} if content is not None else {}
    with httpx.Client(base_url=fake.base_url, timeout=30, verify=False) as client:
        return client.request(request["method"], request["path"], content=content, headers=headers)


# --------------------------------------------------------------------------- #
# Capture replay
# --------------------------------------------------------------------------- #

@pytest.mark.parametrize("name", emulated_captures())
def test_fake_answers_like_the_capture(name: str, fakes: dict, counter: Counter) -> None:
    capture = load(name)
    counter.value = known_count(name, capture)
    fake = fakes["hermes" if name.endswith("_hermes") else "plain"]
    response = replay(fake, capture)

    assert response.status_code == capture["status"]
    for header in ("server", "content-type", "vary", "transfer-encoding"):
        assert response.headers.get(header) == capture["headers"].get(header), header
    if "content-length" in response.headers:
        assert int(response.headers["content-length"]) == len(response.content)

    if "body_raw" in capture:                                      # a stream
        expected = capture["sse_events"]
        actual = sse_events(response.text)
        assert normalize(actual) == normalize(expected)
        # framing: compact JSON, one `data: ` line per event, blank line after each
        assert response.text == "".join(
            "data: " + (e if e == "[DONE]" else json.dumps(e, ensure_ascii=False, separators=(",", ":")))
            + "\n\n" for e in actual)
        assert capture["body_raw"] == "".join(
            "data: " + (e if e == "[DONE]" else json.dumps(e, ensure_ascii=False, separators=(",", ":")))
            + "\n\n" for e in expected)
        return

    body = capture["body"]
    if body == "":
        assert response.content == b""
        return
    if isinstance(body, dict) and ("error" in body or "detail" in body):
        # error bodies verbatim, to the byte
        assert response.content == json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()
        return
    assert normalize(response.json()) == normalize(expand(body))


def test_every_emulated_capture_has_what_the_replay_needs() -> None:
    """Guards the replay itself: a generation capture without a known count would test nothing."""
    for name in emulated_captures():
        capture = load(name)
        path = capture["request"]["path"]
        shows_count = '"prompt_tokens"' in json.dumps(capture) or path == "/tokenize"
        if capture["status"] == 200 and shows_count:
            assert known_count(name, capture) is not None, name


def test_replay_rebuilds_abbreviated_prompts_to_their_full_length() -> None:
    chars = expand(load("c09d_chat_over_char_bound")["request"]["json"])
    assert len(chars["messages"][0]["content"]) == 300_000
    assert chatml_char_count("chat", chars) == 300_050            # the number in the capture's error
    ids = expand(load("c25_completions_ids_over")["request"]["json"])
    assert ids["prompt"] == [9707] * 2049


# --------------------------------------------------------------------------- #
# Behaviour beyond the captures
# --------------------------------------------------------------------------- #

def chat(content: str = "Hello!", **extra: Any) -> dict:
    return {"model": "tiny-qwen", "messages": [{"role": "user", "content": content}], **extra}


def fixed(n: int):
    return lambda endpoint, body: n


def test_count_prompt_receives_the_endpoint_and_body() -> None:
    counter = Counter()
    counter.value = 7
    with FakeVLLM(count_prompt=counter) as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        r = client.post("/v1/chat/completions", json=chat(max_tokens=1))
        client.post("/v1/completions", json={"model": "tiny-qwen", "prompt": ["x", "y"], "max_tokens": 1})
        client.post("/tokenize", json={"model": "tiny-qwen", "prompt": "z"})
    assert r.json()["usage"]["prompt_tokens"] == 7
    assert [(e, b.get("prompt")) for e, b in counter.calls] == [
        ("chat", None), ("completions", "x"), ("completions", "y"), ("completions", "z")]


def test_crude_counter_is_deterministic_and_documented() -> None:
    body = chat("one two three")
    assert crude_count_prompt("chat", body) == 5 + 3 + 3
    assert crude_count_prompt("chat", dict(body, add_generation_prompt=False)) == 5 + 3
    assert crude_count_prompt("completions", {"prompt": "a b"}) == 2
    assert crude_count_prompt("completions", {"prompt": [1, 2, 3]}) == 3


def test_models_lists_lora_card_without_max_model_len_and_serves_it() -> None:
    lora = {"id": "my-lora", "root": "/adapters/x", "parent": "tiny-qwen"}
    with FakeVLLM(extra_models=[lora], count_prompt=fixed(10)) as fake, \
            httpx.Client(base_url=fake.base_url, verify=False) as client:
        cards = client.get("/v1/models").json()["data"]
        r = client.post("/v1/chat/completions", json=dict(chat(max_tokens=2), model="my-lora"))
        missing = client.post("/v1/chat/completions", json=dict(chat(max_tokens=2), model="nope"))
    assert [(c["id"], c["max_model_len"], c["parent"], c["root"]) for c in cards] == [
        ("tiny-qwen", 2048, None, "/models/tiny-qwen"), ("my-lora", None, "tiny-qwen", "/adapters/x")]
    assert r.status_code == 200 and r.json()["model"] == "my-lora"
    assert missing.json()["error"]["message"] == "The model `nope` does not exist. Valid aliases: tiny-qwen, my-lora."


def test_v032_clamps_silently_and_reports_the_clamped_usage() -> None:
    with FakeVLLM(count_prompt=fixed(2038)) as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        r = client.post("/v1/chat/completions", json=chat(max_tokens=100, n=3))
    assert r.status_code == 200
    assert [c["finish_reason"] for c in r.json()["choices"]] == ["length"] * 3
    assert r.json()["usage"]["completion_tokens"] == 30
    assert fake.requests[-1].max_tokens == 10


def test_v032_token_ids_far_over_show_their_real_count() -> None:
    # Inferred (not captured): ids are not truncated, so the count is exact; "at least" only at limit+1.
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        r = client.post("/v1/completions", json={"model": "tiny-qwen", "prompt": [1] * 2100, "max_tokens": 1})
    assert r.status_code == 400
    assert "your prompt contains 2100 input tokens" in r.json()["error"]["message"]


def test_legacy_mode_rejects_overflow_with_the_old_wording() -> None:
    with FakeVLLM(mode="legacy", count_prompt=fixed(2000)) as fake, \
            httpx.Client(base_url=fake.base_url, verify=False) as client:
        over = client.post("/v1/chat/completions", json=chat(max_tokens=100))
        alone = client.post("/v1/chat/completions", json=chat(max_tokens=5000))
        fits = client.post("/v1/chat/completions", json=chat(max_tokens=48))
        default = client.post("/v1/completions", json={"model": "tiny-qwen", "prompt": "x"})
    assert over.status_code == 400
    assert over.json() == {"error": {
        "message": "'max_tokens' or 'max_completion_tokens' is too large: 100. This model's maximum context "
                   "length is 2048 tokens and your request has 2000 input tokens (100 > 2048 - 2000). "
                   "(parameter=max_tokens, value=100)",
        "type": "BadRequestError", "param": "max_tokens", "code": 400}}
    assert "is too large: 5000." in alone.json()["error"]["message"]
    assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == 48
    assert default.status_code == 200 and default.json()["usage"]["completion_tokens"] == 16


def test_legacy_mode_prompt_that_fills_the_context() -> None:
    with FakeVLLM(mode="legacy", count_prompt=fixed(2048)) as fake, \
            httpx.Client(base_url=fake.base_url, verify=False) as client:
        r = client.post("/v1/chat/completions", json=chat())
    assert r.json()["error"]["message"] == (
        "This model's maximum context length is 2048 tokens. However, your request has 2048 input tokens. "
        "Please reduce the length of the input messages. (parameter=input_tokens, value=2048)")


def test_v05_mode_wording() -> None:
    with (
        FakeVLLM(mode="v0.5", count_prompt=fixed(2000)) as fake,
        httpx.Client(base_url=fake.base_url, verify=False) as client,
    ):
        r = client.post("/v1/chat/completions", json=chat(max_tokens=100))
    assert r.json()["error"]["message"] == (
        "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens "
        "(2000 in the messages, 100 in the completion). Please reduce the length of the messages or completion.")


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError):
        FakeVLLM(mode="v9")


def test_requests_are_recorded_with_headers_query_body_and_json() -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        client.post("/v1/chat/completions?x=1", json=chat(max_tokens=1), headers={"X-Trace": "abc"})
        client.get("/nope")
        client.delete("/v1/models")
    first, second, third = fake.requests
    assert (first.method, first.path, first.query) == ("POST", "/v1/chat/completions", "x=1")
    assert first.headers["x-trace"] == "abc"
    assert first.json == chat(max_tokens=1) and json.loads(first.body) == first.json
    assert first.status == 200 and first.finished_at is not None and first.disconnected_at is None
    assert (second.status, third.status) == (404, 405)


def test_fault_respond_replaces_one_answer_then_the_fake_is_normal_again() -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(status=503, body=b'{"oops":1}', path="/v1/chat/completions"))
        models = client.get("/v1/models")                       # not matched by the fault's path
        failed = client.post("/v1/chat/completions", json=chat(max_tokens=1))
        again = client.post("/v1/chat/completions", json=chat(max_tokens=1))
    assert models.status_code == 200
    assert (failed.status_code, failed.content, failed.headers["content-type"]) == (
        503, b'{"oops":1}', "application/json")
    assert again.status_code == 200 and fake.fail_next == []


@pytest.mark.parametrize("kind", ["close", "reset"])
def test_fault_close_or_reset_without_response(kind: str) -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(kind=kind))
        with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
            client.post("/v1/chat/completions", json=chat(max_tokens=1))
        assert client.post("/v1/chat/completions", json=chat(max_tokens=1)).status_code == 200


@pytest.mark.parametrize("kind", ["close_mid_body", "reset_mid_body"])
def test_fault_cuts_a_stream_after_n_events(kind: str) -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(kind=kind, after_chunks=2))
        received: list[str] = []
        with (
            pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)),
            client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=5, stream=True)) as r,
        ):
            assert r.status_code == 200
            for line in r.iter_lines():
                if line:
                    received.append(line)
    assert len(received) == 2 and all(x.startswith("data: {") for x in received)


def test_fault_cuts_a_plain_body_midway() -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(kind="close_mid_body"))
        with pytest.raises(httpx.RemoteProtocolError):
            client.post("/v1/chat/completions", json=chat(max_tokens=3))


def test_fault_sse_error_mid_stream_like_vllm() -> None:
    error = {"error": {"message": "boom", "type": "InternalServerError", "param": None, "code": 500}}
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(kind="sse_error", body=error, after_chunks=2))
        r = client.post("/v1/chat/completions", json=chat(max_tokens=5, stream=True))
    events = sse_events(r.text)
    assert r.status_code == 200
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert events[2:] == [error, "[DONE]"]


def test_fault_stall_after_headers_records_the_client_leaving() -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(kind="stall"))
        with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=5, stream=True)) as r:
            assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream; charset=utf-8"
            assert fake.requests[0].disconnected_at is None          # headers sent, body stalled
        # leaving the block closes the unread response: the fake sees the client go
        assert fake.wait_until(lambda f: f.requests[0].disconnected_at is not None)
    assert fake.requests[0].status == 200 and fake.requests[0].finished_at is None


def test_fault_gate_holds_a_request_until_released() -> None:
    gate = threading.Event()
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.fail_next.append(FaultSpec(kind="respond", status=429, body=b"{}", gate=gate))
        result: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: result.append(client.get("/health")))
        worker.start()
        assert fake.wait_until(lambda f: len(f.requests) == 1)
        assert fake.requests[0].status is None and not result       # held: received, not answered
        gate.set()
        worker.join(10)
    assert result[0].status_code == 429


def test_not_ready_refuses_connections_then_serves_on_the_same_port() -> None:
    with FakeVLLM() as fake:
        port = fake.port
        fake.ready = False
        with pytest.raises(httpx.ConnectError):
            httpx.get(fake.base_url + "/health", verify=False)
        fake.ready = True
        assert fake.port == port
        assert httpx.get(fake.base_url + "/health", verify=False).status_code == 200


def test_engine_dead_health_503_and_generation_500() -> None:
    with FakeVLLM() as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        fake.engine_dead = True
        health = client.get("/health")
        r = client.post("/v1/chat/completions", json=chat(max_tokens=8))
    assert (health.status_code, health.content) == (503, b"")
    assert r.status_code == 500
    assert r.content == (b'{"error":{"message":"EngineCore encountered an issue. See stack trace (above) for '
                         b'the root cause.","type":"InternalServerError","param":null,"code":500}}')


def test_paced_stream_sends_every_token_in_order() -> None:
    with FakeVLLM(tokens_per_second=5000, completion_text_token="x") as fake, \
            httpx.Client(base_url=fake.base_url, verify=False) as client:
        r = client.post("/v1/completions", json={"model": "tiny-qwen", "prompt": "a", "max_tokens": 6,
                                                  "n": 2, "stream": True})
    events = sse_events(r.text)
    tokens = [(e["choices"][0]["index"], e["choices"][0]["finish_reason"]) for e in events[:-1]]
    assert tokens == [(0, None), (1, None)] * 5 + [(0, "length"), (1, "length")]
    assert events[-1] == "[DONE]"
    assert fake.requests[0].completion_tokens == 12


def test_client_disconnect_mid_stream_stops_generation_and_is_recorded() -> None:
    with FakeVLLM(tokens_per_second=200) as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        with client.stream("POST", "/v1/chat/completions", json=chat(max_tokens=2000, stream=True)) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
        assert fake.wait_until(lambda f: f.requests[0].disconnected_at is not None)
        assert fake.wait_until(lambda f: f.requests[0].closed_at is not None)
    record = fake.requests[0]
    assert record.finished_at is None
    assert record.completion_tokens < 2000


def test_tokenize_counts_without_enforcing_the_limit() -> None:
    with FakeVLLM(count_prompt=fixed(3000)) as fake, httpx.Client(base_url=fake.base_url, verify=False) as client:
        r = client.post("/tokenize", json={"model": "tiny-qwen", "prompt": "x", "return_token_strs": True})
        chat_r = client.post("/tokenize", json=chat())
    body = r.json()
    assert (body["count"], body["max_model_len"], len(body["tokens"]), len(body["token_strs"])) == (
        3000, 2048, 3000, 3000)
    assert chat_r.json()["token_strs"] is None


def test_openai_client_chat_stream_and_completions() -> None:
    with FakeVLLM(count_prompt=fixed(10)) as fake, httpx.Client(verify=False) as http:
        client = openai.OpenAI(base_url=fake.base_url + "/v1", api_key="x", max_retries=0, http_client=http)
        r = client.chat.completions.create(model="tiny-qwen", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
        chunks = list(client.chat.completions.create(
            model="tiny-qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True,
            stream_options={"include_usage": True}))
        c = client.completions.create(model="tiny-qwen", prompt="hi")
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="tiny-qwen", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=4096)
    assert r.choices[0].message.content == " TObject" * 3 and r.usage.prompt_tokens == 10
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == " TObject" * 3
    assert chunks[-1].usage.completion_tokens == 3
    assert c.usage.completion_tokens == 16
    assert "cannot be greater than max_model_len=2048" in err.value.message


async def test_async_context_manager_runs_in_the_running_loop() -> None:
    async with FakeVLLM(count_prompt=fixed(10)) as fake:
        async with httpx.AsyncClient(base_url=fake.base_url, verify=False) as client:
            results = await asyncio.gather(*(client.post("/v1/chat/completions", json=chat(max_tokens=2))
                                             for _ in range(5)))
        assert await fake.wait_until_async(lambda f: len(f.requests) == 5)
        fake.ready = False
        with pytest.raises(httpx.ConnectError):
            async with httpx.AsyncClient(base_url=fake.base_url, verify=False) as client:
                await client.get("/health")
    assert [r.json()["usage"]["total_tokens"] for r in results] == [12] * 5
