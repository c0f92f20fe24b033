"""Type stubs for ``nearcache._native``, the PyO3 glue over ``nearcache-core``.

The native module converts and forwards; it holds no policy.  Keys are
``bytes``, ``str`` (UTF-8 encoded, so ``"a"`` and ``b"a"`` are the same
key) or ``int`` (``0xFF`` then the decimal digits, so ``1`` and ``"1"`` are
different keys); the optional ``prefix`` given at open time is prepended to
every key.
TTLs are in milliseconds: ``None`` means "use the cache's default TTL",
``0`` means "never expires".

Every stored entry carries a 32-bit ``flags`` word.  The native typed calls
(``get_typed``/``set_typed``) use these values; anything at or above
``FLAG_USER`` belongs to the Python layer (serializers, compression, signing):

===========  =====  ==============================================
constant     value  payload
===========  =====  ==============================================
FLAG_BYTES   0      raw bytes
FLAG_STR     1      UTF-8 text
FLAG_INT     2      signed 64-bit integer, 8 bytes little-endian
FLAG_FLOAT   3      IEEE-754 double, 8 bytes little-endian
FLAG_BOOL    4      one byte, 0 or 1
FLAG_NONE    5      empty
FLAG_USER    16     first flag value the Python layer may use
===========  =====  ==============================================
"""

from collections.abc import Callable, Iterable
from typing import Any, Final, TypeVar, final

__all__ = [
    "FLAG_BOOL",
    "FLAG_BYTES",
    "FLAG_FLOAT",
    "FLAG_INT",
    "FLAG_NONE",
    "FLAG_STR",
    "FLAG_USER",
    "LAYOUT_VERSION",
    "MAX_KEY_LEN",
    "MISSING",
    "CacheClosedError",
    "CacheFullError",
    "CacheNotFoundError",
    "CacheOSError",
    "ConfigurationError",
    "CorruptFileError",
    "CounterOverflowError",
    "Error",
    "IncompatibleFileError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "KeyTypeError",
    "NativeCache",
    "NotACounterError",
    "Opener",
    "PermissionDeniedError",
    "Reader",
    "ShardLockTimeoutError",
    "UpdateConflictError",
    "ValueTooLargeError",
    "__version__",
    "default_directory",
]

_D = TypeVar("_D")

# Aliases of the stub only (private: the runtime module has no such names).
_Key = bytes | str | int
_Native = bytes | str | int | float | bool | None

FLAG_BYTES: Final[int]
FLAG_STR: Final[int]
FLAG_INT: Final[int]
FLAG_FLOAT: Final[int]
FLAG_BOOL: Final[int]
FLAG_NONE: Final[int]
FLAG_USER: Final[int]
LAYOUT_VERSION: Final[int]
MAX_KEY_LEN: Final[int]
__version__: Final[str]

class Error(Exception):
    """Base class of every error nearcache raises."""

class CacheClosedError(Error):
    """The cache was closed; no further operation is possible."""

class ValueTooLargeError(Error, ValueError):
    """The entry does not fit in a shard; the cache is left unchanged."""

class InvalidKeyError(Error, ValueError):
    """The key is empty or longer than MAX_KEY_LEN bytes (prefix included)."""

class KeyTypeError(Error, TypeError):
    """A key is not a str, bytes or int (keys are never pickled)."""

class ConfigurationError(Error, ValueError):
    """An option given to :class:`nearcache.Cache` (or a decorator) is invalid."""

class InvalidArgumentError(ConfigurationError):
    """An argument is outside its documented range (size, shards, TTL)."""

class CacheOSError(Error, OSError):
    """An operating-system call on the cache file failed."""

class CacheNotFoundError(CacheOSError, FileNotFoundError):
    """The cache file does not exist (opened with create=False)."""

class IncompatibleFileError(Error):
    """The file exists but was created with other parameters or layout."""

class CorruptFileError(Error):
    """The file is not a nearcache file or fails its consistency checks."""

class PermissionDeniedError(Error, PermissionError):
    """The file or directory is unsafe to open (foreign owner, symlink, mode)."""

class CacheFullError(Error):
    """The file system holding the cache has no room for it."""

class NotACounterError(Error, TypeError):
    """incr/decr on an entry that does not hold a 64-bit integer."""

class CounterOverflowError(Error, OverflowError):
    """incr/decr would overflow a signed 64-bit counter; the value is unchanged."""

