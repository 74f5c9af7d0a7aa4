"""Gemma 3 images against a REAL vLLM 0.32 (CPU build, tiny random Gemma 3, real npm tokenizer).

Every recorded case of tests/data/media_cases_gemma3.jsonl is sent again:
vLLM still answers what the file says, and brimful's count (from the served
model directory, found as the proxy would find it) equals ``usage.prompt_tokens``.
Skips without the npm tokenizer (an error under BRIMFUL_REAL_VLLM=require).
"""

from __future__ import annotations

import json

import httpx
import pytest

from tests.support.media_cases import GEMMA3_CORPUS, GEMMA3_MODEL, ask_vllm, build_gemma3_cases
from tokenizer_cache import load_model_tokenizer

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

RECORDED = [json.loads(line) for line in GEMMA3_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_recorded_cases_are_the_ones_the_generator_makes():
    assert [case["id"] for case in RECORDED] == [case["id"] for case in build_gemma3_cases()]


@pytest.mark.parametrize("case", RECORDED, ids=[case["id"] for case in RECORDED])
def test_vllm_still_answers_what_the_corpus_records_and_brimful_agrees(case: dict, real_vllm_gemma3_vl) -> None:
    live = ask_vllm(real_vllm_gemma3_vl.base_url, case, GEMMA3_MODEL)
    assert live["expected_status"] == case["expected_status"]
    assert live["expected_prompt_tokens"] == case["expected_prompt_tokens"]
    if live["expected_status"] == 200:
        tokenizer = load_model_tokenizer(real_vllm_gemma3_vl.tokenizer_dir)
        assert tokenizer.count_chat(case["request"]) == live["expected_prompt_tokens"]


def test_tokenize_counts_gemma3_images_like_the_engine(real_vllm_gemma3_vl) -> None:
    case = next(c for c in RECORDED if c["id"] == "three-images-with-text")
    body = {"model": GEMMA3_MODEL, "messages": case["request"]["messages"], "add_generation_prompt": True}
    answer = httpx.post(f"{real_vllm_gemma3_vl.base_url}/tokenize", json=body, timeout=120).json()
    assert answer["count"] == case["expected_prompt_tokens"]
