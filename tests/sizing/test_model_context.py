"""The model's own context bound (proxy.sizing.model_context), by hand and against vLLM 0.32's ModelConfig."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from proxy.sizing.model_context import ContextBound, model_context_bound

QWEN3 = {  # the tiny test model's config (tests/realvllm/tiny_model.py), a Qwen3ForCausalLM
    "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 32, "hidden_size": 64,
    "intermediate_size": 128, "max_position_embeddings": 40960, "num_attention_heads": 4,
    "num_hidden_layers": 2, "num_key_value_heads": 2, "rope_scaling": None, "rope_theta": 1000000,
    "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": True,
    "torch_dtype": "bfloat16", "vocab_size": 151669,
}
YARN = {"factor": 4.0, "original_max_position_embeddings": 32768, "type": "yarn"}   # Qwen2.5's README block
LLAMA3 = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192, "rope_type": "llama3"}

# (case id, config changes, default max_model_len, largest accepted)
CASES = [
    ("plain", {}, 40960, 40960),
    ("qwen25-yarn-x4", {"max_position_embeddings": 32768, "rope_scaling": YARN}, 32768, 32768),
    ("linear-x2", {"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 2.0}}, 8192, 8192),
    ("dynamic-x2.5", {"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.5}},
     10240, 10240),
    ("llama3-x8", {"max_position_embeddings": 131072, "rope_scaling": LLAMA3}, 131072, 131072),
    ("rope_parameters-linear", {"max_position_embeddings": 2048,
                                "rope_parameters": {"rope_type": "linear", "factor": 3.0, "rope_theta": 10000.0}},
     6144, 6144),
    ("model_max_length-wins", {"max_position_embeddings": 40960, "model_max_length": 8192}, 8192, 8192),
    ("smallest-key", {"max_position_embeddings": 40960, "seq_length": 16384}, 16384, 16384),
    ("sliding-window-ignored", {"sliding_window": 4096, "use_sliding_window": True, "max_window_layers": 0},
     40960, 40960),
]


@pytest.mark.parametrize("case, changes, default, largest", CASES, ids=[c[0] for c in CASES])
def test_bound_by_hand(case, changes, default, largest):
    bound = model_context_bound({**QWEN3, **changes})
    assert bound.default_max_model_len == default
    assert bound.max_model_len == largest
    assert bound.accepts(largest) and not bound.accepts(largest + 1)


def test_yarn_factor_is_not_applied_and_says_why():
    bound = model_context_bound({**QWEN3, "max_position_embeddings": 32768, "rope_scaling": YARN})
    assert bound.scaling_factor == 1.0 and bound.rope_type == "yarn"
    assert any("already the scaled length" in n for n in bound.notes)


def test_refusal_text_is_vllms():
    bound = model_context_bound({**QWEN3, "max_position_embeddings": 4096,
                                 "rope_scaling": {"type": "dynamic", "factor": 2.5}})
    assert bound.refusal(10240) is None
    assert bound.refusal(10241).startswith(
        "User-specified max_model_len (10241) is greater than the derived max_model_len "
        "(max_position_embeddings=10240.0 or model_max_length=None in model's config.json). "
        "To allow overriding this maximum, set the env var VLLM_ALLOW_LONG_MAX_MODEL_LEN=1."
    )


def test_longrope_defaults_to_original_but_accepts_the_scaled_length():
    # Phi-3-mini-128k style: top-level original_max_position_embeddings, rope type su/longrope
    config = {"model_type": "phi3", "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
              "rope_scaling": {"type": "su", "long_factor": [1.0], "short_factor": [1.0]}}
    bound = model_context_bound(config)
    assert bound.default_max_model_len == 4096 and bound.max_model_len == 131072
    assert bound.rope_type == "longrope"


def test_gemma3_is_never_multiplied():
    config = {"model_type": "gemma3", "text_config": {"model_type": "gemma3_text", "max_position_embeddings": 131072,
                                                      "rope_scaling": {"rope_type": "linear", "factor": 8.0}}}
    assert model_context_bound(config).max_model_len == 131072


def test_no_length_key_falls_back_to_2048_and_says_so():
    bound = model_context_bound({"num_hidden_layers": 2})
    assert bound.max_model_len == 2048 and bound.key is None
    assert "vLLM assumes 2048" in bound.notes[0]


def test_disable_sliding_window_bounds_by_the_window():
    config = {"max_position_embeddings": 32768, "sliding_window": 4096}
    assert model_context_bound(config).max_model_len == 32768
    bound = model_context_bound(config, disable_sliding_window=True)
    assert bound.max_model_len == 4096 and bound.key == "sliding_window"


def test_null_factor_is_one():
    bound = model_context_bound({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": None}})
    assert bound.max_model_len == 4096 and isinstance(bound, ContextBound)


# --- against the real thing -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vllm_probe(tmp_path_factory):
    """Run tests/realvllm/config_probe.py in the vLLM 0.32 venv (no server: ModelConfig only)."""
    from tests.realvllm.fixture import MODE_ENV, parse_mode, prepare
    from tests.realvllm.venv import SetupError

    mode = parse_mode(os.environ.get(MODE_ENV))
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    try:
        python, model_dir, _ = prepare(tmp_path_factory.mktemp("probe"))
    except SetupError as error:
        if mode == "require":
            raise
        pytest.skip(f"vLLM venv unavailable: {error}")

    def run(cases: list[dict]) -> list[dict]:
        script = Path(__file__).parents[1] / "realvllm" / "config_probe.py"
        proc = subprocess.run([str(python), str(script), str(model_dir)], input=json.dumps(cases),
                              capture_output=True, text=True, timeout=600, check=False)
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads(proc.stdout)

    return run


@pytest.mark.slow
@pytest.mark.realvllm
def test_bounds_match_vllm_model_config(vllm_probe):
    cases = []
    for _, changes, _, _ in CASES:
        config = {**QWEN3, **changes}
        bound = model_context_bound(config)
        cases += [{"config": config, "max_model_len": None},
                  {"config": config, "max_model_len": bound.max_model_len},
                  {"config": config, "max_model_len": bound.max_model_len + 1}]
    results = vllm_probe(cases)
    for i, (name, changes, _, _) in enumerate(CASES):
        bound = model_context_bound({**QWEN3, **changes})
        unset, at_bound, above = results[3 * i: 3 * i + 3]
        assert unset.get("max_model_len") == bound.default_max_model_len, (name, unset)
        assert at_bound.get("max_model_len") == bound.max_model_len, (name, at_bound)
        assert above.get("error") == bound.refusal(bound.max_model_len + 1), (name, above)


@pytest.mark.slow
@pytest.mark.realvllm
def test_tensor_parallel_rule_matches_vllm(vllm_probe):
    from proxy.sizing import capacity as cap
    config = {**QWEN3, "num_attention_heads": 64, "num_key_value_heads": 8, "hidden_size": 2048}
    sizes = [1, 2, 3, 4, 5, 6, 8, 16]
    [result] = vllm_probe([{"config": config, "max_model_len": None, "tensor_parallel_sizes": sizes}])
    for tp, answer in zip(sizes, result["tensor_parallel"], strict=True):
        try:
            split = cap.tensor_parallel_split(config, tp)
        except cap.TensorParallelError as e:
            assert not answer["ok"] and answer["error"] == str(e), (tp, answer)
        else:
            assert answer["ok"] and answer["kv_heads_per_gpu"] == split.kv_heads_per_gpu, (tp, answer)
