"""Prompt-token counting for a request, wherever the tokenizer lives.

Per model, the tokenizer directory is, in order: the config's
`models."name".tokenizer`; the `root` that `/v1/models` reports when it is a
readable local directory (vLLM and brimful sharing a volume); a Hugging Face
cache snapshot found by the model id or `root`; a LoRA adapter's base model's
tokenizer.  Nothing is downloaded.  A model with no local tokenizer is counted
by the upstream itself (`POST /tokenize`, which answers with vLLM's exact count
and does not enforce the length limit).

Loading a tokenizer takes ~0.5 s and large prompts take milliseconds to
encode, so both run in a worker thread, never on the event loop.

Memory.  Encoding costs 95-240 MiB of RSS per MB of prompt (tokenizers'
`encode_batch_fast` on Qwen3's tokenizer: English text at the low end,
random symbols at the high end; measured with VmHWM), so a 33 MB prompt
peaked at 5.5 GiB.  Three rules bound it:

* a prompt vLLM would refuse by its character bound (`char_bound`) is
  refused before anything is encoded, in vLLM's words;
* long prompts are encoded within `tokenizers.count_memory_bytes`
  (`proxy.upstream.gate.CountingBudget`, weighed at COUNT_BYTES_PER_BODY_BYTE per body
  byte); the excess waits up to `upstream.queue_timeout`, then gets 503;
* after a count above TRIM_ABOVE_BYTES the freed heap is handed back to the
  OS (`malloc_trim`, once the process grew by `heap.TRIM_GROWTH_BYTES`, at most
  every `heap.TRIM_INTERVAL_S`): without it 4.1 GiB stayed resident 80 s after
  the count.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from proxy import errors
from proxy.admitted.heap import HeapTrimmer
from proxy.admitted.surfaces import Surface
from proxy.admitted.trust import CountTrust
from proxy.config import Config, Policy
from proxy.errors import BrimfulError
from proxy.upstream.backends import Backends
from proxy.upstream.client import Upstream
from proxy.upstream.gate import CountingBudget
from proxy.upstream.models import ModelInfo
from tokenizer_cache import (
    ChatCountCache,
    CountError,
    CountingModel,
    MediaNotCountable,
    ModelTokenizer,
    PieceCountCache,
    TokenizerCache,
    default_build_cache_dir,
    encoded_chars,
    find_tokenizer_dir,
    loader_for_vllm,
    start_encode_meter,
    use_build_store,
)
from tokenizer_cache import char_bound as tokenizer_char_bound

log = logging.getLogger("brimful.counting")
_T = TypeVar("_T")

# Requests for a model whose start-up probes are under way wait for them, until this long after
# the probes began at most: they take a few /tokenize round trips, and a count they may find off
# is worse than the wait; probes that take longer (a stalled upstream) make nobody wait longer.
PROBE_WAIT_S = 2.0
TOKENIZE_REFUSED = "tokenize_refused"     # x-brimful-uncounted: the upstream's /tokenize refused the request


# Long prompts are counted on threads the OS runs only when the event loop does
# not want the CPU: `encode_batch_fast` releases the GIL, but on a proxy given
# one core the loop and a 60 ms count still share that core.  At nice +10 the
# kernel's EEVDF scheduler (Linux 6.6+) lets the counting
# thread finish its slice before a woken loop runs: small requests' p99 rose
# from ~1 to ~5.5 ms while 23k-token chats were counted.  SCHED_IDLE threads are
# preempted as soon as the loop wakes: p99 1.6 ms in the same bench (bench/,
# long-mix).  When the loop is idle, or another core is free, a count runs at
# full speed; only a proxy saturating its one core starves long counts, which
# then wait for the small requests (weight 3 against 1024).
LONG_PROMPT_NICE = 10        # the fallback where SCHED_IDLE is unavailable
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _lower_thread_priority() -> None:
    thread = threading.get_native_id()
    try:
        os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
        return
    except (AttributeError, OSError):   # not Linux: try a plain nice value
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, thread, LONG_PROMPT_NICE)
    except (AttributeError, OSError):   # not permitted: count at normal priority
        pass


def _long_prompt_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="brimful-count",
            initializer=_lower_thread_priority,
        )
    return _pool


# RSS an encode costs per byte of request body: the top of the measured
# 95-240 MiB per MB, rounded up, so the budget is not overrun by symbol-dense text.
COUNT_BYTES_PER_BODY_BYTE = 256
# RSS the character-bound check costs per body byte: the conversation prepared for the
# template (+184 MiB for a 33 MB body of 10^6 empty messages, the render stopped at 4x the
# bound), doubled.
RENDER_BYTES_PER_BODY_BYTE = 16
# A count of many inputs (embeddings) goes in slices of at most this share of the budget each.
SLICES_PER_BUDGET = 8
# Counts (and refusals) of larger bodies give their freed heap back: malloc_trim
# took 1.7 ms after a 250 KB prompt, 10.6 ms after 4 MB, on the counting thread.  The
# encode is what costs the memory (95-240 MiB per MB encoded), so a count that encoded at
# most this many characters (the new turn of a conversation counted before) does not trim.
TRIM_ABOVE_BYTES = 128 * 1024
# Bodies counted without a trim (each encoded little) between two trims: 16 MiB is ~40 turns of a
# 400 KiB conversation; without it the counting threads' arenas kept +86 MiB after 150 such turns.
TRIM_EVERY_BYTES = 16 * 1024 * 1024
_untrimmed_bytes = 0   # bodies counted since the last trim, above TRIM_ABOVE_BYTES (races only shift a trim)
# Trims only when worth it, at most every heap.TRIM_INTERVAL_S (a trim after each long unseen prompt cost
# ~0.6 ms, and the event loop ~1 ms more faulting the pages back in).
heap_trimmer = HeapTrimmer()


# -- small counts, together ------------------------------------------------------------

class TurnBatch:
    """Calls asked for during one turn of the event loop, made back to back when it ends.

    A small prompt is counted on the loop (~23 µs for a 197-byte chat in a loop in-process),
    but in the server each count ran between other requests' parsing, splicing and socket
    writes, which pushed the template's code and the tokenizer's tables out of the CPU's
    caches: ~50 µs a count.  The requests that reach their count in the same turn now wait
    for one `call_soon` that counts them all, then go on, each with its own result or
    exception (docs/performance.md: 0.83-0.91x the CPU per small chat at 64 connections).
    A caller gone before its turn (a client that disconnected) is not counted.
    """

    def __init__(self) -> None:
        self._pending: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Future[Any], Callable[[], Any]]]] = {}

    def call(self, fn: Callable[[], _T]) -> asyncio.Future[_T]:
        loop = asyncio.get_running_loop()
        pending = self._pending.get(loop)
        if pending is None:
            pending = self._pending[loop] = []
            loop.call_soon(self._run, loop)
        future: asyncio.Future[_T] = loop.create_future()
        pending.append((future, fn))
        return future

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        for future, fn in self._pending.pop(loop):
            if future.cancelled():
                continue
            error: BaseException
            try:
                result = fn()
            except StopIteration as exc:     # a future refuses it; a coroutine would have raised this instead
                error = RuntimeError("a count raised StopIteration")
                error.__cause__ = exc
            except BaseException as exc:     # the caller's await raises it, as the call would have
                error = exc
            else:
                future.set_result(result)
                continue
            future.set_exception(error)
            # Marked as seen: a caller cancelled after this would leave asyncio to log the refusal,
            # with its message, when the future is collected.  Its await still raises it.
            future.exception()


# -- vLLM's character bound ------------------------------------------------------------

def max_chars_per_token(tok: CountingModel) -> int | None:
    """vLLM's factor, the longest token of the vocabulary in characters (tokenizer_cache computes it
    as vLLM 0.32 does); None where no bound applies: the harmony and mistral families are not held
    to one here, and skipping a check never refuses what vLLM would serve."""
    own = getattr(tok, "max_chars_per_token", None)
    return own if isinstance(own, int) and not isinstance(own, bool) else None


def char_bound(max_model_len: int, chars_per_token: int, body: dict[str, Any]) -> int | None:
    """The most characters vLLM 0.32 lets this request's prompt have (`tokenizer_cache.char_bound`)."""
    return tokenizer_char_bound(max_model_len, chars_per_token, body.get("truncate_prompt_tokens"))


