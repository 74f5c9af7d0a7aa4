"""Counting a chat from the iterations of its message loop rendered before (`_render_memo`) equals a full count.

The claim is exactness: an agent session that grows, is resent, edited and
truncated, counted through one shared piece cache (so through the memo, the
skipped iterations and the counts stored at their boundaries), must give at
every request the count of the same request on a model with no cache at all,
refusals included.  Checked on randomised sessions for every family of the
corpora (tests/support/families.py), on the corpora themselves in one
sequence through one cache, on the look-ahead cases of the templates (Qwen3
dropping the reasoning before the last user query, the generation prompt,
tool results grouped, Gemma 3's `loop_messages`, a Llama 3 template's
`messages[1:]`, `loop.nextitem`), and the rewritten template's render against
the template's own.
"""

from __future__ import annotations

import copy
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.corpus.targets import TARGETS
from tests.support.corpus import CASES as SHARED_CASES
from tests.support.corpus import SHARED, count_case
from tests.support.families import FAMILIES, family_folder
from tests.tokenizer_cache.test_family_corpus import CASES as FAMILY_CASES
from tests.tokenizer_cache.test_prefix_count import _counts
from tokenizer_cache import CountError, ModelTokenizer, PieceCountCache, TokenizerCache, _piece_count
from tokenizer_cache._piece_cache import MAX_VARIANTS
from tokenizer_cache._render import render
from tokenizer_cache._render_memo import render as memo_render

QWEN3 = SHARED / "models" / "Qwen--Qwen3-8B"
_WORDS = ["the", "agent", "reads", "file", "and", "runs", "tests", "again", "모델", "서버", "🐶", "naïve",
          "def", "f(x):", "\n", "\n\n", "  ", "\t", "<|im_start", "<|im_end|>", "<think>", "</think>",
          "<start_of_turn>", "<|eot_id|>", "<｜User｜>", "<|end|>", "[INST]", "{\"a\": 1}", "x" * 40,
          "<tool_response>", "</tool_response>"]
TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file.", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}, "note": {"type": "string"}}}}}]


