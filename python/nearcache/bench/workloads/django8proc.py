"""``django-8proc``: the diskcache study's concurrent Django-backend benchmark (seed 003).

Eight worker processes run interleaved operations on 1,100 distinct short
keys with short byte-string values: 90% get, 9% set, 1% delete, after the
keys were stored (by the parent for shared stores, by each worker for
process-local ones).  Caches are limited to 1,000 entries where the backend
has a limit, so culling and eviction show.  Every operation is timed with
``perf_counter_ns``; each worker sends its raw samples back and the
percentiles are computed over all eight workers' samples pooled.

Three more cases go beyond the study, with the sizes of seed 003's objects as
values: an HTML page (59 KiB), a script (295 KiB) and an image (1.2 MiB),
over fewer keys (enough for a few MiB of values; at least 8).  Their bound
holds the working set twice instead of culling: a byte budget of 2 x keys x
(key + value), which nearcache gets as its file size, diskcache as its
``size_limit`` and the count-bounded caches as 2 x keys entries (servers,
dict and lmdb stay unbounded).  nearcache keeps the 59 KiB values in shared
memory and spills the larger ones to files (its spill budget, 1 GiB by
default, holds them too).
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
from ..model import CaseResult, Measurement, WorkloadResult
from ..multiproc import run_parallel
from ..plots import latency_panels
from ..report import Table, fmt_int, fmt_ns, fmt_ratio, loss_notes, pick_reference, skipped_note
from ..stats import PERCENTILES, LatencySummary, histogram, merge_samples
from .base import Case, Workload
from .value_sizes import SEED_003_SIZES

__all__ = ["Django8proc"]

ACTIONS = ("get", "set", "delete")
_GET, _SET, _DELETE = 0, 1, 2

_PARAMS: dict[str, dict[str, Any]] = {
    # ops: per worker, warm-up included; warmup: first ops of each worker left untimed
    # (the study: 100,000 and 1,000); seconds: a worker stops this long after it
    # started (None: it runs every op); working_set: bytes of values of each seed 003
    # case (keys = working_set // value size, at least 8 and at most `keys`).
    "tiny": {
        "procs": 8,
        "keys": 1_100,
        "limit": 1_000,
        "ops": 150,
        "warmup": 50,
        "seconds": None,
        "working_set": 1 << 20,
    },
    "quick": {
        "procs": 8,
        "keys": 1_100,
        "limit": 1_000,
        "ops": 1_500,
        "warmup": 100,
        "seconds": 0.3,
        "working_set": 16 << 20,
    },
    "default": {
        "procs": 8,
        "keys": 1_100,
        "limit": 1_000,
        "ops": 100_000,
        "warmup": 1_000,
        "seconds": 4.0,
        "working_set": 64 << 20,
    },
}

VALUE_BYTES = 40
#: Fewest keys of a seed 003 case.
MIN_LARGE_KEYS = 8


class _CaseData:
    """The keys, the value and every worker's operations of one case."""

    def __init__(self, keys: list[str], value: bytes, streams: list[tuple[list[int], list[str]]]):
        self.keys = keys
        self.value = value
        self.streams = streams


def _worker_streams(
    keys: list[str], procs: int, ops: int, seed: str
) -> list[tuple[list[int], list[str]]]:
    """Each worker's 90/9/1 get/set/delete stream over ``keys`` (worker w seeded ``seed:w``)."""
    streams: list[tuple[list[int], list[str]]] = []
    for w in range(procs):
        wrng = random.Random(f"{seed}:{w}")
        kinds: list[int] = []
        ops_keys: list[str] = []
        for _ in range(ops):
            r = wrng.random()
            kinds.append(_GET if r < 0.90 else _SET if r < 0.99 else _DELETE)
            ops_keys.append(wrng.choice(keys))
        streams.append((kinds, ops_keys))
    return streams


def _describe(exc: Exception) -> str:
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:160]


