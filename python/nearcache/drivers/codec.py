"""How drivers that store bytes (Redis, memcached) encode values.

The value layer is :class:`nearcache.serializers.ValueCodec`, the one the
shared-memory cache uses (native types, serializers, zstd compression, HMAC
signing, strict decoding).  Its ``(flags, payload)`` pairs are packed into one
byte string per value, chosen so that counters stay usable by the store's own
arithmetic (``INCRBY``, memcached ``incr``) and no other value can ever be
mistaken for a counter:

* an ``int`` in the signed 64-bit range is its decimal digits, untagged
  (``b"42"``, ``b"-7"``), so Redis and memcached increment it in place and
  other tools read it as a number.  Like the shared-memory cache's counters,
  these are never signed or compressed;
* a value whose flags are below 16 (a native ``bytes``/``str``/``float``/
  ``bool``/``None``, not compressed or signed) is one byte holding the flags,
  then the payload;
* anything else is the byte ``0x10``, the flags as 4 bytes little-endian,
  then the payload.

A store whose own clock is too coarse (memcached counts whole seconds) may
wrap a non-counter in a *deadline header* (:func:`with_deadline`): the byte
``0x11``, the absolute deadline in Unix milliseconds as 8 bytes
little-endian (``0``: never expires), then the value in the format above.
The reader checks the deadline (:func:`split_deadline`) before decoding the
value, so the entry expires to the millisecond whatever the store's clock.
A counter is never wrapped (the store must still increment it in place),
nor is a header: what follows a header is a native or tagged value, never
a counter and never another header.

The first byte of a non-counter is thus in ``0x00``-``0x05``, ``0x10`` or
``0x11``: never a digit, a sign or whitespace (memcached's ``incr`` parses
values with ``strtoull``, which skips leading whitespace), so the store
refuses to increment it and the driver reports
:class:`~nearcache.errors.NotACounterError`.

Decoding is as strict as the shared-memory cache's: a value in another
format, written with another serializer, or failing its signature raises
:class:`~nearcache.serializers.EntryRejected`, which drivers treat as a miss
(and count as ``rejected`` in their stats).  A cache configured for JSON
never unpickles.  :meth:`StoreCodec.decode` rejects a value that still
carries its deadline header: only :func:`split_deadline` takes it off.
"""

from __future__ import annotations

from typing import Any

from nearcache.drivers.base import MAX_INT64, MIN_INT64
from nearcache.serializers import (
    Compressor,
    Serializer,
    UndecodableEntry,
    ValueCodec,
)

__all__ = [
    "DEADLINE_HEADER_SIZE",
    "TAG_DEADLINE",
    "TAG_FLAGS",
    "StoreCodec",
    "deadline_of",
    "is_counter",
    "split_deadline",
    "with_deadline",
]

#: First byte of a value stored with its full 32-bit flags word.
TAG_FLAGS = 0x10
#: First byte of a value wrapped in a deadline header (:func:`with_deadline`).
TAG_DEADLINE = 0x11
#: Bytes a deadline header adds to a value: the tag and the deadline.
DEADLINE_HEADER_SIZE = 9
_MAX_DEADLINE = 2**64 - 1

_DIGIT_OR_MINUS = frozenset(b"0123456789-")
_FLAG_BYTES = 0
_FLAG_STR = 1


