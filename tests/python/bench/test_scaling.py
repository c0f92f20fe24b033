"""The scaling workload: process counts, the aggregate rate, and a tiny run's figures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from nearcache.bench import PROFILES, RunOptions, run
from nearcache.bench.backends import BackendContext
from nearcache.bench.backends.registry import get_backend
from nearcache.bench.model import BenchResult, WorkloadResult
from nearcache.bench.runner import render, write_outputs
from nearcache.bench.workloads import scaling
from nearcache.bench.workloads.scaling import Scaling, aggregate_rate, process_counts

BACKENDS = ["nearcache", "nearcache-native", "lmdb", "dict", "diskcache", "cachetools"]


@pytest.mark.parametrize(
    ("cores", "counts"),
    [
        (1, [1, 2, 4]),
        (2, [1, 2, 4, 8]),
        (6, [1, 2, 4, 6, 12, 24]),
        (16, [1, 2, 4, 8, 16, 32, 64]),
        (64, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
    ],
)
def test_process_counts_follow_the_core_count(cores: int, counts: list[int]) -> None:
    assert process_counts(cores) == counts


def test_process_counts_reject_no_cores() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        process_counts(0)


def test_the_counts_come_from_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scaling, "host_cores", lambda: 16)
    w = Scaling(PROFILES["tiny"])
    assert w.params()["cores"] == 16
    assert w.params()["procs"] == [1, 2, 4, 8, 16, 32, 64]


def _worker(ops: float, start_s: float, end_s: float) -> dict[str, float]:
    return {"ops": ops, "start_ns": start_s * 1e9, "end_ns": end_s * 1e9}


def test_aggregate_rate_divides_by_the_common_window() -> None:
    side_by_side = [_worker(1000, 0.0, 1.0), _worker(1000, 0.0, 1.0)]
    assert aggregate_rate(side_by_side) == pytest.approx(2000.0)
    # Two workers that ran one after the other did the work of one: no credit for both.
    one_after_the_other = [_worker(1000, 0.0, 1.0), _worker(1000, 1.0, 2.0)]
    assert aggregate_rate(one_after_the_other) == pytest.approx(1000.0)
    assert aggregate_rate([_worker(5, 1.0, 1.0)]) == 0.0
    with pytest.raises(ValueError, match="no workers"):
        aggregate_rate([])


def _tiny_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backends: list[str]
) -> tuple[BenchResult, WorkloadResult]:
    monkeypatch.setattr(scaling, "host_cores", lambda: 2)
    result, tables = run(
        RunOptions(
            workloads=["scaling"],
            backends=backends,
            profile=replace(PROFILES["tiny"], repeats=2),
            workdir=tmp_path,
            nearcache_dir=tmp_path / "shm",
            progress=False,
            print_tables=False,
        )
    )
    assert tables["scaling"]
    return result, result.workloads[0]


@pytest.mark.timeout(300)
def test_tiny_run_figures_are_computed_from_the_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result, w = _tiny_run(tmp_path, monkeypatch, BACKENDS)
    counts = [1, 2, 4, 8]
    assert w.params["procs"] == counts and w.params["cores"] == 2
    assert [c.case for c in w.cases] == ["get", "1:10", "90/9/1"]
    ran = {n for n in BACKENDS if (s := result.backend(n)) is not None and s.available}
    assert "nearcache" in ran and "dict" in ran
    per_worker = scaling._PARAMS["tiny"]["ops"]
    for case in w.cases:
        assert "process-local" in case.skipped["cachetools"]
        assert {m.backend for m in case.measurements} == ran - {"cachetools"}
        for m in case.measurements:
            assert m.info["procs"] == counts and m.info["best_of"] == 2
            # Every count ran once per repeat, interleaved: 1 2 4 8 1 2 4 8.
            assert [r["procs"] for r in m.runs] == [float(n) for n in counts * 2]
            assert [r["repeat"] for r in m.runs] == [0.0] * 4 + [1.0] * 4
            for r in m.runs:
                assert r["ops"] == r["procs"] * per_worker  # tiny: a fixed count per worker
                assert r["errors"] == 0
                assert r["ops_per_s"] == pytest.approx(r["ops"] / r["window_s"], rel=1e-6)
                assert r["slowest_proc_ops_per_s"] <= r["fastest_proc_ops_per_s"]
            one = m.metrics["ops_per_s_1"]
            for n in counts:
                best = max(r["ops_per_s"] for r in m.runs if r["procs"] == n)
                assert m.metrics[f"ops_per_s_{n}"] == best
                assert m.metrics[f"ratio_{n}"] == pytest.approx(best / one)
            assert m.metrics["ratio_1"] == 1.0
            if case.case == "get":
                # Every key is stored before each run and nothing deletes: every get hits.
                assert all(r["hits"] == r["gets"] == r["ops"] for r in m.runs)
            if case.case == "1:10":
                for r in m.runs:
                    assert r["gets"] == pytest.approx(r["ops"] * 10 / 11, abs=r["procs"])


@pytest.mark.timeout(120)
def test_outputs_and_reload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    result, _ = _tiny_run(tmp_path, monkeypatch, ["dict", "nearcache-native"])
    tables = render(result)["scaling"]
    titles = [t.title for t in tables]
    assert titles[0].startswith("scaling: ratio to one process (N = 2 cores, best of 2)")
    assert any("get only" in t for t in titles) and any("90% get" in t for t in titles)
    written = write_outputs(
        result, render(result), tmp_path / "s.json", tmp_path / "s.md", tmp_path / "png"
    )
    assert (tmp_path / "png" / "scaling.png") in written
    assert (tmp_path / "png" / "scaling.png").stat().st_size > 10_000
    md = (tmp_path / "s.md").read_text()
    assert "x at 2 (N)" in md and "x at 8" in md and "oversubscribe" in md
    # Re-rendered on a host of another size, the tables keep the run's own counts.
    monkeypatch.setattr(scaling, "host_cores", lambda: 64)
    again = BenchResult.load(tmp_path / "s.json")
    assert [t.to_markdown() for t in render(again)["scaling"]] == [t.to_markdown() for t in tables]


def test_every_backend_has_its_own_colour_and_marker() -> None:
    colours = [c for c, _ in scaling.STYLES.values()]
    markers = [m for _, m in scaling.STYLES.values()]
    assert len(set(colours)) == len(colours) and len(set(markers)) == len(markers)
    assert set(scaling.SCALING_BACKENDS) <= set(scaling.STYLES)


def test_workers_share_one_deadline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(
        scaling._PARAMS, "tiny", {**scaling._PARAMS["tiny"], "seconds": 0.05, "ops": None}
    )
    w = Scaling(PROFILES["tiny"])
    w.prepare()
    ctx = BackendContext(
        workdir=tmp_path / "work", run_id="t", options={"nearcache_dir": tmp_path / "shm"}
    )
    backend = get_backend("nearcache-native")(ctx, w.capacity(w.cases()[0]), "deadline")
    try:
        res = w.parallel_run("get", backend, 3)
    finally:
        backend.destroy()
    workers = res["workers"]
    assert len(workers) == 3
    deadlines = {wk["deadline_ns"] for wk in workers}
    assert len(deadlines) == 1 and deadlines.pop() > 0
    for wk in workers:
        assert wk["start_ns"] < wk["deadline_ns"] <= wk["end_ns"]
        assert wk["ops"] > 0 and wk["ops"] % 256 == 0  # whole chunks only
    assert res["ops_per_s"] == aggregate_rate(workers)


def test_skip_reasons() -> None:
    w = Scaling(PROFILES["tiny"])
    assert w.skip_reason(get_backend("nearcache")) is None
    assert w.skip_reason(get_backend("lmdb")) is None
    assert w.skip_reason(get_backend("dict")) is None
    assert "process-local" in str(w.skip_reason(get_backend("cachebox")))
    assert "wraps" in str(w.skip_reason(get_backend("django-nearcache")))
    assert "wraps" in str(w.skip_reason(get_backend("tiered")))
