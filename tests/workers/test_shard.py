"""proxy.workers.shard: the merge of every worker's share says what one process serving everything would say."""

from __future__ import annotations

import json
import random

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import generate_latest

from proxy.recording.metrics import Metrics
from proxy.recording.record import Action, LengthRecord
from proxy.recording.recorder import RecentWindow, Recorder
from proxy.recording.stats import sample_of
from proxy.workers.shard import (
    FamiliesCollector,
    carry_totals,
    demand_to_wire,
    families_to_wire,
    merge_counting,
    merge_demand,
    merge_families,
    merge_windows,
    window_from_wire,
    window_to_wire,
    without_monotone,
    worker_families,
)


def records(n: int, seed: int = 7, start: float = 1000.0) -> list[LengthRecord]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = rng.choice([3, 40, 900, 4000, 30000])
        requested = rng.choice([None, 16, 65535])
        clamped = requested == 65535
        out.append(LengthRecord(
            ts=start + i * 0.25, model=rng.choice(["qwen", "phi"]), endpoint=rng.choice(["chat", "completions"]),
            max_model_len=32768, prompt_tokens=prompt,
            upstream_prompt_tokens=prompt + rng.choice([0, 0, 0, 2]), requested_max_tokens=requested,
            granted_max_tokens=32768 - prompt if clamped else requested, completion_tokens=rng.randint(0, 500),
            finish_reasons=[rng.choice(["stop", "length"])],
            action=Action.CLAMPED if clamped else Action.PASS, status=200))
    return out


def without_created(text: bytes) -> list[str]:
    """The exposition's lines but the creation times (one per process), in any order."""
    return sorted(line for line in text.decode().splitlines() if "_created" not in line)


def render(families: list) -> bytes:
    registry = CollectorRegistry()
    registry.register(FamiliesCollector(families))
    return generate_latest(registry)


def test_merged_families_equal_one_process_that_saw_every_request() -> None:
    one, workers = Metrics(), [Metrics(), Metrics(), Metrics()]
    rng = random.Random(3)
    for rec in records(500):
        one.observe(rec)
        rng.choice(workers).observe(rec)
    # Through JSON, as the shares travel between workers.
    shares = [json.loads(json.dumps(families_to_wire(w.registry.collect()))) for w in workers]
    assert without_created(render(merge_families(shares))) == without_created(one.render()[0])


def test_created_keeps_the_earliest_and_states_merge_by_their_rule() -> None:
    first, second = Metrics(), Metrics()
    first.observe(records(1)[0])
    second.observe(records(1)[0])
    first.set_tokenizer_parity("qwen", True)
    second.set_tokenizer_parity("qwen", False)
    first.set_count_mode("qwen", "local")
    second.set_count_mode("qwen", "upstream")
    merged = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in merge_families([families_to_wire(m.registry.collect()) for m in (first, second)])
              for s in f.samples}
    created = [v for (name, _), v in merged.items() if name == "brimful_requests_created"]
    own = [s.value for m in (first, second) for f in m.registry.collect() for s in f.samples
           if s.name == "brimful_requests_created"]
    assert created == [min(own)]
    assert merged[("brimful_tokenizer_parity", (("model", "qwen"),))] == 0           # one worker saw a mismatch
    modes = {dict(labels)["mode"]: v for (name, labels), v in merged.items() if name == "brimful_count_mode"}
    assert modes == {"local": 1, "upstream": 1, "margin": 0}                         # the modes some worker is in


def test_a_model_without_a_limit_is_one_whichever_many_workers_read_its_card() -> None:
    shares = []
    for _ in range(4):
        metrics = Metrics()
        metrics.set_limit_unknown("qwen", "default", True)
        shares.append(families_to_wire(metrics.registry.collect()))
    merged = {(s.name, tuple(sorted(s.labels.items()))): s.value for f in merge_families(shares) for s in f.samples}
    assert merged[("brimful_model_limit_unknown", (("model", "qwen"), ("upstream", "default")))] == 1


def test_gauges_that_count_add_up() -> None:
    first, second = Metrics(), Metrics()
    first.attach_gates(lambda: [("default", type("G", (), {"in_flight": 3, "waiting": 1})())])
    second.attach_gates(lambda: [("default", type("G", (), {"in_flight": 4, "waiting": 0})())])
    merged = {(s.name, tuple(sorted(s.labels.items()))): s.value
              for f in merge_families([families_to_wire(m.registry.collect()) for m in (first, second)])
              for s in f.samples}
    assert merged[("brimful_in_flight_requests", (("upstream", "default"),))] == 7
    assert merged[("brimful_queued_requests", (("upstream", "default"),))] == 1


def test_merged_window_is_the_window_of_all_traffic() -> None:
    max_records = 50
    one = RecentWindow(max_records, max_age_s=None)
    workers = [RecentWindow(max_records, max_age_s=None) for _ in range(2)]
    rng = random.Random(5)
    for rec in records(400):
        one.add(rec.model or "", sample_of(rec), rec.ts)
        rng.choice(workers).add(rec.model or "", sample_of(rec), rec.ts)
    shares = [window_from_wire(json.loads(json.dumps(window_to_wire(w.snapshot(2000.0))))) for w in workers]
    assert merge_windows(shares, max_records) == one.snapshot(2000.0)


