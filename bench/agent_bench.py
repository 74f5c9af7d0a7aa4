"""An agent session through `brimful serve`: proxy CPU per turn against turn number.

    python bench/agent_bench.py [--turns 50] [--sessions 3] [--brimful-root /work/main] [--unique 3] [--rounds 3]
                                [--connections both|keep-alive|per-turn] [--interleave] [--bare]
                                [--workers 1 --workers 2]

The shape of a coding agent (Claude Code, Codex) at the chat surface: 20
tools, a system prompt of 400 sentences, a task, then per turn one assistant
tool call and one tool result of 4-9 KB appended; every request resends the
whole conversation (turn 50 is ~85k Qwen3 tokens, ~350 KB of JSON).  Each
session is sent turn by turn, one request at a time, to `brimful serve` (one
worker, Qwen3-8B tokenizer, its default caches on, length log on) in front of
bench/fake_upstream.py; --sessions distinct sessions (same system prompt and
tools, different turns: what one agent deployment sees) are run one after
the other.  Agents differ in how they connect: through a relay counting
connections, Claude Code 2.1.197 sent 5 requests of one session over 2
connections, Codex 0.171.0 opened one per request.  `--connections both` (the
default) runs each tree both ways: each session over one kept-alive
connection, and one connection per request.

With --interleave the sessions' turns alternate (turn 1 of every session, then turn 2, ...), as the
agents of one deployment do, all opening with the same system prompt and tools.

With --workers N (repeatable) brimful runs as `serve --workers N`, all its processes on the proxy's
core, and the CPU is the sum over the supervisor and its workers.  Each worker has its own render
memo: with one connection per request the kernel spreads a session's turns over the workers, so a
worker renders the turns it has not seen since it last served that session.

With --bare, bench/bare_proxy.py (Starlette + aiohttp, no counting) runs the same sessions first in
each round: what any Python hop pays per turn to receive and forward bodies that grow to ~400 KB, the
floor under brimful's own growth with the conversation.

Per turn it prints the proxy's CPU time for that request (the sum over its
threads of /proc/<pid>/task/*/schedstat, nanoseconds, read before and after
each request; the clock-tick figures of /proc/<pid>/stat are 10 ms coarse),
median over the sessions, for each `--brimful-root` given (main's tree beside
this one makes the baseline of the same run), and checks that every count
brimful answered (`x-brimful-prompt-tokens`) equals a full count of the same
request made here with no cache at all.

With --unique N it then sends N chats of ~100k tokens (~420 KB) that share no
text with anything sent before (their own system prompt, tools and turns) and
prints the proxy's CPU for each against tokenizers' `encode_batch_fast` of the
same rendered text, measured in this process (the issue's whole-proxy ratio).

Not a test: figures depend on the machine and on whatever else runs on it.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from proxy_bench import (
    LOAD_CORE,
    LONG_MAX_MODEL_LEN,
    LONG_MODEL,
    PROXY_CORE,
    ROOT,
    Server,
    brimful_command,
    free_port,
    loadavg,
    spawn,
)

# The shared models folder beside the checkout (a worktree sits one level deeper).
QWEN3 = next((p for p in (ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B",
                          ROOT.parents[1] / "shared" / "models" / "Qwen--Qwen3-8B") if p.is_dir()),
             ROOT.parent / "shared" / "models" / "Qwen--Qwen3-8B")
MODEL, MAX_MODEL_LEN = LONG_MODEL, LONG_MAX_MODEL_LEN   # proxy_bench's unique-100k sends this module's chats
MAX_TOKENS = 16384

_WORDS = (  # noqa: SIM905 - a pool of words, read as one string
    "the agent must read each file before it edits it and keep the change small so that a reviewer can "
    "follow why it was made when a test fails report the exact command and the first error line never "
    "guess a path list the directory first prefer the project's own helpers over new code run the linter "
    "and the type checker after every edit and say what they found when the user asks for a plan give "
    "numbered steps with the files each step touches and stop before running anything destructive"
).split()
_CODE = [
    "def load(path: str) -> dict:\n    with open(path, encoding='utf-8') as handle:\n"
    "        return json.load(handle)\n",
    "for index, row in enumerate(rows):\n    if row.get('status') != 200:\n        failures.append((index, row))\n",
    "class Budget:\n    def __init__(self, limit: int) -> None:\n        self.limit = limit\n        self.used = 0\n",
    "async def fetch(session, url):\n    async with session.get(url, timeout=30) as response:\n"
    "        return await response.json()\n",
    "    assert response.status_code == 400, response.text\n    assert 'max_model_len' in response.text\n",
]
_LOG = "{date} {level:<5} {module}: request {rid} took {ms} ms ({tokens} prompt tokens, status {status})\n"
_TOOL_NAMES = ["read_file", "write_file", "edit_file", "list_directory", "glob", "grep", "run_shell", "run_tests",
               "git_status", "git_diff", "git_log", "web_fetch", "web_search", "todo_write", "ask_user",
               "notebook_edit", "python_eval", "open_url", "create_task", "finish"]


def sentence(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(9, 22))
    return " ".join(words).capitalize() + "."


def system_prompt(rng: random.Random, sentences: int = 400) -> str:
    paragraphs = [" ".join(sentence(rng) for _ in range(10)) for _ in range(sentences // 10)]
    return "You are a coding agent working in the user's repository.\n\n" + "\n\n".join(paragraphs)


def tools(rng: random.Random) -> list[dict[str, Any]]:
    out = []
    for name in _TOOL_NAMES:
        props = {f"arg_{j}": {"type": rng.choice(["string", "integer", "boolean"]),
                              "description": sentence(rng)} for j in range(rng.randint(2, 5))}
        out.append({"type": "function", "function": {
            "name": name, "description": " ".join(sentence(rng) for _ in range(3)),
            "parameters": {"type": "object", "properties": props, "required": sorted(props)[:1]}}})
    return out


def tool_result(rng: random.Random) -> str:
    """4-9 KB of what tools return: code, log lines, prose."""
    size = rng.randint(4096, 9216)
    parts: list[str] = []
    length = 0
    while length < size:
        roll = rng.random()
        if roll < 0.12:
            part = rng.choice(_CODE).replace("load", rng.choice(["load", "read", "parse"]))
        elif roll < 0.18:
            part = _LOG.format(date=f"2026-12-0{rng.randint(1, 9)}T0{rng.randint(0, 9)}:{rng.randint(10, 59)}",
                               level=rng.choice(["INFO", "WARN", "ERROR"]), module=rng.choice(_TOOL_NAMES),
                               rid=f"{rng.getrandbits(48):012x}", ms=rng.randint(1, 900),
                               tokens=rng.randint(10, 90000), status=rng.choice([200, 200, 400, 503]))
        else:
            part = sentence(rng) + " " + sentence(rng) + "\n"
        parts.append(part)
        length += len(part)
    return "".join(parts)[:size]


def session(seed: int, turns: int) -> list[dict[str, Any]]:
    """The request bodies of one session, turn by turn (each holds the whole conversation)."""
    shared = random.Random(1)          # system prompt and tools: the same in every session
    system, tool_list = system_prompt(shared), tools(shared)
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system},
                                      {"role": "user", "content": " ".join(sentence(rng) for _ in range(4))}]
    bodies = []
    for turn in range(turns):
        name = rng.choice(_TOOL_NAMES)
        arguments = json.dumps({"path": f"src/module_{rng.randint(1, 99)}.py", "reason": sentence(rng)})
        call_id = f"call_{seed}_{turn}"
        messages.append({"role": "assistant", "content": sentence(rng), "tool_calls": [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": tool_result(rng)})
        bodies.append({"model": MODEL, "messages": [dict(m) for m in messages], "tools": tool_list,
                       "max_tokens": MAX_TOKENS})
    return bodies


def unique_chat(seed: int, chars: int) -> dict[str, Any]:
    """A chat of about `chars` characters of JSON whose every text is drawn from `seed` alone."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system_prompt(rng)}]
    size = len(messages[0]["content"])
    while size < chars:
        role = "user" if len(messages) % 2 else "assistant"
        messages.append({"role": role, "content": tool_result(rng)})
        size += len(messages[-1]["content"])
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": sentence(rng)})
    return {"model": MODEL, "messages": messages, "tools": tools(rng), "max_tokens": MAX_TOKENS}


