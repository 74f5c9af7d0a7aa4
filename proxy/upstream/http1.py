"""A lean HTTP/1.1 client for one upstream: asyncio protocol + httptools' parser.

Why not aiohttp (or httpx)?  brimful's whole job per request is cheap
(parse, count, admit, rewrite), so the client's own bookkeeping was the
largest single cost left: py-spy put ~17-21 % of brimful's CPU in
`aiohttp.ClientSession._request` (URL objects, header multidicts, timers,
traces, cookie jar), and httpx's pool was measured at 4.8 ms per request at
64 connections (docs/architecture.md).  This client does only what a reverse proxy to
a known server needs: one request at a time per keep-alive connection,
bytes relayed as they arrive, and timeouts and failures reported precisely
enough to say 502 or 504 and why.  httptools (llhttp) already parses
uvicorn's side of every request, so no new dependency.

What it deliberately does not do: redirects, cookies, decompression,
proxies, HTTP/2, pipelining, or retries (a POST to vLLM starts a
generation; re-sending it could run it twice).

Failures leave as the small exception classes below; `proxy.upstream.client`
turns them into brimful's explained errors.
"""

from __future__ import annotations

import asyncio
import collections
import ssl as ssl_module
import time
from collections.abc import AsyncIterator
from typing import cast
from urllib.parse import urlsplit

from httptools import HttpParserError, HttpParserUpgrade, HttpResponseParser

# Stop reading from the socket when this much body is waiting for the client
# (a slow client must slow the upstream down, not grow brimful's memory).
HIGH_WATER = 256 * 1024
# Idle keep-alive connections older than this are not reused.  uvicorn (which
# serves vLLM's API) closes an idle connection after 5 s by default; reusing
# one just as it does would lose the request, so stop short of that.
KEEPALIVE_SECONDS = 4.0


class ConnectError(Exception):
    """The TCP (or TLS) connection could not be made."""


class ConnectTimeout(Exception):
    """No connection within the connect timeout."""


class ReadTimeout(Exception):
    """The upstream sent nothing for longer than the timeout of the current phase."""


class DeadlineExceeded(ReadTimeout):
    """The request's whole time (upstream.total_timeout) ran out, however busy the upstream kept it."""


class Broken(Exception):
    """The connection closed or sent something that is not HTTP/1.1 mid-exchange."""


class ResponseHeaders:
    """Case-insensitive read access to response headers (the first value of each name)."""

    __slots__ = ("_map",)

    def __init__(self, raw: list[tuple[bytes, bytes]]) -> None:
        mapping: dict[str, str] = {}
        for name, value in raw:
            mapping.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
        self._map = mapping

    def get(self, name: str, default: str | None = None) -> str | None:
        return self._map.get(name.lower(), default)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name.lower() in self._map

    def __getitem__(self, name: str) -> str:
        return self._map[name.lower()]


