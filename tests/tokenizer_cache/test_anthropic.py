"""tokenizer_cache._anthropic: a Messages request → the chat request vLLM 0.32 renders for it.

One test per rule of `AnthropicServingMessages.to_chat_completion_request`
(vllm/entrypoints/anthropic/serving.py); the counts of whole requests against a
real vLLM are tests/tokenizer_cache/test_surface_corpus.py's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import MODELS
from tokenizer_cache import CountError, load_model_tokenizer
from tokenizer_cache._anthropic import detect_merge_inline_system, to_chat_request


def convert(body: dict[str, Any], *, merge: bool = False, effort: str = "none") -> dict[str, Any]:
    return to_chat_request(body, merge_inline_system=merge, disabled_thinking_effort=effort)


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def test_system_blocks_join_without_separator_and_drop_the_billing_header() -> None:
    chat = convert({"system": [{"type": "text", "text": "x-anthropic-billing-header: cch=1"},
                               {"type": "text", "text": "One."}, {"type": "text", "text": " Two."}],
                    "messages": [user("Hi")]})
    assert chat["messages"] == [{"role": "system", "content": "One. Two."}, {"role": "user", "content": "Hi"}]


def test_a_string_system_keeps_its_billing_header_for_the_chat_parser_to_drop() -> None:
    """vLLM's conversion keeps a string `system` whole; its chat parser then drops the header line."""
    header = "x-anthropic-billing-header: cch=1;"
    body = {"system": header + "\nYou are helpful.", "messages": [user("hi")]}
    assert convert(body)["messages"][0] == {"role": "system", "content": header + "\nYou are helpful."}
    qwen3 = load_model_tokenizer(MODELS / "Qwen--Qwen3-8B")
    assert qwen3.count_messages(body) == qwen3.count_messages({**body, "system": "You are helpful."})


def test_a_single_text_block_becomes_a_string_and_several_stay_parts() -> None:
    chat = convert({"messages": [user([{"type": "text", "text": "a"}]),
                                 user([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}])]})
    assert chat["messages"][0]["content"] == "a"
    assert chat["messages"][1]["content"] == [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]


def test_tool_use_becomes_a_tool_call_and_a_users_tool_result_a_tool_message_first() -> None:
    chat = convert({"messages": [
        user("Weather?"),
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Look it up.", "signature": "s"},
            {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Seoul"}}]},
        user([{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "3C"},
                                                                     {"type": "text", "text": "clear"}]},
              {"type": "text", "text": "Warm?"}])]})
    assistant, tool, question = chat["messages"][1:]
    assert assistant == {"role": "assistant", "reasoning": "Look it up.", "tool_calls": [
        {"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Seoul"}'}}]}
    assert tool == {"role": "tool", "tool_call_id": "t1", "content": "3C\nclear"}
    assert question == {"role": "user", "content": "Warm?"}


def test_a_user_message_of_tool_results_only_leaves_no_user_message() -> None:
    chat = convert({"messages": [user([{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}])]})
    assert chat["messages"] == [{"role": "tool", "tool_call_id": "t1", "content": "ok"}]


def test_an_assistants_tool_result_is_printed_as_python_would() -> None:
    chat = convert({"messages": [{"role": "assistant", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "x", "ok": True}]}]}]})
    assert chat["messages"][0]["content"] == "Tool result: [{'type': 'text', 'text': 'x', 'ok': True}]"


def test_inline_system_messages_stay_in_place_or_merge_into_the_first() -> None:
    body = {"system": "Rules.", "messages": [user("a"), {"role": "system", "content": "Reminder."}, user("b")]}
    assert [m["role"] for m in convert(body)["messages"]] == ["system", "user", "system", "user"]
    merged = convert(body, merge=True)["messages"]
    assert merged[0] == {"role": "system", "content": "Rules.Reminder."}
    assert [m["role"] for m in merged] == ["system", "user", "user"]


def test_thinking_disabled_wins_over_output_config_effort() -> None:
    body = {"messages": [user("x")], "output_config": {"effort": "high"}}
    assert convert(body)["reasoning_effort"] == "high"
    assert convert({**body, "thinking": {"type": "disabled"}}, effort="low")["reasoning_effort"] == "low"
    assert "reasoning_effort" not in convert({**body, "output_config": None})


def test_tools_are_chat_tools_with_a_defaulted_schema_type_and_only_set_flags() -> None:
    chat = convert({"messages": [user("x")], "tools": [
        {"name": "a", "input_schema": {"properties": {}}},
        {"name": "b", "description": "B", "input_schema": {"type": "object"}, "strict": False}]})
    assert chat["tools"] == [
        {"type": "function", "function": {"name": "a", "description": None,
                                          "parameters": {"properties": {}, "type": "object"}}},
        {"type": "function", "function": {"name": "b", "description": "B", "parameters": {"type": "object"},
                                          "strict": False}}]
    # "type" is added last, as pydantic's validator does: key order reaches the template's tojson
    assert list(chat["tools"][0]["function"]["parameters"]) == ["properties", "type"]


