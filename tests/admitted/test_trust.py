"""proxy.admitted.trust: when brimful stops trusting its own count of a model, and when it trusts it again."""

from __future__ import annotations

from proxy.admitted.trust import DRIFT_SWITCH, DRIFT_WINDOW, RECOVER_AFTER, CountTrust


def test_a_new_model_is_counted_locally_and_exactly() -> None:
    trust = CountTrust("m")
    assert (trust.mode, trust.exact, trust.margin) == ("local", True, 0)


def test_matching_probes_keep_the_local_count() -> None:
    trust = CountTrust("m")
    assert trust.probes(True) is None
    assert (trust.mode, trust.parity, trust.upstream_tokenize) == ("local", True, True)


def test_probes_that_differ_switch_to_the_upstreams_count() -> None:
    trust = CountTrust("m")
    change = trust.probes(False)
    assert change is not None and "/tokenize" in change
    assert (trust.mode, trust.exact, trust.margin) == ("upstream", True, 0)


def test_one_drift_is_noted_recurring_drift_switches() -> None:
    trust = CountTrust("m")
    trust.probes(True)
    assert trust.answered(100, 104) is None and trust.mode == "local"
    for _ in range(10):
        trust.answered(50, 50)
    assert DRIFT_SWITCH == 2
    change = trust.answered(60, 61)
    assert change is not None and trust.mode == "upstream"
    assert (trust.max_under, trust.drift_requests) == (4, 2)


def test_without_a_tokenize_drift_means_a_margin_of_the_worst_under_count() -> None:
    trust = CountTrust("m")       # no probes: not vLLM, or parity off
    trust.answered(100, 130)
    trust.answered(100, 110)
    assert (trust.mode, trust.exact, trust.margin) == ("margin", False, 30)
    # ... and local again once a whole window of answers agrees.
    for _ in range(DRIFT_WINDOW - 1):
        assert trust.answered(5, 5) is None or trust.mode == "local"
    assert trust.mode == "margin"
    assert trust.answered(5, 5) is not None and trust.mode == "local"


def test_counting_upstream_goes_back_to_local_after_agreeing_long_enough() -> None:
    trust = CountTrust("m")
    trust.probes(False)
    for _ in range(RECOVER_AFTER - 1):
        assert trust.shadow(7, 7) is None
    trust.shadow(7, 8)                   # one disagreement starts the streak again
    for _ in range(RECOVER_AFTER - 1):
        trust.shadow(7, 7)
    assert trust.mode == "upstream"
    assert trust.shadow(7, 7) is not None and trust.mode == "local"


def test_when_even_the_upstreams_tokenize_drifts_nothing_is_exact() -> None:
    # gpt-oss: vLLM's /tokenize renders the HF template, its chat renders harmony.
    trust = CountTrust("m")
    trust.probes(False)
    trust.answered(120, 128)
    assert (trust.mode, trust.exact, trust.margin) == ("margin", False, 8)


def test_a_margin_is_the_under_count_since_the_count_was_last_trusted() -> None:
    """An episode's worst under-count does not come back with a later, smaller drift."""
    trust = CountTrust("m")
    trust.answered(100, 1828)
    trust.answered(100, 1828)
    assert trust.margin == 1728
    for _ in range(DRIFT_WINDOW):
        trust.answered(5, 5)
    assert (trust.mode, trust.margin) == ("local", 0)
    trust.answered(100, 101)
    trust.answered(100, 101)
    assert (trust.mode, trust.margin) == ("margin", 1)
    assert trust.describe()["max_under_count"] == 1728       # the history is still reported


def test_counting_locally_again_forgets_the_upstreams_under_count() -> None:
    """What the /tokenize-less fallback of `upstream` mode holds back (`under_now`) starts again too."""
    trust = CountTrust("m")
    trust.probes(False)
    trust.answered(100, 140)          # the upstream's /tokenize differs from its usage: margin 40
    assert trust.margin == 40
    for _ in range(DRIFT_WINDOW):
        trust.answered(5, 5)
    assert trust.mode == "local"
    trust.answered(100, 103)
    trust.answered(100, 103)
    assert (trust.mode, trust.under_now) == ("upstream", 3)
