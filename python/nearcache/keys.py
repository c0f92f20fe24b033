"""How keys become the bytes the engine stores.

Keys are never pickled: equal keys must always map to the same bytes, in
every process and every Python version.  Three key types are accepted:

========  ====================================================  ===============
type      stored bytes                                          example
========  ====================================================  ===============
``str``   its UTF-8 encoding                                    ``"a"`` → ``61``
``bytes`` unchanged                                             ``b"a"`` → ``61``
``int``   ``0xFF`` then the decimal digits (ASCII, ``-`` sign)  ``-7`` → ``ff 2d 37``
========  ====================================================  ===============

Consequences, all deliberate:

* ``"a"`` and ``b"a"`` are the same key (str and bytes share the UTF-8
  namespace, as in the engine and in memcached/Redis).
* ``1`` and ``"1"`` are different keys: the byte ``0xFF`` never occurs in
  UTF-8, so no ``str`` key can look like an ``int`` key.  ``True`` and
  ``False`` are the ints ``1`` and ``0`` (they are equal in Python, so they
  must be the same key).  Ints may be arbitrarily large.
* A ``bytes`` key that starts with ``0xFF`` lives in the int namespace:
  ``b"\\xff42"`` *is* the key ``42``.  Do not build bytes keys starting with
  ``0xFF`` unless you mean that.
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
>>> encode_key(42) == encode_key("42")
False
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

__all__ = ["INT_KEY_MARKER", "Key", "decode_key", "encode_key", "encode_prefix", "native_key"]

#: What the public API accepts as a key.
Key: TypeAlias = str | bytes | int

#: First byte of every int key; it never occurs in valid UTF-8.
INT_KEY_MARKER: Final = b"\xff"


def _type_error(key: object) -> KeyTypeError:
    return KeyTypeError(f"cache keys must be str, bytes or int, not {type(key).__name__}")


def native_key(key: object) -> str | bytes:
    """Return ``key`` in a form the engine accepts (``str`` or ``bytes``).

    ``str`` and ``bytes`` pass through unchanged (the engine encodes ``str``
    as UTF-8 itself); ints get their ``0xFF``-prefixed encoding.

    >>> native_key("k"), native_key(b"k"), native_key(True)
    ('k', b'k', b'\\xff1')
    """
    if isinstance(key, (str, bytes)):
        return key
    if isinstance(key, int):
        return INT_KEY_MARKER + str(int(key)).encode("ascii")
    raise _type_error(key)


def encode_key(key: object) -> bytes:
    """Return the exact bytes stored for ``key`` (without the cache prefix).

    >>> encode_key(b"\\x00raw")
    b'\\x00raw'
    """
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, bytes):
        return bytes(key)
    if isinstance(key, int):
        return INT_KEY_MARKER + str(int(key)).encode("ascii")
    raise _type_error(key)


def decode_key(raw: bytes) -> Key:
    """Map stored key bytes back to the most natural Python key.

    An int encoding gives the ``int``; valid UTF-8 gives a ``str``; anything
    else stays ``bytes``.  ``encode_key(decode_key(b)) == b`` always holds,
    so a decoded key can be passed back to any cache method.

    >>> decode_key(b"plain"), decode_key(b"\\xff12"), decode_key(b"\\x80")
    ('plain', 12, b'\\x80')
    >>> decode_key(b"\\xff012")  # not the canonical form of an int: stays bytes
    b'\\xff012'
    """
    if raw[:1] == INT_KEY_MARKER:
        digits = raw[1:]
        if _is_canonical_int(digits):
            return int(digits)
        return raw
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
