"""``holds``: how many entries each bounded cache really holds in the other workloads.

The workloads give every bounded backend "the same bound": an LRU gets
``maxsize=C``, nearcache a file sized to hold about C entries (for an entry
count), or every backend the same byte budget (``fastmmap-2004``), which
count-bounded caches get as budget / (key + mean value) entries.  This
workload checks those figures: it replays each workload's own operations in
one process on a fresh store of that workload's bound and counts the entries
(``len``) every few operations once the store is full:

- ``django-8proc``: the 1,100 keys stored, then the 8 workers' 90/9/1
  streams one after the other;
- ``zipf``, ``zipf+scan``: the cache-aside requests after the warm-up;
- ``fastmmap-2004`` ``bin-1628`` and ``complex-55`` (the cases that evict):
  every key stored in order, then the mix stream (15% sets).

The figure is the mean count over the samples (with min and max: a full
nearcache shard's count is a sawtooth, since each compaction frees part of
it) next to the bound C; "held / C" is the discrepancy.  Only backends whose
entries can be counted take part: nearcache's (through its file), the LRU
objects and the unbounded dict (the working set: the most anything can hold).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ..backends.base import Backend, Capacity, Handle, import_module
from ..model import Measurement, WorkloadResult
from ..report import Table, fmt_int, skipped_notes
from .base import GET, GET_MISS, SET, Case, Profile, Workload, object_handle
from .django8proc import Django8proc
from .fastmmap2004 import Fastmmap2004
from .zipf import Zipf

__all__ = ["Holding"]

#: Backends whose entries this workload can count, and how.
COUNTED = ("nearcache-native", "nearcache", "django-nearcache", "cachebox", "cachetools", "dict")
_NATIVE_FILES = {"nearcache-native": "path", "nearcache": "path", "django-nearcache": "location"}

#: Samples taken per replay (at most; every op for short replays).
_SAMPLES = 2_000


def _counter(backend: Backend) -> tuple[Callable[[], int], Callable[[], None]]:
    """A function counting the entries of ``backend``'s store, and one closing it."""
    attr = _NATIVE_FILES.get(backend.name)
    if attr is not None:
        cache = import_module("nearcache._native").NativeCache(
            str(getattr(backend, attr)), int(getattr(backend, "size", 0))
        )
        return cache.__len__, cache.close
    store = backend.local_store()
    return store.__len__, lambda: None


