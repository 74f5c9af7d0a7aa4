"""Each client's own overflow language, and the floor, with the official SDKs against the fake vLLM.

What agent clients match on (docs/agents.md): Claude Code compacts on Anthropic's
`prompt is too long: N tokens > M maximum`; Codex and LiteLLM on OpenAI's
`code: context_length_exceeded` (LiteLLM also on "This model's maximum context
length is"). The fake answers like vLLM 0.32 (it clamps prompt + max_tokens >
max_model_len itself and refuses max_tokens > max_model_len), so each test
shows vLLM alone beside brimful.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import openai
import pytest

from tests.support.fakevllm import FaultSpec
from tests.support.stack import Stack, running_stack
from tests.support.surface_scenarios import Target, prompt_of, words

# Claude Code 2.1's test for an Anthropic context error (DESIGN.md §6).
CLAUDE_CODE_PATTERN = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.IGNORECASE)
MML = 2048
FLOOR = MML // 8           # the Messages floor (3,000) is at most an eighth of the context


@pytest.fixture(scope="module")
def stack(qwen3_dir: Path) -> Iterator[Stack]:
    with running_stack(qwen3_dir) as running:
        yield running


@pytest.fixture
def target(stack: Stack) -> Target:
    assert stack.recorder is not None
    return Target(stack.base_url, stack.fake.base_url, "tiny-qwen", MML, stack.recorder, timeout=10)


def user(n: int) -> list[dict[str, str]]:
    return [{"role": "user", "content": words(n)}]


def test_messages_refusal_speaks_anthropics_words_and_claude_codes_pattern_reads_them(target: Target) -> None:
    with pytest.raises(anthropic.BadRequestError) as direct:
        target.anthropic(direct=True).messages.create(model=target.model, max_tokens=4, messages=user(2100))
    assert not CLAUDE_CODE_PATTERN.search(str(direct.value))    # vLLM alone: a generic API error to Claude Code
    error, rec = target.record_after(lambda: target.anthropic().messages.create(
        model=target.model, max_tokens=4, messages=user(2100)), raises=anthropic.BadRequestError)
    body = error.body["error"]
    assert body["type"] == "invalid_request_error"
    assert body["message"].startswith(f"prompt is too long: {prompt_of(2100)} tokens > {MML - 1} maximum. ")
    found = CLAUDE_CODE_PATTERN.search(body["message"])
    assert found is not None and (int(found[1]), int(found[2])) == (prompt_of(2100), MML - 1)
    assert "counted with tiny-qwen's own tokenizer" in body["message"]     # brimful's explanation follows
    assert (rec.endpoint, rec.action, rec.error_code) == ("messages", "rejected", "context_length_exceeded")


def test_brimfuls_own_error_answers_keep_vllms_vary_origin(target: Target) -> None:
    request = {"model": target.model, "max_tokens": 4, "messages": user(2100)}
    direct = httpx.post(target.upstream + "/v1/messages", json=request, timeout=10)
    through = httpx.post(target.brimful + "/v1/messages", json=request, timeout=10)
    assert direct.status_code == through.status_code == 400
    assert direct.headers["vary"] == through.headers["vary"] == "Origin"


def test_openai_surfaces_refuse_with_context_length_exceeded(target: Target) -> None:
    client = target.openai()
    with pytest.raises(openai.BadRequestError) as chat:
        client.chat.completions.create(model=target.model, max_tokens=4, messages=user(2100))  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError) as responses:
        client.responses.create(model=target.model, input=words(2100), max_output_tokens=16)
    with pytest.raises(openai.BadRequestError) as streamed:
        list(client.responses.create(model=target.model, input=words(2100), stream=True))
    for error in (chat.value, responses.value, streamed.value):
        assert error.code == "context_length_exceeded" and error.type == "invalid_request_error"
        assert isinstance(error.body, dict)
        assert error.body["message"].startswith("This model's maximum context length is 2048 tokens.")


@pytest.mark.slow      # importing litellm takes ~20 s
def test_litellm_raises_its_context_window_error_on_brimfuls_refusal(target: Target) -> None:
    litellm = pytest.importorskip("litellm")
    for provider in ("openai", "hosted_vllm"):
        with pytest.raises(litellm.ContextWindowExceededError):
            litellm.completion(model=f"{provider}/{target.model}", api_base=target.brimful + "/v1", api_key="x",
                               messages=user(2100), max_tokens=4, num_retries=0)


def test_the_floor_refuses_a_sliver_where_vllm_alone_refuses(target: Target) -> None:
    """max_tokens 32,000 (Claude Code's) > max_model_len: vLLM alone answers 400; with less room than
    the floor brimful answers the prompt-too-long error Claude Code compacts on, not a sliver."""
    prompt = MML - FLOOR + 1                              # room: one token below the floor
    history = user(prompt - prompt_of(0))
    with pytest.raises(anthropic.BadRequestError) as direct:
        target.anthropic(direct=True).messages.create(model=target.model, max_tokens=32000, messages=history)
    assert "cannot be greater than max_model_len" in str(direct.value)
    error, rec = target.record_after(lambda: target.anthropic().messages.create(
        model=target.model, max_tokens=32000, messages=history), raises=anthropic.BadRequestError)
    assert error.body["error"]["message"].startswith(f"prompt is too long: {prompt} tokens > {MML - FLOOR} maximum")
    assert error.body["error"]["brimful"]["min_completion_tokens"] == FLOOR
    assert (rec.action, rec.prompt_tokens) == ("rejected", prompt)
    # One token shorter leaves the floor: served, clamped to it.
    shorter = user(prompt - 1 - prompt_of(0))
    raw, _ = target.record_after(lambda: target.anthropic().messages.with_raw_response.create(
        model=target.model, max_tokens=32000, messages=shorter))
    assert (raw.headers["x-brimful-action"], raw.headers["x-brimful-granted-max-tokens"]) == ("clamped", str(FLOOR))


def test_the_floor_serves_a_sliver_where_vllm_alone_serves_it(target: Target) -> None:
    """max_tokens 1,000 <= max_model_len: vLLM 0.32 clamps to the 40 tokens left by itself, so brimful serves."""
    history = user(2000)
    direct = target.anthropic(direct=True).messages.create(model=target.model, max_tokens=1000, messages=history)
    raw, rec = target.record_after(lambda: target.anthropic().messages.with_raw_response.create(
        model=target.model, max_tokens=1000, messages=history))
    message = raw.parse()
    assert message.usage.output_tokens == direct.usage.output_tokens == MML - prompt_of(2000)
    assert (rec.action, rec.granted_max_tokens) == ("clamped", MML - prompt_of(2000))


def test_a_tool_call_vllm_could_not_convert_is_not_called_a_rejected_request(stack: Stack, target: Target) -> None:
    """vLLM's Messages route json.loads the generated tool arguments; its JSONDecodeError comes back as 400."""
    stack.fake.fail_next.append(FaultSpec("respond", status=400, path="/v1/messages", body={
        "type": "error", "error": {"type": "BadRequestError", "message": "Expecting value: line 1 column 1 (char 0)"}}))
    error, rec = target.record_after(lambda: target.anthropic().messages.create(
        model=target.model, max_tokens=20, messages=user(10)), raises=anthropic.BadRequestError)
    message = error.body["error"]["message"]
    assert "rejected the request" not in message
    assert "could not turn it into a Message" in message and "Expecting value" in message
    assert rec.error_code == "upstream_invalid_output"
    # The same text on chat is the request's own fault (a tool call's arguments it sent): relayed as such.
    stack.fake.fail_next.append(FaultSpec("respond", status=400, path="/v1/chat/completions", body={
        "error": {"message": "Expecting value: line 1 column 1 (char 0)", "type": "BadRequestError",
                  "param": None, "code": 400}}))
    with pytest.raises(openai.BadRequestError) as chat:
        target.openai().chat.completions.create(model=target.model, max_tokens=4, messages=user(10))  # type: ignore[arg-type]
    assert "rejected the request" in chat.value.message
