"""``django-8proc``: the diskcache study's concurrent Django-backend benchmark (seed 003).

Eight worker processes run interleaved operations on 1,100 distinct short
keys with short byte-string values: 90% get, 9% set, 1% delete, after the
keys were stored (by the parent for shared stores, by each worker for
process-local ones).  Caches are limited to 1,000 entries where the backend
has a limit, so culling and eviction show.  Every operation is timed with
``perf_counter_ns``; each worker sends its raw samples back and the
percentiles are computed over all eight workers' samples pooled.
"""

from __future__ import annotations

import random
import time
from array import array
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity, Handle, Scope
from ..backends.registry import ours_names
from ..data import binary_values, short_keys
from ..model import Measurement, WorkloadResult
from ..multiproc import run_parallel
from ..plots import latency_panels
from ..report import Table, fmt_int, fmt_ns, fmt_ratio, loss_notes, pick_reference, skipped_note
from ..stats import PERCENTILES, LatencySummary, histogram, merge_samples
from .base import Case, Workload

__all__ = ["Django8proc"]

ACTIONS = ("get", "set", "delete")
_GET, _SET, _DELETE = 0, 1, 2

_PARAMS: dict[str, dict[str, Any]] = {
    # ops: per worker; seconds: deadline of a worker's timed loop (None: run every op).
    "tiny": {"procs": 8, "keys": 1_100, "limit": 1_000, "ops": 150, "seconds": None},
    "quick": {"procs": 8, "keys": 1_100, "limit": 1_000, "ops": 1_500, "seconds": 0.3},
    "default": {"procs": 8, "keys": 1_100, "limit": 1_000, "ops": 12_000, "seconds": 4.0},
}

VALUE_BYTES = 40


def _worker_loop(
    handle: Handle, kinds: list[int], keys: list[str], value: bytes, deadline_ns: int | None
) -> dict[str, Any]:
    """Time every operation; return raw samples, misses and errors per action."""
    get, set_, delete = handle.get, handle.set, handle.delete
    clock = time.perf_counter_ns
    samples = (array("q"), array("q"), array("q"))
    add_get, add_set, add_del = samples[0].append, samples[1].append, samples[2].append
    misses = [0, 0, 0]
    errors = [0, 0, 0]
    last_error = ""
    for i, (kind, key) in enumerate(zip(kinds, keys, strict=True)):
        try:
            if kind == _GET:
                t0 = clock()
                v = get(key)
                t1 = clock()
                add_get(t1 - t0)
                if v is None:
                    misses[0] += 1
            elif kind == _SET:
                t0 = clock()
                set_(key, value)
                t1 = clock()
                add_set(t1 - t0)
            else:
                t0 = clock()
                r = delete(key)
                t1 = clock()
                add_del(t1 - t0)
                if r is False or r == 0:
                    misses[2] += 1
        except Exception as exc:
            errors[kind] += 1
            last_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
        if deadline_ns is not None and not i & 63 and clock() > deadline_ns:
            break
    return {
        "samples": [s.tobytes() for s in samples],
        "misses": misses,
        "errors": errors,
        "last_error": last_error,
    }


