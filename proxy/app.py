"""The ASGI application: wiring, lifespan, dispatch and API keys.

`POST` to an admitted surface (proxy.admitted.surfaces) runs one
`proxy.admitted.exchange.AdmittedExchange`; `POST /v1/messages/count_tokens` is
answered from brimful's own count (proxy.serving.count_tokens); brimful's own pages
(proxy.serving.pages) answer `/metrics`, `/stats` and `/dashboard`; everything else is
relayed untouched (proxy.serving.passthrough).

This is a plain ASGI callable rather than a Starlette router because the hot
path only needs the raw scope, and every layer skipped is CPU saved per
request; Starlette still serves brimful's own pages.
"""

from __future__ import annotations

import asyncio
import gc
import hmac
import logging
from collections.abc import Callable
from typing import Any

from starlette.routing import Router

from proxy import errors
from proxy.admitted.counting import PromptCounter
from proxy.admitted.exchange import AdmittedExchange, ExchangeServices
from proxy.admitted.surfaces import ADMITTED, ANSWERED, Surface
from proxy.asgi import Receive, Scope, Send, content_length, has_body, header, request_id, send_whole
from proxy.config import Config, Policy
from proxy.errors import BrimfulError
from proxy.recording.live_sizing import LiveSizing
from proxy.recording.metrics import Metrics
from proxy.recording.otel import open_telemetry
from proxy.recording.parquetlog import open_length_log
from proxy.recording.recorder import Recorder
from proxy.serving import health
from proxy.serving.count_tokens import answer_count_tokens
from proxy.serving.pages import routes
from proxy.serving.passthrough import Passthrough
from proxy.upstream.backends import Backend, Backends
from proxy.upstream.client import Transport
from proxy.upstream.models import ModelInfo
from proxy.workers.pages import WorkerPages
from proxy.workers.siblings import WorkerSlot

log = logging.getLogger("brimful")

PAGES = frozenset({"/metrics", "/stats", "/dashboard"})   # brimful's own pages (server.metrics_api_keys)
LOCAL_PATHS = PAGES | health.PATHS                         # answered by brimful itself
# vLLM's unauthenticated routes, relayed without an API key: exactly these
# methods and paths (vLLM 0.32 serves /ping for GET and POST), and only
# without a query, a percent-encoded path or a body (see `is_open_route`).
# A replacement worker waits this long at most to be ready before it serves (then it serves anyway,
# as a lone brimful would); polled, as readiness is the upstreams' and tokenizers' state.
REPLACEMENT_READY_WAIT_S = 60.0
READY_POLL_S = 0.05
OPEN_ROUTES = frozenset({("GET", "/health"), ("GET", "/ping"), ("POST", "/ping"), ("GET", "/version")})


def is_open_route(method: str, path: str, raw_path: bytes | None, query: bytes, has_body: bool) -> bool:
    """A request relayed without an API key: one of OPEN_ROUTES exactly as written, or a CORS
    preflight.  Pure.

    `/heal%74h` decodes to /health but is not written so, `/health?x=1` and a
    GET with a body carry more than a probe needs: each needs a key.  A browser
    never sends credentials with a preflight (OPTIONS), and vLLM's own key check
    lets every OPTIONS through (serve/middleware/authenticate.py): refused here,
    no browser app could call brimful at all.
    """
    if method == "OPTIONS":
        return not has_body
    return (method, path) in OPEN_ROUTES and raw_path in (None, path.encode()) and not query and not has_body


