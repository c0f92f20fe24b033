"""Serializers, compression, signing and the flags layout (nearcache.serializers)."""

from __future__ import annotations

import math
import pickle
import struct
from collections.abc import Callable
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nearcache import Cache, ConfigurationError, SerializationError, _native
from nearcache.serializers import (
    FLAG_SIGNED,
    SIGNATURE_SIZE,
    JsonSerializer,
    MsgpackSerializer,
    PickleSerializer,
    Serializer,
    SignatureError,
    UndecodableEntry,
    ValueCodec,
    ZstdCompressor,
    decode_native,
    encode_native,
    get_serializer,
)

pytest_plugins = ["_cache_helpers"]

SIGNING_KEY = b"0123456789abcdef0123456789abcdef"
RawEntry = Callable[[Cache, str], tuple[bytes, int]]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
msgpack_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.text(max_size=8) | st.integers(min_value=-(2**63), max_value=2**63 - 1),
            children,
            max_size=4,
        )
    ),
    max_leaves=20,
)
pickle_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.complex_numbers(allow_nan=False)
    | st.dates(),
    lambda children: (
        st.lists(children, max_size=4)
        | st.tuples(children, children)
        | st.frozensets(st.integers() | st.text(), max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.integers(), children, max_size=4)
    ),
    max_leaves=20,
)
native_values = st.one_of(
    st.binary(),
    st.text(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False),
    st.booleans(),
    st.none(),
)

codec_options = st.fixed_dictionaries(
    {
        "compress": st.sampled_from([None, "zstd"]),
        "compress_threshold": st.sampled_from([0, 16, 1024]),
        "signing_key": st.sampled_from([None, SIGNING_KEY]),
    }
)


def _same(a: Any, b: Any) -> bool:
    return type(a) is type(b) and a == b


@settings(max_examples=150)
@given(pickle_values, codec_options)
def test_pickle_round_trip(value: Any, options: dict[str, Any]) -> None:
    codec = ValueCodec("pickle", **options)
    flags, payload = codec.encode(value, b"key")
    assert codec.decode(flags, payload, b"key") == value


@settings(max_examples=150)
@given(json_values, codec_options)
def test_json_round_trip(value: Any, options: dict[str, Any]) -> None:
    codec = ValueCodec("json", **options)
    flags, payload = codec.encode(value, b"key")
    assert codec.decode(flags, payload, b"key") == value


@settings(max_examples=150)
@given(msgpack_values, codec_options)
def test_msgpack_round_trip(value: Any, options: dict[str, Any]) -> None:
    codec = ValueCodec("msgpack", **options)
    flags, payload = codec.encode(value, b"key")
    assert codec.decode(flags, payload, b"key") == value


@settings(max_examples=200)
@given(native_values, codec_options)
def test_native_values_keep_exact_type(value: Any, options: dict[str, Any]) -> None:
    codec = ValueCodec("json", **options)
    flags, payload = codec.encode(value, b"key")
    assert _same(codec.decode(flags, payload, b"key"), value)
    if options["signing_key"] is None and flags < _native.FLAG_USER:
        assert (flags, payload) == encode_native(value)


@settings(max_examples=100, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=native_values)
def test_python_native_encoding_matches_the_engine(
    value: Any, make_cache: Callable[..., Cache], raw_entry: RawEntry
) -> None:
    """What the engine stores for a native value is what encode_native produces."""
    cache = make_cache("native-enc")
    cache.native.set_typed("k", value)
    payload, flags = raw_entry(cache, "k")
    assert (flags, payload) == encode_native(value)
    assert _same(decode_native(flags, payload), value)


def test_nan_round_trips() -> None:
    flags, payload = ValueCodec().encode(math.nan, b"k")
    assert math.isnan(ValueCodec().decode(flags, payload, b"k"))


def test_flag_layout() -> None:
    codec = ValueCodec("json", compress="zstd", compress_threshold=10)
    assert codec.encode(b"short", b"k") == (_native.FLAG_BYTES, b"short")
    flags, payload = codec.encode("x" * 1000, b"k")
    assert flags == _native.FLAG_USER | 1 << 5 | _native.FLAG_STR  # zstd, native str
    assert zstandard.ZstdDecompressor().decompress(payload) == b"x" * 1000
    flags, _ = codec.encode({"k": "v" * 1000}, b"k")
    assert flags == _native.FLAG_USER | 1 << 5 | 2 << 8  # zstd, json
    flags, _ = ValueCodec("msgpack").encode([1], b"k")
    assert flags == _native.FLAG_USER | 3 << 8
    flags, payload = ValueCodec(signing_key=SIGNING_KEY).encode([1], b"k")
    assert flags == _native.FLAG_USER | FLAG_SIGNED | 1 << 8
    assert len(payload) == SIGNATURE_SIZE + len(pickle.dumps([1], pickle.HIGHEST_PROTOCOL))


