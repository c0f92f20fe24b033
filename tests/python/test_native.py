"""The native module: conversions, errors from bad input, and that a failed
call loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nearcache import _native as n


@pytest.fixture
def cache(tmp_path: Path) -> n.NativeCache:
    return n.NativeCache(str(tmp_path / "c"), 1 << 20, 2, spill_budget=2 << 20)


def test_bytes_round_trip_and_str_keys(cache: n.NativeCache) -> None:
    cache.set(b"k", b"v")
    assert cache.get(b"k") == b"v"
    assert cache.get("k") == b"v"  # str keys are their UTF-8 bytes
    assert cache.get_entry("k") == (b"v", 0)
    cache.set("ключ", bytearray(b"\x00\xff"), flags=99)
    assert cache.get_entry("ключ") == (b"\x00\xff", 99)
    assert cache.get(b"absent") is None


@pytest.mark.parametrize(
    "value",
    [b"", b"bytes", "", "text ✓", 0, -1, 2**63 - 1, -(2**63), 1.5, float("inf"), True, False, None],
)
def test_typed_values_round_trip(cache: n.NativeCache, value: object) -> None:
    cache.set_typed("k", value)
    got = cache.get_typed("k", "MISS")
    assert got == value and type(got) is type(value)


def test_typed_rejects_other_types_and_big_ints(cache: n.NativeCache) -> None:
    cache.set_typed("k", "old")
    with pytest.raises(TypeError):
        cache.set_typed("k", [1, 2])
    with pytest.raises(OverflowError):
        cache.set_typed("k", 2**64)

    class S(str):
        pass

    with pytest.raises(TypeError):
        cache.set_typed("k", S("subclass"))
    assert cache.get_typed("k") == "old"


def test_int_keys_have_their_own_namespace(cache: n.NativeCache) -> None:
    cache.set(1, b"int")
    cache.set("1", b"str")
    assert cache.get(1) == b"int" and cache.get("1") == b"str"
    assert cache.get(True) == b"int"  # True == 1, so the same key
    assert cache.get(b"\xff1") is None  # bytes never alias an int key
    cache.set(2**100, b"big")
    assert cache.get(2**100) == b"big"
    assert cache.get(b"\xff" + str(2**100).encode()) is None
    cache.set(b"\xff1", b"bytes")
    assert cache.get(1) == b"int" and cache.get(b"\xff1") == b"bytes"
    assert sorted(cache.keys()) == sorted(
        [b"1", b"\xff1", b"\xfe\xff1", b"\xff" + str(2**100).encode()]
    )


def test_decoder_handles_user_flags(tmp_path: Path) -> None:
    seen = []

    def decoder(flags: int, payload: bytes) -> object:
        seen.append((flags, payload))
        return n.MISSING if payload == b"reject" else payload.decode()[::-1]

    c = n.NativeCache(str(tmp_path / "d"), 1 << 20, decoder=decoder)
    c.set("a", b"olleh", flags=n.FLAG_USER)
    c.set("b", b"reject", flags=n.FLAG_USER)
    c.set_typed("c", 5)
    assert c.get_typed("a") == "hello"
    assert c.get_typed("b", "default") == "default"
    assert c.get_typed("c") == 5  # native types never reach the decoder
    assert c.get_many_typed(["a", "b", "c", "z"]) == ["hello", n.MISSING, 5, n.MISSING]
    assert c.pop_typed("a") == "hello" and c.get_typed("a") is None
    assert all(flags == n.FLAG_USER for flags, _ in seen)
    with pytest.raises(TypeError, match="callable"):
        n.NativeCache(str(tmp_path / "e"), 1 << 20, decoder=42)  # type: ignore[arg-type]


def test_get_many_map_keeps_the_callers_keys(cache: n.NativeCache) -> None:
    cache.set_typed("a", "text")
    cache.set_typed(7, 7)
    cache.set("u", b"payload", flags=n.FLAG_USER)
    got = cache.get_many_map(["a", 7, "missing", "u"])
    assert got == {"a": "text", 7: 7, "u": (n.FLAG_USER, b"payload")}
    assert cache.get_many_map([]) == {}
    with pytest.raises(n.KeyTypeError):
        cache.get_many_map(["a", 1.5])  # type: ignore[list-item]


def test_compare_and_delete(cache: n.NativeCache) -> None:
    cache.set("lock", b"me")
    assert not cache.delete_if_equals("lock", b"you")
    assert cache.get("lock") == b"me"
    assert cache.delete_if_equals("lock", b"me")
    assert cache.get("lock") is None


def test_user_flags_come_back_as_tuples(cache: n.NativeCache) -> None:
    cache.set("k", b"payload", flags=n.FLAG_USER + 3)
    assert cache.get_typed("k") == (n.FLAG_USER + 3, b"payload")
    hits = cache.get_many_typed(["k", "missing"])
    assert hits[0] == (n.FLAG_USER + 3, b"payload")
    assert hits[1] is n.MISSING


def test_counters(cache: n.NativeCache) -> None:
    assert cache.incr("c") == 1
    assert cache.incr("c", 10) == 11
    assert cache.incr("c", -20) == -9
    assert cache.get_typed("c") == -9
    with pytest.raises(KeyError):
        cache.incr("nope", 1, None)
    cache.set_typed("s", "text")
    with pytest.raises(n.NotACounterError):
        cache.incr("s")
    cache.set_typed("max", 2**63 - 1)
    with pytest.raises(n.CounterOverflowError):
        cache.incr("max")
    assert cache.get_typed("max") == 2**63 - 1
    with pytest.raises(n.CounterOverflowError):
        cache.incr("c", 2**70)


def test_batches(cache: n.NativeCache) -> None:
    cache.set_many([(f"k{i}", str(i).encode(), i) for i in range(50)], ttl_ms=0)
    got = cache.get_many([f"k{i}" for i in range(51)])
    assert got[:50] == [(str(i).encode(), i) for i in range(50)]
    assert got[50] is None
    assert cache.delete_many(["k1", "k2", "zz"]) == 2
    assert len(cache) == 48
    assert sorted(cache.keys())[:2] == [b"k0", b"k10"]


def test_ttl(cache: n.NativeCache) -> None:
    cache.set("short", b"v", ttl_ms=30)
    assert 0 < (cache.ttl_ms("short") or 0) <= 30
    cache.set("forever", b"v", ttl_ms=0)
    assert cache.ttl_ms("forever") == 0
    assert cache.ttl_ms("absent") is None
    time.sleep(0.06)
    assert cache.get("short") is None
    assert cache.touch("forever", 10_000)
    assert 9_000 < (cache.ttl_ms("forever") or 0) <= 10_000
    with pytest.raises(ValueError):
        cache.set("k", b"v", ttl_ms=-1)


def test_default_ttl(tmp_path: Path) -> None:
    c = n.NativeCache(str(tmp_path / "d"), 1 << 20, default_ttl_ms=5_000)
    c.set("k", b"v")
    assert 4_000 < (c.ttl_ms("k") or 0) <= 5_000
    c.set("k", b"v", ttl_ms=0)
    assert c.ttl_ms("k") == 0


def test_prefix_namespaces_share_a_file(tmp_path: Path) -> None:
    path = str(tmp_path / "shared")
    a = n.NativeCache(path, 1 << 20, prefix=b"app-a:")
    b = n.NativeCache(path, 1 << 20, prefix=b"app-b:")
    a.set("k", b"from a")
    b.set("k", b"from b")
    assert a.get("k") == b"from a" and b.get("k") == b"from b"
    assert a.keys() == [b"k"] and len(a) == 1
    a.clear()
    assert a.get("k") is None and b.get("k") == b"from b"


def test_bad_input_raises_clear_errors_and_loses_nothing(cache: n.NativeCache) -> None:
    cache.set("keep", b"safe")
    with pytest.raises(n.KeyTypeError, match="str, bytes or int"):
        cache.get(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.get(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.set("k", "not bytes")  # type: ignore[arg-type]
    with pytest.raises(n.InvalidKeyError):
        cache.set(b"", b"v")
    with pytest.raises(n.InvalidKeyError):
        cache.get(b"x" * (n.MAX_KEY_LEN + 1))
    with pytest.raises(n.ValueTooLargeError) as too_large:
        cache.set("keep", b"x" * (cache.max_value_size + 1))
    assert isinstance(too_large.value, ValueError)
    with pytest.raises(n.InvalidKeyError, match=r"'\\udcff' is not valid Unicode"):
        cache.set("\udcff", b"lone surrogate")
    assert cache.get("keep") == b"safe"
    assert cache.check()["entries"] == 1


@pytest.mark.parametrize(
    ("size", "shards", "match"),
    [
        (-1, 0, "size"),
        (100, 0, "minimum"),
        (1 << 20, 3, "power of two"),
        (1 << 20, 1 << 20, "shards"),
    ],
)
def test_bad_geometry(tmp_path: Path, size: int, shards: int, match: str) -> None:
    with pytest.raises(n.InvalidArgumentError, match=match):
        n.NativeCache(str(tmp_path / "g"), size, shards)
    assert not (tmp_path / "g").exists()


def test_reopen_with_other_parameters(tmp_path: Path) -> None:
    path = str(tmp_path / "r")
    n.NativeCache(path, 1 << 20, 2).set("k", b"v")
    # Another size: resized live, the entry kept.
    grown = n.NativeCache(path, 2 << 20, 2)
    assert grown.get("k") == b"v" and grown.capacity > 1 << 20
    same = n.NativeCache(path, 0, create=False)
    assert same.get("k") == b"v" and same.shard_count == 2
    assert same.resize(4 << 20, 4) == {"capacity": same.capacity, "shards": 4}
    assert grown.get("k") == b"v" and grown.shard_count == 4
    fresh = n.NativeCache(path, 2 << 20, 4, recreate=True)
    assert fresh.get("k") is None and fresh.shard_count == 4


def test_closed_cache(cache: n.NativeCache) -> None:
    with cache as c:
        c.set("k", b"v")
    assert cache.closed
    with pytest.raises(n.CacheClosedError):
        cache.get("k")
    with pytest.raises(n.CacheClosedError):
        cache.stats()


def test_unsafe_files_are_refused(tmp_path: Path) -> None:
    target = tmp_path / "target"
    target.write_bytes(b"precious")
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(n.PermissionDeniedError, match="symbolic link"):
        n.NativeCache(str(tmp_path / "link"), 1 << 20)
    assert target.read_bytes() == b"precious"
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"\0" * 8192)
    garbage.chmod(0o600)
    with pytest.raises(n.CorruptFileError):
        n.NativeCache(str(garbage), 1 << 20)


def test_default_directory_is_private() -> None:
    d = n.default_directory()
    assert os.path.basename(d) == f"nearcache-{os.geteuid()}"
    assert os.stat(d).st_mode & 0o777 == 0o700


def test_stats_and_check(cache: n.NativeCache) -> None:
    cache.set("a", b"1")
    cache.get("a")
    cache.get("b")
    s = cache.stats()
    assert (s["hits"], s["misses"], s["sets"], s["items"], s["shards"]) == (1, 1, 1, 1, 2)
    assert len(cache.shard_stats()) == 2
    assert cache.check() == {"shards": 2, "entries": 1, "live_bytes": s["live_bytes"]}


def test_stats_show_the_largest_compaction(cache: n.NativeCache) -> None:
    assert cache.stats()["max_compaction_bytes"] == 0  # nothing compacted yet
    for i in range(20_000):  # 3 MB into 1 MiB: every shard evicts
        cache.set(f"k{i}", b"v" * 150)
    s = cache.stats()
    shards = cache.shard_stats()
    assert s["evictions"] > 0 and s["compactions"] > 0
    # A maximum over the shards, not a sum; bounded by what a shard holds.
    assert s["max_compaction_bytes"] == max(x["max_compaction_bytes"] for x in shards) > 0
    assert all(x["max_compaction_bytes"] <= x["capacity_bytes"] for x in shards)


def test_kill_inside_lock_from_python(tmp_path: Path) -> None:
    path = str(tmp_path / "k")
    cache = n.NativeCache(path, 1 << 20, 2)
    cache.set("victim", b"v")
    code = (
        "import sys; from nearcache import _native as n;"
        f"c = n.NativeCache({path!r}, 0, create=False);"
        "print('locked', flush=True) or 0;"
        "c._debug_hold_shard_mid_write('victim', 60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == b"locked"
    time.sleep(0.2)  # the child is now sleeping inside the lock
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    t0 = time.perf_counter()
    assert cache.get("victim") == b"v"  # shard repaired from its arena, not torn
    assert time.perf_counter() - t0 < 5  # functional bound only: never wedged
    assert (cache.stats()["salvages"], cache.stats()["resets"]) == (1, 0)
    cache.set("victim", b"again")
    assert cache.get("victim") == b"again"
    cache.check()
