"""Backend adapters: every cache the harness compares, one small class each.

See :mod:`nearcache.bench.backends.base` for the adapter contract.
"""

from __future__ import annotations

from .base import Backend, BackendContext, Capacity, Handle, Scope
from .registry import all_backends, get_backend, register

__all__ = [
    "Backend",
    "BackendContext",
    "Capacity",
    "Handle",
    "Scope",
    "all_backends",
    "get_backend",
    "register",
]
