"""tokenizer_cache._responses: a Responses request → the chat request vLLM 0.32 renders for it.

One test per rule of `construct_input_messages`, `construct_tool_dicts` and
`ResponsesRequest.build_chat_params` / `build_tok_params`
(vllm/entrypoints/openai/responses/); whole requests against a real vLLM are
tests/tokenizer_cache/test_surface_corpus.py's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, processors

from tokenizer_cache import CountError, load_model_tokenizer, responses_to_chat


def chat(body: dict[str, Any]) -> dict[str, Any]:
    return responses_to_chat(body)


def call(call_id: str, name: str = "f", arguments: str = "{}", **extra: Any) -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments, **extra}


def test_instructions_and_a_string_input_are_a_system_and_a_user_message() -> None:
    out = chat({"instructions": "Be brief.", "input": "Hi"})
    assert out["messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (out["add_generation_prompt"], out["continue_final_message"], out["add_special_tokens"]) == (
        True, False, True)
    assert chat({"instructions": "", "input": "Hi"})["messages"] == [{"role": "user", "content": "Hi"}]


def test_one_assistant_turn_merges_reasoning_calls_and_text() -> None:
    out = chat({"input": [
        {"role": "user", "content": "q"},
        {"type": "reasoning", "id": "rs", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        call("c1", arguments='{"a":1}'), call("c2", "g", namespace="ns"),
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "x", "annotations": []}]},
        {"type": "function_call_output", "call_id": "c1", "output": "1"}]})
    assert out["messages"][1:] == [
        {"role": "assistant", "reasoning": "think", "tool_calls": [
            {"id": "c1", "function": {"name": "f", "arguments": '{"a":1}'}, "type": "function"},
            {"id": "c2", "function": {"name": "ns__g", "arguments": "{}"}, "type": "function"}], "content": "x"},
        {"role": "tool", "content": "1", "tool_call_id": "c1"}]


def test_text_after_text_starts_a_new_assistant_message_and_reasoning_joins_the_last() -> None:
    out = chat({"input": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"},
                          {"type": "reasoning", "summary": [{"type": "summary_text", "text": "s"}]},
                          {"type": "reasoning", "summary": [{"type": "summary_text", "text": "t"}]}]})
    assert out["messages"] == [{"role": "assistant", "content": "a"},
                               {"role": "assistant", "content": "b", "reasoning": "s"},
                               {"role": "assistant", "reasoning": "t"}]


def test_an_assistant_message_keeps_only_its_first_parts_text() -> None:
    out = chat({"input": [{"role": "assistant", "content": [{"type": "output_text", "text": "one"},
                                                             {"type": "output_text", "text": "two"}]}]})
    assert out["messages"] == [{"role": "assistant", "content": "one"}]


def test_an_input_image_without_detail_gets_auto_as_vllms_request_model_gives_it() -> None:
    image = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    body = {"input": [{"type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, image, {**image, "detail": "low"}]}]}
    [message] = chat(body)["messages"]
    assert [part.get("detail") for part in message["content"]] == [None, "auto", "low"]
    assert "detail" not in body["input"][0]["content"][1]       # the request itself is left as it came


def test_a_custom_tool_call_is_a_call_of_its_one_string_shim() -> None:
    out = chat({"input": [{"type": "custom_tool_call", "call_id": "c", "name": "patch", "input": "diff é"},
                          {"type": "custom_tool_call_output", "call_id": "c", "output": "ok"}]})
    assert out["messages"][0]["tool_calls"][0]["function"] == {"name": "patch", "arguments": '{"input": "diff é"}'}
    assert out["messages"][1] == {"role": "tool", "content": "ok", "tool_call_id": "c"}


def test_a_partial_last_message_is_continued() -> None:
    out = chat({"input": [{"role": "user", "content": "q"},
                          {"type": "message", "role": "assistant", "status": "incomplete",
                           "content": [{"type": "output_text", "text": "Once", "annotations": []}]}]})
    assert (out["add_generation_prompt"], out["continue_final_message"]) == (False, True)


def test_reasoning_effort_sets_enable_thinking_unless_the_client_did() -> None:
    assert chat({"input": "x", "reasoning": {"effort": "low"}})["chat_template_kwargs"] == {
        "reasoning_effort": "low", "enable_thinking": True}
    assert chat({"input": "x", "reasoning": {"effort": "none"},
                 "chat_template_kwargs": {"enable_thinking": True}})["chat_template_kwargs"] == {
        "enable_thinking": True, "reasoning_effort": "none"}
    assert "chat_template_kwargs" not in chat({"input": "x", "reasoning": {"summary": "auto"}})


def test_function_namespace_and_custom_tools_are_shown_other_tools_are_not() -> None:
    out = chat({"input": "x", "tools": [
        {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True},
        {"type": "namespace", "name": "ns", "tools": [{"type": "function", "name": "g", "description": "G"}]},
        {"type": "custom", "name": "c", "description": "C"},
        {"type": "web_search"}, {"type": "tool_search"}]})
    assert [t["function"]["name"] for t in out["tools"]] == ["f", "ns__g", "c"]
    assert out["tools"][0]["function"] == {"name": "f", "description": None, "parameters": {"type": "object"},
                                           "strict": True}
    assert out["tools"][2]["function"]["parameters"]["required"] == ["input"]
    assert "tools" not in chat({"input": "x", "tools": [{"type": "web_search"}]})


@pytest.mark.parametrize("body, param", [
    ({"input": 3}, "input"),
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input"),
    ({"input": [{"type": "reasoning", "encrypted_content": "gAAA"}]}, "input"),
    ({"input": [call("c", arguments=None)]}, "input[0].arguments"),   # type: ignore[arg-type]
    ({}, "input"),
])
def test_what_vllm_refuses_is_refused(body: dict[str, Any], param: str) -> None:
    with pytest.raises(CountError) as info:
        chat(body)
    assert info.value.param == param


def test_the_request_is_never_changed() -> None:
    body = {"input": [{"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]}, call("c")]}
    before = json.dumps(body)
    chat(body)
    assert json.dumps(body) == before


def test_a_post_processor_bos_is_added_again_on_responses_not_on_chat(tmp_path: Path) -> None:
    """vLLM tokenizes a Responses prompt with add_special_tokens=True (TokenizeParams' default):
    with a tokenizer whose post-processor adds <bos> the prompt starts with two.  Measured on
    vLLM 0.32 with the Gemma-3 tokenizer: "hi" counts 11 on /v1/responses, 10 on chat and Messages."""
    vocab = {"<bos>": 0, "<eos>": 1, "hi": 2, "user": 3, ":": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<eos>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.add_special_tokens(["<bos>", "<eos>"])
    tokenizer.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    template = "{{ bos_token }}{% for m in messages %}{{ m.role }} : {{ m.content }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template}), encoding="utf-8")
    model = load_model_tokenizer(tmp_path)
    assert model.count_chat({"messages": [{"role": "user", "content": "hi"}]}) == 4
    assert model.count_messages({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}) == 4
    assert model.count_responses({"input": "hi"}) == 5
