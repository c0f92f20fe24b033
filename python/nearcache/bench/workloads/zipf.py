"""``zipf``: hit ratio and throughput under a skewed popularity, where eviction policy shows.

Keys are drawn with Zipf(0.99) popularity over a key space five times the
cache's capacity; every request is cache-aside (get, and set on a miss).
The ``zipf+scan`` case mixes in one-time keys (a sequential scan, 20% of
requests) that a good policy keeps from flushing the popular keys.

Every bounded backend holds about the same number of entries: an LRU gets
``maxsize=C``, Django ``MAX_ENTRIES=C``, nearcache a file calibrated to hold C
such entries before its first eviction.  Unbounded backends keep every key,
so their hit ratio is the ceiling (only first requests miss).
"""

from __future__ import annotations

import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity, Handle
from ..backends.registry import network_names, ours_names
from ..data import ZipfSampler, binary_values
from ..model import Measurement, WorkloadResult
from ..plots import barh_panels
from ..report import Table, fmt_int, fmt_ratio, loss_notes, pick_reference, skipped_note
from .base import Case, Workload, medians

__all__ = ["Zipf", "lru_hit_ratio"]

_PARAMS: dict[str, dict[str, Any]] = {
    # capacity: entries; space: key space / capacity; warm: warm-up requests / capacity.
    "tiny": {"capacity": 100, "space": 5, "warm": 3, "ops": 2_000, "s": 0.99},
    "quick": {"capacity": 1_000, "space": 5, "warm": 3, "ops": 40_000, "s": 0.99},
    "default": {"capacity": 5_000, "space": 5, "warm": 4, "ops": 400_000, "s": 0.99},
}
VALUE_BYTES = 100
KEY_BYTES = 10
SCAN_SHARE = 0.2
_CHUNK = 256


def lru_hit_ratio(keys: Sequence[str], capacity: int, warm: int) -> float:
    """Exact LRU hit ratio of cache-aside requests ``keys[warm:]`` (after ``keys[:warm]``)."""
    cache: OrderedDict[str, None] = OrderedDict()
    hits = 0
    for i, key in enumerate(keys):
        if key in cache:
            cache.move_to_end(key)
            if i >= warm:
                hits += 1
        else:
            cache[key] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    measured = len(keys) - warm
    return hits / measured if measured else 0.0


def _cache_aside(
    handle: Handle,
    keys: Sequence[str],
    value: bytes,
    start: int,
    max_ops: int,
    budget_ns: int | None,
) -> tuple[int, int, int]:
    """Run requests from ``keys[start:]``; return (requests, hits, elapsed ns)."""
    get, set_ = handle.get, handle.set
    clock = time.perf_counter_ns
    done = hits = elapsed = 0
    pos = start
    n = len(keys)
    size = 4
    while done < max_ops and pos < n:
        chunk = keys[pos : pos + min(size, max_ops - done)]
        size = min(size * 2, _CHUNK)
        h = 0
        t0 = clock()
        for key in chunk:
            if get(key) is None:
                set_(key, value)
            else:
                h += 1
        elapsed += clock() - t0
        done += len(chunk)
        hits += h
        pos += len(chunk)
        if budget_ns is not None and elapsed >= budget_ns:
            break
    return done, hits, elapsed