# Prompt lengths are measured exactly up to this many times the bound, so the refusal says
# vLLM's numbers; past it the render stops and the refusal says "at least".
EXACT_CHARS_FACTOR = 4


def check_char_bound(surface: Surface, tok: CountingModel, body: dict[str, Any], bound: int,
                     max_model_len: int) -> None:
    """Refuse, as vLLM would, a prompt text longer than `bound` characters (before encoding it)."""
    floor = surface.prompt_floor(tok, body)
    if floor > bound:         # over the bound from the roles alone: nothing prepared or rendered
        raise errors.prompt_over_char_bound(floor, bound, max_model_len, surface.prompt_param, at_least=True)
    cap = bound * EXACT_CHARS_FACTOR
    for chars in surface.prompt_lengths(tok, body, cap):
        if chars > bound:
            raise errors.prompt_over_char_bound(chars, bound, max_model_len, surface.prompt_param,
                                                at_least=chars > cap)


def _counting_busy(limit: int, waited: float) -> BrimfulError:
    return errors.counting_busy(limit, waited)


@dataclass(frozen=True)
class EngineState:
    """Which engine turns a model's text into tokens (/stats, brimful_count_engine)."""

    engine: str                  # "fastokens", "tokenizers" or "mistral-common"
    fallback: str | None         # why not fastokens, when it was wanted but does not count this model
    failures: int                # texts fastokens raised on since load, each counted by `tokenizers`
    # Which rules built the tokenizer (tokenizer_cache._loader): "transformers5", "tokenizer_json"
    # or "mistral-common"; the transformers class that built it; why transformers5 was not used.
    loader: str = "tokenizer_json"
    tokenizer_class: str | None = None
    loader_fallback: str | None = None

    def describe(self) -> dict[str, object]:
        return {"engine": self.engine, "engine_fallback": self.fallback, "engine_failures": self.failures,
                "tokenizer_loader": self.loader, "tokenizer_class": self.tokenizer_class,
                "tokenizer_loader_fallback": self.loader_fallback}


