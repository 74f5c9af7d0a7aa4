"""The counting engine in use gives `tokenizers`' ids everywhere, or is not used.

* Every shipped tokenizer selects the fast engine, and its ids equal
  `tokenizers`' on every corpus request (rendered by brimful) and on a
  randomised set (tests/support/textgen.py: 400 and 2500 texts per tokenizer),
  add_special_tokens off and on, whole and through the piece cache.  The fast
  tier does Qwen3-8B's and Phi-3-mini's corpus requests; the rest is slow.
* Tokenizers edited to use what the shipped ones lack either select it and
  are identical too, or fall back to `tokenizers` with the reason: it cannot
  load Metaspace, and the self-check catches its real ByteLevel
  add_prefix_space difference.
* A fast engine made to disagree falls back (logged once); one that raises
  while counting hands that text to `tokenizers`; concurrent counts from
  threads stay exact.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tests.conftest import MODELS
from tests.support.corpus import CASES
from tests.support.textgen import random_texts
from tests.support.tokenizer_variants import EXACT_VARIANTS, FALLBACK_VARIANTS
from tokenizer_cache import (
    CountError,
    ModelTokenizer,
    PieceCountCache,
    load_model_tokenizer,
)
from tokenizer_cache._encoder import (
    FASTOKENS,
    REFERENCE,
    DeferredEncoder,
    FastokensEncoder,
    ReferenceEncoder,
    select_encoder,
)

pytest.importorskip("fastokens")

MODEL_DIRS = sorted(d for d in MODELS.iterdir() if (d / "tokenizer.json").is_file())
PHI3 = MODELS / "microsoft--Phi-3-mini-4k-instruct" / "tokenizer.json"   # the cheapest for fastokens to load


# fastokens takes 0.4-3.5 s of CPU to load each tokenizer: the fast tier sweeps the README's model and the
# cheapest one, the slow tier every shipped tokenizer.
FAST_TIER = {"Qwen--Qwen3-8B", "microsoft--Phi-3-mini-4k-instruct"}
SHIPPED = [pytest.param(d, id=d.name, marks=() if d.name in FAST_TIER else pytest.mark.slow) for d in MODEL_DIRS]


class FastModels(dict[str, ModelTokenizer]):
    """Each shipped model under "auto", loaded when first asked for, its fast engine loaded at once
    instead of after counting has paid for it."""

    def __missing__(self, name: str) -> ModelTokenizer:
        model = load_model_tokenizer(MODELS / name)
        assert model.engine_settled(timeout=300, now=True)
        self[name] = model
        return model


@pytest.fixture(scope="module")
def models() -> FastModels:
    return FastModels()


def _assert_same_ids(model: ModelTokenizer, texts: list[str]) -> None:
    engine = model._encoder
    reference = ReferenceEncoder(model.tokenizer)
    for text in texts:
        for add_special_tokens in (False, True):
            assert engine.ids(text, add_special_tokens) == reference.ids(text, add_special_tokens), repr(text[:80])
            assert engine.count(text, add_special_tokens) == reference.count(text, add_special_tokens)


@pytest.mark.parametrize("model_dir", SHIPPED)
def test_every_shipped_tokenizer_counts_with_the_fast_engine(model_dir: Path, models: FastModels):
    model = models[model_dir.name]
    assert (model.engine, model.engine_fallback) == (FASTOKENS, None)


@pytest.mark.parametrize("model_dir", SHIPPED)
def test_corpus_prompts_encode_identically(model_dir: Path, models: dict[str, ModelTokenizer]):
    model = models[model_dir.name]
    texts = []
    for case in CASES:
        if Path(case["model_dir"]).name != model_dir.name or case["expected_error"] is not None:
            continue
        if case["endpoint"] == "chat":
            texts.append(model.render_chat(case["request"]))
            assert model.count_chat(case["request"]) == case["expected_prompt_tokens"]
        else:
            prompt = case["request"]["prompt"]
            texts += [p for p in (prompt if isinstance(prompt, list) else [prompt]) if isinstance(p, str)]
    assert len(texts) >= 30
    _assert_same_ids(model, texts)


def _random_set(model_dir: Path, models: dict[str, ModelTokenizer], count: int) -> None:
    model = models[model_dir.name]
    texts = random_texts(model.tokenizer, count, seed=len(model_dir.name))
    _assert_same_ids(model, texts)
    # Through the piece cache, the engine counts the pieces: same totals as tokenizers' whole encode.
    pieces = model.with_piece_cache(PieceCountCache())
    assert pieces.piece_counter is not None and pieces.engine == FASTOKENS
    for text in texts:
        expected = len(model.tokenizer.encode(text, add_special_tokens=False))
        assert pieces.count_text(text, add_special_tokens=False) == expected, repr(text[:80])


@pytest.mark.slow
@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=[d.name for d in MODEL_DIRS])
def test_random_texts_encode_identically(model_dir: Path, models: dict[str, ModelTokenizer]):
    _random_set(model_dir, models, 400)


@pytest.mark.slow
@pytest.mark.parametrize("model_dir", MODEL_DIRS, ids=[d.name for d in MODEL_DIRS])
def test_many_random_texts_encode_identically(model_dir: Path, models: dict[str, ModelTokenizer]):
    _random_set(model_dir, models, 2500)


@pytest.mark.slow
@pytest.mark.parametrize("variant", EXACT_VARIANTS)
def test_edited_tokenizers_are_exact_or_fall_back(variant: str):
    tokenizer = EXACT_VARIANTS[variant]()
    choice = select_encoder(tokenizer, tokenizer.to_str())
    if variant == "metaspace-always":
        # fastokens has no Metaspace pre-tokenizer, and "always" is not rewritten (see docs/counting-loader.md)
        assert choice.encoder.name == REFERENCE and "cannot load" in (choice.fallback_reason or "")
        return
    if variant == "byte-level-add-prefix-space":
        # fastokens really differs here ("\u180e>" among others); the self-check sees it.
        assert choice.encoder.name == REFERENCE and "self-check" in (choice.fallback_reason or "")
        fast = FastokensEncoder(tokenizer.to_str(), ReferenceEncoder(tokenizer), split_special_tokens=False)
        assert fast.ids("\u180e>", False) != tokenizer.encode("\u180e>", add_special_tokens=False).ids
        return
    assert (choice.encoder.name, choice.fallback_reason) == (FASTOKENS, None)
    reference = ReferenceEncoder(tokenizer)
    for text in random_texts(tokenizer, 300, seed=len(variant)):
        for add_special_tokens in (False, True):
            assert choice.encoder.ids(text, add_special_tokens) == reference.ids(text, add_special_tokens), repr(text)


@pytest.mark.slow
@pytest.mark.parametrize("variant", [v for v in FALLBACK_VARIANTS if v != "bpe-dropout"])
def test_tokenizers_the_piece_cache_refuses_are_exact_or_fall_back(variant: str):
    tokenizer = FALLBACK_VARIANTS[variant][0]()
    choice = select_encoder(tokenizer, tokenizer.to_str())
    assert choice.encoder.name == FASTOKENS
    reference = ReferenceEncoder(tokenizer)
    for text in random_texts(tokenizer, 300, seed=len(variant)):
        for add_special_tokens in (False, True):
            assert choice.encoder.ids(text, add_special_tokens) == reference.ids(text, add_special_tokens), repr(text)


def _rebuilt_phi3(name: str, folder: Path) -> ModelTokenizer:
    """Phi-3's files as transformers 5 rebuilds them under a llama/qwen3 config (Metaspace prepend "first")."""
    folder.mkdir()
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (MODELS / name / file).is_file():
            (folder / file).symlink_to(MODELS / name / file)
    (folder / "config.json").write_text('{"model_type": "qwen3"}')
    model = load_model_tokenizer(folder, tokenizer_loader="transformers5")
    assert model.engine_settled(timeout=300, now=True)   # the fast engine now, not once counting paid for it
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", ["microsoft--Phi-3-mini-4k-instruct", "microsoft--Phi-3-medium-4k-instruct"])
def test_phi3_as_transformers5_builds_it_counts_with_the_fast_engine_exactly(name: str, tmp_path: Path):
    """fastokens over the Metaspace-free form plus the offset-0 "▁" (`PrependFirstEncoder`) equals
    `tokenizers` over what transformers 5 built, on the corpus prompts and random texts, whole and in pieces."""
    model = _rebuilt_phi3(name, tmp_path / name)
    assert model.loader_info.tokenizer_class == "LlamaTokenizer"
    assert '"prepend_scheme":"first"' in model.tokenizer.to_str().replace(" ", "")
    assert (model.engine, model.engine_fallback) == (FASTOKENS, None)
    texts = [model.render_chat(case["request"]) for case in CASES
             if Path(case["model_dir"]).name == name and case["endpoint"] == "chat" and case["expected_error"] is None]
    assert len(texts) >= 20
    texts += random_texts(model.tokenizer, 1500, seed=len(name))
    _assert_same_ids(model, texts)
    pieces = model.with_piece_cache(PieceCountCache())
    assert pieces.piece_counter is not None and pieces.engine == FASTOKENS
    for text in texts:
        for add_special_tokens in (False, True):
            expected = len(model.tokenizer.encode(text, add_special_tokens=add_special_tokens))
            assert pieces.count_text(text, add_special_tokens=add_special_tokens) == expected, repr(text[:80])


