"""File-backed peers shared by the processes of one host: diskcache and LMDB."""

from __future__ import annotations

import contextlib
import os
import shutil
from typing import Any

from .base import Backend, Handle, Scope, format_bytes, import_module
from .registry import register

__all__ = ["DiskcacheBackend", "DiskcacheFanout", "LmdbBackend"]


class _DiskcacheBase(Backend):
    scope = Scope.HOST
    requires = ("diskcache",)
    dist = "diskcache"
    stores_objects = True
    tradeoff = "SQLite index plus files: persistent across reboots, pays a SQL query per call"

    def _size_limit(self) -> int:
        """diskcache bounds bytes, not entries: a byte budget maps to ``size_limit``.

        An entry-count bound cannot be expressed (its ``size_limit`` also counts
        the SQLite file's pages), so it keeps its default 1 GiB limit then, as
        in the diskcache study.
        """
        budget = self.capacity.bytes
        if budget is not None:
            self._limit = f"size_limit={format_bytes(budget)}"
            return budget
        self._limit = "size_limit=1 GiB (default; no entry-count limit)"
        return 2**30

    def setup(self) -> None:
        self.directory = str(self.ctx.scratch(self.tag))
        self.size_limit = self._size_limit()
        self._make().close()

    def _make(self) -> Any:
        raise NotImplementedError

    def open(self) -> Handle:
        cache = self._make()
        return Handle(get=cache.get, set=cache.set, delete=cache.delete, close=cache.close)

    def clear(self) -> None:
        cache = self._make()
        try:
            cache.clear()
        finally:
            cache.close()

    def destroy(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)


@register
class DiskcacheBackend(_DiskcacheBase):
    """``diskcache.Cache``: one SQLite database plus a directory of large values."""

    name = "diskcache"
    title = "diskcache.Cache (SQLite + files, one shard)"

    def _make(self) -> Any:
        return import_module("diskcache").Cache(self.directory, size_limit=self.size_limit)


@register
class DiskcacheFanout(_DiskcacheBase):
    """``diskcache.FanoutCache``: 8 SQLite shards, 10 ms timeout (its defaults)."""

    name = "diskcache-fanout"
    title = "diskcache.FanoutCache (8 SQLite shards, defaults)"

    def _make(self) -> Any:
        return import_module("diskcache").FanoutCache(self.directory, size_limit=self.size_limit)


@register
class LmdbBackend(Backend):
    """LMDB through py-lmdb: a memory-mapped B+tree, one write transaction per set."""

    name = "lmdb"
    title = "lmdb (memory-mapped B+tree, sync=False, no eviction)"
    scope = Scope.HOST
    requires = ("lmdb",)
    dist = "lmdb"
    tradeoff = "a persistent key-value store, not a cache: no eviction, no expiry"

    MAP_SIZE = 1 << 30

    def setup(self) -> None:
        self.directory = str(self.ctx.scratch(self.tag))
        self._limit = "unbounded (no eviction; 1 GiB map)"
        self._env().close()

    def _env(self) -> Any:
        # One reader slot per process: the scaling workload runs up to 4x the
        # core count of processes (256 on a 64-core host), plus headroom.
        readers = max(256, 8 * (os.cpu_count() or 1) + 16)
        return import_module("lmdb").open(
            self.directory, map_size=self.MAP_SIZE, sync=False, metasync=False, max_readers=readers
        )

    def open(self) -> Handle:
        env = self._env()
        begin = env.begin

        def get(key: str) -> bytes | None:
            with begin() as txn:
                value: bytes | None = txn.get(key.encode())
                return value

        def set_(key: str, value: bytes) -> None:
            with begin(write=True) as txn:
                txn.put(key.encode(), value)

        def delete(key: str) -> bool:
            with begin(write=True) as txn:
                return bool(txn.delete(key.encode()))

        return Handle(get=get, set=set_, delete=delete, close=env.close)

    def clear(self) -> None:
        env = self._env()
        try:
            with env.begin(write=True) as txn:
                txn.drop(env.open_db(), delete=False)
        finally:
            env.close()

    def destroy(self) -> None:
        with contextlib.suppress(OSError):
            shutil.rmtree(self.directory)
