"""gpt-oss prompts the way vLLM 0.32 builds them: harmony messages, no chat template.

When a model's config.json says `model_type: gpt_oss`, vLLM renders chat and
Responses requests with openai-harmony (the `oss-harmony` fork vLLM 0.32
depends on, whose o200k_harmony vocabulary is compiled in, so nothing is
downloaded): it builds a system message (reasoning effort, start date), a
developer message (instructions, function tools), one or more harmony
messages per request message, renders them for the assistant's next turn and
rewrites prior tool-call headers to the older layout gpt-oss was trained on.
The HF chat template, `chat_template_kwargs`, `add_generation_prompt` and
`continue_final_message` play no part.

The rules below restate vLLM 0.32's own functions, named in each docstring:
vllm/entrypoints/openai/parser/harmony_utils.py (`build_harmony_preamble`,
`parse_chat_input_to_harmony_message`, `render_for_completion`,
`_use_legacy_tool_call_headers`), vllm/entrypoints/openai/responses/harmony.py
(`response_input_to_harmony`) and vllm/renderers/online_renderer.py
(`_make_request_with_harmony`, `_render_responses_with_harmony`).  The input is
the request JSON as a client sends it; a request vLLM would refuse raises
CountError, and anything vLLM would render is counted, never refused.
"""

from __future__ import annotations

import datetime
import functools
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from . import _chat
from ._errors import CountError

if TYPE_CHECKING:  # the package is imported only when a gpt-oss model is loaded
    from openai_harmony import Content, HarmonyEncoding, Message

# vLLM's REASONING_EFFORT table: anything else (also "none", "minimal", "xhigh") is a 400.
_EFFORTS = ("low", "medium", "high")
# Responses tool types vLLM leaves out of the developer message (built-in tools
# it describes only when a tool server provides them); any other non-function type is a 400.
_BUILTIN_TOOL_TYPES = frozenset({"web_search_preview", "code_interpreter", "container"})


@dataclass(frozen=True)
class HarmonyOptions:
    """The two vLLM environment variables that change a harmony prompt.

    `system_instructions` is VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS (system
    and developer instructions go into the system message instead of a
    developer message); `start_date` is VLLM_SYSTEM_START_DATE (else vLLM
    prints today's date; every YYYY-MM-DD costs the same number of tokens).
    Set them for brimful as for the vLLM server it fronts.
    """

    system_instructions: bool = False
    start_date: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> HarmonyOptions:
        raw = environ.get("VLLM_GPT_OSS_HARMONY_SYSTEM_INSTRUCTIONS", "0")
        try:
            system_instructions = bool(int(raw))
        except ValueError:
            system_instructions = False
        return cls(system_instructions=system_instructions, start_date=environ.get("VLLM_SYSTEM_START_DATE"))


@functools.cache
def encoding() -> HarmonyEncoding:
    """The HARMONY_GPT_OSS encoding, loaded once per process (the vocabulary ships inside the wheel)."""
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding

    return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)


# ---------------------------------------------------------------------------
# Request checks vLLM makes before rendering (request model validators)
# ---------------------------------------------------------------------------

def _check_effort(effort: Any, param: str) -> str | None:
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise _chat._bad_type(param, "a string", effort)
    if effort not in _EFFORTS:
        raise CountError(
            f"reasoning_effort={effort!r} is not supported by Harmony. Supported values are: "
            f"{', '.join(_EFFORTS)}.",
            param="reasoning_effort",
        )
    return effort


def _chat_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """Function tools as (name, description, parameters); `strict` and the rest play no part."""
    tools = _chat.parse_tools(body)  # the request model's checks: type, name, an empty list
    if tools is None:
        return None
    return [tool["function"] for tool in tools]


def _flags(body: Mapping[str, Any]) -> None:
    """Only the explicit pair is refused: the harmony path ignores both flags otherwise."""
    continue_final = _chat._as_bool(body, "continue_final_message", False)
    add_generation = _chat._as_bool(body, "add_generation_prompt", True)
    if continue_final and add_generation and "add_generation_prompt" in body:
        raise CountError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
            param="continue_final_message",
        )


# ---------------------------------------------------------------------------
# Harmony message builders (vLLM harmony_utils)
# ---------------------------------------------------------------------------

