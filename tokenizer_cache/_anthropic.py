"""Turn an Anthropic Messages request into the chat request vLLM renders for it.

vLLM 0.32 serves `/v1/messages` by converting the request to a chat request
(`AnthropicServingMessages.to_chat_completion_request`,
vllm/entrypoints/anthropic/serving.py) and then running the ordinary chat
path, so the prompt is the chat prompt of the converted request.  This module
restates that conversion, rule by rule, as a pure function: Messages JSON in,
OpenAI chat JSON out (what `_chat` then validates and the template renders).

Two facts depend on the model rather than the request, and are passed in:

* `merge_inline_system`: vLLM renders `[system, user, system, user]` with the
  model's template at start-up; if that raises, system messages inside
  `messages` are merged into the leading system prompt
  (`_detect_merge_inline_system`, see `detect_merge_inline_system` below);
* `disabled_thinking_effort`: the `reasoning_effort` that `thinking: {"type":
  "disabled"}` becomes — "none", or "low" when the template renders "none" the
  same as an effort (`_probe_disabled_thinking_effort`).

Validation is no stricter than vLLM's pydantic models: a field brimful reads
with the wrong type raises `CountError` (vLLM answers 400 too); anything it
does not read is left for vLLM to judge.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ._chat import BILLING_HEADER
from ._chat import _bad_type as _bad
from ._errors import CountError

# AnthropicContentBlock.type (vllm/entrypoints/anthropic/protocol.py)
BLOCK_TYPES = frozenset({
    "text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
    "tool_addition", "tool_removal",
})
ROLES = frozenset({"user", "assistant", "system"})
# Claude Code puts a per-request hash in a system block with this prefix; vLLM drops the block.
# thinking.type=disabled is probed against these efforts (AnthropicEffort).
EFFORTS = ("low", "medium", "high", "xhigh", "max")


def _optional_str(block: Mapping[str, Any], key: str, where: str) -> str | None:
    value = block.get(key)
    if value is not None and not isinstance(value, str):
        raise _bad(f"{where}.{key}", "a string", value)
    return value


# ---------------------------------------------------------------------------
# Model facts (computed once per chat template)
# ---------------------------------------------------------------------------

def detect_merge_inline_system(template_source: str | None) -> bool:
    """vLLM's `_detect_merge_inline_system`: True when the template refuses a system
    message after the first turn (e.g. a `loop.first` guard), so vLLM merges them.

    vLLM renders in a plain sandbox (no `raise_exception`, no `strftime_now`), so a
    template that calls either on this conversation counts as refusing it.
    """
    if not template_source:
        return True
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    try:
        env.from_string(template_source).render(
            messages=[
                {"role": "system", "content": "t"},
                {"role": "user", "content": "t"},
                {"role": "system", "content": "t"},
                {"role": "user", "content": "t"},
            ],
            add_generation_prompt=False,
        )
    except jinja2.TemplateError:
        return True
    return False


def probe_disabled_thinking_effort(render_chat: Callable[[dict[str, Any]], str]) -> str:
    """vLLM's `_probe_disabled_thinking_effort`: "none", unless rendering "none" fails or gives
    the prompt of an effort (the template ignores it), then "low"."""
    def prompt(effort: str) -> str | None:
        try:
            return render_chat({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort})
        except CountError:
            return None

    none = prompt("none")
    if none is None or any(prompt(effort) == none for effort in EFFORTS):
        return "low"
    return "none"


def count_messages(model: Any, body: Mapping[str, Any]) -> int:
    """Prompt tokens of a Messages request for any counting model (`CountingModel`).

    A model with its own rule (ModelTokenizer: its template's facts) counts it
    itself; otherwise the chat is vLLM's conversion for a renderer without an
    HF template (mistral-common): inline system messages merged (vLLM merges
    when it has no template to probe), the disabled-thinking effort probed.
    """
    own = getattr(model, "count_messages", None)
    if own is not None:
        return int(own(body))
    chat = to_chat_request(body, merge_inline_system=True,
                           disabled_thinking_effort=probe_disabled_thinking_effort(model.render_chat))
    return int(model.count_chat(chat))


# ---------------------------------------------------------------------------
# The conversion
# ---------------------------------------------------------------------------

def to_chat_request(
    body: Mapping[str, Any],
    *,
    merge_inline_system: bool,
    disabled_thinking_effort: str,
) -> dict[str, Any]:
    """The chat request vLLM renders for this Messages (or count_tokens) request."""
    if not isinstance(body, Mapping):
        raise CountError("The request body must be a JSON object.")
    messages = body.get("messages")
    if messages is None:
        raise CountError("'messages' is required for a Messages request.", param="messages")
    if not isinstance(messages, list):
        raise _bad("messages", "an array of message objects", messages)
    parsed = [_message(m, f"messages[{i}]") for i, m in enumerate(messages)]

    chat: list[dict[str, Any]] = []
    _system_message(body, parsed, chat, merge_inline_system)
    for role, content, where in parsed:
        if role == "system":
            if merge_inline_system:
                continue
            text = _system_text(content)
            if text:
                chat.append({"role": "system", "content": text})
            continue
        message: dict[str, Any] = {"role": role}
        if isinstance(content, str):
            message["content"] = content
        else:
            _convert_blocks(content, role, message, chat, where)
        if not (role == "user" and "content" not in message):
            chat.append(message)

    request: dict[str, Any] = {"messages": chat}
    if body.get("chat_template_kwargs") is not None:
        request["chat_template_kwargs"] = body["chat_template_kwargs"]
    effort = _reasoning_effort(body, disabled_thinking_effort)
    if effort is not None:
        request["reasoning_effort"] = effort
    tools = _tools(body, parsed)
    if tools is not None:
        # None left: vLLM sets `req.tools = []` on the chat request it already validated, so the
        # chat's refusal of an empty list never runs; a tuple says so to `_chat.parse_tools`.
        request["tools"] = tools if tools else ()
    return request


def _message(message: Any, where: str) -> tuple[str, Any, str]:
    if not isinstance(message, dict):
        raise _bad(where, "an object", message)
    role = message.get("role")
    if role not in ROLES:
        raise CountError(f"'{where}.role' must be one of user, assistant, system, got {json.dumps(role)}.",
                         param="messages")
    content = message.get("content")
    if isinstance(content, str):
        return role, content, where
    if not isinstance(content, list):
        raise _bad(f"{where}.content", "a string or an array of content blocks", content)
    for i, block in enumerate(content):
        at = f"{where}.content[{i}]"
        if not isinstance(block, dict):
            raise _bad(at, "a content block object", block)
        kind = block.get("type")
        if kind not in BLOCK_TYPES:
            raise CountError(f"'{at}.type' {json.dumps(kind)} is not a Messages content block type.",
                             param="messages")
        if kind in ("tool_addition", "tool_removal") and role != "system":
            raise CountError(f'{kind} blocks are only allowed in messages with role "system"', param="messages")
    return role, content, where


def _system_text(content: Any) -> str | None:
    """Text of a system message, billing-header blocks dropped ("" joins, as vLLM does)."""
    if isinstance(content, str):
        return None if content.startswith(BILLING_HEADER) else content
    parts = [b["text"] for b in content
             if b.get("type") == "text" and isinstance(b.get("text"), str) and b["text"]
             and not b["text"].startswith(BILLING_HEADER)]
    return "".join(parts) if parts else None


def _system_message(body: Mapping[str, Any], parsed: list[tuple[str, Any, str]], chat: list[dict[str, Any]],
                    merge_inline_system: bool) -> None:
    system = body.get("system")
    parts: list[str] = []
    if system:
        if isinstance(system, str):
            parts.append(system)
        elif isinstance(system, list):
            for i, block in enumerate(system):
                if not isinstance(block, dict):
                    raise _bad(f"system[{i}]", "a content block object", block)
                text = _optional_str(block, "text", f"system[{i}]")
                if block.get("type") == "text" and text and not text.startswith(BILLING_HEADER):
                    parts.append(text)
        else:
            raise _bad("system", "a string or an array of content blocks", system)
    if merge_inline_system:
        for role, content, _ in parsed:
            if role == "system":
                text = _system_text(content)
                if text:
                    parts.append(text)
    if parts:
        chat.append({"role": "system", "content": "".join(parts)})


def _convert_blocks(blocks: list[dict[str, Any]], role: str, message: dict[str, Any],
                    chat: list[dict[str, Any]], where: str) -> None:
    """`_convert_message_content`: text and images become parts, thinking becomes
    `reasoning`, tool_use becomes tool calls, a user's tool_result a tool message."""
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    for i, block in enumerate(blocks):
        at = f"{where}.content[{i}]"
        kind = block["type"]
        if kind == "text":
            text = _optional_str(block, "text", at)
            if text:
                parts.append({"type": "text", "text": text})
        elif kind == "image":
            if block.get("source"):
                parts.append({"type": "image_url", "image_url": {"url": _image_url(block["source"], at)}})
        elif kind == "thinking":
            thinking = _optional_str(block, "thinking", at)
            if thinking is not None:
                reasoning.append(thinking)
        elif kind == "tool_use":
            calls.append(_tool_call(block, at))
        elif kind == "tool_result":
            _tool_result(block, role, chat, parts, at)
        # redacted_thinking, tool_reference (outside a tool_result): nothing to render
    if reasoning:
        message["reasoning"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    if parts:
        if len(parts) == 1 and parts[0]["type"] == "text":
            message["content"] = parts[0]["text"]
        else:
            message["content"] = parts


def _image_url(source: Any, where: str) -> str:
    if not isinstance(source, dict):
        raise _bad(f"{where}.source", "an object", source)
    if source.get("type") == "url":
        return str(source.get("url", ""))
    return f"data:{source.get('media_type', 'image/jpeg')};base64,{source.get('data', '')}"


def _tool_call(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    arguments = block.get("input")
    if arguments is not None and not isinstance(arguments, dict):
        raise _bad(f"{where}.input", "an object", arguments)
    name = _optional_str(block, "name", where)
    call_id = _optional_str(block, "id", where)
    return {
        "id": call_id or f"call_{int(time.time())}",   # vLLM's own fallback id
        "type": "function",
        "function": {"name": name or "", "arguments": json.dumps(arguments or {})},
    }


def _tool_result(block: Mapping[str, Any], role: str, chat: list[dict[str, Any]], parts: list[dict[str, Any]],
                 where: str) -> None:
    content = block.get("content")
    if content is not None and not isinstance(content, (str, list)):
        raise _bad(f"{where}.content", "a string or an array of objects", content)
    tool_use_id = _optional_str(block, "tool_use_id", where) or ""
    if role != "user":
        # vLLM: f"Tool result: {str(block.content)}" (a list prints as Python's repr)
        parts.append({"type": "text", "text": f"Tool result: {content if content else ''}"})
        return
    text = ""
    images: list[str] = []
    references: list[dict[str, Any]] = []
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        texts = []
        for i, item in enumerate(content):
            if not isinstance(item, dict):
                continue
            kind = item.get("type")
            if kind == "text":
                value = item.get("text", "")
                if not isinstance(value, str):      # vLLM's join of the texts fails on it: a 400
                    raise _bad(f"{where}.content[{i}].text", "a string", value)
                texts.append(value)
            elif kind == "image":
                url = _image_url(item.get("source", {}), where)
                if url:
                    images.append(url)
            elif kind == "tool_reference":
                name = item.get("tool_name") or item.get("name")
                if name:
                    references.append({"type": "tool_reference", "name": name})
        text = "\n".join(texts)
    chat.append({"role": "tool", "tool_call_id": tool_use_id, "content": text or ""})
    if images:
        chat.append({"role": "user", "content": [{"type": "image_url", "image_url": {"url": u}} for u in images]})
    if references:
        chat.append({"role": "tool", "tool_call_id": tool_use_id, "content": references})


def _reasoning_effort(body: Mapping[str, Any], disabled_thinking_effort: str) -> str | None:
    """`_handle_output_config` then `_handle_thinking`: a disabled thinking wins over output_config.effort."""
    effort = None
    output_config = body.get("output_config")
    if isinstance(output_config, dict) and isinstance(output_config.get("effort"), str):
        effort = output_config["effort"]
    thinking = body.get("thinking")
    if isinstance(thinking, dict) and thinking.get("type") == "disabled":
        effort = disabled_thinking_effort
    return effort


def _tools(body: Mapping[str, Any], parsed: list[tuple[str, Any, str]]) -> list[dict[str, Any]] | None:
    """`_resolve_tools` + `_convert_tools`: the tools in effect at the end of the conversation, as chat tools."""
    declared = body.get("tools")
    if declared is not None and not isinstance(declared, list):
        raise _bad("tools", "an array of tool objects", declared)
    tools = [_tool(t, f"tools[{i}]") for i, t in enumerate(declared or [])]
    changes = [block for role, content, _ in parsed if not isinstance(content, str)
               for block in content if block.get("type") in ("tool_addition", "tool_removal")]
    if changes:
        by_name = {t["name"]: t for t in tools}
        removed: set[str] = set()
        for block in changes:
            change = block.get("tool")
            if not isinstance(change, dict):
                raise CountError(f"tool is required for {block['type']} blocks", param="messages")
            if change.get("type") == "tool_definition":
                tool = _tool(change.get("definition"), "tool.definition")
                name = tool["name"]
                by_name[name] = tool
            else:
                name = change.get("name")
                if not isinstance(name, str) or name not in by_name:
                    raise CountError(f"{block['type']} references tool {name!r}, which is not declared in tools",
                                     param="messages")
                if block["type"] == "tool_addition":
                    by_name[name] = {**by_name[name], "defer_loading": None}
            if block["type"] == "tool_removal":
                removed.add(name)
            else:
                removed.discard(name)
        tools = [t for name, t in by_name.items() if name not in removed]
    elif declared is None:
        return None
    return [_chat_tool(t) for t in tools]


def _tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise _bad(where, "an object", tool)
    name = tool.get("name")
    if not isinstance(name, str):
        raise _bad(f"{where}.name", "a string", name)
    schema = tool.get("input_schema")
    if not isinstance(schema, dict):
        raise _bad(f"{where}.input_schema", "an object", schema)
    if "type" not in schema:
        schema = {**schema, "type": "object"}   # AnthropicTool.validate_input_schema
    return {"name": name, "description": _optional_str(tool, "description", where), "input_schema": schema,
            "strict": tool.get("strict"), "defer_loading": tool.get("defer_loading")}


def _chat_tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """ChatCompletionToolsParam as vLLM dumps it: strict and defer_loading only when set."""
    function: dict[str, Any] = {"name": tool["name"], "description": tool["description"],
                                "parameters": tool["input_schema"]}
    for key in ("strict", "defer_loading"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}
