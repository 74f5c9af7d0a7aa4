"""KV-cache capacity maths against the article's figures (seed 000) and kv_reference.json."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from proxy.sizing import capacity as cap
from proxy.sizing.gpus import GPUS, lookup_gpu
from tests.conftest import SHARED

GIB, MIB, KIB = cap.GIB, cap.MIB, cap.KIB
H100 = lookup_gpu("H100-80GB").memory_bytes
A10 = lookup_gpu("A10-24GB").memory_bytes


def preset_bpt(name: str, dtype: str = "auto") -> int:
    return cap.kv_bytes_per_token(cap.PRESETS[name].config, dtype)


def plan(name: str, gpu: int, dtype: str = "auto", weights: int | None = None, **kw) -> cap.Plan:
    preset = cap.PRESETS[name]
    w = weights if weights is not None else cap.weights_bytes(preset.params)
    return cap.make_plan(cap.PlanInputs(bytes_per_token=preset_bpt(name, dtype),
                                        gpu_memory_bytes=gpu, weights_bytes=w, **kw))


# --- the article's table --------------------------------------------------

@pytest.mark.parametrize("name, kib, mib_1500, gib_32k", [
    ("Qwen2.5-7B", 56, 82, 1.75),
    ("Mistral-7B-v0.3", 128, 188, 4.0),
    ("Qwen3-8B", 144, 211, 4.5),
    ("Qwen2.5-32B", 256, 375, 8.0),
    ("Qwen2.5-72B", 320, 469, 10.0),
])
def test_article_table_kv_per_token_and_per_request(name, kib, mib_1500, gib_32k):
    bpt = preset_bpt(name)
    assert bpt == kib * KIB
    # the table's per-request columns are unrounded tokens × bytes, rounded for print
    assert round(bpt * 1500 / MIB) == mib_1500
    assert bpt * 32768 / GIB == gib_32k
    assert preset_bpt(name, "fp8") == bpt // 2


def test_opt13b_mha_800_kib_without_kv_heads_field():
    # OPT's config has no num_key_value_heads: MHA, KV heads = attention heads
    config = {"num_hidden_layers": 40, "num_attention_heads": 40, "hidden_size": 5120, "torch_dtype": "float16"}
    layout = cap.kv_layout(config)
    assert layout.bytes_per_token == 800 * KIB
    assert layout.attention == "mha" and layout.head_dim == 128 and layout.kv_heads == 40


def _reference_models():
    data = json.loads((SHARED / "corpus" / "kv_reference.json").read_text())
    return [m for m in data["models"] if m["kv_bytes_per_token_bf16"] is not None]


@pytest.mark.parametrize("entry", _reference_models(), ids=lambda m: m["name"])
def test_kv_reference_json(entry):
    keys = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
            "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    config = {k: entry[k] for k in keys if entry.get(k) is not None}
    if entry["head_dim_source"] == "config.head_dim":
        config["head_dim"] = entry["head_dim"]
    assert cap.kv_bytes_per_token(config, "bf16") == entry["kv_bytes_per_token_bf16"]
    assert cap.kv_bytes_per_token(config, "fp8") == entry["kv_bytes_per_token_fp8"]
    assert cap.kv_layout(config, "bf16").attention == entry["attention"]


def test_deepseek_v31_mla_is_68_6_kib_not_the_naive_formula():
    config = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
              "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
              "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}
    layout = cap.kv_layout(config)
    assert layout.attention == "mla"
    assert layout.bytes_per_token == 61 * 576 * 2 == 70272
    assert round(layout.bytes_per_token / KIB, 1) == 68.6


# --- the worked example: Qwen3-8B on an H100 -------------------------------

def test_qwen3_8b_h100_worked_example():
    p = plan("Qwen3-8B", H100)
    assert p.memory.usable_bytes / GIB == pytest.approx(73.6)
    assert round(p.memory.weights_bytes / GIB, 2) == 15.26
    assert round(p.memory.kv_memory_bytes / GIB, 2) == 54.34
    # the article: "54.34GiB ÷ 144KiB = 약 395,717토큰" — the floor of the exact quotient
    assert p.kv_tokens == 395_717
    assert p.slots_per_request == 1504 and p.slots_per_request // 16 == 94
    assert p.concurrent_requests == 263


def test_qwen3_8b_h100_fp8_doubles_concurrency():
    assert plan("Qwen3-8B", H100, "fp8").concurrent_requests == 526


def test_reserving_32k_per_request_leaves_12_and_500_users_need_42_vs_2_gpus():
    p = plan("Qwen3-8B", H100, max_model_len=32768, target_concurrency=500, gpu_hourly_usd=4.29)
    assert p.concurrent_at_max_model_len == 12
    assert p.gpus_for_target == 2
    assert p.gpus_at_max_model_len == 42
    assert p.monthly_cost_usd == pytest.approx(2 * 4.29 * 730)
    assert p.monthly_cost_at_max_model_len_usd == pytest.approx(42 * 4.29 * 730)
    # a 32K request fits, so vLLM starts
    assert p.startup is not None and p.startup.fits and not p.warnings


@pytest.mark.parametrize("gpu, dtype, expected", [
    (A10, "auto", 48), (A10, "fp8", 96), (H100, "auto", 689), (H100, "fp8", 1379),
])
def test_qwen25_7b_a10_and_h100(gpu, dtype, expected):
    # the article gives the weights as ≈14.2 GiB
    p = plan("Qwen2.5-7B", gpu, dtype, weights=cap.parse_bytes("14.2GiB"))
    assert p.concurrent_requests == expected
    # and the exact parameter count gives the same answers
    assert plan("Qwen2.5-7B", gpu, dtype).concurrent_requests == expected


def test_qwen25_7b_kv_memory_figures():
    w = cap.parse_bytes("14.2GiB")
    assert round(plan("Qwen2.5-7B", A10, weights=w).memory.kv_memory_bytes / GIB, 1) == 3.9
    assert round(plan("Qwen2.5-7B", H100, weights=w).memory.kv_memory_bytes / GIB, 1) == 55.4
    assert round(cap.weights_bytes(cap.PRESETS["Qwen2.5-7B"].params) / GIB, 1) == 14.2


def test_qwen25_32b_bf16_on_one_h100():
    p = plan("Qwen2.5-32B", H100)
    assert round(p.memory.kv_memory_bytes / GIB, 1) == 8.6
    assert p.concurrent_requests == 23


def test_utilization_step_on_h100():
    step = cap.utilization_step(H100, preset_bpt("Qwen3-8B"))
    assert round(step.bytes / GIB, 1) == 0.8
    assert step.tokens == 5825


@pytest.mark.parametrize("block, waste", [(16, 7.5), (128, 63.5), (1, 0.0)])
def test_mean_last_block_waste(block, waste):
    assert cap.mean_last_block_waste(block) == waste
    # same as averaging the empty slots over every length modulo the block
    lengths = range(1, 10 * block + 1)
    empirical = sum(cap.slots_per_request(t, block) - t for t in lengths) / len(lengths)
    assert empirical == waste


def test_block_waste_shares_quoted_by_the_article():
    assert round(100 * 7.5 / 1500, 1) == 0.5 and round(100 * 7.5 / 300, 1) == 2.5
    assert round(100 * 63.5 / 1500, 1) == 4.2 and round(100 * 63.5 / 300, 1) == 21.2


# --- small pure functions ---------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("80GiB", 80 * 2**30), ("80GB", 80 * 10**9), ("24 GB", 24 * 10**9), ("85899345920", 85899345920),
    ("14.2GiB", int(14.2 * 2**30)), ("512MiB", 512 * 2**20), ("1.5 TB", 1_500_000_000_000),
    ("4 gib", 4 * 2**30), ("100B", 100), (" 7 KiB ", 7168), (1234, 1234),
])
def test_parse_bytes(text, expected):
    assert cap.parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["80G", "80 gigs", "", "GiB", "-5GiB", "1e9", "eighty GB"])
def test_parse_bytes_refuses_ambiguous_or_bad(text):
    with pytest.raises(ValueError):
        cap.parse_bytes(text)


def test_format_both_units():
    assert cap.format_both(80 * GIB) == "80.00 GiB (85.90 GB)"
    assert cap.format_bytes(512) == "512 B"


def test_slots_and_concurrency_rounding():
    assert cap.slots_per_request(1500) == 1504
    assert cap.slots_per_request(1504) == 1504
    assert cap.slots_per_request(1505) == 1520
    assert cap.slots_per_request(1) == 16
    assert cap.concurrent_requests(1504 * 3 - 1, 1500) == 2
    assert cap.concurrent_requests(1504 * 3, 1500) == 3
    with pytest.raises(ValueError):
        cap.concurrent_requests(1000, 0)


def test_gpus_for_target_and_cost():
    assert cap.gpus_for_target(500, 263) == 2
    assert cap.gpus_for_target(526, 263) == 2
    assert cap.gpus_for_target(527, 263) == 3
    assert cap.gpus_for_target(10, 0) is None
    assert cap.monthly_cost(3, 1.29) == pytest.approx(3 * 1.29 * 730)


def test_parallel_sampling_counts_the_prompt_once():
    assert cap.parallel_sampling_tokens(1000, 500, 4) == 3000


def test_kv_memory_negative_when_weights_do_not_fit_and_zero_tokens():
    p = plan("Qwen2.5-72B", A10, max_model_len=4096)
    assert p.memory.kv_memory_bytes < 0
    assert p.kv_tokens == 0 and p.concurrent_requests == 0
    assert p.startup is not None and not p.startup.fits
    assert any("No available memory" in w for w in p.warnings)


def test_utilization_out_of_range():
    with pytest.raises(ValueError):
        cap.kv_memory(H100, 1.5, 0)


# --- vLLM start-up check ----------------------------------------------------

def test_startup_check_boundary_is_whole_blocks_plus_the_null_block():
    # vLLM 0.32 holds one block back (the pool's null block) before it checks one request fits
    bpt = 1000
    memory = 11 * 16 * bpt + 999            # 11 whole blocks and a bit: 10 usable
    ok = cap.startup_check(160, memory, bpt)
    assert ok.fits and ok.message is None and ok.estimated_max_model_len == 160
    assert ok.available_bytes == memory - 16 * bpt
    bad = cap.startup_check(161, memory, bpt)   # needs an 11th usable block
    assert not bad.fits
    assert bad.needed_bytes == 11 * 16 * bpt
    assert bad.message.startswith("To serve at least one request with the model's max seq len (161)")
    assert "the estimated maximum model length is 160" in bad.message
    assert "Try increasing `gpu_memory_utilization` or decreasing `max_model_len`" in bad.message
    assert "--max-model-len 160" in bad.fix


def test_startup_check_reproduces_vllms_f1_capture():
    # shared/vllm/captures/f1_kv_cache_too_small.txt: the tiny Qwen3 (512 B per token, CPU block 128)
    # with --kv-cache-memory-bytes 262144 and --max-model-len 2048: "the estimated maximum model length
    # is 384" — 4 blocks of 65,536 B, one held back, 3 × 128 tokens.
    s = cap.startup_check(2048, 262_144, 512, block_size=128)
    assert not s.fits and s.estimated_max_model_len == 384
    assert s.needed_bytes == 16 * 65_536 and s.available_bytes == 3 * 65_536


def test_plan_warns_when_max_model_len_exceeds_kv_tokens():
    p = plan("Qwen2.5-7B", A10, weights=cap.parse_bytes("14.2GiB"), max_model_len=131072)
    assert p.kv_tokens < 131072
    assert not p.startup.fits
    assert any("vLLM refuses to start" in w for w in p.warnings)


# --- configs: dtype, nesting, hybrids ----------------------------------------

BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 512}


@pytest.mark.parametrize("torch_dtype, kv_dtype, expected", [
    ("bfloat16", "auto", 2), ("float16", "auto", 2), ("float32", "auto", 2), (None, "auto", 2),
    ("bfloat16", "fp8", 1), ("bfloat16", "fp16", 2), ("float16", "bf16", 2),
])
def test_dtype_bytes(torch_dtype, kv_dtype, expected):
    config = dict(BASE, torch_dtype=torch_dtype)
    assert cap.kv_layout(config, kv_dtype).dtype_bytes == expected
    assert cap.kv_bytes_per_token(config, kv_dtype) == 2 * 4 * 2 * 64 * expected


def test_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        cap.dtype_bytes("int3")


def test_head_dim_from_config_wins_over_hidden_size():
    assert cap.kv_layout(dict(BASE, head_dim=128)).head_dim == 128
    assert cap.kv_layout(BASE).head_dim == 64


def test_nested_text_config_and_transformers5_dtype_key():
    config = {"model_type": "llava", "dtype": "bfloat16", "text_config": dict(BASE)}
    assert cap.kv_bytes_per_token(config) == 2 * 4 * 2 * 64 * 2


def test_missing_fields_are_named():
    with pytest.raises(cap.UnsupportedConfigError, match="num_hidden_layers"):
        cap.kv_layout({"num_attention_heads": 8})
    with pytest.raises(cap.UnsupportedConfigError, match="hidden_size"):
        cap.kv_layout({"num_hidden_layers": 2, "num_attention_heads": 8})


def test_hybrid_layer_types_count_only_full_attention_layers():
    types = ["linear_attention", "linear_attention", "linear_attention", "full_attention"] * 8
    config = {"text_config": {"num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
                              "head_dim": 256, "hidden_size": 4096, "layer_types": types,
                              "full_attention_interval": 4}}
    layout = cap.kv_layout(config)
    assert layout.attention == "hybrid" and layout.kv_layers == 8
    assert layout.bytes_per_token == 2 * 8 * 4 * 256 * 2
    assert layout.notes and "upper bound" in layout.notes[0]


def test_full_attention_interval_without_layer_types():
    config = dict(BASE, num_hidden_layers=12, full_attention_interval=4)
    assert cap.kv_layout(config).kv_layers == 3     # layers 3, 7, 11


def test_qwen2_sliding_window_disabled_is_plain_gqa():
    config = dict(BASE, sliding_window=131072, use_sliding_window=False, max_window_layers=28)
    assert cap.kv_layout(config).kv_layers == 4


@pytest.mark.parametrize("extra, field_name", [
    ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 2},
     "Sliding window for some but all layers is not supported"),                     # vLLM asserts too
    ({"hybrid_override_pattern": "M-M*"}, "hybrid_override_pattern"),
    ({"layer_types": ["full_attention", "moon_attention", "full_attention", "full_attention"]}, "moon_attention"),
    ({"layer_types": ["full_attention"]}, "layer_types"),
])
def test_layouts_we_cannot_state_per_token_are_refused_by_name(extra, field_name):
    with pytest.raises(cap.UnsupportedConfigError, match=field_name):
        cap.kv_layout(dict(BASE, **extra))


def test_deepseek_sparse_attention_refused():
    config = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "index_topk": 2048}
    with pytest.raises(cap.UnsupportedConfigError, match="index_topk"):
        cap.kv_layout(config)


def test_load_model_config_file_and_directory(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(BASE))
    assert cap.load_model_config(tmp_path) == BASE
    assert cap.load_model_config(tmp_path / "config.json") == BASE
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError):
        cap.load_model_config(tmp_path / "list.json")


def test_presets_lookup():
    assert cap.lookup_preset("qwen3-8b").name == "Qwen3-8B"
    assert cap.lookup_preset("Qwen2.5-7B-Instruct").name == "Qwen2.5-7B"
    with pytest.raises(KeyError):
        cap.lookup_preset("gpt-5")


# --- GPUs -------------------------------------------------------------------

def test_gpu_names_read_nominal_size_as_gib():
    assert lookup_gpu("H100-80GB").memory_bytes == 80 * GIB
    # the article's 73.6 = 80 × 0.92 only works with 80 GiB
    assert cap.kv_memory(lookup_gpu("H100-80GB").memory_bytes, 0.92, 0, 0).usable_bytes / GIB == pytest.approx(73.6)
    assert lookup_gpu("a10 24gb").name == "A10-24GB"
    assert lookup_gpu("h100").name == "H100-80GB"
    assert lookup_gpu("L4").name == "L4-24GB"
    for name in ("A100-80GB", "A100-40GB", "L40S-48GB", "RTX4090-24GB", "H200-141GB"):
        assert name in GPUS
        assert GPUS[name].memory_gib == int(name.split("-")[1].removesuffix("GB"))


def test_gpu_lookup_errors():
    with pytest.raises(KeyError, match="ambiguous"):
        lookup_gpu("A100")
    with pytest.raises(KeyError, match="unknown GPU"):
        lookup_gpu("TPUv5")


def test_decimal_gb_differs_by_several_percent():
    gib = plan("Qwen3-8B", cap.parse_bytes("80GiB")).kv_tokens
    gb = plan("Qwen3-8B", cap.parse_bytes("80GB")).kv_tokens
    assert gib == 395_717
    assert 0.05 < (gib - gb) / gib < 0.15
    assert math.isclose(gb, 358_910, abs_tol=1)


# --- tensor parallelism (vLLM 0.32's rules) ----------------------------------

QWEN72 = cap.PRESETS["Qwen2.5-72B"]


@pytest.mark.parametrize("tp, kv_per_gpu, bpt", [
    (1, 8, 2 * 80 * 8 * 128 * 2),      # 327,680 B = 320 KiB, the article's figure
    (2, 4, 2 * 80 * 4 * 128 * 2),      # 163,840 B = 160 KiB per GPU
    (4, 2, 2 * 80 * 2 * 128 * 2),      # 81,920 B
    (8, 1, 2 * 80 * 1 * 128 * 2),      # 40,960 B
    (16, 1, 2 * 80 * 1 * 128 * 2),     # 16 > 8 KV heads: one head per GPU, each replicated twice
])
def test_tp_splits_kv_heads_per_gpu(tp, kv_per_gpu, bpt):
    layout = cap.kv_layout(QWEN72.config, tensor_parallel_size=tp)
    assert layout.kv_heads == kv_per_gpu and layout.kv_heads_total == 8
    assert layout.bytes_per_token == bpt
    split = cap.tensor_parallel_split(QWEN72.config, tp)
    assert split.kv_heads_per_gpu == kv_per_gpu and split.attention_heads_per_gpu == 64 // tp
    assert split.kv_head_replicas == (2 if tp == 16 else 1)


def test_tp_replication_is_noted():
    assert any("replicated on 2 GPUs" in n for n in cap.kv_layout(QWEN72.config, tensor_parallel_size=16).notes)


@pytest.mark.parametrize("tp", [3, 5, 6, 7])
def test_odd_tp_against_64_heads_8_kv_heads_is_refused_with_vllms_reason(tp):
    with pytest.raises(cap.TensorParallelError) as caught:
        cap.kv_layout(QWEN72.config, tensor_parallel_size=tp)
    # vllm/config/model.py ModelConfig.verify_with_parallel_config, verbatim
    assert str(caught.value) == (
        f"Total number of attention heads (64) must be divisible by tensor parallel size ({tp})."
    )


def test_kv_heads_rule_from_qkv_parallel_linear():
    # 24 attention heads divide by 3, the 8 KV heads do not: vLLM's QKVParallelLinear
    # asserts divide(8, 3) at weight loading ("8 is not divisible by 3").
    config = {"num_hidden_layers": 2, "num_attention_heads": 24, "num_key_value_heads": 8, "head_dim": 128}
    with pytest.raises(cap.TensorParallelError, match=r"^8 is not divisible by 3$"):
        cap.tensor_parallel_split(config, 3)
    # 12 GPUs ≥ 8 KV heads: the GPUs must be a multiple of the heads
    config = dict(config, num_attention_heads=48)
    with pytest.raises(cap.TensorParallelError, match=r"^12 is not divisible by 8$"):
        cap.tensor_parallel_split(config, 12)
    assert cap.valid_tensor_parallel_sizes(config, 16) == [1, 2, 4, 8, 16]


def test_mla_latent_is_not_split():
    config = {"num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
              "hidden_size": 7168, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    assert cap.kv_layout(config, "bf16", 8).bytes_per_token == cap.kv_layout(config, "bf16").bytes_per_token == 70272
    assert cap.tensor_parallel_split(config, 8).kv_heads_per_gpu is None


def _tp_plan(tp: int, **kw) -> cap.Plan:
    # weights per GPU = 72,706,203,648 params × 2 B ÷ tp
    return cap.make_plan(cap.PlanInputs(
        bytes_per_token=cap.kv_bytes_per_token(QWEN72.config, tensor_parallel_size=tp), gpu_memory_bytes=H100,
        weights_bytes=QWEN72.params * 2 // tp, tensor_parallel_size=tp, **kw))


def test_qwen25_72b_tp2_on_h100_hand_computed():
    # usable = floor(80 × 2^30 × 0.92) = 79,027,398,246 B
    # KV = 79,027,398,246 − 72,706,203,648 − 4,294,967,296 = 2,026,227,302 B (1.89 GiB)
    # tokens = floor(2,026,227,302 ÷ 163,840) = 12,367; 1,500-token requests: 12,367 ÷ 1,504 = 8
    p = _tp_plan(2, target_concurrency=100)
    assert p.memory.usable_bytes == 79_027_398_246
    assert p.memory.kv_memory_bytes == 2_026_227_302
    assert p.kv_tokens == 12_367 and p.kv_blocks == 772
    assert p.concurrent_requests == 8
    assert p.gpus_for_target == 13 * 2          # ceil(100 ÷ 8) = 13 replicas of 2 GPUs


def test_qwen25_72b_tp4_on_h100_hand_computed():
    # KV = 79,027,398,246 − 36,353,101,824 − 4,294,967,296 = 38,379,329,126 B (35.74 GiB)
    # tokens = floor(38,379,329,126 ÷ 81,920) = 468,497; ÷ 1,504 = 311 concurrent
    p = _tp_plan(4, max_model_len=32768)
    assert p.memory.kv_memory_bytes == 38_379_329_126
    assert round(p.memory.kv_memory_bytes / GIB, 2) == 35.74
    assert p.kv_tokens == 468_497
    assert p.concurrent_requests == 311
    assert p.startup is not None and p.startup.fits
    # 32,768 tokens = 2,048 blocks: floor(468,497 ÷ 16) = 29,281 blocks hold 14 such requests
    assert p.concurrent_at_max_model_len == 14


def test_tp2_does_not_start_at_qwen72b_default_32k():
    p = _tp_plan(2, max_model_len=32768)
    assert not p.startup.fits and p.startup.estimated_max_model_len == (772 - 1) * 16 == 12_336


def test_max_num_seqs_caps_concurrency_below_the_memory_bound():
    # Qwen2.5-7B fp8 KV on an H100: memory holds 1,379, vLLM's default max_num_seqs there is 1,024
    p = plan("Qwen2.5-7B", H100, "fp8", max_num_seqs=1024, target_concurrency=2100)
    assert p.concurrent_requests == 1379
    assert p.concurrency == 1024 and p.limited_by == "max_num_seqs"
    assert p.gpus_for_target == 3                # ceil(2100 ÷ 1024); the memory bound alone would say 2
    assert cap.make_plan(dataclasses.replace(p.inputs, max_num_seqs=None)).gpus_for_target == 2
    not_binding = plan("Qwen3-8B", H100, max_num_seqs=1024)
    assert not_binding.concurrency == 263 and not_binding.limited_by == "memory"


def test_shortfall_is_positive_when_kv_memory_is_negative():
    # the 70B bf16 on one 80 GiB GPU: 73.6 − 131.42 − 4 = −61.82 GiB
    llama = cap.PRESETS["Llama-3.1-70B"]
    p = cap.make_plan(cap.PlanInputs(bytes_per_token=cap.kv_bytes_per_token(llama.config), gpu_memory_bytes=H100,
                                     weights_bytes=llama.params * 2))
    assert p.memory.kv_memory_bytes < 0
    assert round(p.memory.shortfall_bytes / GIB, 2) == 61.82
    assert p.kv_tokens == 0 and p.concurrency == 0


@pytest.mark.parametrize("name, vocab, hidden, inter, layers, heads, kv, qkv_bias, qk_norm", [
    # embeddings + lm_head + layers × (q, k, v, o, gate/up/down, 2 norms [+ biases] [+ q/k norms]) + final norm
    ("Llama-3.1-70B", 128_256, 8192, 28_672, 80, 64, 8, False, False),
    ("Qwen2.5-72B", 152_064, 8192, 29_568, 80, 64, 8, True, False),
    ("Qwen3-8B", 151_936, 4096, 12_288, 36, 32, 8, False, True),
])
def test_preset_parameter_counts_follow_from_the_shapes(name, vocab, hidden, inter, layers, heads, kv, qkv_bias,
                                                         qk_norm):
    hd = 128
    per_layer = (hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden + 3 * hidden * inter + 2 * hidden
                 + (heads * hd + 2 * kv * hd if qkv_bias else 0) + (2 * hd if qk_norm else 0))
    assert 2 * vocab * hidden + layers * per_layer + hidden == cap.PRESETS[name].params
    assert cap.PRESETS[name].config["vocab_size"] == vocab
