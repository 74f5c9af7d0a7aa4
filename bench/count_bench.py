"""How fast brimful counts prompt tokens, and what a loaded tokenizer costs.

    python bench/count_bench.py [--models-root ../shared/models] [--rounds 5]

Prints, per model: tokenizer load time, template compile time, RSS added by
loading it; then count_chat latency at about 1k / 10k / 100k prompt tokens
(template rendering included) with tokens/s; then, for a 100k-token prompt,
whether counting blocks the asyncio event loop: plain `encode` on the loop,
`encode_batch([text])` in a thread, and a ProcessPoolExecutor worker, each
while a 1 ms timer task runs on the loop (its worst lag shows the blocking).

Not a test: numbers depend on the machine.  Medians of --rounds runs.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import gc
import os
import pathlib
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from tokenizers import Tokenizer

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenizer_cache import load_model_tokenizer  # noqa: E402
from tokenizer_cache._jinja import compile_template  # noqa: E402

DEFAULT_MODELS = ROOT.parent / "shared" / "models"
SEEDS = ROOT.parent / "shared" / "seeds"
MODELS = ["Qwen--Qwen3-8B", "deepseek-ai--DeepSeek-V3.1", "microsoft--Phi-3-mini-4k-instruct"]
TARGETS = [1_000, 10_000, 100_000]
ENGINE = "auto"  # --engine: which encoder load_model_tokenizer picks ("tokenizers" = as before fastokens)


def rss_bytes() -> int:
    """Resident set size from /proc (Linux), without third-party packages."""
    with open("/proc/self/statm") as handle:
        resident_pages = int(handle.read().split()[1])
    return resident_pages * os.sysconf("SC_PAGE_SIZE")


def median_seconds(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def seed_text() -> str:
    texts = [p.read_text(encoding="utf-8") for p in sorted(SEEDS.glob("*.txt"))]
    english = (
        "vLLM checks prompt plus max_tokens against max_model_len when a request arrives. "
        "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0\n"
    )
    return "\n".join(texts) + "\n" + english * 20


def text_of_tokens(tokenizer, base: str, target: int) -> str:
    """About `target` tokens of mixed Korean/English/code text."""
    per_copy = max(1, tokenizer.count_text(base, add_special_tokens=False))
    copies = max(1, round(target / per_copy))
    text = (base * (copies + 1))
    # trim to the target by characters, proportionally
    total = tokenizer.count_text(text, add_special_tokens=False)
    return text[: max(1, int(len(text) * target / total))]


def rss_added_by_loading(directory: pathlib.Path) -> int:
    """RSS after minus before loading one tokenizer, in a fresh interpreter
    (in this process the allocator reuses memory freed by earlier loads)."""
    out = subprocess.run(
        [sys.executable, __file__, "--engine", ENGINE, "--rss-of", str(directory)],
        check=True, capture_output=True, text=True,
    ).stdout
    return int(out.strip())


def _print_rss_of(directory: str) -> None:
    gc.collect()
    before = rss_bytes()
    model = load_model_tokenizer(directory, engine=ENGINE)
    gc.collect()
    print(rss_bytes() - before)
    del model


def bench_models(models_root: pathlib.Path, rounds: int) -> dict[str, Any]:
    print("== load / compile / memory (per model)")
    print(f"{'model':40} {'load s':>8} {'compile ms':>11} {'RSS +MiB':>9} {'in-process +MiB':>16}")
    loaded = {}
    for name in MODELS:
        directory = models_root / name
        gc.collect()
        before = rss_bytes()
        start = time.perf_counter()
        model = load_model_tokenizer(directory, engine=ENGINE)
        load_s = time.perf_counter() - start
        after = rss_bytes()
        source = next(iter(model._templates.values())).source
        compile_ms = median_seconds(lambda source=source: compile_template(source), rounds) * 1e3
        loaded[name] = model
        fresh = rss_added_by_loading(directory)
        print(f"{name:40} {load_s:8.3f} {compile_ms:11.2f} {fresh / 2**20:9.1f} {(after - before) / 2**20:16.1f}")
    return loaded


def bench_counting(loaded: dict[str, Any], rounds: int) -> str:
    print()
    print("== count_chat per request (template rendering + encode), median")
    print(f"{'model':40} {'tokens':>8} {'ms':>9} {'tokens/s':>12} {'µs/token':>9}")
    base = seed_text()
    long_text = ""
    for name, model in loaded.items():
        for target in TARGETS:
            text = text_of_tokens(model, base, target)
            body = {"messages": [{"role": "system", "content": "You are helpful."},
                                 {"role": "user", "content": text}]}
            tokens = model.count_chat(body)
            seconds = median_seconds(lambda model=model, body=body: model.count_chat(body), rounds)
            print(f"{name:40} {tokens:8d} {seconds * 1e3:9.2f} {tokens / seconds:12,.0f} "
                  f"{seconds / tokens * 1e6:9.2f}")
            if target == TARGETS[-1] and name == MODELS[0]:
                long_text = text
    render_ms = median_seconds(lambda: loaded[MODELS[0]].render_chat(
        {"messages": [{"role": "user", "content": "Hello"}]}), rounds * 20) * 1e3
    print(f"render only (short chat, {MODELS[0]}): {render_ms:.3f} ms")
    return long_text


_WORKER_TOKENIZER: Tokenizer | None = None


def _worker_init(path: str) -> None:
    global _WORKER_TOKENIZER
    _WORKER_TOKENIZER = Tokenizer.from_file(path)


def _worker_count(text: str) -> int:
    assert _WORKER_TOKENIZER is not None
    return len(_WORKER_TOKENIZER.encode(text, add_special_tokens=False).ids)


async def _with_ticker(job: Callable[[], Any]) -> tuple[float, float, int]:
    """Run `job` (a coroutine factory) while a 1 ms ticker measures loop lag."""
    lags: list[float] = []
    stop = False

    async def ticker() -> None:
        while not stop:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - before - 0.001)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)  # let the ticker settle before the job starts
    lags.clear()
    start = time.perf_counter()
    await job()
    elapsed = time.perf_counter() - start
    stop = True
    await task
    return elapsed, max(lags) if lags else elapsed, len(lags)


def bench_event_loop(models_root: pathlib.Path, text: str, rounds: int) -> None:
    print()
    path = str(models_root / MODELS[0] / "tokenizer.json")
    tokenizer = Tokenizer.from_file(path)
    tokens = len(tokenizer.encode(text, add_special_tokens=False).ids)
    print(f"== {tokens}-token prompt ({MODELS[0]}): does counting block the event loop? (1 ms ticker)")
    print(f"{'method':44} {'wall ms':>8} {'max loop lag ms':>16} {'ticks':>6}")

    async def on_loop() -> None:
        tokenizer.encode(text, add_special_tokens=False)

    async def encode_in_thread() -> None:
        await asyncio.to_thread(lambda: tokenizer.encode(text, add_special_tokens=False))

    async def batch_in_thread() -> None:
        await asyncio.to_thread(lambda: tokenizer.encode_batch([text], add_special_tokens=False))

    async def batch_fast_in_thread() -> None:
        await asyncio.to_thread(lambda: tokenizer.encode_batch_fast([text], add_special_tokens=False))

    pool = concurrent.futures.ProcessPoolExecutor(max_workers=1, initializer=_worker_init, initargs=(path,))
    pool.submit(_worker_count, "warm up").result()

    async def in_process() -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(pool, _worker_count, text)

    methods = [
        ("encode on the loop", on_loop),
        ("encode in a thread (holds the GIL)", encode_in_thread),
        ("encode_batch([text]) in a thread", batch_in_thread),
        ("encode_batch_fast([text]) in a thread *", batch_fast_in_thread),
        ("ProcessPoolExecutor worker", in_process),
    ]
    try:
        for label, job in methods:
            runs = [asyncio.run(_with_ticker(job)) for _ in range(rounds)]
            wall = statistics.median(r[0] for r in runs) * 1e3
            lag = statistics.median(r[1] for r in runs) * 1e3
            ticks = int(statistics.median(r[2] for r in runs))
            print(f"{label:44} {wall:8.1f} {lag:16.1f} {ticks:6d}")
    finally:
        pool.shutdown()
    print("* what ModelTokenizer.count_text uses for a model that counts with tokenizers "
          "(engine_fallback set); fastokens models: bench/engine_bench.py")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models-root", type=pathlib.Path, default=DEFAULT_MODELS)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rss-of", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="auto", help="auto (fastokens where it passes), tokenizers")
    parser.add_argument("--load-only", action="store_true", help="only the load / compile / memory table")
    args = parser.parse_args(argv)
    global ENGINE
    ENGINE = args.engine
    if args.rss_of:
        _print_rss_of(args.rss_of)
        return 0
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, medians of {args.rounds} rounds")
    loaded = bench_models(args.models_root, args.rounds)
    if args.load_only:
        return 0
    long_text = bench_counting(loaded, args.rounds)
    bench_event_loop(args.models_root, long_text, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
