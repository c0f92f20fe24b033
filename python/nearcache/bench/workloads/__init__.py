"""The workloads, each named after the seed study it reproduces."""

from __future__ import annotations

from .base import PROFILES, Case, Profile, Workload
from .chi2010 import Chi2010
from .django8proc import Django8proc
from .e2e import E2e
from .fastmmap2004 import Fastmmap2004
from .holding import Holding
from .large import Large
from .locks import Locks
from .open_per_request import OpenPerRequest
from .perl_chi2010 import PerlChi2010
from .scaling import Scaling
from .traces import Traces
from .value_sizes import ValueSizes
from .zipf import Zipf

__all__ = [
    "PROFILES",
    "WORKLOADS",
    "Case",
    "Profile",
    "Workload",
    "default_workloads",
    "get_workload",
]

#: Workload classes by name, in the order ``nearcache bench`` runs them.
WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls
    for cls in (
        Chi2010,
        Fastmmap2004,
        OpenPerRequest,
        Django8proc,
        Zipf,
        Holding,
        Scaling,
        ValueSizes,
        E2e,
        Traces,
        Large,
        Locks,
    )
}
WORKLOADS[PerlChi2010.name] = PerlChi2010  # runs when Perl and the built Perl modules are present


def default_workloads() -> list[str]:
    """The workloads a plain ``nearcache bench`` runs (not those that run only when named)."""
    return [name for name, cls in WORKLOADS.items() if not cls.only_when_named]


def get_workload(name: str) -> type[Workload]:
    """The workload class called ``name`` (KeyError listing the known names otherwise)."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})") from None