def test_incompressible_bodies_stay_uncompressed() -> None:
    codec = ValueCodec(compress="zstd", compress_threshold=0)
    random_bytes = bytes(range(256)) * 2
    flags, payload = codec.encode(random_bytes[:40], b"k")
    assert flags == _native.FLAG_BYTES  # zstd would make 40 bytes bigger
    assert payload == random_bytes[:40]


def test_signature_binds_key_flags_and_payload() -> None:
    codec = ValueCodec(signing_key=SIGNING_KEY)
    flags, payload = codec.encode({"a": 1}, b"key")
    assert codec.decode(flags, payload, b"key") == {"a": 1}
    with pytest.raises(SignatureError):
        codec.decode(flags, payload, b"other")  # moved to another key
    tampered = payload[:-1] + bytes([payload[-1] ^ 1])
    with pytest.raises(SignatureError):
        codec.decode(flags, tampered, b"key")
    json_flags = (flags & ~(0xFF << 8)) | 2 << 8  # claim another serializer
    with pytest.raises(SignatureError):
        codec.decode(json_flags, payload, b"key")
    with pytest.raises(SignatureError):
        codec.decode(flags, payload[:10], b"key")  # truncated below the tag
    other_key = ValueCodec(signing_key=b"x" * 32)
    with pytest.raises(SignatureError):
        other_key.decode(flags, payload, b"key")


def test_signed_codec_rejects_unsigned_entries() -> None:
    codec = ValueCodec(signing_key=SIGNING_KEY)
    with pytest.raises(SignatureError):
        codec.decode(_native.FLAG_STR, b"planted", b"k")
    flags, payload = ValueCodec().encode({"a": 1}, b"k")
    with pytest.raises(SignatureError):
        codec.decode(flags, payload, b"k")


def test_unsigned_codec_reads_signed_entries() -> None:
    flags, payload = ValueCodec(signing_key=SIGNING_KEY).encode([1, 2], b"k")
    assert ValueCodec().decode(flags, payload, b"k") == [1, 2]


class _Exploit:
    triggered = False

    def __reduce__(self) -> tuple[Callable[..., None], tuple[()]]:
        return (_Exploit.trigger, ())

    @staticmethod
    def trigger() -> None:
        _Exploit.triggered = True


def test_json_cache_never_unpickles() -> None:
    flags, payload = ValueCodec("pickle").encode(_Exploit(), b"k")
    assert _Exploit.triggered is False
    with pytest.raises(UndecodableEntry, match="serializer id 1"):
        ValueCodec("json").decode(flags, payload, b"k")
    assert _Exploit.triggered is False
    with pytest.raises(SignatureError):
        ValueCodec("pickle", signing_key=SIGNING_KEY).decode(flags, payload, b"k")
    assert _Exploit.triggered is False


def test_reserved_and_malformed_flags_are_rejected() -> None:
    codec = ValueCodec()
    for flags, payload in [
        (_native.FLAG_USER | 1 << 16, b""),  # reserved high bits
        (_native.FLAG_USER | 3 << 5, b""),  # reserved compression id
        (_native.FLAG_USER | 9, b""),  # unknown native type
        (_native.FLAG_USER | 1 << 8 | 1, b""),  # native bits with a serializer
        (_native.FLAG_INT, b"\x00" * 7),  # native int of the wrong size
        (_native.FLAG_BOOL, b"\x02"),
        (_native.FLAG_STR, b"\xff"),
        (7, b""),  # unknown engine flag
        (_native.FLAG_USER | 1 << 8, b"not a pickle"),
        (_native.FLAG_USER | 1 << 5 | 1 << 8, b"not zstd"),
    ]:
        with pytest.raises(UndecodableEntry):
            codec.decode(flags, payload, b"k")


