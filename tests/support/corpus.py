"""The shared prompt-token corpus (`../shared/corpus/`): requests with the counts a real vLLM reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tokenizer_cache import CountError, TokenizerCache

SHARED = Path(__file__).resolve().parents[2].parent / "shared"
CORPUS_FILES = [SHARED / "corpus" / "token_cases.jsonl", SHARED / "corpus" / "token_cases_spm.jsonl"]


def load_cases(paths: list[Path] = CORPUS_FILES) -> list[dict[str, Any]]:
    """Every line of the corpus files, in order."""
    cases = []
    for path in paths:
        with path.open(encoding="utf-8") as handle:
            cases.extend(json.loads(line) for line in handle if line.strip())
    return cases


CASES = load_cases()


def count_case(model: Any, case: dict[str, Any]) -> int:
    """The prompt tokens of one case's request, by its endpoint."""
    request = case["request"]
    if case["endpoint"] == "chat":
        return int(model.count_chat(request))
    if case["endpoint"] == "responses":
        return int(model.count_responses(request))
    return sum(model.count_completion(request))


def check_case(case: dict[str, Any], cache: TokenizerCache) -> None:
    """The corpus rule: the count equals vLLM's, or a body vLLM refused raises CountError."""
    tokenizer = cache.get(SHARED / case["model_dir"])
    if case["expected_error"] is not None:
        with pytest.raises(CountError):
            count_case(tokenizer, case)
    else:
        assert count_case(tokenizer, case) == case["expected_prompt_tokens"]
