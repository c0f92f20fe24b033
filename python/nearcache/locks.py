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
from collections.abc import Iterator
from datetime import timedelta
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Final

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


def _backoff(
    first: float, factor: float, most: float, deadline: float | None = None
) -> Iterator[float]:
    """The pauses of a poll: ``first`` seconds, growing by ``factor`` up to
    ``most``, each jittered (so that waiters do not poll in lockstep) and cut
    at ``deadline`` (a :func:`time.monotonic` time, where the pauses end)."""
    delay = first
    while True:
        pause = delay * (0.5 + random.random())
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            pause = min(pause, left)
        yield pause
        delay = min(delay * factor, most)


class _LockState:
    """What :class:`Lock` and :class:`nearcache.aio.AsyncLock` share apart from
    the cache calls: the name and key, the timeout and expiry, the token this
    object holds, how long it waits, and the errors they raise."""

    #: How the reentry error names the object.
    _kind: ClassVar[str]

    def __init__(self, name: str, timeout: float | timedelta | None, expire: Duration) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"lock name must be a non-empty str, got {name!r}")
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

    def _held_token(self) -> bytes | None:
        """The token, if this object took the lock in this process."""
        return self._token if self._pid == os.getpid() else None

    def _pauses(self, timeout: float | timedelta | None, blocking: bool = True) -> Iterator[float]:
        """Start an acquire: refuse reentry, then give the pauses between its
        tries (1 ms doubling to 50 ms), which end when its timeout does."""
        if self._held_token() is not None:
            raise RuntimeError(f"lock {self.name!r} is already held by this {self._kind}")
        wait = self.timeout if timeout == -1 else _timeout_seconds(timeout)
        if not blocking:
            wait = 0.0
        deadline = None if wait is None else time.monotonic() + wait
        return _backoff(_FIRST_DELAY, 2, _MAX_DELAY, deadline)

    def _check_owner(self) -> bytes:
        token = self._token
        if token is None:
            raise LockNotOwnedError(f"lock {self.name!r} is not held")
        if self._pid != os.getpid():
            raise LockNotOwnedError(f"lock {self.name!r} was acquired by another process")
        return token

    def _extend_seconds(self, expire: Duration | None) -> float:
        seconds = self.expire if expire is None else parse_duration(expire)
        if seconds <= 0:
            raise ConfigurationError("expire must be positive")
        return seconds

    def _expired(self) -> LockNotOwnedError:
        return LockNotOwnedError(f"lock {self.name!r} expired and may be held by another owner")

    def _timed_out(self) -> LockTimeoutError:
        return LockTimeoutError(f"lock {self.name!r} not acquired within {self.timeout} s")


class Lock(_LockState):
    """A named lock shared by every process using ``cache``.

    ``timeout`` is how long :meth:`acquire` (and ``with``) waits: ``None``
    waits as long as it takes, ``0`` tries once.  ``expire`` is the lock's
    lifetime in the cache (positive; seconds, timedelta or "30s"): after it,
    a holder that died or hung loses the lock.

    ``with lock:`` raises :class:`~nearcache.LockTimeoutError` when the lock
    is not acquired in time; ``async with lock:`` does the same without
    blocking the event loop.
    """

    _kind: ClassVar[str] = "Lock object"

    def __init__(
        self,
        cache: Cache | Driver,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        expire: Duration = 60.0,
    ) -> None:
        super().__init__(name, timeout, expire)
        self.cache = cache

    # ------------------------------------------------------------------ acquire

    def acquire(self, blocking: bool = True, timeout: float | timedelta | None = -1) -> bool:
        """Take the lock; return whether it was taken.

        ``blocking=False`` tries once.  ``timeout`` overrides the lock's
        timeout for this call (``-1``: use it; ``None``: wait forever).
        """
        pauses = self._pauses(timeout, blocking)
        while not self._try_acquire():
            pause = next(pauses, None)
            if pause is None:
                return False
            time.sleep(pause)
        return True

    async def acquire_async(self, timeout: float | timedelta | None = -1) -> bool:
        """Like :meth:`acquire`, waiting with :func:`asyncio.sleep`."""
        pauses = self._pauses(timeout)
        while not self._try_acquire():
            pause = next(pauses, None)
            if pause is None:
                return False
            await asyncio.sleep(pause)
        return True

    def _try_acquire(self) -> bool:
        token = secrets.token_bytes(16)
        if self.cache.add(self.key, token, ttl=self.expire):
            self._token = token
            self._pid = os.getpid()
            return True
        return False

    # ------------------------------------------------------------------ release

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
            raise self._expired()

    def extend(self, expire: Duration | None = None) -> None:
        """Restart the lock's lifetime (``expire`` seconds, default: the
        lock's), for work that runs longer than planned."""
        token = self._check_owner()
        seconds = self._extend_seconds(expire)
        if self.cache.get(self.key) != token or not self.cache.touch(self.key, ttl=seconds):
            self._token = None
            raise self._expired()

    def locked(self) -> bool:
        """Whether anyone holds the lock right now."""
        return self.key in self.cache

    def owned(self) -> bool:
        """Whether this object holds the lock (and it has not expired)."""
        token = self._held_token()
        return token is not None and self.cache.get(self.key) == token

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

    async def __aenter__(self) -> Lock:
        if not await self.acquire_async():
            raise self._timed_out()
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