def _flatten_text(content: Any) -> str | None:
    """`flatten_input_text_content`: a string as is, the parts' texts joined with no
    separator, None when there is no text at all."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = []
    for item in content:
        if isinstance(item, str):
            texts.append(item)
        elif isinstance(item, dict) and item.get("text") is not None:
            texts.append(item["text"])
    return "".join(texts) if texts else None


def _system_message(options: HarmonyOptions, effort: str | None, instructions: str | None) -> Message:
    """`get_system_message`: the model identity (plus instructions when configured so),
    the reasoning effort when given, and the conversation start date."""
    from openai_harmony import Message, ReasoningEffort, Role, SystemContent

    content = SystemContent.new()
    if instructions is not None and options.system_instructions:
        identity = content.model_identity
        content = content.with_model_identity(f"{identity}\n{instructions}" if identity else instructions)
    if effort is not None:
        content = content.with_reasoning_effort(ReasoningEffort[effort.upper()])
    start_date = options.start_date or datetime.datetime.now().strftime("%Y-%m-%d")
    content = content.with_conversation_start_date(start_date)
    return Message.from_role_and_content(Role.SYSTEM, content)


def _developer_message(
    options: HarmonyOptions, instructions: str | None, tools: Sequence[Mapping[str, Any]] | None
) -> Message:
    """`get_developer_message`: instructions (unless they went to the system message)
    and the function tools as the `functions` namespace."""
    from openai_harmony import DeveloperContent, Message, Role, ToolDescription

    content = DeveloperContent.new()
    if instructions is not None and not options.system_instructions:
        content = content.with_instructions(instructions)
    if tools:
        content = content.with_function_tools(
            [
                ToolDescription.new(
                    name=tool["name"], description=tool.get("description") or "", parameters=tool.get("parameters")
                )
                for tool in tools
            ]
        )
    return Message.from_role_and_content(Role.DEVELOPER, content)


def _preamble(
    options: HarmonyOptions,
    instructions: str | None,
    tools: Sequence[Mapping[str, Any]] | None,
    effort: str | None,
) -> list[Message]:
    """`build_harmony_preamble`: the system message, then a developer message when
    there are developer instructions or tools."""
    system_instructions = instructions if options.system_instructions else None
    developer_instructions = None if options.system_instructions else instructions
    messages = [_system_message(options, effort, system_instructions)]
    if developer_instructions or tools:
        messages.append(_developer_message(options, developer_instructions, tools))
    return messages


def _instructions_message(options: HarmonyOptions, role: str, instructions: str) -> Message:
    """`get_system_or_developer_message`: a later system/developer message."""
    if role == "system" and options.system_instructions:
        return _system_message(options, None, instructions)
    return _developer_message(options, instructions, None)


def _text_contents(content: Any, where: str) -> list[Any]:
    from openai_harmony import TextContent

    if isinstance(content, str):
        return [TextContent(text=content)]
    contents = []
    for i, part in enumerate(content):
        if not isinstance(part, dict):
            raise _chat._bad_type(f"{where}[{i}]", "a content-part object", part)
        text = part.get("text", "")
        if not isinstance(text, str):
            raise _chat._bad_type(f"{where}[{i}].text", "a string", text)
        # Every part becomes one text, media and refusals as "" (vLLM's TODO).
        contents.append(TextContent(text=text))
    return contents


def _check_message(message: Any, where: str) -> dict[str, Any]:
    _chat.check_message_shape(message, where)
    tool_calls = message.get("tool_calls")
    if tool_calls is not None:
        if not isinstance(tool_calls, list):
            raise _chat._bad_type(f"{where}.tool_calls", "an array of tool calls", tool_calls)
        for i, call in enumerate(tool_calls):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                raise _chat._bad_type(f"{where}.tool_calls[{i}].function", "an object", function)
            arguments = function.get("arguments")
            if arguments is not None and not isinstance(arguments, str):
                raise _chat._bad_type(f"{where}.tool_calls[{i}].function.arguments", "a string", arguments)
    return cast(dict[str, Any], message)


def _tool_call_messages(calls: list[dict[str, Any]]) -> list[Message]:
    from openai_harmony import Message, Role

    messages = []
    for call in calls:
        function = call.get("function", {})
        message = Message.from_role_and_content(Role.ASSISTANT, function.get("arguments", "") or "")
        messages.append(
            message.with_channel("commentary")
            .with_recipient(f"functions.{function.get('name', '')}")
            .with_content_type("json")
        )
    return messages


def _chat_message(
    options: HarmonyOptions, message: dict[str, Any], tool_names: Mapping[Any, Any], where: str
) -> list[Message]:
    """`parse_chat_input_to_harmony_message` for one request message."""
    from openai_harmony import Author, Message, Role

    role = message["role"]
    calls = message.get("tool_calls") or []
    if role == "assistant" and calls:
        messages = []
        text = _flatten_text(message.get("content"))
        if text:
            messages.append(Message.from_role_and_content(Role.ASSISTANT, text).with_channel("commentary"))
        reasoning = message.get("reasoning")
        if reasoning:
            messages.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
        return messages + _tool_call_messages(calls)

    if role == "tool":
        name = tool_names.get(message.get("tool_call_id", ""), "")
        text = _flatten_text(message.get("content")) or ""
        return [
            Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{name}"), text)
            .with_channel("commentary")
            .with_recipient("assistant")
        ]

    messages = []
    reasoning = message.get("reasoning")
    if role == "assistant" and reasoning:
        messages.append(Message.from_role_and_content(Role.ASSISTANT, reasoning).with_channel("analysis"))
    contents = _text_contents(message.get("content") or "", f"{where}.content")
    if role == "assistant":
        # Only the first part decides whether the answer is kept.
        if contents and contents[0].text:
            messages.append(Message.from_role_and_contents(Role.ASSISTANT, contents).with_channel("final"))
    elif role in ("system", "developer"):
        instructions = _flatten_text(message.get("content"))
        if instructions is not None:
            messages.append(_instructions_message(options, role, instructions))
    else:
        messages.append(_role_message(role, contents, where))
    return messages


def _role_message(role: str, contents: list[Any], where: str) -> Message:
    from openai_harmony import Message

    try:
        # harmony's pydantic model takes the role string and validates it; its annotation says Role
        return Message.from_role_and_contents(role, contents)  # type: ignore[arg-type]
    except ValueError as exc:  # pydantic: a role harmony does not know
        raise CountError(f"'{where}.role' = {role!r} cannot be rendered for this model: {exc}",
                         param="messages") from exc


def _normalise_reasoning(message: dict[str, Any]) -> dict[str, Any]:
    """The request model renames the deprecated `reasoning_content` to `reasoning`."""
    if "reasoning_content" not in message:
        return message
    message = dict(message)
    legacy = message.pop("reasoning_content")
    if legacy is not None and message.get("reasoning") is None:
        message["reasoning"] = legacy
    return message


def chat_messages(body: Any, options: HarmonyOptions) -> list[Message]:
    """The harmony messages vLLM renders for a /v1/chat/completions request
    (`_make_request_with_harmony`); raises CountError where vLLM answers 400."""
    if not isinstance(body, dict):
        raise CountError("The request body must be a JSON object.")
    _flags(body)
    effort = body.get("reasoning_effort")
    if effort == "none":
        raise CountError("Harmony does not support reasoning_effort='none'", param="reasoning_effort")
    effort = _check_effort(effort, "reasoning_effort")
    tools = _chat_tools(body)
    raw = _chat.message_list(body)
    messages = [_normalise_reasoning(_check_message(m, f"messages[{i}]")) for i, m in enumerate(raw)]

    instructions = None
    offset = 0
    if messages and messages[0]["role"] in ("system", "developer"):
        instructions = _flatten_text(messages[0].get("content"))
        offset = 1
    result = _preamble(options, instructions, tools, effort)

    tool_names: dict[Any, Any] = {}
    for message in messages:
        for call in message.get("tool_calls") or []:
            tool_names[call.get("id")] = call.get("function", {}).get("name")
    for i in range(offset, len(messages)):
        result.extend(_chat_message(options, messages[i], tool_names, f"messages[{i}]"))
    return result


# ---------------------------------------------------------------------------
# Responses (vLLM responses/harmony.py)
# ---------------------------------------------------------------------------

def _responses_tools(body: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The function tools for the developer message (`extract_tool_types`,
    `has_custom_tools`, `get_developer_message`): None unless some tool is
    neither built in nor MCP; then every tool must be a function or built in."""
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise _chat._bad_type("tools", "an array of tool objects", tools)
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _chat._bad_type(f"tools[{i}]", "an object", tool)
    # MCP tools only count as their server label when vLLM allows it as a
    # built-in (VLLM_GPT_OSS_SYSTEM_TOOL_MCP_LABELS), which is off by default.
    kinds = {tool.get("type") for tool in tools if tool.get("type") != "mcp"}
    if kinds.issubset(_BUILTIN_TOOL_TYPES):
        return None
    functions = []
    for i, tool in enumerate(tools):
        kind = tool.get("type")
        if kind in _BUILTIN_TOOL_TYPES:
            continue
        if kind != "function":
            raise CountError(f"tool type {kind!r} is not supported.", param="tools")
        name = tool.get("name")
        if not isinstance(name, str):
            raise _chat._bad_type(f"tools[{i}].name", "a string", name)
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise _chat._bad_type(f"tools[{i}].description", "a string", description)
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise _chat._bad_type(f"tools[{i}].parameters", "an object", parameters)
        functions.append({"name": name, "description": description, "parameters": parameters})
    return functions


