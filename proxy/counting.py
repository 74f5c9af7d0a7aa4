"""Prompt-token counting for a request, wherever the tokenizer lives.

Per model, the tokenizer directory is, in order: the config's
`models."name".tokenizer`; the `root` that `/v1/models` reports when it is a
readable local directory (vLLM and headroom sharing a volume); a Hugging Face
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
  (`proxy.gate.MemoryBudget`, weighed at COUNT_BYTES_PER_BODY_BYTE per body
  byte); the excess waits up to `upstream.queue_timeout`, then gets 503;
* after a count above TRIM_ABOVE_BYTES the freed heap is handed back to the
  OS (`malloc_trim`): without it 4.1 GiB stayed resident 80 s after the count.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import ctypes.util
import json
import logging
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from tokenizer_cache import CountError, ModelTokenizer, PieceCountCache, TokenizerCache, find_tokenizer_dir

from . import errors
from .backends import Backends
from .config import Config
from .errors import HeadroomError
from .gate import MemoryBudget
from .models import ModelInfo
from .surfaces import Surface
from .trust import CountTrust
from .upstream import Upstream

log = logging.getLogger("headroom.counting")


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
            max_workers=min(32, (os.cpu_count() or 1) + 4), thread_name_prefix="headroom-count",
            initializer=_lower_thread_priority,
        )
    return _pool


# RSS an encode costs per byte of request body: the top of the measured
# 95-240 MiB per MB, rounded up, so the budget is not overrun by symbol-dense text.
COUNT_BYTES_PER_BODY_BYTE = 256
# Counts (and refusals) of larger bodies give their freed heap back: malloc_trim
# took 1.7 ms after a 250 KB prompt, 10.6 ms after 4 MB, on the counting thread.
TRIM_ABOVE_BYTES = 128 * 1024
_libc: Any = None


def _trim_heap() -> None:
    """glibc's malloc_trim(0): return freed memory of every arena to the OS (a few ms; no-op elsewhere)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    trim = getattr(_libc, "malloc_trim", None) if _libc else None
    if trim is not None:
        trim(0)


# -- vLLM's character bound ------------------------------------------------------------

_FACTORS: weakref.WeakKeyDictionary[ModelTokenizer, int] = weakref.WeakKeyDictionary()


def max_chars_per_token(tok: ModelTokenizer) -> int:
    """vLLM's factor: the longest token of the vocabulary, in characters.

    vLLM 0.32 takes `max(len(tok) for tok in tokenizer.get_vocab())`
    (vllm/tokenizers/hf.py); transformers' vocabulary is tokenizer.json's with
    its added tokens, plus tokens tokenizer_config.json declares.  The
    tokenizer's own `max_chars_per_token` is used when it has one; otherwise
    it is computed here, over that same set (a token too many can only raise
    the bound, never refuse a prompt vLLM would take).
    """
    own = getattr(tok, "max_chars_per_token", None)
    if isinstance(own, int):
        return own
    found = _FACTORS.get(tok)
    if found is None:
        found = max((len(t) for t in tok.tokenizer.get_vocab(with_added_tokens=True)), default=0)
        found = max([found, *map(len, _config_token_texts(tok.source_dir))])
        _FACTORS[tok] = found
    return found


def _config_token_texts(directory: Path) -> list[str]:
    try:
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    if not isinstance(config, dict):
        return []
    values: list[Any] = []
    decoder = config.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        values += decoder.values()
    values += [config.get(key) for key in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                                           "cls_token", "mask_token")]
    for key in ("additional_special_tokens", "extra_special_tokens"):
        more = config.get(key)
        values += list(more.values()) if isinstance(more, dict) else more if isinstance(more, list) else []
    texts = []
    for value in values:
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            texts.append(text)
    return texts


def char_bound(max_model_len: int, chars_per_token: int, body: dict[str, Any]) -> int | None:
    """The most characters vLLM 0.32 lets a prompt have, or None when it does not refuse by characters.

    renderers/params.py `_text_len_check`: max_input_tokens (= max_model_len)
    x max_chars_per_token, unless the request asks for truncate_prompt_tokens
    (then vLLM truncates instead).  Pure.
    """
    if body.get("truncate_prompt_tokens") is not None:
        return None
    return max_model_len * chars_per_token


