"""Socket peers: redis-py and pymemcache against local servers.

Keys are namespaced ``nearcache-bench:<run>:<store>:`` so a run never touches
data it did not write.  Clearing a Redis store deletes its prefix with SCAN
(never FLUSHDB).  memcached cannot list keys: on a server this run started,
clearing flushes it; on a server given with ``--memcached`` the store moves
to a fresh key generation instead, and every key is written with a 10-minute
expiry so nothing outlives the run for long.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .base import Backend, Handle, Scope, import_module
from .registry import register

__all__ = ["MemcachedBackend", "RedisBackend", "memcached_client", "redis_delete_prefix"]

#: Expiry (seconds) of keys written to a memcached server this run does not own.
FOREIGN_EXPIRY = 600


def redis_delete_prefix(url: str, prefix: str) -> int:
    """Delete every key starting with ``prefix`` (SCAN + DEL in batches); return the count."""
    client = import_module("redis").Redis.from_url(url)
    deleted = 0
    try:
        batch: list[Any] = []
        for key in client.scan_iter(match=prefix.replace("*", r"\*") + "*", count=1000):
            batch.append(key)
            if len(batch) >= 500:
                deleted += int(client.delete(*batch))
                batch = []
        if batch:
            deleted += int(client.delete(*batch))
    finally:
        client.close()
    return deleted


def memcached_client(server: tuple[str, int]) -> Any:
    """A pymemcache client that waits for every reply (``default_noreply=False``)."""
    base = import_module("pymemcache.client.base")
    return base.Client(
        server, no_delay=True, default_noreply=False, connect_timeout=5.0, timeout=10.0
    )


@register
class RedisBackend(Backend):
    """redis-py's ``Redis`` client, one connection per process."""

    name = "redis"
    title = "redis-py against a local redis-server (TCP loopback)"
    scope = Scope.NETWORK
    requires = ("redis",)
    dist = "redis"
    server = "redis"
    tradeoff = "a network server: one round trip per call, but shared by every host"

    def setup(self) -> None:
        self.url = str(self.ctx.redis_url)
        self.prefix = f"nearcache-bench:{self.ctx.run_id}:{self.tag}:"
        self._limit = "unbounded (server maxmemory left as is)"

    def open(self) -> Handle:
        client = import_module("redis").Redis.from_url(self.url)
        rget, rset, rdel = client.get, client.set, client.delete
        p = self.prefix
        return Handle(
            get=lambda k: rget(p + k),
            set=lambda k, v: rset(p + k, v),
            delete=lambda k: rdel(p + k),
            close=client.close,
        )

    def clear(self) -> None:
        redis_delete_prefix(self.url, self.prefix)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.clear()


@register
class MemcachedBackend(Backend):
    """pymemcache's ``Client``, one connection per process."""

    name = "memcached"
    title = "pymemcache against a local memcached (TCP loopback)"
    scope = Scope.NETWORK
    requires = ("pymemcache",)
    dist = "pymemcache"
    server = "memcached"
    tradeoff = "a network server: one round trip per call, but shared by every host"

    def setup(self) -> None:
        assert self.ctx.memcached is not None
        self.address = self.ctx.memcached
        self.generation = 0
        self._limit = "unbounded (server memory limit)"

    def key_prefix(self) -> str:
        """Current key namespace of this store."""
        return f"nearcache-bench:{self.ctx.run_id}:{self.tag}:{self.generation}:"

    def open(self) -> Handle:
        client = memcached_client(self.address)
        mget, mset, mdel = client.get, client.set, client.delete
        p = self.key_prefix()
        expire = 0 if self.ctx.servers_owned else FOREIGN_EXPIRY
        return Handle(
            get=lambda k: mget(p + k),
            set=lambda k, v: mset(p + k, v, expire),
            delete=lambda k: mdel(p + k),
            close=client.close,
        )

    def clear(self) -> None:
        if self.ctx.servers_owned:
            client = memcached_client(self.address)
            try:
                client.flush_all(noreply=False)
            finally:
                client.close()
        else:
            self.generation += 1
