"""How keys become the bytes the engine stores.

Keys are never pickled: equal keys must always map to the same bytes, in
every process and every Python version.  Three key types are accepted:

========  ========================================================  ===================
type      stored bytes                                              example
========  ========================================================  ===================
``str``   its UTF-8 encoding                                        ``"a"`` → ``61``
``bytes`` unchanged, except that a first byte ``0xFE`` or ``0xFF``  ``b"a"`` → ``61``,
          gets a ``0xFE`` escape byte in front                      ``b"\\xff1"`` → ``fe ff 31``
``int``   ``0xFF`` then the decimal digits (ASCII, ``-`` sign)      ``-7`` → ``ff 2d 37``
========  ========================================================  ===================

The encoding is the engine's (``nearcache_core::keys``), shared by every
binding, and it is injective: two keys share stored bytes only if they are
equal or are a ``str`` and the ``bytes`` of its UTF-8.

Consequences, all deliberate:

* ``"a"`` and ``b"a"`` are the same key (str and bytes share the UTF-8
  namespace, as in the engine and in memcached/Redis).
* ``1`` and ``"1"`` are different keys, and so are ``1`` and ``b"\\xff1"``:
  the bytes ``0xFE`` and ``0xFF`` never occur in UTF-8, only int keys start
  with ``0xFF``, and a bytes key that would start with ``0xFE``/``0xFF`` is
  escaped.  ``True`` and ``False`` are the ints ``1`` and ``0`` (they are
  equal in Python, so they must be the same key).  Ints may be arbitrarily
  large.
* Every other type (float, tuple, None, bytearray, objects...) raises
  :class:`~nearcache.errors.KeyTypeError`, a :class:`TypeError`.  Build a
  string key yourself (``f"user:{uid}:{lang}"``) for composite keys.
* A ``str`` containing lone surrogates cannot be encoded and raises
  :class:`UnicodeEncodeError`.

A cache's ``prefix`` (namespace) is prepended by the engine to every key;
several applications can share one file with distinct prefixes.

>>> encode_key("user:42")
b'user:42'
>>> encode_key(42)
b'\\xff42'
>>> encode_key(42) == encode_key("42") or encode_key(42) == encode_key(b"\\xff42")
False
>>> encode_key(b"\\xff42")
b'\\xfe\\xff42'
>>> decode_key(encode_key(-7))
-7
>>> decode_key("é".encode())
'é'
>>> encode_key(1.5)
Traceback (most recent call last):
...
nearcache.KeyTypeError: cache keys must be str, bytes or int, not float
"""

from __future__ import annotations

from typing import Final, TypeAlias

from nearcache.errors import KeyTypeError

__all__ = [
    "BYTES_KEY_ESCAPE",
    "INT_KEY_MARKER",
    "Key",
    "check_key_collection",
    "decode_key",
    "encode_key",
    "encode_prefix",
    "native_key",
]

#: What the public API accepts as a key.
Key: TypeAlias = str | bytes | int

#: First byte of every int key; it never occurs in valid UTF-8.
INT_KEY_MARKER: Final = b"\xff"

#: Put in front of a bytes key whose first byte is 0xFE or 0xFF; never in UTF-8.
BYTES_KEY_ESCAPE: Final = b"\xfe"


def _type_error(key: object) -> KeyTypeError:
    return KeyTypeError(f"cache keys must be str, bytes or int, not {type(key).__name__}")


def native_key(key: object) -> Key:
    """Return ``key`` in a form the engine accepts (``str``, ``bytes`` or ``int``).

    The engine encodes all three itself; this only checks the type, so that
    a bad key fails before any work is done.

    >>> native_key("k"), native_key(b"k"), native_key(7)
    ('k', b'k', 7)
    """
    if isinstance(key, (str, bytes, int)):
        return key
    raise _type_error(key)


def check_key_collection(keys: object) -> None:
    """Refuse a bare ``str``/``bytes`` where a collection of keys is expected.

    Iterating ``"abc"`` gives the keys ``"a"``, ``"b"``, ``"c"`` (and
    ``b"abc"`` the int keys 97, 98, 99): never what was meant.

    >>> check_key_collection(["abc"])
    >>> try:
    ...     check_key_collection("abc")
    ... except TypeError as exc:
    ...     print(exc)
    expected a collection of keys, got a str ('abc'); wrap a single key in a list
    """
    if isinstance(keys, (str, bytes, bytearray, memoryview)):
        raise KeyTypeError(
            f"expected a collection of keys, got a {type(keys).__name__} ({keys!r}); "
            "wrap a single key in a list"
        )


def encode_key(key: object) -> bytes:
    """Return the exact bytes stored for ``key`` (without the cache prefix).

    >>> encode_key(b"\\x00raw"), encode_key(b"\\xfe")
    (b'\\x00raw', b'\\xfe\\xfe')
    """
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes):
        if key[:1] in (INT_KEY_MARKER, BYTES_KEY_ESCAPE):
            return BYTES_KEY_ESCAPE + key
        return bytes(key)
    if isinstance(key, int):
        return INT_KEY_MARKER + str(int(key)).encode("ascii")
    raise _type_error(key)


def decode_key(raw: bytes) -> Key:
    """Map stored key bytes back to the most natural Python key.

    An int encoding gives the ``int``; an escaped bytes key gives its
    ``bytes``; valid UTF-8 gives a ``str``; anything else stays ``bytes``.
    ``encode_key(decode_key(b)) == b`` holds for every ``b`` that
    :func:`encode_key` produces, so a decoded key can be passed back to any
    cache method.

    >>> decode_key(b"plain"), decode_key(b"\\xff12"), decode_key(b"\\x80")
    ('plain', 12, b'\\x80')
    >>> decode_key(b"\\xfe\\xff12")  # the bytes key b"\\xff12", escaped
    b'\\xff12'
    >>> decode_key(b"\\xff012")  # no encoder makes this: stays bytes as stored
    b'\\xff012'
    """
    if raw[:1] == INT_KEY_MARKER:
        digits = raw[1:]
        if _is_canonical_int(digits):
            return int(digits)
        return raw
    if raw[:1] == BYTES_KEY_ESCAPE and raw[1:2] in (INT_KEY_MARKER, BYTES_KEY_ESCAPE):
        return raw[1:]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def _is_canonical_int(digits: bytes) -> bool:
    body = digits[1:] if digits[:1] == b"-" else digits
    if not body or not body.isdigit() or not body.isascii():
        return False
    if body[:1] == b"0":
        return body == b"0" and digits == b"0"  # "0" only; "-0" and "007" are not canonical
    return True


def encode_prefix(prefix: str | bytes) -> bytes:
    """Validate a namespace prefix and return its bytes.

    >>> encode_prefix("app1:")
    b'app1:'
    """
    if isinstance(prefix, str):
        return prefix.encode("utf-8")
    if isinstance(prefix, bytes):
        return bytes(prefix)
    raise TypeError(f"prefix must be str or bytes, not {type(prefix).__name__}")
