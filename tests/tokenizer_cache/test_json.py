"""tokenizer_cache._json: json.loads's value at orjson's speed, for bodies and tool-call arguments."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenizer_cache import json_loads, read_json

ODD_TEXTS = [
    '{"a":18446744073709551615,"b":18446744073709551616,"c":-9223372036854775809}', '{"n":1e400}',
    '{"n":-1E400,"m":1e-400,"z":-0,"y":-0.0}', '{"big":[123456789012345678901234567890]}',
    '{"x":NaN}', '{"x":Infinity}', '{"s":"\\ud83d\\ude00","t":"\\ud800"}', '"\\udfff"', '{"a":"\ud800"}',
    "\ufeff{}", '{"a":1,"a":2.5}', "[" * 2000 + "]" * 2000, "[" * 1100 + "]" * 1100, '{"a":"tab\there"}',
    "", " ", "{} x", '{"a":1,"b":0,"a":2,"c":{"x":1,"y":2,"x":3}}', '{"path": "src/a.py", "n": 3}',
]


def outcome(text: str) -> tuple[Any, ...]:
    """json_loads's value told apart by type (repr: 1 is not 1.0 nor True), or the error it raises."""
    try:
        return "value", repr(json_loads(text))
    except Exception as exc:   # the very error is what is compared
        return "error", type(exc), str(exc)


def json_module_outcome(text: str) -> tuple[Any, ...]:
    try:
        return "value", repr(json.loads(text))
    except Exception as exc:
        return "error", type(exc), str(exc)


@pytest.mark.parametrize("text", ODD_TEXTS)
def test_json_loads_gives_what_json_loads_gives_or_raises_what_it_raises(text: str) -> None:
    assert outcome(text) == json_module_outcome(text)


def test_orjson_reads_what_it_reads_as_the_json_module_does_and_nothing_else() -> None:
    assert read_json('{"path": "src/a.py", "n": 3, "ok": true}')[1] is True
    assert read_json('{"n": 18446744073709551616}') == ({"n": 18446744073709551616}, False)
    assert read_json('{"x": NaN}')[1] is False


@pytest.mark.parametrize("arguments", [
    '{"n": 18446744073709551616, "m": -9223372036854775809}', '{"x": NaN, "y": -Infinity, "z": 1e400}',
    '{"a": 1, "a": 2, "b": {"c": 1, "c": [3]}}', '{"deep": ' + "[" * 900 + "]" * 900 + "}",
    '{"s": "\\ud83d\\ude00 é"}', '{"f": 0.1, "g": 1e16, "h": -0.0}',
])
def test_tool_call_arguments_render_as_the_json_module_reads_them(qwen3: Any, arguments: str) -> None:
    """vLLM reads a tool call's arguments with json.loads, and Qwen3's template writes them with
    tojson (json.dumps): a wide integer read as orjson's float, or a NaN refused, would change the prompt."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    chat = {"messages": [{"role": "user", "content": "go"},
                         {"role": "assistant", "content": "", "tool_calls": [call]},
                         {"role": "tool", "tool_call_id": "c1", "content": "done"}]}
    written = json.dumps(json.loads(arguments), ensure_ascii=False)
    assert f'"arguments": {written}}}' in qwen3.render_chat(chat)
