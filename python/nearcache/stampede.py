"""The stampede protocol of memoize, once, for the sync and the async memoize.

:class:`_Memo` holds one memoized function's options and builds its keys;
the steps below are the protocol of a call (:mod:`nearcache.steps`: they
yield store calls, sleeps, "compute" and "spawn", and do no I/O), driven by
:mod:`nearcache.memoize` (blocking, or awaiting for an ``async def``
function on a sync store) and :mod:`nearcache.aio.memoize` (awaiting).

A call:

1. **read** the entry and classify it (:meth:`_Memo.classify`): fresh
   (return it), early (XFetch chose to recompute before expiry), stale
   (past its logical expiry, inside ``stale_ttl``) or absent;
2. **lead**: try the key's lock (:mod:`nearcache.lockcore`, one ``add``)

   * taken, with ``background`` and a value in hand: spawn the refresh
     (which frees the lock) and return the value;
   * taken: read again (someone may have stored a newer result between our
     read and our lock: return it), else compute, store, free the lock;
   * not taken, with a value in hand (early, stale): return it, another
     caller is refreshing;
   * not taken, nothing in hand: pause (2 ms growing to 50 ms, jittered),
     read again, and go on until a value appears or the lock is ours.

3. **store**: ``(value, delta, logical expiry)`` with a TTL of ``ttl`` (jittered)
   plus ``stale_ttl``; a value the store refuses (serializer, size) is
   returned anyway, counted and logged.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import inspect
import logging
import math
import random
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final, Generic, Protocol, TypeVar

from nearcache.canonical import canonical_bytes
from nearcache.errors import ConfigurationError, SerializationError, ValueTooLargeError
from nearcache.generations import TagsArg, check_tags, current_steps, suffix
from nearcache.lockcore import LockCore, backoff
from nearcache.steps import Compute, Sleep, Spawn, Steps, call
from nearcache.units import Duration, jittered_ttl, parse_duration, ttl_to_ms

__all__ = ["MEMOIZE_NAMESPACE", "call_steps", "lead_steps", "read_steps", "refresh_steps"]

logger = logging.getLogger("nearcache.memoize")

#: Prefix of every memoized entry's key.
MEMOIZE_NAMESPACE: Final = "nearcache.memoize:"

R = TypeVar("R")

_EMPTY: Final = inspect.Parameter.empty
_MISS: Final = object()
_FIRST_DELAY: Final = 0.002
_MAX_DELAY: Final = 0.05

_FRESH: Final = 0
_EARLY: Final = 1  # XFetch decided to recompute before expiry
_STALE: Final = 2  # past the logical expiry, inside stale_ttl
_ABSENT: Final = 3

#: What a read finds: (state, value, logical expiry or 0.0).
Read = tuple[int, Any, float]


class _HasDefaultTTL(Protocol):
    @property
    def default_ttl(self) -> float | None: ...


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


class _Memo(Generic[R]):
    """State and policy of one memoized function (shared by sync and async)."""

    def __init__(
        self,
        cache: _HasDefaultTTL,
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
    ) -> None:
        #: The store (sync memoize) or async cache the entries live in.
        self.cache = cache
        self.func = func
        #: ``tags=`` (names, or a function of the call's arguments), checked.
        self.tags = tags
        self._static_tags = None if tags is None or callable(tags) else check_tags(tags)
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
        return check_tags(self.tags(*args, **kwargs))  # type: ignore[operator]

    def key_steps(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Steps[str]:
        """The call's key: with ``tags=``, its tags' current generations are part
        of it (read before the function runs; see :mod:`nearcache.tags`)."""
        key = self.base_key(args, kwargs)
        names = self.tag_names(args, kwargs)
        if names:
            key += suffix((yield from current_steps(names)))
        return key

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

    def lock(self, key: str) -> LockCore[None]:
        """The stampede lock of ``key``: one try, held at most ``lock_ttl``
        (its steps run on the memo's store, through the caller's driver)."""
        return LockCore(None, key, timeout=0, expire=self.lock_ttl)


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
    50 ms, jittered)."""
    return backoff(_FIRST_DELAY, 1.5, _MAX_DELAY)


def _log_refresh_failure(memo: _Memo[Any]) -> None:
    """Log the exception being handled: a background refresh of ``memo``'s
    function failed."""
    logger.warning(
        "background refresh of %s failed; the stale value stays", memo.name, exc_info=True
    )


# ---------------------------------------------------------------------- steps


def read_steps(memo: _Memo[Any], key: str) -> Steps[Read]:
    """Read and classify the entry under ``key``."""
    return memo.classify((yield call("get", key, _MISS)))


def store_steps(memo: _Memo[Any], key: str, value: Any, delta: float) -> Steps[None]:
    """Store a result that took ``delta`` seconds; one the store refuses is counted."""
    envelope, physical = memo.stored_form(value, delta)
    try:
        yield call("set", key, envelope, physical)
    except (SerializationError, ValueTooLargeError) as exc:
        memo.store_failed(value, exc)


def _release_steps(lock: LockCore[Any]) -> Steps[None]:
    try:
        yield from lock.release_steps()
    except Exception:  # expired meanwhile (or the store failed): nothing to free
        logger.debug("memoize lock of %s not released", lock.name, exc_info=True)


def call_steps(memo: _Memo[Any], key: str) -> Steps[Any]:
    """One call of the memoized function whose key is ``key``."""
    read = yield from read_steps(memo, key)
    if read[0] == _FRESH:
        return read[1]
    return (yield from lead_steps(memo, key, read))


def lead_steps(memo: _Memo[Any], key: str, read: Read) -> Steps[Any]:
    """After a read that was not fresh: compute under the key's lock, or serve
    what is in hand, or wait for another caller's result."""
    state, value, expires = read
    lock = memo.lock(key)
    pauses = _waits()
    while True:
        if (yield from lock.acquire_steps(blocking=False)):
            if memo.background and state != _ABSENT:
                # Serve the stale value now; the lock passes to the refresh.
                yield Spawn(
                    refresh_steps(memo, key, lock, expires), f"nearcache-refresh:{memo.name}"
                )
                return value
            try:
                reread = yield from read_steps(memo, key)
                done, newer = memo.newer(reread, expires if state != _ABSENT else 0.0)
                if done:
                    return newer
                start = time.monotonic()
                result = yield Compute()
                yield from store_steps(memo, key, result, time.monotonic() - start)
                return result
            finally:
                yield from _release_steps(lock)
        if state != _ABSENT:
            return value  # someone else is refreshing: serve what we have
        yield Sleep(next(pauses))
        state, value, expires = yield from read_steps(memo, key)
        if state != _ABSENT:
            return value


def refresh_steps(memo: _Memo[Any], key: str, lock: LockCore[Any], expires: float) -> Steps[None]:
    """Recompute and store one entry in the background, then free its lock; a
    failure is logged and leaves the stale value in place."""
    try:
        if memo.newer((yield from read_steps(memo, key)), expires)[0]:
            return  # another process refreshed it between our read and our lock
        start = time.monotonic()
        result = yield Compute()
        yield from store_steps(memo, key, result, time.monotonic() - start)
    except Exception:
        _log_refresh_failure(memo)
    finally:
        yield from _release_steps(lock)
