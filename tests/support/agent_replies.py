"""Scripted replies for the fake vLLM, so a real agent CLI's loop runs several turns against it.

`FakeVLLM(script=...)` answers a generation request on chat, Responses or
Messages with the `Reply` the script returns (text, tool calls) instead of its
usual run of `completion_text_token`, still validated and limited exactly as
vLLM 0.32 does: a reply longer than the limit the request got is cut there
(finish `length` / stop `max_tokens` / status `incomplete`) and loses its tool
calls, as a clamped sliver would in a real model's answer.

`Reply.tokens` is the reply's length in completion tokens (the fake does not
tokenize); by default a word is a token and a tool call 20.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_TOKENS = 20


@dataclass
class Reply:
    text: str = ""
    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    tokens: int | None = None

    @property
    def length(self) -> int:
        if self.tokens is not None:
            return self.tokens
        return max(1, len(self.text.split()) + TOOL_CALL_TOKENS * len(self.tool_calls))

    def within(self, limit: int) -> tuple[Reply, bool]:
        """The reply as generated under `limit` completion tokens, and whether it was cut."""
        if self.length <= limit:
            return self, False
        words = self.text.split()[:limit] or ["…"]
        return Reply(" ".join(words), [], limit), True


Script = Callable[[str, dict[str, Any]], Reply]


def _sse(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _data(data: Any) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


# -- /v1/messages -------------------------------------------------------------------------

def _message_blocks(reply: Reply, rid: str) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = [{"type": "text", "text": reply.text}] if reply.text else []
    for i, (name, arguments) in enumerate(reply.tool_calls):
        blocks.append({"type": "tool_use", "id": f"toolu_{rid}{i}", "name": name, "input": arguments})
    return blocks or [{"type": "text", "text": ""}]


def _stop_reason(reply: Reply, cut: bool) -> str:
    return "max_tokens" if cut else ("tool_use" if reply.tool_calls else "end_turn")


def messages_body(model: str, prompt: int, limit: int, script: Reply, rid: str) -> dict[str, Any]:
    reply, cut = script.within(limit)
    return {"id": f"chatcmpl-{rid}", "type": "message", "role": "assistant", "content": _message_blocks(reply, rid),
            "model": model, "stop_reason": _stop_reason(reply, cut), "stop_sequence": None,
            "usage": {"input_tokens": prompt, "output_tokens": reply.length}}


def messages_events(model: str, prompt: int, limit: int, script: Reply, rid: str) -> Iterable[tuple[str, bytes]]:
    reply, cut = script.within(limit)
    yield "meta", _sse("message_start", {"type": "message_start", "message": {
        "id": f"chatcmpl-{rid}", "type": "message", "role": "assistant", "content": [], "model": model,
        "stop_reason": None, "stop_sequence": None, "usage": {"input_tokens": prompt, "output_tokens": 0}}})
    for index, block in enumerate(_message_blocks(reply, rid)):
        if block["type"] == "text":
            yield "meta", _sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {"type": "text", "text": ""}})
            delta: dict[str, Any] = {"type": "text_delta", "text": block["text"]}
        else:
            yield "meta", _sse("content_block_start", {"type": "content_block_start", "index": index,
                                                       "content_block": {**block, "input": {}}})
            delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        yield "step", _sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield "meta", _sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield "meta", _sse("message_delta", {"type": "message_delta",
                                         "delta": {"stop_reason": _stop_reason(reply, cut), "stop_sequence": None},
                                         "usage": {"input_tokens": prompt, "output_tokens": reply.length}})
    yield "meta", _sse("message_stop", {"type": "message_stop"})


# -- /v1/chat/completions ---------------------------------------------------------------------

def _chat_calls(reply: Reply, rid: str) -> list[dict[str, Any]]:
    return [{"id": f"call_{rid}{i}", "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
            for i, (n, a) in enumerate(reply.tool_calls)]


def _finish(reply: Reply, cut: bool) -> str:
    return "length" if cut else ("tool_calls" if reply.tool_calls else "stop")


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def chat_body(model: str, prompt: int, limit: int, script: Reply, rid: str, created: int) -> dict[str, Any]:
    reply, cut = script.within(limit)
    message: dict[str, Any] = {"role": "assistant", "content": reply.text or None}
    if reply.tool_calls:
        message["tool_calls"] = _chat_calls(reply, rid)
    return {"id": f"chatcmpl-{rid}", "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": _finish(reply, cut)}],
            "usage": _usage(prompt, reply.length)}


def chat_events(model: str, prompt: int, limit: int, script: Reply, rid: str, created: int,
                include_usage: bool) -> Iterable[tuple[str, bytes]]:
    reply, cut = script.within(limit)
    head = {"id": f"chatcmpl-{rid}", "object": "chat.completion.chunk", "created": created, "model": model}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        return _data({**head, "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]})

    yield "meta", chunk({"role": "assistant", "content": ""})
    if reply.text:
        yield "step", chunk({"content": reply.text})
    for index, call in enumerate(_chat_calls(reply, rid)):
        yield "step", chunk({"tool_calls": [{"index": index, **call}]})
    yield "meta", chunk({}, _finish(reply, cut))
    if include_usage:
        yield "meta", _data({**head, "choices": [], "usage": _usage(prompt, reply.length)})
    yield "meta", b"data: [DONE]\n\n"


# -- /v1/responses ------------------------------------------------------------------------------

def _response_items(reply: Reply, rid: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    if reply.text:
        items.append({"id": f"msg_{rid}", "type": "message", "role": "assistant", "status": "completed",
                      "content": [{"type": "output_text", "text": reply.text, "annotations": []}]})
    for i, (name, arguments) in enumerate(reply.tool_calls):
        items.append({"id": f"fc_{rid}{i}", "type": "function_call", "call_id": f"call_{rid}{i}", "name": name,
                      "arguments": json.dumps(arguments), "status": "completed"})
    return items


def responses_body(model: str, prompt: int, limit: int, script: Reply, rid: str, created: int) -> dict[str, Any]:
    reply, cut = script.within(limit)
    return {"id": f"resp_{rid}", "object": "response", "created_at": created, "model": model,
            "status": "incomplete" if cut else "completed",
            "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "output": _response_items(reply, rid), "parallel_tool_calls": True, "tool_choice": "auto", "tools": [],
            "usage": {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": reply.length, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": prompt + reply.length}}


def responses_events(model: str, prompt: int, limit: int, script: Reply, rid: str,
                     created: int) -> Iterable[tuple[str, bytes]]:
    final = responses_body(model, prompt, limit, script, rid, created)
    seq = iter(range(1 << 30))
    started = {**final, "status": "in_progress", "output": [], "usage": None, "incomplete_details": None}
    yield "meta", _sse("response.created", {"type": "response.created", "response": started,
                                            "sequence_number": next(seq)})
    for index, item in enumerate(final["output"]):
        yield "step", _sse("response.output_item.added", {"type": "response.output_item.added",
                                                          "output_index": index, "item": item,
                                                          "sequence_number": next(seq)})
        yield "meta", _sse("response.output_item.done", {"type": "response.output_item.done",
                                                         "output_index": index, "item": item,
                                                         "sequence_number": next(seq)})
    end = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
    yield "meta", _sse(end, {"type": end, "response": final, "sequence_number": next(seq)})
