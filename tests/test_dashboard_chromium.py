"""The dashboard in a real browser: headless Chromium renders /dashboard from a live /stats.

Needs Debian's `chromium` (apt-get install -y chromium).  Skipped when it is
not on PATH, unless HEADROOM_REQUIRE_CHROMIUM=1 (CI), which turns that into a
failure.  A screenshot is saved to HEADROOM_DASHBOARD_SCREENSHOT if set, else
into pytest's tmp dir; its path is printed (see it with `pytest -s` or `-rA`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from collections import defaultdict
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from proxy.pages import routes
from proxy.recorder import Recorder
from proxy.record import LengthRecord

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-proxy-server", "--hide-scrollbars",
    # virtual time runs the page's timers without waiting; network fetches pause it
    "--virtual-time-budget=4000",
]
METRICS = ("prompt_tokens", "completion_tokens", "total_tokens")


def find_chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    reason = "chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("HEADROOM_REQUIRE_CHROMIUM") == "1":
        pytest.fail(reason + " but HEADROOM_REQUIRE_CHROMIUM=1")
    pytest.skip(reason)


def known_records(now: float) -> list[LengthRecord]:
    """Model alpha: prompts 1..100 with 10 completion tokens (figures checkable by hand);
    model beta: a few long requests, one rejected."""
    out = [
        LengthRecord(
            ts=now, model="alpha", endpoint="chat", max_model_len=4096, prompt_tokens=i, completion_tokens=10,
            requested_max_tokens=5000 if i % 10 == 0 else 100, granted_max_tokens=4000 if i % 10 == 0 else 100,
            action="clamped" if i % 10 == 0 else "pass", finish_reasons=["length" if i % 5 == 0 else "stop"],
            status=200,
        )
        for i in range(1, 101)
    ]
    for p, c, endpoint in [(1500, 300, "completions"), (3000, 800, "responses"), (6000, 1900, "messages"),
                           (12000, 400, "completions")]:
        out.append(LengthRecord(ts=now, model="beta", endpoint=endpoint, max_model_len=32768,
                                prompt_tokens=p, completion_tokens=c, finish_reasons=["stop"], status=200))
    out.append(LengthRecord(ts=now, model="beta", endpoint="chat", max_model_len=32768, prompt_tokens=40000,
                            action="rejected", status=400, error_code="context_length_exceeded"))
    return out


@pytest.fixture
def dashboard_url() -> Iterator[str]:
    recorder = Recorder()
    for rec in known_records(time.time()):
        recorder.record(rec)
    app = Starlette(routes=routes(recorder))
    # Bind before the server thread starts: connections queue in the backlog
    # until uvicorn accepts them, so nothing has to wait for "server started".
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def run_chromium(chromium: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=90,
    )


class DashboardDom(HTMLParser):
    """Collects what the dashboard drew, per model section."""

    def __init__(self) -> None:
        super().__init__()
        self.rendered_at: str | None = None
        self.model: str | None = None
        self.svg_metric: str | None = None
        self.bars: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
        self.cells: dict[tuple[str, str, str], tuple[str, str]] = {}   # (model, metric, stat) → (data-value, text)
        self.facts: dict[tuple[str, str], tuple[str, str]] = {}        # (model, field) → (data-value, text)
        self._text_for: tuple[dict, tuple] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.rendered_at = a.get("data-generated-at")
        elif tag == "section" and "data-model" in a:
            self.model = a["data-model"]
        elif tag == "svg":
            self.svg_metric = a.get("data-metric")
        elif tag == "rect" and a.get("class") == "bar":
            self.bars[(self.model, self.svg_metric)].append((a["data-lo"], a["data-hi"], a["data-count"]))
        elif tag == "td" and "data-stat" in a:
            self._text_for = (self.cells, (self.model, a["data-metric"], a["data-stat"]), a["data-value"])
        elif tag == "dd" and "data-field" in a:
            self._text_for = (self.facts, (self.model, a["data-field"]), a["data-value"])

    def handle_data(self, data: str) -> None:
        if self._text_for is not None:
            target, key, value = self._text_for
            target[key] = (value, data)
            self._text_for = None


def test_dashboard_draws_the_stats_it_fetched(dashboard_url: str, tmp_path: Path) -> None:
    chromium = find_chromium()
    stats = httpx.get(dashboard_url + "/stats", trust_env=False).json()
    by_model = {m["model"]: m for m in stats["models"]}

    result = run_chromium(chromium, tmp_path / "profile", "--dump-dom", dashboard_url + "/dashboard")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = DashboardDom()
    dom.feed(result.stdout)
    assert dom.rendered_at, "the page never rendered /stats:\n" + result.stdout[-2000:]

    # Every histogram bar is a bin of /stats, in order, with its count.
    for model, m in by_model.items():
        for metric in METRICS:
            h = m[metric]["histogram"]
            his = [("" if e is None else str(e)) for e in h["edges"][1:]]
            expected = [(str(lo), hi, str(c)) for lo, hi, c in zip(h["edges"], his, h["counts"])]
            assert dom.bars[(model, metric)] == expected, (model, metric)

    # ...and for alpha the bins are the ones prompts 1..100 imply (counted by hand).
    assert [int(c) for _, _, c in dom.bars[("alpha", "prompt_tokens")]] == [1, 2, 4, 8, 8, 8, 16, 16, 32, 5]
    assert [int(c) for _, _, c in dom.bars[("alpha", "completion_tokens")]] == [100]
    assert sum(int(c) for _, _, c in dom.bars[("beta", "prompt_tokens")]) == 5

    # Percentiles of prompts 1..100 (numpy's linear method) and totals 11..110.
    expected_cells = {
        ("prompt_tokens", "count"): 100, ("prompt_tokens", "p50"): 50.5, ("prompt_tokens", "p90"): 90.1,
        ("prompt_tokens", "p95"): 95.05, ("prompt_tokens", "p99"): 99.01, ("prompt_tokens", "max"): 100,
        ("total_tokens", "p50"): 60.5, ("total_tokens", "p99"): 109.01, ("total_tokens", "max"): 110,
        ("completion_tokens", "p99"): 10,
    }
    for (metric, stat), want in expected_cells.items():
        value, text = dom.cells[("alpha", metric, stat)]
        assert float(value) == pytest.approx(want), (metric, stat)
        assert float(text) == pytest.approx(want, abs=0.051), (metric, stat, text)   # shown to 0.1

    assert dom.facts[("alpha", "recommended_max_model_len")] == ("112", "112")   # ceil(109.01/16)*16
    assert dom.facts[("alpha", "clamped")][1] == "10"
    assert dom.facts[("alpha", "finish_length_pct")][1] == "20 %"
    assert dom.facts[("beta", "rejected")][1] == "1"
    assert dom.facts[("alpha", "endpoints")][1] == "chat 100"
    assert dom.facts[("beta", "endpoints")][1] == "completions 2 · responses 1 · messages 1 · chat 1"
    assert dom.facts[("beta", "recommended_max_model_len")][1] == str(by_model["beta"]["recommended_max_model_len"])


def test_dashboard_screenshot(dashboard_url: str, tmp_path: Path) -> None:
    chromium = find_chromium()
    target = Path(os.environ.get("HEADROOM_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png").resolve()
    result = run_chromium(chromium, tmp_path / "profile", "--window-size=1280,1150",
                          f"--screenshot={target}", dashboard_url + "/dashboard")
    assert result.returncode == 0, result.stderr[-2000:]
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"dashboard screenshot: {target}")


def test_dashboard_of_a_running_proxy_shows_what_it_recorded(tmp_path: Path, qwen3_dir: Path) -> None:
    """Requests through headroom (to the fake vLLM), then headroom's own /dashboard in Chromium."""
    import numpy as np

    from proxy.app import HeadroomApp
    from proxy.config import Config, ModelConfig, UpstreamConfig
    from tests.support.fakevllm import FakeVLLM
    from tests.support.servers import serve_in_thread
    from tokenizer_cache import load_model_tokenizer

    chromium = find_chromium()
    tok = load_model_tokenizer(qwen3_dir)
    sent_prompts, sent_completions = [], []
    with FakeVLLM(count_prompt=lambda endpoint, body: tok.count_chat(body)) as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=10.0))
        config.models["tiny-qwen"] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(HeadroomApp(config)) as base, httpx.Client(base_url=base, timeout=10) as client:
            for i in range(1, 21):
                body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "word " * (i * 7)}],
                        "max_tokens": i * 3}
                assert client.post("/v1/chat/completions", json=body).status_code == 200
                sent_prompts.append(tok.count_chat(body))
                sent_completions.append(i * 3)
            result = run_chromium(chromium, tmp_path / "profile", "--dump-dom", base + "/dashboard")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = DashboardDom()
    dom.feed(result.stdout)
    assert dom.rendered_at, "the page never rendered /stats"
    for metric, values in (("prompt_tokens", sent_prompts), ("completion_tokens", sent_completions)):
        assert sum(int(c) for _, _, c in dom.bars[("tiny-qwen", metric)]) == 20
        for stat, q in (("p50", 50), ("p99", 99)):
            value, _ = dom.cells[("tiny-qwen", metric, stat)]
            assert float(value) == pytest.approx(float(np.percentile(values, q))), (metric, stat)
        assert float(dom.cells[("tiny-qwen", metric, "max")][0]) == max(values)
