"""The Responses, Messages and embeddings scenarios, run with the official clients as users run them.

Each function takes a `Target` — brimful in front of an upstream, and the
upstream itself — and checks one scenario end to end: the official client
against vLLM alone, the same client through brimful, the figures brimful
reports (headers, error body) against the upstream's own usage, and the length
record.  tests/e2e/test_surfaces_fake.py runs them against the fake vLLM,
tests/realvllm/test_surfaces.py against a real vLLM 0.32.

Prompts are made of " hello", one Qwen3 token each; one user message adds 8
tokens of chat template (`prompt_of`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from proxy.recording.record import LengthRecord
from tests.support.stack import ListRecorder

TEMPLATE_TOKENS = 8          # Qwen3's template around one user message, with the generation prompt
WEATHER_PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def words(n: int) -> str:
    return " ".join(["hello"] * n)


def prompt_of(n: int) -> int:
    """The prompt tokens of one user message of `words(n)`, on every surface (Qwen3)."""
    return n + TEMPLATE_TOKENS


@dataclass
class Target:
    brimful: str                 # base URLs, without /v1
    upstream: str
    model: str
    max_model_len: int
    recorder: ListRecorder
    timeout: float = 60.0

    def openai(self, *, direct: bool = False) -> openai.OpenAI:
        return openai.OpenAI(base_url=(self.upstream if direct else self.brimful) + "/v1", api_key="x",
                             max_retries=0, timeout=self.timeout)

    def anthropic(self, *, direct: bool = False) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.upstream if direct else self.brimful, api_key="x",
                                   max_retries=0, timeout=self.timeout)

    def record_after(self, action: Callable[[], Any], raises: type[BaseException] | None = None,
                     ) -> tuple[Any, LengthRecord]:
        """Run `action` through brimful and return its result (with `raises`: the exception it
        must raise) and the one record it left (written after the answer's last byte)."""
        before = len(self.recorder.records)
        if raises is None:
            result = action()
        else:
            with pytest.raises(raises) as info:
                action()
            result = info.value
        return result, self.recorder.wait_for(before + 1)[before]


# ---------------------------------------------------------------------------
# /v1/responses with the openai client
# ---------------------------------------------------------------------------

def responses_limit_beyond_max_model_len(t: Target) -> None:
    request = {"model": t.model, "input": words(2000), "max_output_tokens": 65535}
    with pytest.raises(openai.BadRequestError) as direct:
        t.openai(direct=True).responses.create(**request)
    assert "max_output_tokens=65535 cannot be greater than max_model_len" in direct.value.message

    raw, rec = t.record_after(lambda: t.openai().responses.with_raw_response.create(**request))
    response = raw.parse()
    prompt, room = prompt_of(2000), t.max_model_len - prompt_of(2000)
    assert raw.headers["x-brimful-action"] == "clamped"
    assert int(raw.headers["x-brimful-prompt-tokens"]) == response.usage.input_tokens == prompt
    assert response.usage.output_tokens == room and response.status == "incomplete"
    assert (rec.endpoint, rec.action, rec.prompt_tokens, rec.upstream_prompt_tokens, rec.granted_max_tokens) == (
        "responses", "clamped", prompt, prompt, room)
    assert rec.finish_reasons == ["length"]


def responses_prompt_that_cannot_fit(t: Target) -> None:
    request = {"model": t.model, "input": words(2100), "max_output_tokens": 4}
    with pytest.raises(openai.BadRequestError) as direct:
        t.openai(direct=True).responses.create(**request)
    assert "at least 2049 input tokens" in direct.value.message

    through, rec = t.record_after(lambda: t.openai().responses.create(**request), raises=openai.BadRequestError)
    assert through.body["brimful"]["prompt_tokens"] == prompt_of(2100)
    assert f"your prompt is {prompt_of(2100)} tokens" in through.message
    assert (rec.endpoint, rec.action, rec.prompt_tokens) == ("responses", "rejected", prompt_of(2100))


def responses_truncation_auto(t: Target) -> None:
    """vLLM cuts a prompt too long to max_model_len - 1 under truncation "auto": served, never refused."""
    request = {"model": t.model, "input": words(2100), "max_output_tokens": 100, "truncation": "auto"}
    direct = t.openai(direct=True).responses.create(**request)
    raw, rec = t.record_after(lambda: t.openai().responses.with_raw_response.create(**request))
    response = raw.parse()
    assert response.usage.input_tokens == direct.usage.input_tokens == t.max_model_len - 1 == rec.prompt_tokens
    assert response.usage.output_tokens == direct.usage.output_tokens == 1
    assert int(raw.headers["x-brimful-prompt-tokens"]) == t.max_model_len - 1


def responses_streamed(t: Target) -> None:
    request = {"model": t.model, "input": words(2000), "max_output_tokens": 65535, "stream": True}

    def run() -> list[Any]:
        return list(t.openai().responses.create(**request))

    events, rec = t.record_after(run)
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    usage = events[-1].response.usage
    assert usage.input_tokens == rec.prompt_tokens == prompt_of(2000)
    assert usage.output_tokens == rec.completion_tokens == t.max_model_len - prompt_of(2000)
    assert (rec.stream, rec.action) == (True, "clamped")


def responses_with_tools(t: Target) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
            "parameters": WEATHER_PARAMETERS}
    raw, rec = t.record_after(lambda: t.openai().responses.with_raw_response.create(
        model=t.model, input="Weather in Seoul?", tools=[tool], max_output_tokens=2))
    assert int(raw.headers["x-brimful-prompt-tokens"]) == raw.parse().usage.input_tokens == rec.prompt_tokens


