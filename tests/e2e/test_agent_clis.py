"""The real agent CLIs through brimful, against the fake vLLM scripted to make them loop.

Claude Code and Codex (npm packages, `.ci/run` installs them outside the
clone; tests/support/agent_cli.py runs them offline, fresh HOME, empty
directory, timeout) run a session that outgrows `max_model_len`: the fake
answers each turn with a shell tool call whose output (`seq 1 600`, ~2,340
Qwen3 tokens) grows the conversation, as vLLM 0.32 validates and limits it.
Each test shows the same CLI against the fake alone beside it.

The multi-turn sessions are in the slow tier; the fast tier runs each CLI's reading of
brimful's refusal. Skipped when a CLI is not installed, unless BRIMFUL_REQUIRE_CLIENTS is set
(CI), where a missing CLI fails.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support import agent_cli
from tests.support.agent_cli import need
from tests.support.agent_replies import Reply
from tests.support.stack import Stack, running_stack
from tests.support.surface_scenarios import words

MODEL = "tiny-qwen"


# How Codex 0.171's compaction request begins (its last input item: codex-rs core's compact prompt).
CODEX_COMPACTION = "You are performing a CONTEXT CHECKPOINT COMPACTION"


@dataclass
class ShellLoop:
    """Answer the first `calls` turns that offer the CLI's shell tool with a call to it, then "Done.";
    a Codex compaction request with a summary."""

    tool: str
    arguments: dict[str, Any]
    calls: int
    made: int = 0
    compactions: int = 0
    requests: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, surface: str, body: dict[str, Any]) -> Reply:
        self.requests.append(body)
        items = body.get("input") if surface == "responses" else None
        if isinstance(items, list) and items and CODEX_COMPACTION in json.dumps(items[-1]):
            self.compactions += 1
            return Reply("Summary: seq 1 600 ran several times; run it again until six runs are done.")
        offered = [t.get("name") or (t.get("function") or {}).get("name")
                   for t in body.get("tools") or [] if isinstance(t, dict)]
        if self.tool in offered and self.made < self.calls:
            self.made += 1
            return Reply("Running it.", [(self.tool, self.arguments)])
        return Reply("Done.")


@pytest.fixture
def stack_for(qwen3_dir: Path) -> Iterator[Any]:
    opened: list[Any] = []

    def build(max_model_len: int, script: ShellLoop, **config: Any) -> Stack:
        context = running_stack(qwen3_dir, fake_kwargs={"max_model_len": max_model_len, "script": script},
                                timeout=60, **config)
        opened.append(context)
        return context.__enter__()

    yield build
    for context in reversed(opened):
        context.__exit__(None, None, None)


def claude_session(stack_for: Any, max_model_len: int, calls: int, **config: Any) -> tuple[Stack, ShellLoop]:
    script = ShellLoop("Bash", {"command": "seq 1 600", "description": "count"}, calls)
    return stack_for(max_model_len, script, **config), script


PROMPT = "Count to six hundred with the Bash tool, several times."


@pytest.mark.slow       # a whole session of a real CLI (node): 2-4 s of CPU each
def test_claude_code_fails_against_vllm_alone_and_completes_a_session_that_outgrows_the_context(stack_for: Any,
                                                                                                 ) -> None:
    need("claude")
    stack, script = claude_session(stack_for, 26752, 6)
    direct = agent_cli.run_claude(stack.fake.base_url, MODEL, PROMPT, args=("--allowedTools", "Bash")).json()
    assert direct["is_error"] and "cannot be greater than max_model_len" in direct["result"]   # 32000 > 26752
    assert script.made == 0

    through = agent_cli.run_claude(stack.base_url, MODEL, PROMPT, args=("--allowedTools", "Bash")).json()
    assert (through["is_error"], through["result"]) == (False, "Done.")
    assert script.made == 6                     # every tool call of the session ran
    assert stack.recorder is not None
    records = stack.recorder.records
    refused = [i for i, r in enumerate(records) if r.action == "rejected"]
    assert refused and all(records[i].error_code == "context_length_exceeded" for i in refused)
    for i in refused:       # Claude Code compacted on each refusal: its next request is shorter
        assert records[i + 1].prompt_tokens is not None and records[i].prompt_tokens is not None
        assert records[i + 1].prompt_tokens < records[i].prompt_tokens
    granted = [r.granted_max_tokens for r in records if r.action == "clamped"]
    assert granted and min(g for g in granted if g is not None) >= 3000       # no slivers


def test_claude_code_reports_prompt_too_long_on_brimfuls_refusal(stack_for: Any) -> None:
    """At 18,752 its ~18.8k-token first request leaves less than the floor: the refusal in
    Anthropic's words makes Claude Code report prompt_too_long with brimful's numbers."""
    need("claude")
    stack, _ = claude_session(stack_for, 18752, 1)
    direct = agent_cli.run_claude(stack.fake.base_url, MODEL, PROMPT).json()
    assert (direct["is_error"], direct["terminal_reason"]) == (True, "completed")
    assert direct["result"].startswith("API Error: 400")
    through = agent_cli.run_claude(stack.base_url, MODEL, PROMPT).json()
    assert (through["is_error"], through["terminal_reason"]) == (True, "prompt_too_long")
    assert through["result"].startswith("Prompt is too long")
    assert f"(limit {18752 - 18752 // 8})" in through["result"]       # the longest prompt that leaves the floor


def codex_loop(calls: int) -> ShellLoop:
    return ShellLoop("exec_command", {"cmd": "seq 1 600"}, calls)


def test_codex_shows_brimfuls_refusal_of_a_turn_with_the_setting_that_makes_it_compact(stack_for: Any) -> None:
    """A Codex turn (its x-codex-turn-metadata) is refused with a code Codex 0.171 does not take
    for its window running out (proxy.admitted.codex): it shows the answer as vLLM's own 400,
    and keeps its usage, so its next turn compacts."""
    need("codex")
    script = codex_loop(6)
    stack = stack_for(16384, script)
    direct = agent_cli.run_codex(stack.fake.base_url + "/v1", MODEL, PROMPT)
    assert direct.returncode != 0 and "ran out of room" not in direct.stdout     # vLLM's `code: 400`
    assert "exceeds this limit" in direct.stdout
    script.made = 0
    through = agent_cli.run_codex(stack.base_url + "/v1", MODEL, PROMPT)
    assert through.returncode != 0 and "ran out of room" not in through.stdout
    shown = [e["message"] for e in through.events() if e.get("type") == "error"]
    assert shown and json.loads(shown[-1])["error"]["code"] == "prompt_too_long"
    assert "its config.toml sets model_context_window = 16384" in shown[-1]
    assert stack.recorder is not None and stack.recorder.records[-1].error_code == "context_length_exceeded"


@pytest.mark.slow       # two Codex sessions of seven and eleven requests: ~40 s on 2 shared cores
def test_codex_compacts_within_a_turn_when_its_config_names_the_context_window(stack_for: Any) -> None:
    """Codex compacts mid-turn once the usage a response reports reaches 90 % of its
    `model_context_window`; without it (an unknown local model) it never compacts, and the turn
    that outgrows max_model_len ends on brimful's refusal. What a Codex user must set."""
    need("codex")
    script = codex_loop(6)
    stack = stack_for(16384, script)
    refused = agent_cli.run_codex(stack.base_url + "/v1", MODEL, PROMPT)
    assert "model_context_window = 16384" in refused.stdout and script.compactions == 0
    assert stack.recorder is not None
    before = len(stack.recorder.records)
    script.made = 0
    run = agent_cli.run_codex(stack.base_url + "/v1", MODEL, PROMPT, context_window=16384)
    assert run.returncode == 0, run.stdout[-2000:]
    assert '"type":"agent_message","text":"Done."' in run.stdout and script.made == 6
    assert script.compactions >= 1
    records = stack.recorder.wait_for(before + 6 + 1 + script.compactions)[before:]
    assert not [r for r in records if r.action == "rejected"]
    assert all(r.prompt_tokens is not None and r.prompt_tokens < 16384 for r in records)
    assert all(r.upstream_prompt_tokens == r.prompt_tokens for r in records)     # counted exactly
    assert sum(r.prompt_tokens or 0 for r in records) > 2 * 16384                # the session outgrew the context


