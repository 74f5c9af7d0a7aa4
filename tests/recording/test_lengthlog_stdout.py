"""`[length_log] path = "-"`: the length records as JSON lines on standard output, for a log pipeline."""

from __future__ import annotations

import json
import logging
import re
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from proxy.logs import JsonFormatter
from proxy.recording.lengthlog import LengthLog
from proxy.recording.record import LengthRecord
from tests.support.fakevllm import FakeVLLM
from tests.support.process import wait_listening
from tests.support.servers import free_port

ROOT = Path(__file__).resolve().parents[2]


def record(i: int) -> LengthRecord:
    return LengthRecord(ts=1_700_000_000.0 + i, model="Qwen/Qwen3-8B", endpoint="chat", prompt_tokens=100 + i,
                        completion_tokens=10, status=200)


def test_records_go_to_stdout_whole_and_never_rotate(capfd: pytest.CaptureFixture[str], tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with LengthLog("-", max_bytes=300, backups=2) as log:   # 300 B would rotate a file every two lines
        for i in range(50):
            log.enqueue(record(i))
        assert log.flush(10)
        assert (log.stats.written, log.stats.write_errors) == (50, 0)
    out = capfd.readouterr().out
    lines = [json.loads(line) for line in out.splitlines()]
    assert [line["prompt_tokens"] for line in lines] == [100 + i for i in range(50)]
    assert list(tmp_path.iterdir()) == []                 # no file named "-", no "-.1", no lock file
    print("still open")                                   # closing the log left stdout itself open
    assert capfd.readouterr().out == "still open\n"


def test_stdout_writes_are_whole_lines_of_at_most_pipe_buf(monkeypatch: pytest.MonkeyPatch) -> None:
    """Workers share standard output: a pipe keeps a write of at most PIPE_BUF bytes whole."""
    import proxy.recording.lengthlog as lengthlog

    writes: list[bytes] = []
    monkeypatch.setattr(lengthlog.os, "write", lambda fd, data: writes.append(bytes(data)) or len(data))
    with LengthLog("-") as log:
        for i in range(200):                       # ~30 KiB queued for one round of the writer
            log.enqueue(record(i))
        assert log.flush(10)
    assert len(writes) > 1
    assert all(len(w) <= select.PIPE_BUF and w.endswith(b"\n") for w in writes)
    assert [json.loads(line)["prompt_tokens"] for line in b"".join(writes).splitlines()] == [
        100 + i for i in range(200)]


def test_serve_writes_records_to_stdout_and_report_reads_them_from_stdin(qwen3_dir: Path, tmp_path: Path) -> None:
    config = tmp_path / "brimful.toml"
    config.write_text(f'[length_log]\npath = "-"\n\n[models."tiny-qwen"]\ntokenizer = "{qwen3_dir}"\n')
    port = free_port()
    with FakeVLLM(max_model_len=4096) as fake:
        proc = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config), "--upstream", fake.base_url,
             "--port", str(port)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        stdout: list[str] = []
        stderr: list[str] = []
        started = threading.Event()

        def drain_stderr() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                stderr.append(line)
                if "Application startup complete" in line:
                    started.set()
            started.set()

        def drain_stdout() -> None:
            assert proc.stdout is not None
            stdout.extend(proc.stdout)

        readers = [threading.Thread(target=drain_stderr), threading.Thread(target=drain_stdout)]
        for reader in readers:
            reader.start()
        try:
            assert started.wait(60) and wait_listening(port, proc), "".join(stderr)
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
                for max_tokens in (5, 7, 65535):
                    response = http.post("/v1/chat/completions", json={
                        "model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": max_tokens})
                    assert response.status_code == 200
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
            for reader in readers:
                reader.join(10)

    records = [json.loads(line) for line in stdout]        # nothing but records on stdout
    # docs/deployment.md's `grep '^{"ts":[0-9]'` keeps exactly the records, never a log line (plain or JSON)
    assert all(re.match(r'\{"ts":[0-9]', line) for line in stdout)
    assert not any(re.match(r'\{"ts":[0-9]', line) for line in stderr)
    json_log = JsonFormatter().format(logging.LogRecord("brimful", logging.INFO, "", 0, "x", None, None))
    assert not re.match(r'\{"ts":[0-9]', json_log)
    assert [r["requested_max_tokens"] for r in records] == [5, 7, 65535]
    assert [r["action"] for r in records] == ["pass", "pass", "clamped"]
    assert any("length log standard output" in line for line in stderr)
    assert any("Application startup complete" in line for line in stderr)   # the log went to stderr

    report = subprocess.run([sys.executable, "-m", "proxy.commands.report", "-"], input="".join(stdout),
                            capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert report.startswith("3 records from 1 file(s) (3 lines; 0 malformed and skipped")
    assert "model tiny-qwen: 3 requests" in report
