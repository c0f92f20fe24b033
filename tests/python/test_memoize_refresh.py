"""memoize: refresh in the background (``background=True``) and TTL jitter."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable

import pytest

import nearcache
from nearcache import Cache

pytest_plugins = ["_cache_helpers"]

BOUND = 10.0  # seconds: a bound on waiting, never a speed assertion


def wait_for(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + BOUND
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def expire_logically(cache: Cache, key: str) -> None:
    """Make a memoized entry stale (past its TTL, inside stale_ttl) without sleeping."""
    value, delta, _ = cache.get(key)
    cache.set(key, (value, delta, time.time() - 1), ttl=60)


# ---------------------------------------------------------------- background refresh


def test_stale_value_is_served_while_a_thread_refreshes(cache: Cache) -> None:
    release = threading.Event()
    calls: list[int] = []

    @cache.memoize(ttl=30, stale_ttl=60, background=True)
    def version(x: int) -> int:
        calls.append(x)
        if len(calls) > 1:
            assert release.wait(BOUND)  # the refresh blocks until the test lets it go
        return len(calls)

    assert version(1) == 1
    expire_logically(cache, version.cache_key(1))
    assert version(1) == 1  # returned while the refresh is blocked: it runs elsewhere
    wait_for(lambda: len(calls) == 2)
    assert version(1) == 1  # still stale; the refresh holds the lock: no second refresh
    assert len(calls) == 2
    refresher = next(t for t in threading.enumerate() if t.name.startswith("nearcache-refresh"))
    assert refresher.daemon
    release.set()
    wait_for(lambda: version(1) == 2)
    assert len(calls) == 2
    refresher.join(BOUND)
    assert not cache.lock(version.cache_key(1)).locked()  # freed after the refresh


def test_without_background_the_winner_recomputes_in_the_call(cache: Cache) -> None:
    calls: list[str] = []

    @cache.memoize(ttl=30, stale_ttl=60)
    def version(x: int) -> int:
        calls.append(threading.current_thread().name)
        return len(calls)

    version(1)
    expire_logically(cache, version.cache_key(1))
    assert version(1) == 2
    assert calls == [threading.current_thread().name] * 2


def test_a_failing_background_refresh_keeps_the_stale_value(
    cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    @cache.memoize(ttl=30, stale_ttl=60, background=True)
    def flaky(x: int) -> int:
        calls.append(x)
        if len(calls) == 2:
            raise RuntimeError("backend down")
        return len(calls)

    assert flaky(1) == 1
    key = flaky.cache_key(1)
    expire_logically(cache, key)
    with caplog.at_level(logging.WARNING, logger="nearcache.memoize"):
        assert flaky(1) == 1
        wait_for(lambda: any("background refresh" in r.getMessage() for r in caplog.records))
    record = next(r for r in caplog.records if "background refresh" in r.getMessage())
    assert "flaky" in record.getMessage() and record.exc_info is not None
    wait_for(lambda: not cache.lock(key).locked())
    # The stale value stayed; the lock was freed, so the next call refreshes again.
    wait_for(lambda: flaky(1) == 3)


def test_async_refresh_runs_as_a_task_on_the_loop(cache: Cache) -> None:
    calls: list[int] = []

    async def scenario() -> None:
        release = asyncio.Event()

        @cache.memoize(ttl=30, stale_ttl=60, background=True)
        async def version(x: int) -> int:
            calls.append(x)
            if len(calls) > 1:
                await asyncio.wait_for(release.wait(), BOUND)
            return len(calls)

        assert await version(1) == 1
        expire_logically(cache, version.cache_key(1))
        assert await version(1) == 1  # served while the refresh task waits
        await asyncio.sleep(0)
        assert len(calls) == 2
        assert len(version.memo._tasks) == 1
        release.set()
        task = next(iter(version.memo._tasks))
        await asyncio.wait_for(task, BOUND)
        assert await version(1) == 2
        assert not version.memo._tasks

    asyncio.run(scenario())


def test_background_does_not_apply_to_a_missing_entry(cache: Cache) -> None:
    @cache.memoize(ttl=30, background=True)
    def compute(x: int) -> str:
        return threading.current_thread().name

    assert compute(1) == threading.current_thread().name  # nothing to serve: computed inline


# ---------------------------------------------------------------------- TTL jitter


def test_ttl_jitter_spreads_expiry_and_never_lengthens_it(cache: Cache) -> None:
    @cache.memoize(ttl=100, ttl_jitter=0.5)
    def f(x: int) -> int:
        return x

    before = time.time()
    for i in range(200):
        f(i)
    after = time.time()
    expiries = [cache.get(f.cache_key(i))[2] for i in range(200)]
    assert all(before + 50 <= e <= after + 100 for e in expiries)
    assert len({round(e, 3) for e in expiries}) > 150  # spread, not one instant
    spread = max(expiries) - min(expiries)
    assert spread > 25  # 200 uniform draws over 50 s cover more than half of it
    physical = [cache.ttl(f.cache_key(i)) for i in range(200)]
    assert all(t is not None and t <= 100 for t in physical)


def test_no_jitter_by_default(cache: Cache) -> None:
    @cache.memoize(ttl=100)
    def f(x: int) -> int:
        return x

    before = time.time()
    f(1)
    assert before + 100 <= cache.get(f.cache_key(1))[2] <= time.time() + 100


@pytest.mark.parametrize("bad", [1, 1.5, -0.1, True, "10%", float("nan")])
def test_ttl_jitter_must_be_a_fraction(cache: Cache, bad: object) -> None:
    with pytest.raises(nearcache.ConfigurationError, match="ttl_jitter"):
        cache.memoize(ttl_jitter=bad)(abs)  # type: ignore[arg-type]


def test_a_refresh_that_finds_a_newer_entry_does_not_recompute(cache: Cache) -> None:
    # Between a caller's stale read and its lock, another process may store a
    # fresh result: the background refresh then only frees the lock.
    from nearcache.locks import Lock
    from nearcache.memoize import _refresh_sync

    calls: list[int] = []

    @cache.memoize(ttl=30, stale_ttl=60, background=True)
    def version(x: int) -> int:
        calls.append(x)
        return len(calls)

    version(1)
    key = version.cache_key(1)
    seen_expiry = cache.get(key)[2] - 10  # what the caller read: an older entry
    lock = Lock(cache, key, timeout=0, expire=version.memo.lock_ttl)  # the stampede lock
    assert lock.acquire(blocking=False)
    _refresh_sync(version.memo, key, lock, seen_expiry, (1,), {})
    assert calls == [1]
    assert not lock.locked()