def _item_text_contents(content: Any, where: str) -> list[Any]:
    if isinstance(content, str):
        return _text_contents(content, where)
    if not isinstance(content, list):
        raise _chat._bad_type(where, "a string or an array of content parts", content)
    return _text_contents(content, where)


def _responses_item(
    options: HarmonyOptions, item: Any, calls: dict[str, str], where: str
) -> Message | None:
    """`response_input_to_harmony` for one input item; `calls` maps call ids to the
    function names of the function_call items seen so far."""
    from openai_harmony import Author, Message, Role

    if not isinstance(item, dict):
        raise _chat._bad_type(where, "an object", item)
    kind = item.get("type")
    if kind is None or kind == "message":
        role = item.get("role")
        if not isinstance(role, str):
            raise _chat._bad_type(f"{where}.role", "a string", role)
        content = item.get("content")
        if role in ("system", "developer"):
            text = _flatten_text(content)
            return _instructions_message(options, role, text) if text else None
        message = _role_message(role, _item_text_contents(content, f"{where}.content"), where)
        return message.with_channel("final") if role == "assistant" else message
    if kind == "function_call_output":
        call_id = item.get("call_id")
        if call_id not in calls:
            raise CountError(f"No call message found for {call_id}", param="input")
        output = item.get("output")
        if not isinstance(output, str):
            raise _chat._bad_type(f"{where}.output", "a string", output)
        return (
            Message.from_author_and_content(Author.new(Role.TOOL, f"functions.{calls[call_id]}"), output)
            .with_channel("commentary")
            .with_recipient("assistant")
        )
    if kind == "reasoning":
        content = item.get("content")
        if not content:
            return None
        if not isinstance(content, list) or not all(isinstance(p, dict) and isinstance(p.get("text"), str)
                                                    for p in content):
            raise _chat._bad_type(f"{where}.content", "an array of reasoning_text parts", content)
        text = "\n".join(part["text"] for part in content)
        return Message.from_role_and_content(Role.ASSISTANT, text).with_channel("analysis")
    if kind == "function_call":
        name, arguments = item.get("name"), item.get("arguments")
        if not isinstance(name, str) or not isinstance(arguments, str):
            raise _chat._bad_type(f"{where}", "a function_call with string name and arguments", item)
        if isinstance(item.get("call_id"), str):
            calls[item["call_id"]] = name
        return (
            Message.from_role_and_content(Role.ASSISTANT, arguments)
            .with_channel("commentary")
            .with_recipient(f"functions.{name}")
            .with_content_type("json")
        )
    raise CountError(f"Unknown input type: {kind}", param="input")