def task_cpu_ns(pid: int) -> int:
    """Nanoseconds on CPU of every thread of `pid` and of its children's (schedstat's first field):
    the workers of `serve --workers N` are the supervisor's children."""
    total = 0
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return 0   # a process that just ended
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{task}/children") as f:
                total += sum(task_cpu_ns(int(child)) for child in f.read().split())
        except OSError:
            pass   # a thread that just ended
    return total


def encode_cpu_ms(full: Any, body: dict[str, Any], rounds: int = 3) -> float:
    """Median CPU ms (this process, all threads) of tokenizers' encode_batch_fast of the chat's rendered text."""
    rendered = full.render_chat(body)
    times = []
    for _ in range(rounds):
        before = time.process_time()
        full.tokenizer.encode_batch_fast([rendered], add_special_tokens=False)
        times.append((time.process_time() - before) * 1000)
    return statistics.median(times)


class Client:
    """POSTs to one URL over one kept-alive connection (`keep_alive`), or a new connection each time."""

    def __init__(self, url: str, keep_alive: bool) -> None:
        self.url, self.keep_alive = url, keep_alive
        parts = urllib.parse.urlsplit(url)
        self._host, self._port, self._path = parts.hostname or "127.0.0.1", parts.port, parts.path
        self._connection: http.client.HTTPConnection | None = None

    def post(self, body: bytes) -> tuple[int, dict[str, str]]:
        if not self.keep_alive:
            return post(self.url, body)
        if self._connection is None:
            self._connection = http.client.HTTPConnection(self._host, self._port, timeout=120)
        self._connection.request("POST", self._path, body=body, headers={"content-type": "application/json"})
        response = self._connection.getresponse()
        response.read()
        return response.status, dict(response.headers)

    def close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None


