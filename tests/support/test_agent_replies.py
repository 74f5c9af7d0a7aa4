"""The fake's scripted replies are cut at the granted limit as a real model's answer is."""

from __future__ import annotations

import json

from tests.support import agent_replies
from tests.support.agent_replies import Reply


def test_a_reply_that_fits_keeps_its_tool_calls_and_one_that_does_not_loses_them() -> None:
    reply = Reply("Running it.", [("Bash", {"command": "seq 1 600"})])
    assert reply.length == 2 + agent_replies.TOOL_CALL_TOKENS
    assert reply.within(22) == (reply, False)
    cut, was_cut = reply.within(21)
    assert was_cut and cut.tool_calls == [] and cut.length == 21


def test_each_surface_says_how_the_reply_ended() -> None:
    call = Reply("", [("sh", {"cmd": "ls"})])
    body = agent_replies.messages_body("m", 10, 100, call, "r")
    assert (body["stop_reason"], body["content"][0]["type"]) == ("tool_use", "tool_use")
    assert agent_replies.messages_body("m", 10, 5, call, "r")["stop_reason"] == "max_tokens"
    chat = agent_replies.chat_body("m", 10, 100, call, "r", 0)
    assert chat["choices"][0]["finish_reason"] == "tool_calls"
    assert json.loads(chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]) == {"cmd": "ls"}
    assert agent_replies.responses_body("m", 10, 5, call, "r", 0)["status"] == "incomplete"
    events = [e for _, e in agent_replies.messages_events("m", 10, 100, call, "r")]
    assert events[0].startswith(b"event: message_start") and events[-1].startswith(b"event: message_stop")
