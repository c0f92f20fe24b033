"""The :class:`Cache` users hold: a shared-memory cache with a familiar API.

A :class:`Cache` maps one cache file into the process; every process that
opens the same file (by name or path) shares its entries.  It wraps the
engine (``nearcache._native.NativeCache``) and adds the Python policy:

* keys: ``str``, ``bytes`` and ``int``, encoded as documented in
  :mod:`nearcache.keys` (never pickled);
* values: ``bytes``, ``str``, ``int`` (64-bit), ``float``, ``bool`` and
  ``None`` are stored natively by the engine, anything else through the
  configured serializer, optionally compressed and signed; the flags layout
  is documented in :mod:`nearcache.serializers`;
* TTLs: see :func:`nearcache.units.ttl_to_ms`.  ``ttl=None`` means the
  cache's default TTL (by default: never expires), ``0`` never expires, a
  positive number of seconds (``float`` ok, millisecond resolution), a
  ``timedelta`` or a string like ``"5m"`` expires after that long.
  ``expire_at`` (a ``datetime`` or Unix seconds) is the alternative to
  ``ttl``; a moment already past means "already expired": ``set`` and
  ``replace`` then remove the key, ``add`` stores nothing and returns False.

>>> cache = Cache("guide-demo", size="1MiB")
>>> cache.set("user:1", {"name": "Ada"}, ttl=60)
>>> cache.get("user:1")
{'name': 'Ada'}
>>> cache.get("missing", "fallback")
'fallback'
>>> cache.incr("visits"), cache.incr("visits", 10)
(1, 11)
>>> cache.clear(); cache.close()
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn, TypeVar, cast, overload

from nearcache import _native
from nearcache.conveniences import PolicyMethods
from nearcache.errors import CacheClosedError, ConfigurationError, UpdateConflictError
from nearcache.keys import (
    Key,
    check_key_collection,
    decode_key,
    encode_key,
    encode_prefix,
    native_key,
)
from nearcache.serializers import (
    Compressor,
    EntryRejected,
    Serializer,
    SignatureError,
    ValueCodec,
)
from nearcache.units import (
    Duration,
    ExpireAt,
    Size,
    expire_at_to_ms,
    format_size,
    parse_duration,
    parse_size,
    ttl_to_ms,
)

__all__ = ["DEFAULT_SIZE", "Cache", "SignedCache", "default_directory"]

T = TypeVar("T")
D = TypeVar("D")

#: Size of a cache file created without an explicit ``size``.
DEFAULT_SIZE: Final = 64 * 1024 * 1024
#: Lost attempts in a row after which :meth:`Cache.update` gives up (as the engine's).
DEFAULT_MAX_CONFLICTS: Final = 10_000
#: Environment variable that overrides the default directory of named caches.
DIRECTORY_ENV: Final = "NEARCACHE_DIR"

_MISS: Final = object()
_NATIVE_MISSING: Final = _native.MISSING
_DIRECT_TYPES: Final = frozenset({bytes, str, int, float, bool, type(None)})
_DIRECT_TYPES_COMPRESSED: Final = frozenset({int, float, bool, type(None)})


class _DecodeCounters:
    """Per-process counts of entries a read rejected (kept apart from the
    Cache so the engine's decoder holds no reference back to it)."""

    __slots__ = ("decode_errors", "signature_failures")

    def __init__(self) -> None:
        self.signature_failures = 0
        self.decode_errors = 0


def _make_decoder(codec: ValueCodec, counters: _DecodeCounters) -> Callable[[int, bytes], Any]:
    """The engine's decoder for entries with flags >= FLAG_USER: the value,
    or the engine's MISSING (a miss) for an entry that must be ignored."""
    decode = codec.decode

    def decoder(flags: int, payload: bytes) -> Any:
        try:
            return decode(flags, payload, b"")
        except SignatureError:
            counters.signature_failures += 1
        except EntryRejected:
            counters.decode_errors += 1
        return _NATIVE_MISSING

    return decoder


class _ClosedEngine:
    """Stands in for the engine after :meth:`Cache.close`: every use raises."""

    closed = True

    def __init__(self, path: str) -> None:
        self.path = path

    @staticmethod
    def fail(*args: object, **kwargs: object) -> NoReturn:
        raise CacheClosedError("the cache is closed")

    def __getattr__(self, name: str) -> Callable[..., NoReturn]:
        return self.fail

    def __len__(self) -> int:
        self.fail()


_FAIL: Final = _ClosedEngine.fail


def default_directory() -> str:
    """The directory where caches opened by name live.

    ``$NEARCACHE_DIR`` if set (created 0700 if missing), else the engine's
    default, ``/dev/shm/nearcache-<uid>`` (a tmpfs: fast, survives process
    restarts, not reboots).
    """
    override = _directory_override()
    if override:
        os.makedirs(override, mode=0o700, exist_ok=True)
        return override
    return _engine_default_directory()


def _engine_default_directory() -> str:
    # The engine's checks (a plain 0700 directory of this user) run once per
    # effective user: opening per request must not pay four system calls
    # for them each time. Every open still checks the directory it opens
    # in, and creates it again if it was removed.
    euid = os.geteuid()
    directory = _DEFAULT_DIRECTORIES.get(euid)
    if directory is None:
        directory = _DEFAULT_DIRECTORIES[euid] = _native.default_directory()
    return directory


def _directory_name() -> str:
    """:func:`default_directory` as it is named now, without making or
    checking it: what a Cache opened by name with options already prepared
    needs (it was made when they were prepared, and the engine's open checks
    the directory, and makes it again if it was removed)."""
    return _directory_override() or _engine_default_directory()


#: default_directory() per effective uid, checked once.
_DEFAULT_DIRECTORIES: dict[int, str] = {}

#: os.environ and the dict it keeps its (encoded) variables in, read directly:
#: os.environ.get() of an unset variable raises and catches a KeyError, which
#: costs more than the rest of a reopen.  Used only while os.environ is still
#: that object.
_ENVIRON: Final = os.environ
_ENVIRON_DATA: dict[Any, Any] | None = getattr(os.environ, "_data", None)
_DIRECTORY_ENV_KEY: Final[Any] = os.environ.encodekey(DIRECTORY_ENV)


def _directory_override() -> str | None:
    """``$NEARCACHE_DIR`` (None when unset)."""
    if os.environ is _ENVIRON and _ENVIRON_DATA is not None:
        raw = _ENVIRON_DATA.get(_DIRECTORY_ENV_KEY)
        return None if raw is None else _ENVIRON.decodevalue(raw)
    return os.environ.get(DIRECTORY_ENV)


def _check_name(name: str) -> str:
    if not isinstance(name, str):
        raise ConfigurationError(f"cache name must be a str, not {type(name).__name__}")
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise ConfigurationError(
            f"invalid cache name {name!r}: use a plain file name, or path= for a full path"
        )
    return name


def _ttl_ms(ttl: Duration | None, expire_at: ExpireAt | None) -> int | None:
    """Engine TTL for (ttl, expire_at); -1 means "already expired"."""
    if expire_at is None:
        return ttl_to_ms(ttl)
    if ttl is not None:
        raise TypeError("pass either ttl or expire_at, not both")
    ms = expire_at_to_ms(expire_at)
    return ms if ms > 0 else -1


class _Prepared:
    """Everything a Cache's options decide, parsed and checked once.

    Opening the same cache again (per request) takes these as they are and
    opens the engine with ``open``: an ``Opener``'s, which parses no
    argument.
    """

    __slots__ = (
        "closed",
        "codec",
        "counters",
        "direct_types",
        "name",
        "open",
        "open_get",
        "options",
        "prefix",
        "signed",
        "size",
    )

    def __init__(
        self,
        name: str,
        codec: ValueCodec,
        prefix: bytes,
        options: dict[str, Any],
        counters: _DecodeCounters,
        direct_types: frozenset[Any],
        open: Callable[[bool, bool], _native.NativeCache],
        open_get: Callable[[bool, bool], tuple[_native.NativeCache, Callable[..., Any]]],
        closed: _ClosedEngine,
        size: int | None,
    ) -> None:
        self.name = name
        self.codec = codec
        self.signed = codec.signed
        self.prefix = prefix
        self.options = options
        self.counters = counters
        self.direct_types = direct_types
        self.open = open
        #: ``open``, and the typed get of the handle (pickles as the cache's get).
        self.open_get = open_get
        #: The size asked for (None: the file's own).
        self.size = size
        #: What a closed Cache has for engine (one per file: it holds its path).
        self.closed = closed


#: Preparations by options, so that opening the same cache again (per
#: request) costs the engine's open and little more.  Bounded: cleared
#: when full.
_PREPARED: dict[Any, _Prepared] = {}
_PREPARED_MAX = 64
#: The last (options, preparation) looked up in _PREPARED: comparing with
#: it is cheaper than hashing the options again.
_LAST: tuple[Any, Any] = ((), None)


class _EngineMethod:
    """A method of :class:`Cache` that, on an unsigned cache, the engine
    implements itself with the same arguments and result (``pop``): the
    engine's method is looked up when first used on an instance and kept on
    it, so that later calls go straight to the engine with no Python frame,
    and opening a cache binds nothing for it.  (A non-data descriptor: the
    instance's attribute takes precedence; :meth:`Cache.close` replaces it.)
    On the class it is the Python definition, with its documentation.
    """

    def __init__(self, func: Callable[..., Any], method: str) -> None:
        self.func = func
        self.method = method
        self.__name__ = func.__name__
        self.__qualname__ = func.__qualname__
        self.__module__ = func.__module__
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __get__(self, obj: Cache | None, objtype: type | None = None) -> Any:
        if obj is None:
            return self.func
        bound = getattr(obj._native, self.method)
        obj.__dict__[self.__name__] = bound
        return bound


def _prepared(obj: Cache, key: tuple[Any, ...]) -> _Prepared:
    """The preparation of the options in ``key`` (a Cache's options, then the
    default directory), from _PREPARED or made (``obj``: the Cache opened)."""
    global _LAST
    try:
        prepared = _PREPARED[key]
    except KeyError:
        prepared = _prepare(obj, *key[:-1])
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        _PREPARED[key] = prepared
    except TypeError:  # an unhashable option (a serializer object...)
        return _prepare(obj, *key[:-1])
    _LAST = (key, prepared)
    return prepared


def _signed_class(obj: Cache, signed: bool) -> type[Cache]:
    """The class ``obj`` takes when it is a :class:`SignedCache` and the
    options say otherwise, or the reverse: ``Cache(signing_key=...)`` is a
    :class:`SignedCache`; anything else is an error."""
    if signed and type(obj) is Cache:
        return SignedCache
    raise ConfigurationError("SignedCache needs a signing_key; Cache(...) picks the class")


def _prepare(
    obj: Cache,
    name: str | None,
    path: str | os.PathLike[str] | None,
    size: Size | None,
    shards: int,
    ttl: Duration | None,
    serializer: str | Serializer,
    compress: str | Compressor | None,
    compress_threshold: int | str,
    signing_key: bytes | str | None,
    prefix: str | bytes,
    allow_foreign_owner: bool,
    lock_timeout: Duration,
    on_lock_timeout: str,
    spill_threshold: Size | None,
    spill_budget: Size | None,
    fs_reserve: Size | None,
) -> _Prepared:
    """Parse and check a Cache's options (see :class:`Cache`); ``obj`` is the
    Cache being opened (its class is checked before the engine's options)."""
    if name is not None and path is not None:
        raise ConfigurationError("pass a cache name or path=, not both")
    if path is None:
        name = _check_name("default" if name is None else name)
        file_path = os.path.join(default_directory(), name)
    else:
        file_path = os.fspath(path)
        if not isinstance(file_path, str) or not file_path:
            raise ConfigurationError(f"invalid cache path {path!r}")
        name = os.path.basename(file_path)
    try:
        size_bytes = None if size is None else parse_size(size)
        default_ttl_ms = ttl_to_ms(ttl) or 0
        prefix_bytes = encode_prefix(prefix)
        lock_timeout_ms = parse_duration(lock_timeout) * 1000.0
        spill_threshold_bytes = None if spill_threshold is None else parse_size(spill_threshold)
        spill_budget_bytes = (
            None
            if spill_budget is None
            else 0
            if spill_budget in (0, "0")
            else parse_size(spill_budget)
        )
        fs_reserve_bytes = (
            None if fs_reserve is None else 0 if fs_reserve in (0, "0") else parse_size(fs_reserve)
        )
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from exc
    if on_lock_timeout not in ("raise", "skip"):
        raise ConfigurationError(
            f"on_lock_timeout must be 'raise' or 'skip', got {on_lock_timeout!r}"
        )
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 0:
        raise ConfigurationError(f"shards must be an int >= 0 (0 = automatic), got {shards!r}")
    codec = ValueCodec(
        serializer,
        compress=compress,
        compress_threshold=compress_threshold,
        signing_key=signing_key,
    )
    if codec.signed is not isinstance(obj, SignedCache):
        _signed_class(obj, codec.signed)
    counters = _DecodeCounters()
    options: dict[str, Any] = {
        "path": file_path,
        "shards": shards,
        "ttl": ttl,
        "serializer": serializer,
        "compress": compress,
        "compress_threshold": compress_threshold,
        "signing_key": signing_key,
        "prefix": prefix,
        "allow_foreign_owner": allow_foreign_owner,
        "lock_timeout": lock_timeout,
        "on_lock_timeout": on_lock_timeout,
        "spill_threshold": spill_threshold,
        "spill_budget": spill_budget,
        "fs_reserve": fs_reserve,
    }
    if codec.signed:
        direct_types: frozenset[Any] = frozenset()
    elif codec.compressor is not None:
        direct_types = _DIRECT_TYPES_COMPRESSED
    else:
        direct_types = _DIRECT_TYPES
    # The engine's options, checked here once; each open then parses nothing.
    # Without a size an existing file is opened as it is, and a missing one
    # created with DEFAULT_SIZE.
    opener = _native.Opener(
        file_path,
        0 if size_bytes is None else size_bytes,
        shards,
        default_ttl_ms=default_ttl_ms,
        prefix=prefix_bytes,
        allow_foreign_owner=allow_foreign_owner,
        # Signed caches verify every entry themselves (SignedCache).
        decoder=None if codec.signed else _make_decoder(codec, counters),
        lock_timeout_ms=lock_timeout_ms,
        on_lock_timeout=on_lock_timeout,
        spill_threshold=spill_threshold_bytes,
        spill_budget=spill_budget_bytes,
        size_if_missing=DEFAULT_SIZE if size_bytes is None else 0,
        fs_reserve=fs_reserve_bytes,
        reduce_get=(_reopen_get, (dict(options),)),
    )
    return _Prepared(
        name,
        codec,
        prefix_bytes,
        options,
        counters,
        direct_types,
        opener.open,
        opener.open_get,
        _ClosedEngine(file_path),
        size_bytes,
    )


class Cache(PolicyMethods):
    """A shared-memory cache file, usable from many processes at once.

    Open it by ``name`` (a file in :func:`default_directory`) or by ``path``
    (a path on a disk file system persists across reboots).  Options:

    ``size``
        File size, an ``int`` or a string such as ``"64MiB"`` or ``"1G"``
        (:func:`nearcache.units.parse_size`): single letters and ``MiB``
        are binary (``"64M"`` is 67,108,864 bytes), ``MB`` is decimal
        (``"64MB"`` is 64,000,000 bytes).  ``None`` (default) opens an
        existing file with whatever size it has and otherwise creates one of
        :data:`DEFAULT_SIZE` (64 MiB).  An explicit size (or ``shards``)
        that differs from the existing file's resizes it live, as
        :meth:`resize` does: entries are kept (on a shrink, the most recently
        written that fit) and every process using the file follows; with
        ``recreate=True`` the file is replaced by an empty one instead.
    ``shards``
        Number of independently locked shards; ``0`` lets the engine choose
        from the size.  The largest entry is a fraction of a shard
        (:attr:`max_entry_size`).
    ``ttl``
        Default TTL of entries set without one; ``None`` or ``0`` means they
        never expire.
    ``serializer``
        ``"pickle"`` (default), ``"json"``, ``"msgpack"`` or a
        :class:`~nearcache.serializers.Serializer`; used for values that are
        not bytes/str/int/float/bool/None.  Only this serializer is ever used
        to decode (a json cache never unpickles).
    ``compress``, ``compress_threshold``
        ``"zstd"`` compresses serialized bodies (and bytes/str values) of at
        least ``compress_threshold`` bytes (default 1024) when it saves space.
    ``signing_key``
        ``bytes``/``str`` of at least 16 bytes: every value is signed with
        HMAC-SHA256 and values that do not verify are misses (counted as
        ``signature_failures`` in :meth:`stats`) and never deserialized.  The
        cache is then a :class:`SignedCache`.
    ``prefix``
        A namespace prepended to every key, so several applications can share
        one file: :meth:`keys`, :meth:`clear` and ``len()`` see only it.
    ``recreate``, ``allow_foreign_owner``, ``create``
        Passed to the engine: replace an incompatible file; accept a file
        owned by another user (only with ``signing_key`` or a non-pickle
        serializer, see the guide); fail instead of creating a missing file.
    ``lock_timeout``, ``on_lock_timeout``
        Longest wait for a shard lock that another live process holds
        (stopped, traced, dumping core); default 50 ms.  Past it a read is a
        miss, and a write raises :class:`~nearcache.errors.ShardLockTimeoutError`
        (``on_lock_timeout="raise"``, the default) or is skipped, as if not
        stored (``"skip"``).  Both are counted in ``stats()["lock_timeouts"]``.
    ``spill_threshold``, ``spill_budget``
        Values (as stored: serialized, compressed) longer than
        ``spill_threshold`` bytes (default 128 KiB), and any value too large
        for a shard, are kept in files in a directory beside the cache file
        (``<file>.spill/``) and read back as if they were inline.  Their
        files may hold at most ``spill_budget`` bytes (default 1 GiB; e.g.
        ``"4GiB"``); past it, spilled values are evicted (SIEVE order).
        ``spill_budget=0`` disables spilling: values too large for a shard
        raise :class:`~nearcache.errors.ValueTooLargeError`.  See the guide,
        "Large values".
    ``fs_reserve``
        Bytes of the file system (``/dev/shm``) the cache leaves free for
        other programs: a shard does not grow, and a spilled value's file is
        not written, past it (the shard evicts instead; a spilled value
        first makes room by evicting).  Default: the larger of 8 MiB and 10%
        of the file system, at most 1 GiB (and at most a quarter of a file
        system smaller than 32 MiB); e.g. ``"16MiB"``; ``0`` turns it off.

    >>> with Cache("doc-cache", size="1MiB", ttl=300, prefix="app1:") as c:
    ...     c["answer"] = 42
    ...     (c["answer"], "answer" in c, c.get(b"answer"), 7 in c)
    (42, True, 42, False)
    """

    def __init__(
        self,
        name: str | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        size: Size | None = None,
        shards: int = 0,
        ttl: Duration | None = None,
        serializer: str | Serializer = "pickle",
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
        prefix: str | bytes = "",
        recreate: bool = False,
        allow_foreign_owner: bool = False,
        create: bool = True,
        lock_timeout: Duration = 0.05,
        on_lock_timeout: str = "raise",
        spill_threshold: Size | None = None,
        spill_budget: Size | None = None,
        fs_reserve: Size | None = None,
    ) -> None:
        # Opening per request is a pattern the seeds measure: options already
        # parsed once in this process are not parsed again (the cache of
        # preparations is keyed by every option and the default directory),
        # and the engine's options are not parsed again either.
        key: Any = (
            name,
            path,
            size,
            shards,
            ttl,
            serializer,
            compress,
            compress_threshold,
            signing_key,
            prefix,
            allow_foreign_owner,
            lock_timeout,
            on_lock_timeout,
            spill_threshold,
            spill_budget,
            fs_reserve,
            _directory_name() if path is None else None,
        )
        last = _LAST
        prepared: _Prepared = last[1] if key == last[0] else _prepared(self, key)
        if (type(self) is not Cache or prepared.signed) and (
            prepared.signed is not isinstance(self, SignedCache)
        ):
            self.__class__ = _signed_class(self, prepared.signed)
        self._prepared = prepared
        if prepared.signed:
            self._native = prepared.open(recreate, create)
        else:
            # The hot read path is the engine's own typed get (a bound method
            # of a _native.Reader): no Python frame between the caller and
            # the shared memory; it pickles as this cache's get, and its
            # errors name get.  (pop is the engine's too, but bound when
            # first used: see _EngineMethod.)
            self._native, self.get = prepared.open_get(recreate, create)  # type: ignore[method-assign]

    # The other paths are a couple of Python operations around one call of
    # the engine's method (self._native.method(...): cheaper than keeping
    # bound methods, and nothing to bind at each open).

    @property
    def signature_failures(self) -> int:
        """Entries of this process's reads rejected by their signature."""
        return self._prepared.counters.signature_failures

    @property
    def decode_errors(self) -> int:
        """Entries of this process's reads that could not be decoded."""
        return self._prepared.counters.decode_errors

    # ------------------------------------------------------------------ properties

    @property
    def name(self) -> str:
        """The cache's name (the file name when opened by path)."""
        return self._prepared.name

    @property
    def path(self) -> str:
        """Path of the cache file."""
        return self._native.path

    @property
    def capacity(self) -> int:
        """Total size of the cache file in bytes."""
        return self._native.capacity

    @property
    def shard_count(self) -> int:
        """Number of shards."""
        return self._native.shard_count

    @property
    def max_entry_size(self) -> int:
        """Largest key + value (plus a 32-byte header) one entry may use."""
        return self._native.max_entry_size

    @property
    def max_value_size(self) -> int:
        """Longest stored value (after serialization) accepted: the spill budget,
        or with ``spill_budget=0`` what fits in one entry."""
        return self._native.max_value_size

    @property
    def spill_threshold(self) -> int:
        """Stored values longer than this many bytes are kept in files beside the cache."""
        return self._native.spill_threshold

    @property
    def default_ttl(self) -> float | None:
        """Default TTL in seconds, or None when entries never expire by default."""
        ms = self._native.default_ttl_ms
        return ms / 1000 if ms else None

    @property
    def prefix(self) -> bytes:
        """The key namespace prefix (``b""`` for none)."""
        return self._prepared.prefix

    @property
    def serializer(self) -> Serializer:
        """The serializer used for non-native values."""
        return self._prepared.codec.serializer

    @property
    def codec(self) -> ValueCodec:
        """The value codec (serializer, compression, signing)."""
        return self._prepared.codec

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._native.closed

    @property
    def native(self) -> _native.NativeCache:
        """The engine object, for raw byte-level access (bypasses serializers)."""
        return self._native

    # ---------------------------------------------------------------------- reads

    @overload
    def get(self, key: Key) -> Any: ...
    @overload
    def get(self, key: Key, default: D) -> Any | D: ...
    @overload
    def get(self, key: Key, default: Any = None, *, version: Literal[True]) -> tuple[Any, int]: ...
    @overload
    def get(self, key: Key, default: Any = None, *, version: bool) -> Any: ...
    def get(self, key: Key, default: Any = None, *, version: bool = False) -> Any:
        """Return the value of ``key``, or ``default`` on a miss.

        With ``version=True``, return ``(value, version)``: the version names
        the value read (0 on a miss) and is what :meth:`cas` takes.  An entry
        that cannot be decoded reads as ``default`` with its real version, so
        a :meth:`cas` can replace it.

        >>> c = Cache("doc-get", size="1MiB")
        >>> c.set(1, b"int key"); c.set("1", "str key")
        >>> c.get(1), c.get("1"), c.get(2, 0)
        (b'int key', 'str key', 0)
        >>> c.get("nope", version=True)
        (None, 0)
        >>> c.clear()
        """
        # Unsigned caches replace this method on the instance by the engine's
        # own typed get (same signature and result, _native.Reader.get),
        # which decodes native types itself and calls this cache's decoder
        # for the rest.
        return self._native.get_typed(key, default, version=version)

    def __getitem__(self, key: Key) -> Any:
        """``cache[key]``: the value, or :class:`KeyError` on a miss."""
        value = self.get(key, _MISS)
        if value is _MISS:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        """Whether ``key`` is present and not expired.

        In a :class:`SignedCache` this checks presence only; an entry that
        fails verification is still a miss for :meth:`get`.
        """
        try:
            return self._native.contains(key)  # type: ignore[arg-type]
        except TypeError:
            return self._native.contains(native_key(key))

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        """Return ``{key: value}`` for the keys that hit (misses are left out).

        Takes each shard's lock once.  A bare ``str``/``bytes`` raises
        :class:`~nearcache.KeyTypeError` (a ``TypeError``): pass a list of keys.

        >>> c = Cache("doc-many", size="1MiB")
        >>> c.set_many({"a": 1, "b": [2]})
        >>> c.get_many(["a", "b", "c"])
        {'a': 1, 'b': [2]}
        >>> c.delete_many(["a", "b", "c"])
        2
        """
        return self._native.get_many_map(keys)

    def ttl(self, key: Key) -> float | None:
        """Seconds until ``key`` expires, ``math.inf`` if never, None on a miss.

        >>> c = Cache("doc-ttl", size="1MiB")
        >>> c.set("k", 1, ttl=30); c.set("forever", 1)
        >>> 29 < c.ttl("k") <= 30, c.ttl("forever"), c.ttl("nope")
        (True, inf, None)
        >>> c.clear()
        """
        ms = self._native.ttl_ms(native_key(key))
        if ms is None:
            return None
        return math.inf if ms == 0 else ms / 1000

    def expire_time(self, key: Key) -> float | None:
        """Unix time (seconds) when ``key`` expires, ``math.inf`` if never, None on a miss."""
        ms = self._native.expire_at_ms(native_key(key))
        if ms is None:
            return None
        return math.inf if ms == 0 else ms / 1000

    # --------------------------------------------------------------------- writes

    def set(
        self,
        key: Key,
        value: Any,
        ttl: Duration | None = None,
        expire_at: ExpireAt | None = None,
    ) -> None:
        """Store ``value`` under ``key`` (replacing any previous value).

        On error (a value too large, one the serializer cannot encode) the
        previous value stays untouched.
        """
        if ttl is None and expire_at is None:
            ttl_ms = None
        else:
            ttl_ms = _ttl_ms(ttl, expire_at)
            if ttl_ms == -1:
                self.delete(key)
                return
        if value.__class__ in self._prepared.direct_types:
            try:
                self._native.set_typed(key, value, ttl_ms)
                return
            except TypeError:
                pass  # an int key: the engine takes str/bytes only
            except OverflowError:
                pass  # an int beyond 64 bits: serialize it
        nkey = native_key(key)
        flags, payload = self._prepared.codec.encode(value, self._signed_key(nkey))
        self._native.set(nkey, payload, ttl_ms, flags)

    def __setitem__(self, key: Key, value: Any) -> None:
        """``cache[key] = value``: :meth:`set` with the default TTL."""
        self.set(key, value)

    def add(
        self,
        key: Key,
        value: Any,
        ttl: Duration | None = None,
        expire_at: ExpireAt | None = None,
    ) -> bool:
        """Store ``value`` only if ``key`` is absent; return whether it was stored.

        Atomic across processes: of several concurrent ``add`` calls on one
        key, exactly one returns True.

        >>> c = Cache("doc-add", size="1MiB")
        >>> c.add("k", "first"), c.add("k", "second"), c["k"]
        (True, False, 'first')
        >>> c.clear()
        """
        ttl_ms = _ttl_ms(ttl, expire_at)
        if ttl_ms == -1:
            return False
        if value.__class__ in self._prepared.direct_types:
            try:
                return self._native.add_typed(key, value, ttl_ms)
            except (TypeError, OverflowError):
                pass
        nkey = native_key(key)
        flags, payload = self._prepared.codec.encode(value, self._signed_key(nkey))
        return self._native.add(nkey, payload, ttl_ms, flags)

    def replace(
        self,
        key: Key,
        value: Any,
        ttl: Duration | None = None,
        expire_at: ExpireAt | None = None,
    ) -> bool:
        """Store ``value`` only if ``key`` is present; return whether it was stored."""
        ttl_ms = _ttl_ms(ttl, expire_at)
        nkey = native_key(key)
        if ttl_ms == -1:
            return self._native.delete(nkey)
        flags, payload = self._prepared.codec.encode(value, self._signed_key(nkey))
        return self._native.replace(nkey, payload, ttl_ms, flags)

    def set_many(
        self,
        mapping: Mapping[Any, Any] | Iterable[tuple[Any, Any]],
        ttl: Duration | None = None,
        expire_at: ExpireAt | None = None,
    ) -> None:
        """Store several values, taking each shard's lock once.

        ``mapping`` is a mapping or an iterable of ``(key, value)`` pairs; keys
        are checked like everywhere else (str, bytes or int).  Every value is
        encoded before anything is written, so a value the serializer
        rejects leaves the cache unchanged.
        """
        ttl_ms = _ttl_ms(ttl, expire_at)
        check_key_collection(mapping)
        pairs = mapping.items() if isinstance(mapping, Mapping) else mapping
        if ttl_ms == -1:
            self.delete_many([key for key, _ in pairs])
            return
        encode = self._prepared.codec.encode
        signed_key = self._signed_key
        items: list[tuple[Key, bytes, int]] = []
        for key, value in pairs:
            nkey = native_key(key)
            flags, payload = encode(value, signed_key(nkey))
            items.append((nkey, payload, flags))
        if items:
            self._native.set_many(items, ttl_ms)

    def get_or_set(
        self,
        key: Key,
        factory: Callable[[], T],
        ttl: Duration | None = None,
        expire_at: ExpireAt | None = None,
    ) -> T:
        """Return the cached value, or call ``factory()``, store and return it.

        If another process stores a value between the miss and the store,
        that value wins and is returned (``add`` semantics).  For expensive
        factories called from many processes, :meth:`memoize` adds stampede
        protection.

        >>> c = Cache("doc-gos", size="1MiB")
        >>> c.get_or_set("k", lambda: [1, 2]), c.get_or_set("k", lambda: "not called")
        ([1, 2], [1, 2])
        >>> c.clear()
        """
        value: Any = self.get(key, _MISS)
        if value is not _MISS:
            return cast(T, value)
        created = factory()
        if self.add(key, created, ttl, expire_at):
            return created
        current: Any = self.get(key, _MISS)
        return created if current is _MISS else cast(T, current)

    # ------------------------------------------------------- read-modify-write

    def cas(self, key: Key, value: Any, version: int, *, ttl: Duration | None = None) -> bool:
        """Store ``value`` only if ``key`` still has ``version``; return whether it stored.

        ``version`` comes from ``get(key, version=True)``; ``0`` means "only if
        absent".  Atomic across processes: of several ``cas`` calls with one
        version, at most one stores.  A ``cas`` may fail although the value
        did not change (the engine moved the key while compacting): read again
        and retry, or use :meth:`update`, which does.  The version compared is
        the stored entry's (its bytes and flags), whatever the serializer.

        >>> c = Cache("doc-cas", size="1MiB")
        >>> c.set("k", 1)
        >>> value, version = c.get("k", version=True)
        >>> c.cas("k", value + 1, version), c.cas("k", 100, version), c["k"]
        (True, False, 2)
        >>> c.clear()
        """
        version = _check_version(version)
        ttl_ms = ttl_to_ms(ttl)
        if value.__class__ in self._prepared.direct_types:
            try:
                return self._native.cas_typed(key, value, version, ttl_ms)[0]
            except OverflowError:
                pass  # an int beyond 64 bits: serialize it
        nkey = native_key(key)
        flags, payload = self._prepared.codec.encode(value, self._signed_key(nkey))
        return self._native.cas(nkey, payload, version, ttl_ms, flags)[0]

    def update(
        self,
        key: Key,
        fn: Callable[[Any], Any],
        *,
        default: Any = _MISS,
        ttl: Duration | None = None,
        max_conflicts: int = DEFAULT_MAX_CONFLICTS,
    ) -> Any:
        """Atomically replace the value of ``key`` by ``fn(value)``; return the new value.

        A missing key is ``fn(default)``; without ``default`` a missing key
        raises :class:`KeyError`.  ``fn`` runs without any lock held, on the
        value read; the result is stored with :meth:`cas`, and if another
        process wrote the key in between, the value is read again and ``fn``
        called again, so ``fn`` may run several times and must have no other
        effect.  After ``max_conflicts`` lost attempts in a row it raises
        :class:`~nearcache.UpdateConflictError`, its last attempt having
        written nothing.  An exception from ``fn`` propagates and nothing is
        written.

        >>> c = Cache("doc-update", size="1MiB")
        >>> c.update("hits", lambda n: n + 1, default=0)
        1
        >>> c.update("tags", lambda t: t | {"new"}, default=frozenset())
        frozenset({'new'})
        >>> c.clear()
        """
        check_max_conflicts(max_conflicts)
        ttl_to_ms(ttl)  # a bad ttl fails before fn runs
        conflicts = 0
        while True:
            value, version = self.get(key, _MISS, version=True)
            if value is _MISS:
                if default is _MISS:
                    raise KeyError(key)
                value = default
            new = fn(value)
            if self.cas(key, new, version, ttl=ttl):
                return new
            conflicts += 1
            if conflicts >= max_conflicts:
                raise update_conflict(key, conflicts)
            time.sleep(backoff_seconds(conflicts))

    def delete_if_version(self, key: Key, version: int) -> bool:
        """Remove ``key`` only if it still has ``version``; return whether it did."""
        return self._native.delete_if_version(native_key(key), _check_version(version))

    def touch(
        self, key: Key, ttl: Duration | None = None, expire_at: ExpireAt | None = None
    ) -> bool:
        """Give ``key`` a new TTL (None: the default TTL); return whether it exists."""
        ttl_ms = _ttl_ms(ttl, expire_at)
        nkey = native_key(key)
        if ttl_ms == -1:
            return self._native.delete(nkey)
        return self._native.touch(nkey, ttl_ms)

    def incr(
        self,
        key: Key,
        delta: int = 1,
        default: int | None = 0,
        ttl: Duration | None = None,
    ) -> int:
        """Atomically add ``delta`` to a 64-bit counter and return the new value.

        A missing key starts at ``default`` (``None``: raise ``KeyError(key)``);
        ``ttl`` applies to a counter created by this call.  An entry that is
        not an int raises :class:`~nearcache.NotACounterError`; overflowing
        64 bits raises :class:`~nearcache.CounterOverflowError` and leaves the
        value.  Counters
        are stored natively and are not signed, even in a :class:`SignedCache`
        (read them with ``incr(key, 0)`` there).
        """
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"delta must be an int, not {type(delta).__name__}")
        try:
            return self._native.incr(native_key(key), delta, default, ttl_to_ms(ttl))
        except KeyError:
            raise KeyError(key) from None  # the engine's error does not name the key

    def decr(
        self,
        key: Key,
        delta: int = 1,
        default: int | None = 0,
        ttl: Duration | None = None,
    ) -> int:
        """Atomically subtract ``delta``; see :meth:`incr`."""
        if isinstance(delta, bool) or not isinstance(delta, int):
            raise TypeError(f"delta must be an int, not {type(delta).__name__}")
        return self.incr(key, -delta, default, ttl)

    # -------------------------------------------------------------------- deletes

    def delete(self, key: Key) -> bool:
        """Remove ``key``; return whether it was present."""
        try:
            return self._native.delete(key)
        except TypeError:
            return self._native.delete(native_key(key))

    def __delitem__(self, key: Key) -> None:
        """``del cache[key]``: :class:`KeyError` if it was absent."""
        if not self.delete(key):
            raise KeyError(key)

    @overload
    def pop(self, key: Key) -> Any: ...
    @overload
    def pop(self, key: Key, default: D) -> Any | D: ...
    def pop(self, key: Key, default: Any = None) -> Any:
        """Remove ``key`` and return its value, or ``default`` if absent.

        >>> c = Cache("doc-pop", size="1MiB")
        >>> c["k"] = (1, "one")
        >>> c.pop("k"), c.pop("k", "gone")
        ((1, 'one'), 'gone')
        """
        # Unsigned caches use the engine's own pop_typed instead (see
        # _EngineMethod below), as for get.
        return self._native.pop_typed(key, default)

    if not TYPE_CHECKING:
        pop = _EngineMethod(pop, "pop_typed")

    def delete_many(self, keys: Iterable[Key]) -> int:
        """Remove several keys; return how many were present.

        A bare ``str``/``bytes`` raises :class:`~nearcache.KeyTypeError`
        (a ``TypeError``): pass a list of keys.
        """
        check_key_collection(keys)
        native_keys = [native_key(k) for k in keys]
        return self._native.delete_many(native_keys) if native_keys else 0

    def delete_if_equals(self, key: Key, value: Any) -> bool:
        """Remove ``key`` only if it holds ``value``; return whether it did.

        :class:`nearcache.Lock` releases with it.  A ``bytes`` value that the
        cache stores raw (unsigned, and uncompressed or shorter than
        ``compress_threshold``) is compared and deleted by the engine in one
        step; any other value is read, then deleted (an entry replaced
        between the two is deleted), as
        :meth:`nearcache.drivers.base.Driver.delete_if_equals` does.

        >>> c = Cache("doc-cas-delete", size="1MiB")
        >>> c.set("owner", b"token-1")
        >>> c.delete_if_equals("owner", b"token-2"), c.delete_if_equals("owner", b"token-1")
        (False, True)
        """
        codec = self.codec
        if (
            type(value) is bytes
            and not codec.signed
            and (codec.compressor is None or len(value) < codec.compress_threshold)
        ):
            return self.native.delete_if_equals(native_key(key), value)
        if self.get(key, _MISS) != value:
            return False
        return self.delete(key)

    def clear(self) -> None:
        """Remove every entry (of this cache's ``prefix`` only, if it has one)."""
        self._native.clear()

    # ------------------------------------------------------------------- iteration

    def keys(self) -> list[Key]:
        """A snapshot of the live keys (of this prefix), decoded as in
        :func:`nearcache.keys.decode_key` (str for UTF-8, int for int keys).
        """
        raw_keys = self._native.keys()
        return [decode_key(raw) for raw in raw_keys]

    def __iter__(self) -> Iterator[Key]:
        """Iterate over a snapshot of the keys."""
        return iter(self.keys())

    def __len__(self) -> int:
        """Number of live entries (of this prefix, if any)."""
        return len(self._native)

    def __bool__(self) -> bool:
        """A cache object is always true, even when empty (like a file object)."""
        return True

    # ----------------------------------------------------------------- management

    def stats(self) -> dict[str, int]:
        """Engine counters (shared by every process) plus this process's
        ``signature_failures`` and ``decode_errors``."""
        stats = dict(self._native.stats())
        stats["signature_failures"] = self.signature_failures
        stats["decode_errors"] = self.decode_errors
        return stats

    def check(self) -> dict[str, int]:
        """Verify every shard's invariants (see the engine); return counts."""
        return self._native.check()

    def flush(self) -> None:
        """Write the mapping back to its file (for caches on a disk file system)."""
        self._native.flush()

    def resize(self, size: int | str, shards: int | None = None) -> dict[str, int]:
        """Resize the cache file live; return its new ``capacity`` and ``shards``.

        ``size`` as in the constructor (``"256MiB"``); ``shards`` a power of
        two, or ``None``/``0`` to choose from the size.  A new file of that
        geometry is built beside the cache, the live entries are moved into
        it shard by shard while every process keeps using the cache (a
        shrink keeps the most recently written entries that fit, a grow
        keeps them all), and it replaces the old file: every process
        attached follows at its next operation, and the old file's memory is
        freed once the last of them has.  If another resize of this cache is
        under way, this call waits for it and returns its result.

        >>> c = Cache("doc-resize", size="1MiB", recreate=True)
        >>> c.set("kept", 1)
        >>> c.resize("4MiB")["capacity"] > 3 * 2**20
        True
        >>> c.get("kept")
        1
        >>> c.clear()
        """
        size_bytes = parse_size(size)
        return self._native.resize(size_bytes, shards or 0)

    @property
    def eviction_mode(self) -> str:
        """How the shards choose what to admit when full: ``"adaptive"``
        (the default), ``"strict"`` or ``"lenient"``.

        Lenient is SIEVE: every new entry is admitted and the hand evicts
        entries not read since it last passed (sparing the newest twelfth
        of each shard while older entries can free enough).  Strict is
        W-TinyLFU's
        admission: a new entry not read since it came in stays only if it
        was asked for more often than the entry it would evict, which keeps
        a loop or a scan larger than the cache from turning it over.
        Adaptive shards run whichever of the two a miniature cache of each,
        replaying a sample of the shard's keys, hits more with (strict on a
        clear win, lenient again only when lenient hits more): SIEVE's hit
        ratio where recency pays, strict
        admission's where loops and scans would turn the cache over.  A
        lenient adaptive shard spares the newest half of its entries
        instead of a twelfth while a third miniature shows that a moving
        working set favours it.
        Lenient costs the least per read and write (it learns nothing:
        ``docs/benchmarks.md``, "Eviction on traces", has what the others
        cost); pin it for a workload known to favour recency, and
        ``"strict"`` for one known to loop.  Setting it pins the mode for
        the file, for every process (kept across a resize);
        ``InvalidArgumentError`` for another value.

        >>> c = Cache("doc-eviction", size="1MiB", recreate=True)
        >>> c.eviction_mode
        'adaptive'
        >>> c.eviction_mode = "lenient"
        >>> c.eviction_mode
        'lenient'
        >>> c.eviction_mode = "adaptive"
        """
        return self._native.eviction_mode()

    @eviction_mode.setter
    def eviction_mode(self, mode: str) -> None:
        self._native.set_eviction_mode(mode)

    def close(self) -> None:
        """Release the file; any later operation raises :class:`~nearcache.CacheClosedError`.

        The engine object is dropped here, not left to the garbage collector,
        so the mapping and the file descriptor (with its lock on the file)
        are released at once, unless :attr:`native` is still referenced
        elsewhere.  Idempotent.
        """
        native = self._native
        if native.closed:
            return
        native.close()
        # Every reference to the engine is replaced by a stand-in that raises
        # CacheClosedError.
        prepared = self._prepared
        closed: Any = prepared.closed
        self._native = closed
        if not prepared.signed:
            self.get = self.pop = _FAIL  # type: ignore[method-assign]

    def __enter__(self) -> Cache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._native.closed:
            return f"<{type(self).__name__} {self.name!r} closed>"
        # The size asked for: the file is a little smaller (its header and
        # whole pages per shard come out of it).  Opened without one, the
        # file's size, in the largest unit that keeps it exact to 0.1.
        asked = self._prepared.size
        size = format_size(asked) if asked else _approx_size(self.capacity)
        return (
            f"<{type(self).__name__} {self.name!r} path={self.path!r} "
            f"size={size!r} shards={self.shard_count}>"
        )

    def __reduce__(self) -> tuple[Callable[..., Cache], tuple[dict[str, Any]]]:
        """Pickling a cache (e.g. to a spawned process) reopens the same file."""
        return (_reopen, (dict(self._prepared.options),))

    # ----------------------------------------------------------------- internals

    def _signed_key(self, nkey: Key) -> bytes:
        """The bytes a signature binds to (unused when not signing)."""
        return b""


