"""``locks`` (ours): a lock shared by processes, taken alone and fought over.

Memoize's stampede protection, Django's page locks and every "only one
worker rebuilds this" rest on a cross-process lock, so its cost is paid on
every miss of a hot key.  This workload measures the locks people reach
for, each as its library offers it:

- ``nearcache``: :meth:`nearcache.Cache.lock` (an ``add`` of a token with a
  TTL, released by ``delete_if_equals``), on the engine's shared memory;
- ``diskcache``: ``diskcache.Lock`` (an ``add`` with an expiry in SQLite);
- ``redis``: redis-py's ``Redis.lock`` (``SET NX PX`` and a Lua release),
  when a Redis server is given (``--redis`` or ``--start-servers``);
- two rows the workload measures itself: ``fcntl.flock`` on a lock file
  (the kernel's lock, what filelock and portalocker wrap; it needs no
  cache, but it cannot expire: a holder that hangs holds it) and
  ``filelock.FileLock`` when the ``filelock`` package is installed.

Cases, each run for a fixed time per lock (``tiny`` 0.2 s, ``quick`` 1 s,
``default`` 3 s):

- **alone**: one process acquires and releases in a loop;
- **fought over by 4**: four processes do the same at once (4 whatever
  the core count, so the figures of a 2-core and a 64-core machine are of
  the same fight).

Inside the lock each process reads an 8-byte counter from a shared file,
adds one and writes it back (``pread``/``pwrite``); at the end the counter
must equal the sum of the processes' counts, and any shortfall is shown as
*lost updates* (two holders at once: a broken lock).  Every acquire and
release is timed alone into a :class:`~nearcache.bench.stats.LogHistogram`;
*sections/s* counts the critical sections of all processes per second of
the run's wall time, and *fairness* is the fewest sections a process
completed over the most.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import struct
import time
from collections.abc import Callable
from importlib import import_module
from pathlib import Path
from typing import Any

from ..backends.base import Backend, BackendContext, Capacity
from ..backends.registry import network_names, ours_names
from ..model import Measurement, WorkloadResult
from ..plots import barh_panels
from ..report import Table, fmt_int, fmt_ns, fmt_ratio, pick_reference, skipped_note
from ..stats import LogHistogram
from .base import Case, Workload

__all__ = ["CONTENDERS", "Locks", "fight"]

#: Processes in the contended case (fixed, so every machine runs the same fight).
CONTENDERS = 4
_SECONDS = {"tiny": 0.2, "quick": 1.0, "default": 3.0}
_LOCK_KEY = "bench-lock"
_COUNTER = struct.Struct("<Q")

#: Makes a lock in the process that uses it: returns (acquire, release, close).
LockMaker = Callable[[], tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]]


def _nearcache_lock(path: str, size: int) -> LockMaker:
    def make() -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
        cache = import_module("nearcache").Cache(path=path, size=size)
        lock = cache.lock(_LOCK_KEY, timeout=None, expire=30)
        return lock.acquire, lock.release, cache.close

    return make


def _diskcache_lock(directory: str) -> LockMaker:
    def make() -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
        diskcache = import_module("diskcache")
        cache = diskcache.Cache(directory)
        lock = diskcache.Lock(cache, _LOCK_KEY, expire=30)
        return lock.acquire, lock.release, cache.close

    return make


def _redis_lock(url: str, name: str) -> LockMaker:
    def make() -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
        client = import_module("redis").Redis.from_url(url)
        lock = client.lock(name, timeout=30)
        return lock.acquire, lock.release, client.close

    return make


def _flock_lock(path: str) -> LockMaker:
    def make() -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        return (
            lambda: fcntl.flock(fd, fcntl.LOCK_EX),
            lambda: fcntl.flock(fd, fcntl.LOCK_UN),
            lambda: os.close(fd),
        )

    return make


def _filelock_lock(path: str) -> LockMaker:
    def make() -> tuple[Callable[[], Any], Callable[[], Any], Callable[[], Any]]:
        lock = import_module("filelock").FileLock(path)
        return lock.acquire, lock.release, lambda: None

    return make


def _contender(
    make: LockMaker,
    counter_path: str,
    start: Any,
    seconds: float,
    out: Any,
) -> None:
    """One process of a fight: loop acquire, increment the counter, release."""
    acquire, release, close = make()
    fd = os.open(counter_path, os.O_RDWR)
    take, give = LogHistogram(), LogHistogram()
    clock = time.perf_counter_ns
    pread, pwrite, pack, unpack = os.pread, os.pwrite, _COUNTER.pack, _COUNTER.unpack
    done = 0
    try:
        start.wait()
        end = clock() + int(seconds * 1e9)
        while True:
            t0 = clock()
            if t0 >= end:
                break
            acquire()
            t1 = clock()
            (n,) = unpack(pread(fd, 8, 0))
            pwrite(fd, pack(n + 1), 0)
            t2 = clock()
            release()
            t3 = clock()
            take.record(t1 - t0)
            give.record(t3 - t2)
            done += 1
        out.put((done, take.to_text(), give.to_text(), None))
    except BaseException as exc:  # reported, not lost in a child's stderr
        out.put((done, take.to_text(), give.to_text(), f"{type(exc).__name__}: {exc}"))
    finally:
        os.close(fd)
        with contextlib.suppress(Exception):
            close()


def fight(make: LockMaker, processes: int, seconds: float, workdir: Path) -> dict[str, float]:
    """Run ``processes`` contenders on the lock ``make`` builds for ``seconds``;
    the figures, with ``lost_updates`` (the counter's shortfall)."""
    counter = workdir / "counter"
    counter.write_bytes(_COUNTER.pack(0))
    mp = multiprocessing.get_context("fork")
    start = mp.Event()
    out = mp.Queue()
    procs = [
        mp.Process(target=_contender, args=(make, str(counter), start, seconds, out))
        for _ in range(processes)
    ]
    for p in procs:
        p.start()
    t0 = time.perf_counter()
    start.set()
    reports = [out.get(timeout=seconds + 120) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join(timeout=30)
    errors = [r[3] for r in reports if r[3]]
    if errors:
        raise RuntimeError(f"a contender failed: {errors[0]}")
    take, give = LogHistogram(), LogHistogram()
    for _, t, g, _ in reports:
        take.merge(LogHistogram.from_text(t))
        give.merge(LogHistogram.from_text(g))
    counts = [r[0] for r in reports]
    total = sum(counts)
    (held,) = _COUNTER.unpack(counter.read_bytes()[:8])
    return {
        "sections_per_s": total / wall if wall else 0.0,
        "sections": float(total),
        "acquire_p50_ns": float(take.percentile(50)),
        "acquire_p99_ns": float(take.percentile(99)),
        "acquire_max_ns": float(take.max_ns),
        "release_p50_ns": float(give.percentile(50)),
        "fairness": min(counts) / max(counts) if max(counts) else 0.0,
        "lost_updates": float(total - held),
    }


class Locks(Workload):
    """Acquire and release a cross-process lock, alone and fought over by 4 processes."""

    name = "locks"
    title = "a lock shared by processes: acquire and release, alone and fought over by 4"
    seed = "ours: the lock under memoize's stampede protection and Django's page locks"
    description = (
        "Each process acquires the lock, increments a counter in a shared file, and "
        "releases it, in a loop for a fixed time; 'alone' runs one process, 'fought over "
        "by 4' four at once. Every acquire and release is timed; the counter must end at "
        "the sum of the sections (lost updates: two holders at once). nearcache's, "
        "diskcache's and redis-py's locks, with fcntl.flock on a file and filelock beside."
    )
    only_when_named = True

    def params(self) -> dict[str, Any]:
        return {"seconds": _SECONDS[self.profile.name], "contenders": CONTENDERS}

    def cases(self) -> list[Case]:
        return [
            Case("alone", "alone", {"processes": 1}),
            Case("fought", f"fought over by {CONTENDERS}", {"processes": CONTENDERS}),
        ]

    def capacity(self, case: Case) -> Capacity:
        return Capacity(entry_bytes=64, key_bytes=32, value_bytes=16)

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.name in ("nearcache", "diskcache", "redis"):
            return None
        return "offers no lock (the lock rows are nearcache, diskcache, redis, flock, filelock)"

    def _maker(self, backend: Backend) -> LockMaker:
        b: Any = backend
        if backend.name == "nearcache":
            return _nearcache_lock(b.path, b.size)
        if backend.name == "diskcache":
            return _diskcache_lock(b.directory)
        return _redis_lock(b.url, f"{b.prefix}{_LOCK_KEY}")

    def measure(self, case: Case, backend: Backend) -> Measurement:
        workdir = backend.ctx.scratch(f"locks-{case.id}-{backend.name}")
        figures = fight(
            self._maker(backend), case.params["processes"], _SECONDS[self.profile.name], workdir
        )
        return Measurement(backend=backend.name, metrics=figures, info={"limit": backend.limit()})

    def extra_measurements(
        self, case: Case, ctx: BackendContext, skipped: dict[str, str]
    ) -> list[Measurement]:
        rows: list[Measurement] = []
        workdir = ctx.scratch(f"locks-{case.id}-files")
        makers: dict[str, LockMaker] = {"fcntl.flock": _flock_lock(str(workdir / "flock"))}
        try:
            import_module("filelock")
            makers["filelock"] = _filelock_lock(str(workdir / "filelock.lock"))
        except ImportError:
            skipped["filelock"] = "filelock is not installed (pip install filelock)"
        for name, make in makers.items():
            figures = fight(make, case.params["processes"], _SECONDS[self.profile.name], workdir)
            rows.append(Measurement(backend=name, metrics=figures, info={"limit": "a lock file"}))
        return rows

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        out: list[Table] = []
        for case in result.cases:
            ms = sorted(case.measurements, key=lambda m: -m.metrics["sections_per_s"])
            reference = pick_reference(m.backend for m in ms)
            ref = case.get(reference) if reference else None
            cols = ["lock", "sections/s", "acquire p50", "acquire p99", "acquire max",
                    "release p50", "fairness", "lost updates"]  # fmt: skip
            if ref is not None:
                cols.append(f"vs {reference}")
            rows = []
            for m in ms:
                mm = m.metrics
                row = [
                    m.backend,
                    fmt_int(mm["sections_per_s"]),
                    fmt_ns(mm["acquire_p50_ns"]),
                    fmt_ns(mm["acquire_p99_ns"]),
                    fmt_ns(mm["acquire_max_ns"]),
                    fmt_ns(mm["release_p50_ns"]),
                    f"{mm['fairness']:.2f}",
                    f"{int(mm['lost_updates']):,}",
                ]
                if ref is not None:
                    theirs = ref.metrics["sections_per_s"]
                    row.append(fmt_ratio(mm["sections_per_s"] / theirs) if theirs else "-")
                rows.append(row)
            notes = [
                "fcntl.flock: the kernel's lock on a file (what filelock wraps); it needs no "
                "cache but never expires: a holder that hangs holds it until it exits",
            ]
            notes.extend(skipped_note(case))
            out.append(
                Table(
                    f"locks, {case.label}: acquire, increment a shared counter, release",
                    cols,
                    rows,
                    right=set(range(1, len(cols))),
                    notes=notes,
                )
            )
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        if not result.cases:
            return []
        panels = [
            (
                f"sections/s, {case.label}",
                [(m.backend, m.metrics["sections_per_s"]) for m in case.measurements],
            )
            for case in result.cases
        ]
        return [
            barh_panels(
                outdir / "locks.png",
                "locks: critical sections per second (higher is better)",
                panels,
                "sections per second (log scale)",
                ours=ours_names(),
                network=network_names(),
            )
        ]
