"""Decide, once per tokenizer at load time, whether counting piece by piece is exact.

Piece counting (`_piece_count`) rests on one claim: a piece between added
tokens encodes to the same ids alone as inside the whole text.  That holds
when every stage after the added-token split looks only at its own piece.
From the `tokenizers` 0.23 source:

* normalizers are functions of the piece they are given (Prepend adds its
  prefix to every non-empty piece, not only the first: the Phi-3 notes of
  docs/vllm-behaviour.md show "▁" after each added token);
* pre-tokenizers likewise, except `Metaspace` with `prepend_scheme: "first"`,
  which prepends only when the piece starts at offset 0 of the whole input
  (`metaspace.rs`, `normalized.offsets_original().0 == 0`): that piece is
  counted by the tokenizer itself and every other piece by its copy with
  `prepend_scheme: "never"` (`first_only_variant`), which is what "first" does
  away from offset 0; ByteLevel's `add_prefix_space` prepends to every piece
  and is fine;
* models (BPE, WordPiece, WordLevel, Unigram) work per pre-token; BPE with
  dropout is random and is not cached;
* the post-processor adds its special tokens once per sequence: counted
  separately with `num_special_tokens_to_add`.

The added-token split is reproduced by `_added_split`, except for what makes
a match depend on text outside the piece or on the normalizer:

* `single_word` tokens (the word-boundary test looks across piece edges);
* `normalized: true` tokens under a non-identity normalizer (they are matched
  in normalized text, which a piece re-normalised alone may not reproduce);
* `lstrip`/`rstrip` tokens together with a token that starts or ends with
  whitespace (the scan resumes inside the stripped whitespace and the splits
  can overlap).

Unknown component types fall back too, and so does a tokenizer that fails a
probe comparing piece sums with whole encodes.  Falling back only costs
speed: the whole prompt is encoded as before.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from tokenizers import Tokenizer, pre_tokenizers

from ._added_split import WHITE_SPACE, AddedTokenSplitter, SplitToken

# Every normalizer type of tokenizers 0.23 (normalizers/mod.rs); all are
# functions of the piece alone.
_NORMALIZERS = frozenset(
    {"BertNormalizer", "Strip", "StripAccents", "NFC", "NFD", "NFKC", "NFKD", "Sequence",
     "Lowercase", "Nmt", "Precompiled", "Replace", "Prepend", "ByteLevel"}
)
# Pre-tokenizer types whose output depends only on the piece (Metaspace checked apart).
_PRE_TOKENIZERS = frozenset(
    {"BertPreTokenizer", "ByteLevel", "Delimiter", "CharDelimiterSplit", "Metaspace", "Whitespace",
     "WhitespaceSplit", "Punctuation", "Split", "Digits", "UnicodeScripts", "FixedLength", "Sequence"}
)
_MODELS = frozenset({"BPE", "WordPiece", "WordLevel", "Unigram"})


def split_tokens(tokenizer: Tokenizer) -> list[SplitToken]:
    """The tokenizer's added tokens as the splitter needs them."""
    return [
        SplitToken(
            content=token.content,
            lstrip=token.lstrip,
            rstrip=token.rstrip,
            normalized=token.normalized,
            special=token.special,
        )
        for _, token in sorted(tokenizer.get_added_tokens_decoder().items())
        if token.content
    ]


def _state(component: Any) -> Any:
    """A normalizer / pre-tokenizer as its JSON, or None when absent."""
    if component is None:
        return None
    return json.loads(component.__getstate__())


def _walk(node: Any, children_key: str) -> Iterable[dict[str, Any]]:
    yield node
    for child in node.get(children_key) or ():
        yield from _walk(child, children_key)


def _is_identity(state: Any) -> bool:
    """No normalizer, or Sequences of nothing (DeepSeek-V3.1 ships `{"type": "Sequence", "normalizers": []}`)."""
    if state is None:
        return True
    return state.get("type") == "Sequence" and all(_is_identity(child) for child in state.get("normalizers") or ())


def _normalizer_reason(state: Any) -> str | None:
    if state is None:
        return None
    for node in _walk(state, "normalizers"):
        if node.get("type") not in _NORMALIZERS:
            return f"unknown normalizer type {node.get('type')!r}"
    return None


def _pre_tokenizer_reason(state: Any) -> str | None:
    if state is None:
        return None
    for node in _walk(state, "pretokenizers"):
        kind = node.get("type")
        if kind not in _PRE_TOKENIZERS:
            return f"unknown pre-tokenizer type {kind!r}"
    return None


