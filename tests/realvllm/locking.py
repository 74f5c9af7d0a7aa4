"""Exclusive locks on files, so two test processes never build or serve the same thing at once.

`fcntl.flock` rather than a lock-file package: the lock dies with its process, so
a test run killed half-way through an install never leaves a stale lock behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created if missing) for the duration of the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


_held: dict[Path, tuple[IO[str], int]] = {}
_guard = threading.Lock()


@contextlib.contextmanager
def process_lock(path: Path) -> Iterator[None]:
    """`exclusive_lock` between processes, shared by the blocks of this one: the first block
    takes it, the last one out lets it go. Two flocks of one file from one process exclude each
    other (each open() is its own lock), which would deadlock a process holding two such blocks
    at once (a session's server and a module's, or test_pools' two)."""
    path = path.resolve()
    with _guard:
        handle, count = _held.get(path, (None, 0))
        if handle is None:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = open(path, "a+")      # noqa: SIM115 (closed by the last block out)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        _held[path] = (handle, count + 1)
    try:
        yield
    finally:
        with _guard:
            handle, count = _held.pop(path)
            if count > 1:
                _held[path] = (handle, count - 1)
            else:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
                handle.close()
