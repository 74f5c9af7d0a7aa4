"""proxy.live: percentiles, histograms, the recent window, the Recorder and its routes."""

from __future__ import annotations

import asyncio
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from proxy.recording.lengthlog import LengthLog
from proxy.recording.metrics import Metrics
from proxy.recording.record import LengthRecord
from proxy.recording.recorder import Recorder
from proxy.recording.stats import DISPLAY_EDGES, histogram
from proxy.serving.pages import dashboard_html, routes
from proxy.sizing.lengths import percentile
from proxy.sizing.lengths import round_to_blocks as recommend_max_model_len


def rec(**kw) -> LengthRecord:
    base = dict(ts=1000.0, model="m", endpoint="chat", status=200)
    base.update(kw)
    return LengthRecord(**base)


class FixedClock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def recorder(**kw) -> Recorder:
    """A Recorder whose clock sits at the records' ts, so the age window keeps them."""
    kw.setdefault("clock", FixedClock(1000.0))
    return Recorder(**kw)


# ----------------------------------------------------------------- pure functions

@pytest.mark.parametrize(
    "values, q, expected",
    [   # expected values are numpy.percentile(values, q) (default method "linear")
        ([1, 2, 3, 4], 50, 2.5),
        ([1, 2, 3, 4], 90, 3.7),
        ([1, 2, 3, 4], 99, 3.97),
        ([15, 20, 35, 40, 50], 40, 29.0),
        ([15, 20, 35, 40, 50], 50, 35),
        ([7], 99, 7),
        ([3, 9], 0, 3),
        ([3, 9], 100, 9),
    ],
)
def test_percentile_interpolates_like_numpy(values: list[int], q: float, expected: float) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_percentile_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_histogram_bins_trims_and_keeps_outliers() -> None:
    h = histogram([5, 5, 7, 20, 10_000_000])
    # [4,8): 3, [16,24): 1, then empty bins up to the open-ended last bin [2^21, ∞): 1
    assert h["edges"][:4] == [4, 8, 16, 24] and h["edges"][-2:] == [2**21, None]
    assert h["counts"][:3] == [3, 0, 1] and h["counts"][-1] == 1 and sum(h["counts"]) == 5
    assert len(h["edges"]) == len(h["counts"]) + 1
    assert histogram([]) == {"edges": [], "counts": []}


def test_histogram_edges_are_exclusive_at_the_top() -> None:
    assert histogram([64, 95], DISPLAY_EDGES) == {"edges": [64, 96], "counts": [2]}
    assert histogram([96], DISPLAY_EDGES) == {"edges": [96, 128], "counts": [1]}


@pytest.mark.parametrize("p99, expected", [(4000.2, 4016), (4096, 4096), (4097, 4112), (3, 16), (None, None)])
def test_recommend_rounds_up_to_kv_blocks(p99: float | None, expected: int | None) -> None:
    assert recommend_max_model_len(p99) == expected


# ----------------------------------------------------------------- Recorder.stats

def feed_hundred(recorder: Recorder) -> None:
    """prompts 1..100, 10 completion tokens each; every 10th clamped, every 5th cut by length."""
    for i in range(1, 101):
        recorder.record(rec(
            prompt_tokens=i, completion_tokens=10, max_model_len=4096,
            requested_max_tokens=5000 if i % 10 == 0 else 100,
            granted_max_tokens=4000 if i % 10 == 0 else 100,
            action="clamped" if i % 10 == 0 else "pass",
            finish_reasons=["length"] if i % 5 == 0 else ["stop"],
        ))


def test_stats_percentiles_counts_and_recommendation() -> None:
    r = recorder()
    feed_hundred(r)
    [m] = r.stats()["models"]
    assert m["model"] == "m" and m["count"] == 100
    assert m["clamped"] == 10 and m["rejected"] == 0 and m["upstream_errors"] == 0
    assert m["finish_length"] == {"requests": 20, "finished": 100, "share": 0.2}
    assert m["max_model_len"] == 4096
    p = m["prompt_tokens"]
    assert (p["count"], p["p50"], p["p90"], p["p95"], p["p99"], p["max"]) == (100, 50.5, 90.1, 95.05, 99.01, 100)
    t = m["total_tokens"]
    assert (t["p50"], t["p99"], t["max"]) == (60.5, 109.01, 110)
    assert m["completion_tokens"]["p95"] == 10
    assert m["served_recommended_max_model_len"] == 112    # ceil(109.01 / 16) * 16: censored at what was served
    assert p["histogram"] == {
        "edges": [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128],
        "counts": [1, 2, 4, 8, 8, 8, 16, 16, 32, 5],
    }


