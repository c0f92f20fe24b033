"""Caches from URLs and dicts (nearcache.config)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from nearcache.config import from_dict, from_url
from nearcache.drivers import (
    Driver,
    MemcachedDriver,
    MemoryDriver,
    NullDriver,
    RedisDriver,
    ShmDriver,
)
from nearcache.errors import ConfigurationError
from nearcache.serializers import JsonSerializer
from nearcache.testing import MemcachedServer, RedisServer
from nearcache.tiered import RedisInvalidator, TieredCache


@pytest.fixture
def made() -> Iterator[list[Driver]]:
    drivers: list[Driver] = []
    yield drivers
    for driver in drivers:
        driver.close()


@pytest.fixture(autouse=True)
def _cache_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path / "caches"))


def test_nearcache_by_name(made: list[Driver]) -> None:
    driver = from_url("nearcache://myapp?size=2MiB&ttl=5m&prefix=app:&serializer=json")
    made.append(driver)
    assert isinstance(driver, ShmDriver)
    assert driver.cache.name == "myapp"
    assert driver.cache.capacity == 2 * 1024 * 1024
    assert driver.default_ttl == 300
    assert driver.cache.prefix == b"app:"
    assert isinstance(driver.cache.serializer, JsonSerializer)
    driver.set("k", [1])
    assert driver.get("k") == [1]


def test_nearcache_by_path(tmp_path: Path, made: list[Driver]) -> None:
    path = tmp_path / "by path.cache"
    driver = from_url(f"nearcache://{path.as_posix().replace(' ', '%20')}?size=1MiB")
    made.append(driver)
    assert isinstance(driver, ShmDriver)
    assert driver.cache.path == str(path)
    assert from_url("shm://other?size=1MiB").name == "shm"


def test_memory(made: list[Driver]) -> None:
    driver = from_url("memory://?max_entries=10&max_bytes=1KiB&ttl=30")
    made.append(driver)
    assert isinstance(driver, MemoryDriver)
    assert (driver.max_entries, driver.max_bytes, driver.default_ttl) == (10, 1024, 30)
    unbounded = from_url("memory://?max_entries=none&max_bytes=none")
    assert isinstance(unbounded, MemoryDriver)
    assert unbounded.max_entries is None and unbounded.max_bytes is None


def test_redis(redis_server: RedisServer, made: list[Driver]) -> None:
    url = f"{redis_server.url.rsplit('/', 1)[0]}/3?prefix=cfg:&timeout=0.25&ttl=60&retries=1"
    driver = from_url(url)
    made.append(driver)
    assert isinstance(driver, RedisDriver)
    assert driver.prefix == b"cfg:"
    assert driver.default_ttl == 60
    kwargs = driver.client.connection_pool.connection_kwargs
    assert (kwargs["db"], kwargs["socket_timeout"]) == (3, 0.25)
    driver.set("k", 1)
    assert driver.client.get("cfg:k") == b"1"
    driver.clear()


def test_redis_leaves_its_own_parameters_to_redis_py(redis_server: RedisServer) -> None:
    driver = from_url(f"{redis_server.url}?prefix=p:&client_name=nearcache-test")
    assert isinstance(driver, RedisDriver)
    assert driver.client.connection_pool.connection_kwargs["client_name"] == "nearcache-test"
    driver.close()


def test_memcached(memcached_server: MemcachedServer, made: list[Driver]) -> None:
    driver = from_url(f"memcached://{memcached_server.address}?prefix=cfg:&timeout=0.5")
    made.append(driver)
    assert isinstance(driver, MemcachedDriver)
    assert driver.servers == [memcached_server.address]
    several = from_url("memcached://10.0.0.1:11211,10.0.0.2:11211")  # nothing connects yet
    made.append(several)
    assert isinstance(several, MemcachedDriver)
    assert several.servers == ["10.0.0.1:11211", "10.0.0.2:11211"]
    socket_path = from_url("memcached:///run/memcached.sock")
    made.append(socket_path)
    assert isinstance(socket_path, MemcachedDriver)
    assert socket_path.servers == ["/run/memcached.sock"]


def test_null() -> None:
    assert isinstance(from_url("null://"), NullDriver)


def test_tiered_from_two_urls(redis_server: RedisServer, made: list[Driver]) -> None:
    cache = from_url(
        f"memory://?max_entries=100 {redis_server.url}?prefix=tiered-cfg:",
        l1_ttl="30s",
        on_get_error="raise",
    )
    made.append(cache)
    assert isinstance(cache, TieredCache)
    assert isinstance(cache.l1, MemoryDriver) and isinstance(cache.l2, RedisDriver)
    assert cache.l1_ttl == 30
    assert cache.on_get_error == "raise"
    assert isinstance(cache.invalidator, RedisInvalidator)
    assert cache.invalidator.channel == b"nearcache:invalidate:tiered-cfg:"
    assert cache.wait_ready(5)
    same = from_url(["memory://", f"{redis_server.url}?prefix=tiered-cfg:"], invalidation=None)
    made.append(same)
    assert isinstance(same, TieredCache) and same.invalidator is None


def test_tiered_from_a_dict(
    redis_server: RedisServer, memcached_server: MemcachedServer, made: list[Driver]
) -> None:
    cache = from_dict(
        {
            "l1": {"driver": "nearcache", "name": "tiered-l1", "size": "1MiB"},
            "l2": {"driver": "memcached", "servers": memcached_server.address, "prefix": "d:"},
            "l1_ttl": 10,
            "invalidation": redis_server.url,
            "on_set_error": "ignore",
        }
    )
    made.append(cache)
    assert isinstance(cache, TieredCache)
    assert isinstance(cache.l1, ShmDriver) and isinstance(cache.l2, MemcachedDriver)
    assert cache.wait_ready(5)
    cache.set("k", "v")
    assert cache.get("k") == "v"


def test_dict_forms(redis_server: RedisServer, made: list[Driver]) -> None:
    by_url = from_dict({"url": redis_server.url, "prefix": "x:", "ttl": "1h"})
    made.append(by_url)
    assert isinstance(by_url, RedisDriver)
    assert by_url.prefix == b"x:" and by_url.default_ttl == 3600
    by_driver = from_dict({"driver": "memory", "max_entries": 5, "default_ttl": 2})
    made.append(by_driver)
    assert isinstance(by_driver, MemoryDriver) and by_driver.max_entries == 5
    serializer = JsonSerializer()
    with_object = from_dict({"driver": "redis", "url": redis_server.url, "serializer": serializer})
    made.append(with_object)
    assert with_object.get("nothing") is None


@pytest.mark.parametrize(
    "url",
    [
        "ftp://host",
        "memory://?max_entrys=10",
        "memory://?max_entries=many",
        "redis://localhost?prefixx=a",
        "nearcache://name/and/path",
        "null://?serializer=json",
        "memory:// memory:// memory://",
        "tiered://",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(ConfigurationError):
        from_url(url)


@pytest.mark.parametrize(
    "config",
    [
        {},
        {"driver": "nosuch"},
        {"driver": "memory", "colour": "blue"},
        {"l1": "memory://"},
        {"l1": "memory://", "l2": "memory://", "l3": "memory://"},
        {"l1": "memory://", "l2": "memory://", "on_get_error": "shout"},
        {"l1": 42, "l2": "memory://"},
    ],
)
def test_bad_dicts(config: dict[str, object]) -> None:
    with pytest.raises(ConfigurationError):
        from_dict(config)


def test_tiered_rejects_driver_options() -> None:
    with pytest.raises(ConfigurationError):
        from_url("memory:// memory://", max_entries=3)


def test_passwords_do_not_leak_into_errors() -> None:
    with pytest.raises(ConfigurationError) as info:
        from_url("redis://user:hunter2@localhost/0?nonsense=1&prefix=p:&ttl=-1")
    assert "hunter2" not in str(info.value)
