"""Django's ``BaseCacheTests`` run against nearcache's Django backends.

Each class below is built the way Django's own backend test classes are
(``LocMemCacheTests``, ``RedisCacheTests``, ...): ``BaseCacheTests`` mixed
into ``TestCase`` under ``override_settings(CACHES=caches_setting_for_tests(
BACKEND=..., LOCATION=...))``, plus tests of what is specific to the backend.

Which classes exist is chosen by ``NEARCACHE_DJTESTS_SUITES`` (a comma list,
set by ``tests/django/run.py``).  Tests that cannot apply to a backend are
listed in :data:`NOT_APPLICABLE` with the reason, and skipped by that reason.
"""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import os
import pickle
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from unittest import mock

from cache.tests import BaseCacheTests, caches_setting_for_tests  # Django's suite
from django.core.cache import CacheKeyWarning, cache, caches
from django.core.exceptions import ImproperlyConfigured
from django.test import TestCase, override_settings

from nearcache_djtests.bridge import BRIDGED, AsyncBridge

_T = TypeVar("_T", bound=type)

SUITES = frozenset(
    s.strip() for s in os.environ.get("NEARCACHE_DJTESTS_SUITES", "nearcache").split(",") if s
)
CACHE_DIR = os.environ.get("NEARCACHE_DJTESTS_DIR") or tempfile.mkdtemp(prefix="nearcache-dj-")
NEARCACHE = "nearcache.contrib.django.NearCache"
TIERED = "nearcache.contrib.django.TieredNearCache"
REDIS = os.environ.get("NEARCACHE_DJTESTS_REDIS", "")
MEMCACHED = os.environ.get("NEARCACHE_DJTESTS_MEMCACHED", "")

# Like Django's Redis and memcached backends, the tiered backend does not cull
# by entry count, so (as Django's RedisCacheTests and PyMemcacheCacheTests do)
# its tests leave out the "cull" and "zero_cull" caches.
TIERED_EXCLUDED_CACHES = {"cull", "zero_cull"}
TIERED_NO_CULL = (
    "no entry-count culling: L2 (Redis/memcached) bounds its own memory and L1 its size; "
    "Django's Redis and memcached backend tests skip it the same way"
)

# Skip reasons of the tests listed below start with this (tests/django/run.py
# accepts those skips, and only those, in nearcache's classes).
NOT_APPLICABLE_MARK = "not applicable: "
# Test class name -> {test method name: reason it cannot apply}.
NOT_APPLICABLE: dict[str, dict[str, str]] = {
    "LocMemSelfCheckTests": {},
    "NearCacheTests": {},
    "AsyncNearCacheTests": {},
    "TieredRedisNearCacheTests": {
        "test_cull": TIERED_NO_CULL,
        "test_zero_cull": TIERED_NO_CULL,
        "test_cull_delete_when_store_empty": TIERED_NO_CULL,
    },
    "TieredMemcachedNearCacheTests": {
        "test_cull": TIERED_NO_CULL,
        "test_zero_cull": TIERED_NO_CULL,
        "test_cull_delete_when_store_empty": TIERED_NO_CULL,
    },
}


def not_applicable(cls: _T) -> _T:
    """Skip, with their reasons, the tests :data:`NOT_APPLICABLE` lists for ``cls``."""
    for name, reason in NOT_APPLICABLE.get(cls.__name__, {}).items():
        if not hasattr(cls, name):
            raise AttributeError(f"{cls.__name__}.{name} is listed as not applicable but absent")
        original: Callable[..., Any] = getattr(cls, name)

        def skipped(self: TestCase, _reason: str = reason) -> None:
            self.skipTest(NOT_APPLICABLE_MARK + _reason)

        skipped.__name__ = original.__name__
        skipped.__doc__ = original.__doc__
        setattr(cls, name, skipped)
    return cls


def location(name: str) -> str:
    """Path of a cache file for one test class, in the run's scratch directory."""
    return os.path.join(CACHE_DIR, name)


def _incr_many(path: str, key: str, times: int) -> None:
    """Child process body: increment ``key`` ``times`` times through Django's API."""
    from nearcache.contrib.django import NearCache

    backend = NearCache(path, {})
    for _ in range(times):
        backend.incr(key)


def _set_from_child(path: str, key: str, value: Any) -> None:
    """Child process body: store ``value`` under ``key``."""
    from nearcache.contrib.django import NearCache

    NearCache(path, {}).set(key, value, None)