def test_a_disagreeing_engine_falls_back_and_says_so_once(monkeypatch, caplog):
    tokenizer = Tokenizer.from_file(str(PHI3))
    real_ids = FastokensEncoder.ids

    def off_by_one_on_hangul(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = real_ids(self, text, add_special_tokens)
        return [*ids, 0] if "가" in text else ids

    monkeypatch.setattr(FastokensEncoder, "ids", off_by_one_on_hangul)
    with caplog.at_level(logging.WARNING, logger="brimful.tokenizer"):
        choice = select_encoder(tokenizer, tokenizer.to_str(), source="phi3-test")
    assert choice.encoder.name == REFERENCE
    assert "self-check" in (choice.fallback_reason or "") and "가" in (choice.fallback_reason or "")
    warnings = [r for r in caplog.records if "phi3-test" in r.getMessage()]
    assert len(warnings) == 1


def test_a_model_whose_engine_disagrees_counts_with_tokenizers(monkeypatch, fresh_loads):
    monkeypatch.setattr(FastokensEncoder, "ids", lambda self, text, add: [])
    # loaded afresh (the self-check runs at load); the disagreeing engine is dropped after the test
    model = load_model_tokenizer(PHI3.parent, piece_cache=PieceCountCache(), engine="fastokens")
    assert model.engine == REFERENCE and "self-check" in (model.engine_fallback or "")
    assert model.count_text("Hello world", add_special_tokens=False) == 2


def test_engine_choice_can_be_forced():
    model = load_model_tokenizer(MODELS / "microsoft--Phi-3-mini-4k-instruct", engine="tokenizers")
    assert (model.engine, model.engine_fallback) == (REFERENCE, None)
    with pytest.raises(ValueError):
        load_model_tokenizer(MODELS / "microsoft--Phi-3-mini-4k-instruct", engine="nope")


def test_a_text_the_engine_raises_on_is_counted_by_tokenizers(models: dict[str, ModelTokenizer], caplog):
    model = models["Qwen--Qwen3-8B"]
    deferred = model._encoder
    assert isinstance(deferred, DeferredEncoder)
    encoder = deferred._active                                  # the fast engine it settled on
    assert isinstance(encoder, FastokensEncoder)

    class Raising:
        def encode(self, *args, **kwargs):
            raise RuntimeError("regex resource limit")

        def encode_batch(self, *args, **kwargs):
            raise RuntimeError("regex resource limit")

    broken = FastokensEncoder.__new__(FastokensEncoder)
    broken.__dict__.update(encoder.__dict__, _tokenizer=Raising(), _failures=0)
    with caplog.at_level(logging.WARNING, logger="brimful.tokenizer"):
        assert broken.count("Hello world", False) == 2
        assert broken.count_pieces(["Hello", " world"]) == [1, 1]
    assert broken.failures == 2
    assert model.with_encoder(broken).engine_failures == 2 and model.engine_failures == 0
    assert len([r for r in caplog.records if "fastokens raised" in r.getMessage()]) == 1


def test_counts_from_many_threads_stay_exact(models: dict[str, ModelTokenizer]):
    model = models["Qwen--Qwen3-8B"]
    texts = random_texts(model.tokenizer, 300, seed=5)
    expected = [len(model.tokenizer.encode(t, add_special_tokens=False)) for t in texts]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda t: model.count_text(t, add_special_tokens=False), texts * 4))
    assert got == expected * 4


