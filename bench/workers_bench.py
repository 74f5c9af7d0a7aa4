"""How `--workers N` should share one port: a SO_REUSEPORT socket per worker, or one shared socket.

Three ways, the same app, config and load:

  reuseport    `brimful serve --workers N`: one SO_REUSEPORT socket per worker, the
               kernel hashes each new connection to one of them
  fork-shared  brimful's supervisor with ONE socket every worker accepts from
  uvicorn      uvicorn's `workers=N` (spawned processes, one shared socket)

Per mode:

  connections  how the client's keep-alive connections ended up spread over the
               workers (from `ss`, sampled mid-run): the most-loaded worker's share
  req/s        wrk, chat-197B body, fixed connections (keep-alive)
  CPU balance  the least-busy worker's CPU over the busiest's during the run
  fresh        the same with a new connection per request (hey -disable-keepalive):
               req/s and CPU balance

Everything shares the machine's cores (the load generator and the fake
upstream too): this compares the two ways of sharing a port, it is not the
1-vs-2-worker scaling figure (bench/proxy_bench.py --only workers).

    python bench/workers_bench.py [--rounds 3] [--duration 5] [--workers 2] [--connections 64]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import (
    MAX_MODEL_LEN,
    MODEL,
    QWEN3,
    ROOT,
    Server,
    brimful_command,
    chat_body,
    children,
    free_port,
    loadavg,
    run_wrk,
    spawn,
    tree_cpu_seconds,
    write_brimful_config,
)

ALL_CORES = ",".join(str(c) for c in range(os.cpu_count() or 2))
CONFIG_ENV = "BRIMFUL_BENCH_CONFIG"


def app():  # type: ignore[no-untyped-def]
    """uvicorn's factory for its `workers=` mode: the same BrimfulApp `brimful serve` builds."""
    from proxy.app import BrimfulApp
    from proxy.config import load_config

    return BrimfulApp(load_config(os.environ[CONFIG_ENV]))


MODES = ("reuseport", "fork-shared", "uvicorn")


def serve_shared(config_path: str, port: int, workers: int) -> int:
    """brimful's supervisor and workers, all accepting from one shared socket."""
    import socket

    from proxy.cli import worker_runner
    from proxy.config import load_config
    from proxy.logs import configure_logging
    from proxy.workers.supervisor import BACKLOG, Supervisor

    config = load_config(config_path)
    configure_logging(config.logging.level, config.logging.json)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(BACKLOG)
    return Supervisor([sock], worker_runner(config), Path(tempfile.mkdtemp()), count=workers).run()


def start(mode: str, config: Path, workers: int, workdir: Path) -> Server:
    port = free_port()
    if mode == "fork-shared":
        argv = [sys.executable, __file__, "--serve-shared", str(config), str(port), str(workers)]
        return spawn(mode, argv, ALL_CORES, port, workdir, ready_path="/ready")
    if mode == "reuseport":
        argv = [*brimful_command(), "--config", str(config), "--port", str(port), "--workers", str(workers)]
        return spawn(mode, argv, ALL_CORES, port, workdir, ready_path="/ready")
    code = (f"import uvicorn; uvicorn.run('workers_bench:app', factory=True, host='127.0.0.1', port={port}, "
            f"workers={workers}, app_dir={str(Path(__file__).parent)!r}, log_level='warning', access_log=False, "
            "server_header=False, date_header=False, proxy_headers=False)")
    return spawn(mode, [sys.executable, "-c", code], ALL_CORES, port, workdir, env={CONFIG_ENV: str(config)},
                 ready_path="/ready")


def serving_pids(server: Server, workers: int) -> list[int]:
    """The worker processes (uvicorn's spawn mode also starts a resource tracker: not a worker)."""
    found = [p for p in children(server.proc.pid) if "resource_tracker" not in _cmdline(p)]
    assert len(found) == workers, (found, workers)
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def connections_per_pid(port: int) -> dict[int, int]:
    out = subprocess.run(["ss", "-tnpH", "state", "established", f"( sport = :{port} )"],
                         capture_output=True, text=True).stdout
    counts: dict[int, int] = {}
    for pid in re.findall(r"pid=(\d+)", out):
        counts[int(pid)] = counts.get(int(pid), 0) + 1
    return counts


