"""What a store can do: the protocol the policies are written against.

The package is built in layers, each importing only the layers below it
(``docs/design/python.md`` draws them; ``tests/python/test_layers.py``
fails on any import circle)::

    stores         Cache, drivers, tiered, aio      bind the policies as methods
    conveniences   PolicyMethods: .memoize, .lock   nearcache.conveniences
    policies       memoize, locks, tags             work on any Store
    cores          lock, stampede, tag records      plain state transitions, no I/O
    protocol       Store, the steps a core yields   this module, nearcache.steps
    foundations    keys, canonical, units, errors, serializers

The policies never import a store: they take any object with the methods
below.  :class:`~nearcache.Cache` and every
:class:`~nearcache.drivers.base.Driver` (a tiered cache included) have
them; the TTL and key rules are those of :mod:`nearcache.drivers.base`.
``cache.memoize(...)`` is ``memoize(cache, ...)``: a store offers the
policies as methods by inheriting :class:`nearcache.conveniences.PolicyMethods`,
so a store module imports the conveniences, never the reverse.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Protocol, overload

from nearcache.keys import Key
from nearcache.units import Duration

__all__ = ["Store"]


class Store(Protocol):
    """The store calls memoize, locks and tags make (sync stores)."""

    @property
    def default_ttl(self) -> float | None:
        """The TTL of a write given ``ttl=None`` (None: never expires)."""

    @overload
    def get(self, key: Key) -> Any: ...
    @overload
    def get(self, key: Key, default: Any) -> Any: ...

    def get_many(self, keys: Iterable[Key]) -> Mapping[Any, Any]: ...

    def set(self, key: Key, value: Any, ttl: Duration | None = None) -> None: ...

    def add(self, key: Key, value: Any, ttl: Duration | None = None) -> bool: ...

    def touch(self, key: Key, ttl: Duration | None = None) -> bool: ...

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int: ...

    def delete(self, key: Key) -> bool: ...

    def delete_many(self, keys: Iterable[Key]) -> int: ...

    def delete_if_equals(self, key: Key, value: Any) -> bool: ...

    def keys(self) -> list[Key]: ...

    def __contains__(self, key: Key) -> bool: ...
