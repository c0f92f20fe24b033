"""Opening the same cache again and again (per request): each open is a full,
independent open of the file, with the options parsed once per process."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import nearcache
import nearcache.cache as cache_module
from nearcache import Cache, SignedCache
from nearcache import _native as n

pytest_plugins = ["_cache_helpers"]

SIGNING_KEY = b"0123456789abcdef0123456789abcdef"


def _engine_references(cache: Cache, native: object) -> list[str]:
    """The attributes of ``cache`` that hold ``native`` or a method bound to it."""
    return [
        name
        for name, value in vars(cache).items()
        if value is native or getattr(value, "__self__", None) is native
    ]


# ------------------------------------------------------------------- the Cache


def test_reopening_gives_independent_working_caches(tmp_path: Path) -> None:
    path = tmp_path / "c"
    first = Cache(path=path, size="1MiB")
    second = Cache(path=path, size="1MiB")
    try:
        assert second._prepared is first._prepared  # options parsed once
        assert second.native is not first.native
        first.set("k", {"v": 1})
        first.set("n", 5)
        assert second.get("k") == {"v": 1}
        assert second.pop("n") == 5
        first.close()
        assert first.closed and not second.closed
        second.set("k2", b"x")
        assert second.get("k2") == b"x"
        assert "k2" in second and len(second) == 2
        assert second.delete("k2") and second.pop("k") == {"v": 1}
        for operation in (
            lambda: first.get("k"),
            lambda: first.pop("k"),
            lambda: first.set("k", 1),
            lambda: first.add("k", 1),
            lambda: first.delete("k"),
            lambda: "k" in first,
            lambda: len(first),
        ):
            with pytest.raises(nearcache.CacheClosedError):
                operation()
        first.close()  # idempotent
        third = Cache(path=path, size="1MiB")
        third.set("k", 3)
        assert second.get("k") == 3
        third.close()
        assert second.get("k") == 3
    finally:
        second.close()


@pytest.mark.parametrize("signing_key", [None, SIGNING_KEY])
def test_close_drops_every_reference_to_the_engine(
    tmp_path: Path, signing_key: bytes | None
) -> None:
    for use in (False, True):
        cache = Cache(path=tmp_path / "c", size="1MiB", signing_key=signing_key)
        native = cache.native
        if use:  # methods bound when first used are dropped as well
            cache.set("k", 1)
            assert cache.pop("k") == 1
            assert cache.get("k") is None and "k" not in cache and not cache.delete("k")
        assert _engine_references(cache, native)
        cache.close()
        assert _engine_references(cache, native) == []
        assert cache.native is not native
        assert native.closed


def test_different_options_are_prepared_apart(tmp_path: Path) -> None:
    path = tmp_path / "c"
    plain = Cache(path=path, size="1MiB")
    with_ttl = Cache(path=path, size="1MiB", ttl=60)
    prefixed = Cache(path=path, size="1MiB", prefix="p:")
    as_json = Cache(path=path, size="1MiB", serializer="json")
    caches = [plain, with_ttl, prefixed, as_json]
    try:
        assert len({id(c._prepared) for c in caches}) == 4
        assert plain.default_ttl is None and with_ttl.default_ttl == 60
        plain.set("k", 1)
        assert with_ttl.get("k") == 1 and prefixed.get("k") is None
        prefixed.set("k", 2)
        assert plain.get("k") == 1 and prefixed.get("k") == 2
        as_json.set("j", [1, 2])
        assert as_json.serializer.name == "json" and plain.serializer.name == "pickle"
        # Each kind opens again with its own options.
        again = Cache(path=path, size="1MiB", prefix="p:")
        assert again._prepared is prefixed._prepared and again.get("k") == 2
        again.close()
        assert Cache(path=path, size="1MiB", ttl=60)._prepared is with_ttl._prepared
    finally:
        for c in caches:
            c.close()


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"size": "lots"}, nearcache.ConfigurationError),
        ({"shards": True}, nearcache.ConfigurationError),
        ({"shards": 3}, nearcache.InvalidArgumentError),
        ({"lock_timeout": 10_000}, nearcache.InvalidArgumentError),
        ({"on_lock_timeout": "wait"}, nearcache.ConfigurationError),
        ({"signing_key": b"short"}, nearcache.ConfigurationError),
        ({"recreate": 1}, TypeError),
    ],
)
def test_options_are_checked_at_every_open(
    tmp_path: Path, options: dict[str, Any], error: type[Exception]
) -> None:
    path = tmp_path / "c"
    messages = []
    for _ in range(3):
        with pytest.raises(error) as raised:
            Cache(path=path, **{"size": "1MiB", **options})
        messages.append(str(raised.value))
    assert len(set(messages)) == 1
    with Cache(path=path, size="1MiB") as c:  # the valid options still open
        c.set("k", 1)


def test_the_class_is_checked_at_every_open(tmp_path: Path) -> None:
    path = tmp_path / "c"
    Cache(path=path, size="1MiB").close()
    for _ in range(2):  # options already prepared for a plain Cache
        with pytest.raises(nearcache.ConfigurationError):
            SignedCache(path=path, size="1MiB")
    for _ in range(2):
        signed = Cache(path=path, size="1MiB", signing_key=SIGNING_KEY)
        assert type(signed) is SignedCache
        signed.set("k", [1])
        assert signed.get("k") == [1]
        signed.close()
    with SignedCache(path=path, size="1MiB", signing_key=SIGNING_KEY) as direct:
        assert direct.get("k") == [1]
    with Cache(path=path, size="1MiB") as plain:
        assert type(plain) is Cache

    class Sub(Cache):
        pass

    for _ in range(2):
        with Sub(path=path, size="1MiB") as sub:
            assert type(sub) is Sub
            sub.set("s", 1)
            assert sub.get("s") == 1 and sub.pop("s") == 1
        with pytest.raises(nearcache.ConfigurationError):
            Sub(path=path, size="1MiB", signing_key=SIGNING_KEY)


def test_signed_reopens_share_their_counters(tmp_path: Path) -> None:
    path = tmp_path / "c"
    with Cache(path=path, size="1MiB", signing_key=SIGNING_KEY) as first:
        first.native.set("x", b"planted")
        assert first.get("x") is None
        with Cache(path=path, size="1MiB", signing_key=SIGNING_KEY) as second:
            assert second.get("x", "miss") == "miss"
            assert first.signature_failures == second.signature_failures == 2
            assert second.stats()["signature_failures"] == 2


def test_a_subclass_keeps_what_it_set_before_opening(tmp_path: Path) -> None:
    class Counting(Cache):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self.opened_by = "Counting"
            super().__init__(*args, **kwargs)

    for _ in range(2):
        with Counting(path=tmp_path / "c", size="1MiB") as c:
            assert c.opened_by == "Counting"
            c.set("k", 1)
            assert c.get("k") == 1


def test_a_replaced_or_removed_file_is_noticed_at_the_next_open(tmp_path: Path) -> None:
    path = tmp_path / "c"
    kept = Cache(path=path, size="1MiB")  # keeps the file mapped in this process
    try:
        kept.set("k", "old")
        with Cache(path=path, size="1MiB") as same:
            assert same.get("k") == "old"
        with Cache(path=tmp_path / "other", size="1MiB") as other:
            other.set("k", "new")
        os.replace(tmp_path / "other", path)
        with Cache(path=path, size="1MiB") as reopened:
            assert reopened.get("k") == "new"
        assert kept.get("k") == "old"  # the open handle keeps the file it opened
        os.remove(path)
        with pytest.raises(nearcache.CacheNotFoundError):
            Cache(path=path, size="1MiB", create=False)
        with pytest.raises(nearcache.CacheNotFoundError):
            Cache(path=path, create=False)
        assert not path.exists()
        with Cache(path=path, size="1MiB") as created:
            assert created.get("k") is None
            created.set("k", "newest")
        assert kept.get("k") == "old"
    finally:
        kept.close()


def test_opening_without_a_size(tmp_path: Path) -> None:
    path = tmp_path / "c"
    for _ in range(2):
        with pytest.raises(nearcache.CacheNotFoundError):
            Cache(path=path, create=False)
    assert not path.exists()
    with Cache(path=tmp_path / "sized", size="2MiB") as sized:
        capacity = sized.capacity
        sized.set("k", 1)
    for _ in range(2):
        with Cache(path=tmp_path / "sized") as again:
            assert again.capacity == capacity and again.get("k") == 1
    with Cache(path=path) as created:
        capacity = created.capacity
        assert 0.99 * nearcache.DEFAULT_SIZE <= capacity <= nearcache.DEFAULT_SIZE
    with Cache(path=path, create=False) as existing:
        assert existing.capacity == capacity


def test_pop_is_documented_and_works_before_and_after_its_first_use(
    make_cache: Callable[..., Cache],
) -> None:
    assert Cache.pop.__doc__ and "Remove ``key``" in Cache.pop.__doc__
    assert Cache.pop.__name__ == "pop"
    c = make_cache()
    c.set("a", 1)
    c.set("b", b"2")
    assert c.pop("missing") is None
    assert c.pop("missing", "default") == "default"
    assert c.pop("a") == 1 and c.pop("b", None) == b"2"
    assert c.pop(7, "int key") == "int key"
    fresh = make_cache()
    fresh.set("a", [1])
    assert fresh.pop("a") == [1]
    fresh.close()
    with pytest.raises(nearcache.CacheClosedError):
        fresh.pop("a")


def test_the_directory_override_is_read_at_every_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    monkeypatch.setenv("NEARCACHE_DIR", str(one))
    with Cache("named", size="1MiB") as c:
        assert c.path == str(one / "named")
        c.set("k", 1)
    monkeypatch.setenv("NEARCACHE_DIR", str(two))
    with Cache("named", size="1MiB") as c:
        assert c.path == str(two / "named") and c.get("k") is None
    monkeypatch.setenv("NEARCACHE_DIR", str(one))
    with Cache("named", size="1MiB") as c:
        assert c.path == str(one / "named") and c.get("k") == 1
    monkeypatch.delenv("NEARCACHE_DIR")
    assert cache_module._directory_name() == nearcache.default_directory()
    assert nearcache.default_directory() == n.default_directory()


def test_a_removed_override_directory_is_made_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "caches"
    monkeypatch.setenv("NEARCACHE_DIR", str(directory))
    with Cache("named", size="1MiB") as c:
        c.set("k", 1)
    for _ in range(2):
        for child in directory.iterdir():
            child.unlink()
        directory.rmdir()
        with pytest.raises(nearcache.CacheNotFoundError):
            Cache("named", size="1MiB", create=False)
        with Cache("named", size="1MiB") as c:
            assert c.get("k") is None
            c.set("k", 2)
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        with Cache("named") as c:
            assert c.get("k") == 2


# -------------------------------------------------------------------- the engine


def test_opener_opens_independent_handles(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    opener = n.Opener(path, 1 << 20, 2, prefix=b"p:", default_ttl_ms=60_000)
    assert opener.path == path
    assert not os.path.exists(path)  # it holds no file
    first = opener.open()
    second = opener.open(False, True)
    assert first.prefix == second.prefix == b"p:"
    assert first.default_ttl_ms == 60_000 and first.shard_count == 2
    first.set("k", b"v")
    assert second.get("k") == b"v"
    assert 0 < (second.ttl_ms("k") or 0) <= 60_000
    first.close()
    assert first.closed and not second.closed
    assert second.get("k") == b"v"
    with n.NativeCache(path, 1 << 20, 2) as unprefixed:
        assert unprefixed.get("p:k") == b"v"
    second.close()


def test_opener_open_follows_recreate_and_create(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    with pytest.raises(n.CacheNotFoundError):
        n.Opener(path, 1 << 20).open(create=False)
    assert not os.path.exists(path)
    with n.Opener(path, 1 << 20).open() as c:
        c.set("k", b"v")
    # Another size: resized, the entry kept; with recreate: replaced.
    with n.Opener(path, 2 << 20).open() as c:
        assert c.get("k") == b"v" and c.capacity > 1 << 20
    with n.Opener(path, 4 << 20).open(recreate=True) as c:
        assert c.get("k") is None and c.capacity > 2 << 20
    # Without a size: an existing file as it is; a missing one of size_if_missing
    # bytes, unless create is false.
    other = str(tmp_path / "other")
    as_is = n.Opener(path, 0, size_if_missing=1 << 20)
    with as_is.open() as c:
        assert c.capacity > 2 << 20
    missing = n.Opener(other, 0, size_if_missing=1 << 20)
    with pytest.raises(n.CacheNotFoundError):
        missing.open(create=False)
    assert not os.path.exists(other)
    with missing.open() as c:
        assert 0 < c.capacity <= 1 << 20
    with pytest.raises(n.InvalidArgumentError, match="no size was given"):
        n.Opener(str(tmp_path / "third"), 0).open()


@pytest.mark.parametrize(
    "options",
    [
        {"size": -1},
        {"shards": 70_000},
        {"shards": -1},
        {"default_ttl_ms": -1},
        {"lock_timeout_ms": -1.0},
        {"on_lock_timeout": "wait"},
        {"decoder": 5},
        {"prefix": "text"},
        {"allow_foreign_owner": 1},
    ],
)
def test_opener_checks_its_arguments_as_native_cache_does(
    tmp_path: Path, options: dict[str, Any]
) -> None:
    path = str(tmp_path / "c")
    arguments: dict[str, Any] = {"size": 1 << 20, "shards": 0, **options}
    size, shards = arguments.pop("size"), arguments.pop("shards")
    with pytest.raises(Exception) as by_native:
        n.NativeCache(path, size, shards, **arguments)
    with pytest.raises(Exception) as by_opener:
        n.Opener(path, size, shards, **arguments)
    assert type(by_opener.value) is type(by_native.value)
    assert str(by_opener.value) == str(by_native.value)
    assert not os.path.exists(path)


def test_opener_rejects_a_negative_size_if_missing(tmp_path: Path) -> None:
    with pytest.raises(n.InvalidArgumentError):
        n.Opener(str(tmp_path / "c"), 0, size_if_missing=-1)