def balance(before: dict[int, float], pids: list[int]) -> float:
    used = [tree_cpu_seconds(p) - before[p] for p in pids]
    return min(used) / max(used) if max(used) > 0 else float("nan")


def keepalive_round(server: Server, pids: list[int], body: Path, connections: int, duration: float,
                    workdir: Path) -> dict[str, float]:
    before = {p: tree_cpu_seconds(p) for p in pids}
    seen: dict[int, int] = {}

    def sample() -> None:
        time.sleep(duration / 2)          # mid-run: every wrk connection is open
        seen.update(connections_per_pid(server.port))

    sampler = threading.Thread(target=sample)
    sampler.start()
    r = run_wrk(server.url + "/v1/chat/completions", body, connections, duration, workdir)
    sampler.join()
    spread = [seen.get(p, 0) for p in pids]
    return {"rps": r["rps"], "top_share": max(spread) / max(1, sum(spread)), "balance": balance(before, pids)}


def fresh_round(server: Server, pids: list[int], body: Path, connections: int, duration: float) -> dict[str, float]:
    before = {p: tree_cpu_seconds(p) for p in pids}
    out = subprocess.run(["hey", "-z", f"{duration:g}s", "-c", str(connections), "-disable-keepalive", "-m", "POST",
                          "-T", "application/json", "-D", str(body), server.url + "/v1/chat/completions"],
                         capture_output=True, text=True, timeout=duration + 60).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    return {"fresh_rps": rps, "fresh_balance": balance(before, pids)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--serve-shared", nargs=3, metavar=("CONFIG", "PORT", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_shared:
        config_path, port, workers = args.serve_shared
        return serve_shared(config_path, int(port), int(workers))
    sys.path.insert(0, str(ROOT))
    from tokenizer_cache import load_model_tokenizer

    workdir = Path(tempfile.mkdtemp(prefix="brimful-workers-bench-"))
    body = workdir / "chat-197B.json"
    body.write_bytes(chat_body(load_model_tokenizer(QWEN3).count_chat, size=197))
    print(f"workers bench: {args.workers} workers, {args.connections} connections, {args.rounds} rounds x "
          f"{args.duration:g} s; load average {loadavg()}")
    fake_port = free_port()
    fake = spawn("fake", [sys.executable, "bench/fake_upstream.py", "--port", str(fake_port),
                          "--model", f"{MODEL}={MAX_MODEL_LEN}"], ALL_CORES, fake_port, workdir)
    config = workdir / "brimful.toml"
    write_brimful_config(config, fake.url, {MODEL: QWEN3}, workdir / "lengths.jsonl")
    results: dict[str, dict[str, list[float]]] = {}
    try:
        for mode in args.modes.split(","):
            server = start(mode, config, args.workers, workdir)
            try:
                pids = serving_pids(server, args.workers)
                run_wrk(server.url + "/v1/chat/completions", body, args.connections, 1, workdir)   # warm up
                for _ in range(args.rounds):
                    for key, value in {**keepalive_round(server, pids, body, args.connections, args.duration,
                                                         workdir),
                                       **fresh_round(server, pids, body, args.connections, args.duration)}.items():
                        results.setdefault(mode, {}).setdefault(key, []).append(value)
            finally:
                server.stop()
    finally:
        fake.stop()

    print(f"\n{'mode':<11}{'busiest worker: share of conns':>32}{'req/s':>22}{'CPU balance':>20}"
          f"{'fresh req/s':>22}{'fresh balance':>20}")
    for mode, r in results.items():
        def med(key: str, digits: int, r: dict[str, list[float]] = r) -> str:
            values = r[key]
            return f"{statistics.median(values):,.{digits}f} ({min(values):,.{digits}f}-{max(values):,.{digits}f})"
        print(f"{mode:<11}{med('top_share', 2):>32}{med('rps', 0):>22}{med('balance', 2):>20}"
              f"{med('fresh_rps', 0):>22}{med('fresh_balance', 2):>20}")
    print(f"(a perfect spread: share {1 / args.workers:.2f}, balance 1.00); load average after {loadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
