"""``@cache.memoize()``: cache a function's results, with stampede protection.

Keys
====

A call's cache key is ``nearcache.memoize:<name>:<digest>`` where ``name`` is
the function's ``module.qualname`` (or the ``name=`` given) and ``digest`` a
BLAKE2b-128 hash of the call's arguments, bound to the signature first, so
``f(1, 2)``, ``f(1, b=2)`` and ``f(a=1)`` with ``b=2`` as default are the
same call.  Arguments are encoded canonically by :func:`canonical_bytes`
(:mod:`nearcache.canonical` lists what it covers), never by plain pickle,
whose output depends on dict/set order and hash seeds: ``1``, ``1.0``,
``True`` and ``"1"`` are four different keys; an object with a
``__cache_key__()`` method is encoded by its type name and what that method
returns (use it for your own classes, ``self`` included); anything the
encoding does not know falls back to its pickle (protocol 4), deterministic
for plain objects but not for objects holding sets of strings, for
instance.  Give such functions ``key=`` (a function of the same arguments
returning an encodable value) or ``ignore=`` (argument names left out of
the key).

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
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, Protocol, TypeVar, cast

from nearcache.canonical import canonical_bytes
from nearcache.generations import TagsArg, check_tags
from nearcache.lockcore import LockCore
from nearcache.protocol import Store
from nearcache.stampede import (
    _FRESH,
    _MISS,
    MEMOIZE_NAMESPACE,
    _callable_name,
    _is_async,
    _Memo,
    call_steps,
    lead_steps,
    refresh_steps,
)
from nearcache.steps import Call, Spawn, run, run_async
from nearcache.units import Duration, ttl_to_ms

__all__ = [
    "MEMOIZE_NAMESPACE",
    "MemoizeDecorator",
    "Memoized",
    "canonical_bytes",
    "memoize",
]

R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)

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


# ---------------------------------------------------------------- the drivers
# The protocol is nearcache.stampede's; these only do the waiting.


def _refresh_sync(
    memo: _Memo[Any],
    key: str,
    lock: LockCore[Any],
    expires: float,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> None:
    """Recompute and store one entry, then free its lock (a background thread)."""
    run(refresh_steps(memo, key, lock, expires), memo.cache, lambda: memo.func(*args, **kwargs))


def _call_sync(memo: _Memo[R], args: tuple[Any, ...], kwargs: dict[str, Any]) -> R:
    store: Any = memo.cache
    # A hit costs one read: without tags the key needs no store call, and the
    # core's first step is that read (the steps below run on a miss only).
    key = (
        memo.base_key(args, kwargs)
        if memo.tags is None
        else run(memo.key_steps(args, kwargs), store)
    )
    read = memo.classify(store.get(key, _MISS))
    if read[0] == _FRESH:
        return cast(R, read[1])
    return cast(R, run(lead_steps(memo, key, read), store, lambda: memo.func(*args, **kwargs)))


async def _call_async(memo: _Memo[Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """An ``async def`` function memoized on a sync store: store calls inline,
    waits and background refreshes on the running asyncio loop."""
    store = memo.cache

    async def perform(op: Call) -> Any:
        return getattr(store, op.method)(*op.args)

    async def compute() -> Any:
        return await memo.func(*args, **kwargs)

    def spawn(op: Spawn) -> None:
        task = asyncio.get_running_loop().create_task(
            run_async(op.steps, perform, asyncio.sleep, compute)
        )
        memo._tasks.add(task)  # the loop keeps only a weak reference
        task.add_done_callback(memo._tasks.discard)

    key = run(memo.key_steps(args, kwargs), store)
    return await run_async(call_steps(memo, key), perform, asyncio.sleep, compute, spawn)


def memoize(
    cache: Store,
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

    if tags is not None and not callable(tags):
        check_tags(tags)  # a bare str fails here, at decoration time

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
            return run(memo.key_steps(args, kwargs), cache)

        def invalidate(*args: Any, **kwargs: Any) -> bool:
            return cache.delete(cache_key(*args, **kwargs))

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
        return cast(str, self.func.cache_key(*self.args, *args, **kwargs))  # type: ignore[attr-defined]

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
