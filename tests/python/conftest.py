"""Shared fixtures for the Python tests.

The server fixtures live in ``servers.py`` beside this file; they are
imported here so that every test module can request them by name.

Caches opened by name go to a private directory made for the session (on
tmpfs when there is one, like the real default), never to the user's own
``/dev/shm/nearcache-<uid>``: a test must not read a file left there by
another program or an older build, nor leave files behind.  Tests of the
default directory itself remove ``NEARCACHE_DIR`` with ``monkeypatch``.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest
from servers import (
    memcached_server,
    private_redis_server,
    redis_server,
    unique_prefix,
)

__all__ = ["memcached_server", "private_redis_server", "redis_server", "unique_prefix"]


@pytest.fixture(autouse=True, scope="session")
def _private_cache_directory() -> Iterator[str]:
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="nearcache-tests-", dir=parent)
    patch = pytest.MonkeyPatch()
    patch.setenv("NEARCACHE_DIR", directory)
    try:
        yield directory
    finally:
        patch.undo()
        shutil.rmtree(directory, ignore_errors=True)
