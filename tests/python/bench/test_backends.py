"""Every backend adapter honours the same small contract, or says why it cannot run."""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from nearcache.bench.backends import (
    Backend,
    BackendContext,
    Capacity,
    Scope,
    all_backends,
    get_backend,
    register,
)
from nearcache.bench.backends.base import format_bytes
from nearcache.bench.backends.ours import calibrate_size, calibration_key, held_entries

NO_SERVER = [b.name for b in all_backends() if b.server is None]
WITH_SERVER = [b.name for b in all_backends() if b.server is not None]


def _roundtrip(backend: Backend) -> None:
    handle = backend.open()
    try:
        value = b"\x00value" * 10
        assert handle.get("absent-key") is None
        handle.set("some-key", value)
        assert handle.get("some-key") == value
        if backend.stores_objects:
            obj = {"a": [1, 2.5, "x"]}
            handle.set("obj-key", obj)
            assert handle.get("obj-key") == obj
        else:
            handle.set("obj-key", pickle.dumps({"a": 1}))
            assert pickle.loads(handle.get("obj-key")) == {"a": 1}
        handle.delete("some-key")
        assert handle.get("some-key") is None
        handle.set("other", value)
    finally:
        handle.close()
    backend.clear()
    handle = backend.open()
    try:
        assert handle.get("other") is None
    finally:
        handle.close()


@pytest.mark.parametrize("name", NO_SERVER)
def test_local_backend_contract(name: str, ctx: BackendContext) -> None:
    cls = get_backend(name)
    reason = cls.unavailable(ctx)
    if reason is not None:
        assert reason and "\n" not in reason
        pytest.skip(reason)
    backend = cls(ctx, Capacity(items=100, entry_bytes=80, key_bytes=16, value_bytes=64), "t")
    try:
        assert backend.limit()
        _roundtrip(backend)
    finally:
        backend.destroy()


@pytest.mark.parametrize("name", WITH_SERVER)
def test_server_backends_skip_without_a_server(name: str, ctx: BackendContext) -> None:
    reason = get_backend(name).unavailable(ctx)
    assert reason is not None and "\n" not in reason


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", WITH_SERVER)
def test_server_backend_contract(name: str, server_ctx: BackendContext) -> None:
    cls = get_backend(name)
    reason = cls.unavailable(server_ctx)
    if reason is not None:
        pytest.skip(reason)
    backend = cls(server_ctx, Capacity(entry_bytes=80), "t")
    try:
        _roundtrip(backend)
    finally:
        backend.destroy()


def test_process_local_store_is_per_process(ctx: BackendContext) -> None:
    backend = get_backend("dict")(ctx, Capacity(), "t")
    handle = backend.open()
    handle.set("k", b"v")
    pid = os.fork()
    if pid == 0:  # a child sees an empty store of its own
        os._exit(0 if backend.open().get("k") is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert backend.open().get("k") == b"v"


def test_capacity_conversions() -> None:
    assert Capacity(items=10, entry_bytes=100).max_bytes() == 1000
    assert Capacity(bytes=1000, entry_bytes=100).max_items() == 10
    assert Capacity().max_items() is None and not Capacity().bounded
    assert Capacity(items=5).describe() == "5 entries"
    assert format_bytes(1536) == "1.5 KiB"


def test_count_bounded_backends_evict(ctx: BackendContext) -> None:
    for name in ("cachetools", "cachebox", "django-locmem"):
        cls = get_backend(name)
        if cls.unavailable(ctx):
            continue
        backend = cls(ctx, Capacity(items=50, entry_bytes=20), name)
        handle = backend.open()
        for i in range(200):
            handle.set(f"k{i}", b"v")
        present = sum(handle.get(f"k{i}") is not None for i in range(200))
        assert 0 < present <= 50, name
        backend.destroy()


def test_nearcache_file_is_calibrated_to_the_entry_count(ctx: BackendContext) -> None:
    native = pytest.importorskip("nearcache._native")
    cls = get_backend("nearcache-native")
    backend = cls(ctx, Capacity(items=1000, entry_bytes=48, key_bytes=8, value_bytes=40), "cal")
    try:
        assert "holds ~1,000 entries on average" in backend.limit()
        handle = backend.open()
        for i in range(1000):
            handle.set(f"key:{i:04d}", b"v" * 40)
        # Sized for 1,000 on average once full, so a fresh file holds the first 1,000.
        assert sum(handle.get(f"key:{i:04d}") is not None for i in range(1000)) == 1000
        handle.close()
        # Once full (distinct 8-byte keys keep arriving), it holds 1,000 on average,
        # within 5% (the file size moves in 4 KiB pages: 56 entries of this size),
        # admitting leniently as the calibration does (a shard warming up strictly
        # frees half as much per compaction, and holds more).
        cache = native.NativeCache(backend.path, backend.size)
        cache.set_eviction_mode("lenient")
        counts = []
        for i in range(3000):
            cache.set(f"new:{i:04d}", b"w" * 40)
            if i >= 1000:
                counts.append(len(cache))
        cache.close()
        mean = sum(counts) / len(counts)
        assert 950 <= mean <= 1050, mean
        assert min(counts) < 1000 < max(counts)  # compactions: a sawtooth around it
    finally:
        backend.destroy()
    assert not Path(backend.path).exists()


def test_calibration_keys_have_the_workload_key_length() -> None:
    keys = [calibration_key(i, 8) for i in range(5000)]
    assert {len(k) for k in keys} == {8}
    assert len(set(keys)) == 5000
    assert len(calibration_key(16**3, 3)) == 4  # too short to count that far: longer, distinct


def test_held_entries_sees_the_sawtooth(tmp_path: Path) -> None:
    native = pytest.importorskip("nearcache._native")
    path = str(tmp_path / "held")
    small = held_entries(native, path, 64 * 1024, 8, b"v" * 40, 1000)
    large = held_entries(native, path, 128 * 1024, 8, b"v" * 40, 1000)
    assert small[1] <= small[0] <= small[2] < 1000  # too small: never reaches 1,000
    assert large[0] > small[0] and large[2] > 1000
    assert held_entries(native, path, 1, 8, b"v" * 40, 1000) == (0.0, 0, 0)  # cannot create
    assert not Path(path).exists()


def test_calibration_replays_sets_that_rewrite_a_key_space(tmp_path: Path) -> None:
    native = pytest.importorskip("nearcache._native")
    path = str(tmp_path / "held")
    size = 128 * 1024
    new_keys = held_entries(native, path, size, 8, b"v" * 40, 1000)
    rewrites = held_entries(native, path, size, 8, b"v" * 40, 1000, key_space=1100)
    # Rewritten keys leave dead copies until a compaction: the same file holds fewer.
    assert rewrites[0] < new_keys[0]
    sized = calibrate_size(tmp_path, 1000, 8, 40, key_space=1100)
    assert sized > calibrate_size(tmp_path, 1000, 8, 40)
    held = held_entries(native, path, sized, 8, b"v" * 40, 1000, key_space=1100)[0]
    assert abs(held - 1000) <= 50  # holds what the label says, within 5% (either side)


def test_register_rejects_duplicates() -> None:
    class Dup(Backend):
        name = "dict"
        scope = Scope.PROCESS

    with pytest.raises(ValueError):
        register(Dup)
    with pytest.raises(KeyError):
        get_backend("no-such-backend")
