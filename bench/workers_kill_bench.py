"""`brimful serve --workers 2` when a worker is killed: counters, chats during the restart, a restart storm.

brimful (two workers) in front of FakeVLLM on loopback.  Phases:

  kill    4 clients send small chats, each on a new connection, while a scraper reads /metrics every
          0.2 s; after 3 s worker 1 is killed with SIGKILL; the run goes on until its replacement is
          ready, plus 3 s.  Printed: brimful_requests_total before the kill and the lowest after it,
          scrapes that were not 200, the chats sent from the kill until the replacement was ready,
          their slowest and failures.
  stopkill  as kill, but worker 1 is first stopped (SIGSTOP) for --stop-s seconds, as a worker stuck
          in one long computation is before the OOM killer takes it: the chats that reach its socket
          meanwhile wait in its accept queue, and the kill decides what becomes of them.
  storm   worker 1 is killed, then each replacement about 1 s after it appears, three times (the issue's
          restart storm); then chats on new connections for 10 s.  Printed: whether the supervisor still
          runs, worker 0's pid unchanged, chats answered / failed.

Every phase also prints net.ipv4.tcp_migrate_req (with 1 the kernel moves a closed listener's queue
to another listener of the port instead of resetting it).

Run it in a checkout of the code to measure (`cd <checkout> && python bench/workers_kill_bench.py`): the same
script in two checkouts, one after the other, gives before and after.  A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fakevllm import FakeVLLM  # noqa: E402
from tests.support.process import BrimfulProcess  # noqa: E402

QWEN3 = ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B"
CHAT = json.dumps({"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def get(base: str, path: str, timeout: float = 5.0) -> httpx.Response | None:
    try:
        with httpx.Client(base_url=base, timeout=timeout) as http:
            return http.get(path)
    except httpx.HTTPError:
        return None


def chat(base: str, timeout: float = 30.0) -> tuple[float, bool]:
    started = time.perf_counter()
    try:
        with httpx.Client(base_url=base, timeout=timeout) as http:
            ok = http.post("/v1/chat/completions", content=CHAT,
                           headers={"content-type": "application/json"}).status_code == 200
    except httpx.HTTPError:
        ok = False
    return time.perf_counter() - started, ok


def worker_pids(base: str) -> dict[int, int]:
    page = get(base, "/stats")
    if page is None or page.status_code != 200:
        return {}
    return {w["index"]: w["pid"] for w in page.json().get("workers", []) if w.get("answered")}


def all_ready(base: str) -> bool:
    page = get(base, "/ready")
    return page is not None and page.status_code == 200 and len(page.json()["workers"]) == 2


def wait(condition: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def requests_total(base: str) -> float | None:
    page = get(base, "/metrics")
    if page is None or page.status_code != 200:
        return None
    return sum(float(line.rsplit(" ", 1)[1]) for line in page.text.splitlines()
               if line.startswith("brimful_requests_total{"))


def children(pid: int) -> set[int]:
    return {int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()}


def kill_phase(brimful: BrimfulProcess, args_warmup: float, stop_s: float = 0.0) -> dict[str, Any]:
    base, stop = brimful.base_url, threading.Event()
    chats: list[tuple[float, float, bool]] = []          # (sent at, seconds, ok)
    scrapes: list[tuple[float, float | None]] = []

    def client() -> None:
        while not stop.is_set():
            at = time.monotonic()
            chats.append((at, *chat(base)))

    def scraper() -> None:
        while not stop.is_set():
            scrapes.append((time.monotonic(), requests_total(base)))
            stop.wait(0.2)

    threads = [threading.Thread(target=client) for _ in range(4)] + [threading.Thread(target=scraper)]
    for t in threads:
        t.start()
    time.sleep(args_warmup)
    pids = worker_pids(base)
    killed = time.monotonic()                            # from the stop, when there is one
    if stop_s:
        os.kill(pids[1], signal.SIGSTOP)
        time.sleep(stop_s)
    os.kill(pids[1], signal.SIGKILL)
    wait(lambda: worker_pids(base).get(1) not in (None, pids[1]) and all_ready(base), 120)
    ready = time.monotonic()
    time.sleep(3.0)
    stop.set()
    for t in threads:
        t.join()
    before = [v for at, v in scrapes if at < killed and v is not None]
    after = [v for at, v in scrapes if at >= killed]
    during = [(s, ok) for at, s, ok in chats if killed <= at < ready]
    return dict(restart_s=round(ready - killed, 1), total_before=max(before) if before else None,
                lowest_after=min((v for v in after if v is not None), default=None),
                scrapes_not_200=sum(v is None for v in after), scrapes_after=len(after),
                chats_during=len(during), slowest_during_ms=round(max((s for s, _ in during), default=0) * 1000),
                failed_during=sum(not ok for _, ok in during),
                during=[(round(at - killed, 2), round(s, 2)) for at, s, _ in chats if killed - 1 <= at < ready],
                slowest_before_ms=round(max((s for at, s, _ in chats if at < killed - 1), default=0) * 1000))


def storm_phase(brimful: BrimfulProcess) -> dict[str, Any]:
    base = brimful.base_url
    pids = worker_pids(base)
    victim = pids[1]
    for _ in range(3):
        os.kill(victim, signal.SIGKILL)
        known = {pids[0], victim}
        if not wait(lambda known=known: bool(children(brimful.pid) - known), 30):
            break
        victim = (children(brimful.pid) - known).pop()
        time.sleep(1.0)
    if brimful.proc.poll() is None and victim in children(brimful.pid):
        os.kill(victim, signal.SIGKILL)
    results = []
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        results.append(chat(base, timeout=5.0))
    return dict(supervisor_running=brimful.proc.poll() is None,
                worker0_same=brimful.proc.poll() is None and pids[0] in children(brimful.pid),
                chats=len(results), failed=sum(not ok for _, ok in results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phases", default="kill,storm")
    parser.add_argument("--warmup", type=float, default=10.0, help="seconds of chats before the kill")
    parser.add_argument("--stop-s", type=float, default=1.0, help="stopkill: seconds worker 1 is stopped")
    args = parser.parse_args()
    for kind in args.phases.split(","):
        with FakeVLLM(record=False) as fake, tempfile.TemporaryDirectory() as tmp:
            brimful = BrimfulProcess(fake.base_url, Path(tmp), QWEN3, extra_args=["--workers", "2"])
            try:
                base = brimful.base_url
                assert wait(lambda: all_ready(base), 120), "not ready"   # noqa: B023
                if kind in ("kill", "stopkill"):
                    result = kill_phase(brimful, args.warmup, args.stop_s if kind == "stopkill" else 0.0)
                else:
                    result = storm_phase(brimful)
            finally:
                brimful.stop(signal.SIGKILL)
        migrate = Path("/proc/sys/net/ipv4/tcp_migrate_req")
        print(json.dumps({"phase": kind, "tcp_migrate_req": migrate.read_text().strip() if migrate.exists() else None,
                          **result}), flush=True)


if __name__ == "__main__":
    main()
