"""TieredCache: the contract, two hosts sharing a real Redis, outages, races, stats."""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from nearcache.drivers import (
    BackendError,
    Driver,
    MemcachedDriver,
    MemoryDriver,
    RedisDriver,
    ShmDriver,
)
from nearcache.testing import DriverContract, MemcachedServer, RedisServer
from nearcache.tiered import RedisInvalidator, TieredCache, decode_message, encode_message

_numbers = itertools.count()
POLL = 0.002
BOUND = 5.0  # seconds: the functional limit for anything to propagate


def wait_for(condition: Callable[[], bool], timeout: float = BOUND) -> float:
    """Poll ``condition`` until true; return the seconds it took (fail after ``timeout``)."""
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(POLL)
    return time.monotonic() - start


# ------------------------------------------------------------------------------ contract


class TestTieredMemoryOverRedis(DriverContract):
    @pytest.fixture(autouse=True)
    def _server(self, redis_server: RedisServer, unique_prefix: str) -> None:
        self.url = redis_server.url
        self.prefix = unique_prefix

    def make_driver(self, **options: Any) -> TieredCache:
        l2 = RedisDriver(self.url, prefix=f"{self.prefix}{next(_numbers)}:", **options)
        return TieredCache(MemoryDriver(), l2)


class TestTieredShmOverMemcached(DriverContract):
    @pytest.fixture(autouse=True)
    def _server(
        self,
        memcached_server: MemcachedServer,
        redis_server: RedisServer,
        unique_prefix: str,
        tmp_path: Path,
    ) -> None:
        self.address = memcached_server.address
        self.redis_url = redis_server.url
        self.prefix = unique_prefix
        self.directory = tmp_path

    def make_driver(self, **options: Any) -> TieredCache:
        n = next(_numbers)
        l1 = ShmDriver(path=self.directory / f"l1-{n}", size="8MiB")
        l2 = MemcachedDriver(self.address, prefix=f"{self.prefix}{n}:", **options)
        return TieredCache(l1, l2, invalidation=self.redis_url)


# ------------------------------------------------------------------------------ helpers


@pytest.fixture
def host_factory(
    redis_server: RedisServer, unique_prefix: str, tmp_path: Path
) -> Iterator[Callable[..., TieredCache]]:
    """Makes "hosts": each its own L1 file, all sharing one Redis L2 and channel."""
    made: list[TieredCache] = []

    def make(name: str, *, l1: Driver | None = None, **options: Any) -> TieredCache:
        if l1 is None:
            l1 = ShmDriver(path=tmp_path / f"host-{name}", size="8MiB")
        l2 = RedisDriver(redis_server.url, prefix=unique_prefix)
        cache = TieredCache(l1, l2, **options)
        made.append(cache)
        assert cache.wait_ready(BOUND)
        return cache

    yield make
    for cache in made:
        cache.close()


def settle(cache: TieredCache, received: int) -> None:
    """Wait until ``cache`` has received ``received`` invalidations from other hosts."""
    wait_for(lambda: cache.stats()["invalidations_received"] >= received)


def kill_subscribers(url: str) -> None:
    """Drop every pub/sub connection of the server (as a network blip would)."""
    client = redis.Redis.from_url(url)
    try:
        client.client_kill_filter(_type="pubsub")
    finally:
        client.close()


# ------------------------------------------------------------------------ two hosts


def test_two_hosts_see_each_others_writes(
    host_factory: Callable[..., TieredCache], record_property: Callable[[str, object], None]
) -> None:
    a, b = host_factory("a"), host_factory("b")
    a.set("page", "v0")
    settle(b, 1)
    assert b.get("page") == "v0"  # L2 hit, copied into b's L1
    assert b.l1.get("page") == "v0"
    assert b.stats()["l2_hits"] == 1
    assert b.get("page") == "v0"
    assert b.stats()["l1_hits"] == 1

    delays = []
    for i in range(1, 21):
        expected = f"v{i}"
        a.set("page", expected)
        assert a.get("page") == expected  # the writer reads its own write from L1
        delays.append(wait_for(lambda expected=expected: b.get("page") == expected))
    assert b.stats()["invalidations_received"] == 21
    assert a.stats()["invalidations_sent"] == 21
    median_ms = statistics.median(delays) * 1000
    record_property("invalidation_delay_median_ms", round(median_ms, 3))
    record_property("invalidation_delay_max_ms", round(max(delays) * 1000, 3))
    print(f"invalidation delay: median {median_ms:.2f} ms, max {max(delays) * 1000:.2f} ms")


