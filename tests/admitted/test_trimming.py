"""What a trim drops (proxy/admitted/trimming.py is pure): whole turns, calls with their results."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.admitted import trimming


def chat_session() -> list[dict[str, Any]]:
    call = {"id": "c1", "type": "function", "function": {"name": "sh", "arguments": "{}"}}
    return [
        {"role": "system", "content": "s"},                       # 0 kept
        {"role": "user", "content": "first"},                     # 1 kept: the first user message
        {"role": "assistant", "content": None, "tool_calls": [call]},  # 2 ┐ one unit
        {"role": "tool", "tool_call_id": "c1", "content": "out"},      # 3 ┘
        {"role": "assistant", "content": "ok"},                   # 4 ┐ one unit: an answer and the
        {"role": "user", "content": "second"},                    # 5 ┘ next question
        {"role": "assistant", "content": "fine"},                 # 6
        {"role": "developer", "content": "d"},                    # 7 kept
        {"role": "user", "content": "latest"},                    # 8 kept: the latest turn
    ]


def test_chat_units_keep_system_first_user_and_latest_and_pair_calls_with_results() -> None:
    found = trimming.units("chat", chat_session())
    assert [(u.start, u.end, u.droppable) for u in found] == [
        (0, 1, False), (1, 2, False), (2, 4, True), (4, 6, True), (6, 7, True), (7, 8, False), (8, 9, False)]


def test_dropping_any_unit_keeps_the_roles_alternating() -> None:
    """Gemma's template and mistral-common refuse two user turns in a row, or a tool result after a
    user turn: a unit runs from an assistant turn to the next, so the roles around it are unchanged."""
    history = [{"role": "user", "content": "first"}]
    for i in range(4):
        history += [{"role": "assistant", "content": f"a{i}"}, {"role": "user", "content": f"q{i}"}]
    plan = trimming.plan("chat", {"messages": history}, "middle")
    assert plan is not None
    for k in range(1, len(plan.order) + 1):
        roles = [m["role"] for m in plan.without(history, k)]
        assert roles == ["user", "assistant"] * ((len(roles) - 1) // 2) + ["user"]


def test_oldest_drops_from_the_start_and_middle_from_the_centre_outwards() -> None:
    body = {"messages": chat_session()}
    oldest = trimming.plan("chat", body, "oldest")
    middle = trimming.plan("chat", body, "middle")
    assert oldest is not None and middle is not None
    assert oldest.order == (2, 3, 4)
    assert middle.order == (3, 2, 4)
    kept = oldest.without(body["messages"], 1)
    assert [m["role"] for m in kept] == ["system", "user", "assistant", "user", "assistant", "developer", "user"]
    assert oldest.items_dropped(1) == 2                  # the call and its result went together
    assert [m.get("content") for m in middle.without(body["messages"], 2)] == ["s", "first", "fine", "d", "latest"]


def test_messages_tool_results_go_with_their_tool_use() -> None:
    messages = [
        {"role": "user", "content": "task"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t2", "name": "Bash", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t2", "content": "y"}]},
    ]
    found = trimming.units("messages", messages)
    assert [(u.start, u.end, u.droppable) for u in found] == [(0, 1, False), (1, 3, True), (3, 5, False)]


def test_responses_truncation_auto_drops_whole_rounds_from_the_start() -> None:
    """OpenAI drops from the start; a round at a time, so what is left begins with a user turn."""
    items = [
        {"role": "developer", "content": "d"},
        {"role": "user", "content": "first"},
        {"type": "reasoning", "id": "r", "summary": []},
        {"type": "function_call", "call_id": "c", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "out"},
        {"role": "user", "content": "latest"},
    ]
    auto = trimming.units("responses", items, keep_first_user=False)
    assert [(u.start, u.end, u.droppable) for u in auto] == [(0, 1, False), (1, 5, True), (5, 6, False)]
    # Kept first user: the reasoning, its call, the output and the latest question are one (the latest) unit.
    assert [(u.start, u.end, u.droppable) for u in trimming.units("responses", items)] == [
        (0, 1, False), (1, 2, False), (2, 6, False)]


def test_a_result_stays_with_its_call_across_turns() -> None:
    items = [
        {"role": "user", "content": "first"},
        {"type": "function_call", "call_id": "c1", "name": "sh", "arguments": "{}"},
        {"role": "user", "content": "also"},
        {"type": "function_call", "call_id": "c2", "name": "sh", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "1"},
        {"type": "function_call_output", "call_id": "c2", "output": "2"},
        {"role": "user", "content": "more"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "latest"},
    ]
    assert [(u.start, u.end, u.droppable) for u in trimming.units("responses", items)] == [
        (0, 1, False), (1, 7, True), (7, 9, False)]


def test_nothing_to_drop_is_no_plan() -> None:
    assert trimming.plan("chat", {"messages": [{"role": "user", "content": "only"}]}, "oldest") is None
    assert trimming.plan("responses", {"input": "a string"}, "oldest") is None
    two = {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}
    assert trimming.plan("chat", two, "oldest") is None


@pytest.mark.parametrize(("header", "configured", "expected"), [
    (None, "off", None), (None, "middle", "middle"), (b"oldest", "off", "oldest"), (b" Middle ", "oldest", "middle"),
    (b"off", "oldest", None)])
def test_the_header_wins_over_the_models_configuration(header: bytes | None, configured: str,
                                                       expected: str | None) -> None:
    assert trimming.requested_strategy(header, configured) == expected


def test_an_unknown_strategy_is_refused() -> None:
    with pytest.raises(ValueError):
        trimming.requested_strategy(b"newest", "off")