@pytest.fixture(autouse=True)
def _memo_for_short_chats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chat through the memo, so that the sessions can stay short (quick)."""
    monkeypatch.setattr(_piece_count, "PREFIX_MIN_CHARS", 0)


def _text(rng: random.Random, low: int, high: int) -> str:
    words = rng.choices(_WORDS, k=rng.randint(low, high))
    return "".join(word + rng.choice(["", " ", " ", "\n"]) for word in words)


def _reply(rng: random.Random, reasoning: bool) -> dict[str, Any]:
    reply: dict[str, Any] = {"role": "assistant", "content": _text(rng, 3, 40)}
    roll = rng.random()
    if reasoning and roll < 0.25:
        reply["reasoning"] = _text(rng, 3, 20)
    elif reasoning and roll < 0.4:
        reply["content"] = "<think>\n" + _text(rng, 2, 10) + "</think>\n\n" + reply["content"]
    return reply


def _tool_turn(rng: random.Random, turn: int, reasoning: bool) -> list[dict[str, Any]]:
    """An assistant turn calling 1-2 tools, and 1-3 results (more than one result: grouped)."""
    reply = _reply(rng, reasoning)
    if rng.random() < 0.3:
        reply["content"] = ""
    calls = []
    for k in range(rng.randint(1, 2)):
        arguments = json.dumps({"path": f"src/m{turn}.py", "note": _text(rng, 1, 6)}, ensure_ascii=False)
        calls.append({"id": f"call_{turn}_{k}", "type": "function",
                      "function": {"name": "read_file", "arguments": arguments}})
    reply["tool_calls"] = calls
    results = [{"role": "tool", "tool_call_id": f"call_{turn}_{k}", "content": _text(rng, 5, 60)}
               for k in range(rng.randint(1, 3))]
    return [reply, *results]


def _query(rng: random.Random) -> dict[str, Any]:
    if rng.random() < 0.2:
        return {"role": "user", "content": [{"type": "text", "text": _text(rng, 3, 30)}]}
    return {"role": "user", "content": _text(rng, 3, 50)}


def agent_session(rng: random.Random, *, tools: bool, reasoning: bool, steps: int = 14) -> list[dict[str, Any]]:
    """Request bodies of one session: each step adds a turn (a reply and a query, or a tool call and its
    results); some are resent as they are, sent with an earlier message edited, or cut short."""
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.8:
        messages.append({"role": "system", "content": _text(rng, 20, 80)})
    messages.append(_query(rng))
    bodies = []
    for turn in range(steps):
        if tools and rng.random() < 0.5:
            messages += _tool_turn(rng, turn, reasoning)
            if rng.random() < 0.3:
                messages += [_reply(rng, reasoning), _query(rng)]
        else:
            messages += [_reply(rng, reasoning), _query(rng)]
        body: dict[str, Any] = {"messages": copy.deepcopy(messages)}
        if tools:
            body["tools"] = TOOLS
        if rng.random() < 0.2:
            body["add_generation_prompt"] = False
        if rng.random() < 0.15:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        bodies.append(body)
        roll = rng.random()
        if roll < 0.15:
            bodies.append(copy.deepcopy(body))
        elif roll < 0.25 and len(messages) > 3:
            edited = copy.deepcopy(body)
            at = rng.randrange(len(edited["messages"]) - 1)
            if isinstance(edited["messages"][at].get("content"), str):
                edited["messages"][at]["content"] += " edited"
            bodies.append(edited)
        elif roll < 0.35 and len(messages) > 4:
            bodies.append({**copy.deepcopy(body), "messages": copy.deepcopy(messages[:-2])})
    return bodies


def _takes_tools(model: Any) -> bool:
    probe = {"messages": [{"role": "user", "content": "a"}, *_tool_turn(random.Random(0), 0, False)],
             "tools": TOOLS}
    try:
        model.count_chat(probe)
    except CountError:
        return False            # Gemma 3, Phi-3: no tool role
    return True


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    root = tmp_path_factory.mktemp("families")
    return {name: family_folder(name, root) for name in FAMILIES}


def _uncached(families: dict[str, Path | str], name: str) -> Any:
    """Family `name`'s model with no cache at all: full counts (skips when its files are missing)."""
    folder = families[name]
    if isinstance(folder, str):
        pytest.skip(folder)
    return TokenizerCache(piece_cache_entries=0, chat_cache_entries=0).get(folder)


@pytest.mark.parametrize("name", FAMILIES)
def test_agent_sessions_count_as_full_counts(name: str, families: dict[str, Path | str]) -> None:
    full = _uncached(families, name)
    cache = PieceCountCache()
    incremental = full.with_piece_cache(cache) if isinstance(full, ModelTokenizer) else full
    tools = _takes_tools(full)
    reasoning = full.family != "mistral"                     # mistral-common refuses thinking chunks
    checked = 0
    for seed in range(3):
        bodies = agent_session(random.Random(seed), tools=tools, reasoning=reasoning)
        expected = _counts(full, bodies)
        assert _counts(incremental, bodies) == expected, (name, seed)
        checked += sum(isinstance(count, int) for count in expected)
    assert checked >= 20, name
    templates = getattr(full, "_templates", {})
    if full.family == "hf" and incremental.piece_counter is not None and templates["default"].loop_proof:
        # The memo ran and skipped iterations rendered before.
        assert cache.traces.skipped > 0 and len(cache.traces) > 0, name


@pytest.mark.parametrize("name", FAMILIES)
def test_the_rewritten_template_renders_what_the_template_renders(name: str, families: dict[str, Path | str]) -> None:
    """Nothing stored yet, so nothing skipped: the hooks change no text."""
    model = _uncached(families, name)
    if not isinstance(model, ModelTokenizer) or model.family != "hf":
        pytest.skip("not rendered with a chat template")
    tools = _takes_tools(model)
    compared = 0
    for seed in range(3):
        for body in agent_session(random.Random(10 + seed), tools=tools, reasoning=True):
            try:
                template, variables, _options, _ = model._prepare(body)
                text = render(template.compiled, variables, continue_final_message=False)
            except CountError:
                continue
            assert template.loop_proof is not None, name
            done = memo_render(template.loop_proof, variables, b"k" * 32, PieceCountCache())
            assert done is not None and not done.reused and done.text == text, name
            compared += 1
    assert compared >= 10, name


