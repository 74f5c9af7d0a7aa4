"""Per-piece counting: exact against whole-text encoding, bounded, shared, thread-safe.

* The whole shared corpus (320 cases, 8 tokenizers) with the piece cache off,
  on from cold, and on again from warm.
* A property test per tokenizer: random texts with added tokens sprinkled in
  (adjacent, at the edges, cut short, next to whitespace of every kind) split
  exactly where `tokenizers` splits them, and the piece sum equals the whole
  encode, with and without the post-processor's special tokens.
* Tokenizers edited to exercise the flags the shipped ones lack (lstrip,
  normalized tokens, encode_special_tokens, a BOS/EOS post-processor,
  ByteLevel add_prefix_space, Metaspace prepend_scheme "first" as transformers
  5 builds it, whose piece at offset 0 is counted apart) count exactly by
  pieces; the ones that cannot (single_word, normalized tokens under a
  normalizer, BPE dropout) fall back, and for the first the test shows the
  naive piece sum would indeed be wrong.
"""

from __future__ import annotations

import hashlib
import random
import shutil
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import AddedToken, Tokenizer

from tests.support.corpus import CASES  # the 320 corpus requests, loaded once
from tests.support.tokenizer_variants import EXACT_VARIANTS, FALLBACK_VARIANTS, bos_eos, edited, metaspace
from tokenizer_cache import (
    CountError,
    ModelTokenizer,
    PieceCountCache,
    PieceCounter,
    TokenizerCache,
    load_model_tokenizer,
)
from tokenizer_cache._added_split import AddedTokenSplitter, SplitToken
from tokenizer_cache._piece_support import fallback_reason, split_tokens

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
MODELS = SHARED / "models"
MODEL_DIRS = sorted(d for d in MODELS.iterdir() if (d / "tokenizer.json").is_file())
PHI3_MINI = MODELS / "microsoft--Phi-3-mini-4k-instruct"
PHI3_MEDIUM = MODELS / "microsoft--Phi-3-medium-4k-instruct"


@pytest.fixture(scope="module")
def models() -> dict[str, ModelTokenizer]:
    """Each shipped model loaded once, counting whole texts."""
    return {d.name: load_model_tokenizer(d) for d in MODEL_DIRS}


@pytest.fixture(scope="module")
def piece_models(models: dict[str, ModelTokenizer]) -> dict[str, ModelTokenizer]:
    """The same models counting through one shared piece cache."""
    cache = PieceCountCache()
    return {name: model.with_piece_cache(cache) for name, model in models.items()}


# ---------------------------------------------------------------------------
# Corpus, cache off and on
# ---------------------------------------------------------------------------

def test_every_shipped_tokenizer_counts_by_pieces(piece_models: dict[str, ModelTokenizer]):
    assert len(piece_models) == 8
    decisions = {name: model.piece_fallback for name, model in piece_models.items()}
    assert decisions == {name: None for name in decisions}
    assert all(model.piece_counter is not None for model in piece_models.values())


def _count(model: ModelTokenizer, case: dict) -> int:
    if case["endpoint"] == "chat":
        return model.count_chat(case["request"])
    return sum(model.count_completion(case["request"]))


@pytest.mark.parametrize("mode", ["off", "on"])
@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_corpus_case(case: dict, mode: str, models, piece_models):
    name = Path(case["model_dir"]).name
    model = models[name] if mode == "off" else piece_models[name]
    if case["expected_error"] is not None:
        with pytest.raises(CountError):
            _count(model, case)
        return
    assert _count(model, case) == case["expected_prompt_tokens"]
    if mode == "on":
        # Counted again, everything comes from the cache and nothing changes.
        assert _count(model, case) == case["expected_prompt_tokens"]
        if case["endpoint"] == "chat":
            assert model.tally_chat(case["request"]).encoded_tokens == 0


# ---------------------------------------------------------------------------
# Property: piece sum == whole encode, and the same split as tokenizers
# ---------------------------------------------------------------------------

_FRAGMENTS = [
    "Hello", " world", " ", "  ", "\n", "\n\n", "\t", " \n ", "\r\n", "\u3000", "\xa0", "\u2028",
    "\x1c",  # a Python-only "space": not Unicode White_Space, so rstrip must not take it
    "def f(x):\n    return x<y", "안녕하세요", " 세계", "🐶", "e\u0301", "1234567", "don't", "'s",
    "<", ">", "|", "<|", "|>", "<<", ">>", "</", "｜", "▁", "x",
]


