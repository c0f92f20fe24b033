"""Every driver against the one contract suite, with real servers."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from nearcache.drivers import MemcachedDriver, MemoryDriver, NullDriver, RedisDriver, ShmDriver
from nearcache.testing import DriverContract, MemcachedServer, NullDriverContract, RedisServer

_numbers = itertools.count()


class TestMemoryDriver(DriverContract):
    def make_driver(self, **options: Any) -> MemoryDriver:
        return MemoryDriver(max_bytes=8 * 1024 * 1024, **options)


class TestNullDriver(NullDriverContract):
    def make_driver(self, **options: Any) -> NullDriver:
        return NullDriver(**options)


class TestShmDriver(DriverContract):
    @pytest.fixture(autouse=True)
    def _directory(self, tmp_path: Path) -> None:
        self.directory = tmp_path

    def make_driver(self, **options: Any) -> ShmDriver:
        path = self.directory / f"cache-{next(_numbers)}"
        return ShmDriver(path=path, size="8MiB", spill_budget="4MiB", **options)


class TestRedisDriver(DriverContract):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server: RedisServer, unique_prefix: str) -> None:
        self.url = redis_server.url
        self.prefix = unique_prefix

    def make_driver(self, **options: Any) -> RedisDriver:
        return RedisDriver(self.url, prefix=f"{self.prefix}{next(_numbers)}:", **options)


class TestMemcachedDriver(DriverContract):
    @pytest.fixture(autouse=True)
    def _server(self, memcached_server: MemcachedServer, unique_prefix: str) -> None:
        self.address = memcached_server.address
        self.prefix = unique_prefix

    def make_driver(self, **options: Any) -> MemcachedDriver:
        return MemcachedDriver(self.address, prefix=f"{self.prefix}{next(_numbers)}:", **options)
