"""The Django backend's read-modify-writes: ``incr``/``decr`` of values that
are not native counters go through compare-and-swap, ``get_or_set`` returns
only values the cache held."""

from __future__ import annotations

import multiprocessing
from itertools import count
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

pytest.importorskip("django")

from nearcache.contrib.django import NearCache

_names = count()


@pytest.fixture
def location(tmp_path: Path) -> str:
    return str(tmp_path / f"django-cas-{next(_names)}")


def make(location: str, **options: Any) -> NearCache:
    options.setdefault("size", "4MiB")
    return NearCache(location, {"OPTIONS": options})


def _incr_many(location: str, times: int, signed: bool) -> None:
    backend = make(location, **({"signing_key": "s" * 32} if signed else {}))
    for _ in range(times):
        backend.incr("counter", 1)
        backend.decr("counter", 0.5)


@pytest.mark.parametrize(("start", "signed"), [(0.5, False), (2**64, False), (0, True)])
def test_incr_of_values_that_are_not_counters_is_atomic_across_processes(
    location: str, start: Any, signed: bool
) -> None:
    # A float, an int beyond 64 bits and a pickled (signed) int are not
    # native counters: incr reads, adds and writes them back, which lost
    # updates before it went through compare-and-swap.
    backend = make(location, **({"signing_key": "s" * 32} if signed else {}))
    backend.set("counter", start, 300)
    expiry = backend.cache.expire_time(":1:counter")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_incr_many, args=(location, 500, signed)) for _ in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert backend.get("counter") == start + 4 * 500 * 0.5
    # The entry kept its expiry: each write stores the TTL left, so it moves
    # only by the moments between reading the TTL and writing (< 1 ms each).
    assert backend.cache.expire_time(":1:counter") == pytest.approx(expiry, abs=1.0)


def test_incr_of_a_missing_or_non_number_value(location: str) -> None:
    backend = make(location)
    with pytest.raises(ValueError, match="not found"):
        backend.incr("missing", 1.5)
    backend.set("s", "text")
    with pytest.raises(TypeError):
        backend.incr("s")
    assert backend.get("s") == "text"


def test_get_or_set_adds_again_when_the_winner_vanishes(location: str) -> None:
    backend = make(location)
    real_add = backend.add
    calls = []

    def add_lost_then_won(*args: Any, **kwargs: Any) -> bool:
        # The first add loses to a value that is deleted before it is read.
        calls.append(args)
        if len(calls) == 1:
            return False
        return real_add(*args, **kwargs)

    with mock.patch.object(backend, "add", side_effect=add_lost_then_won):
        assert backend.get_or_set("k", "mine") == "mine"
    assert len(calls) == 2
    assert backend.get("k") == "mine"
    backend.set("other", "theirs")
    assert backend.get_or_set("other", "mine") == "theirs"
