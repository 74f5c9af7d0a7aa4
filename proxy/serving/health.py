"""GET /ready and GET /live: brimful's own probes, for Kubernetes and load balancers.

`/health` is vLLM's and is relayed untouched, so it says nothing about
brimful.  These two are brimful's:

* **/live** answers 200 whenever the event loop runs (with several workers:
  every worker's): a liveness probe that restarts brimful only when brimful
  itself is stuck, never because vLLM is still loading or restarting.
* **/ready** answers 200 once every upstream's `GET /v1/models` has answered
  and every model it lists has its tokenizer loaded (or is known to be
  counted by the upstream's `/tokenize`), in every worker, else 503 with what
  is missing.
  A pod then receives traffic only when its first request can be counted
  without loading a tokenizer.  Once ready it stays ready through a later
  upstream outage (the outage is in the body): a replica that still answers
  explains the outage to clients (502/503 with `Retry-After`), where a
  Service with no ready endpoint would only refuse connections.

`readiness()` is pure; `routes()` reads the live state at request time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from proxy.upstream.models import describe_error

if TYPE_CHECKING:
    from proxy.admitted.counting import PromptCounter
    from proxy.upstream.backends import Backends
    from proxy.workers.pages import WorkerPages

READY_PATH = "/ready"
LIVE_PATH = "/live"
PATHS = frozenset({READY_PATH, LIVE_PATH})
_NO_STORE = {"Cache-Control": "no-store"}


@dataclass(frozen=True)
class UpstreamState:
    """What /ready needs to know of one upstream."""

    name: str
    url: str | None                     # None: not shown to clients (server.show_upstream_url)
    answered: bool                      # its /v1/models answered at least once
    last_error: str | None = None       # the latest failure to read /v1/models, if the latest failed
    max_model_len: Mapping[str, int | None] = field(default_factory=dict)   # served model -> limit


def readiness(upstreams: Sequence[UpstreamState], counted_by: Mapping[str, str]) -> tuple[bool, dict[str, Any]]:
    """(ready, the /ready document).  `counted_by`: model -> "local" | "upstream" once settled."""
    missing: list[str] = []
    models: dict[str, dict[str, Any]] = {}
    for up in upstreams:
        if not up.answered:
            cause = f": {up.last_error}" if up.last_error else ""
            where = f" ({up.url})" if up.url else ""
            missing.append(f"upstream {up.name}{where} has not answered GET /v1/models yet{cause}")
        for model, limit in up.max_model_len.items():
            if model in models:          # served twice: requests go to the first upstream
                continue
            how = counted_by.get(model, "pending")
            models[model] = {"upstream": up.name, "max_model_len": limit, "counted_by": how}
            if how == "pending":
                missing.append(f"model {model}: its tokenizer is not loaded yet")
    ready = not missing
    document = {
        "ready": ready,
        "upstreams": [
            {"name": up.name, **({"url": up.url} if up.url else {}), "answered": up.answered,
             "last_error": up.last_error}
            for up in upstreams
        ],
        "models": models,
        "missing": missing,
    }
    return ready, document


def upstream_states(backends: Backends) -> list[UpstreamState]:
    states = []
    for backend in backends.items:
        registry = backend.registry
        limits = {}
        for name in registry.names:
            info = registry.get(name)
            limits[name] = info.max_model_len if info is not None else None
        cause = registry.last_exception
        error = describe_error(cause) if cause is not None else registry.last_error
        states.append(UpstreamState(backend.name, backend.upstream.public_url, registry.loaded, error, limits))
    return states


def routes(backends: Backends, counter: PromptCounter, workers: WorkerPages | None = None,
           full_view: Callable[[Any], bool] = lambda scope: True) -> list[Route]:
    """GET /ready and GET /live for the app to mount; with `workers`, for every worker.

    `full_view(scope)`: may this caller read the whole /ready document (it
    names every model)?  A probe that may not gets only `{"ready": ...}`
    with the same status: all a load balancer or Kubernetes reads.
    """

    async def ready_endpoint(request: Request) -> Response:
        ok, document = readiness(upstream_states(backends), counter.counted_by)
        if workers is not None:
            ok, document = await workers.ready(ok, document)
        if not full_view(request.scope):
            document = {"ready": ok}
        return JSONResponse(document, status_code=200 if ok else 503, headers=_NO_STORE)

    async def live_endpoint(request: Request) -> Response:
        if workers is not None:
            ok, document = await workers.live()
            return JSONResponse(document, status_code=200 if ok else 503, headers=_NO_STORE)
        return JSONResponse({"live": True}, headers=_NO_STORE)

    return [
        Route(READY_PATH, ready_endpoint, methods=["GET"], name="ready"),
        Route(LIVE_PATH, live_endpoint, methods=["GET"], name="live"),
    ]
