"""The real-vLLM server lock: other processes wait, this process's own servers share it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.realvllm.locking import process_lock

# Another process: exit 0 if it can take the lock at once, 1 if it is held elsewhere.
PROBE = ("import fcntl, sys\n"
         "handle = open(sys.argv[1], 'a+')\n"
         "try:\n"
         "    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
         "except BlockingIOError:\n"
         "    sys.exit(1)\n")


def held_elsewhere(path: Path) -> bool:
    return subprocess.run([sys.executable, "-c", PROBE, str(path)], check=False, timeout=60).returncode == 1


def test_a_process_holds_the_lock_until_its_last_block_ends_and_nests_without_deadlock(tmp_path: Path) -> None:
    lock = tmp_path / "locks" / ".server.lock"
    with process_lock(lock):
        assert held_elsewhere(lock)
        with process_lock(lock):           # a second server of this process: no deadlock
            assert held_elsewhere(lock)
        assert held_elsewhere(lock)        # the first one still serves
    assert not held_elsewhere(lock)