def engine_state(tok: CountingModel) -> EngineState:
    if isinstance(tok, ModelTokenizer):          # HF tokenizers, gpt-oss's harmony included
        info = tok.loader_info
        return EngineState(tok.engine, tok.engine_fallback, tok.engine_failures,
                           info.loader, info.tokenizer_class, info.fallback_reason)
    return EngineState("mistral-common", "a Mistral-format model: mistral-common encodes it, as in vLLM", 0,
                       "mistral-common")


def _loader_note(tok: CountingModel) -> str:
    """How the start-up log names the rules that built a model's tokenizer."""
    state = engine_state(tok)
    built = f" ({state.tokenizer_class})" if state.tokenizer_class else ""
    why = f"; transformers5 not used: {state.loader_fallback}" if state.loader_fallback else ""
    return f", loader {state.loader}{built}{why}"


@dataclass(frozen=True)
class Count:
    """A request's prompt tokens, one figure per prompt, and how far they can be trusted."""

    per_prompt: list[int]
    exact: bool = True          # the upstream's count (see proxy.admitted.trust)
    margin: int = 0             # tokens to hold back when not exact
    source: Literal["local", "upstream"] = "local"
    uncounted: str | None = None  # why nothing could count it (then per_prompt is empty)

    @property
    def total(self) -> int:
        return sum(self.per_prompt)


