"""The wired scrape of the upstream's /metrics ([upstream_metrics], proxy.recording.live_sizing): a fake vLLM with known
values, then the real vLLM 0.32, seen through /stats and brimful's own /metrics."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from proxy.app import BrimfulApp
from proxy.config import Config, UpstreamConfig, UpstreamMetricsConfig, load_config
from proxy.sizing import capacity as cap
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread
from tests.support.stack import CHAT, MODEL, call_app, fake_counter, make_config

QWEN3_8B = cap.PRESETS["Qwen3-8B"].config          # 147,456 B per token, max_position_embeddings 40,960
BLOCKS = 250                                         # 250 blocks of 16 = 4,000 tokens
GIVEN = BLOCKS * 16 * 147_456                        # exactly that pool, as --kv-cache-memory-bytes


def metrics_text(usage: float, waiting: int, running: int, preemptions: int, blocks: int = BLOCKS) -> str:
    """vLLM 0.32's families with known values (names and labels as in tests/data/vllm032_cpu)."""
    info = (f'block_size="16",cache_dtype="auto",engine="0",gpu_memory_utilization="0.92",'
            f'kv_cache_memory_bytes="{GIVEN}",num_gpu_blocks="{blocks}"')
    labels = f'engine="0",model_name="{MODEL}"'
    return (f"# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{{{info}}} 1.0\n"
            f"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{{{labels}}} {usage}\n"
            f"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{{{labels}}} {waiting}\n"
            f"# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{{{labels}}} {running}\n"
            f"# TYPE vllm:num_preemptions_total counter\nvllm:num_preemptions_total{{{labels}}} {preemptions}\n")


@pytest.fixture
def model_dir(tmp_path: Path, qwen3_dir: Path) -> Path:
    """The Qwen3 tokenizer with Qwen3-8B's config.json beside it, as in a model's snapshot."""
    directory = tmp_path / "Qwen3-8B"
    directory.mkdir()
    for file in qwen3_dir.iterdir():
        (directory / file.name).symlink_to(file)
    (directory / "config.json").write_text(json.dumps(QWEN3_8B))
    return directory


def scraping(config: Config, **kw: Any) -> Config:
    # a long interval: the test drives every scrape after the first itself
    config.upstream_metrics = UpstreamMetricsConfig(enabled=True, interval_s=3600, **kw)
    return config