CODEX_WINDOW = 31_000


def codex_session(base_url: str, session: Path, sizes: list[int]) -> list[agent_cli.Run]:
    """One `codex exec` (then `codex exec resume --last`) per turn, each a user prompt of about
    `size` Qwen3 tokens, with `model_context_window` = max_model_len (docs/agents.md)."""
    return [agent_cli.run_codex(base_url + "/v1", MODEL, f"Turn {i}: answer Done. {words(size)}",
                                context_window=CODEX_WINDOW, session=session, resume=i > 0)
            for i, size in enumerate(sizes)]


@pytest.mark.slow       # two sessions of six `codex exec` runs: ~5 s at load 2 on 2 shared cores
@pytest.mark.parametrize("jump", [8000, 14000])
def test_codex_compacts_after_brimfuls_refusal_of_a_turn_at_least_as_after_vllms_own(
        stack_for: Any, tmp_path: Path, jump: int) -> None:
    """Three turns fit; the fourth jumps past max_model_len from below Codex's 90 % compaction mark,
    and fails alone and through brimful alike; Codex 0.171 then compacts before the fifth.

    Jumping 8,000 tokens, its compaction request fits: the sessions are the same. Jumping 14,000,
    the compaction request itself (the history without the tools) is too long: vLLM's own 400
    fails it, and every compaction after it, so the session is stuck; brimful's refusal of it
    keeps OpenAI's `context_length_exceeded`, on which Codex drops its oldest items and sends it
    again, and the session goes on. (Before brimful worded a turn's refusal for Codex, Codex reset
    its usage on it and never compacted: the fifth and sixth turns were refused too.)"""
    need("codex")
    script = codex_loop(0)
    stack = stack_for(CODEX_WINDOW, script)
    sizes = [5000, 5000, 5000, jump, 20, 20]
    alone = codex_session(stack.fake.base_url, tmp_path / "alone", sizes)
    compactions_alone = script.compactions
    through = codex_session(stack.base_url, tmp_path / "through", sizes)
    assert [run.returncode for run in through] == [0, 0, 0, 1, 0, 0]
    assert agent_cli.codex_compactions(tmp_path / "through") == script.compactions - compactions_alone == 1
    if jump == 8000:
        assert [run.returncode for run in alone] == [0, 0, 0, 1, 0, 0] and compactions_alone == 1
    else:
        assert [run.returncode for run in alone] == [0, 0, 0, 1, 1, 1] and compactions_alone == 0
    assert stack.recorder is not None
    records = stack.recorder.records
    trims = len(records) - 7        # compaction requests refused, each sent again one item shorter
    assert (trims == 0) if jump == 8000 else (trims >= 1)
    # three turns, the fourth refused, [its compaction refused while too long], the compaction, two turns
    assert [r.action for r in records] == ["pass"] * 3 + ["rejected"] * (1 + trims) + ["pass"] * 3
    assert all(r.error_code == "context_length_exceeded" for r in records if r.action == "rejected")
    assert all(r.upstream_prompt_tokens == r.prompt_tokens for r in records if r.action == "pass")


