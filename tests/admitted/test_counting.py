"""Each preprocessing rule of the counter, on small hand-made templates and requests.

The tokenizer built here is a byte-level BPE without merges: every UTF-8 byte
is one token and each added token is one token, so expected counts can be
worked out by hand.  Most tests look at the rendered text instead, which is
where the rules show.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

from proxy.admitted.heap import HeapTrimmer
from tests.conftest import MODELS
from tokenizer_cache import CountError, MediaNotCountable, lax_bool, load_model_tokenizer
from tokenizer_cache._content_format import detect_content_format
from tokenizer_cache._jinja import parse_template

SPECIAL = ["<s>", "</s>", "<|im_start|>", "<|im_end|>"]

# A plain ChatML-like template that prints message fields as JSON where the
# rule under test needs to see them.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer(bos_in_post_processor: bool = False) -> Tokenizer:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokenizer = Tokenizer(models.BPE(vocab={ch: i for i, ch in enumerate(alphabet)}, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL])
    if bos_in_post_processor:
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))]
        )
    return tokenizer


def make_model(
    directory: Path,
    template: Any = CHATML,
    *,
    jinja_file: str | None = None,
    bos_in_post_processor: bool = False,
    **config: Any,
):
    directory.mkdir(parents=True, exist_ok=True)
    byte_tokenizer(bos_in_post_processor).save(str(directory / "tokenizer.json"))
    tokenizer_config = {"bos_token": "<s>", "eos_token": "</s>", **config}
    if template is not None:
        tokenizer_config["chat_template"] = template
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config), encoding="utf-8")
    if jinja_file is not None:
        (directory / "chat_template.jinja").write_text(jinja_file, encoding="utf-8")
    return load_model_tokenizer(directory)


@pytest.fixture
def model(tmp_path):
    """Factory: a ModelTokenizer for a template (each call gets its own directory)."""
    counter = iter(range(1000))

    def factory(template: Any = CHATML, **kwargs: Any):
        return make_model(tmp_path / f"m{next(counter)}", template, **kwargs)

    return factory


def chat(*messages: dict, **fields: Any) -> dict:
    return {"model": "m", "messages": list(messages), **fields}


def user(content: Any) -> dict:
    return {"role": "user", "content": content}


# ---------------------------------------------------------------------------
# Content-format detection
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    "template",
    [
        "{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% for p in m.content | selectattr('type', 'equalto', 'text') %}"
        "{{ p.text }}{% endfor %}{% endfor %}",
        "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}"
        "{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% set c = m.content %}{% for p in c %}{{ p.text }}{% endfor %}{% endfor %}",
        "{% macro render(content) %}{% for p in content %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ render(m.content) }}{% endfor %}",
        "{% macro render(x, content=none) %}{% for p in content %}{{ p.text }}{% endfor %}{% endmacro %}"
        "{% for m in messages %}{{ render(1, content=m['content']) }}{% endfor %}",
        "{% for p in messages[0].content %}{{ p.text }}{% endfor %}",
    ],
    ids=["direct", "filtered", "messages-alias", "content-alias", "macro-param", "macro-kwarg", "indexed"],
)
def test_templates_that_iterate_over_content_get_openai_format(template):
    assert detect_content_format(parse_template(template)) == "openai"


@pytest.mark.parametrize(
    "template",
    [
        CHATML,
        "{% for m in messages %}{% for line in m.content.split('\\n') %}{{ line }}{% endfor %}{% endfor %}",
        "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% endif %}{% endfor %}",
        "{% for t in tools %}{% for p in t.content %}{{ p }}{% endfor %}{% endfor %}",
    ],
    ids=["chatml", "split-lines", "string-test", "not-a-message"],
)
def test_templates_that_print_content_get_string_format(template):
    assert detect_content_format(parse_template(template)) == "string"


# ---------------------------------------------------------------------------
# Content flattening
# ---------------------------------------------------------------------------

PARTS_AS_JSON = "{% for m in messages %}{{ m.role }}={{ m.content | tojson }};{% endfor %}"
OPENAI_PARTS_AS_JSON = (
    "{% for m in messages %}{% for p in m.content %}{% endfor %}{{ m.role }}={{ m.content | tojson }};"
    "{% endfor %}"
)


def test_string_format_joins_non_empty_text_parts_with_newlines(model):
    tok = model(PARTS_AS_JSON)
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": ""}, "b",
             {"type": "refusal", "refusal": "c"}]
    assert tok.render_chat(chat(user(parts), add_generation_prompt=False)) == 'user="a\\nb\\nc";'


@pytest.mark.parametrize("part", [{"type": "text"}, {"type": "text", "text": None},
                                  {"type": "input_text", "text": "a"}])
def test_openai_roles_refuse_parts_their_request_model_refuses(model, part):
    # vLLM 0.32 answers 400 for each (pydantic checks OpenAI's part types on these roles).
    for role in ("user", "system", "assistant"):
        with pytest.raises(CountError):
            model(PARTS_AS_JSON).count_chat(chat({"role": role, "content": [part]}, user("q")))


def test_custom_roles_skip_a_text_part_without_text(model):
    body = chat({"role": "critic", "content": [{"type": "text"}, {"type": "text", "text": "b"}]},
                add_generation_prompt=False)
    assert model(PARTS_AS_JSON).render_chat(body) == 'critic="b";'


def test_string_format_turns_null_content_into_empty_string(model):
    tok = model(PARTS_AS_JSON)
    body = chat(user("hi"), {"role": "assistant", "content": None})
    assert tok.render_chat(body) == 'user="hi";assistant="";'


HEADER = "x-anthropic-billing-header: cc_version=2.0.14; cch=5f3c2;"


def test_a_system_messages_billing_header_line_is_dropped_as_vllm_drops_it(model):
    """vLLM 0.32 (chat_utils.py `_strip_claude_code_billing_header`): the first line of a system
    text that starts with Claude Code's attribution header, and the text when nothing follows."""
    body = chat({"role": "system", "content": HEADER + "\nBe brief."}, user(HEADER + "\nq"),
                add_generation_prompt=False)
    assert model(PARTS_AS_JSON).render_chat(body) == f'system="Be brief.";user="{HEADER}\\nq";'
    parts = [{"type": "text", "text": HEADER}, {"type": "text", "text": HEADER + "\nOne."},
             {"type": "text", "text": "Two."}]
    body = chat({"role": "system", "content": parts}, user("q"), add_generation_prompt=False)
    assert model(PARTS_AS_JSON).render_chat(body) == 'system="One.\\nTwo.";user="q";'
    assert model(OPENAI_PARTS_AS_JSON).render_chat(body) == (
        'system=[{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}];'
        'user=[{"type": "text", "text": "q"}];')
    only = chat({"role": "system", "content": HEADER}, user("q"), add_generation_prompt=False)
    assert model(PARTS_AS_JSON).render_chat(only) == 'system="";user="q";'
    assert model(OPENAI_PARTS_AS_JSON).render_chat(only) == 'system=[];user=[{"type": "text", "text": "q"}];'


