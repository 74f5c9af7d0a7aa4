"""The product is brimful everywhere: its old name (taken on PyPI and by another proxy) left no trace.

Every tracked file of the repository is read, bytes and path, and the old name may not appear in
any of them, in any case: console scripts, headers, metric names, environment variables, the chart,
the dashboards, the docs.  (Text inside an image cannot be read this way: docs/dashboard.png is a
screenshot that `tests/serving/test_dashboard_chromium.py` regenerates.)  Then the places users meet
the name are checked for the new one.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from proxy.config import load_config
from tests.test_docs_reference import exported_families

ROOT = Path(__file__).resolve().parents[1]
OLD = ("head" + "room").encode()          # spelt apart, or this file would hold it


# what a run leaves in a checkout that is not part of it (used when the tree is not a git checkout)
UNTRACKED = {".git", ".venv", "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", "build"}


def tracked_files() -> list[str]:
    """The repository's files as git tracks them (what a clean checkout holds), .git excluded; without
    git, every file of the tree but what a run leaves behind."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=False)
    if listed.returncode == 0:
        return [name for name in listed.stdout.decode().split("\0") if name]
    return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
            and not UNTRACKED & set(p.relative_to(ROOT).parts) and ".egg-info" not in str(p)]


def test_the_old_name_appears_nowhere() -> None:
    files = tracked_files()
    assert "pyproject.toml" in files and "README.md" in files
    in_paths = [name for name in files if OLD.decode() in name.lower()]
    in_contents = [name for name in files if (ROOT / name).is_file() and OLD in (ROOT / name).read_bytes().lower()]
    assert in_paths == [] and in_contents == []


def test_the_check_would_find_it(tmp_path: Path) -> None:
    """The comparison is case-blind and byte-level, so the test above cannot pass vacuously."""
    for text in (b"x-" + OLD + b"-action", OLD.upper() + b"_UPSTREAM_URL", b"Head" + OLD[4:]):
        assert OLD in text.lower()


def test_users_meet_brimful(tmp_path: Path) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "brimful"
    assert set(project["scripts"]) == {"brimful"}
    chart = (ROOT / "deploy" / "helm" / "brimful" / "Chart.yaml").read_text()
    assert re.search(r"^name: brimful$", chart, re.M)
    assert (ROOT / "config" / "brimful.toml").is_file()
    assert (ROOT / "config" / "grafana" / "dashboards" / "brimful.json").is_file()
    source = "\n".join(p.read_text() for p in (ROOT / "proxy").rglob("*.py"))
    # x-request-id is everyone's; x-codex-turn-metadata is Codex's, only read (proxy/admitted/codex.py)
    headers = set(re.findall(r'b"(x-[a-z]+)-[a-z-]+"', source)) - {"x-request", "x-codex"}
    assert headers == {"x-brimful"}
    # every metric family and every environment variable brimful reads carries the new name
    families = exported_families(tmp_path)
    assert families and all(name.startswith("brimful_") for name in families), families
    assert load_config(None, env={"BRIMFUL_UPSTREAM_URL": "http://vllm:8000"}).upstream.url == "http://vllm:8000"
