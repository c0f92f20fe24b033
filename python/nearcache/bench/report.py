"""Tables: built by the workloads, rendered with rich in the terminal and as Markdown.

Also the figure formats, Perl's ``cmpthese`` relative-rate matrix, the
"relative to nearcache" columns, and the notes that say where nearcache loses
and what the faster backend gives up for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

    from .model import BenchResult, CaseResult

__all__ = [
    "REFERENCE_ORDER",
    "Table",
    "cmpthese",
    "fmt_bytes",
    "fmt_int",
    "fmt_ns",
    "fmt_rate",
    "fmt_ratio",
    "loss_notes",
    "markdown_report",
    "pick_reference",
    "print_tables",
]

#: Backends that relative columns compare against, in order of preference.
REFERENCE_ORDER = ("nearcache", "nearcache-native", "django-nearcache")


@dataclass
class Table:
    """A rendered-agnostic table: header, string cells, and notes printed below."""

    title: str
    columns: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)
    notes: list[str] = field(default_factory=list)
    #: False for detail tables that only the Markdown report shows.
    terminal: bool = True

    def __post_init__(self) -> None:
        for row in self.rows:
            if len(row) != len(self.columns):
                raise ValueError(f"row {row!r} does not match columns {self.columns!r}")

    def to_markdown(self) -> str:
        """GitHub-flavoured Markdown, with the title as a bold caption."""
        out = [f"**{self.title}**", ""]
        out.append("| " + " | ".join(_md(c) for c in self.columns) + " |")
        out.append(
            "|"
            + "|".join("---:" if i in self.right else ":---" for i in range(len(self.columns)))
            + "|"
        )
        for row in self.rows:
            out.append("| " + " | ".join(_md(c) for c in row) + " |")
        if self.notes:
            out.append("")
            out.extend(f"- {note}" for note in self.notes)
        out.append("")
        return "\n".join(out)

    def to_rich(self) -> Any:
        """A ``rich.table.Table``."""
        from rich.table import Table as RichTable

        table = RichTable(title=self.title, title_justify="left", header_style="bold")
        for i, col in enumerate(self.columns):
            table.add_column(col, justify="right" if i in self.right else "left", no_wrap=i == 0)
        for row in self.rows:
            table.add_row(*row)
        return table


def _md(text: str) -> str:
    return text.replace("|", "\\|") if text else " "


# -- figure formats -----------------------------------------------------------


def fmt_int(n: float) -> str:
    """``1234567`` -> ``1,234,567``."""
    return f"{round(n):,}"


def fmt_rate(ops_per_s: float) -> str:
    """Operations per second as Perl's Benchmark prints them: ``12345/s``."""
    if ops_per_s >= 100:
        return f"{round(ops_per_s):,}/s"
    return f"{ops_per_s:.3g}/s"


def fmt_ratio(x: float) -> str:
    """``2.345`` -> ``2.35x``; large values lose decimals."""
    if x <= 0:
        return "-"
    if x >= 100:
        return f"{x:,.0f}x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x"


def fmt_ns(ns: float) -> str:
    """A duration in the unit that keeps 3 significant digits: ``812ns``, ``36.0us``."""
    if ns < 1_000:
        return f"{ns:.0f}ns"
    if ns < 1_000_000:
        us = ns / 1_000
        return f"{us:.3g}us" if us < 100 else f"{us:.0f}us"
    if ns < 1_000_000_000:
        ms = ns / 1_000_000
        return f"{ms:.3g}ms" if ms < 100 else f"{ms:.0f}ms"
    return f"{ns / 1e9:.3g}s"


