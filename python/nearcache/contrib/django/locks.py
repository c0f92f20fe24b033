"""The stampede locks of the Django integration: what a waiting request takes.

* :class:`nearcache.Lock` over the backend's shared-memory cache, for
  :class:`~nearcache.contrib.django.NearCache` (``get_or_set``) and for
  pages cached in it (:func:`~nearcache.contrib.django.cache_page`);
* :class:`BackendLock` over any other Django cache, made of its atomic
  ``add`` (Django's Redis, memcached and local-memory backends), for pages.

Both expire (``OPTIONS["stampede_wait"]`` or ``cache_page(wait=...)``), so
a process that dies holding one delays the others by that long at most.
This module also holds the stampede settings and counters both users share.
"""

from __future__ import annotations

import logging
import math
import secrets
from typing import Any, Final, Protocol

from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]

from nearcache.units import parse_duration

__all__ = ["DEFAULT_STAMPEDE_WAIT", "STAMPEDE_COUNTERS", "BackendLock", "Releasable", "release"]

logger = logging.getLogger("nearcache.contrib.django")

#: Default ``OPTIONS["stampede_wait"]``: the longest one computation holds
#: the others back (seconds).
DEFAULT_STAMPEDE_WAIT: Final = 5.0
#: Names of the stampede counters :meth:`NearCache.stats` reports.
STAMPEDE_COUNTERS: Final = (
    "get_or_set_computes",
    "get_or_set_waits",
    "get_or_set_fallbacks",
    "page_renders",
    "page_waits",
    "page_fallbacks",
)
# The counters live in the cache file, under this prefix (outside Django's
# "<KEY_PREFIX>:<version>:<key>" key space only by convention, like locks).
_COUNTER_PREFIX: Final = "nearcache.django.stats:"
# Waiters poll the cache: 1 ms at first, growing to 50 ms (with jitter).
_FIRST_POLL: Final = 0.001
_MAX_POLL: Final = 0.05


def stampede_wait(value: Any) -> float:
    """``OPTIONS["stampede_wait"]`` in seconds (a number, ``"5s"``, a timedelta; 0: off)."""
    if value is None:
        return 0.0
    try:
        seconds = parse_duration(value)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"invalid stampede_wait {value!r}: {exc}") from exc
    if seconds < 0 or math.isinf(seconds) or math.isnan(seconds):
        raise ImproperlyConfigured(f"stampede_wait must be finite and >= 0, not {value!r}")
    return seconds


class Releasable(Protocol):
    name: str

    def acquire(self, blocking: bool = True) -> bool: ...

    def release(self) -> None: ...

    def locked(self) -> bool: ...


def release(lock: Releasable) -> None:
    """Free a stampede lock; one that expired meanwhile is someone else's now."""
    try:
        lock.release()
    except Exception as exc:
        logger.debug("stampede lock %s not released: %s", lock.name, exc)


class BackendLock:
    """A stampede lock held in any Django cache through its ``add`` (an atomic
    create in Django's Redis, memcached and local-memory backends).

    Release is check-then-delete, so a lock that expires between the two
    steps may free the next holder's lock early: harmless here, where the
    worst case is one more render.
    """

    def __init__(self, backend: Any, name: str, expire: float) -> None:
        self.backend = backend
        self.name = name
        self.key = "nearcache.lock:django:" + name
        self.expire = expire
        self.token = ""

    def acquire(self, blocking: bool = True) -> bool:
        token = secrets.token_hex(16)
        if self.backend.add(self.key, token, timeout=self.expire):
            self.token = token
            return True
        return False

    def release(self) -> None:
        if self.token and self.backend.get(self.key) == self.token:
            self.backend.delete(self.key)
        self.token = ""

    def locked(self) -> bool:
        return bool(self.backend.has_key(self.key))
