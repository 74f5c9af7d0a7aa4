"""Probe latency while clients attack the connection layer (proxy.serving.server's limits).

brimful (`brimful serve`, one worker) in front of FakeVLLM on loopback.  For
each phase, attackers run in this process while a prober opens a new
connection every 50 ms, as a Kubernetes probe does, alternating `GET /live`
and a small chat completion, and records how long each took (or that it
failed).  Phases:

  baseline    no attack
  slowloris   N connections each sending one header line per second, never
              finishing the head (reconnecting when closed)
  header      N connections each sending an endless header line as fast as the
              socket takes it (reconnecting when closed): a header flood
  body        N connections each sending a head and a few body bytes, then nothing
  idle        M connections that send nothing at all, more than the server's
              descriptor limit (--fd-limit) allows

Printed per phase: probe p50 / p99 / max latency, failed probes, brimful's
RSS at the end of the phase and its peak (VmHWM, reset per phase), open
descriptors.  `--server plain` runs the same app under uvicorn's own
protocol, without brimful's limits, for the comparison.

    python bench/attack_bench.py                     # 200 attackers, 6000 idle, 10 s per phase
    python bench/attack_bench.py --server plain --seconds 5

A benchmark, not a test: the figures depend on the machine and on what else runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.fakevllm import FakeVLLM  # noqa: E402
from tests.support.process import BrimfulProcess, reset_peak_rss  # noqa: E402

QWEN3 = ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B"
CHAT = b'{"model": "tiny-qwen", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}'

PLAIN_RUNNER = """
import sys, uvicorn
from proxy.app import BrimfulApp
from proxy.config import load_config
config = load_config(sys.argv[1], overrides={"server.port": int(sys.argv[2])})
uvicorn.run(BrimfulApp(config), host="127.0.0.1", port=int(sys.argv[2]), log_level="info",
            access_log=False, server_header=False, date_header=False, proxy_headers=False)
"""


class PlainProcess(BrimfulProcess):
    """brimful's app under uvicorn's own protocol (no proxy.serving.server limits), for the comparison."""

    def _command(self, config: Path, extra_args: list[str]) -> list[str]:
        return [sys.executable, "-c", PLAIN_RUNNER, str(config), str(self.port)]


def probe_once(port: int, chat: bool) -> float | None:
    """One request on a fresh connection: seconds to the complete answer, None on failure."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            if chat:
                sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\ncontent-type: application/json\r\n"
                             b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(CHAT), CHAT))
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


async def attacker(port: int, kind: str, stop: asyncio.Event) -> None:
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(0.1)
            continue
        try:
            if kind == "slowloris":
                writer.write(b"GET /v1/models HTTP/1.1\r\nhost: a\r\n")
                while not stop.is_set():
                    await writer.drain()
                    writer.write(b"x-slow: 1\r\n")
                    if await _closed(reader, 1.0):
                        break
            elif kind == "header":
                writer.write(b"GET /v1/models HTTP/1.1\r\nhost: a\r\nx-flood: ")
                filler = b"a" * 65536
                for _ in range(128):                          # up to 8 MiB per connection
                    if stop.is_set():
                        break
                    writer.write(filler)
                    await writer.drain()
                await _closed(reader, 30.0)
            elif kind == "body":
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: a\r\ncontent-type: application/json\r\n"
                             b"content-length: 100000\r\n\r\n{\"model\": ")
                await writer.drain()
                await _closed(reader, 3600.0, stop)
            else:                                             # idle
                await _closed(reader, 3600.0, stop)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


async def _closed(reader: asyncio.StreamReader, seconds: float, stop: asyncio.Event | None = None) -> bool:
    """Wait up to `seconds` (or until `stop`) for the server to close; True when it did."""
    read = asyncio.ensure_future(reader.read(65536))
    waits = {read} | ({asyncio.ensure_future(stop.wait())} if stop is not None else set())
    done, pending = await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    if read in done:
        try:
            return read.result() == b""
        except OSError:
            return True
    return False


def phase(brimful: BrimfulProcess, kind: str, count: int, seconds: float) -> dict[str, object]:
    exact = reset_peak_rss(brimful.pid)
    latencies: list[float | None] = []
    stop_probe = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def attack() -> None:
        tasks = [asyncio.ensure_future(attacker(brimful.port, kind, stop)) for _ in range(count)]
        await asyncio.sleep(min(2.0, seconds / 3))              # let the attack build up first
        prober = threading.Thread(target=run_prober, args=(brimful.port, stop_probe, latencies))
        prober.start()
        await asyncio.sleep(seconds)
        stop_probe.set()
        await asyncio.to_thread(prober.join)
        rss = brimful.status("VmRSS")
        fds = brimful.fds()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        result.update(rss=rss, fds=fds)

    result: dict[str, object] = {}
    if kind == "baseline":
        prober = threading.Thread(target=run_prober, args=(brimful.port, stop_probe, latencies))
        prober.start()
        time.sleep(seconds)
        stop_probe.set()
        prober.join()
        result.update(rss=brimful.status("VmRSS"), fds=brimful.fds())
    else:
        loop.run_until_complete(attack())
    loop.close()
    ok = sorted(x for x in latencies if x is not None)
    result.update(
        probes=len(latencies), failed=len(latencies) - len(ok), peak=brimful.status("VmHWM"), exact_peak=exact,
        p50=statistics.median(ok) * 1000 if ok else None,
        p99=ok[min(len(ok) - 1, int(len(ok) * 0.99))] * 1000 if ok else None,
        max=ok[-1] * 1000 if ok else None,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", choices=["brimful", "plain"], default="brimful")
    parser.add_argument("--connections", type=int, default=200, help="attackers per phase")
    parser.add_argument("--idle", type=int, default=6000, help="idle connections in the idle phase")
    parser.add_argument("--seconds", type=float, default=10.0, help="probing time per phase")
    parser.add_argument("--phases", default="baseline,slowloris,header,body,idle")
    parser.add_argument("--fd-limit", type=int, default=4096,
                        help="the server's RLIMIT_NOFILE (soft and hard): the idle phase goes past it")
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    print(f"load average before: {os.getloadavg()}")
    tmp = Path(subprocess.check_output(["mktemp", "-d"], text=True).strip())
    with FakeVLLM(record=False) as fake:
        proc_class = PlainProcess if args.server == "plain" else BrimfulProcess
        brimful = proc_class(fake.base_url, tmp, QWEN3, fd_limit=args.fd_limit)
        try:
            for _ in range(50):                                 # models known, tokenizer loaded
                if probe_once(brimful.port, chat=True) is not None:
                    break
                time.sleep(0.2)
            print(f"server: {args.server} (fd limit {args.fd_limit}); {args.connections} attackers, "
                  f"{args.idle} idle, {args.seconds:g} s each")
            print(f"{'phase':<10} {'probes':>6} {'failed':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
                  f"{'RSS MiB':>8} {'peak MiB':>9} {'fds':>6}")
            for kind in args.phases.split(","):
                count = args.idle if kind == "idle" else args.connections
                r = phase(brimful, kind, count, args.seconds)

                def ms(value: object) -> str:
                    return f"{value:8.1f}" if isinstance(value, float) else f"{'-':>8}"

                print(f"{kind:<10} {r['probes']:>6} {r['failed']:>6} {ms(r['p50'])} {ms(r['p99'])} {ms(r['max'])} "
                      f"{int(r['rss']) / 1024:8.0f} {int(r['peak']) / 1024:9.0f}"   # type: ignore[call-overload]
                      f"{'' if r['exact_peak'] else '*'} {r['fds']:>6}", flush=True)
        finally:
            brimful.stop()
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
