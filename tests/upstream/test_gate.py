"""proxy.upstream.gate: the in-flight and queued counts, and their gauges on /metrics."""

from __future__ import annotations

import asyncio
import collections
import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from proxy.app import BrimfulApp, make_recorder
from proxy.config import Config, ModelConfig, UpstreamConfig
from proxy.errors import BrimfulError
from proxy.recording.record import LengthRecord
from proxy.recording.recorder import Recorder
from proxy.upstream.gate import CountingBudget, UpstreamGate
from tests.support.fakevllm import FakeVLLM
from tests.support.servers import serve_in_thread


async def test_uncapped_gate_counts_in_flight() -> None:
    gate = UpstreamGate("http://vllm:8000", 0, 1.0)
    await gate.acquire()
    await gate.acquire()
    assert (gate.in_flight, gate.waiting) == (2, 0)
    gate.release()
    gate.release()
    assert (gate.in_flight, gate.waiting) == (0, 0)


async def test_capped_gate_counts_the_queue_and_the_timeouts() -> None:
    gate = UpstreamGate("http://vllm:8000", 1, 30.0)
    await gate.acquire()
    second = asyncio.ensure_future(gate.acquire())
    while gate.waiting == 0:             # let the second request reach the queue
        await asyncio.sleep(0)
    assert (gate.in_flight, gate.waiting) == (1, 1)
    gate.release()
    await second
    assert (gate.in_flight, gate.waiting) == (1, 0)

    gate.queue_timeout = 0.01
    with pytest.raises(BrimfulError):
        await gate.acquire()             # times out in the queue: never in flight
    assert (gate.in_flight, gate.waiting) == (1, 0)
    third = asyncio.ensure_future(gate.acquire())
    while gate.waiting == 0:
        await asyncio.sleep(0)
    third.cancel()                       # the client left while queued
    with pytest.raises(asyncio.CancelledError):
        await third
    assert (gate.in_flight, gate.waiting) == (1, 0)
    gate.release()
    assert gate.in_flight == 0


class NotifyingRecorder(Recorder):
    """The real Recorder, plus an event per finished request (a test waits on it, not on time)."""

    def __init__(self, base: Recorder) -> None:
        super().__init__(base.metrics)
        self.finished = threading.Event()

    def record(self, rec: LengthRecord, count_source: str | None = None) -> None:
        super().record(rec, count_source)
        self.finished.set()


def gauge(text: str, name: str) -> dict[str, float]:
    for family in text_string_to_metric_families(text):
        if family.name == name:
            return {s.labels["upstream"]: s.value for s in family.samples}
    raise AssertionError(f"{name} is not on /metrics")


def test_in_flight_gauge_follows_an_open_stream(qwen3_dir: Path) -> None:
    with FakeVLLM(tokens_per_second=20) as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=30.0))
        config.models["tiny-qwen"] = ModelConfig(tokenizer=str(qwen3_dir))
        recorder = NotifyingRecorder(make_recorder(config))
        with serve_in_thread(BrimfulApp(config, recorder=recorder)) as base, \
                httpx.Client(base_url=base, timeout=30) as http:
            assert gauge(http.get("/metrics").text, "brimful_in_flight_requests") == {"default": 0}
            body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 8, "stream": True}
            with http.stream("POST", "/v1/chat/completions", json=body) as response:
                chunks = response.iter_bytes()
                next(chunks)                                   # the stream is open
                metrics = http.get("/metrics").text
                assert gauge(metrics, "brimful_in_flight_requests") == {"default": 1}
                assert gauge(metrics, "brimful_queued_requests") == {"default": 0}
                b"".join(chunks)
            assert recorder.finished.wait(10)
            assert gauge(http.get("/metrics").text, "brimful_in_flight_requests") == {"default": 0}


# -- CountingBudget: the memory for counting long prompts ---------------------------------------

def _busy(limit: int, waited: float) -> BrimfulError:
    return BrimfulError(503, f"busy {limit} {waited}", code="counting_busy")  # type: ignore[arg-type]


async def _queued(budget: CountingBudget, count: int) -> None:
    while len(budget._waiters) < count:
        await asyncio.sleep(0)


async def test_budget_grants_in_arrival_order_within_the_limit() -> None:
    budget = CountingBudget(100, 30.0, _busy)
    a = await budget.acquire(60)
    second = asyncio.ensure_future(budget.acquire(60))   # does not fit beside the first: waits
    third = asyncio.ensure_future(budget.acquire(10))    # would fit, but waits its turn
    await _queued(budget, 2)
    assert budget.used == 60 and not second.done() and not third.done()
    budget.release(a)
    assert await second == 60 and await third == 10 and budget.used == 70


async def test_work_larger_than_the_budget_runs_alone() -> None:
    budget = CountingBudget(100, 30.0, _busy)
    small = await budget.acquire(10)
    huge = asyncio.ensure_future(budget.acquire(10_000))
    await _queued(budget, 1)
    assert not huge.done()
    budget.release(small)
    assert await huge == 100 and budget.used == 100         # the whole budget, nothing beside it
    later = asyncio.ensure_future(budget.acquire(1))
    await _queued(budget, 1)
    budget.release(100)
    assert await later == 1


async def test_budget_wait_times_out_with_the_refusal_and_frees_its_place() -> None:
    budget = CountingBudget(100, 0.05, _busy)
    held = await budget.acquire(100)
    with pytest.raises(BrimfulError, match=r"busy 100 0\.05"):
        await budget.acquire(50)
    assert budget._waiters == collections.deque() and budget.used == 100
    cancelled = asyncio.ensure_future(budget.acquire(50))
    await _queued(budget, 1)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    budget.release(held)
    assert budget.used == 0 and not budget._waiters
