"""Response caching for ASGI applications (Starlette, FastAPI, Quart...).

:class:`CacheMiddleware` stores whole responses of ``GET`` requests in an
:class:`~nearcache.aio.AsyncCache` and answers repeated requests from it,
without calling the application.  With a shared-memory cache every worker
process of the server shares the stored responses; with a tiered cache,
every host.

::

    from fastapi import FastAPI
    from nearcache.aio import AsyncCache
from nearcache.aio._runtime import Event, loop_token, new_event
    from nearcache.contrib.asgi import CacheMiddleware

    app = FastAPI()
    app.add_middleware(CacheMiddleware, cache=AsyncCache("responses"), ttl=30)

What is stored, and under which key
-----------------------------------
* Only requests whose method is in ``methods`` (``GET`` by default) and
  that carry no ``Authorization`` or ``Cookie`` header, nor a request
  ``Cache-Control: no-cache`` / ``no-store`` (such requests go to the
  application, and a ``no-cache`` one refreshes the stored copy).
* Only responses whose status is in ``statuses`` (200 by default), without
  ``Set-Cookie``, without ``Cache-Control: private``/``no-store``/``no-cache``,
  and whose body is at most ``max_body`` bytes.  The response streams to
  the client as the application produces it; it is stored at its end.
* The key is ``nearcache.asgi:`` and a BLAKE2b digest of the method, path,
  query string and the request headers named in ``vary`` (by default
  ``Accept`` and ``Accept-Encoding``), so clients that negotiate different
  representations get their own copies.
* A stored response is replayed with an ``X-Cache: HIT`` header (``MISS``
  when the application answered), and an ``Age`` header.
* Concurrent requests for the same key while it is being computed wait for
  the first one and replay its stored response (one application call per
  key and process, not one per request); across processes each computes
  once at most.
* ``tags`` (a function of the ASGI scope returning tag names) stores a
  response under those tags, so ``await cache.invalidate_tags([...])``
  drops every response of a group at once (:mod:`nearcache.tags`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from nearcache.aio import AsyncCache
from nearcache.aio._runtime import Event, loop_token, new_event
from nearcache.units import Duration

__all__ = ["CacheMiddleware"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KEY_PREFIX = "nearcache.asgi:"
_UNCACHEABLE_DIRECTIVES = (b"private", b"no-store", b"no-cache")


def _directives(value: bytes) -> set[bytes]:
    return {part.strip().split(b"=")[0].lower() for part in value.split(b",")}


class CacheMiddleware:
    """Serve repeated ``GET`` responses from an :class:`~nearcache.aio.AsyncCache`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        cache: AsyncCache,
        ttl: Duration | None = 60,
        methods: Iterable[str] = ("GET",),
        statuses: Iterable[int] = (200,),
        vary: Iterable[str] = ("accept", "accept-encoding"),
        max_body: int = 1024 * 1024,
        tags: Callable[[Scope], Iterable[str]] | None = None,
    ) -> None:
        self.app = app
        self.cache = cache
        self.ttl = ttl
        self.methods = frozenset(m.upper() for m in methods)
        self.statuses = frozenset(statuses)
        self.vary = tuple(name.lower().encode("latin-1") for name in vary)
        self.max_body = max_body
        self.tags = tags
        self.hits = 0
        self.misses = 0
        self._flights: dict[tuple[object, str], Event] = {}

    def cache_key(self, scope: Scope) -> str:
        """The cache key of a request."""
        headers = dict(scope.get("headers") or [])
        digest = hashlib.blake2b(digest_size=16)
        for part in (
            scope["method"].encode("latin-1"),
            scope.get("raw_path") or scope["path"].encode("utf-8"),
            scope.get("query_string", b""),
            *(headers.get(name, b"") for name in self.vary),
        ):
            digest.update(len(part).to_bytes(4, "big") + part)
        return KEY_PREFIX + digest.hexdigest()

    def _bypass(self, scope: Scope) -> tuple[bool, bool]:
        """(skip the cache entirely, skip only the read)."""
        if scope["type"] != "http" or scope["method"] not in self.methods:
            return True, True
        names = {name for name, _ in scope.get("headers") or []}
        if b"authorization" in names or b"cookie" in names:
            return True, True
        for name, value in scope.get("headers") or []:
            if name == b"cache-control":
                directives = _directives(value)
                if b"no-store" in directives:
                    return True, True
                if b"no-cache" in directives:
                    return False, True
        return False, False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        bypass, refresh = self._bypass(scope)
        if bypass:
            await self.app(scope, receive, send)
            return
        key = self.cache_key(scope)
        if not refresh:
            stored = await self.cache.get(key)
            if stored is not None:
                self.hits += 1
                await self._replay(stored, send)
                return
        slot = (loop_token(), key)
        leader = self._flights.get(slot)
        if leader is not None and not refresh:
            # The same request is being answered: wait for it, then replay its
            # stored response (or, if it was not cacheable, ask the app).
            await leader.wait()
            stored = await self.cache.get(key)
            if stored is not None:
                self.hits += 1
                await self._replay(stored, send)
                return
            self.misses += 1
            await self.app(scope, receive, send)
            return
        self.misses += 1
        done = self._flights[slot] = new_event()
        try:
            await self._call_and_store(scope, receive, send, key)
        finally:
            if self._flights.get(slot) is done:
                del self._flights[slot]
            done.set()

    async def _replay(
        self, stored: tuple[int, list[list[bytes]], bytes, float], send: Send
    ) -> None:
        status, headers, body, stored_at = stored
        age = str(max(0, int(time.time() - stored_at))).encode()
        out = [(name, value) for name, value in headers if name != b"age"]
        out += [(b"x-cache", b"HIT"), (b"age", age)]
        await send({"type": "http.response.start", "status": status, "headers": out})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _call_and_store(self, scope: Scope, receive: Receive, send: Send, key: str) -> None:
        start: Message = {}
        chunks: list[bytes] = []
        size = 0
        cacheable = True

        async def capture(message: Message) -> None:
            nonlocal cacheable, size
            if message["type"] == "http.response.start":
                start.update(message)
                cacheable = self._cacheable(message)
                message = dict(message)
                message["headers"] = [*message.get("headers", []), (b"x-cache", b"MISS")]
            elif message["type"] == "http.response.body" and cacheable:
                body = message.get("body", b"")
                size += len(body)
                if size > self.max_body:
                    cacheable = False
                    chunks.clear()
                else:
                    chunks.append(body)
            await send(message)
            if (
                cacheable
                and message["type"] == "http.response.body"
                and not message.get("more_body", False)
            ):
                headers = [[bytes(n), bytes(v)] for n, v in start.get("headers", [])]
                entry = (start["status"], headers, b"".join(chunks), time.time())
                tags = list(self.tags(scope)) if self.tags is not None else []
                await self.cache.set(key, entry, self.ttl, tags=tags)

        await self.app(scope, receive, capture)

    def _cacheable(self, start: Message) -> bool:
        if start.get("status") not in self.statuses:
            return False
        for name, value in start.get("headers", []):
            lower = bytes(name).lower()
            if lower == b"set-cookie":
                return False
            if lower == b"cache-control" and _directives(bytes(value)) & set(
                _UNCACHEABLE_DIRECTIVES
            ):
                return False
        return True