def first_only_variant(tokenizer: Tokenizer) -> Tokenizer | None:
    """For a Metaspace pre-tokenizer with prepend_scheme "first" (transformers 5's LlamaTokenizer):
    the same tokenizer with "never", which counts every piece not at offset 0.  None otherwise."""
    def firsts(pre_tokenizer: Any) -> list[dict[str, Any]]:
        if pre_tokenizer is None:
            return []
        return [node for node in _walk(pre_tokenizer, "pretokenizers")
                if node.get("type") == "Metaspace" and node.get("prepend_scheme") == "first"]

    state = _state(tokenizer.pre_tokenizer)  # the component alone: no copy of a large vocabulary
    nodes = firsts(state)
    if not nodes:
        return None
    for node in nodes:
        node["prepend_scheme"] = "never"
    # Pieces hold no added token and are encoded without specials: the model (shared, not
    # copied), the normalizer and the edited pre-tokenizer are all a piece meets.
    variant = Tokenizer(tokenizer.model)
    variant.normalizer = tokenizer.normalizer
    pre_tokenizer = pre_tokenizers.Metaspace()
    pre_tokenizer.__setstate__(json.dumps(state).encode("utf-8"))
    variant.pre_tokenizer = pre_tokenizer
    return variant


def piece_lengths(
    tokenizer: Tokenizer, later: Tokenizer | None, pieces: list[str], first_at_zero: bool
) -> list[int]:
    """Each piece's token count alone, as inside the text: with `later` (`first_only_variant`)
    every piece but one at offset 0 is counted by it."""
    if not pieces:
        return []
    if later is None:
        return [len(e) for e in tokenizer.encode_batch_fast(pieces, add_special_tokens=False)]
    head = [len(tokenizer.encode_batch_fast(pieces[:1], add_special_tokens=False)[0])] if first_at_zero else []
    rest = pieces[1:] if first_at_zero else pieces
    return head + [len(e) for e in later.encode_batch_fast(rest, add_special_tokens=False)]


def _model_reason(tokenizer: Tokenizer) -> str | None:
    kind = type(tokenizer.model).__name__
    if kind not in _MODELS:
        return f"unknown model type {kind!r}"
    if kind == "BPE" and getattr(tokenizer.model, "dropout", None):
        return "BPE dropout makes encodings random"
    return None


def _added_tokens_reason(tokens: list[SplitToken], tokenizer: Tokenizer, normalizer: Any) -> str | None:
    decoder = tokenizer.get_added_tokens_decoder()
    if any(token.single_word for token in decoder.values() if token.content):
        return "a single_word added token matches depending on the characters around it"
    if not _is_identity(normalizer) and any(token.normalized for token in tokens):
        return "normalized added tokens are matched in normalized text (non-identity normalizer)"
    strips = any(token.lstrip or token.rstrip for token in tokens)
    edged = any(token.content[0] in WHITE_SPACE or token.content[-1] in WHITE_SPACE for token in tokens)
    if strips and edged:
        return "an added token starts or ends with whitespace next to lstrip/rstrip tokens"
    return None


def _probe_texts(tokens: list[SplitToken]) -> list[str]:
    """Texts that put added tokens next to each other, to whitespace, at the edges, inside words."""
    chosen = tokens[:6] + [t for t in tokens if t.lstrip or t.rstrip or t.normalized][:6]
    marks = [t.content for t in chosen] or [""]
    words = ["Hello", " world", "  two  spaces ", "\n", "\n\n  ", "def f(x):\n\treturn x", "안녕하세요 세계",
             "🐶 ok", ""]
    texts = []
    for i, mark in enumerate(marks):
        nxt = marks[(i + 1) % len(marks)]
        word = words[i % len(words)]
        texts += [
            mark + word + " " + nxt,
            word + mark + mark + " \n" + word,
            " " + mark + "\n" + nxt + word + nxt,
            "x" + mark + "y" + nxt + "  ",
        ]
    texts.append("".join(words))
    # Metaspace prepend_scheme "first": a piece at offset 0 (with and without its own "▁") and after a mark.
    texts += ["Hi" + marks[0] + "Hi", " Hi" + marks[0] + " Hi", "\u2581Hi" + marks[0] + "\u2581Hi"]
    return texts


def fallback_reason(tokenizer: Tokenizer, splitter: AddedTokenSplitter | None = None) -> str | None:
    """Why this tokenizer must be counted whole, or None when pieces are exact."""
    tokens = split_tokens(tokenizer)
    normalizer = _state(tokenizer.normalizer)
    for reason in (
        _model_reason(tokenizer),
        _normalizer_reason(normalizer),
        _pre_tokenizer_reason(_state(tokenizer.pre_tokenizer)),
        _added_tokens_reason(tokens, tokenizer, normalizer),
    ):
        if reason is not None:
            return reason
    splitter = splitter or AddedTokenSplitter(tokens, encode_special_tokens=tokenizer.encode_special_tokens)
    specials = tokenizer.num_special_tokens_to_add(False)
    later = first_only_variant(tokenizer)
    for text in _probe_texts(tokens):
        pieces, matched, at_zero = splitter.split_from_start(text)
        piece_sum = matched + sum(piece_lengths(tokenizer, later, pieces, at_zero))
        whole = len(tokenizer.encode(text, add_special_tokens=False))
        with_specials = len(tokenizer.encode(text, add_special_tokens=True))
        if piece_sum != whole or piece_sum + specials != with_specials:
            return f"probe {text!r} counts {piece_sum}+{specials} by pieces but {whole}/{with_specials} whole"
    return None
