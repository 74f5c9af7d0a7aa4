"""Turn an OpenAI Responses request into the chat request vLLM renders for it.

vLLM 0.32 renders `/v1/responses` (for models without harmony) by building
chat messages from `instructions` and `input`
(`construct_input_messages`, vllm/entrypoints/openai/responses/utils.py),
chat tools from the function tools (`construct_tool_dicts`), and template
arguments from the request (`ResponsesRequest.build_chat_params`), then
running the ordinary chat renderer.  This module restates those rules as a
pure function: Responses JSON in, OpenAI chat JSON out.

One difference from a chat request: the Responses request tokenizes the
rendered prompt with `TokenizeParams`' default `add_special_tokens=True`
(`ResponsesRequest.build_tok_params` does not set it), where chat uses
False; a tokenizer whose post-processor adds a BOS counts one more token.

`previous_response_id` names a conversation stored upstream: it cannot be
counted here, and the caller does not ask this module to.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from ._chat import _bad_type as _bad
from ._errors import CountError

# vllm/tool_parsers/utils.py: namespaced functions are shown as "<namespace>__<name>",
# a custom tool as a function taking one string "input" (custom_tool_parameters).
NAMESPACE_SEPARATOR = "__"
CUSTOM_TOOL_INPUT_KEY = "input"
CUSTOM_TOOL_PARAMETERS = {
    "type": "object",
    "properties": {
        CUSTOM_TOOL_INPUT_KEY: {"type": "string", "description": "The freeform text payload for this tool."},
    },
    "required": [CUSTOM_TOOL_INPUT_KEY],
    "additionalProperties": False,
}
_PARTIAL = ("in_progress", "incomplete")


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key}", "a string", value)
    return value


def count_responses(model: Any, body: Mapping[str, Any]) -> int:
    """Prompt tokens of a Responses request for any counting model (`CountingModel`): its own
    rule when it has one (ModelTokenizer; gpt-oss renders Responses with harmony), else the chat
    of the converted request."""
    own = getattr(model, "count_responses", None)
    if own is not None:
        return int(own(body))
    return int(model.count_chat(to_chat_request(body)))


def to_chat_request(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat request vLLM renders for this Responses request."""
    if not isinstance(body, Mapping):
        raise CountError("The request body must be a JSON object.")
    if body.get("prompt") is not None:
        # ResponsesRequest.validate_prompt (responses/protocol.py), before anything else is read
        raise CountError("prompt template is not supported", param="prompt")
    if "input" not in body:
        raise CountError("'input' is required for a Responses request.", param="input")
    request_input = body["input"]
    messages, _ = _messages(body)
    cont = _continues_final_message(request_input)
    chat: dict[str, Any] = {
        "messages": messages,
        "add_generation_prompt": not cont,
        "continue_final_message": cont,
        "add_special_tokens": True,
    }
    kwargs = _template_kwargs(body)
    if kwargs:
        chat["chat_template_kwargs"] = kwargs
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    return chat


