"""`brimful plan`: options → figures, in-process via main(argv) and once as a subprocess."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from proxy.commands import plan as plan_cli

ROOT = Path(__file__).resolve().parents[2]


def run_json(capsys, *argv: str) -> dict:
    assert plan_cli.main([*argv, "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_qwen3_8b_h100_json(capsys):
    out = run_json(capsys, "--preset", "Qwen3-8B", "--gpu", "H100-80GB",
                   "--target-concurrency", "500", "--gpu-hourly-cost", "4.29", "--max-model-len", "32768")
    assert out["kv_bytes_per_token"] == 147456 and out["kv_kib_per_token"] == 144
    assert out["kv_tokens"] == 395_717
    assert out["concurrent_requests"] == 263
    assert out["gpus_for_target"] == 2 and out["gpus_at_max_model_len"] == 42
    assert out["concurrent_at_max_model_len"] == 12
    assert out["monthly_cost_usd"] == pytest.approx(6263.4)
    assert out["utilization_step"]["tokens"] == 5825
    assert out["mean_last_block_waste"] == 7.5
    assert out["startup"]["fits"] is True


def test_gpu_memory_gib_equals_named_gpu_and_params_equal_preset(capsys):
    named = run_json(capsys, "--preset", "Qwen3-8B", "--gpu", "H100-80GB")
    explicit = run_json(capsys, "--preset", "Qwen3-8B", "--gpu-memory", "80GiB", "--params", "8190735360")
    assert named["kv_tokens"] == explicit["kv_tokens"] == 395_717
    decimal = run_json(capsys, "--preset", "Qwen3-8B", "--gpu-memory", "80GB")
    assert decimal["kv_tokens"] < 370_000


def test_fp8_and_block_size(capsys):
    assert run_json(capsys, "--preset", "Qwen3-8B", "--gpu", "H100-80GB",
                    "--kv-cache-dtype", "fp8")["concurrent_requests"] == 526
    out = run_json(capsys, "--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--block-size", "128")
    assert out["slots_per_request"] == 1536 and out["mean_last_block_waste"] == 63.5


@pytest.mark.parametrize("gpu, dtype, expected", [
    ("A10-24GB", "auto", 48), ("A10-24GB", "fp8", 96), ("H100-80GB", "auto", 689), ("H100-80GB", "fp8", 1379),
])
def test_qwen25_7b_with_weights_memory(capsys, gpu, dtype, expected):
    out = run_json(capsys, "--preset", "Qwen2.5-7B", "--gpu", gpu, "--weights-memory", "14.2GiB",
                   "--kv-cache-dtype", dtype)
    assert out["concurrent_requests"] == expected


def test_model_config_file(capsys, tmp_path):
    config = {"num_hidden_layers": 64, "num_attention_heads": 40, "num_key_value_heads": 8,
              "hidden_size": 5120, "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    out = run_json(capsys, "--model-config", str(path), "--gpu", "H100-80GB", "--params", "32763876352",
                   "--activation-memory", "4GiB", "--gpu-memory-utilization", "0.92")
    assert out["kv_kib_per_token"] == 256
    assert out["concurrent_requests"] == 23


def test_table_output_names_units_and_figures(capsys):
    assert plan_cli.main(["--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--target-concurrency", "500",
                          "--gpu-hourly-cost", "4.29", "--max-model-len", "32768"]) == 0
    out = capsys.readouterr().out
    assert "147,456 B = 144 KiB" in out
    assert "54.34 GiB (58.35 GB)" in out
    assert "395,717" in out and "263" in out
    assert "$6,263.40" in out and "42 GPU(s)" in out
    assert "+0.80 GiB" in out and "+5,825 tokens" in out


def test_max_model_len_over_kv_tokens_warns_with_vllm_message_and_exits_1(capsys):
    code = plan_cli.main(["--preset", "Qwen2.5-7B", "--gpu", "A10-24GB", "--weights-memory", "14.2GiB",
                          "--max-model-len", "131072"])
    out = capsys.readouterr().out
    assert code == 1
    assert "WARNING: max_model_len 131072 exceeds the KV cache" in out
    assert "To serve at least one request with the model's max seq len (131072)" in out
    fix = re.search(r"fix: start vLLM with --max-model-len (\d+) or less", out)
    assert fix and int(fix.group(1)) % 16 == 0 and int(fix.group(1)) < 131072


def test_hybrid_note_is_printed(capsys, tmp_path):
    config = {"num_hidden_layers": 8, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
              "hidden_size": 1024, "full_attention_interval": 4}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert plan_cli.main(["--model-config", str(path), "--gpu", "L4-24GB", "--weights-memory", "2GiB"]) == 0
    assert "note: hybrid: 2 of 8 layers" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--preset", "Qwen3-8B"], "--gpu NAME or --gpu-memory"),
    (["--model-config", "CONFIG", "--gpu", "H100"], "--weights-memory SIZE or --params"),
    (["--preset", "Qwen3-8B", "--gpu", "TPUv5"], "unknown GPU"),
    (["--preset", "nope", "--gpu", "H100"], "unknown preset"),
    (["--model-config", "SLIDING", "--gpu", "H100", "--params", "1"], "Sliding window for some but all layers"),
])
def test_errors_exit_2_with_message(capsys, tmp_path, argv, message):
    (tmp_path / "c.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2,
                                                 "hidden_size": 128}))
    (tmp_path / "s.json").write_text(json.dumps({"num_hidden_layers": 2, "num_attention_heads": 2,
                                                 "hidden_size": 128, "sliding_window": 4096,
                                                 "model_type": "qwen2", "use_sliding_window": True,
                                                 "max_window_layers": 1}))
    argv = [str(tmp_path / "c.json") if a == "CONFIG" else str(tmp_path / "s.json") if a == "SLIDING" else a
            for a in argv]
    assert plan_cli.main(argv) == 2
    assert message in capsys.readouterr().err


def test_bad_size_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as exc:
        plan_cli.main(["--preset", "Qwen3-8B", "--gpu-memory", "80G"])
    assert exc.value.code == 2
    assert "ambiguous unit" in capsys.readouterr().err


def test_register_sets_func_on_a_foreign_parser():
    parser = argparse.ArgumentParser(prog="brimful")
    sub = parser.add_subparsers(dest="command")
    plan_cli.register(sub)
    args = parser.parse_args(["plan", "--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--format", "json"])
    assert args.func is plan_cli.run


def test_module_entry_point_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "proxy.commands.plan", "--preset", "Qwen3-8B", "--gpu", "H100-80GB", "--format", "json"],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["concurrent_requests"] == 263
