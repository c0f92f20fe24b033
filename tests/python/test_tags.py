"""Tags: group invalidation by generation counters, across processes and hosts."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nearcache import Cache
from nearcache.aio import AsyncCache
from nearcache.drivers import MemoryDriver, RedisDriver, ShmDriver
from nearcache.tags import TAG_NAMESPACE, Tagged, tag_key
from nearcache.testing import RedisServer
from nearcache.tiered import TieredCache


@pytest.fixture
def cache(tmp_path: Path) -> Iterator[Cache]:
    with Cache(path=tmp_path / "tags", size="4MiB") as opened:
        yield opened


def test_set_get_invalidate(cache: Cache) -> None:
    tagged = Tagged(cache)
    tagged.set("a", {"x": 1}, tags=["t1", "t2"])
    tagged.set("b", [2], tags=["t2"])
    tagged.set("c", "plain")
    assert tagged.get("a") == {"x": 1} and tagged.get("b") == [2] and tagged.get("c") == "plain"
    assert tagged.invalidate_tags(["t1"]) == 1
    assert tagged.get("a", "miss") == "miss"
    assert tagged.get("b") == [2]
    assert tagged.invalidate_tags(["t2", "never-used"]) == 1
    assert tagged.get("b") is None
    assert tagged.get("c") == "plain"
    tagged.set("a", "again", tags=["t1"])  # a new write under the new generation
    assert tagged.get("a") == "again"


def test_get_many_checks_each_entry(cache: Cache) -> None:
    tagged = Tagged(cache)
    tagged.set("a", 1, tags=["x"])
    tagged.set("b", 2, tags=["y"])
    tagged.set("c", 3)
    tagged.invalidate_tags(["x"])
    assert tagged.get_many(["a", "b", "c", "missing"]) == {"b": 2, "c": 3}


def test_add_with_tags(cache: Cache) -> None:
    tagged = Tagged(cache)
    assert tagged.add("k", 1, tags=["t"]) is True
    assert tagged.add("k", 2, tags=["t"]) is False
    assert tagged.get("k") == 1


def test_a_lost_tag_record_invalidates_and_never_resurrects(cache: Cache) -> None:
    tagged = Tagged(cache)
    tagged.set("k", "v1", tags=["t"])
    before = tagged.generations(["t"])["t"]
    assert cache.delete(tag_key("t"))  # the record is evicted
    assert tagged.get("k", "miss") == "miss"  # a read does not recreate it...
    assert tag_key("t") not in cache
    after = tagged.generations(["t"])["t"]  # ...a write does, with a new random generation
    assert after != before
    assert tagged.get("k", "miss") == "miss"
    # Invalidated, then the record lost and recreated: the old entry stays dead.
    tagged.set("k2", "v2", tags=["u"])
    tagged.invalidate_tags(["u"])
    cache.delete(tag_key("u"))
    tagged.generations(["u"])
    assert tagged.get("k2", "miss") == "miss"


def test_generations_are_random_62_bit_and_nonzero(cache: Cache) -> None:
    tagged = Tagged(cache)
    generations = tagged.generations([f"t{i}" for i in range(50)])
    assert len(set(generations.values())) == 50
    assert all(0 < gen < 2**62 for gen in generations.values())
    assert cache.get(TAG_NAMESPACE + "t0") == generations["t0"]


class CountingDriver(MemoryDriver):
    """A memory driver that counts the store operations made on it."""

    def __init__(self) -> None:
        super().__init__(max_bytes=64 * 1024 * 1024)
        self.calls: list[str] = []

    def _count(self, name: str) -> None:
        self.calls.append(name)

    def get(self, key: Any, default: Any = None) -> Any:
        self._count("get")
        return super().get(key, default)

    def get_many(self, keys: Any) -> dict[Any, Any]:
        self._count("get_many")
        return super().get_many(keys)

    def set(self, key: Any, value: Any, ttl: Any = None) -> None:
        self._count("set")
        super().set(key, value, ttl)

    def delete(self, key: Any) -> bool:
        self._count("delete")
        return super().delete(key)

    def incr(self, key: Any, delta: int = 1, default: int | None = 0) -> int:
        self._count("incr")
        return super().incr(key, delta, default)


def test_invalidation_is_one_operation_per_tag_whatever_the_entries() -> None:
    store = CountingDriver()
    tagged = Tagged(store)
    for count in (10, 2000):
        for i in range(count):
            tagged.set(f"k{count}-{i}", i, tags=[f"group{count}", "all"])
        store.calls.clear()
        assert tagged.invalidate_tags([f"group{count}"]) == 1
        assert store.calls == ["incr"]
    # A read of a tagged entry: the entry, then one get_many for its tags.
    tagged.set("r", 1, tags=["a", "b", "c"])
    store.calls.clear()
    assert tagged.get("r") == 1
    assert store.calls == ["get", "get_many"]


def test_bad_tags_are_refused_and_nothing_is_stored(cache: Cache) -> None:
    tagged = Tagged(cache)
    for bad in ("users", b"users", [1], [""], [None]):
        with pytest.raises(TypeError):
            tagged.set("k", 1, tags=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            tagged.invalidate_tags(bad)  # type: ignore[arg-type]
    assert "k" not in cache
    assert len(cache) == 0


# ------------------------------------------------------------------ across processes


def _invalidate_in_another_process(path: str, tag: str) -> int:
    with Cache(path=path) as cache:
        return Tagged(cache).invalidate_tags([tag])


def test_invalidation_crosses_processes(tmp_path: Path) -> None:
    path = tmp_path / "shared"
    with Cache(path=path, size="4MiB") as cache:
        tagged = Tagged(cache)
        tagged.set("page:1", "<html>", tags=["pages"])
        tagged.set("page:2", "<html>", tags=["pages"])
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            assert pool.apply(_invalidate_in_another_process, (str(path), "pages")) == 1
        assert tagged.get_many(["page:1", "page:2"]) == {}


# --------------------------------------------------------------------- across hosts


@pytest.fixture
def two_hosts(
    redis_server: RedisServer, unique_prefix: str, tmp_path: Path
) -> Iterator[tuple[TieredCache, TieredCache]]:
    hosts = [
        TieredCache(
            ShmDriver(path=tmp_path / f"host-{name}", size="4MiB"),
            RedisDriver(redis_server.url, prefix=unique_prefix),
            invalidation=redis_server.url,
            channel=f"{unique_prefix}channel",
        )
        for name in ("a", "b")
    ]
    for host in hosts:
        assert host.wait_ready(5)
    yield hosts[0], hosts[1]
    for host in hosts:
        host.close()


def wait_for(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.002)


def test_invalidation_crosses_hosts_through_the_tiered_cache(
    two_hosts: tuple[TieredCache, TieredCache],
) -> None:
    host_a, host_b = (Tagged(host) for host in two_hosts)
    host_a.set("user:1", {"name": "Ada"}, tags=["user:1"])
    # B's L1 then holds entry and tag record (A's invalidation of its own
    # write may reach B after B's first read and drop that copy: read again)
    wait_for(
        lambda: (
            host_b.get("user:1") == {"name": "Ada"}
            and two_hosts[1].l1.get(tag_key("user:1")) is not None
        )
    )
    assert host_a.invalidate_tags(["user:1"]) == 1
    wait_for(lambda: host_b.get("user:1", "miss") == "miss")
    # Host B's whole L1 lost (a resync clears it): the entry stays invalidated.
    two_hosts[1].l1.clear()
    assert host_b.get("user:1", "miss") == "miss"


# --------------------------------------------------------------------------- memoize


def test_memoize_with_tags(cache: Cache) -> None:
    tagged = Tagged(cache)
    calls: list[int] = []

    @tagged.memoize(ttl=60, tags=lambda user_id: [f"user:{user_id}"])
    def profile(user_id: int) -> dict[str, int]:
        calls.append(user_id)
        return {"id": user_id}

    assert profile(1) == profile(1) == {"id": 1}
    assert profile(2) == {"id": 2}
    assert calls == [1, 2]
    tagged.invalidate_tags(["user:1"])
    assert profile(1) == {"id": 1}
    assert profile(2) == {"id": 2}
    assert calls == [1, 2, 1]


def test_memoize_static_tags_and_invalidation_while_computing(cache: Cache) -> None:
    tagged = Tagged(cache)
    calls = 0

    @tagged.memoize(ttl=60, tags=["report"])
    def report() -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            tagged.invalidate_tags(["report"])  # the data changed while computing
        return calls

    assert report() == 1  # the caller gets its result...
    assert report() == 2  # ...but it was stored under the old generation: recomputed
    assert report() == 2
    with pytest.raises(TypeError):
        tagged.memoize(tags="report")


@pytest.mark.parametrize("kind", ["cache", "shm", "memory", "tiered"])
def test_memoize_takes_tags_on_every_store(kind: str, tmp_path: Path) -> None:
    store: Any
    if kind == "cache":
        store = Cache(path=tmp_path / "c", size="4MiB")
    elif kind == "shm":
        store = ShmDriver(path=tmp_path / "c", size="4MiB")
    elif kind == "memory":
        store = MemoryDriver()
    else:
        store = TieredCache(ShmDriver(path=tmp_path / "l1", size="4MiB"), MemoryDriver())
    calls: list[int] = []

    @store.memoize(ttl=60, tags=lambda user_id: [f"user:{user_id}", "users"])
    def profile(user_id: int) -> dict[str, int]:
        calls.append(user_id)
        return {"id": user_id}

    assert profile(1) == profile(1) == {"id": 1} and profile(2) == {"id": 2}
    assert calls == [1, 2]
    key = profile.cache_key(1)
    assert Tagged(store).invalidate_tags(["user:1"]) == 1
    assert profile.cache_key(1) != key  # the new generation is part of the key
    assert profile(1) == {"id": 1} and profile(2) == {"id": 2}
    assert calls == [1, 2, 1]
    Tagged(store).invalidate_tags(["users"])
    profile(1), profile(2)
    assert calls == [1, 2, 1, 1, 2]
    assert profile.invalidate(2) is True and profile(2) == {"id": 2}
    assert calls == [1, 2, 1, 1, 2, 2]
    with pytest.raises(TypeError, match="bare str"):
        store.memoize(tags="users")
    store.close()


def test_tagged_memoize_applies_the_method_rule(cache: Cache) -> None:
    tagged = Tagged(cache)
    # Python < 3.12 wraps errors of __set_name__ in a RuntimeError.
    with pytest.raises((TypeError, RuntimeError)) as raised:

        class NoIdentity:
            @tagged.memoize(ttl=60, tags=["repos"])
            def load(self, x: int) -> int:
                return x

    error = raised.value if isinstance(raised.value, TypeError) else raised.value.__cause__
    assert isinstance(error, TypeError) and "NoIdentity has no __cache_key__()" in str(error)

    class Repo:
        def __init__(self, ident: str) -> None:
            self.ident = ident
            self.calls = 0  # state that changes: never part of the key

        def __cache_key__(self) -> str:
            return self.ident

        @cache.memoize(ttl=60, tags=lambda self, x: [f"repo:{self.ident}"])
        def load(self, x: int) -> str:
            self.calls += 1
            return f"{self.ident}:{x}"

        @cache.memoize(ttl=60, tags=["shared"], ignore=("self",))
        def shared(self, x: int) -> int:
            self.calls += 1
            return x

    a, b = Repo("a"), Repo("b")
    assert a.load(1) == a.load(1) == "a:1" and a.calls == 1
    assert Repo("a").load(1) == "a:1"  # same identity, same entry
    assert b.load(1) == "b:1" and b.calls == 1
    tagged.invalidate_tags(["repo:a"])
    assert a.load(1) == "a:1" and a.calls == 2 and b.load(1) == "b:1" and b.calls == 1
    assert a.load.invalidate(1) is True  # helpers bind to the instance
    assert a.shared(5) == b.shared(5) == 5 and a.calls + b.calls == 4


def test_sync_and_async_tagged_memoize_share_entries(tmp_path: Path) -> None:
    sync_cache = Cache(path=tmp_path / "shared", size="4MiB")
    async_cache = AsyncCache(sync_cache)

    @async_cache.memoize(ttl=60, tags=lambda n: [f"n:{n}"], name="shared.square")
    async def asquare(n: int) -> int:
        return n * n

    @sync_cache.memoize(ttl=60, tags=lambda n: [f"n:{n}"], name="shared.square")
    def square(n: int) -> int:
        raise AssertionError("the async result must be served")

    assert asyncio.run(asquare(4)) == 16
    assert square(4) == 16
    assert square.cache_key(4) == asyncio.run(asquare.cache_key(4))
    sync_cache.close()


def test_async_memoize_with_tags(tmp_path: Path) -> None:
    cache = AsyncCache(path=tmp_path / "amemo", size="4MiB")
    calls: list[str] = []

    @cache.memoize(ttl=60, tags=["catalog"])
    async def catalog(section: str) -> str:
        calls.append(section)
        await asyncio.sleep(0.01)
        if len(calls) == 1:
            await cache.invalidate_tags(["catalog"])
        return section.upper()

    async def main() -> list[str]:
        out = [await catalog("a"), await catalog("a"), await catalog("a")]
        await cache.invalidate_tags(["catalog"])
        out.append(await catalog("a"))
        key_before = await catalog.cache_key("a")
        await cache.invalidate_tags(["catalog"])
        assert await catalog.cache_key("a") != key_before
        return out

    assert asyncio.run(main()) == ["A"] * 4
    assert calls == ["a", "a", "a"]
    cache.driver.close()


def test_async_tags_over_redis(redis_server: RedisServer, unique_prefix: str) -> None:
    cache = AsyncCache(RedisDriver(redis_server.url, prefix=unique_prefix))

    async def main() -> tuple[Any, ...]:
        await cache.set("a", 1, tags=["t"])
        await cache.set("b", 2, tags=["t", "u"])
        await cache.set("c", 3)
        first = await cache.get_many(["a", "b", "c"])
        await cache.invalidate_tags(["u"])
        second = await cache.get_many(["a", "b", "c"])
        popped = await cache.pop("b", "gone")
        await cache.aclose()
        return first, second, popped

    first, second, popped = asyncio.run(main())
    assert first == {"a": 1, "b": 2, "c": 3}
    assert second == {"a": 1, "c": 3}
    assert popped == "gone"
    cache.driver.close()


def test_a_garbage_tag_record_is_replaced_and_invalidates(cache: Cache) -> None:
    tagged = Tagged(cache)
    tagged.set("k", 1, tags=["t"])
    cache.set(tag_key("t"), "not a generation")  # written by something else
    assert tagged.get("k", "miss") == "miss"
    tagged.set("k", 2, tags=["t"])  # the record is replaced by a fresh generation
    assert isinstance(cache.get(tag_key("t")), int)
    assert tagged.get("k") == 2
    cache.set(tag_key("t"), b"junk")
    assert tagged.invalidate_tags(["t"]) == 1
    assert isinstance(cache.get(tag_key("t")), int)
    assert tagged.get("k", "miss") == "miss"


def test_async_garbage_tag_record(tmp_path: Path) -> None:
    acache = AsyncCache(path=tmp_path / "g", size="1MiB")
    raw = acache.driver

    async def main() -> tuple[Any, ...]:
        await acache.set("k", 1, tags=["t"])
        raw.set(tag_key("t"), 3.5)
        first = await acache.get("k", "miss")
        await acache.set("k", 2, tags=["t"])
        second = await acache.get("k")
        raw.set(tag_key("t"), "junk")
        count = await acache.invalidate_tags(["t"])
        return first, second, count, await acache.get("k", "miss")

    assert asyncio.run(main()) == ("miss", 2, 1, "miss")
    acache.driver.close()


def test_async_invalidation_crosses_hosts(two_hosts: tuple[TieredCache, TieredCache]) -> None:
    host_a, host_b = (AsyncCache(host) for host in two_hosts)

    async def main() -> None:
        await host_a.set("page", "<html>", ttl=60, tags=["pages"])
        assert await host_b.get("page") == "<html>"
        assert await host_b.get("page") == "<html>"  # now an L1 hit on host B
        assert await host_a.invalidate_tags(["pages"]) == 1
        deadline = time.monotonic() + 5
        while await host_b.get("page", "miss") != "miss":
            assert time.monotonic() < deadline, "host B still serves the invalidated page"
            await asyncio.sleep(0.002)

    asyncio.run(main())
    assert host_b.stats()["l1_hits"] >= 1