class SignedCache(Cache):
    """A :class:`Cache` whose every value is signed (``Cache(signing_key=...)``).

    Reads verify the HMAC-SHA256 tag before anything is decoded; an entry
    that is unsigned, tampered with, or moved to another key is a miss and
    counted as ``signature_failures`` in :meth:`stats`.  Counters
    (:meth:`incr`) are the exception: they are native integers, unsigned.

    >>> key = b"k" * 32
    >>> c = Cache("doc-signed", size="1MiB", signing_key=key)
    >>> type(c).__name__
    'SignedCache'
    >>> c.set("x", {"safe": True}); c.get("x")
    {'safe': True}
    >>> c.native.set("x", b"planted by someone else")   # bypasses signing
    >>> c.get("x"), c.stats()["signature_failures"]
    (None, 1)
    >>> c.clear()
    """

    def get(self, key: Key, default: Any = None, *, version: bool = False) -> Any:
        nkey = native_key(key)
        if version:
            got = self._native.get_entry_versioned(nkey)
            if got is None:
                return default, 0
            return self._decode_signed(nkey, got[1], got[0], default), got[2]
        entry = self._native.get_entry(nkey)
        if entry is None:
            return default
        return self._decode_signed(nkey, entry[1], entry[0], default)

    def pop(self, key: Key, default: Any = None) -> Any:
        nkey = native_key(key)
        entry = self._native.pop(nkey)
        if entry is None:
            return default
        return self._decode_signed(nkey, entry[1], entry[0], default)

    def get_many(self, keys: Iterable[Key]) -> dict[Key, Any]:
        check_key_collection(keys)
        keys = list(keys)
        native_keys = [native_key(k) for k in keys]
        entries = self._native.get_many(native_keys) if keys else []
        found: dict[Key, Any] = {}
        for key, nkey, entry in zip(keys, native_keys, entries, strict=True):
            if entry is None:
                continue
            value = self._decode_signed(nkey, entry[1], entry[0], _MISS)
            if value is not _MISS:
                found[key] = value
        return found

    def _decode_signed(self, nkey: Key, flags: int, payload: bytes, default: Any) -> Any:
        try:
            return self._prepared.codec.decode(flags, payload, self._signed_key(nkey))
        except SignatureError:
            self._prepared.counters.signature_failures += 1
        except EntryRejected:
            self._prepared.counters.decode_errors += 1
        return default

    def _signed_key(self, nkey: Key) -> bytes:
        return self._prepared.prefix + encode_key(nkey)