def test_the_corpora_count_through_the_memo(families: dict[str, Path | str]) -> None:
    """Every case of the shared corpus and the family corpora, in order, through one cache (so the
    memo meets each case's template with what earlier cases left): vLLM's count, or its refusal."""
    cache = TokenizerCache(chat_cache_entries=0)
    cases = [(SHARED / case["model_dir"], case) for case in SHARED_CASES]
    cases += [(families[case["target"]], case) for case in FAMILY_CASES if TARGETS[case["target"]].cases == "hf"]
    counted = 0
    for folder, case in cases:
        if isinstance(folder, str):
            continue
        model = cache.get(folder)
        if case["expected_error"] is not None:
            with pytest.raises(CountError):
                count_case(model, case)
        else:
            assert count_case(model, case) == case["expected_prompt_tokens"], case["id"]
            counted += 1
    assert counted >= 300
    assert cache.piece_cache is not None and cache.piece_cache.traces.rendered > 0


def _qwen3(tmp_path: Path, template: str | None = None) -> tuple[Any, Any]:
    """Qwen3's tokenizer (with its own template or `template`): a model with no cache, one with the memo."""
    if not QWEN3.is_dir():
        pytest.skip(f"{QWEN3} is missing")
    folder = QWEN3
    if template is not None:
        folder = tmp_path / "model"
        folder.mkdir()
        (folder / "tokenizer.json").symlink_to(QWEN3 / "tokenizer.json")
        (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>"}), encoding="utf-8")
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
    full = TokenizerCache(piece_cache_entries=0, chat_cache_entries=0).get(folder)
    return full, full.with_piece_cache(PieceCountCache())


def test_reasoning_dropped_before_a_new_user_query(tmp_path: Path) -> None:
    """Qwen3 keeps an assistant turn's reasoning after the last user query and drops it before: once
    a query follows, that turn renders otherwise, so it is rendered again, not skipped."""
    full, memo = _qwen3(tmp_path)
    turns: list[dict[str, Any]] = [{"role": "system", "content": "Be brief. " * 30},
                                   {"role": "user", "content": "2+2?"},
                                   {"role": "assistant", "content": "4", "reasoning": "Add them. " * 20}]
    first = {"messages": turns, "add_generation_prompt": False}
    second = {"messages": [*turns, {"role": "user", "content": "3+3?"}]}
    assert "Add them." in full.render_chat(first) and "Add them." not in full.render_chat(second)
    for body in (first, second, first, second):
        assert memo.count_chat(body) == full.count_chat(body)
    traces = memo.piece_counter.cache.traces
    assert traces.skipped > 0


MESSAGES_TAIL = (
    "{%- if messages[0].role == 'system' %}{%- set system = messages[0].content %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "<|im_start|>system\n{{ system }}<|im_end|>\n"
    "{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- if loop.nextitem is defined and loop.nextitem.role == message.role %} (again){% endif %}"
    "<|im_end|>\n{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)


def test_a_template_that_rebinds_messages_to_a_slice(tmp_path: Path) -> None:
    """`set messages = messages[1:]` (as Llama 3's templates do) and `loop.nextitem`: the list the loop
    runs over is not the request's, and an earlier turn depends on the next one."""
    full, memo = _qwen3(tmp_path, MESSAGES_TAIL)
    rng = random.Random(7)
    for body in agent_session(rng, tools=False, reasoning=False, steps=12):
        if rng.random() < 0.3:
            body["messages"].append({"role": body["messages"][-1]["role"], "content": "more"})
        assert memo.count_chat(body) == full.count_chat(body)
    assert memo.piece_counter.cache.traces.skipped > 0


def test_a_namespace_written_with_text_is_counted_whole(tmp_path: Path) -> None:
    """An iteration that writes a string into a namespace could not be replayed without keeping the
    string: nothing is recorded, and the counts are a full render's."""
    template = ("{%- set ns = namespace(last='') %}{%- for message in messages %}"
                "<|im_start|>{{ message.role }}\n{{ ns.last }}|{{ message.content }}<|im_end|>\n"
                "{%- set ns.last = message.content[:5] %}{%- endfor %}")
    full, memo = _qwen3(tmp_path, template)
    for body in agent_session(random.Random(8), tools=False, reasoning=False, steps=6):
        assert memo.count_chat(body) == full.count_chat(body)
    traces = memo.piece_counter.cache.traces
    assert len(traces) == 0 and traces.skipped == 0


def test_an_edited_turn_is_rendered_again(tmp_path: Path) -> None:
    """A message changed anywhere (its digest differs) ends the run of skipped iterations there."""
    full, memo = _qwen3(tmp_path)
    bodies = agent_session(random.Random(9), tools=True, reasoning=True, steps=8)
    for body in bodies:
        memo.count_chat(body)
    edited = copy.deepcopy(bodies[-1])
    edited["messages"][2]["content"] = str(edited["messages"][2].get("content")) + "!"
    assert memo.count_chat(edited) == full.count_chat(edited)


def test_the_first_chat_of_an_opening_is_not_recorded(tmp_path: Path) -> None:
    """Recording pays only when a conversation comes back: a long prompt seen once costs no digests;
    the same opening again is recorded, and one turn longer reuses it."""
    full, memo = _qwen3(tmp_path)
    bodies = agent_session(random.Random(11), tools=True, reasoning=True, steps=3)
    traces = memo.piece_counter.cache.traces
    assert memo.count_chat(bodies[0]) == full.count_chat(bodies[0]) and len(traces) == 0
    assert memo.count_chat(bodies[0]) == full.count_chat(bodies[0]) and len(traces) > 0
    assert memo.count_chat(bodies[1]) == full.count_chat(bodies[1]) and traces.skipped > 0


def test_responses_and_messages_histories_go_through_the_memo(tmp_path: Path) -> None:
    """Responses and Messages are counted as the chat they convert to, so their histories skip the
    turns rendered before too, with a full count's result."""
    full, memo = _qwen3(tmp_path)
    rng = random.Random(12)
    items: list[dict[str, Any]] = [{"role": "user", "content": _text(rng, 80, 120)}]
    turns: list[dict[str, Any]] = [{"role": "user", "content": _text(rng, 80, 120)}]
    for _ in range(8):
        items += [{"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": _text(rng, 5, 60)}]}, {"role": "user", "content": _text(rng, 5, 60)}]
        turns += [{"role": "assistant", "content": [{"type": "text", "text": _text(rng, 5, 60)}]},
                  {"role": "user", "content": [{"type": "text", "text": _text(rng, 5, 60)}]}]
        responses = {"model": "m", "instructions": "Be brief.", "input": copy.deepcopy(items)}
        messages = {"model": "m", "max_tokens": 100, "system": "Be brief.", "messages": copy.deepcopy(turns)}
        assert memo.count_responses(responses) == full.count_responses(responses)
        assert memo.count_messages(messages) == full.count_messages(messages)
    assert memo.piece_counter.cache.traces.skipped >= 10