def test_openai_format_keeps_parts_including_empty_ones(model):
    tok = model(OPENAI_PARTS_AS_JSON)
    body = chat(user([{"type": "text", "text": "a"}, {"type": "text", "text": ""}]), {"role": "user", "content": "b"},
                {"role": "assistant", "content": None})
    assert tok.render_chat(body) == (
        'user=[{"type": "text", "text": "a"}, {"type": "text", "text": ""}];'
        'user=[{"type": "text", "text": "b"}];assistant=[];'
    )


def test_tool_message_parts_are_always_flattened(model):
    tok = model(OPENAI_PARTS_AS_JSON)
    tool = {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "x"},
                                                              {"type": "text", "text": ""},
                                                              {"type": "text", "text": "y"}]}
    assert tok.render_chat(chat(user("q"), tool)).endswith('tool="x\\n\\ny";')


def test_media_for_a_model_without_multimodal_arithmetic_is_not_countable(model):
    """Not a CountError: brimful cannot tell that vLLM would refuse it, so it must not 400."""
    tok = model()
    body = chat(user([{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]))
    with pytest.raises(MediaNotCountable) as caught:
        tok.count_chat(body)
    assert not isinstance(caught.value, CountError)
    assert caught.value.reason == "model"


def test_unknown_part_type_is_rejected(model):
    with pytest.raises(CountError, match="Unsupported chat content part type"):
        model().count_chat(chat(user([{"type": "hologram", "text": "x"}])))


# ---------------------------------------------------------------------------
# Tools and tool calls
# ---------------------------------------------------------------------------

def test_tools_are_reserialised_in_vllm_key_order_with_nulls(model):
    tok = model("{{ tools | tojson }}")
    tools = [{"function": {"parameters": {"type": "object"}, "name": "f", "extra": 1}, "type": "function",
              "strict": True}]
    assert tok.render_chat(chat(user("x"), tools=tools)) == (
        '[{"type": "function", "function": {"name": "f", "description": null, '
        '"parameters": {"type": "object"}}}]'
    )


@pytest.mark.parametrize(
    ("function_extra", "tool_extra", "dumped_function", "dumped_tool"),
    [
        # vLLM 0.32's FunctionDefinition / ChatCompletionToolsParam serialisers:
        # strict and defer_loading survive unless null, false included.
        ({"strict": True}, {}, {"strict": True}, {}),
        ({"strict": False}, {}, {"strict": False}, {}),
        ({"strict": None}, {}, {}, {}),
        ({"strict": "yes"}, {}, {"strict": True}, {}),
        ({"defer_loading": True}, {}, {"defer_loading": True}, {}),
        ({}, {"defer_loading": False}, {"defer_loading": False}, {"defer_loading": False}),
        ({"defer_loading": True}, {"defer_loading": False}, {"defer_loading": True}, {"defer_loading": False}),
        ({"strict": False, "defer_loading": None, "cache_control": {"type": "ephemeral"}}, {"strict": True},
         {"strict": False}, {}),
    ],
)
def test_strict_and_defer_loading_are_dumped_as_vllm_dumps_them(
    model, function_extra, tool_extra, dumped_function, dumped_tool
):
    tok = model("{{ tools | tojson }}")
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}, **function_extra},
            **tool_extra}
    expected = [{"type": "function",
                 "function": {"name": "f", "description": None, "parameters": {"type": "object"}, **dumped_function},
                 **dumped_tool}]
    rendered = tok.render_chat(chat(user("x"), tools=[tool]))
    assert rendered == json.dumps(expected, ensure_ascii=False)


