"""What the live view knows per model beyond its traffic: its config.json and its upstream's /metrics.

* The model's `config.json`, read once from its tokenizer directory (the
  `[models] tokenizer`, vLLM's `root`, or the Hugging Face snapshot, which
  hold it beside the tokenizer): the model's own context bounds the
  recommendation (`proxy.sizing.model_context`) and gives the KV bytes per token.
* With `[upstream_metrics] enabled`, one `proxy.sizing.vllm_metrics.UpstreamMetricsScraper`
  per upstream, fetching its `/metrics` through that upstream's own connection
  pool every `interval_s`; started and stopped with the app.  With several
  workers only the primary scrapes (proxy.workers.pages).

`for_model` is the `Recorder.sizing` hook behind `/stats`; `collector` adds
brimful's own gauges to its `/metrics`.  The figures are `proxy.sizing.live`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from proxy.config import Config, Policy
from proxy.sizing.live import ModelSizing, UpstreamSection, UpstreamView, upstream_section
from proxy.sizing.vllm_metrics import SignalKind, UpstreamMetricsScraper
from proxy.upstream.backends import Backend, Backends
from proxy.upstream.client import Upstream

MAX_METRICS_BYTES = 16 * 1024 * 1024      # a vLLM's /metrics is tens of KiB; anything near this is not one
SIGNAL_KINDS: tuple[str, ...] = typing.get_args(SignalKind)

ConfigFound = tuple[Mapping[str, Any] | None, str | None]   # (config.json, the file it came from)


def metrics_fetcher(upstream: Upstream, path: str, timeout: float) -> Callable[[], typing.Awaitable[str]]:
    """GET `path` on `upstream` (its own pool), the body as text; raises on failure, a non-200 or a timeout."""

    async def once() -> str:
        response = await upstream.send("GET", path, [(b"accept", b"text/plain")], None)
        body = await upstream.read_body(response, MAX_METRICS_BYTES)
        if response.status != 200:
            raise ValueError(f"HTTP {response.status} from {path}")
        return body.decode("utf-8", "replace")

    async def fetch() -> str:
        return await asyncio.wait_for(once(), timeout)

    return fetch


def read_model_config(directory: Path | None) -> ConfigFound:
    """`directory`/config.json parsed, or (None, None) when there is none or it is unreadable."""
    if directory is None:
        return None, None
    path = directory / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    return (data, str(path)) if isinstance(data, dict) else (None, None)


class LiveSizing:
    """Per model: its config.json and its upstream's scrape (see the module docstring)."""

    def __init__(self, config: Config, backends: Backends, tokenizer_dir: Callable[[str], Path | None],
                 policy: Callable[[str | None], Policy], *, scrape: bool = True) -> None:
        """`scrape`: False for the workers other than the primary, so each upstream is scraped once."""
        self.settings = config.upstream_metrics
        self._backends = backends
        self._tokenizer_dir = tokenizer_dir
        self._policy = policy
        self._configs: dict[str, ConfigFound] = {}
        s = self.settings
        self.scrapers: dict[str, UpstreamMetricsScraper] = {
            b.name: UpstreamMetricsScraper(
                metrics_fetcher(b.upstream, s.path, s.timeout_s), interval=s.interval_s,
                pinned_at=s.kv_usage_pinned, min_scrapes=s.pinned_scrapes, max_num_seqs=s.max_num_seqs)
            for b in backends.items
        } if s.enabled and scrape else {}
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    # -- lifecycle ----------------------------------------------------------------

    def start(self) -> None:
        self._stop = asyncio.Event()
        self._tasks = [asyncio.ensure_future(s.run(self._stop)) for s in self.scrapers.values()]

    async def stop(self) -> None:
        self._stop.set()
        for task in self._tasks:
            task.cancel()        # a scrape in flight waits for nothing more
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []

    def forget_configs(self) -> None:
        """The upstream's model list changed: roots may have moved."""
        self._configs.clear()

    # -- per model -------------------------------------------------------------------

    def model_config(self, model: str) -> ConfigFound:
        found = self._configs.get(model)
        if found is None:
            found = self._configs[model] = read_model_config(self._tokenizer_dir(model))
        return found

    def view(self, backend: Backend) -> UpstreamView | None:
        scraper = self.scrapers.get(backend.name)
        if scraper is None:
            return None
        return UpstreamView(name=backend.name, url=backend.upstream.base_url, metrics=scraper.latest,
                            signals=scraper.signals, scrapes=scraper.state.scrapes, failures=scraper.failures,
                            last_success=scraper.last_success, last_error=scraper.last_error)

    def for_model(self, model: str) -> ModelSizing:
        """The `Recorder.sizing` hook: what bounds this model's recommendation and checks its pool."""
        config, source = self.model_config(model)
        backend = self._backends.for_model(model)
        return ModelSizing(config=config, config_source=source,
                           upstream=self.view(backend) if backend is not None else None,
                           min_completion=self._policy(model).min_completion_tokens)

    def collector(self, demand_kv: Callable[[str], float | None], label: Callable[[str], str]) -> Collector:
        """brimful's gauges from the scrapes; `demand_kv(model)`: the p95 of demanded KV tokens per request."""
        return _SizingCollector(self, demand_kv, label)

    def sections(self, demand_kv: Callable[[str], float | None]) -> Iterator[tuple[str, str, UpstreamSection]]:
        """(model, upstream, its section) for every model each upstream's last scrape reports: a model
        served by pools has one per upstream."""
        for backend in self._backends.items:
            view = self.view(backend)
            if view is None or view.metrics is None:
                continue
            for model in sorted(view.metrics.models):
                p95 = demand_kv(model)
                yield model, backend.name, upstream_section(
                    view, model, config=self.model_config(model)[0],
                    demand_kv_tokens=None if p95 is None else math.ceil(p95))


