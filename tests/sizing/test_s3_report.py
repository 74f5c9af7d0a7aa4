"""`brimful report 's3://bucket/…/*.parquet'`: DuckDB's httpfs reads the replicas' files from a bucket, and the
report is the one the same files give read from disk (docs/fleet.md, "Object storage + DuckDB").

The bucket is moto's S3 server on 127.0.0.1; the report runs in the venv of tests/sizing/s3env.py (DuckDB 1.5.5
and the httpfs 1.5.5 wheel: no httpfs build exists for the project's DuckDB 2.0.0), with a HOME of its own where
httpfs is installed from the wheel's file and a persistent S3 secret points DuckDB at the server, as a user's
`CREATE PERSISTENT SECRET` would.  The files are the recorder's own (`ParquetLog`), three replicas.  Skipped
when that venv is not installed, failed instead under BRIMFUL_REQUIRE_S3=1 (.ci/run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.sizing import s3env
from tests.support.process import wait_until
from tests.support.servers import free_port

pytest.importorskip("pyarrow")

from proxy.recording import parquetlog as pl
from tests.sizing.test_engine import varied

pytestmark = pytest.mark.slow          # moto's server and three report processes: ~3.5 s

ROOT = Path(__file__).resolve().parents[2]
BUCKET = "bucket"


def s3_python() -> Path:
    try:
        return s3env.python()
    except s3env.MissingEnv as e:
        if os.environ.get("BRIMFUL_REQUIRE_S3") == "1":
            pytest.fail(f"{e} but BRIMFUL_REQUIRE_S3=1")
        pytest.skip(str(e))


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server on a free port of 127.0.0.1: its base URL, the server stopped at the end."""
    python = s3_python()
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([str(python), "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            if proc.poll() is not None:
                return True                 # exited: fail below, not after the whole wait
            try:
                return httpx.get(base + "/moto-api/", timeout=1).status_code == 200
            except httpx.TransportError:
                return False
        assert wait_until(up, 60) and proc.poll() is None, log.read_text()[-3000:]
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def fleet(moto: str, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Three replicas' Parquet files, 4,000 varied records, written by the recorder and PUT into the bucket."""
    folder = tmp_path_factory.mktemp("fleet")
    records = varied(11, 4000)
    files: list[Path] = []
    for replica, part in (("a", records[:1500]), ("b", records[1500:3200]), ("c", records[3200:])):
        log = pl.ParquetLog(folder, replica=replica, flush_interval_s=0.01)
        for record in part:
            log.enqueue(record)
        log.close()
        files.extend(log.converted)
    assert len(files) == 3
    with httpx.Client(base_url=moto, timeout=30) as client:     # moto takes unsigned PUTs
        assert client.put(f"/{BUCKET}").status_code == 200
        for path in files:
            assert client.put(f"/{BUCKET}/fleet/{path.name}", content=path.read_bytes()).status_code == 200
        client.put(f"/{BUCKET}/fleet/notes.txt", content=b"not a parquet file").raise_for_status()
    return sorted(files)


@pytest.fixture(scope="module")
def duckdb_home(moto: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A HOME whose ~/.duckdb holds httpfs, installed from the wheel's file, and an S3 secret for the server."""
    home = tmp_path_factory.mktemp("home")
    endpoint = moto.removeprefix("http://")
    sql = [f"INSTALL '{s3env.httpfs_extension()}'",
           f"CREATE PERSISTENT SECRET moto (TYPE s3, KEY_ID 'x', SECRET 'y', ENDPOINT '{endpoint}', "
           "URL_STYLE 'path', USE_SSL false, REGION 'us-east-1')"]
    script = f"import duckdb\ncon = duckdb.connect()\nfor q in {sql!r}:\n    con.sql(q)\n"
    subprocess.run([str(s3_python()), "-c", script], env={**clean_env(), "HOME": str(home)}, check=True,
                   timeout=120)
    assert list(home.glob(".duckdb/stored_secrets/*.duckdb_secret"))
    return home


def clean_env() -> dict[str, str]:
    """The environment without AWS credentials or proxies that would take the place of the secret's."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith("AWS_") and k.lower() not in ("http_proxy", "https_proxy", "all_proxy")}


def report(python: Path, args: list[str], home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**clean_env(), "PYTHONPATH": str(ROOT)}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run([str(python), "-m", "proxy.commands.report", *args, "--format", "json"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300, check=False)


def without_files(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "files"}


def test_a_bucket_glob_gives_the_report_of_the_same_files_read_locally(fleet: list[Path], duckdb_home: Path) -> None:
    url = f"s3://{BUCKET}/fleet/*.parquet"
    remote = report(s3_python(), [url, "--engine", "duckdb"], duckdb_home)
    assert remote.returncode == 0, remote.stderr
    s3 = json.loads(remote.stdout)
    local = [str(p) for p in fleet]
    for engine in ("duckdb", "python"):         # the main venv: DuckDB 2.0.0, and the Python reader
        done = report(Path(sys.executable), [*local, "--engine", engine])
        assert done.returncode == 0, done.stderr
        here = json.loads(done.stdout)
        assert here["files"] == local
        assert without_files(s3) == without_files(here), engine
    assert s3["files"] == [url]                 # the URL as given: DuckDB expands it, not brimful
    assert s3["records"] == 4000 and s3["malformed"] == 0
    assert {m["model"] for m in s3["models"]} == {"qwen", "llama", "unknown"}
    assert all(m["recommendation"] is not None for m in s3["models"])


def test_a_glob_matching_nothing_in_the_bucket_is_the_clis_one_line_error(moto: str, fleet: list[Path],
                                                                       duckdb_home: Path) -> None:
    done = report(s3_python(), [f"s3://{BUCKET}/elsewhere/*.parquet", "--engine", "duckdb"], duckdb_home)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        f'brimful report: error: DuckDB could not read the files: IO Error: No files found that match the pattern '
        f'"s3://{BUCKET}/elsewhere/*.parquet"']


def test_a_missing_bucket_is_the_clis_error_with_s3s_reason(moto: str, duckdb_home: Path) -> None:
    """No traceback; DuckDB's message for a bucket that does not exist has S3's error code on a line of its own
    (after a blank one), and the CLI prints it as it is."""
    done = report(s3_python(), ["s3://no-such-bucket/fleet/*.parquet", "--engine", "duckdb"], duckdb_home)
    assert (done.returncode, done.stdout) == (2, "")
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line]
    assert lines == ["brimful report: error: DuckDB could not read the files: HTTP Error: HTTP GET error reading "
                     "'s3://no-such-bucket/fleet' in region 'us-east-1' (HTTP 404 Not Found)",
                     "NoSuchBucket: The specified bucket does not exist"]
