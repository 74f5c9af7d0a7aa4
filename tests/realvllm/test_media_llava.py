"""LLaVA-1.5-style images against a REAL vLLM 0.32 (tiny random LLaVA, CLIP tower, Qwen2.5 tokenizer).

Every recorded case of tests/data/media_cases_llava.jsonl is sent again: vLLM
still answers what the file says, and brimful's count (from the served model
directory) equals ``usage.prompt_tokens``: 576 tokens per image, whatever its size.
"""

from __future__ import annotations

import json

import pytest

from tests.support.media_cases import LLAVA_CORPUS, LLAVA_MODEL, ask_vllm, build_llava_cases
from tokenizer_cache import load_model_tokenizer

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

RECORDED = [json.loads(line) for line in LLAVA_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_recorded_cases_are_the_ones_the_generator_makes():
    assert [case["id"] for case in RECORDED] == [case["id"] for case in build_llava_cases()]


@pytest.mark.parametrize("case", RECORDED, ids=[case["id"] for case in RECORDED])
def test_vllm_still_answers_what_the_corpus_records_and_brimful_agrees(case: dict, real_vllm_llava) -> None:
    live = ask_vllm(real_vllm_llava.base_url, case, LLAVA_MODEL)
    assert live["expected_status"] == case["expected_status"]
    assert live["expected_prompt_tokens"] == case["expected_prompt_tokens"]
    if live["expected_status"] == 200:
        tokenizer = load_model_tokenizer(real_vllm_llava.tokenizer_dir)
        assert tokenizer.count_chat(case["request"]) == live["expected_prompt_tokens"]