def _sessions_sharing_an_opening(count: int, steps: int, tools: bool) -> list[list[dict[str, Any]]]:
    """`count` agent sessions of one deployment: the same system prompt (and tools), each its own task."""
    system = {"role": "system", "content": _text(random.Random(20), 60, 80)}
    sessions = []
    for seed in range(count):
        rng = random.Random(100 + seed)
        messages: list[dict[str, Any]] = [system, _query(rng)]
        bodies = []
        for turn in range(steps):
            messages += _tool_turn(rng, turn, False) if tools else [_reply(rng, False), _query(rng)]
            bodies.append({"messages": copy.deepcopy(messages), **({"tools": TOOLS} if tools else {})})
        sessions.append(bodies)
    return sessions


def _skips(model: Any, bodies: list[tuple[int, dict[str, Any]]]) -> dict[tuple[int, int], int]:
    """Iterations skipped by each request (session, turn), counted in this order through one cache."""
    traces = model.piece_counter.cache.traces
    skipped: dict[tuple[int, int], int] = {}
    turns: dict[int, int] = {}
    for session, body in bodies:
        before = traces.skipped
        model.count_chat(body)
        turn = turns[session] = turns.get(session, -1) + 1
        skipped[(session, turn)] = traces.skipped - before
    return skipped


