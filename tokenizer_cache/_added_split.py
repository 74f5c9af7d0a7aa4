"""Split text on a tokenizer's added tokens exactly as `tokenizers` does.

`tokenizers` (0.23, `tokenizers/src/tokenizer/added_vocabulary.rs`,
`AddedVocabulary::find_matches` / `extract_and_normalize`) cuts the input at
added tokens *before* normalising and pre-tokenising, and every later stage
works on one piece at a time.  So a prompt's token count is the sum of its
pieces' counts plus one per added token matched: the fact the piece cache
builds on.  The rules reproduced here, from that source:

* Matching is Aho-Corasick, leftmost-longest, non-overlapping, over the token
  contents.  Here: one regular expression built as a trie of the contents in
  which, at every node, going deeper is tried before stopping, which is the
  same leftmost-longest choice (at a node at most one child can match the next
  character).
* A match of a special token while `encode_special_tokens` is on is dropped,
  but its text stays consumed: the scan resumes after it, not inside it.
* `lstrip` extends a match left over the whitespace before it (never into the
  previous match), `rstrip` right over the whitespace after it; "whitespace"
  is Rust's `\\s`, the Unicode White_Space property, spelt out below because
  Python's `\\s` also matches U+001C..U+001F.
* Tokens with `normalized: false` are matched on the raw text first; tokens
  with `normalized: true` are then matched inside each remaining piece *after*
  the normalizer ran on it.  This module only handles that second pass for an
  identity normalizer (`_piece_support` falls back otherwise), where the
  normalized piece is the raw piece.
* Empty pieces are dropped (`PreTokenizedString::split` filters them).

`single_word` is not handled: whether such a token matches depends on the
characters around it, which differ when a piece is encoded on its own, so a
tokenizer that has one is counted whole (see `_piece_support`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

# Unicode White_Space (what Rust's regex `\s` matches), not Python's `\s`.
WHITE_SPACE = (
    "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006"
    "\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
)
_WHITE_SPACE_SET = frozenset(WHITE_SPACE)
_LEADING_SPACE = re.compile(f"[{re.escape(WHITE_SPACE)}]*")


@dataclass(frozen=True)
class SplitToken:
    """The matching-relevant part of one added token."""

    content: str
    lstrip: bool = False
    rstrip: bool = False
    normalized: bool = False
    special: bool = False


def _trie_pattern(contents: Iterable[str]) -> str:
    """A regex source matching the longest of `contents` at the leftmost position."""
    trie: dict[str, Any] = {}
    for content in contents:
        node = trie
        for char in content:
            node = node.setdefault(char, {})
        node[""] = True  # a token ends here

    def emit(node: dict[str, Any]) -> str:
        ends_here = "" in node
        children = [(char, child) for char, child in node.items() if char != ""]
        if not children:
            return ""
        branches = [re.escape(char) + emit(child) for char, child in sorted(children)]
        if len(branches) == 1 and not ends_here:
            return branches[0]
        # Children first, the empty branch last: deeper (longer) wins, and the
        # engine falls back to stopping here when the longer paths fail.
        return "(?:" + "|".join(branches) + ("|" if ends_here else "") + ")"

    return emit(trie)


class _Matcher:
    """One Aho-Corasick set of `find_matches`: its tokens and their strip rules."""

    def __init__(self, tokens: list[SplitToken], encode_special_tokens: bool) -> None:
        self._by_content = {token.content: token for token in tokens}
        self._pattern = re.compile(_trie_pattern(self._by_content))
        self._encode_special_tokens = encode_special_tokens

    def split(self, text: str, pieces: list[str]) -> int:
        """Append the non-token pieces of `text` to `pieces`; return the number of tokens matched."""
        return self.split_from_start(text, pieces)[0]

    def split_from_start(self, text: str, pieces: list[str]) -> tuple[int, bool]:
        """`split`, and whether the first piece appended starts at offset 0 of `text`."""
        matched = 0
        start_offset = 0
        at_zero = None
        for match in self._pattern.finditer(text):
            token = self._by_content[match.group()]
            if self._encode_special_tokens and token.special:
                continue  # split as plain text, but the scan does not look inside it again
            start, stop = match.span()
            if token.lstrip:
                # Back over whitespace, but not into what the previous match took.
                while start > start_offset and text[start - 1] in _WHITE_SPACE_SET:
                    start -= 1
            if token.rstrip:
                space = _LEADING_SPACE.match(text, stop)
                assert space is not None  # a `[...]*` pattern matches at every position
                stop = space.end()
            if start_offset < start:
                at_zero = start_offset == 0 if at_zero is None else at_zero
                pieces.append(text[start_offset:start])
            matched += 1
            start_offset = stop
        if start_offset < len(text):
            at_zero = start_offset == 0 if at_zero is None else at_zero
            pieces.append(text[start_offset:])
        return matched, bool(at_zero)


class AddedTokenSplitter:
    """`split(text)` → (the pieces between added tokens, how many added tokens matched).

    The pieces are what `tokenizers` normalises and pre-tokenises one by one;
    encoding each on its own gives the same ids it gets inside the text.
    """

    def __init__(self, tokens: Iterable[SplitToken], *, encode_special_tokens: bool = False) -> None:
        tokens = [token for token in tokens if token.content]  # empty contents are ignored upstream
        if any(not token.normalized for token in tokens):
            raw = [token for token in tokens if not token.normalized]
            self._raw: _Matcher | None = _Matcher(raw, encode_special_tokens)
        else:
            self._raw = None
        normalized = [token for token in tokens if token.normalized]
        self._normalized = _Matcher(normalized, encode_special_tokens) if normalized else None

    def raw_contents(self, text: str) -> Iterator[str]:
        """The text of each raw-pass match in `text` (ignoring strip rules and `encode_special_tokens`)."""
        if self._raw is not None:
            for match in self._raw._pattern.finditer(text):
                yield match.group()

    def split(self, text: str) -> tuple[list[str], int]:
        pieces, matched, _ = self.split_from_start(text)
        return pieces, matched

    def split_from_start(self, text: str) -> tuple[list[str], int, bool]:
        """`split`, and whether the first piece starts at offset 0 of `text` (no added token before it):
        the piece a Metaspace pre-tokenizer with prepend_scheme "first" prepends to."""
        if self._raw is None:
            first = [text] if text else []
            matched, at_zero = 0, bool(text)
        else:
            first = []
            matched, at_zero = self._raw.split_from_start(text, first)
        if self._normalized is None:
            return first, matched, at_zero
        pieces: list[str] = []
        for i, piece in enumerate(first):
            count, piece_at_zero = self._normalized.split_from_start(piece, pieces)
            if i == 0:
                at_zero = at_zero and piece_at_zero
            matched += count
        return pieces, matched, at_zero and bool(pieces)