class BrimfulApp:
    def __init__(
        self,
        config: Config,
        recorder: Recorder | None = None,
        *,
        transport_for: Callable[[str], Transport] | None = None,
        worker: WorkerSlot | None = None,
    ) -> None:
        """`worker`: this process's place among `--workers N` (None: the only process)."""
        self.config = config
        self.backends = Backends(config, transport_for)
        self.counter = PromptCounter(config, self.backends)
        self.backends.on_change(self._models_changed)
        self.recorder = recorder if recorder is not None else make_recorder(config)
        metrics = self.recorder.metrics
        self.counter.on_parity.append(metrics.set_tokenizer_parity)
        self.counter.on_trust.append(lambda trust: metrics.set_count_mode(trust.model, trust.mode))
        self.recorder.counting = self.counting_state
        if self.counter.piece_cache is not None:
            metrics.attach_piece_cache(self.counter.piece_cache.stats)
        if self.counter.chat_cache is not None:
            metrics.attach_chat_cache(self.counter.chat_cache.stats)
        metrics.attach_engines(self.counter.engines)
        metrics.attach_gates(lambda: [(b.name, b.gate) for b in self.backends.items])
        self._policies: dict[str | None, Policy] = {}
        # The model's config.json and its upstream's /metrics, for /stats and the sizing gauges;
        # among several workers only the primary scrapes, and it answers /metrics and /stats for all.
        self.sizing = LiveSizing(config, self.backends, self.counter.tokenizer_dir, self._policy,
                                 scrape=worker is None or worker.primary)
        self.recorder.sizing = self.sizing.for_model
        self.workers: WorkerPages | None = None
        if worker is not None:
            self.workers = WorkerPages(
                worker, self.recorder, self.counting_state,
                lambda: health.readiness(health.upstream_states(self.backends), self.counter.counted_by),
                lambda demand_kv: self.sizing.collector(demand_kv, metrics.model_label),
                lambda: sum(b.gate.in_flight for b in self.backends.items))
        else:
            metrics.registry.register(self.sizing.collector(self.recorder.demand_kv_percentile, metrics.model_label))
        self.services = ExchangeServices(config, self.backends, self.counter, self.recorder, self._policy)
        self._local = Router(routes=routes(self.recorder, self.workers)
                             + health.routes(self.backends, self.counter, self.workers, self._pages_authorized))
        self._passthrough = Passthrough(self.backends, config.server.shutdown_timeout, config.upstream.models_timeout)
        self._background: set[asyncio.Task[Any]] = set()
        self._preloads: dict[str, asyncio.Task[None]] = {}     # each upstream's latest start-up probes
        self._listed: dict[str, set[str]] = {}                  # each upstream's model list, as last read
        self._moving: dict[str, set[str]] = {}                  # models its latest preload probes elsewhere
        # Whether the server was asked to stop (proxy.cli sets it to uvicorn's flag): ends a wait at start-up.
        self.stop_requested: Callable[[], bool] = lambda: False
        self._api_keys = [k.encode() for k in config.server.api_keys]
        self._metrics_keys = [k.encode() for k in config.server.metrics_api_keys]
        self._metrics_port = config.server.metrics_port

    def _policy(self, model: str | None) -> Policy:
        """`Config.policy_for`, worked out once per model (it rebuilds a dataclass each call)."""
        policy = self._policies.get(model)
        if policy is None:
            policy = self._policies[model] = self.config.policy_for(model)
        return policy

    def counting_state(self) -> dict[str, dict[str, Any]]:
        """For /stats, per model: how far its count is trusted (proxy.admitted.trust) and which engine counts it."""
        trust = self.counter.trust_states()
        engines = self.counter.engines()
        return {model: {**(trust[model].describe() if model in trust else {}),
                        **(engines[model].describe() if model in engines else {})}
                for model in sorted(trust.keys() | engines.keys())}

    # -- lifecycle --------------------------------------------------------------

    async def startup(self) -> None:
        ll = self.config.length_log
        if ll.path and self.recorder.lengthlog is None:
            # Made here, inside the serving process: the writer thread does not survive a fork.
            self.recorder.attach_lengthlog(open_length_log(ll))
        if self.config.otel.enabled and self.recorder.telemetry is None:
            self.recorder.telemetry = open_telemetry()     # its threads, like the log's, made after the fork
        self.backends.start()
        self.sizing.start()
        if self.workers is not None:
            await self.workers.siblings.start()
            if self.workers.slot.replacement:
                await self._until_ready()

    async def _until_ready(self) -> None:
        """A replacement worker's start-up ends once it can serve (its upstreams answered, its
        tokenizers loaded): only then does its server accept from its socket, and while it loads a
        worker that serves accepts from that socket for it (proxy.workers.handover)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REPLACEMENT_READY_WAIT_S
        while not health.readiness(health.upstream_states(self.backends), self.counter.counted_by)[0]:
            if self.stop_requested():
                return                  # SIGTERM while loading: the server stops as soon as it starts
            if loop.time() > deadline:
                log.warning("not ready after %g s; serving anyway", REPLACEMENT_READY_WAIT_S)
                return
            await asyncio.sleep(READY_POLL_S)

    async def shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        if self.workers is not None:
            await self.workers.siblings.stop()
        await self.sizing.stop()
        await self.backends.stop()
        await asyncio.to_thread(self.recorder.close)   # flushes the length log

    def _models_changed(self, backend: Backend, models: dict[str, ModelInfo]) -> None:
        for name, info in models.items():
            self.recorder.metrics.set_limit_unknown(name, backend.name,
                                                    info.limit_problem is not None and info.source != "config")
        # This upstream's models start again, and so do those it no longer lists that another
        # upstream serves (probed there now) and those no upstream serves any more; the others
        # keep what their own probes and answers taught.
        listed = set(models)
        earlier = self._preloads.pop(backend.name, None)
        unfinished = earlier is not None and not earlier.done()
        if earlier is not None:
            earlier.cancel()            # its probes went to the server this list replaces
        # The moved ones an unfinished earlier preload may not have probed yet go too.
        earlier_moved = self._moving.get(backend.name, set()) if unfinished else set()
        moved = sorted(m for m in (self._listed.get(backend.name, set()) | earlier_moved) - listed
                       if self.backends.for_model(m) is not None)
        self._listed[backend.name] = listed
        self._moving[backend.name] = set(moved)
        self.counter.forget(listed | set(moved)
                            | {m for m in self.counter.known() if self.backends.for_model(m) is None})
        self.sizing.forget_configs()
        task = self.counter.preload(list(models) + moved)
        self._preloads[backend.name] = task
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        # Once tokenizers and templates are loaded, move everything alive to the
        # GC's permanent generation: full collections then skip those objects.
        # Measured (bench/proxy_bench.py, 197 B at 1 connection, 2 A/B pairs):
        # p99 1.6-4.9 ms → 1.2-1.3 ms; p50 and CPU per request unchanged.
        task.add_done_callback(lambda _: gc.freeze())

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:  # pragma: no cover - reported to the server
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    # -- dispatch -----------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            path = scope["path"]
            surface = ADMITTED.get(path)
            answered = ANSWERED.get(path) if surface is None else None
            try:
                if self._metrics_port and _local_port(scope) == self._metrics_port:
                    await self._metrics_listener(scope, receive, send)
                elif surface is not None and scope["method"] == "POST":
                    if self._authorized(scope):
                        await AdmittedExchange(self.services, surface, scope, receive, send).run()
                    else:
                        await self._unauthorized(send, scope, surface.name, surface)
                elif answered is not None and scope["method"] == "POST":
                    if self._authorized(scope):
                        await answer_count_tokens(self.services, answered, scope, receive, send)
                    else:
                        await self._unauthorized(send, scope, answered.name, answered)
                elif path in PAGES:
                    if self._metrics_port:          # served on the metrics listener only
                        await _refuse(send, scope, errors.not_here(path))
                    elif self._pages_authorized(scope):
                        await self._local(scope, receive, send)
                    else:
                        await self._unauthorized(send, scope, "pages")
                elif path in health.PATHS:          # probes: /ready trims its document itself
                    await self._local(scope, receive, send)
                elif self._authorized(scope) or is_open_route(
                        scope["method"], path, scope.get("raw_path"), scope.get("query_string") or b"",
                        bool(content_length(scope)) or has_body(scope)):
                    await self._passthrough(scope, receive, send)
                else:
                    await self._unauthorized(send, scope, "passthrough")
            except Exception:
                # A bug must still answer in the OpenAI shape, never a bare 500 page.
                log.exception("unexpected error while handling %s %s", scope["method"], path)
                await _send_internal_error(send, request_id(scope))
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _metrics_listener(self, scope: Scope, receive: Receive, send: Send) -> None:
        """server.metrics_port: brimful's pages and probes, and nothing the upstream serves."""
        if scope["path"] not in LOCAL_PATHS:
            await _refuse(send, scope, errors.not_here(scope["path"]))
        elif scope["path"] in PAGES and self._metrics_keys and not _bearer_in(scope, self._metrics_keys):
            await self._unauthorized(send, scope, "pages")
        else:
            await self._local(scope, receive, send)

    async def _unauthorized(self, send: Send, scope: Scope, route: str, surface: Surface | None = None) -> None:
        """401: counted on its own (brimful_unauthorized_requests_total), never a length record."""
        self.recorder.metrics.count_unauthorized(route)
        await _refuse(send, scope, errors.unauthorized(), surface)

    def _authorized(self, scope: Scope) -> bool:
        """No keys configured, or `Authorization: Bearer <one of them>`."""
        return not self._api_keys or _bearer_in(scope, self._api_keys)

    def _pages_authorized(self, scope: Scope) -> bool:
        """/metrics, /stats, /dashboard and the full /ready document: never more open than the API.

        A metrics key when server.metrics_api_keys is set; else an API key when
        server.api_keys is; else open.  On the metrics listener (server.metrics_port)
        only the metrics keys apply.
        """
        if self._metrics_keys:
            return _bearer_in(scope, self._metrics_keys)
        if self._metrics_port and _local_port(scope) == self._metrics_port:
            return True
        return self._authorized(scope)


