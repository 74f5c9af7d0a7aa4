"""Turn an OpenAI chat request into what vLLM hands the chat template.

Pure functions, no tokenizer and no template: request JSON in, validated plain
data out.  Each rule names where vLLM does the same thing (vLLM 0.32/0.33,
vllm/entrypoints/chat_utils.py — `_parse_chat_message_content`,
`_postprocess_messages` — the chat request model in
vllm/entrypoints/openai/chat_completion/protocol.py, and
vllm/renderers/hf.py `resolve_chat_template_kwargs`); docs/vllm-behaviour.md
("Chat and completions") restates them.

A field of the wrong type raises `CountError` naming the field, never a bare
Python exception: the proxy answers such a request with a 400 like vLLM does.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ._errors import CountError, MediaNotCountable
from ._json import json_loads
from ._media import MediaItem

ContentFormat = Literal["string", "openai"]

# Part types whose payload is text, and the key holding it
# (vLLM's MM_PARSER_MAP entries that return text).
_TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
# Roles whose messages vLLM's request model validates with OpenAI's own
# message types (their content parts are checked strictly); other roles go
# through vLLM's custom message type, which accepts any part.
_OPENAI_ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})
_RESPONSES_TEXT_PARTS = frozenset({"input_text", "output_text"})
# Part types that carry media, and the modality vLLM files each under
# (`_parse_chat_message_content_part`).
_MEDIA_PART_TYPES = {
    "image_url": "image",
    "input_image": "image",
    "image_pil": "image",
    "image_embeds": "image",
    "audio_url": "audio",
    "input_audio": "audio",
    "audio_embeds": "audio",
    "video_url": "video",
    "video_embeds": "video",
    "prompt_embeds": "prompt_embeds",
}
# Keys that make an untyped part (or one with a uuid) a media part, in the
# order vLLM tries them (`_parse_chat_message_content_mm_part`).
_MEDIA_KEYS = ("image_url", "image_pil", "image_embeds", "audio_embeds", "video_embeds", "prompt_embeds",
               "audio_url", "input_audio", "video_url")
# Fields of vLLM's content-part types; any other field of a media part is
# handed to the template beside {"type": modality} (`_collect_extra_fields`).
_KNOWN_PART_FIELDS = frozenset(
    {"audio_embeds", "audio_url", "closed", "data", "file", "image_embeds", "image_pil", "image_url",
     "input_audio", "name", "prompt_cache_breakpoint", "refusal", "text", "thinking", "type", "uuid",
     "video_embeds", "video_url"}
)
_IMAGE_DETAILS = frozenset({"auto", "low", "high", "original"})

# transformers' `apply_chat_template` named parameters: accepted as
# chat_template_kwargs even when the template never reads them
# (vLLM `_get_hf_base_chat_template_params`), but consumed by
# apply_chat_template rather than passed on to the template.
_APPLY_CHAT_TEMPLATE_PARAMS = frozenset(
    {
        "conversation",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
# Keys vLLM refuses in chat_template_kwargs (`resolve_chat_template_kwargs`).
_FORBIDDEN_KWARGS = ("chat_template", "tokenize")

# pydantic's lax bool parsing, which vLLM's request model uses.
_TRUE_STRINGS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_STRINGS = frozenset({"0", "off", "f", "false", "n", "no"})


@dataclass(frozen=True)
class ChatOptions:
    """The request-level switches that steer rendering and encoding."""

    add_generation_prompt: bool
    continue_final_message: bool
    add_special_tokens: bool


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def _bad_type(param: str, expected: str, value: Any) -> CountError:
    return CountError(f"'{param}' must be {expected}, got {_type_name(value)}.", param=param)


def lax_bool(value: Any) -> bool | None:
    """A `bool | None` field's value as pydantic's lax mode reads it (vLLM's request models);
    ValueError for what vLLM refuses.

    Checked against pydantic 2.14 (vLLM 0.32's): booleans; 0, 1, 0.0 and 1.0; the words
    "1", "on", "t", "true", "y", "yes" and "0", "off", "f", "false", "n", "no" in any case and
    without spaces around them. 2, 1.5, "", " true", "1.0" are refused.
    """
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str):
        lowered = value.lower()
        if lowered in _TRUE_STRINGS:
            return True
        if lowered in _FALSE_STRINGS:
            return False
    raise ValueError("is not a boolean")


def _lax_bool(value: Any, where: str) -> bool | None:
    """`lax_bool`, anything else a 400 naming the field."""
    try:
        return lax_bool(value)
    except ValueError:
        raise _bad_type(where, "a boolean", value) from None


def _as_bool(body: Mapping[str, Any], key: str, default: bool) -> bool:
    """A required-bool request field: like `_lax_bool`, but null is refused too."""
    value = _lax_bool(body.get(key, default), key)
    if value is None:
        raise _bad_type(key, "a boolean", None)
    return value


def chat_options(body: Mapping[str, Any]) -> ChatOptions:
    """Read and check the flags; the two rejections vLLM makes before rendering."""
    add_generation_prompt = _as_bool(body, "add_generation_prompt", True)
    continue_final_message = _as_bool(body, "continue_final_message", False)
    if continue_final_message and add_generation_prompt:
        # vLLM's request validator refuses both set explicitly; with only
        # continue_final_message set, add_generation_prompt stays true and
        # transformers refuses the pair: a 400 either way.
        raise CountError(
            "continue_final_message and add_generation_prompt are not compatible. Use "
            "continue_final_message when you want the model to continue the final message, and "
            "add_generation_prompt when you want to add a header that will prompt it to start a "
            "new assistant message instead. (add_generation_prompt defaults to true: send "
            '"add_generation_prompt": false with "continue_final_message": true.)',
            param="continue_final_message",
        )
    return ChatOptions(
        add_generation_prompt=add_generation_prompt,
        continue_final_message=continue_final_message,
        add_special_tokens=_as_bool(body, "add_special_tokens", False),
    )


def check_no_request_template(body: Mapping[str, Any]) -> None:
    """vLLM refuses a request-supplied chat template unless started with
    --trust-request-chat-template (not the default)."""
    if body.get("chat_template") is not None:
        raise CountError(
            "Chat template is passed with request, but --trust-request-chat-template is not set. "
            "Refused request with untrusted chat template.",
            param="chat_template",
        )


# ---------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------

def parse_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Tools as vLLM 0.32 hands them to the template: `tool.model_dump()` of
    `ChatCompletionToolsParam` (vllm/renderers/online_renderer.py `render_chat`),
    whose serialisers (vllm/entrypoints/openai/chat_completion/protocol.py
    `ChatCompletionToolsParam._serialize`, vllm/entrypoints/generate/base/protocol.py
    `FunctionDefinition._serialize`) keep only the declared fields, in declaration
    order: `{"type", "function": {"name", "description", "parameters", "strict"?,
    "defer_loading"?}, "defer_loading"?}`.  `description` and `parameters` are
    printed as null when missing; `strict` and `defer_loading` are dropped only
    when null (`false` stays); a tool-level `defer_loading` is copied into the
    function when the function has none (`_propagate_defer_loading`)."""
    tools = body.get("tools")
    if tools is None:
        return None
    if tools == () and isinstance(tools, tuple):
        return []           # a conversion's empty list (Anthropic's): rendered as vLLM renders it
    if not isinstance(tools, list):
        raise _bad_type("tools", "an array of tool objects", tools)
    if not tools:
        raise CountError(
            "'tools' is an empty array; omit 'tools' or list at least one tool.", param="tools"
        )
    return [_parse_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools)]


def _parse_tool(tool: Any, where: str) -> dict[str, Any]:
    if not isinstance(tool, dict):
        raise _bad_type(where, "an object", tool)
    kind = tool.get("type", "function")
    if kind != "function":
        raise CountError(f"'{where}.type' must be \"function\", got {json.dumps(kind)}.", param="tools")
    function = tool.get("function")
    if not isinstance(function, dict):
        raise _bad_type(f"{where}.function", "an object", function)
    name = function.get("name")
    if not isinstance(name, str):
        raise _bad_type(f"{where}.function.name", "a string", name)
    description = function.get("description")
    if description is not None and not isinstance(description, str):
        raise _bad_type(f"{where}.function.description", "a string", description)
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise _bad_type(f"{where}.function.parameters", "an object", parameters)
    strict = _lax_bool(function.get("strict"), f"{where}.function.strict")
    defer_loading = _lax_bool(function.get("defer_loading"), f"{where}.function.defer_loading")
    tool_defer_loading = _lax_bool(tool.get("defer_loading"), f"{where}.defer_loading")
    if defer_loading is None:
        defer_loading = tool_defer_loading

    dumped_function: dict[str, Any] = {"name": name, "description": description, "parameters": parameters}
    if strict is not None:
        dumped_function["strict"] = strict
    if defer_loading is not None:
        dumped_function["defer_loading"] = defer_loading
    dumped: dict[str, Any] = {"type": "function", "function": dumped_function}
    if tool_defer_loading is not None:
        dumped["defer_loading"] = tool_defer_loading
    return dumped


# ---------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Conversation:
    """What the template gets, and the media parts in the order vLLM tracks them."""

    messages: list[dict[str, Any]]
    media: list[MediaItem]


def parse_messages(
    body: Mapping[str, Any],
    content_format: ContentFormat,
    template_knows_developer: bool,
    placeholders: Mapping[str, str] | None = None,
) -> Conversation:
    """The conversation vLLM passes to the template, built from `body["messages"]`.

    `placeholders` is the model's text per media modality, needed where a
    "string"-format template gets media (vLLM's `get_placeholder_str`); a
    media part of a modality it lacks is MediaNotCountable there.
    """
    messages = message_list(body)
    if not messages:
        raise CountError("'messages' is empty: send at least one message.", param="messages")
    media: list[MediaItem] = []
    conversation = [
        _parse_message(message, f"messages[{i}]", content_format, media, placeholders or {})
        for i, message in enumerate(messages)
    ]
    if not template_knows_developer:
        conversation = _developer_as_system(conversation, content_format)
    return Conversation(conversation, media)


def message_list(body: Mapping[str, Any]) -> list[Any]:
    """`body["messages"]`, which must be an array (it may be empty: whether that can be
    rendered is the renderer's business)."""
    messages = body.get("messages")
    if messages is None:
        raise CountError("'messages' is required for a chat request.", param="messages")
    if not isinstance(messages, list):
        raise _bad_type("messages", "an array of message objects", messages)
    return messages


def check_message_shape(message: Any, where: str) -> str:
    """The checks vLLM's request model makes on every message, whatever renders it:
    an object with a string role, content a string, a part list, or null (null
    only on assistant and function messages; a missing content is fine on any).
    Returns the role."""
    if not isinstance(message, dict):
        raise _bad_type(where, "an object", message)
    role = message.get("role")
    if not isinstance(role, str):
        raise _bad_type(f"{where}.role", "a string", role)
    content = message.get("content")
    if content is None and "content" in message and role not in ("assistant", "function"):
        raise CountError(f"'{where}.content' must not be null for a {role!r} message.", param="messages")
    if content is not None and not isinstance(content, (str, list)):
        raise _bad_type(f"{where}.content", "a string, an array of content parts or null", content)
    return role


def _parse_message(
    message: Any,
    where: str,
    content_format: ContentFormat,
    media: list[MediaItem],
    placeholders: Mapping[str, str],
) -> dict[str, Any]:
    """One message as vLLM's `_parse_chat_message_content` (vllm/renderers/chat_utils.py)
    builds it, after the request model's validation (checked on a real vLLM 0.32):
    `content: null` is a 400 except on assistant messages and on legacy `function`
    messages that have a name; a `name` that is not a string (null too) is a 400."""
    if not isinstance(message, dict):
        raise _bad_type(where, "an object", message)
    role = message.get("role")
    if not isinstance(role, str):
        raise _bad_type(f"{where}.role", "a string", role)
    if "name" in message and not isinstance(message["name"], str):
        raise _bad_type(f"{where}.name", "a string", message["name"])
    if "content" in message and message["content"] is None and role != "assistant" and not (
        role == "function" and "name" in message
    ):
        raise CountError(
            f"'{where}.content' is null; only assistant messages may have null content "
            "(send a string or an array of content parts).",
            param=f"{where}.content",
        )

    raw = message.get("content")
    if role == "system":
        raw = _without_billing_header(raw)
    content = _parse_content(raw, f"{where}.content", content_format, role in _OPENAI_ROLES, media, placeholders)
    result: dict[str, Any] = {"role": role, "content": content}

    if role == "assistant":
        tool_calls = message.get("tool_calls")
        if tool_calls is not None:
            parsed_calls = _parse_tool_calls(tool_calls, f"{where}.tool_calls")
            if parsed_calls:  # an empty list is dropped: templates take the plain path
                result["tool_calls"] = parsed_calls
        reasoning = message.get("reasoning")
        if reasoning is not None:
            # Passed on as sent, whatever its type (the request model does not
            # check it), under both names for templates old and new.
            result["reasoning"] = reasoning
            result["reasoning_content"] = reasoning
    elif role == "tool":
        if "tool_call_id" in message:
            tool_call_id = message["tool_call_id"]
            if tool_call_id is not None and not isinstance(tool_call_id, str):
                raise _bad_type(f"{where}.tool_call_id", "a string", tool_call_id)
            result["tool_call_id"] = tool_call_id
        if isinstance(content, list):
            result["content"] = _flatten_tool_content(content)

    if "name" in message:
        result["name"] = message["name"]
    task = message.get("task")
    if isinstance(task, str):
        result["task"] = task
    if role == "developer":
        result["tools"] = message.get("tools")
    return result


BILLING_HEADER = "x-anthropic-billing-header"


def _without_billing_header(content: Any) -> Any:
    """A system message's content without Claude Code's attribution line: vLLM 0.32 drops the
    first line of each text that starts with it, and the text when nothing follows
    (renderers/chat_utils.py `_strip_claude_code_billing_header`, system messages only)."""
    if isinstance(content, str):
        if not content.startswith(BILLING_HEADER):
            return content
        rest = content.partition("\n")[2]
        return rest if rest else []
    if not isinstance(content, list):
        return content
    out: list[Any] = []
    for part in content:
        text = part if isinstance(part, str) else (
            part.get("text") if isinstance(part, dict) and part.get("type") == "text" else None)
        if not (isinstance(text, str) and text.startswith(BILLING_HEADER)):
            out.append(part)
            continue
        rest = text.partition("\n")[2]
        if rest:
            out.append(rest if isinstance(part, str) else {**part, "text": rest})
    return out


def _parse_content(
    content: Any,
    where: str,
    content_format: ContentFormat,
    openai_role: bool,
    media: list[MediaItem],
    placeholders: Mapping[str, str],
) -> Any:
    """`string`: one string ("\\n"-joined non-empty texts, media placeholders
    first); `openai`: a list of parts, media as `{"type": modality}`."""
    if content is None:
        parts: list[Any] = []
    elif isinstance(content, str):
        if content_format == "string":
            return content
        return [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = content
    else:
        raise _bad_type(where, "a string, an array of content parts or null", content)

    first_media = len(media)
    parsed = [_parse_part(part, f"{where}[{i}]", openai_role, media) for i, part in enumerate(parts)]
    if content_format == "openai":
        return [part for part in parsed if part is not None]
    # vLLM drops skipped and empty parts before joining.
    texts = []
    for part in parsed:
        if part is not None and part["type"] in ("text", "tool_reference"):
            text = part["text"] if part["type"] == "text" else part["name"]
            if text:
                texts.append(text)
    return _with_placeholders("\n".join(texts), media[first_media:], placeholders)


def _with_placeholders(text: str, items: list[MediaItem], placeholders: Mapping[str, str]) -> str:
    """vLLM's `_get_full_multimodal_text_prompt` (interleave_mm_strings off, the
    default): each item's placeholder not already typed in the text goes first."""
    if not items:
        return text
    counts: dict[str, int] = {}
    for item in items:
        placeholder = placeholders.get(item.modality)
        if placeholder is None:
            raise _not_countable(item)
        counts[placeholder] = counts.get(placeholder, 0) + 1
    missing: list[str] = []
    for placeholder, count in counts.items():
        count -= text.count(placeholder)
        if count < 0:
            raise CountError(
                f"Found more '{placeholder}' placeholders in input prompt than actual multimodal data items.",
                param="messages",
            )
        missing.extend([placeholder] * count)
    return "\n".join([*missing, text] if text else missing)


def _parse_part(part: Any, where: str, openai_role: bool, media: list[MediaItem]) -> dict[str, Any] | None:
    """One content part as the OpenAI-form dict, or None when vLLM skips it.

    A media part is recorded in `media` and becomes `{"type": modality}` plus
    its fields vLLM does not know.

    On the OpenAI roles the request model checks parts against OpenAI's part
    types first: a text part must carry a string, and the Responses-style
    `input_text` / `output_text` parts are refused (400 on a real vLLM 0.32);
    on other roles vLLM skips a text part without text."""
    if isinstance(part, str):
        return {"type": "text", "text": part}
    if not isinstance(part, dict):
        raise _bad_type(where, "a content-part object or a string", part)
    kind = part.get("type")
    if kind is None or part.get("uuid") is not None:
        for key in _MEDIA_KEYS:
            if key in part:
                return _media_part(part, key, _untyped_url(part.get(key)), where, media)
        if "tool_reference" in part:
            return _tool_reference(part.get("tool_reference"), where)
        raise CountError(f"Missing 'type' field in content part '{where}'.", param="type")
    if not isinstance(kind, str):
        raise CountError(f"Invalid 'type' field in content part '{where}'.", param="type")
    if kind in _TEXT_PART_KEYS:
        text = part.get(_TEXT_PART_KEYS[kind])
        if openai_role and kind in _RESPONSES_TEXT_PARTS:
            raise CountError(
                f"Unsupported content part type {kind!r} in '{where}' for this message; "
                'use {"type": "text", "text": ...}.',
                param="type",
            )
        if text is None:
            if openai_role:
                raise _bad_type(f"{where}.{_TEXT_PART_KEYS[kind]}", "a string", text)
            return None  # vLLM logs and skips a text part without text
        if not isinstance(text, str):
            raise _bad_type(f"{where}.{_TEXT_PART_KEYS[kind]}", "a string", text)
        return {"type": "text", "text": text}
    if kind == "tool_reference":
        return _tool_reference(part.get("name"), where)
    if kind in _MEDIA_PART_TYPES:
        return _media_part(part, kind, _typed_url(part, kind, where), where, media)
    supported = ", ".join(sorted(set(_TEXT_PART_KEYS) | set(_MEDIA_PART_TYPES) | {"tool_reference"}))
    raise CountError(
        f"Unsupported chat content part type: {kind!r} in '{where}'. Supported types: {supported}.",
        param="type",
    )


def _untyped_url(value: Any) -> str | None:
    """`{"image_url": "..."}`, or with a uuid `{"image_url": {"url": "..."}}`."""
    if isinstance(value, dict):
        value = value.get("url")
    return value if isinstance(value, str) else None


def _typed_url(part: dict[str, Any], kind: str, where: str) -> str | None:
    """The URL of a typed part, validated as vLLM's pydantic models do."""
    if kind in ("image_url", "video_url", "audio_url"):
        spec = part.get(kind)
        if not isinstance(spec, dict) or not isinstance(spec.get("url"), str):
            raise CountError(f"'{where}.{kind}' must be an object with a string 'url'.", param="messages")
        if kind == "image_url" and "detail" in spec and spec["detail"] not in _IMAGE_DETAILS:
            raise CountError(
                f"'{where}.image_url.detail' must be one of auto, low, high, original.", param="messages"
            )
        return str(spec["url"])
    if kind == "input_image":
        if part.get("detail") not in _IMAGE_DETAILS:
            raise CountError(
                f"'{where}.detail' is required on an input_image part: auto, low, high or original.",
                param="messages",
            )
        url = part.get("image_url")
        if url is not None and not isinstance(url, str):
            raise _bad_type(f"{where}.image_url", "a string", url)
        return url
    return None


def _media_part(
    part: dict[str, Any], kind: str, url: str | None, where: str, media: list[MediaItem]
) -> dict[str, Any]:
    item = MediaItem(modality=_MEDIA_PART_TYPES[kind], part_type=kind, url=url, where=where)
    media.append(item)
    return {"type": item.modality, **{k: v for k, v in part.items() if k not in _KNOWN_PART_FIELDS}}


def _tool_reference(name: Any, where: str) -> dict[str, Any]:
    if not isinstance(name, str):
        raise _bad_type(f"{where}.name", "a string", name)
    return {"type": "tool_reference", "name": name}


def _not_countable(item: MediaItem) -> MediaNotCountable:
    return MediaNotCountable(
        f"'{item.where}' is a {item.part_type} part, and brimful has no {item.modality} arithmetic for "
        "this model.",
        reason="model" if item.modality == "image" else "modality",
        where=item.where,
    )


def media_not_countable(where: str, kind: str) -> MediaNotCountable:
    """A media part in a conversation whose renderer counts no media (Mistral's path)."""
    modality = _MEDIA_PART_TYPES.get(kind, "media")
    return MediaNotCountable(
        f"'{where}' is a {kind} part, and brimful has no {modality} arithmetic for this model.",
        reason="model" if modality == "image" else "modality",
        where=where,
    )


def _flatten_tool_content(parts: list[dict[str, Any]]) -> Any:
    """Tool results always reach the template as one string (vLLM normalises
    Claude Code / Cursor style part lists), unless they hold tool references."""
    if any(part.get("type") != "text" for part in parts):
        return parts
    return "\n".join(part.get("text", "") for part in parts)


def _parse_tool_calls(tool_calls: Any, where: str) -> list[dict[str, Any]]:
    """Copies of the calls with `arguments` parsed to an object (vLLM `_postprocess_messages`);
    an empty list is dropped so templates take the plain assistant path.

    The request model (OpenAI's `ChatCompletionMessageFunctionToolCallParam`)
    requires `id`, `type` and `function.{name, arguments}`, all strings: a call
    missing one, or with `arguments` already an object, is a 400 on vLLM 0.32."""
    if not isinstance(tool_calls, list):
        raise _bad_type(where, "an array of tool calls", tool_calls)
    parsed = []
    for i, call in enumerate(tool_calls):
        at = f"{where}[{i}]"
        if not isinstance(call, dict):
            raise CountError("assistant tool_calls entries must be objects.", param="tool_calls")
        function = call.get("function")
        if call.get("type") != "function" or not isinstance(function, dict):
            raise CountError(
                f"'{at}': chat completions only support assistant tool_calls of type 'function' "
                "with a 'function' object (and 'type': 'function' given).",
                param="tool_calls",
            )
        if not isinstance(call.get("id"), str):
            raise _bad_type(f"{at}.id", "a string", call.get("id"))
        name = function.get("name")
        if not isinstance(name, str):
            raise _bad_type(f"{at}.function.name", "a string", name)
        arguments = function.get("arguments")
        if not isinstance(arguments, str):
            raise _bad_type(f"{at}.function.arguments", "a JSON string", arguments)
        new_call = dict(call)
        new_function = dict(function)
        new_function["arguments"] = _parse_arguments(arguments, f"{at}.function.arguments")
        new_call["function"] = new_function
        parsed.append(new_call)
    return parsed


def _parse_arguments(arguments: Any, where: str = "tool_calls") -> dict[str, Any]:
    """The JSON-string arguments as an object; empty, invalid or non-object JSON → {}.

    JSON nested past the interpreter's recursion limit (2,000 levels of `[`) makes
    `json.loads` raise RecursionError, which vLLM 0.32 does not catch either
    (renderers/chat_utils.py catches only JSONDecodeError): a 400 naming the field,
    never a 500.
    """
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str) and arguments:
        try:
            value = json_loads(arguments)
        except RecursionError:
            raise CountError(f"'{where}' is JSON nested too deeply to be read.", param="tool_calls") from None
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def _developer_as_system(conversation: list[dict[str, Any]], content_format: ContentFormat) -> list[dict[str, Any]]:
    """For templates that never mention "developer" (vllm/renderers/hf.py
    `_convert_developer_to_system`, `_consolidate_system_messages`): developer
    messages become system messages without their `tools`; if that leaves a
    system message anywhere but first, or more than one, the non-empty system
    contents merge into one first message of plain text joined with "\\n\\n"
    (a part list joined with "\\n" first), whatever the content format."""
    if not any(message["role"] == "developer" for message in conversation):
        return conversation
    converted = []
    for message in conversation:
        if message["role"] == "developer":
            message = {key: value for key, value in message.items() if key != "tools"}
            message["role"] = "system"
        converted.append(message)
    system_at = [i for i, message in enumerate(converted) if message["role"] == "system"]
    if system_at == [0]:
        return converted
    texts = [_system_text(converted[i]["content"]) for i in system_at]
    merged: dict[str, Any] = {"role": "system", "content": "\n\n".join(text for text in texts if text)}
    rest = [message for message in converted if message["role"] != "system"]
    return [merged, *rest]


def _system_text(content: Any) -> Any:
    if isinstance(content, list):
        return "\n".join(
            part["text"] if isinstance(part, dict) else part
            for part in content
            if (isinstance(part, dict) and "text" in part) or isinstance(part, str)
        )
    return content


# ---------------------------------------------------------------------------
# Template variables
# ---------------------------------------------------------------------------

def template_kwargs(body: Mapping[str, Any], options: ChatOptions) -> dict[str, Any]:
    """`chat_template_kwargs` merged with the request-level fields that override them.

    Request-level `add_generation_prompt`, `continue_final_message`,
    `documents` and `reasoning_effort` win over chat_template_kwargs of the same
    name; `reasoning_effort` also sets `enable_thinking` (effort != "none")
    unless chat_template_kwargs sets it; null values are dropped.
    """
    raw = body.get("chat_template_kwargs")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _bad_type("chat_template_kwargs", "an object", raw)
    forbidden = [key for key in _FORBIDDEN_KWARGS if key in raw]
    if forbidden:
        raise CountError(
            f"Found unexpected chat template kwargs from request: {set(forbidden)}",
            param="chat_template_kwargs",
        )
    documents = body.get("documents")
    if documents is not None and (
        not isinstance(documents, list) or not all(isinstance(d, dict) for d in documents)
    ):
        raise _bad_type("documents", "an array of objects", documents)
    reasoning_effort = body.get("reasoning_effort")
    if reasoning_effort is not None and not isinstance(reasoning_effort, str):
        raise _bad_type("reasoning_effort", "a string", reasoning_effort)

    # vLLM's merge_kwargs drops a request value that is null or "auto" (renderers/params.py).
    merged = {key: value for key, value in raw.items() if value is not None and not _is_auto(value)}
    overrides = {
        "add_generation_prompt": options.add_generation_prompt,
        "continue_final_message": options.continue_final_message,
        "documents": documents,
        "reasoning_effort": reasoning_effort,
    }
    merged.update({key: value for key, value in overrides.items() if value is not None and not _is_auto(value)})
    if reasoning_effort is not None and "enable_thinking" not in raw:
        merged["enable_thinking"] = reasoning_effort != "none"
    return merged


def _is_auto(value: Any) -> bool:
    return isinstance(value, str) and value == "auto"


def rendered_tools(tools: list[dict[str, Any]] | None, kwargs: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The tools the template gets: `chat_template_kwargs.tools` when set (`template_kwargs`), which
    replace the request's own (`parse_tools`; vLLM's merge_kwargs), else the request's."""
    return _kwargs_tools(kwargs["tools"]) if "tools" in kwargs else tools


def _kwargs_tools(value: Any) -> list[dict[str, Any]]:
    """As transformers' apply_chat_template takes them: each a JSON schema (an object), passed as sent."""
    items = list(value) if isinstance(value, (list, tuple, str, dict)) else None
    if items is None or not all(isinstance(item, dict) for item in items):
        raise CountError("Tools should either be a JSON schema, or a callable function with type hints and a "
                         "docstring suitable for auto-conversion to a schema.", param="chat_template_kwargs")
    return items


def split_kwargs(
    kwargs: dict[str, Any], template_variables: frozenset[str]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(apply_chat_template's own parameters, extra template variables).

    vLLM keeps a kwarg only if the template reads it or apply_chat_template
    names it (`resolve_chat_template_kwargs`); the named ones are consumed by
    apply_chat_template, the rest become template variables.
    """
    named: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in kwargs.items():
        if key in _APPLY_CHAT_TEMPLATE_PARAMS:
            named[key] = value
        elif key in template_variables:
            extra[key] = value
    if "conversation" in named or "messages" in extra:
        raise CountError(
            "chat_template_kwargs may not set 'conversation' or 'messages'; send them as 'messages'.",
            param="chat_template_kwargs",
        )
    return named, extra
