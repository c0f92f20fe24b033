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
    with ShmDriver(path=tmp_path / "c", size="1MiB") as driver:
        assert driver.max_value_size == driver.cache.max_entry_size - 32
        driver.set("k", b"x" * (driver.max_value_size - 1))
        assert len(driver.get("k")) == driver.max_value_size - 1


def test_bound_get_matches_cache_get(tmp_path: Path) -> None:
    with ShmDriver(
        path=tmp_path / "c", size="1MiB", compress="zstd", compress_threshold=10
    ) as driver:
        cache, get = driver.cache, driver.bound_get()
        cache.set_many({"bytes": b"raw", "text": "t" * 100, "obj": {"a": [1]}, 7: "int key"})
        cache.native.set("foreign", b"junk", None, 0xFFFF_0010)  # flags the codec rejects
        miss = object()
        for key in ("bytes", "text", "obj", 7, "foreign", "absent"):
            assert get(key, miss) == cache.get(key, miss)
        assert get("absent", miss) is miss
        before = cache.stats()["decode_errors"]
        assert get("foreign", miss) is miss
        assert cache.stats()["decode_errors"] == before + 1


def test_bound_get_of_a_signed_cache_verifies(tmp_path: Path) -> None:
    with ShmDriver(path=tmp_path / "c", size="1MiB", signing_key=b"k" * 32) as driver:
        driver.set("k", "signed")
        driver.cache.native.set("planted", b"unsigned")
        get = driver.bound_get()
        assert get("k", None) == "signed"
        assert get("planted", "miss") == "miss"
