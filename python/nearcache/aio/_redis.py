"""Redis (or Valkey) through ``redis.asyncio``, with the sync driver's rules.

The store borrows everything but the connection from a
:class:`~nearcache.drivers.redis.RedisDriver`: the key function (prefix +
:func:`~nearcache.drivers.base.key_bytes`), the value codec (serializer,
compression, signing), the default TTL, the error mapping to
:class:`~nearcache.drivers.base.BackendError`, and the connection settings
(host or unix socket, database, credentials, TLS, timeouts).  Sync and async
code therefore read each other's entries.

``redis.asyncio`` connections belong to the event loop that opened them, so
the store keeps one client per running loop (dropped with the loop).  Under
trio, which ``redis.asyncio`` does not support, calls go to the sync driver
on the bounded thread pool.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping
from typing import Any, cast

import redis.asyncio
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from nearcache.aio._runtime import Offloader
from nearcache.aio._stores import ThreadStore
from nearcache.drivers.base import (
    TTL,
    CounterOverflowError,
    Key,
    NotACounterError,
    check_counter_args,
    ttl_to_ms,
)
from nearcache.drivers.redis import _INCR_SCRIPT, RedisDriver, _glob_escape

__all__ = ["AsyncRedisStore"]

# Delete KEYS[1] only if it holds ARGV[1] (the encoded lock token).
_DELETE_IF_EQUALS = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_CONNECTION_KEYS = (
    "host",
    "port",
    "db",
    "username",
    "password",
    "socket_timeout",
    "socket_connect_timeout",
    "health_check_interval",
    "client_name",
)
_SCAN_BATCH = 1000
_MISS: Any = object()


def _async_client_options(driver: RedisDriver) -> dict[str, Any]:
    """``redis.asyncio.Redis`` arguments reaching the same server as ``driver``."""
    pool = driver.client.connection_pool
    given = pool.connection_kwargs
    options: dict[str, Any] = {k: given[k] for k in _CONNECTION_KEYS if k in given}
    if "path" in given:
        options["unix_socket_path"] = given["path"]
    if "ssl" in pool.connection_class.__name__.lower():
        options["ssl"] = True
        options.update({k: v for k, v in given.items() if k.startswith("ssl_")})
    options["retry"] = Retry(NoBackoff(), 0)
    max_connections = getattr(pool, "max_connections", None)
    if isinstance(max_connections, int) and max_connections < 2**31:
        options["max_connections"] = max_connections
    return options


class AsyncRedisStore(ThreadStore):
    """A :class:`RedisDriver`'s data through ``redis.asyncio`` (see the module docs)."""

    def __init__(self, driver: RedisDriver, offloader: Offloader) -> None:
        super().__init__(driver, offloader)
        self.driver: RedisDriver = driver
        self._options = _async_client_options(driver)
        self._clients: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, tuple[redis.asyncio.Redis, Any, Any]
        ] = weakref.WeakKeyDictionary()

    def _client(self) -> tuple[redis.asyncio.Redis, Any, Any] | None:
        """This loop's (client, incr script, delete-if-equals script), or None under trio."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        self.driver._check_open()
        entry = self._clients.get(loop)
        if entry is None:
            client = redis.asyncio.Redis(**self._options)
            entry = (
                client,
                client.register_script(_INCR_SCRIPT),
                client.register_script(_DELETE_IF_EQUALS),
            )
            self._clients[loop] = entry
        return entry

    def _fail(self, exc: redis.exceptions.RedisError) -> Any:
        return self.driver._fail(exc)

    # -- reads -------------------------------------------------------------

    async def get(self, key: Key, default: Any = None) -> Any:
        entry = self._client()
        if entry is None:
            return await super().get(key, default)
        k = self.driver._k(key)
        try:
            data = cast("bytes | None", await entry[0].get(k))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return default if data is None else self.driver._decode(data, k, default)

    async def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        entry = self._client()
        if entry is None:
            return await super().get_with_ttl(key, default)
        k = self.driver._k(key)
        try:
            async with entry[0].pipeline(transaction=False) as pipe:
                pipe.get(k)
                pipe.pttl(k)
                data, pttl = await pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        if data is None:
            return default, None
        value = self.driver._decode(data, k, _MISS)
        if value is _MISS:
            return default, None
        return value, (max(pttl, 1) / 1000 if pttl != -1 else None)

    async def get_many(self, keys: list[Key]) -> dict[Any, Any]:
        entry = self._client()
        if entry is None:
            return await super().get_many(keys)
        ks = [self.driver._k(key) for key in keys]
        if not ks:
            return {}
        try:
            values = cast("list[bytes | None]", await entry[0].mget(ks))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        found: dict[Any, Any] = {}
        for key, k, data in zip(keys, ks, values, strict=True):
            if data is not None:
                value = self.driver._decode(data, k, _MISS)
                if value is not _MISS:
                    found[key] = value
        return found

    async def contains(self, key: Key) -> bool:
        entry = self._client()
        if entry is None:
            return await super().contains(key)
        try:
            return bool(await entry[0].exists(self.driver._k(key)))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
            raise

    # -- writes ------------------------------------------------------------

    async def _write(self, key: Key, value: Any, ttl: TTL, *, nx: bool, xx: bool) -> bool:
        entry = self._client()
        assert entry is not None
        k = self.driver._k(key)
        ms = ttl_to_ms(ttl, self.driver._default_ttl_ms)
        data = self.driver._codec.encode(value, k)
        try:
            done = await entry[0].set(k, data, px=ms or None, nx=nx, xx=xx)
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return bool(done)

    async def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        if self._client() is None:
            return await super().set(key, value, ttl)
        await self._write(key, value, ttl, nx=False, xx=False)

    async def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        if self._client() is None:
            return await super().add(key, value, ttl)
        return await self._write(key, value, ttl, nx=True, xx=False)

    async def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        if self._client() is None:
            return await super().replace(key, value, ttl)
        return await self._write(key, value, ttl, nx=False, xx=True)

    async def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        entry = self._client()
        if entry is None:
            return await super().set_many(mapping, ttl)
        ms = ttl_to_ms(ttl, self.driver._default_ttl_ms)
        items = []
        for key, value in mapping.items():
            k = self.driver._k(key)
            items.append((k, self.driver._codec.encode(value, k)))
        if not items:
            return
        try:
            async with entry[0].pipeline(transaction=False) as pipe:
                for k, data in items:
                    pipe.set(k, data, px=ms or None)
                await pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    async def delete(self, key: Key) -> bool:
        entry = self._client()
        if entry is None:
            return await super().delete(key)
        try:
            return bool(await entry[0].delete(self.driver._k(key)))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
            raise

    async def delete_many(self, keys: list[Key]) -> int:
        entry = self._client()
        if entry is None:
            return await super().delete_many(keys)
        ks = list(dict.fromkeys(self.driver._k(key) for key in keys))
        if not ks:
            return 0
        try:
            return int(await entry[0].delete(*ks))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
            raise

    async def pop(self, key: Key, default: Any = None) -> Any:
        entry = self._client()
        if entry is None:
            return await super().pop(key, default)
        k = self.driver._k(key)
        try:
            data = cast("bytes | None", await entry[0].getdel(k))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return default if data is None else self.driver._decode(data, k, default)

    async def touch(self, key: Key, ttl: TTL = None) -> bool:
        entry = self._client()
        if entry is None:
            return await super().touch(key, ttl)
        k = self.driver._k(key)
        ms = ttl_to_ms(ttl, self.driver._default_ttl_ms)
        try:
            if ms:
                return bool(await entry[0].pexpire(k, ms))
            async with entry[0].pipeline(transaction=True) as pipe:
                pipe.persist(k)
                pipe.exists(k)
                _, exists = await pipe.execute()
            return bool(exists)
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
            raise

    async def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        entry = self._client()
        if entry is None:
            return await super().incr(key, delta, default)
        check_counter_args(delta, default)
        k = self.driver._k(key)
        initial = "" if default is None else str(default)
        try:
            result = await entry[1](keys=[k], args=[delta, initial, self.driver._default_ttl_ms])
        except redis.exceptions.ResponseError as exc:
            message = str(exc)
            if "NEARCACHE_MISSING" in message:
                raise KeyError(key) from None
            if "overflow" in message:
                raise CounterOverflowError("counter would leave the signed 64-bit range") from None
            if "not an integer" in message:
                raise NotACounterError(f"the value under {key!r} is not an integer") from None
            self._fail(exc)
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return int(result)

    async def decr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        check_counter_args(delta, default)
        return await self.incr(key, -delta, default)

    async def clear(self) -> None:
        entry = self._client()
        if entry is None:
            return await super().clear()
        client = entry[0]
        pattern = _glob_escape(self.driver.prefix) + b"*"
        try:
            batch: list[bytes] = []
            async for k in client.scan_iter(match=pattern, count=_SCAN_BATCH):
                batch.append(k)
                if len(batch) >= _SCAN_BATCH:
                    await client.unlink(*batch)
                    batch.clear()
            if batch:
                await client.unlink(*batch)
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    async def delete_if_equals(self, key: Key, token: bytes) -> bool:
        entry = self._client()
        if entry is None:
            return await super().delete_if_equals(key, token)
        k = self.driver._k(key)
        data = self.driver._codec.encode(token, k)
        try:
            return bool(await entry[2](keys=[k], args=[data]))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
            raise

    async def aclose(self) -> None:
        """Close this loop's client (other loops' clients go with their loop)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        entry = self._clients.pop(loop, None)
        if entry is not None:
            await entry[0].aclose()
