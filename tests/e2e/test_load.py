"""Load: 1,000 concurrent streams through a `brimful serve` subprocess to the fake on loopback.

Claims checked:
* every stream completes and every relayed byte is the byte the fake sent
  (each stream is compared, byte for byte and by SHA-256, with the fake's own
  deterministic event generator run on the same request);
* the streams really were concurrent (peak overlap at the fake is printed);
* brimful's peak RSS (VmHWM) stays bounded;
* no file descriptor leaks: once clients and upstream keep-alive connections
  are gone, brimful's open descriptors return to the warm baseline.

Back-pressure: with `upstream.max_concurrent_requests` set, the excess waits
up to `upstream.queue_timeout`, then gets 503 with Retry-After.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.support.fakevllm import FakeVLLM, stream_events
from tests.support.process import BrimfulProcess, reset_peak_rss, wait_until

pytestmark = pytest.mark.slow

STREAMS = int(os.environ.get("BRIMFUL_LOAD_STREAMS", "1000"))
CHAT = "/v1/chat/completions"


def peak_overlap(intervals: list[tuple[float, float]]) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = current = 0
    for _, step in edges:
        current += step
        best = max(best, current)
    return best


def expected_stream(fake: FakeVLLM, body: dict, relayed: bytes) -> bytes:
    """The bytes the fake sent for `body`: its generator, fed the id and time it stamped."""
    first = json.loads(relayed.split(b"\n", 1)[0][len(b"data: "):])
    plan = fake.validator.chat(body)
    rid = first["id"][len("chatcmpl-"):]
    return b"".join(event for _, event in stream_events(plan, True, rid, first["created"],
                                                             fake.completion_text_token))


# ---------------------------------------------------------------------------
# The load test
# ---------------------------------------------------------------------------

@pytest.fixture
def fake_paced() -> Iterator[FakeVLLM]:
    with FakeVLLM(tokens_per_second=10) as fake:
        yield fake


async def _run_streams(base_url: str, bodies: list[dict]) -> tuple[list[bytes], int]:
    open_now = peak = 0
    limits = httpx.Limits(max_connections=len(bodies) + 10, max_keepalive_connections=len(bodies) + 10)

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as client:
        async def one(body: dict) -> bytes:
            nonlocal open_now, peak
            async with client.stream("POST", CHAT, json=body) as response:
                assert response.status_code == 200, await response.aread()
                open_now += 1
                peak = max(peak, open_now)
                data = b"".join([chunk async for chunk in response.aiter_raw()])
                open_now -= 1
                return data

        results = await asyncio.gather(*(one(b) for b in bodies))
    return list(results), peak


def test_1000_concurrent_streams_intact_bounded_and_leak_free(
    fake_paced: FakeVLLM, qwen3_dir: Path, tmp_path: Path
) -> None:
    fake = fake_paced
    brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir)
    try:
        warm = httpx.post(brimful.base_url + CHAT, timeout=30, json={
            "model": "tiny-qwen", "messages": [{"role": "user", "content": "warm"}], "max_tokens": 1})
        assert warm.status_code == 200, warm.text
        fds_before = brimful.fds()
        rss_before = brimful.status("VmRSS")

        bodies = [{
            "model": "tiny-qwen",
            "messages": [{"role": "user", "content": f"stream number {i}"}],
            "max_tokens": 20 + i % 7,
            "stream": True,
            "stream_options": {"include_usage": True},   # forwarded untouched: relayed == sent
        } for i in range(STREAMS)]
        started = time.perf_counter()
        relayed, client_peak = asyncio.run(_run_streams(brimful.base_url, bodies))
        elapsed = time.perf_counter() - started

        peak_rss = brimful.status("VmHWM")
        ids = set()
        for body, data in zip(bodies, relayed, strict=True):
            expected = expected_stream(fake, body, data)
            assert hashlib.sha256(data).hexdigest() == hashlib.sha256(expected).hexdigest(), (
                f"stream {body['messages'][0]['content']!r} differs from what the fake sent"
            )
            assert data.endswith(b"data: [DONE]\n\n")
            ids.add(json.loads(data.split(b"\n", 1)[0][6:])["id"])
        assert len(ids) == STREAMS, "every stream carried its own answer"

        chats = [r for r in fake.requests if r.path == CHAT and r.json.get("stream")]
        upstream_peak = peak_overlap([(r.received_at, r.finished_at or r.received_at) for r in chats])

        # Let go of every connection: the client closed its own; the fake drops idle keep-alives.
        fake.ready = False
        fake.ready = True
        settled = wait_until(lambda: brimful.fds() <= fds_before + 5, timeout=15)
        fds_after = brimful.fds()
        print(
            f"\n[G] load: {STREAMS} streams in {elapsed:.1f} s; concurrent streams held: client {client_peak}, "
            f"upstream {upstream_peak}; brimful RSS {rss_before / 1024:.0f} MiB before, "
            f"peak {peak_rss / 1024:.0f} MiB; fds {fds_before} before, {fds_after} after"
        )
        assert upstream_peak >= STREAMS * 0.8, "the streams were not concurrent"
        assert peak_rss - rss_before < 400 * 1024, "RSS grew by more than 400 MiB for 1,000 streams"
        assert settled, f"file descriptors leaked: {fds_before} before, {fds_after} after"
    finally:
        brimful.stop()


# ---------------------------------------------------------------------------
# Back-pressure
# ---------------------------------------------------------------------------

def test_excess_requests_wait_then_get_503_with_retry_after(qwen3_dir: Path) -> None:
    from proxy.app import BrimfulApp
    from proxy.config import Config, ModelConfig, UpstreamConfig
    from tests.support.fakevllm import FaultSpec
    from tests.support.servers import serve_in_thread

    gate = threading.Event()
    with FakeVLLM() as fake:
        config = Config(upstream=UpstreamConfig(url=fake.base_url, timeout=30.0, max_concurrent_requests=2,
                                                queue_timeout=0.3))
        config.models["tiny-qwen"] = ModelConfig(tokenizer=str(qwen3_dir))
        with serve_in_thread(BrimfulApp(config)) as base, httpx.Client(base_url=base, timeout=30) as http:
            body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            assert http.post(CHAT, json=body).status_code == 200        # models known, tokenizer warm
            fake.fail_next.extend([FaultSpec(kind="respond", status=200, gate=gate, path=CHAT,
                                             body={"choices": [], "usage": None})] * 2)
            results: list[httpx.Response] = []
            holders = [threading.Thread(target=lambda: results.append(http.post(CHAT, json=body)))
                       for _ in range(2)]
            for t in holders:
                t.start()
            assert fake.wait_until(lambda f: sum(r.path == CHAT for r in f.requests) >= 3, timeout=10)
            try:
                third = http.post(CHAT, json=body)     # both slots taken: waits 0.3 s, then 503
            finally:
                gate.set()
                for t in holders:
                    t.join(10)
            assert third.status_code == 503
            assert third.json()["error"]["code"] == "upstream_busy"
            assert int(third.headers["retry-after"]) >= 1
            assert sum(r.path == CHAT for r in fake.requests) == 3, "the excess request never reached vLLM"
            assert [r.status_code for r in results] == [200, 200]
            # once the slots are free, requests flow again
            assert http.post(CHAT, json=body).status_code == 200


# ---------------------------------------------------------------------------
# One huge non-streamed answer
# ---------------------------------------------------------------------------

HUGE_ANSWER = int(os.environ.get("BRIMFUL_HUGE_ANSWER_MB", "500")) * 1024 * 1024


def test_500_mb_answer_is_relayed_in_bounded_memory(qwen3_dir: Path, tmp_path: Path) -> None:
    """A non-streamed answer far above the whole-answer limit: relayed as it arrives, usage still recorded."""
    from tests.support.fakevllm import FaultSpec

    log = tmp_path / "lengths.jsonl"
    with FakeVLLM() as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, extra_args=["--length-log", str(log)])
        try:
            body = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
            assert httpx.post(brimful.base_url + CHAT, json=body, timeout=30).status_code == 200
            rss_before = brimful.status("VmRSS")
            exact_peak = reset_peak_rss(brimful.pid)
            fake.fail_next.append(FaultSpec(kind="huge", size=HUGE_ANSWER, path=CHAT))
            received = 0
            tail = b""
            started = time.perf_counter()
            with httpx.stream("POST", brimful.base_url + CHAT, json=body, timeout=120) as response:
                assert response.status_code == 200
                declared = int(response.headers["content-length"])
                for chunk in response.iter_raw():
                    received += len(chunk)
                    tail = (tail + chunk)[-4096:]
            elapsed = time.perf_counter() - started
            peak = brimful.status("VmHWM")
        finally:
            brimful.stop()
    records = [json.loads(line) for line in log.read_text().splitlines()]
    assert received == declared > HUGE_ANSWER
    assert tail.endswith(b'"completion_tokens":2000}}')
    assert records[-1]["completion_tokens"] == 2000 and records[-1]["status"] == 200
    growth = (peak - rss_before) / 1024
    print(f"\n[G] {HUGE_ANSWER >> 20} MB non-streamed answer in {elapsed:.1f} s: brimful RSS "
          f"{rss_before / 1024:.0f} MiB before, peak {peak / 1024:.0f} MiB (+{growth:.0f} MiB"
          f"{'' if exact_peak else ', peak since start'})")
    assert growth < 100, f"RSS grew by {growth:.0f} MiB relaying one answer"


# ---------------------------------------------------------------------------
# Attacks on the connection layer (proxy.serving.server): probes keep being answered
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("kind,count", [("slowloris", 150), ("header", 150), ("body", 150), ("idle", 5000)])
def test_probes_are_answered_during_a_connection_attack(qwen3_dir: Path, tmp_path: Path, kind: str,
                                                        count: int) -> None:
    """bench/attack_bench.py's phases, shorter: every probe answered, memory and descriptors bounded.

    The idle phase opens more connections than brimful's 4,096 descriptors: under uvicorn's own
    protocol every probe then failed (bench/attack_bench.py --server plain).
    """
    from bench.attack_bench import phase, probe_once

    with FakeVLLM(record=False) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, fd_limit=4096)
        try:
            assert wait_until(lambda: probe_once(brimful.port, chat=True) is not None, timeout=30)
            rss_before = brimful.status("VmRSS")
            result = phase(brimful, kind, count, seconds=3.0)
        finally:
            brimful.stop()
    growth = (int(result["peak"]) - rss_before) / 1024
    print(f"\n[G] {kind} x{count}: {result['probes']} probes, {result['failed']} failed, p50 {result['p50']:.1f} ms, "
          f"p99 {result['p99']:.1f} ms; RSS +{growth:.0f} MiB; {result['fds']} fds")
    assert result["failed"] == 0, result
    assert growth < 100, f"RSS grew by {growth:.0f} MiB under the {kind} attack"
    assert int(result["fds"]) < 4096


# ---------------------------------------------------------------------------
# Memory for counting long prompts
# ---------------------------------------------------------------------------

def _prompt(chars: int, salt: str = "") -> dict:
    words = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
    text = " ".join(f"{words[i % 8]}{salt}{i % 97}" for i in range(chars // 6 + 1))[:chars]
    return {"model": "tiny-qwen", "messages": [{"role": "user", "content": text}], "max_tokens": 4}


def _peak_growth(brimful: BrimfulProcess, send) -> tuple[float, float, list[httpx.Response]]:
    """(peak RSS growth, RSS growth left afterwards) in MiB around `send()`."""
    rss_before = brimful.status("VmRSS")
    reset_peak_rss(brimful.pid)
    responses = send()
    peak = brimful.status("VmHWM")
    after = brimful.status("VmRSS")
    return (peak - rss_before) / 1024, (after - rss_before) / 1024, responses


def test_a_prompt_over_the_character_bound_costs_no_counting_memory(qwen3_dir: Path, tmp_path: Path) -> None:
    """The issue's 33 MB prompt (just under the 32 MiB body limit) peaked at 5.5 GiB: now refused unencoded."""
    with FakeVLLM(record=False) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir)
        try:
            assert httpx.post(brimful.base_url + CHAT, json=_prompt(100), timeout=30).status_code == 200
            body = json.dumps(_prompt(32 * 1024 * 1024 - 200)).encode()
            started = time.perf_counter()
            peak, left, [response] = _peak_growth(brimful, lambda: [
                httpx.post(brimful.base_url + CHAT, content=body, timeout=120)])
            elapsed = time.perf_counter() - started
        finally:
            brimful.stop()
    assert response.status_code == 400, response.text[:300]
    assert "characters" in response.json()["error"]["message"]
    print(f"\n[G] {len(body) / 1e6:.1f} MB prompt over the character bound: refused in {elapsed:.2f} s, "
          f"RSS peak +{peak:.0f} MiB, +{left:.0f} MiB afterwards")
    assert peak < 600, f"refusing one prompt cost {peak:.0f} MiB"