@pytest.mark.slow       # a whole session of a real CLI (node): 2-4 s of CPU each
def test_claude_code_session_goes_on_without_a_refusal_when_it_asks_for_trimming(stack_for: Any) -> None:
    """ANTHROPIC_CUSTOM_HEADERS sends x-brimful-trim: the oldest tool rounds go instead of a refusal."""
    need("claude")
    stack, script = claude_session(stack_for, 26752, 6)
    run = agent_cli.run_claude(stack.base_url, MODEL, PROMPT, args=("--allowedTools", "Bash"),
                               extra_env={"ANTHROPIC_CUSTOM_HEADERS": "x-brimful-trim: oldest"}).json()
    assert (run["is_error"], run["result"], script.made) == (False, "Done.", 6)
    assert stack.recorder is not None
    records = stack.recorder.records
    assert not [r for r in records if r.action == "rejected"]
    trimmed = [r for r in records if r.action == "trimmed"]
    assert trimmed and all((r.trimmed_messages or 0) >= 2 and (r.trimmed_tokens or 0) > 0 for r in trimmed)
    assert all(r.upstream_prompt_tokens == r.prompt_tokens for r in records)    # counted exactly after trimming
    assert all((r.granted_max_tokens or 0) >= 3000 for r in trimmed)              # with the floor


