"""Counting an agent conversation that is resent, one turn longer, every turn.

    python bench/multiturn_bench.py [--models-root ../shared/models] [--turns 50] [--rounds 3]

An agent trace of --turns requests: each request is the whole conversation so
far (system prompt, every earlier user and assistant message) plus a new user
message, and each turn adds about 600 tokens of deterministic pseudo-text
mixing English prose, Python code and some Korean.  For Qwen3-8B and
Phi-3-mini it prints, per turn, the prompt tokens, the tokens actually
encoded and the time of the `count_chat` call, with the per-piece cache
(`PieceCountCache`) and without it (whole-prompt encoding), then totals.
With the cache, the tokens encoded per turn stay near the size of the new
turn; without it they grow with the conversation.

Times are medians over --rounds runs of the whole trace, each from an empty
cache (a cached turn's time is that of its first and only count, misses
included).  Finally: bytes per cache entry (tracemalloc) and, for the last
turn, how the cached call's time splits between template rendering and the
split + hash + lookup that replaced encoding.

Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import hashlib
import pathlib
import random
import statistics
import sys
import time
import tracemalloc
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tokenizer_cache import ModelTokenizer, PieceCountCache, load_model_tokenizer  # noqa: E402

DEFAULT_MODELS = ROOT.parent / "shared" / "models"
MODELS = ["Qwen--Qwen3-8B", "microsoft--Phi-3-mini-4k-instruct"]
TURN_TOKENS = 500  # per turn (assistant reply + next user message): ≈ 600 Qwen3 tokens

_ENGLISH = (  # noqa: SIM905 - a sentence to read, not a list of words
    "the agent reads the file and then runs the tests again before it reports what changed in the "
    "build because a failing check usually means the cache key is stale or the request was retried "
    "with a longer prompt than the server accepts so we measure each step and keep the numbers"
).split()
_KOREAN = (  # noqa: SIM905 - a sentence to read, not a list of words
    "모델 서버 요청 토큰 길이 메모리 캐시 사용자 응답 설정 확인 결과 문제 해결 방법 "
    "컨텍스트 제한 최대 배치 처리 속도"
).split()
_CODE = [
    "def count(items):\n    return sum(len(item) for item in items)\n",
    "for index, row in enumerate(rows):\n    if row.get('status') != 200:\n        failures.append(index)\n",
    "class Cache:\n    def __init__(self, size: int = 64) -> None:\n        self.size = size\n",
    "with open(path, encoding='utf-8') as handle:\n    data = json.load(handle)\n",
    "assert response.status_code == 400, response.text\n",
]


def pseudo_text(rng: random.Random, approx_tokens: int) -> str:
    """English sentences, a code block now and then, a Korean sentence now and then."""
    parts: list[str] = []
    budget = approx_tokens
    while budget > 0:
        roll = rng.random()
        if roll < 0.2:
            code = rng.choice(_CODE).replace("count", rng.choice(["count", "total", "measure"]))
            parts.append(f"```python\n{code}```")
            budget -= len(code) // 3
        elif roll < 0.35:
            words = rng.choices(_KOREAN, k=rng.randint(4, 10))
            parts.append(" ".join(words) + ".")
            budget -= 2 * len(words)
        else:
            words = rng.choices(_ENGLISH, k=rng.randint(8, 20))
            words[0] = words[0].capitalize()
            parts.append(" ".join(words) + f" (step {rng.randint(1, 999)}).")
            budget -= len(words) + 4
    return "\n\n".join(parts)


def agent_trace(turns: int, seed: int = 7) -> list[dict[str, Any]]:
    """Request bodies, one per turn, each holding the whole conversation so far."""
    rng = random.Random(seed)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Answer briefly; show code when useful."},
        {"role": "user", "content": pseudo_text(rng, TURN_TOKENS // 2)},
    ]
    bodies = []
    for _ in range(turns):
        bodies.append({"model": "bench", "messages": [dict(m) for m in messages]})
        messages.append({"role": "assistant", "content": pseudo_text(rng, TURN_TOKENS // 2)})
        messages.append({"role": "user", "content": pseudo_text(rng, TURN_TOKENS // 2)})
    return bodies


def run_trace(model: ModelTokenizer, bodies: list[dict]) -> list[tuple[int, int, float]]:
    """(prompt tokens, tokens encoded, seconds) per turn, in order."""
    rows = []
    for body in bodies:
        start = time.perf_counter()
        tally = model.tally_chat(body)
        rows.append((tally.tokens, tally.encoded_tokens, time.perf_counter() - start))
    return rows


def measure(model: ModelTokenizer, bodies: list[dict], rounds: int, cached: bool) -> list[tuple[int, int, float]]:
    runs = []
    for _ in range(rounds):
        counting = model.with_piece_cache(PieceCountCache()) if cached else model.with_piece_cache(None)
        runs.append(run_trace(counting, bodies))
    first = runs[0]
    assert all([r[:2] for r in run] == [r[:2] for r in first] for run in runs), "counts differ between rounds"
    return [(tokens, encoded, statistics.median(run[i][2] for run in runs))
            for i, (tokens, encoded, _) in enumerate(first)]


def print_model(name: str, model: ModelTokenizer, bodies: list[dict], rounds: int) -> None:
    cached = measure(model, bodies, rounds, cached=True)
    whole = measure(model, bodies, rounds, cached=False)
    assert [c[0] for c in cached] == [w[0] for w in whole], "cache changed a count"
    fallback = model.with_piece_cache(PieceCountCache()).piece_fallback or "none, pieces are exact"
    print(f"\n== {name}   (fallback: {fallback})")
    print(f"{'turn':>4} {'prompt tok':>10} | {'encoded':>8} {'ms':>7} | {'encoded':>8} {'ms':>7} | {'speed-up':>8}")
    print(f"{'':>4} {'':>10} | {'with cache':^16} | {'without cache':^16} |")
    for turn, ((tokens, enc_c, sec_c), (_, enc_w, sec_w)) in enumerate(zip(cached, whole, strict=True), start=1):
        if turn <= 5 or turn % 5 == 0:
            print(f"{turn:>4} {tokens:>10,} | {enc_c:>8,} {sec_c * 1e3:>7.2f} | {enc_w:>8,} {sec_w * 1e3:>7.2f} | "
                  f"{sec_w / sec_c:>7.1f}x")
    total_c = sum(c[2] for c in cached)
    total_w = sum(w[2] for w in whole)
    print(f"{'sum':>4} {sum(c[0] for c in cached):>10,} | {sum(c[1] for c in cached):>8,} {total_c * 1e3:>7.1f} | "
          f"{sum(w[1] for w in whole):>8,} {total_w * 1e3:>7.1f} | {total_w / total_c:>7.1f}x")

    # Where the time of a cached call goes, on the last (largest) turn.
    counting = model.with_piece_cache(PieceCountCache())
    for body in bodies:
        counting.count_chat(body)
    body = bodies[-1]
    render = statistics.median(_timed(lambda: counting.render_chat(body)) for _ in range(7))
    text = counting.render_chat(body)
    counter = counting.piece_counter
    assert counter is not None
    hit = statistics.median(_timed(lambda: counter.count(text, add_special_tokens=False)) for _ in range(7))
    encode = statistics.median(_timed(lambda: model.count_text(text, add_special_tokens=False)) for _ in range(3))
    tally = counter.count(text, add_special_tokens=False)
    print(f"last turn, all pieces cached: render {render * 1e3:.2f} ms + split/hash/lookup of {tally.pieces} pieces "
          f"{hit * 1e3:.2f} ms, versus encoding the whole {tally.tokens:,}-token prompt {encode * 1e3:.2f} ms")


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def entry_bytes(entries: int = 65_536) -> tuple[float, float]:
    """Bytes per entry of a full PieceCountCache: counts ≤ 256 (shared small
    ints) and counts above (an int object each)."""
    results = []
    for base in (1, 1_000):
        cache = PieceCountCache(entries)
        keys = [hashlib.blake2b(i.to_bytes(8, "little"), digest_size=16).digest() for i in range(entries)]
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(0, entries, 1024):
            cache.put_many((key, base + j % 200) for j, key in enumerate(keys[i : i + 1024], start=i))
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        # The digests themselves are part of an entry: count them too.
        key_bytes = sum(sys.getsizeof(key) for key in keys)
        results.append(((after - before) + key_bytes) / entries)
    return results[0], results[1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models-root", type=pathlib.Path, default=DEFAULT_MODELS)
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    bodies = agent_trace(args.turns)
    for name in MODELS:
        print_model(name, load_model_tokenizer(args.models_root / name, engine="fastokens"), bodies, args.rounds)
    small, large = entry_bytes()
    print(f"\nmemory per cache entry (16-byte digest key + count, OrderedDict): {small:.0f} B with counts ≤ 256, "
          f"{large:.0f} B with larger counts; 65,536 entries ≈ {large * 65_536 / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
