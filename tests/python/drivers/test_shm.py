"""ShmDriver specifics: wrapping an open Cache, the hot path, the size limit."""

from __future__ import annotations

from pathlib import Path

import pytest

from nearcache import Cache
from nearcache.drivers import ShmDriver


def test_wraps_an_open_cache(tmp_path: Path) -> None:
    cache = Cache(path=tmp_path / "c", size="1MiB", ttl=30)
    driver = ShmDriver(cache=cache)
    assert driver.cache is cache
    assert driver.default_ttl == 30
    driver.set("k", [1])
    assert cache.get("k") == [1]
    driver.close()
    assert cache.closed


def test_options_and_an_open_cache_do_not_mix(tmp_path: Path) -> None:
    cache = Cache(path=tmp_path / "c", size="1MiB")
    with pytest.raises(TypeError):
        ShmDriver(cache=cache, size="2MiB")
    cache.close()


def test_two_drivers_on_one_file_share_entries(tmp_path: Path) -> None:
    with (
        ShmDriver(path=tmp_path / "shared", size="1MiB") as one,
        ShmDriver(path=tmp_path / "shared") as two,
    ):
        one.set("k", "shared")
        assert two.get("k") == "shared"
        assert one.stats()["driver"] == "shm"


def test_max_value_size_is_the_engine_limit(tmp_path: Path) -> None:
    # With spilling, the limit is the spill budget; without, one entry.
    with ShmDriver(path=tmp_path / "s", size="1MiB", spill_budget="3MiB") as driver:
        assert driver.max_value_size == driver.cache.max_value_size == 3 << 20
        driver.set("k", b"x" * driver.max_value_size)
        assert len(driver.get("k")) == driver.max_value_size
    with ShmDriver(path=tmp_path / "c", size="1MiB", spill_budget=0) as driver:
        assert driver.max_value_size == driver.cache.max_entry_size - 24  # 16-byte header + 8
        driver.set("k", b"x" * driver.max_value_size)
        assert len(driver.get("k")) == driver.max_value_size


def test_bound_get_is_the_caches_get(tmp_path: Path) -> None:
    with ShmDriver(path=tmp_path / "c", size="1MiB") as driver:
        assert driver.bound_get() == driver.cache.get
        driver.set_many({"bytes": b"raw", "obj": {"a": [1]}, 7: "int key"})
        get = driver.bound_get()
        assert (get("bytes", None), get("obj", None), get(7, None)) == (
            b"raw",
            {"a": [1]},
            "int key",
        )