def responses_messages(body: Any, options: HarmonyOptions) -> list[Message]:
    """The harmony messages vLLM renders for a /v1/responses request without
    `previous_response_id` (`_render_responses_with_harmony`).

    A request that continues a stored response is rendered from vLLM's store,
    which brimful cannot see: it raises CountError with param
    "previous_response_id" and the caller must not count it.
    """
    if not isinstance(body, dict):
        raise CountError("The request body must be a JSON object.")
    if body.get("previous_response_id") is not None:
        raise CountError(
            "A request with 'previous_response_id' is rendered from vLLM's response store; "
            "brimful cannot count it.",
            param="previous_response_id",
        )
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise _chat._bad_type("reasoning", "an object", reasoning)
    effort = _check_effort((reasoning or {}).get("effort"), "reasoning.effort")
    tools = _responses_tools(body)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _chat._bad_type("instructions", "a string", instructions)
    request_input = body.get("input")
    if request_input is None:
        raise CountError("'input' is required for a Responses request.", param="input")
    if not isinstance(request_input, (str, list)):
        raise _chat._bad_type("input", "a string or an array of input items", request_input)
    items = request_input
    offset = 0
    if instructions is None and isinstance(items, list) and items:
        first = items[0]
        if isinstance(first, dict) and first.get("role") in ("system", "developer"):
            instructions = _flatten_text(first.get("content"))
            offset = 1
    messages = _preamble(options, instructions, tools, effort)
    messages.extend(_previous_input_messages(body))
    if isinstance(items, str):
        if items or not body.get("previous_input_messages"):
            from openai_harmony import Message, Role

            messages.append(Message.from_role_and_content(Role.USER, items))
        return messages
    calls: dict[str, str] = {}
    for i in range(offset, len(items)):
        message = _responses_item(options, items[i], calls, f"input[{i}]")
        if message is not None:
            messages.append(message)
    return messages


