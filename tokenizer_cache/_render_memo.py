"""Render a chat through its proven message loop, skipping the iterations rendered before.

`_loop_proof` rewrites a template so that every input an iteration of its
message loop has reaches a hook here.  Rendering records, per iteration, the
trace of what it read (the message's digest, `loop.last`, `messages[i+1]`'s
digest, `ns.last_query_index`, ...) in order, with what it wrote to the
template's namespaces.  The same inputs give the same output and the same
writes, so the text up to the end of iteration i is named by a chain of
digests: K(-1) over the template, the tokenizer, the values from outside the
loop and the text before it; K(i) over K(i-1) and iteration i's trace.

Counting: after a render, the text is cut at the last cut of each iteration
(the start of an added token that is always a cut, `_prefix_count`: at the
iteration's end when the next one starts with such a token, else inside it,
such as DeepSeek's end-of-sentence token), the pieces between cuts are
counted, and each iteration's last cut is stored under K(i): its offset in
the iteration and the characters and tokens of the text before it.

The next request walks the traces stored under its own chain first (each
under K(i-1) and the digest of the message iterated, so conversations that
branch at one chain key keep their own traces): an
iteration whose every recorded read gives the value recorded (checked
against this request, with the earlier iterations' writes replayed) renders
what it rendered then, so it need not be rendered.  The last iteration of
that run with a stored cut gives the prefix: the iterations before the cut
are skipped (they yield nothing; the namespaces get the state they leave),
and the text is rendered and counted from the cut on.  The count is the
stored one plus that of the new text, which must begin with a cut token, so
the two add up; when it does not, the chat is rendered whole (`None`).

Where the loop runs over the request's `messages` itself, a render also stores a
jump (`Jump`): the run of iterations from the loop's start to the last whose
cut is at its end, with what the run read from outside itself (the last message
it read, the namespace values it read before writing them).  A request whose
messages up to that one hash the same, that goes on past the run's last
iteration, and whose namespaces hold those values takes the run in one step,
and walks on from there: one hash of the messages' digests instead of a trace
check per iteration.  A run stops at an iteration that read what the list's
length decides (`loop.last` true, `loop.length`, an index from the end).

Nothing stored holds text: traces hold digests, attribute names, indexes and
the small values written to namespaces (booleans, numbers, None; a template
that writes anything else gets no trace).  Any surprise while rendering (a
value of an unknown type, a write of a string) ends the memo for that render:
before anything was skipped the render goes on unrecorded; after, the caller
renders the chat whole, as it does on a template error, whose message then
comes from the whole render.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from jinja2.runtime import Macro, Undefined
from jinja2.utils import Namespace, missing
from markupsafe import Markup

from ._loop_proof import END, ENTER, ITEM, LENGTH, LOOP, NS_GET, NS_SET, OUTER, LoopProof
from ._piece_cache import MAX_VARIANTS, BoundedTable, Jump, PieceCountCache, Trace, TraceTable
from ._piece_count import PieceCounter, PieceTally
from ._render import new_render_context

_DIGEST = 16
_ORJSON_STRICT = orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME
_MISSING: Any = object()
_UNDEFINED_KEY = ("u",)
# Values an iteration may write to a namespace and still be replayed: they hold no text.
_WRITABLE = (type(None), bool, int, float)
# An iteration's last cut (`CutTable` values): its offset from the iteration's start (AT_END: the
# iteration's end, the next one starting with a cut token), and the characters and tokens before it.
AT_END = -1
CutTable = BoundedTable[tuple[int, int, int]]
# `loop` attributes that depend on the list, not only on the iteration's index; and those that are items.
_LIST_ATTRIBUTES = frozenset({"last", "length", "revindex", "revindex0", "nextitem", "previtem"})
_ITEMS = frozenset({"nextitem", "previtem"})
Event = tuple[Any, ...]     # ("i" | "L" | "G" | "n" | "N" | "W", ..., the value read or written)
State = dict[tuple[int, str], Any]
# How many of a request's last messages are tried as the last one a stored jump read: a conversation
# that comes back one turn longer has a few more; a worker that sees every Nth turn, a few more again.
_JUMP_LOOKBACK = 16


class Unmemoisable(Exception):
    """This render cannot be recorded or replayed: render the chat whole."""


def seen(cache: PieceCountCache, base_key: bytes, messages: list[Any]) -> bool:
    """Whether a chat of this template and tokenizer opening with this first message came before.

    The first such chat is rendered whole, unrecorded: recording costs a digest
    of every message and a hook per read, which only pays when the conversation
    comes back one turn longer (an agent), not for a long prompt seen once.
    Only when to record depends on it, never a count."""
    try:
        opening = orjson.dumps(messages[0], option=_ORJSON_STRICT) if messages else b""
    except TypeError:
        return True
    key = _chain(base_key, opening)
    if cache.openings.get(key) is not None:
        return True
    cache.openings.put_many([(key, True)])
    return False


def _text_digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:_DIGEST]


def _chain(key: bytes, data: bytes) -> bytes:
    hasher = hashlib.sha256(key)
    hasher.update(data)
    return hasher.digest()[:_DIGEST]


def _jump_key(loop_key: bytes, digests: list[bytes], reads: int) -> bytes:
    return loop_key + digests[reads] + reads.to_bytes(4, "big")


def _prefix(loop_key: bytes, digests: list[bytes], reads: int) -> bytes:
    """The digest of messages 0..`reads`' digests after the chain key before the loop: one hash of
    16 bytes a message proves a run's messages unchanged."""
    return _chain(loop_key, b"".join(digests[: reads + 1]))


