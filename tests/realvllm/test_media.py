"""Images against a REAL vLLM 0.32 (CPU build, tiny random Qwen2-VL, real Qwen2.5 tokenizer).

- Every recorded case of tests/data/media_cases.jsonl is sent again: vLLM still
  answers what the file says (so the fast tier's expectations are current),
  and brimful's count equals ``usage.prompt_tokens``.
- vLLM's ``/tokenize`` runs the multimodal processor too: its count is exact
  for media, the upstream fallback the proxy can use when brimful cannot count.
- The render endpoints answer 403 without ``--enable-scale-out``.
- Through brimful (which finds the model directory through vLLM's
  /v1/models root): an image request that overflows is clamped to the exact
  room, and one that cannot fit gets brimful's 400 with the true count.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, UpstreamConfig
from tests.support.media_cases import (
    CORPUS,
    ask_vllm,
    build_cases,
    data_url,
    image,
    text,
    user,
    vllm_request,
)
from tests.support.servers import serve_in_thread
from tokenizer_cache import load_model_tokenizer

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]

RECORDED = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()]
STRING_TEMPLATE_CASES = {case["id"] for case in RECORDED if case["template"] == "string"}


def test_the_recorded_cases_are_the_ones_the_generator_makes():
    assert [case["id"] for case in RECORDED] == [case["id"] for case in build_cases()]


@pytest.mark.parametrize("case", RECORDED, ids=[case["id"] for case in RECORDED])
def test_vllm_still_answers_what_the_corpus_records_and_brimful_agrees(case: dict, real_vllm_vl) -> None:
    live = ask_vllm(real_vllm_vl.base_url, case)
    assert live["expected_status"] == case["expected_status"]
    assert live["expected_prompt_tokens"] == case["expected_prompt_tokens"]
    if case["template"] == "openai" and live["expected_status"] == 200 and "brimful" not in case:
        # The string-template cases are counted by the fast tier with a second
        # tokenizer directory; the served directory's own template is this one.
        tokenizer = load_model_tokenizer(real_vllm_vl.tokenizer_dir)
        assert tokenizer.count_chat(case["request"]) == live["expected_prompt_tokens"]


def test_tokenize_counts_media_like_the_engine(real_vllm_vl) -> None:
    case = next(c for c in RECORDED if c["id"] == "two-images-one-message")
    body = {"model": real_vllm_vl.model, "messages": case["request"]["messages"], "add_generation_prompt": True}
    answer = httpx.post(f"{real_vllm_vl.base_url}/tokenize", json=body, timeout=120).json()
    assert answer["count"] == case["expected_prompt_tokens"]


def test_tokenize_counts_a_video_like_the_engine(real_vllm_vl) -> None:
    """Where brimful cannot count (video), the upstream's /tokenize is exact."""
    case = next(c for c in RECORDED if c["id"] == "video-and-image-not-countable")
    body = {"model": real_vllm_vl.model, "messages": case["request"]["messages"], "add_generation_prompt": True}
    answer = httpx.post(f"{real_vllm_vl.base_url}/tokenize", json=body, timeout=120).json()
    assert answer["count"] == case["expected_prompt_tokens"]


def test_render_endpoint_needs_scale_out(real_vllm_vl) -> None:
    case = next(c for c in RECORDED if c["id"] == "size-640x480")
    response = httpx.post(
        f"{real_vllm_vl.base_url}/v1/chat/completions/render", json=vllm_request(case), timeout=120
    )
    assert response.status_code == 403
    assert "--enable-scale-out" in response.json()["error"]["message"]


@pytest.fixture(scope="module")
def through(real_vllm_vl) -> Iterator[tuple[openai.OpenAI, BrimfulApp]]:
    app = BrimfulApp(Config(upstream=UpstreamConfig(url=real_vllm_vl.base_url, timeout=120.0)))
    with serve_in_thread(app) as base_url:
        yield openai.OpenAI(base_url=base_url + "/v1", api_key="x", max_retries=0, timeout=120), app


def big_images(count: int) -> list[dict]:
    """`count` images of ~484 tokens each (clamped by the tiny model's max_pixels)."""
    return [user(text("Look."), *[image(data_url((1400 + i, 1400))) for i in range(count)])]


def test_image_request_that_overflows_is_clamped_to_the_exact_room(through, real_vllm_vl) -> None:
    client, _ = through
    messages = big_images(3)
    prompt = ask_vllm(real_vllm_vl.base_url, {"template": "openai", "request": {"messages": messages}})
    assert 1400 < prompt["expected_prompt_tokens"] < 2048 - 16
    raw = client.chat.completions.with_raw_response.create(model=real_vllm_vl.model, messages=messages, max_tokens=2000)
    completion = raw.parse()
    # An exact count needs no margin: the full room, as vLLM alone would clamp it.
    granted = 2048 - prompt["expected_prompt_tokens"]
    assert raw.headers["x-brimful-action"] == "clamped"
    assert "x-brimful-margin-tokens" not in raw.headers
    assert raw.headers["x-brimful-prompt-tokens"] == str(prompt["expected_prompt_tokens"])
    assert raw.headers["x-brimful-granted-max-tokens"] == str(granted)
    assert completion.usage.prompt_tokens == prompt["expected_prompt_tokens"]
    assert completion.usage.completion_tokens == granted


def test_image_request_that_cannot_fit_gets_brimfuls_400_with_the_true_count(through, real_vllm_vl) -> None:
    client, _ = through
    messages = big_images(5)
    tokenizer = load_model_tokenizer(real_vllm_vl.tokenizer_dir)
    true_count = tokenizer.count_chat({"messages": messages})
    assert true_count > 2048
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=real_vllm_vl.model, messages=messages, max_tokens=4)
    body = info.value.body
    assert body["code"] == "context_length_exceeded"
    assert body["brimful"]["prompt_tokens"] == true_count
