"""What real SDKs send, counted exactly as a real vLLM 0.32 counted it.

tests/corpus/clients.jsonl holds the chat and completions bodies recorded from
openai, openai-agents, langchain-openai, llama-index, litellm, instructor and a
hand-written Aider-style session (tests/clients/capture.py), each with the
`usage.prompt_tokens` a real vLLM 0.32 reported for it
(tests/clients/ground_truth.py), per tokenizer whose template supports the
shape.  tests/corpus/fields.jsonl adds hand-written bodies on the edges of
vLLM's request models (tests/clients/fields.py), answered by the same server.
Every count must be exact; a body vLLM refused must raise CountError.
"""

from __future__ import annotations

import json
import unicodedata
from collections import Counter
from pathlib import Path

import pytest

from tests.support.corpus import check_case
from tokenizer_cache import TokenizerCache

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
CORPUS = ROOT / "tests" / "corpus"
CLIENTS = CORPUS / "clients.jsonl"
CAPTURED = CORPUS / "clients_captured.jsonl"
RESPONSES = CORPUS / "clients_responses.jsonl"
FIELDS = CORPUS / "fields.jsonl"


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


CASES = _lines(CLIENTS)
FIELD_CASES = _lines(FIELDS)


@pytest.fixture(scope="module")
def cache() -> TokenizerCache:
    return TokenizerCache(max_entries=16)


def test_every_captured_body_has_a_ground_truth_for_qwen3():
    # The tiny-qwen server (the real Qwen3 tokenizer) answered for every body.
    captured = {line["id"] for line in _lines(CAPTURED) if line["endpoint"] != "responses"}
    counted = {case["id"].split(":", 1)[1] for case in CASES if case["model_dir"] == "models/Qwen--Qwen3-8B"}
    assert captured and captured == counted


def test_corpus_covers_every_client():
    clients = Counter(case["client"].split()[0] for case in CASES)
    for name in ("openai", "openai-agents", "langchain-openai", "llama-index-llms-openai-like", "litellm",
                 "instructor"):
        assert clients[name] > 0, name
    assert len({case["id"] for case in CASES}) == len(CASES)


def test_responses_bodies_are_stored_with_their_counts():
    # Kept for the /v1/responses surface; vLLM counts them like the equivalent chat.
    lines = _lines(RESPONSES)
    assert lines and all(line["endpoint"] == "responses" for line in lines)
    assert all(line["expected_prompt_tokens"] or line["expected_error"] for line in lines)


def test_qwen35_cases_hold_no_combining_marks():
    # tests/clients/tiny_models.py served Qwen3.5's files through transformers'
    # Qwen2 tokenizer class, which splits differently only around combining marks.
    for case in CASES:
        if case["model_dir"] == "models/Qwen--Qwen3.5-9B":
            text = json.dumps(case["request"], ensure_ascii=False)
            assert not any(unicodedata.combining(ch) for ch in text), case["id"]


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(case: dict, cache: TokenizerCache):
    check_case(case, cache)


def test_field_cases_cover_both_outcomes():
    assert len(FIELD_CASES) == len(_lines(CORPUS / "fields_captured.jsonl"))
    refused = [case for case in FIELD_CASES if case["expected_error"] is not None]
    assert 0 < len(refused) < len(FIELD_CASES)


@pytest.mark.parametrize("case", FIELD_CASES, ids=[case["id"] for case in FIELD_CASES])
def test_field_case(case: dict, cache: TokenizerCache):
    check_case(case, cache)
