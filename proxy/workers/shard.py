"""One worker's share of brimful's own pages, and the merge of every worker's share.

With `--workers N` each worker counts only what it served.  The primary
worker answers `/metrics` and `/stats` from all shares, merged here so the
pages say what one process serving everything would say:

* **metric families**: counters and histogram series (buckets, counts, sums)
  are summed sample by sample, which is exact because every observation
  happened in exactly one worker; a `_created` sample keeps the earliest
  time.  Gauges are summed (requests in flight, queued, cache entries)
  except the per-model states every worker holds on its own, where the
  merge says whether any worker is in it (`GAUGE_MERGE`).
* **the recent window**: per model, the union of the workers' windows,
  latest `max_records` by time: the exact window of all traffic, since a
  sample among the latest of all is among the latest of its worker.
* **how each model is counted** (`/stats` "counting"): the least trusting
  worker's state, drift and engine failures added up.

Pure functions over JSON-able values: the shares travel between workers as
JSON (proxy.workers.siblings).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from proxy.recording.stats import Sample

WireFamily = dict[str, Any]        # {"name", "documentation", "type", "unit", "samples": [[name, labels, value]]}
Window = dict[str, list[Sample]]   # model -> samples

# Gauges whose value is a per-model state each worker holds: 1 when any worker
# is in it (max), or 0 when any worker found a mismatch (min).  Others add up.
GAUGE_MERGE: dict[str, Callable[[Iterable[float]], float]] = {
    "brimful_tokenizer_parity": min,
    "brimful_count_mode": max,
    "brimful_count_engine": max,
    "brimful_model_limit_unknown": max,    # every worker reads the same lists
}

# proxy.admitted.trust's modes, most trusting first: the merged state is the last one any worker is in.
_MODES = ("local", "upstream", "margin")


# ---------------------------------------------------------------------------
# Metric families
# ---------------------------------------------------------------------------

def families_to_wire(families: Iterable[Metric]) -> list[WireFamily]:
    return [{"name": f.name, "documentation": f.documentation, "type": f.type, "unit": f.unit,
             "samples": [[s.name, s.labels, s.value] for s in f.samples]} for f in families]


def merge_families(shares: Sequence[Sequence[WireFamily]]) -> list[Metric]:
    """Every worker's families as one set (see the module docstring for the rules)."""
    merged: dict[str, tuple[WireFamily, dict[tuple[str, tuple[tuple[str, str], ...]], list[float]]]] = {}
    for share in shares:
        for family in share:
            entry = merged.get(family["name"])
            if entry is None:
                entry = merged[family["name"]] = (family, {})
            values = entry[1]
            for name, labels, value in family["samples"]:
                values.setdefault((name, tuple(labels.items())), []).append(value)
    out = []
    for name, (first, values) in merged.items():
        metric = Metric(name, first["documentation"], first["type"], first["unit"])
        for (sample, labels), seen in values.items():
            metric.add_sample(sample, dict(labels), _combine(first["type"], name, sample, seen))
        out.append(metric)
    return out


def _combine(kind: str, family: str, sample: str, values: list[float]) -> float:
    if sample.endswith("_created"):
        return min(values)
    if kind == "gauge":
        return float(GAUGE_MERGE.get(family, sum)(values))
    return sum(values)


# Families whose samples only ever grow while their process lives (a restart resets them).
MONOTONE_TYPES = frozenset({"counter", "histogram", "summary"})

Seen = dict[str, Any]   # {"retired": [WireFamily], "last": {"<index>": {"pid": int, "families": [WireFamily]}}}


def sum_families(shares: Sequence[Sequence[WireFamily]]) -> list[WireFamily]:
    """Several sets of families as one, in the wire form (the same rules as merge_families)."""
    return families_to_wire(merge_families(shares))


def carry_totals(seen: Seen, shares: Sequence[Mapping[str, Any]],
                 missing: Iterable[int]) -> tuple[Seen, list[list[WireFamily]]]:
    """The memory of every worker's counters, so that merged counters never go backwards.

    `seen` holds each slot's last-seen counters and histograms (with the pid
    that counted them) and the "retired" totals of workers that are gone.  A
    share from a new pid in a slot means the old worker died (kill -9, OOM):
    its last-seen totals join the retired ones.  For the same pid the memory
    keeps each sample's largest value (two pages answered at once may bring
    their shares in either order).  A worker that does not answer (dead,
    restarting, backing off, slow) is shown at its last-seen totals.
    Returns the new memory and the counters and histograms to show: merge
    them with the answers' other families (`without_monotone`).
    """
    last: dict[str, Any] = dict(seen.get("last", {}))
    retired: list[WireFamily] = list(seen.get("retired", []))
    gone = []
    for share in shares:
        key = str(share["index"])
        previous = last.get(key)
        families = [f for f in share["families"] if f["type"] in MONOTONE_TYPES]
        if previous is not None and previous["pid"] != share["pid"]:
            gone.append(previous["families"])
        elif previous is not None:
            families = _largest(previous["families"], families)
        last[key] = {"pid": share["pid"], "families": families}
    if gone:
        retired = sum_families([retired, *gone])
    shown_keys = {str(share["index"]) for share in shares} | {str(index) for index in missing}
    shown = [last[key]["families"] for key in sorted(last) if key in shown_keys]
    return {"retired": retired, "last": last}, [retired, *shown]


def without_monotone(families: Iterable[WireFamily]) -> list[WireFamily]:
    """A share's gauges and the like: what `carry_totals` does not show for it."""
    return [f for f in families if f["type"] not in MONOTONE_TYPES]


