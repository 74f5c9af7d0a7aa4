"""Handing the heap a count freed back to the OS (glibc's `malloc_trim`): when it is worth it, and
at most once per interval.

A count of a long prompt leaves its parsed body, rendered text and the encoder's buffers freed but
resident: without a trim 4.1 GiB stayed resident 80 s after a 33 MB prompt.  But a trim costs
0.6 ms after a 400 KB prompt, 3-10 ms after 4 MB, the pages it hands back are faulted in again by
the next request, and after a 400 KB prompt it gave back only 3 MiB (fastokens) to 9 MiB
(tokenizers): the next count reuses that heap anyway.  So a count asks for a trim
(`HeapTrimmer.request`), which runs only when the process's resident memory has grown by
`growth` bytes since the last trim, at once when none ran for `interval` seconds, else once,
`interval` after the last one, on a timer thread.  Freed heap of under `growth` stays for the
next count; more is handed back at most `interval` after the count that asked.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable
from typing import Any

# Trims at most this often, and hand back a large count's heap at most this late.
TRIM_INTERVAL_S = 0.25
# Resident growth since the last trim below which a trim is not worth its cost.
TRIM_GROWTH_BYTES = 32 * 1024 * 1024
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096

_libc: Any = None


def malloc_trim() -> None:
    """glibc's malloc_trim(0): return freed memory of every arena to the OS (a few ms; no-op elsewhere)."""
    global _libc
    if _libc is None:
        name = ctypes.util.find_library("c")
        try:
            _libc = ctypes.CDLL(name) if name else False
        except OSError:
            _libc = False
    trim = getattr(_libc, "malloc_trim", None) if _libc else None
    if trim is not None:
        trim(0)


def resident_bytes() -> int:
    """The process's resident memory (/proc/self/statm, ~10 µs); 0 where there is none."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


def worth_trimming(resident: int, after_last: int, growth: int) -> bool:
    """Whether the process grew by `growth` bytes since the last trim left it at `after_last`:
    where resident memory is unknown (0), every request is."""
    return resident == 0 or resident - after_last >= growth


def trim_delay(last: float | None, now: float, interval: float) -> float:
    """Seconds a trim asked for at `now` waits: none when the last ran `interval` ago, or never ran."""
    if last is None:
        return 0.0
    return max(0.0, last + interval - now)


def _timer(delay: float, run: Callable[[], None]) -> None:
    timer = threading.Timer(delay, run)
    timer.daemon = True
    timer.name = "brimful-heap-trim"
    timer.start()


class HeapTrimmer:
    """Trims when the process grew by `growth` bytes since the last trim, at most once per `interval`;
    a request within the interval runs once, when it ends.

    `trim`, `clock`, `schedule` (delay, callable) and `resident` are the edges, replaced in tests."""

    def __init__(self, interval: float = TRIM_INTERVAL_S, growth: int = TRIM_GROWTH_BYTES,
                 trim: Callable[[], None] = malloc_trim, clock: Callable[[], float] = time.monotonic,
                 schedule: Callable[[float, Callable[[], None]], None] = _timer,
                 resident: Callable[[], int] = resident_bytes) -> None:
        self.interval, self.growth = interval, growth
        self._trim, self._clock, self._schedule, self._resident = trim, clock, schedule, resident
        self._lock = threading.Lock()
        self._last: float | None = None
        self._after_last = 0                      # resident bytes the last trim left
        self._pending = False
        self._pid = os.getpid()

    def request(self) -> None:
        """Trim now, or make sure one trim runs when the interval since the last ends; or, when the
        process has not grown by `growth` since the last trim, nothing."""
        with self._lock:
            if self._pid != os.getpid():          # a forked worker: the parent's timer is not ours
                self._pid, self._pending, self._last, self._after_last = os.getpid(), False, None, 0
            if self._pending or not worth_trimming(self._resident(), self._after_last, self.growth):
                return
            delay = trim_delay(self._last, self._clock(), self.interval)
            if delay > 0:
                self._pending = True
            else:
                self._last = self._clock()
        if delay > 0:
            self._schedule(delay, self._run_pending)
        else:
            self._trimmed()

    def _run_pending(self) -> None:
        with self._lock:
            self._pending = False
            self._last = self._clock()
        self._trimmed()

    def _trimmed(self) -> None:
        self._trim()
        after = self._resident()
        with self._lock:
            self._after_last = after