class PromptCounter:
    def __init__(self, config: Config, backends: Backends) -> None:
        self._config = config
        self._backends = backends
        build_dir = config.tokenizers.build_cache_dir
        use_build_store(default_build_cache_dir() if build_dir is None else build_dir)
        self._cache = TokenizerCache(
            max_entries=config.tokenizers.cache_size,
            piece_cache_entries=config.tokenizers.piece_cache_entries,
            engine=config.tokenizers.engine,
            chat_cache_entries=config.tokenizers.chat_cache_entries,
        )
        self._dirs: dict[str, Path | None] = {}
        # model -> its loaded tokenizer: the per-request lookup then needs no worker
        # thread (asyncio.to_thread + TokenizerCache.get's Path.resolve() were ~20 %
        # of brimful's CPU per small request, profiled at 64 connections).
        # Bounded like the cache itself; cleared when the model list changes.
        self._ready: OrderedDict[str, CountingModel] = OrderedDict()
        self._ready_max = config.tokenizers.cache_size
        self._hf_home = config.tokenizers.hf_home or os.environ.get("HF_HOME")
        self.on_parity: list[Callable[[str, bool], None]] = []
        self.on_trust: list[Callable[[CountTrust], None]] = []
        self._trust: dict[str, CountTrust] = {}
        # model -> (set once its preload's probes are done, when waiting for them ends)
        self._probing: dict[str, tuple[asyncio.Event, float]] = {}
        self._policies: dict[str, Policy] = {}     # Config.policy_for rebuilds a dataclass each call
        # model -> how it is counted once its tokenizer was looked for: "local"
        # (loaded) or "upstream" (POST /tokenize).  Kept across model-list
        # changes, so a refresh does not make a known model "pending" again
        # (GET /ready reads it).
        self.counted_by: dict[str, str] = {}
        self.budget = CountingBudget(config.tokenizers.count_memory_bytes, config.upstream.queue_timeout,
                                   _counting_busy)
        self._small_counts = TurnBatch()

    # -- where each model's tokenizer is -------------------------------------

    def tokenizer_dir(self, model: str) -> Path | None:
        if model in self._dirs:
            return self._dirs[model]
        found = self._resolve(model, seen=set())
        self._dirs[model] = found
        return found

    def tokenizer_mode(self, model: str) -> str:
        """vLLM's --tokenizer-mode for the model (a LoRA adapter takes its base model's)."""
        return self._setting(model, "tokenizer_mode")

    def tokenizer_loader(self, model: str) -> str:
        """Which rules build the model's tokenizer: the override (a LoRA adapter takes its base
        model's), else those of the transformers the upstream's vLLM ships with (`GET /version`:
        vLLM >= 0.19.1 loads with transformers 5, "auto" applies them to a model folder; older
        vLLM reads tokenizer.json as it is)."""
        chosen = self._setting(model, "tokenizer_loader")
        if chosen != "auto":
            return chosen
        return "tokenizer_json" if loader_for_vllm(self._backends.version(model)) == "tokenizer_json" else "auto"

    def _setting(self, model: str, name: str) -> str:
        """A `[models]` setting whose default is "auto": the model's own, else its base model's
        (an adapter is served by its base model's engine and tokenizer)."""
        override = self._config.models.get(model)
        if override is not None and getattr(override, name) != "auto":
            return str(getattr(override, name))
        info = self._backends.info(model)
        if info is not None and info.parent and info.parent != model:
            parent = self._config.models.get(info.parent)
            if parent is not None:
                return str(getattr(parent, name))
        return "auto"

    def _resolve(self, model: str, seen: set[str]) -> Path | None:
        seen.add(model)
        override = self._config.models.get(model)
        if override is not None and override.tokenizer:
            return Path(override.tokenizer)
        info: ModelInfo | None = self._backends.info(model)
        root = info.root if info else None
        found = find_tokenizer_dir(model, root, self._hf_home)
        if found is None and info is not None and info.parent and info.parent not in seen:
            found = self._resolve(info.parent, seen)
        return found

    @property
    def piece_cache(self) -> PieceCountCache | None:
        return self._cache.piece_cache

    @property
    def chat_cache(self) -> ChatCountCache | None:
        return self._cache.chat_cache

    def engines(self) -> dict[str, EngineState]:
        """Per loaded model: which engine counts it, why not fastokens, and the texts it fell back on."""
        return {model: engine_state(tok) for model, tok in list(self._ready.items())}

    def forget(self, models: Iterable[str]) -> None:
        """Called for the models of an upstream whose list changed: roots may have moved, and
        what was learnt about each one's count starts again with its new probes. The other
        upstreams' models keep theirs: their server did not change."""
        for model in models:
            self._dirs.pop(model, None)
            self._ready.pop(model, None)
            self._trust.pop(model, None)

    def known(self) -> set[str]:
        """Every model something was learnt about: a directory, a tokenizer or a trust."""
        return {*self._dirs, *self._ready, *self._trust}

    # -- how far each model's count is trusted (proxy.admitted.trust) -------------------

    def trust(self, model: str) -> CountTrust:
        found = self._trust.get(model)
        if found is None:
            found = self._trust[model] = CountTrust(model)
        return found

    def trust_states(self) -> dict[str, CountTrust]:
        return dict(self._trust)

    def answered(self, model: str, counted: int, reported: int, *, under: CountTrust | None = None) -> None:
        """The upstream's usage for a request counted with `counted` tokens, `under` the trust it was
        counted with: if the model's list changed since (`forget`), the answer came from a server that
        is gone, and says nothing of the new one's count."""
        trust = self.trust(model)
        if under is not None and under is not trust:
            return
        self._changed(trust, trust.answered(counted, reported))

    def _changed(self, trust: CountTrust, change: str | None) -> None:
        if change is None:
            return
        log.warning("model %s: %s", trust.model, change)
        for callback in self.on_trust:
            callback(trust)

    async def tokenizer(self, model: str) -> CountingModel | None:
        ready = self._ready.get(model)
        if ready is not None:
            return ready
        directory = self.tokenizer_dir(model)
        if directory is None:
            self.counted_by[model] = "upstream"
            return None
        try:
            # No model id for transformers: vLLM 0.32 hands AutoTokenizer the local snapshot of a hub id
            # (vllm/transformers_utils/repo_utils.py get_non_weight_snapshot_path), so its id rules never apply.
            tok = await asyncio.to_thread(self._cache.get, directory, self.tokenizer_mode(model),
                                          self.tokenizer_loader(model))
        except (OSError, ValueError) as exc:
            log.warning("cannot load the tokenizer of %s from %s: %s", model, directory, exc)
            self._dirs[model] = None
            self.counted_by[model] = "upstream"
            return None
        self._ready[model] = tok
        self.counted_by[model] = "local"
        if len(self._ready) > self._ready_max:
            self._ready.popitem(last=False)
        return tok

    def preload(self, models: list[str]) -> asyncio.Task[None]:
        """Load every served model's tokenizer once, before the first request needs it,
        then compare its counts with the upstream's own /tokenize (the parity check).

        The models are marked as being probed at once, before the task runs: a request
        for one of them then waits for its probes (`probed`) rather than clamp with a
        count its probes may find off.  However the task ends (cancelled before it ran
        too), no request waits for it any longer.
        """
        events = {model: asyncio.Event() for model in models}
        until = asyncio.get_running_loop().time() + PROBE_WAIT_S
        self._probing.update({model: (event, until) for model, event in events.items()})

        def done(_: asyncio.Task[None]) -> None:
            for model, event in events.items():
                event.set()
                if self._probing.get(model, (None, 0.0))[0] is event:
                    del self._probing[model]

        task = asyncio.ensure_future(self._preload(models, events))
        task.add_done_callback(done)
        return task

    async def _preload(self, models: list[str], events: dict[str, asyncio.Event]) -> None:
        for model in models:
            await self._preload_one(model)
            events[model].set()

    async def _preload_one(self, model: str) -> None:
        """One model's tokenizer loaded and, when asked for, its counts probed."""
        tok = await self.tokenizer(model)
        log.info(
            "model %s: tokenizer %s%s",
            model,
            tok.source_dir if tok is not None else "not found locally; counting via upstream /tokenize",
            _loader_note(tok) if tok is not None else "",
        )
        if tok is not None and tok.piece_fallback:
            log.info("model %s: counting whole prompts (no per-piece cache): %s", model, tok.piece_fallback)
        if tok is not None and self._config.tokenizers.parity_check:
            # vLLM's /tokenize renders the HF template even for gpt-oss, whose chats
            # it renders with harmony: those probes are checked against usage instead.
            by_tokenize = tok.family != "harmony"
            result = await (self.parity_check(model, tok) if by_tokenize else self.parity_by_usage(model, tok))
            trust = self.trust(model)
            self._changed(trust, trust.probes(result, by_tokenize=by_tokenize))
            if result is not None:
                for callback in self.on_parity:
                    callback(model, result)

    async def parity_check(self, model: str, tok: CountingModel) -> bool | None:
        """Count a few built-in conversations locally and with the upstream's /tokenize.

        True: every probe matched. False: a mismatch (logged as a warning naming
        the model: a wrong tokenizer directory or chat template would make every
        clamp wrong), which includes one side refusing a probe the other counts.
        None: nothing could be compared (no usable /tokenize, not vLLM; or both
        sides refused every probe).
        """
        mismatches = []
        compared = 0
        upstream = self._upstream(model)
        for name, probe in PARITY_PROBES.items():
            try:
                local: int | None = await asyncio.to_thread(tok.count_chat, probe)
            except CountError:
                local = None      # the template cannot render this probe (e.g. no tool support)
            except MediaNotCountable:
                continue          # a model brimful counts no images for: the upstream counts those
            try:
                status, answer = await upstream.post_json(
                    "/tokenize", {"model": model, "add_generation_prompt": True, **probe}
                )
            except errors.BrimfulError:
                return None
            if status == 404:
                return None
            theirs = answer.get("count") if status == 200 and isinstance(answer, dict) else None
            if status >= 500 or (status == 200 and not isinstance(theirs, int)):
                continue          # the upstream failed, not the probe: nothing learnt
            if local is None and theirs is None:
                continue          # both refuse it: they agree, but nothing was counted
            compared += 1
            if local != theirs:
                shown = [("refused" if c is None else str(c)) for c in (local, theirs)]
                mismatches.append(f"{name}: brimful {shown[0]}, upstream {shown[1]}")
        if mismatches:
            log.warning(
                "model %s: brimful's token counts differ from the upstream's /tokenize (%s); check the "
                "tokenizer directory %s and the chat template vLLM serves with",
                model, "; ".join(mismatches), tok.source_dir,
            )
            return False
        if compared == 0:
            log.warning("model %s: no start-up probe could be compared with the upstream's /tokenize", model)
            return None
        log.info("model %s: token counts match the upstream's /tokenize (%d probes)", model, compared)
        return True

    async def parity_by_usage(self, model: str, tok: CountingModel) -> bool | None:
        """The probes as one-token chat completions, their usage against brimful's count.

        For models whose /tokenize does not render what the chat renders; costs
        one prefill and one generated token per probe, once per model.
        """
        upstream = self._upstream(model)
        mismatches = []
        compared = 0
        for name, probe in PARITY_PROBES.items():
            try:
                local: int | None = await asyncio.to_thread(tok.count_chat, probe)
            except CountError:
                local = None
            except MediaNotCountable:
                continue
            try:
                status, answer = await upstream.post_json(
                    "/v1/chat/completions", {"model": model, "max_tokens": 1, **probe})
            except errors.BrimfulError:
                return None
            usage = answer.get("usage") if status == 200 and isinstance(answer, dict) else None
            theirs = usage.get("prompt_tokens") if isinstance(usage, dict) else None
            if status >= 500 or (status == 200 and not isinstance(theirs, int)):
                continue
            if local is None and theirs is None:
                continue
            compared += 1
            if local != theirs:
                mismatches.append(f"{name}: brimful {local}, upstream usage {theirs}")
        if mismatches:
            log.warning("model %s: brimful's token counts differ from the upstream's usage (%s)",
                        model, "; ".join(mismatches))
            return False
        if compared == 0:
            return None
        log.info("model %s: token counts match the upstream's usage (%d probes)", model, compared)
        return True

    # -- counting -------------------------------------------------------------

    async def probed(self, model: str) -> None:
        """Once `model`'s start-up probes are done, or `PROBE_WAIT_S` after they began: called once
        per request, before it takes a slot of the upstream's gate."""
        probing = self._probing.get(model)
        if probing is None or probing[0].is_set():
            return
        left = probing[1] - asyncio.get_running_loop().time()
        if left > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(probing[0].wait(), left)

    async def count(self, model: str, surface: Surface, body: dict[str, Any], body_size: int,
                    max_model_len: int | None = None, *, may_go_uncounted: bool = True) -> Count:
        """The request's prompt tokens, one figure per prompt: locally, else by the upstream.

        With `max_model_len`, a prompt over vLLM's character bound is refused
        before it is encoded. `may_go_uncounted`: media neither side can count leave the
        request uncounted (it is forwarded as it is); False where the count is the answer
        (count_tokens), which then fails as the upstream's count failed.
        """
        tok = await self.tokenizer(model)
        trust = self.trust(model)
        if tok is None:
            try:
                counted = await self._count_upstream(model, surface, body)
            except errors.BrimfulError as exc:
                if exc.status >= 500 or not may_go_uncounted:
                    raise
                # /tokenize takes other fields than the route does: the route's own vLLM
                # serves the request, or refuses it in its own words.
                return Count([], False, 0, "upstream", uncounted=TOKENIZE_REFUSED)
            return Count(counted, trust.exact, trust.margin, "upstream")
        if max_model_len is not None and surface.operator_truncates(self._policy(model)):
            max_model_len = None        # brimful has vLLM truncate instead: no character bound
        try:
            local = await self._count_local(tok, surface, body, body_size, max_model_len)
        except MediaNotCountable as exc:
            if not may_go_uncounted:
                return Count(await self._count_upstream(model, surface, body), True, 0, "upstream")
            return await self._count_media_upstream(model, surface, body, exc)
        if trust.mode == "upstream":
            try:
                counted = await self._count_upstream(model, surface, body)
            except errors.BrimfulError:
                # /tokenize unavailable, or refusing what the route may serve (it takes other
                # fields): the local count, held for what it is, not exact (so no refusal on it).
                return Count(local, False, max(trust.under_now, 1), "local")
            self._changed(trust, trust.shadow(sum(local), sum(counted)))
            return Count(counted, True, 0, "upstream")
        return Count(local, trust.exact, trust.margin, "local")

    def _policy(self, model: str) -> Policy:
        """`Config.policy_for`, worked out once per model (~2 % of a small request's CPU each time)."""
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = self._config.policy_for(model)
        return policy

    async def _count_media_upstream(self, model: str, surface: Surface, body: dict[str, Any],
                                    exc: MediaNotCountable) -> Count:
        """Media brimful cannot count: vLLM's /tokenize runs the model's multimodal
        processor and is exact; if it cannot answer, the request goes uncounted (never a 400)."""
        try:
            return Count(await self._count_upstream(model, surface, body), True, 0, "upstream")
        except errors.BrimfulError:
            return Count([], False, 0, "local", uncounted=exc.reason)

    async def _count_local(self, tok: CountingModel, surface: Surface, body: dict[str, Any],
                           body_size: int, max_model_len: int | None) -> list[int]:
        try:
            if body_size > self._config.tokenizers.offload_above_bytes:
                result = await self._count_long(tok, surface, body, body_size, max_model_len)
            else:
                result = await self._small_counts.call(functools.partial(surface.count, tok, body))
        except CountError as exc:
            raise surface.invalid_prompt(exc, body) from None
        return [result] if isinstance(result, int) else list(result)

    async def _count_long(self, tok: CountingModel, surface: Surface, body: dict[str, Any], body_size: int,
                          max_model_len: int | None) -> int | list[int]:
        """A long prompt, on the counting threads: the character bound, then the encode within the budget.

        A prompt's text cannot be over the bound unless its body is at least
        about half as long (a chat template adds little), so smaller bodies
        skip rendering it twice.
        """
        pool = _long_prompt_pool()
        factor = max_chars_per_token(tok)
        bound = char_bound(max_model_len, factor, body) if max_model_len is not None and factor else None
        trim = body_size > TRIM_ABOVE_BYTES
        if bound is not None and max_model_len is not None and body_size * 2 > bound:
            # Within the budget too: preparing 10^6 messages for the render costs memory by the body.
            await self._count_within_budget(
                body_size * RENDER_BYTES_PER_BODY_BYTE,
                functools.partial(_check_and_trim, surface, tok, body, bound, max_model_len, trim), 0)
        slices = surface.count_slices(body, self.slice_bytes)
        if slices is None:
            return await self._count_within_budget(body_size * COUNT_BYTES_PER_BODY_BYTE,
                                                   functools.partial(surface.count, tok, body),
                                                   body_size if trim else 0)
        # Many inputs: one slice at a time, each taking its own share of the budget, so one
        # request of 10^6 inputs never holds the whole budget while others wait (issue 25).
        counts: list[int] = []
        for piece in slices:
            counts.extend(await self._count_within_budget(piece.size * COUNT_BYTES_PER_BODY_BYTE,
                                                          functools.partial(piece.count, tok), 0))
        if trim:
            await _in_thread(pool, heap_trimmer.request)
        return counts

    @property
    def slice_bytes(self) -> int:
        """The request bytes one slice of a many-input count stands for: an eighth of the budget."""
        return max(4096, self.budget.limit // (COUNT_BYTES_PER_BODY_BYTE * SLICES_PER_BUDGET))

    async def _count_within_budget(self, weight: int, count: Callable[[], _T], trim_bytes: int) -> _T:
        """`count()` on a counting thread, holding `weight` bytes of the budget while it runs; then
        the heap handed back for a body of `trim_bytes` (0: not) as `_call_and_trim` decides."""
        weight = await self.budget.acquire(weight)
        done = _long_prompt_pool().submit(_call_and_trim, count, trim_bytes)
        # The budget is returned when the thread is done, not when this await
        # ends: a client gone mid-count does not stop the encode.
        loop = asyncio.get_running_loop()
        done.add_done_callback(lambda _: loop.call_soon_threadsafe(self.budget.release, weight))
        return await asyncio.wrap_future(done)

    def _upstream(self, model: str) -> Upstream:
        backend = self._backends.for_model(model) or self._backends.default
        return backend.upstream

    async def _count_upstream(self, model: str, surface: Surface, body: dict[str, Any]) -> list[int]:
        """Ask the upstream for the count: vLLM's /tokenize (exact; it does not enforce max_model_len)
        or the surface's own counting route."""
        upstream = self._upstream(model)
        counts: list[int] = []
        try:
            calls = surface.tokenize_calls(model, body)
        except CountError as exc:
            raise surface.invalid_prompt(exc, body) from None
        for call in calls:
            if isinstance(call, int):
                counts.append(call)
                continue
            status, answer = await upstream.post_json(call.path, call.body)
            if status == 200 and isinstance(answer, dict) and isinstance(answer.get(call.field), int):
                counts.append(answer[call.field])
                continue
            message = _message_of(answer) or f"HTTP {status}"
            if 400 <= status < 500:
                raise errors.invalid_prompt(
                    f"The upstream could not tokenize this request: {message}", surface.prompt_param
                )
            raise errors.upstream_not_ready(upstream.public_url, status, f"{call.path} failed: {message}")
        return counts


def _tool(name: str, description: str, strict: bool | None = None, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
                       "additionalProperties": False},
    }
    if strict is not None:
        function["strict"] = strict
    return {"type": "function", "function": function, **extra}


