"""Several upstreams, each serving one or more models, chosen by the request's `model`.

A `Backend` is one upstream server (`proxy.forward.Upstream`) with the list of
models it serves (`proxy.limits.ModelRegistry`, read from its own
`/v1/models`).  `Backends` routes a model name to the backend that serves it:
backends are asked in configuration order, the default `[upstream]` first, so
a model served twice goes to the first.  A single-upstream deployment is the
special case of one backend.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable

from .config import Config
from .forward import Upstream
from .gate import UpstreamGate
from .limits import ModelInfo, ModelRegistry


@dataclass
class Backend:
    name: str
    upstream: Upstream
    registry: ModelRegistry
    gate: UpstreamGate          # back-pressure: at most max_concurrent_requests in flight


class Backends:
    def __init__(self, config: Config) -> None:
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
            )
            registry = ModelRegistry(config, _fetcher(upstream), url=url, name=name)
            gate = UpstreamGate(url, up.max_concurrent_requests, up.queue_timeout)
            self.items.append(Backend(name, upstream, registry, gate))

    @property
    def default(self) -> Backend:
        return self.items[0]

    def on_change(self, callback: Callable[[Backend, dict[str, ModelInfo]], None]) -> None:
        for backend in self.items:
            backend.registry.on_change.append(lambda models, b=backend: callback(b, models))

    def for_model(self, model: str) -> Backend | None:
        for backend in self.items:
            if backend.registry.get(model) is not None:
                return backend
        return None

    def info(self, model: str) -> ModelInfo | None:
        backend = self.for_model(model)
        return backend.registry.get(model) if backend else None

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

    async def start(self) -> None:
        for backend in self.items:
            await backend.upstream.start()
            backend.registry.start()

    async def stop(self) -> None:
        for backend in self.items:
            await backend.registry.stop()
            await backend.upstream.close()


def _fetcher(upstream: Upstream) -> Callable[[], Any]:
    return lambda: upstream.get_json("/v1/models")
