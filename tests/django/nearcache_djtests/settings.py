"""Settings for running Django's cache tests against nearcache.

Django's ``runtests.py`` adds the installed apps, middleware and templates it
always uses; this module starts from Django's own ``test_sqlite`` settings
(found in Django's ``tests/`` directory, the runner's working directory), swaps
in a test runner that records every outcome, and, when ``tests/django/run.py``
started local servers, configures Django's own Redis and pymemcache backends
so that Django's ``RedisCacheTests`` and ``PyMemcacheCacheTests`` run too
instead of being skipped as "not configured".
"""

import os

from test_sqlite import *  # noqa: F403  (Django's settings for its own suite)

TEST_RUNNER = "nearcache_djtests.runner.RecordingRunner"

CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
if os.environ.get("NEARCACHE_DJTESTS_DJANGO_REDIS"):
    CACHES["redis"] = {
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": os.environ["NEARCACHE_DJTESTS_DJANGO_REDIS"],
    }
if os.environ.get("NEARCACHE_DJTESTS_DJANGO_MEMCACHED"):
    CACHES["memcached"] = {
        "BACKEND": "django.core.cache.backends.memcached.PyMemcacheCache",
        "LOCATION": os.environ["NEARCACHE_DJTESTS_DJANGO_MEMCACHED"],
    }
