"""A driver that stores nothing, for turning caching off by configuration.

It behaves exactly like a cache in which every entry expires the instant it
is written: every read misses, ``add`` succeeds (the key was missing),
``replace``, ``delete`` and ``touch`` find nothing, and ``incr`` returns
``default + delta`` (or raises ``KeyError`` when ``default`` is ``None``).
Arguments are still checked, so code that works against the null driver
does not break when a real store is configured.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, ClassVar

from nearcache.drivers.base import (
    MAX_INT64,
    MIN_INT64,
    TTL,
    CounterOverflowError,
    Driver,
    Key,
    check_counter_args,
    check_key_collection,
    key_bytes,
    ttl_to_ms,
)

__all__ = ["NullDriver"]


class NullDriver(Driver):
    """Every write is accepted and forgotten; every read misses."""

    name: ClassVar[str] = "null"
    accepts_encoded_keys: ClassVar[bool] = True
    stores: ClassVar[bool] = False

    def get(self, key: Key, default: Any = None) -> Any:
        """Return ``default``."""
        key_bytes(key)
        self._check_open()
        return default

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """Return ``(default, None)``."""
        key_bytes(key)
        self._check_open()
        return default, None

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """Return ``{}``."""
        check_key_collection(keys)
        for key in keys:
            key_bytes(key)
        self._check_open()
        return {}

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """Forget ``value``."""
        self._accept(key, ttl)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """Forget every item."""
        for key in mapping:
            self._accept(key, ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Return ``True``: the key was missing, so the add "succeeded"."""
        self._accept(key, ttl)
        return True

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Return ``False``: there is nothing to replace."""
        self._accept(key, ttl)
        return False

    def delete(self, key: Key) -> bool:
        """Return ``False``."""
        self._accept(key, None)
        return False

    def delete_many(self, keys: Iterable[Key]) -> int:
        """Return ``0``."""
        check_key_collection(keys)
        for key in keys:
            self._accept(key, None)
        return 0

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """Return ``False``."""
        self._accept(key, ttl)
        return False

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Return ``default + delta`` as if a new counter had been made."""
        check_counter_args(delta, default)
        self._accept(key, None)
        if default is None:
            raise KeyError(key)
        result = default + delta
        if not MIN_INT64 <= result <= MAX_INT64:
            raise CounterOverflowError("counter would leave the signed 64-bit range")
        return result

    def clear(self) -> None:
        """Nothing to remove."""
        self._check_open()

    def keys(self) -> list[Key]:
        """Return ``[]``."""
        self._check_open()
        return []

    def _accept(self, key: Key, ttl: TTL) -> None:
        key_bytes(key)
        ttl_to_ms(ttl, self._default_ttl_ms)
        self._check_open()