LARGEST_MML = int(os.environ.get("BRIMFUL_LARGEST_PROMPT_MML", "2048"))


def test_the_largest_allowed_prompt_is_counted_and_its_memory_returned(qwen3_dir: Path, tmp_path: Path) -> None:
    """A prompt just inside vLLM's character bound (max_model_len x 128) is counted; the heap goes back after."""
    with FakeVLLM(record=False) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, model_toml=f"max_model_len = {LARGEST_MML}")
        try:
            assert httpx.post(brimful.base_url + CHAT, json=_prompt(100), timeout=30).status_code == 200
            overhead = 50     # Qwen3's template around one user message, in characters
            body = _prompt(LARGEST_MML * 128 - overhead)
            peak, left, [response] = _peak_growth(brimful, lambda: [
                httpx.post(brimful.base_url + CHAT, json=body, timeout=300)])
        finally:
            brimful.stop()
    assert response.status_code == 400, response.text[:300]        # counted: far more tokens than fit
    error = response.json()["error"]
    assert "characters" not in error["message"] and error["brimful"]["prompt_tokens"] > LARGEST_MML
    print(f"\n[G] largest allowed prompt for max_model_len {LARGEST_MML} ({LARGEST_MML * 128 / 1e6:.2f} M chars, "
          f"{error['brimful']['prompt_tokens']} tokens): RSS peak +{peak:.0f} MiB, +{left:.0f} MiB afterwards")
    assert left < max(64.0, peak / 4), "the counting heap was not returned"


