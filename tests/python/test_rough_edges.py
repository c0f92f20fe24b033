"""The rough edges a new user hit, each pinned to its behaviour.

The number in each test's name is the item of the list in the changelog
("Python, round two"); docs/guide.md describes each behaviour.
"""

from __future__ import annotations

import errno
import functools
import json
import logging
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from servers import MemcachedServer, RedisServer

import nearcache
from nearcache import Cache, from_url
from nearcache.cli import main as cli_main
from nearcache.drivers import Driver, MemoryDriver, NullDriver, RedisDriver
from nearcache.drivers.memcached import MemcachedDriver
from nearcache.drivers.shm import ShmDriver
from nearcache.tiered import TieredCache
from nearcache.units import parse_duration, parse_size

pytest_plugins = ["_cache_helpers"]


# --------------------------------------------------- 1.1 memoized methods and self


class Repo:
    """An object whose state changes and that holds a lock (unpicklable)."""

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.calls = 0
        self.guard = threading.Lock()

    def __cache_key__(self) -> int:
        return self.ident


def test_1_1_methods_key_on_cache_key_not_on_state(cache: Cache) -> None:
    class Service(Repo):
        @cache.memoize()
        def load(self, x: int) -> tuple[int, int]:
            self.calls += 1  # state changes: must not change the key
            return (self.ident, x)

    repo = Service(1)
    assert [repo.load(5) for _ in range(3)] == [(1, 5)] * 3
    assert repo.calls == 1
    assert Service(1).load(5) == (1, 5)  # same identity, another object: a hit
    assert Service(2).load(5) == (2, 5)


def test_1_1_method_of_a_class_without_cache_key_fails_at_definition(cache: Cache) -> None:
    with pytest.raises((TypeError, RuntimeError)) as info:

        class Plain:
            @cache.memoize()
            def load(self, x: int) -> int:
                return x

    error = info.value if isinstance(info.value, TypeError) else info.value.__cause__
    assert isinstance(error, TypeError)
    message = str(error)
    assert "Plain.load" in message
    assert "__cache_key__" in message and "key=" in message and "ignore=" in message


def test_1_1_method_keyed_explicitly_or_shared_between_instances(cache: Cache) -> None:
    class Plain:
        def __init__(self, ident: int) -> None:
            self.ident = ident
            self.guard = threading.Lock()

        @cache.memoize(ignore=("self",))
        def shared(self, x: int) -> tuple[int, int]:
            return (self.ident, x)

        @cache.memoize(key=lambda self, x: (self.ident, x))
        def keyed(self, x: int) -> tuple[int, int]:
            return (self.ident, x)

    assert Plain(1).shared(3) == (1, 3)
    assert Plain(2).shared(3) == (1, 3)  # documented: shared by every instance
    assert Plain(1).keyed(3) == (1, 3)
    assert Plain(2).keyed(3) == (2, 3)


def test_1_1_memoized_method_assigned_after_class_creation_is_checked_on_use(
    cache: Cache,
) -> None:
    class Plain:
        pass

    def load(self: Any, x: int) -> int:
        return x

    Plain.load = cache.memoize()(load)  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="has no __cache_key__"):
        Plain().load(1)  # type: ignore[attr-defined]


# ------------------------------------------------ 1.2 a bare str/bytes is not a key list


def _drivers(
    tmp_path: Path, redis_server: RedisServer, memcached_server: MemcachedServer, prefix: str
) -> list[Any]:
    return [
        Cache(path=tmp_path / "c", size="1MiB"),
        ShmDriver(path=tmp_path / "d", size="1MiB"),
        MemoryDriver(),
        NullDriver(),
        RedisDriver(redis_server.url, prefix=prefix),
        MemcachedDriver(memcached_server.address, prefix=prefix),
    ]


@pytest.fixture
def every_store(
    tmp_path: Path, redis_server: RedisServer, memcached_server: MemcachedServer, unique_prefix: str
) -> Iterator[list[Any]]:
    stores = _drivers(tmp_path, redis_server, memcached_server, unique_prefix)
    yield stores
    for store in stores:
        store.close()


