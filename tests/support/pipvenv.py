"""A venv outside the clone for test dependencies that cannot share brimful's (tests/clients/envs.py,
tests/sizing/s3env.py): created once, packages installed under constraints, a marker written last."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


def install(venv: Path, constraints: Path, packages: Sequence[str], marker: Path, marker_text: str) -> float:
    """Create `venv` unless it exists and pip-install `packages` under `constraints`, then write `marker`
    (what says the venv is ready); returns the seconds it took."""
    started = time.monotonic()
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-c", str(constraints), *packages], check=True)
    marker.write_text(marker_text)
    return time.monotonic() - started