@pytest.mark.parametrize("field", ["strict", "defer_loading"])
def test_a_strict_that_is_not_a_boolean_is_refused(model, field):
    tool = {"type": "function", "function": {"name": "f", field: 2}}
    with pytest.raises(CountError) as caught:
        model().count_chat(chat(user("x"), tools=[tool]))
    assert caught.value.param == f"tools[0].function.{field}"


def test_lax_bool_reads_every_value_as_pydantic_does() -> None:
    """vLLM 0.32's `bool | None` fields (`stream`, `include_usage`, a tool's `strict`) are read in lax mode."""
    pydantic = pytest.importorskip("pydantic")
    import itertools

    reference = pydantic.TypeAdapter(bool | None)

    def theirs(value: object) -> object:
        try:
            return reference.validate_python(value)
        except pydantic.ValidationError:
            return "refused"

    def ours(value: object) -> object:
        try:
            return lax_bool(value)
        except ValueError:
            return "refused"

    words = ["".join(c) for n in range(1, 4) for c in itertools.product("01tfnoyesrua ", repeat=n)]
    cases: list[object] = words + [w.upper() for w in words] + [
        "true", "TRUE", "tRuE", "false", "yes", "No", "on", "OFF", "", " true", "true ", "1.0", "01", "\u0661",
        True, False, None, 0, 1, 2, -1, 0.0, 1.0, -0.0, 0.5, float("nan"), 10 ** 30, [], {}, [True]]
    assert [c for c in cases if theirs(c) != ours(c)] == []


def test_empty_tools_list_is_rejected(model):
    with pytest.raises(CountError) as caught:
        model().count_chat(chat(user("x"), tools=[]))
    assert caught.value.param == "tools"


CALLS_AS_JSON = (
    "{% for m in messages %}{% if m.tool_calls is defined %}"
    "{% for c in m.tool_calls %}{{ c.function.arguments | tojson }};{% endfor %}"
    "{% else %}{{ m.role }}:no-calls;{% endif %}{% endfor %}"
)


@pytest.mark.parametrize(
    ("arguments", "rendered"),
    [
        ('{"city":"Tokyo"}', '{"city": "Tokyo"}'),
        ('{"n": {"deep": [1, 2]}}', '{"n": {"deep": [1, 2]}}'),
        ("", "{}"),
        ("not json", "{}"),
        ("[1, 2]", "{}"),
        ("42", "{}"),
    ],
)
def test_tool_call_arguments_become_objects(model, arguments, rendered):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    body = chat(user("x"), {"role": "assistant", "content": None, "tool_calls": [call]})
    assert model(CALLS_AS_JSON).render_chat(body) == f"user:no-calls;{rendered};"


