"""How each store is reached from async code.

==================  ===============================================================
store               async path
==================  ===============================================================
shm, memory, null   called inline: an operation takes microseconds and never
                    waits on a network, so a thread hop would cost more than it
                    saves (:class:`InlineStore`)
Redis / Valkey      ``redis.asyncio`` under asyncio, one client per event loop
                    (:class:`~nearcache.aio._redis.AsyncRedisStore`); under trio,
                    the sync driver on the bounded thread pool
memcached, others   the sync driver on the bounded thread pool (:class:`ThreadStore`)
tiered              an L1 hit inline; anything that reaches L2 (an L1 miss, every
                    write) runs the tiered cache's own sync method on the pool, so
                    its race and invalidation rules hold unchanged (:class:`TieredStore`)
==================  ===============================================================

Every store speaks the driver protocol's rules (keys, values, the TTL rule,
errors: :mod:`nearcache.drivers.base`) because each one forwards to a sync
driver or, for Redis, shares its codec and key function.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from nearcache.aio._runtime import Offloader
from nearcache.drivers.base import TTL, Driver, Key

__all__ = [
    "INLINE_DRIVERS",
    "AsyncStore",
    "InlineStore",
    "StoreHolder",
    "ThreadStore",
    "TieredStore",
]

#: Drivers whose every operation completes without waiting on I/O.
INLINE_DRIVERS = frozenset({"shm", "memory", "null"})

_MISS: Any = object()


def delete_if_equals_sync(driver: Driver, key: Key, token: bytes) -> bool:
    """Delete ``key`` if it holds ``token``: the driver's own
    :meth:`~nearcache.drivers.base.Driver.delete_if_equals` (atomic on Redis
    with a script and on an unsigned shared-memory cache with the engine's
    compare-and-delete; read-then-delete where the store cannot do better)."""
    return bool(driver.delete_if_equals(key, token))


class AsyncStore:
    """The driver protocol with coroutine methods (see the module table)."""

    #: The sync driver behind this store.
    driver: Driver

    async def get(self, key: Key, default: Any = None) -> Any:
        raise NotImplementedError

    async def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        raise NotImplementedError

    async def get_many(self, keys: list[Key]) -> dict[Any, Any]:
        raise NotImplementedError

    async def contains(self, key: Key) -> bool:
        raise NotImplementedError

    async def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        raise NotImplementedError

    async def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        raise NotImplementedError

    async def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        raise NotImplementedError

    async def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        raise NotImplementedError

    async def delete(self, key: Key) -> bool:
        raise NotImplementedError

    async def delete_many(self, keys: list[Key]) -> int:
        raise NotImplementedError

    async def pop(self, key: Key, default: Any = None) -> Any:
        raise NotImplementedError

    async def touch(self, key: Key, ttl: TTL = None) -> bool:
        raise NotImplementedError

    async def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        raise NotImplementedError

    async def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        raise NotImplementedError

    async def clear(self) -> None:
        raise NotImplementedError

    async def keys(self) -> list[Key]:
        raise NotImplementedError

    async def delete_if_equals(self, key: Key, token: bytes) -> bool:
        """Delete ``key`` if it holds ``token`` (releasing a lock)."""
        raise NotImplementedError

    async def aclose(self) -> None:
        """Release what this store holds beyond the sync driver."""


class StoreHolder(Protocol):
    """What the async policies (:class:`~nearcache.aio.AsyncLock`, the async
    memoize) take: an object holding an async store, an
    :class:`~nearcache.aio.AsyncCache`, without importing its module."""

    _store: AsyncStore
    #: Lock acquisitions that timed out (counted in the cache's stats).
    _lock_timeouts: int

    @property
    def default_ttl(self) -> float | None:
        """The TTL of a write given ``ttl=None``."""


class InlineStore(AsyncStore):
    """A store whose operations never wait: each coroutine calls the driver directly."""

    def __init__(self, driver: Driver) -> None:
        self.driver = driver

    async def get(self, key: Key, default: Any = None) -> Any:
        return self.driver.get(key, default)

    async def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        return self.driver.get_with_ttl(key, default)

    async def get_many(self, keys: list[Key]) -> dict[Any, Any]:
        return self.driver.get_many(keys)

    async def contains(self, key: Key) -> bool:
        return self.driver.contains(key)

    async def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        self.driver.set(key, value, ttl)

    async def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        return self.driver.add(key, value, ttl)

    async def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        return self.driver.replace(key, value, ttl)

    async def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        self.driver.set_many(mapping, ttl)

    async def delete(self, key: Key) -> bool:
        return self.driver.delete(key)

    async def delete_many(self, keys: list[Key]) -> int:
        return self.driver.delete_many(keys)

    async def pop(self, key: Key, default: Any = None) -> Any:
        return self.driver.pop(key, default)

    async def touch(self, key: Key, ttl: TTL = None) -> bool:
        return self.driver.touch(key, ttl)

    async def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        return self.driver.incr(key, delta, default)

    async def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        return self.driver.decr(key, delta, default)

    async def clear(self) -> None:
        self.driver.clear()

    async def keys(self) -> list[Key]:
        return self.driver.keys()

    async def delete_if_equals(self, key: Key, token: bytes) -> bool:
        return delete_if_equals_sync(self.driver, key, token)


class ThreadStore(AsyncStore):
    """A blocking driver, called on the bounded thread pool."""

    def __init__(self, driver: Driver, offloader: Offloader) -> None:
        self.driver = driver
        self._run = offloader.run

    async def get(self, key: Key, default: Any = None) -> Any:
        return await self._run(self.driver.get, key, default)

    async def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        return await self._run(self.driver.get_with_ttl, key, default)

    async def get_many(self, keys: list[Key]) -> dict[Any, Any]:
        return await self._run(self.driver.get_many, keys)

    async def contains(self, key: Key) -> bool:
        return await self._run(self.driver.contains, key)

    async def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        await self._run(self.driver.set, key, value, ttl)

    async def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        return await self._run(self.driver.add, key, value, ttl)

    async def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        return await self._run(self.driver.replace, key, value, ttl)

    async def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        await self._run(self.driver.set_many, mapping, ttl)

    async def delete(self, key: Key) -> bool:
        return await self._run(self.driver.delete, key)

    async def delete_many(self, keys: list[Key]) -> int:
        return await self._run(self.driver.delete_many, keys)

    async def pop(self, key: Key, default: Any = None) -> Any:
        return await self._run(self.driver.pop, key, default)

    async def touch(self, key: Key, ttl: TTL = None) -> bool:
        return await self._run(self.driver.touch, key, ttl)

    async def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        return await self._run(self.driver.incr, key, delta, default)

    async def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        return await self._run(self.driver.decr, key, delta, default)

    async def clear(self) -> None:
        await self._run(self.driver.clear)

    async def keys(self) -> list[Key]:
        return await self._run(self.driver.keys)

    async def delete_if_equals(self, key: Key, token: bytes) -> bool:
        return await self._run(delete_if_equals_sync, self.driver, key, token)


class TieredStore(ThreadStore):
    """A :class:`~nearcache.tiered.TieredCache`: L1 hits inline, the rest on the pool.

    Only a read that hits this host's L1 stays on the event loop; on a miss
    the tiered cache's own ``get`` runs on the pool (it looks at L1 again,
    reads L2 and fills L1 under its epoch rule).  Writes are the tiered
    cache's own methods on the pool: L2, then L1, then the invalidation.
    """

    def __init__(self, driver: Any, offloader: Offloader) -> None:
        super().__init__(driver, offloader)
        l1: Driver = driver.l1
        self._l1_inline = l1.name in INLINE_DRIVERS
        self._l1_get = l1.bound_get()
        self._l1_get_many = l1.get_many
        #: L1 hits served on the event loop (the tiered cache counts the others).
        self.l1_hits = 0

    async def get(self, key: Key, default: Any = None) -> Any:
        if self._l1_inline:
            value = self._l1_get(key, _MISS)
            if value is not _MISS:
                self.l1_hits += 1
                return value
        return await self._run(self.driver.get, key, default)

    async def get_many(self, keys: list[Key]) -> dict[Any, Any]:
        if not self._l1_inline:
            return await self._run(self.driver.get_many, keys)
        found = self._l1_get_many(keys)
        self.l1_hits += len(found)
        missing = [key for key in keys if key not in found]
        if missing:
            found.update(await self._run(self.driver.get_many, missing))
        return found

    async def contains(self, key: Key) -> bool:
        if self._l1_inline and self._l1_get(key, _MISS) is not _MISS:
            return True
        return await self._run(self.driver.contains, key)
