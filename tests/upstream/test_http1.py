"""proxy.upstream.http1, the upstream client, against raw-socket servers on loopback.

Each server here writes exact bytes, so every framing case (keep-alive,
Connection: close, chunked, close-delimited, HEAD) and every failure
(timeouts, resets, garbage) is reproduced on purpose, not hoped for.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from proxy.upstream import http1
from proxy.upstream.http1 import Broken, ConnectError, Pool, ReadTimeout

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "Server"], Awaitable[None]]


class Server:
    """A loopback server running `handler` per connection, counting connections and requests."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.closed = asyncio.Event()        # set when a client closes a connection
        self.requests: list[tuple[bytes, dict[bytes, bytes], bytes]] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def read_request(self, reader: asyncio.StreamReader) -> tuple[bytes, dict[bytes, bytes], bytes] | None:
        """One request (head + body by content-length or chunked); None at EOF."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.closed.set()
            return None
        line, *rest = head[:-4].split(b"\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(b":") for h in rest)}
        body = b""
        if b"content-length" in headers:
            body = await reader.readexactly(int(headers[b"content-length"]))
        elif headers.get(b"transfer-encoding") == b"chunked":
            while True:
                size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
                chunk = await reader.readexactly(size + 2)
                if size == 0:
                    break
                body += chunk[:-2]
        self.requests.append((line, headers, body))
        return line, headers, body


def ok(body: bytes = b"ok", extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n%b\r\n%b" % (len(body), extra, body)


async def answer_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
    while await server.read_request(reader) is not None:
        writer.write(ok(b"hello"))


def reply(raw: bytes, *, hold: bool = False) -> Handler:
    """Read one request and write `raw`; then close, or with `hold` wait for the client to close."""
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        writer.write(raw)
        await writer.drain()
        if hold:
            await server.read_request(reader)    # returns None when the client drops the connection
    return handler


async def until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    """Let the loop run until `condition` holds (it depends on I/O the loop must process)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.001)


def pool(server: Server, **kw: float) -> Pool:
    return Pool(server.url, connect_timeout=kw.pop("connect_timeout", 2.0), limit=int(kw.pop("limit", 16)))


async def get(p: Pool, path: str = "/", method: str = "GET", body: bytes | AsyncIterator[bytes] | None = None,
              timeout: float = 5.0, idle: float = 5.0) -> tuple[int, bytes]:
    response = await p.request(method, path, [], body, timeout=timeout, idle_timeout=idle)
    try:
        return response.status, await response.read()
    finally:
        response.release()


async def test_keep_alive_connection_is_reused() -> None:
    async with Server(answer_each) as server:
        p = pool(server)
        for _ in range(5):
            assert await get(p) == (200, b"hello")
        assert server.connections == 1 and len(server.requests) == 5
        await p.close()


async def test_connection_close_answer_is_not_reused() -> None:
    async with Server(reply(ok(b"bye", b"connection: close\r\n"))) as server:
        p = pool(server)
        assert await get(p) == (200, b"bye")
        assert await get(p) == (200, b"bye")
        assert server.connections == 2


