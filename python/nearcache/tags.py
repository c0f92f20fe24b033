"""Tags: invalidate a group of entries at once, in O(1) per tag.

Design
======

* Every tag has a *generation*: a 64-bit integer stored in the same cache
  under ``nearcache.tag:<tag>`` (never expiring, like any entry it can be
  evicted).
* ``set(key, value, tags=[...])`` reads the generations of its tags and
  stores ``[MARK, value, [[tag, generation], ...]]``: the value and the
  generations it was written under.
* A read of such an entry reads the current generations (one ``get_many``)
  and returns the value only if every tag still has the generation the
  entry recorded; otherwise it is a miss.
* ``invalidate_tags([...])`` increments each tag's generation: one atomic
  ``incr`` per tag, whatever the number of entries carrying it.  Entries
  are not touched; stale ones are misses and go with eviction or expiry.
* A tag record that is lost (evicted, or the whole L1 of a host cleared)
  must invalidate, never resurrect.  So a tag record is created with a
  *random* generation (62 random bits), never 0: a recreated record
  matches an old entry's generation with probability 2**-62.  A read that
  finds a tag record missing is a miss (it does not create the record).
* Across processes: the records live in the shared cache itself.  Across
  hosts: through a :class:`~nearcache.tiered.TieredCache`, ``incr`` goes to
  L2 and drops the record's L1 copy on every host (its invalidation
  message), so hosts see the new generation as soon as they see any other
  write.
* memoize: the generations of a call's tags are read *before* the function
  runs and become part of the call's cache key, so an invalidation that
  lands while the function computes makes its result a miss, never a
  fresh-looking stale value.

Use it through :class:`Tagged` (any :class:`~nearcache.Cache` or driver) or
the async API (:class:`nearcache.aio.AsyncCache` takes ``tags=`` itself).

>>> from nearcache import Cache
>>> cache = Tagged(Cache("tags-demo", size="1MiB"))
>>> cache.set("user:1", {"name": "Ada"}, tags=["user:1", "users"])
>>> cache.set("user:2", {"name": "Bob"}, tags=["user:2", "users"])
>>> cache.get("user:1")
{'name': 'Ada'}
>>> cache.invalidate_tags(["users"])
1
>>> cache.get("user:1"), cache.get("user:2", "gone")
(None, 'gone')
>>> cache.store.clear()
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from nearcache.generations import (
    MARK,
    TAG_NAMESPACE,
    TagsArg,
    check_many_steps,
    check_steps,
    check_tags,
    current_steps,
    envelope,
    envelope_tags,
    invalidate_steps,
    is_envelope,
    new_generation,
    still_valid,
    suffix,
    tag_key,
)
from nearcache.keys import Key
from nearcache.memoize import MemoizeDecorator, memoize
from nearcache.protocol import Store
from nearcache.steps import run

__all__ = [
    "MARK",
    "TAG_NAMESPACE",
    "Tagged",
    "TagsArg",
    "check_tags",
    "envelope",
    "envelope_tags",
    "is_envelope",
    "new_generation",
    "still_valid",
    "suffix",
    "tag_key",
]

_MISS: Any = object()


class Tagged:
    """Tag-aware reads and writes over a :class:`~nearcache.Cache` or any driver.

    Entries written without ``tags`` are plain entries; :meth:`get` returns
    both kinds.  An entry written with tags must be read through this class
    (or :class:`nearcache.aio.AsyncCache`): a plain ``get`` returns its
    stored form.
    """

    def __init__(self, store: Store) -> None:
        self.store = store

    # -- generations -----------------------------------------------------------

    def generations(self, tags: Iterable[str]) -> dict[str, int]:
        """The current generation of each tag, creating missing records."""
        return run(current_steps(tags), self.store)

    def invalidate_tags(self, tags: Iterable[str]) -> int:
        """Invalidate every entry carrying any of ``tags``; return how many
        tag records existed (a missing record already invalidates)."""
        return run(invalidate_steps(tags), self.store)

    # -- reads -----------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """The value, or ``default`` if missing or any of its tags was invalidated."""
        stored = self.store.get(key, _MISS)
        if stored is _MISS:
            return default
        return run(check_steps(stored, default), self.store)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """``{key: value}`` for the keys that hit and whose tags are current."""
        return run(check_many_steps(self.store.get_many(keys)), self.store)

    # -- writes ----------------------------------------------------------------

    def set(self, key: Key, value: Any, ttl: Any = None, *, tags: Iterable[str] = ()) -> None:
        """Store ``value``; with ``tags``, it is a miss once any of them is invalidated."""
        names = check_tags(tags)
        if names:
            value = envelope(value, self.generations(names))
        self.store.set(key, value, ttl)

    def add(self, key: Key, value: Any, ttl: Any = None, *, tags: Iterable[str] = ()) -> bool:
        """Store only if ``key`` is absent (an invalidated entry still counts as present)."""
        names = check_tags(tags)
        if names:
            value = envelope(value, self.generations(names))
        return bool(self.store.add(key, value, ttl))

    def delete(self, key: Key) -> bool:
        """Remove ``key``."""
        return bool(self.store.delete(key))

    # -- memoize ---------------------------------------------------------------

    def memoize(
        self,
        ttl: Any = None,
        *,
        tags: TagsArg,
        key: Callable[..., object] | None = None,
        ignore: Iterable[str] = (),
        name: str | None = None,
        **options: Any,
    ) -> MemoizeDecorator:
        """``store.memoize`` whose entries are invalidated by ``tags``.

        ``tags`` is a list of tag names, or a function of the call's
        arguments returning them (``tags=lambda user_id: [f"user:{user_id}"]``).
        The tags' generations, read before the function runs, are part of
        the call's key; keys, methods (``__cache_key__``, ``key=`` or
        ``ignore=("self",)``, checked when the class is created) and the
        other options are those of :func:`nearcache.memoize.memoize`, which
        does the work.
        """
        if tags is None:
            raise TypeError("Tagged.memoize needs tags= (use the store's memoize without tags)")
        return memoize(self.store, ttl, tags=tags, key=key, ignore=ignore, name=name, **options)
