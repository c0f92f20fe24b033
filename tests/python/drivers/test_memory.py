"""MemoryDriver specifics: bounds, LRU order, stats (the contract covers the rest)."""

from __future__ import annotations

import threading

import pytest

from nearcache.drivers import MemoryDriver
from nearcache.errors import ValueTooLargeError


def test_evicts_least_recently_used_by_count() -> None:
    cache = MemoryDriver(max_entries=3)
    cache.set_many({"a": 1, "b": 2, "c": 3})
    assert cache.get("a") == 1  # a is now the most recently used
    cache.set("d", 4)
    assert cache.get_many(["a", "b", "c", "d"]) == {"a": 1, "c": 3, "d": 4}
    assert cache.stats()["evictions"] == 1
    assert len(cache) == 3


def test_evicts_by_bytes() -> None:
    cache = MemoryDriver(max_entries=None, max_bytes=1000)
    for i in range(10):
        cache.set(f"k{i}", b"x" * 198)  # 200 bytes with the key
    stats = cache.stats()
    assert stats["bytes"] <= 1000
    assert stats["entries"] == 5
    assert cache.get_many([f"k{i}" for i in range(10)]).keys() == {f"k{i}" for i in range(5, 10)}


def test_value_size_limit() -> None:
    cache = MemoryDriver(max_bytes=1000, max_value_size=100)
    cache.set("k", b"x" * 100)
    with pytest.raises(ValueTooLargeError):
        cache.set("k", b"x" * 101)
    with pytest.raises(ValueTooLargeError):
        cache.set("k", ["x" * 200])  # serialized size counts for objects
    assert cache.get("k") == b"x" * 100


def test_bounds_are_validated() -> None:
    with pytest.raises(ValueError):
        MemoryDriver(max_entries=0)
    with pytest.raises(ValueError):
        MemoryDriver(max_bytes=0)


def test_stats_count_hits_misses_and_expirations() -> None:
    cache = MemoryDriver()
    cache.set("k", 1)
    cache.set("gone", 1, ttl=0.001)
    cache.get("k")
    cache.get("missing")
    threading.Event().wait(0.01)
    cache.get("gone")
    stats = cache.stats()
    assert (stats["hits"], stats["misses"], stats["expirations"]) == (1, 2, 1)


def test_threads_share_one_bounded_cache() -> None:
    cache = MemoryDriver(max_entries=100)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(500):
                cache.set((n * 1000 + i) % 150, i)
                cache.get(i % 150)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert len(cache) <= 100
