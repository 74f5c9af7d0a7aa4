"""Trimming on every family in the corpora: chat (oldest, middle), Messages, Responses `truncation: "auto"`.

One fake vLLM serves every family of tests/support/families.py, each counted with its
real tokenizer and template (mistral-common for Mistral, harmony for gpt-oss), and
brimful counts with the same tokenizers (loaded once: the engine's count of what it
receives is a full count of the trimmed request, brimful's the last of its search).
A conversation that does not fit is trimmed; what reaches the engine must render
for the family (Gemma's and Mistral's alternation rules, a tool result right after
its call), its full count by the engine (`usage`) must equal brimful's `x-brimful-prompt-tokens`, and the headers
and the length record must say what went.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from proxy.config import Config, ModelConfig
from tests.support.fakevllm import FakeVLLM
from tests.support.families import FAMILIES, family_folder
from tests.support.stack import Stack, fake_counter, running_stack
from tests.support.surface_scenarios import Target
from tokenizer_cache import CountError, ModelTokenizer, load_model_tokenizer

REQUIRE = os.environ.get("BRIMFUL_REAL_VLLM", "").strip().lower() in ("require", "required", "1", "on", "true", "yes")
MML = 1024
LIMIT = 64
ROUNDS = 10
CASES = [("chat", "oldest"), ("chat", "middle"), ("messages", "oldest"), ("responses", "auto")]


def text(label: str, i: int) -> str:
    return f"{label} {i}: " + " ".join(f"w{i}x{j}" for j in range(30))


def call_id(i: int) -> str:
    return f"call{i:05d}"       # mistral-common wants nine letters or digits


def chat_history(tools: bool) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "system", "content": "You are terse."},
                                     {"role": "user", "content": text("task", 0)}]
    for i in range(ROUNDS):
        if tools:
            history += [{"role": "assistant", "content": None, "tool_calls": [{
                "id": call_id(i), "type": "function",
                "function": {"name": "sh", "arguments": json.dumps({"cmd": f"seq {i}"})}}]},
                {"role": "tool", "tool_call_id": call_id(i), "content": text("output", i)}]
        history += [{"role": "assistant", "content": text("answer", i)}, {"role": "user", "content": text("ask", i)}]
    return history


def messages_history(tools: bool) -> list[dict[str, Any]]:
    history: list[dict[str, Any]] = [{"role": "user", "content": text("task", 0)}]
    for i in range(ROUNDS):
        if tools:
            history += [
                {"role": "assistant", "content": [{"type": "tool_use", "id": call_id(i), "name": "sh",
                                                   "input": {"cmd": f"seq {i}"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call_id(i),
                                              "content": text("output", i)}]}]
        history += [{"role": "assistant", "content": text("answer", i)}, {"role": "user", "content": text("ask", i)}]
    return history


def responses_input(tools: bool) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = [{"role": "user", "content": text("task", 0)}]
    for i in range(ROUNDS):
        if tools:
            items += [{"type": "function_call", "call_id": call_id(i), "name": "sh",
                       "arguments": json.dumps({"cmd": f"seq {i}"})},
                      {"type": "function_call_output", "call_id": call_id(i), "output": text("output", i)}]
        items += [{"role": "assistant", "content": text("answer", i)}, {"role": "user", "content": text("ask", i)}]
    return items


SCHEMA = {"type": "object", "properties": {"cmd": {"type": "string"}}}
TOOLS = {
    "chat": [{"type": "function", "function": {"name": "sh", "description": "run", "parameters": SCHEMA}}],
    "messages": [{"name": "sh", "description": "run", "input_schema": SCHEMA}],
    "responses": [{"type": "function", "name": "sh", "description": "run", "parameters": SCHEMA}],
}


def request_body(surface: str, family: str, tools: bool) -> dict[str, Any]:
    """The request as the client sends it (what the engine would count, untrimmed)."""
    extra = {"tools": TOOLS[surface]} if tools else {}
    if surface == "chat":
        return {"model": family, "messages": chat_history(tools), "max_tokens": LIMIT, **extra}
    if surface == "messages":
        return {"model": family, "system": "You are terse.", "messages": messages_history(tools),
                "max_tokens": LIMIT, **extra}
    return {"model": family, "instructions": "You are terse.", "input": responses_input(tools),
            "max_output_tokens": LIMIT, "truncation": "auto", **extra}


class Families:
    """The families' folders (or why one is missing) and their tokenizers, as the engine counts."""

    def __init__(self, root: Path) -> None:
        self.folders = {name: family_folder(name, root) for name in FAMILIES}
        self.tokenizers: dict[str, ModelTokenizer] = {
            name: load_model_tokenizer(folder) for name, folder in self.folders.items() if isinstance(folder, Path)}
        self.counters = {name: fake_counter(tok) for name, tok in self.tokenizers.items()}

    def loaded(self) -> dict[Path, ModelTokenizer]:
        return {folder: self.tokenizers[name] for name, folder in self.folders.items() if isinstance(folder, Path)}

    def count(self, endpoint: str, body: dict[str, Any]) -> int:
        return self.counters[body["model"]](endpoint, body)

    def configure(self, config: Config) -> None:
        for name, folder in self.folders.items():
            if isinstance(folder, Path):
                config.models[name] = ModelConfig(tokenizer=str(folder))


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> Families:
    return Families(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="module")