def _random_text(rng: random.Random, marks: list[str]) -> str:
    parts = []
    for _ in range(rng.randint(0, 14)):
        if marks and rng.random() < 0.45:
            mark = rng.choice(marks)
            if rng.random() < 0.2:
                mark = mark[: rng.randint(1, len(mark))]  # a token cut short is plain text
            parts.append(mark)
        else:
            parts.append(rng.choice(_FRAGMENTS))
    return "".join(parts)


def _texts(tokenizer: Tokenizer, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    marks = [token.content for token in split_tokens(tokenizer)]
    fixed = ["", " ", "\n"] + [m + m for m in marks[:3]] + [" " + m + " " for m in marks[:3]]
    return fixed + [_random_text(rng, marks) for _ in range(count)]


def _split_by_tokenizers(tokenizer: Tokenizer, text: str) -> tuple[list[str], int]:
    """Pieces and added-token count as `tokenizers` itself split the text (from offsets)."""
    added_ids = set(tokenizer.get_added_tokens_decoder())
    encoding = tokenizer.encode(text, add_special_tokens=False)
    spans = [offsets for token_id, offsets in zip(encoding.ids, encoding.offsets, strict=True) if token_id in added_ids]
    pieces, position = [], 0
    for start, end in spans:
        if position < start:
            pieces.append(text[position:start])
        position = end
    if position < len(text):
        pieces.append(text[position:])
    return pieces, len(spans)


def _assert_pieces_exact(tokenizer: Tokenizer, texts: list[str]) -> None:
    counter, reason = PieceCounter.for_tokenizer(tokenizer, PieceCountCache())
    assert reason is None and counter is not None
    splitter = AddedTokenSplitter(split_tokens(tokenizer), encode_special_tokens=tokenizer.encode_special_tokens)
    for text in texts:
        assert splitter.split(text) == _split_by_tokenizers(tokenizer, text), text
        for add_special_tokens in (False, True):
            whole = len(tokenizer.encode(text, add_special_tokens=add_special_tokens))
            cold = counter.count(text, add_special_tokens=add_special_tokens)
            warm = counter.count(text, add_special_tokens=add_special_tokens)
            assert (cold.tokens, warm.tokens, warm.encoded_tokens) == (whole, whole, 0), text


@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=[d.name for d in MODEL_DIRS])
def test_random_texts_count_the_same_by_pieces(model_dir: Path, models):
    tokenizer = models[model_dir.name].tokenizer
    _assert_pieces_exact(tokenizer, _texts(tokenizer, 250, seed=len(model_dir.name)))


def test_phi3_rstrip_tokens_swallow_whitespace_into_the_token():
    """The SentencePiece notes of docs/vllm-behaviour.md, seen through the splitter."""
    splitter = AddedTokenSplitter(split_tokens(Tokenizer.from_file(str(PHI3_MINI / "tokenizer.json"))))
    assert splitter.split("<|user|>\nHello") == (["Hello"], 1)
    assert splitter.split("Hi<|end|>\n  there") == (["Hi", "there"], 1)
    # \x1c is a Python space but not Unicode White_Space: it stays in the text.
    assert splitter.split("<|end|>\x1c x") == (["\x1c x"], 1)
    # <s> has no rstrip: the newline stays; adjacent tokens leave no empty piece.
    assert splitter.split("<s>\n<|end|><|end|>") == (["\n"], 3)


def test_splitter_rules_without_a_tokenizer():
    tokens = [
        SplitToken("<L>", lstrip=True),
        SplitToken("<R>", rstrip=True),
        SplitToken("<ab>"),
        SplitToken("<abc>", special=True),
        SplitToken("<n>", normalized=True),
    ]
    splitter = AddedTokenSplitter(tokens)
    assert splitter.split("a  <L>b") == (["a", "b"], 1)  # lstrip takes the spaces before
    assert splitter.split("<R>  <L>b") == (["b"], 2)  # ... but not those rstrip took first
    assert splitter.split("x<abc>y<ab>") == (["x", "y"], 2)  # longest at the leftmost start
    assert splitter.split("x<n>y") == (["x", "y"], 1)  # second pass: normalized tokens
    assert splitter.split("") == ([], 0)
    encoding_special = AddedTokenSplitter(tokens, encode_special_tokens=True)
    # A special token is plain text then, and the scan does not look inside it for <ab>.
    assert encoding_special.split("x<abc>y") == (["x<abc>y"], 0)


