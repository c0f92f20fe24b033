"""The backend adapter: one small class per cache the harness compares.

A :class:`Backend` instance is one *store* (a file, a directory, a table, a
key prefix on a server, or a per-process object) created for one case of one
workload and destroyed after it.  :meth:`Backend.open` gives a
:class:`Handle` on that store for the calling process: plain callables
(``get``, ``set``, ``delete``), bound methods of the library wherever
possible, so the timing loops measure the library rather than the adapter.

Adding a backend is one class::

    @register
    class MyCache(Backend):
        name = "mycache"
        title = "mylib.MyCache (in-process LRU)"
        scope = Scope.PROCESS
        requires = ("mylib",)
        stores_objects = True

        def _create_local(self) -> Any:
            return import_module("mylib").MyCache(maxsize=self.capacity.max_items() or 10**9)

        def open(self) -> Handle:
            c = self.local_store()
            return Handle(get=c.get, set=c.__setitem__, delete=lambda k: c.pop(k, None))

A backend whose package or server is missing reports a one-line reason from
:meth:`Backend.unavailable` and is skipped; any exception while setting one
up is caught by the runner and reported the same way.
"""

from __future__ import annotations

import enum
import importlib
import importlib.metadata
import os
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

__all__ = [
    "Backend",
    "BackendContext",
    "Capacity",
    "Handle",
    "Scope",
    "import_module",
    "module_missing",
    "package_version",
]


class Scope(enum.Enum):
    """Who can see a store's entries."""

    PROCESS = "process"
    """Private to one process (dict, LRU objects, Django's locmem)."""
    HOST = "host"
    """Shared by the processes of one host (shared memory, files, SQLite)."""
    NETWORK = "network"
    """Shared over a socket (Redis, memcached, and tiers in front of them)."""


