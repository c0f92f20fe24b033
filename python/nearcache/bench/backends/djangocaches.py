"""Django cache backends, configured programmatically.

If Django's settings are not configured yet, :func:`ensure_django` configures
them with a throw-away SQLite database in a temporary directory (removed at
exit) and calls ``django.setup()``.  Backends are then built directly from
their classes with a params dict, the way Django's ``caches`` does from a
``CACHES`` entry: ``TIMEOUT=None`` (no expiry), and ``MAX_ENTRIES`` set to the
workload's bound (Django's default of 300 otherwise).

If the host program configured Django itself, every backend but the database
one still runs; the database backend refuses to create tables in somebody
else's database.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, ClassVar

from .base import Backend, BackendContext, Handle, Scope, format_bytes, import_module
from .network import FOREIGN_EXPIRY, redis_delete_prefix
from .ours import nearcache_file_size, remove_cache_file
from .registry import register

__all__ = [
    "DjangoDatabase",
    "DjangoDiskcache",
    "DjangoFilebased",
    "DjangoLocmem",
    "DjangoMemcached",
    "DjangoNearcache",
    "DjangoRedis",
    "ensure_django",
]

#: MAX_ENTRIES used when a workload sets no bound.
UNBOUNDED_ENTRIES = 10**9

_state: dict[str, Any] = {"configured_by_us": False}


def ensure_django() -> bool:
    """Configure Django if nobody has; True if the settings are this module's own."""
    conf = import_module("django.conf")
    if not conf.settings.configured:
        directory = tempfile.mkdtemp(prefix="nearcache-bench-django-")
        atexit.register(shutil.rmtree, directory, True)
        conf.settings.configure(
            DATABASES={
                "default": {
                    "ENGINE": "django.db.backends.sqlite3",
                    "NAME": str(Path(directory) / "cache.sqlite3"),
                    "OPTIONS": {"timeout": 20},
                }
            },
            CACHES={"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}},
            INSTALLED_APPS=[],
            USE_TZ=True,
        )
        import_module("django").setup()
        _state["configured_by_us"] = True
    return bool(_state["configured_by_us"])


class _DjangoBackend(Backend):
    """Shared plumbing: a params dict, and a fresh backend object per :meth:`open`."""

    requires: ClassVar[tuple[str, ...]] = ("django",)
    dist = "Django"
    stores_objects = True
    #: Dotted path of the Django cache class.
    backend_path = ""
    #: Whether the class takes MAX_ENTRIES/CULL_FREQUENCY (the server-backed ones pass
    #: OPTIONS to their client library instead).
    culls: ClassVar[bool] = True

    @classmethod
    def unavailable(cls, ctx: BackendContext) -> str | None:
        reason = super().unavailable(ctx)
        if reason is None:
            try:
                ensure_django()
            except Exception as exc:
                return f"Django could not be configured ({exc})".split("\n")[0]
        return reason

    def setup(self) -> None:
        ensure_django()
        n = self.capacity.max_items()
        self.max_entries = n if n is not None else UNBOUNDED_ENTRIES
        self._limit = f"MAX_ENTRIES={n:,}" if n is not None else "unbounded"
        self.location = self.make_location()
        options = {"MAX_ENTRIES": self.max_entries, "CULL_FREQUENCY": 3} if self.culls else {}
        self.params: dict[str, Any] = {"TIMEOUT": None, "OPTIONS": options}
        self.params.update(self.extra_params())

    def make_location(self) -> str:
        """The ``LOCATION`` of the cache."""
        return f"nearcache-bench-{self.ctx.run_id}-{self.tag}"

    def extra_params(self) -> dict[str, Any]:
        """Params beyond TIMEOUT/MAX_ENTRIES."""
        return {}

    def make(self) -> Any:
        """A new Django cache object on this store."""
        module, _, cls = self.backend_path.rpartition(".")
        return getattr(import_module(module), cls)(self.location, self.params)

    def open(self) -> Handle:
        cache = self.make()
        return Handle(get=cache.get, set=cache.set, delete=cache.delete, close=cache.close)

    def clear(self) -> None:
        cache = self.make()
        try:
            cache.clear()
        finally:
            cache.close()


@register
class DjangoLocmem(_DjangoBackend):
    """``django.core.cache.backends.locmem.LocMemCache``."""

    name = "django-locmem"
    title = "Django LocMemCache (per process, pickles values, culls 1/3 at MAX_ENTRIES)"
    scope = Scope.PROCESS
    backend_path = "django.core.cache.backends.locmem.LocMemCache"
    tradeoff = "private to each process (not shared), so every process misses separately"


@register
class DjangoFilebased(_DjangoBackend):
    """``django.core.cache.backends.filebased.FileBasedCache``."""

    name = "django-filebased"
    title = "Django FileBasedCache (one file per key; lists the directory on every set)"
    scope = Scope.HOST
    backend_path = "django.core.cache.backends.filebased.FileBasedCache"
    tradeoff = "one file per entry"

    def make_location(self) -> str:
        return str(self.ctx.scratch(self.tag))

    def destroy(self) -> None:
        shutil.rmtree(self.location, ignore_errors=True)


@register
class DjangoDatabase(_DjangoBackend):
    """``django.core.cache.backends.db.DatabaseCache`` on SQLite."""

    name = "django-db"
    title = "Django DatabaseCache (SQLite, connection closed per request as Django does)"
    scope = Scope.HOST
    backend_path = "django.core.cache.backends.db.DatabaseCache"
    tradeoff = "a SQL round trip per call"

    @classmethod
    def unavailable(cls, ctx: BackendContext) -> str | None:
        reason = super().unavailable(ctx)
        if reason is None and not ensure_django():
            reason = "Django settings belong to the host program; not creating tables there"
        return reason

    def make_location(self) -> str:
        return "bench_" + re.sub(r"[^A-Za-z0-9_]", "_", f"{self.ctx.run_id}_{self.tag}")

    def setup(self) -> None:
        super().setup()
        command = import_module("django.core.management.commands.createcachetable").Command()
        command.verbosity = 0
        command.create_table("default", self.location, False)
        self.before_fork()

    def open(self) -> Handle:
        cache = self.make()
        connections = import_module("django.db").connections

        def close() -> None:
            cache.close()
            connections.close_all()

        return Handle(get=cache.get, set=cache.set, delete=cache.delete, close=close)

    def before_fork(self) -> None:
        import_module("django.db").connections.close_all()

    def destroy(self) -> None:
        db = import_module("django.db")
        with contextlib.suppress(Exception), db.connection.cursor() as cursor:
            cursor.execute(f'DROP TABLE IF EXISTS "{self.location}"')
        db.connections.close_all()


@register
class DjangoDiskcache(_DjangoBackend):
    """``diskcache.DjangoCache``: the backend the diskcache study measured."""

    name = "django-diskcache"
    title = "diskcache.DjangoCache (8 SQLite shards, 10 ms timeout, retries)"
    scope = Scope.HOST
    requires = ("django", "diskcache")
    dist = "diskcache"
    backend_path = "diskcache.DjangoCache"
    tradeoff = "SQLite index plus files: persistent across reboots, pays a SQL query per call"

    def make_location(self) -> str:
        return str(self.ctx.scratch(self.tag))

    def extra_params(self) -> dict[str, Any]:
        budget = self.capacity.bytes
        if budget is None:
            self._limit = "size_limit=1 GiB (default; no entry-count limit)"
            return {}
        self._limit = f"size_limit={format_bytes(budget)}"
        return {"OPTIONS": {"size_limit": budget}}

    def destroy(self) -> None:
        shutil.rmtree(self.location, ignore_errors=True)


@register
class DjangoNearcache(_DjangoBackend):
    """``nearcache.contrib.django.NearCache``: nearcache's own Django backend."""

    name = "django-nearcache"
    title = "nearcache.contrib.django.NearCache (shared memory, bounded by its file size)"
    scope = Scope.HOST
    requires = ("django", "nearcache._native", "nearcache.contrib.django")
    dist = "nearcache"
    backend_path = "nearcache.contrib.django.NearCache"
    ours = True

    def make_location(self) -> str:
        directory = self.ctx.options.get("nearcache_dir")
        if directory is None:
            directory = import_module("nearcache._native").default_directory()
        return str(Path(str(directory)) / f"bench-{self.ctx.run_id}-{self.tag}")

    def extra_params(self) -> dict[str, Any]:
        # Bounded by the file, as the brief of django-8proc asks ("size the file
        # so it holds about 1,000 entries"): MAX_ENTRIES=None turns Django-style
        # random culling off and lets the engine evict.  Django's key function
        # adds ":1:" to every key, so the calibration counts those bytes too.
        cap = self.capacity
        if cap.items is not None:
            cap = dataclasses.replace(cap, key_bytes=cap.key_bytes + len(":1:"))
        self.size, self._limit = nearcache_file_size(self.ctx, cap)
        return {"OPTIONS": {"size": self.size, "MAX_ENTRIES": None}}

    def destroy(self) -> None:
        remove_cache_file(self.location)


@register
class DjangoRedis(_DjangoBackend):
    """``django.core.cache.backends.redis.RedisCache`` (Django's own, on redis-py)."""

    name = "django-redis"
    title = "Django RedisCache (redis-py, local redis-server)"
    scope = Scope.NETWORK
    requires = ("django", "redis")
    server = "redis"
    backend_path = "django.core.cache.backends.redis.RedisCache"
    culls = False
    tradeoff = "a network server: one round trip per call, but shared by every host"

    def make_location(self) -> str:
        return str(self.ctx.redis_url)

    def extra_params(self) -> dict[str, Any]:
        self._limit = "unbounded (server maxmemory left as is)"
        return {"KEY_PREFIX": f"nearcache-bench:{self.ctx.run_id}:{self.tag}"}

    def clear(self) -> None:
        # Django's RedisCache.clear() is FLUSHDB: delete only this store's prefix.
        redis_delete_prefix(self.location, str(self.params["KEY_PREFIX"]) + ":")

    def destroy(self) -> None:
        with contextlib.suppress(Exception):
            self.clear()


@register
class DjangoMemcached(_DjangoBackend):
    """``django.core.cache.backends.memcached.PyMemcacheCache``."""

    name = "django-memcached"
    title = "Django PyMemcacheCache (pymemcache, local memcached)"
    scope = Scope.NETWORK
    requires = ("django", "pymemcache")
    server = "memcached"
    backend_path = "django.core.cache.backends.memcached.PyMemcacheCache"
    culls = False
    tradeoff = "a network server: one round trip per call, but shared by every host"

    def setup(self) -> None:
        self.generation = 0
        super().setup()

    def make_location(self) -> str:
        assert self.ctx.memcached is not None
        host, port = self.ctx.memcached
        return f"{host}:{port}"

    def extra_params(self) -> dict[str, Any]:
        self._limit = "unbounded (server memory limit)"
        params: dict[str, Any] = {
            "KEY_PREFIX": f"nearcache-bench:{self.ctx.run_id}:{self.tag}:{self.generation}"
        }
        if not self.ctx.servers_owned:
            params["TIMEOUT"] = FOREIGN_EXPIRY
        return params

    def clear(self) -> None:
        if self.ctx.servers_owned:
            super().clear()  # flush_all on a server this run started
        else:
            self.generation += 1
            self.params.update(self.extra_params())
