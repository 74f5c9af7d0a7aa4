"""The comparison point: a bare Starlette + aiohttp pass-through, no counting.

It does what any proxy must (read the body, send it upstream through one
shared `aiohttp.ClientSession`, stream the answer back) and nothing brimful
adds (no JSON parse, no count, no admission, no record, no disconnect watch),
served by the same uvicorn settings as `brimful serve` (httptools, uvloop,
one worker, no access log).  brimful's cost over this row is the price of
its features; this row's cost over "direct" is the price of any Python hop.

    python bench/bare_proxy.py --upstream http://127.0.0.1:8000 --port 8200
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import AsyncIterator

import aiohttp
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length", "upgrade", "te"}


def make_app(upstream: str) -> Starlette:
    state: dict[str, aiohttp.ClientSession] = {}

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        state["session"] = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=1024), auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
        )
        yield
        await state["session"].close()

    async def relay(request: Request) -> Response:
        headers = [(k, v) for k, v in request.headers.items() if k not in HOP_BY_HOP]
        body = await request.body()
        upstream_response = await state["session"].request(
            request.method, upstream + request.url.path + ("?" + request.url.query if request.url.query else ""),
            headers=headers, data=body or None,
        )
        out = {k: v for k, v in upstream_response.headers.items() if k.lower() not in HOP_BY_HOP}
        if upstream_response.headers.get("content-type", "").startswith("text/event-stream"):
            async def chunks() -> AsyncIterator[bytes]:
                try:
                    async for chunk in upstream_response.content.iter_any():
                        yield chunk
                finally:
                    upstream_response.release()
            return StreamingResponse(chunks(), status_code=upstream_response.status, headers=out)
        payload = await upstream_response.read()
        return Response(payload, status_code=upstream_response.status, headers=out)

    return Starlette(
        routes=[Route("/{path:path}", relay, methods=["GET", "POST"])],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8200)
    args = parser.parse_args()
    uvicorn.run(
        make_app(args.upstream.rstrip("/")), host=args.host, port=args.port, log_level="warning",
        access_log=False, server_header=False, date_header=False, loop="uvloop", http="httptools",
    )


if __name__ == "__main__":
    main()