def test_deletes_and_clears_reach_the_other_host(host_factory: Callable[..., TieredCache]) -> None:
    a, b = host_factory("a"), host_factory("b")
    a.set_many({"x": 1, "y": 2, "z": 3})
    settle(b, 1)
    assert b.get_many(["x", "y", "z"]) == {"x": 1, "y": 2, "z": 3}
    assert b.l1.get_many(["x", "y", "z"]) == {"x": 1, "y": 2, "z": 3}
    a.delete("x")
    settle(b, 2)
    assert b.l1.get("x") is None
    assert b.get("x") is None
    a.delete_many(["y"])
    settle(b, 3)
    assert b.l1.get("y") is None
    a.incr("counter", 5)
    settle(b, 4)
    assert b.get("counter") == 5
    a.incr("counter")
    settle(b, 5)
    assert b.get("counter") == 6
    assert b.l1.get("z") == 3
    a.set(42, "int key")
    settle(b, 6)
    assert b.get(42) == "int key"
    a.delete(42)
    settle(b, 7)
    assert b.l1.get(42) is None
    assert b.get(42) is None
    a.clear()
    wait_for(lambda: b.stats()["clears_received"] == 1)
    assert b.l1.get("z") is None
    assert b.get("z") is None
    assert b.stats()["clears_received"] == 1


def test_a_host_ignores_its_own_invalidations(host_factory: Callable[..., TieredCache]) -> None:
    a = host_factory("a")
    a.set("k", "v")
    time.sleep(0.1)
    assert a.l1.get("k") == "v"
    assert a.stats()["invalidations_received"] == 0


def test_lost_invalidation_heals_on_reconnect(
    host_factory: Callable[..., TieredCache], redis_server: RedisServer
) -> None:
    a, b = host_factory("a"), host_factory("b")
    a.set("k", "old")
    settle(b, 1)
    assert b.get("k") == "old"
    # A write that reaches L2 but whose invalidation is lost.
    a.l2.set("k", "new")
    time.sleep(0.1)
    assert b.get("k") == "old"  # stale, as expected without a message
    resyncs = b.stats()["resyncs"]
    kill_subscribers(redis_server.url)
    wait_for(lambda: b.stats()["resyncs"] > resyncs)
    assert b.get("k") == "new"  # L1 was cleared on resubscribe


def test_lost_invalidation_heals_within_l1_ttl(host_factory: Callable[..., TieredCache]) -> None:
    a = host_factory("a", invalidation=None)
    b = host_factory("b", invalidation=None, l1_ttl=0.5)
    a.set("k", "old")
    assert b.get("k") == "old"
    filled = time.monotonic()
    a.set("k", "new")
    assert b.get("k") == "old"  # no channel: b keeps its copy...
    wait_for(lambda: b.get("k") == "new")  # ...for at most l1_ttl
    assert time.monotonic() - filled <= 0.5 + 0.3


def test_l1_copies_never_outlive_the_l2_entry(host_factory: Callable[..., TieredCache]) -> None:
    a, b = host_factory("a"), host_factory("b", l1_ttl=60)
    a.set("short", "v", ttl=0.3)
    settle(b, 1)
    assert b.get("short") == "v"
    left = b.l1.get_with_ttl("short")[1]
    assert left is not None and left <= 0.3
    time.sleep(0.35)
    assert b.get("short") is None


