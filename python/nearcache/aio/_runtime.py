"""What the async layer needs from the running event loop, for asyncio and trio.

nearcache's async code runs under asyncio (and anything built on it:
uvicorn, FastAPI, anyio's asyncio backend) and under trio (directly or
through anyio).  The loop is told apart without any extra dependency: an
asyncio loop answers :func:`asyncio.get_running_loop`; otherwise the caller
is assumed to run under trio, which is imported only then.

Blocking work (a memcached call, the L2 half of a tiered cache) runs on a
*bounded* pool of threads: :class:`Offloader` keeps at most ``workers``
calls in flight per cache, so a burst of requests queues instead of
spawning threads or exhausting the store's connections.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Protocol, TypeVar

__all__ = ["Offloader", "in_asyncio", "loop_token", "new_event", "sleep", "spawn"]

T = TypeVar("T")


def in_asyncio() -> bool:
    """Whether the caller runs inside an asyncio event loop (else: trio)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def loop_token() -> object:
    """An object identifying the running event loop (asyncio loop or trio token)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        import trio

        return trio.lowlevel.current_trio_token()


async def sleep(seconds: float) -> None:
    """Sleep without blocking the event loop, whichever library runs it."""
    if in_asyncio():
        await asyncio.sleep(seconds)
    else:
        import trio

        await trio.sleep(seconds)


_background: set[asyncio.Task[None]] = set()


def spawn(func: Callable[..., Coroutine[Any, Any, None]], *args: Any) -> None:
    """Run ``func(*args)`` in the background, outliving the caller's task.

    Under asyncio, a task on the running loop (referenced here until it ends:
    the loop holds tasks only weakly); under trio, a system task of the
    running ``trio.run`` (cancelled when it ends).  ``func`` must handle its
    own errors.
    """
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        import trio

        trio.lowlevel.spawn_system_task(func, *args)
        return
    task = loop.create_task(func(*args))
    _background.add(task)
    task.add_done_callback(_background.discard)


class Event(Protocol):
    """What :func:`new_event` returns: ``asyncio.Event`` or ``trio.Event``."""

    def set(self) -> None: ...

    async def wait(self) -> Any: ...


def new_event() -> Event:
    """A one-shot event of the running library."""
    if in_asyncio():
        return asyncio.Event()
    import trio

    event: Event = trio.Event()
    return event


class Offloader:
    """Runs blocking calls on at most ``workers`` threads, for asyncio or trio."""

    def __init__(self, workers: int = 8, name: str = "nearcache-async") -> None:
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {workers!r}")
        self.workers = workers
        self._name = name
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._trio_limiters: dict[object, Any] = {}
        self._lock = threading.Lock()

    def _pool(self) -> concurrent.futures.ThreadPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = concurrent.futures.ThreadPoolExecutor(
                    max_workers=self.workers, thread_name_prefix=self._name
                )
            return self._executor

    async def run(self, func: Callable[..., T], *args: Any) -> T:
        """``func(*args)`` on a worker thread; the caller's task waits for it."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return await self._run_trio(func, *args)
        return await loop.run_in_executor(self._pool(), functools.partial(func, *args))

    async def _run_trio(self, func: Callable[..., T], *args: Any) -> T:
        import trio

        token = trio.lowlevel.current_trio_token()
        limiter = self._trio_limiters.get(token)
        if limiter is None:
            limiter = self._trio_limiters[token] = trio.CapacityLimiter(self.workers)
        result: T = await trio.to_thread.run_sync(functools.partial(func, *args), limiter=limiter)
        return result

    def close(self) -> None:
        """Let running calls finish; later calls start a new pool."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)
        self._trio_limiters.clear()