# ---------------------------------------------------------------------------
# Edited tokenizers: the flags the shipped ones do not use
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("variant", EXACT_VARIANTS)
def test_edited_tokenizers_count_the_same_by_pieces(variant: str):
    tokenizer = EXACT_VARIANTS[variant]()
    _assert_pieces_exact(tokenizer, _texts(tokenizer, 150, seed=len(variant)))


def test_post_processor_specials_are_added_once():
    tokenizer = edited(PHI3_MINI, bos_eos)
    counter, _ = PieceCounter.for_tokenizer(tokenizer, PieceCountCache())
    assert counter is not None
    assert counter.count("", add_special_tokens=True).tokens == 2
    assert counter.count("a<|end|>b", add_special_tokens=True).tokens == len(tokenizer.encode("a<|end|>b"))


@pytest.mark.parametrize("variant", FALLBACK_VARIANTS)
def test_tokenizers_whose_pieces_interact_fall_back(variant: str):
    make, words, counterexample = FALLBACK_VARIANTS[variant]
    tokenizer = make()
    reason = fallback_reason(tokenizer)
    assert reason is not None and words in reason
    counter, why = PieceCounter.for_tokenizer(tokenizer, PieceCountCache())
    assert counter is None and why == reason
    if counterexample is not None:
        # Why: splitting anyway (ignoring the flag) would miscount this text.
        naive = AddedTokenSplitter(split_tokens(tokenizer))
        pieces, matched = naive.split(counterexample)
        naive_sum = matched + sum(len(e) for e in tokenizer.encode_batch_fast(pieces, add_special_tokens=False))
        assert naive_sum != len(tokenizer.encode(counterexample, add_special_tokens=False))


def test_metaspace_first_counts_its_offset_0_piece_apart():
    """Phi-3 as transformers 5 builds it: "▁" before the text at offset 0 only, none after an added token;
    one count for every piece alike would miss or add that "▁"."""
    tokenizer = edited(PHI3_MINI, metaspace("first"))
    counter, why = PieceCounter.for_tokenizer(tokenizer, PieceCountCache())
    assert counter is not None and why is None
    for text in ("<|end|>안녕", "안녕<|end|>안녕", " Hi<|user|> Hi", "\u2581x<|end|>\u2581x", "<|user|>"):
        whole = len(tokenizer.encode(text, add_special_tokens=False))
        pieces, matched = AddedTokenSplitter(split_tokens(tokenizer)).split(text)
        naive = matched + sum(len(e) for e in tokenizer.encode_batch_fast(pieces, add_special_tokens=False))
        assert counter.count(text, add_special_tokens=False).tokens == whole, text
        if text.startswith("<|end|>"):
            assert naive != whole  # the piece after the token is not at offset 0: no "▁"
    # The same text at offset 0 and after a token are two cache entries.
    assert counter.count("안녕<|end|>안녕", add_special_tokens=False).encoded_pieces == 0


