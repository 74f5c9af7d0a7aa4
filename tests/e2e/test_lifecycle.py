"""Lifecycle of a `brimful serve` process: SIGTERM drains, start-up without an upstream.

SIGTERM must stop accepting new connections, let in-flight requests and
streams finish (up to the graceful-shutdown deadline), then exit with status 0
so a supervisor (systemd, Kubernetes) records a clean stop.
"""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.support.fakevllm import FakeVLLM
from tests.support.process import BrimfulProcess, wait_until
from tests.support.servers import free_port

pytestmark = pytest.mark.slow

CHAT = "/v1/chat/completions"


@pytest.fixture
def fake_paced() -> Iterator[FakeVLLM]:
    with FakeVLLM(tokens_per_second=10) as fake:
        yield fake


def _refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    except ConnectionRefusedError:
        return True
    return False


def _open_streams(
    base_url: str, count: int, max_tokens: int
) -> tuple[list[bytes], list[threading.Thread], threading.Barrier]:
    """Start `count` streams in threads; returns (bodies, threads, a barrier passed once all started)."""
    bodies: list[bytes] = [b""] * count
    started = threading.Barrier(count + 1, timeout=30)

    def run(i: int) -> None:
        with httpx.Client(base_url=base_url, timeout=60) as http:
            body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": f"s{i}"}],
                    "max_tokens": max_tokens, "stream": True}
            with http.stream("POST", CHAT, json=body) as response:
                chunks = response.iter_raw()
                data = next(chunks)
                started.wait()
                bodies[i] = data + b"".join(chunks)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    started.wait()
    return bodies, threads, started


def _assert_complete(body: bytes, max_tokens: int) -> None:
    events = [line[6:] for line in body.decode().split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    payloads = [json.loads(e) for e in events[:-1]]
    assert not any("error" in p for p in payloads), "the stream was cut by the shutdown"
    tokens = sum(1 for p in payloads for c in p["choices"] if c["delta"].get("content"))
    assert tokens == max_tokens


def test_sigterm_stops_accepting_and_lets_streams_finish(fake_paced: FakeVLLM, qwen3_dir: Path,
                                                        tmp_path: Path) -> None:
    brimful = BrimfulProcess(fake_paced.base_url, tmp_path, qwen3_dir)
    try:
        bodies, threads, _ = _open_streams(brimful.base_url, 3, max_tokens=20)   # ~2 s each
        brimful.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: _refuses_connections(brimful.port), timeout=10), "still accepting after SIGTERM"
        for t in threads:
            t.join(30)
        for body in bodies:
            _assert_complete(body, 20)
        brimful.proc.wait(30)
    finally:
        brimful.stop(signal.SIGKILL)


def test_sigterm_exits_with_status_0(fake_paced: FakeVLLM, qwen3_dir: Path, tmp_path: Path) -> None:
    brimful = BrimfulProcess(fake_paced.base_url, tmp_path, qwen3_dir)
    try:
        bodies, threads, _ = _open_streams(brimful.base_url, 2, max_tokens=10)
        brimful.proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        for body in bodies:
            _assert_complete(body, 10)
        assert brimful.proc.wait(30) == 0
    finally:
        brimful.stop(signal.SIGKILL)