class Django8proc(Workload):
    """Per-operation latency percentiles of 8 concurrent processes, 90/9/1 get/set/delete."""

    name = "django-8proc"
    title = "8 processes, 90% get / 9% set / 1% delete, latency percentiles (diskcache, Django)"
    seed = "seed 003, 'DiskCache DjangoCache Benchmarks'"
    description = (
        "Eight worker processes, 1,100 distinct keys, short byte-string values (40 bytes), "
        "90% get / 9% set / 1% delete in random interleaving after every key was stored. "
        "Caches limited to 1,000 entries where the backend has a limit (nearcache: a file "
        "calibrated to hold about 1,000 such entries before its first eviction). Latency of "
        "every operation, percentiles over the samples of all processes pooled; misses are "
        "gets that found nothing. Process-local caches (dict, LRU objects, locmem) are "
        "separate in each process."
    )

    def params(self) -> dict[str, Any]:
        return dict(_PARAMS[self.profile.name])

    def cases(self) -> list[Case]:
        p = _PARAMS[self.profile.name]
        return [
            Case(
                "8proc",
                f"{p['procs']} processes",
                {"procs": p["procs"], "keys": p["keys"], "limit": p["limit"]},
            )
        ]

    def capacity(self, case: Case) -> Capacity:
        key_len = max(len(k) for k in short_keys(int(case.params["keys"])))
        return Capacity(
            items=int(case.params["limit"]),
            entry_bytes=key_len + VALUE_BYTES,
            key_bytes=key_len,
            value_bytes=VALUE_BYTES,
        )

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        self.keys = short_keys(p["keys"])
        rng = random.Random(f"{self.rng_seed}:django")
        self.value = binary_values(rng, 1, VALUE_BYTES, 0.0)[0]
        self.streams: list[tuple[list[int], list[str]]] = []
        for w in range(p["procs"]):
            wrng = random.Random(f"{self.rng_seed}:django:{w}")
            kinds: list[int] = []
            keys: list[str] = []
            for _ in range(p["ops"]):
                r = wrng.random()
                kinds.append(_GET if r < 0.90 else _SET if r < 0.99 else _DELETE)
                keys.append(wrng.choice(self.keys))
            self.streams.append((kinds, keys))

    def _populate(self, handle: Handle) -> None:
        for key in self.keys:
            handle.set(key, self.value)

    def measure(self, case: Case, backend: Backend) -> Measurement:
        p = _PARAMS[self.profile.name]
        local = backend.scope is Scope.PROCESS
        if not local:
            h = backend.open()
            try:
                self._populate(h)
            finally:
                h.close()
        backend.before_fork()
        seconds = p["seconds"]

        def setup(index: int) -> tuple[int, Handle]:
            handle = backend.open()
            if local:
                self._populate(handle)
            return index, handle

        def work(state: tuple[int, Handle]) -> dict[str, Any]:
            index, handle = state
            kinds, keys = self.streams[index]
            deadline = time.perf_counter_ns() + int(seconds * 1e9) if seconds else None
            try:
                return _worker_loop(handle, kinds, keys, self.value, deadline)
            finally:
                handle.close()

        results, wall_ns = run_parallel(p["procs"], setup, work, timeout_s=300.0)
        metrics: dict[str, float] = {}
        info: dict[str, Any] = {"limit": backend.limit(), "procs": p["procs"]}
        total_ops = 0
        total_ns = 0
        errors_total = 0
        for a, action in enumerate(ACTIONS):
            parts: list[array[int]] = []
            for r in results:
                arr: array[int] = array("q")
                arr.frombytes(r["samples"][a])
                parts.append(arr)
            pooled = merge_samples(parts)
            summary = LatencySummary(pooled)
            for key, value in summary.as_dict().items():
                metrics[f"{action}_{key}"] = value
            metrics[f"{action}_miss"] = float(sum(r["misses"][a] for r in results))
            metrics[f"{action}_errors"] = float(sum(r["errors"][a] for r in results))
            info[f"{action}_histogram"] = histogram(pooled)
            info[f"{action}_per_process_count"] = [len(part) for part in parts]
            total_ops += summary.count
            total_ns += summary.total_ns
            errors_total += int(metrics[f"{action}_errors"])
        metrics["ops"] = float(total_ops)
        metrics["total_ns"] = float(total_ns)
        metrics["wall_ns"] = float(wall_ns)
        metrics["ops_per_s"] = total_ops * 1e9 / wall_ns if wall_ns else 0.0
        metrics["errors"] = float(errors_total)
        last_errors = sorted({r["last_error"] for r in results if r["last_error"]})
        if last_errors:
            info["errors"] = last_errors[:3]
        return Measurement(backend=backend.name, metrics=metrics, runs=[], info=info)

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        if not result.cases:
            return []
        case = result.cases[0]
        ms = sorted(case.measurements, key=lambda m: m.metrics.get("get_p50_ns", 0.0))
        reference = pick_reference(m.backend for m in ms)
        ref = case.get(reference) if reference else None
        out: list[Table] = []
        cols = [
            "backend", "get p50", "get p99", "set p50", "set p99", "delete p50", "max",
            "get misses", "errors", "total", "ops/s (all procs)", "limit",
        ]  # fmt: skip
        if ref is not None:
            cols.insert(-1, f"get p50 vs {reference}")
        rows = []
        for m in ms:
            mm = m.metrics
            gets = mm.get("get_count", 0.0)
            row = [
                m.backend,
                fmt_ns(mm.get("get_p50_ns", 0.0)),
                fmt_ns(mm.get("get_p99_ns", 0.0)),
                fmt_ns(mm.get("set_p50_ns", 0.0)),
                fmt_ns(mm.get("set_p99_ns", 0.0)),
                fmt_ns(mm.get("delete_p50_ns", 0.0)),
                fmt_ns(max(mm.get(f"{a}_max_ns", 0.0) for a in ACTIONS)),
                f"{mm.get('get_miss', 0.0) / gets:.1%}" if gets else "-",
                fmt_int(mm.get("errors", 0.0)),
                fmt_ns(mm.get("total_ns", 0.0)),
                fmt_int(mm.get("ops_per_s", 0.0)),
                str(m.info.get("limit", "")),
            ]
            if ref is not None:
                mine, theirs = mm.get("get_p50_ns", 0.0), ref.metrics.get("get_p50_ns", 0.0)
                row.insert(-1, fmt_ratio(mine / theirs) if mine and theirs else "-")
            rows.append(row)
        figures = {
            f"{action} {pct}": [(m.backend, m.metrics.get(f"{action}_{pct}_ns", 0.0)) for m in ms]
            for action in ("get", "set")
            for pct in ("p50", "p99")
        }
        notes = loss_notes(figures, reference, tradeoffs, higher_is_better=False, fmt=fmt_ns)
        for m in ms:
            if m.metrics.get("errors", 0.0):
                notes.append(f"{m.backend} errors: {'; '.join(m.info.get('errors', []))}")
        notes.extend(skipped_note(case))
        right = set(range(1, len(cols) - 1))
        out.append(
            Table(
                "django-8proc: latency per operation, all 8 processes pooled "
                "(sorted by get median; 'vs' > 1 = slower)",
                cols,
                rows,
                right=right,
                notes=notes,
            )
        )
        for m in ms:
            out.append(_seed_style(m))
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        if not result.cases:
            return []
        case = result.cases[0]
        labels = [f"p{p:g}" for p in PERCENTILES] + ["max"]
        panels = []
        for action in ACTIONS:
            series: dict[str, list[tuple[str, float]]] = {}
            for m in case.measurements:
                if not m.metrics.get(f"{action}_count"):
                    continue
                points = [
                    (label, m.metrics.get(f"{action}_{label}_ns", 0.0)) for label in labels[:-1]
                ]
                points.append(("max", m.metrics.get(f"{action}_max_ns", 0.0)))
                series[m.backend] = points
            panels.append((action, series))
        return [
            latency_panels(
                outdir / "django-8proc.png",
                "django-8proc: latency percentiles, 8 processes (lower is better)",
                panels,
                ours=ours_names(),
            )
        ]


def _seed_style(m: Measurement) -> Table:
    """The diskcache study's per-backend table (Action, Count, Miss, Median, ... Total)."""
    mm = m.metrics
    rows = []
    for action in ACTIONS:
        rows.append(
            [
                action,
                fmt_int(mm.get(f"{action}_count", 0.0)),
                fmt_int(mm.get(f"{action}_miss", 0.0)),
                fmt_ns(mm.get(f"{action}_p50_ns", 0.0)),
                fmt_ns(mm.get(f"{action}_p90_ns", 0.0)),
                fmt_ns(mm.get(f"{action}_p99_ns", 0.0)),
                fmt_ns(mm.get(f"{action}_max_ns", 0.0)),
                fmt_ns(mm.get(f"{action}_total_ns", 0.0)),
            ]
        )
    rows.append(
        ["Total", fmt_int(mm.get("ops", 0.0)), "", "", "", "", "", fmt_ns(mm.get("total_ns", 0.0))]
    )
    return Table(
        f"Timings for {m.backend}",
        ["Action", "Count", "Miss", "Median", "P90", "P99", "Max", "Total"],
        rows,
        right=set(range(1, 8)),
        terminal=False,
    )
