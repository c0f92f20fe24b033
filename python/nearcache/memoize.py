"""``@cache.memoize()``: cache a function's results, with stampede protection.

Keys
====

A call's cache key is ``nearcache.memoize:<name>:<digest>`` where ``name`` is
the function's ``module.qualname`` (or the ``name=`` given) and ``digest`` a
BLAKE2b-128 hash of the call's arguments, bound to the signature first, so
``f(1, 2)``, ``f(1, b=2)`` and ``f(a=1)`` with ``b=2`` as default are the
same call.  Arguments are encoded canonically by :func:`canonical_bytes`,
never by plain pickle (whose output depends on dict/set order and hash
seeds):

* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, and tuples,
  lists, dicts (order-insensitive), sets and frozensets of them, are
  encoded by type and value (``1``, ``1.0``, ``True`` and ``"1"`` are four
  different keys);
* enums, classes, subclasses of the built-in types (named tuples, ...),
  ``datetime``/``date``/``time``/``timedelta``, ``Decimal``, ``Fraction``,
  ``UUID``, paths and dataclass instances are encoded by type name and
  value;
* an object with a ``__cache_key__()`` method is encoded by its type name and
  what that method returns (use it for your own classes, ``self`` included);
* anything else falls back to its pickle (protocol 4): deterministic for
  plain objects, but not for objects holding sets of strings, for instance.
  Give such functions ``key=`` (a function of the same arguments returning
  an encodable value) or ``ignore=`` (argument names left out of the key).

Stampedes
=========

When an entry is missing, one caller (across all processes) computes it
while the others wait, polling the cache, for its result.  The mutex is a
cache entry created with the atomic ``add``, with a TTL of ``lock_ttl``
seconds, so a caller that dies while computing delays the others by at most
that long.  Two options avoid waiting altogether:

* ``stale_ttl``: an entry stays in the cache that much longer than ``ttl``;
  once past ``ttl`` one caller recomputes it while the others immediately
  get the stale value.
* ``beta`` (XFetch, Vattani et al., VLDB 2015): each caller may decide to
  recompute *before* expiry, with a probability that grows as expiry nears
  and with the time the computation took (``delta``): it recomputes when
  ``now - delta * beta * ln(rand()) >= expiry``.  ``beta=1.0`` is the
  paper's recommendation; ``0`` (default) disables it.  Others keep getting
  the current value meanwhile.

Entries store ``(value, delta, logical expiry)`` through the cache's
serializer; results are not cached when the function raises.

>>> from nearcache import Cache
>>> cache = Cache("memo-demo", size="1MiB")
>>> calls = []
>>> @cache.memoize(ttl=60)
... def total(a, b=2):
...     calls.append((a, b))
...     return a + b
>>> total(1), total(1, 2), total(a=1, b=2), calls
(3, 3, 3, [(1, 2)])
>>> total.cache_key(1) == total.cache_key(a=1, b=2)
True
>>> total.invalidate(1), total(1), len(calls)
(True, 3, 2)
>>> cache.clear()
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import decimal
import enum
import fractions
import functools
import hashlib
import inspect
import logging
import math
import pathlib
import pickle
import random
import time
import uuid
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

from nearcache.errors import ConfigurationError, ValueTooLargeError
from nearcache.locks import Lock
from nearcache.units import Duration, parse_duration, ttl_to_ms

if TYPE_CHECKING:
    from nearcache.cache import Cache

__all__ = [
    "MEMOIZE_NAMESPACE",
    "MemoizeDecorator",
    "Memoized",
    "canonical_bytes",
    "memoize",
]

logger = logging.getLogger("nearcache.memoize")

#: Prefix of every memoized entry's key.
MEMOIZE_NAMESPACE: Final = "nearcache.memoize:"

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

_EMPTY: Final = inspect.Parameter.empty
_MISS: Final = object()
_FIRST_DELAY: Final = 0.002
_MAX_DELAY: Final = 0.05

# --------------------------------------------------------------- canonical keys

_REPR_TYPES: Final = (
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    datetime.timezone,
    decimal.Decimal,
    fractions.Fraction,
    uuid.UUID,
    complex,
    pathlib.PurePath,
    range,
    slice,
)

_BUILTIN_BASES: Final[tuple[Any, ...]] = (int, float, str, bytes, tuple, list, dict, frozenset, set)


def _type_name(cls: type) -> bytes:
    return f"{cls.__module__}.{cls.__qualname__}".encode("utf-8", "surrogatepass")


def _with_length(tag: bytes, data: bytes, out: list[bytes]) -> None:
    out.append(tag + str(len(data)).encode("ascii") + b":" + data)


def _canonical(obj: Any, out: list[bytes]) -> None:
    cls = obj.__class__
    if cls is str:
        _with_length(b"s", obj.encode("utf-8", "surrogatepass"), out)
    elif cls is int:
        out.append(b"i%d;" % obj)
    elif obj is None:
        out.append(b"N")
    elif cls is bool:
        out.append(b"T" if obj else b"F")
    elif cls is bytes:
        _with_length(b"b", obj, out)
    elif cls is float:
        out.append(b"f" + float.hex(obj).encode("ascii") + b";")
    elif cls is tuple or cls is list:
        out.append(b"(" if cls is tuple else b"[")
        for item in obj:
            _canonical(item, out)
        out.append(b")" if cls is tuple else b"]")
    elif cls is dict:
        _canonical_dict(obj, out)
    elif cls is set or cls is frozenset:
        out.append(b"<" if cls is set else b"{")
        out.extend(sorted(canonical_bytes(item) for item in obj))
        out.append(b">")
    else:
        _canonical_other(obj, cls, out)


def _canonical_dict(obj: dict[Any, Any], out: list[bytes]) -> None:
    out.append(b"{")
    for key_bytes, value_bytes in sorted(
        (canonical_bytes(key), canonical_bytes(value)) for key, value in obj.items()
    ):
        out.append(key_bytes)
        out.append(value_bytes)
    out.append(b"}")


def _canonical_other(obj: Any, cls: type, out: list[bytes]) -> None:
    if isinstance(obj, enum.Enum):
        _with_length(b"e", _type_name(cls), out)
        _canonical(obj.value, out)
    elif isinstance(obj, type):
        _with_length(b"t", _type_name(obj), out)
    elif callable(getattr(cls, "__cache_key__", None)):
        _with_length(b"k", _type_name(cls), out)
        _canonical(obj.__cache_key__(), out)
    elif isinstance(obj, _REPR_TYPES):
        _with_length(b"x", _type_name(cls), out)
        _with_length(b"r", repr(obj).encode("utf-8", "surrogatepass"), out)
    elif dataclasses.is_dataclass(obj):
        _with_length(b"d", _type_name(cls), out)
        _canonical(
            tuple((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)),
            out,
        )
    elif isinstance(obj, _BUILTIN_BASES):
        # Subclasses of the built-in types (named tuples, OrderedDict, str
        # subclasses...): the type name, then the value as its base type.
        _with_length(b"u", _type_name(cls), out)
        base: Any = next(b for b in _BUILTIN_BASES if isinstance(obj, b))
        _canonical(base(obj), out)
    else:
        try:
            data = pickle.dumps(obj, protocol=4)
        except Exception as exc:
            raise TypeError(
                f"cannot build a cache key from a {cls.__qualname__} argument ({exc}); "
                "pass key= or ignore= to memoize, or give the class a __cache_key__() method"
            ) from exc
        _with_length(b"p", data, out)


def canonical_bytes(obj: object) -> bytes:
    """A deterministic byte encoding of ``obj`` for building cache keys.

    Equal inputs of the same types give equal bytes in every process and
    Python version (see the module docs for what is covered, and the pickle
    fallback for the rest).

    >>> canonical_bytes({"b": 1, "a": (1.5, None)}) == canonical_bytes({"a": (1.5, None), "b": 1})
    True
    >>> len({canonical_bytes(v) for v in (1, 1.0, True, "1", b"1")})
    5
    """
    out: list[bytes] = []
    _canonical(obj, out)
    return b"".join(out)


class _Binder:
    """Maps a call's arguments to ``((name, value), ...)`` in signature order."""

    def __init__(self, func: Callable[..., Any], ignore: Iterable[str]) -> None:
        self.signature = inspect.signature(func)
        params = list(self.signature.parameters.values())
        self.ignore = frozenset(ignore)
        unknown = self.ignore - {p.name for p in params}
        if unknown:
            raise ConfigurationError(f"ignore= names unknown parameters: {sorted(unknown)}")
        kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        self.simple = all(p.kind in kinds for p in params)
        self.names = tuple(p.name for p in params)
        self.defaults = tuple(p.default for p in params)
        either = inspect.Parameter.POSITIONAL_OR_KEYWORD
        self.by_name = {p.name: i for i, p in enumerate(params) if p.kind is either}
        self.keep = tuple(i for i, p in enumerate(params) if p.name not in self.ignore)

    def __call__(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        if self.simple:
            bound = self._fast(args, kwargs)
            if bound is not None:
                return bound
        arguments = self.signature.bind(*args, **kwargs)  # TypeError exactly like the call
        arguments.apply_defaults()
        return tuple(
            (name, value) for name, value in arguments.arguments.items() if name not in self.ignore
        )

    def _fast(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...] | None:
        count = len(self.names)
        given = len(args)
        if given > count:
            return None
        values = list(args)
        values.extend([_EMPTY] * (count - given))
        for name, value in kwargs.items():
            index = self.by_name.get(name)
            if index is None or index < given:
                return None
            values[index] = value
        defaults = self.defaults
        for index in range(given, count):
            if values[index] is _EMPTY:
                if defaults[index] is _EMPTY:
                    return None
                values[index] = defaults[index]
        names = self.names
        return tuple((names[i], values[i]) for i in self.keep)


# ---------------------------------------------------------------------- protocols


class Memoized(Protocol[R_co]):
    """What ``@cache.memoize()`` returns: the function, plus helpers.

    For a method, pass ``self`` explicitly to the helpers:
    ``Class.method.invalidate(obj, x)`` or ``obj.method.invalidate(obj, x)``.
    """

    @property
    def __wrapped__(self) -> Callable[..., R_co]:
        """The undecorated function."""

    def __call__(self, *args: Any, **kwargs: Any) -> R_co: ...

    def __get__(self, instance: object, owner: type | None = None) -> Memoized[R_co]: ...

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call."""

    def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Drop this call's entry; return whether there was one."""

    def invalidate_all(self) -> int:
        """Drop every entry of this function (scans the keys); return how many."""


class MemoizeDecorator(Protocol):
    """The decorator returned by ``cache.memoize(...)``."""

    def __call__(self, func: Callable[..., R]) -> Memoized[R]: ...


# --------------------------------------------------------------------- the logic

_FRESH: Final = 0
_EARLY: Final = 1  # XFetch decided to recompute before expiry
_STALE: Final = 2  # past the logical expiry, inside stale_ttl
_ABSENT: Final = 3


class _Memo(Generic[R]):
    """State and policy of one memoized function (shared by sync and async)."""

    def __init__(
        self,
        cache: Cache,
        func: Callable[..., Any],
        *,
        ttl: Duration | None,
        key: Callable[..., object] | None,
        name: str | None,
        ignore: Iterable[str],
        stale_ttl: Duration,
        beta: float,
        lock_ttl: Duration,
    ) -> None:
        self.cache = cache
        self.func = func
        self.name = name or f"{func.__module__}.{func.__qualname__}"
        self.prefix = f"{MEMOIZE_NAMESPACE}{self.name}:"
        self.key_func = key
        self.binder = None if key is not None else _Binder(func, ignore)
        if key is not None and ignore:
            raise ConfigurationError("pass key= or ignore=, not both")
        ttl_ms = ttl_to_ms(ttl)
        if ttl_ms is None:
            default = cache.default_ttl
            ttl_ms = 0 if default is None else round(default * 1000)
        self.ttl = ttl_ms / 1000  # 0: never expires
        self.stale = parse_duration(stale_ttl)
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not beta >= 0:
            raise ConfigurationError(f"beta must be a number >= 0, got {beta!r}")
        if math.isinf(beta):
            raise ConfigurationError("beta must be finite")
        self.beta = float(beta)
        self.lock_ttl = parse_duration(lock_ttl)
        if self.lock_ttl <= 0:
            raise ConfigurationError("lock_ttl must be positive")

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        if self.key_func is not None:
            material: object = self.key_func(*args, **kwargs)
        else:
            assert self.binder is not None
            material = self.binder(args, kwargs)
        digest = hashlib.blake2b(canonical_bytes(material), digest_size=16).hexdigest()
        return self.prefix + digest

    def read(self, key: str) -> tuple[int, Any, float]:
        """(state, value, logical expiry or 0.0) of the entry under ``key``."""
        envelope: Any = self.cache.get(key, _MISS)
        if envelope is _MISS:
            return _ABSENT, None, 0.0
        try:
            value, delta, expires = envelope
            delta = float(delta)
            expires = float(expires)
        except (TypeError, ValueError):
            return _ABSENT, None, 0.0  # not a memoize envelope: recompute over it
        if not expires:
            return _FRESH, value, expires
        now = time.time()
        if now >= expires:
            return _STALE, value, expires
        if self.beta and now - delta * self.beta * math.log(1.0 - random.random()) >= expires:
            return _EARLY, value, expires
        return _FRESH, value, expires

    def refreshed_since(self, key: str, old_expires: float) -> tuple[bool, Any]:
        """After taking the lock: did someone else store a newer result meanwhile?"""
        state, value, expires = self.read(key)
        if state in (_ABSENT, _STALE):
            return False, None
        if old_expires and expires <= old_expires:
            return False, None  # the same entry we decided to refresh
        return True, value

    def store(self, key: str, value: Any, delta: float) -> None:
        ttl = self.ttl
        expires = time.time() + ttl if ttl else 0.0
        physical = ttl + self.stale if ttl else 0
        try:
            self.cache.set(key, (value, delta, expires), ttl=physical)
        except ValueTooLargeError as exc:
            logger.warning("not caching the result of %s: %s", self.name, exc)

    def lock(self, key: str) -> Lock:
        return Lock(self.cache, key, timeout=0, expire=self.lock_ttl)


def _release(lock: Lock) -> None:
    try:
        lock.release()
    except Exception:  # expired meanwhile: nothing to free
        logger.debug("memoize lock %s expired before release", lock.name)


def _call_sync(memo: _Memo[R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    key = memo.key(args, kwargs)
    state, value, expires = memo.read(key)
    if state == _FRESH:
        return cast(R, value)
    lock = memo.lock(key)
    delay = _FIRST_DELAY
    while True:
        if lock.acquire(blocking=False):
            try:
                done, newer = memo.refreshed_since(key, expires if state != _ABSENT else 0.0)
                if done:
                    return cast(R, newer)
                start = time.monotonic()
                result = memo.func(*args, **kwargs)
                memo.store(key, result, time.monotonic() - start)
                return cast(R, result)
            finally:
                _release(lock)
        if state != _ABSENT:
            return cast(R, value)  # someone else is refreshing: serve what we have
        time.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 1.5, _MAX_DELAY)
        state, value, expires = memo.read(key)
        if state != _ABSENT:
            return cast(R, value)


async def _call_async(memo: _Memo[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    key = memo.key(args, kwargs)
    state, value, expires = memo.read(key)
    if state == _FRESH:
        return value
    lock = memo.lock(key)
    delay = _FIRST_DELAY
    while True:
        if lock.acquire(blocking=False):
            try:
                done, newer = memo.refreshed_since(key, expires if state != _ABSENT else 0.0)
                if done:
                    return newer
                start = time.monotonic()
                result = await memo.func(*args, **kwargs)
                memo.store(key, result, time.monotonic() - start)
                return result
            finally:
                _release(lock)
        if state != _ABSENT:
            return value
        await asyncio.sleep(delay * (0.5 + random.random()))
        delay = min(delay * 1.5, _MAX_DELAY)
        state, value, expires = memo.read(key)
        if state != _ABSENT:
            return value


def memoize(
    cache: Cache,
    ttl: Duration | None = None,
    *,
    key: Callable[..., object] | None = None,
    name: str | None = None,
    ignore: Iterable[str] = (),
    stale_ttl: Duration = 0,
    beta: float = 0.0,
    lock_ttl: Duration = 60.0,
) -> MemoizeDecorator:
    """Return a decorator caching a function's results in ``cache``.

    ``ttl``
        Freshness of a result (``None``: the cache's default TTL; ``0``:
        forever).
    ``key``
        A function of the same arguments returning the value that identifies
        the call (instead of all the arguments).
    ``name``
        Replaces ``module.qualname`` in the keys: give it when two functions
        would share a qualified name, or to share entries across renames.
    ``ignore``
        Names of arguments left out of the key (``"self"``, a logger...).
    ``stale_ttl``, ``beta``, ``lock_ttl``
        Stampede protection, see the module docs.

    Works on functions, methods (``self`` is an argument like any other:
    give the class ``__cache_key__``, or pass ``key=``/``ignore=``) and
    ``async def`` functions (the wrapper is then a coroutine function).

    >>> import asyncio
    >>> from nearcache import Cache
    >>> cache = Cache("memo-async-demo", size="1MiB")
    >>> @cache.memoize(ttl="1m")
    ... async def fetch(n):
    ...     await asyncio.sleep(0)
    ...     return n * 10
    >>> asyncio.run(fetch(2)), fetch.cache_key(2) in cache
    (20, True)
    >>> cache.clear()
    """
    if callable(ttl) and not isinstance(ttl, (int, float, str)):
        raise TypeError("memoize takes options: write @cache.memoize() with parentheses")

    def decorator(func: Callable[..., Any]) -> Memoized[Any]:
        memo: _Memo[Any] = _Memo(
            cache,
            func,
            ttl=ttl,
            key=key,
            name=name,
            ignore=ignore,
            stale_ttl=stale_ttl,
            beta=beta,
            lock_ttl=lock_ttl,
        )
        wrapper: Callable[..., Any]
        if inspect.iscoroutinefunction(func):

            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await _call_async(memo, args, kwargs)

            wrapper = async_wrapper
        else:

            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return _call_sync(memo, args, kwargs)

            wrapper = sync_wrapper
        functools.update_wrapper(wrapper, func)

        def cache_key(*args: Any, **kwargs: Any) -> str:
            return memo.key(args, kwargs)

        def invalidate(*args: Any, **kwargs: Any) -> bool:
            return cache.delete(memo.key(args, kwargs))

        def invalidate_all() -> int:
            prefix = memo.prefix
            keys = cache.keys()
            mine = [k for k in keys if isinstance(k, str) and k.startswith(prefix)]
            return cache.delete_many(mine)

        helpers: Any = wrapper
        helpers.cache_key = cache_key
        helpers.invalidate = invalidate
        helpers.invalidate_all = invalidate_all
        helpers.memo = memo
        return cast(Memoized[Any], wrapper)

    return cast(MemoizeDecorator, decorator)
