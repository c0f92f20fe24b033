"""A tiny run of every workload: shapes and sanity of the figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from nearcache.bench import PROFILES, RunOptions, run
from nearcache.bench.model import BenchResult, WorkloadResult
from nearcache.bench.workloads import Fastmmap2004
from nearcache.bench.workloads.zipf import lru_hit_ratio

PEERS = ["dict", "cachetools", "diskcache", "django-locmem", "lmdb"]
OURS = ["nearcache-native", "nearcache"]


def _run(workload: str, tmp_path: Path, backends: list[str]) -> tuple[BenchResult, WorkloadResult]:
    result, tables = run(
        RunOptions(
            workloads=[workload],
            backends=backends,
            profile=PROFILES["tiny"],
            workdir=tmp_path,
            nearcache_dir=tmp_path / "shm",
            progress=False,
            print_tables=False,
        )
    )
    assert [w.name for w in result.workloads] == [workload]
    assert tables[workload], "every workload renders at least one table"
    return result, result.workloads[0]


def _ran(result: BenchResult, names: list[str]) -> list[str]:
    return [n for n in names if (s := result.backend(n)) is not None and s.available]


def test_chi_2010(tmp_path: Path) -> None:
    result, w = _run("chi-2010", tmp_path, PEERS + OURS)
    assert [c.case for c in w.cases] == [
        "1:10-small", "1:10-medium", "1:10-large", "1:1-medium", "1:100-medium", "get", "set",
    ]  # fmt: skip
    for case in w.cases:
        assert not case.skipped, case.skipped
        assert {m.backend for m in case.measurements} == set(_ran(result, PEERS + OURS))
        for m in case.measurements:
            assert m.metrics["ops_per_s"] > 0
            assert m.metrics["hit_rate"] == 1.0  # every key was stored first
            assert [r["ops"] for r in m.runs] == [404.0]  # tiny: exactly the configured ops


FASTMMAP_BACKENDS = ["dict", "cachetools", "diskcache", *OURS]


@pytest.fixture(scope="module")
def fastmmap_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[BenchResult, WorkloadResult]:
    """One tiny run of fastmmap-2004 (every case) shared by the tests below."""
    return _run("fastmmap-2004", tmp_path_factory.mktemp("fastmmap"), FASTMMAP_BACKENDS)


def test_fastmmap_2004_hit_rates_differ_under_eviction(
    fastmmap_run: tuple[BenchResult, WorkloadResult],
) -> None:
    result, w = fastmmap_run
    assert len(w.cases) == 9
    big = w.case("bin-1628")
    small = w.case("bin-147")
    assert big is not None and small is not None
    for case in w.cases:
        assert {m.backend for m in case.measurements} == set(_ran(result, FASTMMAP_BACKENDS)), (
            case.skipped
        )
        for m in case.measurements:
            for key in ("ghitr", "mhitr"):
                assert 0.0 <= m.metrics[key] <= 1.0
            # tiny: every key stored (120; 6 for the seed 003 sizes)
            assert m.metrics["stored"] == case.params.get("keys", 120)
            assert m.runs[0]["false_hits"] == 0  # never-stored keys never hit
            for key in ("set_per_s", "get_per_s", "mix_per_s"):
                assert m.metrics[key] > 0
    dict_big, lru_big, lru_small = big.get("dict"), big.get("cachetools"), small.get("cachetools")
    assert dict_big and lru_big and lru_small
    assert dict_big.metrics["ghitr"] == 1.0  # unbounded
    assert lru_small.metrics["ghitr"] == 1.0  # small values fit the budget
    assert lru_big.metrics["ghitr"] < 0.8  # large ones do not


def test_fastmmap_2004_seed_003_sizes(fastmmap_run: tuple[BenchResult, WorkloadResult]) -> None:
    """Bytes values of 59 KiB, 295 KiB and 1.2 MiB, budget twice the working set: all hit."""
    result, w = fastmmap_run
    large = [c for c in w.cases if c.params.get("large")]
    assert [c.case for c in large] == ["bin-59KiB", "bin-295KiB", "bin-1.2MiB"]
    assert [c.params["cmplx"] for c in large] == [59 * 1024, 295 * 1024, round(1.2 * 2**20)]
    for case in large:
        assert not case.skipped, case.skipped
        assert {m.backend for m in case.measurements} == set(_ran(result, FASTMMAP_BACKENDS))
        for m in case.measurements:
            assert m.metrics["stored"] == 6 == m.info["keys"]
            assert m.info["value_bytes"] == case.params["cmplx"]
            assert m.metrics["ghitr"] == m.metrics["mhitr"] == 1.0  # nothing evicted
            assert m.runs[0]["false_hits"] == 0
            for key in ("set_per_s", "get_per_s", "mix_per_s"):
                assert m.metrics[key] > 0
        ours = case.get("nearcache")
        assert ours is not None
        # nearcache's file is the budget: twice 6 x (36-byte key + value)
        assert ours.info["limit"].endswith(" file")
    tables = Fastmmap2004(PROFILES["tiny"]).tables(w, {})
    rows = 3 * len(_ran(result, FASTMMAP_BACKENDS))
    assert any("seed 003" in t.title and len(t.rows) == rows for t in tables)


def test_open_per_request_skips_process_local_caches(tmp_path: Path) -> None:
    _, w = _run("open-per-request", tmp_path, ["dict", "diskcache", "lmdb", *OURS])
    case = w.cases[0]
    assert "dict" in case.skipped and "process-local" in case.skipped["dict"]
    assert case.get("diskcache") is not None
    for m in case.measurements:
        assert m.metrics["open_requests_per_s"] > 0
        assert m.metrics["kept_requests_per_s"] > 0
        assert m.metrics["open_cost_ns"] >= 0
        assert 0.5 <= m.metrics["hit_rate"] <= 1.0


@pytest.mark.timeout(120)
def test_django_8proc_pools_all_processes(tmp_path: Path) -> None:
    result, w = _run("django-8proc", tmp_path, ["dict", "django-locmem", "diskcache", *OURS])
    case = w.cases[0]
    assert not case.skipped, case.skipped
    assert {m.backend for m in case.measurements} == set(
        _ran(result, ["dict", "django-locmem", "diskcache", *OURS])
    )
    for m in case.measurements:
        mm = m.metrics
        counts = [mm[f"{a}_count"] for a in ("get", "set", "delete")]
        # tiny: 150 ops per worker, the first 50 an untimed warm-up; the rest pooled.
        assert sum(counts) == 8 * 100
        assert mm["ops"] == 8 * 100
        assert m.info["warmup"] == 50
        assert counts[0] > counts[1] > counts[2]  # 90 / 9 / 1
        assert m.info["get_per_process_count"] and len(m.info["get_per_process_count"]) == 8
        assert mm["get_p50_ns"] <= mm["get_p99_ns"] <= mm["get_max_ns"]
        assert 0 <= mm["get_miss"] <= counts[0]
        assert mm["errors"] == 0
        assert sum(c for _, c in m.info["get_histogram"]) == counts[0]
    # locmem is limited to 1,000 of the 1,100 keys and culls: it misses; dict does not cull.
    locmem, plain = case.get("django-locmem"), case.get("dict")
    assert locmem and plain
    assert locmem.metrics["get_miss"] > plain.metrics["get_miss"]
    # The seed 003 sizes: same streams over fewer keys, every bound holding them twice.
    assert [c.case for c in w.cases[1:]] == ["8proc-59KiB", "8proc-295KiB", "8proc-1.2MiB"]
    for big in w.cases[1:]:
        assert not big.skipped, big.skipped
        assert big.params["limit"] is None and big.params["keys"] >= 8
        for m in big.measurements:
            assert m.metrics["ops"] == 8 * 100
            assert m.metrics["errors"] == 0
            assert m.info["value_bytes"] == big.params["value_bytes"]
            assert m.info["keys"] == big.params["keys"]
        ours, local = big.get("nearcache"), big.get("django-locmem")
        assert ours and local
        assert ours.info["limit"].endswith(" file")  # a byte budget, not a calibrated count
        assert local.info["limit"] == f"MAX_ENTRIES={2 * big.params['keys']}"
        # Unbounded per process: a miss needs one of its own deletes.
        unculled = big.get("dict")
        assert unculled is not None
        assert unculled.metrics["get_miss"] == 0 or unculled.metrics["delete_count"] > 0


def test_zipf_matches_exact_lru_for_an_lru(tmp_path: Path) -> None:
    _, w = _run("zipf", tmp_path, ["dict", "cachetools", *OURS])
    assert [c.case for c in w.cases] == ["zipf", "zipf+scan"]
    for case in w.cases:
        lru = case.get("cachetools")
        unbounded = case.get("dict")
        assert lru and unbounded
        # cachetools.LRUCache is an exact LRU: its cache-aside hit ratio equals the simulation.
        assert lru.metrics["hit_ratio"] == pytest.approx(lru.metrics["lru_hit_ratio"])
        assert unbounded.metrics["hit_ratio"] >= lru.metrics["hit_ratio"]
        for m in case.measurements:
            assert 0.0 < m.metrics["hit_ratio"] < 1.0
            assert m.metrics["requests"] == 2000
    scan = w.case("zipf+scan")
    plain = w.case("zipf")
    assert scan and plain
    assert (
        scan.get("cachetools").metrics["hit_ratio"] < plain.get("cachetools").metrics["hit_ratio"]
    )  # type: ignore[union-attr]


def test_lru_simulation() -> None:
    keys = ["a", "b", "a", "c", "a", "b"]
    # capacity 2: a b | a(hit) c(evicts b) a(hit) b(miss)
    assert lru_hit_ratio(keys, 2, 0) == pytest.approx(2 / 6)
    assert lru_hit_ratio(keys, 2, 2) == pytest.approx(2 / 4)


def test_failing_backend_is_skipped_with_a_reason(tmp_path: Path) -> None:
    result, w = _run("chi-2010", tmp_path, ["dict", "redis"])
    status = result.backend("redis")
    assert status is not None and not status.available and "Redis" in status.reason
    assert all(c.get("redis") is None for c in w.cases)


def test_fastmmap_2004_stores_binary_values_as_given(tmp_path: Path) -> None:
    """Bytes reach a bytes-only backend unpickled: its gets time the cache, not pickle.loads."""
    import pickle

    from nearcache._native import NativeCache
    from nearcache.bench.backends import BackendContext
    from nearcache.bench.backends.registry import get_backend
    from nearcache.bench.workloads import Fastmmap2004

    w = Fastmmap2004(PROFILES["tiny"])
    w.prepare()
    ctx = BackendContext(
        workdir=tmp_path / "work", run_id="t", options={"nearcache_dir": tmp_path / "shm"}
    )
    for case_id in ("bin-147", "complex-5"):
        case = next(c for c in w.cases() if c.id == case_id)
        backend = get_backend("nearcache-native")(ctx, w.capacity(case), case_id)
        try:
            m = w.measure(case, backend)
            cache = NativeCache(backend.path, backend.size)
            stored = [
                (cache.get(key), value)
                for key, value in zip(w.stored, w.values[case_id], strict=True)
            ]
            cache.close()
        finally:
            backend.destroy()
        found = [(raw, value) for raw, value in stored if raw is not None]
        assert len(found) == len(w.stored)  # 147-byte values and small dicts all fit
        if case_id == "bin-147":
            assert all(raw == value for raw, value in found)
            assert m.info["serialized_by"] == "nothing (bytes stored as given)"
        else:
            assert all(pickle.loads(raw) == value for raw, value in found)
            assert m.info["serialized_by"] == "harness (pickle)"