@pytest.mark.parametrize(
    "call",
    [
        {"id": "c1", "type": "function", "function": {"name": "f"}},
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": None}},
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"already": "dict"}}},
        {"type": "function", "function": {"name": "f", "arguments": "{}"}},
        {"id": "c1", "function": {"name": "f", "arguments": "{}"}},
    ],
)
def test_tool_calls_the_request_model_refuses(model, call):
    # Each is a 400 on vLLM 0.32 (OpenAI's tool-call type requires id, type and string arguments).
    body = chat(user("x"), {"role": "assistant", "content": None, "tool_calls": [call]})
    with pytest.raises(CountError):
        model(CALLS_AS_JSON).count_chat(body)


def test_empty_tool_calls_are_removed(model):
    body = chat(user("x"), {"role": "assistant", "content": "y", "tool_calls": []})
    assert model(CALLS_AS_JSON).render_chat(body) == "user:no-calls;assistant:no-calls;"


def test_request_tool_calls_are_not_mutated(model):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    body = chat(user("x"), {"role": "assistant", "content": None, "tool_calls": [call]})
    model(CALLS_AS_JSON).count_chat(body)
    assert call["function"]["arguments"] == '{"a": 1}'


def test_message_fields_are_whitelisted_and_reasoning_copied(model):
    tok = model("{% for m in messages %}{{ m | tojson }}\n{% endfor %}")
    body = chat(
        {"role": "user", "content": "q", "name": "ann", "secret": "x"},
        {"role": "assistant", "content": "a", "reasoning": "think", "reasoning_content": "old", "task": 7},
        {"role": "tool", "content": "r", "tool_call_id": "c1", "reasoning": "dropped", "task": "t"},
        {"role": "assistant", "content": "b", "reasoning": ["any", "type"]},
        add_generation_prompt=False,
    )
    lines = [json.loads(line) for line in tok.render_chat(body).splitlines()]
    assert lines == [
        {"role": "user", "content": "q", "name": "ann"},
        {"role": "assistant", "content": "a", "reasoning": "think", "reasoning_content": "think"},
        {"role": "tool", "content": "r", "tool_call_id": "c1", "task": "t"},
        {"role": "assistant", "content": "b", "reasoning": ["any", "type"], "reasoning_content": ["any", "type"]},
    ]


@pytest.mark.parametrize("name", [7, None])
def test_a_name_that_is_not_a_string_is_refused(model, name):
    # vLLM 0.32: 400 from the request model, null included.
    with pytest.raises(CountError) as caught:
        model().count_chat(chat({"role": "user", "content": "q", "name": name}))
    assert caught.value.param == "messages[0].name"


@pytest.mark.parametrize("role", ["user", "system", "tool", "developer", "critic"])
def test_null_content_is_refused_except_on_assistant_messages(model, role):
    with pytest.raises(CountError) as caught:
        model().count_chat(chat(user("q"), {"role": role, "content": None}))
    assert caught.value.param == "messages[1].content"
    model().count_chat(chat(user("q"), {"role": "assistant", "content": None}))
    model().count_chat(chat(user("q"), {"role": "function", "name": "f", "content": None}))
    model().count_chat(chat({"role": "user"}))  # content left out altogether is fine


# ---------------------------------------------------------------------------
# developer → system
# ---------------------------------------------------------------------------

ROLES = "{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"


def test_first_developer_message_becomes_system(model):
    body = chat({"role": "developer", "content": "rules"}, user("q"), add_generation_prompt=False)
    assert model(ROLES).render_chat(body) == "[system:rules][user:q]"


def test_developer_messages_merge_with_system_messages(model):
    body = chat({"role": "system", "content": "s"}, user("q"), {"role": "developer", "content": "d"},
                add_generation_prompt=False)
    assert model(ROLES).render_chat(body) == "[system:s\n\nd][user:q]"


def test_merged_system_text_skips_empty_contents_and_joins_parts_with_newlines(model):
    # vllm/renderers/hf.py _consolidate_system_messages: "\n\n" between non-empty
    # contents, "\n" between a message's parts, plain text even for the openai format.
    body = chat({"role": "system", "content": ""}, user("q"),
                {"role": "developer", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "developer", "content": "c"}, add_generation_prompt=False)
    assert model(ROLES).render_chat(body) == "[system:a\nb\n\nc][user:q]"
    openai_format = ("{% for m in messages %}{% for p in m.content %}{% endfor %}"
                     "[{{ m.role }}:{{ m.content }}]{% endfor %}")
    assert model(openai_format).render_chat(body) == "[system:a\nb\n\nc][user:[{'type': 'text', 'text': 'q'}]]"


