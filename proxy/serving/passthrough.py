"""Every request brimful does not admit: relayed untouched, and the merged `/v1/models`.

Method, path, query, body (buffered when small, else streamed), headers minus
hop-by-hop ones, status and body back as they came.  With several upstreams,
a request is routed by the `model` in its body, and `GET /v1/models` answers
one list of every upstream's models.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from typing import Any

from proxy import errors
from proxy.asgi import (
    ClientGone,
    Receive,
    Scope,
    Send,
    content_length,
    has_body,
    is_shutdown_deadline,
    path_qs,
    read_body,
    request_id,
    send_chunk,
    send_start,
    send_whole,
    stream_body,
    until_disconnect,
)
from proxy.errors import BrimfulError
from proxy.upstream.backends import Backends
from proxy.upstream.client import DROP_REQUEST_ID, UpstreamResponse, client_headers, forwardable

log = logging.getLogger("brimful")

MAX_BUFFERED_BODY = 1024 * 1024  # larger request bodies are streamed


class Passthrough:
    def __init__(self, backends: Backends, shutdown_timeout: float = 30.0, models_timeout: float = 10.0) -> None:
        self.backends = backends
        self.shutdown_timeout = shutdown_timeout
        self.models_timeout = models_timeout       # each upstream's share of a merged GET /v1/models

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rid = request_id(scope)
        try:
            headers = forwardable(scope["headers"], DROP_REQUEST_ID)
            headers.append((b"x-request-id", rid.encode()))
            length = content_length(scope)
            body: bytes | AsyncIterator[bytes] | None
            if length is not None and length <= MAX_BUFFERED_BODY:
                body = await read_body(receive, MAX_BUFFERED_BODY, scope)
            elif length is None and not has_body(scope):
                body = None
            else:
                body = stream_body(receive)
            if scope["path"] == "/v1/models" and len(self.backends.items) > 1 and scope["method"] == "GET":
                await self.send_merged_models(send, rid)
                return
            backend = self.backends.for_body(body) if isinstance(body, bytes) else self.backends.default
            response = await backend.upstream.send(scope["method"], path_qs(scope), headers, body)
        except ClientGone:
            log.debug("client left before sending the whole body of %s", scope["path"])
            return
        except BrimfulError as err:
            if err.status >= 500:
                log.warning("upstream %s: %s %s answered %d%s", self.backends.default.upstream.base_url
                            if len(self.backends.items) == 1 else "(pass-through)", scope["method"], scope["path"],
                            err.status, f" ({err.details['cause']})" if "cause" in err.details else "")
            await send_error(send, err, rid)
            return
        except asyncio.CancelledError as exc:
            if not is_shutdown_deadline(exc):
                raise
            # SIGTERM's drain deadline passed while the upstream had not answered yet.
            await send_error(send, errors.shutting_down(self.shutdown_timeout), rid)
            return
        await until_disconnect(receive, self.relay(scope, send, response, rid, backend.upstream.base_url))

    async def relay(self, scope: Scope, send: Send, response: UpstreamResponse, rid: str, base_url: str) -> None:
        out = client_headers(forwardable(response.raw_headers, DROP_REQUEST_ID), base_url)
        out.append((b"x-request-id", rid.encode()))
        if "content-length" in response.headers:
            out.append((b"content-length", response.headers["content-length"].encode()))
        await send_start(send, response.status, out)
        try:
            while chunk := await response.next_chunk():
                await send_chunk(send, chunk)
        except asyncio.CancelledError:
            response.close()
            raise
        except Exception as exc:  # mid-body failure: nothing sane to add to an unknown format
            log.warning("pass-through %s %s broke mid-body: %s", scope["method"], scope["path"], exc)
            response.close()
        finally:
            response.release()
        await send_chunk(send, b"", more=False)

    async def send_merged_models(self, send: Send, rid: str) -> None:
        """GET /v1/models with several upstreams: one list, in routing order."""
        cards: list[Any] = []
        seen: set[Any] = set()
        for backend in self.backends.items:
            try:
                payload = await backend.upstream.get_json("/v1/models", timeout=self.models_timeout)
            except Exception as exc:  # one upstream down: list the others, say so in the log
                log.warning("upstream %s: /v1/models failed: %s", backend.name, exc)
                continue
            for card in payload.get("data", []) if isinstance(payload, dict) else []:
                if isinstance(card, dict) and card.get("id") not in seen:
                    seen.add(card.get("id"))
                    cards.append(card)
        body = json.dumps({"object": "list", "data": cards}, ensure_ascii=False).encode()
        headers = [(b"content-type", b"application/json"), (b"x-request-id", rid.encode())]
        await send_whole(send, 200, body, headers)


async def send_error(send: Send, err: BrimfulError, rid: str) -> None:
    """An error in OpenAI's shape, before anything else was sent."""
    await send_whole(send, err.status, err.body_bytes(), err.response_headers([(b"x-request-id", rid.encode())]))
