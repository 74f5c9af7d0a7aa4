"""A minimal, fast fake vLLM for benchmarks: raw asyncio on uvloop, canned answers.

Why not tests/fakevllm.py: that fake validates every request the way vLLM
0.32 does and keeps per-request records, which is what tests need and what a
benchmark cannot afford on the load generator's core.  This one parses only
the request line and Content-Length and answers the shapes captured from a
real vLLM 0.32.0 (`shared/vllm/captures/`):

  GET  /v1/models            the served models, each with `max_model_len`
  POST /v1/chat/completions  b01's non-streamed body (compact JSON, vLLM's key
                             order), or, when the body says `"stream":true`,
                             e01's event shapes: a role chunk, 31 content
                             chunks (the last with finish_reason "length"), the
                             usage chunk only when `"include_usage":true` was
                             sent, then `data: [DONE]` -- 34 events with usage
  GET  /health               200, empty body
  anything else              404 (so brimful's start-up /tokenize parity
                             check is skipped rather than faked)

Usage figures: a benchmark request may carry `"user":"prompt-tokens-N"` (the
OpenAI `user` field, which brimful forwards untouched); the fake then reports
N as `usage.prompt_tokens`, so brimful sees no count drift (a drift would add a
warning log line per request and distort the figures).  Without it: 10.

`--event-gap-ms` (or `?gap_ms=N` on one request) pauses between stream events
like a real token rate; at 0
each event is still its own write with a yield in between, so a proxy sees
separate chunks when it keeps up and coalesced ones when it does not.

    python bench/fake_upstream.py --port 8000 --model tiny-qwen=8192 [--event-gap-ms 20]

Prints the bound port on stdout once listening.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from email.utils import formatdate

# b01_single_user.json's body, verbatim key order; usage figures are the bench's small chat.
CHAT_BODY = {
    "id": "chatcmpl-88527880caa69691", "object": "chat.completion", "created": 1795961208,
    "model": "tiny-qwen",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": " TObject", "refusal": None,
                                         "annotations": None, "audio": None, "function_call": None,
                                         "reasoning": None},
                 "logprobs": None, "finish_reason": "length", "stop_reason": None, "token_ids": None,
                 "routed_experts": None}],
    "service_tier": None, "system_fingerprint": "vllm-0.32.0-4aaade95",
    "usage": {"prompt_tokens": 10, "total_tokens": 11, "completion_tokens": 1,
              "prompt_tokens_details": None, "completion_tokens_details": None},
    "prompt_logprobs": None, "prompt_token_ids": None, "prompt_text": None,
    "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
}
STREAM_ID = "chatcmpl-bf3e5f17d671de8e"
CONTENT_CHUNKS = 31


def _compact(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def _event(obj: object) -> bytes:
    return b"data: " + _compact(obj) + b"\n\n"


def stream_events(model: str, include_usage: bool, prompt_tokens: int = 10) -> list[bytes]:
    """e01_stream_include_usage.json's event shapes, stretched to 31 content chunks."""
    head = {"id": STREAM_ID, "object": "chat.completion.chunk", "created": 1795961253, "model": model}
    events = [_event({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                           "logprobs": None, "finish_reason": None}],
                      "prompt_token_ids": None, "prompt_text": None})]
    for i in range(CONTENT_CHUNKS):
        last = i == CONTENT_CHUNKS - 1
        choice = {"index": 0, "delta": {"content": " TObject"}, "logprobs": None,
                  "finish_reason": "length" if last else None}
        if last:
            choice["stop_reason"] = None
        choice["token_ids"] = None
        events.append(_event({**head, "choices": [choice]}))
    if include_usage:
        events.append(_event({**head, "choices": [], "usage": {
            "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + CONTENT_CHUNKS,
            "completion_tokens": CONTENT_CHUNKS}}))
    events.append(b"data: [DONE]\n\n")
    return events


