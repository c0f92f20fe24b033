"""``traces`` (only when named): hit ratio on access traces, nearcache beside the policies.

Every trace is replayed cache-aside (get; set on a miss) through nearcache
and, at the same entry count, through the eviction policies people compare
against: libCacheSim's LRU, SIEVE, S3-FIFO, W-TinyLFU, ARC, LIRS and Belady
(the offline optimum: the ceiling) when the optional ``libcachesim`` package
is installed, and the in-process caches of PyPI (cachetools' LRU and LFU,
cachebox's LRU, theine's and moka-py's W-TinyLFU) when they are.

Sizing.  nearcache is bounded by its file, not by an entry count: per case the
file is calibrated to hold about ``fraction x distinct keys`` entries
(:func:`~nearcache.bench.backends.ours.calibrate_size`), then its *measured*
steady-state entry count (the mean of ``len()`` sampled after its first
eviction: each compaction frees part of a shard, so the count is a sawtooth)
is the capacity every other policy gets.  Both are in the tables.  A trace
with object sizes (``--trace`` files that carry them) is also compared at
equal bytes: nearcache stores values of the trace's sizes, and libCacheSim's
policies get the mean bytes of the objects nearcache held as their budget.

Hit ratios count every request of the trace, the first (compulsory) misses
included, for every policy alike.  Traces: the built-in generators of
:mod:`nearcache.bench.tracefiles` (seeded), ``--trace FILE`` (libCacheSim's
oracleGeneral binary format, or text: one key per line with an optional
size), and ``--real-traces`` (public traces downloaded at bench time; see
``tracefiles.fetch_real_traces``).
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from ..backends.base import Backend, BackendContext, Capacity, import_module, module_missing
from ..backends.ours import calibrate_size, nearcache_directory, remove_cache_file
from ..model import CaseResult, Measurement, WorkloadResult
from ..report import Table, fmt_int
from ..tracefiles import REAL_TRACES, Trace, fetch_real_traces, panel, read_trace
from ..tracefiles import write_oracle_general as _write_og
from .base import Case, Workload

__all__ = ["LIBCACHESIM_POLICIES", "NEARCACHE_LENIENT", "PEERS", "Traces", "replay_nearcache"]

_PARAMS: dict[str, dict[str, Any]] = {
    # space: keys of each generator; requests per generated trace; fractions of
    # the trace's distinct keys that nearcache's file is sized for; max_requests:
    # longer trace files are cut there.
    "tiny": {"space": 400, "requests": 6_000, "fractions": (0.1, 0.5), "max_requests": 20_000},
    "quick": {
        "space": 2_000,
        "requests": 60_000,
        "fractions": (0.05, 0.2, 0.5),
        "max_requests": 300_000,
    },
    "default": {
        "space": 10_000,
        "requests": 400_000,
        "fractions": (0.02, 0.05, 0.1, 0.2, 0.5, 0.8),
        "max_requests": 2_000_000,
    },
}
#: Real traces replayed by ``--real-traces`` (all fetched ones).
REAL_DEFAULT = tuple(REAL_TRACES)
KEY_BYTES = 16
VALUE_BYTES = 100
NEARCACHE = "nearcache"
#: nearcache with ``eviction_mode = "lenient"`` (SIEVE; the default is
#: adaptive), in the same file size.
NEARCACHE_LENIENT = "nearcache lenient"
#: libCacheSim's policies: (row name, class name).
LIBCACHESIM_POLICIES = (
    ("LRU", "LRU"),
    ("SIEVE", "Sieve"),
    ("S3-FIFO", "S3FIFO"),
    ("W-TinyLFU", "WTinyLFU"),
    ("ARC", "ARC"),
    ("LIRS", "LIRS"),
    ("Belady", "Belady"),
)
_LCS_SUFFIX = " (libCacheSim)"


def _cachetools_lru(n: int) -> Any:
    return import_module("cachetools").LRUCache(maxsize=n)


def _cachetools_lfu(n: int) -> Any:
    return import_module("cachetools").LFUCache(maxsize=n)


def _cachebox_lru(n: int) -> Any:
    return import_module("cachebox").LRUCache(n)


#: In-process peers: (row name, module, factory taking the entry count).
PEERS: tuple[tuple[str, str, Callable[[int], Any]], ...] = (
    ("cachetools LRU", "cachetools", _cachetools_lru),
    ("cachetools LFU", "cachetools", _cachetools_lfu),
    ("cachebox LRU", "cachebox", _cachebox_lru),
    ("theine W-TinyLFU", "theine", lambda n: import_module("theine").Cache(n)),
    ("moka-py W-TinyLFU", "moka_py", lambda n: import_module("moka_py").Moka(n)),
)


def _key(k: int) -> str:
    return f"{k & 0xFFFF_FFFF_FFFF_FFFF:016x}"


def replay_nearcache(
    cache: Any, trace: Trace, value: bytes, sample_every: int
) -> tuple[int, float, float]:
    """Replay ``trace`` cache-aside through a ``NativeCache``: (hits, mean entries,
    mean bytes of the objects held), the means over samples taken every
    ``sample_every`` requests once the cache has evicted (over all samples if
    it never did)."""
    get, set_ = cache.get, cache.set
    sizes = trace.sizes
    hits = 0
    samples: list[tuple[int, int]] = []
    steady: list[tuple[int, int]] = []
    values: dict[int, bytes] = {}
    size_of = dict(zip(trace.keys, sizes, strict=True)) if sizes is not None else {}
    for i, k in enumerate(trace.keys):
        key = _key(k)
        if get(key) is not None:
            hits += 1
        elif sizes is None:
            set_(key, value)
        else:
            size = sizes[i]
            v = values.get(size)
            if v is None:
                v = values[size] = b"v" * size
            set_(key, v)
        if i % sample_every == sample_every - 1:
            n = len(cache)
            held = _held_bytes(cache, size_of) if sizes is not None else n
            samples.append((n, held))
            if cache.stats().get("evictions", 0) > 0:
                steady.append((n, held))
    use = steady or samples or [(len(cache), 0)]
    return (
        hits,
        sum(n for n, _ in use) / len(use),
        sum(b for _, b in use) / len(use),
    )


def _held_bytes(cache: Any, size_of: dict[int, int]) -> int:
    """Bytes (trace sizes) of the objects ``cache`` holds."""
    held: list[bytes] = cache.keys()
    return sum(size_of.get(int(kb.decode(), 16), 0) for kb in held)


def _replay_peer(store: Any, trace: Trace, value: bytes) -> int:
    hits = 0
    get = store.get
    tuple_get = type(store).__module__.startswith("theine")
    for k in trace.keys:
        key = _key(k)
        got = get(key)
        if tuple_get:
            got = got[0] if got[1] else None
        if got is None:
            if hasattr(store, "set"):
                store.set(key, value)
            else:
                store[key] = value
        else:
            hits += 1
    return hits


class Traces(Workload):
    """Hit ratio on traces: nearcache against libCacheSim's policies and in-process peers."""

    name = "traces"
    title = "hit ratio on access traces (nearcache vs LRU, SIEVE, S3-FIFO, W-TinyLFU, ARC, LIRS)"
    seed = ""
    only_when_named: ClassVar[bool] = True
    description = (
        "Cache-aside replay (get, set on a miss) of built-in seeded traces (Zipf, frequency-"
        "friendly, loop larger than the cache, scans in a hot set, shifting working set), of "
        "--trace files and of public real traces (--real-traces), through nearcache and, at "
        "nearcache's measured steady-state entry count, libCacheSim's LRU, SIEVE, S3-FIFO, "
        "W-TinyLFU, ARC, LIRS and Belady (the offline optimum) and the in-process caches of "
        "PyPI. Hit ratios count every request, first misses included."
    )

    def __init__(self, profile: Any, seed: int = 2010) -> None:
        super().__init__(profile, seed)
        self._files: list[Path] = []
        self._panel = True
        self._real: list[str] = []
        self._traces: list[Trace] | None = None
        self._scratch: Path | None = None
        self._og: dict[tuple[str, bool], Path] = {}

    def configure(self, options: dict[str, Any]) -> None:
        """``traces``: files to replay; ``real_traces``: names of public traces
        to fetch and replay (``all`` for every one); ``panel``: False leaves the
        built-in generators out."""
        self._files = [Path(p) for p in options.get("traces", ())]
        self._panel = bool(options.get("panel", True))
        real = list(options.get("real_traces", ()))
        self._real = list(REAL_DEFAULT) if "all" in real else real
        unknown = [n for n in self._real if n not in REAL_TRACES]
        if unknown:
            raise KeyError(
                f"unknown real trace(s) {', '.join(unknown)} (known: {', '.join(REAL_TRACES)})"
            )
        self._traces = None

    def params(self) -> dict[str, Any]:
        p = dict(_PARAMS[self.profile.name])
        p["fractions"] = list(p["fractions"])
        p["files"] = [str(f) for f in self._files]
        p["real_traces"] = self._real
        return p

    def traces(self) -> list[Trace]:
        """Every trace of this run (generated once, files read once)."""
        if self._traces is None:
            p = _PARAMS[self.profile.name]
            out = panel(self.rng_seed, p["space"], p["requests"]) if self._panel else []
            for f in self._files:
                out.append(read_trace(f))
            if self._real:
                for name, path in fetch_real_traces(self._real).items():
                    t = read_trace(path, name)
                    t.label = REAL_TRACES[name].label
                    t.source = f"{REAL_TRACES[name].family} family, fetched"
                    out.append(t)
            for t in out:
                if len(t.keys) > p["max_requests"]:
                    t.keys = t.keys[: p["max_requests"]]
                    if t.sizes is not None:
                        t.sizes = t.sizes[: p["max_requests"]]
                    t.label += f" (first {p['max_requests']:,} requests)"
            names = [t.name for t in out]
            dup = {n for n in names if names.count(n) > 1}
            if dup:
                raise ValueError(f"two traces named {', '.join(sorted(dup))}: rename a file")
            self._traces = out
        return self._traces

    def cases(self) -> list[Case]:
        fr = _PARAMS[self.profile.name]["fractions"]
        out = []
        for t in self.traces():
            d = t.distinct
            for f in fr:
                target = max(10, round(f * d))
                out.append(
                    Case(
                        f"{t.name}@{f:g}",
                        f"{t.name}, {f:g} of {d:,} keys",
                        {"trace": t.name, "fraction": f, "target": target, "distinct": d},
                    )
                )
        return out

    def capacity(self, case: Case) -> Capacity:
        return Capacity(
            items=int(case.params["target"]),
            entry_bytes=KEY_BYTES + VALUE_BYTES,
            key_bytes=KEY_BYTES,
            value_bytes=VALUE_BYTES,
        )

    def skip_reason(self, backend: type[Backend]) -> str | None:
        return "replayed by the traces workload itself (nearcache, libCacheSim, PyPI peers)"

    def measure(self, case: Case, backend: Backend) -> Measurement:
        raise RuntimeError("the traces workload measures its rows in extra_measurements")

    def _trace(self, name: str) -> Trace:
        for t in self.traces():
            if t.name == name:
                return t
        raise KeyError(name)

    def _oracle_general(self, trace: Trace, sized: bool) -> Path:
        path = self._og.get((trace.name, sized))
        if path is None:
            if self._scratch is None:
                self._scratch = Path(tempfile.mkdtemp(prefix="nearcache-traces-"))
            path = self._scratch / f"{trace.name}{'-sized' if sized else ''}.oracleGeneral"
            unit = trace if sized else Trace(trace.name, trace.label, trace.keys)
            _write_og(unit, path)
            self._og[(trace.name, sized)] = path
        return path

    def extra_measurements(
        self, case: Case, ctx: BackendContext, skipped: dict[str, str]
    ) -> list[Measurement]:
        trace = self._trace(str(case.params["trace"]))
        target = int(case.params["target"])
        n = len(trace.keys)
        value = b"v" * VALUE_BYTES
        mean_size = (
            VALUE_BYTES if trace.sizes is None else max(1, sum(trace.sizes) // len(trace.sizes))
        )
        out: list[Measurement] = []
        # nearcache first: its steady-state entry count is everyone's capacity.
        native = import_module("nearcache._native")
        directory = nearcache_directory(ctx)
        size = calibrate_size(directory, target, KEY_BYTES, mean_size)
        path = str(directory / f"traces-{ctx.run_id}-{os.getpid()}")
        every = max(1, min(n // 200, target // 4))
        hits, entries, held, shards, strict, half = _replay_in_file(
            native, path, size, trace, every, None
        )
        capacity = max(1, round(entries))
        common = {"entries": float(capacity), "requests": float(n)}
        out.append(
            Measurement(
                backend=NEARCACHE,
                metrics={
                    "hit_ratio": hits / n,
                    **common,
                    "held_bytes": held,
                    # shards admitting strictly at the end (adaptive), and
                    # those admitting leniently with half their entries young
                    "strict_shards": float(strict),
                    "young_half_shards": float(half),
                },
                info={"file_bytes": size, "shards": shards, "limit": f"{size:,}-byte file"},
            )
        )
        # nearcache again in the same file, pinned to lenient admission
        # (SIEVE: `Cache.eviction_mode`), what the default adapts from.
        hits, entries, held, _, _, _ = _replay_in_file(native, path, size, trace, every, "lenient")
        out.append(
            Measurement(
                backend=NEARCACHE_LENIENT,
                metrics={
                    "hit_ratio": hits / n,
                    # the column's count (the default's), and its own
                    **common,
                    "entries_held": entries,
                    "held_bytes": held,
                },
                info={"file_bytes": size, "shards": shards, "limit": f"{size:,}-byte file"},
            )
        )
        # libCacheSim's policies at the same entry count (and at equal bytes).
        reason = module_missing("libcachesim")
        if reason is None:
            lcs = import_module("libcachesim")
            budgets = [(False, capacity, "")]
            if trace.sizes is not None:
                budgets.append((True, max(1, round(held)), ", bytes"))
            for sized, budget, tag in budgets:
                reader = lcs.TraceReader(
                    str(self._oracle_general(trace, sized)), lcs.TraceType.ORACLE_GENERAL_TRACE
                )
                for row, cls in LIBCACHESIM_POLICIES:
                    miss, byte_miss = getattr(lcs, cls)(budget).process_trace(reader)
                    out.append(
                        Measurement(
                            backend=row + _LCS_SUFFIX[:-1] + tag + ")",
                            metrics={
                                "hit_ratio": 1.0 - miss,
                                "byte_hit_ratio": 1.0 - byte_miss,
                                **common,
                            },
                            info={"limit": f"{budget:,} {'bytes' if sized else 'entries'}"},
                        )
                    )
        else:
            skipped["libCacheSim"] = f"{reason} (pip install 'nearcache[traces]')"
        for row, module, make in PEERS:
            reason = module_missing(module)
            if reason is not None:
                skipped[row] = reason
                continue
            try:
                store = make(capacity)
                peer_hits = _replay_peer(store, trace, value)
                with contextlib.suppress(Exception):
                    store.close()
            except Exception as exc:
                skipped[row] = f"failed: {type(exc).__name__}: {exc}"
                continue
            out.append(
                Measurement(
                    backend=row,
                    metrics={"hit_ratio": peer_hits / n, **common},
                    info={"limit": f"{capacity:,} entries"},
                )
            )
        return out

    # -- output -------------------------------------------------------------------

    @staticmethod
    def _by_trace(result: WorkloadResult) -> dict[str, list[CaseResult]]:
        groups: dict[str, list[CaseResult]] = {}
        for c in result.cases:
            groups.setdefault(str(c.params.get("trace")), []).append(c)
        return groups

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        tables = []
        for trace, cases in self._by_trace(result).items():
            rows_by: dict[str, list[str]] = {}
            cols = ["policy"]
            for c in cases:
                nc = c.get(NEARCACHE)
                entries = fmt_int(nc.metrics["entries"]) if nc else "?"
                file_kib = f"{nc.info['file_bytes'] / 1024:,.0f} KiB file" if nc else ""
                cols.append(f"{entries} entries ({file_kib})")
            names: list[str] = []
            for c in cases:
                for m in c.measurements:
                    if m.backend not in names:
                        names.append(m.backend)
            for name in names:
                row = [name]
                for c in cases:
                    got = c.get(name)
                    row.append(f"{got.metrics['hit_ratio']:.3f}" if got else "-")
                rows_by[name] = row
            notes = []
            first = cases[0]
            requests = (
                fmt_int(first.measurements[0].metrics["requests"]) if first.measurements else "?"
            )
            notes.append(
                f"{first.params.get('distinct', 0):,} distinct keys; {requests}"
                " requests. Each column: nearcache's file, and its measured steady-state entry "
                "count, which every other policy gets."
            )
            notes.extend(_goal_notes(cases))
            skipped = sorted(
                {
                    f"{k}: {v}"
                    for c in cases
                    for k, v in c.skipped.items()
                    if not v.startswith("replayed by")
                }
            )
            if skipped:
                notes.append("Not run: " + "; ".join(skipped) + ".")
            tables.append(
                Table(
                    f"traces: {trace}, hit ratio by cache size",
                    cols,
                    list(rows_by.values()),
                    right=set(range(1, len(cols))),
                    notes=notes,
                )
            )
        return tables

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        groups = self._by_trace(result)
        if not groups:
            return []
        from ..plots import _pyplot

        plt = _pyplot()
        n = len(groups)
        cols = min(3, n)
        rows = math.ceil(n / cols)
        fig, axes = plt.subplots(rows, cols, figsize=(6.0 * cols, 4.6 * rows), squeeze=False)
        handles: dict[str, Any] = {}
        for ax, (trace, cases) in zip(axes.flat, groups.items(), strict=False):
            series: dict[str, list[tuple[float, float]]] = {}
            for c in cases:
                for m in c.measurements:
                    series.setdefault(m.backend, []).append(
                        (m.metrics["entries"], m.metrics["hit_ratio"])
                    )
            for name, pts in series.items():
                pts.sort()
                ours = name in (NEARCACHE, NEARCACHE_LENIENT)
                belady = name.startswith("Belady")
                (line,) = ax.plot(
                    [x for x, _ in pts],
                    [y for _, y in pts],
                    marker="o" if ours else ".",
                    linewidth=2.8 if ours else 1.2,
                    linestyle=":" if belady else ("--" if _is_peer(name) else "-"),
                    color=("black" if name == NEARCACHE else "crimson") if ours else None,
                    zorder=3 if ours else 2,
                    label=name,
                )
                handles.setdefault(name, line)
            ax.set_xscale("log")
            ax.set_title(trace, fontsize=10)
            ax.set_xlabel("entries (nearcache's steady-state count)")
            ax.set_ylabel("hit ratio")
            ax.grid(True, alpha=0.3)
        for ax in list(axes.flat)[n:]:
            ax.axis("off")
        fig.legend(list(handles.values()), list(handles), loc="lower center", ncol=5, fontsize=8)
        fig.suptitle("traces: hit ratio against cache size, one line per policy")
        fig.tight_layout(rect=(0, 0.04 + 0.02 * math.ceil(len(handles) / 5), 1, 0.97))
        path = outdir / "traces.png"
        outdir.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=90)
        plt.close(fig)
        return [path]


def _replay_in_file(
    native: Any, path: str, size: int, trace: Trace, every: int, mode: str | None
) -> tuple[int, float, float, int, int, int]:
    """Replay ``trace`` through a new nearcache file of ``size`` bytes at
    ``path`` (its eviction mode pinned to ``mode``, else the default; the
    entries counted every ``every`` requests), then remove the file:
    (hits, mean entries held, held bytes, shards, shards admitting strictly
    at the end, shards admitting leniently with half their entries young
    at the end)."""
    try:
        cache = native.NativeCache(path, size, recreate=True)
        try:
            if mode is not None:
                cache.set_eviction_mode(mode)
            hits, entries, held = replay_nearcache(cache, trace, b"v" * VALUE_BYTES, every)
            return (
                hits,
                entries,
                held,
                cache.shard_count,
                cache.strict_shards(),
                cache.young_half_shards(),
            )
        finally:
            cache.close()
    finally:
        remove_cache_file(path)


def _is_peer(name: str) -> bool:
    """An in-process peer's row (drawn dashed): neither nearcache nor libCacheSim."""
    return name not in (NEARCACHE, NEARCACHE_LENIENT) and _LCS_SUFFIX[:-1] not in name


def _goal_notes(cases: Sequence[CaseResult]) -> list[str]:
    """Where nearcache (adaptive, the default, and lenient) stands against LRU
    and the best non-Belady policy."""
    ours_names = (NEARCACHE, NEARCACHE_LENIENT)
    notes = []
    for c in cases:
        nc = c.get(NEARCACHE)
        if nc is None:
            continue
        others = [
            (m.backend, m.metrics["hit_ratio"])
            for m in c.measurements
            if m.backend not in ours_names
            and "bytes" not in m.backend
            and "Belady" not in m.backend
        ]
        if not others:
            continue
        best_name, best = max(others, key=lambda x: x[1])
        lru = c.get("LRU" + _LCS_SUFFIX)
        for name in ours_names:
            m = c.get(name)
            if m is None:
                continue
            ours = m.metrics["hit_ratio"]
            bits = [f"best other {best_name} {best:.3f} ({ours - best:+.3f})"]
            if lru is not None:
                bits.append(
                    f"LRU {lru.metrics['hit_ratio']:.3f} ({ours - lru.metrics['hit_ratio']:+.3f})"
                )
            notes.append(
                f"{fmt_int(nc.metrics['entries'])} entries: {name} {ours:.3f}; " + "; ".join(bits)
            )
    return notes
