"""The byte format of values in Redis and memcached (nearcache.drivers.codec)."""

from __future__ import annotations

import pickle
import struct
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nearcache.drivers.base import MAX_INT64, MIN_INT64
from nearcache.drivers.codec import (
    DEADLINE_HEADER_SIZE,
    StoreCodec,
    is_counter,
    split_deadline,
    with_deadline,
)
from nearcache.errors import SerializationError
from nearcache.serializers import EntryRejected, SignatureError, UndecodableEntry

KEY = b"prefix:key"
SIGNING_KEY = b"0123456789abcdef0123456789abcdef"

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=10,
)


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        (42, b"42"),
        (-7, b"-7"),
        (0, b"0"),
        (MAX_INT64, b"9223372036854775807"),
        (b"raw", b"\x00raw"),
        ("text", b"\x01text"),
        (1.5, b"\x03" + struct.pack("<d", 1.5)),
        (True, b"\x04\x01"),
        (False, b"\x04\x00"),
        (None, b"\x05"),
    ],
)
def test_native_layout(value: Any, stored: bytes) -> None:
    codec = StoreCodec()
    data = codec.encode(value, KEY)
    assert data == stored
    decoded = codec.decode(data, KEY)
    assert type(decoded) is type(value)
    assert decoded == value


def test_large_ints_and_objects_carry_their_flags() -> None:
    codec = StoreCodec()
    for value in (2**64, MIN_INT64 - 1, [1, 2], {"a": (1,)}):
        data = codec.encode(value, KEY)
        assert data[0] == 0x10
        flags = int.from_bytes(data[1:5], "little")
        assert flags >= 16
        assert codec.decode(data, KEY) == value


@given(values)
def test_every_value_round_trips(value: Any) -> None:
    codec = StoreCodec()
    assert codec.decode(codec.encode(value, KEY), KEY) == value


@given(values)
def test_only_counters_look_like_numbers(value: Any) -> None:
    """memcached's incr parses with strtoull: no other value may start like a number."""
    data = StoreCodec().encode(value, KEY)
    is_counter = type(value) is int and MIN_INT64 <= value <= MAX_INT64
    assert (data[:1] in b"-0123456789" and data[:1] != b"") == is_counter
    assert data[:1] not in (b" ", b"\t", b"\n", b"\r", b"\v", b"\f", b"+")


def test_json_codec_never_unpickles() -> None:
    pickled = StoreCodec("pickle").encode({"a": 1}, KEY)
    with pytest.raises(UndecodableEntry):
        StoreCodec("json").decode(pickled, KEY)
    as_json = StoreCodec("json").encode({"a": [1]}, KEY)
    assert StoreCodec("json").decode(as_json, KEY) == {"a": [1]}


def test_signed_values_verify_and_bind_to_their_key() -> None:
    codec = StoreCodec(signing_key=SIGNING_KEY)
    data = codec.encode({"safe": True}, KEY)
    assert codec.decode(data, KEY) == {"safe": True}
    with pytest.raises(SignatureError):
        codec.decode(data, b"prefix:other")
    with pytest.raises(SignatureError):
        codec.decode(StoreCodec().encode("unsigned", KEY), KEY)
    forged = b"\x10" + (16 | 1 << 8).to_bytes(4, "little") + pickle.dumps("x")
    with pytest.raises(EntryRejected):
        codec.decode(forged, KEY)
    assert codec.decode(b"12", KEY) == 12  # counters are never signed


def test_compression() -> None:
    codec = StoreCodec(compress="zstd", compress_threshold=100)
    page = "lorem ipsum " * 500
    data = codec.encode(page, KEY)
    assert len(data) < len(page) // 4
    assert codec.decode(data, KEY) == page
    assert codec.encode("short", KEY) == b"\x01short"


@pytest.mark.parametrize("data", [b"", b"12a", b"-", b"\x7fjunk", b"\x10\x00", b"abc"])
def test_foreign_bytes_are_rejected(data: bytes) -> None:
    with pytest.raises(EntryRejected):
        StoreCodec().decode(data, KEY)


def test_unserializable_values_raise() -> None:
    with pytest.raises(SerializationError):
        StoreCodec().encode(lambda: None, KEY)


def test_deadline_header_layout() -> None:
    codec = StoreCodec()
    data = with_deadline(codec.encode("text", KEY), 1_700_000_000_123)
    assert data == b"\x11" + (1_700_000_000_123).to_bytes(8, "little") + b"\x01text"
    assert len(data) == DEADLINE_HEADER_SIZE + len(b"\x01text")
    deadline, inner = split_deadline(data)
    assert deadline == 1_700_000_000_123
    assert codec.decode(inner, KEY) == "text"
    assert split_deadline(with_deadline(b"\x05", 0)) == (0, b"\x05")  # 0: never expires
    for plain in (b"\x01text", b"42", b"-7", b"\x10" + bytes(4), b""):
        assert split_deadline(plain) == (None, plain)  # no header: as it is


@given(values, st.integers(min_value=0, max_value=2**64 - 1))
def test_headers_round_trip_and_never_look_like_numbers(value: Any, deadline: int) -> None:
    codec = StoreCodec()
    data = codec.encode(value, KEY)
    if is_counter(data):
        with pytest.raises(ValueError):
            with_deadline(data, deadline)
        return
    wrapped = with_deadline(data, deadline)
    assert wrapped[:1] not in b"-0123456789 \t\n\r\v\f+"
    assert split_deadline(wrapped) == (deadline, data)
    with pytest.raises(UndecodableEntry):
        codec.decode(wrapped, KEY)  # decode never ignores a deadline


def test_with_deadline_refuses_what_it_cannot_wrap() -> None:
    for data in (b"42", b"-1", b"", with_deadline(b"\x01v", 5)):
        with pytest.raises(ValueError):
            with_deadline(data, 5)
    for deadline in (-1, 2**64):
        with pytest.raises(ValueError):
            with_deadline(b"\x01v", deadline)


@pytest.mark.parametrize(
    "data",
    [
        b"\x11",
        b"\x11\x01\x02",
        b"\x11" + bytes(8),
        b"\x11" + bytes(8) + b"123",
        b"\x11" + bytes(8) + b"-1",
        b"\x11" + bytes(8) + b"\x11" + bytes(8) + b"\x01v",
    ],
)
def test_malformed_headers_are_rejected(data: bytes) -> None:
    with pytest.raises(UndecodableEntry):
        split_deadline(data)
