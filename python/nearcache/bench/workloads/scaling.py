"""``scaling``: aggregate throughput as worker processes are added, up to 4x the cores.

nearcache is meant to be the one cache of every worker process of a host, so
what matters is how the host's total rate grows with the number of workers.
For each operation mix and each process count the workload forks that many
processes, each with its own handle on the same store, and measures the
operations they complete together:

- **Process counts.** 1, 2, 4, ... (powers of two below the core count),
  the core count N itself, then 2N and 4N to show oversubscription.  N is
  ``os.cpu_count()``, so the same command covers a 2-, 16- or 64-core host.
- **Mixes.** get only; one set followed by ten gets (1:10, as ``chi-2010``);
  90% get / 9% set / 1% delete (as ``django-8proc``).  1,000 UUID keys,
  160-byte values, every key stored before each timed run; each process
  walks its own stretch of one pre-generated stream.
- **Starting together.** Workers open their handle, report ready and wait
  for one start signal (:func:`..multiproc.run_parallel`).  The first worker
  to wake sets a common deadline in shared memory (``perf_counter_ns`` is
  ``CLOCK_MONOTONIC``, one clock for every process); each worker loops until
  it, reading the clock every 256 operations.
- **The figure.** Aggregate ops/s = operations of all workers / (last end -
  first start).  Dividing by the common window, rather than summing each
  worker's own rate, never credits workers that ran one after another as if
  they ran side by side.  Each (count, backend) is run k times (the
  profile's repeats), counts interleaved within each repeat so a change of
  machine load hits every count alike; the best of the k is reported, and
  the ratio to one process is the best at N over the best at 1, both from
  the same run.
- **Backends.** nearcache (``Cache.get`` and the native path), lmdb (the
  lock-free-reads anchor), diskcache, a per-process ``dict`` (the ceiling:
  each process its own dict, nothing shared), and Redis and memcached when
  their servers are given.  Other process-local caches scale like ``dict``
  and Django's backends wrap backends measured here, so they are skipped.

The ``tiny`` profile (tests) runs a fixed number of operations per worker
instead of a duration, so the counts can be checked exactly.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity, Handle, Scope
from ..backends.registry import ours_names
from ..data import binary_values, uuid_keys
from ..model import Measurement, WorkloadResult
from ..multiproc import run_parallel
from ..report import Table, fmt_ratio, pick_reference, skipped_note
from .base import Case, Profile, Workload

__all__ = ["Scaling", "aggregate_rate", "process_counts"]

_GET, _SET, _DELETE = 0, 1, 2
_CHUNK = 256
VALUE_BYTES = 160

#: The mixes, in report order: (case id, label).
MIXES = (
    ("get", "get only"),
    ("1:10", "1 set : 10 gets"),
    ("90/9/1", "90% get / 9% set / 1% delete"),
)

#: The backends that take part, and why the others do not.
SCALING_BACKENDS = (
    "nearcache",
    "nearcache-native",
    "lmdb",
    "diskcache",
    "diskcache-fanout",
    "dict",
    "redis",
    "memcached",
)

_PARAMS: dict[str, dict[str, Any]] = {
    # seconds: timed loop of each worker (None: exactly `ops` operations per worker).
    "tiny": {"keys": 200, "stream": 2_048, "seconds": None, "ops": 1_024},
    "quick": {"keys": 1_000, "stream": 16_384, "seconds": 0.1, "ops": None},
    "default": {"keys": 1_000, "stream": 16_384, "seconds": 0.5, "ops": None},
}


def host_cores() -> int:
    """The number of cores the workload scales to (``os.cpu_count()``)."""
    return os.cpu_count() or 1


def process_counts(cores: int) -> list[int]:
    """1, 2, 4, ... below ``cores``, then ``cores``, ``2 * cores`` and ``4 * cores``."""
    if cores < 1:
        raise ValueError("cores must be at least 1")
    counts = []
    n = 1
    while n < cores:
        counts.append(n)
        n *= 2
    counts += [cores, 2 * cores, 4 * cores]
    return sorted(set(counts))


def aggregate_rate(workers: Sequence[dict[str, float]]) -> float:
    """Operations of all ``workers`` per second of the window they ran in together.

    Each worker reports ``ops``, ``start_ns`` and ``end_ns`` on the shared
    monotonic clock; the window runs from the first start to the last end.
    """
    if not workers:
        raise ValueError("no workers")
    window = max(w["end_ns"] for w in workers) - min(w["start_ns"] for w in workers)
    ops = sum(w["ops"] for w in workers)
    return ops * 1e9 / window if window > 0 else 0.0


def _chunks(
    kinds: list[int], keys: list[str], values: list[bytes]
) -> list[tuple[list[int], list[str], list[bytes]]]:
    """The stream cut into chunks of 256 operations (sliced once, before timing)."""
    return [
        (kinds[i : i + _CHUNK], keys[i : i + _CHUNK], values[i : i + _CHUNK])
        for i in range(0, len(kinds), _CHUNK)
    ]


def _worker_loop(
    handle: Handle,
    chunks: Sequence[tuple[list[int], list[str], list[bytes]]],
    first: int,
    deadline_box: Any,
    seconds: float | None,
    max_ops: int | None,
) -> dict[str, float]:
    """Run chunks from ``chunks[first]`` on, cycling, until the common deadline or ``max_ops``."""
    get, set_, delete = handle.get, handle.set, handle.delete
    clock = time.perf_counter_ns
    start = clock()
    deadline: int | None = None
    if seconds is not None:
        with deadline_box.get_lock():
            if deadline_box.value == 0:
                deadline_box.value = start + int(seconds * 1e9)
            deadline = int(deadline_box.value)
    ops = gets = hits = errors = 0
    pos = first % len(chunks)
    now = start
    while True:
        ck, kk, vv = chunks[pos]
        for kind, key, value in zip(ck, kk, vv, strict=True):
            try:
                if kind == _GET:
                    gets += 1
                    if get(key) is not None:
                        hits += 1
                elif kind == _SET:
                    set_(key, value)
                else:
                    delete(key)
            except Exception:
                errors += 1
        ops += len(ck)
        pos = (pos + 1) % len(chunks)
        now = clock()
        if deadline is not None and now >= deadline:
            break
        if max_ops is not None and ops >= max_ops:
            break
    return {
        "ops": float(ops),
        "gets": float(gets),
        "hits": float(hits),
        "errors": float(errors),
        "start_ns": float(start),
        "end_ns": float(now),
        "deadline_ns": float(deadline or 0),
    }


class Scaling(Workload):
    """Aggregate ops/s of 1 .. 4N processes on one store, and the ratio to one process."""

    name = "scaling"
    title = "aggregate throughput of 1 .. 4N processes sharing one store (N = cores)"
    seed = "issue 'Reads that scale with every core'"
    description = (
        "1, 2, 4, ... processes up to the core count N, then 2N and 4N (oversubscribed), "
        "each with its own handle on one store, started together and looping for a fixed "
        "time over 1,000 UUID keys with 160-byte values: get only, 1 set : 10 gets, and "
        "90% get / 9% set / 1% delete. Aggregate ops/s = all processes' operations / the "
        "common window; best of k runs (k = repeats); ratio = best at n processes / best at "
        "1. The dict row is one dict per process (nothing shared): the ceiling."
    )

    def __init__(self, profile: Profile, seed: int = 2010) -> None:
        super().__init__(profile, seed)
        self.cores = host_cores()
        self.counts = process_counts(self.cores)

    def params(self) -> dict[str, Any]:
        p = dict(_PARAMS[self.profile.name])
        p.update(
            cores=self.cores,
            procs=self.counts,
            value_bytes=VALUE_BYTES,
            best_of=self.profile.repeats,
        )
        return p

    def cases(self) -> list[Case]:
        return [Case(mix, label, {"mix": mix}) for mix, label in MIXES]

    def capacity(self, case: Case) -> Capacity:
        return Capacity(entry_bytes=36 + VALUE_BYTES, key_bytes=36, value_bytes=VALUE_BYTES)

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.name in SCALING_BACKENDS:
            return None
        if backend.scope is Scope.PROCESS:
            return "process-local: scales like the per-process dict, the ceiling shown"
        if backend.name.startswith("django-") or backend.name == "tiered":
            return "wraps a store measured directly in this workload"
        return "not part of the scaling comparison"

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        rng = random.Random(f"{self.rng_seed}:scaling")
        self.keys = uuid_keys(rng, p["keys"])
        self.values = binary_values(rng, p["keys"], VALUE_BYTES, 0.0)
        self.streams = {mix: _chunks(*self._stream(mix)) for mix, _ in MIXES}

    def _stream(self, mix: str) -> tuple[list[int], list[str], list[bytes]]:
        p = _PARAMS[self.profile.name]
        rng = random.Random(f"{self.rng_seed}:scaling:{mix}")
        kinds: list[int] = []
        keys: list[str] = []
        values: list[bytes] = []
        n = len(self.keys)
        for i in range(p["stream"]):
            if mix == "get":
                kind = _GET
            elif mix == "1:10":
                kind = _SET if i % 11 == 0 else _GET
            else:
                r = rng.random()
                kind = _GET if r < 0.90 else _SET if r < 0.99 else _DELETE
            j = rng.randrange(n)
            kinds.append(kind)
            keys.append(self.keys[j])
            values.append(self.values[j])
        return kinds, keys, values

    def _populate(self, handle: Handle) -> None:
        for key, value in zip(self.keys, self.values, strict=True):
            handle.set(key, value)

    def parallel_run(self, mix: str, backend: Backend, procs: int) -> dict[str, Any]:
        """One timed run of ``procs`` workers; per-worker figures and the aggregate."""
        p = _PARAMS[self.profile.name]
        local = backend.scope is Scope.PROCESS
        if not local:
            h = backend.open()
            try:
                self._populate(h)
            finally:
                h.close()
        backend.before_fork()
        chunks = self.streams[mix]
        box = multiprocessing.get_context("fork").Value("q", 0)
        stride = max(1, len(chunks) // procs)

        def setup(index: int) -> tuple[int, Handle]:
            handle = backend.open()
            if local:
                self._populate(handle)
            return index, handle

        def work(state: tuple[int, Handle]) -> dict[str, float]:
            index, handle = state
            try:
                return _worker_loop(handle, chunks, index * stride, box, p["seconds"], p["ops"])
            finally:
                handle.close()

        timeout = 120.0 + 10.0 * procs * (p["seconds"] or 1.0)
        workers, _ = run_parallel(procs, setup, work, timeout_s=timeout)
        return {"workers": workers, "ops_per_s": aggregate_rate(workers)}

    def measure(self, case: Case, backend: Backend) -> Measurement:
        mix = str(case.params["mix"])
        runs: list[dict[str, float]] = []
        best: dict[int, dict[str, Any]] = {}
        for repeat in range(max(1, self.profile.repeats)):
            for procs in self.counts:
                res = self.parallel_run(mix, backend, procs)
                workers = res["workers"]
                rates = [w["ops"] * 1e9 / max(1.0, w["end_ns"] - w["start_ns"]) for w in workers]
                run = {
                    "procs": float(procs),
                    "repeat": float(repeat),
                    "ops_per_s": res["ops_per_s"],
                    "ops": sum(w["ops"] for w in workers),
                    "window_s": (
                        max(w["end_ns"] for w in workers) - min(w["start_ns"] for w in workers)
                    )
                    / 1e9,
                    "gets": sum(w["gets"] for w in workers),
                    "hits": sum(w["hits"] for w in workers),
                    "errors": sum(w["errors"] for w in workers),
                    "slowest_proc_ops_per_s": min(rates),
                    "fastest_proc_ops_per_s": max(rates),
                }
                runs.append(run)
                if procs not in best or run["ops_per_s"] > best[procs]["ops_per_s"]:
                    best[procs] = run
        one = best[self.counts[0]]["ops_per_s"]
        metrics: dict[str, float] = {}
        for procs in self.counts:
            b = best[procs]
            metrics[f"ops_per_s_{procs}"] = b["ops_per_s"]
            metrics[f"ratio_{procs}"] = b["ops_per_s"] / one if one > 0 else 0.0
            metrics[f"hit_rate_{procs}"] = b["hits"] / b["gets"] if b["gets"] else 1.0
            metrics[f"errors_{procs}"] = b["errors"]
        return Measurement(
            backend=backend.name,
            metrics=metrics,
            runs=runs,
            info={
                "limit": backend.limit(),
                "procs": list(self.counts),
                "cores": self.cores,
                "best_of": max(1, self.profile.repeats),
            },
        )

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        counts = [int(n) for n in result.params.get("procs", [])]
        cores = int(result.params.get("cores", 0))
        if not counts or not result.cases:
            return []
        out: list[Table] = []
        best_of = result.params.get("best_of", "?")

        def head(n: int) -> str:
            return f"{n}" + (" (N)" if n == cores else "")

        summary_rows: list[list[str]] = []
        for case in result.cases:
            ms = sorted(
                case.measurements, key=lambda m: -m.metrics.get(f"ops_per_s_{counts[0]}", 0.0)
            )
            rows = []
            for m in ms:
                row = [m.backend]
                row += [_fmt_mops(m.metrics.get(f"ops_per_s_{n}", 0.0)) for n in counts]
                row += [fmt_ratio(m.metrics.get(f"ratio_{n}", 0.0)) for n in counts[1:]]
                rows.append(row)
                summary_rows.append(
                    [
                        m.backend,
                        case.label,
                        _fmt_mops(m.metrics.get(f"ops_per_s_{counts[0]}", 0.0)),
                        *[
                            fmt_ratio(m.metrics.get(f"ratio_{n}", 0.0))
                            for n in _summary_counts(counts, cores)
                        ],
                    ]
                )
            cols = ["backend", *[f"{head(n)} proc{'' if n == 1 else 's'}" for n in counts]]
            cols += [f"x at {head(n)}" for n in counts[1:]]
            notes = [
                f"N = {cores} cores; {', '.join(str(n) for n in counts if n > cores)} processes "
                "oversubscribe the cores. Aggregate M ops/s of all processes, best of "
                f"{best_of}; 'x at n' = best at n processes / best at 1 process."
            ]
            for m in ms:
                errors = sum(m.metrics.get(f"errors_{n}", 0.0) for n in counts)
                if errors:
                    notes.append(f"{m.backend}: {errors:.0f} operations raised (not counted)")
            notes.extend(skipped_note(case))
            out.append(
                Table(
                    f"scaling, {case.label}: aggregate M ops/s and ratio to one process",
                    cols,
                    rows,
                    right=set(range(1, len(cols))),
                    notes=notes,
                )
            )
        shown = _summary_counts(counts, cores)
        reference = pick_reference(r[0] for r in summary_rows)
        summary_rows.sort(key=lambda r: (r[0] != reference, r[0] not in ours_names(), r[0]))
        out.insert(
            0,
            Table(
                f"scaling: ratio to one process (N = {cores} cores, best of {best_of})",
                ["backend", "mix", "1 proc M ops/s", *[f"x at {head(n)}" for n in shown]],
                summary_rows,
                right=set(range(2, 3 + len(shown))),
            ),
        )
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        counts = [int(n) for n in result.params.get("procs", [])]
        if not counts or not result.cases:
            return []
        return [
            scaling_chart(
                outdir / "scaling.png",
                f"scaling: {int(result.params.get('cores', 0))} cores "
                f"(best of {result.params.get('best_of', '?')}; higher is better)",
                [
                    (
                        c.label,
                        {
                            m.backend: [(n, m.metrics.get(f"ops_per_s_{n}", 0.0)) for n in counts]
                            for m in c.measurements
                        },
                    )
                    for c in result.cases
                ],
                cores=int(result.params.get("cores", 0)),
                ours=ours_names(),
            )
        ]


def _summary_counts(counts: Sequence[int], cores: int) -> list[int]:
    """The counts the summary shows: 2, N and 4N (those that ran)."""
    wanted = [n for n in (2, cores, 4 * cores) if n in counts and n != counts[0]]
    return sorted(set(wanted))


def _fmt_mops(ops_per_s: float) -> str:
    """``12_345_678`` -> ``12.35``; below 0.1 M ops/s, three significant digits."""
    mops = ops_per_s / 1e6
    return f"{mops:.2f}" if mops >= 0.1 else f"{mops:.3g}"


# -- chart ------------------------------------------------------------------------

#: One colour and marker per backend; nearcache's are the warm ones, drawn thick.
STYLES: dict[str, tuple[str, str]] = {
    "nearcache": ("#d9480f", "o"),
    "nearcache-native": ("#f08c00", "s"),
    "lmdb": ("#1c7ed6", "^"),
    "dict": ("#495057", "D"),
    "diskcache": ("#2f9e44", "v"),
    "diskcache-fanout": ("#66a80f", "<"),
    "redis": ("#ae3ec9", "P"),
    "memcached": ("#7048e8", "X"),
}
_FALLBACK = ("#868e96", ".")


def scaling_chart(
    path: Path,
    title: str,
    panels: Sequence[tuple[str, dict[str, list[tuple[int, float]]]]],
    cores: int,
    ours: set[str],
) -> Path:
    """Aggregate ops/s (top row, log scale) and ratio to one process (bottom row) per mix.

    ``panels`` is ``[(mix label, {backend: [(processes, ops/s), ...]}), ...]``.
    The bottom row draws the ideal (min(n, cores)) as a dashed line and marks
    the core count; beyond it the processes share the cores.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(panels)
    fig, axes = plt.subplots(2, n, figsize=(5.2 * n, 8.4), squeeze=False, sharex=True)
    handles: dict[str, Any] = {}
    for col, (label, series) in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        xs_all: set[int] = set()
        for backend in sorted(series, key=lambda b: (b not in ours, b)):
            points = [(x, y) for x, y in series[backend] if y > 0]
            if not points:
                continue
            xs = [x for x, _ in points]
            ys = [y / 1e6 for _, y in points]
            xs_all.update(xs)
            colour, marker = STYLES.get(backend, _FALLBACK)
            mine = backend in ours
            style: dict[str, Any] = {
                "color": colour,
                "marker": marker,
                "linewidth": 2.8 if mine else 1.3,
                "markersize": 7 if mine else 5,
                "zorder": 3 if mine else 2,
                "label": backend,
            }
            (line,) = top.plot(xs, ys, **style)
            bottom.plot(xs, [y / ys[0] for y in ys], **style)
            handles.setdefault(backend, line)
        if xs_all:
            xs_sorted = sorted(xs_all)
            bottom.plot(
                xs_sorted,
                [min(x, cores) / xs_sorted[0] for x in xs_sorted],
                linestyle="--",
                color="#adb5bd",
                linewidth=1.0,
                label="ideal (min(n, cores))",
                zorder=1,
            )
        for ax in (top, bottom):
            ax.set_xscale("log", base=2)
            ax.axvline(cores, color="#adb5bd", linestyle=":", linewidth=1.0)
            ax.grid(True, which="major", alpha=0.3)
            ax.tick_params(axis="both", labelsize=8)
            if xs_all:
                ax.set_xticks(sorted(xs_all))
                ax.set_xticklabels([str(x) for x in sorted(xs_all)])
        top.set_yscale("log")
        top.set_title(label, fontsize=10)
        top.set_ylabel("aggregate M ops/s (log scale)", fontsize=8)
        bottom.set_ylabel("ratio to one process", fontsize=8)
        bottom.set_xlabel(f"processes (dotted line: {cores} cores)", fontsize=8)
        bottom.set_ylim(bottom=0)
    ideal = axes[1][0].get_legend_handles_labels()
    legend_handles = list(handles.values())
    legend_labels = list(handles)
    if "ideal (min(n, cores))" in ideal[1]:
        i = ideal[1].index("ideal (min(n, cores))")
        legend_handles.append(ideal[0][i])
        legend_labels.append(ideal[1][i])
    fig.legend(
        legend_handles,
        legend_labels,
        loc="lower center",
        ncol=min(9, max(1, len(legend_labels))),
        fontsize=9,
    )
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
