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
import os
import random
import secrets
import time
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Final

from nearcache.errors import ConfigurationError, LockNotOwnedError, LockTimeoutError
from nearcache.units import Duration, parse_duration

if TYPE_CHECKING:
    from nearcache.cache import Cache
    from nearcache.drivers.base import Driver

__all__ = ["LOCK_NAMESPACE", "Lock"]

#: Prefix of the cache keys that hold locks.
LOCK_NAMESPACE: Final = "nearcache.lock:"

_FIRST_DELAY: Final = 0.001
_MAX_DELAY: Final = 0.05


def _timeout_seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    seconds = parse_duration(timeout)
    return seconds


class Lock:
    """A named lock shared by every process using ``cache``.

    ``timeout`` is how long :meth:`acquire` (and ``with``) waits: ``None``
    waits as long as it takes, ``0`` tries once.  ``expire`` is the lock's
    lifetime in the cache (positive; seconds, timedelta or "30s"): after it,
    a holder that died or hung loses the lock.

    ``with lock:`` raises :class:`~nearcache.LockTimeoutError` when the lock
    is not acquired in time; ``async with lock:`` does the same without
    blocking the event loop.
    """

    def __init__(
        self,
        cache: Cache | Driver,
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
        self.timeout = _timeout_seconds(timeout)
        expire_seconds = parse_duration(expire)
        if expire_seconds <= 0:
            raise ConfigurationError(
                "a lock needs a positive expire time, so that a dead holder cannot block forever"
            )
        self.expire = expire_seconds
        self._token: bytes | None = None
        self._pid = 0

    # ------------------------------------------------------------------ acquire

    def acquire(self, blocking: bool = True, timeout: float | timedelta | None = -1) -> bool:
        """Take the lock; return whether it was taken.

        ``blocking=False`` tries once.  ``timeout`` overrides the lock's
        timeout for this call (``-1``: use it; ``None``: wait forever).
        """
        if self._token is not None and self._pid == os.getpid():
            raise RuntimeError(f"lock {self.name!r} is already held by this Lock object")
        wait = self.timeout if timeout == -1 else _timeout_seconds(timeout)
        if not blocking:
            wait = 0.0
        deadline = None if wait is None else time.monotonic() + wait
        delay = _FIRST_DELAY
        while True:
            if self._try_acquire():
                return True
            sleep_for = self._next_sleep(deadline, delay)
            if sleep_for is None:
                return False
            time.sleep(sleep_for)
            delay = min(delay * 2, _MAX_DELAY)

    async def acquire_async(self, timeout: float | timedelta | None = -1) -> bool:
        """Like :meth:`acquire`, waiting with :func:`asyncio.sleep`."""
        if self._token is not None and self._pid == os.getpid():
            raise RuntimeError(f"lock {self.name!r} is already held by this Lock object")
        wait = self.timeout if timeout == -1 else _timeout_seconds(timeout)
        deadline = None if wait is None else time.monotonic() + wait
        delay = _FIRST_DELAY
        while True:
            if self._try_acquire():
                return True
            sleep_for = self._next_sleep(deadline, delay)
            if sleep_for is None:
                return False
            await asyncio.sleep(sleep_for)
            delay = min(delay * 2, _MAX_DELAY)

    def _try_acquire(self) -> bool:
        token = secrets.token_bytes(16)
        if self.cache.add(self.key, token, ttl=self.expire):
            self._token = token
            self._pid = os.getpid()
            return True
        return False

    @staticmethod
    def _next_sleep(deadline: float | None, delay: float) -> float | None:
        pause = delay * (0.5 + random.random())  # jitter: waiters do not poll in lockstep
        if deadline is None:
            return pause
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        return min(pause, left)

    # ------------------------------------------------------------------ release

    def _check_owner(self) -> bytes:
        token = self._token
        if token is None:
            raise LockNotOwnedError(f"lock {self.name!r} is not held")
        if self._pid != os.getpid():
            raise LockNotOwnedError(f"lock {self.name!r} was acquired by another process")
        return token

    def release(self) -> None:
        """Free the lock; :class:`~nearcache.LockNotOwnedError` if it is not
        held by this object any more (expired, taken over, never acquired)."""
        token = self._check_owner()
        self._token = None
        from nearcache.cache import Cache

        cache = self.cache
        if not isinstance(cache, Cache):
            # A driver: atomic where the store can (Redis), else check-then-delete.
            released = cache.delete_if_equals(self.key, token)
        elif not cache.codec.signed:
            # Atomic compare-and-delete: the token is stored as raw bytes.
            released = cache.native.delete_if_equals(self.key, token)
        elif cache.get(self.key) == token:
            # Signed entries are not raw bytes: check, then delete (a lock
            # that expires between the two is the only window).
            released = cache.delete(self.key)
        else:
            released = False
        if not released:
            raise LockNotOwnedError(f"lock {self.name!r} expired and may be held by another owner")

    def extend(self, expire: Duration | None = None) -> None:
        """Restart the lock's lifetime (``expire`` seconds, default: the
        lock's), for work that runs longer than planned."""
        token = self._check_owner()
        seconds = self.expire if expire is None else parse_duration(expire)
        if seconds <= 0:
            raise ConfigurationError("expire must be positive")
        if self.cache.get(self.key) != token or not self.cache.touch(self.key, ttl=seconds):
            self._token = None
            raise LockNotOwnedError(f"lock {self.name!r} expired and may be held by another owner")

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        return self.key in self.cache

    def owned(self) -> bool:
        """Whether this object holds the lock (and it has not expired)."""
        token = self._token
        return token is not None and self._pid == os.getpid() and self.cache.get(self.key) == token

    # --------------------------------------------------------- context managers

    def __enter__(self) -> Lock:
        if not self.acquire():
            raise LockTimeoutError(f"lock {self.name!r} not acquired within {self.timeout} s")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    async def __aenter__(self) -> Lock:
        if not await self.acquire_async():
            raise LockTimeoutError(f"lock {self.name!r} not acquired within {self.timeout} s")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "held" if self._token is not None else "free"
        return f"<Lock {self.name!r} {state} expire={self.expire}s>"
