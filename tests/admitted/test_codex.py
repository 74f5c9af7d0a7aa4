"""proxy.admitted.codex: a Codex turn's length refusal carries a code Codex does not reset its usage on.

The in-process tests send what Codex 0.171 sends (its `x-codex-turn-metadata`
header, `request_kind` "turn" or "compaction") and read what the client gets
and what the record keeps. What Codex does with each answer is measured with
the real CLI in tests/e2e/test_agent_clis.py and tests/realvllm/test_agent_sessions.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.admitted import codex
from proxy.app import BrimfulApp
from proxy.errors import BrimfulError, ErrorCode, prompt_too_long
from tests.admitted.test_exchange import MML, Upstream, app_for
from tests.support.stack import MODEL, ListRecorder, call_app
from tests.support.transport import MockResponse, SentRequest

RESPONSES = "/v1/responses"


def metadata(kind: str) -> list[tuple[bytes, bytes]]:
    """Codex's header (its fields as 0.171 sends them, the ids shortened)."""
    value = {"session_id": "01a2", "turn_id": "01a3", "request_kind": kind, "turn_trigger": "exec",
             "compaction": {"trigger": "auto", "phase": "pre_turn"}} if kind == "compaction" else \
        {"session_id": "01a2", "turn_id": "01a3", "request_kind": kind, "turn_trigger": "exec"}
    return [(codex.TURN_METADATA, json.dumps(value).encode())]


@pytest.mark.parametrize("headers,turn", [
    (metadata("turn"), True),
    (metadata("compaction"), False),
    ([], False),
    ([(codex.TURN_METADATA, b"not json")], False),
    ([(codex.TURN_METADATA, b'["request_kind", "turn"]')], False),
    ([(b"originator", b"codex_exec")], False),
], ids=["turn", "compaction", "none", "not-json", "not-an-object", "originator-only"])
def test_only_a_codex_turn_is_a_turn(headers: list[tuple[bytes, bytes]], turn: bool) -> None:
    assert codex.is_turn(headers) is turn


def test_a_turns_length_refusal_changes_only_its_code_and_adds_the_setting() -> None:
    err = prompt_too_long(31766, 31000, MODEL, "input")
    mine = codex.refusal(err, metadata("turn"))
    assert (mine.status, mine.code, mine.envelope_code, mine.param) == (400, ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                                                                        "prompt_too_long", "input")
    assert mine.message.startswith(err.message)
    assert mine.message.endswith("when its config.toml sets model_context_window = 31000 (this model's context).")
    assert mine.details == err.details and err.envelope_code == "context_length_exceeded"


def test_other_errors_and_other_requests_are_answered_as_they_are() -> None:
    refusal = prompt_too_long(31766, 31000, MODEL, "input")
    other = BrimfulError(400, "bad", code=ErrorCode.INVALID_VALUE)
    assert codex.refusal(refusal, metadata("compaction")) is refusal
    assert codex.refusal(refusal, []) is refusal
    assert codex.refusal(other, metadata("turn")) is other


def responses_body(words: int) -> bytes:
    return json.dumps({"model": MODEL, "input": "hello " * words, "stream": True}).encode()


async def test_a_codex_turn_over_the_context_is_refused_with_the_code_codex_compacts_after(qwen3_dir: Path,
                                                                                          ) -> None:
    app, recorder = app_for_responses(qwen3_dir)
    turn = await call_app(app, "POST", RESPONSES, responses_body(3000), metadata("turn"))
    compaction = await call_app(app, "POST", RESPONSES, responses_body(3000), metadata("compaction"))
    plain = await call_app(app, "POST", RESPONSES, responses_body(3000))
    assert turn.status == compaction.status == plain.status == 400
    errors = [json.loads(answer.body)["error"] for answer in (turn, compaction, plain)]
    assert [e["code"] for e in errors] == ["prompt_too_long", "context_length_exceeded", "context_length_exceeded"]
    assert errors[0]["message"] == errors[2]["message"] + (
        f" Codex compacts the conversation before your next message when its config.toml sets "
        f"model_context_window = {MML} (this model's context).")
    assert errors[0]["brimful"] == errors[2]["brimful"]
    assert [(r.action, r.error_code) for r in recorder.records] == [("rejected", "context_length_exceeded")] * 3


async def test_the_upstreams_own_length_refusal_of_a_codex_turn_is_worded_alike(qwen3_dir: Path) -> None:
    """brimful's count fits, vLLM refuses (its count is longer): the explained refusal a Codex turn
    gets carries the same code."""
    def refuse(sent: SentRequest) -> MockResponse:
        return MockResponse.json({"error": {
            "message": f"This model's maximum context length is {MML} tokens. However, your prompt contains at "
                       f"least {MML + 1} input tokens, which exceeds this limit even without any output tokens. "
                       f"Please reduce the length of the input prompt. (parameter=input_tokens, value={MML + 1})",
            "type": "BadRequestError", "param": "input_tokens", "code": 400}}, status=400)

    app, recorder = app_for_responses(qwen3_dir, refuse)
    answer = await call_app(app, "POST", RESPONSES, responses_body(100), metadata("turn"))
    assert answer.status == 400
    assert json.loads(answer.body)["error"]["code"] == "prompt_too_long"
    assert recorder.records[-1].error_code == "context_length_exceeded"


class ResponsesUpstream(Upstream):
    """The models card, and `answer` for /v1/responses (a refused request never reaches it)."""

    def __init__(self, answer: Callable[[SentRequest], MockResponse] | None) -> None:
        super().__init__()
        self.answer = answer

    def handle(self, sent: SentRequest) -> MockResponse:
        if sent.path == RESPONSES and self.answer is not None:
            return self.answer(sent)
        return super().handle(sent)


def app_for_responses(qwen3_dir: Path, answer: Callable[[SentRequest], MockResponse] | None = None,
                      ) -> tuple[BrimfulApp, ListRecorder]:
    return app_for(ResponsesUpstream(answer), qwen3_dir)