def test_a_ttl_shortened_elsewhere_is_not_outlived(
    host_factory: Callable[..., TieredCache],
) -> None:
    a, b = host_factory("a"), host_factory("b")
    a.set("k", "v", ttl=300)
    settle(b, 1)
    assert b.get("k") == "v"
    assert a.touch("k", 0.5)
    settle(b, 2)
    assert b.l1.get("k") is None
    assert b.get("k") == "v"
    left = b.l1.get_with_ttl("k")[1]
    assert left is not None and left <= 0.5


def test_memcached_l2_with_redis_invalidation(
    memcached_server: MemcachedServer,
    redis_server: RedisServer,
    unique_prefix: str,
    tmp_path: Path,
) -> None:
    def host(name: str) -> TieredCache:
        return TieredCache(
            ShmDriver(path=tmp_path / name, size="4MiB"),
            MemcachedDriver(memcached_server.address, prefix=unique_prefix),
            invalidation=redis_server.url,
        )

    with host("a") as a, host("b") as b:
        assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
        a.set("k", 1)
        assert b.get("k") == 1
        a.set("k", 2)
        wait_for(lambda: b.get("k") == 2)


def test_memcached_l2_expires_with_l1(
    memcached_server: MemcachedServer, unique_prefix: str, tmp_path: Path
) -> None:
    """Once L1's copy expires, L2 must not serve the value memcached still holds
    (its whole-second clock keeps the item up to two seconds longer)."""
    with TieredCache(
        ShmDriver(path=tmp_path / "l1", size="4MiB"),
        MemcachedDriver(memcached_server.address, prefix=unique_prefix),
    ) as cache:
        cache.set_many({"key1": "spam", "key2": "eggs"}, ttl=0.3)
        cache.set("key3", "ham", ttl=0.3)
        assert cache.get_many(["key1", "key2", "key3"]) == {
            "key1": "spam",
            "key2": "eggs",
            "key3": "ham",
        }
        time.sleep(0.5)
        assert cache.get("key1") is None
        assert cache.get_many(["key2", "key3"]) == {}
        assert cache.get_with_ttl("key3") == (None, None)
        assert cache.add("key1", "new", ttl=60) is True
        assert cache.get("key1") == "new"


# -------------------------------------------------------------------------------- outage


@pytest.fixture(params=["shm", "memory"])
def outage_cache(
    request: pytest.FixtureRequest, private_redis_server: RedisServer, tmp_path: Path
) -> Iterator[TieredCache]:
    l1: Driver = MemoryDriver()
    if request.param == "shm":
        l1 = ShmDriver(path=tmp_path / "l1", size="4MiB")
    l2 = RedisDriver(private_redis_server.url, socket_timeout=0.3, connect_timeout=0.3)
    cache = TieredCache(
        l1,
        l2,
        on_get_error="ignore",
        on_set_error="ignore",
        circuit_breaker={"backoff": 0.05, "max_backoff": 0.1},
    )
    cache.invalidator.reconnect_delay = 0.02  # type: ignore[union-attr]
    cache.invalidator.max_reconnect_delay = 0.1  # type: ignore[union-attr]
    assert cache.wait_ready(BOUND)
    yield cache
    cache.close()


def test_outage_serves_l1_and_recovers(
    outage_cache: TieredCache, private_redis_server: RedisServer
) -> None:
    cache = outage_cache
    cache.set_many({f"k{i}": i for i in range(10)})
    private_redis_server.stop()
    wait_for(lambda: cache.invalidator is not None and not cache.invalidator.connected)

    started = time.monotonic()
    assert [cache.get(f"k{i}") for i in range(10)] == list(range(10))  # L1 hits
    assert cache.get("absent", "default") == "default"  # L2 down: a miss, no error
    cache.set("written-during-outage", "local")  # L2 down: kept in this host's L1
    assert cache.get("written-during-outage") == "local"
    assert cache.add("added", 1) is False
    assert cache.delete("k9") is False
    assert cache.get("k9") is None  # dropped from L1 anyway
    with pytest.raises(BackendError):
        cache.incr("counter")
    assert time.monotonic() - started < BOUND
    stats = cache.stats()
    assert stats["l2_errors"] >= 1
    assert stats["l2_errors"] + stats["l2_skipped"] >= 5  # skipped: the breaker was open
    assert stats["l1_hits"] >= 10

    private_redis_server.start()  # same port
    resyncs = stats["resyncs"]
    wait_for(lambda: cache.stats()["resyncs"] > resyncs)
    assert cache.get("k0") is None  # L1 cleared; the restarted L2 is empty
    assert cache.get("written-during-outage") is None

    def written() -> bool:  # the first calls may fall in the breaker's back-off
        cache.set("after", "ok")
        return bool(cache.l2.get("after") == "ok")

    wait_for(written)
    assert cache.get("after") == "ok"
    assert cache.incr("counter") == 1


