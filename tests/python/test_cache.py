"""The Cache API: construction, every operation, TTLs, values, signing."""

from __future__ import annotations

import enum
import math
import os
import pickle
import shutil
import stat
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

import nearcache
from nearcache import Cache, SignedCache, format_size

# --------------------------------------------------------------------- construction

pytest_plugins = ["_cache_helpers"]

SIGNING_KEY = b"0123456789abcdef0123456789abcdef"
RawEntry = Callable[[Cache, str], tuple[bytes, int]]


def test_named_cache_lives_in_the_default_directory(cache_dir: Path) -> None:
    with Cache("myapp") as c:
        assert c.name == "myapp"
        assert c.path == str(cache_dir / "myapp")
        assert 0.99 * nearcache.DEFAULT_SIZE <= c.capacity <= nearcache.DEFAULT_SIZE
        c.set("k", "v")
    assert stat.S_IMODE(os.stat(cache_dir).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache_dir / "myapp").st_mode) == 0o600
    with Cache("myapp") as again:
        assert again.get("k") == "v"


def test_default_directory_without_override(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEARCACHE_DIR", raising=False)
    assert nearcache.default_directory() == nearcache._native.default_directory()
    assert nearcache.default_directory() == f"/dev/shm/nearcache-{os.getuid()}"


def test_cache_without_name_is_called_default(cache_dir: Path) -> None:
    with Cache() as c:
        assert c.path == str(cache_dir / "default")


def test_reopen_without_size_keeps_the_file_size(cache_dir: Path) -> None:
    with Cache("sized", size="4MiB") as c:
        capacity = c.capacity
        c.set("k", 1)
    assert capacity > 2 * 1024 * 1024
    with Cache("sized") as c:
        assert c.capacity == capacity
        assert c.get("k") == 1


def test_another_size_resizes_unless_recreate(make_cache: Callable[..., Cache]) -> None:
    first = make_cache("f", size="1MiB")
    first.set("k", 1)
    grown = make_cache("f", size="2MiB")
    assert grown.capacity > 1.5 * 2**20
    assert grown.get("k") == 1 and first.get("k") == 1
    assert first.capacity == grown.capacity
    replaced = make_cache("f", size="4MiB", recreate=True)
    assert replaced.capacity > grown.capacity
    assert replaced.get("k") is None


def test_create_false_refuses_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(nearcache.Error):
        Cache(path=tmp_path / "absent", create=False)
    with pytest.raises(nearcache.Error):
        Cache(path=tmp_path / "absent", size="1MiB", create=False)
    assert not (tmp_path / "absent").exists()


@pytest.mark.parametrize("name", ["", ".", "..", "a/b", "nul\0"])
def test_invalid_names(cache_dir: Path, name: str) -> None:
    with pytest.raises(nearcache.ConfigurationError):
        Cache(name)


@pytest.mark.parametrize(
    "options",
    [
        {"size": "lots"},
        {"size": -1},
        {"shards": -1},
        {"shards": True},
        {"ttl": -5},
        {"ttl": "soon"},
        {"serializer": "yaml"},
        {"compress": "brotli"},
        {"signing_key": b"short"},
        {"prefix": 5},
        {"compress_threshold": -1},
    ],
)
def test_invalid_options(tmp_path: Path, options: dict[str, Any]) -> None:
    with pytest.raises(nearcache.ConfigurationError):
        Cache(path=tmp_path / "c", **options)
    assert not (tmp_path / "c").exists()


def test_name_and_path_together(tmp_path: Path) -> None:
    with pytest.raises(nearcache.ConfigurationError):
        Cache("a", path=tmp_path / "a")


def test_properties_and_repr(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(size="2MiB", shards=4, ttl="5m", prefix="p:", serializer="json")
    assert c.shard_count == 4
    assert c.default_ttl == 300
    assert c.prefix == b"p:"
    assert c.serializer.name == "json"
    assert 0 < c.max_entry_size < c.capacity
    # The size asked for, not the file's (a little smaller: header, whole pages).
    assert c.capacity < 2 << 20
    assert repr(c) == f"<Cache 'c' path={c.path!r} size='2 MiB' shards=4>"
    # Opened without a size: the file's, to 0.1 of its unit.
    again = Cache(path=c.path)
    assert (
        repr(again) == f"<Cache 'c' path={c.path!r} size='{c.capacity / 2**20:.1f} MiB' shards=4>"
    )
    again.close()
    c.close()
    assert c.closed
    assert repr(c) == "<Cache 'c' closed>"


def test_repr_of_256_mib_says_256_mib(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "big", size="256MiB") as c:
        assert "size='256 MiB'" in repr(c)
    with Cache(path=tmp_path / "exact", size=format_size(1 << 20)) as c:
        assert "size='1 MiB'" in repr(c)


def test_closed_cache_raises(make_cache: Callable[..., Cache]) -> None:
    with make_cache() as c:
        c.set("k", 1)
    for operation in (
        lambda: c.get("k"),
        lambda: c.set("k", 2),
        lambda: c.set("k", [2]),
        lambda: c.delete("k"),
        lambda: len(c),
        lambda: c.keys(),
    ):
        with pytest.raises(nearcache.CacheClosedError):
            operation()


def test_pickling_reopens_the_same_file(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(prefix="ns:", serializer="json", ttl=60)
    c.set("k", [1, 2])
    clone = pickle.loads(pickle.dumps(c))
    try:
        assert clone.path == c.path
        assert clone.prefix == b"ns:"
        assert clone.get("k") == [1, 2]
        assert clone.default_ttl == 60
    finally:
        clone.close()


def test_get_pickles_as_the_same_cache_get(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(prefix="ns:", serializer="json")
    c.set("k", {"a": [1, 2]})
    get = pickle.loads(pickle.dumps(c.get))
    assert get("k") == {"a": [1, 2]}
    assert get("missing", 7) == 7
    c.set("k", "changed")  # the same file: the copy sees writes
    assert get("k") == "changed"
    assert get.__name__ == "get"


def test_get_runs_in_a_pool(make_cache: Callable[..., Cache]) -> None:
    import multiprocessing

    c = make_cache()
    c.set("k", [1, {"b": 2}])
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(c.get, ("k",)) == [1, {"b": 2}]
        assert pool.apply(c.get, ("nope", "dflt")) == "dflt"


def test_get_has_a_docstring_and_errors_name_it(cache: Cache) -> None:
    assert cache.get.__doc__ and "default" in cache.get.__doc__
    with pytest.raises(TypeError, match=r"\bget\(\) missing 1 required positional argument: 'key'"):
        cache.get()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"\bget\(\) got an unexpected keyword argument 'dflt'"):
        cache.get("k", dflt=1)  # type: ignore[call-arg]
    assert cache.get("k", version=False) is None
    # Versioned reads go through the same method, pickled or not.
    cache.set("k", [1])
    value, version = cache.get("k", version=True)
    assert value == [1] and version > 0
    assert pickle.loads(pickle.dumps(cache.get))("k", version=True) == ([1], version)


def test_signed_cache_get_pickles_too(tmp_path: Path) -> None:
    c = Cache(path=tmp_path / "signed", size="1MiB", signing_key=b"k" * 32)
    c.set("x", [1])
    try:
        assert pickle.loads(pickle.dumps(c.get))("x") == [1]
    finally:
        c.close()


# -------------------------------------------------------------------------- values


class Color(enum.IntEnum):
    RED = 1


class Label(str):
    pass


NATIVE_VALUES: list[Any] = [
    b"",
    b"\x00bytes",
    "",
    "text é ✓",
    0,
    -1,
    2**63 - 1,
    -(2**63),
    0.0,
    -2.5,
    math.inf,
    True,
    False,
    None,
]
OTHER_VALUES: list[Any] = [
    2**63,
    -(2**100),
    [1, "two", 3.0],
    (1, 2),
    {"a": {"b": [None]}},
    {1, 2},
    frozenset({"x"}),
    Fraction(1, 3),
    datetime(2024, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
    Color.RED,
    Label("subclass"),
    bytearray(b"mutable"),
]


@pytest.mark.parametrize("value", NATIVE_VALUES + OTHER_VALUES, ids=repr)
def test_values_round_trip_with_exact_type(cache: Cache, value: Any) -> None:
    cache.set("k", value)
    got = cache.get("k", "MISS")
    assert type(got) is type(value)
    assert got == value


@pytest.mark.parametrize("value", NATIVE_VALUES, ids=repr)
def test_native_values_are_stored_without_a_serializer(
    cache: Cache, value: Any, raw_entry: RawEntry
) -> None:
    cache.set("k", value)
    _, flags = raw_entry(cache, "k")
    assert flags < nearcache._native.FLAG_USER


def test_nan(cache: Cache) -> None:
    cache.set("k", math.nan)
    assert math.isnan(cache.get("k"))


def test_stored_none_is_not_a_miss(cache: Cache) -> None:
    cache.set("none", None)
    assert cache.get("none", "default") is None
    assert "none" in cache
    assert cache["none"] is None
    assert cache.get("absent", "default") == "default"


def test_tuple_default_is_returned_as_is(cache: Cache) -> None:
    default = (1, b"x")
    assert cache.get("absent", default) is default
    assert cache.pop("absent", default) is default


# ---------------------------------------------------------------------- operations


def test_set_get_delete(cache: Cache) -> None:
    assert cache.get("k") is None
    cache.set("k", "v")
    assert cache.get("k") == "v"
    cache.set("k", ["replaced"])
    assert cache.get("k") == ["replaced"]
    assert cache.delete("k") is True
    assert cache.delete("k") is False
    assert cache.get("k") is None


def test_add_and_replace(cache: Cache) -> None:
    assert cache.replace("k", 1) is False
    assert "k" not in cache
    assert cache.add("k", [1]) is True
    assert cache.add("k", [2]) is False
    assert cache.get("k") == [1]
    assert cache.replace("k", "new") is True
    assert cache.get("k") == "new"
    assert cache.replace("k", 5) is True
    assert cache.incr("k") == 6  # replace stores ints natively too


def test_pop(cache: Cache) -> None:
    cache.set("a", {"x": 1})
    cache.set("b", b"raw")
    assert cache.pop("a") == {"x": 1}
    assert cache.pop("b") == b"raw"
    assert cache.pop("a") is None
    assert cache.pop("a", 0) == 0
    assert len(cache) == 0


def test_mapping_protocol(cache: Cache) -> None:
    cache["k"] = "v"
    assert cache["k"] == "v"
    assert "k" in cache
    assert "other" not in cache
    del cache["k"]
    with pytest.raises(KeyError):
        cache["k"]
    with pytest.raises(KeyError):
        del cache["k"]
    assert bool(cache) is True  # an empty cache object is still truthy


def test_keys_iteration_and_len(cache: Cache) -> None:
    expected: set[str | bytes | int] = {"a", b"\x80raw", 42, "é"}
    for key in expected:
        cache.set(key, 1)
    assert len(cache) == 4
    assert set(cache.keys()) == expected
    assert set(cache) == expected


def test_clear(cache: Cache) -> None:
    cache.set_many({f"k{i}": i for i in range(50)})
    cache.clear()
    assert len(cache) == 0
    assert cache.get("k1") is None


def test_incr_decr(cache: Cache) -> None:
    assert cache.incr("n") == 1
    assert cache.incr("n", 10) == 11
    assert cache.decr("n", 3) == 8
    assert cache.incr("n", -8) == 0
    assert cache.get("n") == 0
    assert cache.incr("fresh", 5, default=100) == 105
    with pytest.raises(KeyError):
        cache.incr("absent", default=None)
    assert "absent" not in cache
    cache.set("text", "not a number")
    with pytest.raises(nearcache.NotACounterError):
        cache.incr("text")
    assert cache.get("text") == "not a number"
    cache.set("big", 2**63 - 1)
    with pytest.raises(nearcache.CounterOverflowError):
        cache.incr("big")
    assert cache.get("big") == 2**63 - 1
    with pytest.raises(TypeError):
        cache.incr("n", 1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        cache.decr("n", True)


def test_incr_ttl_applies_to_new_counters(cache: Cache) -> None:
    cache.incr("n", ttl=30)
    assert 29 < (cache.ttl("n") or 0) <= 30


def test_get_many_set_many_delete_many(cache: Cache) -> None:
    cache.set_many({"a": 1, "b": [2], 3: "three"})
    cache.set_many([("c", b"c"), ("d", None)])
    assert cache.get_many(["a", "b", 3, "c", "d", "missing"]) == {
        "a": 1,
        "b": [2],
        3: "three",
        "c": b"c",
        "d": None,
    }
    assert cache.get_many([]) == {}
    assert cache.get_many(iter(["a"])) == {"a": 1}
    assert cache.delete_many(["a", "b", "missing"]) == 2
    assert cache.delete_many([]) == 0
    assert sorted(cache.keys(), key=repr) == sorted([3, "c", "d"], key=repr)


def test_set_many_is_all_or_nothing_on_serialization_errors(cache: Cache) -> None:
    cache.set("a", "old")
    with pytest.raises(nearcache.SerializationError):
        cache.set_many({"a": "new", "b": lambda: None})
    assert cache.get("a") == "old"
    assert "b" not in cache


def test_get_or_set(cache: Cache) -> None:
    calls: list[int] = []

    def factory() -> list[int]:
        calls.append(1)
        return [len(calls)]

    assert cache.get_or_set("k", factory, ttl=60) == [1]
    assert cache.get_or_set("k", factory) == [1]
    assert calls == [1]
    assert 59 < (cache.ttl("k") or 0) <= 60
    cache.set("none", None)
    assert cache.get_or_set("none", factory) is None
    assert calls == [1]


def test_get_or_set_returns_the_winner(cache: Cache) -> None:
    def factory() -> str:
        cache.set("k", "set meanwhile by someone else")
        return "mine"

    assert cache.get_or_set("k", factory) == "set meanwhile by someone else"


def test_stats(cache: Cache) -> None:
    cache.set("k", 1)
    cache.get("k")
    cache.get("absent")
    stats = cache.stats()
    assert stats["hits"] >= 1
    assert stats["misses"] >= 1
    assert stats["signature_failures"] == 0
    assert stats["decode_errors"] == 0
    assert cache.check()["entries"] == 1
    cache.flush()


# ---------------------------------------------------------------------------- TTLs


def test_ttl_expiry(cache: Cache) -> None:
    cache.set("short", "v", ttl=0.05)
    cache.set("forever", "v", ttl=0)
    cache.set("td", "v", ttl=timedelta(milliseconds=50))
    cache.set("text", "v", ttl="50ms")
    assert cache.get("short") == "v"
    time.sleep(0.12)
    assert cache.get("short") is None
    assert cache.get("td") is None
    assert cache.get("text") is None
    assert cache.get("forever") == "v"
    assert cache.ttl("forever") == math.inf
    assert cache.ttl("short") is None


def test_default_ttl(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(ttl=0.05)
    c.set("default", 1)
    c.set("forever", 1, ttl=0)
    c.set("longer", 1, ttl=60)
    time.sleep(0.12)
    assert c.get("default") is None
    assert c.get("forever") == 1
    assert c.get("longer") == 1


def test_expire_at(cache: Cache) -> None:
    soon = time.time() + 30
    cache.set("unix", 1, expire_at=soon)
    cache.set("dt", [1], expire_at=datetime.fromtimestamp(soon, tz=timezone.utc))
    assert 29 < (cache.ttl("unix") or 0) <= 30
    assert abs((cache.expire_time("dt") or 0) - soon) < 0.01
    assert cache.expire_time("absent") is None
    with pytest.raises(TypeError, match="not both"):
        cache.set("k", 1, ttl=5, expire_at=soon)


def test_expire_at_in_the_past(cache: Cache) -> None:
    past = time.time() - 1
    cache.set("k", "old")
    cache.set("k", "new", expire_at=past)
    assert "k" not in cache  # the new value is already expired: nothing visible remains
    assert cache.add("k", "new", expire_at=past) is False
    assert "k" not in cache
    cache.set("k", "old")
    assert cache.replace("k", "new", expire_at=past) is True
    assert "k" not in cache
    cache.set_many({"a": 1, "b": 2})
    cache.set_many({"a": 3}, expire_at=past)
    assert cache.keys() == ["b"]


def test_touch(cache: Cache) -> None:
    cache.set("k", "v", ttl=0.05)
    assert cache.touch("k", ttl=60) is True
    time.sleep(0.1)
    assert cache.get("k") == "v"
    assert cache.touch("absent", ttl=60) is False
    assert cache.touch("k", expire_at=time.time() - 1) is True
    assert "k" not in cache


def test_bad_ttl_leaves_the_old_value(cache: Cache) -> None:
    cache.set("k", "old")
    for bad in (-1, "soon", math.nan, True):
        with pytest.raises((TypeError, ValueError)):
            cache.set("k", "new", ttl=bad)
    assert cache.get("k") == "old"


# ------------------------------------------------------------------ errors, limits


def test_value_too_large_leaves_the_old_value(cache: Cache) -> None:
    cache.set("k", "old")
    cache.set("other", [1])
    too_big = b"x" * (cache.max_value_size + 1)
    for value in (too_big, too_big.decode(), [too_big]):
        with pytest.raises(nearcache.ValueTooLargeError):
            cache.set("k", value)
        with pytest.raises(ValueError):
            cache.add("new", value)
    assert cache.get("k") == "old"
    assert cache.get("other") == [1]
    assert "new" not in cache


def test_unserializable_value_leaves_the_old_value(cache: Cache) -> None:
    cache.set("k", "old")
    with pytest.raises(nearcache.SerializationError):
        cache.set("k", lambda: None)
    with pytest.raises(TypeError):
        cache.replace("k", lambda: None)
    assert cache.get("k") == "old"


def test_json_cache(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(serializer="json")
    c.set("k", {"tuple": (1, 2)})
    assert c.get("k") == {"tuple": [1, 2]}
    with pytest.raises(nearcache.SerializationError):
        c.set("bad", {1, 2})


def test_entries_written_by_another_process_are_visible(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    writer = Cache(path=path, size="1MiB")
    reader = Cache(path=path)
    try:
        writer.set("k", {"v": 1})
        assert reader.get("k") == {"v": 1}
        reader.delete("k")
        assert writer.get("k") is None
    finally:
        writer.close()
        reader.close()


# ------------------------------------------------------------------------- signing


def test_signed_cache_round_trips_and_rejects_forgeries(
    make_cache: Callable[..., Cache], raw_entry: RawEntry
) -> None:
    c = make_cache(signing_key=SIGNING_KEY, prefix="ns:")
    assert isinstance(c, SignedCache)
    for value in [*NATIVE_VALUES, [1, 2], {"a": b"b"}]:
        c.set("k", value)
        assert c.get("k", "MISS") == value
        _, flags = raw_entry(c, "k")
        assert flags & nearcache.serializers.FLAG_SIGNED
    # An attacker with write access to the file plants values.
    c.native.set("planted", b"evil")
    c.native.set_typed("typed", "evil")
    c.native.set("pickled", pickle.dumps(["evil"]), flags=nearcache._native.FLAG_USER | 1 << 8)
    assert c.get("planted") is None
    assert c.get("typed") is None
    assert c.get("pickled") is None
    assert c.get_many(["planted", "typed", "pickled"]) == {}
    assert c.pop("planted", "gone") == "gone"
    # A genuine value copied under another key does not verify either.
    c.set("genuine", ["data"])
    payload, flags = raw_entry(c, "genuine")
    c.native.set("copy", payload, flags=flags)
    assert c.get("copy") is None
    assert c.get("genuine") == ["data"]
    assert c.get_many(["genuine", "copy"]) == {"genuine": ["data"]}
    assert c.stats()["signature_failures"] == 9


def test_signature_binds_the_prefix(make_cache: Callable[..., Cache], raw_entry: RawEntry) -> None:
    one = make_cache(signing_key=SIGNING_KEY, prefix="one:")
    bare = make_cache(signing_key=SIGNING_KEY)
    one.set("k", "v")
    payload, flags = raw_entry(one, "k")
    bare.native.set("two:k", payload, flags=flags)
    assert bare.get("one:k") == "v"  # the same full key verifies
    assert bare.get("two:k") is None


def test_signed_cache_operations(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(signing_key=SIGNING_KEY, compress="zstd", compress_threshold=10)
    c.set_many({"a": "x" * 100, 1: [1]})
    assert c.get_many(["a", 1, "zz"]) == {"a": "x" * 100, 1: [1]}
    assert c.add("a", 1) is False
    assert c.replace("a", "y") is True
    assert c["a"] == "y"
    assert c.pop(1) == [1]
    assert c.get_or_set("g", lambda: 5) == 5
    assert c.incr("counter", 2) == 2  # counters are native, unsigned
    assert c.get("counter") is None  # ...so get() refuses them
    assert c.incr("counter", 0) == 2


def test_signed_class_needs_a_key(tmp_path: Path) -> None:
    with pytest.raises(nearcache.ConfigurationError):
        SignedCache(path=tmp_path / "c", size="1MiB")


# ------------------------------------------------------------- a model of the cache


def test_random_operations_match_a_dict(cache: Cache) -> None:
    """A seeded random walk of operations against a dict (no TTLs, no eviction)."""
    import random

    rng = random.Random(1234)
    model: dict[Any, Any] = {}
    keys: list[Any] = ["a", "b", 1, 2, b"\x80", "é"]
    values: list[Any] = [None, 0, 7, "s", b"b", 1.5, [1], {"k": (1,)}, True]
    for _ in range(3000):
        key = rng.choice(keys)
        op = rng.randrange(8)
        if op == 0:
            value = rng.choice(values)
            cache.set(key, value)
            model[key if not isinstance(key, bool) else int(key)] = value
        elif op == 1:
            assert cache.get(key, "MISS") == model.get(key, "MISS")
        elif op == 2:
            assert cache.delete(key) == (model.pop(key, "MISS") != "MISS")
        elif op == 3:
            value = rng.choice(values)
            assert cache.add(key, value) == (key not in model)
            model.setdefault(key, value)
        elif op == 4:
            value = rng.choice(values)
            assert cache.replace(key, value) == (key in model)
            if key in model:
                model[key] = value
        elif op == 5:
            assert cache.pop(key, "MISS") == model.pop(key, "MISS")
        elif op == 6:
            current = model.get(key, 0)
            if type(current) is int:
                assert cache.incr(key, 3) == current + 3
                model[key] = current + 3
            else:
                with pytest.raises(nearcache.NotACounterError):
                    cache.incr(key, 3)
        else:
            assert cache.get_many(keys) == model
        assert len(cache) == len(model)


def test_default_directory_is_checked_once_per_user(monkeypatch: pytest.MonkeyPatch) -> None:
    import nearcache.cache as cache_module

    monkeypatch.delenv("NEARCACHE_DIR", raising=False)
    monkeypatch.setattr(cache_module, "_DEFAULT_DIRECTORIES", {})
    calls = []
    real = cache_module._native.default_directory

    def counting() -> str:
        calls.append(1)
        return real()

    monkeypatch.setattr(cache_module._native, "default_directory", counting)
    first = cache_module.default_directory()
    assert cache_module.default_directory() == first
    assert len(calls) == 1


def test_a_removed_default_directory_is_made_again_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import nearcache.cache as cache_module

    monkeypatch.delenv("NEARCACHE_DIR", raising=False)
    directory = tmp_path / "nc"
    directory.mkdir(mode=0o700)
    monkeypatch.setattr(cache_module, "_DEFAULT_DIRECTORIES", {os.geteuid(): str(directory)})
    with Cache("removed", size="1MiB") as c:
        c.set("k", 1)
    shutil.rmtree(directory)
    with Cache("removed", size="1MiB") as c:  # the open makes the directory again
        assert c.get("k") is None
        c.set("k", 2)
    assert directory.stat().st_mode & 0o777 == 0o700
    with Cache("removed") as c:  # and an existing file opens without a size
        assert c.get("k") == 2
    with pytest.raises(nearcache.CacheNotFoundError):
        Cache("absent", create=False)


# ----------------------------------------------------------------------- eviction


def test_eviction_mode_is_pinned_for_the_file(make_cache: Callable[..., Cache]) -> None:
    c = make_cache()
    assert c.eviction_mode == "adaptive", "a new file's default"
    c.eviction_mode = "strict"
    other = make_cache()  # the same path: another handle on the file
    assert other.eviction_mode == "strict"
    with pytest.raises(nearcache.InvalidArgumentError, match="'adaptive', 'strict' or 'lenient'"):
        c.eviction_mode = "lru"
    assert c.eviction_mode == "strict", "a refused mode changes nothing"
    c.eviction_mode = "lenient"
    assert other.eviction_mode == "lenient"


def test_strict_admission_keeps_a_loop_that_lenient_loses(make_cache: Callable[..., Cache]) -> None:
    # A loop over more keys than the cache holds: SIEVE (lenient) evicts
    # every key before it comes back; strict admission keeps most of the
    # entries the cache holds for the whole loop, and so does the default
    # (adaptive: its shards turn strict once their miniatures see it).
    hits = {}
    for mode in ("lenient", "strict", "adaptive"):
        c = make_cache(mode, size="512KiB")
        if mode != "adaptive":
            c.eviction_mode = mode
        assert c.eviction_mode == mode
        held = 0
        for i in range(4096):
            c.set(f"k{i}", b"x" * 100)
        held = len(c)
        n = 0
        for _ in range(6):
            for i in range(4096):
                key = f"k{i}"
                if c.get(key) is None:
                    c.set(key, b"x" * 100)
                else:
                    n += 1
        hits[mode] = n / (6 * 4096)
        assert held < 4096
    assert hits["lenient"] < 0.05, hits
    assert hits["strict"] > 0.3, hits
    assert hits["adaptive"] > 0.3, hits
