"""Demand-side sizing (proxy.sizing.demand): hand-computed records, the issue's traffic, and real proxied records."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

from proxy.config import Config, LengthLogConfig
from proxy.recording.record import LengthRecord
from proxy.sizing import demand as dm
from tests.support.stack import MODEL, running_stack


def rec(**kw) -> dict:
    base = LengthRecord(ts=0.0, model="m", endpoint=kw.pop("endpoint", "chat"), max_model_len=2048)
    return {**base.to_dict(), **kw}


# --- one record -------------------------------------------------------------------------------------

def test_requested_limit_is_the_demand_even_when_clamped():
    d = dm.record_demand(rec(action="clamped", prompt_tokens=1200, requested_max_tokens=65535,
                             granted_max_tokens=832, completion_tokens=832, finish_reasons=["length"]))
    assert d is not None
    assert (d.sequence, d.kv_tokens, d.source, d.lower_bound) == (1200 + 65535, 1200 + 65535, "requested", False)


def test_refused_prompt_with_a_limit():
    d = dm.record_demand(rec(action="rejected", status=400, error_code="context_length_exceeded",
                             prompt_tokens=2600, requested_max_tokens=100))
    assert d.sequence == 2700 and d.completion == 100


def test_refused_prompt_without_a_limit_is_a_lower_bound():
    d = dm.record_demand(rec(action="rejected", prompt_tokens=2600))
    assert (d.sequence, d.completion, d.source, d.lower_bound) == (2601, None, "prompt_only", True)


def test_completions_without_a_limit_get_vllms_16():
    d = dm.record_demand(rec(endpoint="completions", action="rejected", prompt_tokens=3000))
    assert (d.sequence, d.source) == (3016, "engine_default")


def test_nothing_requested_uses_what_was_generated_and_usage_prompt_wins():
    d = dm.record_demand(rec(prompt_tokens=990, upstream_prompt_tokens=1000, completion_tokens=700,
                             finish_reasons=["stop"]))
    assert (d.prompt, d.sequence, d.source, d.lower_bound) == (1000, 1700, "generated", False)
    cut = dm.record_demand(rec(prompt_tokens=1000, completion_tokens=1048, finish_reasons=["length"]))
    assert cut.lower_bound


def test_n_choices_share_the_prompt():
    # seed 000: one prompt + n outputs in the KV cache; max_model_len bounds each sequence
    asked = dm.record_demand(rec(n=4, prompt_tokens=1000, requested_max_tokens=500))
    assert asked.sequence == 1500 and asked.kv_tokens == 1000 + 4 * 500 == 3000
    generated = dm.record_demand(rec(n=4, prompt_tokens=1000, completion_tokens=1800, granted_max_tokens=500))
    assert generated.sequence == 1500 and generated.kv_tokens == 2800


def test_no_prompt_count_no_demand():
    assert dm.record_demand(rec(action="rejected", error_code="invalid_json")) is None


@pytest.mark.parametrize("prompt, requested, limit, expected", [
    (2048, 10, 2048, "refused"),     # the prompt alone fills the context
    (1000, 1048, 2048, "fits"),      # exactly max_model_len
    (1000, 1049, 2048, "clamped"),
    (2040, 100, 2048, "clamped"),    # room 8 ≥ 1
])
def test_outcome(prompt, requested, limit, expected):
    d = dm.record_demand(rec(prompt_tokens=prompt, requested_max_tokens=requested))
    assert dm.outcome(d, limit) == expected


def test_outcome_follows_admission_min_completion():
    # proxy.admitted.admission: a room below min_completion_tokens refuses; a margin only shortens a clamp
    d = dm.record_demand(rec(prompt_tokens=2040, requested_max_tokens=100))
    assert dm.outcome(d, 2048, min_completion=8) == "clamped"     # room 8
    assert dm.outcome(d, 2048, min_completion=9) == "refused"
    fits = dm.record_demand(rec(prompt_tokens=2040, requested_max_tokens=8))
    assert dm.outcome(fits, 2048, min_completion=9) == "fits"     # it fits: nothing to clamp


def test_outcome_matches_admission_decide():
    """The outcome of a demand is what proxy.admitted.admission.decide does with the same numbers, with the
    floor applied to every overflowing limit (as for an engine that refuses any overflow): the plan's
    refusals are an upper bound where vLLM 0.32 would clamp a limit below max_model_len by itself."""
    from proxy.admitted.admission import RequestedLimit, decide
    from proxy.config import Policy

    for prompt in (100, 1990, 2040, 2047, 2048, 3000):
        for asked in (1, 8, 58, 100, 4096):
            for minimum in (1, 16):
                d = dm.record_demand(rec(prompt_tokens=prompt, requested_max_tokens=asked))
                decision = decide([prompt], 2048, RequestedLimit.of(("max_tokens", asked)), Policy(
                    margin_tokens=32, min_completion_tokens=minimum, upstream_clamps_overflow=False), model="m",
                    prompt_param="messages")
                expected = {"pass": "fits", "clamped": "clamped", "rejected": "refused"}[decision.action]
                assert dm.outcome(d, 2048, min_completion=minimum) == expected, (prompt, asked, minimum)


# --- the issue's traffic: 60 requests on max_model_len 2,048 ------------------------------------------

def issue_traffic() -> list[dict]:
    served = [rec(prompt_tokens=1000, requested_max_tokens=500, completion_tokens=500) for _ in range(22)]
    refused_prompts = [2509 + 6 * k for k in range(17)] + [2615]
    refused = [rec(action="rejected", status=400, error_code="context_length_exceeded", prompt_tokens=p)
               for p in refused_prompts]
    clamped = [rec(action="clamped", prompt_tokens=1200, requested_max_tokens=r, granted_max_tokens=832,
                   completion_tokens=832, finish_reasons=["length"]) for r in [4096] * 10 + [65535] * 10]
    return served + refused + clamped


def test_the_recommendation_rises_above_the_current_limit():
    ds = dm.demands(issue_traffic())
    assert len(ds) == 60
    # sorted sequences: 22 × 1,500; 18 refused (2,510 … 2,616, lower bounds); 10 × 5,296; 10 × 66,735.
    # p99: h = 59 × 0.99 = 58.41, between two 66,735 → 66,735 → 66,736 in blocks of 16; the model's
    # own context (Qwen3-8B, 40,960) caps it.
    r = dm.recommend_from_demand(ds, 99, 16, model_bound=40960)
    assert r.demand_at_percentile == 66735 and r.wanted == 66736
    assert r.max_model_len == 40960 and r.limited_by == "model_context"
    assert r.lower_bounds == 18
    # at the current 2,048: 18 refused (30 %), 20 clamped (33.3 %) — the issue's "30 % refused, 33 % clamped"
    assert (r.current.max_model_len, r.current.refused, r.current.clamped, r.current.fits) == (2048, 18, 20, 22)
    # at 40,960: only the ten 65,535-token asks are clamped
    assert (r.recommended.refused, r.recommended.clamped, r.recommended.fits) == (0, 10, 50)
    assert r.reason == (
        "p99 of demanded sequence length is 66,735 tokens → 66,736 in whole blocks of 16, capped at the "
        "model's own context of 40,960; at 40,960, 16.7 % of past requests would be clamped and 0.0 % refused "
        "(at the current 2,048: 33.3 % clamped, 30.0 % refused)"
    )


def test_kv_cache_caps_the_recommendation():
    ds = dm.demands(issue_traffic())
    # p80: h = 47.2, inside the 5,296 run → 5,296 = 331 blocks exactly; the KV cache holds 4,096
    r = dm.recommend_from_demand(ds, 80, 16, model_bound=40960, kv_bound=4096)
    assert (r.demand_at_percentile, r.wanted, r.max_model_len, r.limited_by) == (5296, 5296, 4096, "kv_cache")
    assert (r.recommended.refused, r.recommended.clamped) == (0, 20)
    assert "the longest the KV cache holds" in r.reason


def test_demand_percentiles_are_numpys():
    ds = dm.demands(issue_traffic())
    values = [d.sequence for d in ds]
    hist = dm.sequence_histogram(ds)
    for q in (50, 90, 95, 99):
        assert hist.percentile(q) == pytest.approx(float(np.percentile(values, q)), abs=1e-9)
    assert dm.kv_histogram(ds).n == 60


def test_tally_gives_the_same_answers_as_the_list():
    ds = dm.demands(issue_traffic())
    tally = dm.DemandTally(ds)
    assert tally.n == 60 and tally.lower_bounds == 18 and tally.limits == {2048: 60}
    assert len(tally.sequence) < 60          # repeats are counted, not stored
    for p in (50, 95, 99):
        assert dm.recommend_from_demand(tally, p, model_bound=40960) == dm.recommend_from_demand(
            ds, p, model_bound=40960)
    assert dm.outcome_shares(tally, 4096) == dm.outcome_shares(ds, 4096)


def test_shares_follow_demands_added_after_an_earlier_shares():
    """The sorted histograms `shares` keeps are sorted again once the counts grew, through add or directly
    (the DuckDB reader fills the dicts itself)."""
    ds = dm.demands(issue_traffic())
    tally = dm.DemandTally(ds[:30])
    assert tally.shares(1024) == dm.outcome_shares(ds[:30], 1024)
    for d in ds[30:]:
        tally.add(d)
    assert tally.shares(1024) == dm.outcome_shares(ds, 1024)
    longest = max(tally.sequence)
    tally.sequence[longest + 5000] = 1            # a demand beyond every one before, counted directly
    tally.refused_below[longest + 4000] = 1
    assert tally.shares(longest + 3000).refused == 1 and tally.shares(longest + 3000).total == len(ds) + 1


@pytest.mark.parametrize("minimum", [1, 2, 16, 500])
def test_tally_outcomes_equal_each_demands_outcome(minimum):
    """Two histogram reads give, at every L, the count of outcome() over the demands one by one."""
    rng = random.Random(minimum)
    records = [rec(prompt_tokens=rng.randint(0, 3000), requested_max_tokens=rng.choice([None, 1, 5, 20, 700, 4000]),
                   completion_tokens=rng.randint(0, 50), endpoint=rng.choice(["chat", "completions"]))
               for _ in range(400)]
    ds = dm.demands(records)
    tally = dm.DemandTally(ds, minimum)
    for limit in [1, 2, 15, 16, 17, 500, 1024, 2047, 2048, 2049, 2999, 3000, 3001, 3700, 8000]:
        counts = {"fits": 0, "clamped": 0, "refused": 0}
        for d in ds:
            counts[dm.outcome(d, limit, minimum)] += 1
        assert dm.outcome_shares(tally, limit) == dm.OutcomeShares(limit, 400, **counts), limit
    with pytest.raises(ValueError):
        dm.outcome_shares(tally, 100, min_completion=minimum + 1)


def test_current_defaults_to_the_most_common_limit():
    ds = dm.demands(issue_traffic())
    assert dm.current_max_model_len(ds) == 2048
    assert dm.recommend_from_demand([], 99) is None


# --- rejections by reason ------------------------------------------------------------------------------

def test_rejection_breakdown_separates_length_from_media_and_bad_requests():
    records = [
        *issue_traffic(),
        rec(action="rejected", status=400, error_code="context_length_exceeded", prompt_tokens=2040,
            requested_max_tokens=100),                               # prompt fits, no room for the minimum
        rec(action="rejected", status=400, error_code="invalid_prompt", prompt_tokens=None),  # media today
        rec(action="rejected", status=400, error_code="invalid_media"),
        rec(action="rejected", status=400, error_code="invalid_json"),
        rec(action="rejected", status=404, error_code="model_not_found"),
        rec(action="rejected", status=401, error_code="invalid_api_key"),
        rec(action="upstream_error", status=502, error_code="upstream_unreachable"),
        rec(action="upstream_error", status=400, error_code="context_length_exceeded", prompt_tokens=2100),
        rec(action="pass", status=200, error_code="client_disconnected"),
        rec(action="rejected", status=400, error_code=None),
        rec(action="rejected", status=400, error_code="something_new"),
    ]
    assert dm.rejection_breakdown(records) == {
        "prompt_too_long": 19, "bad_request": 2, "other": 2, "client_gone": 1, "invalid_media": 1,
        "invalid_prompt": 1, "no_room_left": 1, "unauthorized": 1, "upstream_failure": 1,
    }
    assert dm.rejection_reason(rec(prompt_tokens=10, completion_tokens=5, status=200)) is None


def test_every_code_brimful_writes_has_a_reason():
    from proxy.errors import ErrorCode

    assert set(ErrorCode) - set(dm.ERROR_CODE_REASONS) == set()


# --- real records: a traffic mix through the proxy ---------------------------------------------------------

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "theta", "kappa"]


def test_demand_from_proxied_records_matches_what_was_sent(tmp_path, qwen3, qwen3_dir):
    """A mix where a share cannot fit max_model_len 512: refused prompts, clamped limits, passes."""
    rng = random.Random(16)
    log_path = tmp_path / "lengths.jsonl"
    sent: list[tuple[int, int]] = []      # (prompt tokens, max_tokens asked)

    def log_lengths(config: Config) -> None:
        config.length_log = LengthLogConfig(path=str(log_path))

    with running_stack(qwen3_dir, fake_kwargs={"max_model_len": 512}, recorder=None, configure=log_lengths) as stack:
        for _ in range(120):
            words = int(rng.lognormvariate(5.4, 0.6)) + 1
            body = {"model": MODEL, "max_tokens": rng.choice([8, 32, 128, 400]),
                    "messages": [{"role": "user", "content": " ".join(rng.choice(WORDS) for _ in range(words))}]}
            stack.http.post("/v1/chat/completions", json=body)
            sent.append((qwen3.count_chat(body), body["max_tokens"]))
    # leaving the stack ran brimful's shutdown, which flushed the length log
    records = [json.loads(line) for line in log_path.read_text().splitlines()]
    assert len(records) == 120
    actions = [r["action"] for r in records]
    assert actions.count("rejected") > 5 and actions.count("clamped") > 5 and actions.count("pass") > 5

    ds = dm.demands(records)
    demanded = [p + m for p, m in sent]
    assert sorted(d.sequence for d in ds) == sorted(demanded)
    hist = dm.sequence_histogram(ds)
    for q in (50, 90, 95, 99):
        assert hist.percentile(q) == pytest.approx(float(np.percentile(demanded, q)), abs=1e-9)

    # brimful's default policy: minimum completion 1, so only a prompt that fills the context is refused
    now = dm.outcome_shares(ds, 512)
    assert now.refused == actions.count("rejected") == sum(p >= 512 for p, m in sent)
    assert now.clamped == actions.count("clamped")
    r = dm.recommend_from_demand(ds, 95, 16, model_bound=40960)
    assert r.max_model_len > 512 and r.max_model_len % 16 == 0
    assert r.current is not None and r.current.max_model_len == 512
    assert r.recommended.share("refused") < r.current.share("refused")
    too_long = sum(p >= 512 for p, _ in sent)
    assert too_long > 0
    assert dm.rejection_breakdown(records) == {"prompt_too_long": too_long}
