"""Shared test fixtures: where ../shared is, and the real-vLLM tier."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tokenizer_cache import _model, load_model_tokenizer
from tokenizer_cache._build_store import BuildStore

pytest_plugins = ["tests.realvllm.fixture", "tests.realvllm.vl_fixture"]

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODELS = SHARED / "models"
CAPTURES = SHARED / "vllm" / "captures"


def pytest_configure(config: pytest.Config) -> None:
    """Keep compiled, assertion-rewritten modules in __pycache__ even under PYTHONDONTWRITEBYTECODE.

    Without them every pytest process (each xdist worker, each run) compiles and
    rewrites the ~270 test and support modules again: ~5 s of CPU per process.
    """
    sys.dont_write_bytecode = False


# The longest files (mypy with a cold cache: ~11 s of CPU; the others 8-13 s each) run first, so that
# under `-n 2 --dist loadfile` the run ends on short files instead of one worker waiting for a long one.
LONG_FILES_FIRST = ("tests/test_lint.py", "tests/e2e/test_faults.py", "tests/deploy/test_helm.py",
                    "tests/tokenizer_cache/test_render_memo.py", "tests/tokenizer_cache/test_piece_cache.py",
                    "tests/e2e/test_fake.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the real vLLM is slow, whether or not its module says so."""
    for item in items:
        if item.get_closest_marker("realvllm") or "real_vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in LONG_FILES_FIRST)   # stable


@pytest.fixture(autouse=True)
def _tmp_folders_leave_the_loaded_cache(request: pytest.FixtureRequest) -> Iterator[None]:
    """Folders a test loads from its own tmp_path are dropped after it: no later test can load them,
    and kept they would push the shared models out of the bounded cache."""
    if "tmp_path" not in request.fixturenames:
        yield
        return
    tmp = Path(request.getfixturevalue("tmp_path")).resolve()
    yield
    with _model._loaded_lock:
        for key in [key for key in _model._loaded if Path(key[0]).is_relative_to(tmp)]:
            del _model._loaded[key]


@pytest.fixture
def fresh_loads(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No folder or tokenizer loaded before this test is reused by it, and none it loads outlives it.

    For a test that must load afresh (the self-check runs at load): the shared models loaded
    before it are put back afterwards, not dropped, so later modules need not load them again.
    transformers builds afresh too: the builds kept on disk are not read.
    """
    monkeypatch.setattr(_model, "build_store", lambda: BuildStore(None))
    tables: list[OrderedDict[Any, Any]] = [_model._loaded, _model._engines, _model._built]
    with _model._loaded_lock:
        kept = [list(table.items()) for table in tables]
        for table in tables:
            table.clear()
    try:
        yield
    finally:
        with _model._loaded_lock:
            for table, items in zip(tables, kept, strict=True):
                table.clear()
                table.update(items)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the shared data folder is missing: expected {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def qwen3_dir(shared_dir: Path) -> Path:
    return MODELS / "Qwen--Qwen3-8B"


@pytest.fixture(scope="module")
def qwen3(qwen3_dir: Path) -> Any:
    """Qwen3-8B's real tokenizer and template, as brimful loads it (one load per module, as before)."""
    return load_model_tokenizer(qwen3_dir)
