"""The exception hierarchy (nearcache.errors) and "bad input loses no data"."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest

import nearcache
from nearcache import Cache, _native, errors

NATIVE = [
    "Error",
    "CacheClosedError",
    "ValueTooLargeError",
    "InvalidKeyError",
    "InvalidArgumentError",
    "CacheOSError",
    "IncompatibleFileError",
    "CorruptFileError",
    "PermissionDeniedError",
    "CacheFullError",
    "NotACounterError",
    "CounterOverflowError",
]

pytest_plugins = ["_cache_helpers"]


@pytest.mark.parametrize("name", NATIVE)
def test_native_exceptions_are_re_exported_unchanged(name: str) -> None:
    assert getattr(errors, name) is getattr(_native, name)
    assert getattr(nearcache, name) is getattr(_native, name)
    assert issubclass(getattr(errors, name), nearcache.Error)


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("ValueTooLargeError", ValueError),
        ("InvalidKeyError", ValueError),
        ("InvalidArgumentError", ValueError),
        ("CacheOSError", OSError),
        ("PermissionDeniedError", PermissionError),
        ("NotACounterError", TypeError),
        ("CounterOverflowError", OverflowError),
        ("KeyTypeError", TypeError),
        ("SerializationError", TypeError),
        ("ConfigurationError", ValueError),
        ("LockTimeoutError", TimeoutError),
        ("LockNotOwnedError", RuntimeError),
    ],
)
def test_builtin_bases(name: str, builtin: type[Exception]) -> None:
    cls = getattr(nearcache, name)
    assert issubclass(cls, nearcache.Error)
    assert issubclass(cls, builtin)


def test_lock_errors_share_a_base() -> None:
    assert issubclass(nearcache.LockTimeoutError, nearcache.LockError)
    assert issubclass(nearcache.LockNotOwnedError, nearcache.LockError)


def test_key_too_large_alias() -> None:
    assert nearcache.KeyTooLargeError is nearcache.InvalidKeyError


def test_every_public_exception_is_documented() -> None:
    documented = errors.__doc__ or ""
    for name in errors.__all__:
        if name != "KeyTooLargeError":
            assert name in documented, name


class _Unpicklable:
    def __reduce__(self) -> str:
        raise TypeError("not picklable")


def test_bad_input_never_drops_data(cache: Cache) -> None:
    cache.set_many({"s": "text", "n": 5, "o": [1]})
    snapshot = cache.get_many(["s", "n", "o"])
    attempts: list[Callable[[], object]] = [
        lambda: cache.set("s", _Unpicklable()),
        lambda: cache.set("s", b"x" * (cache.max_value_size + 1)),
        lambda: cache.set("s", "v", ttl=-1),
        lambda: cache.set("s", "v", ttl=math.nan),
        lambda: cache.set("s", "v", ttl=1, expire_at=2),
        lambda: cache.set(1.5, "v"),  # type: ignore[arg-type]
        lambda: cache.set("", "v"),
        lambda: cache.add("o", lambda: 0),
        lambda: cache.replace("o", b"x" * (cache.max_value_size + 1)),
        lambda: cache.incr("s"),
        lambda: cache.incr("n", 2**70),
        lambda: cache.incr("n", 1.0),  # type: ignore[arg-type]
        lambda: cache.set_many({"s": "new", "o": lambda: 0}),
        lambda: cache.touch("n", ttl=-1),
    ]
    for attempt in attempts:
        with pytest.raises((nearcache.Error, TypeError, ValueError, OverflowError)):
            attempt()
    assert cache.get_many(["s", "n", "o"]) == snapshot
    assert len(cache) == 3
