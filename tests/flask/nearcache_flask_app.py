"""The Flask config that makes Flask-Caching's app-level tests use nearcache.

``run.py`` rewrites the ``app`` fixture of Flask-Caching's ``conftest.py``
(in its private copy) to call :func:`app_config` instead of choosing
``SimpleCache``.  Each app gets a cache file of its own, so tests start
empty, as they do with ``SimpleCache``.

Flask-Caching's ``clock`` fixture moves a fake clock that only cachelib's
backends read; ``run.py`` replaces it with :class:`RealClock`, whose
``advance`` really waits, so the expiry tests judge nearcache's own TTLs.
Loaded as a pytest plugin (``-p nearcache_flask_app``), it also deselects
the tests ``run.py`` lists as not applicable, by exact node id.
"""

from __future__ import annotations

import itertools
import json
import os
import time
from typing import Any

import pytest

_numbers = itertools.count()


def app_config() -> dict[str, Any]:
    """CACHE_* settings for one test's app."""
    return {
        "CACHE_TYPE": "nearcache.contrib.flask.NearcacheCache",
        "CACHE_NEARCACHE_NAME": f"app-{os.getpid()}-{next(_numbers)}",
        "CACHE_NEARCACHE_OPTIONS": {"size": "2MiB"},
    }


class RealClock:
    """``clock.advance(seconds)`` waits: time passes for every backend."""

    def __call__(self) -> float:
        return time.time()

    def advance(self, seconds: float) -> None:
        if seconds > 10:
            raise RuntimeError(
                f"clock.advance({seconds}): too long to wait for; list the test in "
                "run.py's NOT_APPLICABLE"
            )
        # Wait on the wall clock, the one the engine's expiry reads: a sleep
        # alone can end early by that clock if it is stepped back meanwhile.
        deadline = time.time() + seconds
        while (left := deadline - time.time()) > 0:
            time.sleep(left)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tests run.py lists as not applicable (exact node ids)."""
    listed = set(json.loads(os.environ.get("NEARCACHE_FLASK_NOT_APPLICABLE", "{}")))
    unknown = listed - {item.nodeid for item in items}
    if unknown:
        raise pytest.UsageError(f"NOT_APPLICABLE names tests that do not exist: {sorted(unknown)}")
    kept = [item for item in items if item.nodeid not in listed]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in listed])
    items[:] = kept
