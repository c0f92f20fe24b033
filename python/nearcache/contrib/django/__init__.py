"""Django integration: cache backends, stampede-free ``cache_page``, and their locks.

One module per thing a Django site configures; every name stays importable
from here, under the dotted paths settings use:

==============================================  ===============================================
``nearcache.contrib.django.NearCache``          the backend: one shared-memory cache per host
                                                (:mod:`~nearcache.contrib.django.backend`)
``nearcache.contrib.django.TieredNearCache``    that cache as L1 in front of Redis or memcached
                                                (:mod:`~nearcache.contrib.django.tiered`)
``nearcache.contrib.django.cache_page``,        per-view caching that renders a missing page
``...StampedeFreeCacheMiddleware``              once across processes
                                                (:mod:`~nearcache.contrib.django.pages`)
(used by the above)                             the stampede locks and settings
                                                (:mod:`~nearcache.contrib.django.locks`)
==============================================  ===============================================

See ``docs/django.md``.
"""

from __future__ import annotations

from nearcache.contrib.django.backend import (
    CACHE_OPTIONS,
    DEFAULT_LOCATION,
    LONG_KEY,
    NearCache,
    open_cache,
)
from nearcache.contrib.django.locks import DEFAULT_STAMPEDE_WAIT, STAMPEDE_COUNTERS
from nearcache.contrib.django.pages import StampedeFreeCacheMiddleware, cache_page
from nearcache.contrib.django.tiered import (
    DEFAULT_L1,
    TIERED_OPTIONS,
    TieredNearCache,
    open_tiered,
)

__all__ = [
    "CACHE_OPTIONS",
    "DEFAULT_L1",
    "DEFAULT_LOCATION",
    "DEFAULT_STAMPEDE_WAIT",
    "LONG_KEY",
    "STAMPEDE_COUNTERS",
    "TIERED_OPTIONS",
    "NearCache",
    "StampedeFreeCacheMiddleware",
    "TieredNearCache",
    "cache_page",
    "open_cache",
    "open_tiered",
]
