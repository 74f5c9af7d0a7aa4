"""A cap on concurrent requests to one upstream: excess requests wait, then get 503.

vLLM queues without bound: requests above its `max_num_seqs` wait inside the
engine while holding their HTTP connection, until some client-side timeout
gives up on them (after the engine may already have spent prefill on them).
A cap in front lets the operator bound that queue instead: requests beyond
`limit` wait up to `queue_timeout` seconds for a slot, then get an explained
503 with Retry-After, which the openai client retries by itself.

A slot is held for the whole exchange, from counting the prompt to the
relay of a stream's last byte: vLLM works on the request that long, and
counting a long prompt is work done for it (its memory is bounded apart, by
`CountingBudget`).  The gate also counts
what passes through it, capped or not (`in_flight`, `waiting`): /metrics
exports both, and an autoscaler can scale on them.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from proxy import errors
from proxy.errors import BrimfulError


class UpstreamGate:
    """At most `limit` requests in flight to one upstream (0: no cap)."""

    def __init__(self, upstream: str | None, limit: int, queue_timeout: float) -> None:
        self.upstream = upstream
        self.limit = limit
        self.queue_timeout = queue_timeout
        self._free = asyncio.Semaphore(limit) if limit > 0 else None
        self.in_flight = 0      # requests holding a slot: forwarded and not finished
        self.waiting = 0        # requests queued for a slot (only when capped)

    async def acquire(self) -> None:
        """Take a slot, waiting up to `queue_timeout`; raises the 503 `upstream_busy` if none frees."""
        if self._free is None:
            self.in_flight += 1
            return
        if not self._free.locked():
            await self._free.acquire()     # a free slot: taken at once, without wait_for's task
            self.in_flight += 1
            return
        self.waiting += 1
        try:
            await asyncio.wait_for(self._free.acquire(), self.queue_timeout)
        except TimeoutError:
            raise errors.upstream_busy(self.upstream, self.limit, self.queue_timeout) from None
        finally:
            self.waiting -= 1
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
        if self._free is not None:
            self._free.release()


class CountingBudget:
    """At most `limit` bytes of estimated work at once, granted in arrival order.

    Work larger than the whole budget is granted alone, once nothing else
    holds any: the peak is then that one piece of work, never several of them
    together.  A caller waits up to `queue_timeout` seconds, then gets
    `refusal(limit, waited)` (a 503).
    """

    def __init__(self, limit: int, queue_timeout: float,
                 refusal: Callable[[int, float], BrimfulError]) -> None:
        self.limit = limit
        self.queue_timeout = queue_timeout
        self.used = 0
        self._refusal = refusal
        self._waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()

    def _fits(self, weight: int) -> bool:
        return self.used + weight <= self.limit or self.used == 0

    async def acquire(self, weight: int) -> int:
        """Take `weight` bytes (at most the whole budget); returns what to `release`."""
        weight = min(max(weight, 0), self.limit)
        if not self._waiters and self._fits(weight):
            self.used += weight
            return weight
        waiter = asyncio.get_running_loop().create_future()
        entry = (weight, waiter)
        self._waiters.append(entry)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.queue_timeout)
        except BaseException as exc:
            if waiter.done() and not waiter.cancelled():
                self.release(weight)             # granted just as the wait ended
            else:
                waiter.cancel()
                self._waiters.remove(entry)
                self._wake()                     # the next in line may fit now
            if isinstance(exc, TimeoutError):
                raise self._refusal(self.limit, self.queue_timeout) from None
            raise
        return weight

    def release(self, weight: int) -> None:
        self.used -= weight
        self._wake()

    def _wake(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            weight, waiter = self._waiters.popleft()
            if not waiter.done():
                self.used += weight
                waiter.set_result(None)