def test_a_frozen_server_never_hangs_a_call(
    outage_cache: TieredCache, private_redis_server: RedisServer
) -> None:
    cache = outage_cache
    cache.set("k", "v")
    private_redis_server.pause()  # accepts connections, answers nothing
    try:
        started = time.monotonic()
        assert cache.get("k") == "v"
        assert cache.get("absent") is None
        cache.set("k2", "v2")
        elapsed = time.monotonic() - started
        assert elapsed < 2.0  # two socket timeouts of 0.3 s, with room to spare
        wait_for(lambda: cache.invalidator is not None and not cache.invalidator.connected)
    finally:
        private_redis_server.resume()
    resyncs = cache.stats()["resyncs"]
    wait_for(lambda: cache.stats()["resyncs"] > resyncs)
    assert cache.get("absent") is None

    def written() -> bool:
        cache.set("k3", "v3")
        return bool(cache.l2.get("k3") == "v3")

    wait_for(written)


@pytest.fixture
def dead_l2_cache(tmp_path: Path) -> Iterator[Callable[..., TieredCache]]:
    """Tiered caches whose L2 is a server that was started, then stopped."""
    server = RedisServer(workdir=tmp_path)
    server.start()
    url = server.url
    server.stop()
    made: list[TieredCache] = []

    def make(**policies: Any) -> TieredCache:
        l2 = RedisDriver(url, socket_timeout=0.3, connect_timeout=0.3)
        cache = TieredCache(
            MemoryDriver(), l2, invalidation=None, circuit_breaker=False, **policies
        )
        cache.l1.set("cached", "from L1")
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()
    server.close()


def test_policy_raise(dead_l2_cache: Callable[..., TieredCache]) -> None:
    cache = dead_l2_cache(on_get_error="raise", on_set_error="raise")
    assert cache.get("cached") == "from L1"
    with pytest.raises(BackendError) as info:
        cache.get("absent")
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
    with pytest.raises(BackendError):
        cache.set("cached", "new")
    assert cache.l1.get("cached") is None  # a failed write leaves no L1 copy
    assert cache.stats()["l2_errors"] == 2


def test_policy_log(
    dead_l2_cache: Callable[..., TieredCache], caplog: pytest.LogCaptureFixture
) -> None:
    cache = dead_l2_cache()  # "log" is the default
    with caplog.at_level(logging.WARNING, logger="nearcache.tiered"):
        assert cache.get("absent", "d") == "d"
        assert cache.get("absent", "d") == "d"  # within a second: not logged again
    records = [r for r in caplog.records if r.name == "nearcache.tiered"]
    assert len(records) == 1
    assert "get" in records[0].getMessage()
    assert cache.stats()["l2_errors"] == 2


def test_policy_callable(dead_l2_cache: Callable[..., TieredCache]) -> None:
    seen: list[tuple[type[BaseException], str, Any]] = []

    def policy(error: BackendError, operation: str, key: Any) -> None:
        seen.append((type(error), operation, key))

    cache = dead_l2_cache(on_get_error=policy, on_set_error=policy)
    assert cache.get("absent") is None
    cache.set("k", 1)
    assert cache.get("k") == 1  # ignored failure: kept locally
    assert seen == [(BackendError, "get", "absent"), (BackendError, "set", "k")]


