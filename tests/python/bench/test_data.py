"""Data generators: deterministic, right sizes, right skew."""

from __future__ import annotations

import random
from collections import Counter

from nearcache.bench.data import (
    ZipfSampler,
    binary_values,
    complex_values,
    pickled_size,
    short_keys,
    uuid_keys,
)


def test_uuid_keys_are_36_chars_distinct_and_seeded() -> None:
    keys = uuid_keys(random.Random(7), 500)
    assert len(set(keys)) == 500
    assert all(len(k) == 36 and k.count("-") == 4 for k in keys)
    assert keys == uuid_keys(random.Random(7), 500)


def test_binary_values_sizes() -> None:
    exact = binary_values(random.Random(1), 50, 160, 0.0)
    assert {len(v) for v in exact} == {160}
    spread = binary_values(random.Random(1), 2000, 465, 0.5)
    sizes = [len(v) for v in spread]
    assert min(sizes) >= 232 and max(sizes) <= 698
    assert abs(sum(sizes) / len(sizes) - 465) < 15


def test_complex_values_key_counts_and_pickled_size_grow() -> None:
    rng = random.Random(3)
    small = complex_values(rng, 300, 5)
    large = complex_values(rng, 300, 55)
    assert abs(sum(len(d) for d in small) / 300 - 5) < 0.5
    assert abs(sum(len(d) for d in large) / 300 - 55) < 3
    assert pickled_size(large) > 5 * pickled_size(small)
    assert pickled_size([]) == 0


def test_short_keys() -> None:
    assert short_keys(3) == ["key:0", "key:1", "key:2"]


def test_zipf_skew_matches_the_distribution() -> None:
    sampler = ZipfSampler(1000, 0.99)
    draws = sampler.sample(random.Random(5), 50_000)
    assert all(0 <= d < 1000 for d in draws)
    counts = Counter(draws)
    top = counts[0] / len(draws)
    assert abs(top - sampler.probability(0)) < 0.01
    assert counts[0] > counts[9] > counts[500]
    assert abs(sum(sampler.probability(r) for r in range(1000)) - 1.0) < 1e-9