@dataclass(frozen=True)
class _Reuse:
    """The prefix a render takes from earlier ones: up to the last cut of iteration `index` (-1: the
    text before the loop), at its end or `drop` characters into it (then it is rendered again).
    The iterations before that one (or through it) are skipped: the namespaces get `state`, the
    chain goes on from `key`."""

    index: int
    at_end: bool
    state: State
    key: bytes
    drop: int
    chars: int
    tokens: int

    @property
    def skip_to(self) -> int:
        """The last iteration skipped (-1: none)."""
        return self.index if self.at_end else max(self.index - 1, -1)


@dataclass
class MemoRender:
    """One render through the memo: the text after the reused prefix, and what to store."""

    text: str
    prefix_chars: int = 0
    prefix_tokens: int = 0
    reused: bool = False
    spans: list[tuple[bytes, int, int]] = field(default_factory=list)   # (K(i), start, end) in `text`
    traces: list[tuple[bytes, Trace]] = field(default_factory=list)
    used: list[bytes] = field(default_factory=list)        # the keys of the traces the walk replayed
    used_cuts: list[bytes] = field(default_factory=list)   # and of the cuts it found along them
    skipped: int = 0
    run: _RunSeed | None = None         # what the next jump is built from (loops over the message list)

    @property
    def jumped(self) -> int:
        """Iterations the walk took in one step (a stored `Jump`)."""
        return 0 if self.run is None or self.run.start is None else self.run.start.last + 1


@dataclass
class _RunSeed:
    """A render's run of iterations from the loop's start: the jump it took (`start`), the traces it
    walked after it, and what a jump is keyed and proven by."""

    loop_key: bytes
    digests: list[bytes]
    start: Jump | None
    walked: list[Trace]


class _Run:
    """A run of traces from the loop's start, extended iteration by iteration: what it read from
    outside itself (the last message, the namespace values read before they were written), its
    state and its chain keys, so far as a jump may be built of it."""

    def __init__(self, start: Jump | None) -> None:
        self.reads = -1 if start is None else start.reads
        self.live: State = {} if start is None else dict(start.live)
        self.state: State = {} if start is None else start.state
        self.keys = b"" if start is None else start.keys
        self.new_keys: list[bytes] = []

    def extend(self, index: int, trace: Trace) -> bool:
        """Iteration `index` added; False when what it read depends on more than the messages up to
        `reads` and the namespace values in `live` (the list's length: `loop.last` true, `loop.length`
        and the like, an index from the end, an item past the end)."""
        reads, state, live = max(self.reads, index), self.state, self.live
        written: State = {}
        for event in trace.events:
            tag = event[0]
            if tag == "i":
                continue
            if tag == "L":
                if event[1] != "last" or event[2] is not False:
                    return False
            elif tag == "G":
                if event[2] < 0 or event[3] == _UNDEFINED_KEY:
                    return False
                reads = max(reads, event[2])
            elif tag == "N":
                name = (event[1], event[2])
                if name not in written and name not in state and live.setdefault(name, event[3]) != event[3]:
                    return False
            elif tag == "W":
                written[(event[1], event[2])] = event[3]
            else:           # "n": the list's length
                return False
        self.reads = reads
        if written:
            self.state = {**state, **written}
        self.new_keys.append(trace.key)
        return True


