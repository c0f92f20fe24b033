"""The conveniences that bind the policies to a store: ``cache.memoize(...)``, ``cache.lock(...)``.

:func:`nearcache.memoize.memoize`, :class:`nearcache.Lock` and
:class:`nearcache.tags.Tagged` work on any store (:class:`nearcache.protocol.Store`)
and import none.  A store offers them as methods by inheriting
:class:`PolicyMethods`: :class:`~nearcache.Cache` and
:class:`~nearcache.drivers.base.Driver` (so every driver and the tiered
cache) do.  This is the top of the layers drawn in
``docs/design/python.md``: it imports the policies, the store modules
import it, and nothing below imports a store.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from nearcache.locks import Lock
from nearcache.memoize import MemoizeDecorator, memoize
from nearcache.protocol import Store
from nearcache.tags import Tagged, TagsArg
from nearcache.units import Duration

__all__ = ["PolicyMethods"]


class PolicyMethods:
    """``memoize`` and ``lock`` for a class that implements :class:`~nearcache.protocol.Store`."""

    __slots__ = ()

    def memoize(
        self,
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
    ) -> MemoizeDecorator:
        """Decorator caching a function's results in this store; see
        :func:`nearcache.memoize.memoize`.

        The stampede lock is an ``add`` on this store, so with a remote store
        (or a tiered cache) one caller computes across every host.
        ``invalidate_all`` needs ``keys()``.  With ``tags=``,
        :meth:`nearcache.tags.Tagged.memoize` over this store:
        ``Tagged(cache).invalidate_tags([...])`` drops the calls carrying them.

        >>> from nearcache import Cache
        >>> c = Cache("doc-memo", size="1MiB")
        >>> @c.memoize(ttl=60)
        ... def square(x):
        ...     print("computing", x)
        ...     return x * x
        >>> square(4), square(4)
        computing 4
        (16, 16)
        >>> square.invalidate(4)
        True
        >>> c.clear()
        """
        options: dict[str, Any] = {
            "key": key,
            "name": name,
            "ignore": ignore,
            "stale_ttl": stale_ttl,
            "beta": beta,
            "lock_ttl": lock_ttl,
            "background": background,
            "ttl_jitter": ttl_jitter,
        }
        store: Store = self  # type: ignore[assignment]  # the class is a store
        if tags is not None:
            return Tagged(store).memoize(ttl, tags=tags, **options)
        return memoize(store, ttl, **options)

    def lock(
        self,
        name: str,
        timeout: float | timedelta | None = None,
        expire: Duration = 60.0,
    ) -> Lock:
        """A cross-process lock stored in this store, shared by every process
        (and host) that uses it; see :class:`nearcache.Lock`.

        >>> from nearcache import Cache
        >>> c = Cache("doc-lock", size="1MiB")
        >>> with c.lock("report", timeout=5):
        ...     pass
        """
        store: Store = self  # type: ignore[assignment]  # the class is a store
        return Lock(store, name, timeout=timeout, expire=expire)
