"""nearcache itself: the native bytes path, the full Python API, the tiered cache.

Sizing.  nearcache is bounded by the size of its file, not by an entry count.
When a workload asks for a byte budget, the file is exactly that size.  When
it asks for an entry count (``django-8proc``: "caches limited to 1,000 keys"),
:func:`calibrate_size` finds the smallest file that holds that many entries
of the workload's key and value sizes *on average once full*, by replaying
the workload's pattern of writes into trial files and bisecting on the size:
distinct keys, or, when the workload's sets rewrite keys of a fixed key
space (``Capacity.key_space``), sets of random keys from that space, whose
replaced entries take space until the next compaction.  That is what an LRU
with ``maxsize`` holds (exactly that many, once full).  Sizing for the
peak before the first eviction, as the harness once did, left the file
holding about 10% fewer on average: every compaction frees part of a shard,
so a full file's count is a sawtooth below its peak.  Trial keys are exactly
the workload's key length (they once were a few bytes longer).  Calibrating
with distinct keys only made the ``django-8proc`` file (1,100 keys, sets
rewriting them) hold 9% fewer entries than asked.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
from pathlib import Path
from typing import Any

from .base import Backend, BackendContext, Capacity, Handle, Scope, format_bytes, import_module
from .registry import register

__all__ = [
    "NearcacheCache",
    "NearcacheNative",
    "NearcacheTiered",
    "calibrate_size",
    "calibration_key",
    "held_entries",
    "nearcache_directory",
    "remove_cache_file",
]

#: File size used when a workload sets no bound (roomy enough for every workload).
UNBOUNDED_SIZE = 64 * 1024 * 1024

_calibrated: dict[tuple[int, int, int, int | None], int] = {}


def nearcache_directory(ctx: BackendContext) -> Path:
    """The directory of nearcache's files in this run (``--nearcache-dir``, else the default)."""
    return _nearcache_dir(ctx)


def remove_cache_file(path: str) -> None:
    """Remove a cache file and its spill directory (``<file>.spill/``: values kept in files)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    shutil.rmtree(path + ".spill", ignore_errors=True)


def _nearcache_dir(ctx: BackendContext) -> Path:
    configured = ctx.options.get("nearcache_dir")
    if configured:
        path = Path(str(configured))
    else:
        path = Path(import_module("nearcache._native").default_directory())
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def calibration_key(index: int, key_len: int) -> str:
    """The ``index``-th distinct key of exactly ``key_len`` characters.

    (Longer only when ``key_len`` hex digits cannot count that far.)
    """
    digits = format(index, "x")
    return digits.rjust(key_len, "k") if len(digits) <= key_len else digits


def held_entries(
    native: Any,
    path: str,
    size: int,
    key_len: int,
    value: bytes,
    items: int,
    key_space: int | None = None,
) -> tuple[float, int, int]:
    """Entries a file of ``size`` bytes holds at steady state: (mean, min, max).

    Without ``key_space``: inserts ``items`` distinct keys, then ``2 * items``
    more.  With it: stores keys ``0 .. key_space - 1``, then sets ``3 * items``
    keys drawn at random (seeded) from that space, as a workload rewriting a
    fixed set of keys does.  The entries (``len``) are counted after each of
    the last ``2 * items`` writes (every ``items // 500``-th for large
    counts).  Once the file is full every write evicts or leaves a replaced
    entry behind, and each compaction frees part of a shard, so the count is
    a sawtooth; its mean is what an LRU of ``maxsize=items`` holds exactly.
    (0, 0, 0) if the engine cannot create a file that small.

    Counted with lenient admission (SIEVE), what a shard settles in where
    recency pays: an adaptive shard admits strictly while it warms up, and
    a strict compaction frees half as much, so the count would follow how
    far this short, write-only run got into its warm-up rather than what
    the file holds in the workload it is sized for.
    """
    try:
        cache = native.NativeCache(path, size, recreate=True)
        cache.set_eviction_mode("lenient")
    except Exception:
        return 0.0, 0, 0
    if key_space is None:
        writes = [calibration_key(i, key_len) for i in range(3 * items)]
    else:
        rng = random.Random(f"calibrate:{items}:{key_space}")
        space = [calibration_key(i, key_len) for i in range(key_space)]
        writes = space + [rng.choice(space) for _ in range(3 * items)]
    try:
        step = max(1, items // 500)
        counts: list[int] = []
        first_counted = len(writes) - 2 * items
        for i, key in enumerate(writes):
            try:
                cache.set(key, value)
            except Exception:
                return 0.0, 0, 0
            if i >= first_counted and i % step == 0:
                counts.append(len(cache))
        return sum(counts) / len(counts), min(counts), max(counts)
    finally:
        cache.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def calibrate_size(
    directory: Path, items: int, key_len: int, value_len: int, key_space: int | None = None
) -> int:
    """The file size whose entries held at steady state average closest to ``items``.

    A binary search down to ~2% of the size (one page per shard for small
    files, where a step can be 5% of the entries), then the closer of the two
    sizes it ends between: the cache compared with an LRU of ``maxsize=items``
    holds as many entries, not up to one step more.  ``key_space``: see
    :func:`held_entries`.  Results are memoized per (items, key_len,
    value_len, key_space).
    """
    key = (items, key_len, value_len, key_space)
    cached = _calibrated.get(key)
    if cached is not None:
        return cached
    native = import_module("nearcache._native")
    path = str(directory / f"calibrate-{os.getpid()}")
    value = b"v" * value_len
    held: dict[int, float] = {}

    def holds(size: int) -> bool:
        held[size] = held_entries(native, path, size, key_len, value, items, key_space)[0]
        return held[size] >= items

    lo = max(4096, items * (key_len + value_len))
    hi = lo * 2
    while not holds(hi):
        lo = hi
        hi *= 2
        if hi > 1 << 34:
            raise RuntimeError(f"cannot size a nearcache file for {items} entries")
    while hi - lo > max(4096, hi // 50):
        mid = (lo + hi) // 2
        if holds(mid):
            hi = mid
        else:
            lo = mid
    best = hi
    if lo in held and held[lo] > 0 and items - held[lo] < held[hi] - items:
        best = lo
    _calibrated[key] = best
    return best


def nearcache_file_size(ctx: BackendContext, capacity: Capacity) -> tuple[int, str]:
    """File size for ``capacity`` and a description of the bound."""
    if capacity.bytes is not None:
        return capacity.bytes, f"{format_bytes(capacity.bytes)} file"
    if capacity.items is not None:
        size = calibrate_size(
            _nearcache_dir(ctx),
            capacity.items,
            capacity.key_bytes,
            capacity.value_bytes,
            capacity.key_space,
        )
        return size, f"{format_bytes(size)} file (holds ~{capacity.items:,} entries on average)"
    return UNBOUNDED_SIZE, f"{format_bytes(UNBOUNDED_SIZE)} file"


class _NearcacheFileBackend(Backend):
    """Shared setup of the backends that own one nearcache file."""

    scope = Scope.HOST
    dist = "nearcache"
    ours = True

    def setup(self) -> None:
        self.size, self._limit = nearcache_file_size(self.ctx, self.capacity)
        self.path = str(_nearcache_dir(self.ctx) / f"bench-{self.ctx.run_id}-{self.tag}")
        native = import_module("nearcache._native")
        native.NativeCache(self.path, self.size, recreate=True).close()

    def clear(self) -> None:
        import_module("nearcache._native").NativeCache(self.path, self.size).clear()

    def destroy(self) -> None:
        remove_cache_file(self.path)


@register
class NearcacheNative(_NearcacheFileBackend):
    """``nearcache._native.NativeCache``: the engine's raw bytes path."""

    name = "nearcache-native"
    title = "nearcache._native.NativeCache (shared memory, raw bytes path)"
    requires = ("nearcache._native",)
    tradeoff = "is the engine without the Python layer: bytes values only, no serializer"

    def open(self) -> Handle:
        cache = import_module("nearcache._native").NativeCache(self.path, self.size)
        return Handle(get=cache.get, set=cache.set, delete=cache.delete, close=cache.close)


