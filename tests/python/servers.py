"""pytest fixtures running real redis-server and memcached processes.

Servers listen on free 127.0.0.1 ports, are started once per test session
(the ``private_*`` fixtures: once per test, for tests that stop, pause or
restart them) and are stopped by the PID they were started with.

A missing binary skips the tests that need it, with the reason; when the
``CI`` or ``NEARCACHE_REQUIRE_SERVERS`` environment variable is set it fails
them instead, so CI cannot silently skip the server tests.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from nearcache.testing.servers import MemcachedServer, RedisServer, ServerProcess

__all__ = [
    "memcached_server",
    "private_redis_server",
    "redis_server",
    "require_server",
    "unique_prefix",
]


def require_server(kind: type[ServerProcess]) -> None:
    """Skip (or, in CI, fail) the current test when ``kind``'s binary is missing."""
    if kind.available() is not None:
        return
    message = (
        f"{kind.binary} is not installed (Debian/Ubuntu: apt-get install redis-server memcached)"
    )
    if os.environ.get("CI") or os.environ.get("NEARCACHE_REQUIRE_SERVERS"):
        pytest.fail(f"{message}; the server tests must run in CI", pytrace=False)
    pytest.skip(message)


def _start(server: ServerProcess) -> ServerProcess:
    server.start()
    return server


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """One redis-server for the whole session (tests isolate by key prefix)."""
    require_server(RedisServer)
    server = RedisServer(workdir=tmp_path_factory.mktemp("redis"))
    _start(server)
    yield server
    server.close()


@pytest.fixture(scope="session")
def memcached_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MemcachedServer]:
    """One memcached for the whole session (tests isolate by key prefix)."""
    require_server(MemcachedServer)
    server = MemcachedServer(workdir=tmp_path_factory.mktemp("memcached"))
    _start(server)
    yield server
    server.close()


@pytest.fixture
def private_redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, free to be stopped, paused and restarted."""
    require_server(RedisServer)
    server = RedisServer(workdir=tmp_path / "redis")
    server.workdir.mkdir()
    _start(server)
    yield server
    server.close()


@pytest.fixture
def unique_prefix() -> str:
    """A key prefix no other test uses (printable ASCII, safe for memcached)."""
    return f"t{uuid.uuid4().hex[:12]}:"
