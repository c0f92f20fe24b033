"""The server helpers of nearcache.testing.servers."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from servers import require_server

from nearcache.testing import MemcachedServer, RedisServer, ServerError, free_port
from nearcache.testing.servers import RedisClusterServers, _redis_command


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_redis_restarts_on_the_same_port(tmp_path: Path) -> None:
    require_server(RedisServer)
    with RedisServer(workdir=tmp_path) as server:
        port, pid = server.port, server.pid
        assert server.ping()
        server.stop()
        assert not server.running and server.pid is None
        assert not server.ping(0.2)
        server.start()
        assert server.port == port and server.pid != pid
        assert server.ping()
        server.pause()
        assert not server.ping(0.2)
        server.resume()
        assert server.ping()
    assert not server.running


def test_memcached_answers(tmp_path: Path) -> None:
    require_server(MemcachedServer)
    with MemcachedServer(workdir=tmp_path) as server:
        assert server.url == f"memcached://127.0.0.1:{server.port}"
        server.kill()
        assert not server.running


def test_a_missing_binary_is_reported(tmp_path: Path) -> None:
    class Missing(RedisServer):
        binary = "nearcache-no-such-server"

    with pytest.raises(ServerError):
        Missing(workdir=tmp_path).start()


def test_a_port_in_use_is_reported(tmp_path: Path) -> None:
    require_server(RedisServer)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        server = RedisServer(port=sock.getsockname()[1], workdir=tmp_path)
        with pytest.raises(ServerError):
            server.start(timeout=5)
        server.close()


def _is_primary(node: RedisServer) -> bool:
    return b"role:master" in _redis_command(node.host, node.port, "INFO", "replication")


def test_a_cluster_with_replicas_can_fail_over_as_soon_as_it_started(tmp_path: Path) -> None:
    """A replica that never finished its first sync refuses to fail over: start waits for it."""
    require_server(RedisServer)
    if RedisClusterServers.available() is None:
        pytest.skip("redis-cli is not installed")
    with RedisClusterServers(replicas_per_primary=1, workdir=tmp_path) as cluster:
        primaries = [node for node in cluster.nodes if _is_primary(node)]
        replicas = [node for node in cluster.nodes if node not in primaries]
        assert len(primaries) == len(replicas) == 3
        for replica in replicas:
            info = _redis_command(replica.host, replica.port, "INFO", "replication")
            assert b"master_link_status:up" in info
        primaries[0].kill()
        deadline = time.monotonic() + 30.0
        while not any(_is_primary(replica) for replica in replicas):
            assert time.monotonic() < deadline, "no replica was promoted within 30 s"
            time.sleep(0.05)
