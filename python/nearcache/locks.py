"""A cross-process lock stored in a cache, robust to its holder dying.

The lock is one cache entry, ``nearcache.lock:<name>``, created with the
engine's atomic ``add`` (only one process can create it) and holding a
random token that identifies the holder.  It is created with a TTL
(``expire``): if the holder dies, or hangs, the entry expires and the lock
becomes free again, so nobody waits forever for a dead process.

Rules of use:

* Pick ``expire`` longer than the critical section (or call
  :meth:`Lock.extend` while working): a lock that expires while held may be
  taken by someone else, and the late holder's :meth:`Lock.release` then
  raises :class:`~nearcache.LockNotOwnedError` rather than freeing the new
  holder's lock.
* The lock is not reentrant, and a :class:`Lock` object belongs to the
  process that acquired it (a forked child cannot release its parent's lock).
* Waiting polls the cache with a short exponential backoff (1 ms doubling up
  to 50 ms, with jitter): fine for coordinating work that takes milliseconds
  to minutes, not a replacement for a futex.

>>> from nearcache import Cache
>>> cache = Cache("lock-demo", size="1MiB")
>>> lock = cache.lock("nightly-report", timeout=2, expire=30)
>>> with lock:
...     lock.locked(), lock.owned()
(True, True)
>>> lock.locked()
False
>>> cache.clear()
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from types import TracebackType
from typing import ClassVar

from nearcache.lockcore import LOCK_NAMESPACE, LockCore
from nearcache.protocol import Store
from nearcache.steps import Call, run, run_async
from nearcache.units import Duration

__all__ = ["LOCK_NAMESPACE", "Lock"]


class Lock(LockCore[Store]):
    """A named lock shared by every process using ``cache``.

    ``timeout`` is how long :meth:`acquire` (and ``with``) waits: ``None``
    waits as long as it takes, ``0`` tries once.  ``expire`` is the lock's
    lifetime in the cache (positive; seconds, timedelta or "30s"): after it,
    a holder that died or hung loses the lock.

    ``with lock:`` raises :class:`~nearcache.LockTimeoutError` when the lock
    is not acquired in time; ``async with lock:`` does the same without
    blocking the event loop.  The protocol is :mod:`nearcache.lockcore`'s;
    this class drives it with blocking store calls.
    """

    _kind: ClassVar[str] = "Lock object"

    # ------------------------------------------------------------------ acquire

    def acquire(self, blocking: bool = True, timeout: float | timedelta | None = -1) -> bool:
        """Take the lock; return whether it was taken.

        ``blocking=False`` tries once.  ``timeout`` overrides the lock's
        timeout for this call (``-1``: use it; ``None``: wait forever).
        """
        return run(self.acquire_steps(blocking, timeout), self.cache)

    async def acquire_async(self, timeout: float | timedelta | None = -1) -> bool:
        """Like :meth:`acquire`, waiting with :func:`asyncio.sleep`."""
        return await run_async(self.acquire_steps(True, timeout), self._call, asyncio.sleep)

    async def _call(self, op: Call) -> object:
        return getattr(self.cache, op.method)(*op.args)

    # ------------------------------------------------------------------ release

    def release(self) -> None:
        """Free the lock; :class:`~nearcache.LockNotOwnedError` if it is not
        held by this object any more (expired, taken over, never acquired)."""
        run(self.release_steps(), self.cache)

    def extend(self, expire: Duration | None = None) -> None:
        """Restart the lock's lifetime (``expire`` seconds, default: the
        lock's), for work that runs longer than planned."""
        run(self.extend_steps(expire), self.cache)

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        return self.key in self.cache

    def owned(self) -> bool:
        """Whether this object holds the lock (and it has not expired)."""
        return run(self.owned_steps(), self.cache)

    # --------------------------------------------------------- context managers

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise self._timed_out()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def _acquire_awaiting(self) -> bool:
        return await self.acquire_async()

    async def _release_awaiting(self) -> None:
        self.release()
