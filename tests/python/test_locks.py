"""cache.lock(): a cross-process lock that survives its holder dying."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest

import nearcache
from nearcache import Cache, Lock

pytest_plugins = ["_cache_helpers"]


def test_acquire_release(cache: Cache) -> None:
    lock = cache.lock("job", timeout=1)
    assert not lock.locked()
    assert lock.acquire()
    assert lock.locked() and lock.owned()
    other = cache.lock("job")
    assert other.acquire(blocking=False) is False
    assert other.locked() and not other.owned()
    lock.release()
    assert not lock.locked()
    assert other.acquire(blocking=False) is True
    other.release()


def test_context_manager_and_timeout(cache: Cache) -> None:
    holder = cache.lock("job")
    with holder:
        start = time.monotonic()
        with pytest.raises(nearcache.LockTimeoutError), cache.lock("job", timeout=0.1):
            pass
        assert 0.1 <= time.monotonic() - start < 2
        assert cache.lock("job").acquire(timeout=0) is False
    assert not holder.locked()


def test_expiry_frees_the_lock_and_the_late_holder_notices(cache: Cache) -> None:
    slow = cache.lock("job", expire=0.1)
    assert slow.acquire()
    time.sleep(0.15)
    fresh = cache.lock("job")
    assert fresh.acquire(blocking=False)  # the expired lock is free again
    assert not slow.owned()
    with pytest.raises(nearcache.LockNotOwnedError):
        slow.release()  # must not free the new holder's lock
    assert fresh.owned()
    fresh.release()


def test_extend(cache: Cache) -> None:
    lock = cache.lock("job", expire=0.1)
    with lock:
        lock.extend(60)
        time.sleep(0.15)
        assert lock.owned()
        assert 59 < (cache.ttl(lock.key) or 0) <= 60
    with pytest.raises(nearcache.LockNotOwnedError):
        lock.extend()


def test_release_without_acquire_and_reentry(cache: Cache) -> None:
    lock = cache.lock("job")
    with pytest.raises(nearcache.LockNotOwnedError):
        lock.release()
    lock.acquire()
    with pytest.raises(RuntimeError, match="already held"):
        lock.acquire()
    lock.release()


def test_invalid_arguments(cache: Cache) -> None:
    with pytest.raises(nearcache.ConfigurationError):
        cache.lock("")
    with pytest.raises(nearcache.ConfigurationError):
        cache.lock("job", expire=0)
    with pytest.raises(ValueError):
        cache.lock("job", timeout=-1)


def test_async_context_manager(cache: Cache) -> None:
    order: list[str] = []

    async def worker(name: str) -> None:
        async with cache.lock("job", timeout=5):
            order.append(f"{name} in")
            await asyncio.sleep(0.05)
            order.append(f"{name} out")

    async def main() -> None:
        await asyncio.gather(worker("a"), worker("b"))

    asyncio.run(main())
    assert order in (["a in", "a out", "b in", "b out"], ["b in", "b out", "a in", "a out"])


def test_lock_from_another_process_cannot_be_released_here(tmp_path: Path) -> None:
    path = tmp_path / "c"
    with Cache(path=path, size="1MiB") as cache:
        lock = Lock(cache, "job")
        assert lock.acquire()
        pid = os.fork()
        if pid == 0:  # the child inherits the Lock object, not the ownership
            try:
                lock.release()
                os._exit(1)
            except nearcache.LockNotOwnedError:
                os._exit(0 if lock.locked() else 2)
            except BaseException:
                os._exit(3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert lock.owned()
        lock.release()


def test_mutual_exclusion_across_processes(tmp_path: Path) -> None:
    from _cache_helpers import lock_counter_worker

    path = tmp_path / "c"
    workers, rounds = 4, 15
    with Cache(path=path, size="1MiB") as cache:
        ctx = multiprocessing.get_context("fork")
        barrier = ctx.Barrier(workers)
        processes = [
            ctx.Process(target=lock_counter_worker, args=(str(path), barrier, rounds))
            for _ in range(workers)
        ]
        for process in processes:
            process.start()
        for process in processes:
            process.join(timeout=60)
            assert process.exitcode == 0
        # Each round reads, sleeps, then writes: without exclusion updates get lost.
        assert cache.get("count") == workers * rounds


def test_holder_killed_while_holding(tmp_path: Path) -> None:
    from _cache_helpers import lock_and_die_worker

    path = tmp_path / "c"
    with Cache(path=path, size="1MiB") as cache:
        ctx = multiprocessing.get_context("fork")
        ready = ctx.Event()
        holder = ctx.Process(target=lock_and_die_worker, args=(str(path), 2.0, ready))
        holder.start()
        try:
            assert ready.wait(timeout=30)
            assert holder.pid is not None
            os.kill(holder.pid, signal.SIGKILL)
            holder.join(timeout=30)
            lock = cache.lock("orphan", timeout=10)
            assert lock.locked()  # the dead holder's entry is still there...
            start = time.monotonic()
            with lock:  # ...until it expires
                waited = time.monotonic() - start
        finally:
            if holder.is_alive():
                holder.kill()
        assert waited < 5