if "selfcheck-locmem" in SUITES:

    @not_applicable
    @override_settings(
        CACHES=caches_setting_for_tests(
            BACKEND="django.core.cache.backends.locmem.LocMemCache",
            LOCATION="nearcache-selfcheck",
        )
    )
    class LocMemSelfCheckTests(BaseCacheTests, TestCase):  # type: ignore[misc]
        """The harness itself, checked against Django's locmem backend.

        Django's ``LocMemCacheTests`` already covers locmem; this class runs
        the same generic construction used for nearcache's backends below, so
        a failure here points at the harness, not at a backend.
        """


if "nearcache" in SUITES:

    @not_applicable
    @override_settings(CACHES=caches_setting_for_tests(BACKEND=NEARCACHE, LOCATION=location("nc")))
    class NearCacheTests(BaseCacheTests, TestCase):  # type: ignore[misc]
        """Django's backend tests for ``NearCache``, plus its own behaviour."""

        def test_incr_decr_timeout(self) -> None:
            """incr/decr keep the entry's expiry (as Django's locmem test checks)."""
            key = "value"
            made = cache.make_key(key)
            cache.set(key, 1, timeout=cache.default_timeout * 10)
            expire = cache.cache.expire_time(made)
            self.assertTrue(math.isfinite(expire))
            self.assertEqual(cache.incr(key), 2)
            self.assertEqual(cache.cache.expire_time(made), expire)
            self.assertEqual(cache.decr(key), 1)
            self.assertEqual(cache.cache.expire_time(made), expire)
            # The fallback path for non-counters keeps it too.
            cache.set(key, 1.5, timeout=cache.default_timeout * 10)
            expire = cache.cache.expire_time(made)
            self.assertEqual(cache.incr(key), 2.5)
            self.assertAlmostEqual(cache.cache.expire_time(made), expire, delta=0.01)

        def test_incr_non_counter_values(self) -> None:
            """Values that are not native counters still add like Django's default incr."""
            cache.set("flag", True)
            self.assertEqual(cache.incr("flag"), 2)
            cache.set("big", 2**70)
            self.assertEqual(cache.incr("big", 5), 2**70 + 5)
            self.assertEqual(cache.get("big"), 2**70 + 5)
            cache.set("max", 2**63 - 1)
            self.assertEqual(cache.incr("max"), 2**63)
            self.assertEqual(cache.get("max"), 2**63)
            cache.set("text", "a")
            with self.assertRaises(TypeError):
                cache.incr("text")
            self.assertEqual(cache.get("text"), "a")

        def test_incr_is_atomic_across_processes(self) -> None:
            """Concurrent incr from several processes loses no update."""
            path = location("nc")
            cache.set("counter", 0)
            ctx = multiprocessing.get_context("fork")
            procs = [ctx.Process(target=_incr_many, args=(path, "counter", 300)) for _ in range(4)]
            for p in procs:
                p.start()
            for p in procs:
                p.join(60)
                self.assertEqual(p.exitcode, 0)
            self.assertEqual(cache.get("counter"), 1200)

        def test_shared_between_processes(self) -> None:
            """A value set in another process is seen here (one cache per host)."""
            ctx = multiprocessing.get_context("fork")
            proc = ctx.Process(
                target=_set_from_child,
                args=(location("nc"), "from-child", {"pid": "child"}),
            )
            proc.start()
            proc.join(60)
            self.assertEqual(proc.exitcode, 0)
            self.assertEqual(cache.get("from-child"), {"pid": "child"})

        @override_settings(
            CACHES={
                "default": {"BACKEND": NEARCACHE, "LOCATION": location("nc-a")},
                "other": {"BACKEND": NEARCACHE, "LOCATION": location("nc-b")},
            }
        )
        def test_multiple_caches(self) -> None:
            """Caches with different LOCATIONs are isolated."""
            cache.set("value", 42)
            self.assertEqual(caches["default"].get("value"), 42)
            self.assertIsNone(caches["other"].get("value"))
            caches["default"].clear()

        def test_one_mapping_per_process(self) -> None:
            """Aliases naming the same file share one mapping; close() keeps it open."""
            self.assertIs(cache.cache, caches["prefix"].cache)
            cache.close()
            cache.set("after-close", 1)
            self.assertEqual(cache.get("after-close"), 1)

        def test_max_entries_counts_the_whole_file(self) -> None:
            """MAX_ENTRIES counts every entry of the file, as the file backend counts files."""
            cull_cache = caches["cull"]  # MAX_ENTRIES=30, CULL_FREQUENCY=3
            cache.set_many({f"other{i}": i for i in range(29)})
            cull_cache.set("c0", 0)  # 29 entries before: no cull
            self.assertEqual(len(cache.cache), 30)
            cull_cache.set("c1", 1)  # 30 entries: cull 10 first
            self.assertEqual(len(cache.cache), 21)
            self.assertTrue(cull_cache.has_key("c1"))

        def test_default_max_entries(self) -> None:
            """Without MAX_ENTRIES there is no entry limit: the file's size bounds the cache.

            (Django's 300 would count the whole host's file, where LocMemCache
            counts 300 per process.)
            """
            self.assertIsNone(cache._max_entries)
            cache.set_many({f"k{i}": i for i in range(300)})
            cache.set("one-more", 1)
            self.assertEqual(len(cache.cache), 301)
            caches["cull"].set("counted", 1)  # an explicit MAX_ENTRIES (30) still culls
            self.assertLess(len(cache.cache), 301)

        def test_set_many_culls_like_successive_sets(self) -> None:
            """A set_many that crosses MAX_ENTRIES culls as the same sets one by one would."""
            cull_cache = caches["cull"]
            self.assertEqual(cull_cache.set_many({f"cull{i}": i for i in range(1, 50)}), [])
            self.assertEqual(len(cache.cache), 29)
            cache.clear()
            zero_cull = caches["zero_cull"]
            self.assertEqual(zero_cull.set_many({f"cull{i}": i for i in range(1, 50)}), [])
            self.assertEqual(len(cache.cache), 19)

        @override_settings(
            CACHES={
                "default": {
                    "BACKEND": NEARCACHE,
                    "LOCATION": location("nc-unlimited"),
                    "OPTIONS": {"MAX_ENTRIES": None, "size": "4MiB"},
                }
            }
        )
        def test_max_entries_none_disables_culling(self) -> None:
            """MAX_ENTRIES None leaves the bound to the engine's byte budget."""
            self.assertIsNone(cache._max_entries)
            cache.set_many({f"k{i}": i for i in range(1000)})
            self.assertEqual(len(cache.cache), 1000)
            self.assertTrue(3.9 * 2**20 < cache.cache.capacity <= 4 * 2**20)
            cache.clear()

        @override_settings(
            CACHES={
                "default": {
                    "BACKEND": NEARCACHE,
                    "LOCATION": location("nc-json"),
                    "OPTIONS": {"serializer": "json", "compress": "zstd", "shards": 2},
                }
            }
        )
        def test_options_reach_the_cache(self) -> None:
            """OPTIONS configure nearcache: here a JSON serializer and zstd compression."""
            self.assertEqual(cache.cache.shard_count, 2)
            cache.set("doc", {"a": [1, 2, "x" * 5000]})
            self.assertEqual(cache.get("doc"), {"a": [1, 2, "x" * 5000]})
            with self.assertRaises(TypeError):
                cache.set("obj", object())
            cache.clear()

        @override_settings(
            CACHES={
                "default": {
                    "BACKEND": NEARCACHE,
                    "LOCATION": location("nc-signed"),
                    "OPTIONS": {"signing_key": b"k" * 32},
                }
            }
        )
        def test_signing_key(self) -> None:
            """With a signing key, a value planted in the file is a miss, never unpickled."""
            cache.set("user", {"name": "Ada"})
            self.assertEqual(cache.get("user"), {"name": "Ada"})
            planted = pickle.dumps({"name": "Mallory"})
            cache.cache.native.set(cache.make_key("user"), planted, None, 16)
            self.assertIsNone(cache.get("user"))
            cache.set("n", 1)
            self.assertEqual(cache.incr("n"), 2)
            cache.clear()

        def test_unknown_option(self) -> None:
            """A misspelt option is an ImproperlyConfigured error naming the valid ones."""
            from nearcache.contrib.django import NearCache

            with self.assertRaisesMessage(ImproperlyConfigured, "unknown OPTIONS"):
                NearCache(location("nc"), {"OPTIONS": {"sise": "1MiB"}})
            with self.assertRaisesMessage(ImproperlyConfigured, "TIMEOUT"):
                NearCache(location("nc"), {"OPTIONS": {"ttl": 5}})
            with self.assertRaises(ImproperlyConfigured):
                NearCache(location("nc"), {"OPTIONS": {"size": "lots"}})

        def test_value_too_large(self) -> None:
            """A value larger than one entry is kept in a file beside the cache;
            one over the spill budget is not stored and the stale one is removed."""
            from nearcache.contrib.django import NearCache

            large = b"y" * (cache.cache.max_entry_size + 1)
            cache.set("large", large)
            self.assertEqual(cache.get("large"), large)
            small_budget = NearCache(location("nc-budget"), {"OPTIONS": {"spill_budget": "2MiB"}})
            big = b"x" * (small_budget.cache.max_value_size + 1)
            small_budget.set("big", "old")
            with self.assertLogs("nearcache.contrib.django", "WARNING"):
                small_budget.set("big", big)
            self.assertIsNone(small_budget.get("big"))
            with self.assertLogs("nearcache.contrib.django", "WARNING"):
                failed = small_budget.set_many({"small": 1, "big": big})
            self.assertEqual(failed, ["big"])
            self.assertEqual(small_budget.get("small"), 1)
            with self.assertLogs("nearcache.contrib.django", "WARNING"):
                self.assertIs(small_budget.add("big2", big), False)
            self.assertIs(small_budget.has_key("big2"), False)
            small_budget.clear()

        def test_long_key(self) -> None:
            """Keys longer than LONG_KEY characters work (with Django's warning)."""
            key = "k" * 5000
            with self.assertWarns(CacheKeyWarning):
                cache.set(key, "value")
            with self.assertWarns(CacheKeyWarning):
                self.assertEqual(cache.get(key), "value")
            with self.assertWarns(CacheKeyWarning):
                self.assertEqual(cache.get_many([key]), {key: "value"})
            self.assertTrue(all(len(k) < 100 for k in cache.cache))

        def test_timeout_semantics(self) -> None:
            """None never expires, negative expires at once, huge is forever."""
            cache.set("forever", 1, None)
            self.assertEqual(cache.cache.ttl(cache.make_key("forever")), math.inf)
            cache.set("gone", 1, -5)
            self.assertIs(cache.has_key("gone"), False)
            cache.set("present", 1)
            self.assertIs(cache.add("present", 2, -1), False)
            self.assertIs(cache.add("absent", 2, -1), True)
            self.assertIs(cache.has_key("absent"), False)
            cache.set("huge", 1, 10**20)
            self.assertEqual(cache.cache.ttl(cache.make_key("huge")), math.inf)
            cache.set("soon", 1, 0.3)
            self.assertLessEqual(cache.cache.ttl(cache.make_key("soon")), 0.3)
            time.sleep(0.4)
            self.assertIsNone(cache.get("soon"))

        def test_threads_share_the_cache(self) -> None:
            """Threads (each with its own backend object) see one store and lose no incr."""
            cache.set("hits", 0)
            errors: list[BaseException] = []

            def work() -> None:
                try:
                    for _ in range(500):
                        caches["default"].incr("hits")
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=work) for _ in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            self.assertEqual(errors, [])
            self.assertEqual(cache.get("hits"), 2000)


