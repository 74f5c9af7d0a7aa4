"""A slot's listening socket served by another worker while the slot's own does not serve.

Every slot's SO_REUSEPORT socket stays open in the supervisor for as long as `brimful serve`
runs.  Closing a listener would reset the connections waiting in its accept queue and its
half-done handshakes (Linux moves them to another listener of the port only with
`net.ipv4.tcp_migrate_req` = 1, 5.14 and later, off by default), and a listener that nobody
accepts from keeps its connections waiting.  So while a slot's worker does not serve (it died,
its replacement is loading or backing off, it is draining, or it has not started yet), a worker
that serves accepts from that slot's socket beside its own, and lets go once the slot's own
worker serves.  Nothing is closed, so nothing is reset: the way HAProxy's and Envoy's restarts
pass listening sockets on instead of closing them.

The supervisor and each worker share a socketpair made at the fork (`WorkerSlot.channel` is
the worker's end).  The worker says `serving` once its server accepts and `stopping` when it
begins to drain; the supervisor says `adopt <slot>` with the slot's socket attached
(SCM_RIGHTS) and `release <slot>`.  Which worker accepts which slot is `adoptions`, a pure rule.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import socket
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping

import uvicorn

log = logging.getLogger("brimful.workers")

SERVING, STOPPING, ADOPT, RELEASE = b"serving", b"stopping", b"adopt", b"release"
MAX_MESSAGE = 64

Adopt = Callable[[socket.socket], Awaitable[asyncio.AbstractServer]]


def channel_pair() -> tuple[socket.socket, int]:
    """The supervisor's end (non-blocking) and the worker's end (a descriptor the fork keeps)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.setblocking(False)
    return mine, theirs.detach()


def adoptions(slots: Iterable[int], serving: Mapping[int, int], current: Mapping[int, int]) -> dict[int, int]:
    """Which serving worker (pid) accepts from each slot whose own worker does not serve.  Pure.

    `serving`: slot -> pid of each worker that serves; `current`: slot -> pid of its adopter now.
    An adoption stays while its adopter serves; a new one goes to the worker with the fewest,
    the lowest slot first.  No worker serving: none (connections wait in the queues for one).
    """
    pids = set(serving.values())
    chosen = {slot: pid for slot, pid in current.items() if slot not in serving and pid in pids}
    load = Counter(chosen.values())
    for slot in slots:
        if slot in serving or slot in chosen or not pids:
            continue
        pid = min(sorted(serving.items()), key=lambda item: load[item[1]])[1]
        chosen[slot] = pid
        load[pid] += 1
    return chosen


def tell(channel: socket.socket, verb: bytes, index: int, sock: socket.socket | None = None) -> bool:
    """The supervisor's order to a worker; False when it could not be sent (the worker is gone)."""
    message = b"%s %d" % (verb, index)
    try:
        if sock is None:
            channel.send(message)
        else:
            socket.send_fds(channel, [message], [sock.fileno()])
    except OSError:
        return False
    return True


def heard(channel: socket.socket) -> list[bytes] | None:
    """What a worker said since the last call; None once it closed its end (it exited)."""
    messages: list[bytes] = []
    while True:
        try:
            message = channel.recv(MAX_MESSAGE)
        except BlockingIOError:
            return messages
        except OSError:
            return None
        if not message:
            return None
        messages.append(message)


class Handover:
    """A worker's end of its channel: it says when it serves, and serves the sockets it is handed."""

    def __init__(self, fd: int) -> None:
        self._channel = socket.socket(fileno=fd) if fd >= 0 else None
        self._orders: asyncio.Queue[tuple[bytes, list[int]]] = asyncio.Queue()
        self._adopted: dict[int, asyncio.AbstractServer] = {}
        self._follower: asyncio.Task[None] | None = None

    def start(self, adopt: Adopt) -> None:
        """Once this worker's server accepts: tell the supervisor, and follow its orders."""
        if self._channel is None:
            return
        self._channel.setblocking(False)
        asyncio.get_running_loop().add_reader(self._channel.fileno(), self._read)
        self._follower = asyncio.get_running_loop().create_task(self._follow(adopt))
        self.say(SERVING)

    def say(self, word: bytes) -> None:
        if self._channel is not None:
            with contextlib.suppress(OSError):
                self._channel.send(word)

    def _read(self) -> None:
        assert self._channel is not None
        while True:
            try:
                message, fds, _, _ = socket.recv_fds(self._channel, MAX_MESSAGE, 1)
            except BlockingIOError:
                return
            except OSError:
                message, fds = b"", []
            if not message:                  # the supervisor is gone: PR_SET_PDEATHSIG stops this worker
                asyncio.get_running_loop().remove_reader(self._channel.fileno())
                return
            self._orders.put_nowait((message, fds))

    async def _follow(self, adopt: Adopt) -> None:
        """The orders one at a time, in the order given (a release never overtakes its adopt)."""
        while True:
            message, fds = await self._orders.get()
            verb, _, index = message.partition(b" ")
            try:
                if verb == ADOPT and fds:
                    sock = socket.socket(fileno=fds.pop())
                    try:
                        self._adopted[int(index)] = await adopt(sock)
                    except OSError as exc:       # its queue waits for another worker
                        log.warning("could not serve worker %s's socket: %s", index.decode(), exc)
                        sock.close()
                elif verb == RELEASE and (server := self._adopted.pop(int(index), None)) is not None:
                    server.close()               # this worker's copy only: the supervisor keeps the socket
            except ValueError:
                log.warning("unknown order from the supervisor: %r", message)
            for fd in fds:
                socket.socket(fileno=fd).close()


class WorkerServer(uvicorn.Server):
    """uvicorn's server for one of `--workers N`, speaking to the supervisor through a Handover.

    An adopted socket is served with the same protocol, limits and app state as the worker's
    own, and is closed with it when the worker drains.
    """

    def __init__(self, config: uvicorn.Config, channel: int) -> None:
        super().__init__(config)
        self.handover = Handover(channel)
        self._draining = False

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.handover.start(self._adopt)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._draining = True
        self.handover.say(STOPPING)         # another worker takes this one's socket while it drains
        await super().shutdown(sockets)

    async def _adopt(self, sock: socket.socket) -> asyncio.AbstractServer:
        config = self.config
        protocol = functools.partial(config.http_protocol_class, config=config,  # type: ignore[call-arg]  # as uvicorn's own
                                     server_state=self.server_state, app_state=self.lifespan.state)
        server = await asyncio.get_running_loop().create_server(protocol, sock=sock, backlog=config.backlog)
        if self._draining:                  # began while it was being made: not past the drain's close
            server.close()
            raise OSError("this worker is draining")
        self.servers = [s for s in self.servers if s.is_serving()] + [server]
        return server