def test_policy_is_validated() -> None:
    with pytest.raises(ValueError):
        TieredCache(MemoryDriver(), MemoryDriver(), on_get_error="shout")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------- races


class _GatedL2(MemoryDriver):
    """An L2 whose reads pause at a gate, to interleave a write with a read."""

    def __init__(self) -> None:
        super().__init__()
        self.reading = threading.Event()
        self.gate = threading.Event()

    def get_with_ttl(self, key: Any, default: Any = None) -> tuple[Any, float | None]:
        result = super().get_with_ttl(key, default)
        self.reading.set()
        assert self.gate.wait(BOUND)
        return result


@pytest.mark.parametrize("racer", ["local write", "remote invalidation"])
def test_a_read_racing_a_write_leaves_no_stale_l1_copy(racer: str) -> None:
    l2 = _GatedL2()
    cache = TieredCache(MemoryDriver(), l2, invalidation=None)
    l2.set("k", "old")
    reader = threading.Thread(target=cache.get, args=("k",))
    reader.start()
    assert l2.reading.wait(BOUND)  # the reader holds "old", not yet in L1
    if racer == "local write":
        cache.set("k", "new")  # L2 and L1 now hold "new"
    else:
        MemoryDriver.set(l2, "k", "new")  # another host wrote L2...
        cache._invalidate([b"k"])  # ...and its invalidation arrived
    l2.gate.set()  # now the reader copies "old" into L1
    reader.join(BOUND)
    assert cache.l1.get("k") in (None, "new")
    assert cache.get("k") == "new"


def _racing_pair(l1_kind: str, tmp_path: Path) -> tuple[TieredCache, _GatedL2, TieredCache]:
    """A reader whose L2 reads pause at a gate, and a writer on the same host.

    With a shared L1 the writer is a second cache on the reader's L1 file, as
    another worker process of the host would be; with a private L1 it is the
    reader itself (another thread).
    """
    l2 = _GatedL2()
    if l1_kind == "private":
        reader = TieredCache(MemoryDriver(), l2, invalidation=None)
        return reader, l2, reader
    path = tmp_path / "l1"
    reader = TieredCache(ShmDriver(path=path, size="1MiB"), l2, invalidation=None)
    writer = TieredCache(ShmDriver(path=path, size="1MiB"), MemoryDriver(), invalidation=None)
    return reader, l2, writer


@pytest.mark.parametrize("l1_kind", ["private", "shared"])
def test_a_fill_racing_writes_of_other_keys_is_kept(l1_kind: str, tmp_path: Path) -> None:
    # The generation is per key (striped): on a busy host some key changes
    # during every L2 round trip, and a host-wide counter made every fill
    # drop its copy, so L1 emptied under writes and every get went to L2.
    reader, l2, writer = _racing_pair(l1_kind, tmp_path)
    l2.set("k", "v")
    others = [f"other-{i}" for i in range(20)]
    thread = threading.Thread(target=reader.get, args=("k",))
    thread.start()
    assert l2.reading.wait(BOUND)
    for key in others:
        writer.set(key, 1)
        writer.delete(key)
    l2.gate.set()
    thread.join(BOUND)
    assert reader.l1.get("k") == "v"
    assert reader.stats()["fills_dropped"] == 0


@pytest.mark.parametrize("l1_kind", ["private", "shared"])
def test_a_fill_racing_a_write_of_its_key_on_the_host_is_dropped(
    l1_kind: str, tmp_path: Path
) -> None:
    reader, l2, writer = _racing_pair(l1_kind, tmp_path)
    l2.set("k", "old")
    thread = threading.Thread(target=reader.get, args=("k",))
    thread.start()
    assert l2.reading.wait(BOUND)
    writer.delete("k")  # another worker of the host drops the key
    l2.gate.set()
    thread.join(BOUND)
    assert reader.l1.get("k") is None
    assert reader.stats()["fills_dropped"] == 1


# ---------------------------------------------------------------------- stats and limits


