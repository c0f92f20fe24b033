"""Integrations of nearcache with frameworks.

* :mod:`nearcache.contrib.django`: Django cache backends (``NearCache`` for the
  shared-memory cache of one host, ``TieredNearCache`` for nearcache in front
  of Redis or memcached).
"""
