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
