"""The ``real_vllm_vl`` fixture: a real vLLM 0.32 CPU server with the tiny Qwen2-VL model.

Module-scoped, so it runs only while the tests that ask for it run (≈ 2.5 GiB,
≈ 40 s to start) and stops before the next module. ``HEADROOM_REAL_VLLM``
decides what happens when it cannot be had, as for ``real_vllm``.

The server trusts request-level ``mm_processor_kwargs`` and chat templates
(``--trust-request-mm-kwargs``, ``--trust-request-chat-template``): ground
truth for the processor options and for a string-format template comes from
the same server. Neither flag changes anything else vLLM does.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator

import pytest

from .fixture import MODE_ENV, SHARED_DIR, RealVllm, parse_mode
from .locking import exclusive_lock
from .server import MAX_MODEL_LEN, running_server
from .tiny_vl_model import ensure_built
from .venv import SetupError, cache_root, ensure_vllm_venv
from .vision_overlay import ensure_vision_overlay

QWEN25_TOKENIZER_DIR = SHARED_DIR / "models" / "Qwen--Qwen2.5-7B-Instruct"
VL_MODEL_NAME = "tiny-qwen2-vl"
VL_SERVER_ARGS = ("--trust-request-mm-kwargs", "--trust-request-chat-template")


@pytest.fixture(scope="module")
def real_vllm_vl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """vLLM serving the tiny Qwen2-VL model as ``tiny-qwen2-vl`` (max_model_len 2048)."""
    mode = parse_mode(os.environ.get(MODE_ENV))
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    log_dir = tmp_path_factory.mktemp("realvllm-vl")
    timings: dict[str, float] = {}
    with contextlib.ExitStack() as stack:
        try:
            venv = ensure_vllm_venv(log_path=log_dir / "vllm-venv-install.log")
            overlay = ensure_vision_overlay(venv.python, log_dir / "vision-overlay-install.log")
            if not QWEN25_TOKENIZER_DIR.is_dir():
                raise SetupError(f"the Qwen2.5 tokenizer files are missing: {QWEN25_TOKENIZER_DIR}")
            model_dir = cache_root() / "tiny-qwen2-vl"
            started = time.monotonic()
            with exclusive_lock(cache_root() / ".tiny-qwen2-vl.lock"):
                if ensure_built(model_dir, QWEN25_TOKENIZER_DIR, venv.python, log_dir / "build.log"):
                    timings["model_build_s"] = time.monotonic() - started
            server = stack.enter_context(
                running_server(
                    venv.python,
                    model_dir,
                    log_dir / "vllm-vl-server.log",
                    served_model_name=VL_MODEL_NAME,
                    extra_args=VL_SERVER_ARGS,
                    extra_env={"PYTHONPATH": str(overlay)},
                )
            )
        except SetupError as error:
            if mode == "require":
                raise
            pytest.skip(f"real vLLM (vision) unavailable ({MODE_ENV}=require makes this an error): {error}")
        timings["startup_s"] = server.startup_seconds
        yield RealVllm(
            base_url=server.base_url,
            model=VL_MODEL_NAME,
            max_model_len=MAX_MODEL_LEN,
            tokenizer_dir=model_dir,
            log_path=server.log_path,
            pid=server.process.pid,
            timings=timings,
        )
