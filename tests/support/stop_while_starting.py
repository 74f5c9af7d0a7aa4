"""`brimful serve` whose SIGTERM arrives inside a finalizer while the app is being built.

`python -m tests.support.stop_while_starting CONFIG PORT WORKERS` runs the real command
(proxy.cli.main) with one change: building the app first frees an object whose finalizer sends
SIGTERM (to the supervisor under `--workers`, which passes it to every worker; else to this
process) and waits for it to reach this process.  A handler that raises SystemExit runs inside
that wait, so the exception is printed as "Exception ignored" and lost, and the process serves
on: the lost stop that proxy.signals prevents.  Held, the signal waits until the server
handles it, and the command drains and exits 0.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

import proxy.app
from proxy.cli import main

WAIT_S = 10.0


class _SendsSigterm:
    def __init__(self, pid: int) -> None:
        self.pid = pid

    def __del__(self) -> None:
        os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + WAIT_S
        # Held, it shows as pending; not held, the handler runs in this sleep, inside the finalizer.
        while signal.SIGTERM not in signal.sigpending() and time.monotonic() < deadline:
            time.sleep(0.001)


class _App(proxy.app.BrimfulApp):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        _SendsSigterm(os.getppid() if kwargs.get("worker") is not None else os.getpid())   # freed at once
        super().__init__(*args, **kwargs)


if __name__ == "__main__":
    proxy.app.BrimfulApp = _App             # type: ignore[misc]  # the command imports it when it runs
    config, port, workers = sys.argv[1:]
    sys.exit(main(["serve", "--config", config, "--port", port, "--workers", workers, "--log-level", "info"]))