class _Values:
    """Keys for the values an iteration reads: equal exactly when a template cannot tell the values
    apart.  A message's key is its digest (bytes), any other value's a tuple."""

    def __init__(self, messages: list[Any]) -> None:
        self.messages = messages
        self.ids = {id(message): index for index, message in enumerate(messages)}
        self._digests: list[bytes] = []

    def digest_all(self) -> None:
        """Every message's digest, in one pass: a render through the memo reads them all (the
        iterations' own, or their neighbours').  Equal digests, equal messages: orjson writes every
        JSON value apart (1, 1.0 and true; key order; escapes) and refuses subclasses, dataclasses
        and dates here (and integers past 64 bits: such a chat is rendered whole).  A message is
        JSON data (what a request body parses to, or brimful's conversion of one), as for the
        chat-count cache (`_chat_cache.inputs_digest`): both would write a tuple as a list."""
        dumps, sha256 = orjson.dumps, hashlib.sha256
        try:
            self._digests = [sha256(dumps(message, option=_ORJSON_STRICT)).digest()[:_DIGEST]
                             for message in self.messages]
        except TypeError:
            raise Unmemoisable("a message orjson does not write") from None

    def digest(self, index: int) -> bytes:
        return self._digests[index]

    @property
    def digests(self) -> list[bytes]:
        return self._digests

    def item(self, value: Any) -> Any:
        index = self.ids.get(id(value))
        return self.key(value) if index is None else self.digest(index)

    def key(self, value: Any) -> Any:
        kind = type(value)
        if value is None or kind is bool or kind is int:
            return (kind.__name__, value)
        if kind is float:
            return ("float", repr(value))
        if kind is str:
            return ("str", _text_digest(value))
        if kind is Undefined:
            return _UNDEFINED_KEY
        if kind is dict and id(value) in self.ids:
            return self.digest(self.ids[id(value)])
        hasher = hashlib.sha256()
        self._feed(hasher, value)
        return ("h", hasher.digest()[:_DIGEST])

    def _feed(self, hasher: Any, value: Any) -> None:
        kind = type(value)
        if kind is str or kind is Markup:
            data = value.encode("utf-8", "surrogatepass")
            hasher.update((b"s" if kind is str else b"k") + b"%d:" % len(data) + data)
        elif kind is list or kind is tuple:
            hasher.update(b"[" if kind is list else b"(")
            for item in value:
                self._feed(hasher, item)
            hasher.update(b"]")
        elif kind is dict and id(value) in self.ids:
            hasher.update(b"m" + self.digest(self.ids[id(value)]))
        elif kind is dict:
            hasher.update(b"{")
            for key, item in value.items():
                self._feed(hasher, key)
                self._feed(hasher, item)
            hasher.update(b"}")
        elif value is None or kind in (bool, int, float):
            hasher.update(b"%s%s;" % (kind.__name__.encode(), repr(value).encode()))
        elif kind is Undefined:
            hasher.update(b"u")
        else:
            raise Unmemoisable(f"a value of type {kind.__name__} reaches the message loop")


