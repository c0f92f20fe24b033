"""Statistics helpers: medians, percentiles, pooled samples, histograms."""

from __future__ import annotations

import random
from array import array

import pytest

from nearcache.bench.stats import (
    PERCENTILES,
    LatencySummary,
    histogram,
    median,
    merge_samples,
    percentile,
    percentiles,
    summarize_latencies,
)


def test_median_odd_and_even() -> None:
    assert median([5, 1, 3]) == 3.0
    assert median([4, 1, 3, 2]) == 2.5
    with pytest.raises(ValueError):
        median([])


def test_percentile_interpolates_like_numpy_default() -> None:
    data = [10.0, 20.0, 30.0, 40.0, 50.0]
    assert percentile(data, 0) == 10.0
    assert percentile(data, 100) == 50.0
    assert percentile(data, 50) == 30.0
    assert percentile(data, 25) == 20.0
    assert percentile(data, 90) == pytest.approx(46.0)
    assert percentile([7.0], 99) == 7.0
    with pytest.raises(ValueError):
        percentile(data, 101)
    with pytest.raises(ValueError):
        percentile([], 50)


def test_pooled_percentile_is_not_the_mean_of_per_process_percentiles() -> None:
    # One fast process and one slow one: the pooled P99 is the slow one's tail,
    # far from the average of the two P99s.
    fast = array("q", [100] * 990 + [200] * 10)
    slow = array("q", [10_000] * 1000)
    pooled = merge_samples([fast, slow])
    assert len(pooled) == 2000
    assert list(pooled) == sorted(pooled)
    p50 = percentile(pooled, 50)
    assert 200 <= p50 <= 10_000
    mean_of_p99 = (percentile(sorted(fast), 99) + percentile(sorted(slow), 99)) / 2
    assert percentile(pooled, 99) == 10_000
    assert mean_of_p99 < 6_000


def test_latency_summary_fields() -> None:
    rng = random.Random(1)
    parts = [array("q", [rng.randint(1, 1000) for _ in range(500)]) for _ in range(4)]
    summary, pooled = summarize_latencies(parts)
    assert isinstance(summary, LatencySummary)
    assert summary.count == 2000
    assert summary.max_ns == max(max(p) for p in parts)
    assert summary.total_ns == sum(sum(p) for p in parts)
    figures = summary.as_dict()
    assert figures["p50_ns"] <= figures["p90_ns"] <= figures["p99_ns"] <= figures["max_ns"]
    assert figures["count"] == 2000
    assert len(pooled) == 2000


def test_empty_summary() -> None:
    summary = LatencySummary(array("q"))
    assert summary.count == 0
    assert summary.as_dict()["max_ns"] == 0


def test_histogram_counts_everything_and_is_log_bucketed() -> None:
    data = sorted([1, 2, 3, 100, 101, 1000, 1_000_000, 1_000_001])
    hist = histogram(data)
    assert sum(count for _, count in hist) == len(data)
    lowers = [lower for lower, _ in hist]
    assert lowers == sorted(lowers)
    # 1,000,000 and 1,000,001 fall in the same bucket (12.5% wide at most).
    assert [c for lower, c in hist if lower <= 1_000_000 < lower * 1.125 + 1] == [2]


def test_percentiles_match_a_direct_linear_interpolation() -> None:
    # The definition (NumPy's default), written out, against statistics.quantiles.
    rng = random.Random(7)
    for size in (2, 3, 10, 997, 5000):
        ordered = sorted(rng.randint(0, 10**6) for _ in range(size))
        for pct in (*PERCENTILES, 0.0, 1.0, 33.3, 100.0):
            rank = pct / 100 * (size - 1)
            lo = int(rank)
            hi = min(lo + 1, size - 1)
            expected = ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)
            assert percentile(ordered, pct) == pytest.approx(expected, rel=1e-12, abs=1e-9)
        assert percentiles(ordered, PERCENTILES) == [percentile(ordered, p) for p in PERCENTILES]