@dataclass(frozen=True)
class Capacity:
    """The bound a workload asks for; each backend maps it to its own knob.

    Either ``items`` (hold at most about that many entries, as Django's
    ``MAX_ENTRIES``) or ``bytes`` (a memory budget, as Cache::FastMmap's
    ``cache_size``), or neither (unbounded).  ``entry_bytes`` is the typical
    key + serialized value size, used to convert one into the other for
    backends that only have the other knob.  ``key_space`` is the number of
    distinct keys the workload writes when its sets mostly rewrite keys
    already stored (``django-8proc``: 1,100 keys); ``None`` when every key it
    stores is new.  A cache sized in bytes holds fewer entries when sets
    rewrite keys (the replaced entries take space until a compaction), so
    nearcache's calibration replays that pattern.
    """

    items: int | None = None
    bytes: int | None = None
    entry_bytes: int = 200
    key_bytes: int = 36
    value_bytes: int = 164
    key_space: int | None = None

    @property
    def bounded(self) -> bool:
        """Whether the workload asks for a bound at all."""
        return self.items is not None or self.bytes is not None

    def max_items(self) -> int | None:
        """The bound as an entry count (``bytes // entry_bytes`` for a byte budget)."""
        if self.items is not None:
            return self.items
        if self.bytes is not None:
            return max(1, self.bytes // max(1, self.entry_bytes))
        return None

    def max_bytes(self) -> int | None:
        """The bound as bytes (``items * entry_bytes`` for an entry count)."""
        if self.bytes is not None:
            return self.bytes
        if self.items is not None:
            return self.items * self.entry_bytes
        return None

    def describe(self) -> str:
        """Human form, e.g. ``1,000 entries`` or ``1.0 MiB``."""
        if self.items is not None:
            return f"{self.items:,} entries"
        if self.bytes is not None:
            return format_bytes(self.bytes)
        return "unbounded"


def format_bytes(n: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024.0 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024.0
    return f"{n} B"


@dataclass
class BackendContext:
    """What a backend may use: a scratch directory and the servers of this run."""

    workdir: Path
    run_id: str
    redis_url: str | None = None
    memcached: tuple[str, int] | None = None
    servers_owned: bool = False
    options: dict[str, Any] = field(default_factory=dict)

    def scratch(self, tag: str) -> Path:
        """A fresh directory under the work directory, unique to ``tag``."""
        path = self.workdir / tag
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        return path


def _noop() -> None:
    return None


@dataclass
class Handle:
    """One process's access to a store: the callables the timing loops call.

    ``get(key)`` returns the value or ``None`` on a miss; ``set(key, value)``
    stores (its return value is ignored); ``delete(key)`` removes.
    """

    get: Callable[[str], Any]
    set: Callable[[str, Any], object]
    delete: Callable[[str], object]
    close: Callable[[], None] = _noop


def import_module(name: str) -> Any:
    """Import an optional dependency, typed as ``Any`` (most peers ship no stubs).

    A module already imported comes straight from ``sys.modules``:
    backends call this in ``open()``, which open-per-request times, and
    ``importlib.import_module`` costs about 0.3 us even then (the same for
    every backend, but not a cost of the cache being measured).
    """
    module = sys.modules.get(name)
    return module if module is not None else importlib.import_module(name)


def module_missing(*names: str) -> str | None:
    """A one-line reason if one of ``names`` cannot be imported, else None."""
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # ImportError, or a broken install
            return f"{name} not importable ({type(exc).__name__}: {exc})".split("\n")[0]
    return None


def package_version(dist: str) -> str:
    """The installed version of distribution ``dist``, or an empty string."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return ""


class Backend:
    """Base class of the adapters.  Subclasses set the class attributes and :meth:`open`.

    Construction creates the store (sized by ``capacity``); :meth:`destroy`
    removes it.  Instances must survive ``fork``: the multi-process runner
    builds the backend in the parent and calls :meth:`open` in every worker.
    """

    #: Short name used on the command line and in tables.
    name: ClassVar[str] = ""
    #: One line saying what exactly is measured.
    title: ClassVar[str] = ""
    scope: ClassVar[Scope] = Scope.PROCESS
    #: Modules that must import for the backend to run.
    requires: ClassVar[tuple[str, ...]] = ()
    #: Distribution whose version is recorded.
    dist: ClassVar[str] = ""
    #: True if ``set`` accepts any picklable object; False if it takes bytes only
    #: (the workloads then pickle complex values themselves).
    stores_objects: ClassVar[bool] = False
    #: What the backend gives up for its speed (quoted where nearcache loses to it).
    tradeoff: ClassVar[str] = ""
    #: Which server the backend needs: None, "redis" or "memcached".
    server: ClassVar[str | None] = None
    #: Whether it is part of the nearcache family (relative columns compare to these).
    ours: ClassVar[bool] = False

    def __init__(self, ctx: BackendContext, capacity: Capacity, tag: str) -> None:
        self.ctx = ctx
        self.capacity = capacity
        self.tag = tag
        self._local: tuple[int, Any] | None = None
        self._limit = "unbounded"
        self.setup()

    # -- availability ------------------------------------------------------

    @classmethod
    def unavailable(cls, ctx: BackendContext) -> str | None:
        """A one-line reason this backend cannot run here, or None."""
        missing = module_missing(*cls.requires)
        if missing:
            return missing
        if cls.server == "redis" and not ctx.redis_url:
            return "needs a Redis server (--redis URL or --start-servers)"
        if cls.server == "memcached" and ctx.memcached is None:
            return "needs a memcached server (--memcached HOST:PORT or --start-servers)"
        return None

    @classmethod
    def version(cls) -> str:
        """Version of the measured library."""
        return package_version(cls.dist) if cls.dist else ""

    # -- lifecycle -----------------------------------------------------------

    def setup(self) -> None:
        """Create the store.  Called once, in the process that constructs the backend."""

    def open(self) -> Handle:
        """A handle for the calling process."""
        raise NotImplementedError

    def clear(self) -> None:
        """Remove every entry of the store."""
        raise NotImplementedError

    def before_fork(self) -> None:
        """Release process-bound resources (connections) before worker processes fork."""

    def destroy(self) -> None:
        """Remove the store and everything it created."""

    def limit(self) -> str:
        """The bound in effect, in words (``"MAX_ENTRIES=1000"``, ``"1.0 MiB file"``)."""
        return self._limit

    # -- helpers for process-local stores ------------------------------------

    def _create_local(self) -> Any:
        """Build the per-process store object (process-scope backends)."""
        raise NotImplementedError

    def local_store(self) -> Any:
        """This process's store object, created on first use in each process."""
        pid = os.getpid()
        if self._local is None or self._local[0] != pid:
            self._local = (pid, self._create_local())
        return self._local[1]
