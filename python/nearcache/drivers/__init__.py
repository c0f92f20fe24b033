"""Drivers: one API over the stores nearcache can use.

========================  ==========  ===============================================
class                     name        store
========================  ==========  ===============================================
:class:`ShmDriver`        ``shm``     this host's shared-memory cache (nearcache.Cache)
:class:`MemoryDriver`     ``memory``  a bounded LRU dict in this process
:class:`RedisDriver`      ``redis``   Redis or Valkey, through redis-py
:class:`MemcachedDriver`  ``memcached``  memcached, through pymemcache
:class:`NullDriver`       ``null``    nothing: every read misses
========================  ==========  ===============================================

The protocol (methods, keys, values, the one TTL rule, errors) is
:class:`~nearcache.drivers.base.Driver`; every driver passes the contract
suite in :mod:`nearcache.testing`.  :class:`RedisDriver` and
:class:`MemcachedDriver` import their client library on first use, so
``nearcache.drivers`` works without redis-py or pymemcache installed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nearcache.drivers.base import TTL, BackendError, Driver, key_bytes, ttl_to_ms
from nearcache.drivers.memory import MemoryDriver
from nearcache.drivers.null import NullDriver

if TYPE_CHECKING:
    from nearcache.drivers.memcached import MemcachedDriver
    from nearcache.drivers.redis import RedisDriver
    from nearcache.drivers.shm import ShmDriver

__all__ = [
    "TTL",
    "BackendError",
    "Driver",
    "MemcachedDriver",
    "MemoryDriver",
    "NullDriver",
    "RedisDriver",
    "ShmDriver",
    "key_bytes",
    "ttl_to_ms",
]

_LAZY = {
    "RedisDriver": "nearcache.drivers.redis",
    "MemcachedDriver": "nearcache.drivers.memcached",
    "ShmDriver": "nearcache.drivers.shm",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
