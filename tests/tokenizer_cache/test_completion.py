"""A /v1/completions (or pooling) body's prompts: each distinct text counted once, every count in order."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import SHARED
from tokenizer_cache import _completion, load_model_tokenizer
from tokenizer_cache._completion import count_prompts


def _counting(calls: list[tuple[str, bool]]) -> Any:
    def count_text(text: str, special: bool) -> int:
        calls.append((text, special))
        return len(text) + (1 if special else 0)
    return count_text


def test_a_repeated_text_is_counted_once_and_every_prompt_gets_its_count() -> None:
    calls: list[tuple[str, bool]] = []
    prompts = ["a"] * 1000 + ["bb", "a", "ccc", "bb"]
    counts = count_prompts({"prompt": prompts, "add_special_tokens": False}, _counting(calls))
    assert counts == [len(p) for p in prompts]
    assert calls == [("a", False), ("bb", False), ("ccc", False)]


def test_past_the_remembered_texts_counts_stay_right(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_completion, "DISTINCT_TEXTS_REMEMBERED", 2)
    calls: list[tuple[str, bool]] = []
    prompts = ["a", "bb", "ccc", "a", "ccc", "bb"]
    counts = count_prompts({"prompt": prompts}, _counting(calls))
    assert counts == [2, 3, 4, 2, 4, 3]
    # "a" and "bb" were remembered; "ccc" was not, so it is counted each time it appears
    assert [text for text, _ in calls] == ["a", "bb", "ccc", "ccc"]


@pytest.mark.parametrize("model", ["Qwen--Qwen3-8B", "microsoft--Phi-3-mini-4k-instruct"])
def test_a_real_tokenizer_counts_a_batch_with_repeats_as_each_prompt_alone(model: str) -> None:
    tokenizer = load_model_tokenizer(SHARED / "models" / model)
    prompts = [" hello", "world", " hello", "<|endoftext|> x", "world", "日本語", " hello"] * 50
    for special in (True, False):
        alone = [tokenizer.count_text(p, add_special_tokens=special) for p in prompts]
        assert tokenizer.count_completion({"prompt": prompts, "add_special_tokens": special}) == alone