class Zipf(Workload):
    """Cache-aside requests with Zipf(0.99) popularity over 5x the capacity."""

    name = "zipf"
    title = "hit ratio and throughput under Zipf(0.99) popularity (eviction policy)"
    seed = ""
    description = (
        "Cache-aside requests (get, set on a miss) for 10-byte keys with 100-byte values, "
        "Zipf(0.99) popularity over a key space 5x the capacity. 'zipf+scan' replaces 20% of "
        "requests with a sequential scan of keys used once. Bounded backends hold about the "
        "same number of entries; hit ratios are measured after a warm-up of several times "
        "the capacity. 'LRU (exact)' is a simulated LRU of the same capacity on the same "
        "requests."
    )

    def params(self) -> dict[str, Any]:
        return dict(_PARAMS[self.profile.name])

    def cases(self) -> list[Case]:
        return [
            Case("zipf", "Zipf 0.99", {"scan": 0.0}),
            Case("zipf+scan", "Zipf 0.99 + 20% scan", {"scan": SCAN_SHARE}),
        ]

    def capacity(self, case: Case) -> Capacity:
        p = _PARAMS[self.profile.name]
        return Capacity(
            items=p["capacity"],
            entry_bytes=KEY_BYTES + VALUE_BYTES,
            key_bytes=KEY_BYTES,
            value_bytes=VALUE_BYTES,
        )

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        cap = p["capacity"]
        space = cap * p["space"]
        rng = random.Random(f"{self.rng_seed}:zipf")
        names = [f"z:{i:08d}" for i in range(space)]
        rng.shuffle(names)  # popularity rank -> key, unrelated to key order
        self.value = binary_values(rng, 1, VALUE_BYTES, 0.0)[0]
        total = cap * p["warm"] + p["ops"]
        self.warm = cap * p["warm"]
        sampler = ZipfSampler(space, p["s"])
        self.requests: dict[str, list[str]] = {}
        self.lru: dict[str, float] = {}
        for case in self.cases():
            crng = random.Random(f"{self.rng_seed}:zipf:{case.id}")
            ranks = sampler.sample(crng, total)
            keys = [names[r] for r in ranks]
            share = float(case.params["scan"])
            if share:
                scan = 0
                for i in range(total):
                    if crng.random() < share:
                        keys[i] = f"s:{scan:08d}"
                        scan += 1
            self.requests[case.id] = keys
            self.lru[case.id] = lru_hit_ratio(keys, cap, self.warm)

    def measure(self, case: Case, backend: Backend) -> Measurement:
        p = _PARAMS[self.profile.name]
        keys = self.requests[case.id]
        handle = backend.open()
        try:
            warmed, _, _ = _cache_aside(
                handle, keys, self.value, 0, self.warm, self.profile.budget_ns(10.0)
            )
            runs: list[dict[str, float]] = []
            pos = self.warm
            remaining = p["ops"]
            total_req = total_hits = 0
            started = time.perf_counter()
            for _ in range(self.profile.repeats):
                per_run = max(1, p["ops"] // self.profile.repeats)
                n, hits, ns = _cache_aside(
                    handle, keys, self.value, pos, min(per_run, remaining), self.profile.budget_ns()
                )
                pos += n
                remaining -= n
                total_req += n
                total_hits += hits
                runs.append(
                    {
                        "ops_per_s": n * 1e9 / ns if ns else 0.0,
                        "requests": float(n),
                        "hit_ratio": hits / n if n else 0.0,
                    }
                )
                cs = self.profile.case_seconds
                if remaining <= 0 or (cs is not None and time.perf_counter() - started > cs):
                    break
        finally:
            handle.close()
        summary = medians(runs)
        return Measurement(
            backend=backend.name,
            metrics={
                "ops_per_s": summary["ops_per_s"],
                "hit_ratio": total_hits / total_req if total_req else 0.0,
                "requests": float(total_req),
                "warmup_requests": float(warmed),
                "lru_hit_ratio": self.lru[case.id],
            },
            runs=runs,
            info={"limit": backend.limit(), "repeats": len(runs)},
        )

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        cases = result.cases
        if not cases:
            return []
        names = sorted({m.backend for c in cases for m in c.measurements})
        reference = pick_reference(names)
        cols = ["backend"]
        for c in cases:
            cols += [f"hit ratio, {c.label}", f"requests/s, {c.label}"]
        if reference:
            cols.append(f"requests/s vs {reference} ({cases[0].label})")
        cols.append("limit")
        rows = []
        lru_row = ["LRU (exact, simulated)"]
        for c in cases:
            lru = c.measurements[0].metrics["lru_hit_ratio"] if c.measurements else 0.0
            lru_row += [f"{lru:.3f}", ""]
        if reference:
            lru_row.append("")
        lru_row.append(f"{fmt_int(float(result.params.get('capacity', 0)))} entries")
        first_ref = cases[0].get(reference) if reference else None
        order = sorted(
            names,
            key=lambda n: -(cases[0].get(n).metrics["hit_ratio"] if cases[0].get(n) else 0.0),  # type: ignore[union-attr]
        )
        notes: list[str] = []
        for name in order:
            row = [name]
            limit = ""
            for c in cases:
                m = c.get(name)
                if m is None:
                    row += ["-", "-"]
                    continue
                limit = str(m.info.get("limit", ""))
                warm_short = m.metrics["warmup_requests"] < self.warm_requests(result)
                row += [
                    f"{m.metrics['hit_ratio']:.3f}" + ("*" if warm_short else ""),
                    fmt_int(m.metrics["ops_per_s"]),
                ]
                if warm_short:
                    notes.append(
                        f"* {name} ({c.label}) warmed up with {m.metrics['warmup_requests']:.0f} "
                        "requests only (time budget); its hit ratio is not comparable."
                    )
            if reference:
                m0 = cases[0].get(name)
                row.append(
                    fmt_ratio(m0.metrics["ops_per_s"] / first_ref.metrics["ops_per_s"])
                    if m0 and first_ref and first_ref.metrics["ops_per_s"]
                    else "-"
                )
            row.append(limit)
            rows.append(row)
        rows.insert(0, lru_row)
        bounded = {
            m.backend
            for c in cases
            for m in c.measurements
            if not str(m.info.get("limit", "")).startswith("unbounded")
            and "1 GiB (default" not in str(m.info.get("limit", ""))
        }
        hit_figures = {
            f"hit ratio {c.label}": [
                (m.backend, m.metrics["hit_ratio"]) for m in c.measurements if m.backend in bounded
            ]
            for c in cases
        }
        notes.extend(
            loss_notes(
                hit_figures,
                reference,
                {n: "evicts by exact recency (LRU) per entry" for n in names},
                fmt=lambda v: f"{v:.3f}",
                min_ratio=1.01,
            )
        )
        rate_figures = {
            f"requests/s {c.label}": [(m.backend, m.metrics["ops_per_s"]) for m in c.measurements]
            for c in cases
        }
        notes.extend(loss_notes(rate_figures, reference, tradeoffs, fmt=fmt_int))
        for c in cases:
            notes.extend(skipped_note(c))
        unbounded = sorted(set(names) - bounded)
        if unbounded:
            notes.append(
                "Unbounded (keep every key; their hit ratio is the ceiling): "
                + ", ".join(unbounded)
                + "."
            )
        right = set(range(1, len(cols) - 1))
        return [
            Table(
                f"zipf: cache-aside hit ratio and requests/s, capacity "
                f"{fmt_int(float(result.params.get('capacity', 0)))} entries, key space "
                f"{result.params.get('space', '?')}x",
                cols,
                rows,
                right=right,
                notes=notes,
            )
        ]

    @staticmethod
    def warm_requests(result: WorkloadResult) -> int:
        """Warm-up requests the profile asked for."""
        return int(result.params.get("capacity", 0)) * int(result.params.get("warm", 0))

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        panels = []
        xlabels = []
        for c in result.cases:
            pairs = [(m.backend, m.metrics["hit_ratio"]) for m in c.measurements]
            if c.measurements:
                pairs.append(("LRU (exact)", c.measurements[0].metrics["lru_hit_ratio"]))
            panels.append((f"hit ratio, {c.label}", pairs))
            xlabels.append("hit ratio (hits / requests)")
        for c in result.cases:
            panels.append(
                (
                    f"requests/s, {c.label}",
                    [(m.backend, m.metrics["ops_per_s"]) for m in c.measurements],
                )
            )
            xlabels.append("requests per second")
        if not panels:
            return []
        return [
            barh_panels(
                outdir / "zipf.png",
                "zipf: hit ratio and cache-aside requests per second",
                panels,
                "hit ratio / requests per second",
                xlabels=xlabels,
                ours=ours_names(),
                network=network_names(),
                log=True,
                fmt="{:,.3g}",
            )
        ]
