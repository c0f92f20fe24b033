"""What every workload shares: profiles, cases, the timed loops, repeats.

Timing uses :func:`time.perf_counter_ns`.  Throughput loops run the
operations in chunks of a few hundred and read the clock around each chunk;
latency loops read it around every operation.  A timed run stops after its
configured number of operations or, in the ``quick`` and ``default``
profiles, when its time budget is spent (slow backends then do fewer
operations; the count is recorded with the figures).
"""

from __future__ import annotations

import abc
import pickle
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..backends.base import Backend, BackendContext, Capacity, Handle, Scope
from ..model import Measurement, WorkloadResult
from ..report import Table
from ..stats import median

__all__ = [
    "GET",
    "GET_MISS",
    "PROFILES",
    "SET",
    "Case",
    "CaseSkipped",
    "LoopResult",
    "Profile",
    "Workload",
    "object_handle",
    "repeat_runs",
    "timed_loop",
]

GET = 0
"""Operation kind: get of a key expected to be stored (counts toward the hit rate)."""
SET = 1
"""Operation kind: set."""
GET_MISS = 2
"""Operation kind: get of a key never stored (a hit here would be a bug)."""

_CHUNK = 256


class CaseSkipped(Exception):
    """Raised by :meth:`Workload.measure` when a case cannot run on this machine.

    The message is the reason, shown as the skipped cell (not as a failure):
    e.g. a file larger than the memory the machine has free.
    """


@dataclass(frozen=True)
class Profile:
    """How long and how often to measure.

    ``run_seconds`` is the time budget of one timed run (None: run exactly the
    configured operation counts, as the tests do); ``case_seconds`` caps the
    repeats of one backend on one case (at least one repeat always runs).
    """

    name: str
    repeats: int
    warmup: bool
    run_seconds: float | None
    case_seconds: float | None

    def budget_ns(self, scale: float = 1.0) -> int | None:
        """The run budget in nanoseconds, scaled."""
        if self.run_seconds is None:
            return None
        return int(self.run_seconds * scale * 1e9)


PROFILES: dict[str, Profile] = {
    "tiny": Profile("tiny", repeats=1, warmup=True, run_seconds=None, case_seconds=None),
    "quick": Profile("quick", repeats=2, warmup=True, run_seconds=0.01, case_seconds=0.15),
    "default": Profile("default", repeats=5, warmup=True, run_seconds=0.1, case_seconds=2.0),
}


@dataclass(frozen=True)
class Case:
    """One parameter set of a workload (one column of the seed's tables)."""

    id: str
    label: str
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class LoopResult:
    """What a timed loop did."""

    ops: int = 0
    elapsed_ns: int = 0
    gets: int = 0
    hits: int = 0
    sets: int = 0
    miss_gets: int = 0
    false_hits: int = 0

    @property
    def ops_per_s(self) -> float:
        """Operations per second."""
        return self.ops * 1e9 / self.elapsed_ns if self.elapsed_ns else 0.0

    @property
    def hit_rate(self) -> float:
        """Hits over gets of stored keys (1.0 when there were none)."""
        return self.hits / self.gets if self.gets else 1.0


def timed_loop(
    handle: Handle,
    kinds: Sequence[int],
    keys: Sequence[str],
    values: Sequence[Any],
    max_ops: int,
    budget_ns: int | None,
) -> LoopResult:
    """Run ``kinds[i]`` on ``keys[i]`` (with ``values[i]`` for sets), cycling.

    Stops after ``max_ops`` operations, or once ``budget_ns`` of timed work
    is spent (checked between chunks of at most 256 operations).
    """
    n = len(kinds)
    if not (n == len(keys) == len(values)) or n == 0:
        raise ValueError("kinds, keys and values must be non-empty and of equal length")
    get, set_ = handle.get, handle.set
    clock = time.perf_counter_ns
    res = LoopResult()
    pos = 0
    size = 4  # chunks grow 4, 8 ... 256, so a slow backend cannot overshoot its budget much
    while res.ops < max_ops:
        m = min(size, max_ops - res.ops, n - pos)
        size = min(size * 2, _CHUNK)
        ck, kk, vv = kinds[pos : pos + m], keys[pos : pos + m], values[pos : pos + m]
        hits = false_hits = 0
        t0 = clock()
        for kind, key, value in zip(ck, kk, vv, strict=True):
            if kind == 0:
                if get(key) is not None:
                    hits += 1
            elif kind == 1:
                set_(key, value)
            elif get(key) is not None:
                false_hits += 1
        res.elapsed_ns += clock() - t0
        res.ops += m
        res.hits += hits
        res.false_hits += false_hits
        nsets = ck.count(SET)
        nmiss = ck.count(GET_MISS)
        res.sets += nsets
        res.miss_gets += nmiss
        res.gets += m - nsets - nmiss
        pos = (pos + m) % n
        if budget_ns is not None and res.elapsed_ns >= budget_ns:
            break
    return res


