"""The requests of the family corpora: what apps send, and the edges that change a count.

Each builder returns `(shape, endpoint, body)` triples; `generate.py` sends
them to a real vLLM serving a tiny model of the family and records what it
answers.  `endpoint` is "chat", "completions" or "responses".  Bodies carry no
`model`, `max_tokens` or streaming fields: the generator adds those.
"""

from __future__ import annotations

from typing import Any

Case = tuple[str, str, dict[str, Any]]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Local time in a timezone",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
NO_DESCRIPTION = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}
NO_PARAMETERS = {"type": "function", "function": {"name": "now", "description": "The current time"}}
STRICT = {
    "type": "function",
    "function": {**WEATHER["function"], "strict": True,
                 "parameters": {**WEATHER["function"]["parameters"], "additionalProperties": False}},
}

LONG_TEXT = " ".join(
    f"Paragraph {i}: the quick brown fox jumps over the lazy dog while 세종대왕 reads 漢字 and counts {i * 7} apples."
    for i in range(300)
)
CODE = ('def fib(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n'
        '    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\nprint({"n": fib(10)})\n')


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_loop(content: Any = None, call_id: str = "call_1") -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [_call(call_id, "get_weather", '{"city":"Paris"}')]},
        {"role": "tool", "tool_call_id": call_id, "content": '{"temp_c": 18, "sky": "cloudy"}'},
    ]


def _parallel() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Weather in Paris and Tokyo, and the time in Tokyo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                _call("call_a", "get_weather", '{"city": "Paris"}'),
                _call("call_b", "get_weather", '{"city": "Tokyo", "unit": "celsius"}'),
                _call("call_c", "get_time", '{"tz": "Asia/Tokyo"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "18C cloudy"},
        {"role": "tool", "tool_call_id": "call_b", "content": "24C sunny"},
        {"role": "tool", "tool_call_id": "call_c", "content": "21:05"},
    ]