@pytest.mark.parametrize("name", FAMILIES)
def test_interleaved_sessions_sharing_an_opening_reuse_as_much_as_one_at_a_time(
        name: str, families: dict[str, Path | str]) -> None:
    """Agents of one deployment send the same system prompt and tools, and their turns interleave.
    More sessions than a chain key keeps variants of (MAX_VARIANTS) branch where their tasks start:
    each session's next turn must still skip what its previous turn rendered, at least as much as
    when the sessions come one after the other, with a full count's result."""
    full = _uncached(families, name)
    templates = getattr(full, "_templates", {})
    if not isinstance(full, ModelTokenizer) or full.family != "hf" or not templates["default"].loop_proof:
        pytest.skip("not rendered through a proven chat template")
    sessions = _sessions_sharing_an_opening(3 * MAX_VARIANTS, 5, _takes_tools(full))
    one_at_a_time = [(s, body) for s, bodies in enumerate(sessions) for body in bodies]
    interleaved = [(s, sessions[s][turn]) for turn in range(5) for s in range(len(sessions))]
    expected = {(s, turn): full.count_chat(body)
                for s, bodies in enumerate(sessions) for turn, body in enumerate(bodies)}
    alone = _skips(full.with_piece_cache(PieceCountCache()), one_at_a_time)
    memo = full.with_piece_cache(PieceCountCache())
    together = _skips(memo, interleaved)
    assert {key: memo.count_chat(sessions[key[0]][key[1]]) for key in expected} == expected
    later = [key for key in alone if key[1] > 0]
    assert sum(alone[key] for key in later) > 0, name
    assert [key for key in later if together[key] < alone[key]] == [], name


def test_a_memo_a_little_too_small_keeps_the_start_of_each_conversation(tmp_path: Path) -> None:
    """More conversations coming back in turn than the memo holds: the least recently used traces go.
    A conversation's go from its deepest iteration back, so each keeps the start of its path, which
    its next turn can still skip.  Were its first trace the first to go, the walk would stop there
    and none of its other traces would be of use: with room for 120 of the ~150 traces these six
    sessions make, their last turns skipped 6 iterations in all that way, 42 this way."""
    full, _ = _qwen3(tmp_path)
    sessions = _sessions_sharing_an_opening(6, 8, tools=True)
    cache = PieceCountCache(8 * 120)                 # TRACE_ENTRIES_PER_PIECE: room for 120 traces
    memo = full.with_piece_cache(cache)
    interleaved = [(s, sessions[s][turn]) for turn in range(8) for s in range(len(sessions))]
    skipped = _skips(memo, interleaved)
    assert cache.traces.evictions > 0 and len(cache.traces) == 120
    assert all(memo.count_chat(body) == full.count_chat(body) for _, body in interleaved[-6:])
    assert sum(skipped[(s, 7)] for s in range(len(sessions))) >= 4 * len(sessions)


def test_a_conversation_one_turn_longer_jumps_over_what_it_had(tmp_path: Path) -> None:
    """The walk over a conversation's earlier iterations is one step (a `Jump`): a conversation that
    comes back a turn longer takes at once the iterations its previous turn ended on, but the last
    (it read `loop.last`), proven by one hash of its messages' digests, with a full count's result."""
    full, memo = _qwen3(tmp_path)
    [bodies] = _sessions_sharing_an_opening(1, 10, tools=True)
    traces = memo.piece_counter.cache.traces
    jumped = []
    for body in bodies:
        before = traces.jumped
        assert memo.count_chat(body) == full.count_chat(body)
        jumped.append(traces.jumped - before)
    sizes = [len(body["messages"]) for body in bodies]
    assert jumped[:2] == [0, 0], jumped           # the first chat is not recorded, the second walks
    assert all(jumped[t] >= sizes[t - 1] - 3 for t in range(2, len(bodies))), (jumped, sizes)
    assert len(memo.piece_counter.cache.jumps) == len(bodies) - 1