class Recorder:
    """One render's hooks (`_loop_proof`): records the iterations it runs and skips those it may."""

    def __init__(self, proof: LoopProof, messages: list[Any], base_key: bytes, cache: PieceCountCache) -> None:
        self.env = proof.template.environment
        self.proof = proof
        self.values = _Values(messages)
        self.chunks: list[str] = []
        self._base = base_key
        self._traces: TraceTable = cache.traces
        self._cuts: CutTable = cache.loop_cuts
        self._jumps: BoundedTable[tuple[Jump, ...]] = cache.jumps
        self._outer: dict[str, Any] = {}
        self._namespaces: dict[int, int] = {}       # id(namespace) -> its index in _ns_objects
        self._ns_objects: list[Namespace] = []
        self._loop: Any = None
        self._iterated: list[Any] = []
        self._positions: list[int] = []           # the message index of each item iterated
        self._mode = "before"                     # before, skip, run, off, after
        self._index = 0
        self._key = b""                           # K of the text rendered so far
        self._loop_key = b""                      # K(-1): the text before the loop, and the values from outside it
        self._events: list[Event] = []
        self._span_start = 0
        self.reuse: _Reuse | None = None
        self.start_chunk = 0                      # the text counted starts here (after `reuse.drop` characters)
        self.spans: list[tuple[bytes, int, int]] = []   # (K(i), first chunk, end chunk)
        self.new_traces: list[tuple[bytes, Trace]] = []
        self.used_traces: list[bytes] = []
        self.used_cuts: list[bytes] = []
        self.run: _RunSeed | None = None          # set by the walk where the loop iterates `messages` itself

    def hooks(self) -> dict[str, Callable[..., Any]]:
        return {ENTER: self.enter, OUTER: self.outer, END: self.end, LOOP: self.loop_attribute,
                ITEM: self.item, LENGTH: self.length, NS_GET: self.ns_get, NS_SET: self.ns_set}

    # -- the hooks: each returns what the expression it replaces evaluates to ---------------

    def outer(self, values: dict[str, Any]) -> str:
        self._outer = values
        return ""

    def enter(self, loop: Any, item: Any, iterated: Any) -> bool:
        """Before each iteration: False to skip it (its text is in the reused prefix)."""
        if self._mode == "off":
            return True
        index = self._index
        self._index += 1
        if index == 0:
            self._begin(loop, iterated)
            if self._mode == "off":
                return True
            if self._mode == "skip":
                assert self.reuse is not None
                self._index = _fast_forward(loop, iterated, self.reuse.skip_to)
                return False
        elif loop.index0 != index or item is not self._iterated[index]:
            raise Unmemoisable("the loop did not go on where it was sent")
        elif self._mode == "run":
            self._close()
        if self._mode == "skip":
            assert self.reuse is not None
            self._resume(self.reuse)
        self._events = [("i", self.values.digest(self._positions[index]))]
        self._span_start = len(self.chunks)
        return True

    def end(self) -> str:
        if self._mode == "run":
            self._close()
        elif self._mode == "skip":
            assert self.reuse is not None
            self._resume(self.reuse)
        if self._mode != "off":
            self._mode = "after"
        return ""

    def loop_attribute(self, loop: Any, attribute: str) -> Any:
        """`loop.<attribute>`; recorded when it depends on more than the iteration's index (which
        the chain key fixes: K(i-1) is only ever the key before iteration i)."""
        value = self.env.getattr(loop, attribute)
        if self._mode == "run" and loop is self._loop and attribute in _LIST_ATTRIBUTES:
            self._events.append(("L", attribute, self.values.item(value) if attribute in _ITEMS else value))
        return value

    def item(self, items: Any, key: Any) -> Any:
        value = self.env.getitem(items, key)
        which = self._which(items) if self._mode == "run" else None
        if which is not None:
            if type(key) is int:
                self._events.append(("G", which, key, self.values.key(value)))
            else:
                self._stop("the message list is read with a key that is not an integer")
        return value

    def length(self, items: Any) -> int:
        size = len(items)
        which = self._which(items) if self._mode == "run" else None
        if which is not None:
            self._events.append(("n", which, size))
        return size

    def ns_get(self, namespace: Any, attribute: str) -> Any:
        value = self.env.getattr(namespace, attribute)
        index = self._namespaces.get(id(namespace)) if self._mode == "run" else None
        if index is not None:
            self._events.append(("N", index, attribute, self.values.key(value)))
        return value

    def ns_set(self, namespace: Any, attribute: str) -> str:
        index = self._namespaces.get(id(namespace)) if self._mode == "run" else None
        if index is not None:
            value = getattr(namespace, attribute)
            if type(value) in _WRITABLE:
                self._events.append(("W", index, attribute, value))
            else:
                self._stop("an iteration writes a value that is not a boolean, a number or None")
        return ""

    # -- recording ---------------------------------------------------------------------

    def _begin(self, loop: Any, iterated: Any) -> None:
        """Before iteration 0: the chain key of the text so far, then how much of it can be reused."""
        self._loop = loop
        if type(iterated) is not list or any(id(item) not in self.values.ids for item in iterated):
            self._mode = "off"
            return
        self._iterated = iterated
        self._positions = [self.values.ids[id(item)] for item in iterated]
        try:
            self.values.digest_all()
            outer = self._outer_key()
        except Unmemoisable:
            self._mode = "off"
            return
        self._key = _chain(self._base, repr((outer, _text_digest("".join(self.chunks)))).encode())
        self._loop_key = self._key
        self.spans.append((self._key, 0, len(self.chunks)))
        self._mode = "run"
        reuse = self._plan()
        if reuse is not None:
            self.reuse = reuse
            if reuse.index >= 0 or reuse.at_end:      # the text before the loop is in the prefix
                self.start_chunk = len(self.chunks)
                self.spans.clear()
            if reuse.skip_to >= 0:
                self._mode = "skip"

    def _outer_key(self) -> tuple[Any, ...]:
        keys: list[Any] = []
        for name in self.proof.outer_names:
            keys.append((name, self._outer_value_key(name, self._outer.get(name, _MISSING))))
        for name in sorted(self.proof.namespace_names):
            value = self._outer.get(name, _MISSING)
            if type(value) is Namespace:
                self._namespaces[id(value)] = len(self._ns_objects)
                keys.append((name, ("ns", len(self._ns_objects))))
                self._ns_objects.append(value)
            else:
                keys.append((name, self._outer_value_key(name, value)))
        return tuple(keys)

    def _outer_value_key(self, name: str, value: Any) -> Any:
        if value is _MISSING:
            return ("missing",)
        if type(value) is Macro:
            return ("macro", value.name)
        if callable(value) and value is self.env.globals.get(name):
            return ("global", name)
        return self.values.key(value)

    def _close(self) -> None:
        events = tuple(self._events)
        key = _chain(self._key, repr(events).encode())
        self.new_traces.append((self._key + events[0][1], Trace(events, key)))
        self.spans.append((key, self._span_start, len(self.chunks)))
        self._key = key

    def _stop(self, why: str) -> None:
        """A surprise while recording: go on unrecorded if nothing was skipped, else give up."""
        if self.reuse is not None and self.reuse.skip_to >= 0:
            raise Unmemoisable(why)
        self._mode = "off"
        self.reuse = None
        self.start_chunk = 0
        self.spans.clear()
        self.new_traces.clear()

    def _which(self, items: Any) -> int | None:
        if items is self.values.messages:
            return 0
        if items is self._iterated:
            return 1
        return None

    # -- replaying ---------------------------------------------------------------------

    def _plan(self) -> _Reuse | None:
        """Walk the stored traces from K(-1); the last cut stored along the run they cover.

        Reads the tables without their lock (a dict read is atomic under the GIL); the traces and
        cuts it went through are marked recent with the render's new ones (`tally`, `put_path`).
        `state` is never changed in place: a snapshot of it is a reference."""
        traces, cuts, digest, positions = self._traces.peek, self._cuts.peek, self.values.digest, self._positions
        key = self._key
        state: State = {}
        cut = cuts(key)
        best = None if cut is None else (-1, cut, key, state, key, state)
        used: list[bytes] = []                    # the traces replayed, and the cuts found along them
        cut_keys = [] if cut is None else [key]
        over_messages = self._iterated is self.values.messages     # positions are indexes: jumps apply
        start, jump = 0, self._jump() if over_messages else None
        jump_cut = None if jump is None else cuts(jump.keys[-_DIGEST:])
        if jump is not None and jump_cut is not None and jump_cut[0] == AT_END:   # 0..jump.last in one step
            keys = [jump.keys[i:i + _DIGEST] for i in range(0, len(jump.keys), _DIGEST)]
            used = [k + d for k, d in zip([key, *keys[:-1]], self.values.digests, strict=False)]
            cut_keys += keys                      # marked recent where they are cuts
            key, state, start = keys[-1], jump.state, jump.last + 1
            best = (jump.last, jump_cut, key, state, key, state)     # at its end: nothing before it is used
        else:
            jump = None
        walked: list[Trace] = []
        for index in range(start, len(self._iterated)):
            at = key + digest(positions[index])
            variants = traces(at)
            if variants is None:
                break
            for trace in variants:
                written = self._replays(trace.events, index, state)
                if written is not None:
                    break
            else:
                break
            before = (key, state)
            if written:
                state = {**state, **written}
            key = trace.key
            used.append(at)
            walked.append(trace)
            cut = cuts(key)
            if cut is not None:
                best = (index, cut, key, state, *before)
                cut_keys.append(key)
        self.used_traces, self.used_cuts = used, cut_keys     # marked recent by `tally`
        if over_messages:
            self.run = _RunSeed(self._loop_key, self.values.digests, jump, walked)
        if best is None:
            return None
        index, (offset, chars, tokens), key, state, before_key, before_state = best
        if offset == AT_END:
            return _Reuse(index, True, state, key, 0, chars, tokens)
        return _Reuse(index, False, before_state, before_key, offset, chars, tokens)

    def _jump(self) -> Jump | None:
        """A stored run this request replays from the loop's start, one of those whose last message read
        is among its last `_JUMP_LOOKBACK`, the longest; None when none is proven (then the walk goes
        iteration by iteration, as it would have)."""
        digests, peek = self.values.digests, self._jumps.peek
        size = len(digests)
        for reads in range(size - 1, max(size - 1 - _JUMP_LOOKBACK, -1), -1):
            variants = peek(_jump_key(self._loop_key, digests, reads))
            if variants is None:
                continue
            prefix = _prefix(self._loop_key, digests, reads)
            for jump in variants:
                if jump.prefix == prefix and jump.last < size - 1 and \
                        all(self._live_key(name) == value for name, value in jump.live):
                    return jump
        return None

    def _live_key(self, name: tuple[int, str]) -> Any:
        """The key of a namespace's value as the loop finds it before writing it (an "N" read that no
        replayed write answers)."""
        value = getattr(self._ns_objects[name[0]], name[1], _MISSING)
        return _UNDEFINED_KEY if value is _MISSING else self.values.key(value)

    def _replays(self, events: tuple[Event, ...], index: int, state: State) -> State | None:
        """The writes of `events` if every read in it gives the recorded value at iteration `index` (else None)."""
        written: State = {}
        values = self.values
        now: Any
        for event in events:
            tag = event[0]
            if tag == "i":
                now = values.digest(self._positions[index])
            elif tag == "L":
                now = self._loop_value(event[1], index)
            elif tag == "G":
                items = values.messages if event[1] == 0 else self._iterated
                at = event[2]
                now = values.item(items[at]) if -len(items) <= at < len(items) else _UNDEFINED_KEY
            elif tag == "n":
                now = len(values.messages if event[1] == 0 else self._iterated)
            elif tag == "N":
                name = (event[1], event[2])
                value = written.get(name, state.get(name, _MISSING))
                now = self._live_key(name) if value is _MISSING else values.key(value)
            else:       # "W"
                written[(event[1], event[2])] = event[3]
                continue
            if now != event[-1]:
                return None
        return written

    def _loop_value(self, attribute: str, index: int) -> Any:
        """What `loop.<attribute>` is at iteration `index` of the list iterated (LoopContext's rules),
        as `loop_attribute` records it."""
        size = len(self._iterated)
        if attribute == "last":
            return index == size - 1
        if attribute == "nextitem":
            return self.values.item(self._iterated[index + 1]) if index + 1 < size else _UNDEFINED_KEY
        if attribute == "previtem":
            return self.values.item(self._iterated[index - 1]) if index > 0 else _UNDEFINED_KEY
        return size - {"length": 0, "revindex": index, "revindex0": index + 1}[attribute]

    def _resume(self, reuse: _Reuse) -> None:
        """The first iteration rendered after skipped ones: the namespaces get the state those left."""
        for (index, attribute), value in reuse.state.items():
            self._ns_objects[index][attribute] = value
        self._key = reuse.key
        self._mode = "run"


