"""Two pools routed by length: which short/long split of one model serves the need on the fewest GPUs.

brimful routes a request to the smallest pool whose window holds its prompt
plus the completion it will be granted, and that grant is what the longest pool
would give (`proxy.upstream.pools`): min(ask, long − prompt), the whole room
when nothing is asked.  So a request goes to the short pool of length S exactly
when prompt + ask ≤ S — its *route key* — and a request that asks nothing goes
to the long pool.  Agents that ask 65,535 on every turn therefore stay long
however little they use: the advice counts them where they will go.

Per pool, from the records (`RouteTally`, value → sums dicts any aggregator can
feed) and the need (`proxy.sizing.need`):

* share of requests and their mean KV tokens: the need, each at most the
  pool's max_model_len (refused and unknown ones: prompt + the mean completion
  the served ones generated);
* concurrency one replica holds: its KV blocks ÷ the blocks of the mean
  request (capped at `max_num_seqs` when given) — `proxy.sizing.capacity`'s rule;
* concurrency needed for `rate` requests/s: Little's law, rate × share × the
  mean latency recorded for the pool's requests;
* replicas = ⌈needed ÷ per replica⌉, GPUs = replicas × GPUs per replica;
* the same at the worst case: every request at the pool's max_model_len
  (vLLM's own start-up figure "Maximum concurrency for L tokens per request"),
  the sizing under which no request is ever preempted.

vLLM's KV cache is paged: a request holds the blocks it fills, not its
window, so at the mean the total KV the traffic needs is the same whatever
the split, and splitting saves GPUs only through rounding.  What a short
window buys is the worst case — a short pool guarantees many more requests
at once — so the split is chosen by the worst-case GPUs (ties: the mean's,
then more traffic on the short pool), and both figures are shown.

Refusals and cuts are the long pool's: no request fares worse than on one pool
of the long pool's length (`proxy.sizing.need.outcome_at`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from proxy.sizing.lengths import BLOCK_SIZE, round_up
from proxy.sizing.need import NeedModel, NeedOutcome

NO_ASK = -1      # the route key of a request that asked for no limit: always the longest pool


def route_key(prompt: int, asked: int | None, block_size: int = BLOCK_SIZE) -> int:
    """prompt + ask in whole blocks (the shortest pool that takes it), NO_ASK without an ask."""
    return NO_ASK if asked is None or asked <= 0 else round_up(prompt + asked, block_size)


class RouteTally:
    """Per route key: [requests, sum of known need, unknown requests, their prompts' sum, latency sum, latencies]."""

    __slots__ = ("routes",)

    def __init__(self) -> None:
        self.routes: dict[int, list[float]] = {}

    def add(self, key: int, need: int | None, prompt: int, latency_s: float | None, count: float = 1) -> None:
        """One request (or `count` alike): `need` its known or least need, None when unknown (refused)."""
        row = self.routes.get(key)
        if row is None:
            row = self.routes[key] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        row[0] += count
        if need is None:
            row[2] += count
            row[3] += prompt * count
        else:
            row[1] += need * count
        if latency_s is not None:
            row[4] += latency_s * count
            row[5] += count

    def add_sums(self, key: int, count: int, known_need: int, unknown: int, unknown_prompts: int,
                 latency_s: float, latencies: int) -> None:
        """`count` requests of one route at once (a reader's sums): their known needs' sum, how many are
        unknown and their prompts' sum, their latencies' sum and count."""
        row = self.routes.get(key)
        if row is None:
            row = self.routes[key] = [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        row[0] += count
        row[1] += known_need
        row[2] += unknown
        row[3] += unknown_prompts
        row[4] += latency_s
        row[5] += latencies

    @property
    def n(self) -> float:
        return sum(r[0] for r in self.routes.values())


@dataclass(frozen=True)
class Pool:
    max_model_len: int
    share: float                 # of all requests
    mean_kv_tokens: int
    mean_latency_s: float | None
    concurrent_per_replica: int
    concurrency_needed: float
    replicas: int | None         # None: one replica cannot hold a request of this length
    gpus: int | None
    guaranteed_per_replica: int  # every request at max_model_len: vLLM's "Maximum concurrency"
    replicas_worst: int | None
    gpus_worst: int | None

    def to_dict(self) -> dict[str, Any]:
        return {"max_model_len": self.max_model_len, "share": self.share, "mean_kv_tokens": self.mean_kv_tokens,
                "mean_latency_s": self.mean_latency_s, "concurrent_per_replica": self.concurrent_per_replica,
                "concurrency_needed": round(self.concurrency_needed, 3), "replicas": self.replicas,
                "gpus": self.gpus, "guaranteed_per_replica": self.guaranteed_per_replica,
                "replicas_worst": self.replicas_worst, "gpus_worst": self.gpus_worst}


@dataclass(frozen=True)
class SplitAdvice:
    one_pool: Pool
    short: Pool | None           # None: no split needs fewer GPUs than one pool
    long: Pool | None
    outcome: NeedOutcome         # refused / cut: the long pool's, the same as one pool's
    rate: float
    kv_tokens_per_replica: int
    gpus_per_replica: int

    def to_dict(self) -> dict[str, Any]:
        return {"one_pool": self.one_pool.to_dict(), "short": None if self.short is None else self.short.to_dict(),
                "long": None if self.long is None else self.long.to_dict(), "outcome": self.outcome.to_dict(),
                "rate": self.rate, "kv_tokens_per_replica": self.kv_tokens_per_replica,
                "gpus_per_replica": self.gpus_per_replica}


@dataclass(frozen=True)
class Capacity:
    """One replica: its KV tokens (the plan's, or the running vLLM's pool) and what bounds its batch."""

    kv_tokens: int
    block_size: int = BLOCK_SIZE
    gpus_per_replica: int = 1
    max_num_seqs: int | None = None

    def concurrent(self, mean_kv: int, max_model_len: int) -> int:
        """Requests of `mean_kv` tokens one replica holds at once; 0 when one of `max_model_len` does not fit."""
        blocks = self.kv_tokens // self.block_size
        if blocks * self.block_size < max_model_len:
            return 0
        held = blocks // max(1, math.ceil(mean_kv / self.block_size))
        return held if self.max_num_seqs is None else min(held, self.max_num_seqs)


def _pool(rows: Iterable[list[float]], total: float, limit: int, completion_mean: float, rate: float,
          cap: Capacity, fallback_latency: float | None) -> Pool | None:
    count = need = latency = timed = 0.0
    for r in rows:
        count += r[0]
        need += min(r[1], limit * (r[0] - r[2])) + min(r[3] + r[2] * completion_mean, limit * r[2])
        latency += r[4]
        timed += r[5]
    if count <= 0:
        return None
    mean_kv = max(1, math.ceil(need / count))
    mean_latency = latency / timed if timed else fallback_latency
    per_replica = cap.concurrent(mean_kv, limit)
    worst = cap.concurrent(limit, limit)
    needed = rate * (count / total) * (mean_latency or 0.0)
    replicas = _replicas(needed, per_replica)
    replicas_worst = _replicas(needed, worst)
    return Pool(limit, count / total, mean_kv, mean_latency, per_replica, needed, replicas,
                None if replicas is None else replicas * cap.gpus_per_replica, worst, replicas_worst,
                None if replicas_worst is None else replicas_worst * cap.gpus_per_replica)


def _replicas(needed: float, per_replica: int) -> int | None:
    return None if per_replica == 0 else max(1, math.ceil(needed / per_replica - 1e-9))


def short_candidates(routes: RouteTally, long_len: int, block_size: int = BLOCK_SIZE) -> list[int]:
    """Short lengths worth trying: the route keys' deciles below the long pool, and powers of two from 1,024."""
    keys = sorted((k, r[0]) for k, r in routes.routes.items() if k != NO_ASK and k < long_len)
    out: set[int] = set()
    total = sum(c for _, c in keys)
    running, decile = 0.0, 1
    for k, c in keys:
        running += c
        while decile < 10 and running >= total * decile / 10:
            out.add(round_up(k, block_size))
            decile += 1
    p2 = 1024
    while p2 < long_len:
        out.add(p2)
        p2 *= 2
    return sorted(v for v in out if v < long_len)


def advise_split(routes: RouteTally, need: NeedModel, outcome: NeedOutcome, long_len: int, cap: Capacity,
                 rate: float) -> SplitAdvice | None:
    """The one-pool answer at `long_len` and the short/long split with the fewest GPUs beside it.

    `outcome` is `proxy.sizing.need.outcome_at(need, ..., long_len)`; `rate` the target requests per second.
    """
    total = routes.n
    if total <= 0:
        return None
    points = need.points
    completion_mean = sum(points) / len(points) if points else 1.0
    all_rows = list(routes.routes.values())
    timed = sum(r[5] for r in all_rows)
    overall_latency = sum(r[4] for r in all_rows) / timed if timed else None
    one = _pool(all_rows, total, long_len, completion_mean, rate, cap, overall_latency)
    assert one is not None
    best: tuple[Pool, Pool] | None = None
    for short_len in short_candidates(routes, long_len, cap.block_size):
        short = _pool([r for k, r in routes.routes.items() if k != NO_ASK and k <= short_len], total, short_len,
                      completion_mean, rate, cap, overall_latency)
        long = _pool([r for k, r in routes.routes.items() if k == NO_ASK or k > short_len], total, long_len,
                     completion_mean, rate, cap, overall_latency)
        if short is None or long is None or short.gpus_worst is None or long.gpus_worst is None:
            continue
        if best is None or _key((short, long)) < _key(best):
            best = (short, long)
    if best is not None and one.gpus_worst is not None and _key(best)[:2] >= (one.gpus_worst, one.gpus or 0):
        best = None       # a split that saves no GPU is not worth a second pool
    return SplitAdvice(one, best[0] if best else None, best[1] if best else None, outcome, rate, cap.kv_tokens,
                       cap.gpus_per_replica)


def _key(split: tuple[Pool, Pool]) -> tuple[int, int, float]:
    """Worst-case GPUs, then the mean's, then more of the traffic on the short pool."""
    short, long = split
    return ((short.gpus_worst or 0) + (long.gpus_worst or 0), (short.gpus or 0) + (long.gpus or 0), -short.share)