def gauge(text: str, name: str, **labels: str) -> float | None:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_fake_with_known_values_through_stats_and_metrics(qwen3: Any, model_dir: Path) -> None:
    async with FakeVLLM(max_model_len=2048, count_prompt=fake_counter(qwen3)) as fake:
        fake.metrics_text = metrics_text(0.25, 0, 1, 0)
        app = BrimfulApp(scraping(make_config(fake.base_url, model_dir), max_num_seqs=4))
        scraper = app.sizing.scrapers["default"]
        first = asyncio.Event()            # the scrape the app starts with (the callback runs on this loop)
        scraper.on_scrape.append(lambda s: first.set())
        await app.startup()
        try:
            # traffic with a known demand: 6 fit, 3 prompts too long for 2,048, 3 ask 4,000 after ~1,000
            sent: list[tuple[int, int]] = []
            for words, asked in [(50, 100)] * 6 + [(2600, 100)] * 3 + [(1000, 4000)] * 3:
                body = {"model": MODEL, "messages": [{"role": "user", "content": "hello " * words}],
                        "max_tokens": asked}
                answer = await call_app(app, "POST", CHAT, json.dumps(body).encode())
                assert answer.status in (200, 400)
                sent.append((qwen3.count_chat(body), asked))
            await asyncio.wait_for(first.wait(), 10)
            # then two scrapes under pressure: usage pinned, requests waiting with max_num_seqs running
            fake.metrics_text = metrics_text(0.95, 3, 4, 0)
            assert await scraper.scrape_once() and await scraper.scrape_once()
            stats = json.loads((await call_app(app, "GET", "/stats")).body)
            metrics = (await call_app(app, "GET", "/metrics")).body.decode()
            fake.metrics_text = metrics_text(0.5, 0, 2, 5)
            assert await scraper.scrape_once()
            rising = json.loads((await call_app(app, "GET", "/stats")).body)["models"][0]["upstream"]
            fake.metrics_text = None
            assert not await scraper.scrape_once()
            failed = json.loads((await call_app(app, "GET", "/stats")).body)["models"][0]["upstream"]
            down = (await call_app(app, "GET", "/metrics")).body.decode()
        finally:
            await app.shutdown()

    [m] = stats["models"]
    demanded = [p + asked for p, asked in sent]
    assert m["demand_tokens"]["count"] == 12
    for q in (50, 90, 95, 99):
        assert m["demand_tokens"][f"p{q}"] == pytest.approx(float(np.percentile(demanded, q)))
    assert m["rejections"] == {"prompt_too_long": 3}
    assert m["model_context"] == {"max_model_len": 40960, "key": "max_position_embeddings",
                                  "source": str(model_dir / "config.json")}
    rec = m["recommendation"]
    # p99 of demand ≈ 5,000 tokens, but the pool holds 4,000: the recommendation stops there
    assert rec["wanted"] == math.ceil(np.percentile(demanded, 99) / 16) * 16 > 4000
    assert (rec["max_model_len"], rec["limited_by"], rec["kv_bound"]) == (4000, "kv_cache", 4000)
    assert (rec["current"]["refused"], rec["current"]["clamped"]) == (3, 3)
    assert (rec["recommended"]["refused"], rec["recommended"]["clamped"]) == (0, 3)

    up = m["upstream"]
    pool = up["pool"]
    assert (pool["actual_tokens"], pool["planned_tokens"], pool["difference_tokens"]) == (4000, 4000, 0)
    assert pool["bytes_per_token"] == 147_456
    kv_p95 = math.ceil(np.percentile(demanded, 95))
    assert pool["demand_kv_tokens"] == m["demand_kv_p95"] == kv_p95
    assert pool["concurrency"] == (BLOCKS - 1) * 16 // (math.ceil(kv_p95 / 16) * 16)
    assert (up["scrapes"], up["kv_cache_usage"], up["waiting"], up["running"]) == (3, 0.95, 3, 4)
    assert [s["kind"] for s in up["signals"]] == ["kv_usage_pinned", "requests_waiting"]
    assert up["signals"][1]["action"].startswith("requests queue because max_num_seqs sequences already run")

    assert gauge(metrics, "brimful_upstream_kv_cache_tokens", model=MODEL, upstream="default") == 4000
    assert gauge(metrics, "brimful_planned_kv_cache_tokens", model=MODEL, upstream="default") == 4000
    concurrency = gauge(metrics, "brimful_upstream_concurrency_at_p95_demand", model=MODEL, upstream="default")
    assert concurrency == pool["concurrency"]
    assert gauge(metrics, "brimful_capacity_signal", model=MODEL, signal="kv_usage_pinned", upstream="default") == 1
    assert gauge(metrics, "brimful_capacity_signal", model=MODEL, signal="requests_waiting", upstream="default") == 1
    assert gauge(metrics, "brimful_capacity_signal", model=MODEL, signal="preemptions_rising", upstream="default") == 0
    assert gauge(metrics, "brimful_upstream_metrics_up", upstream="default") == 1

    assert [s["detail"] for s in rising["signals"]] == ["5 preemptions since the last scrape (5 in all)"]
    # a failed scrape keeps the last pool and says why
    assert failed["last_error"] == "ValueError: HTTP 404 from /metrics" and failed["failures"] == 1
    assert failed["pool"]["actual_tokens"] == 4000
    assert gauge(down, "brimful_upstream_metrics_up", upstream="default") == 0


