"""``@acache.memoize()``: async memoization with stampede protection at two levels.

Keys, entries, options and the stampede protocol are those of
:mod:`nearcache.memoize`: the same ``_Memo`` builds the keys and holds
``ttl``, ``stale_ttl``, ``beta`` and ``lock_ttl``, and the same steps
(:mod:`nearcache.stampede`) decide between serving, waiting and computing;
this module only awaits them.  A sync and an async process agree on every
entry.  What the async side adds is how tasks of one process wait:

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
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, cast

from nearcache.aio._runtime import Event, loop_token, new_event, sleep, spawn
from nearcache.aio._stores import StoreHolder
from nearcache.errors import ConfigurationError
from nearcache.generations import TagsArg, check_tags
from nearcache.memoize import _first_parameter, _MethodDescriptor
from nearcache.stampede import (
    _FRESH,
    _MISS,
    _is_async,
    _Memo,
    lead_steps,
)
from nearcache.steps import Call, Spawn, Steps, run_async
from nearcache.units import Duration

__all__ = ["AsyncMemoized", "async_memoize"]


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
    """State of one async memoized function: the shared ``_Memo`` and the
    in-process flights."""

    def __init__(self, cache: StoreHolder, memo: _Memo[Any]) -> None:
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

    async def _perform(self, op: Call) -> Any:
        return await getattr(self._cache._store, op.method)(*op.args)

    async def _run(
        self, steps: Steps[Any], compute: Callable[[], Awaitable[Any]] | None = None
    ) -> Any:
        def start(op: Spawn) -> None:
            spawn(self._run, op.steps, compute)

        return await run_async(steps, self._perform, sleep, compute, start)

    async def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call (with its tags' current generations)."""
        return cast(str, await self._run(self._memo.key_steps(args, kwargs)))

    async def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Drop this call's entry; return whether there was one."""
        return await self._cache._store.delete(await self.cache_key(*args, **kwargs))

    async def invalidate_all(self) -> int:
        """Drop every entry of this function (scans the keys); return how many."""
        prefix = self._memo.prefix
        store = self._cache._store
        keys = await store.keys()
        return await store.delete_many(
            [k for k in keys if isinstance(k, str) and k.startswith(prefix)]
        )

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        memo = self._memo
        # A hit costs one read, made here: the key needs no store call
        # without tags, and the read is the core's first step, classified by
        # the core (the steps run on a miss only).
        key = (
            memo.base_key(args, kwargs)
            if memo.tags is None
            else await self.cache_key(*args, **kwargs)
        )
        store = self._cache._store
        while True:
            read = memo.classify(await store.get(key, _MISS))
            if read[0] == _FRESH:
                return read[1]
            slot = (loop_token(), key)
            flight = self._flights.get(slot)
            if flight is None:
                break
            await flight.done.wait()
            if flight.ok:
                return flight.value
            # The leader failed: start over (one of the waiters leads next).
        flight = self._flights[slot] = _Flight()

        async def compute() -> Any:
            return await memo.func(*args, **kwargs)

        try:
            result = await self._run(lead_steps(memo, key, read), compute)
            flight.ok, flight.value = True, result
            return result
        finally:
            del self._flights[slot]
            flight.done.set()


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
    cache: StoreHolder,
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
            cache,
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
