"""A changed size (or a file of another layout) is told in the caller's own terms.

The engine's ``IncompatibleFileError`` ends with a remedy in Python arguments
(``size=None``, ``recreate=True``).  Django's and Flask's backends and the
``nearcache`` command say it with the settings their users wrote, and the
remedy they give works.
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


def test_engine_facts_keeps_the_facts_and_drops_the_python_remedy(tmp_path: Path) -> None:
    Cache(path=tmp_path / "c", size="1MiB").close()
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        Cache(path=tmp_path / "c", size="2MiB")
    facts = engine_facts(str(info.value))
    assert str(tmp_path / "c") in facts and "shards" in facts
    _no_python_terms(facts)


def test_reworded_tells_a_size_from_a_layout(tmp_path: Path) -> None:
    terms = Terms(asked="SIZE = 2", keep="drop SIZE", recreate="RECREATE = 1", needs_size="SIZE")
    Cache(path=tmp_path / "sized", size="1MiB").close()
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        Cache(path=tmp_path / "sized", size="2MiB")
    text = str(reworded(info.value, str(tmp_path / "sized"), terms))
    assert "asked for by SIZE = 2" in text and "drop SIZE to keep this file" in text
    assert "RECREATE = 1" in text and "another version" not in text
    _no_python_terms(text)
    _other_layout(tmp_path / "old")
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        Cache(path=tmp_path / "old")
    text = str(reworded(info.value, str(tmp_path / "old"), terms))
    assert "layout version" in text and str(tmp_path / "old") in text
    assert "another version of nearcache" in text and "RECREATE = 1 and SIZE" in text
    assert "drop SIZE" not in text
    # Without a path both remedies are given.
    both = str(reworded(info.value, "", terms))
    assert "If only its size differs" in both and "if its layout differs" in both


# ---------------------------------------------------------------------------------- Django


def test_django_names_options_size(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("django")
    from nearcache.contrib.django import NearCache

    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path / "shm"))
    NearCache("mysite", {"OPTIONS": {"size": "1MiB"}}).cache.close()
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        NearCache("mysite", {"OPTIONS": {"size": "2MiB", "shards": 2}})
    text = str(info.value)
    assert str(tmp_path / "shm" / "mysite") in text
    assert 'OPTIONS["size"] = \'2MiB\' and OPTIONS["shards"] = 2' in text
    assert 'remove "size" and "shards" from OPTIONS to keep this file' in text
    assert 'OPTIONS["recreate"] = True' in text and "cannot be resized" in text
    assert isinstance(info.value.__cause__, nearcache.IncompatibleFileError)
    _no_python_terms(text)
    # Both remedies work.
    kept = NearCache("mysite", {"OPTIONS": {}})
    assert kept.cache.capacity < 1.1 * 2**20
    grown = NearCache("mysite", {"OPTIONS": {"size": "2MiB", "recreate": True}})
    assert grown.cache.capacity > 1.5 * 2**20


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

    l1: dict[str, Any] = {"driver": "nearcache", "path": str(tmp_path / "l1"), "size": "1MiB"}
    Cache(path=tmp_path / "l1", size="2MiB").close()
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


def test_flask_names_its_config_keys(tmp_path: Path) -> None:
    path = str(tmp_path / "flask-file")
    cache = _flask_app(CACHE_NEARCACHE_OPTIONS={"path": path, "size": "1MiB"})
    cache.cache.close()
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        _flask_app(CACHE_NEARCACHE_OPTIONS={"path": path, "size": "2MiB"})
    text = str(info.value)
    assert "CACHE_NEARCACHE_OPTIONS[\"size\"] = '2MiB'" in text and path in text
    assert 'CACHE_NEARCACHE_OPTIONS["recreate"] = True' in text
    _no_python_terms(text)
    with pytest.raises(nearcache.IncompatibleFileError) as info:
        _flask_app(CACHE_NEARCACHE_OPTIONS={"path": path}, CACHE_OPTIONS={"size": "2MiB"})
    assert "CACHE_OPTIONS[\"size\"] = '2MiB'" in str(info.value)
    assert 'remove CACHE_OPTIONS["size"]' in str(info.value)
    grown = _flask_app(CACHE_NEARCACHE_OPTIONS={"path": path, "size": "2MiB", "recreate": True})
    assert grown.cache.store.cache.capacity > 1.5 * 2**20
    grown.cache.close()


def test_flask_url(tmp_path: Path) -> None:
    url = f"nearcache://?path={tmp_path}/l1&size=2MiB"
    Cache(path=tmp_path / "l1", size="1MiB").close()
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
