"""``AsyncCache``: the one API as coroutines, over every store.

>>> import asyncio
>>> from nearcache.aio import AsyncCache
>>> async def main():
...     async with AsyncCache("aio-demo", size="1MiB") as cache:
...         await cache.set("user:1", {"name": "Ada"}, ttl=60, tags=["users"])
...         first = await cache.get("user:1")
...         await cache.invalidate_tags(["users"])
...         return first, await cache.get("user:1", "gone")
>>> asyncio.run(main())
({'name': 'Ada'}, 'gone')

What each store costs on the event loop is in :mod:`nearcache.aio._stores`:
shared memory is called inline (no thread hop), Redis goes through
``redis.asyncio``, memcached through a bounded thread pool, and a tiered
cache serves L1 hits inline.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from types import TracebackType
from typing import Any

from nearcache import tags as _tags
from nearcache.aio._runtime import Offloader
from nearcache.aio._stores import INLINE_DRIVERS, AsyncStore, InlineStore, ThreadStore, TieredStore
from nearcache.aio.lock import AsyncLock
from nearcache.aio.memoize import AsyncMemoized, async_memoize
from nearcache.cache import (
    DEFAULT_MAX_CONFLICTS,
    Cache,
    backoff_seconds,
    check_max_conflicts,
    update_conflict,
)
from nearcache.drivers.base import TTL, Driver, Key, check_key_collection
from nearcache.errors import ConfigurationError
from nearcache.units import Duration

__all__ = ["AsyncCache"]

_MISS: Any = object()


def _make_store(driver: Driver, offloader: Offloader) -> AsyncStore:
    from nearcache.tiered import TieredCache

    if isinstance(driver, TieredCache):
        return TieredStore(driver, offloader)
    if driver.name in INLINE_DRIVERS:
        return InlineStore(driver)
    if driver.name == "redis":
        from nearcache.aio._redis import AsyncRedisStore
        from nearcache.drivers.redis import RedisDriver

        if isinstance(driver, RedisDriver):
            return AsyncRedisStore(driver, offloader)
    return ThreadStore(driver, offloader)


class AsyncCache:
    """A cache for ``async`` code: every operation is a coroutine.

    ``backend`` is one of

    * a cache name (``AsyncCache("sessions", size="64MiB")``): a shared-memory
      :class:`~nearcache.Cache` opened with ``options``;
    * a URL (``"redis://127.0.0.1:6379/0"``, ``"memcached://..."``,
      ``"tiered://..."``, ``"nearcache://name"``): :func:`nearcache.from_url`;
    * an open :class:`~nearcache.Cache`, any driver, or a
      :class:`~nearcache.TieredCache`.

    What it opened itself it closes in :meth:`aclose` (or ``async with``);
    an object it was given stays open.  ``workers`` bounds the threads used
    for blocking stores (memcached, a tiered cache's L2 path).

    Methods follow the driver protocol (:mod:`nearcache.drivers.base`: keys,
    values, the TTL rule, errors); ``set``/``add``/``replace`` also take
    ``tags`` (:mod:`nearcache.tags`), and every read honours them.
    """

    def __init__(
        self,
        backend: str | Cache | Driver | None = None,
        *,
        workers: int = 8,
        **options: Any,
    ) -> None:
        owns = False
        driver: Driver
        if backend is None or isinstance(backend, str):
            if backend is not None and "://" in backend:
                from nearcache.config import from_url

                made = from_url(backend, **options)
                if not isinstance(made, Driver):
                    raise ConfigurationError(f"{backend!r} does not name a driver")
                driver = made
            else:
                from nearcache.drivers.shm import ShmDriver

                driver = ShmDriver(cache=Cache(backend, **options))
            owns = True
        elif options:
            raise ConfigurationError("options are for a cache opened by name or URL")
        elif isinstance(backend, Cache):
            from nearcache.drivers.shm import ShmDriver

            driver = ShmDriver(cache=backend)
        elif isinstance(backend, Driver):
            driver = backend
        else:
            raise ConfigurationError(
                f"AsyncCache needs a name, a URL, a Cache or a driver, not {type(backend).__name__}"
            )
        self._driver = driver
        self._owns = owns
        self._offloader = Offloader(workers)
        self._store = _make_store(driver, self._offloader)
        # Shared memory: reads call the driver's fastest get (the engine's own
        # for an unsigned cache) with no coroutine in between.
        self._inline_get = driver.bound_get() if isinstance(self._store, InlineStore) else None
        self._lock_timeouts = 0

    # -- what is underneath ------------------------------------------------------

    @property
    def driver(self) -> Driver:
        """The sync driver (or tiered cache) behind this cache."""
        return self._driver

    @property
    def default_ttl(self) -> float | None:
        """The default TTL in seconds, or ``None`` when entries never expire."""
        return self._driver.default_ttl

    @property
    def closed(self) -> bool:
        """Whether the driver was closed."""
        return self._driver.closed

    # -- reads -------------------------------------------------------------------

    async def get(self, key: Key, default: Any = None, *, version: bool = False) -> Any:
        """The value under ``key``, or ``default`` (a miss, or a tag was invalidated).

        With ``version=True`` (shared memory only): ``(value, version)``, the
        version to pass to :meth:`cas` (0 on a miss), as
        :meth:`nearcache.Cache.get` returns it.
        """
        if version:
            return await self._get_versioned(key, default)
        inline = self._inline_get
        stored = inline(key, _MISS) if inline is not None else await self._store.get(key, _MISS)
        if stored is _MISS:
            return default
        if stored.__class__ is list and _tags.is_envelope(stored):
            return await self._check_tags(stored, default)
        return stored

    async def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """``(value, seconds left)`` (``None``: never expires), or ``(default, None)``."""
        stored, left = await self._store.get_with_ttl(key, _MISS)
        if stored is _MISS:
            return default, None
        if _tags.is_envelope(stored):
            value = await self._check_tags(stored, _MISS)
            return (default, None) if value is _MISS else (value, left)
        return stored, left

    async def _check_tags(self, stored: list[Any], default: Any) -> Any:
        recorded = _tags.envelope_tags(stored)
        current = await self._store.get_many([_tags.tag_key(tag) for tag, _ in recorded])
        return stored[1] if _tags.still_valid(recorded, current) else default

    async def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """``{key: value}`` for the keys that hit (keyed as given).

        A bare ``str``/``bytes`` raises :class:`~nearcache.KeyTypeError` (a
        ``TypeError``), as in the sync API: pass a list of keys.
        """
        check_key_collection(keys)
        found = await self._store.get_many(list(keys))
        tagged = {k: _tags.envelope_tags(v) for k, v in found.items() if _tags.is_envelope(v)}
        if not tagged:
            return found
        wanted = sorted({_tags.tag_key(tag) for pairs in tagged.values() for tag, _ in pairs})
        current = await self._store.get_many(list(wanted))
        result: dict[Any, Any] = {}
        for key, stored in found.items():
            if key not in tagged:
                result[key] = stored
            elif _tags.still_valid(tagged[key], current):
                result[key] = stored[1]
        return result

    # -- read-modify-write (shared memory) ----------------------------------------

    def _shm(self) -> Cache:
        """The shared-memory cache underneath, for compare-and-swap."""
        from nearcache.drivers.shm import ShmDriver

        if isinstance(self._driver, ShmDriver):
            return self._driver.cache
        raise NotImplementedError(
            "cas and update need a shared-memory cache underneath; this AsyncCache "
            f"is over {self._driver.name!r}"
        )

    async def _get_versioned(self, key: Key, default: Any) -> tuple[Any, int]:
        stored, version = self._shm().get(key, _MISS, version=True)
        if stored is _MISS:
            return default, version
        if stored.__class__ is list and _tags.is_envelope(stored):
            # An invalidated tag reads as ``default``, with the entry's
            # version: a cas with it replaces the stale entry.
            return await self._check_tags(stored, default), version
        return stored, version

    async def cas(self, key: Key, value: Any, version: int, *, ttl: TTL = None) -> bool:
        """Store ``value`` only if ``key`` still has ``version``
        (:meth:`nearcache.Cache.cas`); return whether it stored."""
        return self._shm().cas(key, value, version, ttl=ttl)

    async def update(
        self,
        key: Key,
        fn: Callable[[Any], Any],
        *,
        default: Any = _MISS,
        ttl: TTL = None,
        max_conflicts: int = DEFAULT_MAX_CONFLICTS,
    ) -> Any:
        """Atomically replace the value of ``key`` by ``fn(value)``; return the new value.

        As :meth:`nearcache.Cache.update`; ``fn`` may also be a coroutine
        function.  Between attempts lost to other writers it yields to the
        event loop.
        """
        cache = self._shm()
        check_max_conflicts(max_conflicts)
        conflicts = 0
        while True:
            value, version = await self._get_versioned(key, _MISS)
            if value is _MISS:
                if default is _MISS:
                    raise KeyError(key)
                value = default
            new = fn(value)
            if inspect.isawaitable(new):
                new = await new
            if cache.cas(key, new, version, ttl=ttl):
                return new
            conflicts += 1
            if conflicts >= max_conflicts:
                raise update_conflict(key, conflicts)
            await asyncio.sleep(backoff_seconds(conflicts))

    async def contains(self, key: Key) -> bool:
        """Whether ``key`` holds a live entry (tags are not checked)."""
        return await self._store.contains(key)

    # -- writes ------------------------------------------------------------------

    async def _wrap(self, value: Any, tags: Iterable[str]) -> Any:
        names = _tags.check_tags(tags)
        if not names:
            return value
        return _tags.envelope(value, await self.tag_generations(names))

    async def set(self, key: Key, value: Any, ttl: TTL = None, *, tags: Iterable[str] = ()) -> None:
        """Store ``value`` under ``key``; with ``tags``, until one is invalidated."""
        await self._store.set(key, await self._wrap(value, tags), ttl)

    async def add(self, key: Key, value: Any, ttl: TTL = None, *, tags: Iterable[str] = ()) -> bool:
        """Store only if ``key`` is missing; return whether it was stored."""
        return await self._store.add(key, await self._wrap(value, tags), ttl)

    async def replace(
        self, key: Key, value: Any, ttl: TTL = None, *, tags: Iterable[str] = ()
    ) -> bool:
        """Store only if ``key`` exists; return whether it was stored."""
        return await self._store.replace(key, await self._wrap(value, tags), ttl)

    async def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """Store every item of ``mapping`` with the same ``ttl`` (a bare
        ``str``/``bytes`` raises :class:`~nearcache.KeyTypeError`)."""
        check_key_collection(mapping)
        await self._store.set_many(dict(mapping), ttl)

    async def get_or_set(
        self, key: Key, factory: Callable[[], Awaitable[Any]], ttl: TTL = None
    ) -> Any:
        """The value under ``key``; on a miss, ``await factory()``, store and return it.

        Not a lock (see :meth:`memoize` for stampede protection); a value
        stored meanwhile by someone else wins (``add``).
        """
        value = await self.get(key, _MISS)
        if value is not _MISS:
            return value
        created = await factory()
        if await self.add(key, created, ttl):
            return created
        current = await self.get(key, _MISS)
        return created if current is _MISS else current

    async def delete(self, key: Key) -> bool:
        """Remove ``key``; return whether it held a live entry."""
        return await self._store.delete(key)

    async def delete_many(self, keys: Iterable[Key]) -> int:
        """Remove every key; return how many held a live entry (a bare
        ``str``/``bytes`` raises :class:`~nearcache.KeyTypeError`)."""
        check_key_collection(keys)
        return await self._store.delete_many(list(keys))

    async def pop(self, key: Key, default: Any = None) -> Any:
        """Remove ``key`` and return its value (``default`` if missing or invalidated)."""
        stored = await self._store.pop(key, _MISS)
        if stored is _MISS:
            return default
        if _tags.is_envelope(stored):
            return await self._check_tags(stored, default)
        return stored

    async def touch(self, key: Key, ttl: TTL = None) -> bool:
        """Give ``key`` a new TTL; return whether it exists."""
        return await self._store.touch(key, ttl)

    async def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Atomically add ``delta`` to the integer under ``key``."""
        return await self._store.incr(key, delta, default)

    async def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Atomically subtract ``delta``."""
        return await self._store.decr(key, delta, default)

    async def delete_if_equals(self, key: Key, value: Any) -> bool:
        """Remove ``key`` only if it holds ``value``; return whether it did
        (the driver's :meth:`~nearcache.drivers.base.Driver.delete_if_equals`:
        atomic on Redis and on an unsigned shared-memory cache)."""
        return await self._store.delete_if_equals(key, value)

    async def clear(self) -> None:
        """Remove every entry the driver owns (see each driver for its scope)."""
        await self._store.clear()

    async def keys(self) -> list[Key]:
        """A snapshot of the live keys the driver owns (``NotImplementedError``
        where the store cannot list them: memcached)."""
        return await self._store.keys()

    # -- tags --------------------------------------------------------------------

    async def tag_generations(self, tags: Iterable[str]) -> dict[str, int]:
        """The current generation of each tag (missing records are created)."""
        names = _tags.check_tags(tags)
        keys: list[Key] = [_tags.tag_key(tag) for tag in names]
        found = await self._store.get_many(keys) if keys else {}
        result: dict[str, int] = {}
        for tag, key in zip(names, keys, strict=True):
            gen = found.get(key, _MISS)
            if gen.__class__ is not int:
                gen = await self._create_generation(key)
            result[tag] = gen
        return result

    async def _create_generation(self, key: Key) -> int:
        """The rules of :meth:`nearcache.tags.Tagged.generations`, awaited."""
        gen = _tags.new_generation()
        if await self._store.add(key, gen, 0):
            return gen
        current = await self._store.get(key, _MISS)
        if current.__class__ is int:
            return int(current)
        if current is not _MISS:  # not a generation: replace it (invalidates the tag)
            await self._store.set(key, gen, 0)
            return gen
        return _tags.new_generation()  # lost meanwhile: matches nothing stored

    async def invalidate_tags(self, tags: Iterable[str]) -> int:
        """Invalidate every entry carrying any of ``tags``: one ``incr`` per tag.

        Returns how many tag records existed (a missing one already invalidates).
        """
        count = 0
        for tag in _tags.check_tags(tags):
            try:
                await self._store.incr(_tags.tag_key(tag), 1, None)
            except KeyError:
                continue
            except (TypeError, OverflowError):  # not a generation: replace it
                await self._store.set(_tags.tag_key(tag), _tags.new_generation(), 0)
            count += 1
        return count

    # -- memoize and locks -------------------------------------------------------

    def memoize(
        self,
        ttl: Duration | None = None,
        *,
        tags: _tags.TagsArg | None = None,
        key: Callable[..., object] | None = None,
        name: str | None = None,
        ignore: Iterable[str] = (),
        stale_ttl: Duration = 0,
        beta: float = 0.0,
        lock_ttl: Duration = 60.0,
        background: bool = False,
        ttl_jitter: float = 0.0,
    ) -> Callable[[Callable[..., Awaitable[Any]]], AsyncMemoized]:
        """Decorator memoizing an ``async def`` function; see :mod:`nearcache.aio.memoize`.

        >>> import asyncio
        >>> async def main():
        ...     cache = AsyncCache("aio-memo-demo", size="1MiB")
        ...     @cache.memoize(ttl=60, tags=lambda n: [f"n:{n}"])
        ...     async def square(n):
        ...         print("computing", n)
        ...         return n * n
        ...     out = [await square(3), await square(3)]
        ...     await cache.invalidate_tags(["n:3"])
        ...     out.append(await square(3))
        ...     await cache.clear()
        ...     return out
        >>> asyncio.run(main())
        computing 3
        computing 3
        [9, 9, 9]
        """
        return async_memoize(
            self,
            ttl,
            tags=tags,
            key=key,
            name=name,
            ignore=ignore,
            stale_ttl=stale_ttl,
            beta=beta,
            lock_ttl=lock_ttl,
            background=background,
            ttl_jitter=ttl_jitter,
        )

    def lock(
        self,
        name: str,
        timeout: float | timedelta | None = None,
        expire: Duration = 60.0,
    ) -> AsyncLock:
        """A cross-process lock in this cache (``async with cache.lock("x"):``)."""
        return AsyncLock(self, name, timeout=timeout, expire=expire)

    # -- lifecycle ---------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """The driver's stats, plus this object's counters.

        For a tiered cache, ``l1_hits`` includes the hits served on the event
        loop.  ``lock_timeouts`` counts :class:`AsyncLock` acquisitions that
        gave up.
        """
        stats: dict[str, Any] = dict(self._driver.stats())
        if isinstance(self._store, TieredStore):
            stats["l1_hits"] = stats.get("l1_hits", 0) + self._store.l1_hits
        stats["lock_timeouts"] = self._lock_timeouts
        return stats

    async def aclose(self) -> None:
        """Release the async clients and threads; close the driver if this object opened it."""
        await self._store.aclose()
        self._offloader.close()
        if self._owns:
            self._driver.close()

    async def __aenter__(self) -> AsyncCache:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"<AsyncCache {self._driver!r}>"
