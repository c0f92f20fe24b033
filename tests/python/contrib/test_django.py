"""Unit tests of the Django backends (``nearcache.contrib.django``).

Django's own cache test suite runs against these backends through
``tests/django/run.py``; the tests here are the fast checks of what is
nearcache's own: option handling, the cull arithmetic, counters, the async
methods' direct path, the per-process registry, and the tiered backend over
an in-process L2.  Backends are built from their classes with a params dict,
as Django's ``caches`` builds them from a ``CACHES`` entry, so no Django
settings are needed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import multiprocessing
import pickle
import threading
import warnings
from collections.abc import Iterator
from itertools import count
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("django")

from django.core.cache import CacheKeyWarning
from django.core.exceptions import ImproperlyConfigured, SynchronousOnlyOperation
from django.utils.asyncio import async_unsafe

from nearcache.contrib.django import LONG_KEY, NearCache, TieredNearCache
from nearcache.contrib.django import backend as backend_module

_names = count()


@pytest.fixture
def location(tmp_path: Path) -> str:
    """A path for a fresh cache file."""
    return str(tmp_path / f"django-{next(_names)}")


def make(location: str, **params: Any) -> NearCache:
    """A NearCache on ``location`` with Django-style params (small file by default)."""
    params.setdefault("OPTIONS", {}).setdefault("size", "4MiB")
    return NearCache(location, params)


@pytest.fixture
def cache(location: str) -> Iterator[NearCache]:
    backend = make(location)
    yield backend
    backend.clear()


class NotPicklable:
    def __getstate__(self) -> Any:
        raise pickle.PickleError("refuses")


# ---------------------------------------------------------------------- configuration


def test_location_name_and_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path / "named"))
    by_name = NearCache("mysite", {"OPTIONS": {"size": "1MiB"}})
    assert by_name.cache.path == str(tmp_path / "named" / "mysite")
    by_path = NearCache(str(tmp_path / "sub.cache"), {"OPTIONS": {"size": "1MiB"}})
    assert by_path.cache.path == str(tmp_path / "sub.cache")
    default = NearCache("", {"OPTIONS": {"size": "1MiB"}})
    assert default.cache.path == str(tmp_path / "named" / "django")


def test_options_reach_the_cache(location: str) -> None:
    backend = NearCache(location, {"OPTIONS": {"size": "2MiB", "shards": 2, "serializer": "json"}})
    assert 1.9 * 2**20 < backend.cache.capacity <= 2 * 2**20  # rounded to whole shards
    assert backend.cache.shard_count == 2
    backend.set("doc", {"a": [1, 2]})
    assert backend.get("doc") == {"a": [1, 2]}
    with pytest.raises(TypeError):  # the json serializer's own error
        backend.set("obj", object())


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"sise": "1MiB"}, "unknown OPTIONS for NearCache: sise"),
        ({"ttl": 5}, "use TIMEOUT"),
        ({"size": "lots"}, "invalid nearcache cache"),
        ({"shards": -1}, "invalid nearcache cache"),
    ],
)
def test_bad_options(location: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        NearCache(location, {"OPTIONS": options})


def test_one_cache_object_per_location_and_options(location: str) -> None:
    a = make(location)
    b = make(location, KEY_PREFIX="other", OPTIONS={"size": "4MiB", "MAX_ENTRIES": 5})
    assert a.cache is b.cache  # Django settings differ, nearcache options do not
    a.close()  # what Django calls after every request: the file stays mapped
    a.set("k", 1)
    assert a.get("k") == 1
    assert not a.cache.closed
    other = make(location, OPTIONS={"size": "4MiB", "serializer": "json"})
    assert other.cache is not a.cache  # other nearcache options: another Cache object
    assert other.get("k") == 1  # on the same file
    a.cache.close()  # closed from outside: the next backend reopens the file
    c = make(location)
    assert c.cache is not a.cache
    assert c.get("k") == 1


# ------------------------------------------------------------------------- timeouts


def test_timeout_semantics(location: str) -> None:
    backend = make(location, TIMEOUT=120)
    backend.set("default", 1)
    assert 119 < backend.cache.ttl(":1:default") <= 120
    backend.set("forever", 1, None)
    assert backend.cache.ttl(":1:forever") == math.inf
    backend.set("float", 1, 2.5)
    assert 2.4 < backend.cache.ttl(":1:float") <= 2.5
    backend.set("huge", 1, 10**30)
    assert backend.cache.ttl(":1:huge") == math.inf
    for timeout in (0, -1, -0.5):
        backend.set("gone", 1)
        backend.set("gone", 2, timeout)
        assert not backend.has_key("gone")
    assert backend.add("absent", 1, 0) is True
    assert not backend.has_key("absent")
    backend.set("present", 1)
    assert backend.add("present", 2, 0) is False
    assert backend.touch("present", 0) is True
    assert not backend.has_key("present")
    assert backend.touch("present", 0) is False
    assert backend.set_many({"a": 1, "b": 2}, 0) == []
    assert backend.get_many(["a", "b"]) == {}


def test_timeout_none_setting_never_expires(location: str) -> None:
    backend = make(location, TIMEOUT=None)
    backend.set("k", 1)
    assert backend.cache.ttl(":1:k") == math.inf
    backend.touch("k", 30)
    assert backend.cache.ttl(":1:k") <= 30
    backend.touch("k")
    assert backend.cache.ttl(":1:k") == math.inf


# -------------------------------------------------------------------------- culling


def test_cull_removes_a_fraction_before_adding(location: str) -> None:
    backend = make(location, OPTIONS={"MAX_ENTRIES": 10, "CULL_FREQUENCY": 2})
    for i in range(10):
        backend.set(f"k{i}", i)
    assert len(backend.cache) == 10
    backend.set("k10", 10)  # 10 entries >= MAX_ENTRIES: cull 10 // 2 first
    assert len(backend.cache) == 6
    assert backend.get("k10") == 10


def test_cull_frequency_zero_clears(location: str) -> None:
    backend = make(location, OPTIONS={"MAX_ENTRIES": 5, "CULL_FREQUENCY": 0})
    for i in range(5):
        backend.set(f"k{i}", i)
    backend.set("last", 1)
    assert backend.cache.keys() == [":1:last"]


def test_add_culls_only_when_it_adds(location: str) -> None:
    backend = make(location, OPTIONS={"MAX_ENTRIES": 3})
    backend.set_many({"a": 1, "b": 2, "c": 3})
    assert backend.add("a", 9) is False
    assert len(backend.cache) == 3
    assert backend.add("d", 4) is True
    assert len(backend.cache) == 3  # culled 3 // 3, then added


def test_set_many_culls_like_successive_sets(location: str) -> None:
    batch = make(location, OPTIONS={"MAX_ENTRIES": 30})
    assert batch.set_many({f"cull{i}": i for i in range(1, 50)}) == []
    assert len(batch.cache) == 29  # what Django's test_cull expects of 49 sets
    batch.clear()
    zero = make(location, OPTIONS={"MAX_ENTRIES": 30, "CULL_FREQUENCY": 0})
    zero.set_many({f"cull{i}": i for i in range(1, 50)})
    assert len(zero.cache) == 19


def test_max_entries_none_and_default(location: str) -> None:
    unlimited = make(location, OPTIONS={"MAX_ENTRIES": None})
    assert unlimited._max_entries is None
    unlimited.set_many({f"k{i}": i for i in range(500)})
    assert len(unlimited.cache) == 500
    unlimited.clear()
    default = make(location)  # no MAX_ENTRIES: bounded by the file's size alone
    assert default._max_entries is None
    default.set_many({f"k{i}": i for i in range(301)})
    assert len(default.cache) == 301
    default.clear()
    djangos = make(location, OPTIONS={"size": "4MiB", "MAX_ENTRIES": 300})
    assert (djangos._max_entries, djangos._cull_frequency) == (300, 3)
    djangos.set_many({f"k{i}": i for i in range(301)})  # crosses the limit: one by one
    assert len(djangos.cache) == 201


def test_lowercase_params_override_options(location: str) -> None:
    backend = NearCache(location, {"max_entries": 7, "OPTIONS": {"MAX_ENTRIES": 50}})
    assert backend._max_entries == 7


# ------------------------------------------------------------------------- counters


def test_incr_decr(cache: NearCache) -> None:
    cache.set("n", 41, 60)
    expiry = cache.cache.expire_time(":1:n")
    assert cache.incr("n") == 42
    assert cache.decr("n", 10) == 32
    assert cache.cache.expire_time(":1:n") == expiry
    with pytest.raises(ValueError, match="Key ':1:missing' not found"):
        cache.incr("missing")
    cache.set("none", None)
    with pytest.raises(TypeError):
        cache.incr("none")


def test_incr_values_that_are_not_native_counters(cache: NearCache) -> None:
    cache.set("f", 1.5, 60)
    expiry = cache.cache.expire_time(":1:f")
    assert cache.incr("f") == 2.5
    assert cache.cache.expire_time(":1:f") == pytest.approx(expiry, abs=0.01)
    cache.set("b", True)
    assert cache.incr("b") == 2
    cache.set("max", 2**63 - 1, None)
    assert cache.incr("max") == 2**63
    assert cache.incr("max", 2) == 2**63 + 2
    assert cache.cache.ttl(":1:max") == math.inf


def _incr_many(location: str, times: int) -> None:
    backend = make(location)
    for _ in range(times):
        backend.incr("counter")


def test_incr_is_atomic_across_processes(location: str) -> None:
    backend = make(location)
    backend.set("counter", 0)
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_incr_many, args=(location, 500)) for _ in range(3)]
    for p in procs:
        p.start()
    _incr_many(location, 500)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    assert backend.get("counter") == 2000


# ------------------------------------------------------------------ keys and values


def test_key_warnings_and_long_keys(cache: NearCache) -> None:
    with pytest.warns(CacheKeyWarning, match="characters"):
        cache.set("with space", 1)
    key = "x" * (LONG_KEY + 1)
    with pytest.warns(CacheKeyWarning, match="longer than 250"):
        cache.set(key, "long")
    with pytest.warns(CacheKeyWarning):
        assert cache.get(key) == "long"
    stored = [k for k in cache.cache if isinstance(k, str) and k.startswith("nearcache:")]
    assert len(stored) == 1
    assert len(stored[0]) < 100


def test_subclass_key_overrides_are_used(location: str) -> None:
    class Liberal(NearCache):
        def validate_key(self, key: str) -> None:
            pass

    class Custom(NearCache):
        def make_key(self, key: Any, version: int | None = None) -> str:
            return f"custom-{key}"

    liberal = Liberal(location, {"OPTIONS": {"size": "4MiB"}})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        liberal.set("with space", 1)
    assert liberal.get("with space") == 1
    custom = Custom(location, {"OPTIONS": {"size": "4MiB"}})
    custom.set("k", 2)
    assert "custom-k" in custom.cache
    assert custom.get_many(["k"]) == {"k": 2}


def test_empty_made_key_is_stored(location: str) -> None:
    backend = make(location, KEY_FUNCTION=lambda key, prefix, version: "")
    backend.set("anything", 1)
    assert backend.get("other") == 1  # the key function maps both to ""


def test_serializer_errors_are_the_serializers_own(cache: NearCache) -> None:
    with pytest.raises(pickle.PickleError, match="refuses"):
        cache.set("bad", NotPicklable())
    with pytest.raises(pickle.PickleError):
        cache.add("bad", NotPicklable())
    with pytest.raises(pickle.PickleError):
        cache.set_many({"good": 1, "bad": NotPicklable()})
    assert cache.get_many(["good", "bad"]) == {}


def test_value_too_large(location: str, caplog: pytest.LogCaptureFixture) -> None:
    cache = make(location, OPTIONS={"size": "4MiB", "spill_budget": "2MiB"})
    big = b"x" * (cache.cache.max_value_size + 1)
    cache.set("k", "old")
    with caplog.at_level(logging.WARNING, "nearcache.contrib.django"):
        cache.set("k", big)
        assert cache.get("k") is None  # the stale value went with it
        assert cache.set_many({"a": 1, "k": big}) == ["k"]
        assert cache.add("k2", big) is False
    assert cache.get("a") == 1
    assert len([r for r in caplog.records if "not stored" in r.getMessage()]) == 3


def test_get_many_maps_back_to_callers_keys(cache: NearCache) -> None:
    cache.set_many({"a": 1, "b": None}, version=2)
    assert cache.get_many(iter(["a", "b", "c"]), version=2) == {"a": 1, "b": None}
    assert cache.get_many([]) == {}
    assert cache.delete_many(["a", "b"], version=2) is None
    assert cache.get_many(["a", "b"], version=2) == {}


def test_signing_key_rejects_planted_values(location: str) -> None:
    backend = make(location, OPTIONS={"size": "1MiB", "signing_key": b"s" * 32})
    backend.set("user", {"name": "Ada"})
    backend.cache.native.set(":1:user", pickle.dumps({"name": "Mallory"}), None, 16)
    assert backend.get("user") is None
    backend.set("n", 1)
    assert backend.incr("n") == 2  # not a native counter when signed: get-then-set


def _child_set(location: str) -> None:
    make(location).set("from-child", {"pid": "child"}, None)


def test_forked_child_shares_the_cache(cache: NearCache, location: str) -> None:
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_child_set, args=(location,))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 0
    assert cache.get("from-child") == {"pid": "child"}


def test_threads(cache: NearCache) -> None:
    cache.set("hits", 0)

    def work() -> None:
        for _ in range(300):
            cache.incr("hits")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.get("hits") == 1200


# ------------------------------------------------------------------------------ async


def test_async_methods_match_sync_without_thread_hop(cache: NearCache) -> None:
    forbidden = mock.Mock(side_effect=AssertionError("sync_to_async used"))

    async def scenario() -> None:
        assert await cache.aadd("a", 1) is True
        assert await cache.aadd("a", 2) is False
        await cache.aset("b", [2], 30)
        assert await cache.aget("b") == [2]
        assert await cache.aget("zz", "dflt") == "dflt"
        assert await cache.atouch("b", None) is True
        assert await cache.ahas_key("b") is True
        assert await cache.aset_many({"c": 3, "d": 4}) == []
        assert await cache.aget_many(iter(["a", "c", "x"])) == {"a": 1, "c": 3}
        assert await cache.aincr("a", 4) == 5
        assert await cache.adecr("a") == 4
        assert await cache.aget_or_set("e", lambda: "made") == "made"
        assert await cache.aincr_version("e") == 2
        assert await cache.adecr_version("e", version=2) == 1
        assert await cache.adelete("a") is True
        await cache.adelete_many(["c", "d"])
        assert await cache.aget_many(["c", "d"]) == {}
        await cache.aclear()
        assert await cache.ahas_key("b") is False
        await cache.aclose()
        with pytest.warns(CacheKeyWarning):
            await cache.aset("with space", 1)

    with (
        mock.patch("django.core.cache.backends.base.sync_to_async", forbidden),
        mock.patch.object(backend_module, "sync_to_async", forbidden),
    ):
        asyncio.run(scenario())
    forbidden.assert_not_called()


@async_unsafe
def _database_work() -> str:
    """Stands for a query: Django refuses to run it inside an event loop."""
    return "queried"


class LazyQuery:
    """Like a lazy QuerySet: pickling it runs the query."""

    def __getstate__(self) -> dict[str, str]:
        return {"rows": _database_work()}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.rows = state["rows"]


def test_async_falls_back_to_a_thread_when_serializing_needs_it(cache: NearCache) -> None:
    async def scenario() -> None:
        with pytest.raises(SynchronousOnlyOperation):
            _database_work()
        loop_thread = threading.get_ident()
        seen: list[int] = []
        real_set = NearCache.set

        def spy_set(self: NearCache, *args: Any) -> None:
            seen.append(threading.get_ident())
            real_set(self, *args)

        with mock.patch.object(NearCache, "set", spy_set):
            await cache.aset("lazy", LazyQuery())
        assert seen[0] == loop_thread  # tried directly first
        assert seen[-1] != loop_thread  # then done in a thread
        assert (await cache.aget("lazy")).rows == "queried"
        assert await cache.aadd("lazy2", LazyQuery()) is True
        assert await cache.aset_many({"lazy3": LazyQuery()}) == []
        assert (await cache.aget_or_set("lazy4", LazyQuery)).rows == "queried"

    asyncio.run(scenario())


# ----------------------------------------------------------------------------- tiered


@pytest.fixture
def tiered(tmp_path: Path) -> Iterator[TieredNearCache]:
    l1 = {"driver": "nearcache", "path": str(tmp_path / "l1"), "size": "1MiB"}
    backend = TieredNearCache(
        f"memory://?max_entries={1000 + next(_names)}", {"OPTIONS": {"l1": l1, "l1_ttl": 30}}
    )
    yield backend
    backend.clear()


def test_tiered_reads_through_and_writes_through(tiered: TieredNearCache) -> None:
    store = tiered.cache
    tiered.set("k", {"v": 1})
    assert store.l2.get(":1:k") == {"v": 1}
    assert store.l1.get(":1:k") == {"v": 1}
    store.l1.delete(":1:k")
    assert tiered.get("k") == {"v": 1}  # from L2, filling L1
    assert store.l1.get(":1:k") == {"v": 1}
    assert tiered.get_many(["k", "nope"]) == {"k": {"v": 1}}
    assert tiered.delete("k") is True
    assert store.l2.get(":1:k") is None


def test_tiered_counters_and_culling(tiered: TieredNearCache) -> None:
    assert tiered._max_entries is None
    tiered.set("n", 1, 60)
    assert tiered.incr("n", 5) == 6
    assert tiered.cache.l2.get(":1:n") == 6
    with pytest.raises(ValueError, match="not found"):
        tiered.incr("missing")
    tiered.set("f", 0.5)
    assert tiered.incr("f") == 1.5
    tiered.set_many({f"k{i}": i for i in range(400)})
    assert tiered.get("k0") == 0  # no Django-style culling at 300


def test_tiered_timeouts(tiered: TieredNearCache) -> None:
    tiered.set("gone", 1, 0)
    assert tiered.has_key("gone") is False
    tiered.set("k", 1, None)
    assert tiered.touch("k", 0) is True
    assert tiered.get("k") is None


@pytest.mark.parametrize(
    ("location", "options", "message"),
    [
        ("127.0.0.1:6379", {}, "LOCATION must be the L2 URL"),
        ("memory://", {"size": "1MiB"}, "unknown OPTIONS for TieredNearCache: size"),
        ("nosuch://x", {}, "invalid tiered cache"),
    ],
)
def test_tiered_bad_configuration(location: str, options: dict[str, Any], message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        TieredNearCache(location, {"OPTIONS": options})


def test_tiered_registry_compares_options_by_content(tmp_path: Path) -> None:
    l1 = {"driver": "nearcache", "path": str(tmp_path / "l1"), "size": "1MiB"}
    url = f"memory://?max_entries={1000 + next(_names)}"
    a = TieredNearCache(url, {"OPTIONS": {"l1": dict(l1)}})
    b = TieredNearCache(url, {"OPTIONS": {"l1": dict(l1)}, "KEY_PREFIX": "b"})
    assert a.cache is b.cache  # one L1/L2 pair (and subscription) per process
    c = TieredNearCache(url, {"OPTIONS": {"l1": {**l1, "path": str(tmp_path / "l1c")}}})
    assert c.cache is not a.cache
