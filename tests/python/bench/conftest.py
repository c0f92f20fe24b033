"""Fixtures of the benchmark harness tests: a backend context, local servers."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from nearcache.bench.backends import BackendContext
from nearcache.bench.servers import LocalServer, start_memcached, start_redis


@pytest.fixture()
def ctx(tmp_path: Path) -> BackendContext:
    """A context without servers, scratch files under the test's tmp_path."""
    return BackendContext(
        workdir=tmp_path / "work", run_id="test", options={"nearcache_dir": tmp_path / "shm"}
    )


@pytest.fixture(scope="module")
def bench_servers() -> Iterator[tuple[LocalServer, LocalServer]]:
    """redis-server and memcached started by the harness's own helpers."""
    if shutil.which("redis-server") is None or shutil.which("memcached") is None:
        pytest.skip("redis-server or memcached not installed")
    red = start_redis()
    try:
        mem = start_memcached(memory_mb=64)
    except Exception:
        red.stop()
        raise
    try:
        yield red, mem
    finally:
        red.stop()
        mem.stop()


@pytest.fixture()
def server_ctx(tmp_path: Path, bench_servers: tuple[LocalServer, LocalServer]) -> BackendContext:
    """A context with this module's redis-server and memcached."""
    red, mem = bench_servers
    return BackendContext(
        workdir=tmp_path / "work",
        run_id=f"test{tmp_path.name[-8:]}",
        redis_url=red.url,
        memcached=("127.0.0.1", mem.port),
        servers_owned=True,
        options={"nearcache_dir": tmp_path / "shm"},
    )
