"""``TieredNearCache``: nearcache on each host (L1) in front of Redis or memcached (L2).

::

    CACHES = {
        "default": {
            "BACKEND": "nearcache.contrib.django.TieredNearCache",
            "LOCATION": "redis://cache-host:6379/0",
            "OPTIONS": {"l1": "nearcache://mysite?size=256MiB"},
        }
    }

The backend is :class:`~nearcache.contrib.django.NearCache` over a
:class:`nearcache.tiered.TieredCache`; see :class:`TieredNearCache` for its
``OPTIONS`` and ``docs/django.md`` for the whole story.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from django.core.exceptions import ImproperlyConfigured  # type: ignore[import-untyped]

from nearcache._incompatible import Terms, reworded
from nearcache.cache import Cache
from nearcache.config import from_dict
from nearcache.contrib.django.backend import (
    _MISSING,
    NearCache,
    _check_options,
    _freeze,
    _open_lock,
)
from nearcache.errors import IncompatibleFileError

__all__ = ["DEFAULT_L1", "TIERED_OPTIONS", "TieredNearCache", "open_tiered"]

#: ``OPTIONS`` of :class:`TieredNearCache` besides ``l1`` (see :class:`nearcache.TieredCache`).
TIERED_OPTIONS: Final = frozenset(
    {"l1_ttl", "invalidation", "channel", "on_get_error", "on_set_error"}
)
#: The L1 of :class:`TieredNearCache` when ``OPTIONS`` give none.
DEFAULT_L1: Final = "nearcache://django-l1"

# (L2 URL, L1, options) -> (the tiered cache, the L1 and options it was made with)
_open_tiered: dict[tuple[Any, ...], tuple[Any, Any]] = {}


def open_tiered(location: str, l1: Any, options: Mapping[str, Any]) -> Any:
    """Return this process's :class:`~nearcache.tiered.TieredCache` for a configuration.

    One object (with one invalidation subscription) is kept per L2 URL, L1
    and options, shared by every Django alias and thread that names them.
    """
    key = (location, _freeze(l1), _freeze(options))
    with _open_lock:
        entry = _open_tiered.get(key)
        if entry is None or entry[0].closed:
            tiered = from_dict({"l1": l1, "l2": location, **options})
            entry = _open_tiered[key] = (tiered, (l1, dict(options)))
        return entry[0]


def incompatible_l1(exc: IncompatibleFileError, l1: Any) -> IncompatibleFileError:
    """``exc`` raised opening the L1 of ``OPTIONS["l1"]``, in settings' terms."""
    terms = Terms(
        asked=f'OPTIONS["l1"] = {l1!r}',
        recreate='"recreate": True in OPTIONS["l1"] (recreate=1 in a URL)',
        needs_size="a size in it",
    )
    return reworded(exc, "", terms)


class TieredNearCache(NearCache):
    """Django cache backend: nearcache on each host (L1) in front of Redis or memcached (L2).

    ``LOCATION`` is the L2 as a URL, with that driver's options in the query
    string (``redis://cache-host:6379/0?prefix=mysite:&timeout=0.5``,
    ``memcached://10.0.0.5:11211,10.0.0.6:11211``).  ``OPTIONS``:

    ``l1``
        The L1: a ``nearcache://`` URL (``nearcache://mysite?size=256MiB``)
        or a dict (``{"name": "mysite", "size": "256MiB"}``); default
        :data:`DEFAULT_L1`.
    ``l1_ttl``, ``invalidation``, ``channel``, ``on_get_error``, ``on_set_error``
        As for :class:`nearcache.tiered.TieredCache`: the longest an L1 copy
        lives (default 60 s), the cross-host invalidation channel (Redis
        pub/sub, automatic when L2 is Redis) and what to do when L2 fails
        (default: log and carry on from L1).

    Reads are served from L1 when it has the key, else from L2 (filling L1);
    writes go to L2, then L1, then to the other hosts' L1s as invalidations.
    ``incr``/``decr`` are atomic in L2, across hosts.  Like Django's Redis
    and memcached backends, this one does not cull: ``MAX_ENTRIES`` and
    ``CULL_FREQUENCY`` are ignored, L2 bounds its memory itself and L1 by
    its size.
    """

    def __init__(self, location: str, params: dict[str, Any]) -> None:
        """Read Django's cache settings and connect the two tiers."""
        super().__init__(location, params)
        self._max_entries = None

    def _open(self, location: str, options: dict[str, Any]) -> Any:
        options = dict(options)
        l1 = options.pop("l1", DEFAULT_L1)
        _check_options(type(self).__name__, options, TIERED_OPTIONS)
        if "://" not in location:
            raise ImproperlyConfigured(
                f"{type(self).__name__} LOCATION must be the L2 URL "
                f"(redis://host:6379/0, memcached://host:11211), not {location!r}"
            )
        try:
            return open_tiered(location, l1, options)
        except IncompatibleFileError as exc:
            raise incompatible_l1(exc, l1) from exc
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"invalid tiered cache {location!r}: {exc}") from exc

    def _get_with_ttl(self, key: str) -> tuple[Any, Any]:
        value, left = self._cache.get_with_ttl(key, _MISSING)
        return value, (0 if left is None else left)

    def _lock_store(self) -> Cache | None:
        """This host's L1: stampede locks and counters are per host."""
        store = getattr(self._cache.l1, "cache", None)
        return store if isinstance(store, Cache) else None
