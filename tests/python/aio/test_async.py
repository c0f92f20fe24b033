"""AsyncCache specifics: where each store runs, memoize stampedes, locks, trio and anyio."""

from __future__ import annotations

import asyncio
import functools
import inspect
import multiprocessing
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nearcache import Cache, KeyTypeError, Lock, LockNotOwnedError, LockTimeoutError
from nearcache.aio import AsyncCache
from nearcache.aio._redis import AsyncRedisStore
from nearcache.aio._stores import InlineStore, ThreadStore, TieredStore
from nearcache.aio.lock import AsyncLock
from nearcache.drivers import MemcachedDriver, MemoryDriver, RedisDriver, ShmDriver
from nearcache.errors import ConfigurationError
from nearcache.stampede import _ABSENT, _EARLY, _FRESH, _STALE
from nearcache.stampede import _MISS as _MEMO_MISS
from nearcache.testing import MemcachedServer, RedisServer
from nearcache.tiered import TieredCache


@pytest.fixture
def shm_path(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def acache(shm_path: Path) -> Iterator[AsyncCache]:
    cache = AsyncCache(path=shm_path, size="4MiB", spill_budget="4MiB")
    yield cache
    cache.driver.close()


class ThreadRecorder:
    """Wraps a method of a driver and records the threads it ran on."""

    def __init__(self, obj: Any, name: str) -> None:
        self.threads: set[int] = set()
        self.active = 0
        self.most_active = 0
        self._guard = threading.Lock()
        original = getattr(obj, name)

        def recorded(*args: Any, **kwargs: Any) -> Any:
            with self._guard:
                self.threads.add(threading.get_ident())
                self.active += 1
                self.most_active = max(self.most_active, self.active)
            try:
                return original(*args, **kwargs)
            finally:
                with self._guard:
                    self.active -= 1

        setattr(obj, name, recorded)


# ------------------------------------------------------------------ where calls run


def test_shared_memory_runs_inline_on_the_event_loop(shm_path: Path) -> None:
    cache = Cache(path=shm_path, size="1MiB")
    getter = ThreadRecorder(cache, "get")
    setter = ThreadRecorder(cache, "set")
    acache = AsyncCache(cache)
    assert isinstance(acache._store, InlineStore)

    async def main() -> int:
        await acache.set("k", "v")
        assert await acache.get("k") == "v"
        assert await acache.get_many(["k"]) == {"k": "v"}
        return threading.get_ident()

    loop_thread = asyncio.run(main())
    assert setter.threads == {loop_thread}
    assert getter.threads == {loop_thread}
    cache.close()


def test_memcached_runs_on_a_bounded_pool(memcached_server: MemcachedServer) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix="aio-bounded:")
    original_get = driver.get

    def slow_get(key: Any, default: Any = None) -> Any:
        time.sleep(0.05)
        return original_get(key, default)

    driver.get = slow_get  # type: ignore[method-assign]
    recorder = ThreadRecorder(driver, "get")  # counts calls in flight, sleep included
    cache = AsyncCache(driver, workers=3)
    assert isinstance(cache._store, ThreadStore)

    async def main() -> int:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.001)
                ticks += 1

        tick_task = asyncio.create_task(ticker())
        await asyncio.gather(*(cache.get(f"k{i}") for i in range(12)))
        tick_task.cancel()
        return ticks

    ticks = asyncio.run(main())
    assert recorder.most_active == 3  # never more than `workers` at once
    assert threading.get_ident() not in recorder.threads
    assert ticks > 10  # the loop kept running while memcached calls waited
    driver.close()