def test_developer_tools_reach_templates_that_know_developer(model):
    template = "{% for m in messages %}{{ m.tools | tojson }};{% endfor %}{# 'developer' #}"
    body = chat({"role": "developer", "content": "d", "tools": [{"x": 1}]}, {"role": "developer", "content": "e"},
                add_generation_prompt=False)
    assert model(template).render_chat(body) == '[{"x": 1}];null;'
    body = chat({"role": "developer", "content": "d", "tools": [{"x": 1}]}, add_generation_prompt=False)
    assert model("{% for m in messages %}{{ m.tools is defined }}{% endfor %}").render_chat(body) == "False"


def test_plain_system_messages_are_left_alone_without_developer(model):
    body = chat({"role": "system", "content": "s"}, user("q"), {"role": "system", "content": "t"},
                add_generation_prompt=False)
    assert model(ROLES).render_chat(body) == "[system:s][user:q][system:t]"


def test_template_that_knows_developer_keeps_the_role(model):
    template = ROLES + "{% if messages[0].role == 'developer' %}!{% endif %}"
    body = chat({"role": "developer", "content": "d"}, user("q"), add_generation_prompt=False)
    assert model(template).render_chat(body) == "[developer:d][user:q]!"


# ---------------------------------------------------------------------------
# Template variables
# ---------------------------------------------------------------------------

FLAGS = (
    "gp={{ add_generation_prompt }} think={{ enable_thinking | default('unset') }} "
    "effort={{ reasoning_effort | default('unset') }} x={{ x | default('unset') }} bos={{ bos_token }}"
)


def test_request_level_fields_override_chat_template_kwargs(model):
    body = chat(user("q"), chat_template_kwargs={"add_generation_prompt": False, "x": 1})
    assert model(FLAGS).render_chat(body) == "gp=True think=unset effort=unset x=1 bos=<s>"


def test_reasoning_effort_sets_enable_thinking(model):
    assert "think=False effort=none" in model(FLAGS).render_chat(chat(user("q"), reasoning_effort="none"))
    assert "think=True effort=high" in model(FLAGS).render_chat(chat(user("q"), reasoning_effort="high"))


def test_chat_template_kwargs_enable_thinking_beats_reasoning_effort(model):
    body = chat(user("q"), reasoning_effort="high", chat_template_kwargs={"enable_thinking": False})
    assert "think=False effort=high" in model(FLAGS).render_chat(body)


def test_null_kwargs_are_dropped(model):
    body = chat(user("q"), chat_template_kwargs={"x": None, "enable_thinking": None})
    assert "think=unset effort=unset x=unset" in model(FLAGS).render_chat(body)


def test_null_and_auto_kwargs_are_dropped_and_a_null_enable_thinking_still_stops_the_effort(model):
    """vLLM's merge_kwargs drops null and "auto"; `"enable_thinking" in chat_template_kwargs` (even
    null) keeps reasoning_effort from setting it (chat_completion/protocol.py build_chat_params)."""
    body = chat(user("q"), reasoning_effort="high", chat_template_kwargs={"x": "auto", "enable_thinking": None})
    assert "think=unset effort=high x=unset" in model(FLAGS).render_chat(body)


TOOLS_AS_JSON = "{{ tools | tojson }}"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize("kwargs_tools,rendered", [
    ([], "[]"),                                                         # replaces the request's
    ([{"type": "function", "function": {"name": "g"}}],                 # as sent: no request-model dump
     '[{"type": "function", "function": {"name": "g"}}]'),
    ("auto", None), (None, None),                                       # dropped: the request's stay
])
def test_chat_template_kwargs_tools_replace_the_requests_as_vllm_merges_them(model, kwargs_tools, rendered):
    tok = model(TOOLS_AS_JSON)
    own = tok.render_chat(chat(user("q"), tools=[TOOL]))
    body = chat(user("q"), tools=[TOOL], chat_template_kwargs={"tools": kwargs_tools})
    assert tok.render_chat(body) == (own if rendered is None else rendered)
    assert tok.render_chat(chat(user("q"), chat_template_kwargs={"tools": [TOOL["function"]]})) == (
        '[{"name": "f", "parameters": {"type": "object"}}]')        # tools in kwargs only: still rendered
    with pytest.raises(CountError) as info:
        tok.render_chat(chat(user("q"), chat_template_kwargs={"tools": [5]}))
    assert info.value.param == "chat_template_kwargs"


