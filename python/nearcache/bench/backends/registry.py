"""The list of known backends, in the order tables show them."""

from __future__ import annotations

import importlib
from typing import TypeVar

from .base import Backend

__all__ = ["all_backends", "get_backend", "register"]

_B = TypeVar("_B", bound=type[Backend])
_REGISTRY: dict[str, type[Backend]] = {}

# Modules that define backends; imported on first use of the registry.
_MODULES = ("ours", "memory", "disk", "djangocaches", "network")
_loaded = False


def register(cls: _B) -> _B:
    """Class decorator adding a backend to the registry (names must be unique)."""
    if not cls.name:
        raise ValueError(f"{cls.__qualname__} has no name")
    existing = _REGISTRY.get(cls.name)
    if existing is not None and existing is not cls:
        raise ValueError(f"backend name {cls.name!r} registered twice")
    _REGISTRY[cls.name] = cls
    return cls


def _load() -> None:
    global _loaded
    if not _loaded:
        for mod in _MODULES:
            importlib.import_module(f"{__package__}.{mod}")
        _loaded = True


def all_backends() -> list[type[Backend]]:
    """Every known backend class, nearcache's first."""
    _load()
    return list(_REGISTRY.values())


def get_backend(name: str) -> type[Backend]:
    """The backend class called ``name`` (KeyError with the known names otherwise)."""
    _load()
    try:
        return _REGISTRY[name]
    except KeyError:
        known = ", ".join(_REGISTRY)
        raise KeyError(f"unknown backend {name!r} (known: {known})") from None


def ours_names() -> set[str]:
    """Names of nearcache's own backends (highlighted in charts)."""
    return {cls.name for cls in all_backends() if cls.ours}


def network_names() -> set[str]:
    """Names of backends that go through a socket."""
    from .base import Scope

    return {cls.name for cls in all_backends() if cls.scope is Scope.NETWORK}
