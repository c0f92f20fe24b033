"""AsyncCache over every store, judged by the driver contract (asyncio and trio)."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from nearcache.aio import AsyncCache
from nearcache.drivers import Driver, MemcachedDriver, MemoryDriver, RedisDriver, ShmDriver
from nearcache.testing import DriverContract, MemcachedServer, RedisServer
from nearcache.tiered import TieredCache

from ._adapter import AsyncAsDriver, AsyncioRunner, TrioRunner, make_runner

_numbers = itertools.count()


class _AsyncContract(DriverContract):
    runner_kind = "asyncio"
    runner: AsyncioRunner | TrioRunner

    @pytest.fixture(autouse=True)
    def _runner(self) -> Iterator[None]:
        if self.runner_kind == "trio":
            pytest.importorskip("trio")
        self.runner = make_runner(self.runner_kind)
        yield
        self.runner.close()

    def make_sync(self, **options: Any) -> Driver:
        raise NotImplementedError

    def make_driver(self, **options: Any) -> Driver:
        return AsyncAsDriver(AsyncCache(self.make_sync(**options)), self.runner)


class _Shm(_AsyncContract):
    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> None:
        self.directory = tmp_path

    def make_sync(self, **options: Any) -> Driver:
        return ShmDriver(
            path=self.directory / f"cache-{next(_numbers)}",
            size="8MiB",
            spill_budget="4MiB",
            **options,
        )


class _Redis(_AsyncContract):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server: RedisServer, unique_prefix: str) -> None:
        self.url = redis_server.url
        self.prefix = unique_prefix

    def make_sync(self, **options: Any) -> Driver:
        return RedisDriver(self.url, prefix=f"{self.prefix}{next(_numbers)}:", **options)


class TestAsyncShm(_Shm):
    pass


class TestAsyncMemory(_AsyncContract):
    def make_sync(self, **options: Any) -> Driver:
        return MemoryDriver(max_bytes=8 * 1024 * 1024, **options)


class TestAsyncRedis(_Redis):
    pass


class TestAsyncMemcached(_AsyncContract):
    @pytest.fixture(autouse=True)
    def _server(self, memcached_server: MemcachedServer, unique_prefix: str) -> None:
        self.address = memcached_server.address
        self.prefix = unique_prefix

    def make_sync(self, **options: Any) -> Driver:
        return MemcachedDriver(self.address, prefix=f"{self.prefix}{next(_numbers)}:", **options)


class TestAsyncTieredShmOverRedis(_AsyncContract):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server: RedisServer, unique_prefix: str, tmp_path: Path) -> None:
        self.url = redis_server.url
        self.prefix = unique_prefix
        self.directory = tmp_path

    def make_sync(self, **options: Any) -> Driver:
        n = next(_numbers)
        l1 = ShmDriver(path=self.directory / f"l1-{n}", size="8MiB")
        l2 = RedisDriver(self.url, prefix=f"{self.prefix}{n}:", **options)
        return TieredCache(l1, l2, invalidation=self.url)


class TestTrioShm(_Shm):
    runner_kind = "trio"


class TestTrioRedis(_Redis):
    """Under trio, Redis calls run the sync driver on the bounded thread pool."""

    runner_kind = "trio"