def _fast_forward(loop: Any, iterated: list[Any], skip_to: int) -> int:
    """Send a LoopContext at iteration 0 on to iteration `skip_to + 1` (its next), as if it had run the
    ones between: the list iterator moved, the index and the current item set (`previtem` follows).
    `Recorder.enter` checks that the loop goes on there (else the chat is rendered whole)."""
    loop._iterator = itertools.islice(iterated, skip_to + 1, None)
    loop._after = missing
    loop.index0 = skip_to
    loop._current = iterated[skip_to]
    return skip_to + 1


def render(proof: LoopProof, variables: dict[str, Any], base_key: bytes, cache: PieceCountCache) -> MemoRender | None:
    """Render through the memo; None when the chat must be rendered whole instead (a template error
    included: the whole render raises it in its own words)."""
    template = proof.template
    recorder = Recorder(proof, variables["messages"], base_key, cache)
    context = new_render_context(template, {**variables, **recorder.hooks()})
    chunks = recorder.chunks
    try:
        for chunk in template.root_render_func(context):
            chunks.append(chunk)
    except Exception:
        return None
    reuse, start = recorder.reuse, recorder.start_chunk
    drop = reuse.drop if reuse is not None else 0
    text = template.environment.concat(chunks[start:])[drop:]
    spans = []
    at, offset = start, -drop
    for key, first, end in recorder.spans:
        while at < first:
            offset += len(chunks[at])
            at += 1
        span_start = offset
        while at < end:
            offset += len(chunks[at])
            at += 1
        spans.append((key, span_start, offset))
    done = MemoRender(text, spans=spans, traces=recorder.new_traces, used=recorder.used_traces,
                      used_cuts=recorder.used_cuts, run=recorder.run)
    if reuse is not None:
        done.prefix_chars, done.prefix_tokens, done.reused = reuse.chars, reuse.tokens, True
        done.skipped = reuse.skip_to + 1
    return done


