"""The torture harness: a short run with kills must find nothing, and the
harness must find the faults it claims to detect when they are planted."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nearcache import _native, torture
from nearcache.torture import (
    TortureConfig,
    TortureReport,
    counter_key,
    counter_regressed,
    data_key,
    main,
    make_value,
    owned_key,
    parse_value,
    run,
)

from ._helpers import Child

# ------------------------------------------------------------------ value format


def test_values_describe_themselves() -> None:
    value = make_value(b"k:1", writer=7, seq=42, expires_ms=123, flags=99, size=300)
    info = parse_value(b"k:1", value)
    assert (info.writer, info.seq, info.expires_ms, info.flags) == (7, 42, 123, 99)
    assert parse_value(b"k:1", make_value(b"k:1", 1, 1, 0, 16, 0)).seq == 1


@pytest.mark.parametrize("position", [0, 5, 20, 100, -9, -1])
def test_a_torn_value_is_detected(position: int) -> None:
    value = bytearray(make_value(b"k:1", 7, 42, 0, 99, 200))
    value[position] ^= 0x40
    with pytest.raises(ValueError):
        parse_value(b"k:1", bytes(value))


def test_a_value_cut_short_or_of_another_key_is_detected() -> None:
    value = make_value(b"k:1", 7, 42, 0, 99, 200)
    with pytest.raises(ValueError, match="checksum"):
        parse_value(b"k:1", value[:-1])
    with pytest.raises(ValueError, match="short"):
        parse_value(b"k:1", value[:10])
    with pytest.raises(ValueError, match="foreign"):
        parse_value(b"k:2", value)
    # Two halves of two genuine values do not make a valid one.
    other = make_value(b"k:1", 7, 43, 0, 99, 200)
    with pytest.raises(ValueError):
        parse_value(b"k:1", value[:100] + other[100:])


def test_counter_regression_rules() -> None:
    birth = 5 << 32
    assert not counter_regressed(None, birth + 3, strict=True)
    assert not counter_regressed((5, 3), birth + 4, strict=True)
    assert not counter_regressed((5, 3), birth + 3, strict=False)
    assert counter_regressed((5, 3), birth + 3, strict=True)
    assert counter_regressed((5, 3), birth + 2, strict=False)
    assert not counter_regressed((4, 900), birth + 1, strict=True)  # reborn: allowed


# ------------------------------------------------------------------ short run


def _wchan_available() -> bool:
    """Whether /proc/<pid>/wchan names kernel functions on this system."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            try:
                wchan = Path(f"/proc/{child.pid}/wchan").read_text().strip()
            except OSError:
                return False
            if "nanosleep" in wchan:
                return True
            time.sleep(0.01)
        return False
    finally:
        child.kill()
        child.wait()


def test_short_torture_run_with_kills_finds_no_violation(tmp_path: Path) -> None:
    cfg = TortureConfig(
        duration=10.0,
        workers=8,
        kill_interval=0.1,
        hold_fraction=0.4,
        reopen_interval=1.5,
        zombie_fraction=0.5,
        zombie_hold=0.3,
        relative_fraction=0.5,
        sweep_weight=2.0,
        nofile_weight=1.0,
        spill_fraction=0.05,
        directory=str(tmp_path),
        seed=20260522,
    )
    report = run(cfg)
    assert report.violations == 0, report.render()
    # Every fault of the run happened.
    faults = report.faults
    assert faults["reopen_storms"] > 0, faults
    assert faults["zombie_kills"] > 0, faults
    assert faults["sweeps"] > 0 and faults["nofile_episodes"] > 0, faults
    assert faults["nofile_refused_writes"] > 0, faults
    assert faults["relative_opens"] > 0, faults
    assert faults["owned_reads"] > 100, faults
    # The CAS total: one process killed mid-loop, nothing lost or doubled.
    acked, final = faults["cas_total_acknowledged"], faults["cas_total_final"]
    assert acked > 0 and (faults["cas_total_reset"] or acked <= final <= acked + 1), faults
    assert report.operations > 1000
    assert report.values_verified > 100
    assert report.kills_random > 0
    assert report.kills_mid_write > 0
    if _wchan_available():  # the harness can see the victim inside the hold
        assert report.mid_write_kills_repaired == report.kills_mid_write
    else:  # it kills after a fixed delay instead: most kills still land inside
        assert report.mid_write_kills_repaired > 0
    assert report.shard_salvages + report.shard_resets >= report.kills_mid_write
    # The aimed kills hold a shard mid-write without writing an entry: the
    # repair keeps every complete entry.
    assert report.entries_lost_per_mid_write_kill == 0
    assert report.corruptions == 0
    assert report.evictions > 0  # the cache is small on purpose
    assert report.counter_rebirths > 0
    assert report.final_check["shards"] == 8
    assert report.latency_max_ms < cfg.latency_bound * 1000
    assert list(tmp_path.iterdir()) == []  # the run cleans up after itself


