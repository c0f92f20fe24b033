"""``chi-2010``: the 2010 CHI / Cache::FastMmap / memcached comparison (seed 000).

Keys are 36-character UUID strings; values are random bytes of 16 ("small"),
160 ("medium") and 1600 ("large") bytes.  Each case is a stream of
operations with a set:get ratio: blocks of one set followed by N gets of
stored keys.  The figure is operations (sets + gets) per second, shown as a
table and as Perl's ``cmpthese`` matrix.  Two cases beyond the study, pure
gets and pure sets of medium values, give the headline get and set rates.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity
from ..backends.registry import network_names, ours_names
from ..data import binary_values, uuid_keys
from ..model import Measurement, WorkloadResult
from ..plots import barh_panels
from ..report import Table, cmpthese, fmt_rate, fmt_ratio, loss_notes, pick_reference, skipped_note
from .base import GET, SET, Case, Workload, medians, repeat_runs, timed_loop

__all__ = ["Chi2010"]

SIZES = {"small": 16, "medium": 160, "large": 1600}

_PARAMS: dict[str, dict[str, int]] = {
    # keys: distinct keys; ops: ceiling per timed run; stream: length of the op sequence.
    "tiny": {"keys": 50, "ops": 404, "stream": 404, "values": 16},
    "quick": {"keys": 30, "ops": 200_000, "stream": 4_040, "values": 64},
    "default": {"keys": 500, "ops": 2_000_000, "stream": 20_200, "values": 256},
}


class Chi2010(Workload):
    """Set:get ratios over UUID keys and 16/160/1600-byte values; ops/s and cmpthese."""

    name = "chi-2010"
    title = "set:get ratios on UUID keys (CHI, 2010)"
    seed = "seed 000, 'Perl cache modules performance' (January 2010)"
    description = (
        "36-character UUID keys, random binary values of 16/160/1600 bytes. Each case is a "
        "stream of blocks of one set followed by N gets of stored keys (set:get = 1:N); the "
        "rate counts sets and gets. All keys are stored before timing, so gets hit. "
        "'get' and 'set' (pure gets, pure sets of 160-byte values) go beyond the study and "
        "give the headline figures."
    )

    def params(self) -> dict[str, Any]:
        return dict(_PARAMS[self.profile.name])

    def cases(self) -> list[Case]:
        def c(ratio: int | None, size: str, sets_only: bool = False) -> Case:
            if sets_only:
                return Case("set", "set only, medium", {"ratio": 0, "size": SIZES[size]})
            if ratio is None:
                return Case("get", "get only, medium", {"ratio": None, "size": SIZES[size]})
            return Case(
                f"1:{ratio}-{size}", f"1:{ratio} {size}", {"ratio": ratio, "size": SIZES[size]}
            )

        return [
            c(10, "small"),
            c(10, "medium"),
            c(10, "large"),
            c(1, "medium"),
            c(100, "medium"),
            c(None, "medium"),
            c(0, "medium", sets_only=True),
        ]

    def capacity(self, case: Case) -> Capacity:
        size = int(case.params["size"])
        return Capacity(entry_bytes=36 + size, key_bytes=36, value_bytes=size)

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        rng = random.Random(self.rng_seed)
        self.keys = uuid_keys(rng, p["keys"])
        self.values = {size: binary_values(rng, p["values"], size, 0.0) for size in SIZES.values()}
        self.streams: dict[str, tuple[list[int], list[str], list[bytes]]] = {}
        for case in self.cases():
            self.streams[case.id] = self._stream(case, random.Random(f"{self.rng_seed}:{case.id}"))

    def _stream(self, case: Case, rng: random.Random) -> tuple[list[int], list[str], list[bytes]]:
        p = _PARAMS[self.profile.name]
        values = self.values[int(case.params["size"])]
        ratio = case.params["ratio"]
        kinds: list[int] = []
        keys: list[str] = []
        vals: list[bytes] = []
        while len(kinds) < p["stream"]:
            if ratio is None:
                block = [GET]
            elif ratio == 0:
                block = [SET]
            else:
                block = [SET] + [GET] * int(ratio)
            for kind in block:
                kinds.append(kind)
                keys.append(rng.choice(self.keys))
                vals.append(rng.choice(values))
        return kinds, keys, vals

    def measure(self, case: Case, backend: Backend) -> Measurement:
        p = _PARAMS[self.profile.name]
        kinds, keys, vals = self.streams[case.id]
        values = self.values[int(case.params["size"])]
        handle = backend.open()
        try:
            for i, key in enumerate(self.keys):
                handle.set(key, values[i % len(values)])
            if self.profile.warmup:
                timed_loop(
                    handle, kinds, keys, vals, min(len(kinds), 2_000), self.profile.budget_ns(0.5)
                )

            def run() -> dict[str, float]:
                r = timed_loop(handle, kinds, keys, vals, p["ops"], self.profile.budget_ns())
                return {
                    "ops_per_s": r.ops_per_s,
                    "ops": float(r.ops),
                    "elapsed_s": r.elapsed_ns / 1e9,
                    "hit_rate": r.hit_rate,
                }

            runs = repeat_runs(self.profile, run)
        finally:
            handle.close()
        summary = medians(runs)
        return Measurement(
            backend=backend.name,
            metrics={"ops_per_s": summary["ops_per_s"], "hit_rate": summary["hit_rate"]},
            runs=runs,
            info={"limit": backend.limit(), "repeats": len(runs)},
        )

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        cases = result.cases
        if not cases:
            return []
        names = _backend_order(result)
        reference = pick_reference(names)
        rates: dict[str, dict[str, float]] = {
            c.case: {m.backend: m.metrics["ops_per_s"] for m in c.measurements} for c in cases
        }
        cols = ["backend", *[c.label for c in cases]]
        rows = [[name, *[_cell(rates[c.case].get(name)) for c in cases]] for name in names]
        figures = {
            c.label: [(m.backend, m.metrics["ops_per_s"]) for m in c.measurements] for c in cases
        }
        notes = loss_notes(figures, reference, tradeoffs)
        for c in cases:
            notes.extend(skipped_note(c))
            bad = [m.backend for m in c.measurements if m.metrics.get("hit_rate", 1.0) < 0.999]
            if bad:
                notes.append(f"{c.label}: gets missed on {', '.join(bad)} (keys were all stored)")
        out = [
            Table(
                "chi-2010: operations per second (median of repeats, sets + gets)",
                cols,
                rows,
                right=set(range(1, len(cols))),
                notes=notes,
            )
        ]
        if reference is not None:
            rel_rows = []
            for name in names:
                row = [name]
                for c in cases:
                    mine, ref = rates[c.case].get(name), rates[c.case].get(reference)
                    row.append(fmt_ratio(mine / ref) if mine and ref else "-")
                rel_rows.append(row)
            out.append(
                Table(
                    f"chi-2010: rate relative to {reference} (>1 = faster than {reference})",
                    cols,
                    rel_rows,
                    right=set(range(1, len(cols))),
                )
            )
        for c in cases:
            pairs = [(m.backend, m.metrics["ops_per_s"]) for m in c.measurements]
            out.append(cmpthese(pairs, f"chi-2010: Benchmarking caches with ratio {c.label}"))
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        panels = [
            (c.label, [(m.backend, m.metrics["ops_per_s"]) for m in c.measurements])
            for c in result.cases
        ]
        if not panels:
            return []
        path = outdir / "chi-2010.png"
        return [
            barh_panels(
                path,
                "chi-2010: operations per second (higher is better)",
                panels,
                "operations per second (log scale)",
                ours=ours_names(),
                network=network_names(),
            )
        ]


def _cell(rate: float | None) -> str:
    return fmt_rate(rate) if rate else "-"


def _backend_order(result: WorkloadResult) -> list[str]:
    """Backends in the order of their rate on the first case, slowest first (as cmpthese)."""
    seen: dict[str, float] = {}
    for c in result.cases:
        for m in c.measurements:
            seen.setdefault(m.backend, m.metrics.get("ops_per_s", 0.0))
    return sorted(seen, key=lambda n: seen[n])
