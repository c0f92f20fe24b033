"""The nearcache command: bench options and outputs, stats, clear, info."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from nearcache.bench.model import BenchResult
from nearcache.cli import build_parser, main


def test_parser_defaults_and_errors() -> None:
    args = build_parser().parse_args(["bench"])
    assert args.workloads == [] and not args.quick and args.backends == []
    args = build_parser().parse_args(
        ["bench", "zipf", "--quick", "--backends", "dict,lmdb", "--memcached", "127.0.0.1:11211"]
    )
    assert args.workloads == ["zipf"] and args.quick
    assert args.backends == ["dict", "lmdb"] and args.memcached == ("127.0.0.1", 11211)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["bench", "--memcached", "nohostport"])


def test_unknown_workload_and_backend_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "no-such-workload"]) == 2
    assert main(["bench", "zipf", "--backends", "nope", "--no-progress"]) == 2


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--list"]) == 0
    out = capsys.readouterr().out
    for name in ("chi-2010", "fastmmap-2004", "open-per-request", "django-8proc", "zipf"):
        assert name in out
    assert "needs a Redis server" in out


def test_bench_writes_json_markdown_and_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out_json, out_md, plots = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "png"
    argv = ["bench", "chi-2010", "zipf", "--profile", "tiny", "--backends", "dict,cachetools"]
    argv += ["--json", str(out_json), "--markdown", str(out_md), "--plot", str(plots)]
    argv += ["--no-progress", "--no-save", "--dir", str(tmp_path / "scratch")]
    assert main(argv) == 0
    result = BenchResult.load(out_json)
    assert result.command.startswith("nearcache bench chi-2010 zipf")
    assert result.machine["cores"] >= 1 and result.machine["python"]
    assert "cachetools" in result.versions
    assert [w.name for w in result.workloads] == ["chi-2010", "zipf"]
    md = out_md.read_text()
    assert "# nearcache bench results" in md and "Benchmarking caches with ratio 1:10" in md
    assert sorted(p.name for p in plots.iterdir()) == ["chi-2010.png", "zipf.png"]
    assert all(p.stat().st_size > 1000 for p in plots.iterdir())
    # --load re-renders the same tables from the JSON alone.
    again = tmp_path / "again.md"
    assert main(["bench", "--load", str(out_json), "--markdown", str(again)]) == 0
    assert again.read_text() == md
    assert json.loads(out_json.read_text())["schema"] == 1


def _nearcache(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "nearcache", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_stats_info_clear(tmp_path: Path) -> None:
    native = pytest.importorskip("nearcache._native")
    path = str(tmp_path / "cli-cache")
    cache = native.NativeCache(path, 1 << 20)
    for i in range(10):
        cache.set(f"k{i}", b"v")
    del cache
    info = _nearcache("info", path, "--check", "--json")
    assert info.returncode == 0, info.stderr
    data = json.loads(info.stdout)
    assert data["entries"] == 10 and data["size_bytes"] >= 1 << 20 and data["check"] == "ok"
    stats = _nearcache("stats", path, "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["entries"] == 10
    cleared = _nearcache("clear", path)
    assert cleared.returncode == 0 and "10 entries removed" in cleared.stdout
    assert json.loads(_nearcache("stats", path, "--json").stdout)["entries"] == 0
    missing = _nearcache("info", str(tmp_path / "absent"))
    assert missing.returncode == 1 and "no cache file" in missing.stderr
