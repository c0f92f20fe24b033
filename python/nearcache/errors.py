"""The exceptions nearcache raises: one small hierarchy under :class:`Error`.

Every class also derives from the built-in exception a caller would expect
(``ValueError``, ``TypeError``, ``PermissionError``, ``TimeoutError``...), so
code written for those keeps working::

    Error
    ├── CacheClosedError          the cache was closed
    ├── ValueTooLargeError        (ValueError) the entry cannot fit; nothing changed
    ├── InvalidKeyError           (ValueError) empty key, or longer than MAX_KEY_LEN
    ├── KeyTypeError              (TypeError) a key that is not str, bytes or int
    ├── NotACounterError          (TypeError) incr/decr on a non-integer entry
    ├── CounterOverflowError      (OverflowError) incr/decr past 64 bits; value kept
    ├── SerializationError        (TypeError) the serializer cannot encode the value
    ├── ConfigurationError        (ValueError) an invalid option (Cache(), memoize...)
    │   └── InvalidArgumentError  an engine argument out of range (size, shards...)
    ├── IncompatibleFileError     the file exists with other size/shards/layout
    ├── CorruptFileError          the file fails its consistency checks
    ├── PermissionDeniedError     (PermissionError) foreign owner, symlink, bad mode
    ├── CacheFullError            the file system has no room for the cache file
    ├── CacheOSError              (OSError) a system call on the cache file failed
    │   └── CacheNotFoundError    (FileNotFoundError) no cache file (create=False)
    ├── ShardLockTimeoutError     (TimeoutError) a write waited too long for a shard lock
    ├── UpdateConflictError       (RuntimeError) an update lost to other writers too often
    ├── BackendError              a remote store (Redis, memcached) failed or timed out
    └── LockError                 base of the lock helper's errors
        ├── LockTimeoutError      (TimeoutError) the lock was not acquired in time
        └── LockNotOwnedError     (RuntimeError) releasing a lock this holder lost

The engine's exceptions are defined by the native module and re-exported
here unchanged; the others belong to the Python layer.  ``KeyTooLargeError``
is another name for :class:`InvalidKeyError`.  A failed operation
never corrupts or drops existing data: a value that cannot be serialized or
is too large leaves the previous value for that key in place.

>>> import nearcache
>>> issubclass(nearcache.ValueTooLargeError, (nearcache.Error, ValueError))
True
>>> issubclass(nearcache.InvalidArgumentError, nearcache.ConfigurationError)
True
>>> try:
...     raise LockTimeoutError("busy")
... except TimeoutError as exc:
...     print(type(exc).__name__, isinstance(exc, Error))
LockTimeoutError True
"""

from __future__ import annotations

from nearcache._native import (
    CacheClosedError,
    CacheFullError,
    CacheNotFoundError,
    CacheOSError,
    ConfigurationError,
    CorruptFileError,
    CounterOverflowError,
    Error,
    IncompatibleFileError,
    InvalidArgumentError,
    InvalidKeyError,
    KeyTypeError,
    NotACounterError,
    PermissionDeniedError,
    ShardLockTimeoutError,
    UpdateConflictError,
    ValueTooLargeError,
)

__all__ = [
    "BackendError",
    "CacheClosedError",
    "CacheFullError",
    "CacheNotFoundError",
    "CacheOSError",
    "ConfigurationError",
    "CorruptFileError",
    "CounterOverflowError",
    "Error",
    "IncompatibleFileError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "KeyTooLargeError",
    "KeyTypeError",
    "LockError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "NotACounterError",
    "PermissionDeniedError",
    "SerializationError",
    "ShardLockTimeoutError",
    "UpdateConflictError",
    "ValueTooLargeError",
]

#: Another name for :class:`InvalidKeyError` (empty or over-long keys).
KeyTooLargeError = InvalidKeyError


class BackendError(Error):
    """A remote store failed: unreachable, timed out, or returned an error.

    The original exception is chained as ``__cause__``.
    """


class SerializationError(Error, TypeError):
    """The configured serializer could not encode a value.

    The cache is left unchanged: the previous value of the key, if any, stays.
    The original exception is chained as ``__cause__``.
    """


class LockError(Error):
    """Base class of the errors raised by :class:`nearcache.Lock`."""


class LockTimeoutError(LockError, TimeoutError):
    """The lock could not be acquired within the requested timeout."""


class LockNotOwnedError(LockError, RuntimeError):
    """Release or extend of a lock this holder does not hold (never acquired,
    already released, or expired and taken by someone else)."""
