"""How the workers of one `brimful serve --workers N` talk to each other.

Each worker listens on a Unix socket of its own in a directory the
supervisor made (`WorkerSlot.path`).  A question is one JSON line; the
answer is a JSON document, then the connection closes.  The pages that must
speak for every worker use it (proxy.workers.pages): `/metrics` and `/stats`
are answered by the primary worker (index 0, the one that also scrapes the
upstream's /metrics) from every worker's share; `/ready` and `/live` ask each
sibling in turn.

Nothing here knows what the questions mean; the app answers them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("brimful.workers")

Question = dict[str, Any]
Answerer = Callable[[Question], Awaitable[Any]]

MAX_QUESTION_BYTES = 64 * 1024
SLOTS_FILE = "slots.json"      # in the directory: the supervisor's word on each slot, for /metrics
TOTALS_FILE = "totals.json"    # in the directory: the primary's memory of every worker's counters


def replace_json(path: Path, document: Any) -> None:
    """`document` written as `path` whole or not at all (a reader never sees half of it); a failed
    write leaves the old file, which the pages read as last said (SLOTS_FILE, TOTALS_FILE)."""
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(OSError):
        tmp.write_text(json.dumps(document, separators=(",", ":")))
        os.replace(tmp, path)


class SiblingUnavailable(Exception):
    """A sibling did not answer (not started yet, restarting, too slow, or gone)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"worker {index} did not answer: {reason}")
        self.index = index
        self.reason = reason


@dataclass(frozen=True)
class WorkerSlot:
    """One worker's place among `count`: its index (0 is the primary) and where the sockets are."""

    index: int
    count: int
    directory: Path
    replacement: bool = False      # started to replace a worker that exited (serves once ready)
    channel: int = -1              # this worker's end of its channel to the supervisor (proxy.workers.handover)

    def path(self, index: int) -> Path:
        return self.directory / f"worker-{index}.sock"

    @property
    def primary(self) -> bool:
        return self.index == 0

    @property
    def others(self) -> list[int]:
        return [i for i in range(self.count) if i != self.index]


class Siblings:
    """This worker's end: answers its siblings' questions, and asks them its own."""

    def __init__(self, slot: WorkerSlot, answer: Answerer) -> None:
        self.slot = slot
        self._answer = answer
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        path = self.slot.path(self.slot.index)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()              # left by this slot's previous worker
        self._server = await asyncio.start_unix_server(self._serve, path=str(path))
        os.chmod(path, 0o600)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            if len(line) > MAX_QUESTION_BYTES:
                return
            try:
                answer = await self._answer(json.loads(line))
                data = json.dumps({"ok": True, "answer": answer}, separators=(",", ":")).encode()
            except Exception as exc:   # a bug here must not take the sibling's page down with a hang
                log.exception("worker %d could not answer a sibling", self.slot.index)
                data = json.dumps({"ok": False, "error": f"{type(exc).__name__}: {exc}"}).encode()
            writer.write(data)
            await writer.drain()
        except (ConnectionError, ValueError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def ask(self, index: int, question: Question, timeout: float) -> Any:
        """The answer of worker `index`; raises SiblingUnavailable."""
        try:
            return await asyncio.wait_for(self._ask(index, question), timeout)
        except TimeoutError:
            raise SiblingUnavailable(index, f"no answer within {timeout:g} s") from None
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            raise SiblingUnavailable(index, str(exc) or type(exc).__name__) from None

    async def _ask(self, index: int, question: Question) -> Any:
        reader, writer = await asyncio.open_unix_connection(str(self.slot.path(index)), limit=2**20)
        try:
            writer.write(json.dumps(question, separators=(",", ":")).encode() + b"\n")
            await writer.drain()
            data = await reader.read()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
        reply = json.loads(data)
        if not reply.get("ok"):
            raise ValueError(str(reply.get("error")))
        return reply["answer"]

    async def ask_others(self, question: Question, timeout: float) -> dict[int, Any | SiblingUnavailable]:
        """Every other worker's answer (or why there is none), asked at once."""
        indices = self.slot.others

        async def one(i: int) -> Any:
            try:
                return await self.ask(i, question, timeout)
            except SiblingUnavailable as exc:
                return exc

        answers = await asyncio.gather(*(one(i) for i in indices))
        return dict(zip(indices, answers, strict=True))
