"""The length record file: one JSON line per request, written off the request path.

Why it is built this way:

* **Never slow or break a request.**  `LengthLog.enqueue` only puts the record
  on a bounded queue (`put_nowait`); one writer thread does the file I/O.  When
  the queue is full the record is dropped and counted: losing a statistic is
  better than stalling the event loop behind a slow disk.
* **Several worker processes may share one file.**  The file is opened with
  `O_APPEND` and every line goes out in a single `os.write` of the whole line,
  so the kernel appends it atomically: lines from different processes never
  interleave.
* **Size-based rotation that works across processes.**  Rotation uses
  `logging.handlers.RotatingFileHandler`'s naming (`file.1` is the newest
  backup, `file.<backups>` the oldest).  The rename-and-reopen runs under an
  `fcntl.flock` on `<file>.lock`; a writer that finds the path now names a
  different inode (another process rotated) reopens instead of rotating again.
* **A broken disk degrades to one warning.**  An unwritable path or a full disk
  logs ONE warning (then at most one per `warn_interval_s`) and counts the lost
  records in `write_errors`; nothing is raised towards the caller.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import queue
import stat
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from .record import LengthRecord

logger = logging.getLogger("headroom.lengthlog")

_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
_STOP = object()


@dataclass
class LengthLogStats:
    """Counters for /metrics: every enqueued record ends in exactly one of these."""

    written: int = 0
    dropped: int = 0        # queue full (or log closed): never reached the writer
    write_errors: int = 0   # reached the writer but could not be written


def encode_line(rec: LengthRecord | Mapping[str, Any]) -> bytes:
    """One record as one JSON line (compact, ASCII-only so a line is never split by encoding)."""
    data = rec.to_dict() if isinstance(rec, LengthRecord) else dict(rec)
    return (json.dumps(data, separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")


def backup_name(path: Path, index: int) -> Path:
    """RotatingFileHandler's naming: `lengths.jsonl.1` is the most recent backup."""
    return path.with_name(f"{path.name}.{index}")


