"""The template floor (issue 25 item 5): a lower bound on the rendered characters read from the
chat template, by the messages' roles, so a body of very many messages over vLLM's character bound
is refused before its messages are prepared or rendered.  It must never exceed what the template
really renders, or brimful would refuse what vLLM serves."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.support.families import FAMILIES, family_folder
from tokenizer_cache import CountError, ModelTokenizer, TokenizerCache
from tokenizer_cache._jinja import parse_template
from tokenizer_cache._template_floor import TemplateFloor

ROLES = ("system", "user", "assistant", "tool", "developer", "critic", "user ")
CONTENTS = ("", "hi", " spaced \n", "<think>why</think>answer", "<tool_response>x</tool_response>",
            "{{ not a template }}", "多语言")


def _floor(source: str, roles: dict[str | None, int]) -> int:
    return TemplateFloor(parse_template(source)).chars(roles)


def _conversation(rng: random.Random) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 9)):
        role = rng.choice(ROLES)
        message: dict[str, Any] = {"role": role, "content": rng.choice(CONTENTS)}
        if role == "assistant" and rng.random() < 0.4:
            message["tool_calls"] = [{"id": f"c{len(messages)}", "type": "function",
                                      "function": {"name": "grep", "arguments": '{"q": "x"}'}}]
            if rng.random() < 0.5:
                message["content"] = None
        if role == "assistant" and rng.random() < 0.3:
            message["reasoning_content"] = rng.choice(CONTENTS)
        if role == "tool":
            message["tool_call_id"] = "c0"
        messages.append(message)
    body: dict[str, Any] = {"messages": messages, "add_generation_prompt": rng.random() < 0.7}
    if rng.random() < 0.3:
        body["tools"] = [{"type": "function", "function": {"name": "grep", "description": "search",
                                                           "parameters": {"type": "object", "properties": {}}}}]
    return body


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelTokenizer]:
    cache = TokenizerCache()
    root = tmp_path_factory.mktemp("families")
    loaded = {}
    for name in FAMILIES:
        folder = family_folder(name, root)
        if isinstance(folder, Path):
            tok = cache.get(folder)
            if isinstance(tok, ModelTokenizer) and tok.family == "hf":
                loaded[name] = tok
    return loaded


def _sweep(tok: ModelTokenizer, rng: random.Random, conversations: int) -> tuple[int, int]:
    """Random conversations: the floor is at most the rendered length of each one that renders."""
    proven = rendered = 0
    for _ in range(conversations):
        body = _conversation(rng)
        try:
            text = tok.render_chat(body)
        except CountError:
            continue                   # vLLM refuses it too: any refusal is no worse
        floor = tok.chat_chars_floor(body)
        assert floor <= len(text), (tok, body, floor, len(text))
        rendered += 1
        proven += floor > 0
    return rendered, proven


def test_the_floor_never_exceeds_qwen3s_render(qwen3: ModelTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ModelTokenizer, "floor_min_messages", 1)   # every conversation, however short
    rendered, proven = _sweep(qwen3, random.Random(25), 300)
    assert rendered > 100 and proven > 50      # the sweep renders, and the floor says something


@pytest.mark.slow      # loads every family's tokenizer (~10 s)
def test_the_floor_never_exceeds_the_render_on_any_family(families: dict[str, ModelTokenizer],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert {"Qwen--Qwen3-8B", "microsoft--Phi-3-mini-4k-instruct", "deepseek-ai--DeepSeek-V3.1"} <= set(families)
    monkeypatch.setattr(ModelTokenizer, "floor_min_messages", 1)
    rng = random.Random(25)
    totals = [_sweep(tok, rng, 300) for tok in families.values()]
    # Each family renders some (strict templates refuse most random role orders) and the floor
    # proves something on most.
    assert all(rendered >= 10 for rendered, _ in totals), totals
    assert sum(proven > 0 for _, proven in totals) >= len(totals) - 2, totals


def test_qwen3_counts_each_message_by_its_role(qwen3: ModelTokenizer) -> None:
    # "<|im_start|>user\n" + content + "<|im_end|>\n": 28 characters whatever the content.
    body = {"messages": [{"role": "user", "content": ""}] * 1000, "add_generation_prompt": False}
    assert qwen3.chat_chars_floor(body) == 28_000 == len(qwen3.render_chat(body))
    mixed = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}] * 200}
    assert qwen3.chat_chars_floor(mixed) == 200 * 28 + 200 * 33 <= len(qwen3.render_chat(mixed))


def test_short_conversations_and_cut_renders_are_not_read(qwen3: ModelTokenizer) -> None:
    many = [{"role": "user", "content": ""}] * 300
    assert qwen3.chat_chars_floor({"messages": many[:255]}) == 0
    assert qwen3.chat_chars_floor({"messages": many}) == 300 * 28
    assert qwen3.chat_chars_floor({"messages": many, "continue_final_message": True}) == 0
    # Developer messages may merge into one system message where the template does not know them.
    assert qwen3.chat_chars_floor({"messages": [*many, {"role": "developer", "content": ""}]}) == 0


def test_only_what_every_path_renders_is_counted() -> None:
    loop = "{% for m in messages %}{% if m.role == 'user' %}[U]{% elif m.role == 'bot' %}[BOT]{% endif %}{% endfor %}"
    assert _floor(loop, {"user": 3, "bot": 2, "other": 5}) == 3 * 3 + 2 * 5
    # A test the role cannot decide may go either way: the shorter side.
    either = "{% for m in messages %}{% if loop.first %}long text{% else %}x{% endif %}{% endfor %}"
    assert _floor(either, {"user": 4}) == 4
    # `+` and `~` with constants and the role; other expressions count 0.
    joined = "{% for m in messages %}{{ '<' + m.role + '>' + m.content }}{{ m.content | trim }}{% endfor %}"
    assert _floor(joined, {"user": 2}) == 2 * len("<user>")
    # A path that raises renders nothing (vLLM refuses it); a conversation on which all do gets 0.
    strict = "{% for m in messages %}{% if m.role != 'user' %}{{ raise_exception('no') }}{% endif %}ab{% endfor %}"
    assert _floor(strict, {"user": 5}) == 10
    assert _floor(strict, {"user": 5, "bot": 1}) == 0
    # `continue` ends the iteration: what it wrote before counts, not what follows.
    skip = "{% for m in messages %}x{% if m.role == 'system' %}{% continue %}{% endif %}yyy{% endfor %}"
    assert _floor(skip, {"system": 2, "user": 1}) == 2 * 1 + 4
    # An alias of the role is known; a name a nested block rebinds is not.
    alias = "{% for m in messages %}{% set r = m.role %}{% if r == 'user' %}abc{% endif %}{% endfor %}"
    assert _floor(alias, {"user": 2}) == 6


@pytest.mark.parametrize("source", [
    "{% set messages = messages[1:] %}{% for m in messages %}abc{% endfor %}",       # rebound
    "{% for m in messages %}abc{% if m.role == 'user' %}{% break %}{% endif %}{% endfor %}",  # break
    "{% for m in messages if m.role != 'system' %}abc{% endfor %}",                   # filtered
    "{% for m in messages[1:] %}abc{% endfor %}",                                     # not the list itself
    "{% macro turn(m) %}abc{% endmacro %}{% for m in messages %}{{ turn(m) }}{% endfor %}",  # macro
    "{% for m in messages %}{% filter trim %}abc{% endfilter %}{% endfor %}",         # filter block
])
def test_loops_the_floor_cannot_prove_count_nothing(source: str) -> None:
    assert _floor(source, {"user": 1000}) == 0


def test_roles_beyond_the_commonest_count_nothing() -> None:
    loop = "{% for m in messages %}ab{% endfor %}"
    roles: Counter[str | None] = Counter({f"r{i}": 1 for i in range(40)})
    roles["user"] = 100
    roles[None] = 7                 # a message that is not an object: vLLM refuses it
    assert _floor(loop, roles) == 2 * (100 + 15)