async def test_off_by_default_no_scrape(qwen3: Any, model_dir: Path) -> None:
    async with FakeVLLM(count_prompt=fake_counter(qwen3)) as fake:
        fake.metrics_text = metrics_text(0.5, 0, 0, 0)
        app = BrimfulApp(make_config(fake.base_url, model_dir))
        await app.startup()
        try:
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            assert (await call_app(app, "POST", CHAT, json.dumps(body).encode())).status == 200
            [m] = json.loads((await call_app(app, "GET", "/stats")).body)["models"]
            metrics = (await call_app(app, "GET", "/metrics")).body.decode()
        finally:
            await app.shutdown()
    assert app.sizing.scrapers == {} and m["upstream"] is None
    assert "brimful_upstream_kv_cache_tokens" not in metrics and "brimful_capacity_signal" not in metrics
    assert not any(r.path == "/metrics" for r in fake.requests)
    assert m["model_context"]["max_model_len"] == 40960       # config.json is read all the same


def test_config_section_validates() -> None:
    assert load_config(env={"BRIMFUL_UPSTREAM_METRICS_ENABLED": "1",
                            "BRIMFUL_UPSTREAM_METRICS_MAX_NUM_SEQS": "256"}).upstream_metrics == UpstreamMetricsConfig(
        enabled=True, max_num_seqs=256)
    for env, message in [
        ({"BRIMFUL_UPSTREAM_METRICS_PATH": "metrics"}, "'upstream_metrics.path' must start with /"),
        ({"BRIMFUL_UPSTREAM_METRICS_INTERVAL_S": "0"}, "'upstream_metrics.interval_s' must be above 0"),
        ({"BRIMFUL_UPSTREAM_METRICS_KV_USAGE_PINNED": "1.5"}, "'upstream_metrics.kv_usage_pinned' must be in"),
        ({"BRIMFUL_UPSTREAM_METRICS_PINNED_SCRAPES": "0"}, "'upstream_metrics.pinned_scrapes'"),
    ]:
        with pytest.raises(ValueError, match=message):
            load_config(env=env)


# --- the real vLLM 0.32 ----------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.realvllm
def test_real_vllm_metrics_through_the_wired_scrape(real_vllm: Any) -> None:
    """brimful in front of the real server, scraping it: /stats and /metrics show its real pool.

    The fixture's vLLM runs with --kv-cache-memory-bytes 64 MiB, block size 128 (the CPU default) and the
    tiny model's config.json (2 layers × 2 KV heads × head_dim 32 × 2 B = 512 B per token): 131,072 tokens.
    brimful finds that config.json beside the tokenizer, in the model root vLLM reports.
    """
    config = scraping(Config(upstream=UpstreamConfig(url=real_vllm.base_url, timeout=120.0)))
    app = BrimfulApp(config)
    scraped = threading.Semaphore(0)
    app.sizing.scrapers["default"].on_scrape.append(lambda s: scraped.release())
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=120) as client:
        assert scraped.acquire(timeout=60), "the first scrape never finished"
        for words in (10, 200, 400):
            response = client.post("/v1/completions", json={"model": real_vllm.model, "prompt": "hello " * words,
                                                             "max_tokens": 4})
            assert response.status_code == 200
        stats = client.get("/stats").json()
        metrics = client.get("/metrics").text
    [m] = [m for m in stats["models"] if m["model"] == real_vllm.model]
    up = m["upstream"]
    assert up["last_error"] is None and up["scrapes"] >= 1
    pool = up["pool"]
    assert (pool["num_gpu_blocks"], pool["block_size"], pool["actual_tokens"]) == (1024, 128, 131_072)
    assert pool["kv_cache_memory_bytes"] == 64 * cap.MIB and pool["bytes_per_token"] == 512
    assert (pool["planned_tokens"], pool["difference_tokens"]) == (131_072, 0)
    assert pool["vllm_max_concurrency"] == 64.0
    kv_p95 = m["demand_kv_p95"]
    assert kv_p95 is not None and pool["concurrency"] == 1023 * 128 // (math.ceil(kv_p95 / 128) * 128)
    assert up["kv_cache_usage"] == 0.0 and up["waiting"] == 0 and up["signals"] == []
    assert m["model_context"]["key"] == "max_position_embeddings"
    assert gauge(metrics, "brimful_upstream_kv_cache_tokens", model=real_vllm.model, upstream="default") == 131_072
    assert gauge(metrics, "brimful_planned_kv_cache_tokens", model=real_vllm.model, upstream="default") == 131_072
    assert gauge(metrics, "brimful_upstream_metrics_up", upstream="default") == 1


