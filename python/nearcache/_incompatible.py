"""``IncompatibleFileError`` told in the caller's own terms.

The engine refuses to open a cache file whose geometry (size, shards) differs
from the one asked for, or whose layout another version of nearcache wrote,
and its message ends with a remedy in the Python API's words: "open it with
its own parameters (size=None) or pass recreate=True".  A Django site never
calls ``Cache()``: it changed ``OPTIONS["size"]`` in its settings, and a
Flask application its ``CACHE_NEARCACHE_OPTIONS``.  Until nearcache can
migrate a file online, the integrations re-raise the error with the remedy
in their own terms: the facts of the engine's message (the path, the
geometry found and asked for, the layout versions) are kept; the clauses
naming Python arguments are replaced.

:func:`reworded` builds that error from a :class:`Terms`; which remedy
applies is found by opening the file once more with its own size: if
that works, only the size (or shard count) differs and the
file can be kept; if not, the layout differs and the file must be replaced.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from .errors import IncompatibleFileError

__all__ = ["Terms", "engine_facts", "reworded"]

# Clauses of the engine's message that speak the Python API, not facts.
_API_WORDS = ("size=None", "recreate=", "own parameters")


@dataclass(frozen=True)
class Terms:
    """How one caller writes the options of a cache file.

    ``asked``: the setting that asked for the size or shard count, as the
    caller wrote it (``OPTIONS["size"] = "256MiB"``), or "" when none was
    given.  ``keep``: how to open the file with its own size (``leave "size"
    out of OPTIONS``).  ``recreate``: how to replace the file
    (``OPTIONS["recreate"] = True``).  ``needs_size``: what to add for
    ``recreate`` to take effect when no size was given (the engine replaces
    a file only for an explicit size), "" when a size was given.
    """

    asked: str
    keep: str
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

    ``path`` is the cache file ("" when the caller cannot tell: both
    remedies are then given).  The file is opened once more with its own
    size, and closed, to tell a size that differs from a layout that does.
    """
    facts = engine_facts(str(exc))
    if path and path not in facts:
        facts = f"{facts} ({path})"
    if terms.asked:
        facts = f"{facts}, asked for by {terms.asked}"
    own = _opens_with_own_size(path, allow_foreign_owner) if path else None
    resize = (
        "a cache file cannot be resized in place yet: "
        f"{terms.keep} to keep this file and its entries (its own size is then used), "
        f"or set {terms.recreate} to replace it with an empty file of the size asked for "
        "(processes that have the old file open keep using it until they restart)"
    )
    extra = f" and {terms.needs_size}" if terms.needs_size else ""
    layout = (
        "the file was written by another version of nearcache, which may still be "
        f"running: set {terms.recreate}{extra} to replace it with an empty file, or "
        f"delete {path or 'it'} once no process of that version uses it"
    )
    if own is None:
        remedy = f"if only its size differs, {resize}; if its layout differs, {layout}"
    else:
        remedy = resize if own else layout
    return IncompatibleFileError(f"{facts}. {remedy[0].upper()}{remedy[1:]}.")


def _opens_with_own_size(path: str, allow_foreign_owner: bool) -> bool:
    """Whether the file at ``path`` opens with its own geometry (only size or shards differ)."""
    from ._native import NativeCache

    try:
        handle = NativeCache(path, 0, create=False, allow_foreign_owner=allow_foreign_owner)
    except Exception:
        return False
    with contextlib.suppress(Exception):
        handle.close()
    return True
