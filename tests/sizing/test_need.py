"""Censored need (proxy.sizing.need): the rules per record, the product-limit estimate by hand and against
scipy, the issue-24 agent day, and the issue-16 scenario."""

from __future__ import annotations

import math
import random

import pytest

from proxy.recording.record import LengthRecord
from proxy.sizing import demand as dm
from proxy.sizing import need as nd


def fig(prompt=1000, n=1, requested=None, generated=None, granted=None, reasons=None, endpoint="chat", longest=None):
    return nd.need_figures(prompt, n, requested, generated, granted, reasons, endpoint, longest)


# --- one record -------------------------------------------------------------------------------------

def test_a_request_that_stopped_needed_exactly_what_it_used_whatever_it_asked():
    assert fig(requested=65535, generated=412, granted=39960, reasons=["stop"]) == ("exact", 1000, 1412, 1412)
    assert fig(requested=32000, generated=90, reasons=["tool_calls"]) == ("exact", 1000, 1090, 1090)


def test_cut_below_its_ask_is_right_censored_between_granted_and_ask():
    assert fig(requested=65535, generated=832, granted=832, reasons=["length"]) == ("cut", 1000, 1832, 66535)


def test_cut_at_its_own_limit_needed_exactly_that():
    # the client asked 500 and got 500: a longer window would not have given it more
    assert fig(requested=500, generated=500, granted=500, reasons=["length"]).kind == "exact"
    # /v1/completions without a limit: vLLM's own 16
    assert fig(endpoint="completions", generated=16, reasons=["length"]).kind == "exact"


def test_cut_at_the_window_with_no_ask_has_no_upper_bound():
    assert fig(generated=1048, reasons=["length"]) == ("cut", 1000, 2048, None)


def test_without_finish_reasons_reaching_the_limit_counts_as_cut():
    assert fig(requested=4096, generated=832, granted=832).kind == "cut"
    assert fig(requested=4096, generated=300, granted=832).kind == "exact"


def test_length_before_the_ask_was_the_window_not_the_client():
    # asked 3,000, vLLM's window left 548: cut, whether or not the finish reason was recorded
    assert fig(prompt=1500, requested=3000, generated=548, reasons=["length"]) == ("cut", 1500, 2048, 4500)
    assert nd.need_figures(1500, 1, 3000, 548, None, None, "chat", None, 2048).kind == "cut"
    assert nd.need_figures(1500, 1, 3000, 300, None, None, "chat", None, 2048).kind == "exact"


def test_refused_needed_at_least_one_token_more_than_its_prompt():
    assert fig(prompt=2600) == ("unknown", 2600, 2601, None)
    assert fig(prompt=2600, requested=100) == ("unknown", 2600, 2601, 2700)


def test_n_choices_and_batches_use_the_longest_sequence_bound():
    assert fig(n=4, requested=500, generated=1800, granted=500, reasons=["stop"] * 4).value == 1500
    assert fig(prompt=3000, longest=1200, requested=64, generated=100, granted=64, reasons=["stop", "stop"]).value \
        == 1264


# --- the product-limit estimate ---------------------------------------------------------------------

# needs 100, 200, 200, 400 exactly; one cut at 150 (asked up to 1,000), one at 300 (no ask)
HAND = [nd.NeedFigures("exact", 0, 100, 100), nd.NeedFigures("exact", 0, 200, 200),
        nd.NeedFigures("exact", 0, 200, 200), nd.NeedFigures("exact", 0, 400, 400),
        nd.NeedFigures("cut", 0, 150, 1000), nd.NeedFigures("cut", 0, 300, None)]


def test_product_limit_by_hand():
    # t=100: 6 at risk, 1 event → 5/6; 150 censored (4 left); t=200: 2 of 4 → 5/6·2/4 = 5/12;
    # 300 censored (1 left); t=400: 1 of 1 → 0
    model = nd.NeedTally(HAND).model()
    assert model.steps == [(100, pytest.approx(5 / 6)), (200, pytest.approx(5 / 12)), (400, 0.0)]
    assert model.survival(150) == pytest.approx(5 / 6) and model.survival(99) == 1.0
    q50, q90 = model.quantile(50), model.quantile(90)
    assert (q50.value, q50.low, q50.high, q50.beyond_data) == (200, 200, 200, False)
    # p90: estimate 400; low: {100,150,200,200,300,400} → 400; high: {100,200,200,400,1000,∞} → unbounded
    assert (q90.value, q90.low, q90.high) == (400, 400, None)
    assert model.quantile(10).value == 100