def post(url: str, body: bytes) -> tuple[int, dict[str, str]]:
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read()
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as exc:
        exc.read()
        return exc.code, dict(exc.headers)


def write_config(path: Path, upstream: str) -> None:
    path.write_text("\n".join([
        "[upstream]", f'url = "{upstream}"', "", "[logging]", 'level = "warning"', "",
        "[tokenizers]", 'engine = "fastokens"', "",   # the steady state of "auto" (DeferredEncoder)
        "[length_log]", f'path = "{path.parent / "lengths.jsonl"}"', "",
        f'[models."{MODEL}"]', f'tokenizer = "{QWEN3}"', ""]))


def request_order(sessions: list[list[bytes]], interleave: bool, unique: bool) -> list[tuple[int, int]]:
    """(session, turn) in the order sent: each session whole, one after the other, or (`interleave`)
    turn 1 of every session, then turn 2, ...; the unique chats' row (the last, if `unique`) after all."""
    rows = len(sessions) - unique
    if interleave:
        order = [(row, turn) for turn in range(max(map(len, sessions[:rows]), default=0))
                 for row in range(rows) if turn < len(sessions[row])]
    else:
        order = [(row, turn) for row in range(rows) for turn in range(len(sessions[row]))]
    return order + [(rows, turn) for turn in range(len(sessions[rows]))] if unique else order


