"""The dashboard in a real browser: headless Chromium renders /dashboard from a live /stats.

Needs Debian's `chromium` (apt-get install -y chromium).  Skipped when it is
not on PATH, unless BRIMFUL_REQUIRE_CHROMIUM=1 (CI), which turns that into a
failure.  A screenshot is saved to BRIMFUL_DASHBOARD_SCREENSHOT if set, else
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
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette

from proxy.recording.record import LengthRecord
from proxy.recording.recorder import Recorder
from proxy.serving.pages import routes
from proxy.sizing import vllm_metrics as vm
from proxy.sizing.live import ModelSizing, UpstreamView

pytestmark = pytest.mark.slow

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--no-proxy-server", "--hide-scrollbars",
    # virtual time runs the page's timers without waiting; network fetches pause it
    "--virtual-time-budget=4000",
]
METRICS = ("prompt_tokens", "completion_tokens", "total_tokens", "demand_tokens")
TINY = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
        "hidden_size": 64, "torch_dtype": "bfloat16", "max_position_embeddings": 40960}   # 512 B per token
ALPHA_METRICS = (   # a pool of 400 blocks of 16 = 6,400 tokens, given as 6,400 × 512 B; pinned and queueing
    'vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",kv_cache_memory_bytes="3276800",'
    'num_gpu_blocks="400"} 1.0\n'
    'vllm:kv_cache_usage_perc{engine="0",model_name="alpha"} 0.95\n'
    'vllm:num_requests_waiting{engine="0",model_name="alpha"} 2\n'
    'vllm:num_requests_running{engine="0",model_name="alpha"} 3\n'
    'vllm:num_preemptions_total{engine="0",model_name="alpha"} 0\n')


def known_sizing(model: str) -> ModelSizing:
    """alpha: its config.json and two scrapes of its vLLM; beta: a config.json only (32,768 of context)."""
    if model == "alpha":
        metrics = vm.parse_vllm_metrics(ALPHA_METRICS)
        state, _ = vm.observe(vm.CapacityState(), metrics)
        state, signals = vm.observe(state, metrics)
        return ModelSizing(config=TINY, config_source="alpha/config.json",
                           upstream=UpstreamView("default", "http://vllm:8000", metrics, signals, scrapes=2))
    return ModelSizing(config={**TINY, "max_position_embeddings": 32768}, config_source="beta/config.json")


def find_chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    reason = "chromium is not installed (apt-get install -y chromium)"
    if os.environ.get("BRIMFUL_REQUIRE_CHROMIUM") == "1":
        pytest.fail(reason + " but BRIMFUL_REQUIRE_CHROMIUM=1")
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
    recorder.sizing = known_sizing
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
        self.bar_boxes: dict[tuple[str, str], list[tuple[float, float, tuple[str, str, str]]]] = {}
        self.cells: dict[tuple[str, str, str], tuple[str, str]] = {}   # (model, metric, stat) → (data-value, text)
        self.facts: dict[tuple[str, str], tuple[str, str]] = {}        # (model, field) → (data-value, text)
        self.notes: dict[tuple[str, str], tuple[str, str]] = {}        # (model, field) → ("", the fact's note)
        self.beyond_bars: dict[tuple[str, str], list[tuple[str, str, str]]] = defaultdict(list)
        self.markers: dict[tuple[str, str, str], dict[str, str]] = {}  # (model, metric, class) → attributes
        self.beyond_labels: dict[tuple[str, str], str] = {}            # (model, metric) → data-count
        self.reasons: dict[str, dict[str, str]] = defaultdict(dict)    # model → reason → data-count
        self.signals: dict[str, list[str]] = defaultdict(list)         # model → data-kind of each signal
        self.texts: dict[str, list[str]] = defaultdict(list)           # model → every text node, in order
        self._text_for: tuple[dict, tuple] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "body":
            self.rendered_at = a.get("data-generated-at")
        elif tag == "section" and "data-model" in a:
            self.model = a["data-model"]
        elif tag == "svg":
            self.svg_metric = a.get("data-metric")
        elif tag == "rect" and "bar" in a.get("class", "").split():
            bar = (a["data-lo"], a["data-hi"], a["data-count"])
            self.bars[(self.model, self.svg_metric)].append(bar)
            if "beyond" in a["class"].split():
                self.beyond_bars[(self.model, self.svg_metric)].append(bar)
            self.bar_boxes.setdefault((self.model, self.svg_metric), []).append(
                (float(a["x"]), float(a["width"]), bar))
        elif tag == "line" and "marker" in a.get("class", "").split():
            kind = next(c for c in a["class"].split() if c != "marker")
            self.markers[(self.model, self.svg_metric, kind)] = a
        elif tag == "text" and a.get("class") == "beyond-label":
            self.beyond_labels[(self.model, self.svg_metric)] = a["data-count"]
        elif tag == "span" and "data-reason" in a and a["data-reason"]:
            self.reasons[self.model][a["data-reason"]] = a["data-count"]
        elif tag == "li" and a.get("class") == "signal":
            self.signals[self.model].append(a["data-kind"])
        elif tag == "td" and "data-stat" in a:
            self._text_for = (self.cells, (self.model, a["data-metric"], a["data-stat"]), a["data-value"])
        elif tag == "dd" and "data-field" in a:
            self._text_for = (self.facts, (self.model, a["data-field"]), a["data-value"])
        elif tag == "small" and "data-note" in a:
            self._text_for = (self.notes, (self.model, a["data-note"]), "")

    def handle_data(self, data: str) -> None:
        if self.model is not None:
            self.texts[self.model].append(data)
        if self._text_for is not None:
            target, key, value = self._text_for
            target[key] = (value, data)
            self._text_for = None


def rendered(url: str, tmp_path: Path) -> tuple[dict[str, dict], DashboardDom]:
    """/stats per model, and what Chromium drew of /dashboard from it."""
    chromium = find_chromium()
    stats = httpx.get(url + "/stats", trust_env=False).json()
    result = run_chromium(chromium, tmp_path / "profile", "--dump-dom", url + "/dashboard")
    assert result.returncode == 0, result.stderr[-2000:]
    dom = DashboardDom()
    dom.feed(result.stdout)
    assert dom.rendered_at, "the page never rendered /stats:\n" + result.stdout[-2000:]
    return {m["model"]: m for m in stats["models"]}, dom


def test_dashboard_draws_the_stats_it_fetched(dashboard_url: str, tmp_path: Path) -> None:
    by_model, dom = rendered(dashboard_url, tmp_path)

    # Every histogram bar is a bin of /stats, in order, with its count.
    for model, m in by_model.items():
        for metric in METRICS:
            h = m[metric]["histogram"]
            his = [("" if e is None else str(e)) for e in h["edges"][1:]]
            expected = [(str(lo), hi, str(c)) for lo, hi, c in zip(h["edges"][:-1], his, h["counts"], strict=True)]
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

    # alpha's demand: 90 × (i + 100), ten clamped asks of i + 5,000 → p99 5,090.1 → 5,104 (above 4,096)
    assert dom.facts[("alpha", "recommended_max_model_len")] == ("5104", "5104")
    assert dom.notes[("alpha", "recommended_max_model_len")][1] == "from the demand"
    assert dom.facts[("alpha", "served_recommended_max_model_len")] == ("112", "112")   # ceil(109.01/16)*16
    assert dom.facts[("alpha", "clamped")][1] == "10"
    assert dom.facts[("alpha", "finish_length_pct")][1] == "20 %"
    assert dom.facts[("beta", "rejected")][1] == "1"
    assert dom.facts[("alpha", "endpoints")][1] == "chat 100"
    assert dom.facts[("beta", "endpoints")][1] == "completions 2 · responses 1 · messages 1 · chat 1"
    assert dom.facts[("beta", "recommended_max_model_len")][1] == str(by_model["beta"]["recommended_max_model_len"])


def test_dashboard_marks_the_limit_the_recommendation_and_demand_beyond_it(dashboard_url: str, tmp_path: Path) -> None:
    by_model, dom = rendered(dashboard_url, tmp_path)

    for model, m in by_model.items():
        limit, recommended = m["max_model_len"], m["recommended_max_model_len"]
        for metric in METRICS:
            # a marker at max_model_len and one at the recommendation on every histogram
            for kind, value in (("max-model-len", limit), ("recommendation", recommended)):
                marker = dom.markers[(model, metric, kind)]
                assert int(marker["data-value"]) == value, (model, metric, kind)
                edges = m[metric]["histogram"]["edges"]
                inside = edges[0] <= value and (edges[-1] is None or value < edges[-1])
                assert marker["data-clipped"] == ("" if inside else "above" if value >= edges[0] else "below")
                if inside:      # drawn over the bar whose bin holds the value
                    x = float(marker["x1"])
                    [(bx, bw, _)] = [b for b in dom.bar_boxes[(model, metric)]
                                     if int(b[2][0]) <= value and (b[2][1] == "" or value < int(b[2][1]))]
                    assert bx - 1 <= x <= bx + bw + 1, (model, metric, kind, x, bx, bw)
            # every bar that starts at or past max_model_len is flagged, and only those
            h = m[metric]["histogram"]
            flagged = [(str(lo), "" if hi is None else str(hi), str(c)) for lo, hi, c
                       in zip(h["edges"][:-1], h["edges"][1:], h["counts"], strict=True) if lo >= limit and c]
            assert dom.beyond_bars[(model, metric)] == flagged, (model, metric)
            assert dom.beyond_labels.get((model, metric)) == (str(sum(int(c) for *_, c in flagged)) if flagged
                                                              else None)

    # alpha: the ten 5,0xx-token demands are the [4096, 6144) bar, flagged; prompts stay far below the limit
    assert dom.beyond_bars[("alpha", "demand_tokens")] == [("4096", "6144", "10")]
    assert dom.markers[("alpha", "prompt_tokens", "max-model-len")]["data-clipped"] == "above"
    assert dom.facts[("alpha", "beyond")][0] == "10"
    assert dom.facts[("alpha", "clamped_shares")][1] == "10 % → 0 %"
    assert dom.facts[("alpha", "refused_shares")][1] == "0 % → 0 %"
    # beta: the refused 40,000-token prompt is demand too; the model's own context caps the recommendation
    beta = by_model["beta"]
    assert beta["recommendation"]["limited_by"] == "model_context"
    assert dom.facts[("beta", "recommended_max_model_len")][1] == "32768"
    assert dom.notes[("beta", "recommended_max_model_len")][1] == (
        f"capped: the model's own context (wanted {beta['recommendation']['wanted']})")
    assert dom.facts[("beta", "model_context")][1] == "32768"
    assert dom.reasons["beta"] == {"prompt_too_long": "1"}
    assert dom.beyond_bars[("beta", "demand_tokens")] == [("32768", "49152", "1")]
    assert dom.facts[("beta", "refused_shares")][1] == "20 % → 20 %"

    # alpha's running vLLM: its pool against the plan, the concurrency at p95 demand, the seed's signals
    up = by_model["alpha"]["upstream"]
    assert dom.facts[("alpha", "pool_actual")][0] == "6400" and dom.facts[("alpha", "pool_planned")][0] == "6400"
    assert dom.facts[("alpha", "pool_difference")][0] == "0"
    assert dom.facts[("alpha", "concurrency")][0] == str(up["pool"]["concurrency"])
    assert dom.facts[("alpha", "kv_usage")][1] == "95 %" and dom.facts[("alpha", "waiting")][1] == "2"
    assert dom.signals["alpha"] == ["kv_usage_pinned", "requests_waiting"]
    text = " ".join(dom.texts["alpha"])
    assert "→ time to add KV capacity (seed 000): try --kv-cache-dtype fp8 first" in text
    assert "vLLM was given exactly 3.12 MiB (3.28 MB) of KV cache" in text
    assert "upstream" not in by_model["beta"] or by_model["beta"]["upstream"] is None


def test_dashboard_screenshot(dashboard_url: str, tmp_path: Path) -> None:
    chromium = find_chromium()
    target = Path(os.environ.get("BRIMFUL_DASHBOARD_SCREENSHOT") or tmp_path / "dashboard.png").resolve()
    result = run_chromium(chromium, tmp_path / "profile", "--window-size=1280,1150",
                          f"--screenshot={target}", dashboard_url + "/dashboard")
    assert result.returncode == 0, result.stderr[-2000:]
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    print(f"dashboard screenshot: {target}")


def test_dashboard_of_a_running_proxy_shows_what_it_recorded(tmp_path: Path, qwen3_dir: Path) -> None:
    """Requests through brimful (to the fake vLLM), then brimful's own /dashboard in Chromium."""
    import numpy as np

    from proxy.app import BrimfulApp
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
        with serve_in_thread(BrimfulApp(config)) as base, httpx.Client(base_url=base, timeout=10) as client:
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
