"""The length record file: one JSON line per request, written off the request path.

Why it is built this way:

* **Never slow or break a request.**  `LengthLog.enqueue` only appends the
  record to a bounded deque (no lock, no thread woken); one writer thread
  drains it every `flush_interval_s` (0.1 s) and does the file I/O.  When the
  deque is full the record is dropped and counted: losing a statistic is
  better than stalling the event loop behind a slow disk.
* **Several worker processes may share one file.**  The file is opened with
  `O_APPEND` and every write carries whole lines, so the kernel appends
  them atomically: lines from different processes never interleave.
* **Batched: one write per round, not per request.**  The writer takes every
  record queued since its last round and appends them with as few
  `os.write`s as rotation allows, each of whole lines.  (Woken per record,
  it cost ~80 us of CPU per request at one connection: a thread wake-up, a
  GIL hand-off and several system calls each.)
* **What a crash can lose.**  A record is queued once its answer was sent;
  `kill -9` loses what was queued and not yet written: at most the records
  of the last `flush_interval_s` (the page cache keeps what was written).
  `flush_interval_s = 0` wakes the writer for every record instead (the
  loss is then what was answered in the last moment, at the per-record
  cost above); `fsync` also syncs every round to the disk, for a machine
  that loses power (one disk flush per round).
* **Size-based rotation that works across processes.**  Rotation uses
  `logging.handlers.RotatingFileHandler`'s naming (`file.1` is the newest
  backup, `file.<backups>` the oldest).  Sizing, rename-and-reopen and the
  write run under an `fcntl.flock` on `<file>.lock`, so a file exceeds
  `max_bytes` only by a single line longer than the room left; a writer
  that finds the path now names a different inode (another process
  rotated) reopens instead of rotating again.
* **Or JSON lines on standard output** (`path = "-"`), for a cluster's log
  pipeline: the same lines, written to a duplicate of file descriptor 1, never
  rotated.  brimful's own log lines go to standard error, so standard output
  carries nothing but records (`brimful report -` reads them back).  Each
  write is at most PIPE_BUF bytes of whole lines, which a pipe never mixes
  with another worker's.
* **A broken disk degrades to one warning.**  An unwritable path or a full disk
  logs ONE warning (then at most one per `warn_interval_s`) and counts the lost
  records in `write_errors`; nothing is raised towards the caller.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import fcntl
import json
import logging
import math
import os
import select
import stat
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from proxy.recording.record import LengthRecord

logger = logging.getLogger("brimful.lengthlog")

_OPEN_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
STDOUT = "-"        # the `path` that means standard output
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
    # orjson writes the same line in a tenth of json.dumps' ~13 us (a twentieth of a small
    # request's CPU) where it can: not for NaN or infinities (orjson writes null), integers past
    # 64 bits (it refuses), or non-ASCII text (orjson writes UTF-8, the line is kept ASCII).
    # A record's values are flat (finish_reasons: strings), so the check of floats is whole.
    if isinstance(rec, LengthRecord) and all(math.isfinite(v) for v in data.values() if type(v) is float):
        try:
            line = orjson.dumps(data, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError:
            line = b""
        if line and line.isascii():
            return line
    return (json.dumps(data, separators=(",", ":"), ensure_ascii=True) + "\n").encode("ascii")


def _whole_lines(lines: list[bytes], start: int, end: int, written: int) -> int:
    """How many of lines[start:end] a short write of `written` bytes put out whole."""
    count = 0
    for line in lines[start:end]:
        if written < len(line):
            break
        written -= len(line)
        count += 1
    return count


def _run_end(lines: list[bytes], start: int, room: int) -> int:
    """The end of the run from `start` (always taking lines[start]) whose further lines fit in `room` bytes."""
    end = start + 1
    while end < len(lines) and room >= len(lines[end]):
        room -= len(lines[end])
        end += 1
    return end


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
        flush_interval_s: float = 0.1,
        fsync: bool = False,
    ) -> None:
        self.path = Path(path)
        self.to_stdout = os.fspath(path) == STDOUT
        self.max_bytes = max_bytes          # 0: never rotate
        self.backups = backups              # 0: rotation truncates (like RotatingFileHandler)
        self.warn_interval_s = warn_interval_s
        self.reopen_interval_s = reopen_interval_s
        self.flush_interval_s = flush_interval_s    # 0: the writer is woken for every record
        self.fsync = fsync                          # fsync after every round (survives a machine crash)
        self.stats = LengthLogStats()
        # A deque, not queue.Queue: appending takes no lock and wakes no thread
        # (a Queue's put notifies the writer: a wake-up and a GIL hand-off per
        # request). The writer drains it every flush_interval_s, or at once
        # when flush() or close() asks.
        self._pending: collections.deque[Any] = collections.deque()
        self._queue_size = queue_size
        self._wake = threading.Event()
        self._drop_lock = threading.Lock()
        self._fd: int | None = None
        self._ino: tuple[int, int] | None = None   # (st_dev, st_ino) of the open file
        self._regular = True                       # rotation only makes sense for regular files
        self._next_open_attempt = 0.0
        self._last_warning = float("-inf")
        self._errors_since_warning = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="brimful-lengthlog", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------- callers

    def enqueue(self, rec: LengthRecord | Mapping[str, Any]) -> bool:
        """Queue one record for writing; False (and counted) when it had to be dropped.

        The line is encoded here, by the caller: a few microseconds per request
        on the event loop, where the writer thread encoding a whole round at
        once held the GIL for milliseconds (the 1-connection p99 showed it).
        """
        if not self._closed and len(self._pending) < self._queue_size:
            try:
                self._pending.append(encode_line(rec))
            except (TypeError, ValueError) as exc:   # not JSON-able: a bug, counted by the writer
                self._pending.append(exc)
            if self.flush_interval_s <= 0:
                self._wake.set()
            return True
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
        self._pending.append(done)
        self._wake.set()
        return done.wait(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Write what is queued, then stop the writer and close the file."""
        if self._closed:
            return
        self._closed = True
        self._pending.append(_STOP)
        self._wake.set()
        self._thread.join(timeout)

    def __enter__(self) -> LengthLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------- writer thread

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self.flush_interval_s if self.flush_interval_s > 0 else None)
                self._wake.clear()         # cleared before draining: a later set() is not lost
                # Take everything queued since the last round: under load the
                # records of many requests go out in one write.
                items = []
                while self._pending:
                    items.append(self._pending.popleft())
                lines: list[bytes] = []
                for item in items:
                    if item is _STOP:
                        self._write_lines(lines)
                        return
                    if isinstance(item, bytes):
                        lines.append(item)
                    elif isinstance(item, threading.Event):
                        self._write_lines(lines)
                        lines = []
                        item.set()
                    else:                             # a record that was not JSON-able
                        self._failed(item)
                self._write_lines(lines)
        finally:
            self._close_fd()

    def _write_lines(self, lines: list[bytes]) -> None:
        """Append whole lines: as few writes as rotation allows, each of whole lines only."""
        self._append(lines)
        if self.fsync and lines and self._fd is not None and self._regular:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                self._warn(exc, "could not be synced to disk")

    def _append(self, lines: list[bytes]) -> None:
        start = 0
        while start < len(lines):
            try:
                fd = self._ensure_open()
                if fd is None:                        # still backing off after a failed open
                    self._failed(None, len(lines) - start)
                    return
                with self._rotation_lock() as locked:
                    if locked:                        # another process may have rotated meanwhile
                        fd = self._ensure_open()
                    assert fd is not None
                    end, written, wanted = self._write_run(fd, lines, start)
            except OSError as exc:
                if self._fd is None:
                    self._next_open_attempt = time.monotonic() + self.reopen_interval_s
                self._close_fd()                      # reopen on the next record
                self._failed(exc, len(lines) - start)
                return
            if written != wanted:
                # Only a full disk does this to a regular file.  The tail is not
                # retried: a second write could interleave with another process.
                whole = _whole_lines(lines, start, end, written)
                self.stats.written += whole
                self._close_fd()
                self._failed(OSError(errno.ENOSPC, f"short write ({written} of {wanted} bytes)"),
                             len(lines) - start - whole)
                return
            self.stats.written += end - start
            start = end

    def _write_run(self, fd: int, lines: list[bytes], start: int) -> tuple[int, int, int]:
        """Rotate if the next line would overflow, then write the run of lines that fits
        (at least one) in one `os.write`: (end of the run, bytes written, bytes wanted)."""
        if self._should_rotate(fd, len(lines[start])):
            fd = self._rotate_or_keep(fd)
        end = len(lines)
        if self.to_stdout:
            # Other worker processes may share standard output: a pipe takes a
            # write of at most PIPE_BUF bytes whole, never mixed with theirs.
            end = _run_end(lines, start, select.PIPE_BUF - len(lines[start]))
        elif self.max_bytes > 0 and self._regular:
            end = _run_end(lines, start, self.max_bytes - os.fstat(fd).st_size - len(lines[start]))
        data = b"".join(lines[start:end]) if end - start > 1 else lines[start]
        return end, self._write(fd, data), len(data)

    def _write(self, fd: int, data: bytes) -> int:
        """One write; on standard output the rest of a short write too (a line longer
        than PIPE_BUF, the only write a pipe may split)."""
        written = os.write(fd, data)
        if self.to_stdout:
            while 0 < written < len(data):
                written += os.write(fd, data[written:])
        return written

    @contextlib.contextmanager
    def _rotation_lock(self) -> Iterator[bool]:
        """Hold `<file>.lock` while sizing, rotating and writing, when the file rotates.

        Several processes may append to one file: each one sizes its run of
        lines against the file, so without the lock runs written concurrently
        would overshoot `max_bytes` by up to one run per process.
        """
        if self.max_bytes <= 0 or not self._regular:
            yield False
            return
        lock_fd = os.open(self.lock_path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            yield True
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)

    def _ensure_open(self) -> int | None:
        """The open fd, reopening when another process rotated the file away.

        Raises OSError when the file cannot be opened; None while backing off.
        """
        if self._fd is not None and self.to_stdout:
            return self._fd
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
        if self.to_stdout:
            # A duplicate: closing the log never closes the process's stdout.
            self._fd, self._ino, self._regular = os.dup(1), None, False
            return
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
        """Rename file → file.1 → … (the caller holds the lock); return the fd to write to."""
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

    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    # ------------------------------------------------------------- degrading

    def _failed(self, exc: BaseException | None, records: int = 1) -> None:
        """Records were lost: count them, and warn (rate-limited) when there is a cause to tell."""
        self.stats.write_errors += records
        self._errors_since_warning += records
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