def _previous_input_messages(body: Mapping[str, Any]) -> list[Message]:
    """vLLM's `previous_input_messages` extension: prior harmony or chat messages,
    their system and developer messages left out."""
    previous = body.get("previous_input_messages")
    if not previous:
        return []
    if not isinstance(previous, list):
        raise _chat._bad_type("previous_input_messages", "an array of messages", previous)
    from openai_harmony import Role

    result: list[Message] = []
    for i, raw in enumerate(previous):
        where = f"previous_input_messages[{i}]"
        if isinstance(raw, dict) and isinstance(raw.get("author"), dict):
            converted = [_previous_harmony_message(raw, where)]
        else:
            converted = _previous_chat_message(_check_message(raw, where))
        result.extend(m for m in converted if m.author.role not in (Role.SYSTEM, Role.DEVELOPER))
    return result


def _previous_harmony_message(raw: dict[str, Any], where: str) -> Message:
    """`_parse_harmony_format_message`: a message already in harmony's own shape."""
    from openai_harmony import Author, Message, Role, TextContent

    author = raw["author"]
    content = raw.get("content", "")
    contents: list[Content]
    if isinstance(content, list):
        parts = [TextContent(text=part.get("text", "")) if isinstance(part, dict) else None for part in content]
        if any(part is None for part in parts):
            raise _chat._bad_type(f"{where}.content", "an array of content objects", content)
        contents = [part for part in parts if part is not None]
    else:
        contents = [TextContent(text=content if isinstance(content, str) else "")]
    try:
        role = Role(author.get("role"))
        name = author.get("name")
        message = (Message(author=Author.new(role, name), content=contents) if name
                   else Message.from_role_and_contents(role, contents))
    except ValueError as exc:
        raise CountError(f"'{where}' is not a harmony message: {exc}", param="previous_input_messages") from exc
    for key, setter in (("channel", message.with_channel), ("recipient", message.with_recipient),
                        ("content_type", message.with_content_type)):  # fmt: skip
        if raw.get(key):
            setter(raw[key])
    return message


def _previous_chat_message(message: dict[str, Any]) -> list[Message]:
    """`_parse_chat_format_message`: a chat-format message in previous_input_messages."""
    from openai_harmony import Author, Message, Role

    role = message["role"]
    calls = message.get("tool_calls")
    if role == "assistant" and calls:
        return _tool_call_messages(calls)
    if role == "tool":
        name = message.get("name", "") or ""
        if name and not name.startswith("functions."):
            name = f"functions.{name}"
        text = _flatten_text(message.get("content")) or ""
        return [
            Message.from_author_and_content(Author.new(Role.TOOL, name), text)
            .with_channel("commentary")
            .with_recipient("assistant")
        ]
    if role in ("system", "developer"):
        return []  # dropped by the caller in any case
    content = message.get("content", "")
    contents = _item_text_contents(content, "previous_input_messages.content")
    return [_role_message(role, contents, "previous_input_messages")]