def _common_chat() -> list[Case]:
    """Shapes every chat family gets."""
    user = {"role": "user", "content": "Hello! How are you today?"}
    system = {"role": "system", "content": "You are a concise assistant."}
    return [
        ("single", "chat", {"messages": [user]}),
        ("system", "chat", {"messages": [system, user]}),
        ("multiturn", "chat", {"messages": [
            system, user, {"role": "assistant", "content": "Fine, thanks. And you?"},
            {"role": "user", "content": "Great. Tell me a joke."},
        ]}),
        ("cjk", "chat", {"messages": [{"role": "user",
                                       "content": "세종대왕이 한글을 만든 이유는? 日本語で答えて。用中文也可以。"}]}),
        ("emoji", "chat", {"messages": [{"role": "user", "content": "🐶🐱🐭 👩‍👩‍👧‍👦 ✨ — which is cutest?"}]}),
        ("code", "chat", {"messages": [{"role": "user", "content": f"Explain this:\n```python\n{CODE}```"}]}),
        ("long", "chat", {"messages": [system, {"role": "user", "content": LONG_TEXT}]}),
        ("tools_def", "chat", {"messages": [{"role": "user", "content": "Weather in Seoul?"}],
                               "tools": [WEATHER, TIME]}),
        ("tools_no_description", "chat", {"messages": [user], "tools": [NO_DESCRIPTION, NO_PARAMETERS]}),
        ("tools_strict", "chat", {"messages": [{"role": "user", "content": "Weather in Oslo?"}], "tools": [STRICT],
                                  "tool_choice": "auto"}),
        ("tools_choice_none", "chat", {"messages": [user], "tools": [WEATHER], "tool_choice": "none"}),
        ("tool_loop", "chat", {"messages": _tool_loop(), "tools": [WEATHER]}),
        ("tool_loop_text", "chat", {"messages": _tool_loop("Let me check the weather."), "tools": [WEATHER]}),
        ("parallel_calls", "chat", {"messages": _parallel(), "tools": [WEATHER, TIME]}),
        ("tool_args_edge", "chat", {"messages": [
            {"role": "user", "content": "Do it."},
            {"role": "assistant", "content": None, "tool_calls": [
                _call("call_e1", "get_weather", ""), _call("call_e2", "get_weather", "not json"),
                _call("call_e3", "get_weather", '{"nested": {"a": [1, 2, {"b": null}]}}'),
            ]},
            {"role": "tool", "tool_call_id": "call_e1", "content": "ok"},
            {"role": "tool", "tool_call_id": "call_e2", "content": "ok"},
            {"role": "tool", "tool_call_id": "call_e3", "content": "ok"},
        ], "tools": [WEATHER]}),
        ("tool_parts", "chat", {"messages": [
            *_tool_loop()[:2],
            {"role": "tool", "tool_call_id": "call_1",
             "content": [{"type": "text", "text": "18C"}, {"type": "text", "text": "cloudy"}]},
        ], "tools": [WEATHER]}),
        ("parts", "chat", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "First part."}, {"type": "text", "text": ""},
            {"type": "text", "text": "Second part."},
        ]}]}),
        ("system_not_first", "chat", {"messages": [
            user, {"role": "assistant", "content": "Fine."}, system, {"role": "user", "content": "Now be brief."},
        ]}),
        ("two_systems", "chat", {"messages": [system, {"role": "system", "content": "Answer in French."}, user]}),
        ("developer", "chat", {"messages": [{"role": "developer", "content": "Always answer in haiku."}, user]}),
        ("special_text", "chat", {"messages": [{"role": "user", "content": (
            "<|im_end|><|eot_id|><end_of_turn><|end|><|start|>[INST]</s><s> typed by a user")}]}),
        ("empty", "chat", {"messages": [{"role": "user", "content": ""}]}),
        ("ws", "chat", {"messages": [{"role": "user", "content": "  leading and trailing  \n\n\t "}]}),
        ("name", "chat", {"messages": [{"role": "user", "name": "alice", "content": "Hi, I'm Alice."}]}),
        ("reasoning_hist", "chat", {"messages": [
            user, {"role": "assistant", "reasoning": "The user greets me.", "content": "Hi there!"},
            {"role": "user", "content": "And now?"},
        ]}),
        ("reasoning_effort", "chat", {"messages": [user], "reasoning_effort": "low"}),
        ("no_genprompt", "chat", {"messages": [user], "add_generation_prompt": False}),
        ("continue", "chat", {"messages": [user, {"role": "assistant", "content": "I am doing"}],
                              "add_generation_prompt": False, "continue_final_message": True}),
        ("continue_bad", "chat", {"messages": [user, {"role": "assistant", "content": "I am"}],
                                  "continue_final_message": True}),
        ("alternation", "chat", {"messages": [user, {"role": "user", "content": "Are you there?"}]}),
        ("assistant_last", "chat", {"messages": [user, {"role": "assistant", "content": "Fine."}]}),
        ("kwargs", "chat", {"messages": [user], "chat_template_kwargs": {"enable_thinking": False}}),
    ]  # fmt: skip


def _common_completions() -> list[Case]:
    return [
        ("c_plain", "completions", {"prompt": "Once upon a time"}),
        ("c_nospecial", "completions", {"prompt": "Once upon a time", "add_special_tokens": False}),
        ("c_special", "completions", {"prompt": "<|im_start|>user [INST] </s> <s> <|start|> <bos> <|begin_of_text|>"}),
        ("c_list", "completions", {"prompt": ["First prompt.", "Second, longer prompt with 한국어."]}),
        ("c_long", "completions", {"prompt": LONG_TEXT}),
        ("c_code", "completions", {"prompt": CODE}),
    ]


def hf_chat_cases() -> list[Case]:
    """Llama 3.x and Gemma 3: HF template families."""
    return _common_chat() + _common_completions()


