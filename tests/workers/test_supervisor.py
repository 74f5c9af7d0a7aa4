"""`brimful serve --workers 2`: one port, two processes, pages that add up, one scrape, a clean SIGTERM.

Each request below opens its own connection, so the kernel's SO_REUSEPORT hash
spreads them over both workers (the chance that 60 land on one is 2^-59);
/stats' "workers" section shows that both served.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from proxy.recording.metrics import DEFAULT_TOKEN_BUCKETS
from proxy.recording.stats import summarize
from tests.e2e.test_lifecycle import _assert_complete, _refuses_connections
from tests.recording.test_live_sizing import metrics_text
from tests.support.fakevllm import FakeVLLM, FaultSpec
from tests.support.process import BrimfulProcess, wait_until
from tests.support.servers import free_port
from tests.support.stack import CHAT, MODEL, fake_counter
from tokenizer_cache import load_model_tokenizer

pytestmark = pytest.mark.slow


def get(base_url: str, path: str) -> httpx.Response:
    """A GET on a connection of its own (so it may reach either worker)."""
    with httpx.Client(base_url=base_url, timeout=30) as http:
        return http.get(path)


def workers(base_url: str) -> list[dict[str, Any]]:
    return list(get(base_url, "/stats").json()["workers"])


def all_ready(base_url: str) -> bool:
    response = get(base_url, "/ready")
    return response.status_code == 200 and len(response.json()["workers"]) == 2


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples if not s.name.endswith("_created")}


def two_workers(upstream: str, tmp_path: Path, qwen3_dir: Path, extra_toml: str = "") -> BrimfulProcess:
    brimful = BrimfulProcess(upstream, tmp_path, qwen3_dir, extra_toml=extra_toml, extra_args=["--workers", "2"])
    assert wait_until(lambda: all_ready(brimful.base_url), timeout=60), "\n".join(brimful.lines[-30:])
    return brimful


def test_two_workers_serve_one_port_and_every_page_adds_up(qwen3_dir: Path, tmp_path: Path) -> None:
    log = tmp_path / "lengths.jsonl"
    toml = (f'[length_log]\npath = "{log}"\n\n[upstream_metrics]\nenabled = true\ninterval_s = 3600\n')
    with FakeVLLM(max_model_len=4096, count_prompt=fake_counter(load_model_tokenizer(qwen3_dir))) as fake:
        fake.metrics_text = metrics_text(0.25, 0, 1, 0)
        brimful = two_workers(fake.base_url, tmp_path, qwen3_dir, toml)
        try:
            prompts, ids, clamped = [], set(), 0
            for i in range(60):
                body = {"model": MODEL, "messages": [{"role": "user", "content": "word " * (i * 7 + 1)}],
                        "max_tokens": 65535 if i % 3 == 0 else 5}
                with httpx.Client(base_url=brimful.base_url, timeout=30) as http:
                    response = http.post(CHAT, json=body)
                assert response.status_code == 200, response.text
                prompts.append(int(response.headers["x-brimful-prompt-tokens"]))
                ids.add(response.headers["x-request-id"])
                clamped += response.headers["x-brimful-action"] == "clamped"
            assert wait_until(lambda: sum(w["records"] for w in workers(brimful.base_url)) == 60, timeout=10)
            stats = get(brimful.base_url, "/stats").json()
            pages = [get(brimful.base_url, "/metrics") for _ in range(8)]       # some through each worker
            assert wait_until(lambda: len(log.read_text().splitlines()) == 60, timeout=10)
            scrapes = [r for r in fake.requests if r.path == "/metrics"]
        finally:
            assert brimful.stop() == 0

    # Both workers served, and /stats says what one process serving everything would say.
    assert [w["index"] for w in stats["workers"]] == [0, 1]
    assert all(w["answered"] and w["records"] > 0 for w in stats["workers"]), stats["workers"]
    [model] = stats["models"]
    assert (model["count"], model["clamped"]) == (60, clamped)
    assert model["prompt_tokens"] == summarize(prompts)

    # /metrics: the same page from either worker, with exact sums and buckets.
    assert {p.status_code for p in pages} == {200}
    metrics = samples(pages[0].text)
    assert all(samples(p.text) == metrics for p in pages)
    assert sum(v for (name, _), v in metrics.items() if name == "brimful_requests_total") == 60
    hist = {dict(labels)["le"]: v for (name, labels), v in metrics.items() if name == "brimful_prompt_tokens_bucket"}
    assert hist == {**{floatToGoString(b): sum(p <= b for p in prompts) for b in DEFAULT_TOKEN_BUCKETS}, "+Inf": 60}
    assert metrics[("brimful_prompt_tokens_sum", (("model", MODEL),))] == sum(prompts)
    assert metrics[("brimful_length_records_total", (("outcome", "written"),))] == 60
    # The upstream's /metrics was scraped by the primary alone, and shown once.
    assert len(scrapes) == 1
    assert metrics[("brimful_upstream_metrics_up", (("upstream", "default"),))] == 1

    # One length log, whole lines from both workers.
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert {line["request_id"] for line in lines} == ids
    assert sorted(line["prompt_tokens"] for line in lines) == sorted(prompts)


def test_sigterm_drains_every_worker_and_exits_0(qwen3_dir: Path, tmp_path: Path) -> None:
    with FakeVLLM(tokens_per_second=10) as fake:
        brimful = two_workers(fake.base_url, tmp_path, qwen3_dir)
        pids = [w["pid"] for w in workers(brimful.base_url)]
        bodies: list[bytes] = []
        threads: list[threading.Thread] = []
        try:
            # Streams of 4 s, each on its own connection, until both workers hold one.
            while len(threads) < 20:
                first = threading.Event()

                def run(first: threading.Event = first) -> None:
                    body = {"model": MODEL, "messages": [{"role": "user", "content": "s"}], "max_tokens": 40,
                            "stream": True}
                    with httpx.Client(base_url=brimful.base_url, timeout=60) as http, \
                            http.stream("POST", CHAT, json=body) as response:
                        chunks = response.iter_raw()
                        data = next(chunks)
                        first.set()
                        bodies.append(data + b"".join(chunks))

                threads.append(threading.Thread(target=run))
                threads[-1].start()
                assert first.wait(30)
                if all(w["in_flight"] > 0 for w in workers(brimful.base_url)):
                    break
            assert all(w["in_flight"] > 0 for w in workers(brimful.base_url))
            brimful.proc.send_signal(signal.SIGTERM)
            assert wait_until(lambda: _refuses_connections(brimful.port), timeout=10), "still accepting"
            for t in threads:
                t.join(60)
            code = brimful.proc.wait(30)
        finally:
            brimful.stop(signal.SIGKILL)
    assert code == 0
    assert len(bodies) == len(threads)
    for body in bodies:
        _assert_complete(body, 40)
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"worker {pid} outlived the supervisor"


def chat(base_url: str, timeout: float = 30) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
    with httpx.Client(base_url=base_url, timeout=timeout) as http:
        assert http.post(CHAT, json=body).status_code == 200


def requests_total(base_url: str) -> float:
    page = get(base_url, "/metrics")
    assert page.status_code == 200, page.text        # on main: 503 while a worker is replaced
    return sum(v for (name, _), v in samples(page.text).items() if name == "brimful_requests_total")


def test_a_worker_that_dies_is_replaced_and_no_counter_goes_backwards(qwen3_dir: Path, tmp_path: Path) -> None:
    """The issue: after kill -9 of a worker, brimful_requests_total fell (11,641 -> 5,250)."""
    with FakeVLLM() as fake:
        brimful = two_workers(fake.base_url, tmp_path, qwen3_dir)
        try:
            for _ in range(30):
                chat(brimful.base_url)
            before = {w["index"]: w for w in workers(brimful.base_url)}
            assert before[0]["records"] > 0 and before[1]["records"] > 0      # both served some
            assert requests_total(brimful.base_url) == 30
            os.kill(before[1]["pid"], signal.SIGKILL)
            totals = []

            def replaced() -> bool:
                totals.append(requests_total(brimful.base_url))
                now = {w["index"]: w.get("pid") for w in workers(brimful.base_url)}
                return now[0] == before[0]["pid"] and now[1] not in (None, before[1]["pid"])

            assert wait_until(replaced, timeout=60)
            assert wait_until(lambda: all_ready(brimful.base_url), timeout=60)
            for _ in range(10):
                chat(brimful.base_url)
            after = requests_total(brimful.base_url)
            page = samples(get(brimful.base_url, "/metrics").text)
        finally:
            assert brimful.stop() == 0
    assert all(total >= 30 for total in totals), totals
    assert after == 40                       # the dead worker's 30-odd kept, the ten since added
    assert page[("brimful_worker_restarts_total", (("worker", "1"),))] == 1
    assert page[("brimful_worker_up", (("worker", "1"),))] == 1
    assert any("worker 1" in line and "starting a new one" in line for line in brimful.lines)


def test_chats_go_to_the_living_worker_while_a_replacement_loads(qwen3_dir: Path, tmp_path: Path) -> None:
    """The issue: chats queued up to 9.4 s on a dead worker's socket until its replacement was up.

    The replacement is held deterministically: its first GET /v1/models waits on a gate,
    so it cannot be ready; every chat meanwhile must be served by worker 0 (before: those
    hashed to slot 1 waited on the dead worker's socket, or on the replacement loading).
    """
    gate = threading.Event()
    with FakeVLLM() as fake:
        brimful = two_workers(fake.base_url, tmp_path, qwen3_dir)
        try:
            before = {w["index"]: w["pid"] for w in workers(brimful.base_url)}
            models = httpx.get(fake.base_url + "/v1/models").json()
            fake.fail_next.append(FaultSpec(kind="respond", status=200, body=models, path="/v1/models", gate=gate))
            os.kill(before[1], signal.SIGKILL)
            assert fake.wait_until(lambda f: not f.fail_next, timeout=60), "the replacement never asked"
            slowest = 0.0
            for _ in range(20):                      # each on a new connection: about half hash to slot 1
                started = time.perf_counter()
                chat(brimful.base_url, timeout=10)
                slowest = max(slowest, time.perf_counter() - started)
            assert not all_ready(brimful.base_url)   # the replacement was still held throughout
            gate.set()
            assert wait_until(lambda: all_ready(brimful.base_url), timeout=60)
            after = {w["index"]: w["pid"] for w in workers(brimful.base_url)}
        finally:
            gate.set()
            assert brimful.stop() == 0
    assert after[0] == before[0] and after[1] != before[1]
    assert slowest < 5.0, slowest                   # never the replacement's start-up (held indefinitely)



def test_the_pages_listener_is_served_by_every_worker_and_outlives_each(qwen3_dir: Path, tmp_path: Path) -> None:
    """server.metrics_port with --workers 2: the pages on their own port, for all workers, the API not there;
    after kill -9 of either worker the port still answers (the other accepts from the socket the supervisor
    holds), and after SIGTERM it refuses."""
    pages_port = free_port()
    with FakeVLLM() as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, extra_args=["--workers", "2"],
                                 extra_toml=f'[server]\napi_keys = ["sk-a"]\nmetrics_port = {pages_port}\n')
        api, pages = brimful.base_url, f"http://127.0.0.1:{pages_port}"
        key = {"authorization": "Bearer sk-a"}
        try:
            assert wait_until(lambda: all_ready(pages), timeout=60), "\n".join(brimful.lines[-30:])
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}
            for _ in range(20):
                with httpx.Client(base_url=api, headers=key, timeout=30) as http:
                    assert http.post(CHAT, json=body).status_code == 200
            documents = [get(pages, "/stats").json() for _ in range(6)]
            metrics = [get(pages, "/metrics") for _ in range(6)]
            on_api = [httpx.get(api + page, headers=key, timeout=10).status_code for page in ("/metrics", "/stats")]
            api_on_pages = get(pages, "/v1/models").status_code
            answered = []
            for victim in (1, 0):
                pid = _pid_of(pages, victim)
                assert pid is not None
                os.kill(pid, signal.SIGKILL)
                assert wait_until(lambda pid=pid: not _running(pid), timeout=10)
                answered += [get(pages, "/metrics").status_code for _ in range(10)]
                assert wait_until(lambda pid=pid, victim=victim: _pid_of(pages, victim) not in (None, pid)
                                  and all_ready(pages), timeout=60)
            # A 4 s stream keeps its worker draining after SIGTERM: the pages port must refuse meanwhile.
            fake.tokens_per_second = 10
            streamed: list[bytes] = []
            first = threading.Event()

            def stream() -> None:
                with httpx.Client(base_url=api, headers=key, timeout=60) as http, \
                        http.stream("POST", CHAT, json={**body, "max_tokens": 40, "stream": True}) as response:
                    chunks = response.iter_raw()
                    data = next(chunks)
                    first.set()
                    streamed.append(data + b"".join(chunks))

            streaming = threading.Thread(target=stream)
            streaming.start()
            assert first.wait(30)
            brimful.proc.send_signal(signal.SIGTERM)
            assert wait_until(lambda: _refuses_connections(pages_port), timeout=10), "the pages port still accepts"
            draining = streaming.is_alive()
            streaming.join(60)
            code = brimful.proc.wait(30)
        finally:
            brimful.stop(signal.SIGKILL)
    assert code == 0
    assert draining, "the stream ended before the pages port refused: nothing was draining"
    _assert_complete(streamed[0], 40)
    # Whichever worker took the connection: one document for both workers and all 20 chats.
    for document in documents:
        assert [(w["index"], w["answered"]) for w in document["workers"]] == [(0, True), (1, True)]
        assert sum(m["count"] for m in document["models"]) == 20
    assert {m.status_code for m in metrics} == {200}
    assert {sum(v for (name, _), v in samples(m.text).items() if name == "brimful_requests_total")
            for m in metrics} == {20}
    assert on_api == [404, 404] and api_on_pages == 404
    assert answered == [200] * 20, answered


def _pid_of(base_url: str, index: int) -> int | None:
    return next((w.get("pid") for w in get(base_url, "/stats").json()["workers"] if w["index"] == index), None)


def _running(pid: int) -> bool:
    """Not yet killed: a zombie (killed, not reaped) or a reaped pid counts as gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False
