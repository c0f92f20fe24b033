"""Start local redis-server and memcached for a run (``--start-servers``).

The processes are :mod:`nearcache.testing.servers` ones (the same port
choice, readiness probe and retry on a port race as the test suite's): each
listens on a free port of 127.0.0.1 only, keeps nothing on disk, and is
stopped by its PID (SIGTERM, then SIGKILL) when the run ends.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from nearcache.testing.servers import (
    MemcachedServer,
    RedisServer,
    ServerError,
    ServerProcess,
    free_port,
)

__all__ = ["LocalServer", "free_port", "start_memcached", "start_redis", "started_servers"]


@dataclass
class LocalServer:
    """A server process this run started, with its version for the report."""

    kind: str
    server: ServerProcess
    version: str = ""

    @property
    def port(self) -> int:
        """The loopback port it listens on."""
        return self.server.port

    @property
    def running(self) -> bool:
        """Whether the process is alive."""
        return self.server.running

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` or ``127.0.0.1:PORT``."""
        if isinstance(self.server, MemcachedServer):
            return self.server.address
        return f"redis://{self.server.host}:{self.port}/0"

    def stop(self) -> None:
        """Stop the process by PID (SIGTERM, then SIGKILL) and remove its directory."""
        self.server.close()


def _started(kind: str, server: ServerProcess, timeout: float) -> LocalServer:
    if server.available() is None:
        raise FileNotFoundError(f"{server.binary} not found on PATH")
    try:
        server.start(timeout)
    except ServerError:
        server.close()
        raise
    return LocalServer(kind, server, server.version())


def start_redis(timeout: float = 10.0) -> LocalServer:
    """Start redis-server on a free loopback port, without persistence."""
    return _started("redis", RedisServer(), timeout)


def start_memcached(memory_mb: int = 1024, timeout: float = 10.0) -> LocalServer:
    """Start memcached on a free loopback port (TCP only)."""
    return _started("memcached", MemcachedServer(memory_mb=memory_mb), timeout)


@contextlib.contextmanager
def started_servers(redis: bool = True, memcached: bool = True) -> Iterator[dict[str, LocalServer]]:
    """Start the requested servers; stop them when the block exits.

    A server whose binary is missing or fails to start is left out of the
    returned mapping (its backends are then skipped with a reason); the
    exception text is kept under ``"<kind>-error"`` in :data:`start_errors`.
    """
    servers: dict[str, LocalServer] = {}
    start_errors.clear()
    try:
        for kind, wanted, starter in (
            ("redis", redis, start_redis),
            ("memcached", memcached, start_memcached),
        ):
            if not wanted:
                continue
            try:
                servers[kind] = starter()
            except Exception as exc:
                start_errors[kind] = f"{type(exc).__name__}: {exc}"
        yield servers
    finally:
        for server in servers.values():
            server.stop()


#: Why a requested server could not be started, by kind (filled by started_servers).
start_errors: dict[str, str] = {}
