"""``nearcache bench``: the seed studies, rerun side by side with every peer.

Run it as ``nearcache bench`` (or ``python -m nearcache bench``); see
``docs/benchmarks.md``.  Programmatic use::

    from nearcache.bench import PROFILES, RunOptions, run
    result, tables = run(RunOptions(workloads=["chi-2010"], profile=PROFILES["quick"]))
"""

from __future__ import annotations

from .model import BenchResult
from .runner import RunOptions, render, run, write_outputs
from .workloads import PROFILES, WORKLOADS

__all__ = ["PROFILES", "WORKLOADS", "BenchResult", "RunOptions", "render", "run", "write_outputs"]