def test_kwargs_may_override_special_tokens(model):
    body = chat(user("q"), chat_template_kwargs={"bos_token": "B"})
    assert model(FLAGS).render_chat(body).endswith("bos=B")


def test_added_token_dict_special_tokens_are_template_variables(model):
    tok = model("{{ bos_token }}|{{ eos_token }}", bos_token={"__type": "AddedToken", "content": "<s>"})
    assert tok.render_chat(chat(user("q"))) == "<s>|</s>"
    assert tok.count_chat(chat(user("q"))) == 3  # <s>, |, </s>


@pytest.mark.parametrize("key", ["chat_template", "tokenize"])
def test_forbidden_kwargs_are_rejected(model, key):
    with pytest.raises(CountError):
        model().count_chat(chat(user("q"), chat_template_kwargs={key: "x"}))


def test_request_chat_template_is_refused(model):
    with pytest.raises(CountError) as caught:
        model().count_chat(chat(user("q"), chat_template="{{ 'x' }}"))
    assert caught.value.param == "chat_template"


# ---------------------------------------------------------------------------
# continue_final_message / add_generation_prompt
# ---------------------------------------------------------------------------

def continue_body(content: str) -> dict:
    return chat(user("q"), {"role": "assistant", "content": content},
                continue_final_message=True, add_generation_prompt=False)


def test_continue_final_message_cuts_after_the_final_content(model):
    assert model().render_chat(continue_body("The answer is")) == (
        "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\nThe answer is"
    )


def test_continue_keeps_trailing_space_the_template_kept(model):
    assert model().render_chat(continue_body("The answer is ")).endswith("assistant\nThe answer is ")


def test_continue_drops_trailing_space_the_template_trimmed(model):
    trimming = CHATML.replace("{{ m.content }}", "{{ m.content | trim }}")
    assert model(trimming).render_chat(continue_body("  The answer is \n")).endswith("assistant\nThe answer is")


@pytest.mark.parametrize("template", [CHATML, CHATML.replace("{{ m.content }}", "{{ m.content | trim }}")],
                         ids=["kept", "trimmed"])
@pytest.mark.parametrize("final", ["The answer is", "", " ", "im_end", "  x \n", "q", "The answer is "])
def test_continue_cuts_where_transformers_cuts(model, template, final):
    """Differential, against transformers 5.19 itself (vLLM 0.32's): the cut is at a marker appended to
    the final text, so an empty text, a text the template also prints elsewhere ("q"), or one inside
    the template's own markup ("im_end") cut where vLLM cuts, not at the text's last occurrence."""
    from transformers.utils.chat_template_utils import render_jinja_template

    body = continue_body(final)
    try:
        [theirs] = render_jinja_template(conversations=[body["messages"]], chat_template=template,
                                         continue_final_message=True, add_generation_prompt=False)[0]
    except ValueError:
        theirs = None
    try:
        ours = model(template).render_chat(body)
    except CountError:
        ours = None
    assert ours == theirs


def test_continue_when_template_deletes_the_message_is_rejected(model):
    deleting = CHATML.replace("{{ m.content }}", "{{ m.content[:3] }}")
    with pytest.raises(CountError, match="does not appear"):
        model(deleting).count_chat(continue_body("The answer is"))


@pytest.mark.parametrize("fields", [{"continue_final_message": True},
                                    {"continue_final_message": True, "add_generation_prompt": True}])
def test_continue_with_generation_prompt_is_rejected(model, fields):
    with pytest.raises(CountError, match="not compatible"):
        model().count_chat(chat(user("q"), {"role": "assistant", "content": "a"}, **fields))


def test_generation_prompt_can_be_turned_off(model):
    assert model().render_chat(chat(user("q"), add_generation_prompt=False)) == "<|im_start|>user\nq<|im_end|>\n"


