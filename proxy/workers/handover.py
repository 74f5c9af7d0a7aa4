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
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import uvicorn

from proxy import signals

log = logging.getLogger("brimful.workers")

SERVING, STOPPING, ADOPT, RELEASE = b"serving", b"stopping", b"adopt", b"release"
MAX_MESSAGE = 64
ACCEPT_BATCH = 100           # connections accepted per wake-up at most (asyncio's default backlog)
ACCEPT_RETRY_S = 1.0         # after EMFILE and the like (asyncio's constants.ACCEPT_RETRY_DELAY)

Serve = Callable[[socket.socket], None]     # one accepted connection, to serve


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
    """A worker's end of its channel: it says when it serves, and accepts from the sockets it is handed.

    Its own accept loop, not an asyncio server per socket: closing an asyncio server while
    connections it accepted wait for their transport fails them (Python 3.11's `Server._attach`
    asserts the server is open; the connection is left unanswered, found by
    tests/workers/test_restarts.py under load).  Here a connection is handed to `serve` in the
    callback that accepted it, so letting go of a socket can never strand one.
    """

    def __init__(self, fd: int) -> None:
        self._channel = socket.socket(fileno=fd) if fd >= 0 else None
        self._adopted: dict[int, socket.socket] = {}
        self._serve: Serve | None = None
        self._stopped = False

    @property
    def adopted(self) -> set[int]:
        """The slots whose sockets this worker accepts from now."""
        return set(self._adopted)

    def start(self, serve: Serve) -> None:
        """Once this worker's server accepts: tell the supervisor, and follow its orders."""
        if self._channel is None:
            return
        self._serve = serve
        self._channel.setblocking(False)
        asyncio.get_running_loop().add_reader(self._channel.fileno(), self._read)
        self._say(SERVING)

    def stop(self) -> None:
        """Before the drain: let go of every handed socket, take no more, and tell the supervisor."""
        self._stopped = True
        for index in list(self._adopted):
            self._release(index)
        self._say(STOPPING)

    def _say(self, word: bytes) -> None:
        if self._channel is not None:
            with contextlib.suppress(OSError):
                self._channel.send(word)

    def _read(self) -> None:
        """The supervisor's orders, each carried out as it is read (so in the order given)."""
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
            handed = [socket.socket(fileno=fd) for fd in fds]
            verb, _, index = message.partition(b" ")
            try:
                if verb == ADOPT and handed and not self._stopped:
                    self._adopt(int(index), handed.pop())
                elif verb == RELEASE:
                    self._release(int(index))
            except ValueError:
                log.warning("unknown order from the supervisor: %r", message)
            for sock in handed:
                sock.close()

    def _adopt(self, index: int, sock: socket.socket) -> None:
        self._release(index)
        sock.setblocking(False)
        self._adopted[index] = sock
        self._listen(index, sock)

    def _listen(self, index: int, sock: socket.socket) -> None:
        if self._adopted.get(index) is sock:
            asyncio.get_running_loop().add_reader(sock.fileno(), self._accept, index, sock)

    def _release(self, index: int) -> None:
        """This worker's copy closed; the socket stays open in the supervisor (and in the slot's worker)."""
        sock = self._adopted.pop(index, None)
        if sock is not None:
            asyncio.get_running_loop().remove_reader(sock.fileno())
            sock.close()

    def _accept(self, index: int, sock: socket.socket) -> None:
        assert self._serve is not None
        for _ in range(ACCEPT_BATCH):
            try:
                conn, _ = sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:           # out of descriptors or memory: pause, as asyncio's servers do
                log.warning("worker %d's socket: accept failed (%s); trying again in %g s",
                            index, exc, ACCEPT_RETRY_S)
                loop = asyncio.get_running_loop()
                loop.remove_reader(sock.fileno())
                loop.call_later(ACCEPT_RETRY_S, self._listen, index, sock)
                return
            self._serve(conn)


class WorkerServer(signals.Server):
    """uvicorn's server for one of `--workers N`, speaking to the supervisor through a Handover.

    It takes the SIGTERM and SIGINT its worker held from the fork (proxy.signals).

    A connection accepted from a handed socket is served with the same protocol, limits and
    app state as the worker's own, and is drained with them.
    """

    def __init__(self, config: uvicorn.Config, channel: int) -> None:
        super().__init__(config)
        self.handover = Handover(channel)
        self._starting: set[asyncio.Task[Any]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.handover.start(self._serve_handed)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.handover.stop()                # another worker takes this one's socket while it drains
        await super().shutdown(sockets)

    def _serve_handed(self, conn: socket.socket) -> None:
        config = self.config
        protocol = functools.partial(config.http_protocol_class, config=config,  # type: ignore[call-arg]  # as uvicorn's own
                                     server_state=self.server_state, app_state=self.lifespan.state)
        task = asyncio.get_running_loop().create_task(
            asyncio.get_running_loop().connect_accepted_socket(protocol, conn))
        self._starting.add(task)            # held until its transport is made (a task nobody holds may vanish)
        task.add_done_callback(self._starting.discard)