def tally(done: MemoRender, counter: PieceCounter, cut_tokens: tuple[str, ...]) -> PieceTally:
    """The count of the chat `done` rendered, without post-processor specials: the prefix counted
    before plus the new text, split at each iteration's last cut; those cuts' counts are stored
    under their chain keys, and the new traces beside them.  `cut_tokens`: the cut tokens the
    template writes, searched for inside an iteration when its end is no cut."""
    text = done.text
    last_cuts = []
    for key, start, end in done.spans:
        if end == len(text) or counter.starts_with_cut(text, end):
            last_cuts.append((key, AT_END, end))
            continue
        position = max((text.rfind(token, max(start, 0), end) for token in cut_tokens), default=-1)
        if position >= 0:
            last_cuts.append((key, position - start, position))
    points = sorted({position for _, _, position in last_cuts if 0 < position < len(text)})
    bounds = [0, *points, len(text)]
    segments = [text[a:b] for a, b in itertools.pairwise(bounds)] if text else []
    tallies = counter.count_segments(segments, starts_text=not done.reused)
    total = done.prefix_tokens
    running = {0: total}
    for end, segment in zip(bounds[1:], tallies, strict=False):
        total += segment.tokens
        running[end] = total
    cache = counter.cache
    cache.loop_cuts.put_path([(key, (offset, done.prefix_chars + position, running[position]))
                              for key, offset, position in last_cuts if done.prefix_chars + position > 0],
                             done.used_cuts)
    cache.traces.add(done.traces, done.skipped, done.used, done.jumped)
    if done.run is not None:
        _store_jump(done, done.run, cache)
    return PieceTally(tokens=total, pieces=sum(t.pieces for t in tallies),
                      added_tokens=sum(t.added_tokens for t in tallies),
                      encoded_pieces=sum(t.encoded_pieces for t in tallies),
                      encoded_tokens=sum(t.encoded_tokens for t in tallies), reused_tokens=done.prefix_tokens)


