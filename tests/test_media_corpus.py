"""Chats with images, counted by headroom, against what a real vLLM 0.32 answered.

`tests/data/media_cases.jsonl` was recorded from the tiny Qwen2-VL model
(tests/media_cases.py, tests/realvllm/tiny_vl_model.py): images of many sizes,
aspect ratios and formats, several per request, request-level processor
options, a string-format template, and requests vLLM refuses.  The tokenizer
directory headroom counts with is built here from the shared Qwen2.5
tokenizer files plus the builder's config.json, preprocessor_config.json and
chat template, exactly what the served model directory holds.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.media_cases import CORPUS
from tests.realvllm.tiny_vl_model import (
    OPENAI_TEMPLATE,
    STRING_TEMPLATE,
    write_tokenizer_dir,
)
from tokenizer_cache import CountError, ModelTokenizer, load_model_tokenizer

QWEN25 = Path(__file__).resolve().parents[1].parent / "shared" / "models" / "Qwen--Qwen2.5-7B-Instruct"
CASES = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ModelTokenizer]:
    models = {}
    for name, template in (("openai", OPENAI_TEMPLATE), ("string", STRING_TEMPLATE)):
        directory = tmp_path_factory.mktemp(f"tiny-qwen2-vl-{name}")
        write_tokenizer_dir(directory, QWEN25, template)
        models[name] = load_model_tokenizer(directory)
    return models


def images_in(request: dict) -> int:
    return sum(
        1
        for message in request["messages"]
        if isinstance(message["content"], list)
        for part in message["content"]
        if "image_url" in part or part.get("type") == "input_image"
    )


def test_corpus_covers_what_it_claims():
    served = [case for case in CASES if case["expected_status"] == 200]
    assert len(served) >= 45
    assert sum(images_in(case["request"]) > 1 for case in served) >= 4
    assert {case["template"] for case in served} == {"openai", "string"}
    assert sum("mm_processor_kwargs" in case["request"] for case in served) >= 4
    assert any(case["expected_status"] == 400 for case in CASES)


@pytest.mark.parametrize("case", CASES, ids=[case["id"] for case in CASES])
def test_case(case: dict, tokenizers: dict[str, ModelTokenizer]):
    tokenizer = tokenizers[case["template"]]
    assert tokenizer.media_family == "qwen2_vl"
    if case["expected_status"] == 200:
        assert tokenizer.count_chat(case["request"]) == case["expected_prompt_tokens"]
    else:
        with pytest.raises(CountError):
            tokenizer.count_chat(case["request"])
