"""Which models the upstream serves and each one's `max_model_len`.

The source is the upstream's own `GET /v1/models` (vLLM lists every served
model with `max_model_len`; LoRA adapters are listed without it and inherit
their base model's, named in `parent`).  Config overrides win.  The list is
fetched at start-up, retried in the background until the upstream answers
(vLLM takes tens of seconds to minutes to load), refreshed on an interval, and
refreshed at once (coalesced) when a request names a model not seen yet.

What the operator is told: while the upstream has never answered, one
warning saying what brimful waits for and how to point it elsewhere, then a
short reminder once a minute; when an upstream that answered stops, one
warning; when it answers again, one line saying so and for how long it was
gone.

`parse_models`, `waiting_message` and `outage_message` are pure;
`ModelRegistry` owns the I/O.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from proxy.config import Config
from proxy.errors import BrimfulError

log = logging.getLogger("brimful.models")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    max_model_len: int | None          # None: unknown (no card value and no override)
    root: str | None = None            # vLLM's `root`: the local path or hub id it loaded
    parent: str | None = None          # the base model of a LoRA adapter
    source: str = "upstream"           # where max_model_len came from: upstream | config | parent | fallback
    limit_problem: str | None = None   # why the card's own max_model_len could not be used


def _usable_limit(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def parse_models(payload: Any, overrides: Mapping[str, Any] | None = None,
                 fallback: int | None = None) -> dict[str, ModelInfo]:
    """Turn a `/v1/models` JSON body into ModelInfo per model id (ignores malformed cards).

    A card whose max_model_len is missing or not a positive whole number (0,
    -5, "4096") keeps no limit, says why in `limit_problem`, and gets
    `fallback` (upstream.fallback_max_model_len) when one is configured;
    a config override wins over everything.
    """
    cards = payload.get("data") if isinstance(payload, dict) else None
    if not isinstance(cards, list):
        raise ValueError("the /v1/models answer has no 'data' list")
    raw: dict[str, dict[str, Any]] = {}
    for card in cards:
        if isinstance(card, dict) and isinstance(card.get("id"), str):
            raw[card["id"]] = card
    result: dict[str, ModelInfo] = {}
    for name, card in raw.items():
        given = card.get("max_model_len")
        mml = _usable_limit(given)
        parent = card.get("parent") if isinstance(card.get("parent"), str) else None
        problem = None
        if mml is None:
            problem = ("its card has no max_model_len" if given is None else
                       f"its card's max_model_len {json.dumps(given)[:40]} is not a positive whole number")
        root = card.get("root") if isinstance(card.get("root"), str) else None
        result[name] = ModelInfo(name, mml, root, parent, "upstream", problem)
    # Overrides apply to the models this upstream serves; with several upstreams
    # a model is configured once, by name, and routed to whichever serves it.
    for name, override in (overrides or {}).items():
        value = getattr(override, "max_model_len", None)
        base = result.get(name)
        if value is not None and base is not None:
            result[name] = replace(base, max_model_len=value, source="config")
    # A LoRA adapter runs in its base model's engine: without a window of its own it has the
    # base's, from the base's card or from its [models] entry, before any fallback.
    for name, info in list(result.items()):
        base = result.get(info.parent) if info.parent is not None else None
        if info.max_model_len is None and base is not None and base.max_model_len is not None:
            result[name] = replace(info, max_model_len=base.max_model_len, source="parent",
                                   limit_problem=None)
    if fallback is not None:
        for name, info in list(result.items()):
            if info.max_model_len is None:
                result[name] = replace(info, max_model_len=fallback, source="fallback")
    return result


def waiting_message(name: str, url: str, error: str) -> str:
    """The one warning for an upstream that has not answered since start-up."""
    if name == "default":
        where = "--upstream URL, BRIMFUL_UPSTREAM_URL=URL, or url in the [upstream] section of the config file"
    else:
        where = f"the url of the [[upstreams]] entry named {name!r} in the config file"
    return (
        f"waiting for the upstream at {url} to answer GET /v1/models. {_sentence(error)} brimful retries "
        f"in the background; until it answers, requests get an explained 502/503 and GET /ready answers "
        f"503. If vLLM listens elsewhere, point brimful at it with {where}."
    )


def outage_message(url: str, error: str) -> str:
    """The one warning for an upstream that answered before and stopped."""
    return (
        f"the upstream at {url} stopped answering GET /v1/models. {_sentence(error)} brimful keeps "
        f"its last model list and retries in the background."
    )


def limit_warning(url: str, info: ModelInfo) -> str:
    """The one warning for a model whose card gives no usable max_model_len."""
    if info.source == "fallback":
        then = f"brimful uses upstream.fallback_max_model_len = {info.max_model_len} for it"
    else:
        then = (f'brimful cannot clamp its requests and forwards their completion limits untouched; set '
                f'models."{info.name}".max_model_len (or upstream.fallback_max_model_len) to its real limit')
    return f"model {info.name} at the upstream {url}: {info.limit_problem}, so {then}."


def _sentence(text: str) -> str:
    return text if text.endswith((".", "?", "!")) else text + "."


def describe_error(exc: BaseException) -> str:
    """A failure as one line: brimful's own errors are already sentences."""
    return str(exc) if isinstance(exc, BrimfulError) else f"{type(exc).__name__}: {exc}"


