"""Do long prompts stall everybody else?  Small-request latency with and without 100k-token requests.

Runs, in one go and on this machine:
  * a fake vLLM (tests/fakevllm.py) in its own process, max_model_len 131072;
  * brimful (`brimful serve`) in its own process, counting with the real
    Qwen3 tokenizer from ../shared/models;
  * this process as the load generator (aiohttp).

Phases (each measured the same way, 1 connection of small requests):
  direct        small chat requests straight to the fake (the baseline)
  alone         the same through brimful
  with-long     the same through brimful while other connections keep sending
                ~100k-token chat requests (their count runs in a worker thread)
  direct+long   small requests straight to the fake while the long ones still
                flow through brimful: the cost of sharing 2 cores, without
                brimful's event loop in the small requests' path

Prints p50/p99 of the small requests per phase, the ratio to "alone", and the
long requests' own latency.  A benchmark, not a test: figures go to docs/performance.md.

    .venv/bin/python bench/long_prompt_bench.py [--small 400] [--long-concurrency 2] [--long-tokens 100000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
QWEN3 = SHARED / "models" / "Qwen--Qwen3-8B"

FAKE_SCRIPT = """
import asyncio, sys
sys.path.insert(0, {root!r})
from tests.support.fakevllm import FakeVLLM
async def main():
    async with FakeVLLM(max_model_len=131072, record=False) as fake:
        print(fake.port, flush=True)
        await asyncio.Event().wait()
asyncio.run(main())
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


async def wait_http(url: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(url) as r:
                    if r.status < 500:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


SMALL = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "Why does ice float on water?"}],
         "max_tokens": 4}


async def small_requests(session: aiohttp.ClientSession, url: str, count: int) -> list[float]:
    body = json.dumps(SMALL).encode()
    times = []
    for _ in range(count):
        t = time.perf_counter()
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
            await r.read()
            assert r.status == 200, r.status
        times.append((time.perf_counter() - t) * 1000)
    return times


async def long_loop(session: aiohttp.ClientSession, url: str, body: bytes, stop: asyncio.Event,
                    times: list[float]) -> None:
    while not stop.is_set():
        t = time.perf_counter()
        async with session.post(url, data=body, headers={"content-type": "application/json"}) as r:
            await r.read()
            assert r.status == 200, (r.status, await r.text())
        times.append((time.perf_counter() - t) * 1000)


async def run(args: argparse.Namespace) -> None:
    procs: list[subprocess.Popen] = []
    try:
        fake = subprocess.Popen([sys.executable, "-c", FAKE_SCRIPT.format(root=str(ROOT))],
                                stdout=subprocess.PIPE, text=True)
        procs.append(fake)
        fake_port = int(fake.stdout.readline())
        fake_url = f"http://127.0.0.1:{fake_port}"
        port = free_port()
        config = Path(tempfile.mkdtemp()) / "brimful.toml"
        config.write_text(f'[models."tiny-qwen"]\ntokenizer = "{QWEN3}"\n')
        brimful = subprocess.Popen(
            [sys.executable, "-m", "proxy.cli", "serve", "--config", str(config), "--upstream", fake_url,
             "--port", str(port), "--log-level", "warning"],
            cwd=ROOT, stderr=subprocess.DEVNULL,
        )
        procs.append(brimful)
        base = f"http://127.0.0.1:{port}"
        await wait_http(base + "/v1/models")

        long_text = " ".join(["hello"] * args.long_tokens)
        long_body = json.dumps({"model": "tiny-qwen", "messages": [{"role": "user", "content": long_text}],
                                "max_tokens": 4}).encode()
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            # warm up: tokenizer loaded, template compiled, connections open
            await small_requests(session, base + "/v1/chat/completions", 50)
            async with session.post(base + "/v1/chat/completions", data=long_body,
                                    headers={"content-type": "application/json"}) as r:
                prompt_tokens = int(r.headers["x-brimful-prompt-tokens"])
                await r.read()

            results = {}
            results["direct"] = await small_requests(session, fake_url + "/v1/chat/completions", args.small)
            results["alone"] = await small_requests(session, base + "/v1/chat/completions", args.small)
            stop = asyncio.Event()
            long_times: list[float] = []
            loops = [asyncio.create_task(long_loop(session, base + "/v1/chat/completions", long_body, stop,
                                                   long_times)) for _ in range(args.long_concurrency)]
            results["with-long"] = await small_requests(session, base + "/v1/chat/completions", args.small)
            # The same load, small requests straight to the fake: what CPU contention
            # alone costs on this machine, with no brimful event loop in their path.
            results["direct+long"] = await small_requests(session, fake_url + "/v1/chat/completions", args.small)
            stop.set()
            await asyncio.gather(*loops)

        alone = results["alone"]
        print(f"machine: {os.cpu_count()} cores; small request = {len(json.dumps(SMALL))} B chat; "
              f"long request = {prompt_tokens} prompt tokens (Qwen3 tokenizer), {args.long_concurrency} "
              f"connection(s) sending them back to back")
        print(f"{'phase':<12} {'n':>5} {'p50 ms':>9} {'p99 ms':>9} {'p99 / alone':>12}")
        for name, values in results.items():
            print(f"{name:<12} {len(values):>5} {percentile(values, 50):>9.2f} {percentile(values, 99):>9.2f} "
                  f"{percentile(values, 99) / percentile(alone, 99):>12.2f}")
        if long_times:
            print(f"long requests completed meanwhile: {len(long_times)}, p50 {statistics.median(long_times):.1f} ms "
                  f"each ({prompt_tokens / statistics.median(long_times) * 1000:,.0f} prompt tokens/s "
                  "through brimful)")
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=400, help="small requests per phase")
    parser.add_argument("--long-concurrency", type=int, default=2)
    parser.add_argument("--long-tokens", type=int, default=100_000)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
