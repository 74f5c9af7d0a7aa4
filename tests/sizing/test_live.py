"""proxy.sizing.live: the running vLLM's pool against the plan, per model, from vLLM 0.32 captures and known values."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.sizing import capacity as cap
from proxy.sizing import vllm_metrics as vm
from proxy.sizing.live import ModelSizing, UpstreamView, check_pool, given_memory_plan, upstream_section

DATA = Path(__file__).parents[1] / "data" / "vllm032_cpu"
TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 64, "torch_dtype": "bfloat16", "max_position_embeddings": 40960}
FIXTURE = vm.parse_vllm_metrics((DATA / "fixture_server.txt").read_text())
PRESSURE = [vm.parse_vllm_metrics((DATA / f"pressure_{i}.txt").read_text()) for i in range(9)]


def test_given_kv_memory_is_a_plan_without_gpu_figures():
    # the fixture server: --kv-cache-memory-bytes 64 MiB, 512 B per token → 131,072 tokens in blocks of 128
    cache = FIXTURE.cache_for()
    plan = given_memory_plan(cache, 512)
    assert plan is not None and plan.kv_blocks * 128 == 131_072 == plan.kv_tokens
    x = check_pool(FIXTURE, config=TINY, demand_kv_tokens=901)
    assert (x.actual_tokens, x.planned_tokens, x.difference_tokens, x.ratio, x.bytes_per_token) == (
        131_072, 131_072, 0, 1.0, 512)
    assert x.plan_basis == "--kv-cache-memory-bytes 67,108,864 ÷ 512 B per token from config.json, KV cache auto"
    assert x.explanation[0].startswith("vLLM was given exactly 64.00 MiB (67.11 MB) of KV cache")
    # 901 tokens take 8 blocks of 128; 1,023 usable blocks (one is vLLM's null block) hold 127 such requests
    assert (x.usable_tokens, x.concurrency, x.vllm_max_concurrency) == (1023 * 128, 127, 64.0)


def test_wrong_bytes_per_token_is_explained():
    fp32 = {**TINY, "torch_dtype": "float32"}       # vLLM serves float32 as bf16: same 512 B, no mismatch
    assert check_pool(FIXTURE, config=fp32).difference_tokens == 0
    four_layers = {**TINY, "num_hidden_layers": 4}  # a config that is not the served model's
    x = check_pool(FIXTURE, config=four_layers)
    assert (x.planned_tokens, x.ratio) == (65_536, 2.0)
    assert "implies 512 B per token against the planned 1,024" in x.explanation[1]


def test_pool_without_given_memory_says_what_the_plan_needs():
    text = ('vllm:cache_config_info{block_size="16",cache_dtype="fp8",engine="0",gpu_memory_utilization="0.92",'
            'kv_cache_memory_bytes="None",num_gpu_blocks="24000"} 1.0\n')
    x = check_pool(vm.parse_vllm_metrics(text), config=TINY, demand_kv_tokens=1500)
    assert (x.actual_tokens, x.planned_tokens, x.difference_tokens) == (384_000, None, None)
    assert x.explanation == ("no plan: vLLM sized its pool from gpu_memory_utilization 0.92 of the GPU; the plan "
                             "needs the GPU and the weights: brimful report --upstream URL --model-config "
                             "config.json --gpu NAME",)
    assert x.concurrency == 23_999 * 16 // 1504
    assert check_pool(vm.parse_vllm_metrics(text)).explanation[0].startswith("no plan: no config.json")
    assert check_pool(vm.parse_vllm_metrics('vllm:num_requests_waiting{model_name="m"} 1\n')) is None


def test_full_plan_from_the_gpu_options():
    # Qwen3-8B on "80 GiB" planned with 4 GiB of activations; vLLM measured 6 GiB: 23,822 blocks
    bpt = cap.kv_bytes_per_token(cap.PRESETS["Qwen3-8B"].config)
    plan = cap.make_plan(cap.PlanInputs(bytes_per_token=bpt, gpu_memory_bytes=80 * cap.GIB,
                                        weights_bytes=cap.PRESETS["Qwen3-8B"].params * 2))
    text = ('vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",kv_cache_memory_bytes="None",'
            'num_gpu_blocks="23822"} 1.0\n')
    x = check_pool(vm.parse_vllm_metrics(text), plan=plan, plan_basis="plan", demand_kv_tokens=1500)
    assert (x.planned_tokens, x.difference_tokens) == (395_712, (24_732 - 23_822) * 16)
    assert x.explanation[0].startswith("non-KV memory as measured: 6.00 GiB")
    assert x.concurrency == 23_821 * 16 // 1504 and x.plan_basis == "plan"


def test_upstream_section_is_per_model():
    scraper_signals = vm.observe(vm.observe(vm.observe(vm.CapacityState(), PRESSURE[0])[0], PRESSURE[1])[0],
                                 PRESSURE[2])[1]
    view = UpstreamView("default", "http://127.0.0.1:8000", PRESSURE[2], scraper_signals, scrapes=3)
    up = upstream_section(view, "tiny-qwen", config=TINY, demand_kv_tokens=901)
    assert (up.running, up.waiting, up.preemptions_total) == (4, 2, 0)
    assert up.kv_cache_usage == pytest.approx(14 / 15)
    assert [s.kind for s in up.signals] == ["kv_usage_pinned"]
    assert up.pool is not None and up.pool.planned_tokens == up.pool.actual_tokens
    other = upstream_section(view, "lora-adapter")       # same pool, no gauges of its own
    assert other.pool is not None and other.signals == () and other.kv_cache_usage is None
    failed = upstream_section(UpstreamView("default", "http://x", None, failures=2, last_error="HTTP 404"), "m")
    assert failed.pool is None and failed.to_dict()["last_error"] == "HTTP 404"


def test_model_sizing_bounds():
    assert ModelSizing().context is None and ModelSizing().kv_bound is None
    assert ModelSizing(config={"hidden_size": 64}).context is None        # no length field: no bound of its own
    sizing = ModelSizing(config=TINY, upstream=UpstreamView("d", "u", FIXTURE))
    assert sizing.context is not None and sizing.context.max_model_len == 40960
    assert sizing.kv_bound == 131_072


def test_one_scrape_signals():
    [pinned] = vm.current_signals(PRESSURE[1])
    assert pinned.detail == "KV cache 93.3 % used now (threshold 90 %)"
    kinds = [(s.kind, s.detail) for s in vm.current_signals(PRESSURE[5], max_num_seqs=128)]
    assert kinds == [("kv_usage_pinned", "KV cache 93.3 % used now (threshold 90 %)"),
                     ("preemptions_rising", "5 preemptions since vLLM started")]
    [waiting] = [s for s in vm.current_signals(PRESSURE[3], max_num_seqs=128) if s.kind == "requests_waiting"]
    assert waiting.detail == "3 requests waiting, 3 running now"
    assert waiting.action.startswith("requests queue for KV cache blocks")
    assert vm.current_signals(PRESSURE[0]) == ()
