"""proxy.workers.supervisor's rules, without forking: the back-off (the hand-over's: test_handover.py)."""

from __future__ import annotations

from proxy.workers.supervisor import BACKOFF_MAX_S, backoff_s


def test_a_slot_backs_off_only_after_quick_exits_doubling_to_a_cap() -> None:
    assert backoff_s(0, startup_failure=False) == 0        # a worker that ran a while: replaced at once
    assert [backoff_s(n, startup_failure=False) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert backoff_s(0, startup_failure=True) == 1         # could not start: never at once
    assert backoff_s(40, startup_failure=False) == BACKOFF_MAX_S
