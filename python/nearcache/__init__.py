"""nearcache: a multi-process shared-memory cache for one host.

>>> from nearcache import Cache
>>> cache = Cache("init-demo", size="1MiB")
>>> cache.set("greeting", "hello", ttl=60)
>>> cache.get("greeting")
'hello'
>>> cache.clear()

See the user guide (``docs/guide.md``) for the whole API.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nearcache import _native
from nearcache.cache import DEFAULT_SIZE, Cache, SignedCache, default_directory
from nearcache.config import from_dict, from_url
from nearcache.errors import (
    BackendError,
    CacheClosedError,
    CacheFullError,
    CacheNotFoundError,
    CacheOSError,
    ConfigurationError,
    CorruptFileError,
    CounterOverflowError,
    Error,
    IncompatibleFileError,
    InvalidArgumentError,
    InvalidKeyError,
    KeyTooLargeError,
    KeyTypeError,
    LockError,
    LockNotOwnedError,
    LockTimeoutError,
    NotACounterError,
    PermissionDeniedError,
    SerializationError,
    ShardLockTimeoutError,
    UpdateConflictError,
    ValueTooLargeError,
)
from nearcache.locks import Lock
from nearcache.serializers import (
    Compressor,
    JsonSerializer,
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    ValueCodec,
    ZstdCompressor,
)
from nearcache.tiered import TieredCache
from nearcache.units import format_size, parse_duration, parse_size

if TYPE_CHECKING:
    from nearcache.aio import AsyncCache

__version__ = "0.1.0"

#: Version of the on-file layout the engine reads and writes.
LAYOUT_VERSION: int = _native.LAYOUT_VERSION

__all__ = [
    "DEFAULT_SIZE",
    "LAYOUT_VERSION",
    "AsyncCache",
    "BackendError",
    "Cache",
    "CacheClosedError",
    "CacheFullError",
    "CacheNotFoundError",
    "CacheOSError",
    "Compressor",
    "ConfigurationError",
    "CorruptFileError",
    "CounterOverflowError",
    "Error",
    "IncompatibleFileError",
    "InvalidArgumentError",
    "InvalidKeyError",
    "JsonSerializer",
    "KeyTooLargeError",
    "KeyTypeError",
    "Lock",
    "LockError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "MsgpackSerializer",
    "NotACounterError",
    "PermissionDeniedError",
    "PickleSerializer",
    "SerializationError",
    "Serializer",
    "ShardLockTimeoutError",
    "SignedCache",
    "TieredCache",
    "UpdateConflictError",
    "ValueCodec",
    "ValueTooLargeError",
    "ZstdCompressor",
    "__version__",
    "default_directory",
    "format_size",
    "from_dict",
    "from_url",
    "parse_duration",
    "parse_size",
]


def __getattr__(name: str) -> Any:
    """``nearcache.AsyncCache``, imported on first use (it brings in asyncio)."""
    if name == "AsyncCache":
        from nearcache.aio import AsyncCache

        return AsyncCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
