"""`brimful serve --workers N`: N serving processes on one port, forked from this one.

The parent binds N listening sockets on the port with SO_REUSEPORT and forks
one worker per socket; the kernel spreads new connections across the
sockets by a hash of their addresses.  Chosen over uvicorn's `workers=`
(one shared socket that every worker accepts from) by measurement
(bench/workers_bench.py, docs/performance.md "Workers"): with one shared socket, whichever
worker's loop wakes first takes every connection queued at that moment, so
long-lived keep-alive connections (SDK pools, a load balancer's) can stay on
one worker while the other idles.

The parent keeps every socket open while it runs: when a worker dies, its
socket and what waits in its queue stay, and a worker that serves accepts
from it until the slot's replacement serves (proxy.workers.handover), so no
queued connection is reset and none waits on a replacement that is loading.
With no other worker serving, connections wait in the queue for the
replacement rather than being refused.

The parent serves nothing.  It restarts a worker that dies: at once after a
worker that ran a while, after a back-off (1, 2, 4 ... 30 s) for a slot whose
workers keep exiting soon after starting, while the other workers serve.
Only when no other worker runs does a worker that cannot start stop
everything (it would fail the same way again).  It forwards SIGTERM
and SIGINT to every worker as SIGTERM (each drains as a lone brimful
would), and exits 0 once all have exited 0.  Workers get SIGTERM if the
parent dies (PR_SET_PDEATHSIG).  A worker holds both signals from its fork
until its server handles them (proxy.signals): one sent while it
starts is delivered then, never lost.

Each worker knows its `WorkerSlot` (proxy.workers.siblings): the pages that must speak
for all workers ask the others through it (proxy.workers.pages).  So the pages' own
listener (server.metrics_port), when there is one, is a single socket every worker
accepts from (`Supervisor.shared`): a scrape every few seconds gains nothing from being
spread, whichever worker takes it answers for all, and the parent holds it open too.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import logging
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from proxy import signals
from proxy.workers import handover
from proxy.workers.siblings import SLOTS_FILE, WorkerSlot, replace_json

log = logging.getLogger("brimful.workers")

STARTUP_FAILURE = 3          # uvicorn's exit status for a server that could not start
QUICK_EXIT_S = 5.0           # a worker that dies this soon after starting, three times running,
QUICK_EXITS_TO_GIVE_UP = 3   # is not going to start: stop everything, if no other worker runs
BACKOFF_FIRST_S = 1.0        # a slot that crash-loops waits 1, 2, 4 ... s before its next start
BACKOFF_MAX_S = 30.0
BACKLOG = 2048               # uvicorn's default

# A worker's body: it starts with SIGTERM and SIGINT blocked, and unblocks them once it handles them
# (proxy.signals.Server does, inside uvicorn's handlers), so none sent meanwhile is lost.
RunWorker = Callable[[WorkerSlot, socket.socket], int]


def listening_sockets(host: str, port: int, count: int, backlog: int = BACKLOG) -> list[socket.socket]:
    """`count` sockets listening on one port with SO_REUSEPORT.

    The port is first bound alone, without SO_REUSEPORT: that fails while any
    other process holds it, which a group of SO_REUSEPORT sockets would
    instead join silently (another brimful's, splitting its traffic).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, port))
        port = probe.getsockname()[1]          # port 0: the kernel's choice, for every socket
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = bound_socket(family, (host, port))
            sockets.append(sock)
            sock.listen(backlog)
    except OSError:
        for sock in sockets:
            sock.close()
        raise
    return sockets


@dataclass
class _Worker:
    slot: WorkerSlot
    pid: int
    started: float
    channel: socket.socket | None     # the supervisor's end of its handover channel (None once it closed)
    quick_exits: int = 0
    serving: bool = False             # it said so (proxy.workers.handover), and has not said it stops


@dataclass
class _Pending:
    """A slot whose worker crash-loops: started again at `due`, after a back-off."""

    slot: WorkerSlot
    due: float
    quick_exits: int


@dataclass
class Supervisor:
    """Forks, watches and stops the workers (see the module docstring)."""

    sockets: list[socket.socket]      # one per worker, or one that every worker shares
    run_worker: RunWorker
    directory: Path
    count: int = 0                    # workers (0: one per socket)
    # Listeners every worker inherits at its fork and accepts from beside its own (server.metrics_port):
    # held open here like `sockets`, so the connections queued on them outlive any one worker.
    shared: list[socket.socket] = field(default_factory=list)
    _workers: dict[int, _Worker] = field(default_factory=dict)    # pid -> worker
    _pending: dict[int, _Pending] = field(default_factory=dict)   # slot index -> its next start
    _restarts: dict[int, int] = field(default_factory=dict)       # slot index -> replacements started
    _adopted: dict[int, int] = field(default_factory=dict)        # slot index -> pid of the worker accepting for it
    _stopping: bool = False
    _failed: int = 0                                               # the exit status once a worker failed
    _wakeup: tuple[int, int] = (-1, -1)

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in signals.STOP_SIGNALS}
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, _no_op)
        self._wakeup = os.pipe()
        for fd in self._wakeup:
            os.set_blocking(fd, False)
        old_wakeup = signal.set_wakeup_fd(self._wakeup[1], warn_on_full_buffer=False)
        count = self.count or len(self.sockets)
        try:
            for index in range(count):
                if not self._stopping:      # stopped meanwhile: the sockets are closed, start no more
                    self._start(WorkerSlot(index, count, self.directory))
            codes = self._wait()
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for fd in self._wakeup:
                os.close(fd)
            self._close_sockets()
            shutil.rmtree(self.directory, ignore_errors=True)
        if self._failed:
            return self._failed
        return 0 if all(code == 0 for code in codes) else 1

    def _wait(self) -> list[int]:
        """Reap workers and start the backed-off ones until none is left; the codes of those asked to stop."""
        codes: list[int] = []
        while self._workers or (self._pending and not self._stopping):
            for talking in self._sleep(self._next_due()):
                self._hear(talking)
            for pid, status in _reap():
                worker = self._workers.pop(pid, None)
                if worker is None:
                    continue
                _close(worker)
                code = os.waitstatus_to_exitcode(status)
                if self._stopping:
                    codes.append(code)
                    if code != 0:
                        log.warning("worker %d (pid %d) exited with status %d", worker.slot.index, pid, code)
                    continue
                self._replace(worker, code)
            now = time.monotonic()
            for index, pending in list(self._pending.items()):
                if self._stopping:
                    self._pending.clear()
                elif pending.due <= now:
                    del self._pending[index]
                    self._start(pending.slot, pending.quick_exits)
            self._hand_over()
        return codes

    def _next_due(self) -> float | None:
        if not self._pending or self._stopping:
            return None
        return max(0.0, min(p.due for p in self._pending.values()) - time.monotonic())

    def _sleep(self, timeout: float | None) -> list[_Worker]:
        """Until a signal (a child's exit, SIGTERM), a worker's word or `timeout`; the workers that spoke.

        Signals wake it through the wakeup pipe.
        """
        talking = {w.channel.fileno(): w for w in self._workers.values() if w.channel is not None}
        ready: list[int] = []
        with contextlib.suppress(InterruptedError):
            ready = select.select([self._wakeup[0], *talking], [], [], timeout)[0]
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wakeup[0], 512):
                pass
        return [talking[fd] for fd in ready if fd in talking]

    def _hear(self, worker: _Worker) -> None:
        assert worker.channel is not None
        messages = handover.heard(worker.channel)
        if messages is None:                # it exited: reaped on its SIGCHLD
            _close(worker)
            return
        for message in messages:
            worker.serving = {handover.SERVING: True, handover.STOPPING: False}.get(message, worker.serving)

    def _hand_over(self) -> None:
        """Each slot whose worker does not serve to a worker that does, and back once it serves."""
        if self._stopping or len(self.sockets) < 2:
            return
        serving = {w.slot.index: w.pid for w in self._workers.values() if w.serving}
        chosen = handover.adoptions(range(len(self.sockets)), serving, self._adopted)
        by_pid = {w.pid: w for w in self._workers.values()}
        for index, pid in self._adopted.items():
            adopter = by_pid.get(pid)
            if chosen.get(index) != pid and adopter is not None and adopter.serving and adopter.channel:
                handover.tell(adopter.channel, handover.RELEASE, index)
        for index, pid in list(chosen.items()):
            if self._adopted.get(index) == pid:
                continue
            adopter = by_pid[pid]
            if adopter.channel is None or not handover.tell(adopter.channel, handover.ADOPT, index,
                                                            self.sockets[index]):
                del chosen[index]           # tried again at the next wake-up
                continue
            log.log(logging.DEBUG if self._starting(index) else logging.INFO,
                    "worker %d (pid %d) accepts worker %d's connections until one of its own serves",
                    adopter.slot.index, pid, index)
        self._adopted = chosen

    def _starting(self, index: int) -> bool:
        """Whether the slot's first worker is still starting (the first to serve takes its socket
        for a moment at every start: not worth a line)."""
        return any(w.slot.index == index and not w.slot.replacement and w.channel is not None
                   for w in self._workers.values())

    def _replace(self, worker: _Worker, code: int) -> None:
        """A worker died: start its slot again, at once or after a back-off; never stop the others for it."""
        index = worker.slot.index
        quick = time.monotonic() - worker.started < QUICK_EXIT_S
        quick_exits = worker.quick_exits + 1 if quick else 0
        serving = self._others_running(index)
        if not serving and (code == STARTUP_FAILURE or quick_exits >= QUICK_EXITS_TO_GIVE_UP):
            log.error("worker %d (pid %d) %s and no other worker runs; stopping", index, worker.pid,
                      "could not start" if code == STARTUP_FAILURE else f"exited {quick_exits} times on start")
            self._failed = code or 1
            self._stop()
            return
        delay = backoff_s(quick_exits, code == STARTUP_FAILURE)
        self._restarts[index] = self._restarts.get(index, 0) + 1
        slot = dataclasses.replace(worker.slot, replacement=True)
        if delay == 0:
            log.warning("worker %d (pid %d) exited with status %d; starting a new one", index, worker.pid, code)
            self._start(slot, quick_exits)
            return
        log.error("worker %d (pid %d) exited with status %d, %d times within %g s of starting; "
                  "starting a new one in %g s, the other workers serve meanwhile",
                  index, worker.pid, code, quick_exits, QUICK_EXIT_S, delay)
        self._pending[index] = _Pending(slot, time.monotonic() + delay, quick_exits)
        self._write_slots()

    def _others_running(self, index: int) -> bool:
        """Whether another worker serves or will: a first worker from its fork, a replacement once it serves."""
        return any(w.slot.index != index and (w.serving or not w.slot.replacement) for w in self._workers.values())

    def _socket_of(self, index: int) -> socket.socket:
        return self.sockets[index if len(self.sockets) > 1 else 0]

    def _write_slots(self) -> None:
        """What /metrics says of each slot (proxy.workers.pages reads it): restarts, and a back-off under way."""
        document = {str(i): {"restarts": self._restarts.get(i, 0), "waiting": i in self._pending}
                    for i in range(self.count or len(self.sockets))}
        replace_json(self.directory / SLOTS_FILE, document)

    def _start(self, slot: WorkerSlot, quick_exits: int = 0) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        channel, theirs = handover.channel_pair()
        slot = dataclasses.replace(slot, channel=theirs)
        # Signals wait until the child has its own handlers: it must never run the parent's.
        signals.hold()
        try:
            pid = os.fork()
            if pid == 0:                                    # pragma: no cover - runs in the worker
                channel.close()
                self._child(slot, parent)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.STOP_SIGNALS)
        os.close(theirs)
        self._workers[pid] = _Worker(slot, pid, time.monotonic(), channel, quick_exits)
        self._write_slots()
        if self._stopping:                                  # a signal came while forking
            os.kill(pid, signal.SIGTERM)

    def _child(self, slot: WorkerSlot, parent: int) -> None:  # pragma: no cover - runs in the worker
        code = 1
        try:
            signal.set_wakeup_fd(-1)
            for fd in self._wakeup:
                os.close(fd)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for sig in signals.STOP_SIGNALS:
                signal.signal(sig, signals.exit_cleanly)
            # They stay blocked: `run_worker` unblocks them once it handles them (proxy.signals).
            _die_with_parent(parent)
            mine = self._socket_of(slot.index)
            for sock in self.sockets:
                if sock is not mine:
                    sock.close()            # the others' come over the channel, when handed over
            for worker in self._workers.values():
                _close(worker)
            code = self.run_worker(slot, mine)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def _on_signal(self, signum: int, frame: object) -> None:
        if not self._stopping:
            log.info("%s: stopping %d workers (each drains its requests)", signal.Signals(signum).name,
                     len(self._workers))
        self._stop()

    def _stop(self) -> None:
        self._stopping = True
        self._pending.clear()
        # The parent's copies closed first: once the workers close theirs the port refuses.
        self._close_sockets()
        for pid in list(self._workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _close_sockets(self) -> None:
        for sock in [*self.sockets, *self.shared]:
            sock.close()


def backoff_s(quick_exits: int, startup_failure: bool) -> float:
    """How long a slot waits before its next start: none after a worker that ran a while, then doubling."""
    if quick_exits == 0 and not startup_failure:
        return 0.0
    return float(min(BACKOFF_MAX_S, BACKOFF_FIRST_S * 2 ** max(0, quick_exits - 1)))


def bound_socket(family: int, address: tuple[str, int]) -> socket.socket:
    """A socket bound to the port beside the others (SO_REUSEPORT), not yet listening."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except OSError:
        sock.close()
        raise
    return sock


def _close(worker: _Worker) -> None:
    """The supervisor's end of a worker's channel, once the worker is gone (or in another worker)."""
    if worker.channel is not None:
        worker.channel.close()
        worker.channel = None
        worker.serving = False


def _reap() -> list[tuple[int, int]]:
    """Every child that has exited, without waiting."""
    out: list[tuple[int, int]] = []
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return out
        if pid == 0:
            return out
        out.append((pid, status))


def _no_op(signum: int, frame: object) -> None:
    """SIGCHLD's handler: its only job is to write the wakeup pipe."""


def serve(host: str, port: int, count: int, run_worker: RunWorker, shared: Sequence[socket.socket] = ()) -> int:
    """Run `count` workers on host:port until SIGTERM; the process's exit status.  `shared`: listening
    sockets every worker accepts from too (`Supervisor.shared`), closed with the port's at the stop."""
    sockets = listening_sockets(host, port, count)
    directory = Path(tempfile.mkdtemp(prefix="brimful-workers-"))
    log.info("%d workers on http://%s:%d (SO_REUSEPORT)", count, host, sockets[0].getsockname()[1])
    return Supervisor(sockets, run_worker, directory, shared=list(shared)).run()


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the worker
    """Ask Linux for SIGTERM when the parent dies, so no worker outlives a killed supervisor."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:              # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
