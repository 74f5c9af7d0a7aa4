"""Chat counts remembered by exact template inputs: same counts, no rendering on a repeat."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import MODELS
from tests.support.corpus import CASES
from tokenizer_cache import (
    CharBoundExceeded,
    CountError,
    TokenizerCache,
    load_model_tokenizer,
)
from tokenizer_cache._chat_cache import MAX_CHARS, ChatCountCache, message_chars

QWEN3 = MODELS / "Qwen--Qwen3-8B"


@pytest.fixture(scope="module")
def cache() -> TokenizerCache:
    return TokenizerCache(max_entries=16)


def _count(model, case: dict) -> int:
    if case["endpoint"] == "chat":
        return model.count_chat(case["request"])
    return sum(model.count_completion(case["request"]))


@pytest.mark.slow
def test_the_whole_corpus_counts_the_same_from_the_cache(cache: TokenizerCache):
    assert cache.chat_cache is not None
    for _ in range(2):
        for case in CASES:
            model = cache.get(MODELS.parent / case["model_dir"])
            if case["expected_error"] is not None:
                with pytest.raises(CountError):
                    _count(model, case)
            else:
                assert _count(model, case) == case["expected_prompt_tokens"], case["id"]
    stats = cache.chat_cache.stats()
    chats = sum(1 for c in CASES if c["endpoint"] == "chat" and c["expected_error"] is None)
    assert stats.hits >= chats - 5  # every repeat of a counted chat (a few corpus requests repeat)
    for case in CASES:
        if case["endpoint"] == "chat" and case["expected_error"] is None:
            tally = cache.get(MODELS.parent / case["model_dir"]).tally_chat(case["request"])
            assert tally.tokens == case["expected_prompt_tokens"]
            if len(json.dumps(case["request"]["messages"])) < MAX_CHARS:  # larger ones are not cached
                assert (tally.pieces, tally.encoded_tokens) == (0, 0), case["id"]


@pytest.fixture(scope="module")
def qwen3():
    return load_model_tokenizer(QWEN3, chat_cache=ChatCountCache())


def _body(**extra) -> dict:
    return {"messages": [{"role": "user", "content": "Hello"}], **extra}


@pytest.mark.parametrize(
    "a, b",
    [
        (_body(chat_template_kwargs={"enable_thinking": False}), _body(chat_template_kwargs={"enable_thinking": 0})),
        (_body(add_special_tokens=False), _body(add_special_tokens=True)),
        (_body(add_generation_prompt=True), _body(add_generation_prompt=False)),
        (_body(), {"messages": [{"role": "user", "content": "Hello "}]}),
        (_body(), {"messages": [{"role": "system", "content": "Hello"}]}),
        (_body(tools=[{"type": "function", "function": {"name": "a", "parameters": {"x": 1, "y": 2}}}]),
         _body(tools=[{"type": "function", "function": {"name": "a", "parameters": {"y": 2, "x": 1}}}])),
        (_body(tools=[{"type": "function", "function": {"name": "a", "parameters": {"x": 1}}}]),
         _body(tools=[{"type": "function", "function": {"name": "a", "parameters": {"x": 1.0}}}])),
    ],
)
def test_inputs_that_differ_never_share_an_entry(qwen3, a: dict, b: dict):
    fresh = qwen3.with_chat_cache(None)
    for body in (a, b, a, b):  # each counted from the cache on the second round
        assert qwen3.count_chat(body) == fresh.count_chat(body)
    assert qwen3.render_chat(a) != qwen3.render_chat(b) or qwen3.count_chat(a) == qwen3.count_chat(b)


def test_models_sharing_one_cache_keep_their_own_counts():
    shared = ChatCountCache()
    qwen3 = load_model_tokenizer(QWEN3, chat_cache=shared)
    phi3 = load_model_tokenizer(MODELS / "microsoft--Phi-3-mini-4k-instruct", chat_cache=shared)
    body = {"messages": [{"role": "user", "content": "안녕하세요, how are you today?"}]}
    for _ in range(2):
        assert qwen3.count_chat(body) == qwen3.with_chat_cache(None).count_chat(body)
        assert phi3.count_chat(body) == phi3.with_chat_cache(None).count_chat(body)
    assert len(shared) == 2 and shared.stats().hits == 2


def test_the_character_bound_holds_on_a_hit(qwen3):
    body = {"messages": [{"role": "user", "content": "x" * 3000}]}
    qwen3.count_chat(body)  # remembered without a bound
    with pytest.raises(CharBoundExceeded):
        qwen3.count_chat(body, max_model_len=10)


def test_refused_requests_are_not_remembered(qwen3):
    cache = ChatCountCache()
    model = qwen3.with_chat_cache(cache)
    body = {"messages": [{"role": "user", "content": "Hi"}], "continue_final_message": True}
    for _ in range(2):
        with pytest.raises(CountError):
            model.count_chat(body)
    assert len(cache) == 0


def test_long_messages_are_counted_without_the_cache(qwen3):
    cache = ChatCountCache()
    model = qwen3.with_chat_cache(cache)
    model.count_chat({"messages": [{"role": "user", "content": "y" * (MAX_CHARS + 1)}]})
    assert len(cache) == 0
    model.count_chat({"messages": [{"role": "user", "content": "y" * MAX_CHARS}]})
    assert len(cache) == 1


def test_message_chars_is_exact_up_to_its_bound_and_stops_past_it():
    """Exact while within `stop_above` (text parts, reasoning), above it once past; the messages after
    the one that took it past are not read (a long conversation is not walked whole per turn)."""
    messages = [{"role": "system", "content": "s" * 10},
                {"role": "user", "content": [{"type": "text", "text": "t" * 5}, {"type": "image_url"}]},
                {"role": "assistant", "content": None, "reasoning": "r" * 7}]
    assert message_chars(messages, 22) == message_chars(messages, 10**9) == 22
    assert message_chars(messages, 21) > 21 and message_chars(messages, 9) > 9

    class Unread(dict):
        def get(self, *args: object) -> object:
            raise AssertionError("a message after the bound was passed was read")

    assert message_chars([{"role": "user", "content": "y" * 11}, Unread()], 10) > 10
    with pytest.raises(AssertionError):
        message_chars([{"role": "user", "content": "y" * 10}, Unread()], 10)


@pytest.mark.parametrize("snippet", ["{{ strftime_now('%S') }}", "{{ [1, 2, 3] | random }}", "{{ lipsum(1) }}"])
def test_templates_that_are_not_functions_of_their_inputs_are_not_cached(tmp_path: Path, snippet: str):
    shutil.copy(QWEN3 / "tokenizer.json", tmp_path / "tokenizer.json")
    (tmp_path / "chat_template.jinja").write_text(
        snippet + "{% for m in messages %}{{ m.content }}{% endfor %}", encoding="utf-8"
    )
    cache = ChatCountCache()
    model = load_model_tokenizer(tmp_path, chat_cache=cache)
    model.count_chat(_body())
    assert len(cache) == 0


def test_a_prefix_does_not_render_the_same_once_a_turn_is_added(qwen3):
    """Why only whole inputs are keys: Qwen3 drops the reasoning of assistant turns
    before the last user query, so adding a query changes how earlier turns render."""
    turns = [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning": "Add them."},
    ]
    before = qwen3.render_chat({"messages": turns, "add_generation_prompt": False})
    after = qwen3.render_chat({"messages": [*turns, {"role": "user", "content": "3+3?"}]})
    assert "Add them." in before and "Add them." not in after
    assert not after.startswith(before)
