"""Small counts asked for in one turn of the event loop are made together, each answer to its own caller."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import pytest

from proxy.admitted.counting import PromptCounter, TurnBatch
from proxy.admitted.surfaces import ChatSurface
from proxy.errors import BrimfulError
from proxy.upstream.backends import Backends
from tests.support.stack import make_config
from tokenizer_cache import CountError


async def test_calls_of_one_turn_run_after_every_caller_asked() -> None:
    batch, log = TurnBatch(), []

    def make(i: int) -> int:
        log.append(f"made {i}")
        return i * 10

    async def caller(i: int) -> int:
        log.append(f"asked {i}")
        result = await batch.call(lambda: make(i))
        log.append(f"got {i}")
        return result

    assert list(await asyncio.gather(*(caller(i) for i in range(3)))) == [0, 10, 20]
    assert log == ["asked 0", "asked 1", "asked 2", "made 0", "made 1", "made 2", "got 0", "got 1", "got 2"]


async def test_each_caller_gets_its_own_exception_and_the_rest_their_results() -> None:
    batch = TurnBatch()

    def refuse() -> int:
        raise CountError("refused")

    def stop() -> int:
        raise StopIteration

    results = await asyncio.gather(batch.call(lambda: 1), batch.call(refuse), batch.call(stop), batch.call(lambda: 4),
                                   return_exceptions=True)
    assert results[0] == 1 and results[3] == 4
    assert isinstance(results[1], CountError)
    assert isinstance(results[2], RuntimeError) and isinstance(results[2].__cause__, StopIteration)


async def test_a_caller_gone_before_the_turn_ends_is_not_counted() -> None:
    batch, made = TurnBatch(), []

    def make(name: str) -> str:
        made.append(name)
        return name

    gone = batch.call(lambda: make("gone"))
    kept = batch.call(lambda: make("kept"))
    gone.cancel()
    assert await asyncio.wait_for(kept, 10) == "kept"      # a batch that stopped at the gone caller never answers
    assert made == ["kept"]


async def test_a_refusal_nobody_awaited_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    """A caller cancelled once its count failed never reads the error: asyncio must not log it (its
    message may quote the request) when the future is collected."""
    batch = TurnBatch()

    def refuse() -> int:
        raise CountError("The chat template refused the conversation: a quoted field")

    future = batch.call(refuse)
    await asyncio.wait([future])            # done, its exception not read
    del future
    gc.collect()
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


async def test_each_turn_makes_its_own_batch_and_leaves_nothing_behind() -> None:
    batch = TurnBatch()
    assert await asyncio.wait_for(batch.call(lambda: 1), 10) == 1
    assert batch._pending == {}
    assert list(await asyncio.wait_for(asyncio.gather(batch.call(lambda: 2), batch.call(lambda: 3)), 10)) == [2, 3]
    assert batch._pending == {}


def test_a_batch_serves_one_loop_after_another() -> None:
    batch = TurnBatch()
    assert asyncio.run(_one(batch, 5)) == 5
    assert asyncio.run(_one(batch, 6)) == 6


async def _one(batch: TurnBatch, value: int) -> int:
    return await asyncio.wait_for(batch.call(lambda: value), 10)


class _WhereCounted(ChatSurface):
    """The chat surface, noting which task each count ran in."""

    def __init__(self) -> None:
        self.tasks: list[Any] = []

    def count(self, tok: Any, body: dict[str, Any]) -> int | list[int]:
        self.tasks.append(asyncio.current_task())
        return super().count(tok, body)


async def test_the_counter_counts_small_prompts_of_one_turn_together(qwen3: Any, qwen3_dir: Path) -> None:
    """Not in the request's task, but in the turn's one callback: the counts are as exact as before."""
    config = make_config("http://127.0.0.1:9", qwen3_dir)
    counter = PromptCounter(config, Backends(config))
    surface = _WhereCounted()
    bodies = [{"model": "tiny-qwen", "messages": [{"role": "user", "content": "hello " * n}]} for n in (1, 5, 9)]
    await counter.tokenizer("tiny-qwen")
    counts = await asyncio.gather(*(counter.count("tiny-qwen", surface, body, 100) for body in bodies))
    assert [c.per_prompt for c in counts] == [[qwen3.count_chat(body)] for body in bodies]
    assert surface.tasks == [None, None, None]
    with pytest.raises(BrimfulError) as refused:             # a count's error reaches its own request
        await asyncio.wait_for(counter.count("tiny-qwen", surface, {"model": "tiny-qwen", "messages": []}, 100), 10)
    assert refused.value.status == 400