def test_stats_per_tier(host_factory: Callable[..., TieredCache]) -> None:
    a, b = host_factory("a"), host_factory("b")
    a.set("k", 1)
    settle(b, 1)
    b.get("k")  # L2 hit
    b.get("k")  # L1 hit
    b.get("missing")  # miss
    b.get_many(["k", "missing"])  # one L1 hit, one miss
    a.set("k", 2)
    settle(b, 2)
    stats = b.stats()
    assert (stats["l1_hits"], stats["l2_hits"], stats["misses"], stats["l2_errors"]) == (2, 1, 2, 0)
    assert stats["l1"]["driver"] == "shm"
    assert stats["l2"]["driver"] == "redis"
    assert stats["invalidation"]["connected"] is True
    assert stats["resyncs"] >= 1


def test_values_too_large_for_l1_are_served_from_l2(redis_server: RedisServer) -> None:
    l2 = RedisDriver(redis_server.url, prefix="large:")
    with TieredCache(MemoryDriver(max_value_size=100), l2, invalidation=None) as cache:
        cache.set("big", b"x" * 1000)
        assert cache.l1.get("big") is None
        assert cache.get("big") == b"x" * 1000
        assert cache.stats()["l1_rejected"] >= 2
        cache.clear()


def test_messages_round_trip() -> None:
    origin = b"0123456789abcdef"
    keys = [b"a", b"", b"\xff7", b"x" * 300]
    assert decode_message(encode_message(origin, b"k", keys)) == (origin, b"k", keys)
    assert decode_message(encode_message(origin, b"c")) == (origin, b"c", [])
    assert decode_message(b"garbage") is None
    assert decode_message(encode_message(origin, b"k", [b"abc"])[:-1]) is None


# ----------------------------------------------------------------------------------- fork


def _child_waits_for_invalidation(cache: TieredCache, queue: Any) -> None:
    ready = cache.wait_ready(BOUND)
    queue.put(("ready", ready))
    queue.put(("value", cache.get("k")))
    deadline = time.monotonic() + BOUND
    while cache.l1.get("k") is not None and time.monotonic() < deadline:
        time.sleep(POLL)
    queue.put(("invalidated", cache.l1.get("k") is None))


def test_invalidation_survives_fork(redis_server: RedisServer, unique_prefix: str) -> None:
    context = multiprocessing.get_context("fork")
    l2 = RedisDriver(redis_server.url, prefix=unique_prefix)
    with TieredCache(MemoryDriver(), l2) as cache:
        assert cache.wait_ready(BOUND)
        cache.set("k", "v1")
        queue = context.Queue()
        child = context.Process(target=_child_waits_for_invalidation, args=(cache, queue))
        child.start()
        try:
            assert queue.get(timeout=BOUND + 5) == ("ready", True)
            assert queue.get(timeout=BOUND) == ("value", "v1")
            cache.set("k", "v2")  # the child's own invalidator must hear this
            assert queue.get(timeout=BOUND + 5) == ("invalidated", True)
        finally:
            child.join(BOUND)
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0


def test_redis_invalidator_reports_its_state(redis_server: RedisServer) -> None:
    invalidator = RedisInvalidator(redis_server.url, "nearcache:test:state")
    assert not invalidator.connected
    invalidator.publish([b"k"])  # publishing needs no subscription
    assert invalidator.stats()["sent"] == 1
    invalidator.close()


def test_resp2_reader_handles_split_and_batched_replies() -> None:
    from nearcache.tiered.resp import ReplyError, Resp2Reader, command

    assert command(b"PING") == b"*1\r\n$4\r\nPING\r\n"
    stream = b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
    stream += b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$5\r\na\r\nb\x00\r\n"
    stream += b"*2\r\n$4\r\npong\r\n$0\r\n\r\n+OK\r\n$-1\r\n"
    expected = [
        [b"subscribe", b"ch", 1],
        [b"message", b"ch", b"a\r\nb\x00"],
        [b"pong", b""],
        b"OK",
        None,
    ]
    whole = Resp2Reader()
    assert whole.feed(stream) == expected
    pieces = Resp2Reader()
    replies = []
    for i in range(len(stream)):
        replies += pieces.feed(stream[i : i + 1])
    assert replies == expected
    with pytest.raises(ReplyError):
        Resp2Reader().feed(b"-ERR wrong\r\n")