def _messages(body: Mapping[str, Any]) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages, and where each came from: "instructions", "input" or "input[i]" (the
    first of the items merged into it)."""
    request_input = body["input"]
    messages: list[dict[str, Any]] = []
    origins: list[str] = []
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("instructions", "a string", instructions)
    if instructions:
        messages.append({"role": "system", "content": instructions})
        origins.append("instructions")
    if isinstance(request_input, str):
        messages.append({"role": "user", "content": request_input})
        origins.append("input")
    elif isinstance(request_input, list):
        for i, item in enumerate(request_input):
            message = _item(item, messages[-1] if messages else None, f"input[{i}]")
            if message is not None:
                messages.append(message)
                origins.append(f"input[{i}]")
    else:
        raise _bad("input", "a string or an array of input items", request_input)
    return messages, origins


_CHAT_PATH = re.compile(r"\bmessages\[(\d+)\]((?:\.[A-Za-z_]+|\[\d+\])*)")
_CHAT_TOOL_PATH = re.compile(r"\btools\[(\d+)\]\.function\b")
_OUTPUT_FIELDS = {".content": ".output", ".tool_call_id": ".call_id"}


def in_request_terms(body: Mapping[str, Any], text: str) -> str:
    """`text` (a CountError's message or param, which name the converted chat's paths) with
    the Responses request's own: `messages[3].content` → `input[2].content` (or
    `instructions`, or a tool output's `.output`), `tools[0].function.description` →
    `tools[0].description`, a bare `messages` → `input`."""
    origins: list[str] = []
    if "input" in body:
        try:
            _, origins = _messages(body)
        except CountError:
            pass
    tool_origins: list[str] = []
    if body.get("tools") is not None:
        try:
            _, tool_origins = _tools_and_origins(body["tools"])
        except CountError:
            pass
    items = body.get("input")

    def one(match: re.Match[str]) -> str:
        index, rest = int(match.group(1)), match.group(2)
        origin = origins[index] if index < len(origins) else "input"
        if origin in ("instructions", "input") or rest.startswith((".tool_calls", ".reasoning")):
            return origin
        position = re.fullmatch(r"input\[(\d+)\]", origin)
        item = items[int(position.group(1))] if position and isinstance(items, list) else None
        if isinstance(item, dict) and item.get("type") in ("function_call_output", "custom_tool_call_output"):
            for chat_field, own in _OUTPUT_FIELDS.items():
                if rest.startswith(chat_field):
                    rest = own + rest[len(chat_field):]
        return origin + rest

    def tool(match: re.Match[str]) -> str:
        index = int(match.group(1))
        return tool_origins[index] if index < len(tool_origins) else f"tools[{index}]"

    text = _CHAT_TOOL_PATH.sub(tool, _CHAT_PATH.sub(one, text))
    return "input" if text == "messages" else text.replace("'messages'", "'input'")


def _continues_final_message(request_input: Any) -> bool:
    """`should_continue_final_message`: the last item is a partial assistant message or reasoning."""
    if not isinstance(request_input, list) or not request_input:
        return False
    last = request_input[-1]
    if not isinstance(last, dict):
        return False
    return last.get("type", "message") in ("message", "reasoning") and last.get("status") in _PARTIAL


def _template_kwargs(body: Mapping[str, Any]) -> dict[str, Any]:
    """`build_chat_params`: the request's chat_template_kwargs, reasoning.effort and enable_thinking."""
    user = body.get("chat_template_kwargs")
    if user is not None and not isinstance(user, dict):
        raise _bad("chat_template_kwargs", "an object", user)
    kwargs = dict(user or {})
    reasoning = body.get("reasoning")
    effort = reasoning.get("effort") if isinstance(reasoning, dict) else None
    if effort is not None and effort != "auto":
        kwargs["reasoning_effort"] = effort
        if "enable_thinking" not in (user or {}):
            kwargs["enable_thinking"] = effort != "none"
    return kwargs


def _assistant(previous: dict[str, Any] | None) -> dict[str, Any] | None:
    return previous if previous is not None and previous.get("role") == "assistant" else None


def _item(item: Any, previous: dict[str, Any] | None, where: str) -> dict[str, Any] | None:
    """One input item as a new chat message, or None when it extended `previous` (vLLM merges
    reasoning, tool calls and text of one assistant turn into one message)."""
    if not isinstance(item, dict):
        raise _bad(where, "an input item object", item)
    kind = item.get("type")
    prev = _assistant(previous)
    if kind in ("function_call", "custom_tool_call"):
        call = _tool_call(item, kind, where)
        if prev is not None:
            prev.setdefault("tool_calls", []).append(call)
            return None
        return {"role": "assistant", "tool_calls": [call]}
    if kind == "reasoning":
        reasoning = _reasoning_text(item, where)
        if prev is not None and prev.get("reasoning") is None:
            prev["reasoning"] = reasoning
            return None
        return {"role": "assistant", "reasoning": reasoning}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "content": _parts(item.get("output")), "tool_call_id": item.get("call_id")}
    role = item.get("role")
    if role == "assistant":
        content = item.get("content")
        text: Any = content if isinstance(content, str) else (
            content[0].get("text") if isinstance(content, list) and content and isinstance(content[0], dict)
            else None)
        if text is not None:
            if prev is not None and prev.get("content") is None:
                prev["content"] = text
                return None
            return {"role": "assistant", "content": text}
    if role is not None:
        # A message passes as it is; only the fields the input-message types carry reach the template.
        return {"role": role, "content": _parts(item.get("content"))}
    raise CountError(f"Unsupported input item type: {kind}", param="input")


