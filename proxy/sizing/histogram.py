"""An exact histogram of integer lengths (value → count): the report's and the demand's percentiles.

Token counts are small integers with many repeats, so a value → count dict is
exact — no sketch, no sampling — and its size is the number of distinct
lengths, not the number of requests.  Percentiles follow `proxy.sizing.lengths`'
definition (numpy's linear method).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

STANDARD_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


class Histogram:
    """An exact multiset of integer lengths: value → count.

    Only the dict is updated per value (the hot path of a million-line
    report); sorted order, count and sum are derived once when asked for.
    """

    __slots__ = ("_index_cache", "counts")

    def __init__(self, values: Iterable[int] = ()) -> None:
        self.counts: dict[int, int] = {}
        self._index_cache: tuple[list[int], list[int], int] | None = None
        for v in values:
            self.add(v)

    @classmethod
    def of_counts(cls, counts: dict[int, int]) -> Histogram:
        """A view of an existing value → count dict (not copied)."""
        h = cls()
        h.counts = counts
        return h

    def add(self, value: int, count: int = 1) -> None:
        self.counts[value] = self.counts.get(value, 0) + count
        self._index_cache = None

    def merge(self, other: Histogram) -> None:
        for value, count in other.counts.items():
            self.add(value, count)

    def _index(self) -> tuple[list[int], list[int], int]:
        """Sorted distinct values, the cumulative count up to each, and the sum."""
        cache = self._index_cache
        if cache is None:
            values = sorted(self.counts)
            cumulative: list[int] = []
            running = total = 0
            for v in values:
                c = self.counts[v]
                running += c
                total += v * c
                cumulative.append(running)
            cache = self._index_cache = (values, cumulative, total)
        return cache

    @property
    def n(self) -> int:
        cumulative = self._index()[1]
        return cumulative[-1] if cumulative else 0

    @property
    def total(self) -> int:
        return self._index()[2]

    def value_at(self, rank: int) -> int:
        """The value at 0-based position `rank` of the sorted multiset."""
        values, cumulative, _ = self._index()
        return values[bisect.bisect_right(cumulative, rank)]

    def percentile(self, p: float) -> float:
        """Same definition as `percentile` (numpy linear), without expanding the values."""
        n = self.n
        if n == 0:
            raise ValueError("percentile of an empty histogram")
        if not 0 <= p <= 100:
            raise ValueError(f"percentile must be within [0, 100], got {p}")
        h = (n - 1) * p / 100
        lo = math.floor(h)
        a = self.value_at(lo)
        b = self.value_at(min(lo + 1, n - 1))
        return a + (h - lo) * (b - a)

    def count_above(self, threshold: float) -> int:
        values, cumulative, _ = self._index()
        i = bisect.bisect_right(values, threshold)
        return self.n - (cumulative[i - 1] if i else 0)

    @property
    def mean(self) -> float:
        n = self.n
        return self.total / n if n else 0.0

    @property
    def max(self) -> int:
        return max(self.counts) if self.counts else 0

    def summary(self, extra: Sequence[float] = ()) -> dict[str, float | int | None]:
        """count, mean, p50/p90/p95/p99 (+ extra), max — None when empty."""
        keys = sorted(set(STANDARD_PERCENTILES) | set(extra))
        out: dict[str, float | int | None] = {"count": self.n}
        out["mean"] = self.mean if self.n else None
        for p in keys:
            out[percentile_key(p)] = self.percentile(p) if self.n else None
        out["max"] = self.max if self.n else None
        return out


def percentile_key(p: float) -> str:
    """'p99', 'p99.9': the JSON key of a percentile."""
    return f"p{p:g}"
