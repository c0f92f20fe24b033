"""nearcache itself: the native bytes path, the full Python API, the tiered cache.

Sizing.  nearcache is bounded by the size of its file, not by an entry count.
When a workload asks for a byte budget, the file is exactly that size.  When
it asks for an entry count (``django-8proc``: "caches limited to 1,000 keys"),
:func:`calibrate_size` finds the smallest file that holds that many entries
of the workload's key and value sizes before its first eviction, by inserting
distinct keys into trial files and bisecting on the size.  That matches
Django's ``MAX_ENTRIES`` (a ceiling that culling keeps the count under).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from .base import Backend, BackendContext, Capacity, Handle, Scope, format_bytes, import_module
from .registry import register

__all__ = ["NearcacheCache", "NearcacheNative", "NearcacheTiered", "calibrate_size"]

#: File size used when a workload sets no bound (roomy enough for every workload).
UNBOUNDED_SIZE = 64 * 1024 * 1024

_calibrated: dict[tuple[int, int, int], int] = {}


def _nearcache_dir(ctx: BackendContext) -> Path:
    configured = ctx.options.get("nearcache_dir")
    if configured:
        path = Path(str(configured))
    else:
        path = Path(import_module("nearcache._native").default_directory())
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def _peak_entries(native: Any, path: str, size: int, key_len: int, value: bytes, limit: int) -> int:
    """Entries a fresh file of ``size`` bytes holds before its first eviction."""
    try:
        cache = native.NativeCache(path, size, recreate=True)
    except Exception:
        return 0  # too small for the engine to create
    try:
        peak = 0
        for i in range(limit):
            key = f"calibrate:{i}".ljust(key_len, "x")
            try:
                cache.set(key, value)
            except Exception:
                return peak
            n = len(cache)
            if n <= peak:  # something was evicted
                return peak
            peak = n
        return peak
    finally:
        cache.close()
        with contextlib.suppress(OSError):
            os.unlink(path)


def calibrate_size(directory: Path, items: int, key_len: int, value_len: int) -> int:
    """Smallest file size (to ~2%) that holds ``items`` such entries before evicting.

    Results are memoized per (items, key_len, value_len).
    """
    key = (items, key_len, value_len)
    cached = _calibrated.get(key)
    if cached is not None:
        return cached
    native = import_module("nearcache._native")
    path = str(directory / f"calibrate-{os.getpid()}")
    value = b"v" * value_len
    limit = items + 1
    lo = max(4096, items * (key_len + value_len))
    hi = lo * 2
    while _peak_entries(native, path, hi, key_len, value, limit) < items:
        lo = hi
        hi *= 2
        if hi > 1 << 34:
            raise RuntimeError(f"cannot size a nearcache file for {items} entries")
    while hi - lo > max(4096, hi // 50):
        mid = (lo + hi) // 2
        if _peak_entries(native, path, mid, key_len, value, limit) >= items:
            hi = mid
        else:
            lo = mid
    _calibrated[key] = hi
    return hi


def nearcache_file_size(ctx: BackendContext, capacity: Capacity) -> tuple[int, str]:
    """File size for ``capacity`` and a description of the bound."""
    if capacity.bytes is not None:
        return capacity.bytes, f"{format_bytes(capacity.bytes)} file"
    if capacity.items is not None:
        size = calibrate_size(
            _nearcache_dir(ctx), capacity.items, capacity.key_bytes, capacity.value_bytes
        )
        return size, f"{format_bytes(size)} file (holds ~{capacity.items:,} entries)"
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
        with contextlib.suppress(OSError):
            os.unlink(self.path)


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
        with contextlib.suppress(OSError):
            os.unlink(self.path)