def test_no_tools_left_reach_the_template_as_an_empty_list_as_vllm_sets_them() -> None:
    """vLLM sets `req.tools = []` after the chat request's validation (anthropic/serving.py
    `_convert_tools`): served with an empty list, where a chat request's own `tools: []` is refused."""
    from tokenizer_cache._chat import parse_tools

    removed = {"tools": [{"name": "a", "input_schema": {"type": "object"}}], "messages": [
        {"role": "system", "content": [{"type": "tool_removal", "tool": {"type": "tool_reference", "name": "a"}}]},
        user("x")]}
    for body in ({"messages": [user("x")], "tools": []}, removed):
        chat = convert(body)
        assert chat["tools"] == () and parse_tools(chat) == []
    with pytest.raises(CountError):
        parse_tools({"tools": []})
    qwen3 = load_model_tokenizer(MODELS / "Qwen--Qwen3-8B")
    assert qwen3.count_messages({"messages": [user("x")], "tools": []}) == qwen3.count_messages(
        {"messages": [user("x")]})        # Qwen3's template: `if tools`, an empty list shows nothing


def test_tool_additions_and_removals_resolve_the_tools_in_effect() -> None:
    tools = [{"name": "a", "input_schema": {"type": "object"}, "defer_loading": True},
             {"name": "b", "input_schema": {"type": "object"}}]
    chat = convert({"tools": tools, "messages": [
        {"role": "system", "content": [
            {"type": "tool_addition", "tool": {"type": "tool_reference", "name": "a"}},
            {"type": "tool_removal", "tool": {"type": "tool_reference", "name": "b"}},
            {"type": "tool_addition", "tool": {"type": "tool_definition",
                                                "definition": {"name": "c", "input_schema": {"type": "object"}}}}]},
        user("x")]})
    assert [t["function"]["name"] for t in chat["tools"]] == ["a", "c"]
    assert "defer_loading" not in chat["tools"][0]["function"]


@pytest.mark.parametrize("body, param", [
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages"),
    ({"messages": [user([{"type": "video"}])]}, "messages"),
    ({"messages": [user([{"type": "tool_addition", "tool": {"type": "tool_reference", "name": "a"}}])]},
     "messages"),
    ({"messages": [user("x")], "tools": [{"name": "a"}]}, "tools[0].input_schema"),
    ({"messages": [user([{"type": "tool_use", "name": "f", "input": "not an object"}])]},
     "messages[0].content[0].input"),
    # vLLM joins a tool result's texts: a text that is not a string fails there (its 400)
    ({"messages": [user([{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": None}]}])]},
     "messages[0].content[0].content[0].text"),
    ({"messages": [user([{"type": "tool_result", "tool_use_id": "t", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": 5}]}])]}, "messages[0].content[0].content[1].text"),
])
def test_what_vllm_refuses_is_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(CountError) as info:
        convert(body)
    assert info.value.param == param


def test_the_request_is_never_changed() -> None:
    body = {"system": "s", "messages": [user("a"), {"role": "system", "content": "r"}],
            "tools": [{"name": "a", "input_schema": {"properties": {}}}]}
    before = json.dumps(body)
    convert(body, merge=True)
    assert json.dumps(body) == before


def test_templates_that_refuse_a_late_system_message_are_merged() -> None:
    # Qwen3.5's template raises on a system message after the first (vLLM logs the same at start-up).
    qwen35 = (MODELS / "Qwen--Qwen3.5-9B" / "chat_template.jinja").read_text(encoding="utf-8")
    assert detect_merge_inline_system(qwen35) is True
    assert detect_merge_inline_system("{% for m in messages %}{{ m.content }}{% endfor %}") is False
    assert detect_merge_inline_system("{{ raise_exception('no') }}") is True   # vLLM's plain sandbox has none
    assert detect_merge_inline_system(None) is True


def test_model_facts_come_from_the_models_own_template() -> None:
    qwen3 = load_model_tokenizer(MODELS / "Qwen--Qwen3-8B")
    assert (qwen3.merges_inline_system, qwen3.disabled_thinking_effort) == (False, "none")
    # Phi-3's template reads neither reasoning_effort nor enable_thinking: "none" renders like "low".
    phi3 = load_model_tokenizer(MODELS / "microsoft--Phi-3-mini-4k-instruct")
    assert phi3.disabled_thinking_effort == "low"