@register
class NearcacheCache(_NearcacheFileBackend):
    """``nearcache.Cache``: the public Python API (native types, pickle for the rest)."""

    name = "nearcache"
    title = "nearcache.Cache (shared memory, full Python API)"
    requires = ("nearcache._native", "nearcache.cache")
    stores_objects = True

    @classmethod
    def unavailable(cls, ctx: BackendContext) -> str | None:
        reason = super().unavailable(ctx)
        if reason is None and not hasattr(import_module("nearcache"), "Cache"):
            reason = "nearcache.Cache is not exported yet"
        return reason

    def open(self) -> Handle:
        cache = import_module("nearcache").Cache(path=self.path, size=self.size)
        return Handle(get=cache.get, set=cache.set, delete=cache.delete, close=cache.close)


@register
class NearcacheTiered(Backend):
    """``nearcache.tiered.TieredCache``: nearcache as L1 in front of Redis as L2."""

    name = "tiered"
    title = "nearcache.tiered.TieredCache (nearcache L1 over Redis L2, pub/sub invalidation)"
    scope = Scope.NETWORK
    requires = ("nearcache._native", "nearcache.drivers", "nearcache.tiered", "redis")
    server = "redis"
    dist = "nearcache"
    stores_objects = True
    ours = True

    def setup(self) -> None:
        self.size, l1_limit = nearcache_file_size(self.ctx, self.capacity)
        self.path = str(_nearcache_dir(self.ctx) / f"bench-{self.ctx.run_id}-{self.tag}")
        self.prefix = f"nearcache-bench:{self.ctx.run_id}:{self.tag}:"
        self._limit = f"L1 {l1_limit}; L2 unbounded"
        self._close(self._build())

    def _build(self) -> Any:
        drivers = import_module("nearcache.drivers")
        l1 = drivers.ShmDriver(path=self.path, size=self.size)
        l2 = drivers.RedisDriver(str(self.ctx.redis_url), prefix=self.prefix)
        return import_module("nearcache.tiered").TieredCache(l1, l2)

    @staticmethod
    def _close(cache: Any) -> None:
        """Stop the invalidation listener and close both tiers."""
        cache.close()

    def open(self) -> Handle:
        cache = self._build()
        return Handle(
            get=cache.get, set=cache.set, delete=cache.delete, close=lambda: self._close(cache)
        )

    def clear(self) -> None:
        cache = self._build()
        try:
            cache.clear()
        finally:
            self._close(cache)

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.clear()
        remove_cache_file(self.path)