def test_redis_goes_through_redis_asyncio(redis_server: RedisServer, unique_prefix: str) -> None:
    driver = RedisDriver(redis_server.url, prefix=unique_prefix)
    recorder = ThreadRecorder(driver, "get")
    cache = AsyncCache(driver)
    assert isinstance(cache._store, AsyncRedisStore)
    driver.set("written-sync", {"a": 1})

    async def main() -> Any:
        await cache.set("written-async", [1, 2], ttl=30)
        got = await cache.get("written-sync")
        await cache.aclose()
        return got

    # Two event loops in a row: each gets its own client.
    assert asyncio.run(main()) == {"a": 1}
    assert asyncio.run(main()) == {"a": 1}
    assert recorder.threads == set()  # the sync driver's get was never used
    assert driver.get("written-async") == [1, 2]
    assert 29 <= (driver.get_with_ttl("written-async")[1] or 0) <= 30
    driver.close()


def test_tiered_serves_l1_hits_inline_and_misses_on_the_pool(
    redis_server: RedisServer, unique_prefix: str, tmp_path: Path
) -> None:
    tiered = TieredCache(
        ShmDriver(path=tmp_path / "l1", size="4MiB"),
        RedisDriver(redis_server.url, prefix=unique_prefix),
        invalidation=None,
    )
    l2_reads = ThreadRecorder(tiered.l2, "get_with_ttl")
    cache = AsyncCache(tiered)
    assert isinstance(cache._store, TieredStore)
    tiered.l2.set("only-in-l2", "x")

    async def main() -> tuple[Any, Any, int]:
        first = await cache.get("only-in-l2")  # L1 miss: L2 on the pool, fills L1
        second = await cache.get("only-in-l2")  # L1 hit, inline
        return first, second, threading.get_ident()

    first, second, loop_thread = asyncio.run(main())
    assert first == second == "x"
    assert len(l2_reads.threads) == 1 and loop_thread not in l2_reads.threads
    assert cache.stats()["l1_hits"] >= 1
    tiered.close()


def test_bad_backends_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        AsyncCache(42)  # type: ignore[arg-type]
    with Cache(path=tmp_path / "c", size="1MiB") as cache, pytest.raises(ConfigurationError):
        AsyncCache(cache, size="1MiB")
    with pytest.raises(ValueError):
        AsyncCache(MemoryDriver(), workers=0)


def test_bare_strings_are_not_key_collections(acache: AsyncCache) -> None:
    sync = acache.driver

    def sync_error(call: Any) -> str:
        with pytest.raises(KeyTypeError) as raised:
            call()
        return str(raised.value)

    async def main() -> None:
        for bare in ("abc", b"abc"):
            with pytest.raises(KeyTypeError) as raised:
                await acache.get_many(bare)  # type: ignore[arg-type]
            assert str(raised.value) == sync_error(lambda: sync.get_many(bare))  # noqa: B023
            with pytest.raises(KeyTypeError) as raised:
                await acache.delete_many(bare)  # type: ignore[arg-type]
            assert str(raised.value) == sync_error(lambda: sync.delete_many(bare))  # noqa: B023
            with pytest.raises(KeyTypeError) as raised:
                await acache.set_many(bare)  # type: ignore[arg-type]
            assert str(raised.value) == sync_error(lambda: sync.set_many(bare))  # noqa: B023
        assert await acache.get_many([]) == {} and await acache.keys() == []

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["shm", "memory", "redis", "memcached", "tiered"])
def test_incr_without_default_names_the_key_as_the_sync_api_does(
    kind: str,
    shm_path: Path,
    redis_server: RedisServer,
    memcached_server: MemcachedServer,
    unique_prefix: str,
) -> None:
    driver: Any = {
        "shm": lambda: ShmDriver(path=shm_path, size="1MiB"),
        "memory": MemoryDriver,
        "redis": lambda: RedisDriver(redis_server.url, prefix=unique_prefix),
        "memcached": lambda: MemcachedDriver(memcached_server.address, prefix=unique_prefix),
        "tiered": lambda: TieredCache(ShmDriver(path=shm_path, size="1MiB"), MemoryDriver()),
    }[kind]()
    cache = AsyncCache(driver)

    async def main() -> None:
        for call in (cache.incr, cache.decr):
            with pytest.raises(KeyError) as raised:
                await call("no-such-counter", 1, None)
            assert raised.value.args == ("no-such-counter",)
        with pytest.raises(TypeError):
            await cache.decr("counter", True)  # type: ignore[arg-type]

    asyncio.run(main())
    with pytest.raises(KeyError) as raised:
        driver.incr("no-such-counter", 1, None)
    assert raised.value.args == ("no-such-counter",)
    driver.close()


