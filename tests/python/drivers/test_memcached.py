"""MemcachedDriver specifics: the key hashing rule, counters, several servers, timeouts."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pymemcache.client.base import Client

from nearcache.drivers import BackendError, MemcachedDriver
from nearcache.drivers.memcached import memcached_key
from nearcache.testing import MemcachedServer


@pytest.fixture
def raw(memcached_server: MemcachedServer) -> Iterator[Client]:
    client = Client(memcached_server.address)
    yield client
    client.close()


def hashed(prefix: bytes, key: bytes) -> bytes:
    return prefix + b"#" + hashlib.sha256(key).hexdigest().encode()


@pytest.mark.parametrize(
    ("key", "sent"),
    [
        (b"plain:key-1", b"p:plain:key-1"),
        (b"x" * 248, b"p:" + b"x" * 248),
        (b"x" * 249, hashed(b"p:", b"x" * 249)),  # 251 bytes with the prefix
        (b"with space", hashed(b"p:", b"with space")),
        (b"new\nline", hashed(b"p:", b"new\nline")),
        (b"del\x7f", hashed(b"p:", b"del\x7f")),
        ("ключ".encode(), hashed(b"p:", "ключ".encode())),
        (b"\xff42", hashed(b"p:", b"\xff42")),  # int keys
        (b"#abc", hashed(b"p:", b"#abc")),  # could pass for a hash: hashed too
    ],
)
def test_key_rule(key: bytes, sent: bytes) -> None:
    assert memcached_key(b"p:", key) == sent
    assert len(sent) <= 250


def test_prefix_rule() -> None:
    with pytest.raises(ValueError):
        MemcachedDriver(prefix="has space")
    with pytest.raises(ValueError):
        MemcachedDriver(prefix="p" * 186)
    MemcachedDriver(prefix="p" * 185).close()


def test_keys_as_memcached_sees_them(
    memcached_server: MemcachedServer, raw: Client, unique_prefix: str
) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix=unique_prefix)
    driver.set("simple", "v")
    driver.set("with space", 41)
    prefix = unique_prefix.encode()
    assert raw.get(prefix + b"simple") == b"\x01v"
    assert raw.get(hashed(prefix, b"with space")) == b"41"
    assert raw.incr(hashed(prefix, b"with space"), 1) == 42
    assert driver.get("with space") == 42


def test_counters_keep_their_ttl(
    memcached_server: MemcachedServer, raw: Client, unique_prefix: str
) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix=unique_prefix)
    driver.set("n", 10, ttl=100)
    assert driver.incr("n", 5) == 15  # memcached's own incr
    assert driver.decr("n", 20) == -5  # compare-and-swap below zero
    assert driver.incr("n", 1) == -4  # a negative counter: compare-and-swap again
    left = driver.get_with_ttl("n")[1]
    assert left is not None and 95 <= left <= 102


def test_values_over_the_item_size_are_refused_before_sending(
    memcached_server: MemcachedServer, unique_prefix: str
) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix=unique_prefix, max_value_size=1000)
    driver.set("k", "small")
    with pytest.raises(ValueError):
        driver.set("k", b"x" * 1000)
    assert driver.get("k") == "small"


def test_several_servers_share_the_keys(tmp_path: Path, unique_prefix: str) -> None:
    with MemcachedServer(workdir=tmp_path) as one, MemcachedServer(workdir=tmp_path) as two:
        driver = MemcachedDriver([one.address, two.address], prefix=unique_prefix)
        items = {f"key-{i}": i for i in range(200)}
        driver.set_many(items)
        assert driver.get_many(list(items)) == items
        per_server = []
        for server in (one, two):
            client = Client(server.address)
            keys = [memcached_key(unique_prefix.encode(), k.encode()) for k in items]
            per_server.append(len(client.get_many(keys)))
            client.close()
        assert sum(per_server) == 200
        assert min(per_server) > 50  # spread, not all on one server
        assert driver.delete_many(list(items)) == 200
        assert driver.incr("counter") == 1
        driver.clear()
        driver.close()


def test_a_stopped_or_frozen_server_fails_fast(tmp_path: Path) -> None:
    server = MemcachedServer(workdir=tmp_path)
    server.start()
    driver = MemcachedDriver(server.address, timeout=0.3, connect_timeout=0.3)
    driver.set("k", 1)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError):
            driver.get("k")
        assert time.monotonic() - started < 2.0
    finally:
        server.resume()
    assert driver.get("k") == 1
    server.stop()
    with pytest.raises(BackendError):
        driver.get("k")
    with pytest.raises(BackendError):
        driver.set("k", 2)
    driver.close()
    server.close()
