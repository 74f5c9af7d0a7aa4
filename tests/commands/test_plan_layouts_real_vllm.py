"""Live: a real vLLM 0.32 CPU server per attention layout, its start-up KV figures against `brimful plan`.

One server at a time (each ≈ 2 GiB, 30–60 s on two cores), stopped as soon as
it has logged its KV cache.  The same figures are recorded in
tests/data/vllm032_cpu/kv_layouts.json, so each test also shows the capture
is still what this vLLM does.  BRIMFUL_REAL_VLLM decides skip or error when
vLLM cannot be had (tests/realvllm/fixture.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.commands.test_plan_layouts import LAYOUTS, plan_figures
from tests.realvllm.fixture import MODE_ENV, QWEN3_TOKENIZER_DIR, parse_mode
from tests.realvllm.kv_layouts import CASES, vllm_kv_figures, write_model
from tests.realvllm.venv import SetupError, ensure_vllm_venv

pytestmark = [pytest.mark.realvllm, pytest.mark.slow]


@pytest.fixture(scope="module")
def vllm_python() -> Iterator[Path]:
    mode = parse_mode(os.environ.get(MODE_ENV))
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    try:
        yield ensure_vllm_venv().python
    except SetupError as error:
        if mode == "require":
            raise
        pytest.skip(f"real vLLM unavailable ({MODE_ENV}=require makes this an error): {error}")


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_plan_equals_a_live_vllm(vllm_python, tmp_path, capsys, c):
    model_dir = write_model(c, tmp_path / c.name, QWEN3_TOKENIZER_DIR)
    live = vllm_kv_figures(vllm_python, c, model_dir, tmp_path / "vllm.log")
    if live["block_size"] == LAYOUTS[c.name]["block_size"]:
        assert live["line"] == LAYOUTS[c.name]["line"]      # the capture is still what vLLM does
    # plan told the block size this vLLM chose (MLA's depends on the CPU: `kv_layouts.block_size_in`)
    out = plan_figures(capsys, tmp_path, dataclasses.replace(c, block_size=live["block_size"]))
    assert out["vllm_kv_cache_tokens"] == live["kv_cache_tokens"]
    assert f"{out['vllm_max_concurrency']:.2f}" == live["max_concurrency"]
