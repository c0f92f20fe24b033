"""The server helpers of nearcache.testing.servers."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from servers import require_server

from nearcache.testing import MemcachedServer, RedisServer, ServerError, free_port


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