def test_errors_stay_count_errors(models: dict[str, ModelTokenizer]):
    with pytest.raises(CountError):
        models["Qwen--Qwen3-8B"].count_chat({"messages": []})


# -- "auto" defers the fast engine until counting has paid for its load (`_encoder.DeferredEncoder`) --

def _deferred(budget: float, load, started: list) -> DeferredEncoder:
    def start(work) -> None:
        started.append(work)
        work()
    return DeferredEncoder(ReferenceEncoder(Tokenizer.from_file(str(PHI3))), load, budget, start)


def test_the_fast_engine_is_loaded_once_counting_has_cost_the_budget():
    tokenizer = Tokenizer.from_file(str(PHI3))
    started: list = []
    deferred = _deferred(0.0, lambda: select_encoder(tokenizer, tokenizer.to_str()), started)
    assert deferred.name == REFERENCE and "fastokens loads once" in (deferred.fallback_reason or "")
    assert deferred.count("Hello world", False) == 2            # counted by tokenizers; this count paid
    assert len(started) == 1 and deferred.wait_settled(0)
    assert (deferred.name, deferred.fallback_reason) == (FASTOKENS, None)
    assert deferred.count_pieces(["Hello", " world"]) == ReferenceEncoder(tokenizer).count_pieces(["Hello", " world"])
    assert deferred.ids("Hello world", True) == tokenizer.encode("Hello world").ids
    deferred.count("more", False)
    assert len(started) == 1                                    # loaded once


