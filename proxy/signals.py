"""SIGTERM and SIGINT held until uvicorn handles them, so a stop sent while brimful starts is never lost.

Before uvicorn's handlers are in place, a Python handler that raises SystemExit
stops the process only where the exception can propagate.  One that lands in a
finalizer or a weakref callback (asyncio's WeakSet of tasks, an object the
collector frees) is printed as "Exception ignored" and dropped, and the process
goes on to serve until a second signal; under `--workers N` the supervisor,
which sent its only SIGTERM, then waits for that worker for ever.

So `brimful serve` blocks both signals before it builds its app (`hold`), a
worker inherits them blocked from its fork (proxy.workers.supervisor), and
`Server` unblocks them once uvicorn's own handlers are installed: the kernel
keeps a signal sent meanwhile pending and delivers it then, and the server
drains and exits as after any SIGTERM.  The delay is the app's construction,
a few milliseconds; threads started meanwhile keep them blocked, so the
kernel delivers them to the main thread.
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Generator

import uvicorn

STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT})


def exit_cleanly(signum: int, frame: object) -> None:
    """SIGTERM re-raised by uvicorn after its drain: exit 0, not death by the signal (status -15),
    which systemd and Kubernetes report as a failure."""
    raise SystemExit(0)


def hold() -> None:
    """Block SIGTERM and SIGINT in this thread (and the threads and children it starts) until `Server` runs."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


class Server(uvicorn.Server):
    """uvicorn's server, which takes the stop signals held since start-up once it handles them."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        with super().capture_signals():
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
            yield
