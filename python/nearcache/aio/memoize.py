"""``@acache.memoize()``: async memoization with stampede protection at two levels.

Keys, entries and options are those of :mod:`nearcache.memoize` (the same
``_Memo`` builds the keys and holds ``ttl``, ``stale_ttl``, ``beta`` and
``lock_ttl``), so a sync and an async process agree on every entry.  What
differs is how callers wait:

* Across tasks of one process: the first task that misses becomes the
  *leader* of that key; the other tasks of the same event loop await its
  result (an event, no polling, no cache traffic).  If the leader fails,
  they start over and one of them leads.
* Across processes (and hosts, through a shared L2): the leader takes the
  memoize lock of the key (``add`` of a lock entry with ``lock_ttl``) before
  computing; a leader that does not get it polls the cache for the other
  process's result with a jittered backoff (2 ms growing to 50 ms), or
  serves the stale value when there is one (``stale_ttl``, ``beta``).

With ``tags``, the generations of the call's tags (read before computing)
are part of its key (see :mod:`nearcache.tags`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, cast

from nearcache.aio._runtime import Event, loop_token, new_event, sleep, spawn
from nearcache.aio.lock import AsyncLock
from nearcache.errors import (
    ConfigurationError,
    SerializationError,
    ValueTooLargeError,
)
from nearcache.memoize import (
    _ABSENT,
    _FRESH,
    _MISS,
    _first_parameter,
    _is_async,
    _log_refresh_failure,
    _Memo,
    _MethodDescriptor,
    _waits,
)
from nearcache.tags import TagsArg, check_tags, suffix
from nearcache.units import Duration

if TYPE_CHECKING:
    from nearcache.aio.cache import AsyncCache

__all__ = ["AsyncMemoized", "async_memoize"]

logger = logging.getLogger("nearcache.memoize")


class _Flight:
    """One in-process computation of a key that other tasks await."""

    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done: Event = new_event()
        self.ok = False
        self.value: Any = None


class AsyncMemoized(Protocol):
    """What ``@acache.memoize()`` returns: an ``async def`` function, plus helpers."""

    __wrapped__: Callable[..., Awaitable[Any]]

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]: ...

    async def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call (with its tags' current generations)."""

    async def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Drop this call's entry; return whether there was one."""

    async def invalidate_all(self) -> int:
        """Drop every entry of this function (scans the keys); return how many."""


