"""Deterministic random texts aimed at where fast tokenizer reimplementations differ.

`random_texts(tokenizer, count, seed)` mixes: text in many scripts (combining
marks, RTL, Indic, Thai, CJK, Hangul, kana), runs of every kind of whitespace
(Unicode White_Space and the Python-only "spaces" U+001C..U+001F), the
tokenizer's own added tokens with whitespace and word characters on either
side (what lstrip / rstrip / single_word look at), special-token look-alikes
(cut short, mis-cased, full-width bars, doubled brackets), emoji with ZWJ
sequences, skin tones, flags and variation selectors, source code, digit
runs, characters outside any vocabulary (byte fallback: private use, astral
planes, controls, NUL), and very long words.  Each text starts and ends on
something different, so Metaspace / Prepend rules at the edges are hit too.

Used by tests/tokenizer_cache/test_engine_exactness.py and bench/engine_bench.py; the same
seed gives the same texts on every machine.
"""

from __future__ import annotations

import random
from typing import Any

from tokenizer_cache._selfcheck import (
    BYTE_FALLBACK,
    CODE,
    EMOJI,
    PUNCT_AND_DIGITS,
    SCRIPTS,
    WHITESPACE,
    lookalikes,
)


def added_token_specs(tokenizer: Any) -> list[dict[str, Any]]:
    """The tokenizer's added tokens (content and flags), from `tokenizers`' decoder."""
    return [
        {"content": token.content, "lstrip": token.lstrip, "rstrip": token.rstrip,
         "single_word": token.single_word, "normalized": token.normalized, "special": token.special}
        for _, token in sorted(tokenizer.get_added_tokens_decoder().items())
        if token.content
    ]


class TextGenerator:
    """Random texts for one tokenizer's added tokens; `rng` drives every choice."""

    def __init__(self, added: list[dict[str, Any]], rng: random.Random) -> None:
        self._rng = rng
        contents = [token["content"] for token in added]
        # Flagged tokens first: they are where engines differ; then a sample of the rest.
        flagged = [t["content"] for t in added if t["lstrip"] or t["rstrip"] or t["single_word"] or t["normalized"]]
        sample = rng.sample(contents, min(len(contents), 48))
        self._tokens = list(dict.fromkeys(flagged[:64] + sample)) or ["<s>"]
        self._lookalikes = [text for content in self._tokens[:32] for text in lookalikes(content)]

    def _word(self) -> str:
        rng = self._rng
        kind = rng.random()
        if kind < 0.05:  # very long word: one character or a short unit repeated
            unit = rng.choice(["a", "ab", "x1", "가", "é", "🙂", "ـ", "_", "-", "=", "0"])
            return unit * rng.randint(200, 3000)
        if kind < 0.08:
            alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
            return "".join(rng.choice(alphabet) for _ in range(rng.randint(30, 400)))
        pool = rng.choice([SCRIPTS, SCRIPTS, CODE, PUNCT_AND_DIGITS, EMOJI, BYTE_FALLBACK])
        return rng.choice(pool)

    def _token(self) -> str:
        rng = self._rng
        if self._lookalikes and rng.random() < 0.3:
            return rng.choice(self._lookalikes)
        return rng.choice(self._tokens)

    def _around_token(self) -> str:
        """An added token with whitespace or word characters hard against either side."""
        rng = self._rng
        left = rng.choice(["", "", " ", "  ", "\n", "\t", "a", "Hello", "。", "🐶", rng.choice(WHITESPACE)])
        right = rng.choice(["", "", " ", "  ", "\n", " \n", "b", "world", ".", rng.choice(WHITESPACE)])
        return left + self._token() + right

    def text(self) -> str:
        rng = self._rng
        parts = []
        for _ in range(rng.randint(1, 24)):
            roll = rng.random()
            if roll < 0.25:
                parts.append(self._around_token())
            elif roll < 0.45:
                parts.append(rng.choice(WHITESPACE))
            else:
                parts.append(self._word())
            if rng.random() < 0.4:
                parts.append(" ")
        text = "".join(parts)
        # Sometimes lead or trail with whitespace / a token: the edge rules.
        if rng.random() < 0.15:
            text = rng.choice(WHITESPACE) + text
        if rng.random() < 0.1:
            text = self._token() + text
        if rng.random() < 0.1:
            text = text + rng.choice(WHITESPACE)
        return text


FIXED = ["", " ", "  ", "\n", "\t", "a", " a", "a ", "  a  ", "\u3000a", "▁", "▁a", "Ġ", "\x00", "🐶", "👨‍👩‍👧‍👦"]


def random_texts(tokenizer: Any, count: int, seed: int) -> list[str]:
    """`count` random texts (plus a few fixed edge cases) for this tokenizer."""
    rng = random.Random(seed)
    added = added_token_specs(tokenizer)
    generator = TextGenerator(added, rng)
    contents = [token["content"] for token in added][:8]
    fixed = FIXED + [c + c for c in contents] + [" " + c + " " for c in contents] + ["a" + c + "b" for c in contents]
    return fixed + [generator.text() for _ in range(count)]