def test_a_jump_is_taken_only_where_what_it_read_is_unchanged(tmp_path: Path) -> None:
    """An earlier message edited (its digest is in the jump's hash), and a new user query (Qwen3's
    `ns.last_query_index`, which every assistant turn reads before any writes it, moves) each refuse
    the jump: the walk goes iteration by iteration, and the count is a full count's.  One more tool
    turn takes it."""
    full, memo = _qwen3(tmp_path)
    rng = random.Random(31)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 60, 80)}, _query(rng)]
    for turn in range(6):
        reply, *results = _tool_turn(rng, turn, reasoning=False)
        messages += [{**reply, "reasoning": _text(rng, 3, 20)}, *results]
        memo.count_chat({"messages": copy.deepcopy(messages), "tools": TOOLS})
    traces = memo.piece_counter.cache.traces
    edited = copy.deepcopy(messages)
    edited[3]["content"] = str(edited[3].get("content")) + " edited"
    queried = [*copy.deepcopy(messages), {"role": "assistant", "content": "Done.", "reasoning": "ok"},
               {"role": "user", "content": "And now the tests."}]
    longer = [*copy.deepcopy(messages), *_tool_turn(rng, 6, reasoning=False)]
    jumped = {}
    for name, turn in (("edited", edited), ("queried", queried), ("longer", longer)):
        body = {"messages": turn, "tools": TOOLS}
        before = traces.jumped
        assert memo.count_chat(body) == full.count_chat(body), name
        jumped[name] = traces.jumped - before
    assert jumped["edited"] == 0 and jumped["queried"] == 0 and jumped["longer"] >= len(messages) - 3, jumped


def test_a_jump_ends_before_the_iteration_that_was_the_last(tmp_path: Path) -> None:
    """Qwen3 writes an empty think block for an assistant turn after the last user query only when it is the
    last message (`loop.last`).  A conversation cut back to end on such a turn must not jump over it as
    rendered when more followed, and one that grew past it must not jump over it as rendered last."""
    full, memo = _qwen3(tmp_path)
    rng = random.Random(41)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 60, 80)}, _query(rng)]
    for turn in range(5):
        reply, *results = _tool_turn(rng, turn, reasoning=False)
        for ending in ([reply, *results], [reply]):
            body = {"messages": copy.deepcopy([*messages, *ending]), "tools": TOOLS}
            assert memo.count_chat(body) == full.count_chat(body), (turn, len(ending))
        messages += [reply, *results]
    assert memo.piece_counter.cache.traces.jumped > 0


# Iterations that read what the list's length decides: its length, and its last message by a negative index.
_BY_LENGTH = ("{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
              "{%- if loop.index0 == messages|length - 2 %} (the next one is the last){%- endif %}<|im_end|>\n"
              "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")
_BY_LAST = ("{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
            "{%- if messages[-1].role == 'user' %} (a user spoke last){%- endif %}<|im_end|>\n"
            "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@pytest.mark.parametrize("template", [_BY_LENGTH, _BY_LAST], ids=["length", "negative-index"])
def test_no_jump_over_iterations_that_read_the_lists_end(tmp_path: Path, template: str) -> None:
    """An iteration that read `messages|length` or `messages[-1]` renders otherwise once the conversation
    grows: no jump holds it, whatever the messages before it, and every count is a full count's."""
    full, memo = _qwen3(tmp_path, template)
    rng = random.Random(5)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 20, 40)}, _query(rng)]
    for _ in range(8):
        messages += [_reply(rng, False), _query(rng) if rng.random() < 0.5 else _reply(rng, False)]
        body = {"messages": copy.deepcopy(messages)}
        assert memo.count_chat(body) == full.count_chat(body)
    assert memo.piece_counter.cache.traces.jumped == 0


# No `loop.last`: a run may end on the last message, whose end is a cut or not by what follows the loop.
_TAIL_AFTER_LOOP = ("{%- for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>"
                    "{%- endfor %}{%- if add_generation_prompt %}<|im_start|>assistant\n{%- else %}\nEND{%- endif %}")


def test_a_run_that_ends_on_the_last_message(tmp_path: Path) -> None:
    """A template that never reads `loop.last`: a jump runs to the last message, whose end is a cut only
    when the generation prompt follows the loop.  The same conversation without it, and the next one
    longer, count as full counts."""
    full, memo = _qwen3(tmp_path, _TAIL_AFTER_LOOP)
    rng = random.Random(6)
    messages: list[dict[str, Any]] = [{"role": "system", "content": _text(rng, 20, 40)}, _query(rng)]
    for _ in range(8):
        messages += [_reply(rng, False), _query(rng)]
        for generation in (True, False):
            body = {"messages": copy.deepcopy(messages), "add_generation_prompt": generation}
            assert memo.count_chat(body) == full.count_chat(body), generation
    assert memo.piece_counter.cache.traces.jumped > 0
