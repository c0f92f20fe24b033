"""``value-sizes`` (ours): get and set rates of bytes values from 1 KiB to 100 MiB.

nearcache keeps values up to its spill threshold (128 KiB by default) in
shared memory when they fit in a shard, and larger ones in immutable files
beside the cache file (``<file>.spill/``).  This workload measures what that
costs and where the crossover lies, one process, against the peers that
store large values too:

- ``nearcache``: ``nearcache.Cache`` with its defaults (a 64 MiB file, so
  entries up to ~894 KiB fit in a shard; spill threshold 128 KiB; spill
  budget 1 GiB);
- ``nearcache-inline``: the same API with every value kept in shared memory:
  a spill threshold as large as the file and a file big enough, with few
  enough shards, for the value to fit in one (``Cache.max_entry_size``);
- ``nearcache-spilled``: every value in a spill file (spill threshold 512
  bytes, below the smallest value: a value is spilled when it is *longer*
  than the threshold, so 1 KiB would stay inline with a 1 KiB threshold);
- ``diskcache`` (values of 32 KiB and more in files, its default), Django's
  ``FileBasedCache``, Redis and memcached (when their servers are given or
  started), and ``cachetools`` / ``dict`` as the in-process ceiling (a get
  returns a reference: no copy, so their MB/s is not a transfer rate).

Per value size, a few distinct 36-character keys (enough values to fill a
working set of several MiB for small sizes, at least 2 or 3 for large ones)
hold pre-generated random bytes.  Every key is stored and read back once
(untimed; a backend that raises or misses there *refused* the size, shown as
a skipped cell with its reason: memcached refuses items above its ``-I`` item
size limit, 1 MiB by default).  Then set/s (overwrites of stored keys, in
key order) and get/s (the keys in a fixed shuffled order) are timed in chunks
that grow from 1 operation, so a 100 MiB value is not written four times
before the clock is read; MB/s is the rate times the value size (1 MB = 10^6
bytes).  Every value is read back and compared after the timed runs.

Every backend's budget holds the working set, so nothing is evicted: nearcache
64 MiB of shared memory plus its 1 GiB spill budget (the largest working set,
3 x 100 MiB, is 300 MiB), nearcache-inline a file at least four times the
working set, diskcache its default 1 GiB ``size_limit``, Django no
``MAX_ENTRIES`` culling, the LRU object no bound, the servers their own
memory (the harness starts memcached with 1 GiB).  The tables say when a get
missed (hit rate below 1) or when nearcache evicted.

File-based stores share one file system: this workload keeps diskcache's and
Django's directories in nearcache's directory (``/dev/shm`` by default, a
tmpfs; ``--nearcache-dir DIR`` moves all of them, e.g. to repeat the run on
a disk).  The file system of each store is recorded with its figures.
"""

from __future__ import annotations

import dataclasses
import math
import random
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..backends.base import (
    Backend,
    BackendContext,
    Capacity,
    Handle,
    Scope,
    format_bytes,
    import_module,
)
from ..backends.ours import (
    UNBOUNDED_SIZE,
    NearcacheCache,
    nearcache_directory,
    remove_cache_file,
)
from ..backends.registry import ours_names
from ..data import uuid_keys
from ..machine import filesystem_type
from ..model import Measurement, WorkloadResult
from ..plots import size_lines
from ..report import Table, fmt_int, fmt_ratio, loss_notes
from .base import Case, Profile, Workload, medians, repeat_runs

__all__ = [
    "INLINE",
    "SEED_003_SIZES",
    "SIZES",
    "SPILLED",
    "NearcacheInline",
    "NearcacheSpilled",
    "ValueRefused",
    "ValueSize",
    "ValueSizes",
    "inline_geometry",
]

KiB = 1024
MiB = 1024 * KiB


@dataclass(frozen=True)
class ValueSize:
    """One value size: an id for case names, a label, the exact byte count."""

    id: str
    label: str
    bytes: int