def test_sigterm_deadline_cuts_streams_that_run_longer(fake_paced: FakeVLLM, qwen3_dir: Path,
                                                       tmp_path: Path) -> None:
    brimful = BrimfulProcess(fake_paced.base_url, tmp_path, qwen3_dir, extra_args=["--shutdown-timeout", "1"])
    result: dict[str, object] = {}
    started = threading.Event()

    def run() -> None:
        body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "long"}],
                "max_tokens": 300, "stream": True}                     # 30 s at 10 tokens/s
        try:
            with (
                httpx.Client(base_url=brimful.base_url, timeout=60) as http,
                http.stream("POST", CHAT, json=body) as response,
            ):
                chunks = response.iter_raw()
                first = next(chunks)
                started.set()
                result["data"] = first + b"".join(chunks)
        except httpx.HTTPError as exc:                                  # cut mid-chunk: a visible error
            result["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert started.wait(30)
        stream = [r for r in fake_paced.requests if r.path == CHAT][-1]
        signalled = time.monotonic()
        brimful.proc.send_signal(signal.SIGTERM)
        code = brimful.proc.wait(25)
        waited = time.monotonic() - signalled
        thread.join(30)
        print(f"\n[G] SIGTERM with a 30 s stream and a 1 s deadline: exited {code} after {waited:.1f} s")
        assert code == 0
        assert waited < 15, "the deadline did not cut the stream"
        data = result.get("data")
        assert "error" not in result, f"the stream should end cleanly with an error event: {result.get('error')}"
        events = [line[6:] for line in data.decode().split("\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "server_shutting_down", events[-3:]
        assert fake_paced.wait_until(lambda f: stream.disconnected_at is not None, timeout=10)
    finally:
        brimful.stop(signal.SIGKILL)
        thread.join(30)


def test_idle_sigterm_exits_promptly(fake_paced: FakeVLLM, qwen3_dir: Path, tmp_path: Path) -> None:
    brimful = BrimfulProcess(fake_paced.base_url, tmp_path, qwen3_dir)
    brimful.proc.send_signal(signal.SIGTERM)
    code = brimful.proc.wait(15)
    brimful.stop(signal.SIGKILL)
    assert code in (0, -signal.SIGTERM)
    assert not any("Traceback" in line for line in brimful.lines), "\n".join(brimful.lines[-20:])


def test_starts_without_upstream_and_serves_once_it_appears(qwen3_dir: Path, tmp_path: Path) -> None:
    port = free_port()
    brimful = BrimfulProcess(f"http://127.0.0.1:{port}", tmp_path, qwen3_dir)
    try:
        client = openai.OpenAI(base_url=brimful.base_url + "/v1", api_key="x", max_retries=0)
        with pytest.raises(openai.APIStatusError) as info:
            client.chat.completions.create(model="tiny-qwen", messages=[{"role": "user", "content": "hi"}],
                                           max_tokens=3)
        assert info.value.status_code in (502, 503)
        assert f"127.0.0.1:{port}" not in info.value.body["message"]     # internal: for the logs only
        with FakeVLLM() as fake:
            fake.ready = False
            fake.port = port
            fake.ready = True                       # vLLM finished loading, on the configured port
            completion = client.chat.completions.create(
                model="tiny-qwen", messages=[{"role": "user", "content": "hi"}], max_tokens=3)
            assert completion.usage.completion_tokens == 3
    finally:
        brimful.stop()


@pytest.mark.parametrize("path", [CHAT, "/tokenize"], ids=["admitted", "passthrough"])
def test_sigterm_deadline_answers_a_waiting_request_in_openai_shape(
        fake_paced: FakeVLLM, qwen3_dir: Path, tmp_path: Path, path: str) -> None:
    """A non-streamed request still waiting at the deadline: a 503 the openai client reads, and its record."""
    from tests.support.fakevllm import FaultSpec

    log = tmp_path / "lengths.jsonl"
    brimful = BrimfulProcess(fake_paced.base_url, tmp_path, qwen3_dir,
                               extra_args=["--shutdown-timeout", "1", "--length-log", str(log)])
    hold = threading.Event()
    fake_paced.fail_next.append(FaultSpec(kind="respond", status=200, gate=hold, path=path,
                                          body={"count": 1, "max_model_len": 2048, "tokens": [1]}))
    result: dict[str, object] = {}

    def run() -> None:
        client = openai.OpenAI(base_url=brimful.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
        try:
            if path == CHAT:
                client.chat.completions.create(model="tiny-qwen", messages=[{"role": "user", "content": "hi"}],
                                               max_tokens=5)
            else:
                client.post("/../tokenize", cast_to=object, body={"model": "tiny-qwen", "prompt": "hi"})
        except openai.APIStatusError as exc:
            result["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    try:
        assert fake_paced.wait_until(lambda f: any(r.path == path for r in f.requests), timeout=30)
        brimful.proc.send_signal(signal.SIGTERM)
        assert brimful.proc.wait(25) == 0
        thread.join(30)
    finally:
        hold.set()
        brimful.stop(signal.SIGKILL)
        thread.join(30)
    error = result.get("error")
    assert isinstance(error, openai.APIStatusError), f"expected a 503 in OpenAI shape, got {result}"
    assert error.status_code == 503
    assert error.body["code"] == "server_shutting_down"
    assert int(error.response.headers["retry-after"]) >= 1
    assert not any("Traceback" in line for line in brimful.lines), "\n".join(brimful.lines[-20:])
    if path == CHAT:
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert [(r["status"], r["error_code"]) for r in records] == [(503, "server_shutting_down")]


def test_brimful_pages_on_a_listener_of_their_own(fake_paced: FakeVLLM, qwen3_dir: Path, tmp_path: Path) -> None:
    """server.metrics_port: /metrics, /stats, /dashboard only there (open there unless metrics keys are set),
    and nothing the upstream serves on it; the API port keeps its keys."""
    metrics_port = free_port()
    brimful = BrimfulProcess(fake_paced.base_url, tmp_path, qwen3_dir,
                               extra_toml=f'[server]\napi_keys = ["sk-a"]\nmetrics_port = {metrics_port}\n')
    try:
        api, pages = brimful.base_url, f"http://127.0.0.1:{metrics_port}"
        key = {"authorization": "Bearer sk-a"}
        for page in ("/metrics", "/stats", "/dashboard"):
            assert httpx.get(pages + page, timeout=10).status_code == 200
            assert httpx.get(api + page, headers=key, timeout=10).status_code == 404
        assert httpx.get(pages + "/ready", timeout=10).json().get("upstreams") is not None   # the full document
        assert httpx.get(pages + "/v1/models", timeout=10).status_code == 404
        assert httpx.get(pages + "/health", timeout=10).status_code == 404
        assert httpx.get(api + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(api + "/v1/models", headers=key, timeout=10).status_code == 200
        assert any(f":{metrics_port}" in line for line in brimful.lines), "the summary names the pages' listener"
    finally:
        brimful.stop()



def burst_then_kill(brimful: BrimfulProcess, body: dict[str, Any]) -> int:
    """Ten bursts of 25 concurrent chats, then kill -9 at once: how many were answered 200."""
    import asyncio

    async def bursts() -> int:
        answered = 0
        async with httpx.AsyncClient(base_url=brimful.base_url, timeout=30) as http:
            for _ in range(10):
                results = await asyncio.gather(*(http.post(CHAT, json=body) for _ in range(25)))
                answered += sum(r.status_code == 200 for r in results)
            brimful.proc.send_signal(signal.SIGKILL)
        return answered

    try:
        answered = asyncio.run(bursts())
        brimful.proc.wait(10)
    finally:
        brimful.stop(signal.SIGKILL)
    return answered


@pytest.mark.parametrize("interval,bound", [(0.0, 5), (0.02, 25)])
def test_kill_9_loses_at_most_the_records_of_the_last_flush_interval(
        qwen3_dir: Path, tmp_path: Path, interval: float, bound: int) -> None:
    """The issue lost 18 of 250 answered requests' records (a 0.1 s round).  bench/lengthlog_bench.py has the
    figures; the bound here is loose (a busy machine delays the writer thread)."""

    log = tmp_path / "lengths.jsonl"
    body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    with FakeVLLM(record=False) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir,
                                   extra_toml=f"\n[length_log]\nflush_interval = {interval}",
                                   extra_args=["--length-log", str(log)])
        answered = burst_then_kill(brimful, body)
    lost = answered - len(log.read_text().splitlines())
    print(f"\n[G] kill -9 after {answered} answered, flush_interval {interval:g} s: {lost} records lost")
    assert answered == 250 and 0 <= lost <= bound


@pytest.mark.parametrize("interval,bound", [(0.0, 5), (0.02, 25)])
def test_kill_9_parquet_log_loses_at_most_the_records_of_the_last_flush_interval(
        qwen3_dir: Path, tmp_path: Path, interval: float, bound: int) -> None:
    """length_log.format = "parquet" under the same bursts: after kill -9 the window's journal holds what the JSON
    log would; the next start of the replica converts it, and DuckDB reads every kept record from the Parquet."""

    duckdb = pytest.importorskip("duckdb")
    pytest.importorskip("pyarrow")
    records = tmp_path / "lengths"
    body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    toml = (f'\n[length_log]\nformat = "parquet"\nreplica = "r1"\nflush_interval = {interval}\n'
            f'path = "{records}"\n')
    with FakeVLLM(record=False) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, extra_toml=toml)
        answered = burst_then_kill(brimful, body)
        assert not list(records.glob("*.parquet")) and len(list(records.glob("r1-*.open.jsonl"))) == 1
        restarted = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, extra_toml=toml)
        restarted.stop()
    files = str(records / "*.parquet")
    kept, distinct = duckdb.sql(f"SELECT count(*), count(DISTINCT request_id) FROM read_parquet('{files}') "
                                "WHERE status = 200 AND model = 'tiny-qwen'").fetchall()[0]
    lost = answered - kept
    print(f"\n[G] parquet: kill -9 after {answered} answered, flush_interval {interval:g} s: {lost} records lost")
    assert answered == 250 and kept == distinct and 0 <= lost <= bound
    assert not list(records.glob("*.open.jsonl"))
