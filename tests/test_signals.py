"""A SIGTERM sent while `brimful serve` starts is kept until the server handles it (proxy.signals)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.fakevllm import FakeVLLM
from tests.support.process import ROOT
from tests.support.servers import free_port

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("workers", [1, 2])
def test_a_sigterm_that_lands_in_a_finalizer_while_starting_still_stops_brimful(
        workers: int, qwen3_dir: Path, tmp_path: Path) -> None:
    with FakeVLLM() as fake:
        config = tmp_path / "brimful.toml"
        config.write_text(f'[upstream]\nurl = "{fake.base_url}"\n[models."tiny-qwen"]\ntokenizer = "{qwen3_dir}"\n')
        proc = subprocess.Popen([sys.executable, "-m", "tests.support.stop_while_starting", str(config),
                                 str(free_port()), str(workers)],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            _, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            err = proc.communicate()[1]
            pytest.fail("brimful never stopped: the SIGTERM was lost\n" + err[-3000:])
    assert proc.returncode == 0, err[-3000:]
    assert "Exception ignored" not in err
    assert err.count("Application startup complete") == workers      # each server ran, then drained