async def test_body_without_length_ends_with_the_connection() -> None:
    async def unframed(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\npart one, ")
        await writer.drain()
        writer.write(b"part two")

    async with Server(unframed) as server:
        p = pool(server)
        assert await get(p) == (200, b"part one, part two")
        assert await get(p) == (200, b"part one, part two")   # a fresh connection, not the closed one
        assert server.connections == 2


async def test_chunked_answer_is_relayed_chunk_by_chunk() -> None:
    """The first chunk is readable while the server has not yet sent the second."""
    release = asyncio.Event()

    async def chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n")
        await release.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await server.read_request(reader)

    async with Server(chunked) as server:
        p = pool(server)
        response = await p.request("GET", "/", [], None, timeout=5, idle_timeout=5)
        assert await response.next_chunk() == b"first"
        release.set()
        assert await response.next_chunk() == b"second"
        assert await response.next_chunk() == b""
        response.release()
        assert p._idle, "a complete chunked answer leaves its connection reusable"


async def test_request_framing_and_target() -> None:
    async with Server(answer_each) as server:
        p = Pool(server.url + "/prefix/", connect_timeout=2)

        async def parts() -> AsyncIterator[bytes]:
            yield b'{"a":'
            yield b""
            yield b"1}"

        await get(p, "/v1/x?q=1", "POST", b'{"a":1}')
        await get(p, "/v1/x", "POST", parts())
        await get(p, "/v1/x", "POST", None)
        await get(p, "/v1/models", "GET", None)
        (l1, h1, b1), (_l2, h2, b2), (_l3, h3, b3), (l4, h4, _b4) = server.requests
        assert l1 == b"POST /prefix/v1/x?q=1 HTTP/1.1" and h1[b"content-length"] == b"7" and b1 == b'{"a":1}'
        assert h1[b"host"] == server.url.removeprefix("http://").encode()
        assert h2[b"transfer-encoding"] == b"chunked" and b"content-length" not in h2 and b2 == b'{"a":1}'
        assert h3[b"content-length"] == b"0" and b3 == b""
        assert l4 == b"GET /prefix/v1/models HTTP/1.1" and b"content-length" not in h4


async def test_header_with_a_line_break_is_refused_before_sending() -> None:
    async with Server(answer_each) as server:
        p = pool(server)
        with pytest.raises(ValueError):
            await p.request("GET", "/", [(b"x-evil", b"a\r\nx-injected: 1")], None, timeout=5, idle_timeout=5)
        assert server.requests == []


async def test_head_answer_has_no_body_even_with_a_length() -> None:
    async def head(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: Server) -> None:
        while await server.read_request(reader) is not None:
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n")

    async with Server(head) as server:
        p = pool(server)
        assert await get(p, method="HEAD", timeout=2, idle=2) == (200, b"")


async def test_pool_limit_makes_the_next_request_wait_for_a_free_connection() -> None:
    async with Server(answer_each) as server:
        p = pool(server, limit=1)
        first = await p.request("GET", "/", [], None, timeout=5, idle_timeout=5)
        second = asyncio.ensure_future(get(p))
        await until(lambda: bool(p._waiters))
        assert not second.done() and server.connections == 1
        assert await first.read() == b"hello"
        first.release()
        assert await second == (200, b"hello")
        assert server.connections == 1


async def test_waiting_for_headers_times_out_and_drops_the_connection() -> None:
    async with Server(reply(b"", hold=True)) as server:
        p = pool(server)
        with pytest.raises(ReadTimeout):
            await p.request("GET", "/", [], None, timeout=0.2, idle_timeout=5)
        await asyncio.wait_for(server.closed.wait(), 5)
        assert p._open == 0


async def test_a_stalled_body_times_out_with_the_idle_timeout() -> None:
    async with Server(reply(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", hold=True)) as server:
        p = pool(server)
        response = await p.request("GET", "/", [], None, timeout=5, idle_timeout=0.2)
        assert await response.next_chunk() == b"abc"
        with pytest.raises(ReadTimeout):
            await response.next_chunk()
        response.release()
        await asyncio.wait_for(server.closed.wait(), 5)
        assert p._open == 0 and not p._idle


async def test_idle_connection_closed_by_the_server_is_not_used_again() -> None:
    # The server answers, then closes: like uvicorn's keep-alive timeout, without saying so.
    async with Server(reply(ok(b"hello"))) as server:
        p = pool(server)
        assert await get(p) == (200, b"hello")
        await until(lambda: not p._idle)    # the close reaches the pool's connection
        assert await get(p) == (200, b"hello")
        assert server.connections == 2 and p._open == 1


@pytest.mark.parametrize("interim", [b"HTTP/1.1 100 Continue\r\n\r\n",
                                     b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n"],
                         ids=["100", "100+103"])
async def test_interim_answers_are_skipped_for_the_final_one(interim: bytes) -> None:
    """uvicorn (vLLM's server) answers `Expect: 100-continue` with 100 before the real answer."""
    async with Server(reply(interim + ok(b"final", b"x-final: 1\r\n"), hold=True)) as server:
        p = pool(server)
        response = await p.request("POST", "/", [], b"{}", timeout=5, idle_timeout=5)
        assert (response.status, await response.read()) == (200, b"final")
        assert response.headers.get("x-final") == "1" and "link" not in response.headers
        response.release()
        await p.close()


async def test_connection_refused_and_garbage_and_reset() -> None:
    async with Server(answer_each) as server:
        url = server.url
    with pytest.raises(ConnectError):
        await get(Pool(url, connect_timeout=2))

    async with Server(reply(b"SMTP ready\r\n\r\n")) as server:
        with pytest.raises(Broken, match="invalid HTTP response"):
            await get(pool(server))

    async with Server(reply(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly this")) as server:
        with pytest.raises(Broken, match="closed the connection"):
            await get(pool(server))


async def test_large_body_to_a_slow_reader_pauses_the_socket_and_arrives_intact() -> None:
    payload = bytes(range(256)) * (4 * http1.HIGH_WATER // 256)

    async with Server(reply(ok(payload), hold=True)) as server:
        p = pool(server)
        response = await p.request("GET", "/", [], None, timeout=5, idle_timeout=5)
        conn = response._conn
        assert conn is not None
        while not conn.read_paused:          # the reader is not reading: the socket must pause
            await conn.wait(5)
        assert conn.buffered <= http1.HIGH_WATER + 256 * 1024
        received = hashlib.sha256(await response.read()).hexdigest()
        assert received == hashlib.sha256(payload).hexdigest()
        response.release()


async def test_close_mid_body_closes_the_upstream_connection() -> None:
    async with Server(reply(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n", hold=True)) as server:
        p = pool(server)
        response = await p.request("GET", "/", [], None, timeout=5, idle_timeout=5)
        assert await response.next_chunk() == b"abc"
        response.close()
        await asyncio.wait_for(server.closed.wait(), 5)
        assert p._open == 0


async def test_connections_idle_past_the_keepalive_are_not_reused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(http1, "KEEPALIVE_SECONDS", 0.0)
    async with Server(answer_each) as server:
        p = pool(server)
        assert await get(p) == (200, b"hello")
        assert await get(p) == (200, b"hello")
        assert server.connections == 2 and p._open == 1


async def test_a_cancelled_waiter_does_not_keep_the_slot() -> None:
    async with Server(answer_each) as server:
        p = pool(server, limit=1)
        first = await p.request("GET", "/", [], None, timeout=5, idle_timeout=5)
        gone = asyncio.ensure_future(get(p))
        await until(lambda: len(p._waiters) == 1)
        stays = asyncio.ensure_future(get(p))
        await until(lambda: len(p._waiters) == 2)
        gone.cancel()
        await first.read()
        first.release()
        assert await stays == (200, b"hello")
        assert gone.cancelled() and server.connections == 1
