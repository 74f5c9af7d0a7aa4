"""Handing the heap a count freed back to the OS (glibc's `malloc_trim`), at most once per interval.

A count of a long prompt leaves its parsed body, rendered text and the encoder's buffers freed but
resident: without a trim 4.1 GiB stayed resident 80 s after a 33 MB prompt.  A trim costs
0.5-1.7 ms after a 250-420 KB prompt (10.6 ms after 4 MB), and what it hands back the next count
takes again.  So a count asks for a trim (`HeapTrimmer.request`): it runs at once when none ran
for `interval` seconds, else once, `interval` after the last one, on a timer thread.  A run of
long prompts then pays a few trims a second instead of one each, and the heap of the last of
them is handed back at most `interval` after it.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from collections.abc import Callable
from typing import Any

# What a count's freed heap may stay resident before it is handed back.
TRIM_INTERVAL_S = 0.25

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
    """Trims at most once per `interval`; a request within it runs once, when the interval ends.

    `trim`, `clock` and `schedule` (delay, callable) are the edges, replaced in tests."""

    def __init__(self, interval: float = TRIM_INTERVAL_S, trim: Callable[[], None] = malloc_trim,
                 clock: Callable[[], float] = time.monotonic,
                 schedule: Callable[[float, Callable[[], None]], None] = _timer) -> None:
        self.interval = interval
        self._trim, self._clock, self._schedule = trim, clock, schedule
        self._lock = threading.Lock()
        self._last: float | None = None
        self._pending = False
        self._pid = os.getpid()

    def request(self) -> None:
        """Trim now, or make sure one trim runs when the interval since the last ends."""
        with self._lock:
            if self._pid != os.getpid():          # a forked worker: the parent's timer is not ours
                self._pid, self._pending, self._last = os.getpid(), False, None
            if self._pending:
                return
            delay = trim_delay(self._last, self._clock(), self.interval)
            if delay > 0:
                self._pending = True
            else:
                self._last = self._clock()
        if delay > 0:
            self._schedule(delay, self._run_pending)
        else:
            self._trim()

    def _run_pending(self) -> None:
        with self._lock:
            self._pending = False
            self._last = self._clock()
        self._trim()