if "nearcache-async" in SUITES:

    @not_applicable
    @override_settings(
        CACHES=caches_setting_for_tests(BACKEND=NEARCACHE, LOCATION=location("nc-async"))
    )
    class AsyncNearCacheTests(BaseCacheTests, TestCase):  # type: ignore[misc]
        """Django's backend tests run through ``NearCache``'s async methods.

        ``cache`` in Django's tests is replaced by an :class:`AsyncBridge`, so
        ``cache.get(...)`` runs ``await backend.aget(...)``; the other aliases
        (``caches["v2"]``...) stay synchronous, which also checks that both
        paths see the same data.
        """

        def setUp(self) -> None:
            super().setUp()
            self.bridge = AsyncBridge(caches["default"])
            patcher = mock.patch("cache.tests.cache", self.bridge)
            patcher.start()
            self.addCleanup(patcher.stop)

        def test_async_path_was_used(self) -> None:
            """The bridge really answers through the async methods."""
            from cache import tests as django_tests

            django_tests.cache.set("k", "v")
            self.assertEqual(django_tests.cache.get("k"), "v")
            self.assertEqual(self.bridge.calls, ["aset", "aget"])
            self.assertTrue(BRIDGED)

        async def test_no_thread_hop(self) -> None:
            """Every async method runs in the event loop's thread, without sync_to_async."""
            backend = caches["default"]
            loop_thread = threading.get_ident()
            seen: set[int] = set()
            real_get = type(backend).get

            def spy_get(self: Any, *args: Any, **kwargs: Any) -> Any:
                seen.add(threading.get_ident())
                return real_get(self, *args, **kwargs)

            forbidden = mock.Mock(side_effect=AssertionError("sync_to_async used"))
            with (
                mock.patch("django.core.cache.backends.base.sync_to_async", forbidden),
                mock.patch("nearcache.contrib.django.backend.sync_to_async", forbidden),
                mock.patch.object(type(backend), "get", spy_get),
            ):
                await backend.aset("a", 1)
                self.assertEqual(await backend.aget("a"), 1)
                self.assertIs(await backend.aadd("b", 2), True)
                self.assertIs(await backend.atouch("b", 10), True)
                self.assertIs(await backend.ahas_key("b"), True)
                self.assertEqual(await backend.aset_many({"c": 3, "d": 4}), [])
                self.assertEqual(await backend.aget_many(["a", "c", "x"]), {"a": 1, "c": 3})
                self.assertEqual(await backend.aincr("a", 5), 6)
                self.assertEqual(await backend.adecr("a", 2), 4)
                self.assertEqual(await backend.aget_or_set("e", lambda: 5), 5)
                self.assertEqual(await backend.aincr_version("e"), 2)
                self.assertEqual(await backend.adecr_version("e", version=2), 1)
                self.assertIs(await backend.adelete("a"), True)
                await backend.adelete_many(["c", "d"])
                self.assertEqual(await backend.aget_many(["c", "d"]), {})
                await backend.aclear()
                self.assertIs(await backend.ahas_key("b"), False)
                await backend.aclose()
            forbidden.assert_not_called()
            self.assertEqual(seen, {loop_thread})

        async def test_values_whose_pickling_needs_the_database(self) -> None:
            """A lazy QuerySet (evaluated when pickled) is stored from async code.

            Pickling it queries the database, which Django forbids in an event
            loop; the backend then serializes in a thread, like Django's
            default async methods.
            """
            from asgiref.sync import sync_to_async
            from cache.models import Poll

            backend = caches["default"]
            await sync_to_async(Poll.objects.create)(question="Async?")
            await backend.aset("polls", Poll.objects.all())
            polls = await backend.aget("polls")
            self.assertEqual([p.question for p in polls], ["Async?"])
            self.assertIs(await backend.aadd("polls2", Poll.objects.all()), True)
            self.assertEqual(await backend.aset_many({"polls3": Poll.objects.all()}), [])
            self.assertEqual(len((await backend.aget_many(["polls3"]))["polls3"]), 1)

        async def test_aget_or_set(self) -> None:
            """aget_or_set stores the default (or a callable's result) once."""
            backend = caches["default"]
            self.assertEqual(await backend.aget_or_set("projector", 42), 42)
            self.assertEqual(await backend.aget_or_set("projector", 43), 42)
            self.assertIsNone(await backend.aget_or_set("null", None))
            self.assertIsNone(await backend.aget("null", "default"))
            self.assertEqual(await backend.aget_or_set("brian", 1979, version=2), 1979)
            self.assertIsNone(await backend.aget("brian", version=1))

        async def test_async_key_warnings(self) -> None:
            """Async methods validate keys like the sync ones."""
            backend = caches["default"]
            with self.assertWarns(CacheKeyWarning):
                await backend.aset("key with spaces", 1)
            with self.assertWarns(CacheKeyWarning):
                await backend.aget_many(["key with spaces"])

        async def test_concurrent_tasks(self) -> None:
            """Many tasks of one loop interleave safely (each call is one native op)."""
            backend = caches["default"]
            await backend.aset("n", 0)

            async def bump() -> None:
                for _ in range(50):
                    await backend.aincr("n")
                    await asyncio.sleep(0)

            await asyncio.gather(*(bump() for _ in range(20)))
            self.assertEqual(await backend.aget("n"), 1000)