# ---------------------------------------------------------------------------
# Rendering (vLLM render_for_completion)
# ---------------------------------------------------------------------------

def _drop_old_analysis(messages: Sequence[Message]) -> list[Message]:
    """`auto_drop_analysis_messages`: analysis messages before the last final answer go."""
    last_final = -1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].author.role == "assistant" and messages[i].channel == "final":
            last_final = i
            break
    return [m for i, m in enumerate(messages) if not (i < last_final and m.channel == "analysis")]


def render(messages: Sequence[Message]) -> list[int]:
    """The prompt token ids vLLM gives the engine for these messages."""
    from openai_harmony import Conversation, RenderConversationConfig, Role

    enc = encoding()
    conversation = Conversation.from_messages(_drop_old_analysis(messages))
    try:
        ids = enc.render_conversation_for_completion(
            conversation, Role.ASSISTANT, config=RenderConversationConfig(auto_drop_analysis=False)
        )
        return legacy_tool_call_headers(ids)
    except Exception as exc:  # HarmonyError and friends: vLLM answers 400
        raise CountError(f"The conversation cannot be rendered in the harmony format: {exc}") from exc


@functools.cache
def _header_tokens() -> tuple[int, int, int, int]:
    enc = encoding()
    start, channel, constrain, message = (enc.encode(text, allowed_special="all")[0]
                                          for text in ("<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"))
    return start, channel, constrain, message


@functools.cache
def _special_text() -> re.Pattern[str]:
    tokens = sorted(encoding().special_tokens_set, key=len, reverse=True)
    return re.compile("|".join(re.escape(token) for token in tokens))


def _encode_plain(text: str) -> list[int]:
    """`encoding().encode(text)` with its defaults (special-token text refused), minus
    the regex over all ~1,000 special tokens it compiles on every call (~3 ms)."""
    match = _special_text().search(text)
    if match is not None:
        raise CountError("The conversation cannot be rendered in the harmony format: "
                         f"special token {match.group()!r} in a header.")
    return encoding().encode(text, disallowed_special=())


def legacy_tool_call_headers(ids: list[int]) -> list[int]:
    """vLLM's `_use_legacy_tool_call_headers`: every header shaped
    `<|start|>assistant<|channel|>CH to=RCPT <|constrain|>TYPE<|message|>` (how
    oss-harmony >= 0.0.10 renders a prior tool call) becomes
    `<|start|>assistant to=RCPT<|channel|>CH TYPE<|message|>`, re-encoded."""
    start, channel, constrain, message = _header_tokens()
    enc = encoding()
    out: list[int] = []
    i, n = 0, len(ids)
    while i < n:
        if ids[i] != start:
            out.append(ids[i])
            i += 1
            continue
        end = _find(ids, message, i + 1, n)
        at_channel = _find(ids, channel, i + 1, end) if end >= 0 else -1
        at_constrain = _find(ids, constrain, at_channel + 1, end) if at_channel >= 0 else -1
        if at_constrain < 0:
            out.append(ids[i])  # not a tool-call header: look again from the next token
            i += 1
            continue
        author = enc.decode(ids[i + 1 : at_channel])
        middle = enc.decode(ids[at_channel + 1 : at_constrain])
        content_type = enc.decode(ids[at_constrain + 1 : end])
        rewritten = None
        if author == "assistant" and " to=" in middle and middle.endswith(" "):
            channel_name, recipient = middle[:-1].split(" to=", 1)
            if channel_name and recipient and content_type:
                rewritten = (
                    [start, *_encode_plain(f"assistant to={recipient}"), channel,
                     *_encode_plain(f"{channel_name} {content_type}"), message]
                )  # fmt: skip
        out.extend(rewritten if rewritten is not None else ids[i : end + 1])
        i = end + 1
    return out


def _find(ids: list[int], token: int, lo: int, hi: int) -> int:
    try:
        return ids.index(token, lo, hi)
    except ValueError:
        return -1
