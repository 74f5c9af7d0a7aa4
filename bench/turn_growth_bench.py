"""Where an agent turn's CPU grows with the conversation: in-process stage by stage, turns 1-10 against 41-50.

    python bench/turn_growth_bench.py [--rounds 3]

One session of bench/agent_bench.py's shape (Qwen3-8B tokenizer, fastokens, a piece cache with its render
memo, the opening counted once first), every turn read as `serve` reads it (`read_json` of the body bytes)
and counted by `count_chat`, each stage timed by a wrapper around the function that does it:

    body        `read_json`: orjson's parse and the check that its floats read as the json module's
    parse       `parse_messages`: vLLM's conversion of every message (tool-call arguments parsed again)
    digest      the render memo's digest of every message (orjson's bytes, SHA-256): proof the prefix is unchanged
    walk        the walk over the stored traces that finds the reusable prefix (`Recorder._plan`)
    render      the rest of the render: the template outside the skipped iterations, and the new text
    tally       counting the new text and storing its cuts (`_render_memo.tally`)
    rest        the rest of `count_chat` (template variables, the caches' keys)

Prints each stage's median over the rounds, mean over turns 1-10 and 41-50, and its growth per message
added between them.  Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_bench import QWEN3, session
from proxy_bench import ROOT

TURNS = 50
STAGES = ("body", "parse", "digest", "walk", "render", "tally", "rest")


def _timed(owner: Any, name: str, label: str, spent: dict[str, int]) -> Callable[[], None]:
    """Wrap `owner.name` to add its wall ns to spent[label]; returns the undo."""
    original = getattr(owner, name)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0) + time.perf_counter_ns() - start

    setattr(owner, name, wrapper)
    return lambda: setattr(owner, name, original)


def one_pass(bodies: list[bytes]) -> list[dict[str, float]]:
    """Each turn's stages in µs, in a fresh model and cache."""
    from tokenizer_cache import PieceCountCache, _chat, _render_memo, load_model_tokenizer, read_json

    model = load_model_tokenizer(QWEN3, engine="fastokens", piece_cache=PieceCountCache())
    model.count_chat(read_json(bodies[0])[0])
    spent: dict[str, int] = {}
    undo = [_timed(_chat, "parse_messages", "parse", spent),
            _timed(_render_memo._Values, "digest_all", "digest", spent),
            _timed(_render_memo.Recorder, "_plan", "walk", spent),
            _timed(_render_memo, "render", "render_all", spent),
            _timed(_render_memo, "tally", "tally", spent)]
    turns = []
    try:
        for raw in bodies:
            spent.clear()
            start = time.perf_counter_ns()
            body = read_json(raw)[0]
            parsed = time.perf_counter_ns()
            model.count_chat(body)
            end = time.perf_counter_ns()
            stage = {"body": parsed - start, **spent}
            stage["render"] = stage.pop("render_all", 0) - stage.get("digest", 0) - stage.get("walk", 0)
            stage["rest"] = (end - parsed) - sum(stage.get(s, 0) for s in STAGES[1:6])
            turns.append({s: stage.get(s, 0) / 1000 for s in STAGES})
    finally:
        for restore in undo:
            restore()
    return turns


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    bodies = [orjson.dumps(b) for b in session(100, TURNS)]
    messages = [len(orjson.loads(b)["messages"]) for b in bodies]
    passes = [one_pass(bodies) for _ in range(args.rounds)]

    def mean_of(stage: str, first: int) -> float:
        return statistics.mean(statistics.median(p[t][stage] for p in passes) for t in range(first, first + 10))

    added = statistics.mean(messages[40:50]) - statistics.mean(messages[0:10])
    print(f"{'stage':8} {'turns 1-10 µs':>14} {'41-50 µs':>9} {'growth µs':>10} {'µs per message added':>21}")
    totals = [0.0, 0.0]
    for stage in STAGES:
        early, late = mean_of(stage, 0), mean_of(stage, TURNS - 10)
        totals[0] += early
        totals[1] += late
        print(f"{stage:8} {early:14.0f} {late:9.0f} {late - early:10.0f} {(late - early) / added:21.2f}")
    print(f"{'all':8} {totals[0]:14.0f} {totals[1]:9.0f} {totals[1] - totals[0]:10.0f} "
          f"{(totals[1] - totals[0]) / added:21.2f}")
    print(f"({added:.0f} messages added between the two decades; bodies {len(bodies[0]) // 1024}-"
          f"{len(bodies[-1]) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
