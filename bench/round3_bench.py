"""Probe latency and peak memory under issue 25's heavy requests (items 4-6).

brimful (`brimful serve`, one worker) in front of FakeVLLM on loopback.  In each
phase, attackers send one kind of heavy request over and over while a prober
opens a new connection every 50 ms, alternating `GET /live` and an ordinary
20 KB completion (counted on the counting threads, within the counting budget), and
records how long each took or that it failed.  Phases:

  baseline   no attack
  embed      1 client: embeddings of N one-character inputs (item 4; `--inputs`)
  messages   4 clients: chats of M empty messages, over vLLM's character bound (item 5; `--messages`)
  sseline    1 client: a streamed chat whose one event is one L-byte line, brimful stripping the usage
             it asked for (item 6; `--line-mb`); its time to the last byte is printed too
  system     1 client: an Anthropic Messages request whose system prompt is B one-character text
             blocks (the issue's "degraded" 10^6 system blocks; `--blocks`)

Printed per phase: probes, failed probes, probe p50 / p99 / max, brimful's peak RSS
(VmHWM, reset per phase), the attackers' requests done and their statuses.  Run it in a
checkout of the code to measure (`cd <checkout> && python bench/round3_bench.py`): the
same script in two checkouts, one after the other, gives before and after.

A benchmark, not a test: the figures depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fakevllm import FakeVLLM, FaultSpec  # noqa: E402
from tests.support.process import BrimfulProcess, reset_peak_rss  # noqa: E402

QWEN3 = ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B"
# The probe's 20 KB prompt goes to /v1/completions: the sseline attack's fault is taken by
# the next /v1/chat/completions request, which must be the attacker's.
PROBE_20K = json.dumps({"model": "tiny-qwen", "prompt": "word " * 4000, "max_tokens": 2}).encode()


def probe_once(port: int, chat: bool) -> float | None:
    """One request on a fresh connection: seconds to the complete answer, None on failure."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            if chat:
                sock.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(PROBE_20K), PROBE_20K))
            else:
                sock.sendall(b"GET /live HTTP/1.1\r\nhost: p\r\nconnection: close\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
    except OSError:
        return None
    if not data.startswith(b"HTTP/1.1 200 "):
        return None
    return time.perf_counter() - started


def run_prober(port: int, stop: threading.Event, out: list[float | None]) -> None:
    chat = False
    while not stop.is_set():
        out.append(probe_once(port, chat))
        chat = not chat
        stop.wait(0.05)


def attacker(base: str, kind: str, args: argparse.Namespace, fake: FakeVLLM, stop: threading.Event,
             statuses: collections.Counter[str], durations: list[float]) -> None:
    if kind == "embed":
        path, body = "/v1/embeddings", json.dumps({"model": "tiny-qwen", "input": ["a"] * args.inputs}).encode()
    elif kind == "system":
        path, body = "/v1/messages", json.dumps(
            {"model": "tiny-qwen", "max_tokens": 8, "system": [{"type": "text", "text": "a"}] * args.blocks,
             "messages": [{"role": "user", "content": "hi"}]}).encode()
    elif kind == "messages":
        path, body = "/v1/chat/completions", json.dumps(
            {"model": "tiny-qwen", "messages": [{"role": "user", "content": ""}] * args.messages}).encode()
    else:
        path, body = "/v1/chat/completions", json.dumps(
            {"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "stream": True}).encode()
    with httpx.Client(base_url=base, timeout=args.client_timeout) as client:
        while not stop.is_set():
            if kind == "sseline":
                fake.fail_next.append(FaultSpec(kind="long_line", size=args.line_mb << 20,
                                                path="/v1/chat/completions"))
            started = time.perf_counter()
            try:
                with client.stream("POST", path, content=body, headers={"content-type": "application/json"}) as r:
                    size = sum(len(piece) for piece in r.iter_raw())
                statuses[f"{r.status_code}"] += 1
                durations.append(time.perf_counter() - started)
                if kind == "sseline" and size < args.line_mb << 20:
                    statuses["short"] += 1
            except httpx.HTTPError as exc:
                statuses[type(exc).__name__] += 1
                durations.append(time.perf_counter() - started)


def phase(brimful: BrimfulProcess, fake: FakeVLLM, kind: str, args: argparse.Namespace) -> dict[str, object]:
    exact = reset_peak_rss(brimful.pid)
    latencies: list[float | None] = []
    statuses: collections.Counter[str] = collections.Counter()
    durations: list[float] = []
    stop_probe, stop_attack = threading.Event(), threading.Event()
    count = {"baseline": 0, "embed": 1, "messages": 4, "sseline": 1, "system": 1}[kind]
    attackers = [threading.Thread(target=attacker, args=(brimful.base_url, kind, args, fake, stop_attack,
                                                         statuses, durations)) for _ in range(count)]
    for thread in attackers:
        thread.start()
    if attackers:
        time.sleep(1.0)                            # let the attack start first
    prober = threading.Thread(target=run_prober, args=(brimful.port, stop_probe, latencies))
    prober.start()
    time.sleep(args.seconds)
    stop_probe.set()
    prober.join()
    stop_attack.set()
    for thread in attackers:
        thread.join()
    ok = sorted(x for x in latencies if x is not None)
    return dict(
        probes=len(latencies), failed=len(latencies) - len(ok), peak=brimful.status("VmHWM"), exact_peak=exact,
        p50=statistics.median(ok) * 1000 if ok else None,
        p99=ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1000 if ok else None,
        max=ok[-1] * 1000 if ok else None,
        attacks=dict(statuses), attack_s=max(durations) if durations else None,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0, help="probing time per phase")
    parser.add_argument("--phases", default="baseline,embed,messages,sseline")
    parser.add_argument("--inputs", type=int, default=1_000_000, help="embedding inputs (item 4)")
    parser.add_argument("--messages", type=int, default=300_000, help="empty messages per chat (item 5)")
    parser.add_argument("--line-mb", type=int, default=50, help="the SSE line's size in MiB (item 6)")
    parser.add_argument("--blocks", type=int, default=1_000_000, help="system blocks (the system phase)")
    parser.add_argument("--client-timeout", type=float, default=60.0)
    args = parser.parse_args()
    print(f"checkout: {ROOT}; load average before: {os.getloadavg()}")
    tmp = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    # The fake counts crudely: it runs in this process, beside the prober, and counting 10^6
    # inputs with the real tokenizer here would hold this process's GIL and time the fake.
    with FakeVLLM(record=False, max_model_len=8192, count_prompt=lambda endpoint, body: 1) as fake:
        brimful = BrimfulProcess(fake.base_url, tmp, QWEN3, extra_toml="[tokenizers]\nparity_check = false\n")
        try:
            for _ in range(100):                                # models known, tokenizer loaded
                if probe_once(brimful.port, chat=True) is not None:
                    break
                time.sleep(0.2)
            print(f"{'phase':<9} {'probes':>6} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'peak MiB':>9}  attacks (status: count), slowest attack s")
            for kind in args.phases.split(","):
                r = phase(brimful, fake, kind, args)

                def ms(value: object) -> str:
                    return f"{value:8.1f}" if isinstance(value, float) else f"{'-':>8}"

                slowest = f"{r['attack_s']:.1f}" if isinstance(r["attack_s"], float) else "-"
                print(f"{kind:<9} {r['probes']:>6} {r['failed']:>6} {ms(r['p50'])} {ms(r['p99'])} {ms(r['max'])} "
                      f"{int(r['peak']) / 1024:9.0f}{'' if r['exact_peak'] else '*'}"  # type: ignore[call-overload]
                      f"  {r['attacks']} {slowest}", flush=True)
        finally:
            brimful.stop()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