#: Every size measured by the default profile, smallest first.
SIZES = (
    ValueSize("1KiB", "1 KiB", KiB),
    ValueSize("4KiB", "4 KiB", 4 * KiB),
    ValueSize("16KiB", "16 KiB", 16 * KiB),
    ValueSize("59KiB", "59 KiB", 59 * KiB),
    ValueSize("128KiB", "128 KiB", 128 * KiB),
    ValueSize("295KiB", "295 KiB", 295 * KiB),
    ValueSize("1.2MiB", "1.2 MiB", round(1.2 * MiB)),
    ValueSize("4MiB", "4 MiB", 4 * MiB),
    ValueSize("16MiB", "16 MiB", 16 * MiB),
    ValueSize("100MiB", "100 MiB", 100 * MiB),
)

#: Seed 003's objects: an HTML page, a script, an image (also cases of
#: ``fastmmap-2004`` and ``django-8proc``).
SEED_003_SIZES = tuple(s for s in SIZES if s.id in ("59KiB", "295KiB", "1.2MiB"))

#: The registered backends this workload compares (the others are left out).
PARTICIPANTS = (
    "nearcache",
    "diskcache",
    "django-filebased",
    "redis",
    "memcached",
    "cachetools",
    "dict",
)
#: Peers whose stores are directories: kept beside nearcache's files.
FILE_PEERS = ("diskcache", "django-filebased")

INLINE = "nearcache-inline"
SPILLED = "nearcache-spilled"
#: Row order of the tables.
ORDER = ("nearcache", INLINE, SPILLED, *PARTICIPANTS[1:])

#: What the two rows of this workload give up (quoted where the default row loses to them).
TRADEOFFS = {
    INLINE: (
        "keeps every value in shared memory: a file of at least four times the working set "
        "with few shards (the defaults keep a 64 MiB file and spill values above 128 KiB)"
    ),
    SPILLED: "keeps every value in a file: the defaults' path above the spill threshold",
}

#: Spill threshold of the forced-spill row: below the smallest value measured.
FORCED_SPILL_THRESHOLD = 512
#: Largest file the inline row may use.
MAX_INLINE_FILE = 8 << 30
#: Bytes of a key and an entry header, with slack, beyond the value.
_ENTRY_OVERHEAD = 64
_CHUNK = 256
_REFUSED = "failed: ValueRefused: "

_PARAMS: dict[str, dict[str, Any]] = {
    # sizes: the value sizes measured; keys per size: working_set // size, clamped
    # to [min_keys, max_keys]; ops: ceiling of one timed run (0: exactly two
    # passes over the keys, as the tests need).
    "tiny": {
        "sizes": ("1KiB", "128KiB", "295KiB", "1.2MiB"),
        "working_set": 256 * KiB,
        "min_keys": 2,
        "max_keys": 32,
        "ops": 0,
    },
    "quick": {
        "sizes": tuple(s.id for s in SIZES if s.bytes <= 16 * MiB),
        "working_set": 4 * MiB,
        "min_keys": 3,
        "max_keys": 1024,
        "ops": 100_000,
    },
    "default": {
        "sizes": tuple(s.id for s in SIZES),
        "working_set": 8 * MiB,
        "min_keys": 3,
        "max_keys": 2048,
        "ops": 1_000_000,
    },
}


class ValueRefused(Exception):
    """A backend did not store a value of this size (it raised, or a get missed)."""


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0][:240] if lines else ""


def _refusal(name: str, label: str, exc: BaseException) -> str:
    text = _one_line(f"{name} refused a {label} value ({type(exc).__name__}: {exc})")
    if name == "memcached" and "too large" in str(exc):
        text += "; memcached refuses items above its -I item size limit (1 MiB by default)"
    return text


# -- nearcache rows of this workload only ---------------------------------------


