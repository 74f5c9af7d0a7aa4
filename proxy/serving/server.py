"""The client side of the wire: uvicorn's httptools protocol with the limits it lacks.

uvicorn 0.54 on httptools bounds none of these (measured against brimful):

* the size of a request head: 100 connections each holding an unfinished
  8 MiB header line cost +807 MiB;
* the time to send one: half a request line kept a connection for 320 s and
  more, and a connection that sends nothing at all is kept forever (its
  keep-alive timer only starts after a first response);
* the gap between two pieces of a body;
* the number of connections: 21,000 idle ones exhausted the descriptors and
  new requests got an empty reply.

`BrimfulHttpProtocol` adds each limit (`Limits`, from `[server]`) and
answers what it refuses in OpenAI's error shape where HTTP lets it answer
(431 for a head too large, 408 for a head or body too slow, 400 for a
malformed request, 503 when no connection can be made room for); a
connection that has sent nothing is just closed.  At the connection limit
the connection idle longest (no request under way) is closed to make room,
so a flood of idle or slow connections cannot lock out new clients.

It also starts a request's ASGI task only once the bytes that carried its
head were parsed without error: llhttp rejects some requests after the
headers-complete callback (`Transfer-Encoding: xchunked`), and uvicorn had
already started the app, which forwarded an empty body upstream while the
client got its 400.  Nothing the server refuses reaches the app.

Cost on the hot path: one Python call around each `data_received` and a
few attribute and dict updates per request; a request that arrives in one
piece arms no timer and copies nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
from dataclasses import dataclass
from typing import Any, ClassVar

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from proxy import errors
from proxy.config import Config
from proxy.errors import BrimfulError

log = logging.getLogger("brimful.server")

# Descriptors kept free for everything that is not a client connection:
# upstream connections come on top (upstream.max_connections), then files,
# the length log, tokenizer files, the event loop's own.
RESERVED_FDS = 256


@dataclass(frozen=True)
class Limits:
    """What one client connection may cost (`[server]` in the configuration)."""

    max_header_bytes: int = 64 * 1024     # request line + headers (431 above)
    header_timeout: float = 15.0          # from connecting (or the last answer) to a complete head (408)
    body_timeout: float = 30.0            # longest gap between two pieces of a body (408)
    max_connections: int = 10_000         # client connections at once; the idlest make room


def raise_fd_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard one (as servers do); the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    return soft


def connection_cap(configured: int, fd_limit: int, upstream_connections: int) -> int:
    """The client-connection limit: the configured one, or (0) what the descriptor limit leaves.

    Pure.  Never more than the descriptors can hold: a limit above them would
    let accept() fail with EMFILE, the failure the limit exists to prevent.
    """
    room = max(16, fd_limit - upstream_connections - RESERVED_FDS)
    return min(configured, room) if configured > 0 else room


def limits_from(config: Config, fd_limit: int) -> Limits:
    server = config.server
    return Limits(
        max_header_bytes=server.max_header_bytes,
        header_timeout=server.header_timeout,
        body_timeout=server.body_timeout,
        max_connections=connection_cap(server.max_connections, fd_limit, config.upstream.max_connections),
    )


def protocol_class(limits: Limits) -> type[BrimfulHttpProtocol]:
    """The protocol uvicorn instantiates per connection, bound to `limits`."""
    return type("BrimfulHttpProtocol", (BrimfulHttpProtocol,), {"limits": limits})


def uvicorn_settings(config: Config, fd_limit: int | None = None) -> dict[str, Any]:
    """uvicorn's keyword arguments for brimful's server side (cli and tests alike)."""
    limits = limits_from(config, fd_limit if fd_limit is not None else raise_fd_limit())
    return {
        "http": protocol_class(limits),
        "ws": "none",                                  # brimful relays no WebSocket
        "timeout_keep_alive": max(1, round(config.server.keepalive_timeout)),
        "backlog": min(limits.max_connections, 4096),
    }


def error_response(err: BrimfulError) -> bytes:
    """A whole HTTP/1.1 answer that closes the connection, in OpenAI's error shape."""
    body = err.body_bytes()
    head = [b"HTTP/1.1 %d %s\r\n" % (err.status, _REASONS.get(err.status, b"Error"))]
    for name, value in err.response_headers([(b"connection", b"close")]):
        head.append(b"%s: %s\r\n" % (name, value))
    head.append(b"content-length: %d\r\n\r\n" % len(body))
    return b"".join(head) + body


_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}


