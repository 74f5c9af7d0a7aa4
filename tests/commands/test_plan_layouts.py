"""`brimful plan` against what a real vLLM 0.32 logged for each attention layout.

tests/data/vllm032_cpu/kv_layouts.json holds, per layout, the tiny config.json,
the `vllm serve` options and vLLM's own start-up line ("CPU KV cache size: N
tokens, Maximum concurrency for L tokens per request: X.XXx"), recorded by
tests/realvllm/kv_layouts.py.  `plan` is given the same config and options
(the KV memory as a GPU of that size at utilization 1 with no weights or
activations, vLLM's CPU block size, async scheduling off as on the CPU
backend) and must give the same two figures — the token count exactly, the
concurrency to vLLM's two printed decimals and to the whole request.
tests/commands/test_plan_layouts_real_vllm.py checks the same cases live.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from proxy.commands import plan as plan_cli
from tests.realvllm.kv_layouts import CAPTURES, CASES, LayoutCase, parse_log_line

LAYOUTS = json.loads(CAPTURES.read_text())["cases"]


def plan_figures(capsys: pytest.CaptureFixture[str], tmp_path: Path, c: LayoutCase) -> dict[str, Any]:
    """`brimful plan --format json` for one case, as an operator would run it."""
    config = tmp_path / f"{c.name}.json"
    config.write_text(json.dumps(c.config))
    code = plan_cli.main([
        "--model-config", str(config), "--gpu-memory", str(c.kv_cache_memory_bytes),
        "--gpu-memory-utilization", "1", "--weights-memory", "0", "--activation-memory", "0",
        "--block-size", str(c.block_size), "--no-async-scheduling",
        "--max-model-len", str(c.max_model_len), "--max-num-batched-tokens", str(c.max_num_batched_tokens),
        "--tokens-per-request", str(c.max_model_len), "--format", "json", *c.plan_args,
    ])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out["problems"]
    return out


def test_every_layout_has_a_capture():
    assert sorted(LAYOUTS) == sorted(c.name for c in CASES)
    for c in CASES:
        captured = LAYOUTS[c.name]
        assert captured["config"] == c.config and captured["serve_args"] == c.serve_args()
        assert parse_log_line(captured["line"]) == {k: captured[k] for k in (
            "line", "device", "kv_cache_tokens", "max_model_len", "max_concurrency")}


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_plan_equals_vllms_own_figures(capsys, tmp_path, c):
    captured = LAYOUTS[c.name]
    # the block size vLLM served it with when it was recorded (an MLA case's depends on the CPU)
    out = plan_figures(capsys, tmp_path, dataclasses.replace(c, block_size=captured["block_size"]))
    assert out["vllm_kv_cache_tokens"] == captured["kv_cache_tokens"]
    assert f"{out['vllm_max_concurrency']:.2f}" == captured["max_concurrency"]
    # to the request: the requests of max_model_len that fit at once
    assert out["concurrent_at_max_model_len"] == int(float(captured["max_concurrency"]))
    assert out["concurrent_at_max_model_len"] == out["kv_blocks"] // out["blocks_per_request"]


def test_the_table_prints_vllms_line_and_the_groups(capsys, tmp_path):
    c = next(c for c in CASES if c.name == "mixed-padded")
    config = tmp_path / "c.json"
    config.write_text(json.dumps(c.config))
    assert plan_cli.main(["--model-config", str(config), "--gpu-memory", str(c.kv_cache_memory_bytes),
                          "--gpu-memory-utilization", "1", "--weights-memory", "0", "--activation-memory", "0",
                          "--block-size", "128", "--no-async-scheduling", "--max-model-len", str(c.max_model_len),
                          "--max-num-batched-tokens", str(c.max_num_batched_tokens)]) == 0
    out = capsys.readouterr().out
    # vLLM's own words, less the device name it starts with ("CPU")
    assert f"vLLM logs                {LAYOUTS[c.name]['line'].removeprefix('CPU ')}" in out
    assert ("KV cache groups          2 group(s) (1 × sliding window 512, 1 × full) of up to 4 layer(s), "
            "one pool block = 131,072 B; 1 padding layer(s)") in out