def test_stats_recommendation_comes_from_demand() -> None:
    """Demand = prompt + the limit asked: 90 × (i + 100), and the ten clamped ones asked i + 5000."""
    import numpy as np

    r = recorder()
    feed_hundred(r)
    [m] = r.stats()["models"]
    demanded = [i + (5000 if i % 10 == 0 else 100) for i in range(1, 101)]
    d = m["demand_tokens"]
    for q in (50, 90, 95, 99):
        assert d[f"p{q}"] == pytest.approx(float(np.percentile(demanded, q)))
    assert (d["count"], d["max"]) == (100, 5100)
    # p99: h = 98.01 between 5,090 and 5,100 → 5,090.1 → 5,104 in blocks of 16, above the current 4,096
    rec_ = m["recommendation"]
    assert (rec_["demand_at_percentile"], rec_["max_model_len"], rec_["limited_by"]) == (
        pytest.approx(5090.1), 5104, "demand")
    assert m["recommended_max_model_len"] == 5104
    assert rec_["current"] == {"max_model_len": 4096, "total": 100, "fits": 90, "clamped": 10, "refused": 0,
                               "clamped_share": 0.1, "refused_share": 0.0}
    assert (rec_["recommended"]["fits"], rec_["recommended"]["clamped"]) == (100, 0)
    assert m["beyond_max_model_len"] == {"count": 10, "share": 0.1}
    assert m["rejections"] == {} and m["upstream"] is None and m["model_context"] is None
    assert m["demand_kv_p95"] == math.ceil(float(np.percentile(demanded, 95)))


def test_rejected_requests_count_but_add_no_completion() -> None:
    r = recorder()
    r.record(rec(prompt_tokens=9000, max_model_len=8192, action="rejected", status=400,
                 error_code="context_length_exceeded"))
    r.record(rec(prompt_tokens=100, completion_tokens=50, finish_reasons=["stop", "length"]))
    [m] = r.stats()["models"]
    assert m["count"] == 2 and m["rejected"] == 1
    assert m["prompt_tokens"]["max"] == 9000 and m["prompt_tokens"]["count"] == 2
    assert m["total_tokens"]["count"] == 1 and m["total_tokens"]["max"] == 150
    assert m["finish_length"] == {"requests": 1, "finished": 1, "share": 1.0}
    # the refused prompt is demand too: 9,000 + 1 at least (nothing was asked), beyond max_model_len; the
    # other asked for nothing and one choice was cut by length: 150 is a lower bound as well
    assert m["demand_tokens"]["max"] == 9001 and m["demand_lower_bounds"] == 2
    assert m["rejections"] == {"prompt_too_long": 1}
    assert m["recommendation"]["current"]["refused"] == 1


def test_stats_recommendation_is_bounded_by_the_model_and_the_kv_pool() -> None:
    from proxy.sizing import vllm_metrics as vm
    from proxy.sizing.live import ModelSizing, UpstreamView

    r = recorder()
    feed_hundred(r)
    r.sizing = lambda model: ModelSizing(config={"max_position_embeddings": 4608}, config_source="config.json")
    [m] = r.stats()["models"]
    assert (m["recommended_max_model_len"], m["recommendation"]["limited_by"]) == (4608, "model_context")
    assert m["model_context"] == {"max_model_len": 4608, "key": "max_position_embeddings", "source": "config.json"}
    # a pool of 280 blocks of 16 = 4,480 tokens binds below the model's 4,608
    text = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",kv_cache_memory_bytes="None",'
            'num_gpu_blocks="280"} 1.0\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n')
    view = UpstreamView("default", "http://vllm:8000", vm.parse_vllm_metrics(text), scrapes=3)
    r.sizing = lambda model: ModelSizing(config={"max_position_embeddings": 4608}, upstream=view)
    [m] = r.stats()["models"]
    assert (m["recommended_max_model_len"], m["recommendation"]["limited_by"]) == (4480, "kv_cache")
    up = m["upstream"]
    assert (up["upstream"], up["scrapes"], up["kv_cache_usage"], up["signals"]) == ("default", 3, 0.5, [])
    pool = up["pool"]
    assert (pool["actual_tokens"], pool["usable_tokens"], pool["planned_tokens"]) == (4480, 279 * 16, None)
    assert pool["explanation"][0].startswith("no plan: config.json")      # no layers: no bytes per token
    assert pool["concurrency"] == 279 * 16 // (math.ceil(m["demand_kv_p95"] / 16) * 16)