def test_concurrent_long_prompts_are_counted_within_the_memory_budget(qwen3_dir: Path, tmp_path: Path) -> None:
    """Three 8 MB prompts at once peaked at 3.3 GiB: each is over the 1 GiB budget, so they take turns."""
    with FakeVLLM(record=False) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp_path, qwen3_dir, model_toml="max_model_len = 131072",
                                   extra_toml="queue_timeout = 120.0")
        try:
            assert httpx.post(brimful.base_url + CHAT, json=_prompt(100), timeout=30).status_code == 200
            bodies = [json.dumps(_prompt(8 * 1000 * 1000, salt=s)).encode() for s in "xyz"]

            def send() -> list[httpx.Response]:
                async def all_at_once() -> list[httpx.Response]:
                    async with httpx.AsyncClient(base_url=brimful.base_url, timeout=300) as client:
                        return list(await asyncio.gather(*(client.post(CHAT, content=b) for b in bodies)))
                return asyncio.run(all_at_once())

            peak, left, responses = _peak_growth(brimful, send)
        finally:
            brimful.stop()
    assert [r.status_code for r in responses] == [400] * 3, [r.text[:200] for r in responses]
    assert all(r.json()["error"]["brimful"]["prompt_tokens"] > 131072 for r in responses)
    print(f"\n[G] three 8 MB prompts at once: RSS peak +{peak:.0f} MiB, +{left:.0f} MiB afterwards")
    assert peak < 2 * 1024, f"three concurrent counts peaked at +{peak:.0f} MiB"
