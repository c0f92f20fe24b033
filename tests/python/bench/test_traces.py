"""The ``traces`` workload, run tiny: trace formats, nearcache's measured capacity
given to every policy, libCacheSim's rows checked against an exact LRU, bad input."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import pytest

from nearcache.bench import runner
from nearcache.bench.tracefiles import Trace, panel, read_trace, write_oracle_general
from nearcache.bench.workloads import PROFILES
from nearcache.bench.workloads.traces import NEARCACHE, NEARCACHE_LENIENT, Traces
from nearcache.bench.workloads.zipf import lru_hit_ratio
from nearcache.cli import main


def _text_trace(path: Path, sized: bool) -> Path:
    rng = random.Random(7)
    lines = []
    for i in range(2_500):
        # a hot set, a loop and one-time keys
        r = rng.random()
        key = f"h{rng.randrange(60)}" if r < 0.6 else (f"l{i % 150}" if r < 0.9 else f"o{i}")
        lines.append(f"{key} {1 + len(key) * 10}" if sized else key)
    path.write_text("# test trace\n" + "\n".join(lines) + "\n")
    return path


def test_formats_round_trip(tmp_path: Path) -> None:
    t = read_trace(_text_trace(tmp_path / "a.txt", sized=True))
    assert len(t.keys) == 2_500 and t.sizes is not None
    og = write_oracle_general(t, tmp_path / "a.oracleGeneral")
    back = read_trace(og, "a")
    assert back.keys == [k + 1 for k in t.keys]  # libCacheSim reserves id 0
    assert back.sizes == t.sizes
    first = struct.unpack_from("<IQIq", og.read_bytes())
    nxt = t.keys.index(t.keys[0], 1) if t.keys.count(t.keys[0]) > 1 else -1
    assert first[3] == nxt


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a 1 2\n", r"expected 'key \[size\]'"),
        ("a x\n", "is not an integer"),
        ("a 0\n", "must be positive"),
        ("# nothing\n", "no requests"),
    ],
)
def test_bad_text_traces_are_refused(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "bad.txt"
    p.write_text(content)
    with pytest.raises(ValueError, match=message):
        read_trace(p)


def test_truncated_oracle_general_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "t.oracleGeneral"
    p.write_bytes(b"\0" * 30)
    with pytest.raises(ValueError, match="whole number"):
        read_trace(p)


def test_generators_are_seeded_and_shaped() -> None:
    a = {t.name: t for t in panel(3, 200, 2_000)}
    b = {t.name: t for t in panel(3, 200, 2_000)}
    assert set(a) == {"gen-zipf", "gen-freq", "gen-loop", "gen-scan", "gen-shift"}
    assert all(a[n].keys == b[n].keys and len(a[n].keys) == 2_000 for n in a)
    assert a["gen-loop"].distinct == 125
    assert a["gen-freq"].distinct > 3 * a["gen-zipf"].distinct  # the rare-key noise


def test_unknown_trace_file_is_a_usage_error(tmp_path: Path) -> None:
    assert main(["bench", "--trace", str(tmp_path / "missing.txt"), "--no-progress"]) == 2


def test_traces_workload_tiny(tmp_path: Path) -> None:
    pytest.importorskip("libcachesim")
    files = [_text_trace(tmp_path / "mix.txt", False), _text_trace(tmp_path / "sized.txt", True)]
    options = runner.RunOptions(
        workloads=["traces"],
        profile=PROFILES["tiny"],
        backends=["dict"],
        workdir=tmp_path / "work",
        nearcache_dir=tmp_path / "shm",
        progress=False,
        print_tables=False,
        workload_options={"traces": files, "panel": False},
    )
    result, tables = runner.run(options)
    w = result.workload("traces")
    assert w is not None and len(w.cases) == 4  # two traces x two sizes
    mix = read_trace(files[0])
    for case in w.cases:
        nc = case.get(NEARCACHE)
        assert nc is not None and nc.info["file_bytes"] > 0
        entries = nc.metrics["entries"]
        assert entries > 0
        # every row got nearcache's measured count
        assert all(m.metrics["entries"] == entries for m in case.measurements)
        rows = {m.backend: m.metrics["hit_ratio"] for m in case.measurements}
        # the default's shards choose their admission
        assert 0 <= nc.metrics["strict_shards"] <= nc.info["shards"]
        assert 0 <= nc.metrics["young_half_shards"] <= nc.info["shards"]
        assert nc.metrics["strict_shards"] + nc.metrics["young_half_shards"] <= nc.info["shards"]
        # nearcache again, pinned lenient (SIEVE), same file
        lenient = case.get(NEARCACHE_LENIENT)
        assert lenient is not None and lenient.info["file_bytes"] == nc.info["file_bytes"]
        assert lenient.metrics["entries_held"] > 0
        for name in ("LRU", "SIEVE", "S3-FIFO", "W-TinyLFU", "ARC", "LIRS", "Belady"):
            assert f"{name} (libCacheSim)" in rows
        assert "cachetools LRU" in rows
        belady = rows["Belady (libCacheSim)"]
        assert all(v <= belady + 1e-9 for k, v in rows.items() if "bytes" not in k)
        if case.params["trace"] == "mix":
            exact = lru_hit_ratio([str(k) for k in mix.keys], int(entries), 0)
            assert rows["LRU (libCacheSim)"] == pytest.approx(exact, abs=1e-9)
            assert rows["cachetools LRU"] == pytest.approx(exact, abs=1e-9)
            assert not any("bytes" in k for k in rows)
        else:
            assert "LRU (libCacheSim, bytes)" in rows
            assert nc.metrics["held_bytes"] > 0
    assert [t.title for t in tables["traces"]] == [
        "traces: mix, hit ratio by cache size",
        "traces: sized, hit ratio by cache size",
    ]
    written = runner.write_outputs(result, tables, plot_dir=tmp_path / "plots")
    assert written == [tmp_path / "plots" / "traces.png"]
    assert written[0].stat().st_size > 10_000


def test_registered_and_run_only_when_named() -> None:
    from nearcache.bench.workloads import WORKLOADS, default_workloads

    assert WORKLOADS["traces"] is Traces
    assert "traces" not in default_workloads()


def test_unknown_real_trace_is_refused() -> None:
    with pytest.raises(KeyError, match="unknown real trace"):
        Traces(PROFILES["tiny"]).configure({"real_traces": ["nosuch"]})


def test_trace_named_twice_is_refused(tmp_path: Path) -> None:
    f = _text_trace(tmp_path / "mix.txt", False)
    w = Traces(PROFILES["tiny"])
    w.configure({"traces": [f, f], "panel": False})
    with pytest.raises(ValueError, match="two traces named mix"):
        w.cases()


def test_trace_dataclass_checks_sizes() -> None:
    with pytest.raises(ValueError, match="2 sizes for 3 keys"):
        Trace("t", "t", [1, 2, 3], [1, 1])