def test_every_surface_is_counted_per_endpoint_and_a_batch_by_its_longest_prompt() -> None:
    r = recorder()
    r.record(rec(endpoint="chat", prompt_tokens=10, completion_tokens=5))
    r.record(rec(endpoint="responses", prompt_tokens=20, completion_tokens=5))
    r.record(rec(endpoint="responses", prompt_tokens=30, action="uncounted", upstream_prompt_tokens=30,
                 completion_tokens=5))
    r.record(rec(endpoint="messages", prompt_tokens=40, completion_tokens=5))
    # 64 embedded inputs of 500 tokens: one sequence of 500, not one of 32,000
    r.record(rec(endpoint="embeddings", prompt_tokens=32000, longest_prompt_tokens=500, upstream_prompt_tokens=32000,
                 completion_tokens=0, action="truncated"))
    [m] = r.stats()["models"]
    assert m["endpoints"] == {"responses": 2, "chat": 1, "messages": 1, "embeddings": 1}
    assert (m["actions"]["uncounted"], m["actions"]["truncated"]) == (1, 1)
    assert m["recommended_max_model_len"] == 496   # p99 of sequences 15, 25, 35, 45, 500 → 482.2, in blocks


def test_models_are_reported_separately_and_sorted() -> None:
    r = recorder()
    r.record(rec(model="zeta", prompt_tokens=1))
    r.record(rec(model="alpha", prompt_tokens=2))
    r.record(rec(model="alpha", prompt_tokens=4))
    models = r.stats()["models"]
    assert [(m["model"], m["count"]) for m in models] == [("alpha", 2), ("zeta", 1)]


def test_window_keeps_the_last_n_records() -> None:
    r = recorder(window_records=5)
    for i in range(1, 21):
        r.record(rec(prompt_tokens=i))
    [m] = r.stats()["models"]
    assert m["count"] == 5 and m["prompt_tokens"]["p50"] == 18 and m["prompt_tokens"]["max"] == 20


def test_window_forgets_records_older_than_its_age() -> None:
    clock = FixedClock(1000.0)
    r = Recorder(window_seconds=60, clock=clock)
    r.record(rec(ts=900.0, prompt_tokens=111))
    r.record(rec(ts=950.0, prompt_tokens=222))
    [m] = r.stats()["models"]
    assert m["count"] == 1 and m["prompt_tokens"]["max"] == 222
    clock.now = 2000.0
    assert r.stats()["models"] == []


def test_window_caps_the_number_of_models() -> None:
    r = recorder(max_models=2)
    for name in ("a", "b", "c", "d"):
        r.record(rec(model=name, prompt_tokens=1))
    assert [(m["model"], m["count"]) for m in r.stats()["models"]] == [("a", 1), ("b", 1), ("other", 2)]


def test_recorder_updates_metrics_and_the_length_log(tmp_path: Path) -> None:
    log = LengthLog(tmp_path / "lengths.jsonl")
    r = recorder(lengthlog=log)
    one = rec(prompt_tokens=30, completion_tokens=3)
    r.record(one)
    r.count_length_retry("m")
    r.close()
    assert [json.loads(line) for line in (tmp_path / "lengths.jsonl").read_text().splitlines()] == [one.to_dict()]
    reg = r.metrics.registry
    assert reg.get_sample_value("brimful_prompt_tokens_sum", {"model": "m"}) == 30
    assert reg.get_sample_value("brimful_length_retries_total", {"model": "m"}) == 1
    assert reg.get_sample_value("brimful_length_records_total", {"outcome": "written"}) == 1


def prompt_sum(r: Recorder) -> float | None:
    return r.metrics.registry.get_sample_value("brimful_prompt_tokens_sum", {"model": "m"})


def test_off_the_event_loop_a_record_is_applied_at_once() -> None:
    r = recorder()
    r.record(rec(prompt_tokens=30))
    assert (r.records, prompt_sum(r)) == (1, 30)


