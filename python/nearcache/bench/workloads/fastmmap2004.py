"""``fastmmap-2004``: the 2004 Perl caching modules comparison (seed 001).

For binary values averaging about 147, 465 and 1628 bytes and for "complex"
values (dicts averaging 5, 16 and 55 keys, pickled by the harness for the
backends that only store bytes, as Storable did for the Perl modules; binary
values are stored as given by every backend):

- Set/s: store N distinct keys, in order;
- Get/s: gets, 85% of stored keys and 15% of keys never stored;
- Mix/s: 15% sets of stored keys, 85% gets (85% stored / 15% never stored);
- GHitR / MHitR: the hit rate over gets of stored keys during Get and Mix.

Every backend gets the same memory budget, small enough that the largest
values do not all fit, so hit rates differ as in the study: a file or
``size_limit`` of that many bytes, or an entry count of budget / (key +
mean value size) for caches bounded by count.  Backends without a bound keep
everything (hit rate 1.0), like BerkeleyDB and SDBM in the study.

Three more binary cases go beyond the study, with the sizes of seed 003's
objects: an HTML page (59 KiB), a script (295 KiB) and an image (1.2 MiB),
every value of exactly that size, over fewer keys (the first N of the same
keys; ``large_keys`` in the parameters).  Their budget holds the working set
twice (2 x N x (key + value) bytes, mapped to each backend as above: a
nearcache file of that size, a diskcache ``size_limit``, 2 x N entries for
the count-bounded caches), so nothing is evicted and the cases compare rates:
nearcache keeps the 59 KiB values in shared memory and spills the larger
ones to files (its spill budget, 1 GiB by default, holds them too).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity, Handle
from ..backends.registry import network_names, ours_names
from ..data import binary_values, complex_values, pickled_size, uuid_keys
from ..model import Measurement, WorkloadResult
from ..plots import barh_panels
from ..report import Table, fmt_bytes, fmt_int, fmt_ratio, loss_notes, pick_reference, skipped_note
from .base import (
    GET,
    GET_MISS,
    SET,
    Case,
    Workload,
    medians,
    object_handle,
    repeat_runs,
    timed_loop,
)
from .value_sizes import SEED_003_SIZES

__all__ = ["Fastmmap2004"]

BIN_SIZES = (147, 465, 1628)
COMPLEX_KEYS = (5, 16, 55)

_PARAMS: dict[str, dict[str, int]] = {
    # keys: N stored keys; ops: ceiling of one get or mix run; bytes_per_key: budget / N;
    # large_keys: keys of the seed 003 cases (59 KiB, 295 KiB, 1.2 MiB values).
    "tiny": {"keys": 120, "absent": 60, "ops": 600, "bytes_per_key": 832, "large_keys": 6},
    "quick": {"keys": 300, "absent": 150, "ops": 100_000, "bytes_per_key": 832, "large_keys": 24},
    "default": {
        "keys": 1_500,
        "absent": 750,
        "ops": 1_000_000,
        "bytes_per_key": 832,
        "large_keys": 100,
    },
}


_OUR_OVERHEAD = (
    "nearcache's file of the same size also holds its slot index, a 16-byte header per entry, "
    "space left by overwritten entries until the next compaction, and the 10% of a shard "
    "that a compaction frees"
)


def hit_rate_why(limit: str) -> str:
    """Why a backend with bound ``limit`` keeps more entries than nearcache's file of equal size."""
    if limit.startswith(("maxsize", "MAX_ENTRIES")):
        return (
            "is bounded by an entry count (budget / (key + value bytes)) that does not charge "
            "it for its own per-entry memory, while " + _OUR_OVERHEAD
        )
    if limit.startswith("size_limit"):
        return "measures its size_limit by its SQLite file and value files, while " + _OUR_OVERHEAD
    return "is charged differently for the same budget"


def _is_large(case: Case) -> bool:
    """Whether ``case`` is one of the seed 003 sizes (its own keys and budget)."""
    return bool(case.params.get("large"))


def _is_binary(case: Case) -> bool:
    """Whether ``case`` stores byte strings.

    Byte strings go to every backend as they are: pickling them for the
    backends that take only bytes (as complex values are) would time
    ``pickle.loads`` on every get of those backends alone.
    """
    return bool(case.params["type"] == "bin")


