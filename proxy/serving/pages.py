"""brimful's own pages: GET /metrics, /stats and /dashboard (everything else is the upstream's)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from proxy.recording.recorder import Recorder

if TYPE_CHECKING:
    from proxy.workers.pages import WorkerPages

_NO_STORE = {"Cache-Control": "no-store"}

_DASHBOARD_PATH = Path(__file__).with_name("dashboard.html")
_dashboard_html: str | None = None


def dashboard_html() -> str:
    """The self-contained dashboard page (read once; it has no external resources)."""
    global _dashboard_html
    if _dashboard_html is None:
        _dashboard_html = _DASHBOARD_PATH.read_text(encoding="utf-8")
    return _dashboard_html


def routes(recorder: Recorder, workers: WorkerPages | None = None) -> list[Route]:
    """GET /metrics, /stats and /dashboard for the app to mount; with `workers`, they speak for all."""

    async def metrics_endpoint(request: Request) -> Response:
        accept = request.headers.get("accept")
        if workers is not None:
            status, body, content_type = await workers.metrics(accept)
            return Response(body, status_code=status, headers={"Content-Type": content_type})
        body, content_type = recorder.render_metrics(accept)
        return Response(body, headers={"Content-Type": content_type})

    async def stats_endpoint(request: Request) -> Response:
        if workers is not None:
            status, document = await workers.stats()
            return JSONResponse(document, status_code=status, headers=_NO_STORE)
        # Sorting a few full windows takes milliseconds: keep it off the event loop.
        return JSONResponse(await run_in_threadpool(recorder.stats), headers=_NO_STORE)

    async def dashboard_endpoint(request: Request) -> Response:
        return HTMLResponse(dashboard_html(), headers=_NO_STORE)

    return [
        Route("/metrics", metrics_endpoint, methods=["GET"], name="metrics"),
        Route("/stats", stats_endpoint, methods=["GET"], name="stats"),
        Route("/dashboard", dashboard_endpoint, methods=["GET"], name="dashboard"),
    ]
