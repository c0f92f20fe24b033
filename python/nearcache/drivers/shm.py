"""The shared-memory cache of this host (:class:`nearcache.Cache`) as a driver.

Every process on the host that opens the same cache file shares its
entries, which makes it the natural L1 of a tiered cache: one L1 per host,
not one per process.  :class:`nearcache.Cache` already follows the driver
protocol's key, value, TTL and error rules (they are its rules); this class
only adapts the few signatures that differ and reports the size limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

from nearcache.cache import Cache
from nearcache.drivers.base import TTL, Driver, Key
from nearcache.keys import native_key

__all__ = ["ShmDriver"]

_MISS: Any = object()


class ShmDriver(Driver):
    """A :class:`nearcache.Cache` (one shared-memory file) behind the driver API."""

    name: ClassVar[str] = "shm"

    def __init__(
        self,
        name: str | None = None,
        *,
        cache: Cache | None = None,
        default_ttl: TTL = None,
        **options: Any,
    ) -> None:
        """Open the cache ``name`` (or ``path=...``), or wrap an open ``cache``.

        ``default_ttl`` and ``options`` (``path``, ``size``, ``shards``,
        ``serializer``, ``compress``, ``signing_key``, ``prefix``...) are
        passed to :class:`nearcache.Cache`; they cannot be combined with
        ``cache``.  The driver owns the cache: :meth:`close` closes it.
        """
        if cache is None:
            cache = Cache(name, ttl=default_ttl, **options)
        elif name is not None or default_ttl is not None or options:
            raise TypeError("pass either an open cache or options to open one, not both")
        super().__init__(default_ttl=cache.default_ttl)
        self._cache = cache
        self.max_value_size = cache.max_value_size

    @property
    def cache(self) -> Cache:
        """The wrapped :class:`nearcache.Cache`."""
        return self._cache

    @property
    def closed(self) -> bool:
        """Whether the cache was closed."""
        return self._cache.closed

    def bound_get(self) -> Callable[[Key, Any], Any]:
        """The cache's own ``get``: for an unsigned cache, the engine's typed
        read itself, with no Python frame between the caller and the mapping."""
        return self._cache.get

    def get(self, key: Key, default: Any = None) -> Any:
        """Cache.get."""
        return self._cache.get(key, default)

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """Cache.get, then Cache.ttl."""
        value = self._cache.get(key, _MISS)
        if value is _MISS:
            return default, None
        left = self._cache.ttl(key)
        if left is None:
            return value, 0.001  # expired between the two calls
        return value, (None if math.isinf(left) else left)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """Cache.get_many."""
        return self._cache.get_many(keys)

    def contains(self, key: Key) -> bool:
        """``key in cache``."""
        return key in self._cache

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """Cache.set."""
        self._cache.set(key, value, ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Cache.add."""
        return self._cache.add(key, value, ttl)

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Cache.replace."""
        return self._cache.replace(key, value, ttl)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """Cache.set_many."""
        self._cache.set_many(mapping, ttl)

    def delete(self, key: Key) -> bool:
        """Cache.delete."""
        return self._cache.delete(key)

    def delete_many(self, keys: Iterable[Key]) -> int:
        """Cache.delete_many."""
        return self._cache.delete_many(keys)

    def delete_if_equals(self, key: Key, value: Any) -> bool:
        """The engine's atomic compare-and-delete for a ``bytes`` value of a
        cache that stores bytes raw (unsigned, uncompressed); otherwise the
        driver's read-then-delete."""
        cache = self._cache
        if type(value) is bytes and not cache.codec.signed and cache.codec.compressor is None:
            return cache.native.delete_if_equals(native_key(key), value)
        return super().delete_if_equals(key, value)

    def pop(self, key: Key, default: Any = None) -> Any:
        """Cache.pop (atomic)."""
        return self._cache.pop(key, default)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """Cache.touch."""
        return self._cache.touch(key, ttl)

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Cache.incr."""
        return self._cache.incr(key, delta, default)

    def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Cache.decr."""
        return self._cache.decr(key, delta, default)

    def clear(self) -> None:
        """Cache.clear (only the cache's prefix, if it has one)."""
        self._cache.clear()

    def keys(self) -> list[Key]:
        """Cache.keys (only the cache's prefix, if it has one)."""
        return self._cache.keys()

    def close(self) -> None:
        """Close the cache."""
        self._cache.close()
        super().close()

    def stats(self) -> dict[str, Any]:
        """The engine's counters (shared by every process using the file)."""
        stats: dict[str, Any] = dict(self._cache.stats())
        stats["driver"] = self.name
        return stats

    def __repr__(self) -> str:
        return f"<ShmDriver {self._cache!r}>"
