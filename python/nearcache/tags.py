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

import hashlib
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

from nearcache.keys import Key
from nearcache.memoize import canonical_bytes

if TYPE_CHECKING:
    from nearcache.memoize import MemoizeDecorator

__all__ = [
    "TAG_NAMESPACE",
    "Tagged",
    "TagsArg",
    "check_tags",
    "envelope",
    "is_envelope",
    "new_generation",
    "tag_key",
]

#: Prefix of the cache keys holding tag generations.
TAG_NAMESPACE: Final = "nearcache.tag:"
#: First item of a tagged entry's stored form.
MARK: Final = "nearcache.tagged/1"

TagsArg = Iterable[str] | Callable[..., Iterable[str]]
"""``tags=`` of memoize: tag names, or a function of the call's arguments returning them."""

_MISS: Any = object()


def check_tags(tags: Iterable[str]) -> list[str]:
    """The tag names as a list; a bare str (or anything but strs) raises ``TypeError``."""
    if isinstance(tags, (str, bytes)):
        raise TypeError(f"tags must be a collection of str, not a bare {type(tags).__name__}")
    names = list(tags)
    for name in names:
        if not isinstance(name, str) or not name:
            raise TypeError(f"a tag is a non-empty str, got {name!r}")
    return names


def tag_key(tag: str) -> str:
    """The cache key of a tag's generation."""
    return TAG_NAMESPACE + tag


def new_generation() -> int:
    """A fresh random generation: 62 random bits, never 0, room left to increment."""
    return secrets.randbits(62) | 1


def envelope(value: Any, generations: dict[str, int]) -> list[Any]:
    """The stored form of a tagged value."""
    return [MARK, value, [[tag, gen] for tag, gen in generations.items()]]


def is_envelope(stored: Any) -> bool:
    """Whether a stored value is a tagged entry."""
    return stored.__class__ is list and len(stored) == 3 and stored[0] == MARK


def envelope_tags(stored: list[Any]) -> list[tuple[str, int]]:
    """The (tag, generation) pairs recorded in a tagged entry."""
    return [(str(tag), int(gen)) for tag, gen in stored[2]]


def still_valid(recorded: list[tuple[str, int]], current: dict[Any, Any]) -> bool:
    """Whether every recorded generation is the current one (a missing record: no)."""
    return all(current.get(tag_key(tag), _MISS) == gen for tag, gen in recorded)


def suffix(generations: dict[str, int]) -> str:
    """The part a memoized call's key gains from its tags' generations."""
    material = canonical_bytes(sorted(generations.items()))
    return ":t" + hashlib.blake2b(material, digest_size=8).hexdigest()


class Tagged:
    """Tag-aware reads and writes over a :class:`~nearcache.Cache` or any driver.

    Entries written without ``tags`` are plain entries; :meth:`get` returns
    both kinds.  An entry written with tags must be read through this class
    (or :class:`nearcache.aio.AsyncCache`): a plain ``get`` returns its
    stored form.
    """

    def __init__(self, store: Any) -> None:
        self.store = store

    # -- generations -----------------------------------------------------------

    def generations(self, tags: Iterable[str]) -> dict[str, int]:
        """The current generation of each tag, creating missing records."""
        names = check_tags(tags)
        keys = [tag_key(tag) for tag in names]
        found = self.store.get_many(keys) if keys else {}
        result: dict[str, int] = {}
        for tag, key in zip(names, keys, strict=True):
            gen = found.get(key, _MISS)
            if gen.__class__ is not int:
                gen = self._create(key)
            result[tag] = gen
        return result

    def _create(self, key: str) -> int:
        gen = new_generation()
        if self.store.add(key, gen, 0):
            return gen
        current = self.store.get(key, _MISS)
        if current.__class__ is int:
            return int(current)
        if current is not _MISS:
            # Not a generation (written by something else): replace it, which
            # invalidates whatever was written under the tag.
            self.store.set(key, gen, 0)
            return gen
        # Lost between add and get: a generation nobody holds, so what is
        # written under it is a miss, never a resurrection.
        return new_generation()

    def invalidate_tags(self, tags: Iterable[str]) -> int:
        """Invalidate every entry carrying any of ``tags``; return how many
        tag records existed (a missing record already invalidates)."""
        count = 0
        for tag in check_tags(tags):
            try:
                self.store.incr(tag_key(tag), 1, None)
            except KeyError:
                continue
            except (TypeError, OverflowError):  # not a generation: replace it
                self.store.set(tag_key(tag), new_generation(), 0)
            count += 1
        return count

    # -- reads -----------------------------------------------------------------

    def _check(self, stored: Any, default: Any) -> Any:
        if not is_envelope(stored):
            return stored
        recorded = envelope_tags(stored)
        current = self.store.get_many([tag_key(tag) for tag, _ in recorded])
        return stored[1] if still_valid(recorded, current) else default

    def get(self, key: Key, default: Any = None) -> Any:
        """The value, or ``default`` if missing or any of its tags was invalidated."""
        stored = self.store.get(key, _MISS)
        if stored is _MISS:
            return default
        return self._check(stored, default)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """``{key: value}`` for the keys that hit and whose tags are current."""
        found = self.store.get_many(keys)
        tagged = {key: envelope_tags(v) for key, v in found.items() if is_envelope(v)}
        if not tagged:
            return dict(found)
        wanted = {tag_key(tag) for pairs in tagged.values() for tag, _ in pairs}
        current = self.store.get_many(sorted(wanted))
        result: dict[Any, Any] = {}
        for key, stored in found.items():
            if key not in tagged:
                result[key] = stored
            elif still_valid(tagged[key], current):
                result[key] = stored[1]
        return result

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
        from nearcache.memoize import memoize

        if tags is None:
            raise TypeError("Tagged.memoize needs tags= (use the store's memoize without tags)")
        return memoize(self.store, ttl, tags=tags, key=key, ignore=ignore, name=name, **options)
