"""A changed size resizes the file; a file of another layout is told in the caller's terms.

A file of another layout (another version of nearcache wrote it) cannot be
read: Django's and Flask's backends and the ``nearcache`` command say so with
the settings their users wrote, and the remedy they give works.  A changed
``OPTIONS["size"]`` is no error at all: the file is resized live, its entries
kept.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import nearcache
from nearcache import Cache
from nearcache._incompatible import Terms, engine_facts, reworded
from nearcache.cli import main

PYTHON_TERMS = ("size=None", "recreate=True", "recreate=true", "own parameters")


def _no_python_terms(message: str) -> None:
    for word in PYTHON_TERMS:
        assert word not in message, (word, message)


def _other_layout(path: Path) -> None:
    """Make ``path`` a file of a layout version this build does not read."""
    Cache(path=path, size="1MiB").close()
    with open(path, "r+b") as f:
        f.seek(8)  # the layout version, a u32 after the 8-byte magic (layout.rs, fh::VERSION)
        f.write((0xFFFF).to_bytes(4, "little"))


# ---------------------------------------------------------------------------- the helper


def test_engine_facts_keeps_the_facts_and_drops_the_python_remedy() -> None:
    facts = engine_facts(
        "incompatible cache file: /x holds 2 shards but 4 were requested; open it with its "
        "own parameters (size=None) or pass recreate=True to replace it"
    )
    assert facts == "incompatible cache file: /x holds 2 shards but 4 were requested"
    _no_python_terms(facts)


def test_reworded_names_the_callers_options(tmp_path: Path) -> None:
    terms = Terms(asked="SIZE = 2", recreate="RECREATE = 1", needs_size="SIZE")
    _other_layout(tmp_path / "old")
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        Cache(path=tmp_path / "old")
    text = str(reworded(info.value, str(tmp_path / "old"), terms))
    assert "layout version" in text and str(tmp_path / "old") in text
    assert "opened with SIZE = 2" in text
    assert "another version of nearcache" in text and "RECREATE = 1 and SIZE" in text
    _no_python_terms(text)


def test_another_size_is_resized_not_refused(tmp_path: Path) -> None:
    small = Cache(path=tmp_path / "c", size="1MiB")
    small.set("kept", "value")
    grown = Cache(path=tmp_path / "c", size="2MiB")
    assert grown.capacity > 1.5 * 2**20
    assert grown.get("kept") == "value"
    # The handle opened before follows the new file.
    assert small.get("kept") == "value" and small.capacity == grown.capacity


# ---------------------------------------------------------------------------------- Django


def test_django_resizes_when_options_size_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("django")
    from nearcache.contrib.django import NearCache

    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path / "shm"))
    before = NearCache("mysite", {"OPTIONS": {"size": "1MiB"}})
    before.set("page", "cached")
    # The next deploy's settings: a bigger cache, entries kept.
    after = NearCache("mysite", {"OPTIONS": {"size": "2MiB", "shards": 2}})
    assert after.cache.capacity > 1.5 * 2**20 and after.cache.shard_count == 2
    assert after.get("page") == "cached"
    # The previous deploy's process follows at its next operation.
    assert before.get("page") == "cached"
    assert before.cache.capacity == after.cache.capacity
    # And back down.
    smaller = NearCache("mysite", {"OPTIONS": {"size": "512KiB"}})
    assert smaller.cache.capacity <= 512 * 1024
    assert smaller.get("page") == "cached" and after.get("page") == "cached"


def test_django_file_of_another_layout(tmp_path: Path) -> None:
    pytest.importorskip("django")
    from nearcache.contrib.django import NearCache

    path = tmp_path / "old-site"
    _other_layout(path)
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        NearCache(str(path), {"OPTIONS": {}})
    text = str(info.value)
    assert "another version of nearcache" in text and str(path) in text
    assert 'OPTIONS["recreate"] = True and an OPTIONS["size"]' in text
    _no_python_terms(text)
    fresh = NearCache(str(path), {"OPTIONS": {"recreate": True, "size": "1MiB"}})
    fresh.set("k", 1)
    assert fresh.get("k") == 1


def test_django_tiered_l1_names_options_l1(tmp_path: Path) -> None:
    pytest.importorskip("django")
    from nearcache.contrib.django import TieredNearCache

    l1: dict[str, Any] = {"driver": "nearcache", "path": str(tmp_path / "l1")}
    _other_layout(tmp_path / "l1")
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        TieredNearCache("memory://?max_entries=1000", {"OPTIONS": {"l1": l1}})
    text = str(info.value)
    assert 'OPTIONS["l1"]' in text and '"recreate": True in OPTIONS["l1"]' in text
    _no_python_terms(text)


# ----------------------------------------------------------------------------------- Flask


def _flask_app(**config: object) -> Any:
    flask = pytest.importorskip("flask")
    flask_caching = pytest.importorskip("flask_caching")
    app = flask.Flask(__name__)
    app.config.update(CACHE_TYPE="nearcache.contrib.flask.NearcacheCache", **config)
    return flask_caching.Cache(app)


def test_flask_resizes_and_names_its_config_keys(tmp_path: Path) -> None:
    path = str(tmp_path / "flask-file")
    cache = _flask_app(CACHE_NEARCACHE_OPTIONS={"path": path, "size": "1MiB"})
    cache.set("k", "v")
    grown = _flask_app(CACHE_NEARCACHE_OPTIONS={"path": path, "size": "2MiB"})
    assert grown.cache.store.cache.capacity > 1.5 * 2**20
    assert grown.get("k") == "v"
    grown.cache.close()
    cache.cache.close()
    old = str(tmp_path / "old")
    _other_layout(Path(old))
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        _flask_app(CACHE_NEARCACHE_OPTIONS={"path": old}, CACHE_OPTIONS={"size": "2MiB"})
    text = str(info.value)
    assert "CACHE_OPTIONS[\"size\"] = '2MiB'" in text and old in text
    assert 'CACHE_OPTIONS["recreate"] = True' in text
    _no_python_terms(text)


def test_flask_url(tmp_path: Path) -> None:
    _other_layout(tmp_path / "l1")
    url = f"nearcache://?path={tmp_path}/l1&size=2MiB"
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        _flask_app(CACHE_NEARCACHE_URL=url)
    text = str(info.value)
    assert f"CACHE_NEARCACHE_URL = {url!r}" in text and "recreate=1 in that URL" in text
    _no_python_terms(text)


# ------------------------------------------------------------------------------------- CLI


def test_cli_names_what_the_command_can_do(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "old"
    _other_layout(path)
    for command in ("info", "stats", "clear"):
        assert main([command, str(path)]) == 1
        err = capsys.readouterr().err
        assert "layout version" in err and str(path) in err
        assert "nearcache command of the version that wrote the file" in err
        _no_python_terms(err)
    assert os.path.exists(path), "nothing was removed"
