"""Tag records: the generations tags keep in a store, and the steps that read and move them.

The design is :mod:`nearcache.tags`'s (a tag's generation lives under
``nearcache.tag:<tag>``, starts at 62 random bits, moves with one ``incr``,
and a missing record invalidates, never resurrects).  This module holds the
record format and the three protocols on it as steps of store calls
(:mod:`nearcache.steps`): :func:`current_steps` (read, creating missing
records), :func:`invalidate_steps` and :func:`check_steps` /
:func:`check_many_steps` (are tagged entries still valid).
:class:`nearcache.tags.Tagged` drives them with blocking calls,
:class:`nearcache.aio.AsyncCache` awaits them, and memoize reads a call's
generations with them.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from nearcache.canonical import canonical_bytes
from nearcache.steps import Steps, call

__all__ = [
    "MARK",
    "TAG_NAMESPACE",
    "TagsArg",
    "check_many_steps",
    "check_steps",
    "check_tags",
    "current_steps",
    "envelope",
    "envelope_tags",
    "invalidate_steps",
    "is_envelope",
    "new_generation",
    "still_valid",
    "suffix",
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


# ---------------------------------------------------------------------- steps


def current_steps(tags: Iterable[str]) -> Steps[dict[str, int]]:
    """The current generation of each tag, creating missing records."""
    names = check_tags(tags)
    keys = [tag_key(tag) for tag in names]
    found = (yield call("get_many", keys)) if keys else {}
    result: dict[str, int] = {}
    for tag, key in zip(names, keys, strict=True):
        gen = found.get(key, _MISS)
        if gen.__class__ is not int:
            gen = yield from _create_steps(key)
        result[tag] = gen
    return result


def _create_steps(key: str) -> Steps[int]:
    gen = new_generation()
    if (yield call("add", key, gen, 0)):
        return gen
    current = yield call("get", key, _MISS)
    if current.__class__ is int:
        return int(current)
    if current is not _MISS:
        # Not a generation (written by something else): replace it, which
        # invalidates whatever was written under the tag.
        yield call("set", key, gen, 0)
        return gen
    # Lost between add and get: a generation nobody holds, so what is
    # written under it is a miss, never a resurrection.
    return new_generation()


def invalidate_steps(tags: Iterable[str]) -> Steps[int]:
    """Move each tag's generation on (one ``incr``); how many records existed
    (a missing record already invalidates)."""
    count = 0
    for tag in check_tags(tags):
        try:
            yield call("incr", tag_key(tag), 1, None)
        except KeyError:
            continue
        except (TypeError, OverflowError):  # not a generation: replace it
            yield call("set", tag_key(tag), new_generation(), 0)
        count += 1
    return count


def check_steps(stored: Any, default: Any) -> Steps[Any]:
    """The value of a stored entry read through tags: a plain entry as it is,
    a tagged one if its tags are current, else ``default``."""
    if not is_envelope(stored):
        return stored
    recorded = envelope_tags(stored)
    current = yield call("get_many", [tag_key(tag) for tag, _ in recorded])
    return stored[1] if still_valid(recorded, current) else default


def check_many_steps(found: Mapping[Any, Any]) -> Steps[dict[Any, Any]]:
    """:func:`check_steps` for the hits of a ``get_many``: the tag records of
    every tagged entry are read in one ``get_many``; invalid entries are left out."""
    tagged = {key: envelope_tags(v) for key, v in found.items() if is_envelope(v)}
    if not tagged:
        return dict(found)
    wanted = sorted({tag_key(tag) for pairs in tagged.values() for tag, _ in pairs})
    current = yield call("get_many", wanted)
    result: dict[Any, Any] = {}
    for key, stored in found.items():
        if key not in tagged:
            result[key] = stored
        elif still_valid(tagged[key], current):
            result[key] = stored[1]
    return result
