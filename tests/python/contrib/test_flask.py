"""The Flask-Caching backend: configuration and behaviour beyond Flask-Caching's suite.

Flask-Caching's own tests run against it through ``tests/flask/run.sh``.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from nearcache import Cache
from nearcache.errors import ConfigurationError
from nearcache.testing import RedisServer

flask = pytest.importorskip("flask")
flask_caching = pytest.importorskip("flask_caching")
from nearcache.contrib.flask import NearcacheCache  # noqa: E402


def make_app(**config: object) -> tuple[flask.Flask, flask_caching.Cache]:
    app = flask.Flask(__name__)
    app.config.update(CACHE_TYPE="nearcache.contrib.flask.NearcacheCache", **config)
    return app, flask_caching.Cache(app)


def test_configured_by_name_with_prefix_and_options(tmp_path: Path) -> None:
    path = tmp_path / "flask-file"
    app, cache = make_app(
        CACHE_KEY_PREFIX="app1:",
        CACHE_DEFAULT_TIMEOUT=0,
        CACHE_NEARCACHE_OPTIONS={"path": str(path), "size": "2MiB"},
    )
    with app.app_context():
        assert cache.set("k", {"v": 1})
        assert cache.get("k") == {"v": 1}
        backend = cache.cache
        assert isinstance(backend, NearcacheCache)
    with Cache(path=path, prefix="app1:") as raw:
        assert raw.get("k") == {"v": 1}
        assert raw.ttl("k") == float("inf")  # CACHE_DEFAULT_TIMEOUT = 0: never expires
    backend.close()


def test_configured_by_url_as_a_tiered_cache(
    tmp_path: Path, redis_server: RedisServer, unique_prefix: str
) -> None:
    url = f"nearcache://?path={tmp_path}/l1&size=2MiB {redis_server.url}?prefix={unique_prefix}"
    app, cache = make_app(CACHE_NEARCACHE_URL=url)
    with app.app_context():
        assert cache.set("k", "v", timeout=30)
        backend = cache.cache
        assert backend.store.name == "tiered"
        assert backend.store.l2.get("k") == "v"
        assert 29 <= (backend.store.l2.get_with_ttl("k")[1] or 0) <= 30
    backend.close()


@pytest.fixture
def backend(tmp_path: Path) -> NearcacheCache:
    made = NearcacheCache(
        path=tmp_path / "c", size="1MiB", spill_budget="1MiB", default_timeout=300
    )
    yield made
    made.close()


def test_timeouts(backend: NearcacheCache) -> None:
    backend.set("default", 1)
    backend.set("delta", 1, timeout=dt.timedelta(seconds=10))
    backend.set("never", 1, timeout=0)
    store = backend.store
    assert 299 < (store.get_with_ttl("default")[1] or 0) <= 300
    assert 9 < (store.get_with_ttl("delta")[1] or 0) <= 10
    assert store.get_with_ttl("never")[1] is None
    assert backend.set("never", 2, timeout=-1) is True  # negative: stored as already expired
    assert backend.has("never") is False
    assert backend.add("new", 1, timeout=-1) is False


def test_refusals_are_false_not_exceptions(backend: NearcacheCache) -> None:
    assert backend.set("big", b"x" * (2 * 1024 * 1024)) is False  # over the spill budget
    assert backend.set("large", b"y" * (512 * 1024)) is True  # spilled to a file
    assert backend.get("large") == b"y" * (512 * 1024)
    assert backend.set("lambda", lambda: None) is False
    assert backend.set_many({"ok": 1, "bad": lambda: None}) == ["ok"]
    assert backend.get("ok") == 1 and not backend.has("bad")
    backend.set("text", "abc")
    assert backend.inc("text") is None
    assert backend.get("text") == "abc"
    assert backend.inc("n", 5) == 5 and backend.dec("n", 2) == 3


def test_store_or_options_not_both(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "x", size="1MiB") as opened:
        with pytest.raises(ConfigurationError):
            NearcacheCache(opened, size="1MiB")
        wrapped = NearcacheCache(opened)
        wrapped.set("k", 1)
        wrapped.close()  # a given store stays open
        assert opened.get("k") == 1
