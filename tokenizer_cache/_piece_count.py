"""Count a text's tokens by encoding only the pieces not counted before.

Agents resend the whole conversation every turn.  Rendered with a chat
template, the conversation is a run of added tokens (`<|im_start|>`,
`<|end|>`, …) with message text between them; `tokenizers` encodes each
stretch between added tokens on its own (see `_added_split`), so the count
of the whole is

    sum(count(piece) for piece in pieces) + added tokens matched
    + post-processor specials (when add_special_tokens)

and the counts of the pieces seen in earlier turns come from the cache.
What is left per request is rendering, one regex scan and one blake2b per
piece (≈ 1.5 ns per byte): work on the order of the new turn, not the whole
conversation.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import cast

from tokenizers import Tokenizer

from ._added_split import AddedTokenSplitter
from ._encoder import Encoder, ReferenceEncoder
from ._piece_cache import PieceCountCache
from ._piece_support import fallback_reason, first_only_variant, split_tokens

# blake2b keys are at most 64 bytes.
_IDENTITY_BYTES = 32


def tokenizer_identity(tokenizer: Tokenizer) -> bytes:
    """A digest naming what the tokenizer encodes: its full serialised state and
    the `encode_special_tokens` switch, which the serialisation leaves out.
    The loader uses the tokenizer.json bytes instead (cheaper, same role)."""
    state = tokenizer.to_str().encode("utf-8") + (b"\x01" if tokenizer.encode_special_tokens else b"\x00")
    return hashlib.blake2b(state, digest_size=_IDENTITY_BYTES).digest()


@dataclass(frozen=True)
class PieceTally:
    """One count and the work it took (for the benchmark and tests)."""

    tokens: int  # what whole-text encoding would report
    pieces: int  # pieces between added tokens
    added_tokens: int  # added tokens matched (one token each)
    encoded_pieces: int  # pieces actually encoded (cache misses, each distinct piece once)
    encoded_tokens: int  # tokens those pieces hold: the new work


class PieceCounter:
    """Counts texts for one tokenizer through a (possibly shared) PieceCountCache.

    Build it with `PieceCounter.for_tokenizer`, which returns None when
    pieces would not be exact for this tokenizer (`fallback_reason`).
    Missing pieces are counted by `encoder` (the model's engine, `tokenizers`
    when none is given): the cached counts are the same whichever engine
    made them, since an engine is only used once it equals `tokenizers`.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        splitter: AddedTokenSplitter,
        cache: PieceCountCache,
        identity: bytes,
        encoder: Encoder | None = None,
    ) -> None:
        self._encoder = encoder or ReferenceEncoder(tokenizer)
        self._splitter = splitter
        self._cache = cache
        # Keyed hashing puts the tokenizer into every digest: one table, many models.
        self._hasher = hashlib.blake2b(digest_size=16, key=identity[:64])
        self._specials = tokenizer.num_special_tokens_to_add(False)
        # Metaspace prepend_scheme "first": only a piece at offset 0 gets "▁"; the
        # others are counted by the "never" copy, and that first piece has digests of its own.
        later = first_only_variant(tokenizer)
        self._later: Encoder | None = ReferenceEncoder(later) if later is not None else None
        self._first_hasher = hashlib.blake2b(digest_size=16, key=identity[:64], person=b"offset 0")

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer: Tokenizer,
        cache: PieceCountCache,
        identity: bytes | None = None,
        encoder: Encoder | None = None,
    ) -> tuple[PieceCounter | None, str | None]:
        """(counter, None) when piece counting is exact, else (None, why not)."""
        splitter = AddedTokenSplitter(split_tokens(tokenizer), encode_special_tokens=tokenizer.encode_special_tokens)
        reason = fallback_reason(tokenizer, splitter)
        if reason is not None:
            return None, reason
        return cls(tokenizer, splitter, cache, identity or tokenizer_identity(tokenizer), encoder), None

    @property
    def cache(self) -> PieceCountCache:
        return self._cache

    def digest(self, piece: str) -> bytes:
        hasher = self._hasher.copy()
        hasher.update(piece.encode("utf-8", "surrogatepass"))
        return hasher.digest()

    def _first_digest(self, piece: str) -> bytes:
        hasher = self._first_hasher.copy()
        hasher.update(piece.encode("utf-8", "surrogatepass"))
        return hasher.digest()

    def _encode_missing(self, missing: dict[bytes, str], first: bytes | None) -> dict[bytes, int]:
        """Counts of the missing pieces: one batch per prompt (the engine releases the GIL for all of it)."""
        if self._later is None:
            return dict(zip(missing, self._encoder.count_pieces(list(missing.values())), strict=True))
        fresh = {}
        if first is not None and first in missing:
            fresh[first] = self._encoder.count_pieces([missing.pop(first)])[0]
        fresh.update(zip(missing, self._later.count_pieces(list(missing.values())), strict=True))
        return fresh

    def count(self, text: str, *, add_special_tokens: bool) -> PieceTally:
        pieces, added, at_zero = self._splitter.split_from_start(text)
        keys = [self.digest(piece) for piece in pieces]
        first = None
        if self._later is not None and at_zero:
            first = keys[0] = self._first_digest(pieces[0])
        counts = self._cache.get_many(keys)
        # Distinct missing pieces (a prompt repeats some, e.g. "assistant\n").
        missing: dict[bytes, str] = {}
        for key, piece, count in zip(keys, pieces, counts, strict=True):
            if count is None and key not in missing:
                missing[key] = piece
        encoded_pieces = len(missing)
        encoded_tokens = 0
        if missing:
            fresh = self._encode_missing(missing, first)
            self._cache.put_many(fresh.items())
            encoded_tokens = sum(fresh.values())
            counts = [fresh[key] if count is None else count for key, count in zip(keys, counts, strict=True)]
        # No None is left: every missing piece's count came from `fresh`.
        tokens = sum(cast("list[int]", counts)) + added + (self._specials if add_special_tokens else 0)
        return PieceTally(tokens, len(pieces), added, encoded_pieces, encoded_tokens)
