"""`brimful serve --workers N`: N serving processes on one port, forked from this one.

The parent binds N listening sockets on the port with SO_REUSEPORT and forks
one worker per socket; the kernel spreads new connections across the
sockets by a hash of their addresses.  Chosen over uvicorn's `workers=`
(one shared socket that every worker accepts from) by measurement
(bench/workers_bench.py, docs/performance.md "Workers"): with one shared socket, whichever
worker's loop wakes first takes every connection queued at that moment, so
long-lived keep-alive connections (SDK pools, a load balancer's) can stay on
one worker while the other idles.  The parent keeps every socket open while
it runs, so the connections that land on a worker being replaced wait in its
socket's queue for the replacement instead of being refused.

The parent serves nothing.  It restarts a worker that dies (one that cannot
start stops everything: it would fail the same way again), forwards SIGTERM
and SIGINT to every worker as SIGTERM (each drains as a lone brimful
would), and exits 0 once all have exited 0.  Workers get SIGTERM if the
parent dies (PR_SET_PDEATHSIG).

Each worker knows its `WorkerSlot` (proxy.workers.siblings): the pages that must speak
for all workers ask the others through it (proxy.workers.pages).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from proxy.workers.siblings import WorkerSlot

log = logging.getLogger("brimful.workers")

STARTUP_FAILURE = 3          # uvicorn's exit status for a server that could not start
QUICK_EXIT_S = 5.0           # a worker that dies this soon after starting, three times running,
QUICK_EXITS_TO_GIVE_UP = 3   # is not going to start: stop everything
BACKLOG = 2048               # uvicorn's default
_SIGNALS = (signal.SIGTERM, signal.SIGINT)

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
            sock = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((host, port))
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
    quick_exits: int = 0


@dataclass
class Supervisor:
    """Forks, watches and stops the workers (see the module docstring)."""

    sockets: list[socket.socket]      # one per worker, or one that every worker shares
    run_worker: RunWorker
    directory: Path
    count: int = 0                    # workers (0: one per socket)
    _workers: dict[int, _Worker] = field(default_factory=dict)    # pid -> worker
    _stopping: bool = False
    _failed: int = 0                                               # the exit status once a worker failed

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in _SIGNALS}
        count = self.count or len(self.sockets)
        try:
            for index in range(count):
                self._start(WorkerSlot(index, count, self.directory))
            codes = self._wait()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._close_sockets()
            shutil.rmtree(self.directory, ignore_errors=True)
        if self._failed:
            return self._failed
        return 0 if all(code == 0 for code in codes) else 1

    def _wait(self) -> list[int]:
        """Reap workers until none is left; the exit codes of those that stopped when asked."""
        codes: list[int] = []
        while self._workers:
            try:
                pid, status = os.wait()
            except ChildProcessError:
                break
            worker = self._workers.pop(pid, None)
            if worker is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            if self._stopping:
                codes.append(code)
                if code != 0:
                    log.warning("worker %d (pid %d) exited with status %d", worker.slot.index, pid, code)
                continue
            self._replace(worker, code)
        return codes

    def _replace(self, worker: _Worker, code: int) -> None:
        index = worker.slot.index
        quick = time.monotonic() - worker.started < QUICK_EXIT_S
        quick_exits = worker.quick_exits + 1 if quick else 0
        if code == STARTUP_FAILURE or quick_exits >= QUICK_EXITS_TO_GIVE_UP:
            log.error("worker %d (pid %d) %s; stopping every worker", index, worker.pid,
                      "could not start" if code == STARTUP_FAILURE else f"exited {quick_exits} times on start")
            self._failed = code or 1
            self._stop()
            return
        log.warning("worker %d (pid %d) exited with status %d; starting a new one", index, worker.pid, code)
        self._start(worker.slot, quick_exits)

    def _start(self, slot: WorkerSlot, quick_exits: int = 0) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        parent = os.getpid()
        # Signals wait until the child has its own handlers: it must never run the parent's.
        signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
        try:
            pid = os.fork()
            if pid == 0:                                    # pragma: no cover - runs in the worker
                self._child(slot, parent)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        self._workers[pid] = _Worker(slot, pid, time.monotonic(), quick_exits)
        if self._stopping:                                  # a signal came while forking
            os.kill(pid, signal.SIGTERM)

    def _child(self, slot: WorkerSlot, parent: int) -> None:  # pragma: no cover - runs in the worker
        code = 1
        try:
            for sig in _SIGNALS:
                signal.signal(sig, _exit_cleanly)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            _die_with_parent(parent)
            mine = self.sockets[slot.index if len(self.sockets) > 1 else 0]
            for sock in self.sockets:
                if sock is not mine:
                    sock.close()
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
        # The parent's copies closed first: once the workers close theirs the port refuses.
        self._close_sockets()
        for pid in list(self._workers):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)

    def _close_sockets(self) -> None:
        for sock in self.sockets:
            sock.close()


def serve(host: str, port: int, count: int, run_worker: RunWorker) -> int:
    """Run `count` workers on host:port until SIGTERM; the process's exit status."""
    sockets = listening_sockets(host, port, count)
    directory = Path(tempfile.mkdtemp(prefix="brimful-workers-"))
    log.info("%d workers on http://%s:%d (SO_REUSEPORT)", count, host, sockets[0].getsockname()[1])
    return Supervisor(sockets, run_worker, directory).run()


def _exit_cleanly(signum: int, frame: object) -> None:
    """A worker's SIGTERM before its server handles signals, or re-raised after its drain."""
    raise SystemExit(0)


def _die_with_parent(parent: int) -> None:  # pragma: no cover - runs in the worker
    """Ask Linux for SIGTERM when the parent dies, so no worker outlives a killed supervisor."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)       # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:              # the parent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)
