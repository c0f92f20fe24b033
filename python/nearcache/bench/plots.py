"""PNG charts with matplotlib (Agg backend, no display needed).

Every backend has one colour and one marker, the same in every chart
(:func:`backend_style`).  Colours come in families by who sees a store's
entries, so a chart reads by group before it reads by name:

* nearcache's own backends: warm colours (orange, crimson, amber, purple,
  pink), drawn thick (lines) or with a dark outline and a bold label (bars);
* in-process peers (dict, cachetools, cachebox, LocMemCache): blues;
* host peers shared by processes (lmdb, diskcache, file and database
  caches): greens;
* network peers (Redis, memcached): greys and browns.

Line charts with many backends are small multiples: one row per peer group,
each with nearcache's lines repeated as the reference, so no panel has more
than about eight lines.  Values are on a log scale where the backends span
orders of magnitude.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "BackendStyle",
    "backend_style",
    "barh_panels",
    "latency_panels",
    "matplotlib_missing",
    "size_lines",
]


@dataclass(frozen=True)
class BackendStyle:
    """How one backend is drawn."""

    color: str
    marker: str
    family: str  # "ours", "process", "host", "network" or "other"


#: Family -> (legend label, colours for backends not listed in :data:`STYLES`).
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "ours": ("nearcache (ours)", ("#e8590c", "#c2255c", "#f08c00", "#9c36b5", "#f06595")),
    "process": ("in-process peers", ("#1864ab", "#4dabf7", "#3b5bdb", "#15aabf", "#748ffc")),
    "host": ("host peers (shared files)", ("#2b8a3e", "#82c91e", "#0ca678", "#5c940d")),
    "network": ("network peers (servers)", ("#495057", "#868e96", "#7f5539", "#b08968")),
    "other": ("baselines", ("#adb5bd", "#212529")),
}
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "h")

#: The known backends' styles: unique (colour, marker) pairs.
STYLES: dict[str, BackendStyle] = {
    "nearcache": BackendStyle("#e8590c", "o", "ours"),
    "nearcache-native": BackendStyle("#c2255c", "s", "ours"),
    "django-nearcache": BackendStyle("#f08c00", "D", "ours"),
    "tiered": BackendStyle("#9c36b5", "^", "ours"),
    "nearcache-inline": BackendStyle("#a61e4d", "s", "ours"),
    "nearcache-spilled": BackendStyle("#ffa94d", "^", "ours"),
    "django-tiered-redis": BackendStyle("#f06595", "v", "ours"),
    "dict": BackendStyle("#1864ab", "o", "process"),
    "cachetools": BackendStyle("#4dabf7", "s", "process"),
    "cachebox": BackendStyle("#3b5bdb", "^", "process"),
    "django-locmem": BackendStyle("#15aabf", "D", "process"),
    "lmdb": BackendStyle("#2b8a3e", "o", "host"),
    "diskcache": BackendStyle("#82c91e", "s", "host"),
    "diskcache-fanout": BackendStyle("#0ca678", "^", "host"),
    "django-diskcache": BackendStyle("#5c940d", "D", "host"),
    "django-filebased": BackendStyle("#087f5b", "v", "host"),
    "django-db": BackendStyle("#94d82d", "P", "host"),
    "redis": BackendStyle("#495057", "o", "network"),
    "memcached": BackendStyle("#868e96", "s", "network"),
    "django-redis": BackendStyle("#7f5539", "^", "network"),
    "django-memcached": BackendStyle("#b08968", "D", "network"),
    "django-dummy": BackendStyle("#adb5bd", "X", "other"),
    "no-work view": BackendStyle("#212529", "*", "other"),
}

_SCOPE_FAMILY = {"process": "process", "host": "host", "network": "network"}


def _scopes() -> dict[str, str]:
    """Registered backend name -> scope ("process", "host", "network")."""
    try:
        from .backends.registry import all_backends

        return {cls.name: cls.scope.value for cls in all_backends()}
    except Exception:  # plotting a saved result must not need every backend importable
        return {}


def backend_style(name: str, ours: AbstractSet[str] = frozenset()) -> BackendStyle:
    """The colour, marker and family of ``name`` (stable across charts and runs)."""
    style = STYLES.get(name)
    if style is not None:
        return style
    family = "ours" if name in ours else _SCOPE_FAMILY.get(_scopes().get(name, ""), "other")
    colours = FAMILIES[family][1]
    h = zlib.crc32(name.encode("utf-8"))
    return BackendStyle(colours[h % len(colours)], _MARKERS[(h // 7) % len(_MARKERS)], family)


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


def _family_legend(fig: Any, families: Sequence[str], y: float = 0.0) -> None:
    """A legend of the colour families present (bar charts)."""
    from matplotlib.patches import Patch

    handles = [
        Patch(
            facecolor=FAMILIES[f][1][0],
            edgecolor="#212529" if f == "ours" else "none",
            linewidth=1.5,
            label=FAMILIES[f][0],
        )
        for f in ("ours", "process", "host", "network", "other")
        if f in families
    ]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=9, frameon=False)


def barh_panels(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    xlabel: str,
    ours: AbstractSet[str],
    network: AbstractSet[str] = frozenset(),
    log: bool = True,
    fmt: str = "{:,.0f}",
    columns: int = 2,
    xlabels: Sequence[str] | None = None,
) -> Path:
    """One horizontal bar chart per panel, bars sorted by value, labelled with it.

    ``xlabel`` names every panel's axis, unless ``xlabels`` gives one per
    panel (panels that measure different things).

    Each bar has its backend's colour (:func:`backend_style`); nearcache's
    bars are outlined and their labels bold.  ``network`` is kept for
    callers; the family comes from the registry.
    """
    plt = _pyplot()
    n = len(panels)
    cols = min(columns, n) or 1
    rows = math.ceil(n / cols) or 1
    longest = max((len(p[1]) for p in panels), default=1)
    fig, axes = plt.subplots(
        rows, cols, figsize=(6.5 * cols, 0.32 * longest * rows + 1.5 * rows + 0.6), squeeze=False
    )
    families: set[str] = set()
    labels = list(xlabels) if xlabels is not None else [xlabel] * n
    if len(labels) != n:
        raise ValueError(f"{n} panels but {len(labels)} axis labels")
    for ax, (panel_title, pairs), panel_xlabel in zip(axes.flat, panels, labels, strict=False):
        data = sorted((p for p in pairs if p[1] > 0), key=lambda p: p[1])
        names = [p[0] for p in data]
        values = [p[1] for p in data]
        styles = [backend_style(nm, ours) for nm in names]
        families.update(s.family for s in styles)
        ax.barh(
            names,
            values,
            color=[s.color for s in styles],
            edgecolor=["#212529" if nm in ours else "none" for nm in names],
            linewidth=1.5,
        )
        if log and values and max(values) / max(min(values), 1e-12) > 20:
            ax.set_xscale("log")
        ax.set_title(panel_title, fontsize=10)
        ax.set_xlabel(panel_xlabel, fontsize=8)
        ax.tick_params(axis="both", labelsize=8)
        for label in ax.get_yticklabels():
            if label.get_text() in ours:
                label.set_fontweight("bold")
        for y, v in enumerate(values):
            ax.text(v, y, " " + fmt.format(v), va="center", fontsize=7)
        ax.grid(True, axis="x", alpha=0.3)
        if values:
            lo, hi = ax.get_xlim()
            ax.set_xlim(lo, hi * (4 if ax.get_xscale() == "log" else 1.25))
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=12)
    _family_legend(fig, sorted(families))
    height = fig.get_size_inches()[1]
    fig.tight_layout(rect=(0, 0.45 / height, 1, 1 - 0.5 / height))
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
    """Latency at percentiles as small multiples (log scale, microseconds).

    ``panels`` is ``[(action, {backend: [(percentile_label, ns), ...]}), ...]``.
    Columns are the actions; rows are the peer groups (in-process, host,
    network), each row drawing its peers thin and nearcache's backends
    thick, so every panel compares nearcache with a handful of peers.
    """
    plt = _pyplot()
    names = sorted({b for _, series in panels for b in series})
    ours_present = [b for b in names if backend_style(b, ours).family == "ours"]
    groups = [
        (family, [b for b in names if backend_style(b, ours).family == family])
        for family in ("process", "host", "network", "other")
    ]
    groups = [(f, members) for f, members in groups if members] or [("ours", [])]
    n = len(panels)
    fig, axes = plt.subplots(
        len(groups), n, figsize=(5.2 * n + 2.6, 3.6 * len(groups) + 0.8), squeeze=False
    )
    for row, (family, members) in enumerate(groups):
        for col, (action, series) in enumerate(panels):
            ax = axes[row][col]
            for backend in [*members, *ours_present]:
                points = series.get(backend)
                if not points:
                    continue
                style = backend_style(backend, ours)
                mine = style.family == "ours"
                ax.plot(
                    [p[0] for p in points],
                    [max(p[1], 1.0) / 1000.0 for p in points],
                    marker=style.marker,
                    markersize=6 if mine else 4,
                    color=style.color,
                    linewidth=2.8 if mine else 1.3,
                    linestyle="-" if mine else "--",
                    zorder=3 if mine else 2,
                    label=backend,
                )
            ax.set_yscale("log")
            if row == 0:
                ax.set_title(action, fontsize=11)
            if col == 0:
                ax.set_ylabel(f"{FAMILIES[family][0]}\nlatency (µs)", fontsize=9)
            ax.set_xlabel("percentile", fontsize=8)
            ax.grid(True, which="both", alpha=0.3)
            ax.tick_params(axis="both", labelsize=8)
        handles, labels = axes[row][0].get_legend_handles_labels()
        for col in range(1, n):  # backends absent from the first panel
            more_h, more_l = axes[row][col].get_legend_handles_labels()
            for h, lab in zip(more_h, more_l, strict=True):
                if lab not in labels:
                    handles.append(h)
                    labels.append(lab)
        axes[row][n - 1].legend(
            handles, labels, loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize=8
        )
    fig.suptitle(title + "\nnearcache's backends (thick) repeated in every row", fontsize=12)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _size_tick(n: float) -> str:
    """``1024`` -> ``1 KiB``, ``1258291`` -> ``1.2 MiB`` (axis labels)."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.3g} {unit}"
        value /= 1024
    return f"{n:.0f} B"


