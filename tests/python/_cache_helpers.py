"""Shared fixtures and process workers for the Cache API tests.

Test modules load it with ``pytest_plugins = ["_cache_helpers"]`` and import
the workers inside their tests (a top-level import would happen before
pytest can rewrite this module's asserts).  Workers live here, not in the
test modules, so that processes started with ``spawn`` can import them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import pytest

from nearcache import Cache


def _raw_entry(cache: Cache, key: str | bytes) -> tuple[bytes, int]:
    entry = cache.native.get_entry(key)
    assert entry is not None, f"{key!r} is not in the cache"
    return entry


@pytest.fixture
def raw_entry() -> Callable[[Cache, str | bytes], tuple[bytes, int]]:
    """Reads the stored (payload, flags) of a key, below the Python layer."""
    return _raw_entry


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private default directory for caches opened by name."""
    directory = tmp_path / "caches"
    monkeypatch.setenv("NEARCACHE_DIR", str(directory))
    return directory


@pytest.fixture
def make_cache(tmp_path: Path) -> Iterator[Callable[..., Cache]]:
    """Factory of caches on private paths (1 MiB, 2 MiB spill budget unless told);
    closes them after the test."""
    opened: list[Cache] = []

    def factory(name: str = "c", **options: Any) -> Cache:
        options.setdefault("size", "1MiB")
        # A small spill budget: tests of the value size limit stay small.
        options.setdefault("spill_budget", "2MiB")
        cache = Cache(path=tmp_path / name, **options)
        opened.append(cache)
        return cache

    yield factory
    for cache in opened:
        if not cache.closed:
            cache.close()


@pytest.fixture
def cache(make_cache: Callable[..., Cache]) -> Cache:
    """A fresh 1 MiB cache."""
    return make_cache()


# ------------------------------------------------------------------ process workers


def slow_square(cache_path: str, x: int, delay: float) -> int:
    """The function memoized in the stampede tests: counts its runs in the cache."""
    counter = Cache(path=cache_path)
    counter.incr(f"runs:{x}")
    time.sleep(delay)
    return x * x


def memoize_worker(cache_path: str, barrier: Barrier, x: int, delay: float, out: Any) -> None:
    """Open the cache, wait for every worker, then call the memoized function once."""
    cache = Cache(path=cache_path)

    @cache.memoize(ttl=60, name="tests.slow_square", lock_ttl=30)
    def square(value: int) -> int:
        return slow_square(cache_path, value, delay)

    barrier.wait()
    out.put((os.getpid(), square(x)))


def lock_counter_worker(cache_path: str, barrier: Barrier, rounds: int) -> None:
    """Increment a get-then-set counter under the lock: only exclusion keeps it exact."""
    cache = Cache(path=cache_path)
    barrier.wait()
    for _ in range(rounds):
        with cache.lock("counter", timeout=30, expire=10):
            value = cache.get("count", 0)
            time.sleep(0.001)
            cache.set("count", value + 1)


def lock_and_die_worker(cache_path: str, expire: float, ready: Any) -> None:
    """Take a lock, report it, then die without releasing it."""
    cache = Cache(path=cache_path)
    lock = cache.lock("orphan", expire=expire)
    assert lock.acquire(blocking=False)
    ready.set()
    time.sleep(60)  # killed by the test long before this ends
