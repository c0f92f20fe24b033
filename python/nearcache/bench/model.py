"""Result records of a benchmark run, and their JSON form.

The JSON written by ``nearcache bench --json FILE`` is exactly
:meth:`BenchResult.to_json`; ``nearcache bench --load FILE`` reads it back
with :meth:`BenchResult.from_json` to re-render tables, Markdown and charts
without rerunning anything.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "SCHEMA_VERSION",
    "BackendStatus",
    "BenchResult",
    "CaseResult",
    "Measurement",
    "WorkloadResult",
]

SCHEMA_VERSION = 1


@dataclass
class Measurement:
    """One backend's figures for one case of one workload.

    ``metrics`` holds the reported figures (medians over the repeats for
    throughput workloads, pooled percentiles for latency workloads);
    ``runs`` holds every repeat's raw figures; ``info`` holds what the
    figures depend on (the size limit in effect, counts, ...).
    """

    backend: str
    metrics: dict[str, float]
    runs: list[dict[str, float]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Measurement:
        """Inverse of :func:`dataclasses.asdict`."""
        return cls(
            backend=str(data["backend"]),
            metrics={str(k): float(v) for k, v in data["metrics"].items()},
            runs=[{str(k): float(v) for k, v in run.items()} for run in data.get("runs", [])],
            info=dict(data.get("info", {})),
        )


@dataclass
class CaseResult:
    """All backends' measurements for one case (one parameter set) of a workload."""

    case: str
    label: str
    params: dict[str, Any]
    measurements: list[Measurement] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)

    def get(self, backend: str) -> Measurement | None:
        """The measurement of ``backend``, if it ran."""
        for m in self.measurements:
            if m.backend == backend:
                return m
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CaseResult:
        """Inverse of :func:`dataclasses.asdict`."""
        return cls(
            case=str(data["case"]),
            label=str(data["label"]),
            params=dict(data.get("params", {})),
            measurements=[Measurement.from_dict(m) for m in data.get("measurements", [])],
            skipped={str(k): str(v) for k, v in data.get("skipped", {}).items()},
        )


@dataclass
class WorkloadResult:
    """The cases of one workload."""

    name: str
    title: str
    seed: str
    description: str
    params: dict[str, Any]
    cases: list[CaseResult] = field(default_factory=list)
    duration_s: float = 0.0

    def case(self, case_id: str) -> CaseResult | None:
        """The case called ``case_id``, if it ran."""
        for c in self.cases:
            if c.case == case_id:
                return c
        return None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkloadResult:
        """Inverse of :func:`dataclasses.asdict`."""
        return cls(
            name=str(data["name"]),
            title=str(data["title"]),
            seed=str(data.get("seed", "")),
            description=str(data.get("description", "")),
            params=dict(data.get("params", {})),
            cases=[CaseResult.from_dict(c) for c in data.get("cases", [])],
            duration_s=float(data.get("duration_s", 0.0)),
        )


@dataclass
class BackendStatus:
    """Whether a backend took part in the run, and what it is."""

    name: str
    title: str
    scope: str
    available: bool
    reason: str = ""
    version: str = ""
    tradeoff: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> BackendStatus:
        """Inverse of :func:`dataclasses.asdict`."""
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass
class BenchResult:
    """Everything one ``nearcache bench`` run measured, and where."""

    command: str
    started: str
    profile: dict[str, Any]
    machine: dict[str, Any]
    versions: dict[str, str]
    backends: list[BackendStatus] = field(default_factory=list)
    servers: dict[str, Any] = field(default_factory=dict)
    workloads: list[WorkloadResult] = field(default_factory=list)
    duration_s: float = 0.0
    reference: str = ""
    schema: int = SCHEMA_VERSION

    def workload(self, name: str) -> WorkloadResult | None:
        """The result of workload ``name``, if it ran."""
        for w in self.workloads:
            if w.name == name:
                return w
        return None

    def backend(self, name: str) -> BackendStatus | None:
        """The status record of backend ``name``."""
        for b in self.backends:
            if b.name == name:
                return b
        return None

    def to_json(self) -> str:
        """The JSON document written by ``--json``."""
        return json.dumps(asdict(self), indent=1, sort_keys=False) + "\n"

    def write(self, path: Path) -> None:
        """Write :meth:`to_json` to ``path`` (creating parent directories)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def from_json(cls, text: str) -> BenchResult:
        """Parse a document written by :meth:`to_json`."""
        data = json.loads(text)
        schema = int(data.get("schema", 0))
        if schema != SCHEMA_VERSION:
            raise ValueError(f"unsupported benchmark result schema {schema}")
        return cls(
            command=str(data["command"]),
            started=str(data["started"]),
            profile=dict(data.get("profile", {})),
            machine=dict(data.get("machine", {})),
            versions={str(k): str(v) for k, v in data.get("versions", {}).items()},
            backends=[BackendStatus.from_dict(b) for b in data.get("backends", [])],
            servers=dict(data.get("servers", {})),
            workloads=[WorkloadResult.from_dict(w) for w in data.get("workloads", [])],
            duration_s=float(data.get("duration_s", 0.0)),
            reference=str(data.get("reference", "")),
            schema=schema,
        )

    @classmethod
    def load(cls, path: Path) -> BenchResult:
        """Read a JSON file written by ``--json``."""
        return cls.from_json(path.read_text(encoding="utf-8"))
