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

from proxy.admitted import jsonbody
from proxy.admitted.exchange import ExchangeServices
from proxy.admitted.surfaces import Surface
from proxy.asgi import ClientGone, Receive, Scope, Send, read_body, request_id, send_whole
from proxy.errors import BrimfulError

log = logging.getLogger("brimful")


async def answer_count_tokens(services: ExchangeServices, surface: Surface, scope: Scope, receive: Receive,
                              send: Send) -> None:
    rid = request_id(scope).encode()
    try:
        body = await read_body(receive, services.config.server.max_body_bytes, scope)
        request = jsonbody.parse_object(body)
        model, _ = await services.backends.resolve(request.get("model"))
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
