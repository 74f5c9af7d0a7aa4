"""`brimful plan` for every layout the seed discusses (proxy.sizing.deploy via plan_cli), hand-computed.

Shared figures: H100 = 80 GiB; usable = floor(80 × 2^30 × 0.92) = 79,027,398,246 B; activations 4 GiB =
4,294,967,296 B.  Llama-3.1-70B: 70,553,706,496 params, 80 layers × 8 KV heads × 128, vocab 128,256.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from proxy.commands import plan as plan_cli
from proxy.sizing import capacity as cap
from proxy.sizing.deploy import DeploymentSpec, assess
from proxy.sizing.gpus import lookup_gpu

H100 = lookup_gpu("H100-80GB")
USABLE = 79_027_398_246
ACT = 4 * cap.GIB
LLAMA = cap.PRESETS["Llama-3.1-70B"]
QWEN72 = cap.PRESETS["Qwen2.5-72B"]


def spec(preset: cap.Preset, **kw: Any) -> DeploymentSpec:
    return DeploymentSpec(config=preset.config, model_label=preset.name, gpu_label=H100.name,
                          gpu_memory_bytes=H100.memory_bytes, gpu_name=H100.name, params=preset.params, **kw)


def run(capsys, *argv: str) -> tuple[int, str]:
    code = plan_cli.main(list(argv))
    return code, capsys.readouterr().out


def run_json(capsys, *argv: str) -> tuple[int, dict]:
    code, out = run(capsys, *argv, "--format", "json")
    return code, json.loads(out)


def negatives(value: Any, path: str = "") -> list[str]:
    """Every negative number anywhere in a JSON document, with its path."""
    if isinstance(value, bool):
        return []
    if isinstance(value, (int, float)):
        return [path] if value < 0 else []
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in negatives(v, f"{path}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in negatives(v, f"{path}[{i}]")]
    return []


# --- 70B in bf16 on one 80 GiB GPU ---------------------------------------------------------------------

def test_70b_bf16_on_one_h100_refuses_first_and_proposes_what_fits(capsys):
    code, out = run(capsys, "--preset", "Llama-3.1-70B", "--gpu", "H100-80GB")
    assert code == 1
    first = out.splitlines()[0]
    # 141,107,412,992 B = 131.42 GiB of weights against 80 GiB
    assert first == ("DOES NOT FIT: the weights alone take 131.42 GiB per GPU, more than the GPU's 80.00 GiB: "
                     "loading them fails (CUDA out of memory) before any KV cache.")
    # TP 4: 35,276,853,248 B per GPU → KV 79,027,398,246 − 35,276,853,248 − 4,294,967,296 = 39,455,577,702 B
    # = 481,635 tokens of 81,920 B: the default max_model_len 131,072 fits, 481,635 ÷ 1,504 = 320 requests
    assert ("  --tensor-parallel-size 4: tensor parallel over 4 GPUs → 4 GPU(s) per replica, weights 32.85 GiB/GPU, "
            "KV 36.75 GiB = 481,635 tokens, 320 concurrent, max_model_len 131,072 fits") in out
    # TP 2: 70,553,706,496 B per GPU → KV 4,178,724,454 B = 25,504 tokens of 163,840 B
    assert "--tensor-parallel-size 2: tensor parallel over 2 GPUs" in out
    # less the block vLLM holds back: 1,594 − 1 blocks of 16
    assert "25,504 tokens, 16 concurrent; starts only with --max-model-len 25,488 or less" in out
    assert out.index("would fit:") < out.index("--tensor-parallel-size 4") < out.index("would not be enough")
    assert "= KV memory                none: short by 61.82 GiB (66.37 GB)" in out
    assert re.findall(r"(?<!\w)[-−]\s?\d", out) == []   # no negative figure ("H100-80GB" is a name)
    assert "utilization  +" not in out   # no "+0.01 utilization = +N tokens" while nothing fits


def test_70b_json_has_no_negative_figure(capsys):
    code, out = run_json(capsys, "--preset", "Llama-3.1-70B", "--gpu", "H100-80GB")
    assert code == 1 and out["fits"] is False
    assert negatives(out) == []
    assert out["memory"]["kv_memory_bytes"] == 0
    assert out["kv_memory_shortfall_bytes"] == LLAMA.params * 2 + ACT - USABLE == 66_374_982_042
    assert out["problems"][0]["kind"] == "weights_exceed_gpu"


def test_70b_with_a_shorter_context_fits_on_tp2_or_fp8():
    a = assess(spec(LLAMA), 1500, 4096)
    fitting = {alt.flags: alt for alt in a.alternatives if alt.fits}
    tp2 = fitting[("--tensor-parallel-size 2",)]
    assert tp2.kv_tokens == 25_504 and tp2.concurrency == 25_504 // 1504 == 16
    # fp8 weights: 2,101,346,304 embedding params × 2 B + 68,452,360,192 × 1 B = 72,655,052,800 B
    # KV 79,027,398,246 − 72,655,052,800 − 4,294,967,296 = 2,077,378,150 B = 6,339 tokens; 4 × 1,500
    fp8 = fitting[("--weights-dtype fp8",)]
    assert fp8.weights_per_gpu_bytes == 72_655_052_800
    assert fp8.kv_memory_bytes == 2_077_378_150
    assert fp8.kv_tokens == 6_339 and fp8.concurrency == 4 and fp8.gpus_per_replica == 1


def test_70b_fp8_weights_and_kv_together():
    # at 8,192 tokens fp8 weights alone (6,339 tokens) are short; with fp8 KV (163,840 B) 12,679 fit
    a = assess(spec(LLAMA), 1500, 8192)
    alts = {alt.flags: alt for alt in a.alternatives}
    assert not alts[("--weights-dtype fp8",)].fits
    both = alts[("--weights-dtype fp8", "--kv-cache-dtype fp8")]
    assert both.fits and both.kv_tokens == 2_077_378_150 // 163_840 == 12_679


# --- Qwen2.5-72B tensor parallel on H100s ----------------------------------------------------------------

def test_qwen72b_tp2_json(capsys):
    code, out = run_json(capsys, "--preset", "Qwen2.5-72B", "--gpu", "H100-80GB", "-tp", "2",
                         "--max-model-len", "8192", "--target-concurrency", "100")
    assert code == 0 and out["fits"]
    assert out["kv_bytes_per_token"] == 163_840 and out["kv_layout"]["kv_heads"] == 4
    assert out["weights_per_gpu_bytes"] == 72_706_203_648
    assert out["memory"]["kv_memory_bytes"] == 2_026_227_302
    assert out["kv_tokens"] == 12_367 and out["concurrent_requests"] == 8
    assert out["gpus_for_target"] == 26             # 13 replicas × 2
    assert out["concurrent_at_max_model_len"] == 12_367 // 8192 == 1


def test_qwen72b_tp2_at_its_default_context_does_not_start(capsys):
    code, out = run(capsys, "--preset", "Qwen2.5-72B", "--gpu", "H100-80GB", "--tensor-parallel-size", "2")
    assert code == 1
    assert out.startswith("DOES NOT FIT: one request of max_model_len 32,768 (model default "
                          "(max_position_embeddings)) needs 5.00 GiB of KV cache")
    assert "  --max-model-len 12336: lower max_model_len to 12,336" in out
    assert "  --tensor-parallel-size 4: tensor parallel over 4 GPUs" in out
    assert "468,497 tokens, 311 concurrent, max_model_len 32,768 fits" in out


def test_qwen72b_tp4_table(capsys):
    code, out = run(capsys, "--preset", "Qwen2.5-72B", "--gpu", "H100-80GB", "-tp", "4")
    assert code == 0 and "DOES NOT FIT" not in out
    assert "tensor parallel           4 GPUs per replica: 1/4 of the weights and 8 → 2 KV heads per GPU" in out
    assert "KV per token per GPU      81,920 B = 80 KiB" in out
    assert "− weights per GPU         33.86 GiB" in out
    assert "35.74 GiB (38.38 GB)" in out and "468,497" in out
    assert "max_model_len 32,768      fits (model default (max_position_embeddings))" in out


@pytest.mark.parametrize("tp", ["3", "6"])
def test_odd_tp_against_8_kv_heads_is_refused_with_vllms_reason(capsys, tp):
    code, out = run(capsys, "--preset", "Qwen2.5-72B", "--gpu", "H100-80GB", "-tp", tp)
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == (f"DOES NOT FIT: vLLM refuses --tensor-parallel-size {tp} for this model: Total number of "
                        f"attention heads (64) must be divisible by tensor parallel size ({tp}). Sizes it accepts: "
                        "1, 2, 4, 8.")
    assert f"vLLM says: Total number of attention heads (64) must be divisible by tensor parallel size ({tp})." in out
    assert "--tensor-parallel-size 4: tensor parallel over 4 GPUs" in out


# --- quantised checkpoints, scheduler limits, model context ------------------------------------------------

def test_awq_config_weights_line(capsys, tmp_path):
    config = dict(QWEN72.config, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128,
                                                      "zero_point": True})
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code, out = run_json(capsys, "--model-config", str(path), "--gpu", "H100-80GB", "--params", str(QWEN72.params))
    assert code == 0
    assert out["weights"]["total_bytes"] == 41_461_609_248
    assert out["weights"]["scheme"]["bytes_per_param"] == 0.51953125
    # KV 79,027,398,246 − 41,461,609,248 − 4,294,967,296 = 33,270,821,702 B ÷ 327,680 = 101,534 tokens
    assert out["kv_tokens"] == 101_534 and out["concurrent_requests"] == 67


def test_weights_dtype_int4_on_the_table(capsys):
    code, out = run(capsys, "--preset", "Qwen2.5-72B", "--gpu", "H100-80GB", "--weights-dtype", "int4")
    assert code == 0
    assert "[4 bits + fp16 scale + 4-bit zero per 128 = 0.5 + 2.5/128 B; 2,491,416,576 embedding params at 2 B" in out


def test_max_num_seqs_caps_concurrency(capsys):
    code, out = run_json(capsys, "--preset", "Qwen2.5-7B", "--gpu", "H100-80GB", "--weights-memory", "14.2GiB",
                         "--kv-cache-dtype", "fp8", "--max-num-seqs", "512", "--target-concurrency", "2000")
    assert code == 0
    assert out["concurrent_requests"] == 1379 and out["concurrency"] == 512 and out["limited_by"] == "max_num_seqs"
    assert out["gpus_for_target"] == 4              # ceil(2000 ÷ 512); the memory bound alone says 2
    default = run_json(capsys, "--preset", "Qwen2.5-7B", "--gpu", "H100-80GB", "--weights-memory", "14.2GiB",
                       "--kv-cache-dtype", "fp8")[1]
    assert default["scheduler"]["max_num_seqs"] == 1024 and default["concurrency"] == 1024


def test_chunked_prefill_off_needs_batched_tokens_over_max_model_len(capsys):
    argv = ["--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--max-model-len", "32768", "--no-enable-chunked-prefill"]
    code, out = run(capsys, *argv, "--max-num-batched-tokens", "8192")
    assert code == 1
    assert out.startswith("DOES NOT FIT: vLLM refuses the scheduler limits.")
    assert ("vLLM says: max_num_batched_tokens (8192) is smaller than max_model_len (32768). This effectively "
            "limits the maximum sequence length to max_num_batched_tokens") in out
    code, out = run(capsys, *argv)             # unset: vLLM raises the default to max_model_len itself
    assert code == 0 and "max_num_batched_tokens 32,768, chunked prefill off" in out


def test_max_model_len_above_the_models_context_is_refused(capsys):
    code, out = run(capsys, "--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--max-model-len", "65536")
    assert code == 1
    assert out.startswith("DOES NOT FIT: --max-model-len 65,536 is above the model's own context of 40,960 "
                          "(max_position_embeddings): vLLM refuses to start.")
    assert "vLLM says: User-specified max_model_len (65536) is greater than the derived max_model_len" in out


def test_fp8_kv_is_the_first_remedy_when_the_kv_cache_is_short():
    # Qwen2.5-32B bf16 on one H100 keeps 9,204,678,246 B (8.6 GiB) of KV: 35,113 tokens at 262,144 B, so a
    # max_model_len of 65,536 (allowed by a config with max_position_embeddings 131,072) cannot start;
    # fp8 KV (131,072 B) holds 70,226 tokens.  The seed's order: fp8 KV first, then max_model_len, then TP.
    preset = cap.PRESETS["Qwen2.5-32B"]
    config = dict(preset.config, max_position_embeddings=131072)
    s = DeploymentSpec(config=config, model_label="32B", gpu_label=H100.name, gpu_memory_bytes=H100.memory_bytes,
                       gpu_name=H100.name, params=preset.params)
    a = assess(s, 1500, 65536)
    assert [p.kind for p in a.problems] == ["max_model_len_over_kv"]
    assert a.plan is not None and a.plan.memory.kv_memory_bytes == 9_204_678_246 and a.plan.kv_tokens == 35_113
    first = a.alternatives[0]
    assert first.flags == ("--kv-cache-dtype fp8",) and first.fits and first.kv_tokens == 70_226
    assert [alt.flags[0] for alt in a.alternatives][:2] == ["--kv-cache-dtype fp8", "--max-model-len 35088"]
    assert {alt.flags: alt for alt in a.alternatives}[("--tensor-parallel-size 2",)].fits


def test_existing_plans_still_fit_and_exit_0(capsys):
    for argv in (["--preset", "Qwen3-8B", "--gpu", "H100-80GB"],
                 ["--preset", "Qwen2.5-7B", "--gpu", "A10-24GB", "--weights-memory", "14.2GiB"],
                 ["--preset", "Qwen2.5-32B", "--gpu", "H100-80GB"]):
        code, out = run_json(capsys, *argv)
        assert code == 0 and out["fits"] and negatives(out) == [], argv