@pytest.mark.parametrize("kind", ["shm", "signed-shm", "memory", "redis", "memcached", "tiered"])
def test_delete_if_equals_and_keys_on_every_store(
    kind: str,
    shm_path: Path,
    redis_server: RedisServer,
    memcached_server: MemcachedServer,
    unique_prefix: str,
) -> None:
    driver: Any = {
        "shm": lambda: ShmDriver(path=shm_path, size="1MiB"),
        "signed-shm": lambda: ShmDriver(path=shm_path, size="1MiB", signing_key=b"k" * 32),
        "memory": MemoryDriver,
        "redis": lambda: RedisDriver(redis_server.url, prefix=unique_prefix),
        "memcached": lambda: MemcachedDriver(memcached_server.address, prefix=unique_prefix),
        "tiered": lambda: TieredCache(
            ShmDriver(path=shm_path, size="1MiB"),
            RedisDriver(redis_server.url, prefix=unique_prefix),
        ),
    }[kind]()
    cache = AsyncCache(driver)

    async def main() -> None:
        await cache.set("token", b"mine")
        assert await cache.delete_if_equals("token", b"theirs") is False
        assert driver.get("token") == b"mine"
        assert await cache.delete_if_equals("token", b"mine") is True
        assert driver.get("token") is None
        assert await cache.delete_if_equals("token", b"mine") is False
        await cache.set("a", 1)
        if kind == "memcached":  # cannot list keys, sync or async (nor can a tiered cache over it)
            with pytest.raises(NotImplementedError):
                driver.keys()
            with pytest.raises(NotImplementedError):
                await cache.keys()
        else:
            assert await cache.keys() == driver.keys() == ["a"]

    asyncio.run(main())
    driver.close()


def test_async_signatures_match_the_sync_ones() -> None:
    def parameters(func: Any) -> list[tuple[str, Any, Any]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(func).parameters.values()]

    assert parameters(AsyncCache.memoize) == parameters(Cache.memoize)
    assert parameters(AsyncCache.memoize) == parameters(MemoryDriver.memoize)
    assert parameters(AsyncCache.lock) == parameters(Cache.lock)
    assert parameters(AsyncLock.acquire) == parameters(Lock.acquire)
    for name in ("get_many", "delete_many", "set_many", "incr", "decr", "delete_if_equals"):
        assert parameters(getattr(AsyncCache, name)) == parameters(getattr(MemoryDriver, name))


def test_a_given_cache_stays_open_an_opened_one_closes(tmp_path: Path) -> None:
    given = Cache(path=tmp_path / "given", size="1MiB")

    async def main() -> AsyncCache:
        async with AsyncCache(given) as wrapped:
            await wrapped.set("k", 1)
        async with AsyncCache(path=tmp_path / "own", size="1MiB") as owned:
            await owned.set("k", 1)
        return owned

    owned = asyncio.run(main())
    assert given.get("k") == 1 and not given.closed
    assert owned.closed
    given.close()


# ------------------------------------------------------------------------- memoize


def test_memoize_computes_once_for_concurrent_tasks(acache: AsyncCache) -> None:
    calls: list[int] = []

    @acache.memoize(ttl=60)
    async def slow_square(n: int) -> int:
        calls.append(n)
        await asyncio.sleep(0.05)
        return n * n

    async def main() -> list[int]:
        return await asyncio.gather(*(slow_square(7) for _ in range(25)))

    assert asyncio.run(main()) == [49] * 25
    assert calls == [7]
    assert asyncio.run(main()) == [49] * 25
    assert calls == [7]


