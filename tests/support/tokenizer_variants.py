"""Edited copies of the shipped tokenizers, with the features none of them has.

Each turns on one thing fast reimplementations and per-piece counting get
wrong (lstrip/rstrip/normalized added tokens, encode_special_tokens,
ByteLevel add_prefix_space, Metaspace prepend schemes, a BOS/EOS
post-processor, single_word, BPE dropout).  EXACT_VARIANTS keep the
per-piece count exact; FALLBACK_VARIANTS must be counted whole.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, pre_tokenizers

MODELS = Path(__file__).resolve().parents[2].parent / "shared" / "models"
PHI3_MINI = MODELS / "microsoft--Phi-3-mini-4k-instruct"


def edited(model_dir: Path, edit: Callable[[dict], None] | None = None) -> Tokenizer:
    if edit is None:
        return Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    state = json.loads((model_dir / "tokenizer.json").read_text(encoding="utf-8"))
    if edit is not None:
        edit(state)
    return Tokenizer.from_str(json.dumps(state))


def _llama_with_strip_and_normalized_tokens() -> Tokenizer:
    # DeepSeek-R1-Distill-Llama-8B has no normalizer, so normalized tokens are exact.
    tokenizer = edited(MODELS / "deepseek-ai--DeepSeek-R1-Distill-Llama-8B")
    tokenizer.add_special_tokens(
        [AddedToken("<L>", lstrip=True, normalized=False), AddedToken("<R>", rstrip=True, normalized=False),
         AddedToken("<LR>", lstrip=True, rstrip=True, normalized=False)]
    )
    tokenizer.add_tokens(
        [AddedToken("<n>", normalized=True), AddedToken("<n", normalized=True),
         AddedToken("<nl>", normalized=True, lstrip=True, rstrip=True)]
    )
    return tokenizer


def _encode_special_tokens(model_dir: Path) -> Tokenizer:
    tokenizer = edited(model_dir)
    tokenizer.encode_special_tokens = True
    return tokenizer


def _byte_level_prefix_space() -> Tokenizer:
    """Qwen3 with ByteLevel add_prefix_space on: a space before every piece."""
    tokenizer = edited(MODELS / "Qwen--Qwen3-8B")
    split = json.loads(tokenizer.pre_tokenizer.__getstate__())["pretokenizers"][0]
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(split["pattern"]["Regex"]), "isolated"),
         pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False)]
    )
    return tokenizer


def metaspace(scheme: str) -> Callable[[dict], None]:
    def edit(state: dict) -> None:
        state["normalizer"] = None
        state["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": scheme, "split": False}

    return edit


def bos_eos(state: dict) -> None:
    """Llama-2's style of post-processor: <s> A </s>."""
    state["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "</s>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]},
                           "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}},
    }


EXACT_VARIANTS: dict[str, Callable[[], Tokenizer]] = {
    "lstrip-rstrip-and-normalized-tokens": _llama_with_strip_and_normalized_tokens,
    "qwen3-encode-special-tokens": lambda: _encode_special_tokens(MODELS / "Qwen--Qwen3-8B"),
    "phi3-encode-special-tokens": lambda: _encode_special_tokens(PHI3_MINI),
    "byte-level-add-prefix-space": _byte_level_prefix_space,
    "metaspace-always": lambda: edited(PHI3_MINI, metaspace("always")),
    # transformers 5's LlamaTokenizer: only the piece at offset 0 gets "▁" (counted apart, `_piece_support`)
    "metaspace-first": lambda: edited(PHI3_MINI, metaspace("first")),
    "post-processor-bos-eos": lambda: edited(PHI3_MINI, bos_eos),
}


def _single_word(model_dir: Path) -> Tokenizer:
    tokenizer = edited(model_dir)
    tokenizer.add_tokens([AddedToken("word", single_word=True, normalized=False)])
    return tokenizer


def _nfc_with_normalized_token() -> Tokenizer:
    tokenizer = edited(MODELS / "Qwen--Qwen3-8B")
    tokenizer.add_tokens([AddedToken("<n>", normalized=True)])
    return tokenizer


def _whitespace_edged_token() -> Tokenizer:
    tokenizer = edited(PHI3_MINI)
    tokenizer.add_tokens([AddedToken(" <x>", normalized=False)])
    return tokenizer


def _dropout(state: dict) -> None:
    state["model"]["dropout"] = 0.5


FALLBACK_VARIANTS: dict[str, tuple[Callable[[], Tokenizer], str, str | None]] = {
    # name: (tokenizer, words of the reason, a text whose naive piece sum is wrong)
    "single-word": (lambda: _single_word(MODELS / "Qwen--Qwen3-8B"), "single_word", "|<|im_wordx<|box_end|>"),
    "normalized-token-under-nfc": (_nfc_with_normalized_token, "normalized", None),
    "whitespace-edged-token-with-rstrip": (_whitespace_edged_token, "whitespace", None),
    "bpe-dropout": (lambda: edited(PHI3_MINI, _dropout), "dropout", None),
}
