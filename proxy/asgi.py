"""The client side of an exchange: the ASGI types, reading a request, sending an answer.

The types are named once here, as `starlette/types.py` does, and reused by
every module that speaks ASGI.  Nothing here knows about models, tokens or the
upstream.
"""

from __future__ import annotations

import asyncio
import itertools
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from proxy import errors

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
# Header lists stay bytes end to end: both sides of the proxy (ASGI and
# proxy.upstream.http1) speak bytes, so nothing is decoded and encoded again.
Headers = list[tuple[bytes, bytes]]


class ClientGone(Exception):
    """The client disconnected before its request body was complete.

    An ordinary client fault, not a server error: nothing can be answered and
    nothing reached the upstream, so the handlers end quietly.  (Raising
    CancelledError here escaped the app and uvicorn logged a traceback.)
    """



# -- reading the request -------------------------------------------------------

def content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def has_body(scope: Scope) -> bool:
    """A request with neither Content-Length nor Transfer-Encoding has no body."""
    return any(name == b"transfer-encoding" for name, _ in scope["headers"])


def path_qs(scope: Scope) -> str:
    """The request target as the client sent it (raw path + query)."""
    raw = scope.get("raw_path") or scope["path"].encode()
    path = raw.decode("latin-1") if isinstance(raw, bytes) else str(raw)
    qs = scope.get("query_string") or b""
    return path + ("?" + qs.decode("latin-1") if qs else "")


def header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


async def read_body(receive: Receive, limit: int, scope: Scope) -> bytes:
    """The whole request body; the 413 for more than `limit` bytes, declared or received."""
    declared = content_length(scope)
    if declared is not None and declared > limit:
        raise errors.body_too_large(declared, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise errors.body_too_large(size, limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def stream_body(receive: Receive) -> AsyncIterator[bytes]:
    """The request body chunk by chunk, as it arrives; ClientGone if the client leaves first.

    Raising (rather than ending) is what keeps a partial body from reaching the
    upstream as if whole: the upstream request is then aborted, not completed.
    """
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone()
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


# -- request ids -----------------------------------------------------------------

# 80 random bits per process, then a counter: as unique as uuid4().hex (32 hex
# digits), without its urandom system call, ~5 % of the CPU of a small request.
_ID_PREFIX = secrets.token_hex(10)
_ID_COUNTER = itertools.count(1)


def new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_COUNTER):012x}"


def request_id(scope: Scope) -> str:
    """The client's X-Request-Id when it is a sane token, else a new one.

    Sent to the upstream and echoed back, so one id follows a request through
    client logs, brimful's length record and vLLM's logs.  Only printable
    ASCII without spaces, at most 128 characters, is reused: a header value
    brimful sends is never built from arbitrary client bytes.
    """
    value = header(scope, b"x-request-id")
    if value is not None and 0 < len(value) <= 128 and all(33 <= c < 127 for c in value):
        return value.decode("ascii")
    return new_request_id()


# -- sending the answer ------------------------------------------------------------

async def send_whole(send: Send, status: int, body: bytes, headers: Headers) -> None:
    """One complete (non-streamed) response: headers with its content-length, then the body."""
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


async def send_start(send: Send, status: int, headers: Headers) -> None:
    await send({"type": "http.response.start", "status": status, "headers": headers})


async def send_chunk(send: Send, chunk: bytes, *, more: bool = True) -> None:
    await send({"type": "http.response.body", "body": chunk, "more_body": more})


def is_shutdown_deadline(exc: asyncio.CancelledError) -> bool:
    """uvicorn cancels the requests still running at the graceful-shutdown deadline with this message."""
    return any("timeout graceful shutdown exceeded" in str(arg) for arg in exc.args)


# -- the client leaving ---------------------------------------------------------------

# How long a request runs before brimful starts watching for its client to
# leave.  Watching costs a task per request (~30 us of CPU measured in-process,
# 15 % of the app's own work on a small chat); most small answers are done
# before this, and a generation that outlives it gets the watcher, which sees
# a disconnect that already happened at once.  A client that leaves is thus
# noticed within this delay at worst: nothing next to vLLM's seconds of work.
WATCH_AFTER_S = 0.05


async def _disconnected(receive: Receive) -> None:
    """Return once the client has left.

    A request whose body was never read (a GET, a body the upstream answered
    before reading) still has that body to deliver: uvicorn answers the first
    `receive()` with it, at once.  That is not the client leaving; only
    `http.disconnect` is.
    """
    while (await receive())["type"] != "http.disconnect":
        pass


async def until_disconnect(receive: Receive, work: Awaitable[None]) -> bool:
    """Run `work`, cancelling it as soon as the client disconnects; True when it did.

    Cancelling closes the upstream connection, which makes vLLM abort the
    generation and free its KV-cache blocks.

    `work` runs in the calling task; only the wait for the disconnect is a
    task of its own, started WATCH_AFTER_S into the request, whose completion
    cancels this one.  (Running `work` as a second task under `asyncio.wait`
    cost a task, a wait future and four callbacks per request.)
    """
    task = asyncio.current_task()
    assert task is not None
    finished = False
    disconnected = False
    watchers: list[asyncio.Future[Any]] = []

    def client_gone(watcher: asyncio.Future[Any]) -> None:
        nonlocal disconnected
        if finished or watcher.cancelled():
            return
        disconnected = True
        task.cancel()

    def watch() -> None:
        if not finished:
            watcher = asyncio.ensure_future(_disconnected(receive))
            watcher.add_done_callback(client_gone)
            watchers.append(watcher)

    timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
    try:
        await work
    except asyncio.CancelledError:
        if not disconnected:
            raise
        task.uncancel()
    finally:
        finished = True
        timer.cancel()
        for watcher in watchers:
            watcher.cancel()
    return disconnected