async def test_on_the_loop_the_records_of_a_turn_are_applied_together_after_it() -> None:
    r = recorder()
    r.record(rec(prompt_tokens=30))
    r.record(rec(prompt_tokens=12))
    assert (r.records, prompt_sum(r)) == (0, None)           # pending: nothing applied inside the turn
    after = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_soon(after.set_result, None)   # queued behind the recorder's flush
    await after
    assert (r.records, prompt_sum(r)) == (2, 42)


@pytest.mark.parametrize("read, expected", [
    (lambda r: r.stats()["models"][0]["count"], 2),
    (lambda r: 'brimful_prompt_tokens_count{model="m"} 2.0' in r.render_metrics()[0].decode(), True),
    (lambda r: r.demand_kv_percentile("m", 100), 35),                  # 30 + 5 demanded at most
], ids=["stats", "render_metrics", "demand_kv_percentile"])
async def test_every_reader_sees_the_records_still_pending(read: Callable[[Recorder], Any], expected: Any) -> None:
    r = recorder()
    r.record(rec(prompt_tokens=30, requested_max_tokens=5))
    r.record(rec(prompt_tokens=12, requested_max_tokens=5))
    assert read(r) == expected
    assert r.records == 2


async def test_close_writes_the_records_still_pending(tmp_path: Path) -> None:
    r = recorder(lengthlog=LengthLog(tmp_path / "lengths.jsonl"))
    one = rec(prompt_tokens=30)
    r.record(one)
    r.close()
    assert [json.loads(line) for line in (tmp_path / "lengths.jsonl").read_text().splitlines()] == [one.to_dict()]


class FailingMetrics(Metrics):
    """Metrics whose update fails for one model: a bug in the aggregates."""

    def observe(self, record: LengthRecord) -> None:
        if record.model == "broken":
            raise ValueError("a bug")
        super().observe(record)


async def test_a_record_that_fails_to_apply_loses_none_after_it(caplog: pytest.LogCaptureFixture) -> None:
    r = recorder(metrics=FailingMetrics())
    r.record(rec(model="broken", prompt_tokens=1))
    r.record(rec(prompt_tokens=30))
    r.flush()
    assert prompt_sum(r) == 30
    assert [m["model"] for m in r.stats()["models"]] == ["m"]
    assert "could not record a request's length figures" in caplog.text



def test_off_the_loop_a_record_that_fails_to_apply_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    r = recorder(metrics=FailingMetrics())
    r.record(rec(model="broken", prompt_tokens=1))
    r.record(rec(prompt_tokens=30))
    assert prompt_sum(r) == 30
    assert "could not record a request's length figures" in caplog.text

# ----------------------------------------------------------------- routes

@pytest.fixture
def client() -> TestClient:
    r = recorder()
    feed_hundred(r)
    return TestClient(Starlette(routes=routes(r)))


def test_stats_route(client: TestClient) -> None:
    resp = client.get("/stats")
    assert resp.status_code == 200 and resp.headers["cache-control"] == "no-store"
    [m] = resp.json()["models"]
    assert m["recommended_max_model_len"] == 5104 and m["served_recommended_max_model_len"] == 112


def test_metrics_route(client: TestClient) -> None:
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    assert 'brimful_prompt_tokens_count{model="m"} 100.0' in resp.text
    assert 'brimful_clamped_tokens_total{model="m"} 10000.0' in resp.text   # 10 × (5000 − 4000)


def test_dashboard_route_is_self_contained(client: TestClient) -> None:
    resp = client.get("/dashboard")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/html")
    page = resp.text
    assert page == dashboard_html()
    assert 'fetch("stats"' in page                           # relative: works under any mount prefix
    assert not re.search(r"<script[^>]+src=|<link[^>]+href=|@import|url\(", page)
    # the only absolute URL is the SVG namespace identifier, which is never fetched
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}


def test_routes_reject_other_methods(client: TestClient) -> None:
    assert client.post("/stats").status_code == 405


def test_demand_kv_percentile_of_one_model() -> None:
    r = recorder()
    feed_hundred(r)
    r.record(rec(model="other-model", prompt_tokens=7, requested_max_tokens=3))
    demanded = sorted(i + (5000 if i % 10 == 0 else 100) for i in range(1, 101))
    assert r.demand_kv_percentile("m", 95) == pytest.approx(percentile(demanded, 95))
    assert r.demand_kv_percentile("other-model") == 10
    assert r.demand_kv_percentile("nobody") is None
