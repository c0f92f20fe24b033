"""Run the examples of the async API, tags and metrics: docstrings and docs pages."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[2] / "docs"

MODULES = [
    "nearcache.aio.cache",
    "nearcache.tags",
    "nearcache.metrics",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path))  # examples open caches by name
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0


@pytest.mark.parametrize("page", ["async.md", "tags.md"])
def test_docs_examples(page: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path))
    result = doctest.testfile(
        str(DOCS / page), module_relative=False, optionflags=doctest.ELLIPSIS, verbose=False
    )
    assert result.attempted > 0, f"{page} has no examples"
    assert result.failed == 0