def _worker_loop(
    handle: Handle,
    kinds: list[int],
    keys: list[str],
    value: bytes,
    deadline_ns: int | None,
    warmup: int = 0,
) -> dict[str, Any]:
    """Run the first ``warmup`` operations untimed, then time every operation.

    Return the timed operations' raw samples and misses, and the errors of all.
    """
    get, set_, delete = handle.get, handle.set, handle.delete
    clock = time.perf_counter_ns
    samples = (array("q"), array("q"), array("q"))
    add_get, add_set, add_del = samples[0].append, samples[1].append, samples[2].append
    misses = [0, 0, 0]
    errors = [0, 0, 0]
    last_error = ""
    for kind, key in zip(kinds[:warmup], keys[:warmup], strict=True):
        try:
            if kind == _GET:
                get(key)
            elif kind == _SET:
                set_(key, value)
            else:
                delete(key)
        except Exception as exc:
            errors[kind] += 1
            last_error = _describe(exc)
    for i, (kind, key) in enumerate(zip(kinds[warmup:], keys[warmup:], strict=True)):
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
            last_error = _describe(exc)
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
        "90% get / 9% set / 1% delete in random interleaving after every key was stored; "
        "each worker runs 100,000 operations, the first 1,000 an untimed warm-up, as in "
        "the study. "
        "Caches limited to 1,000 entries where the backend has a limit (nearcache: a file "
        "calibrated to hold about 1,000 such entries before its first eviction). Latency of "
        "every timed operation, percentiles over the samples of all processes pooled; misses are "
        "gets that found nothing. Process-local caches (dict, LRU objects, locmem) are "
        "separate in each process. Beyond the study: the same with values of 59 KiB, 295 KiB "
        "and 1.2 MiB (seed 003's page, script and image) over fewer keys, every bound "
        "holding twice the working set (nothing culled or evicted)."
    )

    def params(self) -> dict[str, Any]:
        return dict(_PARAMS[self.profile.name])

    def large_keys(self, value_bytes: int) -> int:
        """Keys of a seed 003 case with values of ``value_bytes``."""
        p = _PARAMS[self.profile.name]
        return int(min(p["keys"], max(MIN_LARGE_KEYS, p["working_set"] // value_bytes)))

    def cases(self) -> list[Case]:
        p = _PARAMS[self.profile.name]
        out = [
            Case(
                "8proc",
                f"{p['procs']} processes",
                {"procs": p["procs"], "keys": p["keys"], "limit": p["limit"]},
            )
        ]
        out += [
            Case(
                f"8proc-{s.id}",
                f"{p['procs']} processes, {s.label} values",
                {
                    "procs": p["procs"],
                    "keys": self.large_keys(s.bytes),
                    "limit": None,
                    "value_bytes": s.bytes,
                    "size": s.label,
                },
            )
            for s in SEED_003_SIZES
        ]
        return out

    def capacity(self, case: Case) -> Capacity:
        keys = int(case.params["keys"])
        key_len = max(len(k) for k in short_keys(keys))
        if case.params.get("limit") is None:
            # A seed 003 size: a byte budget holding the working set twice.
            value = int(case.params["value_bytes"])
            return Capacity(
                bytes=2 * keys * (key_len + value),
                entry_bytes=key_len + value,
                key_bytes=key_len,
                value_bytes=value,
            )
        return Capacity(
            items=int(case.params["limit"]),
            entry_bytes=key_len + VALUE_BYTES,
            key_bytes=key_len,
            value_bytes=VALUE_BYTES,
            key_space=keys,
        )

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        self.keys = short_keys(p["keys"])
        rng = random.Random(f"{self.rng_seed}:django")
        self.value = binary_values(rng, 1, VALUE_BYTES, 0.0)[0]
        self.streams = _worker_streams(self.keys, p["procs"], p["ops"], f"{self.rng_seed}:django")
        self.data: dict[str, _CaseData] = {"8proc": _CaseData(self.keys, self.value, self.streams)}
        for case in self.cases():
            if case.id in self.data:
                continue
            keys = short_keys(int(case.params["keys"]))
            value = random.Random(f"{self.rng_seed}:django:{case.id}").randbytes(
                int(case.params["value_bytes"])
            )
            streams = _worker_streams(
                keys, p["procs"], p["ops"], f"{self.rng_seed}:django:{case.id}"
            )
            self.data[case.id] = _CaseData(keys, value, streams)

    @staticmethod
    def _populate(handle: Handle, data: _CaseData) -> None:
        for key in data.keys:
            handle.set(key, data.value)

    def measure(self, case: Case, backend: Backend) -> Measurement:
        p = _PARAMS[self.profile.name]
        data = self.data[case.id]
        local = backend.scope is Scope.PROCESS
        if not local:
            h = backend.open()
            try:
                self._populate(h, data)
            finally:
                h.close()
        backend.before_fork()
        seconds = p["seconds"]

        def setup(index: int) -> tuple[int, Handle]:
            handle = backend.open()
            if local:
                self._populate(handle, data)
            return index, handle

        def work(state: tuple[int, Handle]) -> dict[str, Any]:
            index, handle = state
            kinds, keys = data.streams[index]
            deadline = time.perf_counter_ns() + int(seconds * 1e9) if seconds else None
            try:
                return _worker_loop(handle, kinds, keys, data.value, deadline, p["warmup"])
            finally:
                handle.close()

        results, wall_ns = run_parallel(p["procs"], setup, work, timeout_s=300.0)
        metrics: dict[str, float] = {}
        info: dict[str, Any] = {
            "limit": backend.limit(),
            "procs": p["procs"],
            "keys": len(data.keys),
            "value_bytes": len(data.value),
            "warmup": p["warmup"],
        }
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
        out: list[Table] = []
        for case in result.cases:
            out.extend(_case_tables(case, tradeoffs))
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        paths: list[Path] = []
        for case in result.cases:
            size = case.params.get("size")
            suffix = f"-{case.case.removeprefix('8proc-')}" if size else ""
            what = f", {size} values" if size else ""
            paths.append(
                latency_panels(
                    outdir / f"django-8proc{suffix}.png",
                    f"django-8proc: latency percentiles, 8 processes{what} (lower is better)",
                    _latency_series(case),
                    ours=ours_names(),
                )
            )
        return paths


def _latency_series(case: CaseResult) -> list[tuple[str, dict[str, list[tuple[str, float]]]]]:
    """Per action, each backend's latency at the percentiles and the maximum."""
    labels = [f"p{p:g}" for p in PERCENTILES] + ["max"]
    panels = []
    for action in ACTIONS:
        series: dict[str, list[tuple[str, float]]] = {}
        for m in case.measurements:
            if not m.metrics.get(f"{action}_count"):
                continue
            points = [(label, m.metrics.get(f"{action}_{label}_ns", 0.0)) for label in labels[:-1]]
            points.append(("max", m.metrics.get(f"{action}_max_ns", 0.0)))
            series[m.backend] = points
        panels.append((action, series))
    return panels


def _case_tables(case: CaseResult, tradeoffs: dict[str, str]) -> list[Table]:
    """The latency table of one case, then the study's per-backend tables."""
    size = case.params.get("size")
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
    if size:
        title = (
            f"django-8proc, {size} values ({case.params.get('keys')} keys, every bound "
            "holds them twice): latency per operation, all 8 processes pooled "
            "(sorted by get median; 'vs' > 1 = slower)"
        )
    else:
        title = (
            "django-8proc: latency per operation, all 8 processes pooled "
            "(sorted by get median; 'vs' > 1 = slower)"
        )
    out.append(Table(title, cols, rows, right=right, notes=notes))
    for m in ms:
        out.append(_seed_style(m, f", {size} values" if size else ""))
    return out


def _seed_style(m: Measurement, what: str = "") -> Table:
    """The diskcache study's per-backend table (Action, Count, Miss, Median, ... Total).

    One column more than the study's: P99.9, where a get that waited for a
    lock holder the scheduler had preempted shows.
    """
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
                fmt_ns(mm.get(f"{action}_p99.9_ns", 0.0)),
                fmt_ns(mm.get(f"{action}_max_ns", 0.0)),
                fmt_ns(mm.get(f"{action}_total_ns", 0.0)),
            ]
        )
    rows.append(
        [
            "Total",
            fmt_int(mm.get("ops", 0.0)),
            "",
            "",
            "",
            "",
            "",
            "",
            fmt_ns(mm.get("total_ns", 0.0)),
        ]
    )
    return Table(
        f"Timings for {m.backend}{what}",
        ["Action", "Count", "Miss", "Median", "P90", "P99", "P99.9", "Max", "Total"],
        rows,
        right=set(range(1, 9)),
        terminal=False,
    )