def responses_function_call_round_trip(t: Target) -> None:
    tool = {"type": "function", "name": "get_weather", "description": "Current weather for a city",
            "parameters": WEATHER_PARAMETERS}
    history: list[Any] = [
        {"role": "user", "content": "Weather in Seoul?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Seoul"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": '{"temp": 3}'},
    ]
    raw, rec = t.record_after(lambda: t.openai().responses.with_raw_response.create(
        model=t.model, input=history, tools=[tool], max_output_tokens=65535))
    response = raw.parse()
    assert int(raw.headers["x-brimful-prompt-tokens"]) == response.usage.input_tokens == rec.prompt_tokens
    assert rec.granted_max_tokens == t.max_model_len - rec.prompt_tokens


async def agents_responses_model(t: Target) -> None:
    """The OpenAI Agents SDK's OpenAIResponsesModel with max_tokens 65535, as an agent app sets it.

    The SDK fails a run whose response is incomplete (max_output_tokens reached), and the
    test models never stop on their own: the agent stops at the first token the model
    emits greedily (learnt from the upstream first), as a model answering in one token would.
    """
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    instructions, question = "Be brief.", "Hello!"
    first = t.openai(direct=True).responses.create(model=t.model, instructions=instructions, input=question,
                                                    max_output_tokens=1, temperature=0).output_text
    assert first

    def agent(base: str) -> Agent:
        client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="x", max_retries=0, timeout=t.timeout)
        settings = ModelSettings(max_tokens=65535, temperature=0, extra_body={"stop": [first]})
        return Agent(name="assistant", instructions=instructions, model=OpenAIResponsesModel(t.model, client),
                     model_settings=settings)

    with pytest.raises(openai.BadRequestError) as direct:
        await Runner.run(agent(t.upstream), question)
    assert "max_output_tokens=65535 cannot be greater than max_model_len" in direct.value.message
    before = len(t.recorder.records)
    result = await Runner.run(agent(t.brimful), question)
    rec = t.recorder.wait_for(before + 1)[before]
    usage = result.raw_responses[-1].usage
    assert usage is not None and usage.input_tokens == rec.prompt_tokens == rec.upstream_prompt_tokens
    assert (rec.endpoint, rec.action, rec.requested_max_tokens, rec.granted_max_tokens) == (
        "responses", "clamped", 65535, t.max_model_len - rec.prompt_tokens)
    assert rec.finish_reasons == ["stop"]


