"""Hand-written bodies on the edges of vLLM 0.32's request models (tests/corpus/fields_captured.jsonl).

    .venv/bin/python -m tests.clients.fields      # then ground_truth.py --captured ... --out tests/corpus/fields.jsonl

Each body probes one serialisation or validation rule of the chat request
model (tools' `strict` / `defer_loading`, null content per role, `name`,
tool-call fields, content parts); the real server's answer is the truth.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "corpus" / "fields_captured.jsonl"
U = {"role": "user", "content": "What's the weather in Paris?"}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
CALLED = {"role": "assistant", "content": None, "tool_calls": [CALL]}
RESULT = {"role": "tool", "tool_call_id": "call_1", "content": "18°C"}
PARAMS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


def tool(**function_fields: object) -> dict:
    return {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": PARAMS,
                                             **function_fields}}


CASES: dict[str, dict] = {
    # tools as ChatCompletionToolsParam.model_dump() prints them
    "tools_plain": {"messages": [U], "tools": [tool()]},
    "tools_strict_true": {"messages": [U], "tools": [tool(strict=True)]},
    "tools_strict_false": {"messages": [U], "tools": [tool(strict=False)]},
    "tools_strict_null": {"messages": [U], "tools": [tool(strict=None)]},
    "tools_strict_string": {"messages": [U], "tools": [tool(strict="yes")]},
    "tools_strict_2": {"messages": [U], "tools": [tool(strict=2)]},
    "tools_defer_function": {"messages": [U], "tools": [tool(defer_loading=True)]},
    "tools_defer_tool": {"messages": [U], "tools": [{**tool(), "defer_loading": False}]},
    "tools_defer_both": {"messages": [U], "tools": [{**tool(defer_loading=True), "defer_loading": False}]},
    "tools_extra_keys": {"messages": [U], "tools": [{**tool(cache_control={"type": "ephemeral"}), "strict": True}]},
    "tools_no_description": {"messages": [U], "tools": [{"type": "function", "function": {"name": "f"}}]},
    "tools_ten_strict": {"messages": [U], "tools": [tool(strict=True, name=f"tool_{i}") for i in range(10)]},
    "tools_type_search": {"messages": [U], "tools": [{"type": "tool_search"}]},
    # content: null per role
    "null_user": {"messages": [{"role": "user", "content": None}]},
    "null_system": {"messages": [{"role": "system", "content": None}, U]},
    "null_developer": {"messages": [{"role": "developer", "content": None}, U]},
    "null_tool": {"messages": [U, CALLED, {"role": "tool", "tool_call_id": "call_1", "content": None}]},
    "null_assistant": {"messages": [U, {"role": "assistant", "content": None}, U]},
    "null_function_named": {"messages": [U, {"role": "function", "name": "f", "content": None}, U]},
    "null_custom_role": {"messages": [U, {"role": "critic", "content": None}, U]},
    "missing_content": {"messages": [{"role": "user"}, U]},
    # names, reasoning, tool calls
    "name_string": {"messages": [{**U, "name": "ann"}]},
    "name_number": {"messages": [{**U, "name": 5}]},
    "name_null": {"messages": [{**U, "name": None}]},
    "reasoning_string": {"messages": [U, {"role": "assistant", "content": "Sunny.", "reasoning": "Look it up."}, U]},
    "reasoning_list": {"messages": [U, {"role": "assistant", "content": "Sunny.", "reasoning": ["a"]}, U]},
    "tool_round_trip": {"messages": [U, CALLED, RESULT], "tools": [tool(strict=True)]},
    "tool_call_no_id": {"messages": [U, {**CALLED, "tool_calls": [{k: v for k, v in CALL.items() if k != "id"}]},
                                     RESULT]},
    "tool_call_no_type": {"messages": [U, {**CALLED, "tool_calls": [{k: v for k, v in CALL.items() if k != "type"}]},
                                       RESULT]},
    "tool_call_dict_arguments": {"messages": [U, {**CALLED, "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]}, RESULT]},
    "tool_call_extra_fields": {"messages": [U, {**CALLED, "tool_calls": [{**CALL, "index": 0}]}, RESULT]},
    "tool_call_id_number": {"messages": [U, CALLED, {**RESULT, "tool_call_id": 5}]},
    # content parts
    "parts_text": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                             {"type": "text", "text": "b"}]}]},
    "parts_with_string": {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}, "b"]}]},
    "parts_no_text": {"messages": [{"role": "user", "content": [{"type": "text"}]}]},
    "parts_text_null": {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    "parts_input_text": {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "a"}]}]},
    "parts_cache_control": {"messages": [{"role": "system", "content": [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]}, U]},
    "parts_tool_result": {"messages": [U, CALLED, {**RESULT, "content": [{"type": "text", "text": "18°C"},
                                                                        {"type": "text", "text": "clear"}]}]},
    # developer → system
    "developer_merge": {"messages": [{"role": "system", "content": ""}, U,
                                     {"role": "developer", "content": [{"type": "text", "text": "a"},
                                                                       {"type": "text", "text": "b"}]},
                                     {"role": "developer", "content": "c"}]},
}


def main() -> int:
    lines = [{"id": f"fields:{name}", "client": "hand-written", "scenario": name, "endpoint": "chat",
              "request": {"model": "tiny-qwen", **body}} for name, body in CASES.items()]
    OUT.write_text("".join(json.dumps(line, ensure_ascii=False) + "\n" for line in lines), encoding="utf-8")
    print(f"{len(lines)} bodies -> {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