def repeat_runs(profile: Profile, run: Callable[[], dict[str, float]]) -> list[dict[str, float]]:
    """Call ``run`` ``profile.repeats`` times (fewer if ``case_seconds`` runs out)."""
    runs: list[dict[str, float]] = []
    start = time.perf_counter()
    for _ in range(profile.repeats):
        runs.append(run())
        if profile.case_seconds is not None and time.perf_counter() - start > profile.case_seconds:
            break
    return runs


def medians(runs: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per-metric median over repeats."""
    keys = runs[0].keys() if runs else ()
    return {k: median(r[k] for r in runs) for k in keys}


def object_handle(handle: Handle, stores_objects: bool) -> Handle:
    """A handle taking any picklable value: ``handle`` itself, or pickling around it.

    Backends that only store bytes get what the 2004 study's modules did with
    Storable: serialize on set, deserialize on get.
    """
    if stores_objects:
        return handle
    raw_get, raw_set = handle.get, handle.set
    dumps, loads, proto = pickle.dumps, pickle.loads, pickle.HIGHEST_PROTOCOL

    def get(key: str) -> Any:
        data = raw_get(key)
        return None if data is None else loads(data)

    def set_(key: str, value: Any) -> None:
        raw_set(key, dumps(value, proto))

    return Handle(get=get, set=set_, delete=handle.delete, close=handle.close)


class Workload(abc.ABC):
    """A benchmark reproducing one seed study; subclasses define the cases and loops."""

    name: ClassVar[str]
    title: ClassVar[str]
    seed: ClassVar[str]
    description: ClassVar[str]
    #: Run only when named on the command line (slow, or needs extra tools).
    only_when_named: ClassVar[bool] = False

    def __init__(self, profile: Profile, seed: int = 2010) -> None:
        self.profile = profile
        self.rng_seed = seed

    def configure(self, options: dict[str, Any]) -> None:  # noqa: B027 - optional hook
        """Take workload-specific options of the command line (``--sizes`` ...).

        Called before :meth:`cases`; options a workload does not know are ignored.
        """

    @abc.abstractmethod
    def params(self) -> dict[str, Any]:
        """The parameters of this profile (recorded in the results)."""

    @abc.abstractmethod
    def cases(self) -> list[Case]:
        """The cases, in report order."""

    @abc.abstractmethod
    def capacity(self, case: Case) -> Capacity:
        """The bound each backend gets for ``case``."""

    def skip_reason(self, backend: type[Backend]) -> str | None:
        """Why ``backend`` does not take part in this workload (None: it does)."""
        return None

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Generate data shared by all cases (called once before the first case)."""

    @abc.abstractmethod
    def measure(self, case: Case, backend: Backend) -> Measurement:
        """Run ``case`` on ``backend``."""

    def extra_measurements(
        self, case: Case, ctx: BackendContext, skipped: dict[str, str]
    ) -> list[Measurement]:
        """Rows the workload measures itself after the backends' (a ceiling, a baseline...).

        Rows it cannot measure go into ``skipped`` with the reason.
        """
        return []

    @abc.abstractmethod
    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        """Tables for the terminal and the Markdown report."""

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        """Write PNG charts; return their paths."""
        return []


def process_scope(backend: type[Backend] | Backend) -> bool:
    """Whether ``backend`` keeps its entries inside one process."""
    return backend.scope is Scope.PROCESS
