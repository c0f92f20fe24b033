"""Test helpers shipped with nearcache: the driver contract and real servers.

* :class:`DriverContract` / :class:`NullDriverContract`: the pytest suite
  every driver passes (:mod:`nearcache.testing.contract`).  Needs pytest.
* :class:`RedisServer` / :class:`MemcachedServer`: throw-away server
  processes on loopback ports (:mod:`nearcache.testing.servers`).
"""

from __future__ import annotations

from nearcache.testing.contract import VALUES, DriverContract, NullDriverContract
from nearcache.testing.servers import (
    MemcachedServer,
    RedisServer,
    ServerError,
    ServerProcess,
    free_port,
)

__all__ = [
    "VALUES",
    "DriverContract",
    "MemcachedServer",
    "NullDriverContract",
    "RedisServer",
    "ServerError",
    "ServerProcess",
    "free_port",
]
