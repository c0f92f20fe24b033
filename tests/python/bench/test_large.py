"""The ``large`` workload: histograms, the loops, skips with reasons, a tiny run end to end."""

from __future__ import annotations

import doctest
import math
import random
from pathlib import Path
from typing import Any

import pytest

from nearcache._native import NativeCache
from nearcache.bench import PROFILES, RunOptions, run
from nearcache.bench import stats as stats_module
from nearcache.bench.model import BenchResult, WorkloadResult
from nearcache.bench.runner import render, write_outputs
from nearcache.bench.stats import LogHistogram
from nearcache.bench.workloads import WORKLOADS, default_workloads
from nearcache.bench.workloads import large as large_mod
from nearcache.bench.workloads.large import (
    GET_EVERY,
    Large,
    key_of,
    read_phase,
    room_reason,
    write_phase,
)
from nearcache.cli import main

GiB = 1 << 30
MiB = 1 << 20


class _Box:
    """Stands in for a multiprocessing RawValue."""

    def __init__(self, value: int) -> None:
        self.value = value


# -- LogHistogram ---------------------------------------------------------------------


def test_histogram_buckets_are_contiguous_and_narrow() -> None:
    previous_high = -1
    for bucket in range(512 * 40):
        low, high = LogHistogram.bounds(bucket)
        assert low == previous_high + 1, bucket
        assert high - low <= low // 512, bucket
        assert LogHistogram.bucket(low) == bucket == LogHistogram.bucket(high)
        previous_high = high
    assert LogHistogram.bucket(-5) == 0


def test_histogram_percentiles_match_the_samples_within_a_bucket() -> None:
    rng = random.Random(7)
    samples = [int(rng.lognormvariate(7, 1.5)) for _ in range(20_000)] + [3_000_000_000]
    h = LogHistogram()
    for s in samples:
        h.record(s)
    ordered = sorted(samples)
    for pct in (0, 50, 90, 99, 99.9, 99.99, 100):
        exact = ordered[max(1, math.ceil(pct / 100 * len(ordered))) - 1]
        assert exact <= h.percentile(pct) <= exact + exact // 512, pct
    assert h.count == len(samples) and h.total_ns == sum(samples)
    assert h.max_ns == h.percentile(100) == 3_000_000_000
    assert LogHistogram().percentile(99) == 0
    with pytest.raises(ValueError, match="out of range"):
        h.percentile(101)


def test_stats_examples() -> None:
    result = doctest.testmod(stats_module, verbose=False)
    assert result.attempted > 0 and result.failed == 0


def test_histogram_merge_and_json_form_round_trip() -> None:
    a, b = LogHistogram(), LogHistogram()
    for ns in (5, 900, 4_000, 70_000):
        a.record(ns)
    for ns in (6, 2_000_000):
        b.record(ns)
    a.merge(b)
    back = LogHistogram.from_list(a.to_list())
    assert (back.count, back.total_ns, back.max_ns) == (6, a.total_ns, 2_000_000)
    assert back.counts == a.counts
    with pytest.raises(ValueError, match="bad histogram entry"):
        LogHistogram.from_list([[-3, 1]])
    text = LogHistogram.from_text(a.to_text())
    assert text.counts == a.counts and text.max_ns == a.max_ns
    for bad in ("7:x", "7", "7:1:2"):
        with pytest.raises(ValueError, match="bad histogram text"):
            LogHistogram.from_text(bad)


# -- room, loops ------------------------------------------------------------------------


def test_room_reason_names_the_file_system_and_the_memory() -> None:
    assert room_reason(GiB, free=2 * GiB, available=4 * GiB) is None
    fs = room_reason(16 * GiB, free=12 * GiB, available=64 * GiB)
    assert fs is not None and "free on the file system" in fs and "12.0 GiB" in fs
    ram = room_reason(16 * GiB, free=32 * GiB, available=8 * GiB)
    assert ram is not None and "MemAvailable" in ram and "8.0 GiB" in ram
    assert room_reason(GiB, free=2 * GiB, available=0) is None  # unknown: not checked


