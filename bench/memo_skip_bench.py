"""What a worker pays for the turns another worker served: in-process count CPU of a growing session
when this process sees every turn, every 2nd or every 3rd (as one of `serve --workers 2` or 3 sees a
client that opens a connection per request).

    python bench/memo_skip_bench.py [--rounds 2]

One session of bench/agent_bench.py's shape (Qwen3-8B tokenizer, fastokens, a piece cache with its
render memo, fresh for each pass, the opening counted once first); prints the mean CPU ms of
`count_chat` over turns 41-50 for each stride.  Not a test: figures depend on the machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from agent_bench import QWEN3, session
from proxy_bench import ROOT

TURNS = 50


def pass_ms(bodies: list[bytes], stride: int) -> float:
    """Mean count CPU ms over turns 41-50 of those this process sees (every `stride`-th, ending at 50)."""
    from tokenizer_cache import PieceCountCache, load_model_tokenizer

    model = load_model_tokenizer(QWEN3, engine="fastokens", piece_cache=PieceCountCache())
    model.count_chat(orjson.loads(bodies[0]))
    times = []
    for turn in range((TURNS - 1) % stride, TURNS, stride):
        body = orjson.loads(bodies[turn])
        before = time.process_time()
        model.count_chat(body)
        if turn >= TURNS - 10:
            times.append((time.process_time() - before) * 1000)
    return statistics.mean(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    bodies = [orjson.dumps(b) for b in session(100, TURNS)]
    for _ in range(args.rounds):
        cells = [f"{label} {pass_ms(bodies, s):.2f}" for s, label in ((1, "every turn"), (2, "every 2nd"),
                                                                       (3, "every 3rd"))]
        print("turns 41-50, count CPU ms: " + ", ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
