"""brimful's own pages when several workers serve one port: each answers for all of them.

A request for `/metrics` or `/stats` reaches whichever worker the kernel gave
the connection.  The primary (worker 0) answers both from every worker's
share (proxy.workers.shard), and a sibling hands the request to it: the primary is
also the one worker that scrapes the upstream's /metrics (proxy.recording.live_sizing),
so the sizing gauges and `/stats` "upstream" come from one scrape, with the
demand of all traffic.  Counters never go backwards (Prometheus would see a
reset): every worker's last-seen counters are kept in a file beside the
sockets (read and written under a lock), so a worker that is gone (kill -9,
OOM) keeps counting at its last-seen totals, even across a restart of the
primary itself, and one that does not answer is shown at them, with
`brimful_worker_up` 0.  While the primary does not answer, a sibling answers
`/metrics` itself from the same file (without the upstream's sizing gauges) and
`/stats` from the workers that answer; either page names the missing worker.

`/ready` is ready when every worker is (each loads its own tokenizers);
`/live` is live when every worker's event loop answers.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from starlette.concurrency import run_in_threadpool

from proxy.recording.metrics import safe_label
from proxy.recording.recorder import Recorder
from proxy.sizing.lengths import percentile
from proxy.workers.shard import (
    FamiliesCollector,
    carry_totals,
    demand_to_wire,
    families_to_wire,
    merge_counting,
    merge_demand,
    merge_families,
    merge_windows,
    window_from_wire,
    window_to_wire,
    without_monotone,
    worker_families,
)
from proxy.workers.siblings import (
    SLOTS_FILE,
    TOTALS_FILE,
    Question,
    Siblings,
    SiblingUnavailable,
    WorkerSlot,
    replace_json,
)

PAGE_TIMEOUT_S = 10.0     # a share of a full window is a few MB of JSON at most
READY_TIMEOUT_S = 2.0
LIVE_TIMEOUT_S = 1.0      # Kubernetes' default probe timeout

Readiness = Callable[[], tuple[bool, dict[str, Any]]]
DemandKV = Callable[[str], float | None]


class WorkerPages:
    """This worker's view of the pages that speak for every worker."""

    def __init__(self, slot: WorkerSlot, recorder: Recorder, counting: Callable[[], dict[str, dict[str, Any]]],
                 readiness: Readiness, sizing_collector: Callable[[DemandKV], Collector],
                 in_flight: Callable[[], int] = lambda: 0) -> None:
        self.slot = slot
        self._in_flight = in_flight
        self.siblings = Siblings(slot, self.answer)
        self._recorder = recorder
        self._counting = counting
        self._readiness = readiness
        self._sizing_collector = sizing_collector
        self._accounting = asyncio.Lock()       # one /metrics of this worker at a time updates the totals

    # -- what a sibling may ask ---------------------------------------------------

    async def answer(self, question: Question) -> Any:
        op = question.get("op")
        if op == "share":
            window = question.get("window")
            if window == "full":       # sorting and copying a full window: off the event loop
                return await run_in_threadpool(self.share, window)
            return self.share(window)
        if op == "ready":
            ready, document = self._readiness()
            return {"ready": ready, "document": document}
        if op == "live":
            return {"pid": os.getpid()}
        if op == "page" and self.slot.primary:
            path = question.get("path")
            if path == "/metrics":
                status, body, content_type = await self.metrics(question.get("accept"))
                return {"status": status, "content_type": content_type, "text": body.decode()}
            if path == "/stats":
                status, document = await self.stats()
                return {"status": status, "document": document}
        raise ValueError(f"unknown question {op!r}")

    def share(self, window: str | None) -> dict[str, Any]:
        """This worker's counts: its metric families, its window (or only its demand), how it counts."""
        rec = self._recorder
        rec.flush()
        out: dict[str, Any] = {"index": self.slot.index, "pid": os.getpid(), "records": rec.records,
                               "in_flight": self._in_flight(),
                               "families": families_to_wire(rec.metrics.registry.collect()),
                               "counting": self._counting()}
        if window in ("full", "demand"):
            snapshot = rec.window.snapshot(rec.clock())
            out["window" if window == "full" else "demand"] = (
                window_to_wire(snapshot) if window == "full" else demand_to_wire(snapshot))
        return out

    async def _shares(self, window: str) -> tuple[list[dict[str, Any]], dict[int, str]]:
        """Every worker's share (this one's first), and why a sibling gave none."""
        own = await run_in_threadpool(self.share, window) if window == "full" else self.share(window)
        answers = await self.siblings.ask_others({"op": "share", "window": window}, PAGE_TIMEOUT_S)
        shares = [own]
        missing: dict[int, str] = {}
        for index, answer in answers.items():
            if isinstance(answer, SiblingUnavailable):
                missing[index] = answer.reason
            else:
                shares.append(answer)
        return shares, missing

    async def _relay(self, question: Question) -> Any:
        return await self.siblings.ask(0, {"op": "page", **question}, PAGE_TIMEOUT_S)

    # -- the pages ------------------------------------------------------------------

    async def metrics(self, accept: str | None) -> tuple[int, bytes, str]:
        """(status, body, content type) of GET /metrics for every worker.

        A sibling relays to the primary; when the primary does not answer (dead,
        restarting, backing off) the sibling answers for every worker itself,
        without the upstream's sizing gauges (only the primary scrapes them).
        """
        if not self.slot.primary:
            try:
                page = await self._relay({"path": "/metrics", "accept": accept})
            except SiblingUnavailable:
                pass
            else:
                return page["status"], page["text"].encode(), page["content_type"]
        async with self._accounting:
            shares, missing = await self._shares("demand")
            shown = await run_in_threadpool(self._carry, shares, list(missing))
        families = merge_families([without_monotone(share["families"]) for share in shares] + shown)
        families += worker_families(self.slot.count, [share["index"] for share in shares], self._slots())
        if self.slot.primary:
            demand = merge_demand([share["demand"] for share in shares], self._recorder.window.max_records)

            def demand_kv(model: str, p: float = 95.0) -> float | None:
                values = sorted(demand.get(safe_label(model), []))
                return percentile(values, p) if values else None

            families.extend(self._sizing_collector(demand_kv).collect())
        registry = CollectorRegistry()
        registry.register(FamiliesCollector(families))
        encoder, content_type = choose_encoder(accept or "")
        return 200, encoder(registry), content_type

    def _carry(self, shares: list[dict[str, Any]], missing: list[int]) -> list[list[Any]]:
        """carry_totals over the file every worker answering /metrics shares, under its lock."""
        path = self.slot.directory / TOTALS_FILE
        with open(path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                seen = json.loads(path.read_text())
            except (OSError, ValueError):
                seen = {}
            seen, shown = carry_totals(seen if isinstance(seen, dict) else {}, shares, missing)
            replace_json(path, seen)
        return shown

    def _slots(self) -> dict[str, Any]:
        try:
            slots = json.loads((self.slot.directory / SLOTS_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return slots if isinstance(slots, dict) else {}

    async def stats(self) -> tuple[int, dict[str, Any]]:
        """(status, document) of GET /stats for every worker, with a "workers" section.

        A sibling relays to the primary; when the primary does not answer, the sibling
        answers from the workers that do (the primary listed as not answering)."""
        if not self.slot.primary:
            try:
                page = await self._relay({"path": "/stats"})
            except SiblingUnavailable:
                pass
            else:
                return page["status"], page["document"]
        shares, missing = await self._shares("full")
        rec = self._recorder
        snapshot = merge_windows([window_from_wire(share["window"]) for share in shares], rec.window.max_records)
        counting = merge_counting({share["index"]: share["counting"] for share in shares})
        document = await run_in_threadpool(rec.stats, snapshot, counting)
        workers = [{"index": share["index"], "pid": share["pid"], "answered": True, "records": share["records"],
                    "in_flight": share["in_flight"]} for share in shares]
        workers += [{"index": i, "answered": False, "error": why} for i, why in missing.items()]
        document["workers"] = sorted(workers, key=lambda w: w["index"])
        return 200, document

    async def ready(self, ready: bool, document: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
        """This worker's readiness and every sibling's: ready when all are."""
        answers = await self.siblings.ask_others({"op": "ready"}, READY_TIMEOUT_S)
        missing = list(document.get("missing", []))
        workers: list[dict[str, Any]] = [{"index": self.slot.index, "ready": ready}]
        for index, answer in answers.items():
            if isinstance(answer, SiblingUnavailable):
                workers.append({"index": index, "ready": False})
                missing.append(str(answer))
                continue
            workers.append({"index": index, "ready": answer["ready"]})
            missing += [f"worker {index}: {m}" for m in answer["document"].get("missing", [])]
            ready = ready and answer["ready"]
        ready = ready and all(w["ready"] for w in workers)
        return ready, {**document, "ready": ready, "missing": missing,
                       "workers": sorted(workers, key=lambda w: w["index"])}

    async def live(self) -> tuple[bool, dict[str, Any]]:
        """Live when every worker's event loop answers within LIVE_TIMEOUT_S."""
        answers = await self.siblings.ask_others({"op": "live"}, LIVE_TIMEOUT_S)
        workers: list[dict[str, Any]] = [{"index": self.slot.index, "live": True}]
        for index, answer in answers.items():
            if isinstance(answer, SiblingUnavailable):
                workers.append({"index": index, "live": False, "error": str(answer)})
            else:
                workers.append({"index": index, "live": True})
        live = all(w["live"] for w in workers)
        return live, {"live": live, "workers": sorted(workers, key=lambda w: w["index"])}