def run_target(root: Path | None, fake: Server, sessions: list[list[bytes]], counts: list[list[int]],
               workdir: Path, keep_alive: bool, order: list[tuple[int, int]], workers: int = 1) -> list[list[float]]:
    """CPU ms per request, [session][turn], of one brimful tree (None: bench/bare_proxy.py, which
    counts nothing: what any Python hop pays to carry the same bodies); checks every count brimful
    answers.  The unique chats, if any, come as one more row after the sessions' (counts: their full
    counts last).  `keep_alive`: each session (and the unique chats) over a connection of its own;
    `order`: the (session, turn) of each request (`request_order`); `workers`: `serve --workers`."""
    port = free_port()
    if root is None:
        server = spawn("bare", [sys.executable, str(ROOT / "bench" / "bare_proxy.py"), "--upstream", fake.url,
                                "--port", str(port)], PROXY_CORE, port, workdir)
    else:
        config = workdir / "brimful.toml"
        write_config(config, fake.url)
        server = spawn("brimful", [*brimful_command(), "--config", str(config), "--port", str(port),
                                   "--workers", str(workers)], PROXY_CORE, port, workdir, {"PYTHONPATH": str(root)})
    url = server.url + "/v1/chat/completions"
    try:
        warm = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}).encode()
        for _ in range(3 * workers):      # a connection each: every worker likely served one
            assert post(url, warm)[0] == 200
        clients = [Client(url, keep_alive) for _ in sessions]
        table: list[list[float]] = [[] for _ in sessions]
        for row, turn in order:
            before = task_cpu_ns(server.proc.pid)
            status, headers = clients[row].post(sessions[row][turn])
            table[row].append((task_cpu_ns(server.proc.pid) - before) / 1e6)
            got, full = int(headers.get("x-brimful-prompt-tokens", -1)), counts[row][turn]
            if status != 200 or (root is not None and got != full):
                raise SystemExit(f"{root or 'bare'}: status {status}, counted {got}, full count {full}")
        for client in clients:
            client.close()
        return table
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--brimful-root", type=Path, action="append",
                        help="a brimful source tree to run (repeatable; default: this one)")
    parser.add_argument("--unique", type=int, default=0, help="then this many unseen ~100k-token chats")
    parser.add_argument("--rounds", type=int, default=1,
                        help="run every target this many times, in alternation (medians over all rounds)")
    parser.add_argument("--unique-chars", type=int, default=400_000, help="characters of text in each")
    parser.add_argument("--connections", choices=("keep-alive", "per-turn", "both"), default="both",
                        help="one connection per session (as Claude Code) or one per request (as Codex), or both")
    parser.add_argument("--interleave", action="store_true",
                        help="send turn 1 of every session, then turn 2, ... (agents of one deployment at once)")
    parser.add_argument("--workers", type=int, action="append",
                        help="run brimful as `serve --workers N` (repeatable; default: 1)")
    parser.add_argument("--bare", action="store_true",
                        help="also run bench/bare_proxy.py (no counting): the CPU of carrying the same bodies")
    args = parser.parse_args(argv)
    roots: list[Path | None] = [r.resolve() for r in (args.brimful_root or [ROOT])]
    worker_counts = args.workers or [1]
    if args.bare:
        roots.insert(0, None)
    os.sched_setaffinity(0, {int(LOAD_CORE)})
    sys.path.insert(0, str(ROOT))
    from tokenizer_cache import load_model_tokenizer
    full = load_model_tokenizer(QWEN3, engine="fastokens")  # no piece cache, no chat cache: a full count

    plain = [session(100 + s, args.turns) for s in range(args.sessions)]
    counts = [[full.count_chat(body) for body in bodies] for bodies in plain]
    sessions = []
    for bodies, expected in zip(plain, counts, strict=True):
        # `user` carries the count for the fake's usage, so brimful sees no drift.
        sessions.append([json.dumps({**b, "user": f"prompt-tokens-{n}"}, separators=(",", ":"),
                                    ensure_ascii=False).encode() for b, n in zip(bodies, expected, strict=True)])
    print(f"agent bench: {args.sessions} sessions x {args.turns} turns; turn 1 {counts[0][0]:,} tokens "
          f"({len(sessions[0][0]) // 1024} KiB), turn {args.turns} {counts[0][-1]:,} tokens "
          f"({len(sessions[0][-1]) // 1024} KiB); load average {loadavg()}")
    unique = [unique_chat(10_000 + i, args.unique_chars) for i in range(args.unique)]
    unique_counts = [full.count_chat(body) for body in unique]
    ebf_ms = [encode_cpu_ms(full, body) for body in unique]
    if unique:
        sessions.append([json.dumps({**b, "user": f"prompt-tokens-{n}"}, separators=(",", ":"),
                                    ensure_ascii=False).encode() for b, n in zip(unique, unique_counts, strict=True)])
        counts.append(unique_counts)
        print(f"unique chats: {', '.join(f'{n:,}' for n in unique_counts)} tokens "
              f"({', '.join(str(len(b) // 1024) for b in sessions[-1])} KiB); "
              f"encode_batch_fast of their rendered text {', '.join(f'{ms:.0f}' for ms in ebf_ms)} ms CPU")
    workdir = Path(tempfile.mkdtemp(prefix="brimful-agent-"))
    fake_port = free_port()
    fake = spawn("fake", [sys.executable, str(ROOT / "bench" / "fake_upstream.py"), "--port", str(fake_port),
                          "--model", f"{MODEL}={MAX_MODEL_LEN}"], LOAD_CORE, fake_port, workdir)
    started = time.perf_counter()
    try:
        modes = {"keep-alive": [True], "per-turn": [False], "both": [True, False]}[args.connections]
        order = request_order(sessions, args.interleave, bool(unique))
        # Round after round, each target in turn with a fresh server: a slow spell of the shared
        # machine then falls on every target instead of on whichever ran during it.
        results: dict[str, list[list[float]]] = {}
        unique_rows: dict[str, list[list[float]]] = {}
        for _ in range(args.rounds):
            for root, workers in [(r, w) for r in roots for w in (worker_counts if r else [1])]:
                for keep in modes:
                    name = (f"{root or 'bare'}{f' w{workers}' if len(worker_counts) > 1 and root else ''} "
                            f"{'kept' if keep else 'per-turn'}")
                    table = run_target(root, fake, sessions, counts, workdir, keep, order, workers)
                    if unique:
                        unique_rows.setdefault(name, []).append(table.pop())
                    results.setdefault(name, []).extend(table)
    finally:
        fake.stop()
    if unique:
        print("\nunique chats: proxy CPU ms per request (and / encode_batch_fast of the rendered text)"
              + (f", median over {args.rounds} rounds" if args.rounds > 1 else ""))
        for label, rows in unique_rows.items():
            cells = [f"{ms:.1f} ({ms / ebf:.3f}x)" for ms, ebf in
                     zip((statistics.median(chat) for chat in zip(*rows, strict=True)), ebf_ms, strict=True)]
            print(f"{label[-22:]:>22}: " + ", ".join(cells))
    print_table(results, counts[0], args.turns)
    print(f"every count equal to a full count; {time.perf_counter() - started:.0f} s; load average {loadavg()}")
    return 0


def print_table(results: dict[str, list[list[float]]], tokens: list[int], turns: int) -> None:
    names = list(results)
    print("\nproxy CPU ms per request (median over sessions and rounds; first session's prompt tokens)")
    print(f"{'turn':>4} {'tokens':>8} " + " ".join(f"{n[-22:]:>22}" for n in names))
    shown = [t for t in range(1, turns + 1) if t in (1, 2, 3, 5) or t % 5 == 0]
    for t in shown:
        cells = [statistics.median(row[t - 1] for row in results[n]) for n in names]
        print(f"{t:>4} {tokens[t - 1]:>8,} " + " ".join(f"{c:>22.2f}" for c in cells))
    for n in names:
        medians = [statistics.median(row[t] for row in results[n]) for t in range(turns)]
        print(f"{n}: mean of turns 1-{min(10, turns)} {statistics.mean(medians[:10]):.2f} ms, "
              f"{max(turns - 9, 1)}-{turns} {statistics.mean(medians[-10:]):.2f} ms")


if __name__ == "__main__":
    sys.exit(main())
