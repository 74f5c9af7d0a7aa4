"""The venv in which `brimful report` reads Parquet files from an S3 bucket (tests/sizing/test_s3_report.py).

DuckDB reads `s3://` URLs with its httpfs extension, which it fetches from its
own extension repository: out of reach here, and the package registries hold no
httpfs build for the DuckDB the project pins (2.0.0, constraints.txt).  PyPI has
DuckDB 1.5.5 and its httpfs 1.5.5 as wheels, and moto's S3 server to read from, so
they get a venv of their own, outside the clone like the vLLM one:
`$BRIMFUL_S3_VENV` or `${XDG_CACHE_HOME:-~/.cache}/brimful/s3-report`, installed by

    python -m tests.sizing.s3env --install      (.ci/run does this)

The report runs there as `python -m proxy.commands.report` with the repository on
PYTHONPATH: of brimful's dependencies it imports prometheus-client alone (pinned
as constraints.txt pins it, like every package both install, DuckDB aside).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tests.realvllm.venv import cache_root
from tests.support import pipvenv

ROOT = Path(__file__).resolve().parents[2]
DUCKDB = "1.5.5"
PACKAGES = (f"duckdb=={DUCKDB}", f"duckdb-extension-httpfs=={DUCKDB}", "moto[server]==5.2.5", "prometheus-client")
READY = ".brimful-ready"          # holds PACKAGES: a venv installed for other pins is not ready


class MissingEnv(RuntimeError):
    """The venv is not installed; the message says how to make it."""


def s3_venv() -> Path:
    override = os.environ.get("BRIMFUL_S3_VENV")
    return Path(override).expanduser() if override else cache_root() / "s3-report"


def ready(venv: Path) -> bool:
    marker = venv / READY
    return (venv / "bin" / "python").exists() and marker.exists() and marker.read_text() == spec()


def spec() -> str:
    return " ".join(PACKAGES) + "\n"


def python() -> Path:
    """The venv's python, or MissingEnv."""
    venv = s3_venv()
    if not ready(venv):
        raise MissingEnv(f"the DuckDB {DUCKDB} + httpfs + moto venv is missing at {venv}: "
                         "run `python -m tests.sizing.s3env --install`")
    return venv / "bin" / "python"


def httpfs_extension() -> Path:
    """The httpfs extension file the duckdb-extension-httpfs wheel installed, for DuckDB's `INSTALL '<file>'`."""
    found = sorted(s3_venv().glob(f"lib/python*/site-packages/duckdb_extension_httpfs/extensions/v{DUCKDB}/"
                                  "httpfs.duckdb_extension"))
    if not found:
        raise MissingEnv(f"no httpfs.duckdb_extension for v{DUCKDB} in {s3_venv()}")
    return found[0]


def constraints(venv: Path) -> Path:
    """constraints.txt without its DuckDB pin (this venv's DuckDB is older), written into the venv."""
    lines = [line for line in (ROOT / "constraints.txt").read_text().splitlines()
             if not line.lower().startswith("duckdb==")]
    path = venv / "constraints-s3.txt"
    path.write_text("\n".join(lines) + "\n")
    return path


def install(venv: Path) -> float:
    """Create the venv and install the packages; returns the seconds it took."""
    venv.mkdir(parents=True, exist_ok=True)      # constraints() writes into it before the venv exists
    return pipvenv.install(venv, constraints(venv), PACKAGES, venv / READY, spec())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Manage the DuckDB 1.5.5 + httpfs + moto venv for the S3 report test.")
    parser.add_argument("--install", action="store_true", help="create it unless it is ready (for these pins)")
    args = parser.parse_args(argv)
    venv = s3_venv()
    if args.install and not ready(venv):
        print(f"installed {venv} in {install(venv):.0f} s")
    print(venv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
