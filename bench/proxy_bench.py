"""What brimful costs per request, side by side with direct and a bare pass-through.

One command, on this machine, pinned like the issue's reference figures: the
load generators (`wrk` for plain requests, `hey` for streams, this process for
the timed-stream and long-prompt phases) and the fake upstream share core 0;
the proxy under test gets core 1 alone.  Targets:

  direct    client -> fake vLLM (bench/fake_upstream.py), the baseline
  bare      client -> bench/bare_proxy.py (Starlette + aiohttp, no counting) -> fake
  litellm   client -> LiteLLM's proxy (with --litellm: one worker, `hosted_vllm/`, its defaults) -> fake
  baseline  client -> another brimful tree (with --baseline-root) -> fake
  brimful   client -> `brimful serve` (one worker, Qwen3-8B tokenizer, length log on) -> fake

Scenarios (each target, medians over --rounds, spread shown as min-max):
  chat-197B   non-streamed 197-byte chat, 64 connections: req/s, CPU ms per request
              (utime+stime of the proxy process from /proc, over completed requests)
  chat-4KB    the same with a 4 KB (~800-token) chat
  p50@1conn   both bodies at 1 connection: p50/p99 latency, "added" = target - direct
  stream      34-event SSE streams (client asks for usage), 64 connections: streams/s, CPU ms per stream
  stream-strip  the client does not ask for usage: brimful asks the upstream and removes
              that event (the default `request_stream_usage`)
  paced       streams with 20 ms between events (a real token rate), 8 at a time:
              added time to first byte and added inter-chunk delay
  long-mix    small requests at 1 connection, alone and while 2 connections send
              23k-token chats: p50/p99, and the ratio the issue bounds (<= 1.5x)
  unique-100k  --unique chats of ~100k tokens (~420 KB) per round that share no text with
              anything sent before, one at a time on one connection: proxy CPU per request
              (ns, from schedstat) and its ratio to tokenizers' `encode_batch_fast` of the
              same rendered text, measured in this process (issue 28's whole-proxy ratio)
Each round runs the light-load scenarios (p50@1conn, paced, long-mix, unique-100k) of a target
before its 64-connection ones: latency right after a saturating burst is not the
steady state (see WRK_ENV).
Once per run (not proxied): counting cost vs the tokenizer's own encode of the
rendered text; tokenizer load time per model; brimful's RSS with 3 tokenizers
loaded and 1,000 idle keep-alive connections.

    python bench/proxy_bench.py                      # 5 rounds of 5 s per measurement (~10 min)
    python bench/proxy_bench.py --rounds 1 --duration 5
    python bench/proxy_bench.py --only chat-197B,stream --brimful-root /tmp/perf-main
    python bench/proxy_bench.py --only chat-197B,chat-4KB --baseline-root /tmp/main   # two brimfuls, one run
    python bench/proxy_bench.py --only chat-197B,chat-4KB --litellm ~/.cache/brimful/litellm/bin/litellm
    python bench/proxy_bench.py --only chat-197B,chat-4KB,unique-100k --targets bare,brimful   # issue 28's rows

LiteLLM is not a dependency of brimful: its proxy comes from a venv of its own,
`python3 -m venv ~/.cache/brimful/litellm && ~/.cache/brimful/litellm/bin/pip install 'litellm[proxy]==1.108.7'`
(~760 MB; it starts in ~11 s, with no network).

Needs `wrk` and `hey` (Debian packages; bench/run.sh installs them).  A benchmark,
not a test: figures depend on the machine and on whatever else runs on it, so
the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
MODELS_DIR = SHARED / "models"
QWEN3 = MODELS_DIR / "Qwen--Qwen3-8B"
THREE_MODELS = {"qwen3": "Qwen--Qwen3-8B", "deepseek-v3": "deepseek-ai--DeepSeek-V3.1",
                "phi3-mini": "microsoft--Phi-3-mini-4k-instruct"}
LOAD_CORE, PROXY_CORE = "0", "1"
MODEL = "tiny-qwen"
MAX_MODEL_LEN = 32768
LONG_MODEL, LONG_MAX_MODEL_LEN = "agent-qwen3", 131072    # unique-100k's, and bench/agent_bench.py's model
# baseline: brimful from --baseline-root; litellm: LiteLLM's proxy from --litellm
TARGETS = ("direct", "bare", "litellm", "baseline", "brimful")
LITELLM_VERSION = "1.108.7"     # the version the figures in docs/performance.md were taken with
SCENARIOS = ("chat-197B", "chat-4KB", "p50@1conn", "stream", "stream-strip", "paced", "long-mix", "unique-100k",
             "workers", "counting", "startup", "memory")
CLK_TCK = os.sysconf("SC_CLK_TCK")
FILLER = ("Why does ice float on water? Explain density, hydrogen bonds and the open hexagonal lattice of "
          "ice in plain words for a curious reader, with one everyday example. ")


# ---------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all its threads) from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK   # fields 14 and 15 of stat(5)


def children(pid: int) -> list[int]:
    """The direct children of a process (its threads' children lists, Linux >= 3.5)."""
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(c) for c in f.read().split()]
    except OSError:
        pass
    return found


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and of its living descendants (the workers of `--workers N`)."""
    total = 0.0
    for p in [pid, *children(pid)]:
        try:
            total += cpu_seconds(p) if p == pid else tree_cpu_seconds(p)
        except OSError:
            pass
    return total


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class Server:
    name: str
    proc: subprocess.Popen
    port: int
    log: Path
    headers: dict[str, str] = field(default_factory=dict)     # what every request to it carries (LiteLLM's key)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def spawn(name: str, argv: list[str], core: str, port: int, workdir: Path,
          env: dict[str, str] | None = None, ready_path: str = "/health", timeout: float = 60) -> Server:
    log = workdir / f"{name}.log"
    proc = subprocess.Popen(["taskset", "-c", core, *argv], stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, **(env or {})}, cwd=str(ROOT))
    server = Server(name, proc, port, log)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(server.url + ready_path, timeout=2) as r:
                if r.status == 200:
                    return server
        except OSError:
            time.sleep(0.05)
    server.stop()
    raise RuntimeError(f"{name} did not answer {ready_path} within {timeout:.0f} s: {log.read_text()[-2000:]}")


def post(url: str, body: bytes, timeout: float = 30,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def brimful_command() -> list[str]:
    script = Path(sys.executable).with_name("brimful")
    return [str(script) if script.exists() else (shutil.which("brimful") or "brimful"), "serve"]


def write_brimful_config(path: Path, upstream: str, models: dict[str, Path], length_log: Path | None,
                          piece_cache: bool = False, chat_cache: bool = False, root: Path = ROOT) -> None:
    """brimful's config for the bench.  The per-piece and chat-count caches are off unless
    asked for: the bench repeats one body, which a cache would count once and never again,
    so with them on the figures would show the cost of a cache hit, not of counting.
    (`root`: the brimful source tree run; one without the chat cache gets no key for it.)"""
    lines = ["[upstream]", f'url = "{upstream}"', "", "[logging]", 'level = "warning"', ""]
    # The steady state: under "auto" a server moves to fastokens once counting has paid for its load
    # (tokenizer_cache._encoder.DeferredEncoder); a bench of seconds would measure the move.
    tokenizers = ['engine = "fastokens"']
    if not piece_cache:
        tokenizers.append("piece_cache_entries = 0")
    if not chat_cache and "chat_cache_entries" in (root / "proxy" / "config.py").read_text():
        tokenizers.append("chat_cache_entries = 0")
    lines += ["[tokenizers]", *tokenizers, ""]
    if length_log is not None:
        lines += ["[length_log]", f'path = "{length_log}"', ""]
    for name, directory in models.items():
        lines += [f'[models."{name}"]', f'tokenizer = "{directory}"', ""]
    path.write_text("\n".join(lines))


# ---------------------------------------------------------------------------
# Request bodies
# ---------------------------------------------------------------------------

def chat_body(count: Callable[[dict], int], size: int | None = None, tokens: int | None = None,
              stream: bool = False, usage: bool = False, max_tokens: int = 65535) -> bytes:
    """A chat request of exactly `size` bytes (or about `tokens` prompt tokens).

    It carries `"user":"prompt-tokens-N"` with brimful's own count, so the fake
    reports the same usage and brimful logs no drift (see fake_upstream.py).
    max_tokens 65535 is more than max_model_len: brimful clamps and rewrites
    the body, its most expensive non-failing path.
    """
    def build(content: str, n: int) -> dict:
        body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": content}],
                                "max_tokens": max_tokens, "user": f"prompt-tokens-{n}"}
        if stream:
            body["stream"] = True
            if usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def encode(body: dict) -> bytes:
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()

    if tokens is not None:
        content = FILLER * max(1, tokens // 35)
        while count(build(content, 0)) < tokens:
            content += FILLER
        return encode(build(content, count(build(content, 0))))
    assert size is not None
    content = (FILLER * (size // len(FILLER) + 1))[: max(1, size - 120)]
    for _ in range(50):   # the count's digits change the size: converge on exactly `size` bytes
        body = build(content, count(build(content, 0)))
        missing = size - len(encode(body))
        if missing == 0:
            break
        content = (FILLER * (size // len(FILLER) + 2))[: max(1, len(content) + missing)]
    return encode(body)


# ---------------------------------------------------------------------------
# Load generators
# ---------------------------------------------------------------------------

WRK_SCRIPT = """
local f = io.open("{body}", "rb")
wrk.method = "POST"
wrk.body = f:read("*a")
f:close()
wrk.headers["Content-Type"] = "application/json"
{headers}"""

_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def _ms(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    return float(m.group(1)) * _UNITS[m.group(2)] if m else float("nan")


# glibc malloc settings for wrk itself.  Without them, a 1-connection wrk run
# started right after a 64-connection burst against brimful reported a p99 of
# 1.3-53 ms for its first seconds (31 of 31 runs; ~0.8 ms once settled); with
# them in wrk, 0.66-1.16 ms (12 of 12, three with them in wrk alone), while the
# same settings in brimful, the fake upstream or both changed nothing (9 runs):
# the stalls were the load generator's, not the proxy's.
WRK_ENV = {"MALLOC_TRIM_THRESHOLD_": "4000000000", "MALLOC_TOP_PAD_": "268435456"}


def run_wrk(url: str, body_file: Path, connections: int, duration: float, workdir: Path,
            headers: dict[str, str] | None = None) -> dict[str, float]:
    script = workdir / f"{body_file.stem}{'-headers' if headers else ''}.lua"
    if not script.exists():
        lines = "".join(f'wrk.headers["{k}"] = "{v}"\n' for k, v in (headers or {}).items())
        script.write_text(WRK_SCRIPT.format(body=body_file, headers=lines))
    out = subprocess.run(
        # --timeout: wrk's 2 s would count a slow proxy's answers (LiteLLM's at 64 connections) as errors
        ["taskset", "-c", LOAD_CORE, "wrk", "-t1", f"-c{connections}", f"-d{duration:g}s", "--timeout", "60s",
         "--latency", "-s", str(script), url], capture_output=True, text=True, timeout=duration + 60,
        env={**os.environ, **WRK_ENV},
    ).stdout
    result = {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
              "requests": int(re.search(r"(\d+) requests in", out).group(1))}
    for q in ("50", "99"):
        m = re.search(rf"^\s+{q}(?:\.000)?%\s+(\S+)", out, re.M)
        result[f"p{q}"] = _ms(m.group(1)) if m else float("nan")
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: (.*)", out)
    if bad or errors:
        raise RuntimeError(f"wrk saw failures against {url}:\n{out}")
    return result


def run_hey(url: str, body_file: Path, connections: int, duration: float,
            headers: dict[str, str] | None = None) -> dict[str, float]:
    extra = [arg for k, v in (headers or {}).items() for arg in ("-H", f"{k}: {v}")]
    out = subprocess.run(
        ["taskset", "-c", LOAD_CORE, "hey", "-z", f"{duration:g}s", "-c", str(connections), "-m", "POST",
         "-T", "application/json", *extra, "-D", str(body_file), url],
        capture_output=True, text=True, timeout=duration + 60,
    ).stdout
    statuses = dict(re.findall(r"\[(\d+)\]\s+(\d+) responses", out))
    if set(statuses) - {"200"}:
        raise RuntimeError(f"hey saw non-200 answers from {url}:\n{out}")
    done = int(statuses.get("200", 0))
    if re.search(r"Error distribution:", out):
        # hey -z cancels requests in flight when the time is up; count only completed ones.
        pass
    return {"rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)), "requests": done}


async def timed_streams(url: str, body: bytes, concurrency: int, duration: float, gap_ms: float,
                        headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Time to first body byte and gaps between arriving chunks, `concurrency` streams at a time."""
    import aiohttp

    sent = {"content-type": "application/json", **(headers or {})}
    ttfb: list[float] = []
    gaps: list[float] = []
    chunks_per_stream: list[int] = []
    stop_at = time.perf_counter() + duration

    async def one(session: aiohttp.ClientSession, offset: float) -> None:
        # Staggered starts: streams begun in the same instant would measure their own queueing.
        await asyncio.sleep(offset)
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            async with session.post(url, data=body, headers=sent) as r:
                assert r.status == 200, r.status
                last = None
                n = 0
                async for _ in r.content.iter_any():
                    now = time.perf_counter()
                    if last is None:
                        ttfb.append((now - start) * 1000)
                    else:
                        gaps.append((now - last) * 1000)
                    last = now
                    n += 1
                chunks_per_stream.append(n)

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i * gap_ms / 1000 / concurrency) for i in range(concurrency)))
    return {"ttfb_p50": pct(ttfb, 50), "ttfb_p99": pct(ttfb, 99), "gap_p50": pct(gaps, 50),
            "gap_p99": pct(gaps, 99), "chunks": statistics.median(chunks_per_stream), "streams": len(ttfb)}


