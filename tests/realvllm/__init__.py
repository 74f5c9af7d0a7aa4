"""Helpers that run a real vLLM 0.32 CPU server for the real-vLLM test tier.

The pytest side lives in `realvllm.fixture` (register it as a plugin from
tests/conftest.py); the rest has no pytest dependency and can be driven by
hand, e.g. to start the server for a benchmark.
"""

from .server import RunningServer, running_server
from .tiny_model import ensure_tiny_model
from .venv import SetupError, VenvResult, cache_root, ensure_vllm_venv

__all__ = [
    "RunningServer",
    "SetupError",
    "VenvResult",
    "cache_root",
    "ensure_tiny_model",
    "ensure_vllm_venv",
    "running_server",
]
