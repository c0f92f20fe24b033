"""The driver contract holds on a loaded machine: slow calls make it wait, not fail."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from nearcache.drivers import Driver, MemoryDriver
from nearcache.drivers.base import TTL, Key
from nearcache.testing import DriverContract
from nearcache.testing.contract import _Factory

#: Seconds each write takes, as on a machine whose cores are all busy: the
#: ~15 writes of test_expiry then take about twice its 0.3 s TTL.
WRITE_DELAY = 0.04


class SlowWrites(MemoryDriver):
    """A memory driver whose every write is delayed before it happens."""

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        time.sleep(WRITE_DELAY)
        super().set(key, value, ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        time.sleep(WRITE_DELAY)
        return super().add(key, value, ttl)

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        time.sleep(WRITE_DELAY)
        return super().replace(key, value, ttl)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        time.sleep(WRITE_DELAY)
        super().set_many(mapping, ttl)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        time.sleep(WRITE_DELAY)
        return super().touch(key, ttl)

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        time.sleep(WRITE_DELAY)
        return super().incr(key, delta, default)


class _SlowContract(DriverContract):
    def make_driver(self, **options: Any) -> Driver:
        return SlowWrites(**options)


def test_expiry_counts_from_the_last_write_of_each_group() -> None:
    factory = _Factory(_SlowContract().make_driver)
    try:
        _SlowContract().test_expiry(factory)
    finally:
        factory.close()
