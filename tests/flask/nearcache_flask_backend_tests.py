"""Flask-Caching's generic backend tests, run against nearcache's backend.

``tests/flask/run.py`` copies this file beside Flask-Caching's own
``tests/`` (extracted from its source distribution, outside this
repository), where ``test_backend_cache`` and its ``conftest`` are
importable, and runs it with pytest.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from test_backend_cache import GenericCacheTests  # Flask-Caching's suite

from nearcache.contrib.flask import NearcacheCache

_numbers = itertools.count()


class TestNearcacheCache(GenericCacheTests):
    """Every generic test, on a fresh cache file per test."""

    # nearcache keeps real time (it cannot follow cachelib's patched clock),
    # and deletes expired entries for sure.
    _can_use_fast_sleep = False
    _guaranteed_deletes = True

    @pytest.fixture
    def make_cache(self, tmp_path: Any) -> Iterator[Callable[..., NearcacheCache]]:
        made: list[NearcacheCache] = []

        def make(**options: Any) -> NearcacheCache:
            path = os.path.join(str(tmp_path), f"cache-{next(_numbers)}")
            cache = NearcacheCache(path=path, size="4MiB", **options)
            made.append(cache)
            return cache

        yield make
        for cache in made:
            cache.close()

    def test_prefixes_are_namespaces(self, tmp_path: Any) -> None:
        path = os.path.join(str(tmp_path), "shared")
        one = NearcacheCache(path=path, size="4MiB", key_prefix="one:")
        two = NearcacheCache(path=path, key_prefix="two:")
        assert one.set("k", 1) and two.set("k", 2)
        assert one.clear()
        assert one.get("k") is None and two.get("k") == 2
        one.close()
        two.close()


class TestNearcacheTiered(GenericCacheTests):
    """The same tests through a tiered cache (shared memory over Redis)."""

    _can_use_fast_sleep = False
    _guaranteed_deletes = True

    @pytest.fixture
    def make_cache(self, tmp_path: Any) -> Iterator[Callable[..., NearcacheCache]]:
        redis_url = os.environ.get("NEARCACHE_FLASK_REDIS")
        if not redis_url:
            pytest.fail("NEARCACHE_FLASK_REDIS is not set (run.py starts a Redis server)")
        made: list[NearcacheCache] = []

        def make(**options: Any) -> NearcacheCache:
            n = next(_numbers)
            l1 = f"nearcache://?path={tmp_path}/l1-{n}&size=4MiB"
            l2 = f"{redis_url}?prefix=flask-{n}:"
            cache = NearcacheCache(url=f"{l1} {l2}", **options)
            made.append(cache)
            return cache

        yield make
        for cache in made:
            cache.close()
