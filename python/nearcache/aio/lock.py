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
import random
import secrets
import time
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Final

from nearcache.aio._runtime import sleep
from nearcache.errors import ConfigurationError, LockNotOwnedError, LockTimeoutError
from nearcache.locks import LOCK_NAMESPACE
from nearcache.units import Duration, parse_duration

if TYPE_CHECKING:
    from nearcache.aio.cache import AsyncCache

__all__ = ["AsyncLock"]

_FIRST_DELAY: Final = 0.001
_MAX_DELAY: Final = 0.05


def _seconds(timeout: float | timedelta | None) -> float | None:
    return None if timeout is None else parse_duration(timeout)


class AsyncLock:
    """A named lock shared by every process (and task) using the cache.

    ``timeout``: how long :meth:`acquire` and ``async with`` wait (``None``:
    as long as it takes; ``0``: one try).  ``expire``: the lock's lifetime
    in the cache, after which a dead or hung holder loses it.
    """

    def __init__(
        self,
        cache: AsyncCache,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        expire: Duration = 60.0,
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"lock name must be a non-empty str, got {name!r}")
        self.cache = cache
        self.name = name
        self.key = LOCK_NAMESPACE + name
        self.timeout = _seconds(timeout)
        self.expire = parse_duration(expire)
        if self.expire <= 0:
            raise ConfigurationError(
                "a lock needs a positive expire time, so that a dead holder cannot block forever"
            )
        self._token: bytes | None = None
        self._pid = 0

    async def acquire(self, blocking: bool = True, timeout: float | timedelta | None = -1) -> bool:
        """Take the lock; return whether it was taken within the timeout.

        ``blocking=False`` tries once.  ``timeout`` overrides the lock's for
        this call (``-1``: the lock's; ``None``: wait forever; ``0``: one
        try).  The signature of :meth:`nearcache.Lock.acquire`.
        """
        if self._token is not None and self._pid == os.getpid():
            raise RuntimeError(f"lock {self.name!r} is already held by this AsyncLock")
        wait = self.timeout if timeout == -1 else _seconds(timeout)
        if not blocking:
            wait = 0.0
        deadline = None if wait is None else time.monotonic() + wait
        delay = _FIRST_DELAY
        while True:
            token = secrets.token_bytes(16)
            if await self.cache._store.add(self.key, token, self.expire):
                self._token, self._pid = token, os.getpid()
                return True
            pause = delay * (0.5 + random.random())
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    self.cache._lock_timeouts += 1
                    return False
                pause = min(pause, left)
            await sleep(pause)
            delay = min(delay * 2, _MAX_DELAY)

    def _owned_token(self) -> bytes:
        token = self._token
        if token is None:
            raise LockNotOwnedError(f"lock {self.name!r} is not held")
        if self._pid != os.getpid():
            raise LockNotOwnedError(f"lock {self.name!r} was acquired by another process")
        return token

    async def release(self) -> None:
        """Free the lock; :class:`~nearcache.LockNotOwnedError` if this object
        does not hold it any more (expired, taken over, never acquired)."""
        token = self._owned_token()
        self._token = None
        if not await self.cache._store.delete_if_equals(self.key, token):
            raise LockNotOwnedError(f"lock {self.name!r} expired and may be held by another owner")

    async def extend(self, expire: Duration | None = None) -> None:
        """Restart the lock's lifetime (default: its ``expire``)."""
        token = self._owned_token()
        seconds = self.expire if expire is None else parse_duration(expire)
        if seconds <= 0:
            raise ConfigurationError("expire must be positive")
        store = self.cache._store
        if await store.get(self.key) != token or not await store.touch(self.key, seconds):
            self._token = None
            raise LockNotOwnedError(f"lock {self.name!r} expired and may be held by another owner")

    async def locked(self) -> bool:
        """Whether anyone holds the lock now."""
        return await self.cache._store.contains(self.key)

    async def owned(self) -> bool:
        """Whether this object holds the lock (and it has not expired)."""
        token = self._token
        if token is None or self._pid != os.getpid():
            return False
        return bool(await self.cache._store.get(self.key) == token)

    async def __aenter__(self) -> AsyncLock:
        if not await self.acquire():
            raise LockTimeoutError(f"lock {self.name!r} not acquired within {self.timeout} s")
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