def test_beyond_the_last_event_the_estimate_is_a_lower_bound():
    model = nd.NeedTally([nd.NeedFigures("exact", 0, 100, 100), nd.NeedFigures("cut", 0, 300, 900)]).model()
    q = model.quantile(90)
    assert (q.value, q.beyond_data, q.high) == (300, True, 900)


def test_without_censoring_it_is_the_inverse_cdf_percentile():
    rng = random.Random(3)
    values = [rng.randint(1, 5000) for _ in range(997)]
    model = nd.NeedTally(nd.NeedFigures("exact", 0, v, v) for v in values).model()
    ordered = sorted(values)
    for p in (1, 50, 90, 95, 99, 99.9, 100):
        assert model.quantile(p).value == ordered[math.ceil(p / 100 * len(values)) - 1]


def test_product_limit_matches_scipy_ecdf_on_censored_data():
    stats = pytest.importorskip("scipy.stats")
    rng = random.Random(24)
    events = [rng.randint(1, 400) for _ in range(300)]
    censored = [rng.randint(1, 400) for _ in range(200)]
    ours = nd.product_limit(dict_of(events), dict_of(censored))
    ref = stats.ecdf(stats.CensoredData(uncensored=events, right=censored)).sf
    for t in range(0, 402):
        assert nd.survival_at(ours, t) == pytest.approx(float(ref.evaluate(t)), abs=1e-12), t


def dict_of(values):
    out: dict[int, float] = {}
    for v in values:
        out[v] = out.get(v, 0) + 1
    return out


def test_refused_requests_get_the_served_completions_spread_over_quantiles():
    # served: half 100-token completions, half 300; a refused 5,000-token prompt: 5,100 or 5,300, half each
    served = [nd.NeedFigures("exact", 1000, 1100, 1100)] * 50 + [nd.NeedFigures("exact", 1000, 1300, 1300)] * 50
    tally = nd.NeedTally([*served, nd.NeedFigures("unknown", 5000, 5001, None)])
    model = tally.model()
    assert model.events[5100] == pytest.approx(0.5) and model.events[5300] == pytest.approx(0.5)
    assert tally.imputed == 1
    # an ask caps the estimate
    capped = nd.NeedTally([*served, nd.NeedFigures("unknown", 5000, 5001, 5200)]).model()
    assert capped.events[5100] == pytest.approx(0.5) and capped.events[5200] == pytest.approx(0.5)


# --- the issue-24 agent-traffic day -----------------------------------------------------------------

CURRENT = 40960        # Qwen3-8B's own context, the limit the day ran under


def agent_day(count: int, seed: int = 24):
    """(need figures, asked demand tally, true needs): log-normal prompts around 1,100, 20 % asking 65,535,
    the rest 4,096 or nothing, every generation `stop` below 800 tokens, under max_model_len 40,960."""
    np = pytest.importorskip("numpy")
    rng = np.random.default_rng(seed)
    prompts = np.maximum(1, rng.lognormal(math.log(1100), 1.08, count).astype(np.int64)).tolist()
    draws = rng.random(count).tolist()
    completions = rng.integers(1, 800, count).tolist()
    figures, truth = [], []
    asked = dm.DemandTally()
    for prompt, draw, completion in zip(prompts, draws, completions, strict=True):
        ask = 65535 if draw < 0.2 else (4096 if draw < 0.6 else None)
        truth.append(prompt + completion)
        generated = granted = None
        if prompt >= CURRENT:      # refused: the prompt alone fills the context
            figures.append(nd.need_figures(prompt, 1, ask, None, None, None, "chat"))
        else:
            granted = min(ask or CURRENT - prompt, CURRENT - prompt)
            generated = min(completion, granted)
            figures.append(nd.need_figures(prompt, 1, ask, generated, granted,
                                           ["stop" if generated == completion else "length"], "chat"))
        a = dm.demand_figures(prompt, 1, ask, generated, granted, False, "chat")
        asked.add_values(prompt, a.sequence, a.kv_tokens, a.lower_bound, CURRENT)
    return figures, asked, truth


def check_agent_day(count: int) -> nd.NeedRecommendation:
    figures, asked, truth = agent_day(count)
    true_p99 = sorted(truth)[math.ceil(0.99 * len(truth)) - 1]
    assert 12_000 < true_p99 < 16_000            # "about 14,000"
    old = dm.recommend_from_demand(asked, 99, 16)
    assert old.max_model_len > 65_535            # the asks drove it past the model's own context
    rec = nd.recommend_from_need(nd.NeedTally(figures), asked, 99, 16, model_bound=40960, current=CURRENT)
    assert abs(rec.max_model_len - true_p99) / true_p99 < 0.10, (rec.max_model_len, true_p99)
    assert rec.limited_by == "need" and rec.imputed == sum(f.kind == "unknown" for f in figures)
    assert rec.need.low <= rec.need.value and rec.need.high is not None and rec.need.high >= rec.need.value
    # at 40,960 only prompts within 800 tokens of the end were really cut; at the recommendation about 1 %
    # needs more than it has (refused or cut)
    really_cut = sum(f.kind == "cut" for f in figures)
    assert rec.current.cut == pytest.approx(really_cut, abs=0.5 + rec.imputed)
    share = (rec.recommended.cut + rec.recommended.refused) / rec.recommended.total
    assert 0.005 < share < 0.011
    return rec


