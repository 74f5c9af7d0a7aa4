"""What turns text into a token count: `tokenizers` (the reference) or a faster engine proven equal.

vLLM encodes with `tokenizers` (through transformers), so `tokenizers` is
what a count must equal.  `fastokens` loads the same tokenizer.json and was
identical to it on the whole corpus and on large randomised sets for every
shipped tokenizer, 10-90x faster (bench/engine_bench.py), but it is a
reimplementation: it cannot load some components (Metaspace pre-tokenizers)
and differs on some it can (ByteLevel with add_prefix_space before U+180E).
transformers 5's LlamaTokenizer builds Metaspace(split=false, prepend_scheme
"first"), which is a Replace(" " -> "▁") normalizer plus a "▁" before the piece
at offset 0: fastokens loads that form (`metaspace_as_normalizer`) and
`PrependFirstEncoder` adds the "▁" itself, under the same self-check.
So each model gets it only after a self-check at load time: its ids must
equal `tokenizers`' on the built-in texts of `_selfcheck` (derived from the
model's own added tokens).  Otherwise, or when it is not installed, the
model counts with `tokenizers`, and `select_encoder` says why.  A fast
engine that raises while counting (e.g. a regex resource limit on a
pathological text) hands that text to `tokenizers`.

Loading fastokens costs 3-4x what loading `tokenizers` does (1.7 s of CPU
for Qwen3's tokenizer, 3.8 s for Qwen3.5's), and a model that is counted
little never earns it back.  So under "auto" a model starts on `tokenizers`
and loads fastokens in the background once counting has cost as much as
the load is expected to (`DeferredEncoder`, the ski-rental rule: never more
than twice the CPU of the better choice made in hindsight).  Start-up and a
replaced worker are ready sooner; "fastokens" loads it at start-up.

Both engines release the GIL while encoding and are safe to call from
several threads at once (tests/tokenizer_cache/test_engine_exactness.py).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from tokenizers import Tokenizer

from ._added_split import AddedTokenSplitter
from ._piece_support import split_tokens
from ._selfcheck import self_check_texts

logger = logging.getLogger("brimful.tokenizer")
_R = TypeVar("_R")

REFERENCE = "tokenizers"
FASTOKENS = "fastokens"
ENGINES = (FASTOKENS, REFERENCE)  # preference order for "auto"


class Encoder(Protocol):
    """Counts tokens of texts for one tokenizer; thread-safe."""

    @property
    def name(self) -> str:
        """The engine counting now: "fastokens" or "tokenizers"."""
        ...

    def count(self, text: str, add_special_tokens: bool) -> int: ...

    def count_pieces(self, pieces: list[str]) -> list[int]:
        """Counts of texts encoded on their own without post-processor specials."""
        ...

    def ids(self, text: str, add_special_tokens: bool) -> list[int]: ...


class ReferenceEncoder:
    """`tokenizers` itself.  `encode_batch_fast` gives `encode`'s ids without
    offsets and releases the GIL; len(Encoding) avoids a Python list of ids."""

    name = REFERENCE

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer

    def count(self, text: str, add_special_tokens: bool) -> int:
        return len(self._tokenizer.encode_batch_fast([text], add_special_tokens=add_special_tokens)[0])

    def count_pieces(self, pieces: list[str]) -> list[int]:
        return [len(e) for e in self._tokenizer.encode_batch_fast(pieces, add_special_tokens=False)]

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids


class FastokensEncoder:
    """`fastokens` over the same tokenizer.json, `tokenizers` for any text it fails on."""

    name = FASTOKENS

    def __init__(self, spec: str, reference: ReferenceEncoder, *, split_special_tokens: bool) -> None:
        import fastokens

        self._tokenizer = fastokens.Tokenizer.from_json_str(spec)
        # As the loader does for `tokenizers`: count whole texts whatever tokenizer.json stores.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        self._split = split_special_tokens
        self._reference = reference
        self._failures = 0
        self._lock = threading.Lock()

    @property
    def failures(self) -> int:
        """Texts this engine raised on (counted by `tokenizers` instead)."""
        return self._failures

    def _failed(self, exc: Exception) -> None:
        with self._lock:
            self._failures += 1
            first = self._failures == 1
        if first:
            logger.warning("fastokens raised %s while counting; that text and any later such text "
                           "are counted with tokenizers", type(exc).__name__)

    def count(self, text: str, add_special_tokens: bool) -> int:
        try:
            return len(self._tokenizer.encode(text, add_special_tokens=add_special_tokens,
                                              split_special_tokens=self._split))
        except Exception as exc:  # fastokens raises ValueError/RuntimeError kinds of its own
            self._failed(exc)
            return self._reference.count(text, add_special_tokens)

    def count_pieces(self, pieces: list[str]) -> list[int]:
        try:
            encodings = self._tokenizer.encode_batch(pieces, add_special_tokens=False,
                                                     split_special_tokens=self._split)
        except Exception as exc:
            self._failed(exc)
            return self._reference.count_pieces(pieces)
        return [len(e) for e in encodings]

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens,
                                           split_special_tokens=self._split).ids)


def metaspace_as_normalizer(spec: str) -> tuple[str, str, str] | None:
    """`spec` with its Metaspace(split=false, prepend_scheme first|never) pre-tokenizer as a Replace normalizer.

    Metaspace without split only replaces " " with its replacement and, for
    "first", puts one before the piece at original offset 0 unless it starts
    with one; the Replace normalizer does the first part on the same pieces
    (the text between added tokens).  Returns (that spec, scheme, replacement),
    or None where the rewrite would not be the same tokenizer: another
    normalizer or pre-tokenizer, split=true, or added tokens matched on
    normalized text (they would see the replacement instead of spaces).
    """
    data = json.loads(spec)
    pre = data.get("pre_tokenizer")
    if not (isinstance(pre, dict) and pre.get("type") == "Metaspace" and pre.get("split") is False
            and pre.get("prepend_scheme") in ("first", "never") and data.get("normalizer") is None):
        return None
    if any(token.get("normalized") for token in data.get("added_tokens") or []):
        return None
    replacement = str(pre.get("replacement", "\u2581"))
    data["pre_tokenizer"] = None
    data["normalizer"] = {"type": "Replace", "pattern": {"String": " "}, "content": replacement}
    return json.dumps(data, ensure_ascii=False), str(pre["prepend_scheme"]), replacement


class PrependFirstEncoder:
    """Metaspace prepend_scheme "first" over an engine of its "never" form: the replacement put before a
    text whose first piece starts at offset 0 (no added token there) and does not start with " " or it."""

    name = FASTOKENS

    def __init__(self, never: FastokensEncoder, splitter: AddedTokenSplitter, replacement: str) -> None:
        self.never = never  # the piece counter counts pieces not at offset 0 with it
        self._splitter = splitter
        self._replacement = replacement

    @property
    def failures(self) -> int:
        return self.never.failures

    def _text(self, text: str) -> str:
        if not text or text[0] == " " or text[0] == self._replacement:
            return text
        return self._replacement + text if self._splitter.split_from_start(text)[2] else text

    def count(self, text: str, add_special_tokens: bool) -> int:
        return self.never.count(self._text(text), add_special_tokens)

    def count_pieces(self, pieces: list[str]) -> list[int]:
        return self.never.count_pieces([self._text(piece) for piece in pieces])

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.never.ids(self._text(text), add_special_tokens)


def _fast_candidate(tokenizer: Tokenizer, spec: str, reference: ReferenceEncoder) -> Encoder:
    """fastokens over `spec`, or over its Metaspace-free form (`metaspace_as_normalizer`)."""
    split = tokenizer.encode_special_tokens
    rewritten = metaspace_as_normalizer(spec)
    if rewritten is None:
        return FastokensEncoder(spec, reference, split_special_tokens=split)
    never_spec, scheme, replacement = rewritten
    never_tokenizer = Tokenizer.from_str(never_spec)
    never_tokenizer.no_truncation()
    never_tokenizer.no_padding()
    never_tokenizer.encode_special_tokens = split
    # A text fastokens raises on goes to `tokenizers` over the same form, so the prefix stays right.
    never = FastokensEncoder(never_spec, ReferenceEncoder(never_tokenizer), split_special_tokens=split)
    if scheme == "never":
        return never
    return PrependFirstEncoder(never, AddedTokenSplitter(split_tokens(tokenizer), encode_special_tokens=split),
                               replacement)


@dataclass(frozen=True)
class EncoderChoice:
    """The encoder a model counts with, and why it is not the preferred one (None when it is)."""

    encoder: Encoder
    fallback_reason: str | None = None


def _flagged_tokens(tokenizer: Tokenizer) -> list[tuple[str, bool]]:
    return [
        (token.content, bool(token.lstrip or token.rstrip or token.single_word or token.normalized))
        for _, token in sorted(tokenizer.get_added_tokens_decoder().items())
    ]


def first_mismatch(candidate: Encoder, reference: Encoder, texts: Sequence[str]) -> str | None:
    """A description of the first text (and add_special_tokens value) where the ids differ, or None."""
    for text in texts:
        for add_special_tokens in (False, True):
            try:
                got = candidate.ids(text, add_special_tokens)
            except Exception as exc:
                return f"raised {type(exc).__name__} on {text[:40]!r} (add_special_tokens={add_special_tokens})"
            expected = reference.ids(text, add_special_tokens)
            if got != expected:
                return (f"{len(got)} ids instead of {len(expected)} for {text[:40]!r} "
                        f"(add_special_tokens={add_special_tokens})")
        # count_pieces is what the piece counter uses: same texts, batched, no specials.
    counts = candidate.count_pieces(list(texts))
    expected_counts = reference.count_pieces(list(texts))
    if counts != expected_counts:
        return "batched piece counts differ from tokenizers'"
    return None


def select_encoder(tokenizer: Tokenizer, spec: str, *, engine: str = "auto", source: str = "") -> EncoderChoice:
    """The encoder for this tokenizer: the fast engine when it loads and passes the
    self-check, else `tokenizers` (with the reason, logged once per load).

    `engine`: "auto" (fastokens if it qualifies), "tokenizers", or "fastokens"
    (still self-checked: a failing engine is never used).  `source` names the
    model in the log line.
    """
    reference = ReferenceEncoder(tokenizer)
    if engine not in ("auto", *ENGINES):
        raise ValueError(f"unknown tokenizer engine {engine!r}; choose auto, {', '.join(ENGINES)}")
    if engine == REFERENCE:
        return EncoderChoice(reference)
    try:
        candidate = _fast_candidate(tokenizer, spec, reference)
    except ImportError:
        return _fallback(reference, "fastokens is not installed", source, quiet=engine == "auto")
    except Exception as exc:  # fastokens refuses components it does not implement
        return _fallback(reference, f"fastokens cannot load it: {str(exc)[:200]}", source)
    mismatch = first_mismatch(candidate, reference, self_check_texts(_flagged_tokens(tokenizer)))
    if mismatch is not None:
        return _fallback(reference, f"fastokens failed the self-check: {mismatch}", source)
    return EncoderChoice(candidate)


# What loading fastokens and its self-check cost, as a multiple of loading `tokenizers` (measured 2.7-3.6x
# on the shipped tokenizers, docs/counting.md "Counting engine"): counting with `tokenizers` may cost this much first.
LOAD_COST_RATIO = 4.0


def _loaded() -> EncoderChoice:
    raise RuntimeError("the fast engine was already loaded")


def _in_background(work: Callable[[], None]) -> None:
    threading.Thread(target=work, name="brimful-fastokens-load", daemon=True).start()


class DeferredEncoder:
    """`tokenizers` until counting with it has cost `budget_seconds`, then the fast engine if it loads
    and passes the self-check (`load`, run by `start`: a background thread), else `tokenizers` for good."""

    def __init__(self, reference: ReferenceEncoder, load: Callable[[], EncoderChoice], budget_seconds: float,
                 start: Callable[[Callable[[], None]], None] = _in_background) -> None:
        self._reference = reference
        self._active: Encoder = reference
        self._load = load
        self._budget = budget_seconds
        self._start = start
        self._spent = 0.0
        self._loading_pid: int | None = None  # the process whose thread is loading; a fork's child starts over
        self._reason: str | None = None
        self._done = False
        self._settled = threading.Event()
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self._active.name

    @property
    def active(self) -> Encoder:
        """The engine counting now."""
        return self._active

    def wait_settled(self, timeout: float | None = None) -> bool:
        """True once the fast engine is in use or refused (benchmarks and tests wait on this)."""
        return self._settled.wait(timeout)

    @property
    def failures(self) -> int:
        return int(getattr(self._active, "failures", 0))

    @property
    def fallback_reason(self) -> str | None:
        """None once on the fast engine; why not yet, or why never."""
        if self._done:
            return self._reason
        return (f"fastokens loads once counting with tokenizers has cost {self._budget:.2f} s "
                f"({self._spent:.2f} s so far)")

    def start_now(self) -> None:
        """Load the fast engine now, whatever counting has cost so far."""
        self._charge(0.0, force=True)

    def _charge(self, seconds: float, *, force: bool = False) -> None:
        with self._lock:
            self._spent += seconds
            if self._done or (self._spent < self._budget and not force):
                return
            if self._loading_pid == os.getpid():
                return
            self._loading_pid = os.getpid()
        self._start(self._switch)

    def _switch(self) -> None:
        try:
            choice = self._load()
        except Exception as exc:  # never let the background load take counting down
            choice = EncoderChoice(self._reference, f"fastokens could not be loaded: {str(exc)[:200]}")
        self._reason = choice.fallback_reason
        self._active = choice.encoder
        self._done = True
        self._load = _loaded  # lets go of the tokenizer.json it held
        self._settled.set()

    def _on_active(self, work: Callable[[Encoder], _R]) -> _R:
        """`work` on the engine counting now; on `tokenizers`, its time is charged to the budget."""
        active = self._active
        if active is not self._reference:
            return work(active)
        started = time.perf_counter()
        result = work(active)
        self._charge(time.perf_counter() - started)
        return result

    def count(self, text: str, add_special_tokens: bool) -> int:
        return self._on_active(lambda engine: engine.count(text, add_special_tokens))

    def count_pieces(self, pieces: list[str]) -> list[int]:
        return self._on_active(lambda engine: engine.count_pieces(pieces))

    def ids(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._on_active(lambda engine: engine.ids(text, add_special_tokens))


def deferred_encoder(tokenizer: Tokenizer, spec: bytes, *, budget_seconds: float, source: str = "",
                     start: Callable[[Callable[[], None]], None] = _in_background) -> EncoderChoice:
    """"auto" for a model being served: `tokenizers` now, the fast engine once it has paid for itself.

    `spec` is kept as bytes until then (a str of tokenizer.json can take twice the memory)."""
    deferred = DeferredEncoder(ReferenceEncoder(tokenizer),
                               lambda: select_encoder(tokenizer, spec.decode("utf-8"), engine="auto", source=source),
                               budget_seconds, start)
    return EncoderChoice(deferred)


def _fallback(reference: ReferenceEncoder, reason: str, source: str, *, quiet: bool = False) -> EncoderChoice:
    if not quiet:
        logger.warning("%s counts with tokenizers: %s", source or "a tokenizer", reason)
    return EncoderChoice(reference, reason)
