"""The driver protocol: one API over every store nearcache can talk to.

A *driver* is a key-value store with expiry: the shared-memory cache of this
host, a bounded dict in this process, Redis, memcached, or nothing at all.
Every driver implements :class:`Driver`, and every driver passes the same
contract suite (:mod:`nearcache.testing`), so an application can switch
stores by configuration.

Keys
----
A key is ``str``, ``bytes`` or ``int``, turned into bytes exactly as
:class:`nearcache.Cache` does (:mod:`nearcache.keys`): ``"a"`` and ``b"a"``
are the same key, ints live in their own namespace (``1`` and ``"1"`` are
different keys; ``True`` is the key ``1``).  Other types raise
:class:`~nearcache.errors.KeyTypeError` (a ``TypeError``); the empty key
raises :class:`~nearcache.errors.InvalidKeyError` (a ``ValueError``; also
known as ``KeyTooLargeError``).

Values
------
Any value.  ``bytes``, ``str``, ``int``, ``float``, ``bool`` and ``None`` come
back with their exact type; anything else goes through the driver's
serializer (pickle unless configured otherwise, see
:mod:`nearcache.serializers`).  Values are stored *by value*: mutating an
object after storing it, or after reading it, never changes what the cache
holds.

TTL: the one rule for every driver
----------------------------------
Every ``ttl`` argument follows :func:`nearcache.units.ttl_to_ms`, the rule of
:class:`nearcache.Cache`:

* ``None``: the driver's ``default_ttl`` (given when the driver is made;
  ``None`` or ``0`` there means entries never expire);
* ``0``: the entry never expires;
* a positive number of seconds (``float`` ok), a :class:`datetime.timedelta`
  or a duration string (``"250ms"``, ``"5m"``): the entry expires that long
  after the write, rounded to the nearest millisecond and never below 1 ms;
* negative, NaN or infinite: ``ValueError``; ``bool``: ``TypeError``.

A store may keep time more coarsely than a millisecond; its driver says so in
:attr:`Driver.ttl_resolution`, and in :attr:`Driver.counter_ttl_resolution`
for counters (``int`` values in the signed 64-bit range, which the store
itself may have to increment) when those are coarser still.  The guarantee
is the same everywhere: an entry is **never** dropped for expiry before its
TTL has elapsed, and it is gone at most ``ttl_resolution`` seconds after
that (``counter_ttl_resolution`` for a counter).  Every driver nearcache
ships keeps a millisecond for values; memcached, with a one-second clock,
keeps whole seconds for counters (sent as ``ceil(ttl) + 1`` seconds: gone
less than two seconds after their TTL).  A counter created by
:meth:`Driver.incr` gets the default TTL; ``incr``/``decr`` on an existing
entry keep its expiry.

Errors
------
The errors are the same for every driver:

* :class:`~nearcache.errors.KeyTypeError` and
  :class:`~nearcache.errors.InvalidKeyError` for bad keys (see above).
* :class:`~nearcache.errors.ValueTooLargeError` when a value is larger than
  the store accepts (:attr:`Driver.max_value_size`); the entry under that key
  is left as it was.
* :class:`~nearcache.errors.NotACounterError` (a ``TypeError``) for
  ``incr``/``decr`` on a value that is not an ``int``; ``KeyError`` for
  ``incr`` on a missing key with ``default=None``;
  :class:`~nearcache.errors.CounterOverflowError` (an ``OverflowError``) when
  the result leaves the signed 64-bit range (the entry is left as it was).
* :class:`~nearcache.errors.CacheClosedError` for any call after
  :meth:`Driver.close`.
* :class:`~nearcache.errors.SerializationError` (a ``TypeError``) when the
  serializer cannot encode a value; nothing is stored.
* :class:`BackendError` when a remote store cannot be reached or fails
  (refused connection, timeout, server error).  Every remote driver uses
  socket timeouts, so a dead server makes a call fail, never hang.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, ClassVar, TypeAlias, TypeVar

from nearcache import units
from nearcache.conveniences import PolicyMethods
from nearcache.errors import (
    BackendError,
    CacheClosedError,
    CounterOverflowError,
    Error,
    InvalidKeyError,
    KeyTypeError,
    NotACounterError,
    SerializationError,
    ValueTooLargeError,
)
from nearcache.keys import Key, check_key_collection, encode_key

__all__ = [
    "MAX_INT64",
    "MIN_INT64",
    "TTL",
    "BackendError",
    "CacheClosedError",
    "CounterOverflowError",
    "Driver",
    "EncodedKey",
    "Error",
    "InvalidKeyError",
    "Key",
    "KeyTypeError",
    "NotACounterError",
    "SerializationError",
    "ValueTooLargeError",
    "check_counter_args",
    "check_key_collection",
    "key_bytes",
    "ttl_to_ms",
]

TTL: TypeAlias = units.Duration | None
"""Time to live: ``None`` (driver default), ``0`` (never) or a duration > 0."""

MAX_INT64 = 2**63 - 1
MIN_INT64 = -(2**63)

_T = TypeVar("_T")
_DriverT = TypeVar("_DriverT", bound="Driver")


class EncodedKey(bytes):
    """A key already encoded by :func:`key_bytes`, handed down so that it is
    not encoded again.

    :func:`key_bytes` returns it as it is, so a driver whose keys all go
    through :func:`key_bytes` (:attr:`Driver.accepts_encoded_keys`) takes it
    in place of the key it encodes.  The tiered cache encodes each key once,
    at its door, and hands these to such tiers.  Anywhere else (a
    :class:`~nearcache.Cache`, the engine) it is an ordinary ``bytes`` key.
    Its ``repr`` is the original key's, so messages that name it (``incr``
    on a value that is not a counter) read as they would with the key.
    """

    #: The key these bytes encode.
    key: Key

    def __new__(cls, data: bytes, key: Key) -> EncodedKey:
        encoded = super().__new__(cls, data)
        encoded.key = key
        return encoded

    def __repr__(self) -> str:
        return repr(self.key)


def key_bytes(key: Key) -> bytes:
    """Return the bytes a driver stores ``key`` under (:func:`nearcache.keys.encode_key`).

    An :class:`EncodedKey` is returned as it is (it was encoded already).

    Raises:
        KeyTypeError: ``key`` is not ``str``, ``bytes`` or ``int``.
        InvalidKeyError: ``key`` is empty.
    """
    if key.__class__ is EncodedKey:
        return key
    data = encode_key(key)
    if not data:
        raise InvalidKeyError("the empty key is not a cache key")
    return data


def ttl_to_ms(ttl: TTL, default_ms: int) -> int:
    """Resolve ``ttl`` to whole milliseconds; ``0`` means "never expires".

    ``None`` gives ``default_ms``; everything else follows
    :func:`nearcache.units.ttl_to_ms`.
    """
    if ttl is None:
        return default_ms
    ms = units.ttl_to_ms(ttl)
    return 0 if ms is None else ms


def check_counter_args(delta: int, default: int | None) -> None:
    """Validate the ``delta`` and ``default`` of ``incr``/``decr``.

    Raises:
        TypeError: either is not an ``int`` (``bool`` is refused).
        CounterOverflowError: either is outside the signed 64-bit range.
    """
    if type(delta) is not int and (isinstance(delta, bool) or not isinstance(delta, int)):
        raise TypeError(f"delta must be an int, not {type(delta).__name__}")
    if not MIN_INT64 <= delta <= MAX_INT64:
        raise CounterOverflowError("delta is outside the signed 64-bit range")
    if default is not None:
        if isinstance(default, bool) or not isinstance(default, int):
            raise TypeError(f"default must be an int or None, not {type(default).__name__}")
        if not MIN_INT64 <= default <= MAX_INT64:
            raise CounterOverflowError("default is outside the signed 64-bit range")


class Driver(PolicyMethods, ABC):
    """A key-value store with expiry, behind nearcache's one API.

    Subclasses implement the abstract methods; the others have correct (if
    not always the fastest) defaults built on them.  Every driver is safe to
    share between threads.
    """

    #: Short name used in configuration URLs and stats.
    name: ClassVar[str] = "driver"
    #: Whether every key this driver takes goes through :func:`key_bytes`, so
    #: that it takes an :class:`EncodedKey` in place of a key (see there).
    accepts_encoded_keys: ClassVar[bool] = False

    #: Seconds: how much later than its TTL an entry may still be seen
    #: (counters: :attr:`counter_ttl_resolution`).
    ttl_resolution: float = 0.001

    #: Whether the driver keeps what it is given (``False`` for the null driver).
    stores: ClassVar[bool] = True

    #: Largest value (in bytes, as serialized) a ``set`` accepts, or ``None``
    #: when the store has no practical limit.
    max_value_size: int | None = None

    def __init__(self, *, default_ttl: TTL = None) -> None:
        """Set the default TTL (see the module documentation)."""
        self._default_ttl_ms = ttl_to_ms(default_ttl, 0)
        self._closed = False

    @property
    def default_ttl(self) -> float | None:
        """The default TTL in seconds, or ``None`` when entries never expire."""
        return self._default_ttl_ms / 1000 if self._default_ttl_ms else None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def counter_ttl_resolution(self) -> float:
        """Seconds: how much later than its TTL a counter (an ``int`` in the
        signed 64-bit range) may still be seen.

        :attr:`ttl_resolution` unless the driver says otherwise (memcached,
        whose counters keep its whole seconds: 2.0).
        """
        return self.ttl_resolution

    def _check_open(self) -> None:
        if self._closed:
            raise CacheClosedError(f"the {self.name} driver is closed")

    # -- reads -------------------------------------------------------------

    @abstractmethod
    def get(self, key: Key, default: Any = None) -> Any:
        """Return the value stored under ``key``, or ``default`` on a miss."""

    @abstractmethod
    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """Return ``(value, seconds left)``, or ``(default, None)`` on a miss.

        Seconds left is ``None`` for an entry that never expires.  A tiered
        cache uses it to never keep an L1 copy longer than the entry lives.
        """

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """Return ``{key: (value, seconds left)}`` for the keys that hit."""
        check_key_collection(keys)
        found: dict[Any, tuple[Any, float | None]] = {}
        for key in keys:
            value, left = self.get_with_ttl(key, _MISSING)
            if value is not _MISSING:
                found[key] = (value, left)
        return found

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """Return ``{key: value}`` for the keys that hit (misses are left out).

        The result is keyed by the keys as given.
        """
        check_key_collection(keys)
        found: dict[Any, Any] = {}
        for key in keys:
            value = self.get(key, _MISSING)
            if value is not _MISSING:
                found[key] = value
        return found

    def contains(self, key: Key) -> bool:
        """Whether ``key`` holds a live entry."""
        return self.get(key, _MISSING) is not _MISSING

    def __contains__(self, key: Key) -> bool:
        return self.contains(key)

    # -- writes ------------------------------------------------------------

    @abstractmethod
    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """Store ``value`` under ``key``, replacing any previous entry."""

    @abstractmethod
    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Store ``value`` only if ``key`` is missing; return whether it was stored."""

    @abstractmethod
    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """Store ``value`` only if ``key`` exists; return whether it was stored."""

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """Store every item of ``mapping`` with the same ``ttl``."""
        for key, value in mapping.items():
            self.set(key, value, ttl)

    @abstractmethod
    def delete(self, key: Key) -> bool:
        """Remove ``key``; return whether it held a live entry."""

    def delete_many(self, keys: Iterable[Key]) -> int:
        """Remove every key; return how many held a live entry."""
        check_key_collection(keys)
        return sum(1 for key in keys if self.delete(key))

    def delete_if_equals(self, key: Key, value: Any) -> bool:
        """Remove ``key`` only if it holds ``value``; return whether it did.

        :class:`nearcache.Lock` releases with it.  This default reads, then
        deletes: not atomic (an entry replaced between the two is deleted).
        A driver whose store can compare and delete in one step overrides it
        (:class:`~nearcache.drivers.RedisDriver` does, with a script).
        """
        if self.get(key, _MISSING) != value:
            return False
        return self.delete(key)

    def pop(self, key: Key, default: Any = None) -> Any:
        """Remove ``key`` and return its value, or ``default`` on a miss."""
        value = self.get(key, _MISSING)
        if value is _MISSING:
            return default
        self.delete(key)
        return value

    @abstractmethod
    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """Give ``key`` a new TTL; return whether it held a live entry."""

    @abstractmethod
    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Atomically add ``delta`` to the integer under ``key``; return the result.

        A missing key is created as ``default + delta`` (with the default
        TTL), or raises ``KeyError`` when ``default`` is ``None``.
        """

    def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Atomically subtract ``delta``; the mirror of :meth:`incr`."""
        check_counter_args(delta, default)
        return self.incr(key, -delta, default)

    def get_or_set(self, key: Key, factory: Callable[[], _T], ttl: TTL = None) -> _T | Any:
        """Return the value under ``key``; on a miss store ``factory()`` and return it.

        Not a lock: two callers that miss at once may both call ``factory``
        (the last write wins).  ``add`` is used, so a value written meanwhile
        by someone else is kept and returned.
        """
        value = self.get(key, _MISSING)
        if value is not _MISSING:
            return value
        value = factory()
        if self.add(key, value, ttl):
            return value
        current = self.get(key, _MISSING)
        return value if current is _MISSING else current

    @abstractmethod
    def clear(self) -> None:
        """Remove every entry this driver owns (see each driver for its scope)."""

    def keys(self) -> list[Key]:
        """A snapshot of the live keys this driver owns (decoded as
        :func:`nearcache.keys.decode_key` does).

        Raises:
            NotImplementedError: the store cannot list its keys (memcached).
        """
        raise NotImplementedError(f"the {self.name} driver cannot list its keys")

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Release connections and mappings; later calls raise CacheClosedError."""
        self._closed = True

    def stats(self) -> dict[str, Any]:
        """Counters and settings describing the store (driver-specific keys)."""
        return {"driver": self.name}

    def bound_get(self) -> Callable[[Key, Any], Any]:
        """The fastest callable with the signature and result of :meth:`get`.

        :class:`~nearcache.tiered.TieredCache` calls it on its hot path; a
        driver whose ``get`` only forwards to another object returns that
        object's bound method here.
        """
        return self.get

    def __enter__(self: _DriverT) -> _DriverT:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " closed" if self._closed else ""
        return f"<{type(self).__name__}{state}>"


class _Missing:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<missing>"


_MISSING: Any = _Missing()
"""Sentinel for "no entry" inside drivers (never returned to callers)."""
