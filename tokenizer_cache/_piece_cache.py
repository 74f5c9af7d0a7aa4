"""A bounded, thread-safe LRU of piece digest → token count, shared by every model of a process.

Keys are 16-byte digests (SHA-256, truncated) of a piece's UTF-8 bytes after
the tokenizer's identity (see `_piece_count`), so one table serves all models
without mixing them up and holds no text: memory per entry is fixed whatever
the piece's length (about 140-170 bytes; bench/multiturn_bench.py measures it).

Beside it, `prefixes` (`PrefixCounts`): digests of long texts' prefixes at
proven cuts and their counts (`_prefix_count`), a quarter as many entries,
about 250 bytes each (16,384 by default: ~4 MiB).  For chats rendered through
their proven message loop (`_render_memo`): `traces`, what each iteration read,
an eighth as many (8,192: ~1 KiB each, ~8 MiB), `loop_cuts`, the count at each
iteration's last cut, and `openings`, the first messages seen, a quarter as many
(~150 bytes each, ~2.5 MiB each); `jumps`, a run of traces per conversation turn, a
sixty-fourth as many (1,024: ~1.2 KiB plus 16 bytes per message each, measured
2.8 KiB at a hundred messages, so ~2.8 MiB).  All hold digests and numbers, never text.

Lookups and inserts come in batches (all pieces of one prompt) under one lock
acquisition, and the lock is never held while encoding: the proxy counts
large prompts in worker threads, and a miss in one must not stall the others.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

V = TypeVar("V")
DEFAULT_MAX_ENTRIES = 65_536
# Piece entries per prefix entry: a turn adds a few prefixes but dozens of pieces.
PREFIX_ENTRIES_PER_PIECE = 4
# Piece entries per trace (`_render_memo`): a trace is ~1 KiB (its reads' digests), a piece ~170 B.
TRACE_ENTRIES_PER_PIECE = 8
# Piece entries per jump: one per conversation turn, ~1.2 KiB plus 16 B per message iterated.
JUMP_ENTRIES_PER_PIECE = 64


@dataclass(frozen=True)
class PieceCacheStats:
    """Counters since creation (or `clear`): for metrics and the benchmark."""

    entries: int
    max_entries: int
    hits: int
    misses: int
    evictions: int
    prefix_entries: int = 0
    prefix_hits: int = 0
    prefix_misses: int = 0
    # The render memo (`TraceTable`): iterations skipped and rendered (recorded), traces kept and dropped.
    memo_skipped: int = 0
    memo_rendered: int = 0
    memo_entries: int = 0
    memo_evictions: int = 0


class BoundedTable(Generic[V]):
    """digest → value, a bounded LRU under a lock it shares with the piece table (one acquisition
    per prompt for all of them)."""

    def __init__(self, max_entries: int, lock: threading.Lock) -> None:
        self.max_entries = max(1, max_entries)
        self._lock = lock
        self._entries: OrderedDict[bytes, V] = OrderedDict()

    def get(self, key: bytes) -> V | None:
        with self._lock:
            found = self._entries.get(key)
            if found is not None:
                self._entries.move_to_end(key)
            return found

    def peek(self, key: bytes) -> V | None:
        """The value without the lock and without marking it recent (a dict read is atomic under
        the GIL): for a walk over many entries, which marks those it used recent once at the end (`put_path`)."""
        return self._entries.get(key)

    def put_many(self, items: Iterable[tuple[bytes, V]]) -> None:
        with self._lock:
            for key, value in items:
                self._put(key, value)
            self._trim()

    def put_path(self, items: Sequence[tuple[bytes, V]], used: Sequence[bytes]) -> None:
        """Store the entries one render made along a conversation and mark those it `used`, both
        given in loop order (the used ones nearer its start), deepest first: the entries nearer a
        conversation's start are then the more recent, so a full table drops conversations' tails
        first, and what is left of each is a path a walk can still follow (`_render_memo`)."""
        with self._lock:
            self._put_path(items, used)

    def _put_path(self, items: Sequence[tuple[bytes, V]], used: Sequence[bytes]) -> None:
        entries = self._entries
        for key, value in reversed(items):
            self._put(key, value)
        for key in reversed(used):
            if key in entries:
                entries.move_to_end(key)
        self._trim()

    def _put(self, key: bytes, value: V) -> None:
        self._entries[key] = value
        self._entries.move_to_end(key)

    def _trim(self) -> None:
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


class PrefixCounts(BoundedTable[tuple[int, int]]):
    """digest of a text's prefix → (its length in characters, its tokens): see `_prefix_count`.

    A prompt looks up all its cut points at once and keeps the longest hit:
    the hits of one prompt are prefixes of each other, so evicting a shorter
    one never makes a longer one wrong.
    """

    def __init__(self, max_entries: int, lock: threading.Lock) -> None:
        super().__init__(max_entries, lock)
        self.hits = 0
        self.misses = 0

    def longest(self, keys: Sequence[bytes], offsets: Sequence[int]) -> tuple[int, int]:
        """(index, tokens) of the last key found whose stored length is its offset, or (-1, 0).

        One lock acquisition: the entry cannot be evicted between finding it and reading it."""
        with self._lock:
            entries = self._entries
            for i in range(len(keys) - 1, -1, -1):
                found = entries.get(keys[i])
                if found is not None and found[0] == offsets[i]:
                    entries.move_to_end(keys[i])
                    self.hits += 1
                    return i, found[1]
            self.misses += 1
            return -1, 0

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self.hits = self.misses = 0


@dataclass(frozen=True)
class Trace:
    """What one iteration of a proven message loop read and wrote, in order, and the chain key
    of the text after it (`_render_memo`)."""

    events: tuple[tuple[Any, ...], ...]
    key: bytes


# Traces kept per key (one iteration of one message read differently, e.g. `loop.last` then and now).
MAX_VARIANTS = 4


@dataclass(frozen=True)
class Jump:
    """A run of traces from the loop's start that a walk takes in one step (`_render_memo`).

    Iterations 0..`last` replay for any request whose messages 0..`reads` have the digests hashed
    into `prefix`, that has more than `last + 1` messages, and whose namespaces hold the values
    `live` names where the run reads them before writing them; the walk goes on from `keys[-1]`
    (K(last), where a cut at the iteration's end is stored) with `state`.  `keys`: K(0)..K(last),
    16 bytes each, joined (the traces and cuts along the run are marked recent through them)."""

    last: int
    reads: int
    prefix: bytes
    live: tuple[tuple[tuple[int, str], Any], ...]
    state: dict[tuple[int, str], Any]
    keys: bytes


class TraceTable(BoundedTable[tuple[Trace, ...]]):
    """chain key before an iteration + its message's digest → the traces recorded there (`_render_memo`).

    The message in the key lets any number of conversations branch at one chain key (every agent
    of a deployment opens with the same system prompt) without their traces pushing out each
    other's: the variants a key keeps differ only in what else the iteration read."""

    def __init__(self, max_entries: int, lock: threading.Lock) -> None:
        super().__init__(max_entries, lock)
        self.skipped = 0        # iterations not rendered since creation
        self.jumped = 0         # of those, the ones a walk took in one step (a `Jump`)
        self.rendered = 0       # iterations rendered and recorded
        self.evictions = 0      # traces dropped to stay within max_entries

    def add(self, items: Sequence[tuple[bytes, Trace]], skipped: int, used: Sequence[bytes] = (),
            jumped: int = 0) -> None:
        """One render's new traces beside the variants already kept, and the traces its walk
        `used` marked recent, as `put_path` orders them."""
        with self._lock:
            merged = []
            for key, trace in items:
                known = self._entries.get(key, ())
                merged.append((key, known if trace in known else (trace, *known[: MAX_VARIANTS - 1])))
            self._put_path(merged, used)
            self.skipped += skipped
            self.jumped += jumped
            self.rendered += len(items)

    def _trim(self) -> None:
        overflow = len(self._entries) - self.max_entries
        if overflow > 0:
            self.evictions += overflow
            super()._trim()

    def clear(self) -> None:
        super().clear()
        with self._lock:
            self.skipped = self.jumped = self.rendered = self.evictions = 0


class PieceCountCache:
    """digest → token count; least recently used entries go first once `max_entries` is reached."""

    def __init__(self, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        self.max_entries = max_entries
        self._lock = threading.Lock()
        self._counts: OrderedDict[bytes, int] = OrderedDict()
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self.prefixes = PrefixCounts(max_entries // PREFIX_ENTRIES_PER_PIECE, self._lock)
        # What each iteration of a proven message loop read, by the chain key before it, and the
        # counts at the last cut of each iteration rendered, by the chain key after it (`_render_memo`).
        self.traces = TraceTable(max_entries // TRACE_ENTRIES_PER_PIECE, self._lock)
        self.loop_cuts: BoundedTable[tuple[int, int, int]] = BoundedTable(
            max_entries // PREFIX_ENTRIES_PER_PIECE, self._lock)
        self.openings: BoundedTable[bool] = BoundedTable(max_entries // PREFIX_ENTRIES_PER_PIECE, self._lock)
        # The runs a walk may take at once, by the chain key before the loop and the last message read.
        self.jumps: BoundedTable[tuple[Jump, ...]] = BoundedTable(max_entries // JUMP_ENTRIES_PER_PIECE, self._lock)

    def get_many(self, keys: Sequence[bytes]) -> list[int | None]:
        """The cached count of each key (None when absent); hits become most recent."""
        found: list[int | None] = []
        with self._lock:
            counts = self._counts
            for key in keys:
                count = counts.get(key)
                if count is not None:
                    counts.move_to_end(key)
                found.append(count)
            hits = len(found) - found.count(None)
            self._hits += hits
            self._misses += len(found) - hits
        return found

    def put_many(self, items: Iterable[tuple[bytes, int]]) -> None:
        with self._lock:
            counts = self._counts
            for key, count in items:
                counts[key] = count
                counts.move_to_end(key)
            overflow = len(counts) - self.max_entries
            for _ in range(max(0, overflow)):
                counts.popitem(last=False)
            self._evictions += max(0, overflow)

    def stats(self) -> PieceCacheStats:
        with self._lock:
            prefixes, traces = self.prefixes, self.traces
            return PieceCacheStats(len(self._counts), self.max_entries, self._hits, self._misses, self._evictions,
                                   len(prefixes._entries), prefixes.hits, prefixes.misses,
                                   traces.skipped, traces.rendered, len(traces._entries), traces.evictions)

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._counts

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()
            self._hits = self._misses = self._evictions = 0
        self.prefixes.clear()
        self.traces.clear()
        self.loop_cuts.clear()
        self.openings.clear()
        self.jumps.clear()
