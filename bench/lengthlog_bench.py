"""The length log's flush policy: records lost on kill -9 and its CPU cost per request.

For each `length_log.flush_interval` given, `brimful serve` (length log on)
in front of FakeVLLM on loopback:

  cost   N sequential small chats on one keep-alive connection: brimful's CPU
         (utime + stime from /proc) per request, and the same with the length
         log off, beside it in the same run
  loss   bursts of concurrent chats, then kill -9 the moment the last answer
         arrived: answered requests whose record is not in the file

    python bench/lengthlog_bench.py                        # intervals 0.1, 0.02, 0
    python bench/lengthlog_bench.py --intervals 0.1,0 --requests 2000

A benchmark, not a test: the figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
import tempfile
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fakevllm import FakeVLLM  # noqa: E402
from tests.support.process import BrimfulProcess  # noqa: E402

QWEN3 = ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B"
CHAT = "/v1/chat/completions"
BODY = {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def start(fake: FakeVLLM, interval: float | None, log: Path) -> BrimfulProcess:
    tmp = Path(tempfile.mkdtemp())
    if interval is None:
        return BrimfulProcess(fake.base_url, tmp, QWEN3)
    return BrimfulProcess(fake.base_url, tmp, QWEN3, extra_toml=f"\n[length_log]\nflush_interval = {interval}",
                           extra_args=["--length-log", str(log)])


def cost(fake: FakeVLLM, interval: float | None, requests: int) -> float:
    """CPU milliseconds per request."""
    log = Path(tempfile.mkdtemp()) / "lengths.jsonl"
    brimful = start(fake, interval, log)
    try:
        with httpx.Client(base_url=brimful.base_url, timeout=30) as http:
            for _ in range(50):
                http.post(CHAT, json=BODY)
            before = cpu_seconds(brimful.pid)
            for _ in range(requests):
                assert http.post(CHAT, json=BODY).status_code == 200
            return (cpu_seconds(brimful.pid) - before) * 1000 / requests
    finally:
        brimful.stop()


def loss(fake: FakeVLLM, interval: float, bursts: int, concurrency: int) -> tuple[int, int]:
    """(answered, recorded) when brimful is killed right after the last answer."""
    log = Path(tempfile.mkdtemp()) / "lengths.jsonl"
    brimful = start(fake, interval, log)
    answered = 0

    async def run() -> None:
        nonlocal answered
        async with httpx.AsyncClient(base_url=brimful.base_url, timeout=30) as http:
            for _ in range(bursts):
                results = await asyncio.gather(*(http.post(CHAT, json=BODY) for _ in range(concurrency)))
                answered += sum(r.status_code == 200 for r in results)
            os.kill(brimful.pid, signal.SIGKILL)

    try:
        asyncio.run(run())
        brimful.proc.wait(10)
    finally:
        brimful.stop(signal.SIGKILL)
    recorded = len(log.read_text().splitlines()) if log.exists() else 0
    return answered, recorded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--intervals", default="0.1,0.02,0")
    parser.add_argument("--requests", type=int, default=1000, help="sequential requests for the cost")
    parser.add_argument("--bursts", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=25)
    parser.add_argument("--runs", type=int, default=3, help="kill -9 runs per interval")
    args = parser.parse_args()
    print(f"load average before: {os.getloadavg()}")
    with FakeVLLM(record=False) as fake:
        base = cost(fake, None, args.requests)
        print(f"length log off: {base:.3f} ms CPU per request")
        for interval in (float(x) for x in args.intervals.split(",")):
            per = cost(fake, interval, args.requests)
            runs = [loss(fake, interval, args.bursts, args.concurrency) for _ in range(args.runs)]
            lost = [a - r for a, r in runs]
            print(f"flush_interval {interval:g} s: {per:.3f} ms CPU per request ({per - base:+.3f} vs off); "
                  f"kill -9 after {runs[0][0]} answered: lost {lost} records", flush=True)
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
