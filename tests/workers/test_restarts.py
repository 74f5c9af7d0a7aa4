"""The supervisor when a worker dies: the others keep the port, and a crash-looping slot backs off.

The real Supervisor runs over toy workers (tests/workers/toy_supervisor.py), so the
kernel's SO_REUSEPORT spreading and the supervisor's own decisions are what is
tested, without brimful's start-up time in the way.  Each connection gets one
line naming the slot and pid that accepted it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.support.process import ROOT, wait_until

pytestmark = pytest.mark.slow


class Toy:
    def __init__(self, state: Path, count: int = 2) -> None:
        self.state = state
        self.count = count
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.workers.toy_supervisor", str(state), str(count)],
                                     cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())
        self.lines: list[str] = []
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()

    def _drain(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip())

    def ask(self, timeout: float = 5.0) -> tuple[int, int]:
        """(slot, pid) of the worker that accepted a new connection."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as conn:
            slot, pid = conn.makefile().readline().split()
        return int(slot), int(pid)

    def starts(self, index: int) -> list[int]:
        path = self.state / f"slot-{index}.starts"
        return [int(line) for line in path.read_text().split()] if path.exists() else []

    def serving(self) -> dict[int, int]:
        """slot -> pid, once every slot has answered (connections until they have)."""
        seen: dict[int, int] = {}
        assert wait_until(lambda: seen.update([self.ask()]) or len(seen) == self.count, timeout=30)
        return seen

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(15)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._drainer.join(5)          # every line of its log read


def test_connections_never_wait_on_a_dead_worker(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "gate-1")
    toy = Toy(tmp_path)
    try:
        pids = toy.serving()
        os.kill(pids[1], signal.SIGKILL)
        # The replacement has been forked and is held before it serves.
        assert wait_until(lambda: len(toy.starts(1)) == 2, timeout=30)
        # Every new connection is accepted by the living worker, none queued for the replacement
        # (before round 3: about half hashed to the dead worker's socket and waited there).
        answers = [toy.ask(timeout=3.0) for _ in range(40)]
        assert answers == [(0, pids[0])] * 40
        with (tmp_path / "gate-1").open("w"):
            pass                                      # the replacement may start now
        replacement = toy.starts(1)[1]
        assert wait_until(lambda: toy.ask() == (1, replacement), timeout=30), "the replacement never served"
    finally:
        code = toy.stop()
    assert code == 0, toy.lines


def test_the_sockets_an_adopter_held_go_to_another_when_it_dies_too(tmp_path: Path) -> None:
    for index in (0, 1):
        os.mkfifo(tmp_path / f"gate-{index}")
    toy = Toy(tmp_path, count=3)
    try:
        pids = toy.serving()
        os.kill(pids[1], signal.SIGKILL)                 # slot 1's socket goes to worker 0 (fewest, lowest)
        assert wait_until(lambda: len(toy.starts(1)) == 2, timeout=30)
        assert wait_until(lambda: any("worker 0" in line and "accepts worker 1's" in line for line in toy.lines),
                          timeout=30), toy.lines
        os.kill(pids[0], signal.SIGKILL)                 # the adopter dies: slots 0 and 1 go to worker 2
        assert wait_until(lambda: len(toy.starts(0)) == 2, timeout=30)
        assert wait_until(lambda: sum("worker 2" in line and "accepts" in line for line in toy.lines) == 2,
                          timeout=30), toy.lines
        # Every connection is answered, by the one worker that serves (none waits on a held replacement).
        assert [toy.ask(timeout=3.0) for _ in range(40)] == [(2, pids[2])] * 40
    finally:
        for index in (0, 1):
            with (tmp_path / f"gate-{index}").open("w"):
                pass
        code = toy.stop()
    assert code == 0, toy.lines


def test_a_crash_looping_slot_backs_off_and_the_others_keep_serving(tmp_path: Path) -> None:
    toy = Toy(tmp_path)
    try:
        pids = toy.serving()
        # Kill slot 1's worker and each replacement as soon as it starts: three quick exits.
        for kill in range(3):
            os.kill(toy.starts(1)[kill], signal.SIGKILL)
            if kill < 2:
                assert wait_until(lambda n=kill: len(toy.starts(1)) == n + 2, timeout=30), toy.lines
        assert wait_until(lambda: any("in 4 s" in line for line in toy.lines), timeout=10), toy.lines
        # Before: the third quick exit stopped every worker and the port refused connections.
        assert toy.proc.poll() is None, toy.lines
        assert [toy.ask(timeout=3.0) for _ in range(20)] == [(0, pids[0])] * 20
        slots = json.loads((tmp_path / "workers" / "slots.json").read_text())
        assert slots["1"] == {"restarts": 3, "waiting": True}
        assert slots["0"]["restarts"] == 0
        # After its back-off the slot is started again, and serves.
        assert wait_until(lambda: len(toy.starts(1)) == 4, timeout=30), toy.lines
        assert wait_until(lambda: toy.ask()[0] == 1, timeout=30)
    finally:
        code = toy.stop()
    assert code == 0, toy.lines
    assert any("worker 1" in line and "the other workers serve" in line for line in toy.lines)


def test_workers_that_cannot_start_stop_everything_once_none_runs(tmp_path: Path) -> None:
    (tmp_path / "cannot-start").touch()
    toy = Toy(tmp_path)
    try:
        toy.proc.wait(30)
    finally:
        code = toy.stop()
    assert code == 3, toy.lines
    assert any("could not start and no other worker runs; stopping" in line for line in toy.lines), toy.lines


def test_a_sigterm_while_the_workers_are_forked_starts_no_more_and_exits_0(tmp_path: Path) -> None:
    (tmp_path / "stop-at-start").touch()
    toy = Toy(tmp_path, count=3)
    try:
        code = toy.proc.wait(15)
    finally:
        toy.stop()
    # The first worker, forked before the signal was handled, stops with it; the others, whose
    # sockets the stop closed, are never forked (before: forked on a closed socket, exit 1).
    assert code == 0, "\n".join(toy.lines)
    assert len(toy.starts(0)) == 1
    assert toy.starts(1) == toy.starts(2) == []
