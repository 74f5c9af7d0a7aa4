"""Where a text can be cut so that its count is the sum of the two sides' counts.

An agent's next request renders to the previous request's text up to some
point, then something new.  If the count of that shared prefix is known, only
the rest needs counting; but a BPE count is only additive at a cut where no
token spans the cut.  Piece counting (`_piece_count`, `_piece_support`) rests
on that at added tokens: `tokenizers` splits the input at added tokens before
anything else, and every later stage sees one piece at a time.  This module
names the added tokens whose *start* is always such a cut, whatever comes
before and after them, so that

    count(text) = count(text[:b]) + count(text[b:])          (no specials added)

for every offset b where the text continues with one of them.  From the
leftmost-longest scan of `_added_split` (tokenizers'
`AddedVocabulary::find_matches`), a start b of token t's content is a cut when:

1. t is matched on the raw text (`normalized: false`), so the raw split, which
   bounds every piece, has a match starting at b;
2. no raw token can cover b from the left: no raw token u has a proper suffix
   u[k:] (k >= 1) that is a prefix of t's content or has it as a prefix.  A
   match covering b would start before b and run into t's text, so u[k:] and
   t's content would agree on their common length;
3. whatever token the scan matches at b (t, or a longer raw token starting
   with t's content) stops there on the left: none of those is `lstrip`, and
   t's first character is not whitespace, so an earlier token's `rstrip` ends
   before b;
4. special tokens are not split as text (`encode_special_tokens` off): a match
   the scan drops would leave one piece across b.

Then the scan of the whole text reaches b without a match across it and
matches at b; the scan of text[:b] finds the same matches before b (every
candidate that ends by b is the same in both texts, and none runs past b);
the scan of text[b:] is the whole scan's from b on.  So the pieces of the whole
are the pieces of text[:b] followed by those of text[b:], each counted alone
(the piece-exactness claim `_piece_support` checks at load), and the added
tokens matched likewise.  Condition 2 with u = t also means t's occurrences
cannot overlap, so `str.find` lists them all.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable

from ._added_split import WHITE_SPACE, SplitToken


def cut_tokens(tokens: Iterable[SplitToken], *, encode_special_tokens: bool) -> list[str]:
    """The contents of the added tokens whose every start in a text is a cut (conditions 1-4 above).

    Condition 2 is checked against every proper suffix of every raw token, kept
    sorted: some suffix is a prefix of the content (a set lookup per prefix), or
    starts with it (the first suffix not below it, by bisection).  Gemma 3 has
    ~6,000 added tokens; comparing them pairwise took minutes."""
    tokens = [token for token in tokens if token.content]
    raw = [token for token in tokens if not token.normalized]
    if encode_special_tokens and any(token.special for token in raw):
        return []
    suffixes = sorted({token.content[k:] for token in raw for k in range(1, len(token.content))})
    suffix_set = frozenset(suffixes)
    left_stripping = [token.content for token in raw if token.lstrip]
    cuts = []
    for token in raw:
        content = token.content
        if content[0] in WHITE_SPACE:
            continue
        if any(other.startswith(content) for other in left_stripping):
            continue
        if any(content[:j] in suffix_set for j in range(1, len(content) + 1)):
            continue
        at = bisect.bisect_left(suffixes, content)
        if at < len(suffixes) and suffixes[at].startswith(content):
            continue
        cuts.append(content)
    return cuts


def cut_offsets(text: bytes, anchor: bytes) -> list[int]:
    """Every offset > 0 where `text` continues with `anchor` (a cut token's UTF-8: its
    occurrences never overlap, and fall where the characters' occurrences do)."""
    offsets = []
    at = text.find(anchor, 1)
    step = len(anchor)
    while at != -1:
        offsets.append(at)
        at = text.find(anchor, at + step)
    return offsets


def choose_anchor(text: str, cuts: Iterable[str], matches: Iterable[str]) -> str | None:
    """The cut token matched most often in `text` (a rendered chat: its turn marker), if any twice.

    `matches` are the raw-pass matches of `text` (`AddedTokenSplitter.raw_contents`):
    one scan, however many added tokens the model has."""
    counts = Counter(match for match in matches)
    best, best_count = None, 1
    for content in cuts:
        found = counts.get(content, 0)
        if found > best_count:
            best, best_count = content, found
    return best
