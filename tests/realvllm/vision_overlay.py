"""torchvision for the vision-model server only, beside (never inside) the shared vLLM venv.

Why: transformers 5.19's Qwen2-VL processor loads a video processor that needs
torchvision, and ``vllm/model_executor/models/qwen2_vl.py`` imports
``transformers.models.qwen2_vl.image_processing_qwen2_vl``, which imports it at
module level; vLLM's model inspection of Gemma3ForConditionalGeneration fails
without it the same way. The vLLM venv has no torchvision on purpose (venv.py): the only
build the registry serves, 0.28.0 (the release paired with torch 2.13), is a
CUDA build whose C++ ops cannot load beside the CPU torch, and importing it
then dies registering fake kernels for ``torchvision::nms``/``qnms``, ops that
never got defined.

So it goes into a separate directory put on PYTHONPATH for the vision server
alone, with a ``sitecustomize.py`` that defines those two op schemas just
before torchvision is first imported. torchvision then imports without its C++
ops, which only detection models use; transformers' Qwen2-VL and Gemma 3
processors use its Python transforms on torch tensors. That is the torchvision
backend production GPU installs run, so the image grid arithmetic under test is
the one they use. The text server (and every other user of the venv) never
sees this directory.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from .locking import exclusive_lock
from .venv import SetupError, cache_root, log_tail, quiet_env

TORCHVISION = "torchvision==0.28.0"
READY_MARKER = ".brimful-ready"

SITECUSTOMIZE = '''\
"""Define torchvision's nms/qnms op schemas before torchvision registers fakes for them
(its CUDA-built C++ ops cannot load beside the CPU torch); see brimful's
tests/realvllm/vision_overlay.py."""

import importlib.abc
import importlib.machinery
import sys


class _DefineOpsFirst(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "torchvision":
            return None
        sys.meta_path.remove(self)
        import torch.library

        schema = "(Tensor dets, Tensor scores, float iou_threshold) -> Tensor"
        for name in ("nms", "qnms"):
            try:
                torch.library.define(f"torchvision::{name}", schema)
            except RuntimeError:
                pass  # defined already (the C++ ops did load)
        return importlib.machinery.PathFinder.find_spec(fullname, path)


sys.meta_path.insert(0, _DefineOpsFirst())
'''


def overlay_dir() -> Path:
    return cache_root() / "vllm-vision-overlay"


def ensure_vision_overlay(python: Path, log_path: Path) -> Path:
    """Install torchvision (no dependencies) and the sitecustomize into the overlay once; return its path."""
    target = overlay_dir()
    with exclusive_lock(target.parent / f".{target.name}.lock"):
        if (target / READY_MARKER).exists() and (target / "sitecustomize.py").read_text() == SITECUSTOMIZE:
            return target
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "w") as log:
            command = [str(python), "-m", "pip", "install", "--no-input", "--no-deps", "--upgrade",
                       "--target", str(target), TORCHVISION]  # fmt: skip
            result = subprocess.run(
                command, stdout=log, stderr=subprocess.STDOUT, env=quiet_env(), timeout=900, check=False
            )
        if result.returncode != 0:
            raise SetupError(f"installing {TORCHVISION} into {target} failed:\n{log_tail(log_path)}")
        (target / "sitecustomize.py").write_text(SITECUSTOMIZE)
        probe = subprocess.run(
            [str(python), "-c", "import torchvision.transforms.v2.functional"],
            env={**quiet_env(), "PYTHONPATH": str(target)},
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if probe.returncode != 0:
            raise SetupError(f"torchvision in {target} does not import:\n{probe.stderr[-2000:]}")
        (target / READY_MARKER).write_text(TORCHVISION + "\n")
    return target
