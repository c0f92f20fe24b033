"""A default cache on a 64 MiB tmpfs with 20 MiB taken by another program.

``benchmarks/small_shm.py`` makes the tmpfs (mount as root, else in a user
namespace) and reports what happened; these tests check that it measured
the case of the issue, and hold the engine to the goals: a reserve of the
file system left free, and a 300 KB value stored by eviction rather than
refused.  The ``fs_reserve`` option itself is tested here too.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from nearcache import Cache
from nearcache.errors import CacheFullError, ConfigurationError

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "small_shm.py"
MIB = 1 << 20


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode == 2:
        pytest.skip(f"no small tmpfs on this machine: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_the_case_of_the_issue_is_measured(report: dict[str, Any]) -> None:
    assert report["df_empty"]["size"] == 64 * MIB
    assert report["df_empty"]["used"] < MIB
    assert report["df_other"]["used"] - report["df_empty"]["used"] >= 20 * MIB
    filled = report["filled"]
    assert report["cache"]["size"] > 60 * MIB  # Cache("app"): the 64 MiB default
    assert filled["evictions"] > 0 and filled["entries"] > 0, filled
    assert filled["set_errors"] == {}, "a full tmpfs makes the cache evict, never fail a set"
    big = report["big_value"]
    assert big["stored"] or "Error" in big["error"], big


def test_a_default_cache_leaves_the_reserve_free(report: dict[str, Any]) -> None:
    assert report["df_filled"]["avail"] >= report["goals"]["reserve_bytes"]


def test_a_300kb_value_is_stored_by_eviction(report: dict[str, Any]) -> None:
    assert report["big_value"]["stored"], report["big_value"]["error"]


def test_fs_reserve_takes_sizes(tmp_path: Path) -> None:
    for reserve in ("8MiB", 1 << 20, 0, "0"):
        with Cache(path=tmp_path / "c", size="1MiB", fs_reserve=reserve) as c:
            c["k"] = "v"
            assert c["k"] == "v"
    for bad in ("lots", -1, 1.5):
        with pytest.raises(ConfigurationError):
            Cache(path=tmp_path / "c", size="1MiB", fs_reserve=bad)  # type: ignore[arg-type]


def test_a_reserve_larger_than_the_file_system_refuses_to_grow(tmp_path: Path) -> None:
    # Nothing can be reserved and leave 1 PiB free: the new file is refused,
    # naming the option.
    with pytest.raises(CacheFullError, match="fs_reserve"):
        Cache(path=tmp_path / "c", size="1MiB", fs_reserve=1 << 50)
    assert not (tmp_path / "c").exists()


def test_django_passes_fs_reserve(tmp_path: Path) -> None:
    pytest.importorskip("django")
    from nearcache.contrib.django import NearCache

    with pytest.raises(CacheFullError, match="fs_reserve"):
        NearCache(str(tmp_path / "refused"), {"OPTIONS": {"size": "1MiB", "fs_reserve": 1 << 50}})
    site = NearCache(str(tmp_path / "site"), {"OPTIONS": {"size": "1MiB", "fs_reserve": "4MiB"}})
    site.set("k", 1)
    assert site.get("k") == 1
