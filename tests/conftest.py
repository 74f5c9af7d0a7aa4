"""Shared test fixtures: where ../shared is, and the real-vLLM tier."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.realvllm.fixture", "tests.realvllm.vl_fixture"]

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODELS = SHARED / "models"
CAPTURES = SHARED / "vllm" / "captures"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the real vLLM is slow, whether or not its module says so."""
    for item in items:
        if item.get_closest_marker("realvllm") or "real_vllm" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"the shared data folder is missing: expected {SHARED}")
    return SHARED


@pytest.fixture(scope="session")
def qwen3_dir(shared_dir: Path) -> Path:
    return MODELS / "Qwen--Qwen3-8B"