def test_a_model_counted_little_never_loads_the_fast_engine():
    def load():
        raise AssertionError("loaded although counting never paid for it")
    started: list = []
    deferred = _deferred(3600.0, load, started)
    for _ in range(50):
        assert deferred.count("Hello world", False) == 2
    assert not started and not deferred.wait_settled(0) and deferred.name == REFERENCE


def test_a_fast_engine_that_fails_its_self_check_is_never_used(monkeypatch):
    tokenizer = Tokenizer.from_file(str(PHI3))
    monkeypatch.setattr(FastokensEncoder, "ids", lambda self, text, add: [])
    started: list = []
    deferred = _deferred(0.0, lambda: select_encoder(tokenizer, tokenizer.to_str()), started)
    deferred.count("Hello world", False)
    assert deferred.wait_settled(0) and deferred.name == REFERENCE
    assert "self-check" in (deferred.fallback_reason or "")
    deferred.count("Hello world", False)
    assert len(started) == 1                                    # refused once, for good


def test_a_load_in_flight_is_started_once_per_process():
    started: list = []
    deferred = DeferredEncoder(ReferenceEncoder(Tokenizer.from_file(str(PHI3))), lambda: None,  # type: ignore
                               0.0, started.append)             # never runs: stays in flight
    deferred.count("a", False)
    deferred.count("b", False)
    assert len(started) == 1
    deferred._loading_pid = os.getpid() + 1                    # as in a forked child: that thread is gone
    deferred.count("c", False)
    assert len(started) == 2
