"""vLLM 0.32's KV-cache manager, formula by formula (vllm/v1/core/kv_cache_utils.py, kv_cache_interface.py).

Every expected figure is worked out by hand from vLLM's source in the comment
beside it; tests/commands/test_plan_layouts.py checks the whole chain against what a real
vLLM logged.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.sizing import capacity as cap
from proxy.sizing.deploy import DeploymentSpec, hybrid_kv_cache_manager, resolve
from proxy.sizing.kv_groups import (
    LayerSpec,
    group_layers,
    kv_cache_size_tokens,
    longest_fitting,
    max_concurrency,
    startup_fit,
)
from proxy.sizing.vllm_metrics import parse_vllm_metrics

DATA = Path(__file__).resolve().parents[1] / "data" / "vllm032_cpu"
FULL = LayerSpec("full", 128, 256)                   # 2 KV heads × 32 × (K+V) × bf16 = 256 B per token
SLIDING = LayerSpec("sliding", 128, 256, window=256)


def test_one_group_when_every_layer_is_full_attention():
    # _get_kv_cache_groups_uniform_spec: one group, a pool block holds a page of every layer
    groups = group_layers([FULL, FULL])
    assert len(groups.groups) == 1 and groups.groups[0].layers == (0, 1)
    assert groups.bytes_per_block == 2 * 128 * 256 == 65_536
    # 64 MiB → 1,024 blocks; a 2,048-token request takes cdiv(2048, 128) = 16: 64.0x, 131,072 tokens —
    # what tests/data/vllm032_cpu/fixture_server.txt's cache_config_info says (num_gpu_blocks="1024",
    # kv_cache_max_concurrency="64.0", kv_cache_size_tokens="131072")
    blocks = groups.num_blocks(64 * 1024 * 1024)
    assert blocks == 1024
    assert max_concurrency(blocks, groups, 2048, 2048) == 64.0
    assert kv_cache_size_tokens(blocks, groups, 2048, 2048) == 131_072
    served = parse_vllm_metrics((DATA / "fixture_server.txt").read_text()).cache_for("0")
    assert served is not None
    figures = (served.num_gpu_blocks, served.kv_cache_max_concurrency, served.kv_cache_size_tokens)
    assert figures == (1024, 64.0, 131_072)


def test_kv_cache_size_depends_on_max_model_len_through_whole_blocks():
    # get_kv_cache_capacity: int(concurrency × max_model_len); 2,000 tokens still take 16 blocks
    groups = group_layers([FULL, FULL])
    assert kv_cache_size_tokens(1024, groups, 2000, 2000) == 128_000


def test_sliding_window_blocks_per_request():
    # SlidingWindowSpec.max_admission_blocks_per_request: cdiv(min(W − 1 + F, L), B) + 1
    assert SLIDING.blocks_per_request(8192, 512) == -(-(255 + 512) // 128) + 1 == 7
    assert SLIDING.blocks_per_request(2048, 2048) == 16 + 1      # L binds: one block more than full
    assert SLIDING.blocks_per_request(100, 512) == 1 + 1
    # ChunkedLocalAttentionSpec: cdiv(min(C + F, L), B), no extra block
    chunked = LayerSpec("chunked", 16, 256, window=8192)
    assert chunked.blocks_per_request(131_072, 8192) == 1024
    assert chunked.blocks_per_request(1000, 8192) == 63
    # MambaSpec (mamba_cache_mode "none"): one page per request
    assert LayerSpec("mamba", 128, state_bytes=1000).blocks_per_request(10**6, 2048) == 1


def test_all_sliding_is_one_uniform_group():
    groups = group_layers([SLIDING, SLIDING])
    assert len(groups.groups) == 1 and groups.bytes_per_block == 65_536
    # 1,024 blocks ÷ 17 = 60.24x at L = F = 2,048 (a real vLLM logged this for the tiny Mistral)
    assert f"{max_concurrency(1024, groups, 2048, 2048):.2f}" == "60.24"
    assert kv_cache_size_tokens(1024, groups, 2048, 2048) == 123_361


def test_gemma3_five_to_one_makes_six_groups_of_one_layer():
    # min 1 layer, max 5 ≥ 1.5 × 1: the group size is 1, so 5 sliding groups + 1 full group
    groups = group_layers([SLIDING] * 5 + [FULL])
    assert [g.spec.kind for g in groups.groups] == ["sliding"] * 5 + ["full"]
    assert all(len(g.layers) == 1 for g in groups.groups) and groups.padding_layers == 0
    assert groups.bytes_per_block == 32_768
    # 2,048 blocks; per request 5 × 7 + 64 = 99 → 20.69x, int(2048 / 99 × 8192) = 169,466
    assert groups.blocks_per_request(8192, 512) == 99
    assert kv_cache_size_tokens(2048, groups, 8192, 512) == 169_466


def test_layers_are_dealt_round_robin_into_groups():
    # layers[i::num_groups]: 10 full + 20 sliding → (full), (sw 0, 2, …), (sw 1, 3, …)
    specs = [FULL if i % 3 == 0 else SLIDING for i in range(30)]
    groups = group_layers(specs)
    assert [len(g.layers) for g in groups.groups] == [10, 10, 10]
    sliding = [i for i in range(30) if i % 3]
    assert groups.groups[1].layers == tuple(sliding[0::2]) and groups.groups[2].layers == tuple(sliding[1::2])
    assert groups.bytes_per_block == 10 * 128 * 256


def test_close_counts_use_the_larger_group_and_pad():
    # the source's own example: 8 full + 9 sliding → padded to 9 + 9 (9 < 1.5 × 8)
    groups = group_layers([FULL] * 8 + [SLIDING] * 9)
    assert [len(g.layers) for g in groups.groups] == [8, 9]
    assert groups.padding_layers == 1 and groups.bytes_per_block == 9 * 128 * 256
    # 4 sliding + 3 full → groups of 4, the full one padded
    groups = group_layers([SLIDING, FULL] * 3 + [SLIDING])
    assert [len(g.layers) for g in groups.groups] == [4, 3] and groups.padding_layers == 1


def test_gpt_oss_like_twelve_and_twelve():
    groups = group_layers([SLIDING, FULL] * 12)
    assert [len(g.layers) for g in groups.groups] == [12, 12] and groups.padding_layers == 0


def test_hybrid_manager_off_allocates_local_layers_as_full():
    # unify_hybrid_kv_cache_specs / _promote_local_kv_cache_specs
    groups = group_layers([SLIDING] * 5 + [FULL], hybrid_manager=False)
    assert groups.promoted and len(groups.groups) == 1 and groups.groups[0].spec.kind == "full"
    assert groups.bytes_per_block == 6 * 32_768
    # all-sliding has no full layer to promote to: unchanged
    assert not group_layers([SLIDING, SLIDING], hybrid_manager=False).promoted


def test_smaller_pages_get_a_larger_block():
    # unify_kv_cache_spec_page_size: a page that divides the largest scales its block size
    small = LayerSpec("sliding", 128, 128, window=256)          # one KV head
    groups = group_layers([FULL, small])
    assert {g.spec.block_size for g in groups.groups} == {128, 256}
    assert all(g.spec.page_bytes == 32_768 for g in groups.groups)
    # one that does not divide it is padded to it
    odd = LayerSpec("sliding", 128, 96, window=256)
    padded = group_layers([FULL, odd])
    assert padded.groups[1].spec.page_size_padded == 32_768 and padded.groups[1].spec.block_size == 128


def test_startup_holds_the_null_block_back():
    groups = group_layers([FULL, FULL])
    # 4 blocks, one held back: 3 × 128 = 384 (shared/vllm/captures/f1_kv_cache_too_small.txt)
    fit = startup_fit(262_144, groups, 2048, 2048)
    assert not fit.fits and fit.estimated_max_model_len == 384 and fit.check_bytes == 3 * 65_536
    assert startup_fit(17 * 65_536, groups, 2048, 2048).fits
    assert not startup_fit(16 * 65_536, groups, 2048, 2048).fits
    assert longest_fitting(0, groups, 2048, 2048) == 0


def test_sliding_layers_let_longer_requests_start():
    # all-sliding: the cost stops at the window, so any length fits once one window does
    groups = group_layers([SLIDING, SLIDING])
    assert startup_fit(10 * 65_536, groups, 1_000_000, 512).fits


def _kinds(config):
    return [k for k, _ in cap.kv_layout(config).layer_kinds] or ["full"] * config["num_hidden_layers"]


BASE = {"num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 64}


def test_transformers_default_interleaving():
    # Gemma2Config / GptOssConfig: layer i slides when (i + 1) % 2; Gemma3TextConfig: sliding_window_pattern 6
    assert _kinds(dict(BASE, model_type="gemma2")) == ["sliding", "full"] * 3
    assert _kinds(dict(BASE, model_type="gemma3_text", num_hidden_layers=12)) == (["sliding"] * 5 + ["full"]) * 2
    assert _kinds(dict(BASE, model_type="gemma3_text", sliding_window_pattern=3)) == ["sliding", "sliding", "full"] * 2
    # defaults of the windows: Gemma 4,096, gpt-oss 128
    assert cap.kv_layout(dict(BASE, model_type="gemma2")).layer_kinds[0] == ("sliding", 4096)
    assert cap.kv_layout(dict(BASE, model_type="gpt_oss")).layer_kinds[0] == ("sliding", 128)


def test_gpt_oss_slides_on_even_layers_whatever_the_config_says():
    config = dict(BASE, model_type="gpt_oss", sliding_window=128, layer_types=["full_attention"] * 6)
    assert _kinds(config) == ["sliding", "full"] * 3


def test_mistral_v01_slides_everywhere_and_v03_nowhere():
    assert _kinds(dict(BASE, model_type="mistral", sliding_window=4096)) == ["sliding"] * 6
    assert _kinds(dict(BASE, model_type="mistral")) == ["sliding"] * 6       # MistralConfig's default 4,096
    assert cap.kv_layout(dict(BASE, model_type="mistral", sliding_window=None)).layer_kinds == ()
    assert cap.kv_layout(dict(BASE, sliding_window=0)).layer_kinds == ()     # vLLM: 0 means none


def test_phi3_mini_slides_on_every_layer():
    # microsoft/Phi-3-mini-4k-instruct's config.json: sliding_window 2047 and no layer_types → every layer
    # is a SlidingWindowSpec in vLLM (CacheConfig.sliding_window is set when there are no layer_types)
    config = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_size": 3072,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
              "sliding_window": 2047, "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    layout = cap.kv_layout(config)
    assert layout.layer_kinds == tuple(("sliding", 2047) for _ in range(32))
    assert layout.bytes_per_token == 32 * 2 * 32 * 96 * 2


def test_llama4_chunked_attention_runs_as_full_by_default():
    config = dict(BASE, model_type="llama4_text", num_hidden_layers=8, attention_chunk_size=8192)
    layout = cap.kv_layout(config)
    # no_rope_layers default (interval 4): layers 3 and 7 are global NoPE layers
    assert [k for k, _ in layout.layer_kinds] == ["chunked"] * 3 + ["full"] + ["chunked"] * 3 + ["full"]
    spec = DeploymentSpec(config=config, model_label="l4", gpu_label="x", gpu_memory_bytes=80 << 30, params=1)
    assert not hybrid_kv_cache_manager(spec)           # vLLM disables it for chunked local attention
    hw = resolve(spec)
    assert hw.kv_groups is not None and hw.kv_groups.promoted and len(hw.kv_groups.groups) == 1
    opted_in = resolve(DeploymentSpec(**{**spec.__dict__, "chunked_local_hybrid": True}))
    # 6 chunked : 2 full, 6 ≥ 1.5 × 2 → groups of 2: three chunked groups and one full group
    assert opted_in.kv_groups is not None and [len(g.layers) for g in opted_in.kv_groups.groups] == [2, 2, 2, 2]
    with pytest.raises(ValueError, match="explicitly enabled but is not supported"):
        hybrid_kv_cache_manager(DeploymentSpec(**{**spec.__dict__, "hybrid_kv_cache_manager": True}))


def test_qwen2_partial_sliding_is_refused_like_vllm():
    config = dict(BASE, model_type="qwen2", sliding_window=4096, use_sliding_window=True, max_window_layers=3)
    with pytest.raises(cap.UnsupportedConfigError, match="some but all layers"):
        cap.kv_layout(config)
    # max_window_layers 0: every layer slides, which vLLM runs
    assert _kinds(dict(config, max_window_layers=0)) == ["sliding"] * 6


def test_plan_concurrency_counts_the_window_not_the_whole_request():
    # a 6-layer 5 : 1 model on 64 MiB: at 32,768 tokens a full-only model holds 2,048 blocks ÷ (6 × 256)
    # = 1 request; here each request takes 5 × 7 sliding blocks + 256 full blocks = 291 → 7 requests
    config = dict(BASE, model_type="gemma3_text", sliding_window=256)
    layout = cap.kv_layout(config)
    plan = cap.make_plan(cap.PlanInputs(
        bytes_per_token=layout.bytes_per_token, gpu_memory_bytes=64 << 20, weights_bytes=0, utilization=1.0,
        activation_bytes=0, block_size=128, tokens_per_request=32_768, max_model_len=32_768,
        kv_groups=layout.kv_groups(128), in_flight_tokens=512))
    assert plan.kv_blocks == 2048 and plan.blocks_per_request == 291 and plan.concurrent_requests == 7
    assert plan.vllm_kv_cache_tokens == int(2048 / 291 * 32_768)
    assert plan.startup is not None and plan.startup.fits


def test_a_running_sliding_window_pool_matches_its_plan_to_the_block():
    # vLLM's pool for the 5 : 1 tiny model on 64 MiB: 2,048 blocks of 128 (one 32,768 B page per block,
    # tests/data/vllm032_cpu/kv_layouts.json "mixed-gemma3"); per token over all six layers it would be 341
    from proxy.sizing.live import given_memory_plan
    from proxy.sizing.vllm_metrics import CacheConfigInfo, cross_check

    cache = CacheConfigInfo("0", 2048, 128, "auto", None, 64 << 20, 169_466, 20.69)
    layout = cap.kv_layout(dict(BASE, model_type="gemma3_text", sliding_window=256))
    plan = given_memory_plan(cache, layout.bytes_per_token, layout)
    assert plan is not None and plan.kv_blocks == 2048
    x = cross_check(cache, plan)
    assert x.planned_tokens == x.actual_tokens == 2048 * 128 and x.difference_tokens == 0
    assert x.actual_kv_bytes == 64 << 20


QWEN3_NEXT_80B = {  # Qwen/Qwen3-Next-80B-A3B-Instruct config.json (the fields that size its caches)
    "model_type": "qwen3_next", "num_hidden_layers": 48, "hidden_size": 2048, "num_attention_heads": 16,
    "num_key_value_heads": 2, "head_dim": 256, "full_attention_interval": 4, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "torch_dtype": "bfloat16",
}


def test_gated_delta_net_state_and_the_enlarged_attention_block():
    # conv (128·16·2 + 128·32) × 3 × 2 B = 49,152; recurrent 32 × 128 × 128 × 2 B = 1,048,576
    assert cap.gated_delta_net_state_bytes(QWEN3_NEXT_80B) == 1_097_728
    assert cap.gated_delta_net_state_bytes(QWEN3_NEXT_80B, mamba_ssm_cache_dtype="float32") == 49_152 + 2_097_152
    assert cap.gated_delta_net_state_bytes(QWEN3_NEXT_80B, tensor_parallel_size=2) == 1_097_728 // 2
    # the attention page of one token is 2 heads × 256 × (K+V) × 2 B = 2,048 B: 16 × ceil(1,097,728 ÷ 32,768)
    # = 544 tokens ("Setting attention block size to 544 tokens"), the state padded by 1.49 %
    layout = cap.kv_layout(QWEN3_NEXT_80B)
    groups = layout.kv_groups(16)
    assert groups.block_size == 544
    assert [g.spec.kind for g in groups.groups] == ["mamba"] * 3 + ["full"]      # 36 : 12 → groups of 12
    assert all(len(g.layers) == 12 for g in groups.groups)
    assert groups.bytes_per_block == 12 * 544 * 2048
    assert f"{(544 * 2048 - 1_097_728) / 1_097_728:.2%}" == "1.49%"
    # a request of 32,768 tokens: ceil(32768 ÷ 544) = 61 full blocks + 3 groups × 2 state pages (align)
    assert groups.blocks_per_request(32_768, 8192) == 61 + 6
    assert layout.kv_groups(16, mamba_cache_mode="none").blocks_per_request(32_768, 8192) == 61 + 3


def test_other_linear_layers_stay_an_upper_bound():
    # no Gated DeltaNet fields: the linear layers are left out, as before, with the note
    config = dict(BASE, layer_types=["linear_attention"] * 3 + ["full_attention"] * 3)
    layout = cap.kv_layout(config)
    assert layout.linear_state_bytes == 0 and layout.kv_groups(16).groups[0].layers == (0, 1, 2)
    assert "upper bound" in layout.notes[0]


def test_models_whose_vllm_layers_take_only_the_model_wide_window():
    # Qwen2-MoE: transformers interleaves layer_types, but vLLM's qwen2_moe.py reads only
    # CacheConfig.sliding_window, which mixed layer_types leave unset: every layer is full attention
    config = dict(BASE, model_type="qwen2_moe", sliding_window=4096, use_sliding_window=True, max_window_layers=6)
    assert cap.kv_layout(config).layer_kinds == ()
    # Qwen3-MoE has no layer_types at all: the window is on every layer
    assert _kinds(dict(BASE, model_type="qwen3_moe", sliding_window=4096, use_sliding_window=True)) == ["sliding"] * 6


def test_cohere2_layers_see_one_token_more_than_the_window():
    # vLLM's commandr.py passes sliding_window + 1; Cohere2Config's default pattern is 4
    layout = cap.kv_layout(dict(BASE, model_type="cohere2", num_hidden_layers=8, sliding_window=4096))
    assert layout.layer_kinds == ((("sliding", 4097),) * 3 + (("full", None),)) * 2