def test_zstd_bomb_is_refused_before_allocation() -> None:
    small = ZstdCompressor(max_output_size=1000)
    frame = zstandard.ZstdCompressor().compress(b"\x00" * 100_000)
    with pytest.raises(UndecodableEntry, match="over the limit"):
        small.decompress(frame)
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(b"abc")
    with pytest.raises(UndecodableEntry):
        small.decompress(no_size)


def test_serialization_errors() -> None:
    with pytest.raises(SerializationError):
        ValueCodec("pickle").encode(lambda: None, b"k")
    with pytest.raises(SerializationError) as info:
        ValueCodec("json").encode({1, 2}, b"k")
    assert isinstance(info.value.__cause__, TypeError)
    with pytest.raises(SerializationError):
        ValueCodec("msgpack").encode(object(), b"k")


def test_json_default_hook() -> None:
    codec = ValueCodec(JsonSerializer(default=sorted))
    flags, payload = codec.encode({3, 1, 2}, b"k")
    assert codec.decode(flags, payload, b"k") == [1, 2, 3]


class _Reversed(Serializer):
    id = 200
    name = "reversed-json"

    def dumps(self, value: Any) -> bytes:
        return JsonSerializer().dumps(value)[::-1]

    def loads(self, data: bytes) -> Any:
        return JsonSerializer().loads(data[::-1])


def test_custom_serializer() -> None:
    codec = ValueCodec(_Reversed())
    flags, payload = codec.encode({"a": [1]}, b"k")
    assert flags >> 8 == 200
    assert payload == b'}]1[:"a"{'
    assert codec.decode(flags, payload, b"k") == {"a": [1]}


def test_serializer_validation() -> None:
    assert isinstance(get_serializer("pickle"), PickleSerializer)
    assert isinstance(get_serializer("msgpack"), MsgpackSerializer)
    with pytest.raises(ConfigurationError, match="unknown serializer"):
        get_serializer("yaml")

    class Reserved(_Reversed):
        id = 5

    class Bad(_Reversed):
        id = 256

    with pytest.raises(ConfigurationError, match="reserved"):
        get_serializer(Reserved())
    with pytest.raises(ConfigurationError):
        get_serializer(Bad())
    with pytest.raises(ConfigurationError):
        get_serializer(object())  # type: ignore[arg-type]


def test_codec_option_validation() -> None:
    with pytest.raises(ConfigurationError, match="16 bytes"):
        ValueCodec(signing_key=b"short")
    with pytest.raises(ConfigurationError):
        ValueCodec(signing_key=123)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="unknown compression"):
        ValueCodec(compress="brotli")
    with pytest.raises(ConfigurationError):
        ValueCodec(compress_threshold=-1)
    assert ValueCodec(compress_threshold="4KiB").compress_threshold == 4096
    assert ValueCodec(signing_key="a text key of enough length").signed


def test_decode_native_matches_struct() -> None:
    assert decode_native(_native.FLAG_INT, struct.pack("<q", -5)) == -5
    assert decode_native(_native.FLAG_FLOAT, struct.pack("<d", 2.5)) == 2.5
    assert decode_native(_native.FLAG_NONE, b"") is None
    assert encode_native(2**63) is None
    assert encode_native(-(2**63)) == (_native.FLAG_INT, struct.pack("<q", -(2**63)))


# ------------------------------------------------------------------ through the cache


def test_compressed_values_through_the_cache(
    make_cache: Callable[..., Cache], raw_entry: RawEntry
) -> None:
    cache = make_cache(compress="zstd", compress_threshold=100)
    page = "<html>" + "lorem ipsum " * 500 + "</html>"
    cache.set("page", page)
    cache.set("small", "tiny")
    cache.set("obj", {"rows": list(range(500))})
    payload, flags = raw_entry(cache, "page")
    assert flags & (3 << 5) and len(payload) < len(page) // 4
    assert cache.native.get_entry("small") == (b"tiny", _native.FLAG_STR)
    assert cache.get("page") == page
    assert cache.get("obj") == {"rows": list(range(500))}
    plain = make_cache("c")  # same file, no compression configured: still decodes
    assert plain.get("page") == page


def test_json_cache_treats_foreign_entries_as_misses(make_cache: Callable[..., Cache]) -> None:
    pickler = make_cache()
    pickler.set("obj", _Exploit())
    reader = make_cache(serializer="json")
    assert reader.get("obj", "miss") == "miss"
    assert reader.stats()["decode_errors"] == 1
    assert _Exploit.triggered is False