# A 27x29 PNG (data URL): a size that is not a multiple of any patch grid.
_PROBE_IMAGE = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAABsAAAAdCAIAAADU74AfAAAAJ0lEQVR4nGPUqDjBQFXARF3jRk0cNXHU"
                "xFETR00cNXHUxFETB62JACQeAaLILPZmAAAAAElFTkSuQmCC")

# Built-in conversations for the start-up parity check: the shapes real traffic
# has (a system prompt, tools as the Agents SDK and LlamaIndex send them, with
# `strict` true and false and `defer_loading`, text parts, a tool round trip,
# non-ASCII text, a developer message with reasoning in the history, an image
# for the models whose images brimful counts, a system message that is not
# first).  Where a template cannot render one, the upstream must refuse it too,
# else it is a mismatch (parity_check).
PARITY_PROBES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "Hello! How are you today?"}]},
    "system": {"messages": [{"role": "system", "content": "You are a careful assistant. Answer briefly."},
                            {"role": "user", "content": "What is the capital of France?"}]},
    "tools_strict": {
        "messages": [{"role": "user", "content": "Weather in Seoul?"}],
        "tools": [_tool("get_weather", "Current weather for a city", strict=True),
                  _tool("get_forecast", "Forecast for a city", strict=False, defer_loading=True)],
    },
    "parts": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be terse."}, {"type": "text", "text": "No lists."}]},
        {"role": "user", "content": [{"type": "text", "text": "Describe rain."}, {"type": "text", "text": "Briefly."}]},
    ]},
    "tool_loop": {
        "messages": [
            {"role": "user", "content": "Weather in Seoul?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21, "sky": "clear"}'},
            {"role": "user", "content": "And tomorrow?"},
        ],
        "tools": [_tool("get_weather", "Current weather for a city", strict=True)],
    },
    "multi_turn": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "세종대왕이 한글을 만든 이유는? 🐶 漢字, café, naïve, e\u0301"},
            {"role": "assistant", "content": "To make reading easy for everyone."},
            {"role": "user", "content": "Thanks!"},
        ]
    },
    "developer_reasoning": {"messages": [
        {"role": "developer", "content": "Prefer metric units."},
        {"role": "user", "content": "How far is a marathon?"},
        {"role": "assistant", "content": "About 42 km.", "reasoning": "The marathon is 42.195 km."},
        {"role": "user", "content": "In miles?"},
    ]},
    "image": {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this image?"},
        {"type": "image_url", "image_url": {"url": _PROBE_IMAGE}},
    ]}]},
    "system_not_first": {"messages": [
        {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Hello."},
        {"role": "system", "content": "From now on answer in French."},
        {"role": "user", "content": "How are you?"},
    ]},
}