class BrimfulHttpProtocol(HttpToolsProtocol):
    """One client connection, with `limits` enforced (see the module docstring).

    Timers: one per connection from connecting to its first head, one for a
    head or body that does not arrive in one piece; a request that arrives
    whole (the usual case) arms none.
    """

    limits: ClassVar[Limits] = Limits()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # uvicorn narrows it so too
        self._head_bytes = 0          # bytes of the request head being received
        self._parsed_head = 0         # bytes of it the parser has read (request line and headers)
        self._in_head = True          # between requests: the next bytes are a head
        self._completed = False       # a message ended during the current data_received
        self._feeding = False
        self._deferred: list[tuple[Any, Any]] = []
        self._body_seen = 0.0         # loop time of the last body bytes
        self._timer: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        idle = _idle_connections(self.server_state)
        if len(self.connections) > self.limits.max_connections and not _make_room(idle):
            log.warning("%d client connections, each with a request under way: refusing a new one "
                        "(server.max_connections)", len(self.connections) - 1)
            self._refuse(errors.too_many_connections(self.limits.max_connections))
            return
        idle[self] = None
        self._arm(self.limits.header_timeout, self._head_expired)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        _idle_connections(self.server_state).pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        in_head = self._in_head
        self._completed = False
        self._feeding = True
        try:
            super().data_received(data)
        finally:
            self._feeding = False
        deferred = self._deferred
        if deferred:
            self._deferred = []
            if not self.transport.is_closing():      # closing: the parser refused the bytes (400 sent)
                for cycle, app in deferred:
                    super()._start_asgi_task(cycle, app)
        if self.transport.is_closing():
            return
        if self._in_head:
            if in_head and not self._completed:      # a head still arriving
                self._head_bytes += len(data)
                if self._head_bytes > self.limits.max_header_bytes:
                    self._refuse(errors.header_too_large(self.limits.max_header_bytes))
                elif self._timer is None:
                    self._arm(self.limits.header_timeout, self._head_expired)
        else:                                        # a body still arriving
            self._body_seen = self.loop.time()
            if self._timer is None:
                self._arm(self.limits.body_timeout, self._body_expired)

    def _start_asgi_task(self, cycle: Any, app: Any) -> None:
        if self._feeding:
            self._deferred.append((cycle, app))      # started once the whole chunk parsed
        else:
            super()._start_asgi_task(cycle, app)     # a pipelined request, after the previous answer

    # -- parser callbacks ------------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._count_head(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count_head(len(name) + len(value) + 4)       # "name: value\r\n"
        super().on_header(name, value)

    def _count_head(self, size: int) -> None:
        """The head as parsed: a head that arrives whole in one read never reaches the
        byte count in data_received (taken only while a head is still arriving), so a
        60-100 KiB head in one write was served; counted here too, it is refused."""
        self._parsed_head += size
        if self._parsed_head > self.limits.max_header_bytes and not self.transport.is_closing():
            self._refuse(errors.header_too_large(self.limits.max_header_bytes))

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._parsed_head = 0
        _idle_connections(self.server_state).pop(self, None)
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._in_head = True
        self._completed = True
        self._disarm()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and not self.transport.is_closing():
            _idle_connections(self.server_state)[self] = None

    def send_400_response(self, msg: str) -> None:
        if not self.transport.is_closing():
            self._refuse(errors.malformed_request(msg))

    # -- limits ------------------------------------------------------------------------

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        if delay > 0:
            self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _head_expired(self) -> None:
        self._timer = None
        if self.transport.is_closing() or not self._in_head:
            return
        if self._head_bytes:
            self._refuse(errors.request_timeout("request head", self.limits.header_timeout))
        else:
            self.transport.close()                   # sent nothing: nothing to answer

    def _body_expired(self) -> None:
        self._timer = None
        if self.transport.is_closing() or self._in_head:
            return
        now = self.loop.time()
        if self.flow.read_paused:
            # brimful stopped reading (the app has not taken what came): not the client's delay.
            self._body_seen = now
        quiet = now - self._body_seen
        if quiet < self.limits.body_timeout:
            self._arm(self.limits.body_timeout - quiet, self._body_expired)
        elif self.cycle is not None and not self.cycle.response_started:
            self._refuse(errors.request_timeout("request body", self.limits.body_timeout))
        else:
            self.transport.close()

    def _refuse(self, err: BrimfulError) -> None:
        """Answer `err` and close: the connection is not used again, the app sees a disconnect."""
        self._disarm()
        _idle_connections(self.server_state).pop(self, None)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
            cycle.disconnected = True                # the app's own answer is dropped
            cycle.message_event.set()
        with contextlib.suppress(RuntimeError):      # the transport may be closing already
            self.transport.write(error_response(err))
        self.transport.close()


def _make_room(idle: dict[BrimfulHttpProtocol, None]) -> bool:
    """Close the connection idle longest; False when every connection has a request under way."""
    for oldest in idle:
        idle.pop(oldest)
        oldest._disarm()
        oldest.transport.close()
        return True
    return False


def _idle_connections(state: Any) -> dict[BrimfulHttpProtocol, None]:
    """Connections with no request under way, the longest idle first (kept on uvicorn's shared state)."""
    idle = getattr(state, "brimful_idle", None)
    if idle is None:
        idle = state.brimful_idle = {}
    return idle