class ShardLockTimeoutError(Error, TimeoutError):
    """A write could not take its shard's lock within the lock timeout."""

class UpdateConflictError(Error, RuntimeError):
    """An update lost its compare-and-swap too many times in a row; it wrote nothing."""

@final
class NativeCache:
    """One shared-memory cache file, mapped into this process."""

    def __new__(
        cls,
        path: str,
        size: int,
        shards: int = 0,
        *,
        default_ttl_ms: int = 0,
        prefix: bytes = ...,  # b"" (PyO3 does not render bytes defaults)
        recreate: bool = False,
        allow_foreign_owner: bool = False,
        create: bool = True,
        decoder: Callable[[int, bytes], object] | None = None,
        lock_timeout_ms: float = 50.0,
        on_lock_timeout: str = "raise",
        spill_threshold: int | None = None,
        spill_budget: int | None = None,
        fs_reserve: int | None = None,
    ) -> NativeCache:
        """Open ``path`` or create it with ``size`` bytes in ``shards`` shards.

        ``shards=0`` picks a count from ``size``.  Reopening an existing file
        with a different ``size`` or ``shards`` raises
        :class:`IncompatibleFileError` unless ``recreate=True``, which
        replaces the file.  ``size=0`` (with ``create=False``) opens an
        existing file with whatever parameters it has.

        ``decoder(flags, payload)`` is called by the typed reads for entries
        with flags >= FLAG_USER; it returns the value, or ``MISSING`` to make
        the read a miss. Without a decoder those reads return
        ``(flags, payload)``.

        A shard lock held by another live process is waited for at most
        ``lock_timeout_ms``; then a read is a miss and a write raises
        :class:`ShardLockTimeoutError` (``on_lock_timeout="raise"``) or is
        skipped, reported as not stored / not found (``"skip"``). Both are
        counted in ``stats()["lock_timeouts"]``.

        Values longer than ``spill_threshold`` bytes (default 128 KiB) or too
        large for a shard are kept in files beside the cache, which hold at
        most ``spill_budget`` bytes (default 1 GiB; 0 disables spilling).

        ``fs_reserve`` bytes of the file system are left free: a shard does
        not grow, nor a spilled value's file get written, past it (None: the
        larger of 8 MiB and 10% of the file system, at most 1 GiB; 0: off).
        """

    @property
    def path(self) -> str: ...
    @property
    def capacity(self) -> int:
        """Total file size in bytes."""
    @property
    def shard_count(self) -> int: ...
    def eviction_mode(self) -> str:
        """How the shards choose their admission mode: "adaptive" (the
        default: each shard runs the mode its miniature caches do better
        with), "strict" (a new entry must win its place: resists loops and
        scans) or "lenient" (SIEVE: every new entry admitted)."""
    def set_eviction_mode(self, mode: str) -> None:
        """Pin the admission mode of every shard (kept in the file, for
        every process); ``InvalidArgumentError`` for another mode."""
    def strict_shards(self) -> int:
        """How many shards admit new entries strictly now."""
    def young_half_shards(self) -> int:
        """How many shards admit leniently now and keep half their entries
        young (adaptive shards on a working set that moves) instead of a
        twelfth."""
    @property
    def lock_timeout_ms(self) -> float:
        """Longest wait for a shard lock held by another process."""
    @property
    def max_entry_size(self) -> int:
        """Largest key+value (plus a 32-byte header) one entry may use."""
    @property
    def max_value_size(self) -> int:
        """Longest value accepted: the spill budget (or, with spilling off, what fits inline)."""
    @property
    def spill_threshold(self) -> int:
        """Values longer than this many bytes are kept in files beside the cache."""
    @property
    def default_ttl_ms(self) -> int: ...
    @property
    def closed(self) -> bool: ...
    @property
    def prefix(self) -> bytes: ...

    # Raw bytes path (flags are the caller's).
    def get(self, key: _Key) -> bytes | None: ...
    def get_entry(self, key: _Key) -> tuple[bytes, int] | None:
        """Value and flags, or None on a miss."""
    def set(self, key: _Key, value: bytes, ttl_ms: int | None = None, flags: int = 0) -> None: ...
    def add(self, key: _Key, value: bytes, ttl_ms: int | None = None, flags: int = 0) -> bool: ...
    def replace(
        self, key: _Key, value: bytes, ttl_ms: int | None = None, flags: int = 0
    ) -> bool: ...
    def pop(self, key: _Key) -> tuple[bytes, int] | None: ...

    # Typed path: native values encoded by flag; others come back as (flags, bytes).
    def get_typed(
        self, key: _Key, default: _D = ..., *, version: bool = False
    ) -> _Native | tuple[int, bytes] | _D | tuple[object, int]:
        """The value (native types decoded), or ``default`` on a miss.

        With ``version=True``: ``(value, version)``, version 0 on a miss; an
        entry that does not decode reads as ``default`` with its real version.
        """
    def set_typed(self, key: _Key, value: _Native, ttl_ms: int | None = None) -> None:
        """Store a bytes/str/int (64-bit)/float/bool/None value with its flag.

        Raises TypeError for other types and OverflowError for ints outside
        the signed 64-bit range: the Python layer serializes those instead.
        """
    def add_typed(self, key: _Key, value: _Native, ttl_ms: int | None = None) -> bool: ...
    def pop_typed(self, key: _Key, default: _D = ...) -> _Native | tuple[int, bytes] | _D: ...
    def delete(self, key: _Key) -> bool: ...
    def delete_if_equals(self, key: _Key, value: bytes) -> bool:
        """Delete ``key`` only if its raw value is exactly ``value`` (atomic)."""
    def get_entry_versioned(self, key: _Key) -> tuple[bytes, int, int] | None:
        """Raw value, flags and version (never 0), or None on a miss."""
    def cas(
        self, key: _Key, value: bytes, version: int, ttl_ms: int | None = None, flags: int = 0
    ) -> tuple[bool, int]:
        """Store only if ``key``'s version is ``version`` (0: only if absent).

        Returns ``(stored, version)``: the new version if it stored, else the
        version found (0: absent), with nothing changed.
        """
    def cas_typed(
        self, key: _Key, value: _Native, version: int, ttl_ms: int | None = None
    ) -> tuple[bool, int]:
        """``cas`` of a natively stored value (as ``set_typed`` encodes it)."""
    def delete_if_version(self, key: _Key, version: int) -> bool:
        """Delete ``key`` only if its version is ``version`` (0 never matches)."""
    def touch(self, key: _Key, ttl_ms: int | None = None) -> bool: ...
    def ttl_ms(self, key: _Key) -> int | None:
        """Milliseconds left (0 = never expires), None on a miss."""
    def expire_at_ms(self, key: _Key) -> int | None:
        """Absolute expiry in Unix milliseconds (0 = never), None on a miss."""
    def incr(
        self, key: _Key, delta: int = 1, initial: int | None = 0, ttl_ms: int | None = None
    ) -> int:
        """Atomically add ``delta`` (may be negative) to a 64-bit counter.

        A missing key is created as ``initial + delta`` (with ``ttl_ms``)
        unless ``initial`` is None, in which case KeyError is raised. An
        overflow raises CounterOverflowError and leaves the value as it was;
        a non-counter value raises NotACounterError.
        """
    def contains(self, key: _Key) -> bool: ...
    def __contains__(self, key: _Key, /) -> bool: ...
    def __len__(self) -> int: ...
    def get_many(self, keys: Iterable[_Key]) -> list[tuple[bytes, int] | None]:
        """(value, flags) per key, in order; None for a miss. One lock per shard."""
    def get_many_typed(self, keys: Iterable[_Key]) -> list[_Native | tuple[int, bytes] | object]:
        """Like get_typed per key, in order; a miss is the ``MISSING`` sentinel."""
    def get_many_map(self, keys: Iterable[_Key]) -> dict[_Key, object]:
        """Hits as ``{key: value}`` (keys as given), decoded like get_typed."""
    def set_many(self, items: Iterable[tuple[_Key, bytes, int]], ttl_ms: int | None = None) -> None:
        """Store (key, value, flags) triples, taking each shard's lock once."""
    def delete_many(self, keys: Iterable[_Key]) -> int: ...
    def clear(self) -> None:
        """Remove every entry (only this prefix's entries when a prefix is set)."""
    def keys(self) -> list[bytes]:
        """Snapshot of live keys (without the prefix)."""
    def stats(self) -> dict[str, int]:
        """Counters summed over the shards, plus ``shards`` and ``file_bytes``.

        ``held_bytes`` is the memory the file holds (its reserved pages, the
        file header included): a cache file is sparse and its shards reserve
        space as they fill, so this follows what is stored, up to
        ``file_bytes``. ``max_compaction_bytes`` is a maximum, not a sum: the
        most arena bytes the compactions of one write examined, in any
        shard (what a reader of that shard could wait for), bounded by a
        few segments whatever the shard's size.
        """
    def shard_stats(self) -> list[dict[str, int]]:
        """Counters of each shard (``held_bytes``: that shard's reserved pages)."""
    def check(self) -> dict[str, int]:
        """Walk every shard under its lock and verify every invariant.

        Returns counts (shards, entries, live_bytes); raises CorruptFileError
        describing the first violation (or a file resized by someone else).
        """
    def shard_of(self, key: _Key) -> int:
        """Index of the shard that holds ``key``."""
    def _debug_hold_shard_mid_write(self, key: _Key, seconds: float) -> None:
        """Test hook: lock key's shard, leave it half-written, sleep (GIL released)."""
    def _debug_sweep_spilled(self, grace: float) -> int:
        """Test hook: sweep orphaned spill files older than ``grace`` s; files removed."""
    def flush(self) -> None:
        """msync the mapping (for caches on a persistent file system)."""
    def resize(self, size: int, shards: int = 0) -> dict[str, int]:
        """Resize the file live; the resulting ``{"capacity", "shards"}``."""
    def close(self) -> None: ...
    def __enter__(self) -> NativeCache: ...
    def __exit__(self, *exc: object) -> None: ...

