"""proxy.workers.pages: with several workers, any of them answers /metrics, /stats, /ready and /live for all.

Two BrimfulApps in one event loop stand for two workers (each with its own
recorder and its own Unix socket); what a worker recorded is fed to its
recorder directly.  tests/workers/test_supervisor.py runs the real `--workers 2`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import BrimfulApp
from proxy.config import UpstreamMetricsConfig
from proxy.recording.metrics import Metrics
from proxy.serving import health
from proxy.workers.siblings import Siblings, SiblingUnavailable, WorkerSlot
from tests.support.fakevllm import FakeVLLM, FaultSpec
from tests.support.stack import call_app, make_config
from tests.workers.test_shard import records


@pytest.fixture
def fake() -> Iterator[FakeVLLM]:
    with FakeVLLM() as fake:
        yield fake


async def started(fake: FakeVLLM, directory: Path, count: int = 2, **config_kw) -> list[BrimfulApp]:
    apps = []
    for index in range(count):
        config = make_config(fake.base_url, None, **config_kw)
        config.upstream_metrics = UpstreamMetricsConfig(enabled=True, interval_s=3600)
        app = BrimfulApp(config, worker=WorkerSlot(index, count, directory))
        await app.startup()
        apps.append(app)
    return apps


async def stopped(apps: list[BrimfulApp]) -> None:
    for app in apps:
        await app.shutdown()


def metric_samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(body.decode()) for s in f.samples
            if not s.name.endswith("_created")}


async def test_every_worker_answers_for_all(fake: FakeVLLM, tmp_path: Path) -> None:
    apps = await started(fake, tmp_path)
    try:
        one = Metrics()
        for i, rec in enumerate(records(200, start=time.time() - 60)):
            apps[i % 2].recorder.record(rec)
            one.observe(rec)
        pages = {path: [await call_app(app, "GET", path) for app in apps]
                 for path in ("/stats", "/metrics", "/ready", "/live")}
    finally:
        await stopped(apps)
    stats = [json.loads(a.body) for a in pages["/stats"]]
    for document in stats:
        document.pop("generated_at")
    assert [a.status for a in pages["/stats"]] == [200, 200]
    assert stats[0] == stats[1]                                  # the second worker relayed to the primary
    assert sum(m["count"] for m in stats[0]["models"]) == 200
    assert [(w["index"], w["answered"], w["records"]) for w in stats[0]["workers"]] == [(0, True, 100),
                                                                                       (1, True, 100)]
    metrics = [metric_samples(a.body) for a in pages["/metrics"]]
    assert metrics[0] == metrics[1]
    expected = metric_samples(one.render()[0])
    assert {k: v for k, v in metrics[0].items() if k in expected} == expected
    ready = [json.loads(a.body) for a in pages["/ready"]]
    assert [w["index"] for w in ready[0]["workers"]] == [0, 1] and ready[0]["missing"] == ready[1]["missing"]
    assert [json.loads(a.body)["workers"] for a in pages["/live"]] == [
        [{"index": 0, "live": True}, {"index": 1, "live": True}]] * 2


async def test_only_the_primary_scrapes_the_upstream(fake: FakeVLLM, tmp_path: Path) -> None:
    apps = await started(fake, tmp_path)
    await stopped(apps)
    assert [list(app.sizing.scrapers) for app in apps] == [["default"], []]


async def test_a_sibling_that_does_not_answer(fake: FakeVLLM, tmp_path: Path) -> None:
    apps = await started(fake, tmp_path)
    try:
        apps[0].recorder.record(records(1, start=time.time())[0])
        apps[1].recorder.record(records(1, start=time.time())[0])
        assert (await call_app(apps[0], "GET", "/metrics")).status == 200     # worker 1's counters seen
        await apps[1].workers.siblings.stop()                   # worker 1 gone (crashed, restarting)
        metrics = await call_app(apps[0], "GET", "/metrics")
        stats = json.loads((await call_app(apps[0], "GET", "/stats")).body)
        live = await call_app(apps[0], "GET", "/live")
        ready = json.loads((await call_app(apps[0], "GET", "/ready")).body)
        await apps[1].workers.siblings.start()
        await apps[0].workers.siblings.stop()                   # the primary gone: worker 1 cannot relay
        relayed = await call_app(apps[1], "GET", "/stats")
        by_sibling = await call_app(apps[1], "GET", "/metrics")  # answered by worker 1 itself
    finally:
        await stopped(apps)
    # Served by the primary alone, with worker 1 at its last-seen counters, and said so.
    assert metrics.status == 200
    page = metric_samples(metrics.body)
    assert sum(v for (name, _), v in page.items() if name == "brimful_requests_total") == 2
    assert page[("brimful_worker_up", (("worker", "0"),))] == 1
    assert page[("brimful_worker_up", (("worker", "1"),))] == 0
    assert [(w["index"], w["answered"]) for w in stats["workers"]] == [(0, True), (1, False)]
    assert stats["models"][0]["count"] == 1      # the recent window: only what answers
    assert live.status == 503
    assert ready["ready"] is False and any("worker 1 did not answer" in m for m in ready["missing"])
    assert relayed.status == 200                                  # answered by worker 1 from who answers
    by_worker_1 = json.loads(relayed.body)
    assert [(w["index"], w["answered"]) for w in by_worker_1["workers"]] == [(0, False), (1, True)]
    assert by_worker_1["workers"][0]["error"]                     # why it did not answer
    assert by_worker_1["models"][0]["count"] == 1                 # worker 1's own record
    assert by_sibling.status == 200
    page = metric_samples(by_sibling.body)
    assert sum(v for (name, _), v in page.items() if name == "brimful_requests_total") == 2   # worker 0's kept
    assert page[("brimful_worker_up", (("worker", "0"),))] == 0
    assert page[("brimful_worker_up", (("worker", "1"),))] == 1


async def test_siblings_ask_and_answer(tmp_path: Path) -> None:
    async def echo(question: dict) -> dict:
        if question.get("boom"):
            raise RuntimeError("no")
        return {"seen": question}

    first = Siblings(WorkerSlot(0, 3, tmp_path), echo)
    second = Siblings(WorkerSlot(1, 3, tmp_path), echo)
    await first.start()
    await second.start()
    try:
        assert await first.ask(1, {"op": "x"}, 5) == {"seen": {"op": "x"}}
        answers = await first.ask_others({"op": "y"}, 5)
        with pytest.raises(SiblingUnavailable, match="worker 1 did not answer: RuntimeError: no"):
            await first.ask(1, {"boom": True}, 5)
    finally:
        await first.stop()
        await second.stop()
    assert answers[1] == {"seen": {"op": "y"}}
    assert isinstance(answers[2], SiblingUnavailable)            # worker 2 never started


async def test_a_replacement_starts_once_ready_or_once_asked_to_stop(tmp_path: Path) -> None:
    """A replacement's start-up (then its server listens) waits for its upstream's models; SIGTERM ends the wait."""
    gate = threading.Event()
    with FakeVLLM() as fake:
        models = httpx.get(fake.base_url + "/v1/models").json()
        app = BrimfulApp(make_config(fake.base_url, None), worker=WorkerSlot(1, 2, tmp_path, replacement=True))
        try:
            for stop in (True, False):
                fake.fail_next.append(FaultSpec(kind="respond", status=200, body=models, path="/v1/models",
                                                gate=gate))
                starting = asyncio.ensure_future(app.startup())
                assert await fake.wait_until_async(lambda f: not f.fail_next), "no GET /v1/models"
                await asyncio.sleep(0)
                assert not starting.done()                       # held: its models are not known
                if stop:
                    app.stop_requested = lambda: True
                    await asyncio.wait_for(starting, 2)
                    await app.shutdown()
                    app = BrimfulApp(make_config(fake.base_url, None),
                                     worker=WorkerSlot(1, 2, tmp_path, replacement=True))
                else:
                    gate.set()
                    await asyncio.wait_for(starting, 10)         # ready: its models and tokenizer loaded
                    ready, _ = health.readiness(health.upstream_states(app.backends), app.counter.counted_by)
                    assert ready
        finally:
            gate.set()
            await app.shutdown()