def inline_geometry(path: str, value_len: int, key_len: int, keys: int) -> tuple[int, int]:
    """A file size and shard count keeping ``keys`` entries of this size inline, without eviction.

    The file is at least 64 MiB and four times the working set; the shard
    count is the largest power of two (up to the engine's choice for that
    size) whose shards take the value (``max_entry_size``) and hold, with
    room to spare, the keys a shard may get (the mean plus four standard
    deviations of a uniform hash).  Trial files are created at ``path``; the
    one left there has the returned geometry.
    """
    native = import_module("nearcache._native")
    entry = value_len + key_len + _ENTRY_OVERHEAD
    size = max(UNBOUNDED_SIZE, 1 << math.ceil(math.log2(4 * keys * entry)))
    largest = 0  # the largest entry any geometry tried so far takes inline
    while size <= MAX_INLINE_FILE:
        cache = native.NativeCache(path, size, 0, recreate=True)
        shards = int(cache.shard_count)
        cache.close()
        largest_here = 0
        while shards >= 1:
            load = keys / shards
            bound = min(keys, math.ceil(load + 4 * math.sqrt(load) + 2))
            if (size // shards) // 2 >= bound * entry:
                cache = native.NativeCache(path, size, shards, recreate=True)
                takes = int(cache.max_entry_size)
                cache.close()
                if takes >= entry:
                    return size, shards
                largest_here = max(largest_here, takes)
            shards //= 2
        if largest and largest_here <= largest:
            # A larger file takes no larger entry: inline entries are
            # bounded by an arena segment, not by the file.
            remove_cache_file(path)
            raise ValueRefused(
                f"nearcache keeps entries up to {format_bytes(largest)} in shared memory "
                f"(one arena segment); {format_bytes(value_len)} values are spilled to files"
            )
        largest = max(largest, largest_here)
        size *= 2
    remove_cache_file(path)
    raise ValueRefused(
        f"no file up to {format_bytes(MAX_INLINE_FILE)} keeps {keys} values of "
        f"{format_bytes(value_len)} in shared memory"
    )


class _Variant(NearcacheCache):
    """``nearcache.Cache`` with its own geometry and spill threshold (not registered)."""

    def __init__(self, ctx: BackendContext, capacity: Capacity, tag: str, keys: int) -> None:
        self.keys = keys
        self.shards = 0
        self.threshold = 0
        super().__init__(ctx, capacity, tag)

    def open(self) -> Handle:
        cache = import_module("nearcache").Cache(
            path=self.path, size=self.size, shards=self.shards, spill_threshold=self.threshold
        )
        return Handle(get=cache.get, set=cache.set, delete=cache.delete, close=cache.close)

    def clear(self) -> None:
        cache = import_module("nearcache._native").NativeCache(self.path, self.size, self.shards)
        try:
            cache.clear()
        finally:
            cache.close()


class NearcacheInline(_Variant):
    """Every value in shared memory: a file and shard count that fit it, no spill threshold."""

    name = INLINE
    title = "nearcache.Cache, values kept inline (big file, few shards, no spill threshold)"

    def setup(self) -> None:
        self.path = str(nearcache_directory(self.ctx) / f"bench-{self.ctx.run_id}-{self.tag}")
        self.size, self.shards = inline_geometry(
            self.path, self.capacity.value_bytes, self.capacity.key_bytes, self.keys
        )
        self.threshold = self.size
        self._limit = (
            f"{format_bytes(self.size)} file, {self.shards} shard"
            f"{'s' if self.shards > 1 else ''}, spill_threshold={format_bytes(self.threshold)}"
        )


class NearcacheSpilled(_Variant):
    """Every value in a spill file: the default file, a 512-byte spill threshold."""

    name = SPILLED
    title = "nearcache.Cache, values spilled to files (spill_threshold=512)"

    def setup(self) -> None:
        super().setup()
        self.threshold = FORCED_SPILL_THRESHOLD
        self._limit = (
            f"{format_bytes(self.size)} file, spill_threshold={self.threshold} B, "
            "spill budget 1 GiB"
        )


# -- the timed loops --------------------------------------------------------------


def timed_sets(
    set_: Callable[[str, Any], object],
    keys: Sequence[str],
    values: Sequence[Any],
    max_ops: int,
    budget_ns: int | None,
) -> tuple[int, int]:
    """Set ``keys[i]`` to ``values[i]``, cycling; return (operations, nanoseconds).

    The clock is read around chunks of 1, 2, 4 ... 256 operations; the run
    stops after ``max_ops`` or once ``budget_ns`` is spent.
    """
    clock = time.perf_counter_ns
    n = len(keys)
    ops = elapsed = pos = 0
    size = 1
    while ops < max_ops:
        m = min(size, max_ops - ops, n - pos)
        size = min(size * 2, _CHUNK)
        kk, vv = keys[pos : pos + m], values[pos : pos + m]
        t0 = clock()
        for key, value in zip(kk, vv, strict=True):
            set_(key, value)
        elapsed += clock() - t0
        ops += m
        pos = (pos + m) % n
        if budget_ns is not None and elapsed >= budget_ns:
            break
    return ops, elapsed


def timed_gets(
    get: Callable[[str], Any], keys: Sequence[str], max_ops: int, budget_ns: int | None
) -> tuple[int, int, int]:
    """Get ``keys``, cycling; return (ops, nanoseconds, hits); chunked as :func:`timed_sets`."""
    clock = time.perf_counter_ns
    n = len(keys)
    ops = elapsed = pos = hits = 0
    size = 1
    while ops < max_ops:
        m = min(size, max_ops - ops, n - pos)
        size = min(size * 2, _CHUNK)
        kk = keys[pos : pos + m]
        found = 0
        t0 = clock()
        for key in kk:
            if get(key) is not None:
                found += 1
        elapsed += clock() - t0
        hits += found
        ops += m
        pos = (pos + m) % n
        if budget_ns is not None and elapsed >= budget_ns:
            break
    return ops, elapsed, hits


@dataclass
class _Data:
    """The keys and values of one case (kept for the case being measured only)."""

    case: str
    keys: list[str]
    values: list[bytes]
    get_keys: list[str]


def _nearcache_state(path: str) -> dict[str, int]:
    """Counters and geometry of the nearcache file at ``path``."""
    cache = import_module("nearcache._native").NativeCache(path, 0, create=False)
    try:
        stats = cache.stats()
        return {
            "items": int(stats["items"]),
            "spilled_values": int(stats["spilled_values"]),
            "evictions": int(stats["evictions"]),
            "max_entry_size": int(cache.max_entry_size),
            "spill_threshold": int(cache.spill_threshold),
            "shards": int(cache.shard_count),
        }
    finally:
        cache.close()


def _tag(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))[:80]