# ---------------------------------------------------------------------------
# /v1/messages with the anthropic client
# ---------------------------------------------------------------------------

def messages_limit_beyond_max_model_len(t: Target) -> None:
    request: dict[str, Any] = {"model": t.model, "max_tokens": 65535,
                               "messages": [{"role": "user", "content": words(1700)}]}
    with pytest.raises(anthropic.BadRequestError) as direct:
        t.anthropic(direct=True).messages.create(**request)
    assert "max_completion_tokens=65535 cannot be greater than max_model_len" in str(direct.value)

    raw, rec = t.record_after(lambda: t.anthropic().messages.with_raw_response.create(**request))
    message = raw.parse()
    prompt = prompt_of(1700)
    assert raw.headers["x-brimful-action"] == "clamped"
    assert int(raw.headers["x-brimful-prompt-tokens"]) == message.usage.input_tokens == prompt
    assert message.stop_reason == "max_tokens" and message.usage.output_tokens == t.max_model_len - prompt
    assert (rec.endpoint, rec.action, rec.upstream_prompt_tokens, rec.finish_reasons) == (
        "messages", "clamped", prompt, ["length"])


def messages_prompt_that_cannot_fit(t: Target) -> None:
    request: dict[str, Any] = {"model": t.model, "max_tokens": 4,
                               "messages": [{"role": "user", "content": words(2100)}]}
    with pytest.raises(anthropic.BadRequestError) as direct:
        t.anthropic(direct=True).messages.create(**request)
    assert "at least 2049 input tokens" in str(direct.value)

    through, rec = t.record_after(lambda: t.anthropic().messages.create(**request), raises=anthropic.BadRequestError)
    error = through.body["error"]
    assert error["type"] == "invalid_request_error" and error["brimful"]["prompt_tokens"] == prompt_of(2100)
    # Anthropic's own words first (what Claude Code matches to compact), brimful's explanation after.
    assert error["message"].startswith(f"prompt is too long: {prompt_of(2100)} tokens > {t.max_model_len - 1} "
                                       "maximum. ")
    assert f"your prompt is {prompt_of(2100)} tokens" in error["message"]
    assert (rec.endpoint, rec.action) == ("messages", "rejected")


def messages_streamed(t: Target) -> None:
    request: dict[str, Any] = {"model": t.model, "max_tokens": 65535,
                               "messages": [{"role": "user", "content": words(1700)}]}

    def run() -> Any:
        with t.anthropic().messages.stream(**request) as stream:
            return stream.get_final_message()

    message, rec = t.record_after(run)
    room = t.max_model_len - prompt_of(1700)
    assert message.usage.input_tokens == rec.upstream_prompt_tokens == rec.prompt_tokens == prompt_of(1700)
    assert message.usage.output_tokens == rec.completion_tokens == room
    assert (rec.stream, rec.action, message.stop_reason) == (True, "clamped", "max_tokens")


def messages_with_tools(t: Target) -> None:
    tool = {"name": "get_weather", "description": "Current weather for a city", "input_schema": WEATHER_PARAMETERS}
    history: list[Any] = [
        {"role": "user", "content": "Weather in Seoul?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather",
                                           "input": {"city": "Seoul"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "3C"}]},
    ]
    raw, rec = t.record_after(lambda: t.anthropic().messages.with_raw_response.create(
        model=t.model, max_tokens=2, tools=[tool], messages=history))
    assert int(raw.headers["x-brimful-prompt-tokens"]) == raw.parse().usage.input_tokens == rec.prompt_tokens


