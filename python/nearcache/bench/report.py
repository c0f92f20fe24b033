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
    "IDLE_LOAD",
    "REFERENCE_ORDER",
    "Table",
    "cmpthese",
    "fmt_bytes",
    "fmt_int",
    "fmt_ns",
    "fmt_rate",
    "fmt_ratio",
    "load_warning",
    "loss_notes",
    "markdown_report",
    "pick_reference",
    "print_tables",
    "skipped_note",
    "skipped_notes",
    "terminal_header",
]

#: The 1-minute load average at a run's start above which its timings are
#: marked as measured on a busy machine (in the terminal and the results).
IDLE_LOAD = 0.5

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

    def to_rich(self, columns: Sequence[int] | None = None, title: str | None = None) -> Any:
        """A ``rich.table.Table`` of ``columns`` (indexes; all by default).

        No cell wraps: a table wider than the console is not shrunk by this
        table but split or stacked by :func:`print_tables`.
        """
        from rich.table import Table as RichTable

        chosen = range(len(self.columns)) if columns is None else columns
        table = RichTable(
            title=self.title if title is None else title,
            title_justify="left",
            header_style="bold",
        )
        for i in chosen:
            table.add_column(
                self.columns[i],
                justify="right" if i in self.right else "left",
                no_wrap=True,
                overflow="ignore",
            )
        for row in self.rows:
            table.add_row(*(row[i] for i in chosen))
        return table

    def terminal_parts(self, width: int) -> list[Any]:
        """Renderables that show every cell whole within ``width`` columns.

        The table itself when it fits; else split into several tables that
        each repeat the first column (the row's name) and fit; else, when not
        even one column fits beside the first, stacked: one block per row,
        a ``column: value`` line per cell.
        """
        widths = self.column_widths()
        if _table_width(widths) <= width:
            return [self.to_rich()]
        if len(self.columns) < 2:
            return [self.stacked()]
        groups: list[list[int]] = []
        current: list[int] = []
        for i in range(1, len(self.columns)):
            if _table_width([widths[0], widths[i]]) > width:
                return [self.stacked()]  # this column alone does not fit beside the first
            if _table_width([widths[j] for j in (0, *current, i)]) <= width:
                current.append(i)
            else:
                groups.append(current)
                current = [i]
        groups.append(current)
        n = len(groups)
        return [
            self.to_rich([0, *g], title=f"{self.title} (part {k}/{n})")
            for k, g in enumerate(groups, 1)
        ]

    def column_widths(self) -> list[int]:
        """Each column's width in terminal cells: its widest cell or header."""
        from rich.cells import cell_len

        return [
            max([cell_len(col), *(cell_len(row[i]) for row in self.rows)])
            for i, col in enumerate(self.columns)
        ]

    def stacked(self) -> Any:
        """Every row as a block of ``column: value`` lines (for narrow terminals)."""
        from rich.console import Group
        from rich.text import Text

        lines: list[Any] = [Text(self.title, style="italic")]
        for row in self.rows:
            name = row[0] or "-"
            lines.append(Text(name, style="bold"))
            for col, cell in zip(self.columns[1:], row[1:], strict=True):
                lines.append(Text(f"  {col or '-'}: {cell}"))
        return Group(*lines)


def _table_width(column_widths: Sequence[int]) -> int:
    """The width of a rich table (default box, one space of padding on each
    side of a cell) with columns of these widths."""
    return sum(column_widths) + 3 * len(column_widths) + 1


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
    """Notes listing the backends a case skipped: one per reason."""
    return skipped_notes([case])


def skipped_notes(cases: Sequence[CaseResult]) -> list[str]:
    """One note per reason for skipping, listing the backends it skipped (and
    the cases, when not every one of ``cases``)."""
    by_reason: dict[str, dict[str, list[str]]] = {}
    for case in cases:
        for name, reason in case.skipped.items():
            by_reason.setdefault(reason, {}).setdefault(name, []).append(case.label)
    notes = []
    for reason, backends in by_reason.items():
        everywhere = all(len(labels) == len(cases) for labels in backends.values())
        names = ", ".join(sorted(backends))
        where = ""
        if not everywhere and len(cases) > 1:
            labels = dict.fromkeys(label for ls in backends.values() for label in ls)
            where = f" (in {', '.join(labels)})"
        notes.append(f"{names} skipped{where}: {reason}")
    return notes


# -- whole reports -------------------------------------------------------------


def print_tables(console: Console, tables: Sequence[Table]) -> None:
    """Print tables and their notes to a rich console.

    No figure is ever cut or wrapped: a table wider than the console is
    split into tables that fit, or stacked (:meth:`Table.terminal_parts`);
    stacked lines longer than the console are left to the terminal to wrap
    (rich does not break them).
    """
    for table in tables:
        if not table.terminal:
            continue
        for part in table.terminal_parts(console.width):
            console.print(part, soft_wrap=not hasattr(part, "columns"))
        for note in table.notes:
            console.print(f"  [dim]- {note}[/dim]", highlight=False)
        console.print()


def load_warning(machine: Mapping[str, Any]) -> str | None:
    """Why a run's timings are not an idle machine's, or None (load at start <= IDLE_LOAD)."""
    load = machine.get("loadavg_at_start") or []
    if not load or float(load[0]) <= IDLE_LOAD:
        return None
    return (
        f"the load average was {float(load[0]):.2f} when the run started (above {IDLE_LOAD}): "
        "other programs competed for the CPU, so timings are lower and noisier than an idle "
        "machine's; publish only figures from an idle run"
    )


def terminal_header(result: BenchResult) -> list[str]:
    """Machine, load and versions, as rich markup lines for the top of a run."""
    m = result.machine
    mem = fmt_bytes(float(m.get("memory_bytes", 0))) if m.get("memory_bytes") else "?"
    load = " ".join(f"{x:.2f}" for x in m.get("loadavg_at_start") or []) or "?"
    versions = ", ".join(
        f"{k} {v}" for k, v in sorted(result.versions.items(), key=lambda kv: kv[0].lower())
    )
    commit = f" (commit {m['nearcache_commit']})" if m.get("nearcache_commit") else ""
    lines = [
        f"[bold]nearcache bench[/bold] started {result.started}, profile "
        f"{result.profile.get('name', '?')} ({result.profile.get('repeats', '?')} repeats, "
        "median reported)",
        f"machine: {m.get('cpu', '?')}, {m.get('cores', '?')} cores, {mem} RAM; {m.get('os', '?')}",
        f"load average (1/5/15 min) at start: {load}",
        f"versions: {m.get('python_implementation', 'Python')} {m.get('python', '?')}"
        f"{commit}; {versions}",
    ]
    warning = load_warning(m)
    if warning:
        lines.append(f"[bold yellow]warning[/bold yellow]: {warning}")
    return lines


def header_lines(result: BenchResult) -> list[str]:
    """Command, machine and versions, as Markdown bullet lines."""
    m = result.machine
    mem = fmt_bytes(float(m.get("memory_bytes", 0))) if m.get("memory_bytes") else "?"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(result.versions.items()))
    warning = load_warning(m)
    lines = [
        f"- Command: `{result.command}`",
        *([f"- **Warning**: {warning}"] if warning else []),
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