# ---------------------------------------------------------------------------
# Bad field types never leak Python exceptions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": "hello"}, "messages"),
        ({}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": ["hello"]}, "messages[0]"),
        ({"messages": [{"content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        ({"messages": [{"role": "user", "content": [5]}]}, "messages[0].content[0]"),
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]}, "messages[0].content[0].text"),
        ({"messages": [user("x")], "tools": {"a": 1}}, "tools"),
        ({"messages": [user("x")], "tools": ["f"]}, "tools[0]"),
        ({"messages": [user("x")], "tools": [{"type": "function"}]}, "tools[0].function"),
        ({"messages": [user("x")], "tools": [{"function": {"name": 3}}]}, "tools[0].function.name"),
        ({"messages": [user("x")], "chat_template_kwargs": [1]}, "chat_template_kwargs"),
        ({"messages": [user("x")], "add_generation_prompt": "maybe"}, "add_generation_prompt"),
        ({"messages": [user("x")], "reasoning_effort": 3}, "reasoning_effort"),
        ({"messages": [user("x"), {"role": "assistant", "tool_calls": "f()"}]}, "messages[1].tool_calls"),
        ({"messages": [user("x"), {"role": "assistant", "tool_calls": [1]}]}, "tool_calls"),
    ],
)
def test_wrong_field_types_raise_count_error_naming_the_field(model, body, param):
    with pytest.raises(CountError) as caught:
        model().count_chat(body)
    assert caught.value.param == param
    assert caught.value.message


def test_body_that_is_not_an_object_is_rejected(model):
    with pytest.raises(CountError):
        model().count_chat(["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(CountError):
        model().count_completion("prompt")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------
# Template failures and injection
# ---------------------------------------------------------------------------

def test_template_injection_in_content_stays_inert(model):
    payload = "{{ 7 * 7 }}{% for x in range(3) %}X{% endfor %}{{ raise_exception('boom') }}"
    rendered = model().render_chat(chat(user(payload)))
    assert payload in rendered
    assert "49" not in rendered


def test_template_raise_exception_becomes_count_error(model):
    template = "{% if messages[0].role != 'system' %}{{ raise_exception('System message must be first.') }}{% endif %}"
    with pytest.raises(CountError, match=r"System message must be first\."):
        model(template).count_chat(chat(user("q")))


def test_template_type_error_becomes_count_error(model):
    template = ("{% for m in messages %}{% for c in m.tool_calls %}{{ 'x' + c.function.arguments }}"
                "{% endfor %}{% endfor %}")
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    with pytest.raises(CountError, match="can only concatenate"):
        model(template).count_chat(chat({"role": "assistant", "content": "", "tool_calls": [call]}))


def test_sandbox_violation_becomes_count_error(model):
    with pytest.raises(CountError, match="sandbox"):
        model("{{ messages.append(1) }}").count_chat(chat(user("q")))


def test_model_without_chat_template_refuses_chat_but_counts_completions(model):
    tok = model(None)
    with pytest.raises(CountError, match="no chat template"):
        tok.count_chat(chat(user("q")))
    assert tok.count_completion({"prompt": "abc"}) == [3]


# ---------------------------------------------------------------------------
# Template selection and loading
# ---------------------------------------------------------------------------

def test_named_templates_pick_tool_use_when_tools_are_given(model):
    tok = model([{"name": "default", "template": "plain"}, {"name": "tool_use", "template": "tools"}])
    assert tok.render_chat(chat(user("q"))) == "plain"
    tools = [{"type": "function", "function": {"name": "f"}}]
    assert tok.render_chat(chat(user("q"), tools=tools)) == "tools"


def test_chat_template_jinja_wins_over_config(model):
    assert model("from config", jinja_file="from file").render_chat(chat(user("q"))) == "from file"


def test_special_token_text_typed_by_the_user_is_one_token(model):
    # 5 bytes of "a<|im_end|>b" outside the special token: a, b, plus <|im_end|> = 3
    assert model("{{ messages[0].content }}").count_chat(chat(user("a<|im_end|>b"))) == 3


def test_missing_tokenizer_json_is_a_clear_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        load_model_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError):
        load_model_tokenizer(tmp_path / "absent")


def test_broken_template_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="does not compile"):
        make_model(tmp_path, "{% for m in messages %}")


# ---------------------------------------------------------------------------
# Completions
# ---------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("prompt", "counts"),
    [
        ("héllo", [6]),
        (["ab", "cde"], [2, 3]),
        ([5, 6, 7], [3]),
        ([[1, 2], [3]], [2, 1]),
    ],
)
def test_completion_prompt_shapes(model, prompt, counts):
    assert model().count_completion({"prompt": prompt}) == counts


