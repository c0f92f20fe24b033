"""Engine hardening, seen from Python: batches with duplicate keys, per-file
hash seeds, and (further below) the defended failure modes of the engine."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from nearcache import Cache
from nearcache._native import NativeCache
from nearcache.errors import ConfigurationError, ShardLockTimeoutError

from ._helpers import hold_in_child, key_in_shard, kill_and_reap


def test_set_many_last_occurrence_wins_even_across_key_types(tmp_path: Path) -> None:
    """``"abc"`` and ``b"abc"`` are one key; within one batch the last of
    them wins, always (an unstable sort used to keep an earlier value)."""
    cache = NativeCache(str(tmp_path / "c"), 4 << 20, 16)
    for batch in range(50):
        items = []
        for round_ in range(3):
            for k in range(30):
                key: str | bytes = f"k{k}" if (k + round_) % 2 else f"k{k}".encode()
                items.append((key, f"{batch}-{round_}".encode(), 0))
        cache.set_many(items)
        for k in range(30):
            assert cache.get(f"k{k}") == f"{batch}-2".encode(), (batch, k)


def test_every_file_hashes_with_its_own_seed(tmp_path: Path) -> None:
    first = NativeCache(str(tmp_path / "a"), 1 << 20, 8)
    second = NativeCache(str(tmp_path / "b"), 1 << 20, 8)
    keys = [f"user:{i}" for i in range(64)]
    placement = [first.shard_of(k) for k in keys]
    assert placement != [second.shard_of(k) for k in keys]
    first.close()
    reopened = NativeCache(str(tmp_path / "a"), 0, create=False)
    assert [reopened.shard_of(k) for k in keys] == placement


# ------------------------------------------------------------- bounded waits


def test_a_sigstopped_lock_holder_costs_a_bounded_wait(tmp_path: Path) -> None:
    """A peer stopped (SIGSTOP) while it holds a shard lock: reads miss and
    writes fail after the lock timeout, counted; other shards are unaffected;
    once the peer is gone, the shard is repaired and usable."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, 4096 + 4 * 64 * 1024, 4, lock_timeout_ms=30)
    skipping = NativeCache(path, 0, create=False, lock_timeout_ms=30, on_lock_timeout="skip")
    cache.set("k0", b"v")
    other = key_in_shard(cache, (cache.shard_of("k0") + 1) % 4)
    cache.set(other, b"free")
    holder = hold_in_child(path, "k0")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        assert cache.get("k0") is None  # a counted miss, not a hang
        with pytest.raises(ShardLockTimeoutError, match="still held"):
            cache.set("k0", b"new")
        assert skipping.set("k0", b"new") is None  # policy "skip": skipped
        assert skipping.add("k0", b"new") is False
        assert skipping.delete("k0") is False
        assert cache.get(other) == b"free"
        assert cache.stats()["lock_timeouts"] == 5
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        kill_and_reap(holder)
    assert cache.get("k0") == b"v"
    cache.set("k0", b"after")
    assert cache.get("k0") == b"after"
    cache.check()


def test_cache_exposes_the_lock_timeout_policy(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="on_lock_timeout"):
        Cache(path=str(tmp_path / "bad"), size="1MiB", on_lock_timeout="wait")
    cache = Cache(
        path=str(tmp_path / "c"), size="1MiB", lock_timeout="20ms", on_lock_timeout="skip"
    )
    assert cache.native.lock_timeout_ms == pytest.approx(20)
    holder = hold_in_child(cache.path, "k")
    os.kill(holder.pid, signal.SIGSTOP)
    try:
        cache.set("k", 1)  # skipped, not raised
        assert cache.get("k") is None
        assert cache.stats()["lock_timeouts"] == 2
    finally:
        os.kill(holder.pid, signal.SIGCONT)
        kill_and_reap(holder)
    cache.set("k", 2)
    assert cache.get("k") == 2
