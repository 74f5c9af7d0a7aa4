"""proxy.cli: what `brimful serve` sets up in its process before it serves."""

from __future__ import annotations

import gc
import signal
from typing import Any

import pytest

import proxy.app
from proxy import signals
from proxy.cli import GC_YOUNG_THRESHOLD, main


class _Built(Exception):
    """Raised by the stand-in app: the command got as far as building it."""


def test_serve_runs_the_young_generation_collector_less_often(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, ...]] = []

    class App:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append(gc.get_threshold())
            raise _Built

    monkeypatch.setattr(proxy.app, "BrimfulApp", App)
    before = gc.get_threshold()
    try:
        with pytest.raises(_Built):
            main(["serve", "--upstream", "http://127.0.0.1:9", "--port", "8199"])
    finally:
        gc.set_threshold(*before)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.STOP_SIGNALS)   # serve held them for its server
    assert before[0] < GC_YOUNG_THRESHOLD
    assert seen == [(GC_YOUNG_THRESHOLD, *before[1:])]
