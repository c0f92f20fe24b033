"""A Flask-Caching backend: ``CACHE_TYPE = "nearcache.contrib.flask.NearcacheCache"``.

Every worker process of the application (gunicorn, uWSGI...) opens the same
shared-memory file, so they share one cache instead of one each
(``SimpleCache``) or a network round trip per read (``RedisCache``).

Configuration (Flask config keys)::

    CACHE_TYPE = "nearcache.contrib.flask.NearcacheCache"
    CACHE_DEFAULT_TIMEOUT = 300           # seconds; 0: never expire
    CACHE_KEY_PREFIX = "flask_cache_"     # a namespace in the file (clear() only clears it)
    CACHE_NEARCACHE_NAME = "myapp"        # the cache file's name (default "flask")
    CACHE_NEARCACHE_OPTIONS = {"size": "256MiB"}  # more nearcache.Cache options (path=, ...)
    # or, instead of a name: any cache nearcache.from_url makes, e.g. a tiered stack
    CACHE_NEARCACHE_URL = "nearcache://myapp?size=256MiB redis://10.0.0.5:6379/0"

Timeouts follow Flask-Caching (cachelib): ``None`` is the default timeout,
``0`` never expires, a number of seconds or a ``timedelta``; a negative
timeout stores nothing (the key is removed).  Keys are strings; values are
anything nearcache stores (pickle by default: see the guide's security
section before sharing the file between users).

The backend passes Flask-Caching's own backend test suite
(``tests/flask/run.sh`` runs it from Flask-Caching's source distribution).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from typing import Any

from flask_caching.backends.base import BaseCache

from nearcache.cache import Cache
from nearcache.drivers.base import Driver
from nearcache.errors import (
    ConfigurationError,
    IncompatibleFileError,
    NotACounterError,
    SerializationError,
    ValueTooLargeError,
)

__all__ = ["NearcacheCache"]

logger = logging.getLogger("nearcache.contrib.flask")

_MISS: Any = object()


def incompatible_in_config(
    exc: IncompatibleFileError,
    config: dict[str, Any],
    kwargs: dict[str, Any],
    options: dict[str, Any],
) -> IncompatibleFileError:
    """``exc`` (a file of another layout) in the Flask config's terms.

    The engine's remedy speaks of ``Cache()`` arguments; an application
    changed ``CACHE_NEARCACHE_OPTIONS`` (or ``CACHE_OPTIONS``, or the
    ``nearcache://`` URL of ``CACHE_NEARCACHE_URL``).  See
    :mod:`nearcache._incompatible`.
    """
    from nearcache._incompatible import Terms, reworded

    url = options.get("url")
    if url is not None:
        terms = Terms(
            asked=f"CACHE_NEARCACHE_URL = {url!r}",
            recreate="recreate=1 in that URL",
            needs_size="a size= in it",
        )
        return reworded(exc, "", terms)
    ours = config.get("CACHE_NEARCACHE_OPTIONS") or {}

    def key(option: str) -> str:
        where = (
            "CACHE_OPTIONS"
            if option in kwargs and option not in ours
            else "CACHE_NEARCACHE_OPTIONS"
        )
        return f'{where}["{option}"]'

    given = [k for k in ("size", "shards") if options.get(k)]
    terms = Terms(
        asked=" and ".join(f"{key(k)} = {options[k]!r}" for k in given),
        recreate=f"{key('recreate')} = True",
        needs_size="" if options.get("size") else 'a CACHE_NEARCACHE_OPTIONS["size"]',
    )
    path = options.get("path")
    if path is None:
        from nearcache.cache import default_directory

        path = os.path.join(default_directory(), str(options.get("name") or "flask"))
    return reworded(exc, str(path), terms, bool(options.get("allow_foreign_owner")))


class NearcacheCache(BaseCache):
    """A nearcache cache (or any nearcache driver) behind Flask-Caching's API."""

    def __init__(
        self,
        store: Driver | Cache | None = None,
        *,
        default_timeout: int = 300,
        ignore_delete_many_errors: bool = False,
        name: str = "flask",
        url: str | None = None,
        key_prefix: str = "",
        **options: Any,
    ) -> None:
        """Wrap ``store``, or open the cache ``name`` (or ``url``) with ``options``.

        ``key_prefix`` becomes the cache's ``prefix`` (a namespace in the
        file) for a cache opened by name, and the driver's ``prefix`` for a
        URL.  The backend closes what it opened in :meth:`close`.
        """
        super().__init__(
            default_timeout=default_timeout, ignore_delete_many_errors=ignore_delete_many_errors
        )
        from nearcache.drivers.shm import ShmDriver

        self._owns = store is None
        if store is None:
            if url is not None:
                from nearcache.config import from_url

                if key_prefix and len(url.split()) == 1:  # a tiered stack: prefixes in its URLs
                    options.setdefault("prefix", key_prefix)
                store = from_url(url, **options)
            else:
                named = None if "path" in options else name
                store = Cache(named, prefix=key_prefix, **options)
        elif options or url is not None:
            raise ConfigurationError("pass a store, or options to open one, not both")
        self.store: Driver = ShmDriver(cache=store) if isinstance(store, Cache) else store

    @classmethod
    def factory(
        cls, app: Any, config: dict[str, Any], args: list[Any], kwargs: dict[str, Any]
    ) -> NearcacheCache:
        """Build the backend from the Flask config (see the module docs)."""
        options = dict(kwargs)  # default_timeout, ignore_delete_many_errors, CACHE_OPTIONS
        options.update(config.get("CACHE_NEARCACHE_OPTIONS") or {})
        options.setdefault("key_prefix", config.get("CACHE_KEY_PREFIX") or "")
        if config.get("CACHE_NEARCACHE_URL"):
            options.setdefault("url", config["CACHE_NEARCACHE_URL"])
        else:
            options.setdefault("name", config.get("CACHE_NEARCACHE_NAME") or "flask")
        try:
            return cls(*args, **options)
        except IncompatibleFileError as exc:
            raise incompatible_in_config(exc, config, kwargs, options) from exc

    # -- timeouts ------------------------------------------------------------------

    def _ttl(self, timeout: int | dt.timedelta | None) -> float | None:
        """nearcache's TTL for a cachelib timeout; None means "already expired"."""
        seconds = self._normalize_timeout(timeout)
        if seconds < 0:
            return None
        return float(seconds)

    # -- reads -----------------------------------------------------------------------

    def get(self, key: str) -> Any:
        """The value, or None."""
        return self.store.get(key)

    def get_many(self, *keys: str) -> list[Any]:
        """The values of ``keys`` in order (None for misses)."""
        found = self.store.get_many(keys)
        return [found.get(key) for key in keys]

    def get_dict(self, *keys: str) -> dict[str, Any]:
        """``{key: value or None}``."""
        return dict(zip(keys, self.get_many(*keys), strict=True))

    def has(self, key: str) -> bool:
        """Whether ``key`` holds a live entry (the value is not read)."""
        return self.store.contains(key)

    # -- writes ----------------------------------------------------------------------

    def _refused(self, operation: str, key: str, exc: Exception) -> bool:
        logger.warning("nearcache: %s of %r not stored: %s", operation, key, exc)
        return False

    def set(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        """Store ``value``; False if it could not be stored (too large, unpicklable)."""
        ttl = self._ttl(timeout)
        if ttl is None:
            self.store.delete(key)
            return True
        try:
            self.store.set(key, value, ttl)
        except (ValueTooLargeError, SerializationError) as exc:
            return self._refused("set", key, exc)
        return True

    def add(self, key: str, value: Any, timeout: int | dt.timedelta | None = None) -> bool:
        """Store ``value`` only if ``key`` is missing; return whether it was stored."""
        ttl = self._ttl(timeout)
        if ttl is None:
            return False
        try:
            return self.store.add(key, value, ttl)
        except (ValueTooLargeError, SerializationError) as exc:
            return self._refused("add", key, exc)

    def set_many(
        self, mapping: dict[str, Any], timeout: int | dt.timedelta | None = None
    ) -> list[Any]:
        """Store every item; return the keys stored."""
        ttl = self._ttl(timeout)
        if ttl is None:
            self.store.delete_many(list(mapping))
            return list(mapping)
        try:
            self.store.set_many(dict(mapping.items()), ttl)
        except (ValueTooLargeError, SerializationError):
            return [key for key, value in mapping.items() if self.set(key, value, timeout)]
        return list(mapping)

    def delete(self, key: str) -> bool:
        """Remove ``key``; return whether it was there."""
        return self.store.delete(key)

    def delete_many(self, *keys: str) -> list[Any]:
        """Remove ``keys``; return them (a key that is absent afterwards counts)."""
        self.store.delete_many(keys)
        return list(keys)

    def clear(self) -> bool:
        """Remove every entry of this backend's prefix."""
        self.store.clear()
        return True

    def inc(self, key: str, delta: int = 1) -> int | None:
        """Atomically add ``delta`` (a missing key starts at 0); None if not a counter."""
        try:
            return self.store.incr(key, delta)
        except (NotACounterError, OverflowError) as exc:
            self._refused("inc", key, exc)
            return None

    def dec(self, key: str, delta: int = 1) -> int | None:
        """Atomically subtract ``delta``; see :meth:`inc`."""
        try:
            return self.store.decr(key, delta)
        except (NotACounterError, OverflowError) as exc:
            self._refused("dec", key, exc)
            return None

    def close(self) -> None:
        """Close the cache if this backend opened it."""
        if self._owns:
            self.store.close()

    def __repr__(self) -> str:
        return f"<NearcacheCache {self.store!r}>"
