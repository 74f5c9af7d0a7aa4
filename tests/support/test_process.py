"""BrimfulProcess is ready only when its port listens, not on uvicorn's start-up line alone."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from tests.support.process import BrimfulProcess

# uvicorn logs "Application startup complete" and only then binds and listens; this child
# widens that gap to half a second, so a helper that trusted the line would be refused.
LISTENS_LATE = """
import signal, socket, sys, time
print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
time.sleep(0.5)
server = socket.socket()
server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    server.accept()[0].close()
"""

EXITS_AFTER_THE_LINE = """
import sys
print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
sys.exit(3)
"""


class Child(BrimfulProcess):
    script = ""

    def _command(self, config: Path, extra_args: list[str]) -> list[str]:
        return [sys.executable, "-c", self.script, str(self.port)]


class ListensLate(Child):
    script = LISTENS_LATE


class ExitsAfterTheLine(Child):
    script = EXITS_AFTER_THE_LINE


def test_ready_means_the_port_takes_a_connection(tmp_path: Path) -> None:
    child = ListensLate("http://127.0.0.1:9", tmp_path, tmp_path)
    try:
        socket.create_connection(("127.0.0.1", child.port), timeout=5).close()
    finally:
        assert child.stop() == 0


def test_a_server_that_exits_after_the_line_did_not_start(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="brimful did not start"):
        ExitsAfterTheLine("http://127.0.0.1:9", tmp_path, tmp_path)
