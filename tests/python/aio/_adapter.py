"""An AsyncCache seen as a sync driver, so the driver contract can judge it.

Every method of the adapter runs the AsyncCache coroutine to completion:
under asyncio on one event loop living in a background thread (calls from
several threads are then several tasks on that loop), or under trio with
one ``trio.run`` per call.  ``get_many_with_ttl``, which the async API
does not offer, goes to the sync driver underneath.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from nearcache.aio import AsyncCache
from nearcache.drivers.base import TTL, Driver, Key

T = TypeVar("T")


class AsyncioRunner:
    """Runs coroutines on one event loop in a daemon thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        async def call() -> T:
            return await func(*args)

        return asyncio.run_coroutine_threadsafe(call(), self.loop).result(60)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class TrioRunner:
    """Runs each coroutine in its own ``trio.run``."""

    def run(self, func: Callable[..., Awaitable[T]], *args: Any) -> T:
        import trio

        async def call() -> T:
            return await func(*args)

        return trio.run(call)

    def close(self) -> None:
        pass


class AsyncAsDriver(Driver):
    """The driver protocol, each call one awaited AsyncCache coroutine."""

    def __init__(self, cache: AsyncCache, runner: AsyncioRunner | TrioRunner) -> None:
        inner = cache.driver
        super().__init__(default_ttl=inner.default_ttl)
        self.acache = cache
        self.runner = runner
        self.name = inner.name  # type: ignore[misc]
        self.ttl_resolution = inner.ttl_resolution
        self.max_value_size = inner.max_value_size

    @property
    def closed(self) -> bool:
        return self.acache.driver.closed

    @property
    def counter_ttl_resolution(self) -> float:
        return self.acache.driver.counter_ttl_resolution

    def _run(self, method: Callable[..., Awaitable[T]], *args: Any) -> T:
        return self.runner.run(method, *args)

    def get(self, key: Key, default: Any = None) -> Any:
        return self._run(self.acache.get, key, default)

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        return self._run(self.acache.get_with_ttl, key, default)

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        return self.acache.driver.get_many_with_ttl(keys)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        return self._run(self.acache.get_many, keys)

    def contains(self, key: Key) -> bool:
        return self._run(self.acache.contains, key)

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        self._run(self.acache.set, key, value, ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        return self._run(self.acache.add, key, value, ttl)

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        return self._run(self.acache.replace, key, value, ttl)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        self._run(self.acache.set_many, mapping, ttl)

    def delete(self, key: Key) -> bool:
        return self._run(self.acache.delete, key)

    def delete_many(self, keys: Iterable[Key]) -> int:
        return self._run(self.acache.delete_many, keys)

    def pop(self, key: Key, default: Any = None) -> Any:
        return self._run(self.acache.pop, key, default)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        return self._run(self.acache.touch, key, ttl)

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        return self._run(self.acache.incr, key, delta, default)

    def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        return self._run(self.acache.decr, key, delta, default)

    def get_or_set(self, key: Key, factory: Callable[[], T], ttl: TTL = None) -> T | Any:
        async def made() -> T:
            return factory()

        return self._run(self.acache.get_or_set, key, made, ttl)

    def clear(self) -> None:
        self._run(self.acache.clear)

    def close(self) -> None:
        if not self.acache.driver.closed:
            self._run(self.acache.aclose)
            self.acache.driver.close()

    def stats(self) -> dict[str, Any]:
        return self.acache.stats()


def make_runner(kind: str) -> AsyncioRunner | TrioRunner:
    """A runner for ``kind`` ("asyncio" or "trio")."""
    return AsyncioRunner() if kind == "asyncio" else TrioRunner()
