"""The ``e2e`` workload: selection, skip reasons, counting, and one real run.

The real run serves the e2e site with gunicorn and loads it with wrk (both
needed; the test is skipped with the reason otherwise), on nearcache's Django
backend: the warm-up must compute every fragment exactly once across the
workers (stampede-free ``get_or_set``), and the timed run must be all hits.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nearcache.bench.backends import BackendContext
from nearcache.bench.model import CaseResult, Measurement, WorkloadResult
from nearcache.bench.workloads import WORKLOADS, default_workloads
from nearcache.bench.workloads import e2e as e2e_module
from nearcache.bench.workloads.base import PROFILES
from nearcache.bench.workloads.e2e import E2e, duplicates, e2e_missing


def test_runs_only_when_named() -> None:
    assert "e2e" in WORKLOADS
    assert "e2e" not in default_workloads()
    # perl-chi-2010 too: it starts a memcached of its own; value-sizes takes minutes;
    # large fills files of up to 16 GiB; locks is ours, beside the seed studies.
    assert set(default_workloads()) == set(WORKLOADS) - {
        "e2e",
        "perl-chi-2010",
        "value-sizes",
        "traces",
        "large",
        "locks",
    }


def test_skipped_with_the_reason_when_a_tool_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from nearcache.bench.backends.djangocaches import DjangoNearcache

    monkeypatch.setattr(shutil, "which", lambda name: None)
    reason = e2e_missing()
    assert reason is not None and "wrk (apt-get install wrk)" in reason
    assert E2e(PROFILES["tiny"]).skip_reason(DjangoNearcache) == reason


def test_only_django_backends_take_part() -> None:
    from nearcache.bench.backends.memory import DictBackend

    if e2e_missing() is not None:
        pytest.skip(e2e_missing())
    assert E2e(PROFILES["tiny"]).skip_reason(DictBackend) == "not a Django cache backend"


def test_duplicates_are_counted_per_cache() -> None:
    computes = [(1, "f1"), (2, "f1"), (1, "f2"), (1, "f1")]
    assert duplicates(computes, per_process=False) == 2  # shared cache: f1 three times
    assert duplicates(computes, per_process=True) == 1  # per process: f1 twice in pid 1


def test_goal_rows_compare_within_the_run() -> None:
    def m(name: str, rps: float, hit: float, dup: float = 0.0) -> Measurement:
        metrics = {"req_per_s": rps, "hit_ratio": hit, "warmup_duplicates": dup}
        return Measurement(backend=name, metrics=metrics)

    case = CaseResult(case="sync-fragments", label="fragments", params={"view": "fragments"})
    case.measurements = [
        m("django-nearcache", 6000, 1.0),
        m("django-locmem", 5000, 0.5, 7),
        m("django-redis", 3000, 1.0),
    ]
    result = WorkloadResult(name="e2e", title="", seed="", description="", params={})
    result.cases = [case]
    goals = {row[0]: row[1:] for row in e2e_module._goal_notes(result)}
    assert goals["sync-fragments: NearCache / RedisCache req/s (>= 1.8)"] == ["2.00x", "yes"]
    assert goals["sync-fragments: NearCache / LocMemCache req/s (>= 1.1)"] == ["1.20x", "yes"]
    assert goals["sync-fragments: NearCache warm-up duplicates"] == ["0", "yes"]


@pytest.mark.timeout(300)
def test_fragments_on_nearcache_computes_each_fragment_once(tmp_path: Path) -> None:
    reason = e2e_missing()
    if reason is not None:
        pytest.skip(reason)
    ctx = BackendContext(
        workdir=tmp_path / "work", run_id="test", options={"nearcache_dir": tmp_path / "shm"}
    )
    workload = E2e(PROFILES["tiny"])
    case = next(c for c in workload.cases() if c.id == "sync-fragments")
    site = workload._site("django-nearcache", ctx, "t", "fragments")
    try:
        m = workload._run(site, case, ctx, "t")
    finally:
        e2e_module._clean(site, ctx)
    mm = m.metrics
    from nearcache.bench.workloads.e2e_site import FRAGMENTS

    assert mm["requests"] > 0 and mm["errors"] == 0
    assert mm["warmup_computes"] == FRAGMENTS  # every fragment, once, across the workers
    assert mm["warmup_duplicates"] == 0
    assert mm["get_or_set_computes"] == FRAGMENTS
    assert mm["get_or_set_waits"] > 0  # the walkers did collide
    assert mm["hit_ratio"] == 1.0 and mm["run_computes"] == 0
    assert mm["store_held_bytes"] > 0 and mm["stored_bytes"] > FRAGMENTS * 1600
    assert mm["workers_pss_bytes"] > 0 and mm["cpu_us_per_request"] > 0