@pytest.mark.slow       # a whole session of a real CLI (node): 2-4 s of CPU each
def test_codex_session_completes_when_its_provider_asks_for_trimming(stack_for: Any) -> None:
    """Codex sends no max_output_tokens; its provider's http_headers carry x-brimful-trim."""
    need("codex")
    script = codex_loop(6)
    stack = stack_for(16384, script)
    run = agent_cli.run_codex(stack.base_url + "/v1", MODEL, PROMPT, headers={"x-brimful-trim": "oldest"})
    assert run.returncode == 0, run.stdout[-2000:]
    assert '"type":"agent_message","text":"Done."' in run.stdout and script.made == 6
    assert stack.recorder is not None
    records = stack.recorder.records
    assert not [r for r in records if r.action == "rejected"]
    trimmed = [r for r in records if r.action == "trimmed"]
    assert trimmed and all(r.upstream_prompt_tokens == r.prompt_tokens for r in records)
    assert all(r.prompt_tokens is not None and r.prompt_tokens < 16384 for r in trimmed)


@pytest.mark.slow       # a whole session of a real CLI (node): 2-4 s of CPU each
def test_ai_sdk_tool_loop_through_brimful_refuses_in_openais_words_or_goes_on_when_trimming(stack_for: Any) -> None:
    """The AI SDK (`generateText` with a tool, @ai-sdk/openai-compatible: chat completions) asks
    maxOutputTokens 16,384 of an 8,192 model: vLLM alone refuses its first step. Through brimful
    the steps are clamped until the prompt itself no longer fits, then its APICallError carries
    `code: context_length_exceeded`; asking for trimming, the loop runs to its end."""
    need("ai")
    script = ShellLoop("shell", {"cmd": "seq 1 600"}, 6)
    stack = stack_for(8192, script)
    direct = agent_cli.run_ai_sdk(stack.fake.base_url + "/v1", MODEL, 16384)
    assert (direct["error"], direct["code"], direct["toolCalls"]) == ("AI_APICallError", 400, 0)
    script.made = 0
    refused = agent_cli.run_ai_sdk(stack.base_url + "/v1", MODEL, 16384)
    assert (refused["error"], refused["statusCode"], refused["code"]) == ("AI_APICallError", 400,
                                                                         "context_length_exceeded")
    assert refused["toolCalls"] >= 3
    script.made = 0
    trimmed = agent_cli.run_ai_sdk(stack.base_url + "/v1", MODEL, 16384, trim="oldest")
    assert (trimmed["text"], trimmed["toolCalls"]) == ("Done.", 6)
    assert stack.recorder is not None
    assert any(r.action == "trimmed" for r in stack.recorder.records)


@pytest.mark.slow       # an opencode session of ten requests: ~40 s on 2 shared cores
def test_opencode_session_that_outgrows_the_context_is_clamped_then_compacts_by_itself(stack_for: Any) -> None:
    """opencode 1.18 (`opencode run`, @ai-sdk/openai-compatible: chat completions) asks `max_tokens`
    = its model's `limit.output` (4,096) on every step. Near the end of the context brimful
    clamps what is left exactly (as vLLM 0.32 would), and opencode compacts by its `limit.context`
    (a request without tools, then a shorter conversation): all six tool calls run."""
    need("opencode")
    script = ShellLoop("bash", {"command": "seq 1 600", "description": "count"}, 6)
    stack = stack_for(16384, script)
    run = agent_cli.run_opencode(stack.base_url + "/v1", MODEL, PROMPT, context=16384, output=4096)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    assert '"text":"Done."' in run.stdout and script.made == 6
    assert stack.recorder is not None
    records = stack.recorder.records
    assert not [r for r in records if r.action == "rejected"]
    assert all(r.upstream_prompt_tokens == r.prompt_tokens for r in records)     # counted exactly
    clamped = [r for r in records if r.action == "clamped"]
    assert clamped and all(r.prompt_tokens is not None and r.granted_max_tokens == 16384 - r.prompt_tokens
                           for r in clamped)
    prompts = [r.prompt_tokens or 0 for r in records]
    peak = prompts.index(max(prompts))
    assert min(prompts[peak:]) < max(prompts) // 2          # it compacted after the peak
    assert any(not body.get("tools") for body in script.requests[1:])    # the compaction request
