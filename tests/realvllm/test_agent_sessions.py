"""Real agent CLI sessions that outgrow the context, against a REAL vLLM 0.32, through brimful and alone.

The model is tests/realvllm/tiny_reply_model.py's: the tiny Qwen3 with the real
tokenizer whose weights answer "Done." and stop (EOS), at any temperature, so
every turn ends the way a real model's would (a reply cut by `max_tokens` is
something else to Claude Code: "response exceeded the 32000 output token
maximum"). Each session is a run of the CLI and then runs that continue it
(`claude -p --continue`, `codex exec resume --last`, `opencode run --continue`)
in one folder, each turn a long user prompt, so the conversation grows past
`max_model_len`. Every test runs the same CLI against vLLM alone beside it.

`MAX_MODEL_LEN` 31,000: Claude Code's first request (its system prompt and 24
tools) is ~18,750 Qwen3 tokens, brimful's Messages floor 3,000, which leaves
~9,000 tokens of conversation; and it is below the 32,000 `max_tokens` Claude
Code asks, which vLLM alone refuses on any smaller context.

One server for the module (~80 s to start; like every real vLLM of the tests,
once no other process on the machine serves one: tests/realvllm/server.py). CLIs missing:
skipped, failed under BRIMFUL_REQUIRE_CLIENTS (tests/support/agent_cli.py).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from proxy.recording.record import LengthRecord
from tests.realvllm.fixture import QWEN3_TOKENIZER_DIR, RealVllm, setup_or_skip
from tests.realvllm.locking import exclusive_lock
from tests.realvllm.server import SERVED_MODEL_NAME, running_server
from tests.realvllm.test_surfaces import through
from tests.realvllm.tiny_reply_model import REPLY, chain, ensure_reply_model
from tests.realvllm.venv import SetupError, cache_root, ensure_vllm_venv
from tests.support import agent_cli
from tests.support.agent_cli import Run, need
from tests.support.surface_scenarios import Target, words

MAX_MODEL_LEN = 31_000
MESSAGES_FLOOR = 3_000          # brimful's default floor on /v1/messages (docs/agents.md)
START_TIMEOUT_S = 600.0
realvllm = pytest.mark.realvllm      # on each test but the pure one: the conftest makes them slow


def test_a_reply_whose_tokens_repeat_is_not_a_first_order_chain() -> None:
    assert chain([17453, 13], 151645) == [(0, 17453), (1, 13), (2, 151645)]
    with pytest.raises(ValueError, match="repeat"):
        chain([13, 17453, 13], 151645)


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealVllm]:
    """vLLM 0.32 serving the reply model as `tiny-qwen` at MAX_MODEL_LEN."""
    log_dir = tmp_path_factory.mktemp("realvllm-agent-sessions")
    with contextlib.ExitStack() as stack:
        with setup_or_skip():
            venv = ensure_vllm_venv(log_path=log_dir / "vllm-venv-install.log")
            if not QWEN3_TOKENIZER_DIR.is_dir():
                raise SetupError(f"the Qwen3 tokenizer files are missing: {QWEN3_TOKENIZER_DIR}")
            model_dir = cache_root() / "tiny-qwen3-reply"
            with exclusive_lock(cache_root() / ".tiny-qwen3-reply.lock"):
                ensure_reply_model(model_dir, QWEN3_TOKENIZER_DIR, venv.python, log_dir / "build.log")
            server = stack.enter_context(running_server(venv.python, model_dir, log_dir / "vllm-server.log",
                                                        timeout=START_TIMEOUT_S, max_model_len=MAX_MODEL_LEN))
        yield RealVllm(base_url=server.base_url, model=SERVED_MODEL_NAME, max_model_len=MAX_MODEL_LEN,
                       tokenizer_dir=model_dir, log_path=server.log_path, pid=server.process.pid,
                       timings={"startup_s": server.startup_seconds})


@pytest.fixture
def target(vllm: RealVllm) -> Iterator[Target]:
    """brimful in front of it, with its own length records (brimful reads the tokenizer from vLLM's model root)."""
    yield from through(vllm)


def turn(number: int, size: int) -> str:
    """A user prompt of about `size` Qwen3 tokens."""
    return f"Turn {number}: answer {REPLY} {words(size)}"


def served(records: list[LengthRecord]) -> list[LengthRecord]:
    return [r for r in records if r.action != "rejected"]


def exact(records: list[LengthRecord]) -> bool:
    """brimful forwarded exactly what vLLM counted (its usage.prompt_tokens) on every served request."""
    return all(r.prompt_tokens is not None and r.upstream_prompt_tokens == r.prompt_tokens for r in served(records))


def summary(name: str, records: list[LengthRecord], started: float, **figures: Any) -> None:
    """The figures docs/agents.md quotes (shown with `pytest -s`): each request's action and prompt
    tokens (and the completion limit granted, or the items and tokens trimmed), then the totals."""
    actions = [str(r.action) for r in records]
    prompts = [r.prompt_tokens or 0 for r in records]
    steps = " ".join(f"{r.action}:{r.prompt_tokens}" + (f"/{r.granted_max_tokens}" if r.action == "clamped" else "")
                     + (f"(-{r.trimmed_messages}:{r.trimmed_tokens})" if r.action == "trimmed" else "")
                     for r in records)
    print(f"\n{name}: {steps}\n  {len(records)} requests, {actions.count('clamped')} clamped, "
          f"{actions.count('trimmed')} trimmed, {actions.count('rejected')} refused, {sum(prompts)} prompt tokens; "
          f"{figures}; {time.monotonic() - started:.0f} s")


@realvllm
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_reply_model_answers_done_and_stops_by_itself(vllm: RealVllm, temperature: float) -> None:
    chat = openai.OpenAI(base_url=vllm.openai_base_url, api_key="x", max_retries=0, timeout=120)
    for size in (1, 20_000):
        answer = chat.chat.completions.create(model=vllm.model, temperature=temperature, max_tokens=1000,
                                              messages=[{"role": "user", "content": words(size)}])
        assert answer.usage is not None
        assert (answer.choices[0].message.content, answer.choices[0].finish_reason,
                answer.usage.completion_tokens) == (REPLY, "stop", 3)        # "Done", ".", <|im_end|>
    message = anthropic.Anthropic(base_url=vllm.base_url, api_key="x", max_retries=0, timeout=120).messages.create(
        model=vllm.model, max_tokens=1000, messages=[{"role": "user", "content": "Hi"}],
        extra_body={"temperature": temperature})
    assert ([block.text for block in message.content if block.type == "text"], message.stop_reason) == (
        [REPLY], "end_turn")


CLAUDE_TURNS = [2500] * 8


@realvllm
def test_claude_code_session_goes_on_through_brimful_where_vllm_alone_refuses_its_first_turn(
        vllm: RealVllm, target: Target, tmp_path: Path) -> None:
    """Claude Code asks max_tokens 32,000 on every turn. vLLM alone refuses the first; through brimful
    each turn is clamped to the room left until the prompt leaves less than the floor, then refused
    in Anthropic's words: Claude Code compacts (its transcript's compact_boundary) and the turn is
    served from the summary. Every turn ends "Done."."""
    need("claude")
    started = time.monotonic()
    direct = agent_cli.run_claude(vllm.base_url, vllm.model, turn(0, CLAUDE_TURNS[0]),
                                  session=tmp_path / "alone").json()
    assert direct["is_error"] and direct["result"].startswith("API Error: 400")
    assert f"max_completion_tokens=32000 cannot be greater than max_model_len={MAX_MODEL_LEN}" in direct["result"]

    session = tmp_path / "through"
    results = [agent_cli.run_claude(target.brimful, vllm.model, turn(i, size), session=session,
                                    args=("--continue",) if i else ()).json()
               for i, size in enumerate(CLAUDE_TURNS)]
    assert [(r["is_error"], r["result"]) for r in results] == [(False, REPLY)] * len(CLAUDE_TURNS)
    records = target.recorder.records
    refused = [i for i, r in enumerate(records) if r.action == "rejected"]
    assert len(refused) >= 2, [(r.action, r.prompt_tokens) for r in records]
    for i in refused:
        assert records[i].error_code == "context_length_exceeded"
        assert (records[i].prompt_tokens or 0) > MAX_MODEL_LEN - MESSAGES_FLOOR       # less than the floor left
        assert records[i + 1].action == "clamped"                                     # Claude Code went on
    compactions = agent_cli.claude_compactions(session)
    assert len(compactions) == len(refused) and {c.get("trigger") for c in compactions} == {"auto"}
    assert exact(records)
    assert [(r.action, r.prompt_tokens, r.granted_max_tokens, r.finish_reasons) for r in served(records)
            if not (r.action == "clamped" and r.granted_max_tokens == MAX_MODEL_LEN - (r.prompt_tokens or 0)
                    and r.granted_max_tokens >= MESSAGES_FLOOR and r.finish_reasons == ["stop"])] == []
    summary("Claude Code", records, started, turns=len(results), compactions=len(compactions))


CODEX_TURNS = [5000, 5000, 5000, 8000, 20, 20]
CODEX_DONE = '"type":"agent_message","text":"Done."'


def codex_session(base_url: str, session: Path, sizes: list[int] | None = None,
                  headers: dict[str, str] | None = None) -> list[Run]:
    """Codex with `model_context_window` = the served max_model_len (docs/agents.md), one turn a run."""
    return [agent_cli.run_codex(base_url + "/v1", SERVED_MODEL_NAME, turn(i, size), context_window=MAX_MODEL_LEN,
                                headers=headers, session=session, resume=i > 0)
            for i, size in enumerate(sizes or CODEX_TURNS)]


@realvllm
def test_codex_session_compacts_after_the_refused_turn_through_brimful_as_against_vllm_alone(
        vllm: RealVllm, target: Target, tmp_path: Path) -> None:
    """Three turns fit; the fourth (an 8,000-token prompt) jumps past max_model_len from below
    Codex's 90 % compaction mark, so Codex sends it and it fails, alone and through brimful alike;
    the next `codex exec resume` compacts first and the session goes on, alone and through brimful.

    brimful refuses a Codex turn with a code Codex 0.171 does not take for its window running out
    (proxy.admitted.codex): on `context_length_exceeded` it marks its usage full in a way that
    leaves its last request's usage at 0 once the session's summed usage is past the window, and
    did not compact (the 5th and 6th were refused too). With `x-brimful-trim: oldest` in the
    provider's http_headers every turn is served, trimmed instead."""
    need("codex")
    started = time.monotonic()
    alone = codex_session(vllm.base_url, tmp_path / "alone")
    assert [run.returncode for run in alone] == [0, 0, 0, 1, 0, 0]
    assert "maximum context length is 31000 tokens" in alone[3].stdout and "ran out of room" not in alone[3].stdout
    assert all(CODEX_DONE in run.stdout for i, run in enumerate(alone) if i != 3)
    compactions_alone = agent_cli.codex_compactions(tmp_path / "alone")
    assert compactions_alone >= 1

    through = codex_session(target.brimful, tmp_path / "through")
    assert [run.returncode for run in through] == [0, 0, 0, 1, 0, 0]
    assert f"its config.toml sets model_context_window = {MAX_MODEL_LEN}" in through[3].stdout
    assert all(CODEX_DONE in run.stdout for i, run in enumerate(through) if i != 3)
    assert agent_cli.codex_compactions(tmp_path / "through") == compactions_alone
    records = list(target.recorder.records)
    # three turns, the fourth refused, the compaction request, the fifth and sixth turns
    assert [r.action for r in records] == ["pass"] * 3 + ["rejected"] + ["pass"] * 3 and exact(records)
    assert records[3].error_code == "context_length_exceeded" and (records[3].prompt_tokens or 0) > MAX_MODEL_LEN
    assert all(r.error_code is None for r in served(records))       # every answer delivered whole

    trimmed = codex_session(target.brimful, tmp_path / "trimmed", headers={"x-brimful-trim": "oldest"})
    assert all(run.returncode == 0 and CODEX_DONE in run.stdout for run in trimmed)
    records = target.recorder.records[len(records):]
    assert not [r for r in records if r.action == "rejected"] and exact(records)
    assert [r.action for r in records[3:]] == ["trimmed"] * 3
    assert all((r.prompt_tokens or 0) <= MAX_MODEL_LEN and (r.trimmed_tokens or 0) > 0 for r in records[3:])
    summary("Codex", target.recorder.records, started, compactions_alone=compactions_alone,
            compactions_through=agent_cli.codex_compactions(tmp_path / "through"))


@realvllm
def test_codex_compaction_too_long_for_the_context_fails_against_vllm_alone_and_is_trimmed_through_brimful(
        vllm: RealVllm, target: Target, tmp_path: Path) -> None:
    """The fourth turn jumps 14,000 tokens: Codex's compaction request before the fifth (the history,
    without the tools) is too long itself. vLLM's own 400 fails it, every turn after it does the
    same, and the session is stuck; brimful refuses it with OpenAI's `context_length_exceeded`,
    on which Codex drops its oldest items and sends it again, until it fits: the session goes on."""
    need("codex")
    started = time.monotonic()
    sizes = [*CODEX_TURNS[:3], 14_000, *CODEX_TURNS[4:]]
    alone = codex_session(vllm.base_url, tmp_path / "alone", sizes)
    assert [run.returncode for run in alone] == [0, 0, 0, 1, 1, 1]
    assert agent_cli.codex_compactions(tmp_path / "alone") == 0
    through = codex_session(target.brimful, tmp_path / "through", sizes)
    assert [run.returncode for run in through] == [0, 0, 0, 1, 0, 0]
    assert agent_cli.codex_compactions(tmp_path / "through") == 1
    records = target.recorder.records
    trims = len(records) - 7          # compaction requests refused, each sent again shorter
    assert trims >= 1 and [r.action for r in records] == ["pass"] * 3 + ["rejected"] * (1 + trims) + ["pass"] * 3
    assert [r.prompt_tokens or 0 for r in records[4:4 + trims]] == sorted(
        (r.prompt_tokens or 0 for r in records[4:4 + trims]), reverse=True)      # shorter each time
    assert exact(records)
    summary("Codex, a compaction too long", records, started, trims=trims)


OPENCODE_TURNS = [4000, 4000, 4000, 6000, 6000, 4000, 4000]
OPENCODE_OUTPUT = 4096


def opencode_session(base_url: str, session: Path) -> list[Run]:
    """opencode with its model's `limit` = the served max_model_len and an output of 4,096 (sent as max_tokens)."""
    return [agent_cli.run_opencode(base_url + "/v1", SERVED_MODEL_NAME, turn(i, size), context=MAX_MODEL_LEN,
                                   output=OPENCODE_OUTPUT, session=session, resume=i > 0)
            for i, size in enumerate(OPENCODE_TURNS)]


def overflow_errors(run: Run) -> list[str]:
    return [event["error"]["data"]["message"] for event in run.events()
            if event.get("type") == "error" and event["error"].get("name") == "ContextOverflowError"]


def answered(run: Run) -> bool:
    texts = [event["part"].get("text") for event in run.events() if event.get("type") == "text"]
    return bool(texts) and texts[-1] == REPLY


@realvllm
def test_opencode_session_compacts_on_overflow_and_by_its_limit_alone_and_through_brimful(
        vllm: RealVllm, target: Target, tmp_path: Path) -> None:
    """The fifth turn jumps past max_model_len: opencode 1.18 reads vLLM's own 400 and brimful's
    refusal alike as a ContextOverflowError, compacts and answers; the seventh leaves less than its
    4,096 output, which vLLM 0.32 and brimful clamp alike, and opencode then compacts by its
    `limit.context`. Through brimful the session is the same, counted exactly."""
    need("opencode")
    started = time.monotonic()
    for base_url, name in ((vllm.base_url, "alone"), (target.brimful, "through")):
        runs = opencode_session(base_url, tmp_path / name)
        assert all(answered(run) for run in runs), name
        assert [bool(overflow_errors(run)) for run in runs] == [False] * 4 + [True] + [False] * 2, name
        assert agent_cli.opencode_compactions(tmp_path / name) == 2, name
    records = target.recorder.records
    refused = [r for r in records if r.action == "rejected"]
    assert len(refused) == 1 and refused[0].error_code == "context_length_exceeded"
    assert (refused[0].prompt_tokens or 0) > MAX_MODEL_LEN and exact(records)
    clamped = [r for r in records if r.action == "clamped"]
    assert clamped and all(r.granted_max_tokens == MAX_MODEL_LEN - (r.prompt_tokens or 0) for r in clamped)
    summary("opencode", records, started, turns=len(OPENCODE_TURNS))