class Holding(Workload):
    """Entries held by each bounded cache in the other workloads, against their bound."""

    name = "holds"
    title = "entries each bounded cache really holds in the other workloads (len, sampled)"
    seed = "issue 'Reads that scale with every core' ('holds ~N' within 5%)"
    description = (
        "Each count-bounded or byte-bounded case of django-8proc, zipf and fastmmap-2004 "
        "replayed in one process on a fresh store with that workload's bound; the entries "
        "are counted (len) at up to 2,000 points once the store is full. 'bound C' is the "
        "entry count the workload gives count-bounded caches (fastmmap-2004: budget / "
        "(key + mean value)); 'held / C' is mean held entries over C. The dict row is "
        "unbounded: the working set."
    )

    def __init__(self, profile: Profile, seed: int = 2010) -> None:
        super().__init__(profile, seed)
        self.django = Django8proc(profile, seed)
        self.zipf = Zipf(profile, seed)
        self.fastmmap = Fastmmap2004(profile, seed)

    def params(self) -> dict[str, Any]:
        return {"samples": _SAMPLES}

    def cases(self) -> list[Case]:
        return [
            Case("django-8proc", "django-8proc", {"workload": "django-8proc", "case": "8proc"}),
            Case("zipf", "zipf", {"workload": "zipf", "case": "zipf"}),
            Case("zipf+scan", "zipf+scan", {"workload": "zipf", "case": "zipf+scan"}),
            Case(
                "fastmmap-bin-1628",
                "fastmmap-2004 bin 1628",
                {"workload": "fastmmap-2004", "case": "bin-1628"},
            ),
            Case(
                "fastmmap-complex-55",
                "fastmmap-2004 complex 55",
                {"workload": "fastmmap-2004", "case": "complex-55"},
            ),
        ]

    def _source(self, case: Case) -> tuple[Workload, Case]:
        source: Workload = {
            "django-8proc": self.django,
            "zipf": self.zipf,
            "fastmmap-2004": self.fastmmap,
        }[str(case.params["workload"])]
        inner = next(c for c in source.cases() if c.id == case.params["case"])
        return source, inner

    def capacity(self, case: Case) -> Capacity:
        source, inner = self._source(case)
        return source.capacity(inner)

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.name in COUNTED:
            return None
        return "its entries are not counted here"

    def prepare(self) -> None:
        self.django.prepare()
        self.zipf.prepare()
        self.fastmmap.prepare()

    def _replay(self, case: Case, handle: Handle) -> Iterator[None]:
        """Run the source workload's operations, yielding after each once the store is full."""
        workload, inner = str(case.params["workload"]), str(case.params["case"])
        if workload == "django-8proc":
            d = self.django
            for key in d.keys:
                handle.set(key, d.value)
            for kinds, keys in d.streams:
                for kind, key in zip(kinds, keys, strict=True):
                    if kind == 0:
                        handle.get(key)
                    elif kind == 1:
                        handle.set(key, d.value)
                    else:
                        handle.delete(key)
                    yield None
        elif workload == "zipf":
            z = self.zipf
            for i, key in enumerate(z.requests[inner]):
                if handle.get(key) is None:
                    handle.set(key, z.value)
                if i >= z.warm:
                    yield None
        else:
            f = self.fastmmap
            values = f.values[inner]
            for key, value in zip(f.stored, values, strict=True):
                handle.set(key, value)
            fcase = next(c for c in f.cases() if c.id == inner)
            kinds, keys, vals = f._stream(fcase, len(f.stored), "mix")
            for kind, key, value in zip(kinds, keys, vals, strict=True):
                if kind == SET:
                    handle.set(key, value)
                elif kind in (GET, GET_MISS):
                    handle.get(key)
                yield None

    def _replay_length(self, case: Case) -> int:
        workload, inner = str(case.params["workload"]), str(case.params["case"])
        if workload == "django-8proc":
            return sum(len(kinds) for kinds, _ in self.django.streams)
        if workload == "zipf":
            return len(self.zipf.requests[inner]) - int(self.zipf.warm)
        fcase = next(c for c in self.fastmmap.cases() if c.id == inner)
        return len(self.fastmmap._stream(fcase, len(self.fastmmap.stored), "mix")[0])

    def measure(self, case: Case, backend: Backend) -> Measurement:
        raw = backend.open()
        is_complex = str(case.params["case"]).startswith("complex")
        handle = object_handle(raw, backend.stores_objects) if is_complex else raw
        count, close = _counter(backend)
        step = max(1, self._replay_length(case) // _SAMPLES)
        counts: list[int] = []
        try:
            for i, _ in enumerate(self._replay(case, handle)):
                if i % step == 0:
                    counts.append(count())
        finally:
            close()
            raw.close()
        bound = backend.capacity.max_items() or 0
        mean = sum(counts) / len(counts) if counts else 0.0
        return Measurement(
            backend=backend.name,
            metrics={
                "bound": float(bound),
                "held_mean": mean,
                "held_min": float(min(counts, default=0)),
                "held_max": float(max(counts, default=0)),
                "held_ratio": mean / bound if bound else 0.0,
                "samples": float(len(counts)),
            },
            info={"limit": backend.limit()},
        )

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        rows: list[list[str]] = []
        notes: list[str] = []
        for c in result.cases:
            for m in c.measurements:
                mm = m.metrics
                rows.append(
                    [
                        c.label,
                        m.backend,
                        str(m.info.get("limit", "")),
                        fmt_int(mm["bound"]),
                        fmt_int(mm["held_mean"]),
                        fmt_int(mm["held_min"]),
                        fmt_int(mm["held_max"]),
                        f"{mm['held_ratio']:.3f}" if mm["bound"] else "-",
                    ]
                )
        notes.extend(skipped_notes(result.cases))
        if not rows:
            return []
        return [
            Table(
                "holds: entries held once full, against the bound C each workload gives",
                ["case", "backend", "limit", "bound C", "held (mean)", "min", "max", "held / C"],
                rows,
                right={3, 4, 5, 6, 7},
                notes=notes,
            )
        ]