def test_a_model_that_falls_back_still_counts_exactly(tmp_path: Path):
    for name in ("tokenizer_config.json", "chat_template.jinja"):
        if (PHI3_MINI / name).is_file():
            shutil.copy(PHI3_MINI / name, tmp_path / name)
    tokenizer = edited(PHI3_MINI)
    tokenizer.add_tokens([AddedToken("word", single_word=True, normalized=False)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    # tokenizer.json as it is: transformers 5's LlamaTokenizer would rebuild it without the edit.
    model = load_model_tokenizer(tmp_path, piece_cache=PieceCountCache(), tokenizer_loader="tokenizer_json")
    assert model.piece_counter is None and "single_word" in (model.piece_fallback or "")
    body = {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi there"}]}
    assert model.count_chat(body) == len(model.tokenizer.encode(model.render_chat(body), add_special_tokens=False))


# ---------------------------------------------------------------------------
# The cache: work per turn, bounds, sharing, threads
# ---------------------------------------------------------------------------

def _conversation(turns: int) -> dict:
    messages = [{"role": "system", "content": "You are terse."}]
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {turn}: how many tokens are in 안녕하세요 {turn}?"})
        messages.append({"role": "assistant", "content": f"Answer {turn}: ```python\nprint({turn} * 2)\n```"})
    messages.append({"role": "user", "content": "And now?"})
    return {"messages": messages}


@pytest.mark.parametrize("name", ["Qwen--Qwen3-8B", "microsoft--Phi-3-mini-4k-instruct"])
def test_a_resent_conversation_only_encodes_its_new_turn(name: str, models):
    model = models[name].with_piece_cache(PieceCountCache())
    first = model.tally_chat(_conversation(20))
    assert first.encoded_tokens > 0
    again = model.tally_chat(_conversation(20))
    assert (again.tokens, again.encoded_pieces, again.encoded_tokens) == (first.tokens, 0, 0)

    longer = model.tally_chat(_conversation(21))
    assert longer.tokens == models[name].count_chat(_conversation(21))
    # New: the question/answer pair of turn 21 ("And now?" was already last
    # turn's final message); a template may add its role header to a piece.
    new_messages = _conversation(21)["messages"][-3:-1]
    new_tokens = sum(models[name].count_text(m["content"], add_special_tokens=False) for m in new_messages)
    assert 1 <= longer.encoded_pieces <= 4
    assert new_tokens <= longer.encoded_tokens <= new_tokens + 12
    assert longer.encoded_tokens * 10 < longer.tokens


def test_lru_is_bounded_and_evicts_the_least_recently_used():
    cache = PieceCountCache(max_entries=2)
    a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
    cache.put_many([(a, 1), (b, 2)])
    assert cache.get_many([a]) == [1]  # a is now the most recent
    cache.put_many([(c, 3)])  # evicts b
    assert cache.get_many([a, b, c]) == [1, None, 3]
    stats = cache.stats()
    assert (stats.entries, stats.max_entries, stats.hits, stats.misses, stats.evictions) == (2, 2, 3, 1, 1)
    with pytest.raises(ValueError):
        PieceCountCache(max_entries=0)


def test_one_cache_serves_several_models_without_mixing_them(models):
    cache = PieceCountCache()
    qwen = models["Qwen--Qwen3-8B"].with_piece_cache(cache)
    phi3 = models["microsoft--Phi-3-mini-4k-instruct"].with_piece_cache(cache)
    text = " Hello 안녕하세요 world"
    assert qwen.piece_counter.digest(text) != phi3.piece_counter.digest(text)
    for model in (qwen, phi3, qwen, phi3):
        expected = len(model.tokenizer.encode(text, add_special_tokens=False))
        assert model.count_text(text, add_special_tokens=False) == expected
    assert len(cache) == 2


def test_tokenizer_cache_shares_one_piece_cache_and_can_turn_it_off():
    shared = TokenizerCache(max_entries=4, piece_cache_entries=1000)
    mini, medium = shared.get(PHI3_MINI), shared.get(PHI3_MEDIUM)
    assert shared.piece_cache is not None and shared.piece_cache.max_entries == 1000
    assert mini.piece_counter.cache is shared.piece_cache
    assert medium.piece_counter.cache is shared.piece_cache

    off = TokenizerCache(max_entries=4, piece_cache_entries=0)
    assert off.piece_cache is None and off.get(PHI3_MINI).piece_counter is None
    assert off.get(PHI3_MINI).piece_fallback is None  # off, not a fallback
    with pytest.raises(ValueError):
        TokenizerCache(piece_cache_entries=-1)


def test_concurrent_counts_through_a_tiny_shared_cache_stay_exact(models):
    model = models["Qwen--Qwen3-8B"]
    cache = PieceCountCache(max_entries=8)  # far fewer entries than pieces: constant eviction
    counting = model.with_piece_cache(cache)
    bodies = [_conversation(turns) for turns in range(1, 13)] * 4
    expected = [model.count_chat(body) for body in bodies]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(counting.count_chat, bodies))
    assert got == expected
    assert len(cache) <= 8


def test_text_the_tokenizer_refuses_is_refused_either_way(fresh_loads):
    # Its own load: fastokens raising on the text counts as an engine failure, which must not stay
    # on the process's shared Qwen3 (tests/tokenizer_cache/test_encoder.py asserts a fresh model's 0).
    model = load_model_tokenizer(MODELS / "Qwen--Qwen3-8B")
    text = "fine<|im_end|>lone surrogate \ud800"
    with pytest.raises(TypeError):
        model.count_text(text, add_special_tokens=False)
    with pytest.raises(TypeError):
        model.with_piece_cache(PieceCountCache()).count_text(text, add_special_tokens=False)


def test_memory_per_entry_is_bounded():
    entries = 16_384
    keys = [hashlib.blake2b(i.to_bytes(4, "little"), digest_size=16).digest() for i in range(entries)]
    cache = PieceCountCache(entries)
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cache.put_many((key, 1000 + i) for i, key in enumerate(keys))
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    per_entry = (after - before) / entries + 49  # + the 16-byte digest object itself (49 B)
    assert per_entry < 200, per_entry