class _SizingCollector(Collector):
    """Per model: the pool vLLM allocated, the planned one, the concurrency at p95 demand, each signal."""

    def __init__(self, sizing: LiveSizing, demand_kv: Callable[[str], float | None],
                 label: Callable[[str], str]) -> None:
        self._sizing = sizing
        self._demand_kv = demand_kv
        self._label = label

    def collect(self) -> Iterator[GaugeMetricFamily]:
        if not self._sizing.scrapers:
            return          # the scrape is off: no empty families in /metrics
        families = self._families()
        actual, planned, concurrency, signal, up = families
        for name, scraper in self._sizing.scrapers.items():
            up.add_metric([name], 1 if scraper.latest is not None and scraper.failures == 0 else 0)
        for model, upstream, section in self._sizing.sections(self._demand_kv):
            labels = [self._label(model), upstream]
            pool = section.pool
            if pool is not None:
                actual.add_metric(labels, pool.actual_tokens)
                if pool.planned_tokens is not None:
                    planned.add_metric(labels, pool.planned_tokens)
                if pool.concurrency is not None:
                    concurrency.add_metric(labels, pool.concurrency)
            held = {s.kind for s in section.signals}
            for kind in SIGNAL_KINDS:
                signal.add_metric([*labels, kind], 1 if kind in held else 0)
        yield from families

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield from self._families()

    @staticmethod
    def _families() -> tuple[GaugeMetricFamily, ...]:
        return (
            GaugeMetricFamily("brimful_upstream_kv_cache_tokens",
                              "KV cache tokens the running vLLM allocated (num_gpu_blocks x block_size, engine 0).",
                              labels=["model", "upstream"]),
            GaugeMetricFamily("brimful_planned_kv_cache_tokens",
                              "KV cache tokens the plan computes for the same configuration (when it can be made).",
                              labels=["model", "upstream"]),
            GaugeMetricFamily("brimful_upstream_concurrency_at_p95_demand",
                              "Requests of the p95 demanded KV tokens the running vLLM's pool holds at once.",
                              labels=["model", "upstream"]),
            GaugeMetricFamily("brimful_capacity_signal",
                              "1 while a time-to-add-capacity signal holds (seed 000): kv_usage_pinned, "
                              "preemptions_rising, requests_waiting.", labels=["model", "upstream", "signal"]),
            GaugeMetricFamily("brimful_upstream_metrics_up",
                              "1 when the last scrape of the upstream's /metrics succeeded.", labels=["upstream"]),
        )
