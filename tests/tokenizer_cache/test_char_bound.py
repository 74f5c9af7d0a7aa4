"""vLLM's character bound: max_chars_per_token as vLLM computes it, and the refusal it makes."""

from __future__ import annotations

import json

import pytest

from tests.conftest import SHARED
from tokenizer_cache import CharBoundExceeded, CountError, load_model_tokenizer
from tokenizer_cache._char_bound import (
    char_bound,
    char_bound_message,
    config_token_texts,
    max_chars_per_token,
)

MODELS = SHARED / "models"
CAPTURES = SHARED / "vllm" / "captures"
QWEN3 = MODELS / "Qwen--Qwen3-8B"

# max(len(tok) for tok in tokenizer.get_vocab()) on the tokenizer vLLM 0.32 loads
# (transformers 5.19 AutoTokenizer in the real-vLLM venv, measured once for these files).
VLLM_MAX_CHARS_PER_TOKEN = {
    "Qwen--Qwen2.5-7B-Instruct": 128,
    "Qwen--Qwen3-8B": 128,
    "Qwen--Qwen3.5-9B": 128,
    "deepseek-ai--DeepSeek-R1-Distill-Llama-8B": 128,
    "deepseek-ai--DeepSeek-R1-Distill-Qwen-7B": 128,
    "deepseek-ai--DeepSeek-V3.1": 128,
    "microsoft--Phi-3-medium-4k-instruct": 16,
    "microsoft--Phi-3-mini-4k-instruct": 16,
}


@pytest.mark.parametrize("name", sorted(VLLM_MAX_CHARS_PER_TOKEN))
def test_max_chars_per_token_is_vllms(name: str):
    model = load_model_tokenizer(MODELS / name, engine="tokenizers")
    assert model.max_chars_per_token == VLLM_MAX_CHARS_PER_TOKEN[name]


def test_tokens_only_the_config_names_count_too():
    """transformers adds tokenizer_config.json's tokens missing from tokenizer.json
    (Qwen3.5's <tts_text_bos_single> and others) to get_vocab()."""
    config = json.loads((MODELS / "Qwen--Qwen3.5-9B" / "tokenizer_config.json").read_text(encoding="utf-8"))
    assert "<tts_text_bos_single>" in config_token_texts(config)
    assert max_chars_per_token(["ab", "abc"], ["x" * 200]) == 200
    assert max_chars_per_token([], []) == 0
    assert config_token_texts({"bos_token": {"content": "<s>"}, "extra_special_tokens": ["<a>"],
                               "additional_special_tokens": ["<b>", 3]}) == ["<s>", "<b>", "<a>"]


def test_bound_applies_unless_truncation_is_asked_for():
    assert char_bound(2048, 128) == 262_144
    assert char_bound(None, 128) is None
    assert char_bound(2048, 128, truncate_prompt_tokens=100) is None
    assert char_bound(2048, 128, truncate_prompt_tokens=-1) is None


def _capture(name: str) -> dict:
    return json.loads((CAPTURES / f"{name}.json").read_text(encoding="utf-8"))


def test_message_is_vllms_word_for_word():
    captured = _capture("c09d_chat_over_char_bound")["body"]["error"]
    assert captured["param"] == "input_text"
    assert char_bound_message(300_050, 262_144, 2048) == captured["message"]


def test_chat_over_the_bound_is_refused_before_encoding(qwen3, monkeypatch):
    # The captured request: 300,000 characters of content to tiny-qwen (Qwen3's
    # tokenizer and template, --max-model-len 2048); the template adds 50.
    body = {"messages": [{"role": "user", "content": ("hello " * 50_000)[:300_000]}], "max_tokens": 4}
    captured = _capture("c09d_chat_over_char_bound")["body"]["error"]

    def no_encoding(*args, **kwargs):
        raise AssertionError("encoded a prompt over the character bound")

    monkeypatch.setattr(qwen3, "tally_text", no_encoding)
    with pytest.raises(CharBoundExceeded) as caught:
        qwen3.count_chat(body, max_model_len=2048)
    assert (caught.value.message, caught.value.param) == (captured["message"], "input_text")
    assert (caught.value.chars, caught.value.max_chars) == (300_050, 262_144)
    assert isinstance(caught.value, CountError)


def test_chat_at_the_bound_is_counted(qwen3):
    overhead = len(qwen3.render_chat({"messages": [{"role": "user", "content": ""}]}))
    body = {"messages": [{"role": "user", "content": "a" * (16 * 128 - overhead)}]}
    assert len(qwen3.render_chat(body)) == 16 * 128
    assert qwen3.count_chat(body, max_model_len=16) == qwen3.count_chat(body)  # over 16 tokens, not refused here
    body["messages"][0]["content"] += "a"
    with pytest.raises(CharBoundExceeded):
        qwen3.count_chat(body, max_model_len=16)
    body["truncate_prompt_tokens"] = 8  # vLLM truncates instead of refusing
    assert qwen3.count_chat(body, max_model_len=16) > 16


def test_completions_check_each_prompt(qwen3):
    captured = _capture("c09e_completions_over_char_bound")["body"]["error"]
    with pytest.raises(CharBoundExceeded) as caught:
        qwen3.count_completion({"prompt": "x" * 300_000}, max_model_len=2048)
    assert caught.value.message == captured["message"]
    with pytest.raises(CharBoundExceeded):
        qwen3.count_completion({"prompt": ["short", "x" * (2048 * 128 + 1)]}, max_model_len=2048)
    assert qwen3.count_completion({"prompt": ["short", "x" * 2048 * 128]}, max_model_len=2048)[0] == 1
    assert qwen3.count_completion({"prompt": [[1, 2, 3]]}, max_model_len=1) == [3]  # ids are not texts
