"""`POST /v1/messages/count_tokens`, answered by brimful itself from its exact count.

vLLM serves Anthropic's token-counting route by rendering the converted chat
request, and refuses a conversation longer than max_model_len there too ("at
least N input tokens"), so a client cannot learn how far over it is.  brimful
has already counted the prompt the way vLLM's /v1/messages will
(`proxy.admitted.surfaces.MessagesCountSurface`); it answers in Anthropic's shape,
`{"input_tokens": N}` (plus vLLM's `context_management`), without an upstream
round trip — unless the model has no local tokenizer, or the prompt holds media brimful
cannot count, when the upstream's own route counts it (its failure is the answer: a count
is never made up).  Nothing is generated, so no length record is written.
"""

from __future__ import annotations

import json
import logging

from proxy import errors
from proxy.admitted import jsonbody
from proxy.admitted.exchange import ExchangeServices
from proxy.admitted.surfaces import Surface
from proxy.asgi import ClientGone, Receive, Scope, Send, path_qs, read_body, request_id, send_whole
from proxy.errors import BrimfulError
from proxy.upstream.backends import Backend
from proxy.upstream.client import DROP_ADMITTED, DROP_REQUEST_ID, access_control, client_headers, forwardable

log = logging.getLogger("brimful")
MAX_ANSWER = 1024 * 1024      # the most of an upstream's count_tokens answer read (exchange's MAX_WHOLE_ANSWER)


async def answer_count_tokens(services: ExchangeServices, surface: Surface, scope: Scope, receive: Receive,
                              send: Send) -> None:
    rid = request_id(scope).encode()
    try:
        body = await read_body(receive, services.config.server.max_body_bytes, scope)
        request = jsonbody.parse_object(body)
        model, backend = await services.backends.resolve(request.get("model"), unlisted=True)
        if services.backends.for_model(model) is None:
            await _relay_unlisted(services, surface, backend, scope, body, send, rid)
            return
        await services.counter.probed(model)
        count = await services.counter.count(model, surface, request, len(body), may_go_uncounted=False)
    except ClientGone:
        log.debug("client left before sending the whole body of %s", scope["path"])
        return
    except BrimfulError as err:
        await send_whole(send, err.status, surface.error_body(err), err.response_headers([(b"x-request-id", rid)]))
        return
    tokens = count.total
    answer = {"input_tokens": tokens, "context_management": {"original_input_tokens": tokens}}
    headers = [
        (b"content-type", b"application/json"),
        (b"x-request-id", rid),
        (b"x-brimful-prompt-tokens", str(tokens).encode()),
        (b"x-brimful-count", (count.source if count.exact else "margin").encode()),
    ]
    await send_whole(send, 200, json.dumps(answer).encode(), headers)


async def _relay_unlisted(services: ExchangeServices, surface: Surface, backend: Backend, scope: Scope, body: bytes,
                          send: Send, rid: bytes) -> None:
    """A name no upstream lists goes to the first upstream's own route, as `/v1/messages` does
    (its vLLM may serve any name); its answer is relayed, a model 404 worded as brimful's."""
    upstream = backend.upstream
    headers = [*forwardable(scope["headers"], DROP_ADMITTED), (b"x-request-id", rid)]
    try:
        response = await upstream.send("POST", path_qs(scope), headers, body)
        answer = await upstream.read_body(response, MAX_ANSWER + 1)
        if len(answer) > MAX_ANSWER:      # a count is a few bytes: read no more than this of anything
            raise errors.upstream_invalid_answer(upstream.public_url, response.status, len(answer),
                                                 "a body larger than a count answer can be")
    except BrimfulError as err:
        await send_whole(send, err.status, surface.error_body(err), err.response_headers([(b"x-request-id", rid)]))
        return
    # vLLM's CORS headers (--allowed-origins) stay on an answer brimful builds from its answer.
    cors = access_control(response.raw_headers)
    if response.status == 404 and b"model" in answer.lower():
        missing = errors.model_not_found(str(jsonbody.parse_object(body).get("model")), services.backends.names)
        await send_whole(send, 404, surface.error_body(missing),
                         missing.response_headers([(b"x-request-id", rid), *cors]))
        return
    relayed = client_headers(forwardable(response.raw_headers, DROP_REQUEST_ID), upstream.base_url)
    await send_whole(send, response.status, answer, [*relayed, (b"x-request-id", rid)])