def test_memoize_waiters_retry_when_the_leader_fails(acache: AsyncCache) -> None:
    attempts: list[int] = []

    @acache.memoize(ttl=60)
    async def flaky(n: int) -> int:
        attempts.append(n)
        await asyncio.sleep(0.02)
        if len(attempts) == 1:
            raise RuntimeError("first attempt fails")
        return n

    async def main() -> list[Any]:
        return await asyncio.gather(*(flaky(1) for _ in range(5)), return_exceptions=True)

    results = asyncio.run(main())
    assert sum(isinstance(r, RuntimeError) for r in results) == 1
    assert [r for r in results if not isinstance(r, RuntimeError)] == [1, 1, 1, 1]
    assert len(attempts) == 2


def test_memoize_is_shared_with_sync_memoize_keys(acache: AsyncCache) -> None:
    @acache.memoize(ttl=60, name="shared.fn")
    async def afn(x: int, y: int = 2) -> int:
        return x + y

    sync_cache = acache.driver.cache  # type: ignore[attr-defined]

    @sync_cache.memoize(ttl=60, name="shared.fn")
    def sfn(x: int, y: int = 2) -> int:
        raise AssertionError("the async result must be served")

    assert asyncio.run(afn(1)) == 3
    assert sfn(1) == 3
    assert asyncio.run(afn.invalidate(1, y=2)) is True
    assert asyncio.run(afn.invalidate(1)) is False


def test_sync_and_async_memoize_decide_an_entrys_state_with_one_function(
    acache: AsyncCache,
) -> None:
    @acache.memoize(ttl=60, stale_ttl=60, name="decide.fn")
    async def afn(x: int) -> int:
        return x * 10

    memo = afn.memo  # type: ignore[attr-defined]
    now = time.time()
    # The one decision: absent, not an envelope, fresh, never expiring, stale.
    assert memo.classify(_MEMO_MISS)[0] == _ABSENT
    assert memo.classify("not an envelope")[0] == _ABSENT
    assert memo.classify((1, 0.1, now + 60)) == (_FRESH, 1, now + 60)
    assert memo.classify((1, 0.1, 0.0)) == (_FRESH, 1, 0.0)
    assert memo.classify((1, 0.1, now - 1)) == (_STALE, 1, now - 1)
    memo.beta = 1e9  # XFetch certain to refresh early
    assert memo.classify((1, 1.0, now + 60))[0] == _EARLY
    memo.beta = 0.0

    # The async memoize's reads go through it (so a change reaches both).
    seen: list[Any] = []
    decide = memo.classify

    def recording(envelope: Any) -> tuple[int, Any, float]:
        seen.append(envelope)
        return decide(envelope)

    memo.classify = recording
    assert asyncio.run(afn(2)) == 20
    assert asyncio.run(afn(2)) == 20
    assert seen[0] is _MEMO_MISS and seen[-1][0] == 20
    # While a sync process refreshes a stale entry, the async side serves it.
    key = asyncio.run(afn.cache_key(3))
    acache.driver.set(key, (-3, 0.0, now - 1), 60)
    with acache.driver.lock(key, timeout=0):
        assert asyncio.run(afn(3)) == -3
    assert asyncio.run(afn(3)) == 30


def _expire_logically(acache: AsyncCache, key: str) -> None:
    """Make a memoized entry stale (past its TTL, inside stale_ttl) without sleeping."""
    value, delta, _ = acache.driver.get(key)
    acache.driver.set(key, (value, delta, time.time() - 1), 60)


def test_memoize_refreshes_in_the_background_as_a_task(acache: AsyncCache) -> None:
    calls: list[int] = []

    @acache.memoize(ttl=30, stale_ttl=60, background=True)
    async def version(x: int) -> int:
        calls.append(x)
        if len(calls) > 1:
            await release.wait()  # the refresh waits until the test lets it go
        return len(calls)

    async def main() -> None:
        assert await version(1) == 1
        key = await version.cache_key(1)
        _expire_logically(acache, key)
        # The caller that takes the refresh gets the stale value at once.
        assert await asyncio.wait_for(version(1), 5) == 1
        for _ in range(1000):
            if len(calls) == 2:
                break
            await asyncio.sleep(0.005)
        assert len(calls) == 2
        assert await version(1) == 1  # still stale; the refresh holds the lock
        assert len(calls) == 2 and await acache.lock(key).locked()
        release.set()
        for _ in range(1000):
            if await version(1) == 2:
                break
            await asyncio.sleep(0.005)
        assert await version(1) == 2 and len(calls) == 2
        for _ in range(1000):
            if not await acache.lock(key).locked():
                break
            await asyncio.sleep(0.005)
        assert not await acache.lock(key).locked()  # freed after the refresh

    release = asyncio.Event()
    asyncio.run(main())


