"""A default cache on a 64 MiB tmpfs with 20 MiB taken by another program.

``benchmarks/small_shm.py`` makes the tmpfs (mount as root, else in a user
namespace) and reports what happened; these tests check that it measured
the case of the issue, and hold the engine to the goals: a reserve of the
file system left free, and a 300 KB value stored by eviction rather than
refused.  Until the engine leaves a reserve those two fail, and are marked
so (strict: the day they pass, the marks must go).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "small_shm.py"
MIB = 1 << 20
NO_RESERVE_YET = (
    "the engine does not leave a reserve of the file system yet, nor evict to make room "
    "for a spilled value (docs/reliability.md, 'A small /dev/shm')"
)


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


@pytest.mark.xfail(strict=True, reason=NO_RESERVE_YET)
def test_a_default_cache_leaves_the_reserve_free(report: dict[str, Any]) -> None:
    assert report["df_filled"]["avail"] >= report["goals"]["reserve_bytes"]


@pytest.mark.xfail(strict=True, reason=NO_RESERVE_YET)
def test_a_300kb_value_is_stored_by_eviction(report: dict[str, Any]) -> None:
    assert report["big_value"]["stored"], report["big_value"]["error"]