@pytest.mark.parametrize(
    "prompt",
    ["", [], [""], ["a", 1], [1, "a"], [[]], [[1], 2], [True], [-1], {"text": "a"}, 3.5, None],
)
def test_bad_or_empty_completion_prompts_are_rejected(model, prompt):
    with pytest.raises(CountError) as caught:
        model().count_completion({"prompt": prompt})
    assert caught.value.param == "prompt"


def test_post_processor_decides_special_tokens_for_completions_not_chat(model):
    tok = model("{{ messages[0].content }}", bos_in_post_processor=True)
    assert tok.count_completion({"prompt": "ab"}) == [3]  # <s> a b
    assert tok.count_completion({"prompt": "ab", "add_special_tokens": False}) == [2]
    assert tok.count_chat(chat(user("ab"))) == 2
    assert tok.count_chat(chat(user("ab"), add_special_tokens=True)) == 3


# -- proxy.admitted.counting: vLLM's character bound -------------------------------------------------


@pytest.mark.parametrize("name,vllm_factor", [("Qwen--Qwen3-8B", 128), ("Qwen--Qwen3.5-9B", 128),
                                              ("microsoft--Phi-3-mini-4k-instruct", 16)])
def test_the_counter_holds_prompts_to_vllms_factor(name: str, vllm_factor: int) -> None:
    """max(len(tok) for tok in get_vocab()) of the tokenizer vLLM 0.32 loads (its venv's transformers,
    measured on these files) is the factor the counter checks prompts against."""
    from proxy.admitted.counting import max_chars_per_token

    tok = load_model_tokenizer(MODELS / name)
    assert max_chars_per_token(tok) == vllm_factor


def test_the_tokenizers_own_factor_wins_and_the_bound_follows_vllms_rule() -> None:
    from proxy.admitted.counting import char_bound, max_chars_per_token

    class WithFactor:
        max_chars_per_token = 7

    assert max_chars_per_token(WithFactor()) == 7  # type: ignore[arg-type]
    assert char_bound(2048, 128, {}) == 262_144
    assert char_bound(2048, 128, {"truncate_prompt_tokens": 100}) is None   # vLLM truncates instead
    assert char_bound(2048, 128, {"truncate_prompt_tokens": -1}) is None


def _trims(monkeypatch: pytest.MonkeyPatch, count: Any) -> int:
    """How many times `_call_and_trim` hands the heap back around `count()` for a large body."""
    from proxy.admitted import counting

    calls: list[int] = []
    monkeypatch.setattr(counting, "heap_trimmer", HeapTrimmer(0, 0, trim=lambda: calls.append(1)))
    counting._call_and_trim(count, 1_000_000)
    return len(calls)


def test_a_count_that_encoded_little_does_not_trim_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    """malloc_trim after every turn of a long conversation cost more than counting it: the encode is
    what grows the heap, so a count that encoded only a new turn's pieces leaves the heap as it is
    (until TRIM_EVERY_BYTES of such bodies went by); one that encoded much, or whose encoding is not
    metered (no piece cache), still trims."""
    from proxy.admitted import counting
    from tokenizer_cache import PieceCountCache

    folder = MODELS / "Qwen--Qwen3-8B"
    if not folder.is_dir():
        pytest.skip(f"{folder} is missing")
    monkeypatch.setattr(counting, "TRIM_ABOVE_BYTES", 2000)
    whole = load_model_tokenizer(folder)
    pieces = whole.with_piece_cache(PieceCountCache())
    history = [{"role": "user", "content": f"turn {i}: " + "words of an earlier turn " * 20} for i in range(6)]
    body = {"messages": history}
    assert _trims(monkeypatch, lambda: pieces.count_chat(body)) == 1          # all new: ~3,000 characters
    grown = {"messages": [*history, {"role": "assistant", "content": "short"}]}
    assert _trims(monkeypatch, lambda: pieces.count_chat(grown)) == 0         # only the new turn encoded
    assert _trims(monkeypatch, lambda: whole.count_chat(grown)) == 1          # not metered: unknown
    monkeypatch.setattr(counting, "TRIM_EVERY_BYTES", 2_500_000)               # and after 2.5 bodies that did not
    monkeypatch.setattr(counting, "_untrimmed_bytes", 0)
    assert [_trims(monkeypatch, lambda: pieces.count_chat(grown)) for _ in range(4)] == [0, 0, 0, 1]