def _largest(old: Sequence[WireFamily], new: Sequence[WireFamily]) -> list[WireFamily]:
    """`new`, each sample at least its value in `old` (`_created`: the earliest)."""
    before = {(f["name"], s[0], tuple(sorted(s[1].items()))): s[2] for f in old for s in f["samples"]}
    out = []
    for family in new:
        samples = []
        for name, labels, value in family["samples"]:
            prior = before.get((family["name"], name, tuple(sorted(labels.items()))))
            if prior is not None:
                value = min(value, prior) if name.endswith("_created") else max(value, prior)
            samples.append([name, labels, value])
        out.append({**family, "samples": samples})
    names = {f["name"] for f in new}
    out += [f for f in old if f["name"] not in names]     # a family the new share lacks: kept
    return out


def worker_families(count: int, answered: Iterable[int], slots: Mapping[str, Mapping[str, Any]]) -> list[Metric]:
    """The workers themselves on /metrics: who answered, how often each slot was restarted, who backs off.

    `slots` is the supervisor's word on each slot (proxy.workers.supervisor writes it).
    """
    up = Metric("brimful_worker_up", "Whether the worker in each slot answered for this page (1) or not (0).",
                "gauge")
    restarts = Metric("brimful_worker_restarts", "Workers started in each slot to replace one that exited.",
                      "counter")
    waiting = Metric("brimful_worker_backing_off",
                     "Whether each slot waits out a back-off before its next start (its workers keep exiting).",
                     "gauge")
    answered = set(answered)
    for index in range(count):
        labels = {"worker": str(index)}
        slot = slots.get(str(index), {})
        up.add_sample("brimful_worker_up", labels, float(index in answered))
        restarts.add_sample("brimful_worker_restarts_total", labels, float(slot.get("restarts", 0)))
        waiting.add_sample("brimful_worker_backing_off", labels, float(bool(slot.get("waiting"))))
    return [up, restarts, waiting]


class FamiliesCollector(Collector):
    """Merged families, for prometheus_client's encoders."""

    def __init__(self, families: Sequence[Metric]) -> None:
        self._families = families

    def collect(self) -> Iterator[Metric]:
        yield from self._families


# ---------------------------------------------------------------------------
# The recent window
# ---------------------------------------------------------------------------

def window_to_wire(window: Mapping[str, Sequence[Sample]]) -> dict[str, list[list[Any]]]:
    return {model: [list(s) for s in samples] for model, samples in window.items()}


def window_from_wire(data: Mapping[str, Sequence[Sequence[Any]]]) -> Window:
    return {model: [Sample(*row) for row in rows] for model, rows in data.items()}


def merge_windows(windows: Iterable[Mapping[str, Sequence[Sample]]], max_records: int) -> Window:
    """Per model, the latest `max_records` samples of all the windows, oldest first."""
    merged: Window = {}
    for window in windows:
        for model, samples in window.items():
            merged.setdefault(model, []).extend(samples)
    return {model: _latest(samples, lambda s: s.ts, max_records) for model, samples in merged.items()}


def demand_to_wire(window: Mapping[str, Sequence[Sample]]) -> dict[str, list[tuple[float, int | None]]]:
    """What /metrics needs of a window: per request, its time and demanded KV tokens."""
    return {model: [(s.ts, s.demanded_kv) for s in samples] for model, samples in window.items()}


def merge_demand(shares: Iterable[Mapping[str, Sequence[Sequence[Any]]]], max_records: int) -> dict[str, list[int]]:
    """Per model, the demanded KV tokens of the latest `max_records` requests of all workers."""
    merged: dict[str, list[Sequence[Any]]] = {}
    for share in shares:
        for model, rows in share.items():
            merged.setdefault(model, []).extend(rows)
    return {model: [row[1] for row in _latest(rows, lambda r: r[0], max_records) if row[1] is not None]
            for model, rows in merged.items()}


def _latest(items: list[Any], ts: Callable[[Any], float], max_records: int) -> list[Any]:
    items.sort(key=ts)
    return items[-max_records:] if len(items) > max_records else items


# ---------------------------------------------------------------------------
# How each model is counted
# ---------------------------------------------------------------------------

def _caution(entry: Mapping[str, Any]) -> int:
    mode = entry.get("mode")
    return _MODES.index(mode) if mode in _MODES else -1


def merge_counting(shares: Mapping[int, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """worker index -> its /stats "counting" -> one entry per model.

    The entry is the least trusting worker's (each worker learns from its own
    traffic's usage), with the drift seen and the engine's failures added up;
    `modes_by_worker` appears when the workers do not agree.
    """
    models = sorted({m for share in shares.values() for m in share})
    out: dict[str, dict[str, Any]] = {}
    for model in models:
        held: dict[int, dict[str, Any]] = {i: dict(share[model]) for i, share in sorted(shares.items())
                                           if model in share}
        cautious = max(held.values(), key=_caution)
        base = dict(cautious)
        for key in ("drift_requests", "engine_failures"):
            if any(key in e for e in held.values()):
                base[key] = sum(int(e.get(key) or 0) for e in held.values())
        for key in ("max_under_count", "max_over_count"):
            if any(key in e for e in held.values()):
                base[key] = max(int(e.get(key) or 0) for e in held.values())
        modes = {i: e.get("mode") for i, e in held.items()}
        if len(set(modes.values())) > 1:
            base["modes_by_worker"] = {str(i): mode for i, mode in modes.items()}
        out[model] = base
    return out