def stack(families: Families) -> Iterator[Stack]:
    cards = [{"id": name, "root": f"/models/{name}", "max_model_len": MML} for name in FAMILIES[1:]]
    fake_kwargs = {"model": FAMILIES[0], "max_model_len": MML, "extra_models": cards, "count_prompt": families.count}
    with running_stack(None, fake_kwargs=fake_kwargs, configure=families.configure,
                       loaded=families.loaded()) as running:
        yield running


def forwarded(fake: FakeVLLM, path: str, family: str) -> dict[str, Any]:
    sent = [r.json for r in fake.requests if r.path == path and isinstance(r.json, dict)
            and r.json.get("model") == family]
    assert sent, f"nothing reached the engine for {family}"
    return sent[-1]


def send(target: Target, surface: str, strategy: str, body: dict[str, Any]) -> Callable[[], Any]:
    header = {} if surface == "responses" else {"extra_headers": {"x-brimful-trim": strategy}}
    if surface == "chat":
        return lambda: target.openai().chat.completions.with_raw_response.create(**body, **header)
    if surface == "messages":
        return lambda: target.anthropic().messages.with_raw_response.create(**body, **header)
    return lambda: target.openai().responses.with_raw_response.create(**body)


def prompt_usage(surface: str, answer: Any) -> int:
    if surface == "chat":
        return int(answer.usage.prompt_tokens)
    return int(answer.usage.input_tokens)


@pytest.mark.parametrize("tools", [False, True], ids=["plain", "tools"])
@pytest.mark.parametrize(("surface", "strategy"), CASES, ids=[f"{s}-{t}" for s, t in CASES])
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.slow      # loading the fourteen families' tokenizers takes minutes on 2 shared cores
def test_a_conversation_that_does_not_fit_is_trimmed_and_counted_exactly(
        stack: Stack, families: Families, family: str, surface: str, strategy: str, tools: bool) -> None:
    folder = families.folders[family]
    if not isinstance(folder, Path):     # CI (BRIMFUL_REAL_VLLM=require) fetches every tokenizer
        (pytest.fail if REQUIRE else pytest.skip)(folder)
    body = request_body(surface, family, tools)
    endpoint = "messages" if surface == "messages" else surface
    try:
        whole = families.count(endpoint, body)
    except CountError as refused:                # vLLM refuses the untrimmed conversation too
        pytest.skip(f"{family} refuses this conversation untrimmed: {refused}")
    assert whole + LIMIT > MML                     # it does not fit as sent
    assert stack.recorder is not None
    target = Target(stack.base_url, stack.fake.base_url, family, MML, stack.recorder, timeout=30)
    raw, rec = target.record_after(send(target, surface, strategy, body))
    path = {"chat": "/v1/chat/completions", "messages": "/v1/messages", "responses": "/v1/responses"}[surface]
    sent = forwarded(stack.fake, path, family)
    field = "input" if surface == "responses" else "messages"
    items, kept = body[field], sent[field]
    prompt = int(raw.headers["x-brimful-prompt-tokens"])
    # The engine's own full count of what it received is brimful's count, and it fits.
    assert prompt == prompt_usage(surface, raw.parse()) == families.count(endpoint, sent)
    assert prompt + int(raw.headers["x-brimful-granted-max-tokens"]) <= MML
    dropped = int(raw.headers["x-brimful-trimmed-messages"])
    assert raw.headers["x-brimful-action"] == "trimmed" and 0 < dropped == len(items) - len(kept)
    assert int(raw.headers["x-brimful-trimmed-tokens"]) == whole - prompt
    assert (rec.action, rec.trimmed_messages, rec.trimmed_tokens, rec.prompt_tokens) == (
        "trimmed", dropped, whole - prompt, prompt)
    # Whole items, in order; the latest kept; the first user turn kept (truncation "auto": a suffix
    # that begins with a user turn).
    assert kept[-1] == items[-1] and all(item in items for item in kept)
    assert [items.index(item) for item in kept] == sorted(items.index(item) for item in kept)
    if surface == "responses":
        assert kept == items[len(items) - len(kept):] and kept[0]["role"] == "user"
        assert sent["truncation"] == "disabled" and sent["instructions"] == body["instructions"]
    else:
        assert kept[0] == items[0] and (surface == "messages" or kept[1] == items[1])