# --- brimful report --upstream URL: one read ------------------------------------------------------------

def write_records(path: Path, demands: list[tuple[int, int]]) -> None:
    from proxy.recording.record import LengthRecord

    with path.open("w") as f:
        for i, (prompt, asked) in enumerate(demands):
            rec = LengthRecord(ts=1.7e9 + i, model=MODEL, endpoint="chat", max_model_len=2048, prompt_tokens=prompt,
                               requested_max_tokens=asked, status=200,
                               completion_tokens=min(asked, 2048 - prompt) if prompt < 2048 else None)
            f.write(json.dumps(rec.to_dict()) + "\n")


def test_report_upstream_one_read(tmp_path: Path, capsys: Any) -> None:
    from proxy.commands import report as report_cli
    demands = [(1000, 500)] * 8 + [(1500, 3000)] * 2        # demanded KV tokens: 1,500 × 8, 4,500 × 2
    write_records(tmp_path / "lengths.jsonl", demands)
    with FakeVLLM(max_model_len=2048) as fake:
        fake.metrics_text = metrics_text(0.95, 2, 3, 7)
        argv = [str(tmp_path / "lengths.jsonl"), "--upstream", fake.base_url, "--preset", "Qwen3-8B",
                "--max-num-seqs", "3"]
        assert report_cli.main([*argv, "--format", "json"]) == 0
        result = json.loads(capsys.readouterr().out)
        assert report_cli.main(argv) == 0
        text = capsys.readouterr().out
        fake.metrics_text = None
        assert report_cli.main(argv) == 2
        assert f"cannot read {fake.base_url}/metrics: HTTP Error 404" in capsys.readouterr().err
    [m] = result["models"]
    # p99 of the asks is 4,500 → 4,512 in blocks, capped by the vLLM's pool of 4,000 tokens
    assert (m["asked_recommendation"]["wanted"], m["asked_recommendation"]["max_model_len"]) == (4512, 4000)
    # the need: eight exact 1,500s; the two 3,000-token asks were cut at the window (2,048) with no finish reason
    # recorded, so the estimate ends there: 2,048 or more, at most 4,500
    need = m["recommendation"]["need"]
    assert (need["value"], need["beyond_data"], need["low"], need["high"]) == (2048, True, 2048, 4500)
    assert m["kv_bound_source"] == f"the KV pool of {fake.base_url}"
    [up] = result["upstreams"]
    assert up["metrics_url"] == fake.base_url + "/metrics" and up["engines"] == 1
    [um] = up["models"]
    pool = um["pool"]
    assert (pool["actual_tokens"], pool["planned_tokens"], pool["difference_tokens"]) == (4000, 4000, 0)
    kv_p95 = math.ceil(np.percentile([p + a for p, a in demands], 95))      # 4,500
    assert pool["demand_kv_tokens"] == kv_p95 and pool["concurrency"] == 249 * 16 // (math.ceil(kv_p95 / 16) * 16)
    assert [s["kind"] for s in um["signals"]] == ["kv_usage_pinned", "preemptions_rising", "requests_waiting"]
    assert um["signals"][2]["action"].startswith("requests queue because max_num_seqs sequences already run")
    assert f"upstream {fake.base_url} (one read of {fake.base_url}/metrics)" in text
    assert "  KV pool: 250 blocks of 16 = 4,000 tokens (engine 0 of 1, KV cache auto)" in text
    assert ("  planned: 4,000 tokens (--kv-cache-memory-bytes 589,824,000 ÷ 147,456 B per token from config.json, KV "
            "cache auto); difference 0 tokens, actual ÷ planned = 1.000") in text
    assert (f"    concurrency at the p95 demand of 4,500 KV tokens: {pool['concurrency']:,} at once at full length "
            "(249 usable blocks of 16, 282 per request)") in text
    assert "    SIGNAL kv_usage_pinned: KV cache 95.0 % used now (threshold 90 %)" in text
    assert "    SIGNAL preemptions_rising: 7 preemptions since vLLM started" in text
    assert "      → time to add KV capacity (seed 000): try --kv-cache-dtype fp8 first" in text


