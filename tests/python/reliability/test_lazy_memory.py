"""Memory that follows the data: a cache file is sparse and its shards
reserve space as they fill; a file system that runs out of room makes a
shard evict within the space it holds, never a SIGBUS or a failed get.

The dangerous parts run in child processes, so that a SIGBUS shows up as a
failed test (the child's exit status), not as a dead test run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from nearcache import Cache, _native
from nearcache._native import NativeCache

from ._helpers import Child, mounted_tmpfs


def held(path: str) -> int:
    """Bytes the file holds (what ``du`` reports)."""
    return os.stat(path).st_blocks * 512


@pytest.fixture
def shm_dir() -> Iterator[Path]:
    """A private directory on /dev/shm: block counts there are exactly the
    pages the file holds (a disk file system adds its own metadata)."""
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    path = Path(tempfile.mkdtemp(prefix="nc-lazy-", dir="/dev/shm"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tiny_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for the test (root only)."""
    with mounted_tmpfs(tmp_path, "2m") as mnt:
        yield mnt


def test_new_cache_holds_only_headers_and_stats_report_it(shm_dir: Path) -> None:
    path = str(shm_dir / "c")
    cache = Cache(path=path, size="256MiB")
    stats = cache.stats()
    assert stats["file_bytes"] >= 255 << 20
    assert stats["held_bytes"] == held(path)
    assert held(path) <= 4096 + stats["shards"] * 8192
    per_shard = cache._native.shard_stats()
    assert sum(s["held_bytes"] for s in per_shard) + 4096 == stats["held_bytes"]


def test_held_memory_grows_with_stored_bytes(shm_dir: Path) -> None:
    path = str(shm_dir / "c")
    cache = NativeCache(path, 256 << 20)
    shards = cache.stats()["shards"]
    previous = held(path)
    for step in range(1, 5):
        for i in range((step - 1) * 1000, step * 1000):
            cache.set(f"fragment-{i}", os.urandom(1600))
        stats = cache.stats()
        assert stats["held_bytes"] == held(path)
        assert held(path) > previous
        previous = held(path)
        # 1.2x the stored bytes plus header and index page, dead-entry slack,
        # growth chunk and rounding: 96 KiB a shard.
        assert held(path) <= stats["live_bytes"] * 1.2 + 4096 + shards * 96 * 1024


def test_full_tmpfs_evicts_within_held_space(tiny_tmpfs: Path) -> None:
    """A 64 MiB cache on a 2 MiB tmpfs: sets keep working (older entries
    are evicted once the file system is full), every get answers, no
    SIGBUS; an entry too large for its shard's held space is refused with
    CacheFullError and the old value stays."""
    path = str(tiny_tmpfs / "c")

    def work() -> str:
        cache = NativeCache(path, 64 << 20, 4)
        for i in range(4000):
            cache.set(f"k{i}", bytes([i % 251]) * 1500)
            assert cache.get(f"k{i}") == bytes([i % 251]) * 1500
            cache.get(f"k{i // 2}")  # a hit or a miss, never an error
        stats = cache.stats()
        assert stats["evictions"] > 0, stats
        assert stats["held_bytes"] <= 2 << 20, stats
        cache.set("big", b"old")
        # Inline only: an entry larger than the shard's held space (in a
        # segmented shard, larger than a segment: refused before the file
        # system is asked).
        inline = NativeCache(path, 0, 0, create=False, spill_budget=0)
        try:
            inline.set("big", b"x" * (4 << 20))
        except _native.CacheFullError as exc:
            assert "nothing was changed" in str(exc)
        except _native.ValueTooLargeError as exc:
            assert "the cache was left unchanged" in str(exc)
        else:
            raise AssertionError("a 4 MiB entry fit in a 2 MiB file system")
        assert inline.get("big") == b"old"
        inline.close()
        # Spilled: the file does not fit the file system either.
        try:
            cache.set("big", b"x" * (4 << 20))
        except _native.CacheFullError as exc:
            assert "the previous value is kept" in str(exc)
        else:
            raise AssertionError("a 4 MiB value fit in a 2 MiB file system")
        assert cache.get("big") == b"old"
        assert cache.stats()["spilled_bytes"] == 0
        cache.check()
        return f"{stats['evictions']} {stats['items']}"

    result = Child(work).wait(timeout=60)
    assert result.ok, result.error
    # The file system is full, yet another process can still use the cache.
    reader = NativeCache(path, 0, create=False)
    assert reader.get("big") == b"old"
    reader.set("more", b"v" * 1000)
    assert reader.get("more") == b"v" * 1000


def test_processes_grow_one_shard_together(shm_dir: Path) -> None:
    path = str(shm_dir / "c")
    cache = NativeCache(path, 32 << 20, 1)

    def writer(prefix: str) -> str:
        # A long lock timeout: four writers share one shard on a loaded machine.
        c = NativeCache(path, 0, create=False, lock_timeout_ms=30_000)
        for i in range(3000):
            c.set(f"{prefix}{i}", prefix.encode() * 700)
        return "ok"

    children = [Child(lambda p=p: writer(p)) for p in "abcd"]  # type: ignore[misc]
    results = [child.wait(timeout=60) for child in children]
    assert all(r.ok for r in results), results
    stats = cache.stats()
    assert stats["items"] == 12000 and stats["evictions"] == 0, stats
    assert stats["held_bytes"] == held(path)
    for p in "abcd":
        assert cache.get(f"{p}2999") == p.encode() * 700
    cache.check()


def test_clear_gives_the_memory_back(shm_dir: Path) -> None:
    path = str(shm_dir / "c")
    cache = NativeCache(path, 64 << 20)
    empty = held(path)
    for i in range(10_000):
        cache.set(f"k{i}", b"v" * 1000)
    assert held(path) > 8 << 20
    other = NativeCache(path, 0, create=False)  # a second mapping of the pages
    assert other.get("k9999") == b"v" * 1000
    cache.clear()
    assert held(path) == empty == cache.stats()["held_bytes"]
    assert other.get("k9999") is None
    other.set("again", b"w" * 5000)
    assert cache.get("again") == b"w" * 5000
    cache.check()
