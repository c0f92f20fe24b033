"""``open-per-request``: the cost of opening the cache in every request (seed 002).

The 2009 study constructed its Cache::FileCache and Cache::Memcached::Fast
clients inside each request, then did one get (and a set on a miss).  Here
each request opens a new handle on the store (a new NativeCache / Cache /
diskcache object, a new LMDB environment, a new Django backend object with
Django's per-request connection close, a new Redis or memcached client and
connection), does the get, sets on a miss, and closes it.  The same requests
with one handle kept open show what the opening costs.

Process-local caches cannot take part: a dict made anew in each request is
always empty.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from ..backends.base import Backend, Capacity, Handle, Scope
from ..backends.registry import network_names, ours_names
from ..data import binary_values, short_keys
from ..model import Measurement, WorkloadResult
from ..plots import barh_panels
from ..report import Table, fmt_int, fmt_ns, fmt_ratio, loss_notes, pick_reference, skipped_note
from .base import Case, Workload, medians, repeat_runs

__all__ = ["OpenPerRequest"]

_PARAMS: dict[str, dict[str, int]] = {
    "tiny": {"keys": 110, "stored": 100, "requests": 60},
    "quick": {"keys": 220, "stored": 200, "requests": 20_000},
    "default": {"keys": 1_100, "stored": 1_000, "requests": 200_000},
}
VALUE_BYTES = 40


class OpenPerRequest(Workload):
    """Requests that open the cache, get one key (set on a miss) and close it."""

    name = "open-per-request"
    title = "open the cache in every request, then get (set on a miss)"
    seed = "seed 002, FileCache vs memcached with the cache opened per request"
    description = (
        "Each request opens a new handle on the store, gets one of 1,100 short keys "
        "(1,000 stored beforehand), sets it on a miss, and closes the handle. 'kept open' "
        "runs the same requests on one handle. The opening cost is the difference in time "
        "per request. Process-local caches are left out: a new one is always empty."
    )

    def params(self) -> dict[str, Any]:
        return dict(_PARAMS[self.profile.name])

    def cases(self) -> list[Case]:
        return [Case("open", "open per request", {})]

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.scope is Scope.PROCESS:
            return "process-local: a cache opened per request is always empty"
        return None

    def capacity(self, case: Case) -> Capacity:
        return Capacity(entry_bytes=16 + VALUE_BYTES, key_bytes=16, value_bytes=VALUE_BYTES)

    def prepare(self) -> None:
        p = _PARAMS[self.profile.name]
        rng = random.Random(f"{self.rng_seed}:open")
        self.keys = short_keys(p["keys"], "req")
        self.value = binary_values(rng, 1, VALUE_BYTES, 0.0)[0]
        self.requests = [rng.choice(self.keys) for _ in range(4_096)]

    def _run(self, backend: Backend, reopen: bool, budget_ns: int | None) -> dict[str, float]:
        p = _PARAMS[self.profile.name]
        clock = time.perf_counter_ns
        value = self.value
        requests = self.requests
        kept: Handle | None = None if reopen else backend.open()
        open_ = backend.open
        done = hits = elapsed = 0
        size = 1  # chunks grow 1, 2, 4 ... 128: opening some stores takes tens of ms
        try:
            while done < p["requests"]:
                chunk = requests[: min(len(requests), p["requests"] - done, size)]
                size = min(size * 2, 128)
                h = 0
                t0 = clock()
                if kept is None:
                    for key in chunk:
                        handle = open_()
                        if handle.get(key) is None:
                            handle.set(key, value)
                        else:
                            h += 1
                        handle.close()
                else:
                    get, set_ = kept.get, kept.set
                    for key in chunk:
                        if get(key) is None:
                            set_(key, value)
                        else:
                            h += 1
                elapsed += clock() - t0
                done += len(chunk)
                hits += h
                requests = requests[len(chunk) :] + requests[: len(chunk)]
                if budget_ns is not None and elapsed >= budget_ns:
                    break
        finally:
            if kept is not None:
                kept.close()
        return {
            "requests_per_s": done * 1e9 / elapsed if elapsed else 0.0,
            "requests": float(done),
            "hit_rate": hits / done if done else 0.0,
        }

    def measure(self, case: Case, backend: Backend) -> Measurement:
        p = _PARAMS[self.profile.name]
        handle = backend.open()
        try:
            for key in self.keys[: p["stored"]]:
                handle.set(key, self.value)
        finally:
            handle.close()
        if self.profile.warmup:
            self._run(backend, True, self.profile.budget_ns(0.3))

        def run() -> dict[str, float]:
            per = self._run(backend, True, self.profile.budget_ns())
            kept = self._run(backend, False, self.profile.budget_ns(0.5))
            return {
                "open_requests_per_s": per["requests_per_s"],
                "kept_requests_per_s": kept["requests_per_s"],
                "open_hit_rate": per["hit_rate"],
                "open_requests": per["requests"],
                "kept_requests": kept["requests"],
            }

        runs = repeat_runs(self.profile, run)
        summary = medians(runs)
        per_ns = 1e9 / summary["open_requests_per_s"] if summary["open_requests_per_s"] else 0.0
        kept_ns = 1e9 / summary["kept_requests_per_s"] if summary["kept_requests_per_s"] else 0.0
        return Measurement(
            backend=backend.name,
            metrics={
                "open_requests_per_s": summary["open_requests_per_s"],
                "kept_requests_per_s": summary["kept_requests_per_s"],
                "open_cost_ns": max(0.0, per_ns - kept_ns),
                "hit_rate": summary["open_hit_rate"],
            },
            runs=runs,
            info={"limit": backend.limit(), "repeats": len(runs)},
        )

    # -- output -------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        if not result.cases:
            return []
        case = result.cases[0]
        ms = sorted(case.measurements, key=lambda m: -m.metrics["open_requests_per_s"])
        reference = pick_reference(m.backend for m in ms)
        ref = case.get(reference) if reference else None
        cols = ["backend", "requests/s (open per request)", "time per request",
                "requests/s (kept open)", "cost of opening", "hit rate"]  # fmt: skip
        if ref is not None:
            cols.append(f"vs {reference} (open per request)")
        rows = []
        for m in ms:
            mm = m.metrics
            row = [
                m.backend,
                fmt_int(mm["open_requests_per_s"]),
                fmt_ns(1e9 / mm["open_requests_per_s"]) if mm["open_requests_per_s"] else "-",
                fmt_int(mm["kept_requests_per_s"]),
                fmt_ns(mm["open_cost_ns"]),
                f"{mm['hit_rate']:.3f}",
            ]
            if ref is not None:
                theirs = ref.metrics["open_requests_per_s"]
                row.append(fmt_ratio(mm["open_requests_per_s"] / theirs) if theirs else "-")
            rows.append(row)
        figures = {
            "requests/s opened per request": [
                (m.backend, m.metrics["open_requests_per_s"]) for m in ms
            ]
        }
        notes = loss_notes(figures, reference, tradeoffs, fmt=fmt_int)
        notes.extend(skipped_note(case))
        return [
            Table(
                "open-per-request: open, get (set on a miss), close - per request",
                cols,
                rows,
                right=set(range(1, len(cols))),
                notes=notes,
            )
        ]

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        if not result.cases:
            return []
        case = result.cases[0]
        panels = [
            (
                "requests/s, cache opened per request",
                [(m.backend, m.metrics["open_requests_per_s"]) for m in case.measurements],
            ),
            (
                "requests/s, cache kept open",
                [(m.backend, m.metrics["kept_requests_per_s"]) for m in case.measurements],
            ),
        ]
        return [
            barh_panels(
                outdir / "open-per-request.png",
                "open-per-request: requests per second (higher is better)",
                panels,
                "requests per second (log scale)",
                ours=ours_names(),
                network=network_names(),
            )
        ]