class Fastmmap2004(Workload):
    """Set/s, Get/s, Mix/s and hit rates under a memory budget that forces eviction."""

    name = "fastmmap-2004"
    title = "Set/Get/Mix rates and hit rates under eviction (Cache::FastMmap, 2004)"
    seed = "seed 001, 'Comparison of different PERL caching modules' (2004)"
    description = (
        "Binary values of about 147/465/1628 bytes (sizes uniform within +-50%) and complex "
        "values (dicts averaging 5/16/55 keys). Set/s stores N distinct UUID keys in order; "
        "Get/s draws 85% stored and 15% never-stored keys; Mix/s does 15% sets and 85% gets. "
        "GHitR/MHitR are hit rates over gets of stored keys. Every backend gets the same "
        "memory budget (N x 832 bytes), so the largest values force eviction. Binary values "
        "are stored as given; for backends that store only bytes, complex values are "
        "pickled, as the Perl modules used Storable. Beyond the study: binary values of "
        "exactly 59 KiB, 295 KiB and 1.2 MiB (seed 003's page, script and image) over fewer "
        "keys, with a budget of twice their working set (nothing evicted)."
    )

    def params(self) -> dict[str, Any]:
        p: dict[str, Any] = dict(_PARAMS[self.profile.name])
        p["budget_bytes"] = p["keys"] * p["bytes_per_key"]
        p["large_sizes"] = [s.bytes for s in SEED_003_SIZES]
        return p

    def cases(self) -> list[Case]:
        out = [Case(f"bin-{n}", f"bin {n}", {"type": "bin", "cmplx": n}) for n in BIN_SIZES]
        out += [
            Case(f"complex-{n}", f"complex {n}", {"type": "complex", "cmplx": n})
            for n in COMPLEX_KEYS
        ]
        large_keys = _PARAMS[self.profile.name]["large_keys"]
        out += [
            Case(
                f"bin-{s.id}",
                f"bin {s.label}",
                {
                    "type": "bin",
                    "cmplx": s.bytes,
                    "size": s.label,
                    "large": True,
                    "keys": large_keys,
                },
            )
            for s in SEED_003_SIZES
        ]
        return out

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        rng = random.Random(f"{self.rng_seed}:fastmmap")
        self.keys = uuid_keys(rng, p["keys"] + p["absent"])
        self.stored, self.absent = self.keys[: p["keys"]], self.keys[p["keys"] :]
        self.values: dict[str, list[Any]] = {}
        self.value_bytes: dict[str, int] = {}
        for case in self.cases():
            n = int(case.params["cmplx"])
            if _is_large(case):
                # A generator of its own: the other cases' data stay as they were.
                large = random.Random(f"{self.rng_seed}:fastmmap:{case.id}")
                self.values[case.id] = [large.randbytes(n) for _ in range(p["large_keys"])]
                self.value_bytes[case.id] = n
                continue
            if case.params["type"] == "bin":
                vals: list[Any] = binary_values(rng, p["keys"], n, 0.5)
                size = round(sum(len(v) for v in vals) / len(vals))
            else:
                vals = complex_values(rng, p["keys"], n, 0.5)
                size = pickled_size(vals)
            self.values[case.id] = vals
            self.value_bytes[case.id] = size
        self._streams: dict[tuple[str, int, str], tuple[list[int], list[str], list[Any]]] = {}

    def stored_keys(self, case: Case) -> list[str]:
        """The keys ``case`` stores (the first ``large_keys`` of them for the seed 003 sizes)."""
        if _is_large(case):
            return self.stored[: int(case.params["keys"])]
        return self.stored

    def capacity(self, case: Case) -> Capacity:
        p = _PARAMS[self.profile.name]
        size = self.value_bytes[case.id]
        if _is_large(case):
            # Twice the working set: every backend holds every value.
            return Capacity(
                bytes=2 * int(case.params["keys"]) * (36 + size),
                entry_bytes=36 + size,
                key_bytes=36,
                value_bytes=size,
            )
        return Capacity(
            bytes=p["keys"] * p["bytes_per_key"],
            entry_bytes=36 + size,
            key_bytes=36,
            value_bytes=size,
        )

    def _stream(
        self, case: Case, n_stored: int, phase: str
    ) -> tuple[list[int], list[str], list[Any]]:
        """The get or mix operation stream over the first ``n_stored`` keys."""
        key = (case.id, n_stored, phase)
        cached = self._streams.get(key)
        if cached is not None:
            return cached
        rng = random.Random(f"{self.rng_seed}:{case.id}:{phase}")
        length = 8_192 if self.profile.name != "tiny" else 600
        values = self.values[case.id]
        kinds: list[int] = []
        keys: list[str] = []
        vals: list[Any] = []
        stored = self.stored[:n_stored]
        for _ in range(length):
            if phase == "mix" and rng.random() < 0.15:
                kinds.append(SET)
                i = rng.randrange(n_stored)
                keys.append(stored[i])
                vals.append(values[i])
            elif rng.random() < 0.85:
                kinds.append(GET)
                keys.append(rng.choice(stored))
                vals.append(None)
            else:
                kinds.append(GET_MISS)
                keys.append(rng.choice(self.absent))
                vals.append(None)
        self._streams[key] = (kinds, keys, vals)
        return kinds, keys, vals

    def _one_repeat(self, case: Case, backend: Backend, scale: float) -> dict[str, float]:
        p = _PARAMS[self.profile.name]
        backend.clear()
        raw = backend.open()
        try:
            handle: Handle = raw if _is_binary(case) else object_handle(raw, backend.stores_objects)
            values = self.values[case.id]
            stored = self.stored_keys(case)
            set_res = timed_loop(
                handle,
                [SET] * len(stored),
                stored,
                values,
                len(stored),
                self.profile.budget_ns(scale),
            )
            n_stored = max(1, set_res.ops)
            budget = self.profile.budget_ns(0.5 * scale)
            kinds, keys, vals = self._stream(case, n_stored, "get")
            get_res = timed_loop(handle, kinds, keys, vals, p["ops"], budget)
            kinds, keys, vals = self._stream(case, n_stored, "mix")
            mix_res = timed_loop(handle, kinds, keys, vals, p["ops"], budget)
        finally:
            raw.close()
        return {
            "set_per_s": set_res.ops_per_s,
            "get_per_s": get_res.ops_per_s,
            "mix_per_s": mix_res.ops_per_s,
            "ghitr": get_res.hit_rate,
            "mhitr": mix_res.hit_rate,
            "stored": float(set_res.ops),
            "get_ops": float(get_res.ops),
            "mix_ops": float(mix_res.ops),
            "false_hits": float(get_res.false_hits + mix_res.false_hits),
        }

    def measure(self, case: Case, backend: Backend) -> Measurement:
        if self.profile.warmup:
            self._one_repeat(case, backend, 0.3)
        runs = repeat_runs(self.profile, lambda: self._one_repeat(case, backend, 1.0))
        summary = medians(runs)
        return Measurement(
            backend=backend.name,
            metrics={
                k: summary[k]
                for k in ("set_per_s", "get_per_s", "mix_per_s", "ghitr", "mhitr", "stored")
            },
            runs=runs,
            info={
                "limit": backend.limit(),
                "repeats": len(runs),
                "keys": len(self.stored_keys(case)),
                "value_bytes": self.value_bytes[case.id],
                "serialized_by": (
                    "nothing (bytes stored as given)"
                    if _is_binary(case)
                    else "backend"
                    if backend.stores_objects
                    else "harness (pickle)"
                ),
            },
        )

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        out: list[Table] = []
        keys = int(result.params.get("keys", 0))
        groups = (
            ("bin", False, "binary values"),
            ("complex", False, "complex values (dicts)"),
            ("bin", True, "binary values of seed 003's sizes (page, script, image)"),
        )
        for dtype, large, title in groups:
            cases = [
                c
                for c in result.cases
                if c.params.get("type") == dtype and bool(c.params.get("large")) == large
            ]
            if not cases:
                continue
            names = sorted({m.backend for c in cases for m in c.measurements})
            reference = pick_reference(names)
            cols = ["Package", "Cmplx", "Set/S", "Get/S", "Mix/S", "GHitR", "MHitR", "Limit"]
            if reference:
                cols += [f"Set vs {reference}", f"Get vs {reference}"]
            rows: list[list[str]] = []
            notes: list[str] = []
            partial: list[str] = []
            incomparable: set[tuple[str, str]] = set()
            for name in names:
                for c in cases:
                    m = c.get(name)
                    if m is None:
                        continue
                    mm = m.metrics
                    row = [
                        name,
                        str(c.params.get("size", c.params["cmplx"])),
                        fmt_int(mm["set_per_s"]),
                        fmt_int(mm["get_per_s"]),
                        fmt_int(mm["mix_per_s"]),
                        f"{mm['ghitr']:.3f}",
                        f"{mm['mhitr']:.3f}",
                        str(m.info.get("limit", "")),
                    ]
                    if reference:
                        ref = c.get(reference)
                        for metric in ("set_per_s", "get_per_s"):
                            row.append(
                                fmt_ratio(mm[metric] / ref.metrics[metric])
                                if ref and ref.metrics[metric] > 0
                                else "-"
                            )
                    rows.append(row)
                    case_keys = int(c.params.get("keys", keys))
                    if case_keys and mm["stored"] < case_keys:
                        partial.append(f"{name} ({c.label}: {mm['stored']:.0f})")
                        incomparable.add((name, c.case))
            for metric, label in (("set_per_s", "Set/s"), ("get_per_s", "Get/s")):
                figures = {
                    f"{label} {c.label}": [(m.backend, m.metrics[metric]) for m in c.measurements]
                    for c in cases
                }
                notes.extend(loss_notes(figures, reference, tradeoffs, fmt=fmt_int))
            group_keys = int(cases[0].params.get("keys", keys))
            if partial:
                notes.append(
                    f"Stored fewer than {group_keys} keys within the time budget (hit rates not "
                    "comparable): " + ", ".join(partial) + "."
                )
            # Hit rates are compared among bounded backends that stored every key.
            figures = {
                f"GHitR {c.label}": [
                    (m.backend, m.metrics["ghitr"])
                    for m in c.measurements
                    if (m.backend, c.case) not in incomparable
                    and not str(m.info.get("limit", "")).startswith("unbounded")
                ]
                for c in cases
            }
            limits = {
                m.backend: str(m.info.get("limit", "")) for c in cases for m in c.measurements
            }
            notes.extend(
                loss_notes(
                    figures,
                    reference,
                    {name: hit_rate_why(limit) for name, limit in limits.items()},
                    fmt=lambda v: f"{v:.3f}",
                    min_ratio=1.02,
                )
            )
            for c in cases:
                notes.extend(skipped_note(c))
            budget = result.params.get("budget_bytes")
            bound = (
                "budget twice the working set (per case: Limit)"
                if large
                else f"budget {fmt_bytes(float(budget)) if budget else '?'}"
            )
            out.append(
                Table(
                    f"fastmmap-2004: {title}, {group_keys} keys, {bound}",
                    cols,
                    rows,
                    right={1, 2, 3, 4, 5, 6, *range(8, len(cols))},
                    notes=notes,
                )
            )
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        panels = []
        for case_id in ("bin-465", "complex-16"):
            c = result.case(case_id)
            if c is None:
                continue
            for metric, label in (
                ("set_per_s", "Set/s"),
                ("get_per_s", "Get/s"),
                ("mix_per_s", "Mix/s"),
            ):
                panels.append(
                    (
                        f"{label}, {c.label}",
                        [(m.backend, m.metrics[metric]) for m in c.measurements],
                    )
                )
        paths: list[Path] = []
        if panels:
            paths.append(
                barh_panels(
                    outdir / "fastmmap-2004-rates.png",
                    "fastmmap-2004: operations per second (higher is better)",
                    panels,
                    "operations per second (log scale)",
                    ours=ours_names(),
                    network=network_names(),
                    columns=3,
                )
            )
        large_panels = []
        for c in result.cases:
            if not c.params.get("large"):
                continue
            for metric, label in (
                ("set_per_s", "Set/s"),
                ("get_per_s", "Get/s"),
                ("mix_per_s", "Mix/s"),
            ):
                large_panels.append(
                    (
                        f"{label}, {c.label}",
                        [(m.backend, m.metrics[metric]) for m in c.measurements],
                    )
                )
        if large_panels:
            paths.append(
                barh_panels(
                    outdir / "fastmmap-2004-large.png",
                    "fastmmap-2004: operations per second, seed 003's value sizes "
                    "(higher is better)",
                    large_panels,
                    "operations per second (log scale)",
                    ours=ours_names(),
                    network=network_names(),
                    columns=3,
                )
            )
        hit_panels = []
        for case_id in ("bin-1628", "complex-55"):
            c = result.case(case_id)
            if c is None:
                continue
            hit_panels.append(
                (f"GHitR, {c.label}", [(m.backend, m.metrics["ghitr"]) for m in c.measurements])
            )
        if hit_panels:
            paths.append(
                barh_panels(
                    outdir / "fastmmap-2004-hitrate.png",
                    "fastmmap-2004: hit rate of gets on stored keys under eviction",
                    hit_panels,
                    "hit rate",
                    ours=ours_names(),
                    network=network_names(),
                    log=False,
                    fmt="{:.3f}",
                )
            )
        return paths
