"""Key encoding (nearcache.keys) and how the cache applies it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nearcache
from nearcache import Cache, KeyTypeError
from nearcache.keys import (
    BYTES_KEY_ESCAPE,
    INT_KEY_MARKER,
    decode_key,
    encode_key,
    encode_prefix,
    native_key,
)

keys = st.one_of(st.text(), st.binary(), st.integers(min_value=-(10**40), max_value=10**40))

pytest_plugins = ["_cache_helpers"]


def test_documented_encodings() -> None:
    assert encode_key("a") == b"a"
    assert encode_key(b"a") == b"a"
    assert encode_key("é") == "é".encode()
    assert encode_key(0) == b"\xff0"
    assert encode_key(-7) == b"\xff-7"
    assert encode_key(10**30) == b"\xff" + b"1" + b"0" * 30
    assert encode_key(True) == encode_key(1)
    assert encode_key(False) == encode_key(0)
    assert encode_key(b"\xff12345") == b"\xfe\xff12345"
    assert encode_key(b"\xfe") == b"\xfe\xfe"


@pytest.mark.parametrize("bad", [1.5, None, (1, 2), ["a"], bytearray(b"a"), memoryview(b"a"), {1}])
def test_unsupported_key_types(bad: object) -> None:
    with pytest.raises(KeyTypeError, match="str, bytes or int"):
        encode_key(bad)
    with pytest.raises(TypeError):
        native_key(bad)


def test_lone_surrogate_is_rejected() -> None:
    with pytest.raises(UnicodeEncodeError):
        encode_key("\ud800")


@given(keys)
def test_decode_inverts_encode(key: str | bytes | int) -> None:
    raw = encode_key(key)
    assert encode_key(decode_key(raw)) == raw


@given(keys, keys)
def test_equal_bytes_only_for_equal_keys(a: str | bytes | int, b: str | bytes | int) -> None:
    """Two keys share bytes only if they are equal, or are str/bytes with the
    same UTF-8: the int and bytes namespaces never meet."""

    def canon(k: str | bytes | int) -> tuple[str, object]:
        if isinstance(k, int):
            return ("int", int(k))
        if isinstance(k, str):
            return ("bytes", k.encode())
        return ("bytes", k)

    assert (encode_key(a) == encode_key(b)) == (canon(a) == canon(b))


@given(st.integers(min_value=-(10**40), max_value=10**40))
def test_int_key_is_not_its_old_bytes_alias(number: int) -> None:
    alias = INT_KEY_MARKER + str(number).encode()
    assert encode_key(alias) == BYTES_KEY_ESCAPE + alias
    assert encode_key(alias) != encode_key(number)
    assert decode_key(encode_key(alias)) == alias


@given(st.text())
def test_str_keys_never_collide_with_int_keys(text: str) -> None:
    assert not encode_key(text).startswith(INT_KEY_MARKER)


def test_decode_key_kinds() -> None:
    assert decode_key(b"abc") == "abc"
    assert decode_key(b"\xff42") == 42
    assert decode_key(b"\xff-42") == 42 * -1
    assert decode_key(b"\x80\x81") == b"\x80\x81"
    for not_canonical in (b"\xff", b"\xff-", b"\xff007", b"\xff-0", b"\xff+1", b"\xff1a"):
        assert decode_key(not_canonical) == not_canonical


def test_prefix_encoding() -> None:
    assert encode_prefix("ns:") == b"ns:"
    assert encode_prefix(b"\x00") == b"\x00"
    with pytest.raises(TypeError):
        encode_prefix(1)  # type: ignore[arg-type]


# ---------------------------------------------------------------- through the cache


def test_int_and_str_keys_are_distinct(cache: Cache) -> None:
    cache.set(1, "int one")
    cache.set("1", "str one")
    assert cache.get(1) == "int one"
    assert cache.get("1") == "str one"
    assert cache.get(True) == "int one"
    assert cache.get(b"1") == "str one"
    assert sorted(cache.keys(), key=repr) == sorted([1, "1"], key=repr)


def test_bytes_keys_starting_with_ff_are_not_int_keys(cache: Cache) -> None:
    """An int key and the bytes of its old stored form used to be one key."""
    cache.set(12345, "int")
    assert cache.get(b"\xff12345") is None
    cache.set(b"\xff12345", "bytes")
    cache.set(b"\xfe", "escape byte")
    assert cache.get(12345) == "int"
    assert cache.get(b"\xff12345") == "bytes"
    assert cache.get(b"\xfe") == "escape byte"
    assert sorted(cache.keys(), key=repr) == sorted([12345, b"\xff12345", b"\xfe"], key=repr)
    assert cache.delete(b"\xff12345") is True
    assert cache.get(12345) == "int"


def test_every_operation_accepts_int_keys(cache: Cache) -> None:
    cache.set(7, b"v")
    assert 7 in cache
    assert cache[7] == b"v"
    assert cache.add(7, "no") is False
    assert cache.replace(7, "yes") is True
    assert cache.touch(7, ttl=60) is True
    assert 59 < (cache.ttl(7) or 0) <= 60
    assert cache.get_many([7, 8]) == {7: "yes"}
    assert cache.pop(7) == "yes"
    assert cache.incr(9, 5) == 5
    assert cache.decr(9) == 4
    cache.set_many({10: [1], 11: {"a": 1}})
    assert cache.delete_many([9, 10, 11]) == 3
    cache[12] = 1
    del cache[12]
    assert 12 not in cache


@pytest.mark.parametrize("bad", [1.5, None, (1,), bytearray(b"x")])
def test_cache_rejects_unsupported_keys(cache: Cache, bad: object) -> None:
    cache.set("keep", 1)
    for operation in (
        lambda: cache.get(bad),  # type: ignore[call-overload]
        lambda: cache.set(bad, 1),  # type: ignore[arg-type]
        lambda: cache.add(bad, 1),  # type: ignore[arg-type]
        lambda: cache.delete(bad),  # type: ignore[arg-type]
        lambda: bad in cache,
        lambda: cache.get_many([bad]),  # type: ignore[list-item]
        lambda: cache.incr(bad),  # type: ignore[arg-type]
    ):
        with pytest.raises(TypeError):
            operation()
    assert cache.get("keep") == 1
    assert len(cache) == 1


def test_empty_and_oversized_keys(cache: Cache) -> None:
    with pytest.raises(nearcache.InvalidKeyError):
        cache.set("", 1)
    with pytest.raises(nearcache.InvalidKeyError):
        cache.set("k" * (nearcache._native.MAX_KEY_LEN + 1), 1)
    cache.set("k" * nearcache._native.MAX_KEY_LEN, 1)
    assert cache.get("k" * nearcache._native.MAX_KEY_LEN) == 1


def test_prefixes_isolate_namespaces(make_cache: Callable[..., Cache]) -> None:
    first = make_cache("shared", prefix="app1:")
    second = make_cache("shared", prefix=b"app2:")
    bare = make_cache("shared")
    first.set("k", "one")
    second.set("k", "two")
    assert first.get("k") == "one"
    assert second.get("k") == "two"
    assert sorted(bare.keys()) == ["app1:k", "app2:k"]
    assert first.keys() == ["k"]
    assert len(first) == 1
    first.clear()
    assert second.get("k") == "two"
    assert bare.keys() == ["app2:k"]