async def small_while_long(url_small: str, small: bytes, url_long: str | None, long_body: bytes,
                           long_connections: int, duration: float,
                           headers: dict[str, str] | None = None) -> dict[str, Any]:
    """Sequential small requests (1 connection); optionally long ones on other connections."""
    import aiohttp

    sent = {"content-type": "application/json", **(headers or {})}

    lat: list[float] = []
    long_lat: list[float] = []
    stop_at = time.perf_counter() + duration

    async def small_loop(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            async with session.post(url_small, data=small, headers=sent) as r:
                await r.read()
                assert r.status == 200, r.status
            lat.append((time.perf_counter() - start) * 1000)

    async def long_loop(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            async with session.post(url_long, data=long_body, headers=sent) as r:
                await r.read()
                assert r.status == 200, r.status
            long_lat.append((time.perf_counter() - start) * 1000)

    async with aiohttp.ClientSession() as s1, aiohttp.ClientSession() as s2:
        jobs = [small_loop(s1)] + ([long_loop(s2) for _ in range(long_connections)] if url_long else [])
        await asyncio.gather(*jobs)
    return {"p50": pct(lat, 50), "p99": pct(lat, 99), "n": len(lat),
            "long_p50": pct(long_lat, 50) if long_lat else None, "long_n": len(long_lat)}


# ---------------------------------------------------------------------------
# Statistics and printing
# ---------------------------------------------------------------------------

def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Series:
    values: list[float] = field(default_factory=list)

    def add(self, v: float) -> None:
        self.values.append(v)

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def spread(self, digits: int) -> str:
        if len(self.values) < 2:
            return ""
        lo, hi = min(self.values), max(self.values)
        rel = statistics.pstdev(self.values) / self.median * 100 if self.median else float("nan")
        return f"{lo:.{digits}f}-{hi:.{digits}f} (±{rel:.0f}%)"


Results = dict[tuple[str, str, str], Series]    # (scenario, target, metric) -> per-round values


def fmt(v: float | None, digits: int) -> str:
    return "-" if v is None or v != v else f"{v:,.{digits}f}"


def _times(ratio: float | None) -> str:
    """A ratio column's cell: "-" where the row it divides by was not measured (no direct target)."""
    return "-" if ratio is None or ratio != ratio else f"{ratio:.2f}x"


def print_table(title: str, rows: list[tuple[str, str, int]], results: Results, scenario: str,
                ratio_metric: str | None = None, added: tuple[str, ...] = ()) -> None:
    """One block per scenario: a row per target, a column per metric (median, spread)."""
    present = [t for t in TARGETS if any((scenario, t, m) in results for _, m, _ in rows)]
    if not present:
        return
    print(f"\n== {title}")
    header = f"{'target':<10}" + "".join(f"{label:>30}" for label, _, _ in rows)
    if ratio_metric:
        header += f"{'vs direct':>11}"
    cpu_vs_bare = any((scenario, "bare", m) in results for _, m, _ in rows if m == "cpu_ms")
    if cpu_vs_bare:
        header += f"{'CPU / bare':>11}"
    for metric in added:
        header += f"{'added ' + metric:>16}"
    print(header)
    for target in present:
        line = f"{target:<10}"
        for _, metric, digits in rows:
            s = results.get((scenario, target, metric))
            cell = f"{fmt(s.median, digits)}" if s else "-"
            spread = s.spread(digits) if s else ""
            line += f"{cell + (' ' + spread if spread else ''):>30}"
        if ratio_metric:
            base = results.get((scenario, "direct", ratio_metric))
            mine = results.get((scenario, target, ratio_metric))
            line += f"{_times(mine.median / base.median if base and mine else None):>11}"
        if cpu_vs_bare:
            base, mine = results.get((scenario, "bare", "cpu_ms")), results.get((scenario, target, "cpu_ms"))
            line += f"{_times(mine.median / base.median if base and mine else None):>11}"
        for metric in added:
            base = results.get((scenario, "direct", metric))
            mine = results.get((scenario, target, metric))
            line += f"{fmt(mine.median - base.median if base and mine else None, 3):>13} ms"
        print(line)


def loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# ---------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------

def measure_wrk(results: Results, scenario: str, target: str, server: Server, url: str, body_file: Path,
                connections: int, duration: float, workdir: Path, cpu_label: str = "cpu_ms") -> None:
    before = tree_cpu_seconds(server.proc.pid)
    r = run_wrk(url, body_file, connections, duration, workdir, server.headers)
    used = tree_cpu_seconds(server.proc.pid) - before
    results.setdefault((scenario, target, "rps"), Series()).add(r["rps"])
    results.setdefault((scenario, target, cpu_label), Series()).add(used * 1000 / max(1, r["requests"]))
    results.setdefault((scenario, target, "p50"), Series()).add(r["p50"])
    results.setdefault((scenario, target, "p99"), Series()).add(r["p99"])


def measure_hey(results: Results, scenario: str, target: str, server: Server, url: str, body_file: Path,
                connections: int, duration: float) -> None:
    before = tree_cpu_seconds(server.proc.pid)
    r = run_hey(url, body_file, connections, duration, server.headers)
    used = tree_cpu_seconds(server.proc.pid) - before
    results.setdefault((scenario, target, "rps"), Series()).add(r["rps"])
    results.setdefault((scenario, target, "cpu_ms"), Series()).add(used * 1000 / max(1, r["requests"]))


@dataclass
class UniqueChat:
    """One unseen ~100k-token chat: its body, brimful's full count of it, and encode_batch_fast's CPU ms."""
    body: bytes
    tokens: int
    encode_ms: float


def unique_chats(tok: Any, first_seed: int, count: int) -> list[UniqueChat]:
    """bench/agent_bench.py's unique chats (own system prompt, tools and turns; model LONG_MODEL)."""
    from agent_bench import encode_cpu_ms, unique_chat  # bench/ is sys.path[0]; it imports this module

    chats = []
    for seed in range(first_seed, first_seed + count):
        body = unique_chat(seed, 400_000)
        chats.append(UniqueChat(json.dumps(body, ensure_ascii=False).encode(), tok.count_chat(body),
                                encode_cpu_ms(tok, body)))
    return chats


def measure_unique(results: Results, target: str, server: Server, chats: list[UniqueChat]) -> None:
    """Each chat once, one after the other on one kept-alive connection: the proxy's CPU for each (every
    thread's schedstat, ns) and that over encode_batch_fast's; a brimful tree's count must be the full one."""
    from agent_bench import task_cpu_ns

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=120)
    try:
        for chat in chats:
            before = task_cpu_ns(server.proc.pid)
            conn.request("POST", "/v1/chat/completions", body=chat.body,
                         headers={"content-type": "application/json", **server.headers})
            response = conn.getresponse()
            response.read()
            used = (task_cpu_ns(server.proc.pid) - before) / 1e6
            counted = int(response.headers.get("x-brimful-prompt-tokens", -1))
            if response.status != 200 or (target in ("brimful", "baseline") and counted != chat.tokens):
                raise SystemExit(f"unique-100k via {target}: status {response.status}, counted {counted}, "
                                 f"full count {chat.tokens}")
            results.setdefault(("unique-100k", target, "cpu_ms"), Series()).add(used)
            results.setdefault(("unique-100k", target, "ebf"), Series()).add(used / chat.encode_ms)
    finally:
        conn.close()


def measure_workers(results: Results, scenario: str, label: str, server: Server, fake: Server, body_file: Path,
                    connections: int, duration: float, workdir: Path) -> None:
    """req/s and proxy CPU per request, plus what the load generator and the fake used (in cores),
    and how evenly the workers shared the work (least / most CPU of one worker)."""
    workers = children(server.proc.pid)
    per_worker = [tree_cpu_seconds(w) for w in workers]
    load_before = cpu_seconds(fake.proc.pid) + _children_cpu()
    before = tree_cpu_seconds(server.proc.pid)
    started = time.perf_counter()
    r = run_wrk(server.url + "/v1/chat/completions", body_file, connections, duration, workdir)
    wall = time.perf_counter() - started
    used = tree_cpu_seconds(server.proc.pid) - before
    load = cpu_seconds(fake.proc.pid) + _children_cpu() - load_before
    results.setdefault((scenario, label, "rps"), Series()).add(r["rps"])
    results.setdefault((scenario, label, "cpu_ms"), Series()).add(used * 1000 / max(1, r["requests"]))
    results.setdefault((scenario, label, "proxy_cores"), Series()).add(used / wall)
    results.setdefault((scenario, label, "load_cores"), Series()).add(load / wall)
    if len(workers) > 1:
        shares = [tree_cpu_seconds(w) - b for w, b in zip(workers, per_worker, strict=True)]
        results.setdefault((scenario, label, "balance"), Series()).add(min(shares) / max(shares))


def _children_cpu() -> float:
    """CPU of this process's finished children: the wrk and hey runs."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def print_workers(results: Results, labels: tuple[str, str], connections: int) -> None:
    one, many = labels
    if not any(k[1] == many for k in results):
        return
    print(f"\n== brimful, {one} (core {PROXY_CORE}; load + fake on core {LOAD_CORE}) vs {many} "
          f"(one per core; load + fake still on core {LOAD_CORE}), {connections} connections")
    print(f"{'body':<11}{'':<13}{'req/s':>26}{'CPU ms/req':>26}{'proxy cores':>13}{'load cores':>12}"
          f"{'balance':>9}")
    for scen in ("chat-197B", "chat-4KB"):
        key = f"workers-{scen}"
        for label in labels:
            rps, cpu = results.get((key, label, "rps")), results.get((key, label, "cpu_ms"))
            if rps is None or cpu is None:
                continue
            bal = results.get((key, label, "balance"))
            print(f"{scen:<11}{label:<13}{fmt(rps.median, 0) + ' ' + rps.spread(0):>26}"
                  f"{fmt(cpu.median, 3) + ' ' + cpu.spread(3):>26}"
                  f"{fmt(results[(key, label, 'proxy_cores')].median, 2):>13}"
                  f"{fmt(results[(key, label, 'load_cores')].median, 2):>12}"
                  f"{(fmt(bal.median, 2) if bal else '-'):>9}")
        a, b = results.get((key, one, "rps")), results.get((key, many, "rps"))
        ca, cb = results.get((key, one, "cpu_ms")), results.get((key, many, "cpu_ms"))
        if a and b and ca and cb:
            pairs = [y / x for x, y in zip(a.values, b.values, strict=True)]
            print(f"{'':<11}{many + ' / ' + one:<24} req/s {statistics.median(pairs):.2f}x "
                  f"({min(pairs):.2f}-{max(pairs):.2f}), CPU per request {cb.median / ca.median:.2f}x")



def counting_cost(rounds: int) -> None:
    """brimful's count vs the tokenizer's own encode of the rendered text (same process)."""
    sys.path.insert(0, str(ROOT))
    from tokenizer_cache import load_model_tokenizer

    tok = load_model_tokenizer(QWEN3)
    print("\n== counting cost vs the tokenizer's own encode of the rendered text (Qwen3-8B, in-process, median)")
    print(f"{'prompt':<10}{'tokens':>8}{'count_chat':>13}{'render':>10}{'encode':>10}"
          f"{'encode_batch_fast':>19}{'count/encode':>14}{'count/fast':>12}")
    for label, spec in (("197 B", {"size": 197}), ("4 KB", {"size": 4096}), ("23k tok", {"tokens": 23000}),
                        ("100k tok", {"tokens": 100000})):
        body = json.loads(chat_body(tok.count_chat, **spec))
        text = tok.render_chat(body)
        n = tok.count_chat(body)
        reps = max(rounds * 4, 5) if n < 50000 else rounds

        def timed(fn: Callable[[], Any], reps: int = reps) -> float:
            fn()
            samples = []
            for _ in range(reps):
                t = time.perf_counter()
                fn()
                samples.append(time.perf_counter() - t)
            return statistics.median(samples) * 1000

        t_count = timed(lambda body=body: tok.count_chat(body))
        t_render = timed(lambda body=body: tok.render_chat(body))
        t_encode = timed(lambda text=text: tok.tokenizer.encode(text, add_special_tokens=False))
        t_fast = timed(lambda text=text: tok.tokenizer.encode_batch_fast([text], add_special_tokens=False))
        print(f"{label:<10}{n:>8}{t_count:>10.3f} ms{t_render:>7.3f} ms{t_encode:>7.3f} ms{t_fast:>16.3f} ms"
              f"{t_count / t_encode:>13.2f}x{t_count / t_fast:>11.2f}x")


def startup_and_memory(workdir: Path, do_startup: bool, do_memory: bool, idle: int) -> None:
    sys.path.insert(0, str(ROOT))
    if do_startup:
        from tokenizer_cache import load_model_tokenizer
        print("\n== tokenizer load time (in-process, first load; brimful loads each once per model)")
        for directory in THREE_MODELS.values():
            t = time.perf_counter()
            load_model_tokenizer(MODELS_DIR / directory)
            print(f"{directory:<40}{(time.perf_counter() - t) * 1000:>9.0f} ms")
    fake_port, hr_port = free_port(), free_port()
    fake = spawn("fake3", [sys.executable, "bench/fake_upstream.py", "--port", str(fake_port)]
                 + [a for name in THREE_MODELS for a in ("--model", f"{name}=32768")], LOAD_CORE, fake_port, workdir)
    config = workdir / "brimful3.toml"
    write_brimful_config(config, fake.url, {n: MODELS_DIR / d for n, d in THREE_MODELS.items()}, None)
    t0 = time.perf_counter()
    hr = None
    try:
        hr = spawn("brimful3", [*brimful_command(), "--config", str(config), "--port", str(hr_port),
                                 "--log-level", "info"], PROXY_CORE, hr_port, workdir)
        listening = time.perf_counter() - t0
        rss_start = rss_mib(hr.proc.pid)   # the background preload may already be under way
        firsts = {}
        for name in THREE_MODELS:
            body = json.dumps({"model": name, "messages": [{"role": "user", "content": "Hello!"}],
                               "max_tokens": 8}).encode()
            t = time.perf_counter()
            status, _, _ = post(hr.url + "/v1/chat/completions", body, timeout=120)
            firsts[name] = (time.perf_counter() - t) * 1000
            assert status == 200, status
        ready = time.perf_counter() - t0
        rss_loaded = rss_mib(hr.proc.pid)
        log_text = hr.log.read_text()
        loads = re.findall(r"^\S+ (\S+) INFO brimful.counting: model (\S+): tokenizer ", log_text, re.M)
        known = re.search(r"^\S+ (\S+) INFO brimful.limits: model", log_text, re.M)
        if do_startup:
            print(f"\n== brimful start-up: listening after {listening:.2f} s; first answer per model "
                  + ", ".join(f"{n} {ms:.0f} ms" for n, ms in firsts.items())
                  + f"; all three answered after {ready:.2f} s")
            if known:
                t_prev = _clock(known.group(1))
                for stamp, model in loads:
                    print(f"   preload {model}: {(_clock(stamp) - t_prev) * 1000:.0f} ms (from the log)")
                    t_prev = _clock(stamp)
            print(f"   tokenizer loads logged: {len(loads)} for {len(THREE_MODELS)} models")
        if do_memory:
            rss_conns = asyncio.run(_idle_connections(hr.port, idle, lambda: rss_mib(hr.proc.pid)))
            print(f"\n== brimful RSS: {rss_start:.0f} MiB at start, {rss_loaded:.0f} MiB with 3 tokenizers loaded "
                  f"(+{rss_loaded - rss_start:.0f}), {rss_conns:.0f} MiB with {idle} idle keep-alive connections "
                  f"(+{rss_conns - rss_loaded:.1f}, {(rss_conns - rss_loaded) * 1024 / idle:.1f} KiB each)")
    finally:
        if hr is not None:
            hr.stop()
        fake.stop()


def _clock(stamp: str) -> float:
    h, m, rest = stamp.split(":")
    sec, _, ms = rest.partition(",")
    return int(h) * 3600 + int(m) * 60 + int(sec) + int(ms or 0) / 1000


async def _idle_connections(port: int, count: int, rss: Callable[[], float]) -> float:
    """Open `count` connections, make one request on each, keep them open idle, read RSS."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, count + 256)), hard))
    writers = []
    try:
        for _ in range(count):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"GET /health HTTP/1.1\r\nhost: bench\r\n\r\n")
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head[:40]
            writers.append(writer)
        await asyncio.sleep(0.5)    # let the server settle (not a synchronisation: RSS is only read)
        return rss()
    finally:
        for w in writers:
            w.close()