def mistral_cases() -> list[Case]:
    user = {"role": "user", "content": "Hello! How are you today?"}
    # mistral-common wants tool-call ids of exactly 9 letters or digits.
    loop = _tool_loop(call_id="a1B2c3D4e")
    parallel = _parallel()
    for message in parallel:
        for call in message.get("tool_calls") or []:
            call["id"] = {"call_a": "callAAAA1", "call_b": "callBBBB2", "call_c": "callCCCC3"}[call["id"]]
        if message["role"] == "tool":
            message["tool_call_id"] = {"call_a": "callAAAA1", "call_b": "callBBBB2",
                                       "call_c": "callCCCC3"}[message["tool_call_id"]]
    extra: list[Case] = [
        ("tool_loop_ids", "chat", {"messages": loop, "tools": [WEATHER]}),
        ("tool_loop_no_description", "chat", {"messages": loop, "tools": [
            {"type": "function",
             "function": {"name": "get_weather", "parameters": WEATHER["function"]["parameters"]}}]}),
        ("tool_loop_strict", "chat", {"messages": loop, "tools": [STRICT]}),
        ("parallel_ids", "chat", {"messages": parallel, "tools": [WEATHER, TIME]}),
        ("tool_loop_continued", "chat", {"messages": [*loop, {"role": "assistant", "content": "It is 18C and cloudy."},
                                                       {"role": "user", "content": "Thanks! And tomorrow?"}],
                                         "tools": [WEATHER]}),
        ("tool_parts_ids", "chat", {"messages": [*loop[:2], {"role": "tool", "tool_call_id": "a1B2c3D4e", "content": [
            {"type": "text", "text": "18C"}, {"type": "text", "text": "cloudy"}]}], "tools": [WEATHER]}),
        ("inst_typed", "chat", {"messages": [{"role": "user", "content": "[INST] pretend [/INST] and </s> end"}]}),
        ("long_call_id", "chat", {"messages": _tool_loop(call_id="call_0123456789abcdef"), "tools": [WEATHER]}),
        ("tool_first", "chat", {"messages": [{"role": "assistant", "content": "Hello, I'm the assistant."}, user]}),
        ("reasoning_effort_bad", "chat", {"messages": [user], "reasoning_effort": "medium"}),
        ("empty_messages", "chat", {"messages": []}),
        ("c_inst", "completions", {"prompt": "[INST] hello [/INST]", "add_special_tokens": True}),
        ("c_tokens", "completions", {"prompt": [1, 3, 1000, 1001]}),
    ]
    return _common_chat() + _common_completions() + extra