def _call_and_trim(count: Callable[[], _T], trim_bytes: int) -> _T:
    """`count()`, then the heap handed back after a body of `trim_bytes` (0: not), unless the count
    is known to have encoded little: a conversation whose earlier turns were counted before encodes
    only its new pieces (tokenizer_cache's meter), and trimming after each turn cost more than the
    count.  What such counts free (the parsed and rendered conversation, in each counting thread's
    arena) is handed back once TRIM_EVERY_BYTES of their bodies have gone by untrimmed."""
    global _untrimmed_bytes
    start_encode_meter()
    try:
        return count()
    finally:
        if trim_bytes:
            encoded = encoded_chars()
            if encoded is not None and encoded <= TRIM_ABOVE_BYTES and _untrimmed_bytes < TRIM_EVERY_BYTES:
                _untrimmed_bytes += trim_bytes
            else:
                _untrimmed_bytes = 0
                heap_trimmer.request()


def _check_and_trim(surface: Surface, tok: CountingModel, body: dict[str, Any], bound: int, max_model_len: int,
                    trim: bool) -> None:
    try:
        check_char_bound(surface, tok, body, bound, max_model_len)
    except BrimfulError:
        if trim:
            heap_trimmer.request()      # the rendered text of a huge prompt, gone
        raise


async def _in_thread(pool: concurrent.futures.Executor, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _message_of(answer: Any) -> str | None:
    if isinstance(answer, dict):
        err = answer.get("error")
        if isinstance(err, dict) and isinstance(message := err.get("message"), str):
            return message
        if isinstance(message := answer.get("message"), str):
            return message
        if isinstance(detail := answer.get("detail"), str):
            return detail
    return None
