"""Shared fixtures for the Python tests.

The server fixtures live in ``servers.py`` beside this file; they are
imported here so that every test module can request them by name.
"""

from __future__ import annotations

from servers import (
    memcached_server,
    private_redis_server,
    redis_server,
    unique_prefix,
)

__all__ = ["memcached_server", "private_redis_server", "redis_server", "unique_prefix"]