def test_write_phase_times_every_operation_and_stops_at_the_first_eviction(
    tmp_path: Path,
) -> None:
    values = [bytes([i]) * 160 for i in range(256)]
    offsets = list(range(1024))
    cache = NativeCache(str(tmp_path / "w"), 2 * MiB)
    try:
        res = write_phase(cache, 0, 500, values, offsets, 100)
        sets, gets = LogHistogram.from_list(res["set"]), LogHistogram.from_list(res["get"])
        assert (sets.count, gets.count, res["next"]) == (500, 500 // GET_EVERY, 500)
        assert res["hits"] == gets.count and res["wrong"] == 0 and not res["evicted"]
        assert cache.get(key_of(499)) == values[499 & 255] and len(key_of(499)) == 36
        progress = _Box(0)
        res = write_phase(
            cache, 500, 10**7, values, offsets, 100, progress=progress, stop_on_eviction=True
        )
        assert res["evicted"] and progress.value == res["next"] < 500 + 10**7
        assert cache.stats()["evictions"] > 0
    finally:
        cache.close()


def test_read_phase_counts_hits_misses_and_wrong_values() -> None:
    values = [bytes([i]) * 160 for i in range(256)]
    table: dict[bytes, Any] = {key_of(j): values[j & 255] for j in range(64)}
    table[key_of(3)] = b"not the value of key 3"
    del table[key_of(5)]
    done = _Box(0)
    calls = 0

    def get(key: bytes) -> Any:
        nonlocal calls
        calls += 1
        if calls >= 4096:
            done.value = 1
        return table.get(key)

    res = read_phase(get, values, list(range(64)), 64, _Box(64), done)
    total = LogHistogram.from_list(res["get"]).count
    assert total == res["hits"] + res["misses"] + res["wrong"] >= 4096
    assert res["wrong"] > 0 and res["misses"] > 0 and res["hits"] > res["wrong"]


# -- registration, options, a tiny run -----------------------------------------------------


def test_registered_only_when_named_and_sizes_configurable() -> None:
    assert WORKLOADS["large"] is Large and "large" not in default_workloads()
    default = Large(PROFILES["default"])
    assert [c.id for c in default.cases()] == [
        "size-1.0GiB",
        "size-4.0GiB",
        "size-16.0GiB",
        "shard-1.0MiB",
        "shard-4.0MiB",
        "shard-16.0MiB",
        "shard-64.0MiB",
    ]
    sweep = [c for c in default.cases() if c.params["sweep"]]
    assert [c.params["shards"] for c in sweep] == [1024, 256, 64, 16]
    assert all(c.params["bytes"] == GiB for c in sweep)
    default.configure({"sizes": [64 * MiB, GiB, 64 * MiB]})
    assert [c.params["bytes"] for c in default.cases() if not c.params["sweep"]] == [
        64 * MiB,
        GiB,
    ]


def _run(tmp_path: Path) -> tuple[BenchResult, dict[str, Any]]:
    return run(
        RunOptions(
            workloads=["large"],
            backends=["nearcache-native", "dict"],
            profile=PROFILES["tiny"],
            workdir=tmp_path / "scratch",
            nearcache_dir=tmp_path / "shm",
            progress=False,
            print_tables=False,
        )
    )


def test_a_tiny_run_measures_every_phase(tmp_path: Path) -> None:
    result, tables = _run(tmp_path)
    w = result.workload("large")
    assert isinstance(w, WorkloadResult)
    assert [c.case for c in w.cases] == [c.id for c in Large(PROFILES["tiny"]).cases()]
    for c in w.cases:
        assert c.skipped.get("dict", "").startswith("large measures nearcache's engine")
        m = c.get("nearcache-native")
        assert m is not None, c.skipped
        mm = m.metrics
        assert mm["fill_sets"] > 0 and mm["evictions"] > 0 and mm["entries_fill"] > 0
        assert mm["evict_set_ops"] == mm["evict_sets"]
        assert mm["fill_set_ops"] == mm["fill_sets"]
        assert mm["reader_get_ops"] > 0 and mm["dict_get_ops"] > 0
        for who in ("fill", "evict", "reader", "dict"):
            assert mm[f"{who}_get_wrong"] == 0
            assert mm[f"{who}_get_hit_rate"] > 0
        # Nothing is evicted while the file fills: the writer reads back what
        # it wrote. Once it evicts, what a reader finds depends on the
        # admission mode: an adaptive shard admits strictly while it warms up
        # and drops new keys until its miniatures see reads that strict
        # admission misses, which a run this short can end inside (the
        # reader's hit rate 0.12 to 0.98 over 15 tiny runs).
        assert mm["fill_get_hit_rate"] > 0.5
        assert mm["dict_get_hit_rate"] == 1.0
        for phase in ("fill_set", "evict_set", "reader_get", "dict_get"):
            assert 0 < mm[f"{phase}_p50_ns"] <= mm[f"{phase}_p99_ns"]
            assert mm[f"{phase}_p99_ns"] <= mm[f"{phase}_p99.99_ns"] <= mm[f"{phase}_max_ns"]
        for key in ("open_create_ns", "open_attach_ns", "open_clean_ns", "open_crash_ns"):
            assert mm[key] > 0
        assert 0 < mm["held_evict_bytes"] <= mm["file_bytes"]
        if c.params["sweep"]:
            assert mm["shards"] == c.params["shards"]
        assert set(m.info["histograms"]) >= {"fill_set", "reader_get", "dict_get"}
        reader = LogHistogram.from_text(m.info["histograms"]["reader_get"])
        assert reader.count == mm["reader_get_ops"] and reader.max_ns == mm["reader_get_max_ns"]
    assert not list((tmp_path / "shm").glob("bench-*")), "the files are removed"
    titles = [t.title for t in tables["large"]]
    assert any("shard-size sweep" in t for t in titles)
    back = BenchResult.from_json(result.to_json())
    assert [t.title for t in render(back)["large"]] == titles
    pytest.importorskip("matplotlib")
    written = write_outputs(back, render(back), plot_dir=tmp_path / "png")
    assert [p.name for p in written] == ["large.png"]


def test_a_size_the_machine_cannot_hold_is_skipped_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(large_mod, "mem_available", lambda: 64 * MiB)
    result, tables = _run(tmp_path)
    w = result.workload("large")
    assert w is not None
    for c in w.cases:
        assert c.get("nearcache-native") is None
        reason = c.skipped["nearcache-native"]
        assert "MemAvailable" in reason and not reason.startswith("failed")
    notes = [n for t in tables["large"] for n in t.notes]
    assert any("not measured" in n and "MemAvailable" in n for n in notes)


def test_cli_sizes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "zipf", "--sizes", "1GiB"]) == 2
    assert "--sizes applies to the large workload" in capsys.readouterr().err
    assert main(["bench", "large", "--sizes", "1GiB,lots"]) == 2
    assert "--sizes" in capsys.readouterr().err
    out_json = tmp_path / "r.json"
    argv = ["bench", "large", "--profile", "tiny", "--sizes", "2MiB", "--backends"]
    argv += ["nearcache-native", "--no-progress", "--no-save", "--json", str(out_json)]
    argv += ["--nearcache-dir", str(tmp_path / "shm"), "--dir", str(tmp_path / "scratch")]
    assert main(argv) == 0
    w = BenchResult.load(out_json).workload("large")
    assert w is not None and w.params["sizes"] == [2 * MiB]
    assert next(c.case for c in w.cases) == "size-2.0MiB"
