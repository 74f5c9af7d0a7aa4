"""The fake vLLM answers Responses, Messages and pooling requests as the real vLLM 0.32 did.

tests/data/vllm032_surfaces/ holds a real vLLM 0.32's verbatim answers
(tests/realvllm/capture_surfaces.py).  Each capture's request is replayed to
the fake, which counts prompts with brimful's real Qwen3 tokenizer (the
capture server's tokenizer), and the answer is compared: status, error bodies
exactly, success bodies after blanking ids, times, generated text and vectors,
SSE streams event by event (a run of text deltas counts as one: the real
server sometimes sends two tokens in one delta).  The engine-killed captures
are replayed with the fake's `sse_error` fault: the stream breaks as the real
one did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.fakevllm import FakeVLLM, FaultSpec
from tests.support.stack import fake_counter
from tokenizer_cache import load_model_tokenizer

CAPTURES = Path(__file__).resolve().parents[1] / "data" / "vllm032_surfaces"
NAMES = sorted(p.stem for p in CAPTURES.glob("*.json"))
REPLAYED = [n for n in NAMES if not n.startswith("x")]
_VOLATILE = re.compile(r"^(chatcmpl-|resp_|msg_|embd-|pooling-|score-)[0-9a-f]{16}$")


def load(name: str) -> dict[str, Any]:
    return json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))


def normalize(obj: Any, key: str | None = None) -> Any:
    if isinstance(obj, dict):
        return {k: normalize(v, k) for k, v in obj.items() if k not in ("cache_write_tokens", "cached_tokens")}
    if isinstance(obj, list):
        if key in ("embedding", "data") and all(isinstance(x, float) for x in obj):
            return "<vector>"
        return [normalize(x) for x in obj]
    if key in ("created", "created_at") and isinstance(obj, int):
        return "<time>"
    if key in ("score", "relevance_score") and isinstance(obj, float):
        return "<score>"
    if isinstance(obj, str):
        if key in ("id", "item_id") and _VOLATILE.match(obj):
            return obj[: obj.index("-") + 1 if "-" in obj else obj.index("_") + 1] + "<id>"
        if key in ("text", "delta") and obj:
            return "<text>"
    if key == "temperature":
        return "<temperature>"
    return obj


def events(raw: str) -> list[tuple[str, Any]]:
    """(event name, data) per SSE event, consecutive text deltas merged into one."""
    out: list[tuple[str, Any]] = []
    for block in raw.split("\n\n"):
        if not block.strip():
            continue
        name, data = "", None
        for line in block.split("\n"):
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
        if data is not None and isinstance(data.get("sequence_number"), int):
            data = {**data, "sequence_number": "<n>"}
        if out and name in ("response.output_text.delta", "content_block_delta") and out[-1][0] == name:
            continue
        out.append((name, normalize(data)))
    return out


@pytest.fixture(scope="module")
def fake(qwen3_dir: Path) -> Iterator[FakeVLLM]:
    with FakeVLLM(count_prompt=fake_counter(load_model_tokenizer(qwen3_dir))) as server:
        yield server
        assert not server.errors


def replay(fake: FakeVLLM, capture: dict[str, Any]) -> httpx.Response:
    request = capture["request"]
    with httpx.Client(base_url=fake.base_url, timeout=30) as client:
        return client.post(request["path"], json=request["json"])


@pytest.mark.parametrize("name", REPLAYED)
def test_the_fake_answers_like_the_capture(name: str, fake: FakeVLLM) -> None:
    capture = load(name)
    response = replay(fake, capture)
    assert response.status_code == capture["status"]
    assert response.headers["content-type"] == capture["headers"]["content-type"]
    if "body_raw" in capture:
        assert events(response.text) == events(capture["body_raw"])
    elif capture["status"] >= 400:
        assert response.json() == capture["body"]
    else:
        assert normalize(response.json()) == normalize(capture["body"])


def test_the_engine_dying_mid_stream_breaks_a_responses_stream_off(fake: FakeVLLM) -> None:
    """x02: vLLM's Responses stream ends without a terminal event or the last chunk."""
    capture = load("x02_responses_stream_engine_killed")
    assert capture["ended"] and "response.completed" not in capture["body_raw"]
    fake.fail_next.append(FaultSpec("sse_error", path="/v1/responses", after_chunks=6))
    with pytest.raises(httpx.RemoteProtocolError), httpx.Client(base_url=fake.base_url, timeout=30) as client, \
            client.stream("POST", "/v1/responses", json=capture["request"]["json"]) as response:
        for _ in response.iter_bytes():
            pass


def test_the_engine_dying_mid_stream_ends_a_messages_stream_with_vllms_error_event(fake: FakeVLLM) -> None:
    """x03: an `event: error` whose message is a pydantic error about the chat chunk (vLLM's own bug)."""
    capture = load("x03_messages_stream_engine_killed")
    fake.fail_next.append(FaultSpec("sse_error", path="/v1/messages", after_chunks=6))
    response = replay(fake, capture)
    assert events(response.text)[-1] == events(capture["body_raw"])[-1]
    assert events(response.text)[-1][0] == "error" and "message_stop" not in response.text


def test_a_stored_response_can_be_continued(fake: FakeVLLM) -> None:
    fake.stored_responses.add("resp_known")
    with httpx.Client(base_url=fake.base_url, timeout=30) as client:
        ok = client.post("/v1/responses", json={"model": "tiny-qwen", "input": "Hi", "max_output_tokens": 2,
                                                "previous_response_id": "resp_known"})
        unknown = client.post("/v1/responses", json={"model": "tiny-qwen", "input": "Hi",
                                                     "previous_response_id": "resp_other"})
    assert ok.status_code == 200 and ok.json()["previous_response_id"] == "resp_known"
    assert unknown.status_code == 404
