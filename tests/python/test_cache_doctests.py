"""Run the examples in the Python layer's docstrings."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

MODULES = [
    "nearcache",
    "nearcache._incompatible",
    "nearcache.cache",
    "nearcache.errors",
    "nearcache.keys",
    "nearcache.locks",
    "nearcache.memoize",
    "nearcache.serializers",
    "nearcache.units",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path))  # examples open caches by name
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.attempted > 0, f"{name} has no examples"
    assert result.failed == 0