def test_agent_day_is_recommended_within_ten_percent_of_the_true_p99_need():
    check_agent_day(20_000)


@pytest.mark.slow
def test_agent_day_of_200000_records():
    rec = check_agent_day(200_000)
    assert rec.imputed > 0


# --- the issue-16 scenario: refused RAG prompts, clamped asks that were really cut -------------------

def issue16_figures():
    served = [fig(prompt=1000, requested=500, generated=500)] * 22
    refused = [fig(prompt=p) for p in [2509 + 6 * k for k in range(17)] + [2615]]
    clamped = [fig(prompt=1200, requested=r, generated=832, granted=832, reasons=["length"])
               for r in [4096] * 10 + [65535] * 10]
    return served + refused + clamped


def issue_traffic() -> list[dict]:
    """tests.sizing.test_demand's issue-16 records (imported from there, it would load the whole stack)."""
    base = LengthRecord(ts=0.0, model="m", endpoint="chat", max_model_len=2048).to_dict()
    served = [{**base, "prompt_tokens": 1000, "requested_max_tokens": 500, "completion_tokens": 500}] * 22
    refused = [{**base, "action": "rejected", "status": 400, "error_code": "context_length_exceeded",
                "prompt_tokens": p} for p in [2509 + 6 * k for k in range(17)] + [2615]]
    clamped = [{**base, "action": "clamped", "prompt_tokens": 1200, "requested_max_tokens": r,
                "granted_max_tokens": 832, "completion_tokens": 832, "finish_reasons": ["length"]}
               for r in [4096] * 10 + [65535] * 10]
    return served + refused + clamped


def test_issue16_scenario_still_rises_above_the_current_limit():
    asked = dm.DemandTally(dm.demands(issue_traffic()))
    rec = nd.recommend_from_need(nd.NeedTally(issue16_figures()), asked, 99, 16, model_bound=40960, current=2048)
    # 22 exact at 1,500; 20 censored at 2,032; 18 refused prompts 2,509…2,615 + 500 or 832 (the served
    # completions' estimate): the last event is 2,615 + 832 = 3,447 → 3,456 in blocks
    assert rec.need.value == 3447 and rec.max_model_len == 3456 > 2048
    # bounds: every refused prompt at prompt + 1 (2,616) … the clamped at their asks (66,735)
    assert (rec.need.low, rec.need.high) == (2616, None)
    assert (rec.current.refused, rec.recommended.refused) == (18, 0)
    # at 2,048 the 20 censored at 2,032 are cut by the estimate; at their least need (2,032) they were not
    assert (rec.current.cut, rec.current.cut_low, rec.current.cut_high) == (pytest.approx(20), 0, 20)
    assert rec.imputed == 18 and rec.cut == 20


def test_counts_fed_in_groups_give_the_same_estimate_as_records_one_by_one():
    """An aggregator (a SQL GROUP BY) may feed each distinct need once with its count."""
    rng = random.Random(7)
    figures = [fig(prompt=rng.choice([100, 900, 3000]), requested=rng.choice([None, 64, 4096]),
                   generated=rng.choice([None, 20, 64, 700]), granted=rng.choice([None, 64, 700]),
                   reasons=rng.choice([["stop"], ["length"], None])) for _ in range(2000)]
    one_by_one = nd.NeedTally(figures)
    grouped = nd.NeedTally()
    counts: dict[nd.NeedFigures, int] = {}
    for f in figures:
        counts[f] = counts.get(f, 0) + 1
    for f, c in counts.items():
        grouped.add(f, c)
    halves = nd.NeedTally(figures[:1000])
    halves.merge(nd.NeedTally(figures[1000:]))
    for tally in (grouped, halves):
        assert (tally.exact, tally.completions, tally.cut, tally.unknown) == (
            one_by_one.exact, one_by_one.completions, one_by_one.cut, one_by_one.unknown)
        for p in (50, 90, 99):
            assert tally.model().quantile(p) == one_by_one.model().quantile(p)