def _declared_prompt_tokens(body: bytes) -> int:
    at = body.find(b'"prompt-tokens-')
    if at < 0:
        return 10
    end = body.find(b'"', at + 15)
    try:
        return int(body[at + 15: end])
    except ValueError:
        return 10


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class FakeUpstream:
    def __init__(self, models: dict[str, int], event_gap_s: float) -> None:
        self.event_gap_s = event_gap_s
        self.models_body = _compact({"object": "list", "data": [
            {"id": name, "object": "model", "created": 1795961208, "owned_by": "vllm",
             "root": f"/models/{name}", "parent": None, "max_model_len": mml, "permission": []}
            for name, mml in models.items()]})
        self.model = next(iter(models))
        self._bodies: dict[int, bytes] = {}
        self._streams: dict[tuple[int, bool], list[bytes]] = {}
        self._date = formatdate(usegmt=True).encode()

    def chat_body(self, prompt_tokens: int) -> bytes:
        body = self._bodies.get(prompt_tokens)
        if body is None:
            usage = {**CHAT_BODY["usage"], "prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + 1}
            body = self._bodies[prompt_tokens] = _compact({**CHAT_BODY, "model": self.model, "usage": usage})
        return body

    def stream(self, prompt_tokens: int, include_usage: bool) -> list[bytes]:
        events = self._streams.get((prompt_tokens, include_usage))
        if events is None:
            events = [_chunked(e) for e in stream_events(self.model, include_usage, prompt_tokens)]
            self._streams[(prompt_tokens, include_usage)] = events
        return events

    def head(self, status: bytes, content_type: bytes, length: int | None) -> bytes:
        framing = b"content-length: %d\r\n" % length if length is not None else b"transfer-encoding: chunked\r\n"
        return (b"HTTP/1.1 " + status + b"\r\ndate: " + self._date + b"\r\nserver: uvicorn\r\n" + framing
                + b"content-type: " + content_type + b"\r\nvary: Origin\r\n\r\n")

    def simple(self, status: bytes, body: bytes, content_type: bytes = b"application/json") -> bytes:
        return self.head(status, content_type, len(body)) + body

    def tick(self) -> None:
        """Refresh the Date header once a second instead of formatting it per response."""
        self._date = formatdate(usegmt=True).encode()
        asyncio.get_running_loop().call_later(1.0, self.tick)


class Connection(asyncio.Protocol):
    def __init__(self, fake: FakeUpstream) -> None:
        self.fake = fake
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.busy = False    # a stream is being written: later requests wait in the buffer
        self.stream_task: asyncio.Future[None] | None = None  # held: the loop keeps only a weak reference

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if not self.busy:
            self.serve_buffered()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def serve_buffered(self) -> None:
        while self.transport is not None and not self.busy:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(self.buffer[:end]).lower()
            length = 0
            at = head.find(b"\r\ncontent-length:")
            if at >= 0:
                stop = head.find(b"\r\n", at + 2)
                length = int(head[at + 17: stop if stop >= 0 else len(head)])
            if len(self.buffer) < end + 4 + length:
                return
            body = bytes(self.buffer[end + 4: end + 4 + length])
            del self.buffer[: end + 4 + length]
            method, _, rest = head.partition(b" ")
            path, _, query = rest.partition(b" ")[0].partition(b"?")
            self.answer(method, path, query, body)

    def answer(self, method: bytes, path: bytes, query: bytes, body: bytes) -> None:
        fake, write = self.fake, self.transport.write  # type: ignore[union-attr]
        if path == b"/v1/chat/completions" and method == b"post":
            prompt_tokens = _declared_prompt_tokens(body)
            if b'"stream":true' in body or b'"stream": true' in body:
                usage = b'"include_usage":true' in body or b'"include_usage": true' in body
                self.busy = True
                gap = fake.event_gap_s
                if query.startswith(b"gap_ms="):
                    gap = float(query[7:]) / 1000
                self.stream_task = asyncio.ensure_future(self.stream(fake.stream(prompt_tokens, usage), gap))
            else:
                write(fake.simple(b"200 OK", fake.chat_body(prompt_tokens)))
        elif path == b"/v1/models":
            write(fake.simple(b"200 OK", fake.models_body))
        elif path in (b"/health", b"/ping"):
            write(fake.simple(b"200 OK", b"", b"text/plain"))
        else:
            write(fake.simple(b"404 Not Found", b'{"detail":"Not Found"}'))

    async def stream(self, events: list[bytes], gap: float) -> None:
        transport = self.transport
        if transport is None:
            return
        transport.write(self.fake.head(b"200 OK", b"text/event-stream; charset=utf-8", None))
        for event in events:
            if self.transport is None:
                return
            transport.write(event)
            await asyncio.sleep(gap)
        if self.transport is not None:
            transport.write(b"0\r\n\r\n")
        self.busy = False
        if self.buffer:
            self.serve_buffered()


async def serve(host: str, port: int, fake: FakeUpstream) -> None:
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    server = await loop.create_server(lambda: Connection(fake), sock=sock, backlog=4096)
    fake.tick()
    print(sock.getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--model", action="append", metavar="NAME=MAX_MODEL_LEN",
                        help="a served model (repeatable; default tiny-qwen=8192)")
    parser.add_argument("--event-gap-ms", type=float, default=0.0, help="pause between stream events")
    args = parser.parse_args()
    models = dict((n, int(m)) for n, _, m in (s.partition("=") for s in (args.model or ["tiny-qwen=8192"])))
    fake = FakeUpstream(models, args.event_gap_ms / 1000)
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a brimful dependency
        asyncio.run(serve(args.host, args.port, fake))
    else:
        uvloop.run(serve(args.host, args.port, fake))


if __name__ == "__main__":
    main()