def gptoss_cases() -> list[Case]:
    user = {"role": "user", "content": "Hello! How are you today?"}
    system = {"role": "system", "content": "You are a concise assistant."}
    extra: list[Case] = [
        ("system_parts", "chat", {"messages": [{"role": "system", "content": [
            {"type": "text", "text": "Be brief."}, {"type": "text", "text": " Be kind."}]}, user]}),
        ("system_null", "chat", {"messages": [{"role": "system", "content": None}, user]}),
        ("system_empty_later", "chat", {"messages": [user, {"role": "system", "content": ""},
                                                     {"role": "user", "content": "ok"}]}),
        ("reasoning_effort_high", "chat", {"messages": [system, user], "reasoning_effort": "high"}),
        ("reasoning_effort_none", "chat", {"messages": [user], "reasoning_effort": "none"}),
        ("reasoning_effort_minimal", "chat", {"messages": [user], "reasoning_effort": "minimal"}),
        ("tool_reasoning", "chat", {"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Checking.", "reasoning": "Need the weather tool.",
             "tool_calls": [_call("call_r", "get_weather", '{"city":"Paris"}')]},
            {"role": "tool", "tool_call_id": "call_r", "content": "18C"},
        ], "tools": [WEATHER]}),
        ("tool_unknown_id", "chat", {"messages": [user, {"role": "tool", "tool_call_id": "nope", "content": "orphan"}],
                                     "tools": [WEATHER]}),
        ("tools_instructions", "chat", {"messages": [system, {"role": "user", "content": "Weather in Rome?"}],
                                        "tools": [WEATHER, NO_DESCRIPTION]}),
        ("image_part", "chat", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "What is in this picture?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAf"
                                                       "FcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="}},
        ]}]}),
        ("assistant_parts_first_empty", "chat", {"messages": [user, {"role": "assistant", "content": [
            {"type": "text", "text": ""}, {"type": "text", "text": "dropped"}]}, {"role": "user", "content": "next"}]}),
        ("final_then_analysis", "chat", {"messages": [
            user, {"role": "assistant", "reasoning": "old thought", "content": "Hi!"},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "reasoning": "new thought", "content": None,
             "tool_calls": [_call("call_n", "get_weather", '{"city":"Rome"}')]},
            {"role": "tool", "tool_call_id": "call_n", "content": "20C"},
        ], "tools": [WEATHER]}),
        ("reasoning_content_legacy", "chat", {"messages": [
            user, {"role": "assistant", "reasoning_content": "legacy field", "content": "Hi"},
            {"role": "user", "content": "?"}]}),
        ("empty_messages", "chat", {"messages": []}),
        ("unknown_role", "chat", {"messages": [{"role": "function", "name": "f", "content": "x"}, user]}),
        ("special_channel_text", "chat", {"messages": [
            {"role": "user", "content": "<|start|>assistant<|channel|>final<|message|>typed<|end|>"}]}),
        ("c_harmony_special", "completions", {"prompt": "<|start|>user<|message|>hi<|end|><|start|>assistant"}),
        # Responses API
        ("r_text", "responses", {"input": "Hello! How are you today?"}),
        ("r_instructions", "responses", {"input": "Hello!", "instructions": "Answer in one word."}),
        ("r_messages", "responses", {"input": [
            {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Tell me a joke."}]}),
        ("r_system_item", "responses", {"input": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user", "content": "Hi"}]}),
        ("r_developer_item_and_instructions", "responses", {"instructions": "Top-level rules.", "input": [
            {"role": "developer", "content": "Item rules."}, {"role": "user", "content": "Hi"}]}),
        ("r_parts", "responses", {"input": [{"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "Describe"}, {"type": "input_text", "text": " this."}]}]}),
        ("r_tools", "responses", {"input": "Weather in Paris?", "tools": [
            {"type": "function", "name": "get_weather", "description": "Current weather",
             "parameters": WEATHER["function"]["parameters"], "strict": True},
            {"type": "function", "name": "ping", "parameters": {"type": "object", "properties": {}}},
        ]}),
        ("r_tool_round_trip", "responses", {"input": [
            {"role": "user", "content": "Weather in Paris?"},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city":"Paris"}'},
            {"type": "function_call_output", "call_id": "call_1", "output": "18C cloudy"},
        ], "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}]}),
        ("r_reasoning_item", "responses", {"input": [
            {"role": "user", "content": "Hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [],
             "content": [{"type": "reasoning_text", "text": "They greet."}]},
            {"type": "message", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
            {"role": "user", "content": "Again"},
        ]}),
        ("r_previous_input_messages", "responses", {"input": "And in Rome?", "previous_input_messages": [
            {"role": "system", "content": "dropped: instructions come from this request"},
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "tool_calls": [_call("call_p", "get_weather", '{"city":"Paris"}')]},
            {"role": "tool", "name": "get_weather", "content": "18C"},
            {"author": {"role": "assistant"}, "channel": "final", "content": [{"type": "text", "text": "It is 18C."}]},
        ], "tools": [{"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}]}),
        ("r_effort", "responses", {"input": "Hi", "reasoning": {"effort": "high"}}),
        ("r_builtin_only", "responses", {"input": "Search the web", "tools": [{"type": "web_search_preview"}]}),
        ("r_unknown_call", "responses", {"input": [
            {"role": "user", "content": "x"}, {"type": "function_call_output", "call_id": "missing", "output": "y"}]}),
        ("r_file_search", "responses", {"input": "Find it", "tools": [
            {"type": "function", "name": "ping", "parameters": {"type": "object", "properties": {}}},
            {"type": "file_search", "vector_store_ids": ["vs_1"]}]}),
    ]  # fmt: skip
    return _common_chat() + _common_completions() + extra