def _bearer_in(scope: Scope, keys: list[bytes]) -> bool:
    """`Authorization: Bearer <one of keys>` (compared in constant time)."""
    value = header(scope, b"authorization")
    if value is None:
        return False
    scheme, _, token = value.partition(b" ")
    if scheme.lower() != b"bearer":
        return False
    token = token.strip()
    return any(hmac.compare_digest(token, key) for key in keys)


def _local_port(scope: Scope) -> int | None:
    server = scope.get("server")
    return server[1] if server else None


def make_recorder(config: Config) -> Recorder:
    """Metrics + the recent window for /stats; the length-log file is attached at start-up."""
    return Recorder(Metrics(config.metrics.buckets), window_records=config.metrics.window)


async def _refuse(send: Send, scope: Scope, err: BrimfulError, surface: Surface | None = None) -> None:
    """An error answered before any work, in the surface's shape (OpenAI's for pass-through)."""
    body = surface.error_body(err) if surface is not None else err.body_bytes()
    await send_whole(send, err.status, body, err.response_headers([(b"x-request-id", request_id(scope).encode())]))


async def _send_internal_error(send: Send, rid: str) -> None:
    err = errors.internal_error(rid)
    try:
        await send_whole(send, err.status, err.body_bytes(), err.response_headers([(b"x-request-id", rid.encode())]))
    except Exception:  # the response had already started: nothing more can be said
        pass