def fmt_bytes(n: float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


# -- comparisons ----------------------------------------------------------------


def pick_reference(names: Iterable[str]) -> str | None:
    """The backend relative columns compare against, among ``names``."""
    present = set(names)
    for name in REFERENCE_ORDER:
        if name in present:
            return name
    return None


def cmpthese(rates: Sequence[tuple[str, float]], title: str) -> Table:
    """Perl ``Benchmark::cmpthese``: rows and columns by rate ascending, cells in percent.

    The cell of row A, column B is how much faster A is than B:
    ``rate_A / rate_B - 1``, shown as a whole percentage, ``--`` on the diagonal.
    """
    ordered = sorted((r for r in rates if r[1] > 0), key=lambda r: r[1])
    columns = ["", "Rate", *[name for name, _ in ordered]]
    rows: list[list[str]] = []
    for name, rate in ordered:
        row = [name, fmt_rate(rate)]
        for other, other_rate in ordered:
            row.append("--" if other == name else f"{(rate / other_rate - 1) * 100:.0f}%")
        rows.append(row)
    return Table(title, columns, rows, right=set(range(1, len(columns))))


def loss_notes(
    figures: Mapping[str, Sequence[tuple[str, float]]],
    reference: str | None,
    tradeoffs: dict[str, str],
    higher_is_better: bool = True,
    fmt: Any = fmt_rate,
    min_ratio: float = 1.05,
) -> list[str]:
    """Say where ``reference`` loses: one note per faster backend, listing every figure.

    ``figures`` maps a figure's label (a case, a metric) to ``(backend, value)``
    pairs.  A backend beating ``reference`` by at least ``min_ratio`` on any
    figure gets one note quoting both measured values for each such figure and
    what it gives up for the speed (its ``tradeoff``).
    """
    if reference is None:
        return []
    losses: dict[str, list[str]] = {}
    for label, pairs in figures.items():
        values = dict(pairs)
        ref_value = values.get(reference)
        if ref_value is None or ref_value <= 0:
            continue
        for name, value in pairs:
            if name == reference or value <= 0:
                continue
            ratio = value / ref_value if higher_is_better else ref_value / value
            if ratio >= min_ratio:
                losses.setdefault(name, []).append(
                    f"{label} {fmt(value)} vs {fmt(ref_value)} ({ratio:.2f}x)"
                )
    notes = []
    for name, items in losses.items():
        why = tradeoffs.get(name, "")
        notes.append(
            f"{reference} loses to {name} on "
            + "; ".join(items)
            + (f". Why: {name} {why}." if why else ".")
        )
    return notes


def skipped_note(case: CaseResult) -> list[str]:
    """Notes listing the backends a case skipped, with their reasons."""
    return [f"{name} skipped: {reason}" for name, reason in sorted(case.skipped.items())]


# -- whole reports -------------------------------------------------------------


def print_tables(console: Console, tables: Sequence[Table]) -> None:
    """Print tables and their notes to a rich console."""
    for table in tables:
        if not table.terminal:
            continue
        console.print(table.to_rich())
        for note in table.notes:
            console.print(f"  [dim]- {note}[/dim]", highlight=False)
        console.print()


def header_lines(result: BenchResult) -> list[str]:
    """Command, machine and versions, as Markdown bullet lines."""
    m = result.machine
    mem = fmt_bytes(float(m.get("memory_bytes", 0))) if m.get("memory_bytes") else "?"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items()))
    lines = [
        f"- Command: `{result.command}`",
        f"- Started: {result.started} (took {result.duration_s:.0f} s; "
        f"profile `{result.profile.get('name', '?')}`, {result.profile.get('repeats', '?')} "
        "repeats, median reported)",
        f"- Machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {mem} RAM; "
        f"{m.get('os', '?')}",
        f"- Python: {m.get('python_implementation', '')} {m.get('python', '?')}",
        f"- Load average (1/5/15 min) at start {m.get('loadavg_at_start', '?')}, at end "
        f"{m.get('loadavg_at_end', '?')}: on {m.get('cores', '?')} cores, anything above 0 "
        "means other programs competed for the CPU and the figures are lower and noisier",
        f"- Scratch files: {m.get('workdir_fs', '?')}; nearcache files: "
        f"{m.get('shm_fs', '?')} (/dev/shm)",
        f"- Versions: {versions}",
    ]
    if m.get("nearcache_commit"):
        lines.append(f"- nearcache commit: {m['nearcache_commit']}")
    for kind, info in sorted(result.servers.items()):
        lines.append(f"- {kind}: {info}")
    return lines


def markdown_report(result: BenchResult, tables_by_workload: dict[str, list[Table]]) -> str:
    """The whole run as one Markdown document."""
    out = ["# nearcache bench results", ""]
    out.extend(header_lines(result))
    out.append("")
    out.append("## Backends")
    out.append("")
    out.append("| backend | what is measured | scope | version | status |")
    out.append("|:---|:---|:---|:---|:---|")
    for b in result.backends:
        status = "ran" if b.available else f"skipped: {b.reason}"
        out.append(f"| {b.name} | {_md(b.title)} | {b.scope} | {b.version} | {_md(status)} |")
    out.append("")
    for w in result.workloads:
        out.append(f"## {w.name}: {w.title}")
        out.append("")
        out.append(w.description)
        out.append("")
        if w.seed:
            out.append(f"Reproduces: {w.seed}. Parameters: `{_params(w.params)}`.")
            out.append("")
        for table in tables_by_workload.get(w.name, []):
            out.append(table.to_markdown())
    return "\n".join(out).rstrip() + "\n"


def _params(params: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in params.items())
