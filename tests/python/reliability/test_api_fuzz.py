"""Hypothesis fuzzing of the public API: random types, sizes, unicode, huge
keys, NaN and negative TTLs, negative sizes.  Only documented exceptions may
come out, a successful write reads back exactly, and the file always passes
its consistency check.

Documented exceptions of the native API (``_native.pyi``): the
``nearcache.Error`` hierarchy, ``TypeError`` for arguments of the wrong type,
``OverflowError`` for integers outside the range of their C type, ``KeyError``
from ``incr(initial=None)`` on a missing key, and ``UnicodeEncodeError`` for
a ``str`` key that has no UTF-8 form (a lone surrogate).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nearcache
from nearcache import _native
from nearcache._native import NativeCache

FUZZ = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

MAX_KEY = _native.MAX_KEY_LEN

ints = st.one_of(
    st.integers(-5, 5),
    st.integers(-(2**64), 2**64),
    st.sampled_from([2**31, 2**32, 2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 2**100]),
)
floats = st.floats(allow_nan=True, allow_infinity=True)
odd_text = st.one_of(
    st.text(),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=50),
    st.sampled_from(["\ud800", "a\udfffb", "\x00", "é" * 40000, "🙂" * 20000]),
)
keys = st.one_of(
    st.binary(max_size=40),
    odd_text,
    st.integers(-3, 3),
    floats,
    st.none(),
    st.lists(st.integers(), max_size=2),
    st.binary(min_size=MAX_KEY - 2, max_size=MAX_KEY + 2),
    st.just(bytearray(b"ba")),
    st.just(memoryview(b"mv")),
)
values = st.one_of(
    st.binary(max_size=3000),
    st.binary(min_size=20000, max_size=300_000),
    st.just(bytearray(b"x" * 100)),
    odd_text,
    ints,
    floats,
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=3),
    st.just(object()),
)
ttls = st.one_of(st.none(), ints, floats, st.just("10"), st.just(datetime.timedelta(1)))
flags = st.one_of(st.integers(0, 64), ints, st.none())


NATIVE_OPS = (
    *("get", "get_entry", "set", "add", "replace", "pop", "get_typed", "set_typed"),
    *("add_typed", "pop_typed", "delete", "touch", "ttl_ms", "expire_at_ms", "incr"),
    *("contains", "get_many", "get_many_typed", "set_many", "delete_many", "shard_of"),
)
CACHE_OPS = (
    *("get", "set", "add", "replace", "delete", "pop", "touch", "incr", "decr"),
    *("get_many", "set_many", "delete_many", "contains", "getitem"),
)


def documented(exc: BaseException, op: str, args: tuple[Any, ...]) -> bool:
    if isinstance(exc, nearcache.Error | TypeError | OverflowError | UnicodeEncodeError):
        return True
    if isinstance(exc, KeyError):
        return op == "incr" and len(args) > 2 and args[2] is None
    return False


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NativeCache]:
    path = tmp_path_factory.mktemp("fuzz") / "c"
    cache = NativeCache(str(path), 4096 + 4 * 256 * 1024, 4)
    yield cache
    del cache


def call(cache: NativeCache, op: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
    try:
        return True, getattr(cache, op)(*args)
    except BaseException as exc:
        assert documented(exc, op, args), f"{op}{args!r:.300} raised {exc!r:.300}"
        return False, exc


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a):
        return math.isnan(b)
    return type(a) is type(b) and a == b


@FUZZ
@given(data=st.data())
def test_native_operations_raise_only_documented_errors(
    shared: NativeCache, data: st.DataObject
) -> None:
    cache = shared
    op = data.draw(st.sampled_from(NATIVE_OPS))
    key = data.draw(keys)
    args: tuple[Any, ...]
    if op in ("set", "add", "replace"):
        args = (key, data.draw(values), data.draw(ttls), data.draw(flags))
    elif op in ("set_typed", "add_typed"):
        args = (key, data.draw(values), data.draw(ttls))
    elif op == "touch":
        args = (key, data.draw(ttls))
    elif op == "incr":
        args = (key, data.draw(ints), data.draw(st.one_of(st.none(), ints)), data.draw(ttls))
    elif op in ("get_many", "get_many_typed", "delete_many"):
        args = (data.draw(st.one_of(st.lists(keys, max_size=5), keys)),)
    elif op == "set_many":
        item = st.tuples(keys, values, flags)
        args = (data.draw(st.one_of(st.lists(item, max_size=4), st.lists(keys))), data.draw(ttls))
    else:
        args = (key,)
    ok, result = call(cache, op, args)

    # A write that succeeded reads back exactly (no TTL: it cannot expire).
    if ok and op == "set" and args[2] in (None, 0):
        assert cache.get_entry(key) == (bytes(args[1]), args[3] or 0)
    if ok and op == "set_typed" and args[2] in (None, 0):
        expected = args[1]
        assert same(cache.get_typed(key, _native.MISSING), expected)
    if ok and op == "incr":
        assert isinstance(result, int) and -(2**63) <= result < 2**63
    cache.check()


@FUZZ
@given(
    size=st.one_of(ints.filter(lambda n: n <= 64 << 20 or n >= 2**50), st.integers(0, 1 << 20)),
    shards=ints,
    ttl=ints,
    prefix=st.one_of(st.binary(max_size=20), st.just(b"p" * (MAX_KEY + 1)), odd_text),
    create=st.booleans(),
)
def test_native_constructor_raises_only_documented_errors(
    tmp_path: Path, size: int, shards: int, ttl: int, prefix: Any, create: bool
) -> None:
    path = tmp_path / f"c{abs(hash((size, shards, ttl, create))) % 10**9}"
    try:
        cache = NativeCache(
            str(path), size, shards, default_ttl_ms=ttl, prefix=prefix, create=create
        )
    except (nearcache.Error, TypeError, OverflowError) as exc:
        assert not isinstance(exc, nearcache.CorruptFileError), exc
        return
    assert size >= 0 and ttl >= 0 and cache.capacity <= max(size, 64 << 20)
    if len(cache.prefix) >= MAX_KEY:  # no room left for any key
        with pytest.raises(nearcache.InvalidKeyError):
            cache.set_typed("k", 1)
    else:
        cache.set_typed("k", 1)
        assert cache.get_typed("k") == 1
    cache.check()


def test_negative_default_ttl_raises_invalid_argument(tmp_path: Path) -> None:
    with pytest.raises(nearcache.InvalidArgumentError):
        NativeCache(str(tmp_path / "d"), 1 << 20, default_ttl_ms=-1)


@pytest.mark.parametrize("op", ["set", "add", "replace", "set_typed", "touch", "incr"])
def test_negative_call_ttl_raises_invalid_argument(tmp_path: Path, op: str) -> None:
    """Regression: a negative per-call TTL raised a plain ValueError instead
    of the documented InvalidArgumentError (a ValueError subclass)."""
    cache = NativeCache(str(tmp_path / "c"), 1 << 20)
    call = {
        "set": lambda: cache.set("k", b"v", -1),
        "add": lambda: cache.add("k", b"v", -1),
        "replace": lambda: cache.replace("k", b"v", -1),
        "set_typed": lambda: cache.set_typed("k", 1, -1),
        "touch": lambda: cache.touch("k", -1),
        "incr": lambda: cache.incr("k", 1, 0, -1),
    }[op]
    with pytest.raises(ValueError) as raised:
        call()
    assert isinstance(raised.value, nearcache.InvalidArgumentError), repr(raised.value)


# ------------------------------------------------------------------ Python layer


@pytest.fixture(scope="module")
def py_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[nearcache.Cache]:
    cache = nearcache.Cache(path=tmp_path_factory.mktemp("pyfuzz") / "c", size="4MiB")
    yield cache


py_keys = st.one_of(keys, st.tuples(st.integers()), st.integers(-(2**70), 2**70))
py_values = st.one_of(
    values,
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
    st.just(lambda: None),  # cannot be pickled
    st.just({1, 2}),
    st.just(datetime.date(2026, 1, 1)),
)
py_ttls = st.one_of(ttls, st.just(-1.5), st.just(float("nan")), st.just(True), st.just("1h"))


@FUZZ
@given(data=st.data())
def test_cache_operations_raise_only_documented_errors(
    py_cache: nearcache.Cache, data: st.DataObject
) -> None:
    op = data.draw(st.sampled_from(CACHE_OPS))
    key = data.draw(py_keys)
    value = data.draw(py_values)
    ttl = data.draw(py_ttls)
    try:
        if op in ("set", "add", "replace"):
            getattr(py_cache, op)(key, value, ttl=ttl)
            if op == "set" and ttl in (None, 0):
                missing = object()
                got = py_cache.get(key, missing)
                assert got is not missing  # just written, no TTL: cannot be gone
                # A bare object() compares by identity: a pickled copy is
                # the same kind of object, never the same object.
                copied = type(value) is object and type(got) is object
                assert same(got, value) or got == value or copied
        elif op == "touch":
            py_cache.touch(key, ttl=ttl)
        elif op in ("incr", "decr"):
            getattr(py_cache, op)(key, data.draw(ints))
        elif op == "get_many":
            py_cache.get_many([key, value])
        elif op == "set_many":
            py_cache.set_many({key: value}, ttl=ttl)
        elif op == "delete_many":
            py_cache.delete_many([key])
        elif op == "contains":
            _ = key in py_cache
        elif op == "getitem":
            _ = py_cache[key]
        else:
            getattr(py_cache, op)(key)
    except KeyError:
        assert op == "getitem"
    except (nearcache.Error, TypeError, ValueError, OverflowError):
        pass
    py_cache.check()
