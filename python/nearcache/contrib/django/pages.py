"""Stampede-free per-view caching: :func:`cache_page` and its middleware.

::

    from nearcache.contrib.django import cache_page

    @cache_page(60)
    def report(request): ...

Django's ``cache_page`` renders a missing page in every process that misses
it at once; this one renders it once across processes while the others
wait for the stored page (:class:`StampedeFreeCacheMiddleware`), under a
lock from :mod:`nearcache.contrib.django.locks`.  It works with any Django
cache backend; with :class:`~nearcache.contrib.django.NearCache` the lock
is the engine's and the counters are in its ``stats()``.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from collections.abc import Callable
from typing import Any

from django.middleware.cache import CacheMiddleware  # type: ignore[import-untyped]
from django.utils.cache import get_cache_key  # type: ignore[import-untyped]
from django.utils.decorators import (  # type: ignore[import-untyped]
    decorator_from_middleware_with_args,
)

from nearcache.contrib.django.backend import NearCache
from nearcache.contrib.django.locks import (
    _FIRST_POLL,
    _MAX_POLL,
    DEFAULT_STAMPEDE_WAIT,
    BackendLock,
    Releasable,
    release,
)
from nearcache.locks import Lock

__all__ = ["StampedeFreeCacheMiddleware", "cache_page"]


def _page_lock(backend: Any, name: str, wait: float) -> Releasable | None:
    """The stampede lock of one page: nearcache's own, or one made of ``add``."""
    if wait <= 0:
        return None
    if isinstance(backend, NearCache):
        store = backend._lock_store()
        if store is not None:
            return Lock(store, "django:" + name, timeout=0, expire=wait)
    return BackendLock(backend, name, wait)


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class StampedeFreeCacheMiddleware(CacheMiddleware):  # type: ignore[misc]
    """Django's ``CacheMiddleware`` that renders a missing page once across processes.

    When a cacheable request misses, the first process to take the page's
    lock renders it; the others poll the cache for the page until it
    appears, or until they take the lock themselves (its holder produced an
    uncacheable response, failed, or died and the lock expired after
    ``wait`` seconds); after twice ``wait`` they render anyway.  The lock is
    keyed by the page's cache key when Django knows it (its ``Vary`` headers
    learnt) and by the URL before.  A URL whose response turns out not to be
    cacheable is remembered for ``wait`` seconds, so its renders are not
    serialized.  With a :class:`NearCache` the lock is the engine's and the
    counters (``page_renders``, ``page_waits``, ``page_fallbacks``) are in
    :meth:`NearCache.stats`; any other backend's atomic ``add`` serves as
    the lock.  Inside an event loop (an async view) nothing waits: the
    behaviour is Django's.
    """

    def __init__(self, get_response: Any = None, wait: float | None = None, **kwargs: Any) -> None:
        super().__init__(get_response, **kwargs)
        self.wait = wait

    def _wait_seconds(self) -> float:
        if self.wait is not None:
            return float(self.wait)
        cache = self.cache
        return cache.stampede_wait if isinstance(cache, NearCache) else DEFAULT_STAMPEDE_WAIT

    def _count(self, counter: str) -> None:
        cache = self.cache
        if isinstance(cache, NearCache):
            cache.count(counter)

    def _url_name(self, request: Any) -> str:
        url = request.build_absolute_uri()
        digest = hashlib.sha256(url.encode("utf-8", "surrogatepass")).hexdigest()
        return f"page:{self.key_prefix}:url:{digest}"

    def _lock(self, request: Any, url_name: str, url_lock: Releasable, wait: float) -> Any:
        """Take the lock to render under, or return None if someone holds it.

        The URL's lock until Django knows the page's cache key (its Vary
        headers), then the page variant's.  The URL's first render learns the
        Vary headers before it stores the page, holding the URL's lock
        throughout: a variant's lock taken in that window is given back.
        """
        key = get_cache_key(request, self.key_prefix, "GET", cache=self.cache)
        if key is None:
            return url_lock if url_lock.acquire(blocking=False) else None
        lock = _page_lock(self.cache, f"page:{self.key_prefix}:{key}", wait)
        if lock is None or not lock.acquire(blocking=False):
            return None
        if url_lock.locked():
            release(lock)
            return None
        return lock

    def process_request(self, request: Any) -> Any:
        """Serve the page from the cache, or wait for the process rendering it."""
        response = super().process_request(request)
        if response is not None or not getattr(request, "_cache_update_cache", False):
            return response
        wait = self._wait_seconds()
        url_name = self._url_name(request)
        url_lock = _page_lock(self.cache, url_name, wait)
        if (
            url_lock is None
            or _in_event_loop()
            or self.cache.get("nearcache.uncacheable:" + url_name) is not None
        ):
            self._count("page_renders")
            return None
        deadline = time.monotonic() + 2 * wait
        pause = _FIRST_POLL
        waited = False
        while True:
            # While the URL's first render runs (it holds the URL's lock until
            # its page is stored), wait for it even if its Vary headers are
            # known already; then render under the variant's own lock.
            lock = None if url_lock.locked() else self._lock(request, url_name, url_lock, wait)
            if lock is not None:
                # Rendered by someone else meanwhile?
                response = super().process_request(request)
                if response is not None:
                    release(lock)
                    if waited:
                        self._count("page_waits")
                    return response
                request._nearcache_page_lock = (lock, url_name)
                self._count("page_renders")
                return None
            if time.monotonic() >= deadline:
                self._count("page_fallbacks")
                self._count("page_renders")
                return None
            time.sleep(pause * (0.5 + random.random()))
            pause = min(pause * 1.5, _MAX_POLL)
            waited = True
            response = super().process_request(request)
            if response is not None:
                self._count("page_waits")
                return response

    def process_response(self, request: Any, response: Any) -> Any:
        """Store the page as Django does, then free its lock."""
        held = getattr(request, "_nearcache_page_lock", None)
        try:
            return super().process_response(request, response)
        finally:
            if held is not None:
                lock, url_name = held
                del request._nearcache_page_lock
                if get_cache_key(request, self.key_prefix, "GET", cache=self.cache) is None:
                    # Not cacheable: let the next requests render without waiting.
                    self.cache.set("nearcache.uncacheable:" + url_name, 1, self._wait_seconds())
                release(lock)

    def process_exception(self, request: Any, exception: Exception) -> None:
        """The view failed: free the page's lock (the next waiter renders)."""
        held = getattr(request, "_nearcache_page_lock", None)
        if held is not None:
            del request._nearcache_page_lock
            release(held[0])


def cache_page(
    timeout: float | None,
    *,
    cache: str | None = None,
    key_prefix: str | None = None,
    wait: float | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Django's ``cache_page`` decorator, rendering a missing page once across processes.

    Same arguments as ``django.views.decorators.cache.cache_page``, plus
    ``wait``: how long one render holds the others back (default: the
    backend's ``stampede_wait``, 5 s for backends other than nearcache's;
    0 turns waiting off).  See :class:`StampedeFreeCacheMiddleware`.
    """
    decorator: Callable[[Callable[..., Any]], Callable[..., Any]] = (
        decorator_from_middleware_with_args(StampedeFreeCacheMiddleware)(
            page_timeout=timeout, cache_alias=cache, key_prefix=key_prefix, wait=wait
        )
    )
    return decorator