def check_char_bound(surface: Surface, tok: ModelTokenizer, body: dict[str, Any], bound: int,
                     max_model_len: int) -> None:
    """Refuse, as vLLM would, a prompt text longer than `bound` characters (before encoding it)."""
    for text in surface.prompt_texts(tok, body):
        if len(text) > bound:
            raise errors.prompt_over_char_bound(len(text), bound, max_model_len, surface.prompt_param)


def _counting_busy(limit: int, waited: float) -> HeadroomError:
    return errors.counting_busy(limit, waited)


@dataclass(frozen=True)
class Count:
    """A request's prompt tokens, one figure per prompt, and how far they can be trusted."""

    per_prompt: list[int]
    exact: bool = True          # the upstream's count (see proxy.trust)
    margin: int = 0             # tokens to hold back when not exact
    source: Literal["local", "upstream"] = "local"

    @property
    def total(self) -> int:
        return sum(self.per_prompt)


class PromptCounter:
    def __init__(self, config: Config, backends: Backends) -> None:
        self._config = config
        self._backends = backends
        self._cache = TokenizerCache(
            max_entries=config.tokenizers.cache_size,
            piece_cache_entries=config.tokenizers.piece_cache_entries,
        )
        self._dirs: dict[str, Path | None] = {}
        # model -> its loaded tokenizer: the per-request lookup then needs no worker
        # thread (asyncio.to_thread + TokenizerCache.get's Path.resolve() were ~20 %
        # of headroom's CPU per small request, profiled at 64 connections).
        # Bounded like the cache itself; cleared when the model list changes.
        self._ready: OrderedDict[str, ModelTokenizer] = OrderedDict()
        self._ready_max = config.tokenizers.cache_size
        self._hf_home = config.tokenizers.hf_home or os.environ.get("HF_HOME")
        self.on_parity: list[Callable[[str, bool], None]] = []
        self.on_trust: list[Callable[[CountTrust], None]] = []
        self._trust: dict[str, CountTrust] = {}
        # model -> how it is counted once its tokenizer was looked for: "local"
        # (loaded) or "upstream" (POST /tokenize).  Kept across model-list
        # changes, so a refresh does not make a known model "pending" again
        # (GET /ready reads it).
        self.counted_by: dict[str, str] = {}
        self.budget = MemoryBudget(config.tokenizers.count_memory_bytes, config.upstream.queue_timeout,
                                   _counting_busy)

    # -- where each model's tokenizer is -------------------------------------

    def tokenizer_dir(self, model: str) -> Path | None:
        if model in self._dirs:
            return self._dirs[model]
        found = self._resolve(model, seen=set())
        self._dirs[model] = found
        return found

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

    def forget_dirs(self) -> None:
        """Called when the upstream's model list changes: roots may have moved, and
        what was learnt about each model's count starts again with its new probes."""
        self._dirs.clear()
        self._ready.clear()
        self._trust.clear()

    # -- how far each model's count is trusted (proxy.trust) -------------------

    def trust(self, model: str) -> CountTrust:
        found = self._trust.get(model)
        if found is None:
            found = self._trust[model] = CountTrust(model)
        return found

    def trust_states(self) -> dict[str, CountTrust]:
        return dict(self._trust)

    def answered(self, model: str, counted: int, reported: int) -> None:
        """The upstream's usage for a request counted with `counted` tokens."""
        trust = self.trust(model)
        self._changed(trust, trust.answered(counted, reported))

    def _changed(self, trust: CountTrust, change: str | None) -> None:
        if change is None:
            return
        log.warning("model %s: %s", trust.model, change)
        for callback in self.on_trust:
            callback(trust)

    async def tokenizer(self, model: str) -> ModelTokenizer | None:
        ready = self._ready.get(model)
        if ready is not None:
            return ready
        directory = self.tokenizer_dir(model)
        if directory is None:
            self.counted_by[model] = "upstream"
            return None
        try:
            tok = await asyncio.to_thread(self._cache.get, directory)
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

    async def preload(self, models: list[str]) -> None:
        """Load every served model's tokenizer once, before the first request needs it,
        then compare its counts with the upstream's own /tokenize (the parity check)."""
        for model in models:
            tok = await self.tokenizer(model)
            log.info(
                "model %s: tokenizer %s",
                model,
                tok.source_dir if tok is not None else "not found locally; counting via upstream /tokenize",
            )
            if tok is not None and tok.piece_fallback:
                log.info("model %s: counting whole prompts (no per-piece cache): %s", model, tok.piece_fallback)
            if tok is not None and self._config.tokenizers.parity_check:
                result = await self.parity_check(model, tok)
                trust = self.trust(model)
                self._changed(trust, trust.probes(result))
                if result is not None:
                    for callback in self.on_parity:
                        callback(model, result)

    async def parity_check(self, model: str, tok: ModelTokenizer) -> bool | None:
        """Count a few built-in conversations locally and with the upstream's /tokenize.

        True: every count matched. False: a mismatch (logged as a warning naming
        the model: a wrong tokenizer directory or chat template would make every
        clamp wrong). None: the upstream has no usable /tokenize (not vLLM).
        """
        mismatches = []
        upstream = self._upstream(model)
        for name, probe in PARITY_PROBES.items():
            try:
                local = await asyncio.to_thread(tok.count_chat, probe)
            except CountError:
                continue  # the template cannot render this probe (e.g. no tool support)
            try:
                status, answer = await upstream.post_json(
                    "/tokenize", {"model": model, "add_generation_prompt": True, **probe}
                )
            except errors.HeadroomError:
                return None
            if status == 404:
                return None
            if status != 200 or not isinstance(answer, dict) or not isinstance(answer.get("count"), int):
                continue
            if answer["count"] != local:
                mismatches.append(f"{name}: headroom {local}, upstream {answer['count']}")
        if mismatches:
            log.warning(
                "model %s: headroom's token counts differ from the upstream's /tokenize (%s); check the "
                "tokenizer directory %s and the chat template vLLM serves with",
                model, "; ".join(mismatches), tok.source_dir,
            )
            return False
        log.info("model %s: token counts match the upstream's /tokenize", model)
        return True

    # -- counting -------------------------------------------------------------

    async def count(self, model: str, surface: Surface, body: dict[str, Any], body_size: int,
                    max_model_len: int | None = None) -> Count:
        """The request's prompt tokens, one figure per prompt: locally, else by the upstream.

        With `max_model_len`, a prompt over vLLM's character bound is refused
        before it is encoded.
        """
        tok = await self.tokenizer(model)
        trust = self.trust(model)
        if tok is None:
            counted = await self._count_upstream(model, surface, body)
            return Count(counted, trust.exact, trust.margin, "upstream")
        local = await self._count_local(tok, surface, body, body_size, max_model_len)
        if trust.mode == "upstream":
            try:
                counted = await self._count_upstream(model, surface, body)
            except errors.HeadroomError as exc:
                if exc.status < 500:
                    raise      # /tokenize refused the request: vLLM's chat would refuse it too
                # /tokenize unavailable: the local count, held for what it is, not exact.
                return Count(local, False, max(trust.max_under, 1), "local")
            self._changed(trust, trust.shadow(sum(local), sum(counted)))
            return Count(counted, True, 0, "upstream")
        return Count(local, trust.exact, trust.margin, "local")

    async def _count_local(self, tok: ModelTokenizer, surface: Surface, body: dict[str, Any],
                           body_size: int, max_model_len: int | None) -> list[int]:
        try:
            if body_size > self._config.tokenizers.offload_above_bytes:
                result = await self._count_long(tok, surface, body, body_size, max_model_len)
            else:
                result = surface.count(tok, body)
        except CountError as exc:
            raise errors.invalid_prompt(exc.message, getattr(exc, "param", None) or surface.prompt_param) from None
        return [result] if isinstance(result, int) else list(result)

    async def _count_long(self, tok: ModelTokenizer, surface: Surface, body: dict[str, Any], body_size: int,
                          max_model_len: int | None) -> int | list[int]:
        """A long prompt, on the counting threads: the character bound, then the encode within the budget.

        A prompt's text cannot be over the bound unless its body is at least
        about half as long (a chat template adds little), so smaller bodies
        skip rendering it twice.
        """
        pool = _long_prompt_pool()
        bound = char_bound(max_model_len, max_chars_per_token(tok), body) if max_model_len is not None else None
        trim = body_size > TRIM_ABOVE_BYTES
        if bound is not None and max_model_len is not None and body_size * 2 > bound:
            await _in_thread(pool, _check_and_trim, surface, tok, body, bound, max_model_len, trim)
        weight = await self.budget.acquire(body_size * COUNT_BYTES_PER_BODY_BYTE)
        done = pool.submit(_count_and_trim, surface, tok, body, trim)
        # The budget is returned when the thread is done, not when this await
        # ends: a client gone mid-count does not stop the encode.
        loop = asyncio.get_running_loop()
        done.add_done_callback(lambda _: loop.call_soon_threadsafe(self.budget.release, weight))
        return await asyncio.wrap_future(done)

    def _upstream(self, model: str) -> Upstream:
        backend = self._backends.for_model(model) or self._backends.default
        return backend.upstream

    async def _count_upstream(self, model: str, surface: Surface, body: dict[str, Any]) -> list[int]:
        """Ask vLLM's /tokenize for the count (exact; it does not enforce max_model_len)."""
        upstream = self._upstream(model)
        counts: list[int] = []
        for call in surface.tokenize_calls(model, body):
            if isinstance(call, int):
                counts.append(call)
                continue
            status, answer = await upstream.post_json("/tokenize", call)
            if status == 200 and isinstance(answer, dict) and isinstance(answer.get("count"), int):
                counts.append(answer["count"])
                continue
            message = _message_of(answer) or f"HTTP {status}"
            if 400 <= status < 500:
                raise errors.invalid_prompt(
                    f"The upstream could not tokenize this request: {message}", surface.prompt_param
                )
            raise errors.upstream_not_ready(upstream.public_url, status, f"/tokenize failed: {message}")
        return counts


