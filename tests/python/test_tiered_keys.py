"""A tiered operation encodes each key once, at its door, and hands the bytes down.

The key's bytes serve the change counters (:mod:`nearcache.tiered.shared`),
the invalidation message and, for an L2 whose driver encodes with
``key_bytes`` (Redis, memcached, memory), the L2 call itself
(:class:`~nearcache.drivers.base.EncodedKey`).  The L1 here is shared
memory, whose engine encodes keys itself (in Rust, not counted).  Every
Python encoding goes through ``nearcache.drivers.base.encode_key``, which
the test counts.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import nearcache.drivers.base as driver_base
from nearcache.drivers import Driver, MemoryDriver, RedisDriver, ShmDriver
from nearcache.drivers.base import EncodedKey, key_bytes
from nearcache.testing import RedisServer
from nearcache.tiered import TieredCache

KEYS: list[Any] = ["user:1", b"\x01raw", 7]


class Counter:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[object] = []
        real = driver_base.encode_key

        def counting(key: object) -> bytes:
            self.calls.append(key)
            return real(key)

        monkeypatch.setattr(driver_base, "encode_key", counting)

    def during(self, action: Callable[[], object]) -> int:
        self.calls.clear()
        action()
        return len(self.calls)


@pytest.fixture(params=["memory", "redis"])
def tiered(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TieredCache]:
    l2: Driver
    if request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        prefix: str = request.getfixturevalue("unique_prefix")
        l2 = RedisDriver(server.url, prefix=prefix)  # invalidations pipelined with writes
    else:
        l2 = MemoryDriver()
    cache = TieredCache(ShmDriver(path=tmp_path / "l1", size="4MiB"), l2)
    yield cache
    cache.close()


@pytest.mark.parametrize("key", KEYS)
def test_each_operation_encodes_its_key_once(
    tiered: TieredCache, key: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = Counter(monkeypatch)
    operations: list[tuple[str, Callable[[], object]]] = [
        ("set", lambda: tiered.set(key, 1)),
        ("add", lambda: tiered.add(key, 1)),
        ("replace", lambda: tiered.replace(key, 2)),
        ("touch", lambda: tiered.touch(key, 60)),
        ("incr", lambda: tiered.incr(key, 1)),
        ("get from L2", lambda: (tiered.l1.delete(key), tiered.get(key))),
        ("get_with_ttl", lambda: tiered.get_with_ttl(key)),
        ("pop", lambda: tiered.pop(key)),
        ("delete", lambda: tiered.delete(key)),
    ]
    counts = {name: counter.during(action) for name, action in operations}
    assert counts == dict.fromkeys(counts, 1)
    assert tiered.get(key) is None  # and the operations did what they say
    tiered.set(key, "v")
    assert tiered.get(key) == "v" and tiered.l2.get(key) == "v"


def test_many_key_operations_encode_each_key_once(
    tiered: TieredCache, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = Counter(monkeypatch)
    assert counter.during(lambda: tiered.set_many(dict.fromkeys(KEYS, "v"))) == len(KEYS)
    tiered.l1.clear()
    found: dict[Any, Any] = {}
    assert counter.during(lambda: found.update(tiered.get_many(KEYS))) == len(KEYS)
    assert found == dict.fromkeys(KEYS, "v")
    assert counter.during(lambda: tiered.delete_many(KEYS)) == len(KEYS)
    assert tiered.get_many(KEYS) == {} and tiered.l2.get_many(KEYS) == {}


def test_an_encoded_key_is_the_key_it_encodes() -> None:
    encoded_side, plain_side = MemoryDriver(), MemoryDriver()
    for key in KEYS:
        encoded = EncodedKey(key_bytes(key), key)
        assert key_bytes(encoded) is encoded  # not encoded again
        encoded_side.set(encoded, key)
        plain_side.set(key, key)
        assert encoded_side.get(key) == key  # the same entry as the key itself
        assert repr(encoded) == repr(key)  # messages name the key, not its bytes
    assert sorted(map(repr, encoded_side.keys())) == sorted(map(repr, plain_side.keys()))


@pytest.mark.parametrize("key", KEYS)
def test_errors_name_the_callers_key(tiered: TieredCache, key: Any) -> None:
    with pytest.raises(KeyError) as raised:
        tiered.incr(key, 1, None)
    assert raised.value.args == (key,)
    tiered.set(key, "text")
    with pytest.raises(TypeError, match=re.escape(repr(key))):
        tiered.incr(key, 1)
