"""An in-process cache: a bounded, thread-safe LRU dictionary.

Useful as the L1 of a tiered cache when the shared-memory engine is not
wanted (one process per host, or tests), and as a reference implementation
of the driver protocol.

Bounds: at most ``max_entries`` entries and about ``max_bytes`` bytes (the
sum over entries of the key length plus the value's size: its length for
``bytes``/``str``, its serialized length for other objects, 8 for numbers).
When a write would exceed a bound, least recently used entries are evicted
first; expired entries are dropped when they are met.

Values are stored by value, like every driver: ``bytes``, ``str``, ``int``
(64-bit: the counters), ``float``, ``bool`` and ``None`` are immutable and
kept as they are; other objects are serialized on ``set`` and rebuilt on
each ``get``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from typing import Any, ClassVar, NamedTuple

from nearcache.drivers.base import (
    MAX_INT64,
    MIN_INT64,
    TTL,
    CounterOverflowError,
    Driver,
    Key,
    NotACounterError,
    ValueTooLargeError,
    check_counter_args,
    check_key_collection,
    key_bytes,
    ttl_to_ms,
)
from nearcache.keys import decode_key
from nearcache.serializers import Serializer, ValueCodec

__all__ = ["MemoryDriver"]

_IMMUTABLE = frozenset({bytes, str, int, float, bool, type(None)})
_NUMBER_SIZE = 8


class _Entry(NamedTuple):
    value: Any  # the value itself, or its encoded payload when flags >= 0
    deadline: float  # time.monotonic() after which it is expired; 0.0 = never
    size: int
    flags: int  # -1: the value itself; else the ValueCodec flags of the payload


class MemoryDriver(Driver):
    """A bounded LRU dictionary in this process, shared by its threads."""

    name: ClassVar[str] = "memory"
    accepts_encoded_keys: ClassVar[bool] = True

    def __init__(
        self,
        *,
        max_entries: int | None = 100_000,
        max_bytes: int | None = 64 * 1024 * 1024,
        max_value_size: int | None = None,
        default_ttl: TTL = None,
        serializer: str | Serializer = "pickle",
    ) -> None:
        """Make an empty cache.

        Args:
            max_entries: most entries kept (``None``: no limit on the count).
            max_bytes: approximate byte budget (``None``: no limit).
            max_value_size: largest value accepted; defaults to ``max_bytes``.
            default_ttl: TTL used when a call passes ``ttl=None``.
            serializer: for values that are not bytes/str/int/float/bool/None.
        """
        super().__init__(default_ttl=default_ttl)
        if max_entries is not None and max_entries < 1:
            raise ValueError("max_entries must be at least 1")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError("max_bytes must be at least 1")
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_value_size = max_value_size if max_value_size is not None else max_bytes
        self._codec = ValueCodec(serializer)
        self._data: OrderedDict[bytes, _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = 0
        self._hits = 0
        self._misses = 0
        self._evictions = 0
        self._expirations = 0

    # -- helpers (call with the lock held unless noted) --------------------

    def _make_entry(self, key: bytes, value: Any, ttl: TTL) -> _Entry:
        """Build an entry (no lock needed); raises before anything changes."""
        ttl_ms = ttl_to_ms(ttl, self._default_ttl_ms)
        kind = type(value)
        if kind in _IMMUTABLE and (kind is not int or MIN_INT64 <= value <= MAX_INT64):
            stored, flags = value, -1
            size = len(value) if kind is bytes or kind is str else _NUMBER_SIZE
        else:
            flags, stored = self._codec.encode(value, b"")
            size = len(stored)
        if self.max_value_size is not None and size > self.max_value_size:
            raise ValueTooLargeError(
                f"value of {size} bytes exceeds max_value_size={self.max_value_size}"
            )
        deadline = time.monotonic() + ttl_ms / 1000 if ttl_ms else 0.0
        return _Entry(stored, deadline, len(key) + size, flags)

    def _live(self, key: bytes) -> _Entry | None:
        entry = self._data.get(key)
        if entry is None:
            return None
        if entry.deadline and entry.deadline <= time.monotonic():
            del self._data[key]
            self._bytes -= entry.size
            self._expirations += 1
            return None
        return entry

    def _store(self, key: bytes, entry: _Entry) -> None:
        old = self._data.pop(key, None)
        if old is not None:
            self._bytes -= old.size
        self._data[key] = entry
        self._bytes += entry.size
        data = self._data
        while len(data) > 1 and (
            (self.max_entries is not None and len(data) > self.max_entries)
            or (self.max_bytes is not None and self._bytes > self.max_bytes)
        ):
            _, evicted = data.popitem(last=False)
            self._bytes -= evicted.size
            self._evictions += 1

    def _value(self, entry: _Entry) -> Any:
        if entry.flags < 0:
            return entry.value
        return self._codec.decode(entry.flags, entry.value, b"")

    # -- the protocol ------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """Return the value under ``key`` (marking it recently used) or ``default``."""
        k = key.encode() if type(key) is str and key else key_bytes(key)
        with self._lock:
            if self._closed:
                self._check_open()
            entry = self._data.get(k)
            if entry is not None and entry.deadline and entry.deadline <= time.monotonic():
                entry = self._live(k)  # drops it and counts the expiration
            if entry is None:
                self._misses += 1
                return default
            self._data.move_to_end(k)
            self._hits += 1
        if entry.flags < 0:
            return entry.value
        return self._codec.decode(entry.flags, entry.value, b"")

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """Value and seconds left (None: never expires), or ``(default, None)``."""
        k = key_bytes(key)
        with self._lock:
            self._check_open()
            entry = self._live(k)
            if entry is None:
                self._misses += 1
                return default, None
            self._data.move_to_end(k)
            self._hits += 1
        left = max(entry.deadline - time.monotonic(), 0.001) if entry.deadline else None
        return self._value(entry), left

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """Return the hits among ``keys``, taking the lock once."""
        check_key_collection(keys)
        pairs = [(key, key_bytes(key)) for key in keys]
        found: list[tuple[Any, _Entry]] = []
        with self._lock:
            self._check_open()
            for key, k in pairs:
                entry = self._live(k)
                if entry is None:
                    self._misses += 1
                else:
                    self._data.move_to_end(k)
                    self._hits += 1
                    found.append((key, entry))
        return {key: self._value(entry) for key, entry in found}

    def contains(self, key: Key) -> bool:
        """Whether ``key`` holds a live entry (does not count as a use)."""
        k = key_bytes(key)
        with self._lock:
            self._check_open()
            return self._live(k) is not None

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """Store ``value`` under ``key``."""
        k = key_bytes(key)
        entry = self._make_entry(k, value, ttl)
        with self._lock:
            self._check_open()
            self._store(k, entry)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """Store every item; nothing is stored if any value is refused."""
        entries = [(k, self._make_entry(k, v, ttl)) for k, v in _keyed(mapping)]
        with self._lock:
            self._check_open()
            for k, entry in entries:
                self._store(k, entry)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Store ``value`` only if ``key`` is missing."""
        k = key_bytes(key)
        entry = self._make_entry(k, value, ttl)
        with self._lock:
            self._check_open()
            if self._live(k) is not None:
                return False
            self._store(k, entry)
            return True

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Store ``value`` only if ``key`` exists."""
        k = key_bytes(key)
        entry = self._make_entry(k, value, ttl)
        with self._lock:
            self._check_open()
            if self._live(k) is None:
                return False
            self._store(k, entry)
            return True

    def delete(self, key: Key) -> bool:
        """Remove ``key``."""
        k = key_bytes(key)
        with self._lock:
            self._check_open()
            live = self._live(k) is not None
            if live:
                self._bytes -= self._data.pop(k).size
            return live

    def delete_many(self, keys: Iterable[Key]) -> int:
        """Remove every key, taking the lock once."""
        check_key_collection(keys)
        ks = [key_bytes(key) for key in keys]
        count = 0
        with self._lock:
            self._check_open()
            for k in ks:
                if self._live(k) is not None:
                    self._bytes -= self._data.pop(k).size
                    count += 1
        return count

    def pop(self, key: Key, default: Any = None) -> Any:
        """Remove ``key`` and return its value, atomically."""
        k = key_bytes(key)
        with self._lock:
            self._check_open()
            entry = self._live(k)
            if entry is None:
                return default
            del self._data[k]
            self._bytes -= entry.size
        return self._value(entry)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """Give ``key`` a new TTL."""
        k = key_bytes(key)
        ttl_ms = ttl_to_ms(ttl, self._default_ttl_ms)
        with self._lock:
            self._check_open()
            entry = self._live(k)
            if entry is None:
                return False
            deadline = time.monotonic() + ttl_ms / 1000 if ttl_ms else 0.0
            self._data[k] = entry._replace(deadline=deadline)
            return True

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Atomically add ``delta`` to the counter under ``key``."""
        check_counter_args(delta, default)
        k = key_bytes(key)
        with self._lock:
            self._check_open()
            entry = self._live(k)
            if entry is None:
                if default is None:
                    raise KeyError(key)
                result = default + delta
                if not MIN_INT64 <= result <= MAX_INT64:
                    raise CounterOverflowError("counter would leave the signed 64-bit range")
                self._store(k, self._make_entry(k, result, None))
                return result
            if entry.flags >= 0 or type(entry.value) is not int:
                raise NotACounterError(f"the value under {key!r} is not an integer")
            result = entry.value + delta
            if not MIN_INT64 <= result <= MAX_INT64:
                raise CounterOverflowError("counter would leave the signed 64-bit range")
            self._data[k] = entry._replace(value=result)
            return result

    def clear(self) -> None:
        """Remove every entry."""
        with self._lock:
            self._check_open()
            self._data.clear()
            self._bytes = 0

    def keys(self) -> list[Key]:
        """A snapshot of the live keys, oldest use first."""
        with self._lock:
            self._check_open()
            now = time.monotonic()
            raw = [k for k, e in self._data.items() if not e.deadline or e.deadline > now]
        return [decode_key(k) for k in raw]

    def close(self) -> None:
        """Drop every entry; later calls raise CacheClosedError."""
        with self._lock:
            self._data.clear()
            self._bytes = 0
            super().close()

    def __len__(self) -> int:
        """Number of entries held (expired ones not yet dropped included)."""
        return len(self._data)

    def stats(self) -> dict[str, Any]:
        """Hits, misses, evictions, expirations, entries and bytes held."""
        with self._lock:
            return {
                "driver": self.name,
                "hits": self._hits,
                "misses": self._misses,
                "evictions": self._evictions,
                "expirations": self._expirations,
                "entries": len(self._data),
                "bytes": self._bytes,
                "max_entries": self.max_entries,
                "max_bytes": self.max_bytes,
            }


def _keyed(mapping: Mapping[Key, Any]) -> Iterable[tuple[bytes, Any]]:
    for key, value in mapping.items():
        yield key_bytes(key), value