class ValueSizes(Workload):
    """get/s, set/s and MB/s against value size: inline, spilled, and the peers."""

    name = "value-sizes"
    title = "get and set rates against value size, 1 KiB to 100 MiB (inline vs spilled)"
    seed = "(ours) nearcache's spill files; seed 003's page, script and image sizes"
    description = (
        "One process, bytes values of random data from 1 KiB to 100 MiB (tiny/quick profiles "
        "stop earlier), a few 36-character keys per size (several MiB of values for small "
        "sizes, at least 3 for large ones, 2 in the tiny profile). Set/s overwrites stored keys, "
        "get/s reads them; MB/s = rate x value size. nearcache with its defaults (values above "
        "128 KiB, or too large for a shard of its 64 MiB file, go to spill files), forced "
        "inline (a file and shard count that fit the value, no spill threshold) and forced "
        "spilled (spill threshold 512 B), against diskcache (values of 32 KiB and more in "
        "files), Django's FileBasedCache, Redis, memcached and the in-process ceiling "
        "(cachetools, dict: a get returns a reference). Every budget holds the working set; "
        "file-based stores share nearcache's directory (tmpfs unless --nearcache-dir). A "
        "backend that raises or misses on a size refused it (shown with the reason)."
    )
    only_when_named = True

    def __init__(self, profile: Profile, seed: int = 2010) -> None:
        super().__init__(profile, seed)
        self._data_cache: _Data | None = None
        self._ours_ran: set[str] = set()

    def params(self) -> dict[str, Any]:
        p = _PARAMS[self.profile.name]
        return {
            "sizes": [s.label for s in self._sizes()],
            "working_set_bytes": p["working_set"],
            "min_keys": p["min_keys"],
            "max_keys": p["max_keys"],
            "ops": p["ops"],
            "forced_spill_threshold": FORCED_SPILL_THRESHOLD,
        }

    def _sizes(self) -> list[ValueSize]:
        wanted = set(_PARAMS[self.profile.name]["sizes"])
        return [s for s in SIZES if s.id in wanted]

    def keys_for(self, size: int) -> int:
        """How many keys hold values of ``size`` bytes in this profile."""
        p = _PARAMS[self.profile.name]
        return int(min(p["max_keys"], max(p["min_keys"], p["working_set"] // size)))

    def cases(self) -> list[Case]:
        return [
            Case(s.id, s.label, {"bytes": s.bytes, "keys": self.keys_for(s.bytes)})
            for s in self._sizes()
        ]

    def capacity(self, case: Case) -> Capacity:
        size = int(case.params["bytes"])
        return Capacity(entry_bytes=36 + size, key_bytes=36, value_bytes=size)

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.name in PARTICIPANTS:
            return None
        return "not one of this workload's rows (" + ", ".join(PARTICIPANTS) + ")"

    def data(self, case: Case) -> _Data:
        """The keys and values of ``case`` (generated on first use, deterministic)."""
        cached = self._data_cache
        if cached is not None and cached.case == case.id:
            return cached
        self._data_cache = None  # free the previous size's values first
        rng = random.Random(f"{self.rng_seed}:value-sizes:{case.id}")
        n, size = int(case.params["keys"]), int(case.params["bytes"])
        keys = uuid_keys(rng, n)
        values = [rng.randbytes(size) for _ in range(n)]
        order = list(range(n))
        rng.shuffle(order)
        self._data_cache = _Data(case.id, keys, values, [keys[i] for i in order])
        return self._data_cache

    # -- measuring --------------------------------------------------------------

    def _rehome(self, backend: Backend) -> None:
        """Move a file-based peer's store into nearcache's directory (one file system)."""
        target = nearcache_directory(backend.ctx)
        if backend.ctx.workdir == target:
            return
        backend.destroy()
        backend.ctx = dataclasses.replace(backend.ctx, workdir=target)
        backend.tag = f"bench-{backend.ctx.run_id}-{backend.tag}"
        backend.setup()

    def measure(self, case: Case, backend: Backend) -> Measurement:
        if backend.name == "nearcache":
            self._ours_ran.add(case.id)
        if backend.name in FILE_PEERS:
            self._rehome(backend)
        return self.measure_backend(case, backend)

    def _check(self, name: str, case: Case, handle: Handle, data: _Data, when: str) -> None:
        """Read every value back: a miss is a refusal, a different value an error."""
        missing = wrong = 0
        for key, value in zip(data.keys, data.values, strict=True):
            got = handle.get(key)
            if got is None:
                missing += 1
            elif got != value:
                wrong += 1
            del got
        n = len(data.keys)
        if wrong:
            raise RuntimeError(f"{wrong} of {n} values read back {when} differ from what was set")
        if missing:
            raise ValueRefused(
                f"{name} kept {n - missing} of {n} {case.label} values (gets {when} missed)"
            )

    def _one_repeat(
        self, case: Case, handle: Handle, data: _Data, scale: float
    ) -> dict[str, float]:
        p = _PARAMS[self.profile.name]
        max_ops = int(p["ops"]) or 2 * len(data.keys)
        budget = self.profile.budget_ns(scale)
        size = int(case.params["bytes"])
        set_ops, set_ns = timed_sets(handle.set, data.keys, data.values, max_ops, budget)
        get_ops, get_ns, hits = timed_gets(handle.get, data.get_keys, max_ops, budget)
        set_rate = set_ops * 1e9 / set_ns if set_ns else 0.0
        get_rate = get_ops * 1e9 / get_ns if get_ns else 0.0
        return {
            "set_per_s": set_rate,
            "get_per_s": get_rate,
            "set_mb_per_s": set_rate * size / 1e6,
            "get_mb_per_s": get_rate * size / 1e6,
            "hit_rate": hits / get_ops if get_ops else 1.0,
            "set_ops": float(set_ops),
            "get_ops": float(get_ops),
        }

    def measure_backend(self, case: Case, backend: Backend) -> Measurement:
        """Store every key, time sets and gets, read every value back."""
        data = self.data(case)
        name = backend.name
        info: dict[str, Any] = {
            "limit": backend.limit(),
            "keys": len(data.keys),
            "value_bytes": int(case.params["bytes"]),
        }
        handle = backend.open()
        try:
            for key, value in zip(data.keys, data.values, strict=True):
                try:
                    handle.set(key, value)
                except Exception as exc:
                    raise ValueRefused(_refusal(name, case.label, exc)) from exc
            self._check(name, case, handle, data, "after storing them")
            info.update(self._where(case, backend))
            if self.profile.warmup:
                self._one_repeat(case, handle, data, 0.3)
            runs = repeat_runs(self.profile, lambda: self._one_repeat(case, handle, data, 1.0))
            self._check(name, case, handle, data, "after the timed runs")
        finally:
            handle.close()
        path = getattr(backend, "path", None)
        if backend.ours and isinstance(path, str):
            info["evictions"] = _nearcache_state(path)["evictions"]
        info["verified_values"] = len(data.keys)
        info["repeats"] = len(runs)
        summary = medians(runs)
        return Measurement(backend=name, metrics=summary, runs=runs, info=info)

    def _where(self, case: Case, backend: Backend) -> dict[str, Any]:
        """Where the values went (after the first store), and on which file system."""
        size = int(case.params["bytes"])
        path = getattr(backend, "path", None)
        if backend.ours and isinstance(path, str):
            state = _nearcache_state(path)
            threshold = int(getattr(backend, "threshold", 0)) or state["spill_threshold"]
            spilled, n = state["spilled_values"], len(self.data(case).keys)
            where = (
                "inline"
                if spilled == 0
                else "spilled"
                if spilled >= n
                else f"{spilled}/{n} spilled"
            )
            return {
                "stored": where,
                "spill_threshold": threshold,
                "max_entry_size": state["max_entry_size"],
                "shards": state["shards"],
                "fs": filesystem_type(Path(path).parent),
            }
        if backend.name == "diskcache":
            floor = int(import_module("diskcache").DEFAULT_SETTINGS["disk_min_file_size"])
            return {
                "stored": "file" if size >= floor else "SQLite row",
                "fs": filesystem_type(Path(str(getattr(backend, "directory", "")))),
            }
        if backend.name == "django-filebased":
            return {
                "stored": "file per key (pickle, zlib)",
                "fs": filesystem_type(Path(str(getattr(backend, "location", "")))),
            }
        if backend.scope is Scope.NETWORK:
            return {"stored": "server memory"}
        return {"stored": "in-process reference"}

    def extra_measurements(
        self, case: Case, ctx: BackendContext, skipped: dict[str, str]
    ) -> list[Measurement]:
        """The forced-inline and forced-spilled rows (when nearcache itself ran)."""
        for name, reason in list(skipped.items()):
            if reason.startswith(_REFUSED):
                skipped[name] = "refused: " + reason[len(_REFUSED) :]
        if case.id not in self._ours_ran:
            return []
        out: list[Measurement] = []
        for cls in (NearcacheInline, NearcacheSpilled):
            backend: Backend | None = None
            try:
                backend = cls(
                    ctx,
                    self.capacity(case),
                    _tag(self.name, case.id, cls.name),
                    int(case.params["keys"]),
                )
                out.append(self.measure_backend(case, backend))
            except ValueRefused as exc:
                skipped[cls.name] = f"refused: {exc}"
            except Exception as exc:
                skipped[cls.name] = "failed: " + _one_line(f"{type(exc).__name__}: {exc}")
            finally:
                if backend is not None:
                    backend.destroy()
        return out

    # -- output -------------------------------------------------------------------

    @staticmethod
    def _names(result: WorkloadResult) -> list[str]:
        present = {m.backend for c in result.cases for m in c.measurements}
        present |= {
            name
            for c in result.cases
            for name, reason in c.skipped.items()
            if reason.startswith("refused")
        }
        return [n for n in ORDER if n in present] + sorted(present - set(ORDER))

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        cases = result.cases
        names = self._names(result)
        if not cases or not names:
            return []
        ratio = "nearcache" in names and "diskcache" in names
        tradeoffs = {**tradeoffs, **TRADEOFFS}
        out: list[Table] = []
        for metric, label in (("get_per_s", "get/s"), ("set_per_s", "set/s")):
            cols = ["value", "keys", *names]
            if ratio:
                cols.append("nearcache ÷ diskcache")
            rows: list[list[str]] = []
            for c in cases:
                row = [c.label, str(c.params.get("keys", ""))]
                for name in names:
                    m = c.get(name)
                    row.append(fmt_int(m.metrics[metric]) if m else _missing(c.skipped.get(name)))
                if ratio:
                    ours, theirs = c.get("nearcache"), c.get("diskcache")
                    row.append(
                        fmt_ratio(ours.metrics[metric] / theirs.metrics[metric])
                        if ours and theirs and theirs.metrics[metric] > 0
                        else "-"
                    )
                rows.append(row)
            figures = {
                f"{label} {c.label}": [(m.backend, m.metrics[metric]) for m in c.measurements]
                for c in cases
            }
            notes = loss_notes(
                figures, "nearcache" if "nearcache" in names else None, tradeoffs, fmt=fmt_int
            )
            if metric == "get_per_s":
                notes = self._notes(result, names) + notes
            out.append(
                Table(
                    f"value-sizes: {label} by value size (one process, working set held)",
                    cols,
                    rows,
                    right=set(range(1, len(cols))),
                    notes=notes,
                )
            )
        rows = []
        for c in cases:
            row = [c.label]
            for name in names:
                m = c.get(name)
                row.append(
                    f"{_fmt_mb(m.metrics['get_mb_per_s'])} / {_fmt_mb(m.metrics['set_mb_per_s'])}"
                    if m
                    else _missing(c.skipped.get(name))
                )
            rows.append(row)
        out.append(
            Table(
                "value-sizes: MB/s by value size, get / set (dict and cachetools return a "
                "reference: no bytes move)",
                ["value", *names],
                rows,
                right=set(range(1, len(names) + 1)),
            )
        )
        detail: list[list[str]] = []
        for c in cases:
            for name in names:
                m = c.get(name)
                if m is None:
                    continue
                mm = m.metrics
                detail.append(
                    [
                        c.label,
                        name,
                        fmt_int(mm["get_per_s"]),
                        fmt_int(mm["set_per_s"]),
                        _fmt_mb(mm["get_mb_per_s"]),
                        _fmt_mb(mm["set_mb_per_s"]),
                        f"{mm['hit_rate']:.3f}",
                        str(m.info.get("stored", "")),
                        str(m.info.get("fs", "")),
                        str(m.info.get("limit", "")),
                    ]
                )
        out.append(
            Table(
                "value-sizes: every figure, where the values were stored, and each store's bound",
                [
                    "value",
                    "backend",
                    "get/s",
                    "set/s",
                    "get MB/s",
                    "set MB/s",
                    "hit rate",
                    "stored as",
                    "file system",
                    "limit",
                ],
                detail,
                right={2, 3, 4, 5, 6},
                terminal=False,
            )
        )
        return out

    @staticmethod
    def _notes(result: WorkloadResult, names: list[str]) -> list[str]:
        notes: list[str] = []
        ours = _first(result, "nearcache")
        if ours is not None:
            notes.append(
                "nearcache keeps values of up to "
                f"{format_bytes(int(ours.info.get('spill_threshold', 0)))} in shared memory "
                "when they fit in a shard (largest entry of its "
                f"{ours.info.get('limit', '?')}: "
                f"{format_bytes(int(ours.info.get('max_entry_size', 0)))}), larger ones in "
                f"spill files; {INLINE} keeps every value in shared memory, {SPILLED} "
                "every value in a file."
            )
            stored = [
                f"{c.label} {m.info.get('stored')}"
                for c in result.cases
                if (m := c.get("nearcache")) is not None
            ]
            notes.append("nearcache stored: " + ", ".join(stored) + ".")
        filesystems = sorted(
            {str(m.info["fs"]) for c in result.cases for m in c.measurements if m.info.get("fs")}
        )
        if filesystems:
            notes.append(
                "Files of nearcache and the file-based peers on: " + ", ".join(filesystems) + "."
            )
        for c in result.cases:
            for m in c.measurements:
                if m.metrics.get("hit_rate", 1.0) < 1.0:
                    notes.append(
                        f"{m.backend} missed gets at {c.label} (hit rate "
                        f"{m.metrics['hit_rate']:.3f}): its rates are not comparable."
                    )
                if m.info.get("evictions"):
                    notes.append(f"{m.backend} evicted {m.info['evictions']} entries at {c.label}.")
        shown = set(names)
        for c in result.cases:
            for name, reason in sorted(c.skipped.items()):
                if name in shown or name in ORDER:
                    notes.append(f"{name} at {c.label}: {reason}")
        return notes

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        if not result.cases:
            return []
        panels = []
        for metric, label in (("get_mb_per_s", "get"), ("set_mb_per_s", "set")):
            series: dict[str, list[tuple[float, float]]] = {}
            for c in result.cases:
                for m in c.measurements:
                    series.setdefault(m.backend, []).append(
                        (float(c.params.get("bytes", 0)), m.metrics.get(metric, 0.0))
                    )
            panels.append((label, series))
        marks: list[tuple[float, str]] = []
        ours = _first(result, "nearcache")
        if ours is not None:
            threshold = float(ours.info.get("spill_threshold", 0))
            largest = float(ours.info.get("max_entry_size", 0))
            if threshold:
                marks.append((threshold, f"spill threshold ({format_bytes(int(threshold))})"))
            if largest:
                marks.append(
                    (
                        largest,
                        f"largest inline entry, {ours.info.get('limit', '')} "
                        f"({format_bytes(int(largest))})",
                    )
                )
        return [
            size_lines(
                outdir / "value-sizes.png",
                "value-sizes: MB/s against value size, one process (higher is better; "
                "dict and cachetools return a reference, no copy)",
                panels,
                "MB/s (log scale)",
                ours=ours_names() | {INLINE, SPILLED},
                marks=marks,
                dashes={INLINE: "--", SPILLED: ":"},
            )
        ]


def _first(result: WorkloadResult, name: str) -> Measurement | None:
    """The first measurement of backend ``name`` in ``result``."""
    for c in result.cases:
        m = c.get(name)
        if m is not None:
            return m
    return None


def _missing(reason: str | None) -> str:
    """The cell of a backend without figures: refused, failed, or not run."""
    if reason is None:
        return "-"
    if reason.startswith("refused"):
        return "refused"
    if reason.startswith("failed"):
        return "failed"
    return "-"


def _fmt_mb(mb_per_s: float) -> str:
    """MB/s with three significant digits below 100."""
    if mb_per_s >= 100:
        return f"{mb_per_s:,.0f}"
    return f"{mb_per_s:.3g}"
