"""The shared prompt-token corpus (`../shared/corpus/`): requests with the counts a real vLLM reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

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
