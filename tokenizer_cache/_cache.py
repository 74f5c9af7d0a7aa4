"""A bounded, thread-safe LRU of loaded ModelTokenizers.

Loading a tokenizer costs about half a second and tens of MB, so each model
directory is loaded once and kept; the bound keeps a proxy that sees many
model names from growing without limit.  Concurrent first requests for the
same directory wait for one load instead of each loading their own copy;
different directories load in parallel (the lock is not held while loading).

The models loaded here share one `PieceCountCache` (per-piece token counts,
so a resent conversation only encodes what is new); `piece_cache_entries=0`
turns it off.  `engine` chooses the encoder as `load_model_tokenizer` does
("auto": the fast engine wherever it passes its self-check); the models
also share one `ChatCountCache` (`chat_cache_entries=0` turns it off).
"""

from __future__ import annotations

import functools
import os
import pathlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future

from ._chat_cache import DEFAULT_MAX_ENTRIES as DEFAULT_CHAT_ENTRIES
from ._chat_cache import ChatCountCache
from ._family import check_tokenizer_mode
from ._loader import AUTO, check_loader
from ._model import folder_signature, load_model_tokenizer
from ._piece_cache import DEFAULT_MAX_ENTRIES, PieceCountCache
from ._protocol import CountingModel

_Key = tuple[pathlib.Path, str, str, str | None, tuple[tuple[str, int, int], ...]]
Loader = Callable[..., CountingModel]  # (directory[, tokenizer_mode=, tokenizer_loader=, name_or_path=]) -> model


class TokenizerCache:
    """`get(directory, tokenizer_mode)` → the counter for that directory, loaded at most once while cached.

    `tokenizer_mode` is vLLM's `--tokenizer-mode` for the model ("auto", the
    default, "hf" or "mistral"); `tokenizer_loader` the rules that build its
    tokenizer (`_loader`: "auto", "transformers5", "tokenizer_json").  The
    same folder under two modes or loaders is two entries.
    """

    def __init__(
        self,
        max_entries: int = 8,
        *,
        loader: Loader | None = None,
        piece_cache_entries: int = DEFAULT_MAX_ENTRIES,
        engine: str = "auto",
        chat_cache_entries: int = DEFAULT_CHAT_ENTRIES,
    ) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if piece_cache_entries < 0 or chat_cache_entries < 0:
            raise ValueError("piece_cache_entries and chat_cache_entries must be 0 (off) or more")
        self.max_entries = max_entries
        # One table for every model: the digests are keyed by tokenizer.
        self.piece_cache = PieceCountCache(piece_cache_entries) if piece_cache_entries else None
        # Chat counts by exact template inputs (repeated requests skip rendering).
        self.chat_cache = ChatCountCache(chat_cache_entries) if chat_cache_entries else None
        if loader is None:
            loader = functools.partial(
                load_model_tokenizer, piece_cache=self.piece_cache, engine=engine, chat_cache=self.chat_cache
            )
        self._loader = loader
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Key, CountingModel] = OrderedDict()
        self._loading: dict[_Key, Future[CountingModel]] = {}

    def get(
        self, directory: str | os.PathLike[str], tokenizer_mode: str = "auto", tokenizer_loader: str = AUTO,
        name_or_path: str | None = None,
    ) -> CountingModel:
        """`name_or_path`: the name transformers is to see, when not this folder (`load_model_tokenizer`)."""
        path = pathlib.Path(directory).expanduser().resolve()
        # The files' sizes and times too: a folder whose template or tokenizer was replaced
        # (vLLM restarted on it) is loaded again, not answered from memory.
        key = (path, check_tokenizer_mode(tokenizer_mode), check_loader(tokenizer_loader), name_or_path,
               folder_signature(path))
        with self._lock:
            cached = self._entries.get(key)
            if cached is not None:
                self._entries.move_to_end(key)
                return cached
            pending = self._loading.get(key)
            owner = pending is None
            if owner:
                pending = Future()
                self._loading[key] = pending
        assert pending is not None
        if not owner:
            return pending.result()  # re-raises the loader's exception
        try:
            # Defaults keep the one-argument call custom loaders know.
            options = {name: value for name, value in (("tokenizer_mode", key[1]), ("tokenizer_loader", key[2]),
                                                       ("name_or_path", key[3])) if value not in ("auto", None)}
            model = self._loader(key[0], **options)
        except BaseException as exc:
            with self._lock:
                del self._loading[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            for stale in [k for k in self._entries if k[:4] == key[:4]]:
                del self._entries[stale]        # the same folder as its files were before
            self._entries[key] = model
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            del self._loading[key]
        pending.set_result(model)
        return model

    def __contains__(self, directory: str | os.PathLike[str]) -> bool:
        path = pathlib.Path(directory).expanduser().resolve()
        with self._lock:
            return any(key[0] == path for key in self._entries)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
