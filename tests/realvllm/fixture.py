"""The session-scoped ``real_vllm`` pytest fixture: one real vLLM 0.32 CPU server per test run.

Register it from ``tests/conftest.py`` with ``pytest_plugins = ["tests.realvllm.fixture"]``
(this module is then a plugin: it also registers the ``realvllm`` marker).

``BRIMFUL_REAL_VLLM`` decides what happens when the server cannot be had:
- unset / ``auto``: try; if setup is impossible (no registry to install from, no
  cached venv, a start that fails) the tests that need it are skipped with the
  reason, so a developer without the 2.5 GB venv still gets a green run;
- ``require``: any failure is a test error (CI sets this, so a broken tier
  cannot hide behind skips);
- ``0`` / ``off`` / ``false`` / ``no``: skip without trying.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .locking import exclusive_lock
from .server import MAX_MODEL_LEN, POOLING_ARGS, SERVED_MODEL_NAME, process_tree_rss_bytes, running_server
from .tiny_model import ensure_tiny_model
from .venv import SetupError, cache_root, ensure_vllm_venv

MODE_ENV = "BRIMFUL_REAL_VLLM"
# Tests locate shared data as <project root>/../shared, never by absolute path.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
SHARED_DIR = PROJECT_ROOT.parent / "shared"
QWEN3_TOKENIZER_DIR = SHARED_DIR / "models" / "Qwen--Qwen3-8B"


@dataclass(frozen=True)
class RealVllm:
    """What a test needs to talk to the real server.

    `base_url` has no ``/v1`` suffix (vLLM's ``/tokenize`` and ``/health`` live
    outside it); `tokenizer_dir` holds the model's tokenizer.json and
    tokenizer_config.json, the files brimful's own counter loads.
    """

    base_url: str
    model: str
    max_model_len: int
    tokenizer_dir: Path
    log_path: Path
    pid: int
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def openai_base_url(self) -> str:
        """The ``base_url`` an OpenAI client takes."""
        return f"{self.base_url}/v1"

    def rss_bytes(self) -> int:
        """Resident memory of the server and its engine processes right now."""
        return process_tree_rss_bytes(self.pid)


def parse_mode(value: str | None) -> str:
    """Map ``BRIMFUL_REAL_VLLM`` to ``auto``, ``require`` or ``off``; anything else is a usage error."""
    normalised = (value or "auto").strip().lower()
    if normalised in ("", "auto"):
        return "auto"
    if normalised in ("require", "required", "1", "on", "true", "yes"):
        return "require"
    if normalised in ("0", "off", "false", "no"):
        return "off"
    raise pytest.UsageError(f"{MODE_ENV}={value!r}: expected auto, require or off")


@contextlib.contextmanager
def setup_or_skip(what: str = "real vLLM") -> Iterator[None]:
    """Around a fixture's setup: ``BRIMFUL_REAL_VLLM=off`` skips before it; a `SetupError` in it
    skips the tests that need `what`, or is the error itself under ``require``."""
    mode = parse_mode(os.environ.get(MODE_ENV))
    if mode == "off":
        pytest.skip(f"{MODE_ENV}=off")
    try:
        yield
    except SetupError as error:
        if mode == "require":
            raise
        pytest.skip(f"{what} unavailable ({MODE_ENV}=require makes this an error): {error}")


def prepare(log_dir: Path) -> tuple[Path, Path, dict[str, float]]:
    """Make sure the vLLM venv and the tiny model exist; return (python, model dir, timings)."""
    timings: dict[str, float] = {}
    venv = ensure_vllm_venv(log_path=log_dir / "vllm-venv-install.log")
    if venv.installed:
        timings["install_s"] = venv.install_seconds
    if not QWEN3_TOKENIZER_DIR.is_dir():
        raise SetupError(f"the Qwen3 tokenizer files are missing: {QWEN3_TOKENIZER_DIR}")
    model_dir = cache_root() / "tiny-qwen3"
    started = time.monotonic()
    with exclusive_lock(cache_root() / ".tiny-qwen3.lock"):
        built = ensure_tiny_model(model_dir, QWEN3_TOKENIZER_DIR, venv.python, log_dir / "tiny-model-build.log")
    if built:
        timings["model_build_s"] = time.monotonic() - started
    return venv.python, model_dir, timings


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``realvllm`` marker unless the project's ini already does (``--strict-markers`` safe)."""
    if not any(line.split(":", 1)[0].strip() == "realvllm" for line in config.getini("markers")):
        config.addinivalue_line("markers", "realvllm: needs a real vLLM 0.32 CPU server (see tests/realvllm)")


@pytest.fixture(scope="session")
def real_vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """A running vLLM server serving the tiny Qwen3 model as ``tiny-qwen`` with max_model_len 2048."""
    yield from _serve(tmp_path_factory, "realvllm", ())


@pytest.fixture(scope="module")
def real_vllm_pooling(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """The same tiny model served as an embedding model (``--runner pooling --convert embed``).

    Module-scoped: vLLM serves either generation or pooling, so this is a second
    server (~2.4 GiB), stopped when the module that needs it is done.
    """
    yield from _serve(tmp_path_factory, "realvllm-pooling", POOLING_ARGS)


def _serve(tmp_path_factory: pytest.TempPathFactory, name: str, extra: tuple[str, ...]) -> Iterator[RealVllm]:
    log_dir = tmp_path_factory.mktemp(name)
    with contextlib.ExitStack() as stack:
        with setup_or_skip():
            python, model_dir, timings = prepare(log_dir)
            server = stack.enter_context(running_server(python, model_dir, log_dir / "vllm-server.log",
                                                        extra_args=extra))
        timings["startup_s"] = server.startup_seconds
        yield RealVllm(
            base_url=server.base_url,
            model=SERVED_MODEL_NAME,
            max_model_len=MAX_MODEL_LEN,
            tokenizer_dir=model_dir,
            log_path=server.log_path,
            pid=server.process.pid,
            timings=timings,
        )