class TieredTestsMixin:
    """Tests of the tiered backend itself, for either L2."""

    l2_location: str

    def _second_host(self) -> Any:
        """A backend with its own L1 file and the same L2: another host."""
        from nearcache.contrib.django import TieredNearCache

        l1 = {"driver": "nearcache", "path": location(f"{self.id()}-b"), "size": "1MiB"}
        other = TieredNearCache(self.l2_location, {"OPTIONS": {"l1": l1}})
        other.cache.wait_ready(5)
        return other

    def test_culling_is_off(self) -> None:
        """MAX_ENTRIES is ignored, as by Django's Redis and memcached backends."""
        self.assertIsNone(cache._max_entries)

    def test_reads_are_served_from_l1(self) -> None:
        """After a write, reads on this host hit L1 (the shared-memory file)."""
        tiered = cache.cache
        cache.set("page", "<html>")
        self.assertEqual(tiered.l1.get(cache.make_key("page")), "<html>")
        before = tiered.stats()
        self.assertEqual(cache.get("page"), "<html>")
        after = tiered.stats()
        self.assertEqual(after["l1_hits"], before["l1_hits"] + 1)
        self.assertEqual(after["l2_hits"], before["l2_hits"])

    def test_l2_fills_l1(self) -> None:
        """A value written by another host is read from L2 once, then from L1."""
        other = self._second_host()
        other.set("from-b", [1, 2])
        tiered = cache.cache
        self.assertEqual(cache.get("from-b"), [1, 2])
        # The other host's invalidation for its own write may arrive after this
        # read filled L1 and drop the copy again (correctly: it cannot tell the
        # order); once it has arrived, a read fills L1 for good.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            self.assertEqual(cache.get("from-b"), [1, 2])
            if tiered.l1.get(cache.make_key("from-b")) == [1, 2]:
                break
            time.sleep(0.01)
        self.assertEqual(tiered.l1.get(cache.make_key("from-b")), [1, 2])
        before = tiered.stats()["l2_hits"]
        self.assertEqual(cache.get("from-b"), [1, 2])
        self.assertEqual(tiered.stats()["l2_hits"], before)

    def test_incr_is_atomic_in_l2(self) -> None:
        """incr from two hosts adds up in L2."""
        other = self._second_host()
        cache.set("visits", 0)
        for _ in range(10):
            cache.incr("visits")
            other.incr("visits")
        self.assertEqual(cache.cache.l2.get(cache.make_key("visits")), 20)
        self.assertEqual(other.get("visits"), 20)


