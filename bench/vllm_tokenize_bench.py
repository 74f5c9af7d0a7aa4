"""brimful's count_chat against vLLM 0.32's own POST /tokenize, same chat, same run.

    python bench/vllm_tokenize_bench.py [--rounds 5]

Starts the real vLLM CPU server of the tests (tests/realvllm: tiny random
Qwen3 model with the real Qwen3-8B tokenizer and template; /tokenize does
not enforce max_model_len) and sends it chats of about 10k and 100k tokens
of code, prose and Korean.  For vLLM: wall time of the HTTP request and the
CPU its process tree spent on it (/proc).  For brimful: CPU of count_chat
in this process, first on a text the engine has not seen (a fresh engine)
and then again.  Counts must agree.  Not a test: the machine is shared, so
each figure is a median of --rounds with its min-max spread.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import tempfile
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.engine_bench import (  # noqa: E402
    MODELS,
    _chat_body,
    source_texts,
    text_of_tokens,
    unseen_warmup,
)
from tests.realvllm.fixture import prepare  # noqa: E402
from tests.realvllm.server import SERVED_MODEL_NAME, running_server  # noqa: E402
from tokenizer_cache import load_model_tokenizer  # noqa: E402
from tokenizer_cache._encoder import select_encoder  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu_seconds(pid: int) -> float:
    """utime + stime of `pid` and its descendants (Linux /proc)."""
    children: dict[int, list[int]] = {}
    stats: dict[int, float] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
        stats[int(entry.name)] = (int(fields[11]) + int(fields[12])) / TICKS
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        total += stats.get(current, 0.0)
        todo += children.get(current, [])
    return total


def tokenize(base_url: str, body: dict) -> tuple[int, float]:
    payload = json.dumps({"model": SERVED_MODEL_NAME, **body}).encode()
    request = urllib.request.Request(f"{base_url}/tokenize", data=payload, headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=300) as response:
        answer = json.loads(response.read())
    return answer["count"], time.perf_counter() - start


def spread(values: list[float]) -> str:
    return f"{statistics.median(values) * 1e3:8.1f} ({min(values) * 1e3:.1f}-{max(values) * 1e3:.1f})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    directory = MODELS / "Qwen--Qwen3-8B"
    spec = (directory / "tokenizer.json").read_text(encoding="utf-8")
    model = load_model_tokenizer(directory, engine="fastokens")
    sources = source_texts()
    with tempfile.TemporaryDirectory() as logs:
        python, model_dir, _ = prepare(pathlib.Path(logs))
        with running_server(python, model_dir, pathlib.Path(logs) / "vllm.log") as server:
            print(f"vLLM 0.32 /tokenize vs brimful count_chat ({model.engine}), Qwen3-8B tokenizer and template; "
                  f"ms, median (min-max) of {args.rounds}; load average {os.getloadavg()[0]:.1f}")
            print(f"{'text':7} {'tokens':>7} {'vLLM wall':>22} {'vLLM CPU':>22} {'brimful cold CPU':>22} "
                  f"{'warm CPU':>20} {'wall/cold':>9} {'CPU/cold':>9}")
            for kind in ("code", "prose", "korean"):
                for target in (10_000, 100_000):
                    body = _chat_body(text_of_tokens(model.tokenizer, sources[kind], target))
                    expected = model.count_chat(body)
                    walls, cpus, colds, warms = [], [], [], []
                    tokenize(server.base_url, body)  # vLLM's own first sight of the text
                    for _ in range(args.rounds):
                        before = tree_cpu_seconds(server.process.pid)
                        count, wall = tokenize(server.base_url, body)
                        cpus.append(tree_cpu_seconds(server.process.pid) - before)
                        walls.append(wall)
                        assert count == expected, (kind, target, count, expected)
                        fresh = model.with_encoder(select_encoder(model.tokenizer, spec, engine=model.engine))
                        fresh.count_chat(_chat_body(unseen_warmup(sources, kind)))
                        start = time.process_time()
                        fresh.count_chat(body)
                        colds.append(time.process_time() - start)
                        start = time.process_time()
                        model.count_chat(body)
                        warms.append(time.process_time() - start)
                    cold = statistics.median(colds)
                    print(f"{kind:7} {expected:7d} {spread(walls):>22} {spread(cpus):>22} {spread(colds):>22} "
                          f"{spread(warms):>20} {statistics.median(walls) / cold:9.1f} "
                          f"{statistics.median(cpus) / cold:9.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
