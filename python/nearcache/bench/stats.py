"""Statistics for benchmark figures, on the standard library's :mod:`statistics`.

Latency percentiles are computed from the raw per-operation samples of every
process pooled together (:func:`merge_samples`), never by averaging the
percentiles of each process: the P99 of eight processes is not the mean of
their eight P99s.
"""

from __future__ import annotations

import math
import statistics
from array import array
from collections.abc import Iterable, Sequence
from fractions import Fraction

__all__ = [
    "PERCENTILES",
    "LatencySummary",
    "LogHistogram",
    "histogram",
    "median",
    "merge_samples",
    "percentile",
    "percentiles",
    "summarize_latencies",
]

#: Percentiles reported for latency workloads (and plotted).
PERCENTILES: tuple[float, ...] = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9)


def median(values: Iterable[float]) -> float:
    """Median of ``values`` (the mean of the two middle values for even counts).

    >>> median([3, 1, 2])
    2.0
    >>> median([4, 1, 2, 3])
    2.5
    """
    data = list(values)
    if not data:
        raise ValueError("median of no values")
    return float(statistics.median(data))


def percentile(ordered: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile of already sorted values, by linear interpolation.

    This is the usual definition (NumPy's default): rank ``pct/100 * (n-1)``,
    which is :func:`statistics.quantiles` with ``method="inclusive"``.

    >>> percentile([10, 20, 30, 40, 50], 50)
    30.0
    >>> percentile([10, 20, 30, 40, 50], 90)
    46.0
    """
    return percentiles(ordered, (pct,))[0]


def percentiles(ordered: Sequence[float], pcts: Sequence[float]) -> list[float]:
    """Several percentiles of already sorted values in one pass of
    :func:`statistics.quantiles` (``method="inclusive"``, cut into as many
    parts as the finest percentile needs: 1000 for P99.9).

    >>> percentiles([10, 20, 30, 40, 50], (0, 25, 99.9, 100))
    [10.0, 20.0, 49.96, 50.0]
    """
    if len(ordered) == 0:
        raise ValueError("percentile of no values")
    for pct in pcts:
        if not 0.0 <= pct <= 100.0:
            raise ValueError(f"percentile out of range: {pct}")
    if len(ordered) == 1:
        return [float(ordered[0])] * len(pcts)
    fractions = [Fraction(str(pct)) / 100 for pct in pcts]
    parts = math.lcm(*(f.denominator for f in fractions))
    cuts = statistics.quantiles(ordered, n=parts, method="inclusive") if parts > 1 else []
    out: list[float] = []
    for f in fractions:
        if f == 0:
            out.append(float(ordered[0]))
        elif f == 1:
            out.append(float(ordered[-1]))
        else:
            out.append(float(cuts[f.numerator * (parts // f.denominator) - 1]))
    return out


def merge_samples(parts: Iterable[Sequence[int]]) -> array[int]:
    """Pool the raw samples of several processes into one sorted array."""
    pooled: array[int] = array("q")
    for part in parts:
        pooled.extend(part)
    return array("q", sorted(pooled))


def histogram(ordered: Sequence[int], sub_buckets: int = 8) -> list[list[int]]:
    """A sparse log-scale histogram of nanosecond samples: ``[[lower_ns, count], ...]``.

    Buckets are powers of two split into ``sub_buckets`` equal parts, so each
    bucket is at most 1/sub_buckets wide relative to its value (12.5% by
    default).  Compact enough to keep in the JSON output for every backend,
    precise enough to redraw the latency distribution.
    """
    counts: dict[int, int] = {}
    for v in ordered:
        lower = _bucket_lower(max(int(v), 0), sub_buckets)
        counts[lower] = counts.get(lower, 0) + 1
    return [[k, counts[k]] for k in sorted(counts)]


def _bucket_lower(v: int, sub_buckets: int) -> int:
    if v < sub_buckets:
        return v
    top = v.bit_length() - 1
    width = (1 << top) // sub_buckets
    return (v // width) * width


class LatencySummary:
    """Count, percentiles, max and total of one action's pooled samples (ns)."""

    __slots__ = ("count", "max_ns", "percentiles_ns", "total_ns")

    def __init__(self, ordered: Sequence[int]) -> None:
        self.count = len(ordered)
        self.total_ns = int(sum(ordered))
        self.max_ns = int(ordered[-1]) if ordered else 0
        self.percentiles_ns: dict[str, float] = (
            dict(zip(map(_pct_key, PERCENTILES), percentiles(ordered, PERCENTILES), strict=True))
            if ordered
            else {}
        )

    def as_dict(self) -> dict[str, float]:
        """Flat figures, for the JSON output and the tables."""
        out: dict[str, float] = {
            "count": float(self.count),
            "max_ns": float(self.max_ns),
            "total_ns": float(self.total_ns),
        }
        for key, value in self.percentiles_ns.items():
            out[f"p{key}_ns"] = value
        return out


def _pct_key(p: float) -> str:
    return f"{p:g}"


def summarize_latencies(parts: Iterable[Sequence[int]]) -> tuple[LatencySummary, array[int]]:
    """Merge per-process samples and summarize them; also return the pooled samples."""
    pooled = merge_samples(parts)
    return LatencySummary(pooled), pooled


class LogHistogram:
    """Counts of nanosecond durations, for runs too long to keep every sample.

    A fill of a 16 GiB cache is some 70 million sets; their samples would
    take gigabytes, and the figures that matter (P99.99, max) need every one
    of them.  Durations below 1,024 ns are counted exactly; above, each power
    of two is split into 512 buckets, so a bucket is at most 1/512 (0.2%)
    of its value wide.  The maximum, count and total are exact.  Bucket
    ``i``: ``i`` itself below 1,024, else ``512 * s + m`` for the duration
    ``d`` with ``s = d.bit_length() - 10`` and ``m = d >> s`` (512..1023).

    >>> h = LogHistogram()
    >>> for ns in (100, 200, 300, 5_000_000):
    ...     h.record(ns)
    >>> (h.count, h.max_ns, h.percentile(50), h.percentile(100))
    (4, 5000000, 200, 5000000)
    >>> abs(h.percentile(99.99) - 5_000_000) <= 5_000_000 // 512
    True
    """

    __slots__ = ("count", "counts", "max_ns", "total_ns")

    def __init__(self) -> None:
        self.counts: dict[int, int] = {}
        self.count = 0
        self.total_ns = 0
        self.max_ns = 0

    @staticmethod
    def bucket(ns: int) -> int:
        """The bucket of a duration (negative durations count as 0)."""
        if ns < 1024:
            return max(ns, 0)
        s = ns.bit_length() - 10
        return (s << 9) + (ns >> s)

    @staticmethod
    def bounds(bucket: int) -> tuple[int, int]:
        """The smallest and largest durations of ``bucket``."""
        if bucket < 1024:
            return bucket, bucket
        s = (bucket >> 9) - 1
        m = bucket - (s << 9)
        return m << s, ((m + 1) << s) - 1

    def record(self, ns: int) -> None:
        """Count one duration."""
        b = self.bucket(ns)
        counts = self.counts
        counts[b] = counts.get(b, 0) + 1
        self.count += 1
        self.total_ns += ns
        if ns > self.max_ns:
            self.max_ns = ns

    def merge(self, other: LogHistogram) -> None:
        """Add ``other``'s counts to this histogram."""
        for b, n in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + n
        self.count += other.count
        self.total_ns += other.total_ns
        self.max_ns = max(self.max_ns, other.max_ns)

    def percentile(self, pct: float) -> int:
        """The nearest-rank ``pct`` percentile: the upper bound of the bucket
        holding the ``ceil(pct / 100 * count)``-th smallest duration (never
        above the maximum).  0 for an empty histogram."""
        if not 0.0 <= pct <= 100.0:
            raise ValueError(f"percentile out of range: {pct}")
        if self.count == 0:
            return 0
        rank = max(1, math.ceil(pct / 100.0 * self.count))
        seen = 0
        for b in sorted(self.counts):
            seen += self.counts[b]
            if seen >= rank:
                return min(self.bounds(b)[1], self.max_ns)
        return self.max_ns

    def to_list(self) -> list[list[int]]:
        """``[[bucket, count], ...]`` (sorted), the JSON form; see :meth:`from_list`."""
        return [[b, self.counts[b]] for b in sorted(self.counts)] + [
            [-1, self.total_ns],
            [-2, self.max_ns],
        ]

    def to_text(self) -> str:
        """:meth:`to_list` as one line, ``"bucket:count ..."`` (compact in indented JSON).

        >>> h = LogHistogram()
        >>> h.record(7); h.record(7); h.record(2048)
        >>> h.to_text()
        '7:2 1536:1 -1:2062 -2:2048'
        >>> LogHistogram.from_text(h.to_text()).percentile(100)
        2048
        """
        return " ".join(f"{b}:{n}" for b, n in self.to_list())

    @classmethod
    def from_text(cls, text: str) -> LogHistogram:
        """The histogram :meth:`to_text` described."""
        try:
            pairs = [[int(x) for x in item.split(":")] for item in text.split()]
        except ValueError:
            raise ValueError(f"bad histogram text {text[:40]!r}") from None
        if any(len(p) != 2 for p in pairs):
            raise ValueError(f"bad histogram text {text[:40]!r}")
        return cls.from_list(pairs)

    @classmethod
    def from_list(cls, data: Sequence[Sequence[int]]) -> LogHistogram:
        """The histogram :meth:`to_list` described."""
        h = cls()
        for b, n in data:
            b, n = int(b), int(n)
            if b == -1:
                h.total_ns = n
            elif b == -2:
                h.max_ns = n
            elif b >= 0 and n > 0:
                h.counts[b] = h.counts.get(b, 0) + n
                h.count += n
            else:
                raise ValueError(f"bad histogram entry {[b, n]}")
        return h
