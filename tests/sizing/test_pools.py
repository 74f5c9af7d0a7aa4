"""Two pools by length (proxy.sizing.pools): a hand-computed split, and the advice `brimful report` prints."""

from __future__ import annotations

import json

import pytest

from proxy.commands import report as report_cli
from proxy.recording.record import LengthRecord
from proxy.sizing import demand as dm
from proxy.sizing import need as nd
from proxy.sizing import pools as pl


def test_route_key_is_prompt_plus_ask_in_blocks_and_no_ask_goes_long():
    assert pl.route_key(1000, 600) == 1600 and pl.route_key(1000, 601) == 1616
    assert pl.route_key(1000, None) == pl.NO_ASK == pl.route_key(1000, 0)


def small_traffic():
    """8 short asks (1,000 + 600) that needed 1,200 in 1 s; 2 without a limit that needed 8,000 in 4 s."""
    routes, need, asked = pl.RouteTally(), nd.NeedTally(), dm.DemandTally()
    for _ in range(8):
        routes.add(pl.route_key(1000, 600), 1200, 1000, 1.0)
        need.add(nd.need_figures(1000, 1, 600, 200, 600, ["stop"], "chat"))
        asked.add_values(1000, 1600, 1600, False, 8192)
    for _ in range(2):
        routes.add(pl.route_key(1000, None), 8000, 1000, 4.0)
        need.add(nd.need_figures(1000, 1, None, 7000, None, ["stop"], "chat"))
        asked.add_values(1000, 8000, 8000, False, 8192)
    return routes, need.model(), asked


def test_the_split_by_hand():
    routes, need, asked = small_traffic()
    cap = pl.Capacity(kv_tokens=32_000, block_size=16)          # 2,000 blocks
    advice = pl.advise_split(routes, need, nd.outcome_at(need, asked, 8192), 8192, cap, rate=10.0)
    one, short, long = advice.one_pool, advice.short, advice.long
    # one pool: mean (8 × 1,200 + 2 × 8,000) / 10 = 2,560 = 160 blocks → 12 at once; 10/s × 1.6 s = 16 needed
    assert (one.mean_kv_tokens, one.concurrent_per_replica, one.concurrency_needed, one.replicas) == (2560, 12, 16, 2)
    # worst case: 2,000 // 512 blocks of 8,192 = 3 at once → 6 replicas
    assert (one.guaranteed_per_replica, one.gpus_worst) == (3, 6)
    # short 1,600: 8/s × 1 s = 8 needed; 1,200 = 75 blocks → 26 at once; worst 2,000 // 100 = 20 → one replica
    assert (short.max_model_len, short.share, short.concurrent_per_replica, short.guaranteed_per_replica) == (
        1600, 0.8, 26, 20)
    assert (short.replicas, short.replicas_worst) == (1, 1)
    # long 8,192: 2/s × 4 s = 8 needed; 8,000 = 500 blocks → 4 at once (2 replicas), worst 3 (3 replicas)
    assert (long.concurrent_per_replica, long.replicas, long.guaranteed_per_replica, long.replicas_worst) == (
        4, 2, 3, 3)
    assert short.gpus_worst + long.gpus_worst == 4 < one.gpus_worst
    assert advice.outcome.refused == 0 and advice.outcome.cut == 0


def test_no_split_when_it_saves_nothing():
    routes, need, asked = small_traffic()
    # a KV cache so large one replica holds everything either way
    advice = pl.advise_split(routes, need, nd.outcome_at(need, asked, 8192), 8192, pl.Capacity(10_000_000), 10.0)
    assert advice.one_pool.gpus_worst == 1 and advice.short is None and advice.long is None


def test_a_window_longer_than_the_kv_cache_has_no_replica():
    assert pl.Capacity(kv_tokens=4096).concurrent(100, 8192) == 0
    assert pl.Capacity(kv_tokens=8192, max_num_seqs=5).concurrent(100, 8192) == 5


def test_report_prints_one_pool_and_the_split(tmp_path, capsys):
    path = tmp_path / "lengths.jsonl"
    with path.open("w") as f:
        for i in range(400):
            short = i % 5 != 0
            rec = LengthRecord(ts=1.7e9 + i, model="m", endpoint="chat", max_model_len=40960,
                               prompt_tokens=1000 if short else 30000, requested_max_tokens=600 if short else None,
                               granted_max_tokens=600 if short else None, completion_tokens=200, status=200,
                               finish_reasons=["stop"], latency_ms=1000.0 if short else 6000.0)
            f.write(json.dumps(rec.to_dict()) + "\n")
    argv = [str(path), "--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--target-rate", "40"]
    assert report_cli.main([*argv, "--format", "json"]) == 0
    m = json.loads(capsys.readouterr().out)["models"][0]
    pools = m["pools"]
    assert pools["rate"] == 40
    assert pools["one_pool"]["max_model_len"] == m["recommendation"]["max_model_len"] == 30208
    assert pools["short"]["max_model_len"] < 30208 and pools["short"]["share"] == pytest.approx(0.8)
    assert pools["short"]["gpus_worst"] + pools["long"]["gpus_worst"] < pools["one_pool"]["gpus_worst"]
    assert report_cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "  pools for 40.00 requests/s (--target-rate)" in text
    assert "    short pool max_model_len " in text and "    long pool  max_model_len  30,208" in text
