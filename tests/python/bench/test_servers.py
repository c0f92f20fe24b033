"""Local servers for --start-servers, and the server backends in a tiny run."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from nearcache.bench import PROFILES, RunOptions, run
from nearcache.bench.servers import LocalServer, free_port


def test_free_port_is_bindable() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_one_server_module() -> None:
    """The harness starts its servers with the test suite's helpers, not a copy."""
    from nearcache.bench import servers as bench_servers
    from nearcache.testing import servers as testing_servers

    assert bench_servers.free_port is testing_servers.free_port
    assert not hasattr(bench_servers, "_wait_listening")


def test_servers_answer(bench_servers: tuple[LocalServer, LocalServer]) -> None:
    red, mem = bench_servers
    for server in (red, mem):
        assert server.running
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as conn:
            conn.sendall(b"PING\r\n" if server.kind == "redis" else b"version\r\n")
            assert conn.recv(64)
    assert red.url.startswith("redis://127.0.0.1:")


@pytest.mark.timeout(120)
def test_start_servers_run_and_stop(tmp_path: Path) -> None:
    import shutil

    if shutil.which("redis-server") is None or shutil.which("memcached") is None:
        pytest.skip("redis-server or memcached not installed")
    result, _ = run(
        RunOptions(
            workloads=["chi-2010"],
            backends=["redis", "memcached", "django-redis", "django-memcached", "tiered"],
            profile=PROFILES["tiny"],
            workdir=tmp_path,
            nearcache_dir=tmp_path / "shm",
            start_servers=True,
            progress=False,
            print_tables=False,
        )
    )
    assert "started" in result.servers["redis"] and "started" in result.servers["memcached"]
    case = result.workloads[0].case("1:10-medium")
    assert case is not None
    for name in ("redis", "memcached", "django-redis", "django-memcached"):
        m = case.get(name)
        assert m is not None, case.skipped
        assert m.metrics["hit_rate"] == 1.0
    # The servers were stopped: their ports no longer answer.
    for info in result.servers.values():
        port = int(re.findall(r"127\.0\.0\.1:(\d+)", str(info))[0])
        with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
            pass
