"""Several upstreams, each serving one or more models, chosen by the request's `model`.

A `Backend` is one upstream server (`proxy.upstream.client.Upstream`) with the list of
models it serves (`proxy.upstream.models.ModelRegistry`, read from its own
`/v1/models`).  `Backends` routes a model name to the backend that serves it:
backends are asked in configuration order, the default `[upstream]` first, so
a model served twice with the same window goes to the first.  A model served
with different `max_model_len`s forms pools (`pools`), and each request goes to
the smallest that holds it (`proxy.upstream.pools`).  A single-upstream
deployment is the special case of one backend.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy import errors
from proxy.config import Config
from proxy.errors import BrimfulError
from proxy.upstream.client import Transport, Upstream
from proxy.upstream.gate import UpstreamGate
from proxy.upstream.models import ModelInfo, ModelRegistry


@dataclass
class Backend:
    name: str
    upstream: Upstream
    registry: ModelRegistry
    gate: UpstreamGate          # back-pressure: at most max_concurrent_requests in flight


class Backends:
    """`transport_for(url)` gives each upstream its transport (default: `proxy.upstream.http1.Pool`)."""

    def __init__(self, config: Config, transport_for: Callable[[str], Transport] | None = None) -> None:
        up = config.upstream
        entries = [("default", up.url, up.api_key)] + [(u.name, u.url, u.api_key) for u in config.upstreams]
        self.items: list[Backend] = []
        for name, url, api_key in entries:
            upstream = Upstream(
                url,
                connect_timeout=up.connect_timeout,
                timeout=up.timeout,
                idle_timeout=up.idle_timeout,
                max_connections=up.max_connections,
                api_key=api_key,
                transport=transport_for(url) if transport_for is not None else None,
                show_url=config.server.show_upstream_url,
                forward_authorization=up.forward_client_authorization,
                total_timeout=up.total_timeout,
            )
            registry = ModelRegistry(config, _fetcher(upstream, up.models_timeout), url=url, name=name,
                                     fetch_version=_fetcher(upstream, up.models_timeout, "/version"))
            gate = UpstreamGate(upstream.public_url, up.max_concurrent_requests, up.queue_timeout)
            self.items.append(Backend(name, upstream, registry, gate))

    @property
    def default(self) -> Backend:
        return self.items[0]

    def on_change(self, callback: Callable[[Backend, dict[str, ModelInfo]], None]) -> None:
        for backend in self.items:
            backend.registry.on_change.append(functools.partial(callback, backend))

    def for_model(self, model: str) -> Backend | None:
        for backend in self.items:
            if backend.registry.get(model) is not None:
                return backend
        return None

    def pools(self, model: str) -> list[tuple[Backend, int]]:
        """The backends serving `model` with a known max_model_len, shortest window first (config order on ties).

        Two or more are pools routed by length (`proxy.upstream.pools`); one or none is no pool at all.
        """
        found: list[tuple[Backend, int]] = []
        for backend in self.items:
            info = backend.registry.get(model)
            if info is not None and info.max_model_len is not None:
                found.append((backend, info.max_model_len))
        return sorted(found, key=lambda bw: bw[1]) if len({w for _, w in found}) > 1 else []

    def info(self, model: str) -> ModelInfo | None:
        backend = self.for_model(model)
        return backend.registry.get(model) if backend else None

    def version(self, model: str) -> str | None:
        """The `GET /version` of the upstream serving `model` (None: unknown)."""
        backend = self.for_model(model)
        return backend.registry.version if backend else None

    @property
    def names(self) -> list[str]:
        seen: list[str] = []
        for backend in self.items:
            seen += [n for n in backend.registry.names if n not in seen]
        return seen

    @property
    def loaded(self) -> bool:
        return any(b.registry.loaded for b in self.items)

    async def refresh_all(self, unknown: bool = False) -> None:
        calls = [b.registry.refresh_for_unknown() if unknown else b.registry.refresh() for b in self.items]
        await asyncio.gather(*calls)

    async def resolve(self, model: object, *, unlisted: bool = False) -> tuple[str, Backend]:
        """The served model a request's `model` field names (or vLLM's default) and its backend.

        Refreshes the model lists once when nothing is known yet, or when the
        name is not served (coalesced); 404 in vLLM's own words when it still
        is not, 503 while no upstream has answered.  `unlisted`: a name no list
        holds goes to the first upstream instead, whose vLLM may serve it all
        the same (VLLM_SKIP_MODEL_NAME_VALIDATION, a LoRA resolver) or answer
        its own 404.
        """
        if model is not None and not isinstance(model, str):
            raise errors.invalid_field("model", "must be a string naming a served model", model)
        if not self.loaded:
            await self.refresh_all()
            if not self.loaded:
                cause = self.default.registry.last_exception
                if isinstance(cause, BrimfulError):
                    raise cause
                raise errors.no_model_known(self.default.upstream.public_url)
        if model is None or model == "":
            for backend in self.items:
                default = backend.registry.default_model()
                if default is not None:
                    return default, backend
            raise errors.no_model_known(self.default.upstream.public_url)
        found = self.for_model(model)
        if found is None:
            await self.refresh_all(unknown=True)
            found = self.for_model(model)
            if found is None:
                if unlisted:
                    return model, self.default
                raise errors.model_not_found(model, self.names)
        return model, found

    def for_body(self, body: bytes) -> Backend:
        """Route a pass-through request (e.g. /tokenize, /v1/embeddings) by the `model` in its body."""
        if len(self.items) > 1 and body[:1] == b"{":
            try:
                model = json.loads(body).get("model")
            except (ValueError, AttributeError, RecursionError):
                model = None
            if isinstance(model, str):
                return self.for_model(model) or self.default
        return self.default

    def start(self) -> None:
        for backend in self.items:
            backend.registry.start()

    async def stop(self) -> None:
        for backend in self.items:
            await backend.registry.stop()
            await backend.upstream.close()


def _fetcher(upstream: Upstream, timeout: float, path: str = "/v1/models") -> Callable[[], Any]:
    return lambda: upstream.get_json(path, timeout=timeout)
