"""What ``nearcache bench`` shows in a terminal: no cut figure at 80 or 120
columns, a header with machine, load and versions, saved results, usage errors."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from nearcache.bench import runner
from nearcache.bench.model import BenchResult, CaseResult, Measurement, WorkloadResult
from nearcache.bench.report import (
    Table,
    header_lines,
    load_warning,
    markdown_report,
    print_tables,
    skipped_notes,
    terminal_header,
)
from nearcache.cli import main

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"
#: Saved runs whose tables are wide: pairwise matrices, latency columns, limits.
SAVED = ["holds.json", "scaling.json", "value-sizes.json", "e2e.json"]


def _render(tables: list[Table], width: int) -> str:
    console = Console(record=True, width=width, file=io.StringIO(), color_system=None)
    print_tables(console, tables)
    return console.export_text()


def _assert_whole(tables: list[Table], out: str, width: int) -> None:
    assert "…" not in out
    for line in out.splitlines():
        if line[:1] in "┏┃┡│└":
            assert len(line) <= width, line
    for table in tables:
        if not table.terminal:
            continue
        for row in table.rows:
            for cell in row:
                # Every figure intact, on one line.
                assert cell in out, (table.title, cell)


@pytest.mark.parametrize("width", [80, 120])
@pytest.mark.parametrize("saved", SAVED)
def test_saved_results_render_whole(saved: str, width: int) -> None:
    result = BenchResult.load(RESULTS / saved)
    for tables in runner.render(result).values():
        _assert_whole(tables, _render(tables, width), width)


@pytest.mark.parametrize("width", [80, 120])
def test_chi2010_and_django_tables_render_whole(width: int) -> None:
    result = BenchResult.load(RESULTS / "bench.json")
    result.workloads = [w for w in result.workloads if w.name in ("chi-2010", "django-8proc")]
    assert len(result.workloads) == 2
    for tables in runner.render(result).values():
        _assert_whole(tables, _render(tables, width), width)


def test_wide_table_is_split_then_stacked() -> None:
    figures = [f"{n:,}.{n % 10}/s" for n in range(1_000_000, 1_000_012)]
    wide = Table("wide", ["backend", *[f"case {i}" for i in range(12)]], [["nearcache", *figures]])
    out = _render([wide], 80)
    assert "wide (part 1/" in out and "…" not in out
    assert all(f in out for f in figures)
    # A cell too wide to sit beside the first column: stacked, never cut.
    long_cell = "x" * 90
    tall = Table("tall", ["backend", "limit"], [["lmdb", long_cell]])
    out = _render([tall], 80)
    assert f"limit: {long_cell}" in out and "┃" not in out


def test_skipped_notes_say_each_reason_once() -> None:
    cases = [
        CaseResult(f"c{i}", f"case {i}", {}, skipped={"a": "not counted", "b": "not counted"})
        for i in range(35)
    ]
    cases[0].skipped["c"] = "failed: boom"
    notes = skipped_notes(cases)
    assert notes == ["a, b skipped: not counted", "c skipped (in case 0): failed: boom"]


def _result(load: list[float]) -> BenchResult:
    return BenchResult(
        command="nearcache bench",
        started="2026-01-02T03:04:05+00:00",
        profile={"name": "quick", "repeats": 2},
        machine={"cpu": "CPU X", "cores": 2, "loadavg_at_start": load, "python": "3.11.2"},
        versions={"nearcache": "9.9", "rich": "13"},
    )


def test_header_and_load_warning() -> None:
    idle, busy = _result([0.2, 0.3, 0.4]), _result([1.74, 0.7, 0.3])
    assert load_warning(idle.machine) is None
    assert "1.74" in (load_warning(busy.machine) or "")
    text = "\n".join(terminal_header(busy))
    assert "CPU X, 2 cores" in text and "1.74 0.70 0.30" in text
    assert "nearcache 9.9" in text and "warning" in text
    assert "warning" not in "\n".join(terminal_header(idle))
    assert any(line.startswith("- **Warning**: ") for line in header_lines(busy))
    assert "**Warning**" not in markdown_report(idle, {})


def _tiny(*extra: str) -> list[str]:
    return ["bench", "chi-2010", "--profile", "tiny", "--backends", "dict", "--no-progress", *extra]


def test_bench_saves_into_a_dated_folder_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(_tiny("--dir", str(tmp_path / "scratch"))) == 0
    (folder,) = (tmp_path / "nearcache-bench").iterdir()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d{6}", folder.name)
    names = {p.name for p in folder.iterdir()}
    assert {"results.json", "results.md"} <= names
    captured = capsys.readouterr()
    assert f"saved in {Path('nearcache-bench') / folder.name}/\n" in captured.err
    assert "load average (1/5/15 min) at start" in captured.out
    assert BenchResult.load(folder / "results.json").workloads[0].name == "chi-2010"
    assert "chi-2010.png" in names or "no charts" in captured.err
    # --out chooses the folder (without matplotlib: no charts, and it says so);
    # --no-save saves nothing.
    import nearcache.bench.plots as plots

    monkeypatch.setattr(plots, "matplotlib_missing", lambda: "matplotlib not importable (test)")
    assert main(_tiny("--out", str(tmp_path / "mine"))) == 0
    assert {p.name for p in (tmp_path / "mine").iterdir()} == {"results.json", "results.md"}
    assert "no charts: matplotlib not importable (test)" in capsys.readouterr().err
    assert main(_tiny("--no-save")) == 0
    assert len(list((tmp_path / "nearcache-bench").iterdir())) == 1


def test_busy_machine_warns_in_output_and_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import nearcache.bench.machine as machine
    import nearcache.bench.plots as plots

    monkeypatch.setattr(machine, "_loadavg", lambda: [3.5, 2.0, 1.0])
    monkeypatch.setattr(plots, "matplotlib_missing", lambda: "not needed here")
    assert main(_tiny("--out", str(tmp_path / "busy"))) == 0
    assert "warning" in capsys.readouterr().out
    saved = BenchResult.load(tmp_path / "busy" / "results.json")
    assert "3.50" in saved.machine["load_warning"]
    assert (
        "- **Warning**: the load average was 3.50" in (tmp_path / "busy" / "results.md").read_text()
    )


def test_misspelled_option_shows_bench_usage(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--quik"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: nearcache bench")
    assert "did you mean --quick?" in err


def test_help_names_the_workloads_all_runs(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    # argparse wraps lines, at hyphens too: compare without whitespace.
    text = "".join(capsys.readouterr().out.split())
    from nearcache.bench.workloads import WORKLOADS, default_workloads

    named = [n for n in WORKLOADS if n not in default_workloads()]
    assert {"value-sizes", "e2e", "perl-chi-2010"} <= set(named)
    wanted = f"default: {', '.join(default_workloads())}; only when named: {', '.join(named)}"
    assert "".join(wanted.split()) in text
    assert "(all)" not in text


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    import nearcache

    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"nearcache {nearcache.__version__} (")


def test_zipf_hit_ratio_panels_are_labelled_hit_ratio(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from nearcache.bench.workloads import zipf

    seen: dict[str, Any] = {}

    def capture(path: Path, title: str, panels: Any, xlabel: str, **kw: Any) -> Path:
        seen.update(panels=panels, xlabels=kw["xlabels"])
        return path

    monkeypatch.setattr(zipf, "barh_panels", capture)
    metrics = {"hit_ratio": 0.8, "lru_hit_ratio": 0.82, "ops_per_s": 1e6}
    case = CaseResult("a", "alpha 1", {}, measurements=[Measurement("nearcache", metrics)])
    result = WorkloadResult("zipf", "t", "", "", {}, cases=[case])
    zipf.Zipf(runner.PROFILES["tiny"]).plot(result, tmp_path)
    titles = [p[0] for p in seen["panels"]]
    assert titles == ["hit ratio, alpha 1", "requests/s, alpha 1"]
    assert seen["xlabels"] == ["hit ratio (hits / requests)", "requests per second"]