def _store_jump(done: MemoRender, seed: _RunSeed, cache: PieceCountCache) -> None:
    """The jump to the last iteration with a stored cut of this render's run from the loop's start
    (the jump it took, the traces walked after it, the iterations rendered): built from where the
    jump it took ended, so a conversation one turn longer costs a turn's iterations here."""
    start, skip_to = seed.start, done.skipped - 1      # a jump taken is skipped through its last iteration
    first = 0 if start is None else start.last + 1
    run = _Run(start)
    cuts = cache.loop_cuts.peek
    best = None
    path = seed.walked[: skip_to + 1 - first] + [trace for _, trace in done.traces]
    for index, trace in enumerate(path, first):
        if not run.extend(index, trace):
            break
        cut = cuts(trace.key)
        if cut is not None and cut[0] == AT_END:    # a jump's run ends where its next one may go on
            best = (index, run.reads, tuple(run.live.items()), run.state, len(run.new_keys))
    if best is None or (start is not None and best[0] == start.last):
        return
    last, reads, live, state, count = best
    jump = Jump(last, reads, _prefix(seed.loop_key, seed.digests, reads), live, state,
                run.keys + b"".join(run.new_keys[:count]))
    key = _jump_key(seed.loop_key, seed.digests, reads)
    # beside the runs that end on the same message but differ before it, or read other namespace values
    known = [other for other in cache.jumps.peek(key) or () if (other.prefix, other.live) != (jump.prefix, live)]
    cache.jumps.put_many([(key, (jump, *known[: MAX_VARIANTS - 1]))])
