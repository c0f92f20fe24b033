"""@cache.memoize(): keys, invalidation, methods, async, stampede protection."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import logging
import math
import multiprocessing
import random
import time
import uuid
from collections import OrderedDict, namedtuple
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import nearcache
from nearcache import Cache, Lock
from nearcache.memoize import MEMOIZE_NAMESPACE, canonical_bytes

# ------------------------------------------------------------------------ basics

pytest_plugins = ["_cache_helpers"]


def test_caches_results_and_binds_arguments(cache: Cache) -> None:
    calls: list[tuple[Any, ...]] = []

    @cache.memoize(ttl=60)
    def f(a: int, b: int = 2, *, c: int = 3) -> int:
        calls.append((a, b, c))
        return a + b + c

    assert f(1) == 6
    assert f(1, 2) == 6
    assert f(a=1, b=2, c=3) == 6
    assert f(1, c=3) == 6
    assert len(calls) == 1
    assert f(1, 3) == 7
    assert f(1, c=4) == 7
    assert len(calls) == 3
    assert f.cache_key(1) == f.cache_key(b=2, a=1)
    assert f.cache_key(1).startswith(MEMOIZE_NAMESPACE + f"{__name__}.")
    with pytest.raises(TypeError):
        f()  # a wrong call fails like the function would
    with pytest.raises(TypeError):
        f(1, d=5)


def test_var_args_and_kwargs(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize()
    def f(*args: Any, **kwargs: Any) -> int:
        calls.append(1)
        return len(args) + len(kwargs)

    assert f(1, x=1, y=2) == 3
    assert f(1, y=2, x=1) == 3  # keyword order does not matter
    assert len(calls) == 1
    assert f(1, x=1, y=3) == 3
    assert len(calls) == 2


def test_cached_none_and_falsy_results(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize()
    def nothing() -> None:
        calls.append(1)

    assert nothing() is None
    assert nothing() is None
    assert len(calls) == 1


def test_invalidate_and_invalidate_all(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize()
    def f(x: int) -> int:
        calls.append(x)
        return x

    @cache.memoize()
    def g(x: int) -> int:
        return -x

    f(1), f(2), g(1)
    assert f.invalidate(1) is True
    assert f.invalidate(1) is False
    f(1)
    assert calls == [1, 2, 1]
    assert f.invalidate_all() == 2
    assert g(1) == -1 and len(cache) == 1


def test_key_ignore_and_name(cache: Cache) -> None:
    calls: list[str] = []

    @cache.memoize(key=lambda user, request: user["id"])
    def profile(user: dict[str, Any], request: object) -> str:
        name: str = user["name"]
        calls.append(name)
        return name

    assert profile({"id": 1, "name": "Ada"}, object()) == "Ada"
    assert profile({"id": 1, "name": "changed"}, object()) == "Ada"
    assert calls == ["Ada"]

    @cache.memoize(ignore=["log"])
    def compute(x: int, log: logging.Logger) -> int:
        calls.append("compute")
        return x

    compute(1, logging.getLogger("a"))
    compute(1, logging.getLogger("b"))
    assert calls.count("compute") == 1

    @cache.memoize(name="shared")
    def one(x: int) -> str:
        return "one"

    @cache.memoize(name="shared")
    def two(x: int) -> str:
        return "two"

    assert one(1) == "one"
    assert two(1) == "one"  # same name, same entries

    with pytest.raises(nearcache.ConfigurationError):
        cache.memoize(ignore=["nope"])(compute.__wrapped__)
    with pytest.raises(nearcache.ConfigurationError):
        cache.memoize(key=lambda x: x, ignore=["x"])(lambda x: x)


def test_decorator_needs_parentheses(cache: Cache) -> None:
    with pytest.raises(TypeError, match="parentheses"):
        cache.memoize(lambda: 1)  # type: ignore[arg-type]


def test_invalid_options(cache: Cache) -> None:
    for options in ({"beta": -1}, {"beta": math.inf}, {"lock_ttl": 0}, {"stale_ttl": -1}):
        with pytest.raises((nearcache.ConfigurationError, ValueError)):
            cache.memoize(**options)(lambda: 1)


def test_exceptions_are_not_cached_and_free_the_lock(cache: Cache) -> None:
    attempts: list[int] = []

    @cache.memoize()
    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise RuntimeError("first call fails")
        return "ok"

    with pytest.raises(RuntimeError):
        flaky()
    assert flaky() == "ok"  # no waiting for a lock left behind
    assert flaky() == "ok"
    assert len(attempts) == 2
    assert [k for k in cache if str(k).startswith("nearcache.lock:")] == []


def test_result_too_large_is_returned_but_not_cached(
    cache: Cache, caplog: pytest.LogCaptureFixture
) -> None:
    calls: list[int] = []

    @cache.memoize()
    def huge() -> bytes:
        calls.append(1)
        return b"x" * (cache.max_value_size + 1)

    with caplog.at_level(logging.WARNING, logger="nearcache.memoize"):
        assert len(huge()) == cache.max_value_size + 1
    assert "not caching" in caplog.text
    huge()
    assert len(calls) == 2


def test_foreign_value_under_the_key_is_recomputed(cache: Cache) -> None:
    @cache.memoize()
    def f() -> str:
        return "computed"

    cache.set(f.cache_key(), "not an envelope")
    assert f() == "computed"
    assert f() == "computed"


# --------------------------------------------------------------------- expiry


def test_ttl_expiry_recomputes(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize(ttl=0.05)
    def f() -> int:
        calls.append(1)
        return len(calls)

    assert f() == 1
    assert f() == 1
    time.sleep(0.1)
    assert f() == 2


def test_ttl_defaults_to_the_cache_default(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(ttl=30)

    @c.memoize()
    def f() -> int:
        return 1

    @c.memoize(ttl=0)
    def forever() -> int:
        return 1

    f(), forever()
    assert 29 < (c.ttl(f.cache_key()) or 0) <= 30
    assert c.ttl(forever.cache_key()) == math.inf


def test_stale_value_served_while_someone_recomputes(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize(ttl=0.05, stale_ttl=60)
    def f() -> int:
        calls.append(1)
        return len(calls)

    assert f() == 1
    time.sleep(0.1)
    key = f.cache_key()
    other = Lock(cache, key, expire=10)  # another process is recomputing
    assert other.acquire(blocking=False)
    start = time.monotonic()
    assert f() == 1  # stale, immediately
    assert time.monotonic() - start < 0.05
    assert len(calls) == 1
    other.release()
    assert f() == 2  # expired and nobody recomputing: this caller does
    assert f() == 2


def test_waiters_wait_for_the_computer_then_take_over_a_dead_lock(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize(lock_ttl=30)
    def f() -> str:
        calls.append(1)
        return "fresh"

    dead_holder = Lock(cache, f.cache_key(), expire=0.3)
    assert dead_holder.acquire(blocking=False)  # ...and its process dies: never released
    start = time.monotonic()
    assert f() == "fresh"
    waited = time.monotonic() - start
    assert 0.2 <= waited < 5
    assert calls == [1]


def test_xfetch_recomputes_early(cache: Cache, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []

    def slow(tag: str) -> str:
        calls.append(tag)
        time.sleep(0.02)  # delta >= 20 ms
        return tag

    eager = cache.memoize(ttl=60, beta=1000.0)(slow)
    calm = cache.memoize(ttl=60, beta=0.001, name="calm")(slow)
    off = cache.memoize(ttl=60, name="off")(slow)
    eager("e"), calm("c"), off("o")
    # -ln(1 - 0.999999) = 13.8: eager's 0.02 * 1000 * 13.8 = 276 s > 60 s of TTL left,
    # calm's 0.02 * 0.001 * 13.8 = 0.3 ms is not.
    monkeypatch.setattr(random, "random", lambda: 0.999999)
    eager("e"), calm("c"), off("o")
    assert calls == ["e", "c", "o", "e"]


# ------------------------------------------------------------------- methods, async


class Repo:
    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.calls = 0

    def __cache_key__(self) -> int:
        return self.ident


def test_methods_classmethods_and_staticmethods(cache: Cache) -> None:
    class Service(Repo):
        @cache.memoize()
        def load(self, x: int) -> tuple[int, int]:
            self.calls += 1
            return (self.ident, x)

        @classmethod
        @cache.memoize()
        def build(cls, x: int) -> str:
            return f"{cls.__name__}:{x}"

        @staticmethod
        @cache.memoize()
        def pure(x: int) -> int:
            return x * 2

    a, b, a_again = Service(1), Service(2), Service(1)
    assert a.load(5) == (1, 5)
    assert b.load(5) == (2, 5)
    assert a_again.load(5) == (1, 5)  # same __cache_key__: same entry
    assert (a.calls, b.calls, a_again.calls) == (1, 1, 0)
    assert Service.load.invalidate(a, 5) is True
    assert a.load.invalidate(5) is False  # helpers bind to the instance
    assert Service.build(3) == "Service:3"
    assert Service.pure(4) == 8
    assert Service(9).pure(4) == 8


def test_objects_without_a_stable_key_are_refused(cache: Cache) -> None:
    import threading

    @cache.memoize()
    def f(lock: Any) -> int:
        return 1

    with pytest.raises(TypeError, match="key= or ignore="):
        f(threading.Lock())


def test_async_functions(cache: Cache) -> None:
    calls: list[int] = []

    @cache.memoize(ttl=60)
    async def fetch(x: int) -> int:
        calls.append(x)
        await asyncio.sleep(0.1)
        return x * 10

    assert asyncio.iscoroutinefunction(fetch)

    async def main() -> list[int]:
        return list(await asyncio.gather(*(fetch(3) for _ in range(5))))

    assert asyncio.run(main()) == [30] * 5
    assert calls == [3]  # concurrent callers waited for the one computing
    assert asyncio.run(fetch(3)) == 30
    assert fetch.invalidate(3) is True


def test_async_exceptions_are_not_cached(cache: Cache) -> None:
    attempts: list[int] = []

    @cache.memoize()
    async def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ValueError("boom")
        return "ok"

    with pytest.raises(ValueError):
        asyncio.run(flaky())
    assert asyncio.run(flaky()) == "ok"


def test_json_cache_memoize(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(serializer="json")

    @c.memoize()
    def f(x: int) -> dict[str, list[int]]:
        return {"x": [x]}

    assert f(1) == {"x": [1]}
    assert f(1) == {"x": [1]}


def test_signed_cache_memoize(make_cache: Callable[..., Cache]) -> None:
    c = make_cache(signing_key=b"s" * 32)
    calls: list[int] = []

    @c.memoize()
    def f() -> list[int]:
        calls.append(1)
        return [1]

    assert f() == [1] and f() == [1]
    assert calls == [1]


# ------------------------------------------------------------------ canonical keys

Point = namedtuple("Point", "x y")


class Kind(enum.Enum):
    A = "a"


@dataclasses.dataclass
class Box:
    size: int
    tags: list[str]


def test_canonical_bytes_distinguishes_types() -> None:
    values = [
        1,
        1.0,
        True,
        "1",
        b"1",
        (1,),
        [1],
        {1},
        frozenset({1}),
        {1: None},
        None,
        Point(1, 2),
        (1, 2),
        Kind.A,
        "a",
        Decimal("1"),
        Box(1, []),
        int,
        str,
        PurePosixPath("/a"),
        "/a",
        OrderedDict(a=1),
        {"a": 1},
    ]
    encoded = [canonical_bytes(v) for v in values]
    assert len(set(encoded)) == len(values)


def test_canonical_bytes_is_stable() -> None:
    assert canonical_bytes({"b": {2, 1}, "a": [1.5, None]}) == canonical_bytes(
        {"a": [1.5, None], "b": {1, 2}}
    )
    when = datetime.datetime(2024, 5, 1, tzinfo=datetime.timezone.utc)
    assert canonical_bytes(when) == canonical_bytes(when.replace())
    ident = uuid.UUID(int=5)
    assert canonical_bytes(ident) == canonical_bytes(uuid.UUID(int=5))
    assert canonical_bytes(Box(1, ["a"])) == canonical_bytes(Box(1, ["a"]))
    assert canonical_bytes(Box(1, ["a"])) != canonical_bytes(Box(1, ["b"]))
    # A fixed value pins the format: changing it would silently orphan every entry.
    assert canonical_bytes(("a", 1, None, 2.5, b"z")) == b"(s1:ai1;Nf0x1.4000000000000p+1;b1:z)"


hashable = st.one_of(st.integers(), st.text(max_size=5), st.binary(max_size=5), st.none())
nested = st.recursive(
    hashable | st.floats(allow_nan=False),
    lambda children: (
        st.lists(children, max_size=3)
        | st.tuples(children, children)
        | st.dictionaries(hashable, children, max_size=3)
        | st.frozensets(hashable, max_size=3)
    ),
    max_leaves=12,
)


@given(st.dictionaries(hashable, nested, max_size=5), st.randoms())
def test_canonical_bytes_ignores_dict_order(mapping: dict[Any, Any], rng: Any) -> None:
    items = list(mapping.items())
    rng.shuffle(items)
    assert canonical_bytes(dict(items)) == canonical_bytes(mapping)


@given(nested, nested)
def test_canonical_bytes_equal_only_for_equal_values(a: Any, b: Any) -> None:
    if canonical_bytes(a) == canonical_bytes(b):
        assert a == b
        assert type(a) is type(b)


# ------------------------------------------------------------ stampede, processes


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_stampede_across_processes_runs_the_function_once(tmp_path: Path, method: str) -> None:
    from _cache_helpers import memoize_worker

    workers = 4 if method == "fork" else 3
    path = tmp_path / "stampede"
    with Cache(path=path, size="1MiB") as cache:
        ctx: Any = multiprocessing.get_context(method)
        barrier = ctx.Barrier(workers)
        results = ctx.Queue()
        processes = [
            ctx.Process(target=memoize_worker, args=(str(path), barrier, 7, 0.5, results))
            for _ in range(workers)
        ]
        for process in processes:
            process.start()
        outcomes = [results.get(timeout=60) for _ in processes]
        for process in processes:
            process.join(timeout=30)
            assert process.exitcode == 0
        assert [value for _, value in outcomes] == [49] * workers
        assert len({pid for pid, _ in outcomes}) == workers
        assert cache.get("runs:7") == 1  # the slow function ran exactly once
