"""Values: native types, serializers, compression, signing, and the flags word.

Every entry the engine stores carries a 32-bit ``flags`` word.  Values of
the six native types are stored by the engine itself, without any Python
serialization, so other languages can read them:

===========  =====  =============================================
flag         value  payload
===========  =====  =============================================
FLAG_BYTES   0      the bytes
FLAG_STR     1      UTF-8 text
FLAG_INT     2      signed 64-bit integer, 8 bytes little-endian
FLAG_FLOAT   3      IEEE-754 double, 8 bytes little-endian
FLAG_BOOL    4      one byte, 0 or 1
FLAG_NONE    5      empty
===========  =====  =============================================

Everything else (and native values that are compressed or signed) is
encoded by this module, with flags at or above ``FLAG_USER`` (16) laid out
as follows::

    bit  0-3   native type (FLAG_*) of the payload when the serializer id is 0
    bit  4     always 1 (FLAG_USER): encoded by the Python layer
    bit  5-6   compression: 0 none, 1 zstd, 2-3 reserved
    bit  7     signed: the payload starts with a 32-byte HMAC-SHA256 tag
    bit  8-15  serializer id: 0 native payload (bits 0-3), 1 pickle, 2 json,
               3 msgpack, 4-63 reserved, 64-255 user-defined serializers
    bit 16-31  reserved, must be 0

The stored payload is ``[tag (32 bytes, if signed)] body`` where ``body``
is the serialized (then, if bit 5-6 say so, compressed) value.  The tag is
``HMAC-SHA256(signing_key, flags as 4 bytes LE || key length as 4 bytes LE
|| full key (prefix included) || body)``: it binds the value to its key and
flags, so a signed value cannot be replayed under another key, nor have its
serializer changed.  Expiry times are not covered.

Decoding is strict.  An entry whose flags use reserved bits, whose
signature is missing or wrong (when a signing key is configured), or whose
serializer is not the one this cache is configured with is *rejected*: the
cache treats it as a miss and counts it (``signature_failures`` or
``decode_errors`` in :meth:`nearcache.Cache.stats`).  In particular a cache
configured with ``serializer="json"`` never unpickles anything, whatever
the file contains.

.. warning::
   Unpickling data runs code chosen by whoever wrote it.  The default
   ``pickle`` serializer is safe only while the cache file can be written by
   your own user alone (the engine creates it 0600 in a 0700 directory and
   refuses files owned by others).  When the file is shared with other users
   or processes you do not trust, set a ``signing_key`` (then nothing
   unsigned is ever deserialized) or use the ``json``/``msgpack``
   serializers.

>>> codec = ValueCodec("json")
>>> codec.encode(b"raw", b"k")           # native value: plain native flag
(0, b'raw')
>>> flags, payload = codec.encode({"a": [1, 2]}, b"k")
>>> hex(flags), payload
('0x210', b'{"a":[1,2]}')
>>> codec.decode(flags, payload, b"k")
{'a': [1, 2]}
"""

from __future__ import annotations

import abc
import functools
import hmac
import json
import pickle
import struct
from collections.abc import Callable
from typing import Any, ClassVar, Final

from nearcache._native import (
    FLAG_BOOL,
    FLAG_BYTES,
    FLAG_FLOAT,
    FLAG_INT,
    FLAG_NONE,
    FLAG_STR,
    FLAG_USER,
)
from nearcache.errors import ConfigurationError, SerializationError
from nearcache.units import parse_size

__all__ = [
    "COMPRESSION_MASK",
    "COMPRESSION_SHIFT",
    "FLAG_SIGNED",
    "RESERVED_MASK",
    "SERIALIZER_SHIFT",
    "SIGNATURE_SIZE",
    "Compressor",
    "EntryRejected",
    "JsonSerializer",
    "MsgpackSerializer",
    "PickleSerializer",
    "Serializer",
    "SignatureError",
    "UndecodableEntry",
    "ValueCodec",
    "ZstdCompressor",
    "decode_native",
    "encode_native",
    "get_compressor",
    "get_serializer",
]

COMPRESSION_SHIFT: Final = 5
COMPRESSION_MASK: Final = 0b11 << COMPRESSION_SHIFT
FLAG_SIGNED: Final = 1 << 7
SERIALIZER_SHIFT: Final = 8
SERIALIZER_MASK: Final = 0xFF << SERIALIZER_SHIFT
NATIVE_MASK: Final = 0x0F
RESERVED_MASK: Final = 0xFFFF_0000
SIGNATURE_SIZE: Final = 32
#: Smallest user-defined serializer id; ids below are reserved for nearcache.
#: Taken by the Perl binding (perl/Cache-Near), read here as undecodable
#: entries (misses): serializer 16 = Storable, 17 = Sereal; compression 2 = zlib.
FIRST_USER_SERIALIZER_ID: Final = 64

