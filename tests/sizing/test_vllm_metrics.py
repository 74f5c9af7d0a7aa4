"""Reading vLLM's /metrics (proxy.sizing.vllm_metrics): vLLM 0.32 captures, a fake with known values, a live server."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path

import pytest

from proxy.sizing import capacity as cap
from proxy.sizing import vllm_metrics as vm
from tests.realvllm.fixture import RealVllm

DATA = Path(__file__).parents[1] / "data" / "vllm032_cpu"
TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 64, "torch_dtype": "bfloat16"}     # tests/realvllm/tiny_model.py: 2 × 2 × 2 × 32 × 2 = 512 B
PRESSURE = [(DATA / f"pressure_{i}.txt").read_text() for i in range(9)]


def tiny_plan(block: int = 128) -> cap.Plan:
    return cap.make_plan(cap.PlanInputs(bytes_per_token=cap.kv_bytes_per_token(TINY), gpu_memory_bytes=16 * cap.GIB,
                                        weights_bytes=0, block_size=block))


# --- captured from a real vLLM 0.32 -----------------------------------------------------------------

def test_parse_the_fixture_servers_metrics():
    m = vm.parse_vllm_metrics((DATA / "fixture_server.txt").read_text())
    [c] = m.cache
    assert (c.engine, c.num_gpu_blocks, c.block_size, c.cache_dtype) == ("0", 1024, 128, "auto")
    assert c.kv_cache_memory_bytes == 64 * cap.MIB and c.gpu_memory_utilization == 0.92
    assert c.kv_cache_size_tokens == 131_072 == c.pool_tokens       # what vLLM logs: 64 MiB ÷ 512 B
    assert c.kv_cache_max_concurrency == 64.0                         # 1,024 blocks ÷ 16 per 2,048-token request
    assert c.usable_tokens == 1023 * 128
    g = m.models["tiny-qwen"]
    assert (g.engines, g.kv_cache_usage, g.preemptions_total, g.waiting, g.running) == (("0",), 0.0, 0.0, 0.0, 0.0)


def test_cross_check_real_pool_against_the_plan():
    c = vm.parse_vllm_metrics((DATA / "fixture_server.txt").read_text()).cache_for("0")
    x = vm.cross_check(c, tiny_plan(), demand_tokens=901)
    assert (x.actual_tokens, x.planned_tokens, x.difference_tokens, x.ratio) == (131_072, 131_072, 0, 1.0)
    assert "exactly 64.00 MiB" in x.explanation[0] and len(x.explanation) == 1
    # 901 tokens take 8 blocks of 128; 1,023 usable blocks hold 127 such requests
    assert x.concurrency == 1023 // 8 == 127


def test_cross_check_names_a_bytes_per_token_mismatch():
    c = vm.parse_vllm_metrics((DATA / "fixture_server.txt").read_text()).cache_for()
    wrong = cap.make_plan(cap.PlanInputs(bytes_per_token=1024, gpu_memory_bytes=16 * cap.GIB, weights_bytes=0,
                                         block_size=128))        # as if the KV cache were fp32
    x = vm.cross_check(c, wrong)
    assert x.planned_tokens == 65_536 and x.actual_above_plan and x.ratio == 2.0
    assert "implies 512 B per token against the planned 1,024" in x.explanation[1]


def test_pressure_series_signals():
    """Nine scrapes 1 s apart while six 901-token requests fought over 15 usable blocks."""
    parsed = [vm.parse_vllm_metrics(t).models["tiny-qwen"] for t in PRESSURE]
    assert [(g.running, g.waiting, g.preemptions_total) for g in parsed] == [
        (0, 0, 0), (6, 0, 0), (4, 2, 0), (3, 3, 0), (2, 4, 0), (3, 0, 5), (2, 0, 6), (0, 0, 6), (0, 0, 6)]
    assert [round(g.kv_cache_usage, 4) for g in parsed] == [0, 0.9333, 0.9333, 0.9333, 0.8, 0.9333, 0.7333, 0, 0]
    state = vm.CapacityState()
    seen = []
    for text in PRESSURE:
        state, signals = vm.observe(state, vm.parse_vllm_metrics(text), max_num_seqs=128)   # CPU default
        seen.append([(s.kind, s.scrapes) for s in signals])
    assert seen == [
        [], [],
        [("kv_usage_pinned", 2)],
        [("kv_usage_pinned", 3), ("requests_waiting", 2)],
        [("requests_waiting", 3)],                      # 80 % used, yet 4 wait: the free blocks are too few
        [("preemptions_rising", 1)],
        [("preemptions_rising", 2)],
        [], [],
    ]
    assert state.scrapes == 9


def test_signal_texts_carry_the_seeds_actions():
    state = vm.CapacityState()
    for text in PRESSURE[:4]:
        state, signals = vm.observe(state, vm.parse_vllm_metrics(text), max_num_seqs=128)
    pinned, waiting = signals
    assert pinned.detail == "KV cache 93.3 % used for 3 scrapes (threshold 90 %)"
    assert pinned.action.startswith("time to add KV capacity (seed 000): try --kv-cache-dtype fp8 first")
    assert waiting.detail == "3 requests waiting, 3 running, for 2 scrapes"
    assert waiting.action.startswith("requests queue for KV cache blocks: add capacity")
    for text in PRESSURE[4:6]:
        state, signals = vm.observe(state, vm.parse_vllm_metrics(text))
    [rising] = signals
    assert rising.detail == "5 preemptions since the last scrape (5 in all)"
    assert "raise --gpu-memory-utilization, or lower --max-num-seqs / --max-num-batched-tokens" in rising.action


# --- a fake with known values ----------------------------------------------------------------------------

INFO = 'block_size="16",cache_dtype="fp8",kv_cache_memory_bytes="None",num_gpu_blocks="24000"'
FAKE = (
    "# TYPE vllm:cache_config_info gauge\n"
    + "".join(f"vllm:cache_config_info{{{INFO},engine=\"{e}\"}} 1\n" for e in ("1", "0"))
) + """\
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="big"} 0.5
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="big"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="big"} 0.75
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="big"} 3.0
vllm:num_preemptions_total{engine="1",model_name="big"} 4.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="big"} 1.0
vllm:num_requests_waiting{engine="1",model_name="big"} 2.0
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="big"} 10.0
vllm:num_requests_running{engine="1",model_name="big"} 20.0
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="old"} 0.4
"""


def test_fake_two_engines_sum_and_max():
    m = vm.parse_vllm_metrics(FAKE)
    assert [c.engine for c in m.cache] == ["0", "1"] and m.cache[0].kv_cache_memory_bytes is None
    big = m.models["big"]
    assert (big.engines, big.kv_cache_usage, big.preemptions_total, big.waiting, big.running) == (
        ("0", "1"), 0.75, 7.0, 3.0, 30.0)
    assert m.models["old"].kv_cache_usage == 0.4         # vLLM < 0.10's name, when the new one is absent
    assert m.cache_for("1").engine == "1" and m.cache_for("9").engine == "0"


def test_cross_check_explains_activations_and_units():
    # plan: Qwen3-8B on "80 GiB", 4 GiB of activations → 395,712 tokens in blocks of 16
    bpt = cap.kv_bytes_per_token(cap.PRESETS["Qwen3-8B"].config)
    plan = cap.make_plan(cap.PlanInputs(bytes_per_token=bpt, gpu_memory_bytes=80 * cap.GIB,
                                        weights_bytes=cap.PRESETS["Qwen3-8B"].params * 2))
    assert plan.kv_blocks * 16 == 395_712

    def info(blocks: int) -> vm.CacheConfigInfo:
        return vm.CacheConfigInfo.from_labels({"engine": "0", "num_gpu_blocks": str(blocks), "block_size": "16",
                                               "kv_cache_memory_bytes": "None"})

    assert vm.cross_check(info(24_732), plan).explanation == ("matches the plan to a block",)
    # vLLM measured 6 GiB of activations: KV = 79,027,398,246 − 16,381,470,720 − 6,442,450,944 B → 23,822 blocks
    six = cap.kv_memory(80 * cap.GIB, 0.92, plan.inputs.weights_bytes, 6 * cap.GIB).kv_memory_bytes // (bpt * 16)
    assert six == 23_822
    x = vm.cross_check(info(six), plan, demand_tokens=1500)
    assert not x.actual_above_plan and x.difference_tokens == (24_732 - 23_822) * 16
    assert round(x.implied_other_bytes / cap.GIB, 2) == 6.0
    assert x.explanation[0].startswith("non-KV memory as measured: 6.00 GiB")
    assert "--activation-memory 6.00GiB" in x.explanation[0]
    assert x.concurrency == (23_821 * 16) // 1504
    # the GPU really had 80 GB (74.51 GiB), the plan said 80 GiB
    gb = cap.kv_memory(80 * cap.GB, 0.92, plan.inputs.weights_bytes, 4 * cap.GIB).kv_memory_bytes // (bpt * 16)
    units = vm.cross_check(info(gb), plan)
    assert units.explanation == (
        ("units: the pool matches a GPU of 74.51 GiB (80.00 GB) — the plan's GPU memory looks like GB read as "
         "GiB (GiB = 2^30, GB = 10^9 bytes)"),)


def test_preemption_counter_reset_is_a_restart_not_a_signal():
    def scrape(total: float) -> vm.VllmMetrics:
        return vm.parse_vllm_metrics(f'vllm:num_preemptions_total{{engine="0",model_name="m"}} {total}\n')

    state, _ = vm.observe(vm.CapacityState(), scrape(10))
    state, signals = vm.observe(state, scrape(2))
    assert signals == () and state.models["m"].preemptions == 2
    state, signals = vm.observe(state, scrape(3))
    assert [s.kind for s in signals] == ["preemptions_rising"]


def test_waiting_at_max_num_seqs_blames_the_scheduler():
    text = ('vllm:num_requests_waiting{engine="0",model_name="m"} 5\n'
            'vllm:num_requests_running{engine="0",model_name="m"} 256\n'
            'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.3\n')
    state = vm.CapacityState()
    for _ in range(2):
        state, signals = vm.observe(state, vm.parse_vllm_metrics(text), max_num_seqs=256)
    assert signals[0].action.startswith("requests queue because max_num_seqs sequences already run")
    _, unknown = vm.observe(state, vm.parse_vllm_metrics(text))
    assert unknown[0].action.startswith("requests queue: if the running count sits at max_num_seqs")


# --- the scraper --------------------------------------------------------------------------------------------

async def test_scraper_folds_scrapes_and_survives_failures():
    bodies = iter([*PRESSURE[:4], "boom", *PRESSURE[4:6]])

    async def fetch() -> str:
        body = next(bodies)
        if body == "boom":
            raise ConnectionError("connection refused")
        return body

    scraper = vm.UpstreamMetricsScraper(fetch, interval=15, max_num_seqs=128, clock=lambda: 42.0)
    results = [await scraper.scrape_once() for _ in range(7)]
    assert results == [True, True, True, True, False, True, True]
    assert scraper.state.scrapes == 6 and scraper.failures == 0 and scraper.last_success == 42.0
    assert [s.kind for s in scraper.signals] == ["preemptions_rising"]
    assert scraper.latest.models["tiny-qwen"].preemptions_total == 5


async def test_scraper_reports_a_failure_without_raising():
    async def fetch() -> str:
        raise TimeoutError("no answer in 5 s")

    scraper = vm.UpstreamMetricsScraper(fetch)
    assert await scraper.scrape_once() is False and await scraper.scrape_once() is False
    assert scraper.failures == 2 and scraper.last_error == "TimeoutError: no answer in 5 s" and scraper.latest is None


async def test_scraper_run_stops_on_the_event():
    stop = asyncio.Event()
    calls = 0

    async def fetch() -> str:
        nonlocal calls
        calls += 1
        if calls == 3:
            stop.set()
        return PRESSURE[calls]

    await asyncio.wait_for(vm.UpstreamMetricsScraper(fetch, interval=0).run(stop), 10)
    assert calls == 3


# --- a live vLLM 0.32 --------------------------------------------------------------------------------------

def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


@pytest.mark.slow
@pytest.mark.realvllm
def test_real_vllm_metrics(real_vllm: RealVllm):
    text = _get(f"{real_vllm.base_url}/metrics")
    metrics = vm.parse_vllm_metrics(text)
    cache = metrics.cache_for("0")
    assert cache is not None and cache.block_size and cache.num_gpu_blocks
    # the server runs with --kv-cache-memory-bytes 64 MiB: 64 MiB ÷ 512 B per token = 131,072 tokens
    assert cache.kv_cache_memory_bytes == 64 * cap.MIB
    assert cache.pool_tokens == cache.kv_cache_size_tokens == 131_072
    x = vm.cross_check(cache, tiny_plan(cache.block_size), demand_tokens=1000)
    assert x.difference_tokens == 0
    assert real_vllm.model in metrics.models

    body = json.dumps({"model": real_vllm.model, "prompt": "hello " * 40, "max_tokens": 4}).encode()
    request = urllib.request.Request(f"{real_vllm.base_url}/v1/completions", body,
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200

    async def fetch() -> str:
        return await asyncio.to_thread(_get, f"{real_vllm.base_url}/metrics")

    scraper = vm.UpstreamMetricsScraper(fetch)
    assert asyncio.run(scraper.scrape_once()) and asyncio.run(scraper.scrape_once())
    g = scraper.latest.models[real_vllm.model]
    assert g.running == 0 and g.waiting == 0 and g.kv_cache_usage == 0.0 and g.preemptions_total is not None
    assert scraper.signals == ()