class _AsyncMemo:
    """State and policy of one async memoized function."""

    def __init__(self, cache: AsyncCache, memo: _Memo[Any]) -> None:
        self._cache = cache
        self._memo = memo
        self._flights: dict[tuple[object, str], _Flight] = {}

    @property
    def store_failures(self) -> int:
        """Results computed but not cached (the serializer refused, too large)."""
        return self._memo.store_failures

    @property
    def memo(self) -> _Memo[Any]:
        """The key builder and options shared with the sync memoize."""
        return self._memo

    async def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call (with its tags' current generations)."""
        key = self._memo.base_key(args, kwargs)
        names = self._memo.tag_names(args, kwargs)
        if names:
            key += suffix(await self._cache.tag_generations(names))
        return key

    async def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Drop this call's entry; return whether there was one."""
        return await self._cache.delete(await self.cache_key(*args, **kwargs))

    async def invalidate_all(self) -> int:
        """Drop every entry of this function (scans the keys); return how many."""
        prefix = self._memo.prefix
        keys = await self._cache.keys()
        return await self._cache.delete_many(
            [k for k in keys if isinstance(k, str) and k.startswith(prefix)]
        )

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = await self.cache_key(*args, **kwargs)
        while True:
            state, value, expires = await self._read(key)
            if state == _FRESH:
                return value
            slot = (loop_token(), key)
            flight = self._flights.get(slot)
            if flight is None:
                break
            await flight.done.wait()
            if flight.ok:
                return flight.value
            # The leader failed: start over (one of the waiters leads next).
        flight = self._flights[slot] = _Flight()
        try:
            result = await self._lead(key, state, value, expires, args, kwargs)
            flight.ok, flight.value = True, result
            return result
        finally:
            del self._flights[slot]
            flight.done.set()

    async def _lead(
        self,
        key: str,
        state: int,
        value: Any,
        expires: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        memo = self._memo
        lock = AsyncLock(self._cache, key, timeout=0, expire=memo.lock_ttl)
        pauses = _waits()
        while True:
            if await lock.acquire():
                if memo.background and state != _ABSENT:
                    # Serve the stale value now; the lock passes to the refresh.
                    spawn(self._refresh, key, lock, expires, args, kwargs)
                    return value
                try:
                    done, newer = memo.newer(
                        await self._read(key), expires if state != _ABSENT else 0.0
                    )
                    if done:
                        return newer
                    start = time.monotonic()
                    result = await memo.func(*args, **kwargs)
                    await self._store(key, result, time.monotonic() - start)
                    return result
                finally:
                    await _release(lock, key)
            if state != _ABSENT:
                return value  # another process is refreshing: serve what we have
            await sleep(next(pauses))
            state, value, expires = await self._read(key)
            if state != _ABSENT:
                return value

    async def _refresh(
        self,
        key: str,
        lock: AsyncLock,
        expires: float,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        """Recompute and store one entry in the background, then free its lock."""
        memo = self._memo
        try:
            if memo.newer(await self._read(key), expires)[0]:
                return  # another process refreshed it between our read and our lock
            start = time.monotonic()
            result = await memo.func(*args, **kwargs)
            await self._store(key, result, time.monotonic() - start)
        except Exception:
            _log_refresh_failure(memo)
        finally:
            await _release(lock, key)

    async def _read(self, key: str) -> tuple[int, Any, float]:
        return self._memo.classify(await self._cache._store.get(key, _MISS))

    async def _store(self, key: str, value: Any, delta: float) -> None:
        memo = self._memo
        envelope, physical = memo.stored_form(value, delta)
        try:
            await self._cache._store.set(key, envelope, physical)
        except (SerializationError, ValueTooLargeError) as exc:
            memo.store_failed(value, exc)


async def _release(lock: AsyncLock, key: str) -> None:
    try:
        await lock.release()
    except Exception:  # expired meanwhile (or the store failed): nothing to free
        logger.debug("memoize lock of %s not released", key, exc_info=True)


class _BoundAsyncMemoized:
    """A memoized method bound to an instance: helpers take the other arguments."""

    def __init__(self, wrapper: Callable[..., Awaitable[Any]], state: _AsyncMemo, instance: object):
        self._wrapper = wrapper
        self._state = state
        self.__self__ = instance
        functools.update_wrapper(self, state.memo.func)

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._wrapper(self.__self__, *args, **kwargs)

    async def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call on this instance."""
        return await self._state.cache_key(self.__self__, *args, **kwargs)

    async def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Drop this call's entry on this instance; return whether there was one."""
        return await self._state.invalidate(self.__self__, *args, **kwargs)

    async def invalidate_all(self) -> int:
        """Drop every entry of this method (of every instance)."""
        return await self._state.invalidate_all()


class _AsyncMemoizedMethod(_MethodDescriptor):
    """An ``async def`` method memoized: the class needs ``__cache_key__``
    unless ``key=`` or ``ignore=("self",)`` says how to key (the rule of the
    sync memoize), checked when the class is created."""

    def __init__(self, wrapper: Callable[..., Awaitable[Any]], state: _AsyncMemo) -> None:
        self._wrapper = wrapper
        self._state = state
        self._owner = None
        self.memo = state.memo
        self.cache_key = state.cache_key
        self.invalidate = state.invalidate
        self.invalidate_all = state.invalidate_all
        functools.update_wrapper(self, state.memo.func)

    def _bind(self, instance: object) -> _BoundAsyncMemoized:
        return _BoundAsyncMemoized(self._wrapper, self._state, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Awaitable[Any]:
        return self._wrapper(*args, **kwargs)


def async_memoize(
    cache: AsyncCache,
    ttl: Duration | None = None,
    *,
    tags: TagsArg | None = None,
    key: Callable[..., object] | None = None,
    name: str | None = None,
    ignore: Iterable[str] = (),
    stale_ttl: Duration = 0,
    beta: float = 0.0,
    lock_ttl: Duration = 60.0,
    background: bool = False,
    ttl_jitter: float = 0.0,
) -> Callable[[Callable[..., Awaitable[Any]]], AsyncMemoized]:
    """A decorator memoizing an ``async def`` function in ``cache``.

    Options are those of :func:`nearcache.memoize.memoize`, plus ``tags``
    (tag names, or a function of the call's arguments returning them).
    With ``background=True`` the caller that takes the refresh of a stale
    entry gets the stale value too, and the recomputation runs as a task
    (asyncio) or a system task (trio); a refresh that raises is logged and
    leaves the stale value in place.
    """
    if callable(ttl) and not isinstance(ttl, (int, float, str)):
        raise TypeError("memoize takes options: write @cache.memoize() with parentheses")
    if tags is not None and not callable(tags):
        check_tags(tags)  # a bare str fails here, as in the sync memoize

    def decorator(func: Callable[..., Awaitable[Any]]) -> AsyncMemoized:
        if not callable(func):
            raise TypeError(f"memoize decorates callables, not {type(func).__name__}")
        if not _is_async(func):
            raise ConfigurationError(
                "AsyncCache.memoize decorates async functions (or callables returning a "
                f"coroutine); {func!r} is not one "
                "(use the sync cache's memoize)"
            )
        memo: _Memo[Any] = _Memo(
            cache,  # type: ignore[arg-type]  # only its default_ttl is read
            func,
            ttl=ttl,
            key=key,
            name=name,
            ignore=ignore,
            stale_ttl=stale_ttl,
            beta=beta,
            lock_ttl=lock_ttl,
            background=background,
            ttl_jitter=ttl_jitter,
            tags=tags,
        )
        state = _AsyncMemo(cache, memo)

        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            return await state(*args, **kwargs)

        functools.update_wrapper(wrapper, func)
        helpers: Any = wrapper
        helpers.cache_key = state.cache_key
        helpers.invalidate = state.invalidate
        helpers.invalidate_all = state.invalidate_all
        helpers.memo = memo
        helpers.state = state
        if _first_parameter(func) == "self":
            return cast(AsyncMemoized, _AsyncMemoizedMethod(wrapper, state))
        return cast(AsyncMemoized, wrapper)

    return decorator
