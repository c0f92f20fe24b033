"""Canonical bytes of Python values: the key material of memoized calls and tags.

:func:`canonical_bytes` turns a value into bytes that are equal for equal
inputs of the same types in every process and Python version, never by
plain pickle (whose output depends on dict/set order and hash seeds):

* ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, and tuples,
  lists, dicts (order-insensitive), sets and frozensets of them, are
  encoded by type and value (``1``, ``1.0``, ``True`` and ``"1"`` are four
  different encodings);
* enums, classes, subclasses of the built-in types (named tuples, ...),
  ``datetime``/``date``/``time``/``timedelta``, ``Decimal``, ``Fraction``,
  ``UUID``, paths and dataclass instances are encoded by type name and
  value;
* an object with a ``__cache_key__()`` method is encoded by its type name and
  what that method returns;
* anything else falls back to its pickle (protocol 4).

It sits at the bottom of the package: memoize (:mod:`nearcache.memoize`)
hashes a call's bound arguments with it, tags (:mod:`nearcache.tags`) the
generations that become part of a memoized key.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import fractions
import pathlib
import pickle
import uuid
from typing import Any, Final

__all__ = ["canonical_bytes"]

_REPR_TYPES: Final = (
    datetime.datetime,
    datetime.date,
    datetime.time,
    datetime.timedelta,
    datetime.timezone,
    decimal.Decimal,
    fractions.Fraction,
    uuid.UUID,
    complex,
    pathlib.PurePath,
    range,
    slice,
)

_BUILTIN_BASES: Final[tuple[Any, ...]] = (int, float, str, bytes, tuple, list, dict, frozenset, set)


def _type_name(cls: type) -> bytes:
    return f"{cls.__module__}.{cls.__qualname__}".encode("utf-8", "surrogatepass")


def _with_length(tag: bytes, data: bytes, out: list[bytes]) -> None:
    out.append(tag + str(len(data)).encode("ascii") + b":" + data)


def _canonical(obj: Any, out: list[bytes]) -> None:
    cls = obj.__class__
    if cls is str:
        _with_length(b"s", obj.encode("utf-8", "surrogatepass"), out)
    elif cls is int:
        out.append(b"i%d;" % obj)
    elif obj is None:
        out.append(b"N")
    elif cls is bool:
        out.append(b"T" if obj else b"F")
    elif cls is bytes:
        _with_length(b"b", obj, out)
    elif cls is float:
        out.append(b"f" + float.hex(obj).encode("ascii") + b";")
    elif cls is tuple or cls is list:
        out.append(b"(" if cls is tuple else b"[")
        for item in obj:
            _canonical(item, out)
        out.append(b")" if cls is tuple else b"]")
    elif cls is dict:
        _canonical_dict(obj, out)
    elif cls is set or cls is frozenset:
        out.append(b"<" if cls is set else b"{")
        out.extend(sorted(canonical_bytes(item) for item in obj))
        out.append(b">")
    else:
        _canonical_other(obj, cls, out)


def _canonical_dict(obj: dict[Any, Any], out: list[bytes]) -> None:
    out.append(b"{")
    for key_bytes, value_bytes in sorted(
        (canonical_bytes(key), canonical_bytes(value)) for key, value in obj.items()
    ):
        out.append(key_bytes)
        out.append(value_bytes)
    out.append(b"}")


def _canonical_other(obj: Any, cls: type, out: list[bytes]) -> None:
    if isinstance(obj, enum.Enum):
        _with_length(b"e", _type_name(cls), out)
        _canonical(obj.value, out)
    elif isinstance(obj, type):
        _with_length(b"t", _type_name(obj), out)
    elif callable(getattr(cls, "__cache_key__", None)):
        _with_length(b"k", _type_name(cls), out)
        _canonical(obj.__cache_key__(), out)
    elif isinstance(obj, _REPR_TYPES):
        _with_length(b"x", _type_name(cls), out)
        _with_length(b"r", repr(obj).encode("utf-8", "surrogatepass"), out)
    elif dataclasses.is_dataclass(obj):
        _with_length(b"d", _type_name(cls), out)
        _canonical(
            tuple((f.name, getattr(obj, f.name)) for f in dataclasses.fields(obj)),
            out,
        )
    elif isinstance(obj, _BUILTIN_BASES):
        # Subclasses of the built-in types (named tuples, OrderedDict, str
        # subclasses...): the type name, then the value as its base type.
        _with_length(b"u", _type_name(cls), out)
        base: Any = next(b for b in _BUILTIN_BASES if isinstance(obj, b))
        _canonical(base(obj), out)
    else:
        try:
            data = pickle.dumps(obj, protocol=4)
        except Exception as exc:
            raise TypeError(
                f"cannot build a cache key from a {cls.__qualname__} argument ({exc}); "
                "pass key= or ignore= to memoize, or give the class a __cache_key__() method"
            ) from exc
        _with_length(b"p", data, out)


def canonical_bytes(obj: object) -> bytes:
    """A deterministic byte encoding of ``obj`` for building cache keys.

    Equal inputs of the same types give equal bytes in every process and
    Python version (see the module docs for what is covered, and the pickle
    fallback for the rest).

    >>> canonical_bytes({"b": 1, "a": (1.5, None)}) == canonical_bytes({"a": (1.5, None), "b": 1})
    True
    >>> len({canonical_bytes(v) for v in (1, 1.0, True, "1", b"1")})
    5
    """
    out: list[bytes] = []
    _canonical(obj, out)
    return b"".join(out)
