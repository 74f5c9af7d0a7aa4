"""The code stays ruff- and mypy-clean (pyproject.toml's [tool.ruff] and [tool.mypy])."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean() -> None:
    result = _run("ruff", "check", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_is_clean(tmp_path: Path) -> None:
    # A fresh cache outside the clone: nothing for git to see, no stale results.
    result = _run("mypy", "--cache-dir", str(tmp_path / "mypy_cache"))
    assert result.returncode == 0, result.stdout + result.stderr
