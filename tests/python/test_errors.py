"""The exception hierarchy (nearcache.errors) and "bad input loses no data"."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import nearcache
from nearcache import Cache, _native, errors

NATIVE = [
    "Error",
    "CacheClosedError",
    "ValueTooLargeError",
    "InvalidKeyError",
    "InvalidArgumentError",
    "ConfigurationError",
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


# -- errors as the guide states them ------------------------------------------------


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ({"shards": 3}, "power of two"),
        ({"size": 100}, "below the minimum"),
        ({"size": "nonsense"}, "cannot parse size"),
        ({"ttl": "x"}, "cannot parse duration"),
        ({"serializer": "nope"}, "unknown serializer"),
    ],
)
def test_invalid_options_raise_configuration_error(
    tmp_path: Path, options: dict[str, Any], words: str
) -> None:
    with pytest.raises(nearcache.ConfigurationError, match=words) as info:
        Cache(path=tmp_path / "c", **options)
    # Still the ValueError callers caught before.
    assert isinstance(info.value, ValueError)
    assert not (tmp_path / "c").exists()


def test_invalid_argument_error_is_a_configuration_error() -> None:
    assert issubclass(nearcache.InvalidArgumentError, nearcache.ConfigurationError)
    assert issubclass(nearcache.InvalidArgumentError, ValueError)


def test_memoize_with_a_malformed_ttl_fails_at_once(tmp_path: Path) -> None:
    from nearcache.memoize import memoize

    with Cache(path=tmp_path / "m", size="1MiB") as c:
        with pytest.raises(nearcache.ConfigurationError, match="cannot parse duration 'x'"):
            memoize(c, ttl="x")
        with pytest.raises(nearcache.ConfigurationError):
            c.memoize(ttl="x")


def test_create_false_on_a_missing_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "absent"
    with pytest.raises(nearcache.CacheNotFoundError) as info:
        Cache(path=path, create=False)
    message = str(info.value)
    assert f"no cache file at {path}" in message and "create=False" in message
    assert "entity not found" not in message
    assert isinstance(info.value, FileNotFoundError) and info.value.errno == 2
    assert not path.exists()


def test_too_large_value_without_spilling_names_spill_budget(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "s", size="1MiB", spill_budget=0) as c:
        c.set("k", b"kept")
        with pytest.raises(nearcache.ValueTooLargeError, match=r"spill_budget=0") as info:
            c.set("k", b"x" * (2 << 20))
        assert "spill_budget above 0" in str(info.value)
        assert c.get("k") == b"kept"


def test_huge_size_with_automatic_shards_does_not_say_use_more_shards(tmp_path: Path) -> None:
    with pytest.raises(nearcache.ConfigurationError) as info:
        Cache(path=tmp_path / "huge", size="100TiB")
    message = str(info.value)
    assert "use more shards" not in message
    assert "automatic shard count" in message and "shards set to a power of two" in message
    assert not (tmp_path / "huge").exists()
