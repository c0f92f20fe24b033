"""In-process peers: a plain dict (the floor), cachetools and cachebox LRU caches."""

from __future__ import annotations

import sys
from typing import Any

from .base import Backend, Handle, Scope, import_module
from .registry import register

__all__ = ["CacheboxLRU", "CachetoolsLRU", "DictBackend"]

_PROCESS_TRADEOFF = (
    "keeps a reference to the object inside one process: no copy, no lock, "
    "nothing shared with other processes"
)


class _MappingBackend(Backend):
    """An in-process store used through the mapping protocol (get, item
    assignment, pop); each process has its own (``local_store``)."""

    def open(self) -> Handle:
        store = self.local_store()
        pop = store.pop
        return Handle(
            get=store.get, set=store.__setitem__, delete=lambda k: pop(k, None) is not None
        )

    def clear(self) -> None:
        self.local_store().clear()


@register
class DictBackend(_MappingBackend):
    """A plain ``dict``: the fastest Python can store and fetch a reference."""

    name = "dict"
    title = "dict (in-process, unbounded, no eviction: the floor)"
    scope = Scope.PROCESS
    stores_objects = True
    tradeoff = _PROCESS_TRADEOFF + ", no eviction"

    def setup(self) -> None:
        self._limit = "unbounded (no eviction)"

    def _create_local(self) -> dict[str, Any]:
        return {}


@register
class CachetoolsLRU(_MappingBackend):
    """``cachetools.LRUCache``, pure Python."""

    name = "cachetools"
    title = "cachetools.LRUCache (in-process, pure Python)"
    scope = Scope.PROCESS
    requires = ("cachetools",)
    dist = "cachetools"
    stores_objects = True
    tradeoff = _PROCESS_TRADEOFF

    def setup(self) -> None:
        n = self.capacity.max_items()
        self._maxsize = n if n is not None else sys.maxsize
        self._limit = f"maxsize={n:,}" if n is not None else "unbounded"

    def _create_local(self) -> Any:
        return import_module("cachetools").LRUCache(maxsize=self._maxsize)


@register
class CacheboxLRU(_MappingBackend):
    """``cachebox.LRUCache``, implemented in Rust."""

    name = "cachebox"
    title = "cachebox.LRUCache (in-process, Rust)"
    scope = Scope.PROCESS
    requires = ("cachebox",)
    dist = "cachebox"
    stores_objects = True
    tradeoff = _PROCESS_TRADEOFF

    def setup(self) -> None:
        n = self.capacity.max_items()
        self._maxsize = n if n is not None else 0  # 0 = unbounded for cachebox
        self._limit = f"maxsize={n:,}" if n is not None else "unbounded"

    def _create_local(self) -> Any:
        return import_module("cachebox").LRUCache(self._maxsize)
