"""An async cross-process lock: :class:`nearcache.Lock`'s rules, awaited.

The lock is the cache entry ``nearcache.lock:<name>`` (the namespace of the
sync :class:`nearcache.Lock`, so sync and async code exclude each other),
created with the atomic ``add`` and holding a random token, with a TTL
(``expire``) so a holder that dies frees it.  Release deletes the entry
only if it still holds this lock's token: atomically on an unsigned
shared-memory cache and on Redis (a small script), and as check-then-delete
elsewhere (memcached, signed caches), where a lock that expires between
the two steps is the only window.  Waiting sleeps on the event loop with
a jittered exponential backoff (1 ms doubling to 50 ms).
"""

from __future__ import annotations

from datetime import timedelta
from typing import ClassVar

from nearcache.aio._runtime import sleep
from nearcache.aio._stores import StoreHolder
from nearcache.lockcore import LockCore
from nearcache.steps import Call, Steps, run_async
from nearcache.units import Duration

__all__ = ["AsyncLock"]


class AsyncLock(LockCore[StoreHolder]):
    """A named lock shared by every process (and task) using the cache.

    ``timeout``: how long :meth:`acquire` and ``async with`` wait (``None``:
    as long as it takes; ``0``: one try).  ``expire``: the lock's lifetime
    in the cache, after which a dead or hung holder loses it.  The protocol
    is :mod:`nearcache.lockcore`'s; this class awaits its store calls.
    """

    _kind: ClassVar[str] = "AsyncLock"

    async def _run(self, steps: Steps[object]) -> object:
        return await run_async(steps, self._call, sleep)

    async def _call(self, op: Call) -> object:
        return await getattr(self.cache._store, op.method)(*op.args)

    async def acquire(self, blocking: bool = True, timeout: float | timedelta | None = -1) -> bool:
        """Take the lock; return whether it was taken within the timeout.

        ``blocking=False`` tries once.  ``timeout`` overrides the lock's for
        this call (``-1``: the lock's; ``None``: wait forever; ``0``: one
        try).  The signature of :meth:`nearcache.Lock.acquire`.
        """
        if await self._run(self.acquire_steps(blocking, timeout)):
            return True
        self.cache._lock_timeouts += 1
        return False

    async def release(self) -> None:
        """Free the lock; :class:`~nearcache.LockNotOwnedError` if this object
        does not hold it any more (expired, taken over, never acquired)."""
        await self._run(self.release_steps())

    async def extend(self, expire: Duration | None = None) -> None:
        """Restart the lock's lifetime (default: its ``expire``)."""
        await self._run(self.extend_steps(expire))

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        return await self.cache._store.contains(self.key)

    async def owned(self) -> bool:
        """Whether this object holds the lock (and it has not expired)."""
        return bool(await self._run(self.owned_steps()))

    async def _acquire_awaiting(self) -> bool:
        return await self.acquire()

    async def _release_awaiting(self) -> None:
        await self.release()
