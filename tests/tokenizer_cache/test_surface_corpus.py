"""Responses and Messages requests counted with real tokenizer files, against a real vLLM 0.32's counts.

tests/data/surface_corpus.jsonl is made by tests/realvllm/surface_corpus.py:
each request was sent to a real vLLM 0.32 serving a tiny model around the
tokenizer, which reported `expected_prompt_tokens` (Responses: the usage of
the answer; Messages: /v1/messages/count_tokens, equal to the usage of the
answer).  Two checks per case:

* the conversion: brimful turns the request into the chat request recorded
  with the case, whose count by vLLM's own /tokenize (`chat_tokenize_count`)
  is the surface's count — so the conversion is the one vLLM applies;
* the count: brimful's count is vLLM's.  On vLLM 0.32 (transformers 5.19.0)
  two of the tokenizers encode some prompts differently from their
  tokenizer.json — Phi-3's SentencePiece (no "▁" after a special token) and
  the Llama-3 vocabulary of R1-Distill-Llama: the tiny model's config.json
  says model_type qwen3, so transformers 5 builds both as a LlamaTokenizer —
  and brimful counts with the tokenizer transformers 5 builds
  (tokenizer_cache/_loader.py), so those cases hold like any other.  Each
  case is counted from a folder like the one vLLM served: the tokenizer files
  and the tiny model's config.json (`recorded_folders`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from proxy.commands import count as count_cli
from tests.realvllm.tiny_model import full_vocab_size, model_config
from tests.support.corpus import SHARED
from tokenizer_cache import CountError, TokenizerCache

CORPUS = Path(__file__).resolve().parents[1] / "data" / "surface_corpus.jsonl"
CASES = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def cache() -> TokenizerCache:
    return TokenizerCache(max_entries=8)


@pytest.fixture(scope="module")
def recorded_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """model_dir → a folder as the recording's vLLM loaded it: the tokenizer files
    beside the tiny Qwen3 model's config.json (tests/realvllm/tiny_model.py)."""
    folders = {}
    for model_dir in sorted({case["model_dir"] for case in CASES}):
        source = SHARED / model_dir
        folder = tmp_path_factory.mktemp(source.name)
        for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            if (source / name).is_file():
                (folder / name).symlink_to(source / name)
        config = model_config(full_vocab_size(source / "tokenizer.json"))
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
        folders[model_dir] = folder
    return folders


def _count(tokenizer: Any, case: dict[str, Any]) -> int:
    if case["endpoint"] == "responses":
        return tokenizer.count_responses(case["request"])
    return tokenizer.count_messages(case["request"])


def test_the_corpus_covers_both_surfaces_over_both_tokenizer_kinds() -> None:
    by = {(c["endpoint"], c["id"].split(":")[0]) for c in CASES}
    for endpoint in ("responses", "messages"):
        assert sum(1 for c in CASES if c["endpoint"] == endpoint) >= 30
        assert {(endpoint, "qwen3-8b"), (endpoint, "phi3-mini")} <= by    # byte-level BPE and SentencePiece
    assert len({c["id"] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_the_conversion_is_the_one_vllm_counts(case: dict[str, Any], cache: TokenizerCache,
                                               recorded_folders: dict[str, Path]) -> None:
    tokenizer = cache.get(recorded_folders[case["model_dir"]])
    convert = tokenizer.responses_chat if case["endpoint"] == "responses" else tokenizer.messages_chat
    assert convert(case["request"]) == case["chat"]
    assert case["chat_tokenize_count"] == case["expected_prompt_tokens"]


@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_brimful_counts_what_vllm_counts(case: dict[str, Any], cache: TokenizerCache,
                                        recorded_folders: dict[str, Path]) -> None:
    tokenizer = cache.get(recorded_folders[case["model_dir"]])
    assert tokenizer.tokenizer_loader == "transformers5"
    if case["expected_error"] is not None:
        with pytest.raises(CountError):
            _count(tokenizer, case)
    else:
        assert _count(tokenizer, case) == case["expected_prompt_tokens"]


def test_brimful_count_runs_the_corpus(capsys: pytest.CaptureFixture[str], cache: TokenizerCache) -> None:
    """`brimful count --jsonl` counts Responses and Messages cases as the library does."""
    assert count_cli.main(["--jsonl", str(CORPUS), "--models-root", str(SHARED)]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["id"] for line in lines] == [c["id"] for c in CASES]
    for case, line in zip(CASES, lines, strict=True):
        assert line["prompt_tokens"] == _count(cache.get(SHARED / case["model_dir"]), case), case["id"]