def test_merged_stats_equal_one_recorders() -> None:
    one, workers = Recorder(), [Recorder(), Recorder()]
    for i, rec in enumerate(records(300)):
        one.record(rec)
        workers[i % 2].record(rec)
    snapshot = merge_windows([w.window.snapshot(w.clock()) for w in workers], one.window.max_records)
    mine, theirs = one.stats(), workers[0].stats(snapshot)
    mine.pop("generated_at")
    theirs.pop("generated_at")
    assert theirs == mine


def test_merged_demand_is_that_of_the_latest_requests_of_all() -> None:
    one = RecentWindow(20, max_age_s=None)
    workers = [RecentWindow(20, max_age_s=None) for _ in range(2)]
    for i, rec in enumerate(records(100)):
        one.add("m", sample_of(rec), rec.ts)
        workers[i % 2].add("m", sample_of(rec), rec.ts)
    shares = [json.loads(json.dumps(demand_to_wire(w.snapshot(2000.0)))) for w in workers]
    expected = [s.demanded_kv for s in one.snapshot(2000.0)["m"] if s.demanded_kv is not None]
    assert merge_demand(shares, 20) == {"m": expected}


def test_merged_counting_is_the_least_trusting_workers() -> None:
    local = {"mode": "local", "exact": True, "drift_requests": 1, "max_under_count": 0, "max_over_count": 2,
             "engine": "fastokens", "engine_fallback": None, "engine_failures": 1}
    upstream = {**local, "mode": "upstream", "exact": True, "drift_requests": 4, "max_under_count": 3,
                "max_over_count": 1, "engine_failures": 0, "reason": "drift"}
    merged = merge_counting({0: {"qwen": local, "phi": local}, 1: {"qwen": upstream}})
    assert merged["qwen"] == {**upstream, "drift_requests": 5, "max_under_count": 3, "max_over_count": 2,
                              "engine_failures": 1, "modes_by_worker": {"0": "local", "1": "upstream"}}
    assert merged["phi"] == local


def _share(index: int, pid: int, requests: float, in_flight: float) -> dict:
    return {"index": index, "pid": pid, "families": [
        {"name": "brimful_requests", "documentation": "", "type": "counter", "unit": "",
         "samples": [["brimful_requests_total", {"model": "m"}, requests]]},
        {"name": "brimful_in_flight", "documentation": "", "type": "gauge", "unit": "",
         "samples": [["brimful_in_flight", {}, in_flight]]}]}


def _total(shares: list, carried: list, name: str) -> float:
    return sum(s.value for f in merge_families([without_monotone(s["families"]) for s in shares] + carried)
               for s in f.samples if s.name == name)


def test_carried_totals_never_go_backwards_when_a_worker_dies_or_does_not_answer() -> None:
    seen: dict = {}
    steps = [  # (answers, missing): worker 1 killed (pid 11 -> 12), then the primary too (pid 10 -> 13)
        ([_share(0, 10, 100, 2), _share(1, 11, 50, 3)], []),
        ([_share(0, 10, 120, 1)], [1]),                                 # worker 1 dead, its replacement starting
        ([_share(0, 10, 130, 1), _share(1, 12, 5, 1)], []),            # the replacement counts from 0
        ([_share(0, 13, 1, 0), _share(1, 12, 9, 0)], []),              # the primary restarted
    ]
    totals, in_flight = [], []
    for shares, missing in steps:
        seen, carried = carry_totals(json.loads(json.dumps(seen)), shares, missing)   # as the file keeps it
        totals.append(_total(shares, carried, "brimful_requests_total"))
        in_flight.append(_total(shares, carried, "brimful_in_flight"))
    assert totals == [150, 170, 185, 50 + 130 + 1 + 9]
    assert in_flight == [5, 1, 2, 0]                   # gauges are the living workers' alone
    assert totals == sorted(totals)


def test_two_pages_bringing_their_shares_in_either_order_never_lower_a_total() -> None:
    seen, _ = carry_totals({}, [_share(0, 10, 100, 0)], [])
    seen, shown = carry_totals(seen, [_share(0, 10, 90, 0)], [])        # an older share, late
    assert _total([], shown, "brimful_requests_total") == 100
    seen, shown = carry_totals(seen, [_share(0, 11, 3, 0)], [])         # then the worker died
    assert _total([], shown, "brimful_requests_total") == 103


def test_worker_families_say_who_answered_and_who_backs_off() -> None:
    text = render(worker_families(3, [0, 2], {"1": {"restarts": 3, "waiting": True}})).decode()
    assert 'brimful_worker_up{worker="1"} 0.0' in text and 'brimful_worker_up{worker="2"} 1.0' in text
    assert 'brimful_worker_restarts_total{worker="1"} 3.0' in text
    assert 'brimful_worker_backing_off{worker="1"} 1.0' in text and 'brimful_worker_backing_off{worker="0"} 0.0' in text
