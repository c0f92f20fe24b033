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

import os
import secrets
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar

from nearcache.aio._runtime import sleep
from nearcache.locks import _LockState
from nearcache.units import Duration

if TYPE_CHECKING:
    from nearcache.aio.cache import AsyncCache

__all__ = ["AsyncLock"]


class AsyncLock(_LockState):
    """A named lock shared by every process (and task) using the cache.

    ``timeout``: how long :meth:`acquire` and ``async with`` wait (``None``:
    as long as it takes; ``0``: one try).  ``expire``: the lock's lifetime
    in the cache, after which a dead or hung holder loses it.
    """

    _kind: ClassVar[str] = "AsyncLock"

    def __init__(
        self,
        cache: AsyncCache,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        expire: Duration = 60.0,
    ) -> None:
        super().__init__(name, timeout, expire)
        self.cache = cache

    async def acquire(self, blocking: bool = True, timeout: float | timedelta | None = -1) -> bool:
        """Take the lock; return whether it was taken within the timeout.

        ``blocking=False`` tries once.  ``timeout`` overrides the lock's for
        this call (``-1``: the lock's; ``None``: wait forever; ``0``: one
        try).  The signature of :meth:`nearcache.Lock.acquire`.
        """
        pauses = self._pauses(timeout, blocking)
        while True:
            token = secrets.token_bytes(16)
            if await self.cache._store.add(self.key, token, self.expire):
                self._token, self._pid = token, os.getpid()
                return True
            pause = next(pauses, None)
            if pause is None:
                self.cache._lock_timeouts += 1
                return False
            await sleep(pause)

    async def release(self) -> None:
        """Free the lock; :class:`~nearcache.LockNotOwnedError` if this object
        does not hold it any more (expired, taken over, never acquired)."""
        token = self._check_owner()
        self._token = None
        if not await self.cache._store.delete_if_equals(self.key, token):
            raise self._expired()

    async def extend(self, expire: Duration | None = None) -> None:
        """Restart the lock's lifetime (default: its ``expire``)."""
        token = self._check_owner()
        seconds = self._extend_seconds(expire)
        store = self.cache._store
        if await store.get(self.key) != token or not await store.touch(self.key, seconds):
            self._token = None
            raise self._expired()

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        return await self.cache._store.contains(self.key)

    async def owned(self) -> bool:
        """Whether this object holds the lock (and it has not expired)."""
        token = self._held_token()
        if token is None:
            return False
        return bool(await self.cache._store.get(self.key) == token)

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire():
            raise self._timed_out()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.release()

    def __repr__(self) -> str:
        state = "held" if self._token is not None else "free"
        return f"<AsyncLock {self.name!r} {state} expire={self.expire}s>"
