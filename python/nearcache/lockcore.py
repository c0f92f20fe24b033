"""The lock protocol, once, for :class:`nearcache.Lock` and :class:`nearcache.aio.AsyncLock`.

A lock is the cache entry ``nearcache.lock:<name>`` holding a random
16-byte token, created with the store's atomic ``add`` and a TTL
(``expire``), so a holder that dies frees it:

* **acquire**: ``add(key, token, expire)``; taken when it stored, else
  pause (1 ms doubling to 50 ms, jittered, cut at the timeout) and try
  again; out of time: not taken.
* **release**: ``delete_if_equals(key, token)``; the entry held another
  token (ours expired, someone took it): :class:`~nearcache.LockNotOwnedError`.
* **extend**: ``get(key) == token``, then ``touch(key, expire)``; either
  fails: expired.
* A :class:`LockCore` belongs to the process that acquired it: after a fork
  the child does not hold it.

The steps are generators of store calls (:mod:`nearcache.steps`): the sync
lock drives them with blocking calls, the async one awaits them, and both
keep the state here (name, key, timeout, expiry, token).
"""

from __future__ import annotations

import os
import random
import secrets
import time
from collections.abc import Iterator
from datetime import timedelta
from types import TracebackType
from typing import Any, ClassVar, Final, Generic, TypeVar

from nearcache.errors import ConfigurationError, LockNotOwnedError, LockTimeoutError
from nearcache.steps import Sleep, Steps, call
from nearcache.units import Duration, parse_duration

__all__ = ["LOCK_NAMESPACE", "LockCore", "backoff"]

S = TypeVar("S")
_L = TypeVar("_L", bound="LockCore[Any]")

#: Prefix of the cache keys that hold locks.
LOCK_NAMESPACE: Final = "nearcache.lock:"

_FIRST_DELAY: Final = 0.001
_MAX_DELAY: Final = 0.05


def _timeout_seconds(timeout: float | timedelta | None) -> float | None:
    if timeout is None:
        return None
    seconds = parse_duration(timeout)
    return seconds


def backoff(
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


class LockCore(Generic[S]):
    """The state of one lock object and the steps of its operations.

    ``cache`` is the store the driver makes the steps' calls on (the core
    itself never touches it); ``timeout`` is how long an acquire waits
    (``None``: as long as it takes; ``0``: one try); ``expire`` the lock's
    lifetime in the cache (positive; seconds, timedelta or "30s").
    """

    #: How the reentry error names the object.
    _kind: ClassVar[str] = "lock"

    def __init__(
        self,
        cache: S,
        name: str,
        *,
        timeout: float | timedelta | None = None,
        expire: Duration = 60.0,
    ) -> None:
        self.cache = cache
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

    def _deadline(self, timeout: float | timedelta | None, blocking: bool = True) -> float | None:
        """Start an acquire: refuse reentry, then give the :func:`time.monotonic`
        time its tries end at (``None``: never)."""
        if self._held_token() is not None:
            raise RuntimeError(f"lock {self.name!r} is already held by this {self._kind}")
        wait = self.timeout if timeout == -1 else _timeout_seconds(timeout)
        if not blocking:
            wait = 0.0
        return None if wait is None else time.monotonic() + wait

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

    # ------------------------------------------------------------------ steps

    def acquire_steps(
        self, blocking: bool = True, timeout: float | timedelta | None = -1
    ) -> Steps[bool]:
        """Take the lock: ``add`` a fresh token, pausing between tries until
        the timeout (``-1``: the lock's; ``None``: forever); whether it was taken."""
        deadline = self._deadline(timeout, blocking)
        pauses: Iterator[float] | None = None  # made on the first refusal: most tries succeed
        while True:
            token = secrets.token_bytes(16)
            if (yield call("add", self.key, token, self.expire)):
                self._token, self._pid = token, os.getpid()
                return True
            if pauses is None:
                pauses = backoff(_FIRST_DELAY, 2, _MAX_DELAY, deadline)
            pause = next(pauses, None)
            if pause is None:
                return False
            yield Sleep(pause)

    def release_steps(self) -> Steps[None]:
        """Free the lock, if it still holds this object's token."""
        token = self._check_owner()
        self._token = None
        if not (yield call("delete_if_equals", self.key, token)):
            raise self._expired()

    def extend_steps(self, expire: Duration | None = None) -> Steps[None]:
        """Restart the lock's lifetime, if it still holds this object's token."""
        token = self._check_owner()
        seconds = self._extend_seconds(expire)
        if (yield call("get", self.key)) != token or not (yield call("touch", self.key, seconds)):
            self._token = None
            raise self._expired()

    def owned_steps(self) -> Steps[bool]:
        """Whether this object holds the lock (and it has not expired)."""
        token = self._held_token()
        if token is None:
            return False
        return bool((yield call("get", self.key)) == token)

    # ------------------------------------------------ async with, for both drivers

    async def _acquire_awaiting(self) -> bool:
        """The driver's acquire with the lock's timeout, awaited."""
        raise NotImplementedError

    async def _release_awaiting(self) -> None:
        """The driver's release, awaited."""
        raise NotImplementedError

    async def __aenter__(self: _L) -> _L:
        if not await self._acquire_awaiting():
            raise self._timed_out()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._release_awaiting()

    def __repr__(self) -> str:
        state = "held" if self._token is not None else "free"
        return f"<{type(self).__name__} {self.name!r} {state} expire={self.expire}s>"
