"""An in-memory upstream transport: brimful's exchange tested in-process, without sockets.

The same seam as HTTPX's `MockTransport`: `proxy.upstream.client.Upstream` takes any
object with `request()` and `close()`; this one hands each request to a
handler function and answers with what it returns.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from proxy.upstream.http1 import ResponseHeaders


@dataclass
class SentRequest:
    """What the upstream received."""

    method: str
    path: str
    headers: list[tuple[bytes, bytes]]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class MockResponse:
    """An upstream answer: a status, headers and the body in the chunks it arrives in.

    `fail_after` raises that exception once the chunks are read (a connection
    breaking mid-body).
    """

    def __init__(self, status: int = 200, headers: Iterable[tuple[str, str]] = (), chunks: Iterable[bytes] = (),
                 fail_after: BaseException | None = None) -> None:
        self.status = status
        self.raw_headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
        self.headers = ResponseHeaders(self.raw_headers)
        self._chunks = list(chunks)
        self._fail_after = fail_after
        self.released = False
        self.closed = False

    @classmethod
    def json(cls, payload: Any, status: int = 200) -> MockResponse:
        return cls(status, [("content-type", "application/json")], [json.dumps(payload).encode()])

    @classmethod
    def events(cls, events: Iterable[Any], *, done: bool = True, **kw: Any) -> MockResponse:
        """An SSE stream, one chunk per `data:` event (dicts are JSON-encoded)."""
        chunks = [b"data: " + (json.dumps(e, separators=(",", ":")).encode() if not isinstance(e, bytes) else e)
                  + b"\n\n" for e in events]
        if done:
            chunks.append(b"data: [DONE]\n\n")
        return cls(200, [("content-type", "text/event-stream")], chunks, **kw)

    async def next_chunk(self) -> bytes:
        if self._chunks:
            return self._chunks.pop(0)
        if self._fail_after is not None:
            error, self._fail_after = self._fail_after, None
            raise error
        return b""

    async def read(self, limit: int | None = None) -> bytes:
        data = b"".join(self._chunks)
        self._chunks = []
        return data[:limit] if limit is not None else data

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


Handler = Callable[[SentRequest], Awaitable[MockResponse] | MockResponse]


@dataclass
class MockTransport:
    """Answers every request with `handler(request)`; keeps what was sent in `sent`."""

    handler: Handler
    sent: list[SentRequest] = field(default_factory=list)

    async def request(self, method: str, path_qs: str, headers: list[tuple[bytes, bytes]],
                      body: bytes | AsyncIterator[bytes] | None, *, timeout: float,
                      idle_timeout: float, deadline: float | None = None) -> MockResponse:
        if body is None:
            data = b""
        elif isinstance(body, bytes):
            data = body
        else:
            data = b"".join([chunk async for chunk in body])
        sent = SentRequest(method, path_qs, list(headers), data)
        self.sent.append(sent)
        answer = self.handler(sent)
        if not isinstance(answer, MockResponse):
            answer = await answer
        return answer

    async def close(self) -> None:
        pass
