"""``large`` (ours): caches of 1 to 16 GiB filled past capacity: pauses, open time, memory.

nearcache's tail latency is bounded by the work one write can do under a
shard's lock, and a compaction slides a whole shard.  Shards are about
2 MiB until the shard count reaches its cap, so the pauses of a large cache
grow with it.  This workload measures that, so the figures can be held to
the goals of a cache of any size (a reader's get p99.99 <= 50 us and max
<= 1 ms while a writer evicts; set p99.99 <= 100 us, max <= 2 ms).  One
backend takes part: ``nearcache-native`` (the engine's bytes path, so the
figures are the engine's, not the Python layer's).

Cases:

- **Sizes.** Files of 1, 4 and 16 GiB (``--sizes`` to choose; the quick
  profile uses 64 and 256 MiB) with the shard count the engine picks.
- **Shard-size sweep.** A 1 GiB file (256 MiB in the quick profile) forced
  to shards of 1, 4, 16 and 64 MiB (``shards = size / shard size``), as a
  user would force it: ``NativeCache(path, size, shards)``.

A case the machine cannot hold is skipped with the reason: the file needs
its size free on the file system of nearcache's directory (``df``, via
``statvfs``) and, on top, 512 MiB of ``MemAvailable`` besides the file
(tmpfs pages are RAM).

Each case, in forked processes so that no process keeps a mapping made
before a fork (which would leave the last detach unable to tell it is the
last, see ``registry.rs``):

1. **Fill** (one process): create the file (timed: *open, create*), then
   set new keys ``0, 1, 2 ...`` (36-byte keys, 160-byte values: 256
   pre-generated random values, the value of key ``i`` is value
   ``i % 256``) until the first eviction (``stats()["evictions"]``, read
   every 4,096 sets).  After every 4th set the writer gets one key drawn
   from the last ``window`` keys it set (``window`` = 100,000, or a quarter
   of the entries held); a hit must return that key's value.  Then the
   entries held (``len``) and memory held (``stats()["held_bytes"]``: the
   file's pages on tmpfs).
2. **Evicting**, two windows of the same length (together ``turnover`` x
   the fill's sets: once the file's worth of entries by default), each a
   writer process going on setting new keys (and getting one in four, as
   above), every set now evicting, next to a second process that reads from
   the start signal until the writer is done:

   - window A: the reader gets keys from the last ``window`` keys the writer
     set (it reads the writer's position from shared memory every 256 gets),
     from nearcache; the *reader* rows;
   - window B: the same loop, line for line, over a ``dict`` of ``window``
     keys built before the start: the *scheduler-noise baseline*.  On 2
     cores a preempted process waits milliseconds whatever it runs, so a
     reader's max next to this row says how much is nearcache's.

   Both processes open their own handle (timed: *open, attach*; the first
   of them may find the file unused).  The writer's figures of both windows
   are pooled as the *evicting* phase.
3. **Open** (the file full): a process alone opens it after the last
   detached cleanly (timed: *open, clean*), reads ``len`` and the memory
   held after evicting, and keeps it open while a second process opens it
   (*open, in use*).  Then a process opens it and exits without closing (a
   crash), and the next process alone opens it (*open, after a crash*: the
   engine checks every shard's header and resets a shard left mid-write).

Every operation is timed alone (``perf_counter_ns`` before and after) into
a :class:`~nearcache.bench.stats.LogHistogram` (exact below 1 us, 0.2%
buckets above; max, count and total exact), so P99.99 and max come from
every operation of the run, even the 70 million sets of a 16 GiB fill.
Rates are operations per second of time inside the calls (the loop's own
work: key formatting, the clock, the histogram, is left out).  Values read
back are compared with what was set: a wrong value is counted and shown.

Nothing here depends on the core count: one writer and one reader, the same
on 2 or 64 cores (where the baseline row will show little preemption).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity, format_bytes, import_module
from ..backends.ours import remove_cache_file
from ..machine import filesystem_type
from ..model import Measurement, WorkloadResult
from ..multiproc import run_parallel
from ..report import Table, fmt_int, fmt_ns, fmt_rate
from ..stats import LogHistogram
from .base import Case, CaseSkipped, Profile, Workload

__all__ = [
    "GOALS",
    "Large",
    "read_phase",
    "room_reason",
    "write_phase",
]

KEY_BYTES = 36
VALUE_BYTES = 160
#: The writer gets one key after every GET_EVERY sets.
GET_EVERY = 4
#: Gets of the reader between two reads of the writer's position; sets of
#: the writer between two updates of it.
CHUNK = 256
#: Sets between two checks for the first eviction during the fill.
EVICTION_CHECK = 4096
#: MemAvailable a case needs besides its file (the processes, the histograms).
RAM_HEADROOM = 512 << 20
#: Percentiles reported (P99.9 is kept in the JSON, the tables show the others).
PCTS: tuple[tuple[str, float], ...] = (
    ("p50", 50.0),
    ("p99", 99.0),
    ("p99.9", 99.9),
    ("p99.99", 99.99),
)
#: The issue's goals, in ns: shown next to the figures, never used to pass or fail.
GOALS = {
    "reader_p99.99": 50_000,
    "reader_max": 1_000_000,
    "set_p99.99": 100_000,
    "set_max": 2_000_000,
}

_MiB = 1 << 20
_GiB = 1 << 30

_PARAMS: dict[str, dict[str, Any]] = {
    "tiny": {
        "sizes": [2 * _MiB],
        "sweep_file": 2 * _MiB,
        "sweep_shards": [512 * 1024, 1 * _MiB],
        "turnover": 0.5,
        "window": 100_000,
    },
    "quick": {
        "sizes": [64 * _MiB, 256 * _MiB],
        "sweep_file": 256 * _MiB,
        "sweep_shards": [1 * _MiB, 4 * _MiB, 16 * _MiB, 64 * _MiB],
        "turnover": 0.5,
        "window": 100_000,
    },
    "default": {
        "sizes": [1 * _GiB, 4 * _GiB, 16 * _GiB],
        "sweep_file": 1 * _GiB,
        "sweep_shards": [1 * _MiB, 4 * _MiB, 16 * _MiB, 64 * _MiB],
        "turnover": 1.0,
        "window": 100_000,
    },
}


def key_of(i: int) -> bytes:
    """The ``i``-th key: 36 ASCII digits."""
    return b"%036d" % i


def mem_available() -> int:
    """``MemAvailable`` of /proc/meminfo in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def fs_free(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s file system."""
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def room_reason(size: int, free: int, available: int) -> str | None:
    """Why a file of ``size`` bytes cannot be filled here (None: it can).

    ``free`` is the file system's free space, ``available`` the machine's
    ``MemAvailable`` (0: unknown, not checked).
    """
    if free < size:
        return (
            f"a {format_bytes(size)} file needs {format_bytes(size)} free on the file system "
            f"of nearcache's directory; it has {format_bytes(free)} (df; --nearcache-dir "
            "moves the file)"
        )
    if available and available < size + RAM_HEADROOM:
        return (
            f"a {format_bytes(size)} file needs {format_bytes(size + RAM_HEADROOM)} of "
            f"MemAvailable (the file, plus {format_bytes(RAM_HEADROOM)}); the machine has "
            f"{format_bytes(available)}"
        )
    return None


# -- the loops ----------------------------------------------------------------------


def write_phase(
    cache: Any,
    start: int,
    count: int,
    values: list[bytes],
    offsets: list[int],
    window: int,
    progress: Any = None,
    stop_on_eviction: bool = False,
) -> dict[str, Any]:
    """Set keys ``start .. start + count - 1``, getting a recent key after every 4th set.

    ``progress`` (a shared ``RawValue``) gets the next key to set every
    :data:`CHUNK` sets.  With ``stop_on_eviction`` the phase ends at the
    first eviction (checked every :data:`EVICTION_CHECK` sets).  Returns
    the histograms (``to_list`` form) and counts.
    """
    sets, gets = LogHistogram(), LogHistogram()
    rec_set, rec_get = sets.record, gets.record
    cset, cget = cache.set, cache.get
    clock = time.perf_counter_ns
    mask = len(offsets) - 1
    hits = wrong = k = 0
    evictions = int(cache.stats()["evictions"]) if stop_on_eviction else 0
    i, end = start, start + count
    evicted = False
    while i < end and not evicted:
        top = min(i + EVICTION_CHECK, end)
        while i < top:
            key = b"%036d" % i
            value = values[i & 255]
            t0 = clock()
            cset(key, value)
            t1 = clock()
            rec_set(t1 - t0)
            i += 1
            if i % GET_EVERY == 0:
                g = i - 1 - offsets[k & mask] % (i if i < window else window)
                k += 1
                gkey = b"%036d" % g
                t0 = clock()
                got = cget(gkey)
                t1 = clock()
                rec_get(t1 - t0)
                if got is not None:
                    if got == values[g & 255]:
                        hits += 1
                    else:
                        wrong += 1
            if progress is not None and i % CHUNK == 0:
                progress.value = i
        if stop_on_eviction and int(cache.stats()["evictions"]) > evictions:
            evicted = True
    if progress is not None:
        progress.value = i
    return {
        "set": sets.to_list(),
        "get": gets.to_list(),
        "hits": hits,
        "wrong": wrong,
        "next": i,
        "evicted": evicted,
    }


def read_phase(
    get: Callable[[bytes], Any],
    values: list[bytes],
    offsets: list[int],
    window: int,
    progress: Any,
    done: Any,
) -> dict[str, Any]:
    """Get keys from the ``window`` keys below ``progress.value`` until ``done.value``.

    The same loop reads nearcache (``progress``: the writer's position) and
    the baseline's dict (``progress`` fixed at ``window``, the dict holding
    keys ``0 .. window - 1``).  One chunk is read even when the writer was
    done first (a short window on a loaded machine, where the reader gets
    the CPU late), so that every reader measures something.
    """
    hist = LogHistogram()
    rec = hist.record
    clock = time.perf_counter_ns
    mask = len(offsets) - 1
    hits = misses = wrong = k = 0
    first = True
    while first or not done.value:
        first = False
        top = progress.value
        span = top if top < window else window
        if span <= 0:
            continue
        for _ in range(CHUNK):
            i = top - 1 - offsets[k & mask] % span
            k += 1
            key = b"%036d" % i
            t0 = clock()
            got = get(key)
            t1 = clock()
            rec(t1 - t0)
            if got is None:
                misses += 1
            elif got == values[i & 255]:
                hits += 1
            else:
                wrong += 1
    return {"get": hist.to_list(), "hits": hits, "misses": misses, "wrong": wrong}


def _summary(prefix: str, hist: LogHistogram) -> dict[str, float]:
    out: dict[str, float] = {
        f"{prefix}_ops": float(hist.count),
        f"{prefix}_per_s": hist.count * 1e9 / hist.total_ns if hist.total_ns else 0.0,
        f"{prefix}_max_ns": float(hist.max_ns),
    }
    for name, pct in PCTS:
        out[f"{prefix}_{name}_ns"] = float(hist.percentile(pct))
    return out


# -- the workload -------------------------------------------------------------------


class Large(Workload):
    """Tail latency, open time and memory of caches of 1 to 16 GiB, and the shard-size sweep."""

    name = "large"
    title = "caches of 1 to 16 GiB past capacity: set/get tails, a reader while a writer evicts"
    seed = "(ours) issue 'A cache of any size'"
    description = (
        "36-byte keys, 160-byte values set into a file until the first eviction (fill), then "
        "as many again (evicting) while a second process gets recent keys (reader) and, in a "
        "second window of the same length, runs the same loop over a dict (scheduler-noise "
        "baseline). Every operation is timed; p50/p99/p99.99/max from all of them. Files of "
        "1, 4 and 16 GiB with the engine's shard count, and a 1 GiB file forced to 1, 4, 16 "
        "and 64 MiB shards; sizes the machine's tmpfs or RAM cannot hold are skipped. Open "
        "times (create, attach, clean, after a crash), entries and memory held."
    )
    only_when_named = True

    def __init__(self, profile: Profile, seed: int = 2010) -> None:
        super().__init__(profile, seed)
        p = _PARAMS[profile.name]
        self.sizes: list[int] = list(p["sizes"])
        self.values: list[bytes] = []
        self.offsets: list[int] = []

    def configure(self, options: dict[str, Any]) -> None:
        sizes = options.get("sizes")
        if sizes:
            self.sizes = sorted({int(s) for s in sizes})

    def params(self) -> dict[str, Any]:
        p = _PARAMS[self.profile.name]
        return {
            "sizes": list(self.sizes),
            "sweep_file": p["sweep_file"],
            "sweep_shard_sizes": list(p["sweep_shards"]),
            "turnover": p["turnover"],
            "window": p["window"],
            "key_bytes": KEY_BYTES,
            "value_bytes": VALUE_BYTES,
            "get_every": GET_EVERY,
            "goals_ns": dict(GOALS),
        }

    def cases(self) -> list[Case]:
        p = _PARAMS[self.profile.name]
        out = [
            Case(
                f"size-{format_bytes(size).replace(' ', '')}",
                f"{format_bytes(size)} file",
                {"sweep": False, "bytes": size, "shards": 0},
            )
            for size in self.sizes
        ]
        file = int(p["sweep_file"])
        for shard in p["sweep_shards"]:
            out.append(
                Case(
                    f"shard-{format_bytes(shard).replace(' ', '')}",
                    f"{format_bytes(file)} file, {format_bytes(shard)} shards",
                    {
                        "sweep": True,
                        "bytes": file,
                        "shards": file // int(shard),
                        "shard_bytes": int(shard),
                    },
                )
            )
        return out

    def capacity(self, case: Case) -> Capacity:
        return Capacity(
            bytes=int(case.params["bytes"]),
            entry_bytes=KEY_BYTES + VALUE_BYTES,
            key_bytes=KEY_BYTES,
            value_bytes=VALUE_BYTES,
        )

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.name == "nearcache-native":
            return None
        return "large measures nearcache's engine alone (nearcache-native)"

    def prepare(self) -> None:
        rng = random.Random(f"{self.rng_seed}:large")
        self.values = [rng.randbytes(VALUE_BYTES) for _ in range(256)]
        self.offsets = [rng.randrange(1 << 30) for _ in range(1 << 16)]

    # -- measuring ----------------------------------------------------------------

    def measure(self, case: Case, backend: Backend) -> Measurement:
        size, shards = int(case.params["bytes"]), int(case.params["shards"])
        path = str(getattr(backend, "path", ""))
        if not path:
            raise RuntimeError(f"{backend.name} has no cache file")
        remove_cache_file(path)  # the backend's placeholder: the fill creates the file
        directory = Path(path).parent
        free, available = fs_free(directory), mem_available()
        reason = room_reason(size, free, available)
        if reason is not None:
            raise CaseSkipped(reason)
        info: dict[str, Any] = {
            "limit": f"{format_bytes(size)} file",
            "filesystem": filesystem_type(directory),
            "fs_free_bytes": free,
            "mem_available_bytes": available,
        }
        try:
            metrics = self._run(path, size, shards, info)
        finally:
            remove_cache_file(path)
        return Measurement(backend=backend.name, metrics=metrics, info=info)

    def _open(self, path: str, size: int, shards: int) -> tuple[Any, int]:
        native = import_module("nearcache._native")
        t0 = time.perf_counter_ns()
        cache = native.NativeCache(path, size, shards)
        return cache, time.perf_counter_ns() - t0

    def _run(self, path: str, size: int, shards: int, info: dict[str, Any]) -> dict[str, float]:
        p = _PARAMS[self.profile.name]
        values, offsets = self.values, self.offsets
        cap = 4 * size // (KEY_BYTES + VALUE_BYTES) + 4 * EVICTION_CHECK
        budget = 600.0 + cap * 50e-6  # seconds; generous: only a wedged process hits it

        # 1. fill, in its own process
        def fill(state: None) -> dict[str, Any]:
            cache, open_ns = self._open(path, size, shards)
            try:
                res = write_phase(
                    cache, 0, cap, values, offsets, int(p["window"]), stop_on_eviction=True
                )
                st = cache.stats()
                res.update(
                    open_ns=open_ns,
                    entries=len(cache),
                    held=int(st["held_bytes"]),
                    shards=cache.shard_count,
                )
                return res
            finally:
                cache.close()

        (filled,), _ = run_parallel(1, lambda i: None, fill, timeout_s=budget)
        if not filled["evicted"]:
            raise RuntimeError(f"no eviction after {filled['next']:,} sets into {size:,} bytes")
        n_fill = int(filled["next"])
        window = max(1, min(int(p["window"]), int(filled["entries"]) // 4))
        turnover = max(2, int(n_fill * float(p["turnover"])))

        # 2. evicting: two windows, nearcache's reader then the dict baseline
        w_a = self._window(path, size, shards, n_fill, turnover // 2, window, False, budget)
        w_b = self._window(
            path,
            size,
            shards,
            n_fill + turnover // 2,
            turnover - turnover // 2,
            window,
            True,
            budget,
        )

        # 3. opens of the full file
        cache, open_clean = self._open(path, size, shards)
        try:
            st = cache.stats()
            entries_evict, held_evict = len(cache), int(st["held_bytes"])
            evictions, compactions = int(st["evictions"]), int(st["compactions"])

            def attach(state: None) -> int:
                c, ns = self._open(path, size, shards)
                c.close()
                return ns

            (open_in_use,), _ = run_parallel(1, lambda i: None, attach, timeout_s=budget)
        finally:
            cache.close()
        open_crash = self._open_after_crash(path, size, shards)

        metrics: dict[str, float] = {
            "file_bytes": float(size),
            "shards": float(filled["shards"]),
            "shard_bytes": float(size // max(1, int(filled["shards"]))),
            "fill_sets": float(n_fill),
            "evict_sets": float(turnover),
            "window": float(window),
            "entries_fill": float(filled["entries"]),
            "held_fill_bytes": float(filled["held"]),
            "entries_evict": float(entries_evict),
            "held_evict_bytes": float(held_evict),
            "evictions": float(evictions),
            "compactions": float(compactions),
            "open_create_ns": float(filled["open_ns"]),
            "open_attach_ns": float(max(w_a["open_ns"] + w_b["open_ns"])),
            "open_clean_ns": float(open_clean),
            "open_in_use_ns": float(open_in_use),
            "open_crash_ns": float(open_crash),
        }
        hists: dict[str, LogHistogram] = {}
        hists["fill_set"] = LogHistogram.from_list(filled["set"])
        hists["fill_get"] = LogHistogram.from_list(filled["get"])
        hists["evict_set"] = LogHistogram.from_list(w_a["writer"]["set"])
        hists["evict_set"].merge(LogHistogram.from_list(w_b["writer"]["set"]))
        hists["evict_get"] = LogHistogram.from_list(w_a["writer"]["get"])
        hists["evict_get"].merge(LogHistogram.from_list(w_b["writer"]["get"]))
        hists["reader_get"] = LogHistogram.from_list(w_a["reader"]["get"])
        hists["dict_get"] = LogHistogram.from_list(w_b["reader"]["get"])
        for name, hist in hists.items():
            metrics.update(_summary(name, hist))
        writer_hits = {
            "fill": (filled["hits"], filled["wrong"]),
            "evict": (
                w_a["writer"]["hits"] + w_b["writer"]["hits"],
                w_a["writer"]["wrong"] + w_b["writer"]["wrong"],
            ),
        }
        for phase, (hits, wrong) in writer_hits.items():
            gets = hists[f"{phase}_get"].count
            metrics[f"{phase}_get_hit_rate"] = hits / gets if gets else 1.0
            metrics[f"{phase}_get_wrong"] = float(wrong)
        for name, res in (("reader", w_a["reader"]), ("dict", w_b["reader"])):
            gets = hists[f"{name}_get"].count
            metrics[f"{name}_get_hit_rate"] = res["hits"] / gets if gets else 1.0
            metrics[f"{name}_get_wrong"] = float(res["wrong"])
        info["histograms"] = {name: hist.to_text() for name, hist in hists.items()}
        return metrics

    def _window(
        self,
        path: str,
        size: int,
        shards: int,
        start: int,
        count: int,
        window: int,
        baseline: bool,
        budget: float,
    ) -> dict[str, Any]:
        """One evicting window: a writer and a reader (nearcache, or the dict baseline)."""
        values, offsets = self.values, self.offsets
        mp = multiprocessing.get_context("fork")
        progress = mp.RawValue("q", start)
        fixed = mp.RawValue("q", window)
        done = mp.RawValue("b", 0)

        def setup(index: int) -> tuple[int, Any, int]:
            if index == 1 and baseline:
                table = {key_of(j): values[j & 255] for j in range(window)}
                return index, table, 0
            cache, open_ns = self._open(path, size, shards)
            return index, cache, open_ns

        def work(state: tuple[int, Any, int]) -> dict[str, Any]:
            index, store, open_ns = state
            if index == 0:
                try:
                    res = write_phase(store, start, count, values, offsets, window, progress)
                finally:
                    done.value = 1
                    store.close()
            elif baseline:
                res = read_phase(store.get, values, offsets, window, fixed, done)
            else:
                try:
                    res = read_phase(store.get, values, offsets, window, progress, done)
                finally:
                    store.close()
            res["open_ns"] = open_ns
            return res

        (writer, reader), _ = run_parallel(2, setup, work, timeout_s=budget)
        opens = [writer["open_ns"]] + ([] if baseline else [reader["open_ns"]])
        return {"writer": writer, "reader": reader, "open_ns": opens}

    def _open_after_crash(self, path: str, size: int, shards: int) -> int:
        """Open the file alone after a process that had it open died without closing it."""
        mp = multiprocessing.get_context("fork")

        def crash() -> None:
            held = self._open(path, size, shards)
            os._exit(0 if held else 1)  # no close: the file is left as a killed process leaves it

        proc = mp.Process(target=crash, name="nearcache-bench-crash")
        proc.start()
        proc.join(600)
        if proc.is_alive() and proc.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, 9)
            proc.join(5)
            raise RuntimeError("the process opening the file did not exit")
        cache, ns = self._open(path, size, shards)
        cache.close()
        return ns

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        rows_phase: list[list[str]] = []
        rows_reader: list[list[str]] = []
        rows_open: list[list[str]] = []
        rows_sweep: list[list[str]] = []
        notes: list[str] = []
        for c in result.cases:
            reason = c.skipped.get("nearcache-native")
            if reason is not None:
                notes.append(f"{c.label}: not measured: {reason}")
            for m in c.measurements:
                mm = m.metrics
                geo = f"{fmt_int(mm['shards'])} x {format_bytes(int(mm['shard_bytes']))}"
                for phase, label in (("fill", "fill"), ("evict", "evicting")):
                    rows_phase.append(
                        [
                            c.label,
                            geo,
                            label,
                            fmt_rate(mm[f"{phase}_set_per_s"]),
                            *[fmt_ns(mm[f"{phase}_set_{q}_ns"]) for q in ("p50", "p99", "p99.99")],
                            fmt_ns(mm[f"{phase}_set_max_ns"]),
                            fmt_rate(mm[f"{phase}_get_per_s"]),
                            *[fmt_ns(mm[f"{phase}_get_{q}_ns"]) for q in ("p50", "p99", "p99.99")],
                            fmt_ns(mm[f"{phase}_get_max_ns"]),
                            f"{mm[f'{phase}_get_hit_rate']:.3f}",
                        ]
                    )
                for who, label in (("reader", "nearcache"), ("dict", "dict (baseline)")):
                    rows_reader.append(
                        [
                            c.label,
                            label,
                            fmt_int(mm[f"{who}_get_ops"]),
                            *[fmt_ns(mm[f"{who}_get_{q}_ns"]) for q in ("p50", "p99", "p99.99")],
                            fmt_ns(mm[f"{who}_get_max_ns"]),
                            f"{mm[f'{who}_get_hit_rate']:.3f}",
                            fmt_int(mm[f"{who}_get_wrong"]),
                        ]
                    )
                rows_open.append(
                    [
                        c.label,
                        geo,
                        fmt_ns(mm["open_create_ns"]),
                        fmt_ns(mm["open_attach_ns"]),
                        fmt_ns(mm["open_clean_ns"]),
                        fmt_ns(mm["open_in_use_ns"]),
                        fmt_ns(mm["open_crash_ns"]),
                        fmt_int(mm["entries_fill"]),
                        format_bytes(int(mm["held_fill_bytes"])),
                        fmt_int(mm["entries_evict"]),
                        format_bytes(int(mm["held_evict_bytes"])),
                        f"{mm['held_evict_bytes'] / mm['file_bytes']:.2f}",
                    ]
                )
                if c.params.get("sweep"):
                    rows_sweep.append(
                        [
                            format_bytes(int(c.params["shard_bytes"])),
                            fmt_int(mm["shards"]),
                            fmt_ns(mm["evict_set_p99.99_ns"]),
                            fmt_ns(mm["evict_set_max_ns"]),
                            fmt_ns(mm["reader_get_p99.99_ns"]),
                            fmt_ns(mm["reader_get_max_ns"]),
                            fmt_ns(mm["dict_get_max_ns"]),
                        ]
                    )
        if not rows_phase and not notes:
            return []
        goals = (
            "goals: a reader's get p99.99 <= 50us and max <= 1ms while a writer evicts; "
            "set p99.99 <= 100us, max <= 2ms (at every size and shard size)"
        )
        pct_cols = ["p50", "p99", "p99.99", "max"]
        out = [
            Table(
                "large: the writer's sets and gets, per phase (every operation timed)",
                [
                    "case",
                    "shards",
                    "phase",
                    "set/s",
                    *[f"set {q}" for q in pct_cols],
                    "get/s",
                    *[f"get {q}" for q in pct_cols],
                    "get hit rate",
                ],
                rows_phase,
                right=set(range(3, 14)),
                notes=[
                    "fill: from empty to the first eviction; evicting: as many sets again "
                    f"(turnover {result.params.get('turnover', '?')}), each evicting. One get "
                    f"of a recent key after every {GET_EVERY} sets. Rates: operations per "
                    "second inside the calls.",
                    goals,
                    *notes,
                ],
            ),
            Table(
                "large: a second process's gets while one writer evicts (dict: the same loop, "
                "scheduler noise)",
                ["case", "reader", "gets", *pct_cols, "hit rate", "wrong values"],
                rows_reader,
                right=set(range(2, 9)),
                notes=[
                    "nearcache: gets of the writer's last keys from the file, during the first "
                    "half of the evicting phase; dict: the same loop over a dict in a second "
                    "process during the second half (the writer still evicting): what "
                    "preemption alone costs on this machine.",
                    goals,
                ],
            ),
            Table(
                "large: open times, entries and memory held",
                [
                    "case",
                    "shards",
                    "create",
                    "attach",
                    "clean",
                    "in use",
                    "after crash",
                    "entries (fill)",
                    "held (fill)",
                    "entries (evicting)",
                    "held (evicting)",
                    "held / size",
                ],
                rows_open,
                right=set(range(2, 12)),
                notes=[
                    "create: a new file; attach: the writer's and reader's opens at the start "
                    "of each evicting window (the largest); clean: alone, after the last "
                    "process closed it; in use: while another process has it open; after "
                    "crash: alone, after a process died holding it (each shard's header checked). "
                    "held: stats()['held_bytes'], the file's pages.",
                ],
            ),
        ]
        if rows_sweep:
            out.append(
                Table(
                    f"large: shard-size sweep ({format_bytes(int(result.params['sweep_file']))} "
                    "file, shards forced), evicting phase",
                    [
                        "shard size",
                        "shards",
                        "set p99.99",
                        "set max",
                        "reader get p99.99",
                        "reader get max",
                        "dict reader max",
                    ],
                    rows_sweep,
                    right=set(range(1, 7)),
                    notes=[goals],
                )
            )
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        sizes: dict[str, list[tuple[float, float]]] = {}
        sweep: dict[str, list[tuple[float, float]]] = {}
        series = (
            ("set p99.99", "evict_set_p99.99_ns"),
            ("set max", "evict_set_max_ns"),
            ("reader get p99.99", "reader_get_p99.99_ns"),
            ("reader get max", "reader_get_max_ns"),
            ("dict reader max (noise)", "dict_get_max_ns"),
        )
        for c in result.cases:
            for m in c.measurements:
                x = float(c.params["shard_bytes"] if c.params.get("sweep") else c.params["bytes"])
                target = sweep if c.params.get("sweep") else sizes
                for label, key in series:
                    target.setdefault(label, []).append((x, m.metrics[key] / 1e3))
        if not sizes and not sweep:
            return []
        return [large_chart(outdir / "large.png", sizes, sweep)]


def large_chart(
    path: Path,
    sizes: dict[str, list[tuple[float, float]]],
    sweep: dict[str, list[tuple[float, float]]],
) -> Path:
    """Tail latencies (us, log scale) against file size and against shard size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    styles = {
        "set p99.99": ("#e8590c", "o", "-"),
        "set max": ("#e8590c", "s", "--"),
        "reader get p99.99": ("#1864ab", "o", "-"),
        "reader get max": ("#1864ab", "s", "--"),
        "dict reader max (noise)": ("#868e96", "D", ":"),
    }
    goals = (
        (GOALS["reader_p99.99"], "reader p99.99 goal"),
        (GOALS["reader_max"], "reader max goal"),
        (GOALS["set_max"], "set max goal"),
    )
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), squeeze=False)
    panels = (("by file size (engine's shards)", sizes), ("by shard size (shards forced)", sweep))
    for ax, (title, data) in zip(axes[0], panels, strict=True):
        xs: set[float] = set()
        for label, points in data.items():
            pts = sorted((x, y) for x, y in points if y > 0)
            if not pts:
                continue
            colour, marker, dash = styles.get(label, ("#212529", ".", "-"))
            xs.update(x for x, _ in pts)
            ax.plot(
                [x for x, _ in pts],
                [y for _, y in pts],
                color=colour,
                marker=marker,
                linestyle=dash,
                label=label,
            )
        for ns, label in goals:
            ax.axhline(ns / 1e3, color="#adb5bd", linestyle=":", linewidth=1.0)
            ax.annotate(label, xy=(0.01, ns / 1e3), xycoords=("axes fraction", "data"), fontsize=7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=11)
        ax.set_ylabel("latency, us (log scale)", fontsize=9)
        ax.grid(True, which="major", alpha=0.3)
        if xs:
            ticks = sorted(xs)
            ax.set_xticks(ticks)
            ax.set_xticklabels([format_bytes(int(x)) for x in ticks], fontsize=8)
            ax.minorticks_off()
        if data:
            ax.legend(fontsize=8)
    fig.suptitle("large: tails while a writer evicts (lower is better)", fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
