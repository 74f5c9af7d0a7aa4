"""Property-based fuzzing of the admitted routes, in process.

Hypothesis generates request bodies -- chat- and completions-shaped ones with
every field drawn from valid, odd and wrong values, random JSON, and raw bytes --
and each is sent to the ASGI app through `httpx.ASGITransport` (no sockets on
brimful's side), with a FakeVLLM on loopback as the upstream, all in one
event loop.  The properties: brimful never answers 5xx unless the upstream
really failed, and every answer is JSON in the OpenAI error or success shape
(or, for a stream, SSE that ends with `data: [DONE]`).

The run is sized by FUZZ_EXAMPLES (>= 10,000 by default; the Responses, Messages
and pooling routes get SURFACE_FUZZ_EXAMPLES, 4,000) and prints the number
of bodies and the wall time; `database=None` keeps hypothesis from writing an
example database into the repository.  On those routes the property is each
surface's own shape: Anthropic's envelope and events on /v1/messages, OpenAI's
on the others.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from proxy.app import BrimfulApp
from proxy.config import Config, ModelConfig, ServerConfig, UpstreamConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.stack import fake_counter
from tokenizer_cache import load_model_tokenizer

pytestmark = pytest.mark.slow

FUZZ_EXAMPLES = int(os.environ.get("BRIMFUL_FUZZ_EXAMPLES", "10000"))
SURFACE_FUZZ_EXAMPLES = int(os.environ.get("BRIMFUL_SURFACE_FUZZ_EXAMPLES", "4000"))
BATCH = 10                # bodies per hypothesis example: amortizes hypothesis' per-example cost
MML = 256                 # small: the fake's generations stay short whatever limit gets through
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


# ---------------------------------------------------------------------------
# Strategies: cheap, mostly shallow, mixing valid-ish and hostile values
# ---------------------------------------------------------------------------

short_text = st.text(max_size=12)
odd_text = st.sampled_from([
    "", " ", "{{ 7*7 }}", "{% for x in y %}", "<|im_end|>", "\u0000", "\ud7ff", "\U0001F600", "é" * 3,
    "\r\n", "tiny-qwen", "user", "NaN", "1e309", "-1", "9" * 30,
    "\ud800", "a\udfffb",                  # unpaired surrogates: json.dumps escapes them, brimful must 400
])
scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | short_text | odd_text
)
any_json = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(short_text | odd_text, inner, max_size=3),
    max_leaves=6,
)

limit_values = (
    st.integers(min_value=-3, max_value=MML * 2) | st.integers(min_value=-(2**80), max_value=2**80)
    | st.sampled_from([None, 0, 1, 1.0, 2.5, -0.0, "10", "abc", " 7 ", "1e3", True, False, [], {}, math.inf])
    | any_json
)
content_part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": short_text | odd_text}),
    st.fixed_dictionaries({"type": st.sampled_from(["image_url", "input_audio", "video_url", "weird", 5]),
                           "image_url": st.just({"url": "data:,"}) | any_json}),
    any_json,
)
content = short_text | odd_text | st.lists(content_part, max_size=3) | any_json
message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "wizard", "", 5, None])},
    optional={
        "content": content,
        "name": short_text | any_json,
        "tool_calls": st.lists(st.fixed_dictionaries({
            "id": short_text, "type": st.just("function"),
            "function": st.fixed_dictionaries({"name": short_text, "arguments": short_text | any_json}),
        }), max_size=2) | any_json,
        "tool_call_id": short_text,
        "reasoning_content": short_text,
    },
)
tool = st.fixed_dictionaries({
    "type": st.just("function") | any_json,
    "function": st.fixed_dictionaries({"name": short_text}, optional={
        "description": short_text | odd_text, "parameters": st.just({"type": "object", "properties": {}}) | any_json,
    }) | any_json,
}) | any_json
common_fields = {
    "model": st.sampled_from(["tiny-qwen", "", "nope", "tiny-qwen\r\nx: y"]) | any_json,
    "max_tokens": limit_values,
    "stream": st.booleans() | any_json,
    "stream_options": st.fixed_dictionaries({}, optional={
        "include_usage": st.booleans() | any_json, "continuous_usage_stats": st.booleans()}) | any_json,
    "n": st.integers(min_value=-1, max_value=3) | any_json,
    "temperature": st.floats(allow_nan=True, allow_infinity=True) | any_json,
    "add_special_tokens": st.booleans() | any_json,
}
chat_body = st.fixed_dictionaries(
    {"messages": st.lists(message, max_size=4) | any_json},
    optional={
        **common_fields,
        "max_completion_tokens": limit_values,
        "tools": st.lists(tool, max_size=2) | any_json,
        "tool_choice": st.sampled_from(["auto", "none", "required"]) | any_json,
        "chat_template_kwargs": st.fixed_dictionaries({}, optional={
            "enable_thinking": st.booleans() | any_json, "custom": any_json}) | any_json,
        "add_generation_prompt": st.booleans() | any_json,
        "continue_final_message": st.booleans() | any_json,
        "documents": any_json,
    },
)
completions_body = st.fixed_dictionaries(
    {"prompt": short_text | odd_text | st.lists(st.integers(min_value=-2, max_value=200_000), max_size=8)
     | st.lists(short_text, max_size=3) | st.lists(st.lists(st.integers(0, 1000), max_size=4), max_size=2)
     | any_json},
    optional=common_fields,
)


block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": short_text | odd_text | any_json}),
    st.fixed_dictionaries({"type": st.just("tool_use"), "id": short_text | any_json, "name": short_text,
                           "input": st.dictionaries(short_text, short_text, max_size=2) | any_json}),
    st.fixed_dictionaries({"type": st.just("tool_result"), "tool_use_id": short_text | any_json},
                          optional={"content": short_text | st.lists(any_json, max_size=2) | any_json}),
    st.fixed_dictionaries({"type": st.sampled_from(["thinking", "redacted_thinking", "image", "tool_reference",
                                                    "tool_addition", "tool_removal", "nope"])},
                          optional={"thinking": short_text | any_json, "source": any_json, "tool": any_json}),
    any_json,
)
anthropic_message = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", 5])},
    optional={"content": short_text | odd_text | st.lists(block, max_size=3) | any_json},
)
messages_body = st.fixed_dictionaries(
    {"messages": st.lists(anthropic_message, max_size=4) | any_json},
    optional={
        "model": common_fields["model"], "max_tokens": limit_values, "stream": st.booleans() | any_json,
        "system": short_text | st.lists(block, max_size=2) | any_json,
        "tools": st.lists(st.fixed_dictionaries({"name": short_text}, optional={
            "input_schema": st.just({"type": "object"}) | any_json, "description": any_json}), max_size=2)
        | any_json,
        "thinking": st.fixed_dictionaries({"type": st.sampled_from(["enabled", "disabled", "adaptive", 3])})
        | any_json,
        "output_config": any_json, "chat_template_kwargs": any_json,
    },
)
response_item = st.one_of(
    message,
    st.fixed_dictionaries({"type": st.sampled_from(["function_call", "custom_tool_call"]),
                           "call_id": short_text | any_json, "name": short_text | any_json},
                          optional={"arguments": short_text | any_json, "namespace": any_json,
                                    "input": any_json}),
    st.fixed_dictionaries({"type": st.sampled_from(["function_call_output", "reasoning", "item_reference", "x"])},
                          optional={"call_id": short_text, "output": any_json, "content": any_json,
                                    "summary": any_json, "status": st.sampled_from(["incomplete", "completed"])}),
    any_json,
)
responses_body = st.fixed_dictionaries(
    {"input": short_text | odd_text | st.lists(response_item, max_size=4) | any_json},
    optional={
        "model": common_fields["model"], "max_output_tokens": limit_values, "stream": st.booleans() | any_json,
        "instructions": short_text | any_json, "previous_response_id": st.just("resp_x") | any_json,
        "tools": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["function", "custom", "namespace", "web"]),
                                                 "name": short_text | any_json}, optional={
            "parameters": any_json, "tools": any_json}), max_size=2) | any_json,
        "reasoning": any_json, "chat_template_kwargs": any_json,
    },
)
pooling_body = st.fixed_dictionaries(
    {"input": completions_body.map(lambda b: b["prompt"]) | any_json},
    optional={"model": common_fields["model"], "truncate_prompt_tokens": limit_values,
              "messages": st.lists(message, max_size=2) | any_json, "add_special_tokens": any_json},
)
SURFACE_BODIES = {"/v1/responses": responses_body, "/v1/messages": messages_body,
                  "/v1/messages/count_tokens": messages_body, "/v1/embeddings": pooling_body}


@st.composite
def surface_request_bytes(draw: st.DrawFn) -> tuple[str, bytes, str]:
    path = draw(st.sampled_from(list(SURFACE_BODIES)))
    value = draw(any_json) if draw(st.integers(0, 5)) == 0 else draw(SURFACE_BODIES[path])
    return path, json.dumps(value, allow_nan=True).encode(), "application/json"


@st.composite
def request_bytes(draw: st.DrawFn) -> tuple[str, bytes, str]:
    """(path, body bytes, content type)."""
    path = draw(st.sampled_from([CHAT, COMPLETIONS]))
    kind = draw(st.sampled_from(["shaped", "shaped", "shaped", "shaped", "json", "bytes"]))
    if kind == "bytes":
        return path, draw(st.binary(max_size=48)), draw(st.sampled_from(["application/json", "text/plain"]))
    value = draw(any_json) if kind == "json" else draw(chat_body if path == CHAT else completions_body)
    return path, json.dumps(value, allow_nan=True).encode(), "application/json"


# ---------------------------------------------------------------------------
# The app in process, the fake upstream on loopback, one event loop
# ---------------------------------------------------------------------------

class InProcess:
    def __init__(self, qwen3_dir: Path) -> None:
        self.loop = asyncio.new_event_loop()
        tok = load_model_tokenizer(qwen3_dir)     # the fake counts as brimful does: no drift noise
        self.fake = FakeVLLM(max_model_len=MML, record=False, count_prompt=fake_counter(tok))
        self.loop.run_until_complete(self.fake.start())
        config = Config(
            server=ServerConfig(max_body_bytes=64 * 1024),
            upstream=UpstreamConfig(url=self.fake.base_url, connect_timeout=2.0, timeout=10.0),
        )
        config.models["tiny-qwen"] = ModelConfig(tokenizer=str(qwen3_dir))
        self.app = BrimfulApp(config)
        self.loop.run_until_complete(self.app.startup())
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app),
                                        base_url="http://brimful", timeout=30)

    def post(self, path: str, body: bytes, content_type: str) -> httpx.Response:
        return self.loop.run_until_complete(
            self.client.post(path, content=body, headers={"content-type": content_type}))

    def close(self) -> None:
        self.loop.run_until_complete(self.client.aclose())
        self.loop.run_until_complete(self.app.shutdown())
        self.loop.run_until_complete(self.fake.stop())
        self.loop.close()


@pytest.fixture(scope="module")
def inproc(qwen3_dir: Path) -> Iterator[InProcess]:
    harness = InProcess(qwen3_dir)
    warm = harness.post(CHAT, b'{"model":"tiny-qwen","messages":[{"role":"user","content":"hi"}],"max_tokens":2}',
                        "application/json")
    assert warm.status_code == 200, warm.text      # models known, tokenizer loaded
    yield harness
    harness.close()


def check_response(response: httpx.Response, upstream_failed: bool) -> str:
    """Assert the OpenAI shape; returns a label for the statistics."""
    status = response.status_code
    if status >= 500:
        assert upstream_failed and status in (502, 503, 504), (status, response.text[:300])
    content_type = response.headers.get("content-type", "")
    if status >= 400:
        assert content_type.startswith("application/json"), (status, content_type, response.text[:300])
        error = response.json()["error"]
        assert isinstance(error, dict) and isinstance(error["message"], str) and error["message"]
        assert {"type", "param", "code"} <= set(error)
        return f"{status} {error['code']}"
    assert status == 200, (status, response.text[:300])
    if content_type.startswith("text/event-stream"):
        events = [line[6:] for line in response.text.split("\n") if line.startswith("data: ")]
        assert events and events[-1] == "[DONE]", response.text[-300:]
        for event in events[:-1]:
            payload = json.loads(event)
            assert "choices" in payload or "error" in payload, event[:300]
        return "200 stream"
    payload = response.json()
    assert isinstance(payload.get("choices"), list), response.text[:300]
    return "200"


def test_fuzz_admitted_routes_never_5xx_and_always_openai_shaped(inproc: InProcess) -> None:
    seen: dict[str, int] = {}
    started = time.perf_counter()

    @settings(max_examples=max(1, FUZZ_EXAMPLES // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(st.lists(request_bytes(), min_size=BATCH, max_size=BATCH))
    def batch(cases: list[tuple[str, bytes, str]]) -> None:
        for path, body, content_type in cases:
            crashes = len(inproc.fake.errors)
            response = inproc.post(path, body, content_type)
            label = check_response(response, upstream_failed=len(inproc.fake.errors) > crashes)
            seen[label] = seen.get(label, 0) + 1

    batch()
    elapsed = time.perf_counter() - started
    total = sum(seen.values())
    top = ", ".join(f"{k}: {v}" for k, v in sorted(seen.items(), key=lambda kv: -kv[1])[:12])
    print(f"\n[G] fuzz: {total} request bodies in {elapsed:.1f} s ({total / elapsed:.0f}/s); {top}")
    assert total >= FUZZ_EXAMPLES
    assert seen.get("200", 0) + seen.get("200 stream", 0) > total // 50, "the fuzz must also reach the upstream"
    assert sum(v for k, v in seen.items() if k.startswith("400")) > total // 10


def check_surface_response(path: str, response: httpx.Response, upstream_failed: bool) -> str:
    """Assert each surface's own shape: Anthropic's on /v1/messages*, OpenAI's elsewhere."""
    status = response.status_code
    if status >= 500:
        assert upstream_failed and status in (502, 503, 504), (path, status, response.text[:300])
    anthropic = path.startswith("/v1/messages")
    content_type = response.headers.get("content-type", "")
    if status >= 400:
        assert content_type.startswith("application/json"), (path, status, response.text[:300])
        body = response.json()
        error = body["error"]
        assert isinstance(error, dict) and isinstance(error["message"], str) and error["message"]
        if anthropic:
            assert body["type"] == "error" and isinstance(error["type"], str), body
            return f"{status} {error.get('brimful', {}).get('code', error['type'])}"
        assert {"type", "param", "code"} <= set(error), body
        return f"{status} {error['code']}"
    assert status == 200, (path, status, response.text[:300])
    if content_type.startswith("text/event-stream"):
        names = [line[7:] for line in response.text.split("\n") if line.startswith("event: ")]
        ends = ("message_stop", "error") if anthropic else ("response.completed", "error")
        assert names and names[-1] in ends, (path, response.text[-300:])
        return "200 stream"
    payload = response.json()
    if path.endswith("count_tokens"):
        assert isinstance(payload["input_tokens"], int)
    else:
        assert payload.get("type" if anthropic else "object") in ("message", "response", "list"), payload
    return "200"


def test_fuzz_the_other_surfaces_never_5xx_and_in_their_own_shape(inproc: InProcess) -> None:
    seen: dict[str, int] = {}
    started = time.perf_counter()

    @settings(max_examples=max(1, SURFACE_FUZZ_EXAMPLES // BATCH), deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(st.lists(surface_request_bytes(), min_size=BATCH, max_size=BATCH))
    def batch(cases: list[tuple[str, bytes, str]]) -> None:
        for path, body, content_type in cases:
            crashes = len(inproc.fake.errors)
            response = inproc.post(path, body, content_type)
            label = check_surface_response(path, response, upstream_failed=len(inproc.fake.errors) > crashes)
            seen[label] = seen.get(label, 0) + 1

    batch()
    elapsed = time.perf_counter() - started
    total = sum(seen.values())
    top = ", ".join(f"{k}: {v}" for k, v in sorted(seen.items(), key=lambda kv: -kv[1])[:12])
    print(f"\n[G] surface fuzz: {total} request bodies in {elapsed:.1f} s ({total / elapsed:.0f}/s); {top}")
    assert total >= SURFACE_FUZZ_EXAMPLES
    assert seen.get("200", 0) + seen.get("200 stream", 0) > total // 50, "the fuzz must also reach the upstream"
