"""proxy.admitted.heap: a count's freed heap is handed back at most once per interval, and never later."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from proxy.admitted import heap
from proxy.admitted.heap import HeapTrimmer, trim_delay


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _trimmer(interval: float = 0.25) -> tuple[HeapTrimmer, Clock, list[float], list[tuple[float, Callable[[], None]]]]:
    clock, trims, timers = Clock(), [], []
    trimmer = HeapTrimmer(interval, trim=lambda: trims.append(clock.now), clock=clock,
                          schedule=lambda delay, run: timers.append((delay, run)))
    return trimmer, clock, trims, timers


def test_the_delay_is_what_is_left_of_the_interval() -> None:
    assert trim_delay(None, 5.0, 0.25) == 0.0
    assert abs(trim_delay(5.0, 5.1, 0.25) - 0.15) < 1e-9
    assert trim_delay(5.0, 5.25, 0.25) == 0.0
    assert trim_delay(5.0, 9.0, 0.25) == 0.0


def test_the_first_request_trims_at_once_and_a_burst_after_it_trims_once_when_the_interval_ends() -> None:
    trimmer, clock, trims, timers = _trimmer()
    trimmer.request()
    assert trims == [100.0] and timers == []
    for step in range(5):                      # five long prompts within the interval
        clock.now = 100.05 + step * 0.01
        trimmer.request()
    assert trims == [100.0]                    # none ran now ...
    assert len(timers) == 1                    # ... and one is due, at the interval's end
    delay, run = timers[0]
    assert abs(delay - 0.2) < 1e-9
    clock.now = 100.25
    run()
    assert trims == [100.0, 100.25]
    clock.now = 100.3                          # within the interval of the timer's trim: due again
    trimmer.request()
    assert trims == [100.0, 100.25] and len(timers) == 2
    clock.now = 101.0
    timers[1][1]()
    clock.now = 102.0                          # an interval after: at once
    trimmer.request()
    assert trims == [100.0, 100.25, 101.0, 102.0] and len(timers) == 2


def test_a_forked_worker_does_not_wait_for_its_parents_timer() -> None:
    trimmer, clock, trims, timers = _trimmer()
    trimmer.request()
    clock.now += 0.01
    trimmer.request()                          # pending in the "parent"
    assert len(timers) == 1
    trimmer._pid = os.getpid() + 1             # as a child sees it after fork
    trimmer.request()
    assert trims == [100.0, 100.01] and len(timers) == 1


def test_the_real_timer_trims_after_the_interval() -> None:
    done = threading.Event()
    trimmer = HeapTrimmer(0.01, trim=done.set)
    trimmer.request()
    assert done.is_set()
    done.clear()
    trimmer.request()                          # within 10 ms of the first: on the timer thread
    assert done.wait(5)


def test_malloc_trim_runs() -> None:
    heap.malloc_trim()                         # glibc here; a no-op where there is none