# ------------------------------------------------------------------ detection


def _find_cache(directory: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(directory.glob("nearcache-torture-*/torture.cache"))
        if found:
            return str(found[0])
        time.sleep(0.01)
    raise TimeoutError("the torture run never created its cache")


def _sabotage(directory: Path, seconds: float) -> None:
    """Plant foreign, torn and expired values and lower counters, in a loop."""
    cache = _native.NativeCache(_find_cache(directory), 0, create=False)
    deadline = time.monotonic() + seconds
    n = 0
    while time.monotonic() < deadline:
        n += 1
        i = n % 200
        if n % 4 == 0:  # a whole value, but of another key
            cache.set(data_key(i), make_value(data_key(i + 1), 1, n, 0, 20, 50), None, 20)
        elif n % 4 == 1:  # a torn value
            torn = bytearray(make_value(data_key(i), 1, n, 0, 20, 50))
            torn[40] ^= 1
            cache.set(data_key(i), bytes(torn), None, 20)
        elif n % 4 == 2:  # claims a TTL it was not stored with
            cache.set(data_key(i), make_value(data_key(i), 1, n, 1000, 20, 50), None, 20)
        else:  # a counter going backwards (same birth id, lower count)
            got = cache.get_entry(counter_key(i % 4))
            if got is not None and got[1] == _native.FLAG_INT:
                value = int.from_bytes(got[0], "little", signed=True)
                if value & 0xFFFFFFFF > 2:
                    lowered = (value - 2).to_bytes(8, "little", signed=True)
                    cache.set(counter_key(i % 4), lowered, None, _native.FLAG_INT)
        time.sleep(0.0005)


def _detect(cfg: TortureConfig, saboteur: Child) -> TortureReport:
    try:
        return run(cfg)
    finally:
        saboteur.kill()
        saboteur.wait()


def test_strict_admission_in_segmented_shards_survives_kills(tmp_path: Path) -> None:
    # Strict admission judges a full head inside a move (segmented shards:
    # 1 MiB each here) and a shard of one segment inside its compaction
    # (the run above); kills land in both.
    cfg = TortureConfig(
        duration=6.0,
        workers=6,
        size=4 << 20,
        shards=4,
        keys=12000,
        kill_interval=0.1,
        hold_fraction=0.4,
        reopen_interval=3.0,
        spill_fraction=0.0,
        directory=str(tmp_path),
        seed=20261127,
        eviction_mode="strict",
    )
    report = run(cfg)
    assert report.violations == 0, report.render()
    assert report.evictions > 0
    assert report.corruptions == 0
    assert report.kills_mid_write > 0
    assert report.final_check["shards"] == 4


def test_planted_faults_are_reported(tmp_path: Path) -> None:
    saboteur = Child(lambda: _sabotage(tmp_path, 5.0))
    cfg = TortureConfig(
        duration=4.0,
        workers=3,
        keys=200,
        counters=4,
        kill_interval=0,
        ttl_fraction=0,
        directory=str(tmp_path),
    )
    report = _detect(cfg, saboteur)
    kinds = report.violation_kinds
    assert report.violations == sum(kinds.values()) > 0
    assert kinds.get("bad value", 0) > 0  # foreign and torn values
    assert kinds.get("expiry lost", 0) > 0
    assert kinds.get("counter went backwards", 0) > 0
    errors = {s.get("error", "") for s in report.violation_samples}
    assert any("foreign" in e for e in errors) and any("checksum" in e for e in errors)


def test_a_compare_and_swap_that_ignores_versions_is_reported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers' compare-and-swap increments made blind (a plain set of
    # what they read plus delta), racing the in-place increments: the lost
    # updates take counters back below counts their writers saw. The
    # workers are forked, so they inherit the patch.
    def blind_cas_incr(self: Any, op: int) -> None:
        key = counter_key(self.rng.randrange(self.cfg.counters))
        got = self.cache.get_entry(key)
        if got is not None and got[1] == _native.FLAG_INT:
            time.sleep(0.0002)  # widen the window a concurrent incr falls into
            value = int.from_bytes(got[0], "little", signed=True) + 1
            self.cache.set(key, value.to_bytes(8, "little", signed=True), None, _native.FLAG_INT)

    monkeypatch.setattr(torture._Worker, "cas_incr", blind_cas_incr)
    only = ("incr", "cas_incr")
    # _OP_WEIGHTS covers every operation but the last two (sweep, nofile),
    # whose weights come from the configuration.
    named = torture._OP_NAMES[: len(torture._OP_WEIGHTS)]
    weights = tuple(5 if name in only else 0 for name in named)
    monkeypatch.setattr(torture, "_OP_WEIGHTS", weights)
    cfg = TortureConfig(
        duration=3.0,
        workers=3,
        counters=2,
        kill_interval=0,
        sweep_weight=0,
        nofile_weight=0,
        directory=str(tmp_path),
    )
    report = run(cfg)
    assert report.violation_kinds.get("counter went backwards", 0) > 0, report.render()


def _delete_owned(directory: Path, seconds: float) -> None:
    """Delete the workers' owned keys behind their backs (no reason counted)."""
    cache = _native.NativeCache(_find_cache(directory), 0, create=False)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for slot in range(3):
            for i in range(12):
                cache.delete(owned_key(slot, i))
        time.sleep(0.002)


def test_an_acknowledged_value_that_silently_disappears_is_reported(tmp_path: Path) -> None:
    saboteur = Child(lambda: _delete_owned(tmp_path, 5.0))
    cfg = TortureConfig(
        duration=4.0,
        workers=3,
        keys=200,
        kill_interval=0,
        reopen_interval=0,
        directory=str(tmp_path),
    )
    report = _detect(cfg, saboteur)
    assert report.violation_kinds.get("acknowledged value vanished", 0) > 0, report.render()


def test_a_stuck_lock_holder_costs_timeouts_not_hangs(tmp_path: Path) -> None:
    """A peer that sits on a shard lock for 2.5 s: with bounded lock waits no
    operation blocks past the lock timeout; reads miss, writes are refused
    and counted."""

    def hold() -> None:
        cache = _native.NativeCache(_find_cache(tmp_path), 0, create=False)
        time.sleep(0.5)
        cache._debug_hold_shard_mid_write(data_key(0), 2.5)

    saboteur = Child(hold)
    cfg = TortureConfig(
        duration=4.5,
        workers=3,
        shards=1,  # every operation needs the held shard
        kill_interval=0,
        latency_bound=0.5,
        stall_limit=1.5,
        directory=str(tmp_path),
    )
    report = _detect(cfg, saboteur)
    kinds = report.violation_kinds
    assert kinds.get("operation blocked", 0) == 0, report.render()
    assert kinds.get("slow operation", 0) == 0, report.render()
    assert report.lock_timeouts > 0 and report.write_timeouts > 0
    assert report.latency_max_ms < 500


# ------------------------------------------------------------------ command line


def test_command_line_json_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--duration", "1.5", "--workers", "2", "--json", "--dir", str(tmp_path)]
    argv += ["--kill-interval", "0.3"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["violations"] == 0
    assert report["workers"] == 2
    assert report["operations"] > 0
    assert report["entries_lost_per_mid_write_kill"] >= 0
    assert "lock_timeouts" in report and "shard_salvages" in report


def test_runs_as_a_module() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nearcache.torture", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 0
    assert "--duration" in proc.stdout


def test_nearcache_command_has_a_torture_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    from nearcache import cli

    with pytest.raises(SystemExit) as exit_info:
        cli.main(["torture", "--help"])
    assert exit_info.value.code == 0
    assert "--kill-interval" in capsys.readouterr().out