_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}

# Built-in conversations for the start-up parity check: plain, multi-turn with
# non-ASCII text, and one with tools (the shape most likely to differ).
PARITY_PROBES: dict[str, dict[str, Any]] = {
    "plain": {"messages": [{"role": "user", "content": "Hello! How are you today?"}]},
    "multi_turn": {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "세종대왕이 한글을 만든 이유는? 🐶"},
            {"role": "assistant", "content": "To make reading easy for everyone."},
            {"role": "user", "content": "Thanks!"},
        ]
    },
    "tools": {"messages": [{"role": "user", "content": "Weather in Seoul?"}], "tools": [_WEATHER_TOOL]},
}


def _count_and_trim(surface: Surface, tok: ModelTokenizer, body: dict[str, Any], trim: bool) -> int | list[int]:
    try:
        return surface.count(tok, body)
    finally:
        if trim:
            _trim_heap()


def _check_and_trim(surface: Surface, tok: ModelTokenizer, body: dict[str, Any], bound: int, max_model_len: int,
                    trim: bool) -> None:
    try:
        check_char_bound(surface, tok, body, bound, max_model_len)
    except HeadroomError:
        if trim:
            _trim_heap()            # the rendered text of a huge prompt, gone
        raise


async def _in_thread(pool: concurrent.futures.Executor, fn: Callable[..., Any], *args: Any) -> Any:
    return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _message_of(answer: Any) -> str | None:
    if isinstance(answer, dict):
        err = answer.get("error")
        if isinstance(err, dict) and isinstance(err.get("message"), str):
            return err["message"]
        if isinstance(answer.get("message"), str):
            return answer["message"]
        if isinstance(answer.get("detail"), str):
            return answer["detail"]
    return None
