"""proxy.admitted.heap: a count's freed heap is handed back when it is worth a trim, at most once per
interval, and never later than the interval."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from proxy.admitted import heap
from proxy.admitted.heap import HeapTrimmer, resident_bytes, trim_delay, worth_trimming

MIB = 1024 * 1024


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _trimmer(interval: float = 0.25, growth: int = 0, resident: Callable[[], int] = lambda: 0,
             ) -> tuple[HeapTrimmer, Clock, list[float], list[tuple[float, Callable[[], None]]]]:
    clock, trims, timers = Clock(), [], []
    trimmer = HeapTrimmer(interval, growth, trim=lambda: trims.append(clock.now), clock=clock,
                          schedule=lambda delay, run: timers.append((delay, run)), resident=resident)
    return trimmer, clock, trims, timers


def test_a_trim_is_worth_it_once_the_process_grew_by_the_threshold() -> None:
    assert worth_trimming(300 * MIB, 250 * MIB, 32 * MIB)
    assert not worth_trimming(260 * MIB, 250 * MIB, 32 * MIB)
    assert worth_trimming(0, 250 * MIB, 32 * MIB)         # resident memory unknown: as before, trim
    assert resident_bytes() > 0                            # Linux: /proc/self/statm


def test_a_count_that_left_little_freed_heap_does_not_trim() -> None:
    """After a 400 KB prompt a trim gave back 3-9 MiB for ~0.6 ms: below the threshold nothing runs;
    once the process has grown by it since the last trim, one does, and what it left is the new floor."""
    resident = [240 * MIB]
    trimmer, clock, trims, timers = _trimmer(growth=32 * MIB, resident=lambda: resident[0])
    trimmer.request()                          # first: grown from nothing
    assert trims == [100.0]
    clock.now = 200.0
    resident[0] = 250 * MIB                    # +10 MiB since the trim
    trimmer.request()
    assert trims == [100.0] and timers == []
    resident[0] = 280 * MIB                    # +40 MiB: a large prompt's heap
    trimmer.request()
    assert trims == [100.0, 200.0]
    clock.now = 300.0                          # the trim left 280 MiB resident (caches, not heap): the floor
    resident[0] = 290 * MIB
    trimmer.request()
    assert trims == [100.0, 200.0]


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
    trimmer = HeapTrimmer(0.01, 0, trim=done.set)
    trimmer.request()
    assert done.is_set()
    done.clear()
    trimmer.request()                          # within 10 ms of the first: on the timer thread
    assert done.wait(5)


def test_malloc_trim_runs() -> None:
    heap.malloc_trim()                         # glibc here; a no-op where there is none
