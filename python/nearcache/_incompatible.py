"""``IncompatibleFileError`` told in the caller's own terms.

A cache file of another size or shard count is no error: the engine resizes
it live (``Cache.resize``).  What remains is a file the engine cannot read:
one whose layout another version of nearcache wrote (and which that version
may still be using).  The engine's message states the facts (the path, the
layout versions); a Django site never calls ``Cache()``, it set ``OPTIONS``
in its settings, and a Flask application its ``CACHE_NEARCACHE_OPTIONS``,
so the integrations re-raise the error with the remedy in their own terms:
the facts of the engine's message are kept, and any clause naming Python
arguments is replaced.

:func:`reworded` builds that error from a :class:`Terms`.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import IncompatibleFileError

__all__ = ["Terms", "engine_facts", "reworded"]

# Clauses of the engine's message that speak the Python API, not facts.
_API_WORDS = ("size=None", "recreate=", "own parameters")


@dataclass(frozen=True)
class Terms:
    """How one caller writes the options of a cache file.

    ``asked``: the setting that opened the file with a size or shard count,
    as the caller wrote it (``OPTIONS["size"] = "256MiB"``), or "" when none
    was given.  ``recreate``: how to replace the file
    (``OPTIONS["recreate"] = True``).  ``needs_size``: what to add for
    ``recreate`` to take effect when no size was given (the engine replaces
    a file only for an explicit size), "" when a size was given.
    """

    asked: str
    recreate: str
    needs_size: str = ""


def engine_facts(message: str) -> str:
    """The engine's message without the clauses that name Python arguments.

    >>> engine_facts("incompatible cache file: /x holds 2 shards but 4 were "
    ...              "requested; open it with its own parameters (size=None) or "
    ...              "pass recreate=True to replace it")
    'incompatible cache file: /x holds 2 shards but 4 were requested'
    >>> engine_facts("incompatible cache file: layout version 3, this build reads version 4")
    'incompatible cache file: layout version 3, this build reads version 4'
    """
    parts = [p for p in message.split("; ") if not any(w in p for w in _API_WORDS)]
    return "; ".join(parts).rstrip(" .") or message


def reworded(
    exc: IncompatibleFileError, path: str, terms: Terms, allow_foreign_owner: bool = False
) -> IncompatibleFileError:
    """``exc`` with its remedy in ``terms`` (the caller raises it ``from exc``).

    ``path`` is the cache file ("" when the caller cannot tell).
    ``allow_foreign_owner`` is accepted for the callers' sake: the remedy
    does not depend on it.
    """
    facts = engine_facts(str(exc))
    if path and path not in facts:
        facts = f"{facts} ({path})"
    if terms.asked:
        facts = f"{facts}, opened with {terms.asked}"
    extra = f" and {terms.needs_size}" if terms.needs_size else ""
    remedy = (
        "the file was written by another version of nearcache, which may still be "
        f"running: set {terms.recreate}{extra} to replace it with an empty file, or "
        f"delete {path or 'it'} once no process of that version uses it (a file of "
        "another size is no error: it is resized live, keeping its entries)"
    )
    return IncompatibleFileError(f"{facts}. {remedy[0].upper()}{remedy[1:]}.")