_I64_MIN: Final = -(2**63)
_I64_MAX: Final = 2**63 - 1
_pack_q = struct.Struct("<q").pack
_pack_d = struct.Struct("<d").pack
_unpack_q = struct.Struct("<q").unpack
_unpack_d = struct.Struct("<d").unpack


class EntryRejected(Exception):
    """A stored entry that must not be returned: the cache treats it as a miss."""


class SignatureError(EntryRejected):
    """The entry is unsigned or its HMAC tag does not verify."""


class UndecodableEntry(EntryRejected):
    """The entry cannot be decoded by this cache's configuration."""


# --------------------------------------------------------------------------- native


def encode_native(value: object) -> tuple[int, bytes] | None:
    """Encode a value of a native type as ``(FLAG_*, payload)``, else ``None``.

    Only exact types count (a ``str`` subclass or an ``IntEnum`` goes through
    the serializer, so it comes back with its own type); ints outside the
    signed 64-bit range return ``None`` too.

    >>> encode_native(-2)
    (2, b'\\xfe\\xff\\xff\\xff\\xff\\xff\\xff\\xff')
    >>> encode_native(True), encode_native(None), encode_native(2**64)
    ((4, b'\\x01'), (5, b''), None)
    """
    cls = value.__class__
    if cls is bytes:
        return FLAG_BYTES, value  # type: ignore[return-value]
    if cls is str:
        return FLAG_STR, value.encode("utf-8")  # type: ignore[attr-defined]
    if cls is int:
        if _I64_MIN <= value <= _I64_MAX:  # type: ignore[operator]
            return FLAG_INT, _pack_q(value)
        return None
    if cls is float:
        return FLAG_FLOAT, _pack_d(value)
    if cls is bool:
        return FLAG_BOOL, b"\x01" if value else b"\x00"
    if value is None:
        return FLAG_NONE, b""
    return None


def decode_native(flag: int, payload: bytes) -> Any:
    """Decode a native payload; raise :class:`UndecodableEntry` if malformed.

    >>> decode_native(FLAG_FLOAT, encode_native(0.5)[1])
    0.5
    """
    if flag == FLAG_BYTES:
        return bytes(payload)
    if flag == FLAG_STR:
        try:
            return bytes(payload).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise UndecodableEntry("invalid UTF-8 in a str entry") from exc
    if flag == FLAG_INT and len(payload) == 8:
        return _unpack_q(payload)[0]
    if flag == FLAG_FLOAT and len(payload) == 8:
        return _unpack_d(payload)[0]
    if flag == FLAG_BOOL and payload in (b"\x00", b"\x01"):
        return payload == b"\x01"
    if flag == FLAG_NONE and not payload:
        return None
    raise UndecodableEntry(f"malformed or unknown native entry (flag {flag}, {len(payload)} bytes)")


# ----------------------------------------------------------------------- serializers