def test_an_unclosed_cache_stops_its_thread_once_collected(
    redis_server: RedisServer, unique_prefix: str
) -> None:
    import gc

    def subscribers() -> int:
        return sum(t.name.startswith("nearcache-invalidation-") for t in threading.enumerate())

    before = subscribers()
    forgotten = TieredCache(MemoryDriver(), RedisDriver(redis_server.url, prefix=unique_prefix))
    assert subscribers() == before + 1
    del forgotten
    gc.collect()
    with TieredCache(MemoryDriver(), RedisDriver(redis_server.url, prefix=unique_prefix)) as writer:
        writer.set("k", 1)  # the forgotten cache's thread hears it and stops
        wait_for(lambda: subscribers() == before + 1)
    wait_for(lambda: subscribers() == before)


# ------------------------------------------------------------------------ key listing


def test_keys_lists_l2_and_memoize_invalidate_all_works(
    host_factory: Callable[..., TieredCache],
) -> None:
    a, b = host_factory("a"), host_factory("b")
    a.set("only-in-l2", 1)
    b.l1.delete("only-in-l2")  # b's L1 never held it: the listing comes from L2
    assert sorted(map(str, b.keys())) == ["only-in-l2"]
    calls: list[int] = []

    @b.memoize(ttl=60)
    def square(n: int) -> int:
        calls.append(n)
        return n * n

    assert [square(2), square(3), square(2)] == [4, 9, 4]
    assert calls == [2, 3]
    assert square.invalidate_all() == 2
    assert a.get("only-in-l2") == 1  # other keys stay
    assert square(2) == 4 and calls == [2, 3, 2]


def test_keys_of_a_memcached_l2_cannot_be_listed(
    memcached_server: MemcachedServer, unique_prefix: str
) -> None:
    with (
        TieredCache(
            MemoryDriver(), MemcachedDriver(memcached_server.address, prefix=unique_prefix)
        ) as cache,
        pytest.raises(NotImplementedError),
    ):
        cache.keys()


def test_bare_strings_are_refused_as_key_collections(
    host_factory: Callable[..., TieredCache],
) -> None:
    from nearcache.keys import KeyTypeError

    cache = host_factory("a")
    cache.set_many({"a": 1, "b": 2, "c": 3})
    for keys in ("abc", b"abc"):
        for method in (cache.get_many, cache.get_many_with_ttl, cache.delete_many):
            with pytest.raises(KeyTypeError):
                method(keys)  # type: ignore[arg-type]
        with pytest.raises(KeyTypeError):
            cache.set_many(keys)  # type: ignore[arg-type]
    assert cache.get_many(["a", "b", "c"]) == {"a": 1, "b": 2, "c": 3}
    found = cache.get_many_with_ttl(["a", "b", "missing"])
    assert {key: value for key, (value, _) in found.items()} == {"a": 1, "b": 2}


def test_a_lone_invalidation_is_not_held_back_by_the_batch_pause(
    host_factory: Callable[..., TieredCache], redis_server: RedisServer, unique_prefix: str
) -> None:
    # The pause that gathers a burst follows only a read of several
    # messages: after a lone one the next is applied at once, not after
    # batch_interval (here far longer than the wait below allows).
    slow = RedisInvalidator(
        redis_server.url, "nearcache:invalidate:" + unique_prefix, batch_interval=60.0
    )
    a, b = host_factory("a"), host_factory("b", invalidation=slow)
    heard = 0
    for round_ in range(3):
        a.set("k", round_)
        heard += 1
        settle(b, heard)
        assert b.get("k") == round_ and b.l1.contains("k")
        a.set("k", f"new {round_}")
        heard += 1
        wait_for(lambda: not b.l1.contains("k"))