class _Connection(asyncio.Protocol):
    """One keep-alive TCP connection carrying one exchange at a time.

    The parser's callbacks fill this object; the reading side (`Http1Response`)
    waits on `_waiter`, which every event (headers, body, end, loss) wakes.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.loop = pool.loop
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self.counted = True         # still counted in the pool's open connections
        self._write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._reset(head=False)

    def _reset(self, head: bool) -> None:
        self.parser = HttpResponseParser(self)
        self.head = head
        self.status = 0
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.interim = False        # inside a 1xx answer, which the final one follows
        self.complete = False
        self.keep_alive = False
        self.close_delimited = False
        # A connection that closed while idle fails its next exchange at once
        # instead of waiting for an answer that cannot come.
        self.error: BaseException | None = Broken("the server closed the connection") if self.lost else None
        self.chunks: collections.deque[bytes] = collections.deque()
        self.buffered = 0
        self.read_paused = False
        self._waiter: asyncio.Future[None] | None = None

    # -- asyncio.Protocol ---------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # a stream connection's transport

    def data_received(self, data: bytes) -> None:
        if self.complete:           # bytes after a complete answer: the connection is unusable
            self.lost = True
            if self.transport is not None:
                self.transport.close()
            return
        try:
            self.parser.feed_data(data)
        except HttpParserUpgrade:
            self._fail(Broken("the upstream switched protocols"))
        except HttpParserError as exc:
            self._fail(Broken(f"invalid HTTP response: {exc}"))
        self._wake()

    def eof_received(self) -> bool | None:
        return None                 # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self.headers_done and self.close_delimited and not self.complete and exc is None:
            self.complete = True    # a body without length ends where the connection does
        elif not self.complete and self.error is None:
            cause = f"{type(exc).__name__}: {exc}" if exc else "the server closed the connection"
            self.error = Broken(cause)
        self._wake()
        if self._drain is not None and not self._drain.done():
            self._drain.set_exception(Broken("the server closed the connection while receiving the request"))
        self.pool._forget(self)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)

    # -- httptools callbacks --------------------------------------------------------

    def on_header(self, name: bytes, value: bytes) -> None:
        self.raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200 and status != 101:
            # An interim answer (100 Continue, 103 Early Hints): the final one follows
            # on the same connection.  101 is an upgrade, which llhttp reports itself.
            self.interim = True
            self.raw_headers = []
            return
        self.status = status
        self.headers_done = True
        if self.head or status in (204, 304):
            self.complete = True    # no body follows; llhttp cannot know that for HEAD
            return
        framed = False
        for name, value in self.raw_headers:
            lowered = name.lower()
            if lowered == b"content-length" or (lowered == b"transfer-encoding" and b"chunked" in value.lower()):
                framed = True
        self.close_delimited = not framed

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.read_paused and self.transport is not None:
            self.read_paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        # Asked here: once the message is complete llhttp resets and always says no.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True

    # -- for Http1Response ----------------------------------------------------------------

    def _fail(self, exc: BaseException) -> None:
        if self.error is None:
            self.error = exc
        self.lost = True
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, timeout: float, deadline: float | None = None) -> None:
        """Wait for the next parser event, at most `timeout` seconds and never past `deadline` (loop time)."""
        expire = _expire
        if deadline is not None:
            left = deadline - self.loop.time()
            if left <= 0:
                raise DeadlineExceeded()
            if left < timeout:
                timeout, expire = left, _expire_deadline
        waiter = self.loop.create_future()
        self._waiter = waiter
        timer = self.loop.call_later(timeout, expire, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None

    async def write_body(self, head: bytes, body: bytes | AsyncIterator[bytes] | None) -> None:
        transport = self.transport
        assert transport is not None
        if body is None or isinstance(body, bytes):
            transport.write(head + body if body else head)
            return
        transport.write(head)
        async for chunk in body:
            if self.lost:
                raise Broken("the server closed the connection while receiving the request")
            if chunk:
                transport.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
                if self._write_paused:
                    self._drain = self.loop.create_future()
                    await self._drain
        transport.write(b"0\r\n\r\n")

    def consumed(self, size: int) -> None:
        self.buffered -= size
        if self.read_paused and self.buffered <= HIGH_WATER // 4 and self.transport is not None:
            self.read_paused = False
            self.transport.resume_reading()


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(ReadTimeout())


def _expire_deadline(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(DeadlineExceeded())


class Http1Response:
    """The answer to one request: status and headers now, body as it arrives.

    Read it with `next_chunk()` or `read()`, then call `release()` (the
    connection goes back to the pool when the body was read to its end) or
    `close()` (the connection is dropped: what a proxy does when its client
    leaves, so that vLLM aborts the generation).
    """

    def __init__(self, conn: _Connection, idle_timeout: float, deadline: float | None = None) -> None:
        self._conn: _Connection | None = conn
        self.status = conn.status
        self.raw_headers = conn.raw_headers
        self.headers = ResponseHeaders(conn.raw_headers)
        self._idle_timeout = idle_timeout
        self._deadline = deadline

    async def next_chunk(self) -> bytes:
        """The body bytes that arrived since the last call, waiting for some; b"" at the end.

        A plain coroutine rather than an async generator: a generator left
        unfinished (a client gone mid-stream) is closed later by a task of
        its own.
        """
        while True:
            conn = self._conn
            if conn is None:
                return b""
            if conn.chunks:
                if len(conn.chunks) == 1:
                    data = conn.chunks.popleft()
                else:
                    data = b"".join(conn.chunks)
                    conn.chunks.clear()
                conn.consumed(len(data))
                return data
            if conn.complete:
                return b""
            if conn.error is not None:
                raise conn.error
            await conn.wait(self._idle_timeout, self._deadline)

    async def read(self, limit: int | None = None) -> bytes:
        """The whole body (or its first `limit` bytes)."""
        parts: list[bytes] = []
        size = 0
        while chunk := await self.next_chunk():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        return data[:limit] if limit is not None else data

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool._release(conn, reusable=conn.complete and not conn.chunks and not conn.head)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.pool._release(conn, reusable=False)


class Pool:
    """Keep-alive connections to one origin, at most `limit` open at once.

    The most recently used idle connection is reused first, so a burst's
    connections stay warm and the rest age out.
    """

    def __init__(self, base_url: str, *, connect_timeout: float, limit: int = 1024) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        default_port = parts.port is None or parts.port == (443 if parts.scheme == "https" else 80)
        host = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = host if default_port else f"{host}:{self.port}"
        self.prefix = parts.path.rstrip("/")
        self.connect_timeout = connect_timeout
        self.limit = limit
        self._ssl: ssl_module.SSLContext | None = (
            ssl_module.create_default_context() if parts.scheme == "https" else None
        )
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The running loop (a pool is made before the server's loop starts)."""
        return asyncio.get_running_loop()

    async def request(
        self,
        method: str,
        path_qs: str,
        headers: list[tuple[bytes, bytes]],
        body: bytes | AsyncIterator[bytes] | None,
        *,
        timeout: float,
        idle_timeout: float,
        deadline: float | None = None,
    ) -> Http1Response:
        """Send one request and wait (at most `timeout` s of silence) for the response headers.

        `deadline` (loop time) bounds the whole exchange, headers and body.
        """
        head = _request_head(method, self.prefix + path_qs, self.host_header, headers, body)
        conn = await self._acquire()
        conn._reset(head=method == "HEAD")
        try:
            await conn.write_body(head, body)
            while not conn.headers_done:
                if conn.error is not None:
                    raise conn.error
                await conn.wait(timeout, deadline)
        except BaseException:
            self._release(conn, reusable=False)
            raise
        return Http1Response(conn, idle_timeout, deadline)

    async def close(self) -> None:
        for conn in self._idle:
            if conn.transport is not None:
                conn.transport.close()
        self._idle.clear()

    # -- the pool -------------------------------------------------------------------

    async def _acquire(self) -> _Connection:
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if not conn.lost and now - conn.idle_since < KEEPALIVE_SECONDS:
                return conn
            self._drop(conn)
        while self._open >= self.limit:
            waiter = self.loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if not waiter.cancelled() and waiter.done():
                    self._wake_one()   # pass the slot on: this caller no longer needs it
                raise
            if self._idle:
                return await self._acquire()
        self._open += 1
        try:
            return await self._connect()
        except BaseException:
            self._open -= 1
            self._wake_one()
            raise

    async def _connect(self) -> _Connection:
        loop = self.loop
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self), self.host, self.port, ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError as exc:
            raise ConnectTimeout() from exc
        except OSError as exc:
            raise ConnectError(exc.strerror or str(exc) or type(exc).__name__) from exc
        return conn

    def _release(self, conn: _Connection, *, reusable: bool) -> None:
        if reusable and not conn.lost and conn.keep_alive:
            conn.idle_since = time.monotonic()
            conn._waiter = None
            self._idle.append(conn)
            self._wake_one()
            return
        self._drop(conn)

    def _drop(self, conn: _Connection) -> None:
        if conn.transport is not None and not conn.transport.is_closing():
            conn.transport.abort()
        if conn.counted:
            conn.counted = False
            self._open -= 1
            self._wake_one()

    def _forget(self, conn: _Connection) -> None:
        """`conn` closed: an idle one leaves the pool now rather than at its next use."""
        if conn in self._idle:
            self._idle.remove(conn)
            self._drop(conn)

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


def _request_head(
    method: str, target: str, host: str, headers: list[tuple[bytes, bytes]], body: bytes | AsyncIterator[bytes] | None
) -> bytes:
    """The request line and headers.  Framing is the client's: `headers` must not carry
    Host, Content-Length or Transfer-Encoding (proxy.upstream.client drops them as hop-by-hop)."""
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {host}\r\n".encode("latin-1")]
    for name, value in headers:
        if b"\n" in value or b"\r" in value or b"\n" in name or b"\r" in name:
            raise ValueError(f"header {name!r} contains a line break")
        lines.append(b"%b: %b\r\n" % (name, value))
    if isinstance(body, bytes):
        lines.append(b"content-length: %d\r\n" % len(body))
    elif body is not None:
        lines.append(b"transfer-encoding: chunked\r\n")
    elif method in ("POST", "PUT", "PATCH"):
        lines.append(b"content-length: 0\r\n")   # RFC 9110 §8.6: a body-bearing method says it has none
    lines.append(b"\r\n")
    return b"".join(lines)