def spawn_baseline(args: argparse.Namespace, upstream: str, workdir: Path) -> Server:
    """brimful from --baseline-root, configured as the measured one, on the proxy core too."""
    root = args.baseline_root.resolve()
    config = workdir / "baseline.toml"
    write_brimful_config(config, upstream, {MODEL: QWEN3, LONG_MODEL: QWEN3},
                         None if args.no_length_log else workdir / "baseline-lengths.jsonl", args.piece_cache,
                         args.chat_cache, root)
    port = free_port()
    return spawn("baseline", [*brimful_command(), "--config", str(config), "--port", str(port)], PROXY_CORE,
                 port, workdir, {"PYTHONPATH": str(root)})


def spawn_litellm(command: Path, upstream: str, workdir: Path) -> Server:
    """LiteLLM's proxy in front of the fake, as its docs set up a vLLM server (`hosted_vllm/`), one
    worker on the proxy core, its other settings its defaults.  It refuses to start without a master
    key: one made for this run, sent as every request's bearer token.  The model cost map is read from
    the package, not fetched (no network here)."""
    config = workdir / "litellm.yaml"
    config.write_text("model_list:\n" + "".join(f"""  - model_name: {name}
    litellm_params:
      model: hosted_vllm/{name}
      api_base: {upstream}/v1
      api_key: none
""" for name in (MODEL, LONG_MODEL)) + """litellm_settings:
  telemetry: false
""")
    key = "sk-bench-" + secrets.token_hex(16)
    port = free_port()
    server = spawn("litellm", [str(command), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
                               "--num_workers", "1"], PROXY_CORE, port, workdir,
                   {"LITELLM_MASTER_KEY": key, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
                   ready_path="/health/liveliness", timeout=180)
    server.headers = {"Authorization": f"Bearer {key}"}
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per measurement")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--only", help="comma-separated scenarios: " + ",".join(SCENARIOS))
    parser.add_argument("--targets", default=",".join(TARGETS))
    parser.add_argument("--brimful-root", type=Path, default=None,
                        help="run brimful from this source tree (e.g. a private copy with a patch)")
    parser.add_argument("--baseline-root", type=Path, default=None,
                        help="also run brimful from this source tree (target 'baseline', e.g. a worktree of main)")
    parser.add_argument("--litellm", type=Path, default=os.environ.get("BRIMFUL_BENCH_LITELLM") or None,
                        help="also run LiteLLM's proxy (target 'litellm'): the `litellm` command of a venv with "
                        f"litellm[proxy]=={LITELLM_VERSION} (default: $BRIMFUL_BENCH_LITELLM)")
    parser.add_argument("--no-length-log", action="store_true", help="run brimful without its length log")
    parser.add_argument("--piece-cache", action="store_true",
                        help="keep brimful's per-piece count cache on (the bench repeats one body: all hits)")
    parser.add_argument("--chat-cache", action="store_true",
                        help="keep brimful's chat-count cache on (the bench repeats one body: all hits)")
    parser.add_argument("--workers", type=int, default=2, help="the 'workers' scenario: 1 worker against this many")
    parser.add_argument("--event-gap-ms", type=float, default=20.0, help="pause between events in 'paced'")
    parser.add_argument("--idle-connections", type=int, default=1000)
    parser.add_argument("--unique", type=int, default=3, help="the 'unique-100k' scenario: chats per round")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    args = parser.parse_args(argv)
    only = set(args.only.split(",")) if args.only else set(SCENARIOS)
    unknown = only - set(SCENARIOS)
    if unknown:
        parser.error(f"unknown scenarios {sorted(unknown)}; known: {', '.join(SCENARIOS)}")
    # the baseline and LiteLLM run only where there is one to run: the default target list names them
    given = {"baseline": args.baseline_root, "litellm": args.litellm}
    targets = [t for t in args.targets.split(",") if t in TARGETS and given.get(t, True)]
    if args.baseline_root and "baseline" not in targets:
        targets.insert(targets.index("brimful") if "brimful" in targets else len(targets), "baseline")
    for tool in ("wrk", "hey", "taskset"):
        if shutil.which(tool) is None:
            parser.error(f"'{tool}' is not installed (bench/run.sh installs wrk and hey with apt-get)")
    if os.cpu_count() is None or os.cpu_count() < 2:
        parser.error("needs 2 cores: core 0 for load + fake, core 1 for the proxy")
    os.sched_setaffinity(0, {int(LOAD_CORE)})    # this process is a load generator too

    sys.path.insert(0, str(ROOT))
    from tokenizer_cache import load_model_tokenizer
    tok = load_model_tokenizer(QWEN3)

    workdir = Path(tempfile.mkdtemp(prefix="brimful-bench-"))
    bodies = {
        "chat-197B": chat_body(tok.count_chat, size=197),
        "chat-4KB": chat_body(tok.count_chat, size=4096),
        "stream": chat_body(tok.count_chat, size=197, stream=True, usage=True),
        "stream-strip": chat_body(tok.count_chat, size=197, stream=True),
        "long": chat_body(tok.count_chat, tokens=23000),
    }
    files = {}
    for name, body in bodies.items():
        files[name] = workdir / f"{name}.json"
        files[name].write_bytes(body)

    print(f"brimful proxy bench: {args.rounds} round(s) x {args.duration:g} s, {args.connections} connections; "
          f"load+fake on core {LOAD_CORE}, proxy on core {PROXY_CORE}")
    print(f"bodies: chat-197B {len(bodies['chat-197B'])} B, chat-4KB {len(bodies['chat-4KB'])} B "
          f"({tok.count_chat(json.loads(bodies['chat-4KB']))} tokens), long "
          f"{len(bodies['long']) // 1024} KiB ({tok.count_chat(json.loads(bodies['long']))} tokens); "
          f"brimful from {args.brimful_root or ROOT}, piece cache {'on' if args.piece_cache else 'off'}, "
          f"chat cache {'on' if args.chat_cache else 'off'}")
    print(f"load average before: {loadavg()}")
    started = time.perf_counter()

    servers: dict[str, Server] = {}
    results: Results = {}
    proxied = only & {"chat-197B", "chat-4KB", "p50@1conn", "stream", "stream-strip", "paced", "long-mix",
                      "unique-100k", "workers"}
    root = (args.brimful_root or ROOT).resolve()
    many = f"{args.workers} workers"
    labels = ("1 worker", many)
    try:
        if proxied:
            fake_port = free_port()
            fake = spawn("fake", [sys.executable, "bench/fake_upstream.py", "--port", str(fake_port),
                                  "--model", f"{MODEL}={MAX_MODEL_LEN}",
                                  "--model", f"{LONG_MODEL}={LONG_MAX_MODEL_LEN}"], LOAD_CORE, fake_port, workdir)
            servers["direct"] = fake
            if "bare" in targets:
                port = free_port()
                servers["bare"] = spawn("bare", [sys.executable, "bench/bare_proxy.py", "--upstream", fake.url,
                                                 "--port", str(port)], PROXY_CORE, port, workdir)
            if "litellm" in targets:
                servers["litellm"] = spawn_litellm(args.litellm, fake.url, workdir)
            if "brimful" in targets:
                port = free_port()
                config = workdir / "brimful.toml"
                write_brimful_config(config, fake.url, {MODEL: QWEN3, LONG_MODEL: QWEN3},
                                      None if args.no_length_log else workdir / "lengths.jsonl", args.piece_cache,
                                      args.chat_cache, root)
                env = {}
                if args.brimful_root:
                    env["PYTHONPATH"] = str(root)
                servers["brimful"] = spawn("brimful", [*brimful_command(), "--config", str(config),
                                                         "--port", str(port)], PROXY_CORE, port, workdir, env)
                if "baseline" in targets:
                    servers["baseline"] = spawn_baseline(args, fake.url, workdir)
                status, headers, _ = post(servers["brimful"].url + "/v1/chat/completions", bodies["chat-197B"])
                assert status == 200 and headers.get("x-brimful-action") == "clamped", (status, headers)
                if "workers" in only:
                    # Every core for the workers: one each, pinned, the load generator and the
                    # fake staying on core 0 (nowhere else to go on 2 cores; their CPU is shown).
                    port = free_port()
                    multi = spawn("brimful-multi", [*brimful_command(), "--config", str(config), "--port",
                                                     str(port), "--workers", str(args.workers)],
                                  ",".join(str(c) for c in range(os.cpu_count() or 2)), port, workdir, env,
                                  ready_path="/ready")
                    for i, pid in enumerate(sorted(children(multi.proc.pid))):
                        os.sched_setaffinity(pid, {i % (os.cpu_count() or 2)})
                    servers[many] = multi
                    run_wrk(multi.url + "/v1/chat/completions", files["chat-197B"], args.connections, 1, workdir)
            # and one unseen long chat, not measured: in a fresh brimful the first body counted on the
            # counting threads cost 33-58 ms of CPU, against ~3.5 ms for the next ones
            warm = unique_chats(tok, 29_999, 1) if "unique-100k" in only else []
            for t in targets:   # warm up every path once
                run_wrk(servers[t].url + "/v1/chat/completions", files["chat-197B"], args.connections, 1, workdir,
                        servers[t].headers)
                if warm:
                    measure_unique({}, t, servers[t], warm)

        for rnd in range(args.rounds if proxied else 0):
            # New chats each round (every target sees the same ones, each in a process of its own).
            chats = unique_chats(tok, 30_000 + rnd * args.unique, args.unique) if "unique-100k" in only else []
            for t in targets:
                s, url = servers[t], servers[t].url + "/v1/chat/completions"
                # Light-load scenarios first, so that no latency figure is taken in the
                # seconds right after a saturating burst (see WRK_ENV for what those
                # seconds showed); this target's previous burst ended a round ago.
                if "p50@1conn" in only:
                    for scen in ("chat-197B", "chat-4KB"):
                        measure_wrk(results, f"1conn-{scen}", t, s, url, files[scen], 1, args.duration, workdir)
                if "paced" in only:
                    # The client asks for usage: with the strip path the removed usage event would
                    # show as one doubled gap per stream, not a delay brimful adds.
                    r = asyncio.run(timed_streams(f"{url}?gap_ms={args.event_gap_ms:g}", bodies["stream"],
                                                  8, args.duration, args.event_gap_ms, s.headers))
                    for k, v in r.items():
                        results.setdefault(("paced", t, k), Series()).add(v)
                if "long-mix" in only:
                    alone = asyncio.run(small_while_long(url, bodies["chat-197B"], None, b"", 0, args.duration,
                                                         s.headers))
                    mixed = asyncio.run(small_while_long(url, bodies["chat-197B"], url, bodies["long"], 2,
                                                         args.duration, s.headers))
                    for k in ("p50", "p99"):
                        results.setdefault(("long-alone", t, k), Series()).add(alone[k])
                        results.setdefault(("long-mix", t, k), Series()).add(mixed[k])
                    results.setdefault(("long-mix", t, "ratio_p99"), Series()).add(mixed["p99"] / alone["p99"])
                    results.setdefault(("long-mix", t, "long_p50"), Series()).add(mixed["long_p50"] or float("nan"))
                    results.setdefault(("long-mix", t, "long_n"), Series()).add(mixed["long_n"])
                if chats:
                    measure_unique(results, t, s, chats)
                for scen in ("chat-197B", "chat-4KB"):
                    if scen in only:
                        measure_wrk(results, scen, t, s, url, files[scen], args.connections, args.duration, workdir)
                for scen in ("stream", "stream-strip"):
                    if scen in only:
                        measure_hey(results, scen, t, s, url, files[scen], args.connections, args.duration)
            if many in servers:
                for scen in ("chat-197B", "chat-4KB"):
                    for label, server in zip(labels, (servers["brimful"], servers[many]), strict=True):
                        measure_workers(results, f"workers-{scen}", label, server, servers["direct"], files[scen],
                                        args.connections, args.duration, workdir)
            print(f"  round {rnd + 1}/{args.rounds} done ({time.perf_counter() - started:.0f} s, load {loadavg()})",
                  flush=True)
    finally:
        for s in servers.values():
            s.stop()

    print_table(f"non-streamed 197 B chat (clamped + rewritten), {args.connections} connections",
                [("req/s", "rps", 0), ("CPU ms/req", "cpu_ms", 3)], results, "chat-197B", ratio_metric="rps")
    print_table(f"non-streamed 4 KB chat (clamped + rewritten), {args.connections} connections",
                [("req/s", "rps", 0), ("CPU ms/req", "cpu_ms", 3)], results, "chat-4KB", ratio_metric="rps")
    print_table("197 B chat at 1 connection (latency, ms)", [("p50", "p50", 3), ("p99", "p99", 3)],
                results, "1conn-chat-197B", added=("p50",))
    print_table("4 KB chat at 1 connection (latency, ms)", [("p50", "p50", 3), ("p99", "p99", 3)],
                results, "1conn-chat-4KB", added=("p50",))
    print_table(f"34-event streams, client asks for usage, {args.connections} connections",
                [("streams/s", "rps", 0), ("CPU ms/stream", "cpu_ms", 3)], results, "stream", ratio_metric="rps")
    print_table(f"streams, client does not ask for usage (brimful asks and strips), {args.connections} connections",
                [("streams/s", "rps", 0), ("CPU ms/stream", "cpu_ms", 3)], results, "stream-strip",
                ratio_metric="rps")
    print_table(f"paced streams ({args.event_gap_ms:g} ms between events, 8 at a time), ms",
                [("TTFB p50", "ttfb_p50", 3), ("gap p50", "gap_p50", 3), ("gap p99", "gap_p99", 3),
                 ("chunks/stream", "chunks", 0)], results, "paced", added=("ttfb_p50", "gap_p50", "gap_p99"))
    print_table("small 197 B requests alone (1 connection), ms", [("p50", "p50", 3), ("p99", "p99", 3)],
                results, "long-alone")
    print_table("... while 2 connections send 23k-token chats, ms",
                [("p50", "p50", 3), ("p99", "p99", 3), ("p99 / alone", "ratio_p99", 2),
                 ("long p50", "long_p50", 1), ("long reqs", "long_n", 0)], results, "long-mix")
    print_table(f"unique ~100k-token chats (~420 KB), one at a time, {args.unique} per round",
                [("CPU ms/req", "cpu_ms", 2), ("/ encode_batch_fast", "ebf", 3)], results, "unique-100k")

    print_workers(results, labels, args.connections)
    if "counting" in only:
        counting_cost(args.rounds)
    if only & {"startup", "memory"}:
        startup_and_memory(workdir, "startup" in only, "memory" in only, args.idle_connections)
    print(f"\nload average after: {loadavg()}; {time.perf_counter() - started:.0f} s in all")
    if args.keep:
        print(f"logs and bodies kept in {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
