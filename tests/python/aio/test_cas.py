"""``AsyncCache`` versions, ``cas`` and ``update`` (shared memory)."""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nearcache import Cache, UpdateConflictError
from nearcache.aio import AsyncCache
from nearcache.drivers import MemoryDriver


@pytest.fixture
def shm_path(tmp_path: Path) -> Path:
    return tmp_path / "cache"


@pytest.fixture
def acache(shm_path: Path) -> Iterator[AsyncCache]:
    cache = AsyncCache(path=shm_path, size="4MiB")
    yield cache
    cache.driver.close()


def test_get_version_and_cas(acache: AsyncCache) -> None:
    async def main() -> None:
        assert await acache.get("k", version=True) == (None, 0)
        assert await acache.cas("k", {"n": 1}, 0)
        value, v1 = await acache.get("k", version=True)
        assert value == {"n": 1} and v1 > 0
        assert await acache.get("k") == {"n": 1}
        assert await acache.cas("k", {"n": 2}, v1, ttl=60)
        # Stale: returns False and changes nothing.
        assert await acache.cas("k", {"n": 3}, v1) is False
        value, v2 = await acache.get("k", version=True)
        assert value == {"n": 2} and v2 != v1
        with pytest.raises(TypeError, match="version"):
            await acache.cas("k", "x", "1")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="version"):
            await acache.cas("k", "x", -1)
        assert await acache.get("k", version=True) == (value, v2)

    asyncio.run(main())


def test_update_with_sync_and_async_functions(acache: AsyncCache) -> None:
    async def add_later(n: int) -> int:
        await asyncio.sleep(0)
        return n + 1

    async def main() -> None:
        assert await acache.update("n", lambda n: n + 1, default=0) == 1
        assert await acache.update("n", add_later) == 2
        with pytest.raises(KeyError):
            await acache.update("missing", lambda n: n)
        # Coroutines interleaving at the await inside fn: every update counts.
        await asyncio.gather(*(acache.update("n", add_later) for _ in range(200)))
        assert await acache.get("n") == 202

    asyncio.run(main())


def test_update_gives_up_after_max_conflicts(acache: AsyncCache, shm_path: Path) -> None:
    other = Cache(path=str(shm_path))

    def overtaken(value: int) -> int:
        other.set("k", value - 1)
        return value + 100

    async def main() -> None:
        await acache.set("k", 0)
        with pytest.raises(UpdateConflictError, match="2 times"):
            await acache.update("k", overtaken, max_conflicts=2)
        assert await acache.get("k") == -2

    asyncio.run(main())
    other.close()


def test_tagged_values_read_with_their_version(acache: AsyncCache) -> None:
    async def main() -> None:
        await acache.set("t", 1, tags=["group"])
        value, v = await acache.get("t", version=True)
        assert value == 1 and v > 0
        await acache.invalidate_tags(["group"])
        # Invalidated: the default, with the entry's version so a cas replaces it.
        value, v = await acache.get("t", "gone", version=True)
        assert value == "gone" and v > 0
        assert await acache.cas("t", 5, v)
        assert await acache.get("t") == 5

    asyncio.run(main())


def test_other_stores_refuse_clearly() -> None:
    cache = AsyncCache(MemoryDriver())

    async def main() -> None:
        with pytest.raises(NotImplementedError, match="shared-memory"):
            await cache.cas("k", 1, 0)
        with pytest.raises(NotImplementedError, match="shared-memory"):
            await cache.update("k", lambda v: v, default=0)
        with pytest.raises(NotImplementedError, match="shared-memory"):
            await cache.get("k", version=True)

    asyncio.run(main())


def _async_worker(path: str, n: int) -> None:
    async def run() -> None:
        cache = AsyncCache(path=path, lock_timeout=5)
        for _ in range(n):
            await cache.update("counter", lambda v: v + 1, default=0)

    asyncio.run(run())


def test_four_processes_update_one_key_exactly(shm_path: Path) -> None:
    cache = Cache(path=str(shm_path), size="4MiB")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_async_worker, args=(str(shm_path), 5_000)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    result: Any = cache.get("counter")
    assert result == 20_000
    cache.close()