class LengthLog:
    """Appends `LengthRecord`s to a JSONL file from a background thread.

    `enqueue()` is safe to call from the event loop and from any thread.
    `flush()` waits until everything enqueued so far is written (tests, shutdown);
    `close()` flushes and stops the writer thread.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_bytes: int = 64 * 1024 * 1024,
        backups: int = 5,
        queue_size: int = 10_000,
        warn_interval_s: float = 300.0,
        reopen_interval_s: float = 1.0,
    ) -> None:
        self.path = Path(path)
        self.max_bytes = max_bytes          # 0: never rotate
        self.backups = backups              # 0: rotation truncates (like RotatingFileHandler)
        self.warn_interval_s = warn_interval_s
        self.reopen_interval_s = reopen_interval_s
        self.stats = LengthLogStats()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=queue_size)
        self._drop_lock = threading.Lock()
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None   # (st_dev, st_ino) of the open file
        self._regular = True                       # rotation only makes sense for regular files
        self._next_open_attempt = 0.0
        self._last_warning = float("-inf")
        self._errors_since_warning = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="headroom-lengthlog", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- callers

    def enqueue(self, rec: LengthRecord | Mapping[str, Any]) -> bool:
        """Queue one record for writing; False (and counted) when it had to be dropped."""
        if not self._closed:
            try:
                self._queue.put_nowait(rec)
                return True
            except queue.Full:
                pass
        with self._drop_lock:                  # enqueue may run on many threads at once
            self.stats.dropped += 1
        return False

    def flush(self, timeout: float | None = None) -> bool:
        """Block until every record queued so far has been handled; False on timeout.

        Blocks the calling thread: for tests, shutdown and CLIs, not the event loop.
        """
        if self._closed or not self._thread.is_alive():
            return True
        done = threading.Event()
        try:
            self._queue.put(done, timeout=timeout)
        except queue.Full:
            return False
        return done.wait(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued, then stop the writer and close the file."""
        if self._closed:
            return
        self._closed = True
        self._queue.put(_STOP)
        self._thread.join(timeout)

    def __enter__(self) -> "LengthLog":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------- writer thread

    def _run(self) -> None:
        try:
            while True:
                item = self._queue.get()
                if item is _STOP:
                    return
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                self._write_record(item)
        finally:
            self._close_fd()

    def _write_record(self, rec: Any) -> None:
        try:
            line = encode_line(rec)
        except (TypeError, ValueError) as exc:   # a record that is not JSON-able: a bug, not a disk
            self._failed(exc)
            return
        try:
            fd = self._ensure_open()
        except OSError as exc:
            self._next_open_attempt = time.monotonic() + self.reopen_interval_s
            self._failed(exc)
            return
        if fd is None:                            # still backing off after a failed open
            self._failed(None)
            return
        try:
            if self._should_rotate(fd, len(line)):
                fd = self._rotate_or_keep(fd)
            written = os.write(fd, line)
            if written != len(line):
                # Only a full disk does this to a regular file.  The tail is not
                # retried: a second write could interleave with another process.
                raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)")
        except OSError as exc:
            self._close_fd()                      # reopen on the next record
            self._failed(exc)
            return
        self.stats.written += 1

    def _ensure_open(self) -> int | None:
        """The open fd, reopening when another process rotated the file away.

        Raises OSError when the file cannot be opened; None while backing off.
        """
        if self._fd is not None:
            try:
                st = os.stat(self.path)
                if (st.st_dev, st.st_ino) == self._ino:
                    return self._fd
            except FileNotFoundError:
                pass
            self._close_fd()
        if time.monotonic() < self._next_open_attempt:
            return None
        self._open()
        return self._fd

    def _open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, _OPEN_FLAGS, 0o644)
        st = os.fstat(fd)
        self._fd, self._ino, self._regular = fd, (st.st_dev, st.st_ino), stat.S_ISREG(st.st_mode)

    def _close_fd(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = self._ino = None

    def _should_rotate(self, fd: int, incoming: int) -> bool:
        if self.max_bytes <= 0 or not self._regular:
            return False
        size = os.fstat(fd).st_size
        return size > 0 and size + incoming > self.max_bytes

    def _rotate_or_keep(self, fd: int) -> int:
        """Rotate; if renaming fails, keep appending to the big file rather than lose records."""
        try:
            return self._rotate()
        except OSError as exc:
            self._warn(exc, "could not rotate")
            reopened = self._ensure_open()
            if reopened is None:
                raise
            return reopened

    def _rotate(self) -> int:
        """Rename file → file.1 → … under an exclusive lock; return the fd to write to."""
        lock_fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                st = os.stat(self.path)
                rotated_by_other = (st.st_dev, st.st_ino) != self._ino
            except FileNotFoundError:
                rotated_by_other = True
            if rotated_by_other:
                self._close_fd()
                self._open()
                assert self._fd is not None
                if not self._should_rotate(self._fd, 1):
                    return self._fd
            self._close_fd()
            if self.backups > 0:
                for i in range(self.backups - 1, 0, -1):
                    src = backup_name(self.path, i)
                    if src.exists():
                        os.replace(src, backup_name(self.path, i + 1))
                os.replace(self.path, backup_name(self.path, 1))
            else:
                os.truncate(self.path, 0)
            self._open()
            assert self._fd is not None
            return self._fd
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # ------------------------------------------------------------- degrading

    def _failed(self, exc: BaseException | None) -> None:
        """A record was lost: count it, and warn (rate-limited) when there is a cause to tell."""
        self.stats.write_errors += 1
        self._errors_since_warning += 1
        if exc is not None:
            self._warn(exc, "is not writable")

    def _warn(self, exc: BaseException, what: str) -> None:
        """One warning line, then at most one per warn_interval_s."""
        now = time.monotonic()
        if now - self._last_warning < self.warn_interval_s:
            return
        lost, self._errors_since_warning = self._errors_since_warning, 0
        self._last_warning = now
        logger.warning(
            "length log %s %s (%s: %s); %d length record(s) lost since the last warning, "
            "%d in total; requests are not affected",
            self.path, what, type(exc).__name__, exc, lost, self.stats.write_errors,
        )
