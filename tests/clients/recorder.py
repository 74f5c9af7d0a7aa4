"""A scripted OpenAI-compatible server on loopback that records what clients send.

Two roles, one class:

- **Scripted upstream** (`Recorder(script)`): answers chat, completions and
  Responses requests with valid canned bodies (streamed or not) that follow a
  `Script` — call this tool with these arguments while no tool result is in
  the conversation, answer this JSON for a structured-output request, else a
  short text — so an SDK's agent loop, tool round trip or response parsing
  proceeds as with a real model.  Every request body is stored verbatim.
  With `count_via=URL` it also forwards each generation request to a real (or
  fake) vLLM with the completion limit forced to 1 and answers with that
  server's `usage.prompt_tokens` (and relays its 4xx errors), so a brimful in
  front of it sees real counts while the conversation follows the script.
  Every other path (/v1/models, /tokenize, /health…) is proxied to `count_via`.
- **Tap** (`Recorder(forward_to=URL)`): a transparent forwarder that stores each
  request body with the status, headers and body of the answer, e.g. between
  an SDK and brimful, to read `x-brimful-*` headers whatever the SDK hides.

Test-only code: answers are buffered, not streamed through.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Self

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tests.clients.script import Script
from tests.support.servers import serve_in_thread

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/responses")
_HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"}


@dataclass
class Exchange:
    """One request as received, and what was answered."""

    path: str
    body: dict[str, Any] | None
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    answer: Any = None                     # the JSON answer, or the SSE text of a stream
    upstream_prompt_tokens: int | None = None  # count_via's usage.prompt_tokens


def _offered_tools(body: dict[str, Any]) -> list[str]:
    names = []
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.append(function["name"])
        elif isinstance(tool.get("name"), str):  # Responses: {"type": "function", "name": ...}
            names.append(tool["name"])
    return names


def _has_tool_result(body: dict[str, Any]) -> bool:
    """A tool result after the last user turn: the loop has been round once."""
    items = body.get("messages") if "messages" in body else body.get("input")
    if not isinstance(items, list):
        return False
    for item in reversed(items):
        if not isinstance(item, dict):
            continue
        if item.get("role") == "tool" or item.get("type") == "function_call_output":
            return True
        if item.get("role") == "user":
            return False
    return False


def _wants_json(body: dict[str, Any]) -> bool:
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_schema", "json_object"):
        return True
    text = body.get("text")  # Responses: text.format
    return (isinstance(text, dict) and isinstance(text.get("format"), dict)
            and text["format"].get("type") == "json_schema")


def plan_answer(script: Script, body: dict[str, Any]) -> tuple[str | None, list[tuple[str, str]]]:
    """(text, [(tool name, JSON arguments)]) for this request under `script`."""
    if script.call_tools and body.get("tool_choice") != "none" and not _has_tool_result(body):
        for name in _offered_tools(body):
            if name in script.tool_calls:
                return None, [(name, json.dumps(script.tool_calls[name]))]
    if _wants_json(body) and script.json_content is not None:
        return script.json_content, []
    return script.text, []


_counter = itertools.count(1)


def _ids() -> str:
    """Ids for answers (call_…, chatcmpl-…): a counter restarted by each scripted
    recorder, so capturing a scenario twice records the same bodies."""
    return f"{next(_counter):024x}"


def chat_answer(body: dict[str, Any], text: str | None, calls: list[tuple[str, str]], usage: dict[str, int]) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{_ids()}", "type": "function", "function": {"name": name, "arguments": arguments}}
            for name, arguments in calls
        ]
    return {
        "id": f"chatcmpl-{_ids()}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model") or "tiny-qwen",
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": usage,
    }


def chat_stream(body: dict[str, Any], answer: dict) -> str:
    """The same answer as SSE chunks (role, content or tool calls, finish, usage if asked)."""
    base = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}
    message = answer["choices"][0]["message"]
    deltas: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
    if message.get("content"):
        deltas.append({"content": message["content"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        deltas.append({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
                                        "function": {"name": call["function"]["name"], "arguments": ""}}]})
        deltas.append({"tool_calls": [{"index": index, "function": {"arguments": call["function"]["arguments"]}}]})
    chunks = [{**base, "choices": [{"index": 0, "delta": d, "logprobs": None, "finish_reason": None}]} for d in deltas]
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "logprobs": None,
                                        "finish_reason": answer["choices"][0]["finish_reason"]}]})
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        chunks.append({**base, "choices": [], "usage": answer["usage"]})
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def completion_answer(body: dict[str, Any], text: str, usage: dict[str, int]) -> dict:
    prompts = body.get("prompt")
    n = len(prompts) if isinstance(prompts, list) and prompts and not isinstance(prompts[0], int) else 1
    return {
        "id": f"cmpl-{_ids()}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": body.get("model") or "tiny-qwen",
        "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": "stop"} for i in range(n)],
        "usage": usage,
    }


def completion_stream(answer: dict) -> str:
    base = {k: answer[k] for k in ("id", "object", "created", "model")}
    chunks = [{**base, "choices": [{**c, "finish_reason": None}]} for c in answer["choices"]]
    chunks += [{**base, "choices": [{"index": c["index"], "text": "", "logprobs": None, "finish_reason": "stop"}]}
               for c in answer["choices"]]
    return "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"


def responses_answer(
    body: dict[str, Any], text: str | None, calls: list[tuple[str, str]], usage: dict[str, int]
) -> dict:
    output: list[dict[str, Any]] = []
    for name, arguments in calls:
        output.append({"type": "function_call", "id": f"fc_{_ids()}", "call_id": f"call_{_ids()}",
                       "name": name, "arguments": arguments, "status": "completed"})
    if text is not None:
        output.append({"type": "message", "id": f"msg_{_ids()}", "role": "assistant", "status": "completed",
                       "content": [{"type": "output_text", "text": text, "annotations": []}]})
    return {
        "id": f"resp_{_ids()}",
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model") or "tiny-qwen",
        "status": "completed",
        "output": output,
        "parallel_tool_calls": bool(body.get("parallel_tool_calls", True)),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "usage": {"input_tokens": usage["prompt_tokens"], "output_tokens": usage["completion_tokens"],
                  "total_tokens": usage["total_tokens"], "input_tokens_details": {"cached_tokens": 0},
                  "output_tokens_details": {"reasoning_tokens": 0}},
    }


def responses_stream(answer: dict) -> str:
    """created → one output_item.added/done per item → completed (what SDKs read)."""
    events: list[tuple[str, dict[str, Any]]] = []
    in_progress = {**answer, "status": "in_progress", "output": []}
    events.append(("response.created", {"response": in_progress}))
    for index, item in enumerate(answer["output"]):
        events.append(("response.output_item.added", {"output_index": index, "item": item}))
        events.append(("response.output_item.done", {"output_index": index, "item": item}))
    events.append(("response.completed", {"response": answer}))
    return "".join(
        f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': i, **data})}\n\n"
        for i, (kind, data) in enumerate(events)
    )


def _counting_body(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """The request as sent, but asking for one token and no stream: only the prompt is wanted."""
    sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    if path == "/v1/responses":
        sent["max_output_tokens"] = 1
    else:
        sent["max_tokens"] = 1
        if "max_completion_tokens" in sent:
            sent["max_completion_tokens"] = 1
    return sent


class Recorder:
    """See the module docstring.  Use as a context manager; `base_url` has no /v1."""

    def __init__(self, script: Script | None = None, *, count_via: str | None = None,
                 forward_to: str | None = None, model: str = "tiny-qwen",
                 count_paths: tuple[str, ...] = GENERATION_PATHS) -> None:
        if (script is None) == (forward_to is None):
            raise ValueError("give a script (scripted upstream) or forward_to (tap), not both")
        self.script = script
        self.count_via = count_via
        self.count_paths = count_paths  # the generation paths count_via is asked to count
        self.forward_to = forward_to
        self.model = model
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()
        self._client: httpx.AsyncClient | None = None
        self._stack = contextlib.ExitStack()
        self.base_url = ""

    # -- lifecycle ---------------------------------------------------------

    def __enter__(self) -> Self:
        global _counter
        if self.script is not None:
            _counter = itertools.count(1)
        app = Starlette(routes=[Route("/{path:path}", self._handle, methods=["GET", "POST", "DELETE"])])
        self.base_url = self._stack.enter_context(serve_in_thread(app, lifespan="off"))
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def bodies(self, path: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [e.body for e in self.exchanges if e.body is not None and (path is None or e.path == path)]

    # -- handling ----------------------------------------------------------

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=300)
        return self._client

    async def _handle(self, request: Request) -> Response:
        path = request.url.path
        raw = await request.body()
        body = None
        if raw:
            with contextlib.suppress(ValueError):
                body = json.loads(raw)
        exchange = Exchange(path=path, body=body if isinstance(body, dict) else None)
        if self.forward_to is not None:
            response = await self._forward(self.forward_to, request, raw, exchange)
        elif path in GENERATION_PATHS and isinstance(body, dict):
            response = await self._scripted(path, body, exchange)
        elif self.count_via is not None:
            response = await self._forward(self.count_via, request, raw, exchange)
        elif path == "/v1/models":
            response = JSONResponse({"object": "list", "data": [
                {"id": self.model, "object": "model", "created": 0, "owned_by": "recorder", "max_model_len": 2048}]})
        else:
            response = JSONResponse({"error": {"message": f"not scripted: {path}", "code": 404}}, status_code=404)
        exchange.status = response.status_code
        with self._lock:
            self.exchanges.append(exchange)
        return response

    async def _forward(self, target: str, request: Request, raw: bytes, exchange: Exchange) -> Response:
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP_HEADERS | {"host"}}
        url = target + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        upstream = await self._http().request(request.method, url, content=raw, headers=headers)
        exchange.headers = {k.lower(): v for k, v in upstream.headers.items()}
        text = upstream.text
        try:
            exchange.answer = json.loads(text)
        except ValueError:
            exchange.answer = text
        out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP_HEADERS}
        return Response(upstream.content, status_code=upstream.status_code, headers=out_headers)

    async def _scripted(self, path: str, body: dict[str, Any], exchange: Exchange) -> Response:
        assert self.script is not None
        prompt_tokens = 0
        if self.count_via is not None and path in self.count_paths:
            counted = await self._http().post(self.count_via + path, json=_counting_body(path, body))
            if counted.status_code != 200:
                exchange.answer = counted.json()
                return JSONResponse(exchange.answer, status_code=counted.status_code)
            usage = counted.json()["usage"]
            prompt_tokens = usage["input_tokens"] if path == "/v1/responses" else usage["prompt_tokens"]
            exchange.upstream_prompt_tokens = prompt_tokens
        text, calls = plan_answer(self.script, body)
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 3, "total_tokens": prompt_tokens + 3}
        stream = bool(body.get("stream"))
        if path == "/v1/chat/completions":
            answer = chat_answer(body, text, calls, usage)
            exchange.answer = answer
            if stream:
                return Response(chat_stream(body, answer), media_type="text/event-stream")
            return JSONResponse(answer)
        if path == "/v1/completions":
            answer = completion_answer(body, text or "", usage)
            exchange.answer = answer
            if stream:
                return Response(completion_stream(answer), media_type="text/event-stream")
            return JSONResponse(answer)
        answer = responses_answer(body, text, calls, usage)
        exchange.answer = answer
        if stream:
            return Response(responses_stream(answer), media_type="text/event-stream")
        return JSONResponse(answer)
