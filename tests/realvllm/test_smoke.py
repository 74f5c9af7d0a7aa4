"""Smoke tests against a REAL vLLM 0.32 CPU server (no proxy in between).

They pin the upstream facts brimful is built on, measured on the real thing
rather than recalled: the advertised max_model_len, that ``/tokenize`` counts a
chat exactly as the chat endpoint bills it, the wording of the ``max_tokens``
rejection, and 0.32's silent clamp of ``prompt + max_tokens > max_model_len``.
The server is the session-scoped ``real_vllm`` fixture (tests/realvllm).

The tiny model never emits EOS: every generation request sends a small
``max_tokens`` or it would generate up to the whole context.

The last few tests check the tier's own helpers without a server.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import openai
import pytest

from tests.realvllm.fixture import QWEN3_TOKENIZER_DIR, SHARED_DIR, RealVllm, parse_mode
from tests.realvllm.tiny_model import expected_manifest, full_vocab_size, model_config, weight_shapes

CAPTURES = SHARED_DIR / "vllm" / "captures"

CHATS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_user": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Name three prime numbers."},
    ],
    "multi_turn": [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Korea?"},
    ],
    "korean": [{"role": "user", "content": "안녕하세요, 오늘 날씨는 어떤가요? 🌤️"}],
}


@pytest.fixture(scope="module")
def client(real_vllm: RealVllm) -> openai.OpenAI:
    return openai.OpenAI(base_url=real_vllm.openai_base_url, api_key="unused", max_retries=0, timeout=60)


def tokenize_chat(real_vllm: RealVllm, messages: list[dict]) -> dict:
    """vLLM's ``POST /tokenize`` (outside /v1, so not in the OpenAI client)."""
    response = httpx.post(
        f"{real_vllm.base_url}/tokenize",
        json={"model": real_vllm.model, "messages": messages, "add_generation_prompt": True},
        timeout=60,
    )
    response.raise_for_status()
    return response.json()


def captured_error(name: str) -> dict:
    return json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))["body"]["error"]


@pytest.mark.realvllm
def test_models_lists_tiny_qwen_with_max_model_len_2048(real_vllm: RealVllm, client: openai.OpenAI) -> None:
    models = {model.id: model for model in client.models.list().data}
    assert list(models) == ["tiny-qwen"]
    # max_model_len is a vLLM extension of the OpenAI model object.
    assert models["tiny-qwen"].model_extra["max_model_len"] == real_vllm.max_model_len == 2048


@pytest.mark.realvllm
@pytest.mark.parametrize("name", sorted(CHATS))
def test_tokenize_count_equals_billed_prompt_tokens(real_vllm: RealVllm, client: openai.OpenAI, name: str) -> None:
    messages = CHATS[name]
    tokenized = tokenize_chat(real_vllm, messages)
    completion = client.chat.completions.create(model=real_vllm.model, messages=messages, max_tokens=1)
    assert tokenized["count"] == len(tokenized["tokens"])
    assert tokenized["max_model_len"] == 2048
    assert completion.usage.prompt_tokens == tokenized["count"]
    assert completion.usage.completion_tokens == 1


@pytest.mark.realvllm
def test_single_user_hello_counts_like_the_capture(real_vllm: RealVllm) -> None:
    """The capture server and this one are the same build and tokenizer: same count (10)."""
    captured = json.loads((CAPTURES / "b01_single_user_tokenize.json").read_text(encoding="utf-8"))
    assert tokenize_chat(real_vllm, captured["request"]["json"]["messages"])["count"] == captured["body"]["count"]


@pytest.mark.realvllm
def test_max_tokens_above_max_model_len_is_rejected_with_captured_wording(
    real_vllm: RealVllm, client: openai.OpenAI
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=real_vllm.model, messages=CHATS["single_user"], max_tokens=2049)
    assert caught.value.status_code == 400
    assert caught.value.body == captured_error("c03_max_tokens_gt_max_model_len")
    assert caught.value.body["message"] == (
        "max_tokens=2049 cannot be greater than max_model_len=2048. "
        "Please request fewer output tokens. (parameter=max_tokens, value=2049)"
    )


@pytest.mark.realvllm
def test_prompt_plus_max_tokens_over_the_limit_is_clamped_silently(real_vllm: RealVllm, client: openai.OpenAI) -> None:
    """vLLM 0.32 generates into the remaining room instead of rejecting (older versions said 400).

    A prompt near the limit keeps the clamped generation to a handful of tokens.
    """
    words = 2030  # " hello" is one Qwen3 token; the template adds ~10
    messages = [{"role": "user", "content": "hello" + " hello" * (words - 1)}]
    prompt_tokens = tokenize_chat(real_vllm, messages)["count"]
    room = real_vllm.max_model_len - prompt_tokens
    assert 0 < room < 64, f"prompt of {prompt_tokens} tokens should leave a little room"
    completion = client.chat.completions.create(model=real_vllm.model, messages=messages, max_tokens=room + 100)
    assert completion.usage.prompt_tokens == prompt_tokens
    assert completion.usage.completion_tokens == room
    assert completion.choices[0].finish_reason == "length"


@pytest.mark.realvllm
def test_server_footprint_is_reported(real_vllm: RealVllm) -> None:
    """Not a limit test: prints the tier's measured costs (-s to see them) and checks they were measured."""
    rss_mib = real_vllm.rss_bytes() / 2**20
    print(f"\nreal vLLM: rss {rss_mib:.0f} MiB, timings {real_vllm.timings}, log {real_vllm.log_path}")
    assert rss_mib > 100  # a live torch process tree; 0 would mean the PID walk found nothing
    assert real_vllm.timings["startup_s"] > 0


# --- the tier's own helpers, no server needed ---------------------------------


@pytest.mark.parametrize(
    ("value", "mode"),
    [(None, "auto"), ("", "auto"), ("auto", "auto"), ("require", "require"), ("REQUIRE", "require"),
     ("0", "off"), ("off", "off"), ("false", "off")],
)  # fmt: skip
def test_parse_mode(value: str | None, mode: str) -> None:
    assert parse_mode(value) == mode


def test_parse_mode_rejects_unknown_values() -> None:
    with pytest.raises(pytest.UsageError):
        parse_mode("sometimes")


def test_tiny_model_vocab_covers_every_qwen3_token_id() -> None:
    # 151,643 BPE entries + 26 added tokens (<|endoftext|> ... </think>) = 151,669
    assert full_vocab_size(QWEN3_TOKENIZER_DIR / "tokenizer.json") == 151_669


def test_tiny_model_shapes_follow_its_config() -> None:
    config = model_config(151_669)
    shapes = weight_shapes(151_669)
    assert config["head_dim"] >= 32  # 16 crashes vLLM's CPU attention (docs/vllm-behaviour.md)
    assert shapes["model.embed_tokens.weight"] == (151_669, config["hidden_size"])
    assert shapes["model.layers.0.self_attn.k_proj.weight"] == (
        config["num_key_value_heads"] * config["head_dim"],
        config["hidden_size"],
    )
    layers = {name.split(".")[2] for name in shapes if name.startswith("model.layers.")}
    assert len(layers) == config["num_hidden_layers"]
    assert "lm_head.weight" not in shapes and config["tie_word_embeddings"]


def test_tiny_model_manifest_tracks_the_tokenizer_files(tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text("{}")
    before = expected_manifest(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text('{"changed": true}')
    assert expected_manifest(tmp_path) != before