def messages_count_tokens(t: Target) -> None:
    short = [{"role": "user", "content": "Hello!"}]
    direct = t.anthropic(direct=True).messages.count_tokens(model=t.model, messages=short)
    through = t.anthropic().messages.count_tokens(model=t.model, messages=short)
    assert through.input_tokens == direct.input_tokens
    long = [{"role": "user", "content": words(2100)}]
    with pytest.raises(anthropic.BadRequestError):
        t.anthropic(direct=True).messages.count_tokens(model=t.model, messages=long)
    assert t.anthropic().messages.count_tokens(model=t.model, messages=long).input_tokens == prompt_of(2100)


# ---------------------------------------------------------------------------
# /v1/embeddings with the openai client
# ---------------------------------------------------------------------------

def embeddings_counted(t: Target) -> None:
    raw, rec = t.record_after(lambda: t.openai().embeddings.with_raw_response.create(
        model=t.model, input=["Hello there", words(300)]))
    usage = raw.parse().usage
    assert int(raw.headers["x-brimful-prompt-tokens"]) == usage.prompt_tokens == rec.prompt_tokens
    assert (rec.endpoint, rec.action, rec.longest_prompt_tokens) == ("embeddings", "pass", 300)


def embeddings_input_that_cannot_fit(t: Target) -> None:
    request = {"model": t.model, "input": ["ok", words(2100)]}
    with pytest.raises(openai.BadRequestError) as direct:
        t.openai(direct=True).embeddings.create(**request)
    assert "at least 2049 input tokens" in direct.value.message
    through, rec = t.record_after(lambda: t.openai().embeddings.create(**request), raises=openai.BadRequestError)
    assert through.body["brimful"]["inputs"] == [{"index": 1, "prompt_tokens": 2100, "tokens_to_remove": 52}]
    assert rec.action == "rejected"
    truncated, rec = t.record_after(lambda: t.openai().embeddings.create(
        **request, extra_body={"truncate_prompt_tokens": -1}))
    assert truncated.usage.prompt_tokens == rec.prompt_tokens == 1 + t.max_model_len


def score_and_rerank_counted(t: Target) -> None:
    """vLLM's /score and /rerank (no official client: plain HTTP, as their users send them)."""
    with httpx.Client(timeout=t.timeout) as client:
        score = client.post(t.brimful + "/score", json={"model": t.model, "queries": "what is it",
                                                         "documents": ["one doc", "another doc here"]})
        rerank = client.post(t.brimful + "/v1/rerank", json={"model": t.model, "query": "what is it",
                                                              "documents": ["one doc", words(300)]})
        too_long = {"model": t.model, "query": "q", "documents": ["fine", words(2100)]}
        direct = client.post(t.upstream + "/rerank", json=too_long)
        refused = client.post(t.brimful + "/rerank", json=too_long)
    assert score.status_code == rerank.status_code == 200
    assert int(score.headers["x-brimful-prompt-tokens"]) == score.json()["usage"]["prompt_tokens"]
    assert int(rerank.headers["x-brimful-prompt-tokens"]) == rerank.json()["usage"]["prompt_tokens"]
    assert direct.status_code == 400 and "at least 2049" in direct.json()["error"]["message"]
    assert refused.status_code == 400
    assert refused.json()["error"]["brimful"]["inputs"] == [{"index": 2, "prompt_tokens": 2100,
                                                              "tokens_to_remove": 52}]


# What tests/e2e/test_surfaces_fake.py and tests/realvllm/test_surfaces.py run (the Agents SDK is async: apart).
GENERATION: list[Callable[[Target], None]] = [
    responses_limit_beyond_max_model_len,
    responses_prompt_that_cannot_fit,
    responses_truncation_auto,
    responses_streamed,
    responses_with_tools,
    responses_function_call_round_trip,
    messages_limit_beyond_max_model_len,
    messages_prompt_that_cannot_fit,
    messages_streamed,
    messages_with_tools,
    messages_count_tokens,
]
POOLING: list[Callable[[Target], None]] = [embeddings_counted, embeddings_input_that_cannot_fit,
                                           score_and_rerank_counted]