def _parts(content: Any) -> Any:
    """Responses' text parts (`input_text`, `output_text`) as chat `text` parts: vLLM's chat parser
    reads them alike, and the /tokenize route (which counts when no tokenizer is local) only takes `text`.
    An `input_image` without `detail` gets the API's "auto", as vLLM 0.32's request model gives it
    (responses/protocol.py `_default_input_image_details`)."""
    if not isinstance(content, list):
        return content
    return [_part(part) for part in content]


def _part(part: Any) -> Any:
    if not isinstance(part, dict):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text")}
    if kind == "input_image" and "detail" not in part:
        return {**part, "detail": "auto"}
    return part


def _tool_call(item: Mapping[str, Any], kind: str, where: str) -> dict[str, Any]:
    call_id = _string(item, "call_id", where)
    name = _string(item, "name", where)
    if kind == "custom_tool_call":
        payload: Any = item.get("input") or ""
        arguments = json.dumps({CUSTOM_TOOL_INPUT_KEY: payload}, ensure_ascii=False)
    else:
        arguments = _string(item, "arguments", where)
        namespace = item.get("namespace")
        if isinstance(namespace, str) and namespace:
            name = f"{namespace}{NAMESPACE_SEPARATOR}{name}"
    return {"id": call_id, "function": {"name": name, "arguments": arguments}, "type": "function"}


def _reasoning_text(item: Mapping[str, Any], where: str) -> str:
    if item.get("encrypted_content"):
        raise CountError("Encrypted content is not supported.", param="input")
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list) and parts:
            first = parts[0]
            if not isinstance(first, dict):
                raise _bad(f"{where}.{key}[0]", "an object", first)
            return _string(first, "text", f"{where}.{key}[0]")
    return ""


def _tools(tools: Any) -> list[dict[str, Any]] | None:
    """`construct_tool_dicts`: function tools (namespaces flattened, custom tools as a
    one-string function) as chat tools; tools of other types are not shown to the model."""
    return None if tools is None else _tools_and_origins(tools)[0]


def _tools_and_origins(tools: Any) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat tools, and the request path each came from (`tools[1]`, `tools[0].tools[2]`)."""
    if not isinstance(tools, list):
        raise _bad("tools", "an array of tool objects", tools)
    functions: list[dict[str, Any]] = []
    origins: list[str] = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"tools[{i}]", "an object", tool)
        kind = tool.get("type")
        if kind == "function":
            functions.append(_function(tool, tool.get("name"), f"tools[{i}]"))
            origins.append(f"tools[{i}]")
        elif kind == "namespace":
            namespace = _string(tool, "name", f"tools[{i}]")
            inner = tool.get("tools")
            if not isinstance(inner, list):
                raise _bad(f"tools[{i}].tools", "an array of tool objects", inner)
            for j, member in enumerate(inner):
                if isinstance(member, dict) and member.get("type") == "function":
                    where = f"tools[{i}].tools[{j}]"
                    name = f"{namespace}{NAMESPACE_SEPARATOR}{_string(member, 'name', where)}"
                    functions.append(_function(member, name, where))
                    origins.append(where)
        elif kind == "custom":
            name = _string(tool, "name", f"tools[{i}]")
            functions.append({"type": "function", "function": {
                "name": name, "description": tool.get("description"), "parameters": CUSTOM_TOOL_PARAMETERS}})
            origins.append(f"tools[{i}]")
    return functions, origins


def _function(tool: Mapping[str, Any], name: Any, where: str) -> dict[str, Any]:
    """FunctionDefinition as vLLM dumps it: strict and defer_loading only when set."""
    if not isinstance(name, str):
        raise _bad(f"{where}.name", "a string", name)
    parameters = tool.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _bad(f"{where}.parameters", "an object", parameters)
    function: dict[str, Any] = {"name": name, "description": tool.get("description"), "parameters": parameters}
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}