def test_report_upstream_with_the_gpu_explains_the_difference(tmp_path: Path, capsys: Any) -> None:
    """vLLM sized from gpu_memory_utilization: the full plan, and the activations it measured."""
    from proxy.commands import report as report_cli
    bpt = 147_456
    plan = cap.make_plan(cap.PlanInputs(bytes_per_token=bpt, gpu_memory_bytes=80 * cap.GIB,
                                        weights_bytes=cap.PRESETS["Qwen3-8B"].params * 2))
    six = cap.kv_memory(80 * cap.GIB, 0.92, plan.inputs.weights_bytes, 6 * cap.GIB).kv_memory_bytes // (bpt * 16)
    text = metrics_text(0.1, 0, 1, 0, blocks=six).replace(f'kv_cache_memory_bytes="{GIVEN}"',
                                                          'kv_cache_memory_bytes="None"')
    with FakeVLLM() as fake:
        fake.metrics_text = text
        assert report_cli.main(["--upstream", fake.base_url, "--preset", "Qwen3-8B", "--gpu", "H100-80GB",
                                "--format", "json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["models"] == []
    pool = result["upstreams"][0]["pool"]
    assert (pool["actual_tokens"], pool["planned_tokens"]) == (six * 16, 395_712)
    assert pool["plan_basis"].startswith("plan for Qwen3-8B (preset) on H100-80GB: utilization 0.92")
    assert pool["explanation"][0].startswith("non-KV memory as measured: 6.00 GiB")
    assert result["upstreams"][0]["models"][0]["pool"]["concurrency"] is None      # no records given


async def test_pools_of_one_model_give_each_upstream_its_own_series(model_dir: Path) -> None:
    """Two vLLMs serving the model at two windows (pools): each pool's KV cache and signals are its own."""
    from proxy.config import UpstreamEntry
    from tests.support.stack import ListRecorder, started_up
    from tests.support.transport import MockResponse, MockTransport, SentRequest

    def vllm(window: int, blocks: int, waiting: int) -> MockTransport:
        def handle(sent: SentRequest) -> MockResponse:
            if sent.path == "/v1/models":
                return MockResponse.json({"object": "list", "data": [
                    {"id": MODEL, "object": "model", "max_model_len": window}]})
            if sent.path == "/metrics":
                text = metrics_text(0.5, waiting, 1, 0, blocks=blocks)
                return MockResponse(200, [("content-type", "text/plain")], [text.encode()])
            return MockResponse.json({"detail": "Not Found"}, status=404)
        return MockTransport(handle)

    short, long = vllm(2048, 250, 0), vllm(8192, 500, 3)
    config = scraping(make_config("http://short.test", model_dir))
    config.upstreams.append(UpstreamEntry(name="long", url="http://long.test"))
    app = BrimfulApp(config, ListRecorder(), transport_for=lambda url: long if "long" in url else short)
    await started_up(app)
    for _ in range(3):                  # a signal holds over scrapes
        for scraper in app.sizing.scrapers.values():
            assert await scraper.scrape_once()
    text = app.recorder.metrics.render()[0].decode()

    kv = [line for line in text.splitlines() if line.startswith("brimful_upstream_kv_cache_tokens{")]
    assert sorted(kv) == [f'brimful_upstream_kv_cache_tokens{{model="{MODEL}",upstream="default"}} 4000.0',
                          f'brimful_upstream_kv_cache_tokens{{model="{MODEL}",upstream="long"}} 8000.0']
    assert gauge(text, "brimful_capacity_signal", model=MODEL, signal="requests_waiting", upstream="long") == 1
    assert gauge(text, "brimful_capacity_signal", model=MODEL, signal="requests_waiting", upstream="default") == 0
