"""Weights memory of plain and quantised checkpoints (proxy.sizing.weights), against hand-computed bytes."""

from __future__ import annotations

import pytest

from proxy.sizing import capacity as cap
from proxy.sizing.weights import (
    embedding_params,
    estimate_weights,
    scheme_from_quantization_config,
    weight_scheme,
)

QWEN72 = cap.PRESETS["Qwen2.5-72B"]
EMB72 = 2 * 152_064 * 8192           # embed_tokens + untied lm_head = 2,491,416,576 params
REST72 = QWEN72.params - EMB72        # 70,214,787,072 params in the linear layers (+ norms, biases)


def test_plain_bf16_is_params_times_two():
    w = estimate_weights(QWEN72.params, QWEN72.config, weight_scheme(QWEN72.config))
    assert w.total_bytes == 145_412_407_296 == QWEN72.params * 2
    assert w.scheme.name == "bf16" and w.kept_params == 0
    assert w.per_gpu_bytes(2) == 72_706_203_648 and w.per_gpu_bytes(4) == 36_353_101_824


def test_fp32_checkpoint_is_served_in_bf16():
    assert weight_scheme({"torch_dtype": "float32"}).bytes_per_param == 2


def test_embeddings_tied_or_not():
    assert embedding_params(QWEN72.config) == EMB72
    assert embedding_params({"vocab_size": 100, "hidden_size": 10, "tie_word_embeddings": True}) == 1000
    assert embedding_params({"hidden_size": 10}) is None


def test_fp8_keeps_embeddings_in_bf16():
    w = estimate_weights(QWEN72.params, QWEN72.config, weight_scheme(QWEN72.config, "fp8"))
    assert w.scheme.bytes_per_param == 1.0
    assert w.total_bytes == EMB72 * 2 + REST72 * 1 == 75_197_620_224
    assert round(w.total_bytes / cap.GIB, 2) == 70.03


def test_int4_awq_group_128_with_zero_points():
    # 4 bits + an fp16 scale and a 4-bit zero per 128 weights = 0.5 + 2.5/128 = 0.51953125 B
    config = dict(QWEN72.config, quantization_config={"quant_method": "awq", "bits": 4, "group_size": 128,
                                                      "zero_point": True, "version": "gemm"})
    scheme = weight_scheme(config)
    assert scheme.name == "int4" and scheme.method == "awq"
    assert scheme.bytes_per_param == 0.51953125
    w = estimate_weights(QWEN72.params, config, scheme)
    assert w.total_bytes == EMB72 * 2 + 36_478_776_096 == 41_461_609_248   # 70,214,787,072 × 133/256 exactly
    assert round(w.total_bytes / cap.GIB, 2) == 38.61


@pytest.mark.parametrize("qc, name, bpp", [
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}, "int4", 0.5 + 2.5 / 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, "int4", 0.5),
    ({"quant_method": "gptq", "bits": 8, "group_size": 128}, "int8", 1.0),
    ({"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": False}, "int4", 0.5 + 2 / 64),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "fp8", 1.0),
    ({"quant_method": "fp8", "weight_block_size": [128, 128]}, "fp8", 1 + 4 / 16384),
    ({"quant_method": "fbgemm_fp8"}, "fp8", 1.0),
    ({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}}, "fp8", 1.0),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}, "fp8", 1.0),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}}, "int8", 1.0),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {
        "weights": {"num_bits": 4, "type": "int", "group_size": 128, "symmetric": True}}}}, "int4", 0.5 + 2 / 128),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, "int4",
     0.5 + 1 / 64),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4", 0.5 + 4 / 64),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "int8", 1.0),
])
def test_quantization_configs(qc, name, bpp):
    scheme = scheme_from_quantization_config(qc)
    assert scheme.name == name and scheme.bytes_per_param == bpp


@pytest.mark.parametrize("qc, match", [
    ({"quant_method": "hqq"}, "'hqq' is not modelled"),
    ({"quant_method": "awq", "bits": 3}, "3 bits"),
    ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "NVFP4"),
    ({"quant_method": "compressed-tensors"}, "config_groups"),
])
def test_unmodelled_quantization_is_refused_by_name(qc, match):
    with pytest.raises(cap.UnsupportedConfigError, match=match):
        scheme_from_quantization_config(qc)


def test_weights_dtype_option_overrides_and_int4_default_group():
    config = dict(QWEN72.config, quantization_config={"quant_method": "fp8"})
    assert weight_scheme(config).name == "fp8"
    assert weight_scheme(config, "bf16").bytes_per_param == 2
    assert weight_scheme(QWEN72.config, "int4").bytes_per_param == 0.51953125
    assert weight_scheme(QWEN72.config, "int8").bytes_per_param == 1
    with pytest.raises(ValueError, match="unknown weights dtype"):
        weight_scheme(QWEN72.config, "int3")


def test_unknown_embeddings_are_counted_quantised_with_a_note():
    w = estimate_weights(1000, {}, weight_scheme({}, "fp8"))
    assert w.total_bytes == 1000 and "underestimate" in w.notes[0]