if "tiered-redis" in SUITES:

    @not_applicable
    @override_settings(
        CACHES=caches_setting_for_tests(
            BACKEND=TIERED,
            LOCATION=f"{REDIS}/1?prefix=djtests:",
            OPTIONS={"l1": {"driver": "nearcache", "path": location("tiered-redis-l1")}},
            exclude=TIERED_EXCLUDED_CACHES,
        )
    )
    class TieredRedisNearCacheTests(TieredTestsMixin, BaseCacheTests, TestCase):  # type: ignore[misc]
        """Django's backend tests for nearcache in front of a real redis-server."""

        l2_location = f"{REDIS}/1?prefix=djtests:"

        def setUp(self) -> None:
            super().setUp()
            cache.cache.wait_ready(5)

        def test_invalidation_reaches_other_hosts(self) -> None:
            """A write on one host drops the other host's L1 copy (Redis pub/sub)."""
            other = self._second_host()
            cache.set("shared", "v1")
            self.assertEqual(other.get("shared"), "v1")  # now in the other L1
            cache.set("shared", "v2")
            deadline = time.monotonic() + 5
            while other.get("shared") != "v2" and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertEqual(other.get("shared"), "v2")
            cache.delete("shared")
            deadline = time.monotonic() + 5
            while other.get("shared") is not None and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertIsNone(other.get("shared"))


if "tiered-memcached" in SUITES:

    @not_applicable
    @override_settings(
        CACHES=caches_setting_for_tests(
            BACKEND=TIERED,
            LOCATION=f"memcached://{MEMCACHED}?prefix=djtests:",
            OPTIONS={"l1": {"driver": "nearcache", "path": location("tiered-memcached-l1")}},
            exclude=TIERED_EXCLUDED_CACHES,
        )
    )
    class TieredMemcachedNearCacheTests(TieredTestsMixin, BaseCacheTests, TestCase):  # type: ignore[misc]
        """Django's backend tests for nearcache in front of a real memcached."""

        l2_location = f"memcached://{MEMCACHED}?prefix=djtests:"
