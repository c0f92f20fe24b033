"""Test helpers shipped with nearcache: the driver contract and real servers.

* :class:`DriverContract` / :class:`NullDriverContract`: the pytest suite
  every driver passes (:mod:`nearcache.testing.contract`; needs pytest,
  imported on first use).
* :class:`RedisServer` / :class:`MemcachedServer`: throw-away server
  processes on loopback ports (:mod:`nearcache.testing.servers`; no
  dependencies, usable from benchmarks and scripts).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from nearcache.testing.servers import (
    MemcachedServer,
    RedisServer,
    ServerError,
    ServerProcess,
    free_port,
)

if TYPE_CHECKING:
    from nearcache.testing.contract import VALUES, DriverContract, NullDriverContract

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

_CONTRACT = frozenset({"VALUES", "DriverContract", "NullDriverContract"})


def __getattr__(name: str) -> Any:
    if name in _CONTRACT:
        return getattr(importlib.import_module("nearcache.testing.contract"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