class StoreCodec:
    """Values to one byte string and back, in the format described above."""

    __slots__ = ("_plain", "values")

    def __init__(
        self,
        serializer: str | Serializer = "pickle",
        *,
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
    ) -> None:
        """Build the value layer (same options as :class:`nearcache.Cache`)."""
        self.values = ValueCodec(
            serializer,
            compress=compress,
            compress_threshold=compress_threshold,
            signing_key=signing_key,
        )
        # bytes and str skip ValueCodec when they would come out unchanged.
        self._plain = not self.values.signed and self.values.compressor is None

    def encode(self, value: Any, key: bytes) -> bytes:
        """Return the stored form of ``value`` under the full key ``key``.

        Raises :class:`~nearcache.errors.SerializationError` when the
        serializer cannot encode the value.
        """
        kind = type(value)
        if kind is int and MIN_INT64 <= value <= MAX_INT64:
            return b"%d" % value
        if self._plain:
            if kind is bytes:
                raw: bytes = value
                return b"\x00" + raw
            if kind is str:
                text: str = value
                return b"\x01" + text.encode("utf-8")
        flags, payload = self.values.encode(value, key)
        if flags < TAG_FLAGS:
            return bytes((flags,)) + payload
        return b"\x10" + flags.to_bytes(4, "little") + payload

    def decode(self, data: bytes, key: bytes) -> Any:
        """Rebuild the value stored under the full key ``key``.

        Raises:
            EntryRejected: the bytes are not in this format, were written with
                another serializer, or fail their signature.
        """
        if not data:
            raise UndecodableEntry("an empty stored value is not in nearcache's format")
        tag = data[0]
        if tag in _DIGIT_OR_MINUS:
            try:
                return int(data)
            except ValueError:
                raise UndecodableEntry(f"not a stored counter: {data[:32]!r}") from None
        if tag < TAG_FLAGS:
            if self._plain:
                if tag == _FLAG_BYTES:
                    return data[1:]
                if tag == _FLAG_STR:
                    try:
                        return data[1:].decode("utf-8")
                    except UnicodeDecodeError:
                        raise UndecodableEntry("invalid UTF-8 in a str value") from None
            return self.values.decode(tag, data[1:], key)
        if tag == TAG_FLAGS and len(data) >= 5:
            return self.values.decode(int.from_bytes(data[1:5], "little"), data[5:], key)
        if tag == TAG_DEADLINE:
            raise UndecodableEntry("a value with a deadline header reached decode unopened")
        raise UndecodableEntry(f"stored value starts with {tag:#04x}: not nearcache's format")


def is_counter(data: bytes) -> bool:
    """Whether stored bytes are a counter (plain decimal digits, maybe signed)."""
    return bool(data) and data[0] in _DIGIT_OR_MINUS


def with_deadline(data: bytes, deadline_ms: int) -> bytes:
    """Wrap the stored form ``data`` of a non-counter in a deadline header.

    ``deadline_ms`` is the Unix time, in milliseconds, from which the value
    is expired; ``0`` means it never expires.

    Raises:
        ValueError: ``data`` is a counter (which must stay plain digits) or
            already has a header, or the deadline does not fit 64 bits.
    """
    if not data or is_counter(data) or data[0] == TAG_DEADLINE:
        raise ValueError("only a stored non-counter without a header takes a deadline header")
    if not 0 <= deadline_ms <= _MAX_DEADLINE:
        raise ValueError(f"deadline {deadline_ms} ms is outside 0..2**64-1")
    return b"\x11" + deadline_ms.to_bytes(8, "little") + data


def deadline_of(data: bytes) -> int | None:
    """The deadline (Unix ms, ``0``: never) of stored bytes that start with a
    whole header and something after it, else ``None``; what follows the
    header is not checked (:func:`split_deadline` checks it)."""
    if len(data) <= DEADLINE_HEADER_SIZE or data[0] != TAG_DEADLINE:
        return None
    return int.from_bytes(data[1:DEADLINE_HEADER_SIZE], "little")


def split_deadline(data: bytes) -> tuple[int | None, bytes]:
    """Return ``(deadline in Unix ms, stored value)`` of stored bytes.

    Bytes without a header come back as they are, with the deadline
    ``None``: a counter, a value stored with no TTL, or a value written by an
    older nearcache (the store's own expiry applies to them).

    Raises:
        UndecodableEntry: a header is truncated, or wraps a counter, another
            header or nothing (never written by nearcache).
    """
    if not data or data[0] != TAG_DEADLINE:
        return None, data
    if len(data) <= DEADLINE_HEADER_SIZE:
        raise UndecodableEntry(f"truncated deadline header ({len(data)} bytes)")
    inner = data[DEADLINE_HEADER_SIZE:]
    if inner[0] in _DIGIT_OR_MINUS or inner[0] == TAG_DEADLINE:
        raise UndecodableEntry("a deadline header wraps a counter or another header")
    return deadline_of(data), inner
