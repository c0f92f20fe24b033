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

Methods
=======

A method's key is built from ``self`` like any other argument, and ``self``
is almost never encodable as it should be: pickling it would put its whole
state in the key (a method that does ``self.calls += 1`` would never hit) and
fails for objects holding locks or connections.  So a memoized function whose
first parameter is ``self`` needs one of:

* a ``__cache_key__()`` method on the class, returning what identifies the
  instance (a database id, a URL...): entries are per identity, shared by
  equal instances across processes;
* ``key=`` (a function of the same arguments), or ``ignore=("self",)`` to
  share entries between all instances of the class.

Without one, defining the class fails at once (``TypeError``, wrapped in a
``RuntimeError`` by Python < 3.12), naming the class and the three ways out.
Helpers bind to the instance like the method: ``obj.load.invalidate(1)``
drops ``obj.load(1)``'s entry (``Class.load.invalidate(obj, 1)`` too).

Any callable can be memoized: a ``functools.partial`` is named after the
function it wraps plus a digest of its bound arguments (two partials of one
function never share entries), a callable object after its class (give it
``name=`` when instances must not share entries).

Results that cannot be stored
=============================

A result the serializer rejects, or one larger than the cache accepts, is
returned to the caller but not cached: the failure is logged (logger
``nearcache.memoize``, naming the function and the result's type) and
counted in ``f.memo.store_failures``; the next call computes again.

Stampedes
=========

When an entry is missing, one caller (across all processes) computes it
while the others wait, polling the cache, for its result.  The mutex is a
cache entry created with the atomic ``add``, with a TTL of ``lock_ttl``
seconds, so a caller that dies while computing delays the others by at most
that long.  Two options avoid waiting altogether:

* ``stale_ttl``: an entry stays in the cache that much longer than ``ttl``;
  once past ``ttl`` one caller recomputes it while the others immediately
  get the stale value.  With ``background=True`` that caller too gets the
  stale value at once, and the recomputation runs in a daemon thread (a task
  on the running event loop for ``async def`` functions); a refresh that
  raises is logged and leaves the stale value in place.
* ``beta`` (XFetch, Vattani et al., VLDB 2015): each caller may decide to
  recompute *before* expiry, with a probability that grows as expiry nears
  and with the time the computation took (``delta``): it recomputes when
  ``now - delta * beta * ln(rand()) >= expiry``.  ``beta=1.0`` is the
  paper's recommendation; ``0`` (default) disables it.  Others keep getting
  the current value meanwhile.

``ttl_jitter`` (CHI's ``expires_variance``), a fraction in ``[0, 1)``,
shortens each stored result's TTL by a random part of up to that fraction,
so results computed together (a warm-up, a deploy) do not all expire in the
same second; it never lengthens a TTL.

Entries store ``(value, delta, logical expiry)`` through the cache's
serializer; results are not cached when the function raises.

The cache may be a :class:`~nearcache.Cache`, any driver
(:mod:`nearcache.drivers`) or a tiered cache: they all have ``memoize``.

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
import contextlib
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
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, Generic, Protocol, TypeVar, cast

from nearcache.errors import ConfigurationError, SerializationError, ValueTooLargeError
from nearcache.locks import Lock, _backoff
from nearcache.units import Duration, jittered_ttl, parse_duration, ttl_to_ms

if TYPE_CHECKING:
    from nearcache.cache import Cache
    from nearcache.drivers.base import Driver
    from nearcache.tags import TagsArg

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

    For a method, the helpers bind like the method does:
    ``obj.method.invalidate(x)``, or ``Class.method.invalidate(obj, x)``.
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
        cache: Cache | Driver,
        func: Callable[..., Any],
        *,
        ttl: Duration | None,
        key: Callable[..., object] | None,
        name: str | None,
        ignore: Iterable[str],
        stale_ttl: Duration,
        beta: float,
        lock_ttl: Duration,
        background: bool = False,
        ttl_jitter: float = 0.0,
        tags: TagsArg | None = None,
        generations: Callable[[list[str]], dict[str, int]] | None = None,
    ) -> None:
        from nearcache.tags import check_tags

        self.cache = cache
        self.func = func
        #: ``tags=`` (names, or a function of the call's arguments), checked.
        self.tags = tags
        self._static_tags = None if tags is None or callable(tags) else check_tags(tags)
        #: Reads the tags' current generations (sync memoize; the async one awaits its own).
        self._generations = generations
        self.name = name or _callable_name(func)
        self.prefix = f"{MEMOIZE_NAMESPACE}{self.name}:"
        self.key_func = key
        if key is not None and ignore:
            raise ConfigurationError("pass key= or ignore=, not both")
        self.binder = None if key is not None else _Binder(func, ignore)
        #: Results computed but not cached (serializer refused, too large).
        self.store_failures = 0
        self.background = bool(background)
        if isinstance(ttl_jitter, bool) or not isinstance(ttl_jitter, (int, float)):
            raise ConfigurationError(f"ttl_jitter must be a number in [0, 1), got {ttl_jitter!r}")
        if not 0 <= ttl_jitter < 1:
            raise ConfigurationError(f"ttl_jitter must be in [0, 1), got {ttl_jitter!r}")
        self.ttl_jitter = float(ttl_jitter)
        self._tasks: set[asyncio.Task[None]] = set()
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

    def base_key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's key without its tags' generations."""
        if self.key_func is not None:
            material: object = self.key_func(*args, **kwargs)
        else:
            assert self.binder is not None
            material = self.binder(args, kwargs)
        digest = hashlib.blake2b(canonical_bytes(material), digest_size=16).hexdigest()
        return self.prefix + digest

    def tag_names(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
        """The call's tags (``[]`` without ``tags=``)."""
        if self._static_tags is not None:
            return self._static_tags
        if self.tags is None:
            return []
        from nearcache.tags import check_tags

        return check_tags(self.tags(*args, **kwargs))  # type: ignore[operator]

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        """The call's key: with ``tags=``, its tags' current generations are part
        of it (read before the function runs; see :mod:`nearcache.tags`)."""
        key = self.base_key(args, kwargs)
        if self._generations is not None:
            names = self.tag_names(args, kwargs)
            if names:
                from nearcache.tags import suffix

                key += suffix(self._generations(names))
        return key

    def read(self, key: str) -> tuple[int, Any, float]:
        """(state, value, logical expiry or 0.0) of the entry under ``key``."""
        return self.classify(self.cache.get(key, _MISS))

    def classify(self, envelope: Any) -> tuple[int, Any, float]:
        """(state, value, logical expiry or 0.0) of a stored envelope (``_MISS``:
        none): the one decision between fresh, early (XFetch), stale and
        absent, for the sync and the async memoize."""
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
        return self.newer(self.read(key), old_expires)

    @staticmethod
    def newer(read: tuple[int, Any, float], old_expires: float) -> tuple[bool, Any]:
        """``(True, value)`` if ``read`` (a :meth:`classify` result) is a live
        entry newer than the one that expired at ``old_expires`` (``0.0``:
        there was none)."""
        state, value, expires = read
        if state in (_ABSENT, _STALE):
            return False, None
        if old_expires and expires <= old_expires:
            return False, None  # the same entry we decided to refresh
        return True, value

    def stored_form(self, value: Any, delta: float) -> tuple[tuple[Any, float, float], float]:
        """``(envelope, physical TTL)`` of a result that took ``delta`` seconds:
        the TTL jittered, the envelope's logical expiry, ``stale_ttl`` added."""
        ttl = jittered_ttl(self.ttl, self.ttl_jitter) if self.ttl_jitter else self.ttl
        expires = time.time() + ttl if ttl else 0.0
        physical = ttl + self.stale if ttl else 0
        return (value, delta, expires), physical

    def store(self, key: str, value: Any, delta: float) -> None:
        envelope, physical = self.stored_form(value, delta)
        try:
            self.cache.set(key, envelope, ttl=physical)
        except (SerializationError, ValueTooLargeError) as exc:
            self.store_failed(value, exc)

    def store_failed(self, value: Any, exc: SerializationError | ValueTooLargeError) -> None:
        """A result the cache refused: the caller still gets it; the failure
        is counted and logged, naming the result's type (not the envelope)."""
        self.store_failures += 1
        reason = exc.__cause__ if isinstance(exc, SerializationError) and exc.__cause__ else exc
        logger.warning(
            "not caching the result of %s: its %s value cannot be stored (%s: %s)",
            self.name,
            _qualified_type(value),
            type(exc).__name__,
            reason,
        )

    def lock(self, key: str) -> Lock:
        return Lock(self.cache, key, timeout=0, expire=self.lock_ttl)


def _qualified_type(value: object) -> str:
    cls = type(value)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


def _callable_name(func: Callable[..., Any]) -> str:
    """``module.qualname`` of any callable (partials and callable objects too)."""
    if isinstance(func, functools.partial):
        try:
            bound = canonical_bytes((func.args, func.keywords))
        except TypeError as exc:
            raise TypeError(
                f"cannot name a memoized functools.partial by its bound arguments ({exc}); "
                "pass name="
            ) from exc
        digest = hashlib.blake2b(bound, digest_size=8).hexdigest()
        return f"{_callable_name(func.func)}:partial-{digest}"
    qualname = getattr(func, "__qualname__", None)
    module = getattr(func, "__module__", None)
    if not isinstance(qualname, str):  # a callable object: named after its class
        qualname = type(func).__qualname__
        module = type(func).__module__
    return f"{module}.{qualname}"


def _is_async(func: Callable[..., Any]) -> bool:
    """Whether calling ``func`` returns a coroutine (async functions, partials
    of them, objects with an ``async def __call__``)."""
    if inspect.iscoroutinefunction(func):
        return True
    call = None if inspect.isfunction(func) else inspect.getattr_static(func, "__call__", None)
    return call is not None and inspect.iscoroutinefunction(call)


def _waits() -> Iterator[float]:
    """The pauses of a caller polling for another's result (2 ms growing to
    50 ms, jittered), for the sync and the async memoize."""
    return _backoff(_FIRST_DELAY, 1.5, _MAX_DELAY)


def _release(lock: Lock) -> None:
    try:
        lock.release()
    except Exception:  # expired meanwhile: nothing to free
        logger.debug("memoize lock %s expired before release", lock.name)


def _log_refresh_failure(memo: _Memo[Any]) -> None:
    """Log the exception being handled: a background refresh of ``memo``'s
    function failed (for the sync and the async memoize)."""
    logger.warning(
        "background refresh of %s failed; the stale value stays", memo.name, exc_info=True
    )


@contextlib.contextmanager
def _refreshing(memo: _Memo[Any], lock: Lock) -> Iterator[None]:
    """Around a background refresh: a failure is logged and leaves the stale
    value in place; the lock is freed either way."""
    try:
        yield
    except Exception:
        _log_refresh_failure(memo)
    finally:
        _release(lock)


def _refresh_sync(
    memo: _Memo[Any],
    key: str,
    lock: Lock,
    expires: float,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Recompute and store one entry, then free its lock (a background thread)."""
    with _refreshing(memo, lock):
        if memo.refreshed_since(key, expires)[0]:
            return  # another process refreshed it between our read and our lock
        start = time.monotonic()
        result = memo.func(*args, **kwargs)
        memo.store(key, result, time.monotonic() - start)


async def _refresh_async(
    memo: _Memo[Any],
    key: str,
    lock: Lock,
    expires: float,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Recompute and store one entry, then free its lock (a task on the loop)."""
    with _refreshing(memo, lock):
        if memo.refreshed_since(key, expires)[0]:
            return  # another process refreshed it between our read and our lock
        start = time.monotonic()
        result = await memo.func(*args, **kwargs)
        memo.store(key, result, time.monotonic() - start)


def _call_sync(memo: _Memo[R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    key = memo.key(args, kwargs)
    state, value, expires = memo.read(key)
    if state == _FRESH:
        return cast(R, value)
    lock = memo.lock(key)
    pauses = _waits()
    while True:
        if lock.acquire(blocking=False):
            if memo.background and state != _ABSENT:
                # Serve the stale value now; the lock passes to the thread.
                threading.Thread(
                    target=_refresh_sync,
                    args=(memo, key, lock, expires, args, kwargs),
                    name=f"nearcache-refresh:{memo.name}",
                    daemon=True,
                ).start()
                return cast(R, value)
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
        time.sleep(next(pauses))
        state, value, expires = memo.read(key)
        if state != _ABSENT:
            return cast(R, value)


async def _call_async(memo: _Memo[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    key = memo.key(args, kwargs)
    state, value, expires = memo.read(key)
    if state == _FRESH:
        return value
    lock = memo.lock(key)
    pauses = _waits()
    while True:
        if lock.acquire(blocking=False):
            if memo.background and state != _ABSENT:
                coro: Coroutine[Any, Any, None] = _refresh_async(
                    memo, key, lock, expires, args, kwargs
                )
                task = asyncio.get_running_loop().create_task(coro)
                memo._tasks.add(task)  # the loop keeps only a weak reference
                task.add_done_callback(memo._tasks.discard)
                return value
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
        await asyncio.sleep(next(pauses))
        state, value, expires = memo.read(key)
        if state != _ABSENT:
            return value


def memoize(
    cache: Cache | Driver,
    ttl: Duration | None = None,
    *,
    tags: TagsArg | None = None,
    key: Callable[..., object] | None = None,
    name: str | None = None,
    ignore: Iterable[str] = (),
    stale_ttl: Duration = 0,
    beta: float = 0.0,
    lock_ttl: Duration = 60.0,
    background: bool = False,
    ttl_jitter: float = 0.0,
) -> MemoizeDecorator:
    """Return a decorator caching a function's results in ``cache``.

    ``ttl``
        Freshness of a result (``None``: the cache's default TTL; ``0``:
        forever).
    ``tags``
        Tag names, or a function of the call's arguments returning them:
        ``invalidate_tags`` on any of them (:class:`nearcache.tags.Tagged`)
        makes the call's entry a miss.  Their generations, read before the
        function runs, are part of the key (:mod:`nearcache.tags`).
    ``key``
        A function of the same arguments returning the value that identifies
        the call (instead of all the arguments).
    ``name``
        Replaces ``module.qualname`` in the keys: give it when two functions
        would share a qualified name, or to share entries across renames.
    ``ignore``
        Names of arguments left out of the key (``"self"``, a logger...).
    ``stale_ttl``, ``beta``, ``lock_ttl``, ``background``
        Stampede protection, see the module docs.
    ``ttl_jitter``
        A fraction in ``[0, 1)``: each result's TTL is shortened by a random
        part of up to that fraction (see the module docs).

    Works on any callable: functions, methods (keyed by the instance's
    ``__cache_key__()``, or give ``key=``/``ignore=``: see the module
    docs), ``functools.partial`` objects, callable objects, and ``async
    def`` functions (the wrapper is then a coroutine function).

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

    if not callable(getattr(cache, "keys", None)) or not hasattr(cache, "add"):
        raise TypeError(f"memoize needs a nearcache Cache or driver, not {type(cache).__name__}")
    ttl_to_ms(ttl)  # a malformed ttl fails here (ConfigurationError), not at decoration

    generations = None
    if tags is not None:
        from nearcache.tags import Tagged, check_tags

        if not callable(tags):
            check_tags(tags)  # a bare str fails here, at decoration time
        generations = Tagged(cache).generations

    def decorator(func: Callable[..., Any]) -> Memoized[Any]:
        if not callable(func):
            raise TypeError(f"memoize decorates callables, not {type(func).__name__}")
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
            background=background,
            ttl_jitter=ttl_jitter,
            tags=tags,
            generations=generations,
        )
        wrapper: Callable[..., Any]
        if _is_async(func):

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
        if _first_parameter(func) == "self":
            return cast(Memoized[Any], _MemoizedMethod(wrapper, memo))
        return cast(Memoized[Any], wrapper)

    return cast(MemoizeDecorator, decorator)


def _first_parameter(func: Callable[..., Any]) -> str | None:
    try:
        params = list(inspect.signature(func).parameters.values())
    except (TypeError, ValueError):
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return params[0].name if params and params[0].kind in positional else None


def check_method_class(memo: _Memo[Any], cls: type, attribute: str) -> None:
    """The method rule, for the sync and the async memoize: a method keyed
    with ``self`` needs ``cls.__cache_key__`` (else ``TypeError``)."""
    binder = memo.binder
    needs_key = binder is not None and "self" not in binder.ignore
    if needs_key and not callable(getattr(cls, "__cache_key__", None)):
        name = f"{cls.__qualname__}.{attribute}"
        raise TypeError(
            f"cannot memoize the method {name}: its key would include self, and "
            f"{cls.__qualname__} has no __cache_key__() method. Define "
            f"{cls.__qualname__}.__cache_key__() returning what identifies an instance "
            "(entries are then per identity), pass key= (a function of the method's "
            'arguments), or pass ignore=("self",) to share entries between all instances'
        )


def _attribute_name(func: Callable[..., Any]) -> str:
    name = getattr(func, "__name__", None)
    return name if isinstance(name, str) else _callable_name(func).rpartition(".")[2]


class _BoundMemoized(functools.partial[Any]):
    """A memoized method bound to an instance: calls and helpers take the
    arguments after ``self`` (a partial, so ``inspect`` sees through it)."""

    __slots__ = ()

    @property
    def __wrapped__(self) -> Callable[..., Any]:
        wrapped: Callable[..., Any] = getattr(self.func, "__wrapped__")  # noqa: B009
        return wrapped

    @property
    def memo(self) -> _Memo[Any]:
        return cast(_Memo[Any], self.func.memo)  # type: ignore[attr-defined]

    def cache_key(self, *args: Any, **kwargs: Any) -> str:
        """The cache key of this call."""
        return self.memo.key((*self.args, *args), kwargs)

    def invalidate(self, *args: Any, **kwargs: Any) -> bool:
        """Drop this call's entry; return whether there was one."""
        return cast(bool, self.func.invalidate(*self.args, *args, **kwargs))  # type: ignore[attr-defined]

    def invalidate_all(self) -> int:
        """Drop every entry of this method (of every instance)."""
        return cast(int, self.func.invalidate_all())  # type: ignore[attr-defined]


class _MethodDescriptor:
    """A memoized method (sync or async): checked when its class is created
    (``__set_name__``, see :func:`check_method_class`), or on first use when
    it was not defined in a class body, and bound on attribute access."""

    memo: _Memo[Any]
    _owner: type | None

    def _bind(self, instance: object) -> Any:
        """The method bound to ``instance``."""
        raise NotImplementedError

    def _check_class(self, cls: type, attribute: str) -> None:
        check_method_class(self.memo, cls, attribute)

    def __set_name__(self, owner: type, attribute: str) -> None:
        self._check_class(owner, attribute)
        self._owner = owner

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        if instance is None:
            return self
        if self._owner is None:  # not defined in a class body: check on use
            self._check_class(type(instance), _attribute_name(self.memo.func))
        return self._bind(instance)


class _MemoizedMethod(_MethodDescriptor):
    """What ``memoize`` returns for a function whose first parameter is ``self``.

    A descriptor: checked when its class is created (``__set_name__``: the
    class needs ``__cache_key__`` unless ``key=``/``ignore=("self",)`` says
    how to key), bound on attribute access (:class:`_BoundMemoized`).
    """

    def __init__(self, wrapper: Callable[..., Any], memo: _Memo[Any]) -> None:
        self._wrapper = wrapper
        self.memo = memo
        self._owner = None
        functools.update_wrapper(self, memo.func)
        helpers: Any = wrapper
        self.cache_key = helpers.cache_key
        self.invalidate = helpers.invalidate
        self.invalidate_all = helpers.invalidate_all

    def _bind(self, instance: object) -> _BoundMemoized:
        return _BoundMemoized(self._wrapper, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrapper(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<memoized method {self.memo.name}>"
