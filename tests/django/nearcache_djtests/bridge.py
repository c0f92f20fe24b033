"""Run Django's synchronous cache tests through a backend's async methods.

Django's ``BaseCacheTests`` call the module-global ``cache`` of
``cache.tests``.  :class:`AsyncBridge` stands in for it: each call of a cache
operation runs the backend's ``a``-prefixed coroutine (``get`` ->
``aget``...) to completion with asgiref's ``async_to_sync`` (as Django runs
async test methods: an event loop in another thread, with thread-sensitive
work handed back to this thread), so the whole suite checks
that every async method takes the same arguments and behaves exactly like its
sync twin.  Attribute reads and writes (``key_func``, ``_max_entries``...) go
to the backend itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import async_to_sync

# Operations whose calls are answered by the async twin.  get_or_set is not
# among them: Django's test_get_or_set_version checks the sync method's own
# TypeError message, so aget_or_set is tested separately.
BRIDGED = frozenset(
    {
        "add",
        "get",
        "set",
        "touch",
        "delete",
        "has_key",
        "get_many",
        "set_many",
        "delete_many",
        "incr",
        "decr",
        "incr_version",
        "decr_version",
        "clear",
        "close",
    }
)


class AsyncBridge:
    """A stand-in for a cache backend that answers sync calls with its async methods."""

    def __init__(self, backend: Any) -> None:
        object.__setattr__(self, "_backend", backend)
        object.__setattr__(self, "calls", [])

    def __getattr__(self, name: str) -> Any:
        backend = object.__getattribute__(self, "_backend")
        if name not in BRIDGED:
            return getattr(backend, name)
        coroutine_function = getattr(backend, "a" + name)
        calls: list[str] = object.__getattribute__(self, "calls")

        def run(*args: Any, **kwargs: Any) -> Any:
            calls.append("a" + name)
            return async_to_sync(coroutine_function)(*args, **kwargs)

        # Django >= 6.1 inspects ``cache.<method>.__func__`` to see which
        # methods a backend overrides; answer with the backend's own function.
        run.__func__ = getattr(type(backend), name)  # type: ignore[attr-defined]
        return run

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_backend"), name, value)

    def __delattr__(self, name: str) -> None:
        delattr(object.__getattribute__(self, "_backend"), name)

    def __contains__(self, key: Any) -> bool:
        has_key: Callable[[Any], bool] = self.__getattr__("has_key")
        return has_key(key)