def size_lines(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, Mapping[str, Sequence[tuple[float, float]]]]],
    ylabel: str,
    ours: AbstractSet[str],
    marks: Sequence[tuple[float, str]] = (),
    dashes: Mapping[str, str] | None = None,
) -> Path:
    """A figure against value size, log-log: a panel per entry of ``panels``, a line per backend.

    ``panels`` is ``[(panel title, {backend: [(value bytes, figure), ...]}), ...]``;
    ``marks`` are vertical lines ``(value bytes, label)`` (a threshold, a limit);
    ``dashes`` gives some backends a line style other than solid.  nearcache's
    backends are drawn thick; points with a figure of 0 (not measured) are left out.
    """
    plt = _pyplot()
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(6.4 * n + 2.4, 5.4), squeeze=False)
    handles: dict[str, Any] = {}
    xs_all: set[float] = set()
    for ax, (panel_title, series) in zip(axes[0], panels, strict=True):
        for backend in sorted(series, key=lambda b: (b not in ours, b)):
            points = sorted((x, y) for x, y in series[backend] if x > 0 and y > 0)
            if not points:
                continue
            xs_all.update(x for x, _ in points)
            style = backend_style(backend, ours)
            mine = style.family == "ours"
            (line,) = ax.plot(
                [x for x, _ in points],
                [y for _, y in points],
                marker=style.marker,
                markersize=6 if mine else 4,
                color=style.color,
                linewidth=2.6 if mine else 1.3,
                linestyle=(dashes or {}).get(backend, "-"),
                zorder=3 if mine else 2,
                label=backend,
            )
            handles.setdefault(backend, line)
        for x, label in marks:
            ax.axvline(x, color="#868e96", linestyle=":", linewidth=1.2, zorder=1)
            ax.annotate(
                label,
                xy=(x, 1.0),
                xycoords=("data", "axes fraction"),
                xytext=(3, -4),
                textcoords="offset points",
                rotation=90,
                va="top",
                fontsize=7,
                color="#495057",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(panel_title, fontsize=11)
        ax.set_xlabel("value size (log scale)", fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        ax.tick_params(axis="both", labelsize=8)
        if xs_all:
            ticks = sorted(xs_all)
            ax.set_xticks(ticks)
            ax.set_xticklabels([_size_tick(x) for x in ticks], rotation=45, ha="right")
            ax.minorticks_off()
    fig.legend(
        list(handles.values()),
        list(handles),
        loc="center right",
        fontsize=8,
        frameon=False,
    )
    fig.suptitle(title, fontsize=12)
    width = fig.get_size_inches()[0]
    fig.tight_layout(rect=(0, 0, 1 - 2.2 / width, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
