"""Django cache backends backed by nearcache.

``NearCache`` stores Django's cache in a nearcache shared-memory file, so
every worker process of a host (gunicorn, uWSGI, Celery...) shares one cache
without a server::

    CACHES = {
        "default": {
            "BACKEND": "nearcache.contrib.django.NearCache",
            "LOCATION": "mysite",          # a name under /dev/shm, or a path
            "TIMEOUT": 300,
            "OPTIONS": {"size": "256MiB"},  # the byte budget of the whole host
        }
    }

What Django documents for cache backends holds here:

* ``TIMEOUT``, ``KEY_PREFIX``, ``VERSION`` and ``KEY_FUNCTION`` work as for
  every backend.  A ``timeout`` of ``None`` never expires; ``0`` or less
  expires at once (``set`` removes the key, ``add`` stores nothing and
  returns True when the key was absent, ``touch`` removes it).
* Without ``MAX_ENTRIES`` the cache is bounded by its file's size alone
  (the engine evicts by its own policy), not by Django's default of 300
  entries: that count would cover the whole host's file, where
  ``LocMemCache`` keeps 300 entries in every process, so a site switching
  over would hold fewer entries than before.  Given explicitly,
  ``MAX_ENTRIES`` and ``CULL_FREQUENCY`` (default 3) work as in Django's
  local-memory and file backends: before a value is added while the cache
  holds ``MAX_ENTRIES`` entries or more, ``1/CULL_FREQUENCY`` of the
  entries (picked at random) are deleted, or all of them when
  ``CULL_FREQUENCY`` is 0.  The count covers the whole cache file, as the
  file backend counts every file of its directory.
* ``get_or_set`` is stampede-free across processes: when several workers
  miss the same key, one calls the default while the others wait for its
  result, for at most twice ``OPTIONS["stampede_wait"]`` (default
  :data:`DEFAULT_STAMPEDE_WAIT` seconds, 0 turns it off); see
  :meth:`NearCache._get_or_set_steps`.  :func:`cache_page` does the same
  for Django's per-view cache.  :meth:`NearCache.stats` counts computes,
  waits and fallbacks for the whole host.
* Keys are validated as by Django's built-in backends: a key that memcached
  would refuse raises a :class:`~django.core.cache.CacheKeyWarning` and is
  still used.  Keys longer than :data:`LONG_KEY` characters are stored under
  their SHA-256 digest.
* ``incr``/``decr`` are atomic across processes for integers stored by this
  backend (the engine's native 64-bit counter); other numbers (``float``,
  ``bool``, integers beyond 64 bits) go through a compare-and-swap loop,
  atomic too (the tiered backend keeps Django's get-then-set for those).
  Like every backend, a missing key raises ``ValueError`` and a value that
  cannot be added to raises ``TypeError``; the entry keeps its expiry.
* ``get_many``/``set_many``/``delete_many`` take each shard's lock once.
* The async methods (``aget``, ``aset``, ...) run the in-memory operation
  directly in the event loop; there is no thread hop, since an operation
  takes microseconds and never waits on I/O.  Only when (de)serializing a
  value needs the database (pickling a lazy ``QuerySet`` evaluates it, which
  Django forbids in async code) is the call run in a thread instead, as
  Django's default async methods always do.
* A value too large for the cache is not stored (a warning is logged) and
  any older value of the key is deleted, as Django's memcached backends do;
  ``set_many`` returns such keys.  A value the serializer cannot encode
  raises the serializer's error (``pickle.PickleError`` for pickle).

Other ``OPTIONS`` (besides ``stampede_wait``) are passed to
:class:`nearcache.Cache`: ``size``,
``shards``, ``serializer``, ``compress``, ``compress_threshold``,
``signing_key``, ``prefix``, ``recreate``, ``allow_foreign_owner``.  The
cache file is mapped once per process and shared by every alias and thread
that names the same ``LOCATION`` and options; ``close()`` (which Django calls
after each request) keeps it mapped.  A deploy that changes
``OPTIONS["size"]`` (or ``"shards"``) resizes the file live at the first
open by a new process: the entries are kept (on a shrink, the most recently
written that fit) and the processes of the previous deploy that still have
it open follow the new file at their next operation.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Awaitable, Callable, Generator, Iterable, Mapping
from typing import Any, Final

from asgiref.sync import sync_to_async
from django.core.cache.backends.base import (  # type: ignore[import-untyped]
    DEFAULT_TIMEOUT,
    MEMCACHE_MAX_KEY_LENGTH,
    BaseCache,
)
from django.core.exceptions import (  # type: ignore[import-untyped]
    ImproperlyConfigured,
    SynchronousOnlyOperation,
)

from nearcache._incompatible import Terms, reworded
from nearcache.cache import (
    DEFAULT_MAX_CONFLICTS,
    Cache,
    backoff_seconds,
    default_directory,
    update_conflict,
)
from nearcache.contrib.django.locks import (
    _COUNTER_PREFIX,
    _FIRST_POLL,
    _MAX_POLL,
    DEFAULT_STAMPEDE_WAIT,
    STAMPEDE_COUNTERS,
    release,
    stampede_wait,
)
from nearcache.errors import (
    IncompatibleFileError,
    NotACounterError,
    SerializationError,
    ValueTooLargeError,
)
from nearcache.locks import Lock
from nearcache.units import MAX_TTL_MS

__all__ = ["DEFAULT_LOCATION", "LONG_KEY", "NearCache", "open_cache"]

logger = logging.getLogger("nearcache.contrib.django")

#: Keys longer than this many characters are stored under their SHA-256 digest.
LONG_KEY: Final = 1024
#: Name of the cache file when ``LOCATION`` is empty.
DEFAULT_LOCATION: Final = "django"
#: ``OPTIONS`` passed through to :class:`nearcache.Cache`.
CACHE_OPTIONS: Final = frozenset(
    {
        "size",
        "shards",
        "serializer",
        "compress",
        "compress_threshold",
        "signing_key",
        "prefix",
        "recreate",
        "allow_foreign_owner",
        "spill_threshold",
        "spill_budget",
        "fs_reserve",
    }
)

_MISSING: Final = object()
# A Django timeout of 0 or less: the value expires at once.
_EXPIRED: Final = object()
_MAX_TTL_SECONDS: Final = MAX_TTL_MS // 1000

# The characters Django's memcache_key_warnings() warns about.
_memcached_bad_char: Final = re.compile(r"[\x00-\x20\x7f]").search

# (location, options) -> (the cache, the options it was opened with)
_open_caches: dict[tuple[Any, ...], tuple[Cache, dict[str, Any]]] = {}
_open_lock = threading.Lock()


def _freeze(value: Any) -> Any:
    """A hashable stand-in for an option value.

    Dicts and lists are compared by content; other unhashable objects by
    identity (the registries keep a reference to the options, so an id is
    never reused while its entry exists).
    """
    if isinstance(value, Mapping):
        return ("dict", tuple(sorted((str(k), _freeze(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("list", tuple(_freeze(v) for v in value))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return value


def open_cache(location: str, options: Mapping[str, Any]) -> Cache:
    """Return this process's :class:`~nearcache.Cache` for ``location``.

    ``location`` is a cache name (a file in nearcache's default directory) or,
    when it contains ``/`` or starts with ``~``, a path.  One object is kept
    per location and options, so every Django alias and thread naming the
    same file shares one mapping.
    """
    # Keyed by the file, not the name: a name means another file once
    # $NEARCACHE_DIR changes.
    key = (_location_path(location), _freeze(options))
    with _open_lock:
        entry = _open_caches.get(key)
        if entry is None or entry[0].closed:
            if "/" in location or location.startswith("~"):
                cache = Cache(path=os.path.expanduser(location), **options)
            else:
                cache = Cache(location or DEFAULT_LOCATION, **options)
            entry = _open_caches[key] = (cache, dict(options))
        return entry[0]


def _location_path(location: str) -> str:
    """The file ``LOCATION`` names: a path (``/`` in it, or ``~``), else a
    name in nearcache's default directory."""
    if "/" in location or location.startswith("~"):
        return os.path.expanduser(location)
    return os.path.join(default_directory(), location or DEFAULT_LOCATION)


def incompatible_in_settings(
    exc: IncompatibleFileError, location: str, options: Mapping[str, Any]
) -> IncompatibleFileError:
    """``exc`` (a file of another layout) in settings' terms.

    The engine's remedy speaks of ``Cache()`` arguments; a site changed its
    ``CACHES`` setting.  See :mod:`nearcache._incompatible`.
    """
    path = _location_path(location)
    given = [k for k in ("size", "shards") if options.get(k)]
    terms = Terms(
        asked=" and ".join(f'OPTIONS["{k}"] = {options[k]!r}' for k in given),
        recreate='OPTIONS["recreate"] = True',
        needs_size="" if options.get("size") else 'an OPTIONS["size"]',
    )
    return reworded(exc, path, terms, bool(options.get("allow_foreign_owner")))


def _check_options(backend: str, options: Mapping[str, Any], valid: Iterable[str]) -> None:
    """Raise ImproperlyConfigured for OPTIONS the backend does not know."""
    unknown = set(options) - set(valid)
    if unknown:
        hint = " (use TIMEOUT for the default expiry)" if "ttl" in unknown else ""
        raise ImproperlyConfigured(
            f"unknown OPTIONS for {backend}: {', '.join(sorted(unknown))}{hint}; "
            f"valid: MAX_ENTRIES, CULL_FREQUENCY, stampede_wait, {', '.join(sorted(valid))}"
        )


def _long_key(key: str) -> str:
    return "nearcache:sha256:" + hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


class NearCache(BaseCache):  # type: ignore[misc]
    """Django cache backend storing entries in a nearcache shared-memory file.

    See the module documentation for the settings it reads and the semantics
    of each operation.
    """

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        """Read Django's cache settings and open (or create) the cache file."""
        super().__init__(params)
        options = dict(params.get("OPTIONS") or {})
        # Unlike Django's local backends, no MAX_ENTRIES means no entry limit:
        # the file's size bounds the cache (see the module docs).
        max_entries = params.get("max_entries", options.pop("MAX_ENTRIES", None))
        options.pop("CULL_FREQUENCY", None)
        # BaseCache turned MAX_ENTRIES into an int (300 for None); None means
        # "no entry limit" here.
        self._max_entries: int | None = None if max_entries is None else self._max_entries
        self._stampede_wait = stampede_wait(options.pop("stampede_wait", DEFAULT_STAMPEDE_WAIT))
        self._location = location
        self._cache: Any = self._open(location, options)
        # Keys are made by Django's own make_key/validate_key unless a subclass
        # overrides them; then _key() calls the overrides.
        cls = type(self)
        self._plain_keys = (
            cls.make_key is BaseCache.make_key
            and cls.make_and_validate_key is BaseCache.make_and_validate_key
            and cls.validate_key is NearCache.validate_key
        )

    def _open(self, location: str, options: dict[str, Any]) -> Any:
        """Open the store from ``LOCATION`` and ``OPTIONS`` (less the cull options).

        Subclasses open another store with the same API (the driver API).
        """
        _check_options(type(self).__name__, options, CACHE_OPTIONS)
        try:
            return open_cache(location, options)
        except IncompatibleFileError as exc:
            raise incompatible_in_settings(exc, location, options) from exc
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"invalid nearcache cache {location!r}: {exc}") from exc

    def _get_with_ttl(self, key: str) -> tuple[Any, Any]:
        """The value of ``key`` (or a sentinel) and its remaining TTL (0: never)."""
        value = self._cache.get(key, _MISSING)
        if value is _MISSING:
            return _MISSING, None
        left = self._cache.ttl(key)
        if left is None:
            return _MISSING, None
        return value, 0 if math.isinf(left) else left

    @property
    def cache(self) -> Any:
        """The underlying :class:`nearcache.Cache` (for stats, ttl, memoize...)."""
        return self._cache

    def _lock_store(self) -> Cache | None:
        """The shared-memory cache that holds this backend's stampede locks and counters."""
        cache: Cache = self._cache
        return cache

    @property
    def stampede_wait(self) -> float:
        """Seconds one computation of a missing key holds the others back (0: off)."""
        return self._stampede_wait

    def stampede_lock(self, name: str) -> Lock | None:
        """A cross-process lock named ``name``, expiring after :attr:`stampede_wait`.

        None when stampede protection is off (``stampede_wait`` 0) or the
        backend has no shared-memory store to hold the lock.
        """
        store = self._lock_store()
        if store is None or not self._stampede_wait:
            return None
        return Lock(store, "django:" + name, timeout=0, expire=self._stampede_wait)

    def count(self, counter: str) -> None:
        """Add one to the shared stampede counter ``counter`` (see :data:`STAMPEDE_COUNTERS`)."""
        store = self._lock_store()
        if store is not None:
            try:
                store.incr(_COUNTER_PREFIX + counter, 1, 0, 0)
            except Exception as exc:  # a counter must never fail a request
                logger.debug("stampede counter %s not counted: %s", counter, exc)

    def stats(self) -> dict[str, Any]:
        """The store's statistics plus the stampede counters, shared by every process.

        ``get_or_set_computes``: calls of a ``get_or_set`` default;
        ``get_or_set_waits``: misses answered by another process's computation;
        ``get_or_set_fallbacks``: callers that waited :attr:`stampede_wait`
        and then computed anyway; ``page_*``: the same for
        :func:`cache_page`.  The counters are entries of the cache file:
        :meth:`clear` resets them.
        """
        out: dict[str, Any] = dict(self._cache.stats())
        store = self._lock_store()
        for counter in STAMPEDE_COUNTERS:
            value = 0
            if store is not None:
                try:
                    value = store.incr(_COUNTER_PREFIX + counter, 0, 0, 0)
                except Exception:
                    value = 0
            out[counter] = value
        return out

    # ------------------------------------------------------------------ helpers

    def validate_key(self, key: str) -> None:
        """Warn about keys memcached would refuse, exactly as Django's backends do.

        Django's check costs microseconds per call (a generator and a lazily
        compiled regex); a key that passes the same two tests here (at most
        250 characters, no control character, space or DEL) skips it.
        """
        if len(key) > MEMCACHE_MAX_KEY_LENGTH or _memcached_bad_char(key) is not None:
            super().validate_key(key)

    def _key(self, key: Any, version: int | None) -> str:
        """Django's key (made and validated), shortened when very long."""
        made: str
        if self._plain_keys:
            # make_and_validate_key() inlined (same calls, fewer Python frames).
            made = self.key_func(key, self.key_prefix, self.version if version is None else version)
            if len(made) > MEMCACHE_MAX_KEY_LENGTH or _memcached_bad_char(made) is not None:
                BaseCache.validate_key(self, made)
        else:
            made = self.make_and_validate_key(key, version=version)
        if len(made) > LONG_KEY or not made:
            return _long_key(made)
        return made

    def _ttl(self, timeout: Any) -> Any:
        """Django timeout -> nearcache TTL: seconds, 0 (never) or :data:`_EXPIRED`."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            return 0
        if timeout <= 0:
            return _EXPIRED
        if timeout >= _MAX_TTL_SECONDS:
            return 0
        return timeout

    def _cull(self) -> None:
        """Make room as Django's local backends do before storing a new entry."""
        max_entries = self._max_entries
        if max_entries is None:
            return
        cache = self._cache
        if len(cache) < max_entries:
            return
        if self._cull_frequency == 0:
            cache.clear()
            return
        keys = cache.keys()
        doomed = len(keys) // self._cull_frequency
        if doomed > 0:
            cache.delete_many(random.sample(keys, doomed))

    def _store(self, key: str, value: Any, ttl: Any) -> bool:
        """Set one value (culling first); False if it was too large to store."""
        self._cull()
        try:
            self._cache.set(key, value, ttl)
        except ValueTooLargeError as exc:
            self._too_large(key, exc)
            return False
        except SerializationError as exc:
            raise _original(exc) from None
        return True

    def _too_large(self, key: str, exc: Exception) -> None:
        self._cache.delete(key)
        logger.warning("value for cache key %r not stored: %s", key, exc)

    # ---------------------------------------------------------------- sync API

    def add(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        """Store ``value`` if ``key`` is absent; return whether it was absent."""
        key = self._key(key, version)
        ttl = self._ttl(timeout)
        cache = self._cache
        if ttl is _EXPIRED:
            return key not in cache
        if self._max_entries is not None and key not in cache:
            self._cull()
        try:
            added: bool = cache.add(key, value, ttl)
        except ValueTooLargeError as exc:
            logger.warning("value for cache key %r not stored: %s", key, exc)
            return False
        except SerializationError as exc:
            raise _original(exc) from None
        return added

    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        """Return the value of ``key``, or ``default`` if it is missing or expired."""
        return self._cache.get(self._key(key, version), default)

    def set(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        """Store ``value`` under ``key``."""
        key = self._key(key, version)
        ttl = self._ttl(timeout)
        if ttl is _EXPIRED:
            self._cache.delete(key)
            return
        self._store(key, value, ttl)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None) -> bool:
        """Give ``key`` a new expiry; return whether it exists."""
        key = self._key(key, version)
        ttl = self._ttl(timeout)
        if ttl is _EXPIRED:
            deleted: bool = self._cache.delete(key)
            return deleted
        touched: bool = self._cache.touch(key, ttl)
        return touched

    def delete(self, key: Any, version: int | None = None) -> bool:
        """Delete ``key``; return whether it existed."""
        deleted: bool = self._cache.delete(self._key(key, version))
        return deleted

    def has_key(self, key: Any, version: int | None = None) -> bool:
        """Whether ``key`` is present and not expired."""
        return self._key(key, version) in self._cache

    def get_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        """Return ``{key: value}`` for the keys present (one lock per shard)."""
        made = {self._key(key, version): key for key in keys}
        if not made:
            return {}
        found = self._cache.get_many(list(made))
        return {made[k]: v for k, v in found.items()}

    def set_many(
        self,
        data: Mapping[Any, Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        """Store every item of ``data``; return the keys that were too large to store."""
        made = {self._key(key, version): (key, value) for key, value in data.items()}
        if not made:
            return []
        ttl = self._ttl(timeout)
        cache = self._cache
        if ttl is _EXPIRED:
            cache.delete_many(list(made))
            return []
        if self._max_entries is None or len(made) <= self._max_entries - len(cache):
            # No cull would happen part-way through: one batch.
            try:
                cache.set_many({k: value for k, (_, value) in made.items()}, ttl)
                return []
            except ValueTooLargeError:
                pass  # store one by one to learn which keys failed
            except SerializationError as exc:
                raise _original(exc) from None
        return [key for k, (key, value) in made.items() if not self._store(k, value, ttl)]

    def delete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        """Delete every key of ``keys`` (one lock per shard)."""
        made = [self._key(key, version) for key in keys]
        if made:
            self._cache.delete_many(made)

    def get_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> Any:
        """Return the value of ``key``; if missing, store ``default`` (called if callable).

        Stampede-free across processes: when several callers miss the same
        key, one calls ``default`` while the others wait for its result (see
        :meth:`_get_or_set_steps`).
        """
        steps = self._get_or_set_steps(key, default, timeout, version)
        while True:
            try:
                pause = next(steps)
            except StopIteration as done:
                return done.value
            time.sleep(pause)

    def _get_or_set_steps(
        self, key: Any, default: Any, timeout: Any, version: int | None
    ) -> Generator[float, None, Any]:
        """The logic of :meth:`get_or_set`, yielding the pauses (seconds) of its waits.

        On a miss with a callable ``default``, the caller takes the key's
        stampede lock (an entry created with the engine's atomic ``add``,
        expiring after ``stampede_wait`` seconds), checks the key again, calls
        ``default`` and stores the result with :meth:`add` as Django's own
        ``get_or_set`` does, then frees the lock.  A caller that finds the lock
        taken polls the key until the value appears (a wait) or it gets the
        lock itself (its holder failed to store or died: the lock expired);
        after twice ``stampede_wait`` it computes without the lock (a
        fallback).  The sync method sleeps, the async one awaits.
        """
        value = self.get(key, _MISSING, version=version)
        if value is not _MISSING:
            return value
        if not callable(default):
            return self._add_and_get(key, default, timeout, version)
        lock = self.stampede_lock(self._key(key, version))
        if lock is None:
            self.count("get_or_set_computes")
            return self._add_and_get(key, default(), timeout, version)
        deadline = time.monotonic() + 2 * self._stampede_wait
        pause = _FIRST_POLL
        waited = False
        while True:
            if lock.acquire(blocking=False):
                try:
                    value = self.get(key, _MISSING, version=version)
                    if value is not _MISSING:
                        if waited:
                            self.count("get_or_set_waits")
                        return value
                    self.count("get_or_set_computes")
                    return self._add_and_get(key, default(), timeout, version)
                finally:
                    release(lock)
            if time.monotonic() >= deadline:
                self.count("get_or_set_fallbacks")
                self.count("get_or_set_computes")
                return self._add_and_get(key, default(), timeout, version)
            yield pause * (0.5 + random.random())
            pause = min(pause * 1.5, _MAX_POLL)
            waited = True
            value = self.get(key, _MISSING, version=version)
            if value is not _MISSING:
                self.count("get_or_set_waits")
                return value

    def _add_and_get(self, key: Any, value: Any, timeout: Any, version: int | None) -> Any:
        """Django's ``get_or_set`` after the miss: add, or return what won.

        The result is a value the cache held: ours if the add stored it
        (read back, as Django's own ``get_or_set`` does, so it is the
        deserialized copy), else the one another caller added first.  If
        that one is gone again before it is read (deleted, expired), the add
        is tried again rather than returning a value that was never stored.
        """
        for _ in range(_ADD_TRIES):
            if self.add(key, value, timeout=timeout, version=version):
                return self.get(key, value, version=version)
            current = self.get(key, _MISSING, version=version)
            if current is not _MISSING:
                return current
        return value

    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """Add ``delta`` to the number under ``key``; atomic for 64-bit integers.

        Raises ``ValueError`` if ``key`` is missing, ``TypeError`` if its value
        is not a number.  The entry keeps its expiry.
        """
        key = self._key(key, version)
        try:
            return self._cache.incr(key, delta, None)
        except KeyError:
            raise ValueError(f"Key '{key}' not found") from None
        except (NotACounterError, OverflowError, TypeError):
            pass
        # Not a native 64-bit counter (float, bool, big int, a pickled int of
        # a signed cache...): on shared memory a compare-and-swap loop, so a
        # concurrent increment is never lost; it keeps the entry's expiry.
        if isinstance(self._cache, Cache):
            return _incr_cas(self._cache, key, delta)
        value, left = self._get_with_ttl(key)
        if value is _MISSING:
            raise ValueError(f"Key '{key}' not found")
        new_value = value + delta
        self._cache.set(key, new_value, left)
        return new_value

    def decr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """Subtract ``delta``; see :meth:`incr`."""
        return self.incr(key, -delta, version=version)

    def clear(self) -> None:
        """Remove every entry of the cache file (every alias sharing it too)."""
        self._cache.clear()

    def close(self, **kwargs: Any) -> None:
        """Called by Django after each request: the file stays mapped for the next."""

    # --------------------------------------------------------------- async API
    # An operation is a few microseconds of in-memory work that never waits on
    # I/O, so it runs directly in the event loop, without sync_to_async.  The
    # one exception: (de)serializing a value runs user code, which may touch
    # the database (pickling a lazy QuerySet evaluates it) and so raise
    # SynchronousOnlyOperation in async code; such a call is run again in a
    # thread, as Django's default async methods always do.  Nothing is written
    # before a value is serialized, so the retry is safe.

    async def aadd(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        """Async :meth:`add`."""
        try:
            return self.add(key, value, timeout, version)
        except SynchronousOnlyOperation:
            added: bool = await _in_thread(self.add)(key, value, timeout, version)
            return added

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        """Async :meth:`get`."""
        try:
            return self.get(key, default, version)
        except SynchronousOnlyOperation:
            return await _in_thread(self.get)(key, default, version)

    async def aset(
        self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> None:
        """Async :meth:`set`."""
        try:
            self.set(key, value, timeout, version)
        except SynchronousOnlyOperation:
            await _in_thread(self.set)(key, value, timeout, version)

    async def atouch(
        self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> bool:
        """Async :meth:`touch`."""
        return self.touch(key, timeout, version)

    async def adelete(self, key: Any, version: int | None = None) -> bool:
        """Async :meth:`delete`."""
        return self.delete(key, version)

    async def ahas_key(self, key: Any, version: int | None = None) -> bool:
        """Async :meth:`has_key`."""
        return self.has_key(key, version)

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> dict[Any, Any]:
        """Async :meth:`get_many`."""
        keys = list(keys)
        try:
            return self.get_many(keys, version)
        except SynchronousOnlyOperation:
            found: dict[Any, Any] = await _in_thread(self.get_many)(keys, version)
            return found

    async def aset_many(
        self,
        data: Mapping[Any, Any],
        timeout: Any = DEFAULT_TIMEOUT,
        version: int | None = None,
    ) -> list[Any]:
        """Async :meth:`set_many`."""
        try:
            return self.set_many(data, timeout, version)
        except SynchronousOnlyOperation:
            failed: list[Any] = await _in_thread(self.set_many)(data, timeout, version)
            return failed

    async def adelete_many(self, keys: Iterable[Any], version: int | None = None) -> None:
        """Async :meth:`delete_many`."""
        self.delete_many(keys, version)

    async def aget_or_set(
        self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None
    ) -> Any:
        """Async :meth:`get_or_set` (a callable ``default`` is called without a thread hop).

        Waits for another process's computation with :func:`asyncio.sleep`.
        """
        try:
            steps = self._get_or_set_steps(key, default, timeout, version)
            while True:
                try:
                    pause = next(steps)
                except StopIteration as done:
                    return done.value
                await asyncio.sleep(pause)
        except SynchronousOnlyOperation:
            return await _in_thread(self.get_or_set)(key, default, timeout, version)

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """Async :meth:`incr`."""
        try:
            return self.incr(key, delta, version)
        except SynchronousOnlyOperation:
            return await _in_thread(self.incr)(key, delta, version)

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """Async :meth:`decr`."""
        return await self.aincr(key, -delta, version)

    async def aincr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        """Async :meth:`incr_version`."""
        try:
            new_version: int = self.incr_version(key, delta, version)
        except SynchronousOnlyOperation:
            new_version = await _in_thread(self.incr_version)(key, delta, version)
        return new_version

    async def adecr_version(self, key: Any, delta: int = 1, version: int | None = None) -> int:
        """Async :meth:`decr_version`."""
        return await self.aincr_version(key, -delta, version)

    async def aclear(self) -> None:
        """Async :meth:`clear`."""
        self.clear()

    async def aclose(self, **kwargs: Any) -> None:
        """Async :meth:`close`."""
        self.close(**kwargs)


#: Adds a ``get_or_set`` tries while the winner of each vanishes before it is read.
_ADD_TRIES: Final = 3


def _incr_cas(cache: Cache, key: str, delta: int) -> Any:
    """``incr`` of a value that is not a native counter: read it with its
    version, add ``delta``, store the sum only if nobody wrote the key
    meanwhile (else read again), keeping the entry's expiry."""
    conflicts = 0
    while True:
        value, version = cache.get(key, _MISSING, version=True)
        left = cache.ttl(key)
        if value is _MISSING or left is None:
            raise ValueError(f"Key '{key}' not found")
        new_value = value + delta
        # The expiry was read after the version: if a touch changed it in
        # between, it changed the version too, and this CAS fails.
        if cache.cas(key, new_value, version, ttl=0 if math.isinf(left) else left):
            return new_value
        conflicts += 1
        if conflicts >= DEFAULT_MAX_CONFLICTS:
            raise update_conflict(key, conflicts)
        time.sleep(backoff_seconds(conflicts))


def _in_thread(method: Callable[..., Any]) -> Callable[..., Awaitable[Any]]:
    """``method`` run by asgiref in a thread, as Django's default async methods run."""
    wrapped: Callable[..., Awaitable[Any]] = sync_to_async(method, thread_sensitive=True)
    return wrapped


def _original(exc: SerializationError) -> BaseException:
    """The serializer's own exception (e.g. ``pickle.PickleError``) behind ``exc``.

    Django code (and Django's test suite) expects the serializer's error, as
    its own backends raise it.
    """
    return exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