class Serializer(abc.ABC):
    """Turns values into bytes and back.

    Subclass it for a custom format: give it a ``name`` and an ``id``
    between 64 and 255 (stored in every entry's flags, so it must never
    change once data is written), and implement :meth:`dumps` and
    :meth:`loads`.

    >>> class Upper(Serializer):
    ...     id = 64
    ...     name = "upper-text"
    ...     def dumps(self, value):
    ...         return str(value).upper().encode()
    ...     def loads(self, data):
    ...         return data.decode()
    >>> ValueCodec(Upper()).encode(["x"], b"k")
    (16400, b"['X']")
    """

    id: ClassVar[int]
    name: ClassVar[str]

    @abc.abstractmethod
    def dumps(self, value: Any) -> bytes:
        """Encode ``value``; raise any exception if it cannot be encoded."""

    @abc.abstractmethod
    def loads(self, data: bytes) -> Any:
        """Decode what :meth:`dumps` produced."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class PickleSerializer(Serializer):
    """Python's pickle: any picklable object, exactly round-tripped.

    See the module's security warning: never unpickle data from a file that
    someone else can write, unless values are signed.

    >>> s = PickleSerializer()
    >>> s.loads(s.dumps({"t": (1, 2)}))
    {'t': (1, 2)}
    """

    id = 1
    name = "pickle"

    def __init__(self, protocol: int = pickle.HIGHEST_PROTOCOL) -> None:
        self.protocol = protocol

    def dumps(self, value: Any) -> bytes:
        return pickle.dumps(value, protocol=self.protocol)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class JsonSerializer(Serializer):
    """Compact UTF-8 JSON; safe to load from untrusted data.

    Tuples come back as lists and dict keys as strings, as JSON dictates.

    >>> s = JsonSerializer()
    >>> s.dumps({"k": (1, "é")})
    b'{"k":[1,"\\xc3\\xa9"]}'
    """

    id = 2
    name = "json"

    def __init__(self, *, default: Callable[[Any], Any] | None = None) -> None:
        self._encoder = json.JSONEncoder(
            separators=(",", ":"), ensure_ascii=False, default=default, allow_nan=True
        )
        self._decoder = json.JSONDecoder()

    def dumps(self, value: Any) -> bytes:
        return self._encoder.encode(value).encode("utf-8")

    def loads(self, data: bytes) -> Any:
        return self._decoder.decode(bytes(data).decode("utf-8"))


class MsgpackSerializer(Serializer):
    """MessagePack via the ``msgpack`` package (``pip install nearcache[msgpack]``).

    Compact and safe to load from untrusted data; tuples come back as lists.

    >>> s = MsgpackSerializer()
    >>> s.loads(s.dumps({"a": b"\\x00", 1: [True, None]}))
    {'a': b'\\x00', 1: [True, None]}
    """

    id = 3
    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack  # type: ignore[import-untyped]
        except ImportError as exc:  # pragma: no cover - msgpack is installed in CI
            raise ConfigurationError(
                "serializer='msgpack' needs the msgpack package: pip install 'nearcache[msgpack]'"
            ) from exc
        self._packb = msgpack.packb
        self._unpackb = msgpack.unpackb

    def dumps(self, value: Any) -> bytes:
        data: bytes = self._packb(value, use_bin_type=True)
        return data

    def loads(self, data: bytes) -> Any:
        return self._unpackb(data, raw=False, strict_map_key=False)


_SERIALIZERS: Final[dict[str, Callable[[], Serializer]]] = {
    "pickle": PickleSerializer,
    "json": JsonSerializer,
    "msgpack": MsgpackSerializer,
}


def get_serializer(spec: str | Serializer) -> Serializer:
    """Return the serializer named ``spec`` (``"pickle"``, ``"json"``,
    ``"msgpack"``), or validate and return a :class:`Serializer` object.

    >>> get_serializer("json").name
    'json'
    """
    if isinstance(spec, str):
        try:
            factory = _SERIALIZERS[spec]
        except KeyError:
            raise ConfigurationError(
                f"unknown serializer {spec!r}; choose one of {sorted(_SERIALIZERS)} "
                "or pass a Serializer object"
            ) from None
        return factory()
    if not (callable(getattr(spec, "dumps", None)) and callable(getattr(spec, "loads", None))):
        raise ConfigurationError(f"a serializer needs dumps() and loads() methods, got {spec!r}")
    ident = getattr(spec, "id", None)
    if not isinstance(ident, int) or isinstance(ident, bool) or not 1 <= ident <= 255:
        raise ConfigurationError(f"serializer id must be an int in 1..255, got {ident!r}")
    builtin = isinstance(spec, (PickleSerializer, JsonSerializer, MsgpackSerializer))
    if ident < FIRST_USER_SERIALIZER_ID and not builtin:
        raise ConfigurationError(
            f"serializer id {ident} is reserved; custom serializers use ids "
            f"{FIRST_USER_SERIALIZER_ID}..255"
        )
    return spec


# ----------------------------------------------------------------------- compression


class Compressor(abc.ABC):
    """A compression algorithm; ``id`` is stored in flag bits 5-6."""

    id: ClassVar[int]
    name: ClassVar[str]

    @abc.abstractmethod
    def compress(self, data: bytes) -> bytes:
        """Compress ``data``."""

    @abc.abstractmethod
    def decompress(self, data: bytes) -> bytes:
        """Decompress; raise :class:`UndecodableEntry` on bad or oversized input."""


class ZstdCompressor(Compressor):
    """Zstandard via the ``zstandard`` package (``pip install nearcache[zstd]``).

    ``max_output_size`` bounds what one entry may decompress to (the frame
    header states the size; larger claims are rejected before allocating),
    so a hostile entry cannot exhaust memory.

    >>> z = ZstdCompressor(level=3)
    >>> data = b"abc" * 1000
    >>> packed = z.compress(data)
    >>> len(packed) < len(data), z.decompress(packed) == data
    (True, True)
    """

    id = 1
    name = "zstd"

    def __init__(self, level: int = 3, *, max_output_size: int | str = "256MiB") -> None:
        try:
            import zstandard
        except ImportError as exc:  # pragma: no cover - zstandard is installed in CI
            raise ConfigurationError(
                "compress='zstd' needs the zstandard package: pip install 'nearcache[zstd]'"
            ) from exc
        self.level = level
        self.max_output_size = parse_size(max_output_size)
        self._zstd: Any = zstandard
        self._compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
        self._decompressor = zstandard.ZstdDecompressor()

    def compress(self, data: bytes) -> bytes:
        out: bytes = self._compressor.compress(data)
        return out

    def decompress(self, data: bytes) -> bytes:
        try:
            size = self._zstd.frame_content_size(data)
        except self._zstd.ZstdError as exc:
            raise UndecodableEntry(f"bad zstd frame: {exc}") from exc
        if size < 0 or size > self.max_output_size:
            raise UndecodableEntry(f"zstd frame declares {size} bytes, over the limit")
        try:
            out: bytes = self._decompressor.decompress(data, max_output_size=self.max_output_size)
        except self._zstd.ZstdError as exc:
            raise UndecodableEntry(f"bad zstd frame: {exc}") from exc
        return out

    def __repr__(self) -> str:
        return f"ZstdCompressor(level={self.level})"


_COMPRESSORS: Final[dict[str, Callable[[], Compressor]]] = {"zstd": ZstdCompressor}


def get_compressor(spec: str | Compressor | None) -> Compressor | None:
    """Return the compressor for ``spec`` (``None``, ``"zstd"`` or an instance)."""
    if spec is None:
        return None
    if isinstance(spec, Compressor):
        if spec.id not in (1, 2, 3):
            raise ConfigurationError(f"compressor id must be 1..3, got {spec.id!r}")
        return spec
    if isinstance(spec, str):
        try:
            return _COMPRESSORS[spec]()
        except KeyError:
            raise ConfigurationError(
                f"unknown compression {spec!r}; choose one of {sorted(_COMPRESSORS)} or None"
            ) from None
    raise ConfigurationError(f"compress must be None, 'zstd' or a Compressor, got {spec!r}")


# ---------------------------------------------------------------------------- codec


def _signing_key(key: bytes | str | None) -> bytes | None:
    if key is None:
        return None
    if isinstance(key, str):
        key = key.encode("utf-8")
    if not isinstance(key, bytes):
        raise ConfigurationError(f"signing_key must be bytes or str, not {type(key).__name__}")
    if len(key) < 16:
        raise ConfigurationError(
            "signing_key must be at least 16 bytes; use secrets.token_bytes(32)"
        )
    return bytes(key)


class ValueCodec:
    """Encodes values into ``(flags, payload)`` and back, per the layout above.

    ``serializer`` handles non-native values (and is the only one allowed to
    decode); ``compress`` (``None`` or ``"zstd"``) applies to bodies of at
    least ``compress_threshold`` bytes when it actually saves space;
    ``signing_key`` (at least 16 bytes) signs every entry and rejects any
    entry that does not verify.  ``key`` arguments are the full stored key
    bytes (prefix included); they only matter when signing.

    >>> signed = ValueCodec(signing_key=b"0123456789abcdef")
    >>> flags, payload = signed.encode(42, b"answer")
    >>> hex(flags), len(payload)
    ('0x92', 40)
    >>> signed.decode(flags, payload, b"answer")
    42
    >>> signed.decode(flags, payload, b"another-key")
    Traceback (most recent call last):
    ...
    nearcache.serializers.SignatureError: signature does not verify
    """

    __slots__ = ("_compressor", "_signing_key", "compress_threshold", "serializer")

    def __init__(
        self,
        serializer: str | Serializer = "pickle",
        *,
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
    ) -> None:
        self.serializer: Serializer = get_serializer(serializer)
        self._compressor = get_compressor(compress)
        if isinstance(compress_threshold, str):
            compress_threshold = parse_size(compress_threshold)
        if isinstance(compress_threshold, bool) or not isinstance(compress_threshold, int):
            raise ConfigurationError(
                f"compress_threshold must be an int or a size string, got {compress_threshold!r}"
            )
        if compress_threshold < 0:
            raise ConfigurationError(f"compress_threshold cannot be negative: {compress_threshold}")
        self.compress_threshold: int = compress_threshold
        self._signing_key = _signing_key(signing_key)

    @property
    def signed(self) -> bool:
        """Whether entries are signed (and unsigned ones rejected)."""
        return self._signing_key is not None

    @property
    def compressor(self) -> Compressor | None:
        """The compressor, or None."""
        return self._compressor

    def encode(self, value: object, key: bytes) -> tuple[int, bytes]:
        """Return ``(flags, payload)`` for ``value`` stored under ``key``.

        Raises :class:`~nearcache.errors.SerializationError` when the
        serializer cannot encode the value.
        """
        native = encode_native(value)
        if native is not None:
            flags, body = native
            serializer_id = 0
        else:
            serializer = self.serializer
            try:
                body = serializer.dumps(value)
            except Exception as exc:
                raise SerializationError(
                    f"{serializer.name} cannot serialize {type(value).__name__}: {exc}"
                ) from exc
            if not isinstance(body, bytes):
                raise SerializationError(
                    f"{serializer!r}.dumps returned {type(body).__name__}, not bytes"
                )
            flags = 0
            serializer_id = serializer.id
        compressor = self._compressor
        compression = 0
        if compressor is not None and len(body) >= self.compress_threshold:
            packed = compressor.compress(body)
            if len(packed) < len(body):
                body = packed
                compression = compressor.id
        signing_key = self._signing_key
        if serializer_id == 0 and compression == 0 and signing_key is None:
            return flags, body
        flags |= FLAG_USER | compression << COMPRESSION_SHIFT | serializer_id << SERIALIZER_SHIFT
        if signing_key is not None:
            flags |= FLAG_SIGNED
            body = _tag(signing_key, flags, key, body) + body
        return flags, body

    def decode(self, flags: int, payload: bytes, key: bytes) -> Any:
        """Decode an entry; raise :class:`EntryRejected` if it must be ignored."""
        signing_key = self._signing_key
        if flags < FLAG_USER:
            if signing_key is not None:
                raise SignatureError("unsigned entry in a signed cache")
            return decode_native(flags, payload)
        if flags & RESERVED_MASK or not flags & FLAG_USER:
            raise UndecodableEntry(f"unknown flags {flags:#x}")
        if flags & FLAG_SIGNED:
            if len(payload) < SIGNATURE_SIZE:
                raise SignatureError("signature does not verify")
            tag = payload[:SIGNATURE_SIZE]
            body = payload[SIGNATURE_SIZE:]
            if signing_key is not None and not hmac.compare_digest(
                tag, _tag(signing_key, flags, key, body)
            ):
                raise SignatureError("signature does not verify")
        elif signing_key is not None:
            raise SignatureError("unsigned entry in a signed cache")
        else:
            body = payload
        compression = (flags & COMPRESSION_MASK) >> COMPRESSION_SHIFT
        if compression:
            compressor = self._compressor
            if compressor is None or compressor.id != compression:
                compressor = _default_compressor(compression)
            body = compressor.decompress(body)
        serializer_id = (flags & SERIALIZER_MASK) >> SERIALIZER_SHIFT
        if serializer_id == 0:
            return decode_native(flags & NATIVE_MASK, body)
        if flags & NATIVE_MASK:
            raise UndecodableEntry(f"unknown flags {flags:#x}")
        serializer = self.serializer
        if serializer_id != serializer.id:
            raise UndecodableEntry(
                f"entry written with serializer id {serializer_id}; this cache uses "
                f"{serializer.name} (id {serializer.id})"
            )
        try:
            return serializer.loads(body)
        except Exception as exc:
            raise UndecodableEntry(f"{serializer.name} cannot decode the entry: {exc}") from exc

    def __repr__(self) -> str:
        return (
            f"ValueCodec({self.serializer.name!r}, compress={self._compressor!r}, "
            f"compress_threshold={self.compress_threshold}, signed={self.signed})"
        )


@functools.cache
def _default_compressor(compression: int) -> Compressor:
    """A compressor able to decode entries written by a cache configured differently."""
    if compression == ZstdCompressor.id:
        try:
            return ZstdCompressor()
        except ConfigurationError as exc:  # pragma: no cover - zstandard is installed in CI
            raise UndecodableEntry(str(exc)) from exc
    raise UndecodableEntry(f"unknown compression id {compression}")


def _tag(signing_key: bytes, flags: int, key: bytes, body: bytes) -> bytes:
    header = flags.to_bytes(4, "little") + len(key).to_bytes(4, "little")
    return hmac.digest(signing_key, header + key + body, "sha256")
