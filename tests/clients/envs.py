"""Where each SDK scenario runs, and the second venv for SDKs pinned to openai < 3.

The current releases of llama-index-llms-openai (0.8.x: `openai<3`) and
instructor (1.17: `jiter<0.15`, while openai 3.x needs `jiter>=0.16`) cannot
share a venv with openai 3.x, which the project pins and the Agents SDK
(>= 0.21) requires.  So they get their own venv, outside the clone like the
vLLM one: `$BRIMFUL_CLIENTS_OPENAI2_VENV` or `~/.cache/brimful/clients-openai2`,
installed from tests/clients/constraints-openai2.txt by

    python -m tests.clients.envs --install      (.ci/run does this)

Scenarios run as subprocesses (`tests.clients.run`) with that venv's python
and the repository on PYTHONPATH; the SDK venvs need nothing of brimful's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.clients.drivers import Scenario
from tests.support import pipvenv

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = Path(__file__).with_name("constraints-openai2.txt")
OPENAI2_PACKAGES = ("llama-index-llms-openai-like", "instructor")
READY = ".brimful-ready"


class MissingEnv(RuntimeError):
    """The venv a scenario needs is not installed; the message says how to make it."""


def openai2_venv() -> Path:
    override = os.environ.get("BRIMFUL_CLIENTS_OPENAI2_VENV")
    if override:
        return Path(override).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "brimful" / "clients-openai2"


def python_for(env: str) -> Path:
    if env == "main":
        return Path(sys.executable)
    venv = openai2_venv()
    python = venv / "bin" / "python"
    if not (venv / READY).exists() or not python.exists():
        raise MissingEnv(f"the openai<3 SDK venv is missing at {venv}: run `python -m tests.clients.envs --install`")
    return python


def run_scenario(scenario: Scenario, base: str, timeout: float = 600) -> str:
    """Run `scenario` against `base` in its venv; returns "<distribution> <version>"."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENAI_AGENTS_DISABLE_TRACING": "1",
           "LITELLM_LOCAL_MODEL_COST_MAP": "True", "HF_HUB_OFFLINE": "1", "NO_PROXY": "127.0.0.1,localhost"}
    result = subprocess.run(
        [str(python_for(scenario.env)), "-m", "tests.clients.run", scenario.name, base],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )
    if result.returncode != 0:
        raise RuntimeError(f"scenario {scenario.name} failed (exit {result.returncode}):\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])["client"]


def install_openai2(venv: Path) -> float:
    """Create the venv and install the pinned SDKs; returns the seconds it took."""
    return pipvenv.install(venv, CONSTRAINTS, OPENAI2_PACKAGES, venv / READY, "ok\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Manage the openai<3 SDK venv for the client tests.")
    parser.add_argument("--install", action="store_true", help="create it unless it is ready")
    args = parser.parse_args(argv)
    venv = openai2_venv()
    if args.install and not (venv / READY).exists():
        print(f"installed {venv} in {install_openai2(venv):.0f} s")
    print(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
