"""vLLM's character bound: a prompt too long to fit, refused without tokenizing it.

vLLM 0.32 (`vllm/renderers/params.py`, `TokenizeParams._text_len_check`)
checks each text prompt before encoding it: with `max_input_tokens` =
`max_model_len` and `max_chars_per_token` the longest token of the
vocabulary (`vllm/tokenizers/hf.py`, `get_cached_tokenizer`:
`max(len(tok) for tok in tokenizer.get_vocab())`), a text of more than
`max_input_tokens * max_chars_per_token` characters cannot fit however it
tokenizes, and is refused with a 400 (param `input_text`) unless the request
asks for truncation (`truncate_prompt_tokens`; with a `truncation_side` the
text is cut to the bound instead).  Characters are Python code points,
counted on the rendered chat prompt or on each completions prompt.

The bound is exact: brimful refuses exactly what vLLM refuses, with its
words, and the text of such a prompt never has to be encoded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ._errors import CountError


def max_chars_per_token(vocabulary: Iterable[str], config_tokens: Iterable[str] = ()) -> int:
    """The longest token's length in characters, as vLLM computes it.

    transformers' `get_vocab()` holds tokenizer.json's vocabulary and added
    tokens, plus tokens that tokenizer_config.json names but tokenizer.json
    lacks (it adds them at load): `config_tokens`.
    """
    return max((len(token) for token in (*vocabulary, *config_tokens)), default=0)


def config_token_texts(config: Mapping[str, Any]) -> list[str]:
    """Token texts tokenizer_config.json declares (added_tokens_decoder, the named
    special tokens, additional/extra special tokens): transformers adds any of
    them missing from tokenizer.json to the vocabulary."""
    texts: list[str] = []

    def add(value: Any) -> None:
        if isinstance(value, str):
            texts.append(value)
        elif isinstance(value, dict) and isinstance(value.get("content"), str):
            texts.append(value["content"])

    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for entry in decoder.values():
            add(entry)
    for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        add(config.get(key))
    for key in ("additional_special_tokens",):
        values = config.get(key)
        if isinstance(values, list):
            for value in values:
                add(value)
    extra = config.get("extra_special_tokens")
    if isinstance(extra, dict):
        for value in extra.values():
            add(value)
    elif isinstance(extra, list):
        for value in extra:
            add(value)
    return texts


class CharBoundExceeded(CountError):
    """The prompt has more characters than `max_model_len` tokens can hold (vLLM's 400)."""

    def __init__(self, chars: int, max_chars: int, max_model_len: int) -> None:
        self.chars = chars
        self.max_chars = max_chars
        self.max_model_len = max_model_len
        super().__init__(char_bound_message(chars, max_chars, max_model_len), param="input_text")


def char_bound(
    max_model_len: int | None, chars_per_token: int, truncate_prompt_tokens: object = None
) -> int | None:
    """The most characters a prompt may have, or None when vLLM does not refuse by characters
    (no context length, or the request sets `truncate_prompt_tokens`, whatever its value: vLLM
    then truncates instead)."""
    if max_model_len is None or truncate_prompt_tokens is not None:
        return None
    return max_model_len * chars_per_token


def check_chars(chars: int, bound: int | None, max_model_len: int | None) -> None:
    """Raise CharBoundExceeded when a prompt of `chars` characters is over `bound` (from `char_bound`)."""
    if bound is not None and chars > bound:
        raise CharBoundExceeded(chars, bound, max_model_len if max_model_len is not None else 0)


def char_bound_message(chars: int, max_chars: int, max_model_len: int) -> str:
    """vLLM 0.32's text, with the " (parameter=…, value=…)" its error adds
    (capture c09d_chat_over_char_bound.json, quoted in docs/vllm-behaviour.md)."""
    return (
        f"This model's maximum context length is {max_model_len} tokens. However, your prompt "
        f"contains {chars} characters (more than {max_chars} characters, which is the upper bound "
        f"for {max_model_len} input tokens). Please reduce the length of the input prompt. "
        f"(parameter=input_text, value={chars})"
    )
