"""``perl-chi-2010``: seed 000 re-run in Perl, with Cache::Near beside the study's modules.

The Perl script ``perl/bench/chi2010.pl`` (in the source tree) measures
Cache::Near, CHI::Driver::Near, Cache::FastMmap (raw and Storable), CHI's
Memory, FastMmap and File drivers, and Cache::Memcached::Fast / CHI's
Memcached::Fast driver with ``Benchmark::cmpthese``: 36-character UUID
keys, 16/160/1600-byte values, blocks of one set and N gets.  This
workload runs it once per case and reports every Perl module's rate.  It
needs Perl, the built Perl distribution (``make perl-test`` or ``perl
Makefile.PL && make`` in ``perl/Cache-Near``) and the source tree; without
them it is skipped with the reason.  It runs on the ``nearcache`` backend's
slot only (the Perl modules are the contenders, not the Python backends).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from ..backends.base import Backend, Capacity
from ..model import Measurement, WorkloadResult
from ..report import Table, cmpthese, fmt_rate, fmt_ratio
from .base import Case, Workload

__all__ = ["PerlChi2010", "perl_bench_problem"]

#: Seed 000's cases: (set:get ratio, value size name).
CASES = [
    ("1:10", "small"),
    ("1:10", "medium"),
    ("1:10", "large"),
    ("1:1", "medium"),
    ("1:100", "medium"),
]

#: How long each Perl module runs per case: an iteration count or CPU seconds.
_RUN_ARGS: dict[str, list[str]] = {
    "tiny": ["--count", "200", "--keys", "50"],
    "quick": ["--seconds", "0.2"],
    "default": ["--seconds", "1"],
}

#: The backend whose slot runs the Perl script.
HOST_BACKEND = "nearcache"

#: The goals of the Perl binding: (case, ours, theirs, minimum ratio).
GOALS = [
    ("1:10 medium", "C:Near", "C:FMmap", 8.0),
    ("1:10 medium", "CHI:Near", "CHI:Mem", 0.9),
    ("1:10 medium", "CHI:Near", "CHI:FMmap", 1.6),
]


def _source_tree() -> Path:
    env = os.environ.get("NEARCACHE_SOURCE")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[4]


def _perl_paths() -> tuple[Path, Path]:
    root = _source_tree()
    return root / "perl" / "bench" / "chi2010.pl", root / "perl" / "Cache-Near" / "blib"


def perl_bench_problem() -> str | None:
    """Why the Perl benchmark cannot run here (None: it can)."""
    perl = shutil.which("perl")
    if perl is None:
        return "perl is not installed"
    script, blib = _perl_paths()
    if not script.is_file():
        return f"{script} not found (the Perl benchmark needs nearcache's source tree)"
    if not (blib / "arch" / "auto" / "Cache" / "Near").is_dir():
        return f"Cache::Near is not built in {blib.parent} (run: make perl-test)"
    probe = subprocess.run(
        [perl, "-MBenchmark", "-MCHI", "-MCache::FastMmap", "-e1"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        return "Perl modules missing (CHI, Cache::FastMmap): run scripts/install-deps.sh"
    return None


class PerlChi2010(Workload):
    """Seed 000 in Perl: Cache::Near and CHI::Driver::Near against the study's modules."""

    name = "perl-chi-2010"
    # It starts a memcached of its own: the default run stays server-free.
    only_when_named: ClassVar[bool] = True
    title = "seed 000 re-run in Perl (Cache::Near, CHI, Cache::FastMmap, memcached)"
    seed = "seed 000, 'Perl cache modules performance' (January 2010), in its own language"
    description = (
        "perl/bench/chi2010.pl: Benchmark::cmpthese over blocks of one set and N gets "
        "(set:get = 1:N) of 36-character UUID keys and random 16/160/1600-byte values, "
        "for Cache::Near, CHI::Driver::Near, Cache::FastMmap, CHI's Memory/FastMmap/File "
        "drivers and memcached clients; rates are operations (sets + gets) per second."
    )

    def params(self) -> dict[str, Any]:
        return {"run": " ".join(_RUN_ARGS[self.profile.name])}

    def cases(self) -> list[Case]:
        return [
            Case(f"{ratio}-{size}", f"{ratio} {size}", {"ratio": ratio, "size": size})
            for ratio, size in CASES
        ]

    def capacity(self, case: Case) -> Capacity:
        return Capacity(entry_bytes=1636, key_bytes=36, value_bytes=1600)

    def skip_reason(self, backend: type[Backend]) -> str | None:
        if backend.name != HOST_BACKEND:
            return f"the Perl modules are measured on the {HOST_BACKEND} backend's slot"
        return perl_bench_problem()

    def measure(self, case: Case, backend: Backend) -> Measurement:
        script, blib = _perl_paths()
        with tempfile.TemporaryDirectory(prefix="nearcache-perl-bench-") as tmp:
            out = Path(tmp) / "r.json"
            cmd = [
                "perl",
                f"-I{blib / 'lib'}",
                f"-I{blib / 'arch'}",
                str(script),
                *_RUN_ARGS[self.profile.name],
                "--cases",
                case.label,
                "--no-seed001",
                "--json",
                str(out),
            ]
            subprocess.run(cmd, check=True, capture_output=True, timeout=1800)
            data = json.loads(out.read_text())
        figures = data["seed000"][case.label]
        metrics = {f"{module} ops/s": float(f["ops_per_s"]) for module, f in figures.items()}
        metrics["ops_per_s"] = metrics.get("C:Near ops/s", 0.0)
        return Measurement(
            backend=backend.name,
            metrics=metrics,
            runs=[metrics],
            info={"skipped": data.get("skipped", {}), "versions": data["machine"]["versions"]},
        )

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        rates: dict[str, dict[str, float]] = {}
        for c in result.cases:
            m = c.get(HOST_BACKEND)
            if m is None:
                continue
            rates[c.label] = {
                k.removesuffix(" ops/s"): v for k, v in m.metrics.items() if k.endswith(" ops/s")
            }
        if not rates:
            return []
        labels = list(rates)
        modules = sorted(
            {name for r in rates.values() for name in r}, key=lambda n: rates[labels[0]].get(n, 0.0)
        )
        out = [
            Table(
                "perl-chi-2010: operations per second (sets + gets), Perl modules",
                ["module", *labels],
                [
                    [n, *[fmt_rate(rates[lb][n]) if rates[lb].get(n) else "-" for lb in labels]]
                    for n in modules
                ],
                right=set(range(1, len(labels) + 1)),
            )
        ]
        goal_rows = []
        for label, ours, theirs, target in GOALS:
            r = rates.get(label, {})
            if r.get(ours) and r.get(theirs):
                x = r[ours] / r[theirs]
                goal_rows.append(
                    [
                        label,
                        f"{ours} / {theirs}",
                        fmt_ratio(x),
                        f">= {target:g}x",
                        "met" if x >= target else "NOT met",
                    ]
                )
        if goal_rows:
            out.append(
                Table(
                    "perl-chi-2010: goals (ratios within one run)",
                    ["case", "ratio", "measured", "goal", ""],
                    goal_rows,
                )
            )
        for label in labels:
            out.append(
                cmpthese(
                    sorted(rates[label].items()),
                    f"perl-chi-2010: Benchmarking caches with ratio {label} values",
                )
            )
        return out