@final
class Opener:
    """A :class:`NativeCache`'s options, parsed and checked once: ``open()``
    opens handles on the file with no argument to parse.

    It holds no file, descriptor or mapping: each ``open()`` is a full open
    of ``path``, exactly as ``NativeCache(path, size, shards, ...)`` with
    these options makes it (a file replaced or removed meanwhile is noticed
    there).  Every argument is checked here as ``NativeCache(...)`` checks
    it, with the same errors.
    """

    def __new__(
        cls,
        path: str,
        size: int,
        shards: int = 0,
        *,
        default_ttl_ms: int = 0,
        prefix: bytes = ...,  # b"" (PyO3 does not render bytes defaults)
        allow_foreign_owner: bool = False,
        decoder: Callable[[int, bytes], object] | None = None,
        lock_timeout_ms: float = 50.0,
        on_lock_timeout: str = "raise",
        spill_threshold: int | None = None,
        spill_budget: int | None = None,
        size_if_missing: int = 0,
        fs_reserve: int | None = None,
        reduce_get: tuple[Callable[..., object], tuple[object, ...]] | None = None,
    ) -> Opener:
        """The options of ``NativeCache(path, size, shards, ...)``, but
        ``recreate`` and ``create``, which each open takes.

        With ``size=0`` and ``size_if_missing`` > 0, an open first opens an
        existing file as it is (as ``create=False`` does) and, if there is
        none and ``create`` is true, creates one of ``size_if_missing`` bytes.
        ``reduce_get`` is what the ``get`` of :meth:`open_get` pickles as.
        """

    @property
    def path(self) -> str: ...
    def open(self, recreate: bool = False, create: bool = True) -> NativeCache:
        """A new handle on the file, opened as ``NativeCache(...)`` with these
        options and ``recreate``/``create`` opens it."""
    def open_get(
        self, recreate: bool = False, create: bool = True
    ) -> tuple[NativeCache, Callable[..., Any]]:
        """:meth:`open`, and the new handle's typed get (a :class:`Reader`'s
        bound ``get``), which pickles as ``reduce_get``."""

@final
class Reader:
    """The typed read of one handle: ``nearcache.Cache.get`` of an unsigned
    cache is this class's bound ``get``."""

    def get(self, key: _Key, default: object = None, *, version: bool = False) -> Any:
        """Return the value of ``key``, or ``default`` on a miss.

        With ``version=True``, ``(value, version)``: the version names this
        value for a compare-and-swap (as ``NativeCache.get_typed``)."""
    def __reduce__(self) -> tuple[Callable[..., object], tuple[object, ...]]: ...

MISSING: Final[object]

def default_directory() -> str:
    """``/dev/shm/nearcache-<uid>`` (created 0700 on first use)."""