Fetch = Callable[[], Awaitable[Any]]


class ModelRegistry:
    """The served models, kept fresh from the upstream; safe to query from any request."""

    def __init__(self, config: Config, fetch_models: Fetch, *, url: str | None = None,
                 name: str = "default", fetch_version: Fetch | None = None) -> None:
        self._config = config
        self._fetch = fetch_models
        self._fetch_version = fetch_version
        # The upstream's `GET /version` ("0.32.0"), read with its first model list:
        # which transformers' tokenizer loader it uses (tokenizer_cache._loader).
        self.version: str | None = None
        self.url = url if url is not None else config.upstream.url     # for the operator's messages
        self.name = name
        self._failing_since: float | None = None
        self._models: dict[str, ModelInfo] = {}
        self._order: list[str] = []
        self._loaded = False
        self._refreshing: asyncio.Task[bool] | None = None
        self._last_attempt = 0.0
        self._task: asyncio.Task[None] | None = None
        self.last_error: str | None = None
        self.last_exception: BaseException | None = None
        self._last_warning = -math.inf
        self.on_change: list[Callable[[dict[str, ModelInfo]], None]] = []

    @property
    def loaded(self) -> bool:
        return self._loaded

    @property
    def names(self) -> list[str]:
        return list(self._order)

    def get(self, name: str) -> ModelInfo | None:
        return self._models.get(name)

    def default_model(self) -> str | None:
        """The model vLLM uses when a request names none: its first served (base) model."""
        for name in self._order:
            if self._models[name].parent is None:
                return name
        return self._order[0] if self._order else None

    async def refresh(self) -> bool:
        """Fetch /v1/models now (concurrent callers share one fetch); True when it succeeded."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self._refresh_once())
        return await asyncio.shield(self._refreshing)

    async def refresh_for_unknown(self, min_interval: float = 2.0) -> bool:
        """Refresh because a request named an unknown model, at most once per interval."""
        if time.monotonic() - self._last_attempt < min_interval and self._refreshing is not None:
            if not self._refreshing.done():
                return await asyncio.shield(self._refreshing)
            return False
        return await self.refresh()

    async def _refresh_once(self) -> bool:
        self._last_attempt = time.monotonic()
        try:
            payload = await self._fetch()
            models = parse_models(payload, self._config.models, self._config.upstream.fallback_max_model_len)
        except Exception as exc:  # any failure leaves the previous list in place
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.last_exception = exc
            self._tell_failure(exc)
            return False
        self._tell_recovery()
        self.last_error = None
        self.last_exception = None
        # The version on every list read: vLLM upgraded in place comes back with the same list,
        # and its tokenizer is built by another transformers (the loader's rules).
        known = self.version
        if self._fetch_version is not None:
            await self._read_version()
        changed = models != self._models or (self._loaded and self.version != known)
        self._models = models
        self._order = list(models)
        self._loaded = True
        if changed:
            for name, info in models.items():
                log.info("model %s: max_model_len=%s (%s)", name, info.max_model_len, info.source)
                if info.limit_problem is not None and info.source != "config":
                    log.warning(limit_warning(self.url, info))
            for callback in self.on_change:
                callback(models)
        return True

    async def _read_version(self) -> None:
        """`GET /version` (vLLM: {"version": "0.32.0"}); None when the upstream has no such route."""
        assert self._fetch_version is not None
        try:
            payload = await self._fetch_version()
        except Exception as exc:
            # Not vLLM, or too old: the loader falls back to vLLM 0.32's rules. A read that
            # fails once the version is known keeps it (a timeout is no upgrade).
            log.debug("upstream %s: no version (%s)", self.name, describe_error(exc))
            return
        version = payload.get("version") if isinstance(payload, dict) else None
        self.version = version if isinstance(version, str) else None

    def _tell_failure(self, exc: BaseException) -> None:
        """vLLM can take minutes to load: the explanation once, then a reminder once a minute."""
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = self._last_warning = now
            error = describe_error(exc)
            if self._loaded:
                log.warning(outage_message(self.url, error))
            else:
                log.warning(waiting_message(self.name, self.url, error))
        elif now - self._last_warning >= 60.0:
            self._last_warning = now
            log.warning("still no answer from the upstream at %s after %.0f s: %s",
                        self.url, now - self._failing_since, describe_error(exc))

    def _tell_recovery(self) -> None:
        if self._failing_since is None:
            return
        gone = time.monotonic() - self._failing_since
        self._failing_since = None
        self._last_warning = -math.inf
        if self._loaded:
            log.info("the upstream at %s answers GET /v1/models again, after %.0f s", self.url, gone)
        else:
            log.info("the upstream at %s answered GET /v1/models, after %.0f s of waiting", self.url, gone)

    def start(self) -> None:
        """Start the background loop: retry quickly until loaded, then refresh on the interval."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _loop(self) -> None:
        delay = 0.5
        while True:
            ok = await self.refresh()
            if ok:
                delay = 0.5
                await asyncio.sleep(self._config.upstream.models_refresh_interval)
            else:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