def _check_version(version: object) -> int:
    """A version as :meth:`Cache.cas` takes it, or a clear error."""
    if isinstance(version, bool) or not isinstance(version, int):
        raise TypeError(
            f"version must be an int from get(key, version=True), not {type(version).__name__}"
        )
    if not 0 <= version < 1 << 64:
        raise ValueError(f"version must be between 0 and 2**64 - 1, got {version}")
    return version


def check_max_conflicts(max_conflicts: object) -> None:
    """Refuse a ``max_conflicts`` that is not an int >= 1 (before anything runs)."""
    if isinstance(max_conflicts, bool) or not isinstance(max_conflicts, int):
        raise TypeError(f"max_conflicts must be an int, not {type(max_conflicts).__name__}")
    if max_conflicts < 1:
        raise ValueError(f"max_conflicts must be >= 1, got {max_conflicts}")


def update_conflict(key: object, conflicts: int) -> UpdateConflictError:
    """The error of an update that lost ``conflicts`` attempts in a row."""
    return UpdateConflictError(
        f"update of {key!r} lost to other writers {conflicts} times in a row and gave up; "
        "its last attempt wrote nothing (raise max_conflicts, or write the key less often)"
    )


def backoff_seconds(conflicts: int) -> float:
    """The pause after the ``conflicts``-th lost attempt of one update in a
    row: give the CPU away at first, then sleep a little longer each time (at
    most 1 ms), so that writers racing for one key spread out."""
    return 0.0 if conflicts < 4 else min(conflicts, 1000) * 1e-6


def _reopen(options: dict[str, Any]) -> Cache:
    options = dict(options)
    path = options.pop("path")
    return Cache(path=path, **options)


def _reopen_get(options: dict[str, Any]) -> _native.Reader:
    """What an unsigned cache's ``get`` pickles as: the same file reopened in
    the unpickling process, and its get's reader (``getattr(reader, "get")``
    completes the method)."""
    get = _reopen(options).get
    reader: _native.Reader = get.__self__  # type: ignore[attr-defined]
    return reader


def _approx_size(n: int) -> str:
    """``268435456`` -> ``'256 MiB'``, ``267915264`` -> ``'255.5 MiB'``: the
    largest binary unit below ``n``, with one decimal unless exact."""
    for exponent, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        factor = 1024**exponent
        if n >= factor:
            return f"{n // factor} {unit}" if n % factor == 0 else f"{n / factor:.1f} {unit}"
    return f"{n} B"
