"""A cap on concurrent requests to one upstream: excess requests wait, then get 503.

vLLM queues without bound: requests above its `max_num_seqs` wait inside the
engine while holding their HTTP connection, until some client-side timeout
gives up on them (after the engine may already have spent prefill on them).
A cap in front lets the operator bound that queue instead: requests beyond
`limit` wait up to `queue_timeout` seconds for a slot, then get an explained
503 with Retry-After, which the openai client retries by itself.

A slot is held for the whole exchange, the relay of a stream included,
because that is how long vLLM works on the request.  The gate also counts
what passes through it, capped or not (`in_flight`, `waiting`): /metrics
exports both, and an autoscaler can scale on them.
"""

from __future__ import annotations

import asyncio

from . import errors


class UpstreamGate:
    """At most `limit` requests in flight to one upstream (0: no cap)."""

    def __init__(self, upstream: str, limit: int, queue_timeout: float) -> None:
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
        except asyncio.TimeoutError:
            raise errors.upstream_busy(self.upstream, self.limit, self.queue_timeout) from None
        finally:
            self.waiting -= 1
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1
        if self._free is not None:
            self._free.release()
