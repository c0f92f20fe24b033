"""The holds workload: entries counted in each workload's own replay, against the bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from nearcache.bench import PROFILES, RunOptions, run


@pytest.mark.timeout(120)
def test_holds_counts_entries_against_the_bound(tmp_path: Path) -> None:
    backends = ["nearcache-native", "nearcache", "cachebox", "dict", "lmdb"]
    result, tables = run(
        RunOptions(
            workloads=["holds"],
            backends=backends,
            profile=PROFILES["tiny"],
            workdir=tmp_path,
            nearcache_dir=tmp_path / "shm",
            progress=False,
            print_tables=False,
        )
    )
    assert tables["holds"]
    w = result.workloads[0]
    assert [c.case for c in w.cases] == [
        "django-8proc", "zipf", "zipf+scan", "fastmmap-bin-1628", "fastmmap-complex-55",
    ]  # fmt: skip
    for case in w.cases:
        assert "not counted" in case.skipped["lmdb"]
        for m in case.measurements:
            mm = m.metrics
            assert mm["samples"] > 0
            assert mm["held_min"] <= mm["held_mean"] <= mm["held_max"]
            assert mm["held_ratio"] == pytest.approx(mm["held_mean"] / mm["bound"])
        lru, floor = case.get("cachebox"), case.get("dict")
        assert lru is not None and floor is not None
        assert lru.metrics["held_max"] <= lru.metrics["bound"]  # maxsize is a ceiling
        assert floor.metrics["held_mean"] >= lru.metrics["held_mean"]  # unbounded: the most
    # In zipf every miss inserts a new key: a full LRU holds exactly its maxsize.
    zipf = w.case("zipf")
    assert zipf is not None
    lru = zipf.get("cachebox")
    assert lru is not None and lru.metrics["held_min"] == lru.metrics["bound"] == 100
    ours = zipf.get("nearcache-native")
    assert ours is not None and "holds ~100 entries on average" in ours.info["limit"]
    # The byte budget: count-bounded caches get budget / (key + mean value) entries.
    big = w.case("fastmmap-bin-1628")
    assert big is not None and big.get("cachebox").metrics["bound"] < 120  # type: ignore[union-attr]
