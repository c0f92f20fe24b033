"""The ``value-sizes`` workload: rows per backend and size, exact values, refusals, geometry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from nearcache import Cache
from nearcache._native import NativeCache
from nearcache.bench import PROFILES, RunOptions, run
from nearcache.bench.backends import BackendContext, get_backend
from nearcache.bench.backends.base import Backend
from nearcache.bench.backends.ours import NearcacheCache
from nearcache.bench.model import BenchResult, WorkloadResult
from nearcache.bench.plots import matplotlib_missing
from nearcache.bench.servers import LocalServer
from nearcache.bench.workloads import WORKLOADS, default_workloads
from nearcache.bench.workloads.value_sizes import (
    INLINE,
    SEED_003_SIZES,
    SIZES,
    SPILLED,
    NearcacheInline,
    NearcacheSpilled,
    ValueRefused,
    ValueSizes,
    inline_geometry,
)

PEERS = ["nearcache", "diskcache", "django-filebased", "cachetools", "dict"]
TINY_SIZES = ["1KiB", "128KiB", "295KiB", "1.2MiB"]


def _run(
    tmp_path: Path, backends: list[str], memcached: tuple[str, int] | None = None
) -> tuple[BenchResult, WorkloadResult]:
    result, tables = run(
        RunOptions(
            workloads=["value-sizes"],
            backends=backends,
            profile=PROFILES["tiny"],
            workdir=tmp_path / "scratch",
            nearcache_dir=tmp_path / "shm",
            memcached=memcached,
            progress=False,
            print_tables=False,
        )
    )
    assert tables["value-sizes"], "the workload renders its tables"
    return result, result.workloads[0]


def test_registered_and_run_only_when_named() -> None:
    assert WORKLOADS["value-sizes"] is ValueSizes
    assert "value-sizes" not in default_workloads()
    assert [s.label for s in SEED_003_SIZES] == ["59 KiB", "295 KiB", "1.2 MiB"]
    assert [s.bytes for s in SIZES][-1] == 100 * 2**20
    assert [c.id for c in ValueSizes(PROFILES["tiny"]).cases()] == TINY_SIZES
    default = ValueSizes(PROFILES["default"])
    assert [c.id for c in default.cases()] == [s.id for s in SIZES]
    assert all(int(c.params["keys"]) >= 3 for c in default.cases())


def test_a_row_per_backend_and_size(tmp_path: Path) -> None:
    result, w = _run(tmp_path, PEERS)
    ran = {n for n in PEERS if (s := result.backend(n)) is not None and s.available}
    assert "nearcache" in ran
    assert [c.case for c in w.cases] == TINY_SIZES
    # Inline entries are bounded by an arena segment (72-256 KiB): the
    # forced-inline row refuses the larger values, with the reason.
    inline_sizes = {"1KiB", "128KiB"}
    for case in w.cases:
        expected = ran | {SPILLED} | ({INLINE} if case.case in inline_sizes else set())
        assert {m.backend for m in case.measurements} == expected, case.skipped
        if case.case not in inline_sizes:
            assert "one arena segment" in case.skipped.pop(INLINE)
        assert not {n for n in case.skipped if n in ran or n in (INLINE, SPILLED)}, case.skipped
        for m in case.measurements:
            assert m.metrics["get_per_s"] > 0 and m.metrics["set_per_s"] > 0
            assert m.metrics["get_mb_per_s"] == pytest.approx(
                m.metrics["get_per_s"] * case.params["bytes"] / 1e6
            )
            assert m.metrics["hit_rate"] == 1.0  # every budget holds the working set
            keys = int(case.params["keys"])
            assert m.info["verified_values"] == keys
            assert [r["get_ops"] for r in m.runs] == [2.0 * keys]  # tiny: two passes
            if m.backend.startswith("nearcache"):
                assert m.info["evictions"] == 0
                assert m.info["fs"]
    stored = {(c.case, m.backend): m.info["stored"] for c in w.cases for m in c.measurements}
    # The default threshold is 128 KiB, but an inline entry must fit one
    # arena segment (about 100 KiB in the default 2 MiB shards): 128 KiB spills.
    assert [stored[(size, "nearcache")] for size in TINY_SIZES] == [
        "inline", "spilled", "spilled", "spilled",
    ]  # fmt: skip
    assert {stored[(size, INLINE)] for size in TINY_SIZES if size in inline_sizes} == {"inline"}
    assert {stored[(size, SPILLED)] for size in TINY_SIZES} == {"spilled"}
    # Every store and spill directory is gone, in nearcache's directory and the scratch one.
    assert not list((tmp_path / "shm").iterdir())
    assert not list((tmp_path / "scratch").iterdir())

    tables = ValueSizes(PROFILES["tiny"]).tables(w, {})
    get_table, set_table = tables[0], tables[1]
    for table in (get_table, set_table):
        assert [row[0] for row in table.rows] == ["1 KiB", "128 KiB", "295 KiB", "1.2 MiB"]
        assert table.columns[-1] == "nearcache ÷ diskcache"
        assert table.columns[2:5] == ["nearcache", INLINE, SPILLED]
    if matplotlib_missing() is None:
        (path,) = ValueSizes(PROFILES["tiny"]).plot(w, tmp_path / "png")
        assert path.name == "value-sizes.png" and path.stat().st_size > 1000


@pytest.mark.parametrize("size_id", ["1KiB", "1.2MiB"])
def test_nearcache_rows_return_the_exact_values(tmp_path: Path, size_id: str) -> None:
    """A get after the timed runs returns the bytes that were set, read through a new handle."""
    w = ValueSizes(PROFILES["tiny"])
    w.prepare()
    case = next(c for c in w.cases() if c.id == size_id)
    data = w.data(case)
    ctx = BackendContext(
        workdir=tmp_path / "work", run_id="t", options={"nearcache_dir": tmp_path / "shm"}
    )
    keys = int(case.params["keys"])
    backends: list[Backend] = [
        get_backend("nearcache")(ctx, w.capacity(case), f"{size_id}-default"),
        NearcacheSpilled(ctx, w.capacity(case), f"{size_id}-spilled", keys),
    ]
    if size_id == "1KiB":  # inline entries are bounded by an arena segment
        backends.append(NearcacheInline(ctx, w.capacity(case), f"{size_id}-inline", keys))
    else:
        with pytest.raises(ValueRefused, match="one arena segment"):
            NearcacheInline(ctx, w.capacity(case), f"{size_id}-inline", keys)
    for backend in backends:
        try:
            assert isinstance(backend, NearcacheCache)
            path = backend.path
            m = w.measure_backend(case, backend)
            assert m.metrics["hit_rate"] == 1.0
            shards = int(getattr(backend, "shards", 0))
            with Cache(path=path, size=backend.size, shards=shards) as cache:
                for key, value in zip(data.keys, data.values, strict=True):
                    got = cache.get(key)
                    assert isinstance(got, bytes) and got == value
            spill_dir = Path(path + ".spill")
            spilled = spill_dir.exists() and any(spill_dir.iterdir())
            assert spilled == (m.info["stored"] == "spilled"), (backend.name, m.info)
        finally:
            backend.destroy()
        assert not os.path.exists(path) and not os.path.exists(path + ".spill")


def test_inline_geometry_fits_the_value_in_one_shard(tmp_path: Path) -> None:
    path = str(tmp_path / "geometry")
    value = 64 * 2**10
    size, shards = inline_geometry(path, value, 36, 3)
    cache = NativeCache(path, size, shards)
    try:
        assert cache.shard_count == shards and cache.capacity <= size
        assert cache.max_entry_size >= value + 36 + 32
        assert size // shards >= 2 * 3 * value  # all three keys fit one shard, twice over
    finally:
        cache.close()
    # Inline entries are bounded by an arena segment: a 4 MiB value is
    # refused at once, whatever the file, with the reason.
    with pytest.raises(ValueRefused, match="one arena segment"):
        inline_geometry(path, 4 * 2**20, 36, 3)
    assert not os.path.exists(path)
    with pytest.raises(ValueRefused):
        inline_geometry(path, 2**40, 36, 3)
    assert not os.path.exists(path)


def test_memcached_refusals_are_skipped_cells_with_the_reason(
    tmp_path: Path, bench_servers: tuple[LocalServer, LocalServer]
) -> None:
    _, mem = bench_servers
    _, w = _run(tmp_path, ["memcached", "dict"], memcached=("127.0.0.1", mem.port))
    by_size = {c.case: c for c in w.cases}
    for size in ("1KiB", "128KiB", "295KiB"):
        assert by_size[size].get("memcached") is not None  # below its 1 MiB item limit
    big = by_size["1.2MiB"]
    assert big.get("memcached") is None and big.get("dict") is not None
    reason = big.skipped["memcached"]
    assert reason.startswith("refused: memcached refused a 1.2 MiB value")
    assert "-I" in reason
    tables = ValueSizes(PROFILES["tiny"]).tables(w, {})
    get_table = tables[0]
    column = get_table.columns.index("memcached")
    assert [row[column] for row in get_table.rows][-1] == "refused"
    assert any(note.startswith("memcached at 1.2 MiB: refused") for note in get_table.notes)
