"""The workloads, each named after the seed study it reproduces."""

from __future__ import annotations

from .base import PROFILES, Case, Profile, Workload
from .chi2010 import Chi2010
from .django8proc import Django8proc
from .fastmmap2004 import Fastmmap2004
from .open_per_request import OpenPerRequest
from .zipf import Zipf

__all__ = ["PROFILES", "WORKLOADS", "Case", "Profile", "Workload", "get_workload"]

#: Workload classes by name, in the order ``nearcache bench`` runs them.
WORKLOADS: dict[str, type[Workload]] = {
    cls.name: cls for cls in (Chi2010, Fastmmap2004, OpenPerRequest, Django8proc, Zipf)
}


def get_workload(name: str) -> type[Workload]:
    """The workload class called ``name`` (KeyError listing the known names otherwise)."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise KeyError(f"unknown workload {name!r} (known: {', '.join(WORKLOADS)})") from None