def test_a_failing_background_refresh_keeps_the_stale_value(
    acache: AsyncCache, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    @acache.memoize(ttl=30, stale_ttl=60, background=True)
    async def fragile() -> str:
        nonlocal calls
        calls += 1
        if calls > 1:
            raise RuntimeError("backend down")
        return "first"

    async def main() -> None:
        assert await fragile() == "first"
        key = await fragile.cache_key()
        _expire_logically(acache, key)
        assert await fragile() == "first"
        for _ in range(1000):
            if not await acache.lock(key).locked():
                break
            await asyncio.sleep(0.005)
        assert calls == 2 and not await acache.lock(key).locked()
        assert (await acache.get(key))[0] == "first"

    with caplog.at_level("WARNING", logger="nearcache.memoize"):
        asyncio.run(main())
    assert "background refresh of" in caplog.text and "backend down" in caplog.text


def test_background_refresh_under_trio(acache: AsyncCache) -> None:
    trio = pytest.importorskip("trio")
    calls: list[int] = []

    @acache.memoize(ttl=30, stale_ttl=60, background=True)
    async def version() -> int:
        calls.append(1)
        return len(calls)

    async def main() -> int:
        assert await version() == 1
        _expire_logically(acache, await version.cache_key())
        assert await version() == 1  # stale, served at once
        with trio.fail_after(10):
            while await version() != 2:
                await trio.sleep(0.005)
        return len(calls)

    assert trio.run(main) == 2


def test_memoize_ttl_jitter_spreads_expiry_and_never_lengthens_it(acache: AsyncCache) -> None:
    @acache.memoize(ttl=100, ttl_jitter=0.5)
    async def f(x: int) -> int:
        return x

    async def main() -> list[str]:
        for i in range(200):
            await f(i)
        return [await f.cache_key(i) for i in range(200)]

    before = time.time()
    keys = asyncio.run(main())
    after = time.time()
    expiries = [acache.driver.get(key)[2] for key in keys]
    assert all(before + 50 <= e <= after + 100 for e in expiries)
    assert max(expiries) - min(expiries) > 25  # 200 uniform draws over 50 s
    physical = [acache.driver.get_with_ttl(key)[1] for key in keys]
    assert all(t is not None and t <= 100 for t in physical)


@pytest.mark.parametrize("bad", [1, 1.5, -0.1, True, "10%"])
def test_memoize_ttl_jitter_must_be_a_fraction(acache: AsyncCache, bad: object) -> None:
    async def f() -> None:
        pass

    with pytest.raises(ConfigurationError, match="ttl_jitter"):
        acache.memoize(ttl_jitter=bad)(f)  # type: ignore[arg-type]


def test_memoize_takes_any_async_callable_and_invalidates_all(acache: AsyncCache) -> None:
    calls: list[tuple[str, int]] = []

    async def scaled(factor: int, x: int) -> int:
        calls.append(("partial", x))
        return factor * x

    class Fetcher:
        async def __call__(self, x: int) -> int:
            calls.append(("object", x))
            return -x

    triple = acache.memoize(ttl=60)(functools.partial(scaled, 3))
    fetch = acache.memoize(ttl=60, name="fetcher")(Fetcher())

    async def main() -> None:
        assert [await triple(2), await triple(2), await fetch(2), await fetch(2)] == [6, 6, -2, -2]
        assert calls == [("partial", 2), ("object", 2)]
        await triple(3)
        assert await triple.invalidate_all() == 2  # type: ignore[attr-defined]
        assert await fetch.invalidate_all() == 1  # type: ignore[attr-defined]
        await triple(2)
        assert calls[-1] == ("partial", 2) and len(calls) == 4

    asyncio.run(main())
    with pytest.raises(TypeError, match="bare str"):
        acache.memoize(tags="users")


def test_async_lock_acquire_takes_blocking_like_the_sync_lock(acache: AsyncCache) -> None:
    async def main() -> None:
        holder = acache.lock("blocking", timeout=5)
        assert await holder.acquire(blocking=False)
        started = time.monotonic()
        assert await acache.lock("blocking", timeout=30).acquire(blocking=False) is False
        assert time.monotonic() - started < 5  # one try, not the lock's 30 s timeout
        assert await acache.delete_if_equals(holder.key, b"not the token") is False
        await holder.release()

    asyncio.run(main())


def test_memoize_refuses_sync_functions(acache: AsyncCache) -> None:
    with pytest.raises(ConfigurationError, match="async functions"):

        @acache.memoize()
        def not_async() -> None:
            pass

    with pytest.raises(TypeError, match="parentheses"):
        acache.memoize(lambda: None)  # type: ignore[arg-type]


def test_memoize_on_methods(acache: AsyncCache) -> None:
    class Repo:
        def __init__(self) -> None:
            self.loads = 0

        def __cache_key__(self) -> str:
            return "repo"

        @acache.memoize(ttl=60)
        async def load(self, x: int) -> int:
            self.loads += 1
            return x * 10

    repo = Repo()
    assert asyncio.run(repo.load(2)) == 20
    assert asyncio.run(repo.load(2)) == 20
    assert repo.loads == 1


def _memoize_in_process(path: str, start: float) -> list[int]:
    """One process: 4 tasks call the memoized function at the same moment."""
    cache = AsyncCache(path=path)

    @cache.memoize(ttl=60, name="cross-process")
    async def compute(n: int) -> int:
        cache.driver.incr("computations")
        await asyncio.sleep(0.3)
        return n + 1

    async def main() -> list[int]:
        await asyncio.sleep(max(0.0, start - time.time()))
        return await asyncio.gather(*(compute(41) for _ in range(4)))

    try:
        return asyncio.run(main())
    finally:
        cache.driver.close()


def test_memoize_computes_once_across_processes(shm_path: Path) -> None:
    Cache(path=shm_path, size="4MiB").close()
    context = multiprocessing.get_context("spawn")
    start = time.time() + 2.0
    with context.Pool(3) as pool:
        results = pool.starmap(_memoize_in_process, [(str(shm_path), start)] * 3)
    assert results == [[42] * 4] * 3
    with Cache(path=shm_path) as cache:
        assert cache.get("computations") == 1


def test_memoize_over_redis_across_two_event_loops(
    redis_server: RedisServer, unique_prefix: str
) -> None:
    """Two threads, each its own loop and client: like two hosts sharing Redis."""
    calls: list[int] = []
    guard = threading.Lock()
    results: list[list[int]] = []

    def host() -> None:
        cache = AsyncCache(RedisDriver(redis_server.url, prefix=unique_prefix))

        @cache.memoize(ttl=60, name="two-hosts")
        async def compute(n: int) -> int:
            with guard:
                calls.append(n)
            await asyncio.sleep(0.3)
            return n * 3

        async def main() -> list[int]:
            try:
                return await asyncio.gather(*(compute(5) for _ in range(3)))
            finally:
                await cache.aclose()

        results.append(asyncio.run(main()))
        cache.driver.close()

    threads = [threading.Thread(target=host) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert results == [[15] * 3] * 2
    assert calls == [5]


# --------------------------------------------------------------------------- locks


def test_async_lock_excludes_the_sync_lock(acache: AsyncCache) -> None:
    sync_cache: Cache = acache.driver.cache  # type: ignore[attr-defined]

    async def main() -> None:
        async with acache.lock("job", timeout=1) as lock:
            assert await lock.owned()
            assert sync_cache.lock("job", timeout=0).acquire() is False
        assert not await acache.lock("job").locked()
        with sync_cache.lock("job", timeout=0), pytest.raises(LockTimeoutError):
            async with acache.lock("job", timeout=0.05):
                pass
        assert acache.stats()["lock_timeouts"] == 1

    asyncio.run(main())


def test_async_lock_serializes_tasks(acache: AsyncCache) -> None:
    inside = 0
    most = 0

    async def worker() -> None:
        nonlocal inside, most
        async with acache.lock("critical", timeout=10):
            inside += 1
            most = max(most, inside)
            await asyncio.sleep(0.01)
            inside -= 1

    async def main() -> None:
        await asyncio.gather(*(worker() for _ in range(8)))

    asyncio.run(main())
    assert most == 1


@pytest.mark.parametrize("store", ["shm", "redis", "memcached"])
def test_async_lock_release_after_expiry_does_not_free_the_new_holder(
    store: str,
    acache: AsyncCache,
    redis_server: RedisServer,
    memcached_server: MemcachedServer,
    unique_prefix: str,
) -> None:
    if store == "redis":
        acache = AsyncCache(RedisDriver(redis_server.url, prefix=unique_prefix))
    elif store == "memcached":
        acache = AsyncCache(MemcachedDriver(memcached_server.address, prefix=unique_prefix))
    expire = 2.5 if store == "memcached" else 0.05

    async def main() -> None:
        first = acache.lock("short", expire=expire)
        assert await first.acquire(timeout=0)
        await asyncio.sleep(expire + (2.1 if store == "memcached" else 0.05))
        second = acache.lock("short", expire=30)
        assert await second.acquire(timeout=0)
        with pytest.raises(LockNotOwnedError):
            await first.release()
        assert await second.owned()
        await second.release()
        with pytest.raises(LockNotOwnedError):
            await second.release()
        await acache.aclose()

    asyncio.run(main())


class _CountingRedisDriver(RedisDriver):
    """A Redis driver that counts its compare-and-delete calls."""

    compare_and_deletes = 0

    def delete_if_equals(self, key: Any, value: Any) -> bool:
        type(self).compare_and_deletes += 1
        return super().delete_if_equals(key, value)


def test_async_lock_releases_through_the_drivers_compare_and_delete(
    redis_server: RedisServer, unique_prefix: str, shm_path: Path
) -> None:
    trio = pytest.importorskip("trio")
    # Under trio, Redis is the sync driver on the pool: its release must be
    # the driver's Lua script, not a read then a delete.
    redis = AsyncCache(_CountingRedisDriver(redis_server.url, prefix=unique_prefix))
    assert isinstance(redis._store, AsyncRedisStore)

    async def hold(cache: AsyncCache) -> None:
        async with cache.lock("released-atomically", timeout=1):
            pass
        assert not await cache.lock("released-atomically").locked()

    trio.run(hold, redis)
    assert _CountingRedisDriver.compare_and_deletes == 1
    redis.driver.close()

    # Shared memory: the engine's compare-and-delete, also for an int key.
    shm = ShmDriver(path=shm_path, size="1MiB")
    store = AsyncCache(shm)._store

    async def release_int_key() -> tuple[bool, bool]:
        shm.set(42, b"token")
        wrong = await store.delete_if_equals(42, b"other")
        right = await store.delete_if_equals(42, b"token")
        return wrong, right

    assert asyncio.run(release_int_key()) == (False, True)
    assert shm.get(42) is None
    shm.close()


def test_lock_options_are_checked(acache: AsyncCache) -> None:
    with pytest.raises(ConfigurationError):
        acache.lock("")
    with pytest.raises(ConfigurationError):
        acache.lock("x", expire=0)


# ---------------------------------------------------------------------- trio, anyio


def test_memoize_and_lock_under_trio(acache: AsyncCache) -> None:
    trio = pytest.importorskip("trio")
    calls: list[int] = []

    @acache.memoize(ttl=60)
    async def slow(n: int) -> int:
        calls.append(n)
        await trio.sleep(0.05)
        return -n

    async def main() -> list[int]:
        results: list[int] = []

        async def one() -> None:
            results.append(await slow(3))

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        async with acache.lock("trio-lock", timeout=1):
            assert await acache.lock("trio-lock").locked()
        return results

    assert trio.run(main) == [-3] * 6
    assert calls == [3]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_anyio_backends(backend: str, shm_path: Path, memcached_server: MemcachedServer) -> None:
    anyio = pytest.importorskip("anyio")
    if backend == "trio":
        pytest.importorskip("trio")
    cache = AsyncCache(path=shm_path, size="1MiB")
    remote = AsyncCache(MemcachedDriver(memcached_server.address, prefix=f"anyio-{backend}:"))

    async def main() -> tuple[Any, Any]:
        await cache.set("k", {"v": 1}, tags=["t"])
        await remote.set("k", "remote")
        return await cache.get("k"), await remote.get("k")

    assert anyio.run(main, backend=backend) == ({"v": 1}, "remote")
    cache.driver.close()
    remote.driver.close()


def test_memoize_returns_results_it_cannot_store(
    acache: AsyncCache, caplog: pytest.LogCaptureFixture
) -> None:
    calls = 0

    class Unpicklable:
        def __reduce__(self) -> Any:
            raise TypeError("no pickling")

    @acache.memoize(ttl=60)
    async def make(kind: str) -> Any:
        nonlocal calls
        calls += 1
        return Unpicklable() if kind == "object" else b"x" * (8 * 1024 * 1024)

    async def main() -> tuple[Any, Any]:
        return await make("object"), await make("huge")

    with caplog.at_level("WARNING", logger="nearcache.memoize"):
        obj, huge = asyncio.run(main())
    assert isinstance(obj, Unpicklable) and len(huge) == 8 * 1024 * 1024
    assert make.state.store_failures == make.memo.store_failures == 2  # type: ignore[attr-defined]
    # The sync memoize's message: the result's own type, never the envelope.
    assert ".Unpicklable value cannot be stored (SerializationError: no pickling)" in caplog.text
    assert "its bytes value cannot be stored (ValueTooLargeError" in caplog.text
    asyncio.run(main())
    assert calls == 4  # nothing was cached


def test_memoized_methods_need_an_identity(acache: AsyncCache) -> None:
    # Python < 3.12 wraps errors of __set_name__ in a RuntimeError.
    with pytest.raises((TypeError, RuntimeError)) as raised:

        class NoIdentity:
            @acache.memoize(ttl=60)
            async def load(self, x: int) -> int:
                return x

    error = raised.value if isinstance(raised.value, TypeError) else raised.value.__cause__
    assert isinstance(error, TypeError) and "NoIdentity has no __cache_key__()" in str(error)

    class Shared:
        def __init__(self) -> None:
            self.calls = 0

        @acache.memoize(ttl=60, ignore=("self",))
        async def load(self, x: int) -> int:
            self.calls += 1
            return x * 2

    class Keyed:
        def __init__(self, ident: str) -> None:
            self.ident = ident
            self.calls = 0

        def __cache_key__(self) -> str:
            return self.ident

        @acache.memoize(ttl=60)
        async def load(self, x: int) -> str:
            self.calls += 1
            return f"{self.ident}:{x}"

    async def main() -> None:
        one, two = Shared(), Shared()
        assert await one.load(3) == await two.load(3) == 6
        assert one.calls + two.calls == 1  # shared between instances
        a, b = Keyed("a"), Keyed("b")
        assert await a.load(1) == "a:1" and await b.load(1) == "b:1"
        a.unrelated_state = 5  # type: ignore[attr-defined]  # state changes do not matter
        assert await a.load(1) == "a:1" and a.calls == 1
        assert await a.load.invalidate(1) is True  # helpers bind to the instance
        assert await a.load.invalidate(1) is False
        assert await a.load.cache_key(1) != await b.load.cache_key(1)
        assert await Keyed.load(a, 1) == "a:1"  # the unbound form takes the instance

    asyncio.run(main())