@pytest.mark.parametrize("bare", ["abc", b"abc"])
def test_1_2_get_many_and_delete_many_refuse_a_bare_string(
    every_store: list[Any], bare: str | bytes
) -> None:
    for store in every_store:
        store.set("a", 1)
        store.set(97, 2)  # what b"abc" would have deleted
        for method in (store.get_many, store.delete_many):
            with pytest.raises(TypeError, match="collection of keys") as info:
                method(bare)
            assert isinstance(info.value, nearcache.KeyTypeError), store
        if getattr(store, "stores", True):
            assert store.get_many(["a", 97]) == {"a": 1, 97: 2}, store
        assert store.delete_many([bare]) == 0, store  # one key, in a list: fine


def test_1_2_set_many_and_get_many_with_ttl_refuse_a_bare_string(every_store: list[Any]) -> None:
    for store in every_store:
        if isinstance(store, Cache):
            with pytest.raises(TypeError, match="collection of keys"):
                store.set_many("ab")
        else:
            with pytest.raises(TypeError, match="collection of keys"):
                store.get_many_with_ttl("ab")


# ------------------------------------------------------ 1.3 the CLI resolves like Cache


def test_1_3_cli_finds_caches_under_nearcache_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("NEARCACHE_DIR", str(tmp_path / "dir"))
    with Cache("exp", size="1MiB") as cache:
        cache.set("k", "v")
        path = cache.path
    assert path == str(tmp_path / "dir" / "exp")
    assert cli_main(["info", "exp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["path"] == path
    assert cli_main(["stats", "exp", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["entries"] == 1
    assert cli_main(["clear", "exp"]) == 0
    with Cache("exp") as cache:
        assert len(cache) == 0
    assert cli_main(["info", "nope"]) != 0
    assert str(tmp_path / "dir" / "nope") in capsys.readouterr().err


# ---------------------------------------------- 1.4 a missing file is FileNotFoundError


def test_1_4_missing_file_with_create_false_is_file_not_found(cache_dir: Path) -> None:
    with pytest.raises(FileNotFoundError) as info:
        Cache("nope", create=False)
    error = info.value
    assert isinstance(error, nearcache.CacheNotFoundError)
    assert isinstance(error, nearcache.CacheOSError) and isinstance(error, nearcache.Error)
    assert error.errno == errno.ENOENT
    assert str(cache_dir / "nope") in str(error)
    assert not (cache_dir / "nope").exists()


# ----------------------------------------- 1.5 results that cannot be stored: one behaviour


@pytest.mark.parametrize("kind", ["unpicklable", "too large"])
def test_1_5_uncacheable_result_is_returned_counted_and_logged(
    cache: Cache, caplog: pytest.LogCaptureFixture, kind: str
) -> None:
    calls = []

    class Session:
        def __init__(self) -> None:
            self.guard = threading.Lock()

    @cache.memoize()
    def compute(x: int) -> Any:
        calls.append(x)
        return Session() if kind == "unpicklable" else b"x" * (cache.max_value_size + 1)

    with caplog.at_level(logging.WARNING, logger="nearcache.memoize"):
        first = compute(1)
        second = compute(1)
    assert first is not second and len(calls) == 2  # returned, never cached
    assert compute.memo.store_failures == 2
    assert compute.cache_key(1) not in cache
    message = caplog.records[0].getMessage()
    assert "test_rough_edges" in message and "compute" in message
    expected_type = "Session" if kind == "unpicklable" else "its bytes value"
    assert expected_type in message
    assert "tuple" not in message  # never the internal envelope


# ------------------------------------------------------------ 1.6 any callable memoizes


def test_1_6_partials_and_callable_objects(cache: Cache) -> None:
    calls: list[tuple[int, int]] = []

    def add(a: int, b: int) -> int:
        calls.append((a, b))
        return a + b

    plus_one = cache.memoize()(functools.partial(add, 1))
    plus_two = cache.memoize()(functools.partial(add, 2))
    assert (plus_one(1), plus_one(1), plus_two(1)) == (2, 2, 3)
    assert calls == [(1, 1), (2, 1)]  # two partials of one function never share
    assert plus_one.memo.name != plus_two.memo.name

    class Tripler:
        def __call__(self, x: int) -> int:
            calls.append((3, x))
            return 3 * x

    triple = cache.memoize()(Tripler())
    assert (triple(2), triple(2)) == (6, 6)
    assert calls[-1] == (3, 2) and len(calls) == 3
    assert "Tripler" in triple.memo.name

    with pytest.raises(TypeError, match="decorates callables"):
        cache.memoize()(42)  # type: ignore[arg-type]


def test_1_6_partial_of_an_async_function_stays_async(cache: Cache) -> None:
    import asyncio
    import inspect

    async def fetch(a: int, b: int) -> int:
        return a * b

    times_ten = cache.memoize()(functools.partial(fetch, 10))
    assert inspect.iscoroutinefunction(times_ten)
    assert asyncio.run(times_ten(4)) == 40


# -------------------------------------------------- 1.7 helpers bind to the instance


def test_1_7_helpers_bind_to_the_instance(cache: Cache) -> None:
    class Service(Repo):
        @cache.memoize()
        def load(self, x: int) -> int:
            self.calls += 1
            return self.ident * 100 + x

    repo = Service(1)
    assert repo.load(2) == 102
    assert repo.load.cache_key(2) == Service.load.cache_key(repo, 2)
    assert repo.load.cache_key(2) in cache
    assert repo.load.invalidate(2) is True
    assert repo.load.invalidate(2) is False
    assert repo.load(2) == 102 and repo.calls == 2
    assert Service.load.invalidate(repo, 2) is True
    assert repo.load.invalidate_all() == 0
    assert repo.load.__wrapped__ is Service.load.__wrapped__


# ------------------------------------------ 1.8 memoize, lock and keys on every driver


@pytest.fixture
def tiered(tmp_path: Path, redis_server: RedisServer, unique_prefix: str) -> Iterator[Driver]:
    cache = TieredCache(
        ShmDriver(path=tmp_path / "l1", size="1MiB"),
        RedisDriver(redis_server.url, prefix=f"{unique_prefix}tiered:"),
    )
    yield cache
    cache.close()


def _exercise_memoize_and_lock(store: Any) -> None:
    calls: list[int] = []

    @store.memoize(ttl=60)
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert (square(3), square(3)) == (9, 9)
    assert calls == [3]
    assert square.invalidate(3) is True
    assert square(3) == 9 and calls == [3, 3]

    lock = store.lock("job", timeout=0, expire=30)
    with lock:
        assert lock.locked() and lock.owned()
        assert store.lock("job", timeout=0).acquire() is False
    assert not lock.locked()


def test_1_8_memoize_and_lock_on_every_driver_and_the_tiered_cache(
    every_store: list[Any], tiered: Driver, tmp_path: Path
) -> None:
    url_driver = from_url(f"nearcache://{tmp_path / 'u'}?size=1MiB".replace("://", ":///", 1))
    try:
        for store in [*every_store, tiered, url_driver]:
            if getattr(store, "stores", True):
                _exercise_memoize_and_lock(store)
            else:
                assert store.memoize()(abs)(-1) == 1  # the null driver computes every time
    finally:
        url_driver.close()


def test_1_8_keys_on_the_drivers_that_can_list_them(every_store: list[Any]) -> None:
    for store in every_store:
        store.set("k", 1)
        store.set(7, 2)
        if isinstance(store, MemcachedDriver):
            with pytest.raises(NotImplementedError, match="memcached"):
                store.keys()
        elif getattr(store, "stores", True):
            assert sorted(map(str, store.keys())) == ["7", "k"], store
        else:
            assert store.keys() == []


def test_1_8_invalidate_all_on_a_driver(every_store: list[Any]) -> None:
    shm = next(s for s in every_store if isinstance(s, ShmDriver))

    @shm.memoize()
    def double(x: int) -> int:
        return 2 * x

    assert [double(i) for i in range(4)] == [0, 2, 4, 6]
    assert double.invalidate_all() == 4
    assert shm.keys() == []


# ------------------------------------------------------- 1.9 durations and sizes


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5min", 300),
        ("5 min", 300),
        ("5 minutes", 300),
        ("1 hour", 3600),
        ("2 hrs", 7200),
        ("1 hour, 30 min", 5400),
        ("1h30m", 5400),
        ("3 days", 259200),
        ("1 week", 604800),
        ("250 msec", 0.25),
        ("10 sec", 10),
        ("2 Seconds", 2),
    ],
)
def test_1_9_usual_duration_spellings(text: str, seconds: float, cache: Cache) -> None:
    assert parse_duration(text) == seconds
    cache.set("k", 1, ttl=text)
    ttl = cache.ttl("k")
    assert ttl is not None and seconds - 1 < ttl <= seconds


@pytest.mark.parametrize("text", ["5 minx", "min", "5 mins later", "1 hour 30", "5 xm", "h1"])
def test_1_9_malformed_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="cannot parse duration"):
        parse_duration(text)


def test_1_9_size_errors_explain_both_conventions(tmp_path: Path) -> None:
    assert parse_size("64mb") == 64_000_000
    assert parse_size("64M") == 64 * 1024 * 1024
    with pytest.raises(ValueError, match=r"64M = 64MiB = 67,108,864 bytes.*64MB = 64,000,000"):
        parse_size("64 megs")
    with pytest.raises(nearcache.ConfigurationError, match="64MB = 64,000,000"):
        Cache(path=tmp_path / "c", size="lots")
    with pytest.raises(nearcache.ConfigurationError, match="64MB = 64,000,000"):
        from_url(f"nearcache:///{tmp_path}/u?size=lots")


# -------------------------------------------------- 1.10 unencodable str keys


@pytest.mark.parametrize("key", ["\ud800", "ok\udfffok"])
def test_1_10_lone_surrogate_keys_raise_the_key_error_naming_the_key(
    cache: Cache, key: str
) -> None:
    cache.set("other", 1)
    calls: list[Callable[[], Any]] = [
        lambda: cache.set(key, 1),
        lambda: cache.get(key),
        lambda: cache.add(key, 1),
        lambda: cache.delete(key),
        lambda: cache.incr(key),
        lambda: key in cache,
        lambda: cache.get_many([key]),
        lambda: cache.delete_many(["other", key]),
        lambda: cache.pop(key),
    ]
    for call in calls:
        with pytest.raises(nearcache.InvalidKeyError) as info:
            call()
        assert repr(key) in str(info.value)
        assert isinstance(info.value, ValueError)
    assert cache.get("other") == 1  # nothing lost


# ------------------------------------------------------- 1.11 KeyError names the key


def test_1_11_incr_on_a_missing_key_without_default_names_the_key(
    every_store: list[Any],
) -> None:
    for store in every_store:
        with pytest.raises(KeyError) as info:
            store.incr("nokey", default=None)
        assert info.value.args == ("nokey",), store
        with pytest.raises(KeyError) as info:
            store.decr(12, default=None)
        assert info.value.args == (12,), store


# ------------------------------ 1.12 another size is no error: the file is resized


def test_1_12_another_size_resizes_the_file_keeping_its_entries(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "c", size="1MiB") as small:
        small.set("k", "v")
    with Cache(path=tmp_path / "c", size="2MiB") as cache:
        assert cache.capacity >= 2 * 1024 * 1024 - 8192
        assert cache.get("k") == "v"
    with Cache(path=tmp_path / "c", size="2MiB", shards=4, recreate=True) as cache:
        assert cache.get("k") is None


# ------------------------------------------------ 1.13 URL option typos are named


@pytest.mark.parametrize(
    ("url", "typo", "meant"),
    [
        ("redis://127.0.0.1:1/0?prefx=a", "prefx", "prefix"),
        ("redis://127.0.0.1:1/0?timout=1", "timout", "timeout"),
        ("memcached://127.0.0.1:1?prefx=a", "prefx", "prefix"),
        ("nearcache://x?sise=1M", "sise", "size"),
        ("memory://?max_entires=3", "max_entires", "max_entries"),
    ],
)
def test_1_13_url_option_typos_suggest_the_closest_option(url: str, typo: str, meant: str) -> None:
    with pytest.raises(nearcache.ConfigurationError) as info:
        from_url(url)
    message = str(info.value)
    assert f"unknown option {typo!r}" in message
    assert f"did you mean {meant!r}?" in message
    assert "prefix" in message or "max_entries" in message  # the list of options
    assert "AbstractConnection" not in message and "__init__" not in message


# -------------------------------------- 1.14 nearcache.testing without pytest installed


def test_1_14_nearcache_testing_imports_without_pytest(tmp_path: Path) -> None:
    import subprocess

    blocker = tmp_path / "no_pytest"
    blocker.mkdir()
    (blocker / "pytest.py").write_text("raise ImportError('pytest is not installed')\n")
    code = (
        "import nearcache.testing as t\n"
        "print(t.RedisServer.__name__, t.free_port() > 0)\n"
        "try:\n"
        "    t.DriverContract\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(blocker), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "RedisServer True",
        "nearcache.testing.contract is a pytest suite: install pytest to use it",
    ]


def test_1_8_memoize_on_two_tiered_hosts_computes_once(
    tmp_path: Path, redis_server: RedisServer, unique_prefix: str
) -> None:
    hosts = [
        TieredCache(
            ShmDriver(path=tmp_path / f"host-{n}", size="1MiB"),
            RedisDriver(redis_server.url, prefix=unique_prefix),
        )
        for n in range(2)
    ]
    calls: list[int] = []
    try:

        def on_host(n: int) -> Callable[[str], str]:
            def report(day: str) -> str:
                calls.append(n)
                return f"r{day}"

            return report

        memoized = [host.memoize(ttl=60)(on_host(n)) for n, host in enumerate(hosts)]
        assert memoized[0]("mon") == "rmon"
        assert memoized[1]("mon") == "rmon"  # the other host finds it in L2
        assert calls == [0]
        with hosts[0].lock("nightly", timeout=0):
            assert hosts[1].lock("nightly", timeout=0).acquire() is False  # one lock, two hosts
    finally:
        for host in hosts:
            host.close()


def test_1_8_lock_release_never_frees_the_next_holders_lock(every_store: list[Any]) -> None:
    import time

    for store in every_store:
        if not getattr(store, "stores", True):
            continue
        first = store.lock("handover", timeout=0, expire=0.05)
        assert first.acquire()
        time.sleep(0.1 + getattr(store, "ttl_resolution", 0.0))  # first's lock expires
        second = store.lock("handover", timeout=0, expire=30)
        deadline = time.monotonic() + 10
        while not second.acquire(blocking=False):  # a loaded machine may need a few tries
            assert time.monotonic() < deadline
            time.sleep(0.05)
        with pytest.raises(nearcache.LockNotOwnedError):
            first.release()
        assert second.locked() and second.owned(), store
        second.release()
        assert not second.locked()


def test_1_8_delete_if_equals_compares_before_deleting(every_store: list[Any]) -> None:
    for store in every_store:
        if isinstance(store, Cache) or not store.stores:
            continue
        store.set("token", b"mine")
        assert store.delete_if_equals("token", b"theirs") is False
        assert store.get("token") == b"mine", store
        assert store.delete_if_equals("token", b"mine") is True
        assert store.get("token") is None
        assert store.delete_if_equals("token", b"mine") is False
