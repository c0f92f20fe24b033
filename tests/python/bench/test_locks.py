"""The ``locks`` workload: the fight loop keeps count, a tiny run end to end."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from nearcache.bench import PROFILES, RunOptions, run
from nearcache.bench.workloads import WORKLOADS, default_workloads
from nearcache.bench.workloads.locks import CONTENDERS, _flock_lock, _nearcache_lock, fight


def test_runs_only_when_named() -> None:
    assert "locks" in WORKLOADS
    assert "locks" not in default_workloads()


@pytest.mark.parametrize("kind", ["flock", "nearcache"])
def test_a_fight_loses_no_update_and_counts_every_section(tmp_path: Path, kind: str) -> None:
    make = (
        _flock_lock(str(tmp_path / "lock"))
        if kind == "flock"
        else _nearcache_lock(str(tmp_path / "cache"), 1 << 20)
    )
    figures = fight(make, 3, 0.3, tmp_path)
    assert figures["lost_updates"] == 0
    assert figures["sections"] > 0
    assert 0 < figures["fairness"] <= 1
    assert 0 < figures["acquire_p50_ns"] <= figures["acquire_p99_ns"] <= figures["acquire_max_ns"]


def test_a_lock_that_does_not_exclude_loses_updates(tmp_path: Path) -> None:
    # Four processes incrementing one counter with no exclusion overwrite
    # each other's increments (on two cores or more, thousands in 0.5 s):
    # the count the workload shows is how it tells a broken lock.
    def make() -> tuple[Callable[[], None], Callable[[], None], Callable[[], None]]:
        return (lambda: None), (lambda: None), (lambda: None)

    figures = fight(make, CONTENDERS, 0.5, tmp_path)
    assert figures["sections"] > 0
    assert figures["lost_updates"] > 0


def test_a_tiny_run_renders_every_lock(tmp_path: Path) -> None:
    result, tables = run(
        RunOptions(
            workloads=["locks"],
            backends=["nearcache", "diskcache", "dict"],
            profile=PROFILES["tiny"],
            workdir=tmp_path,
            nearcache_dir=tmp_path / "shm",
            progress=False,
            print_tables=False,
        )
    )
    (w,) = result.workloads
    assert [c.case for c in w.cases] == ["alone", "fought"]
    for case in w.cases:
        rows = {m.backend for m in case.measurements}
        assert {"nearcache", "diskcache", "fcntl.flock"} <= rows
        assert "offers no lock" in case.skipped["dict"]
        for m in case.measurements:
            assert m.metrics["lost_updates"] == 0, m.backend
            assert m.metrics["sections_per_s"] > 0, m.backend
    assert len(tables["locks"]) == 2
