"""The async API: :class:`AsyncCache`, :class:`AsyncLock` and async memoize.

Under asyncio (FastAPI, Starlette, aiohttp...) and trio (directly or through
anyio).  See :mod:`nearcache.aio.cache` for the class and
:mod:`nearcache.aio._stores` for how each store is reached without blocking
the event loop.
"""

from __future__ import annotations

from nearcache.aio.cache import AsyncCache
from nearcache.aio.lock import AsyncLock
from nearcache.aio.memoize import AsyncMemoized

__all__ = ["AsyncCache", "AsyncLock", "AsyncMemoized"]
