"""PNG charts with matplotlib (Agg backend, no display needed).

nearcache's own bars are drawn in one colour and every peer in a neutral one,
so a reader finds nearcache at a glance; values are on a log scale where the
backends span orders of magnitude.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["barh_panels", "latency_panels", "matplotlib_missing"]

OURS_COLOR = "#d9480f"
PEER_COLOR = "#5c7cfa"
SERVER_COLOR = "#868e96"


def matplotlib_missing() -> str | None:
    """A reason if matplotlib cannot be imported, else None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
    except Exception as exc:
        return f"matplotlib not importable ({exc})"
    return None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(name: str, ours: set[str], network: set[str]) -> str:
    if name in ours:
        return OURS_COLOR
    if name in network:
        return SERVER_COLOR
    return PEER_COLOR


def barh_panels(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    xlabel: str,
    ours: set[str],
    network: set[str] = frozenset(),  # type: ignore[assignment]
    log: bool = True,
    fmt: str = "{:,.0f}",
    columns: int = 2,
) -> Path:
    """One horizontal bar chart per panel, bars sorted by value, labelled with it."""
    plt = _pyplot()
    n = len(panels)
    cols = min(columns, n) or 1
    rows = math.ceil(n / cols) or 1
    longest = max((len(p[1]) for p in panels), default=1)
    fig, axes = plt.subplots(
        rows, cols, figsize=(6.5 * cols, 0.32 * longest * rows + 1.4 * rows), squeeze=False
    )
    for ax, (panel_title, pairs) in zip(axes.flat, panels, strict=False):
        data = sorted((p for p in pairs if p[1] > 0), key=lambda p: p[1])
        names = [p[0] for p in data]
        values = [p[1] for p in data]
        ax.barh(names, values, color=[_color(nm, ours, network) for nm in names])
        if log and values and max(values) / max(min(values), 1e-12) > 20:
            ax.set_xscale("log")
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.tick_params(axis="both", labelsize=8)
        for y, v in enumerate(values):
            ax.text(v, y, " " + fmt.format(v), va="center", fontsize=7)
        if values:
            lo, hi = ax.get_xlim()
            ax.set_xlim(lo, hi * (4 if ax.get_xscale() == "log" else 1.25))
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_size_inches()[1]))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_panels(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, Mapping[str, Sequence[tuple[str, float]]]]],
    ours: set[str],
) -> Path:
    """Latency at percentiles, one line per backend, one panel per action (log scale).

    ``panels`` is ``[(action, {backend: [(percentile_label, ns), ...]}), ...]``,
    plotted in microseconds like the diskcache study's charts.
    """
    plt = _pyplot()
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(6.0 * n, 4.8), squeeze=False)
    for ax, (action, series) in zip(axes.flat, panels, strict=False):
        for backend, points in sorted(series.items()):
            labels = [p[0] for p in points]
            values = [max(p[1], 1.0) / 1000.0 for p in points]
            style = (
                {"linewidth": 2.6, "color": OURS_COLOR} if backend in ours else {"linewidth": 1.2}
            )
            ax.plot(labels, values, marker="o", markersize=3, label=backend, **style)
        ax.set_yscale("log")
        ax.set_title(action, fontsize=10)
        ax.set_xlabel("percentile", fontsize=8)
        ax.set_ylabel("latency (microseconds)", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(axis="both", labelsize=8)
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, max(1, len(labels))), fontsize=8)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
