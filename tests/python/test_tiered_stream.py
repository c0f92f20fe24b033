"""Ordered invalidations in a Redis Stream, one listener per host, replay after gaps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from nearcache.drivers import MemoryDriver, RedisDriver, ShmDriver
from nearcache.testing import RedisServer
from nearcache.tiered import TieredCache
from nearcache.tiered.election import ListenerElection
from nearcache.tiered.stream import StreamInvalidator, _intact, stream_id

BOUND = 10.0


def wait_for(condition: Callable[[], bool], timeout: float = BOUND) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.005)
    return time.monotonic() - start


def xread_clients(url: str) -> int:
    """How many connections of the server are blocked in XREAD (the listeners)."""
    client = redis.Redis.from_url(url)
    try:
        return sum(1 for c in client.client_list() if c.get("cmd") == "xread")
    finally:
        client.close()


@pytest.fixture
def hosts(
    private_redis_server: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., TieredCache]]:
    """``hosts(name)``: a tiered cache on host ``name`` (one L1 file per name)."""
    made: list[TieredCache] = []

    def make(name: str, **options: Any) -> TieredCache:
        l1 = ShmDriver(path=tmp_path / f"host-{name}", size="4MiB")
        l2 = RedisDriver(private_redis_server.url, prefix="app:")
        cache = TieredCache(l1, l2, **{"invalidation": "stream", **options})
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


def test_invalidations_reach_the_other_host_in_order(hosts: Callable[..., TieredCache]) -> None:
    a, b = hosts("a"), hosts("b")
    assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
    assert isinstance(a.invalidator, StreamInvalidator)
    for i in range(5):
        a.set("k", i)
        wait_for(lambda i=i: b.get("k") == i)  # type: ignore[misc]
    a.delete("k")
    wait_for(lambda: b.get("k") is None)
    b.set_many({"x": 1, "y": 2})
    wait_for(lambda: a.get_many(["x", "y"]) == {"x": 1, "y": 2})
    b.clear()
    wait_for(lambda: a.stats()["clears_received"] == 1)
    stats = a.stats()["invalidation"]
    assert stats["received"] == 8  # its own five sets and delete, set_many and clear from b
    assert stats["own"] == 6
    assert stats["resyncs"] == 1  # one: the first start


def test_one_listener_per_host(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    workers = [hosts("a") for _ in range(4)]  # four processes of host a (one L1 file each)
    other = hosts("b")
    for cache in [*workers, other]:
        assert cache.wait_ready(BOUND)
    assert sum(cache.is_listener for cache in workers) == 1
    wait_for(lambda: xread_clients(private_redis_server.url) == 2)  # one per host
    listener = next(cache for cache in workers if cache.is_listener)
    other.set("k", 1)
    for cache in workers:
        cache.get("k")  # every worker reads it into the one L1
    other.set("k", 2)
    wait_for(lambda: all(cache.get("k") == 2 for cache in workers))
    assert listener.stats()["invalidations_received"] >= 1
    assert all(
        cache.stats()["invalidations_received"] == 0 for cache in workers if cache is not listener
    )
    listener.close()  # another worker of the host takes over
    wait_for(lambda: sum(cache.is_listener for cache in workers if not cache.closed) == 1)


_WORKER = textwrap.dedent(
    """
    import sys, time
    from nearcache.drivers import RedisDriver, ShmDriver
    from nearcache.tiered import TieredCache
    l1 = ShmDriver(path=sys.argv[1], size="4MiB")
    cache = TieredCache(l1, RedisDriver(sys.argv[2], prefix="app:"), invalidation="stream")
    while not cache.is_listener:
        time.sleep(0.005)
    # Connected means the listener has saved its starting position: a kill
    # before that would leave the survivor nothing to replay from.
    assert cache.wait_ready(60)
    print("listening", flush=True)
    time.sleep(600)
    """
)


def test_listener_killed_hands_over_and_replays(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer, tmp_path: Path
) -> None:
    writer = hosts("w")
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(tmp_path / "host-a"), private_redis_server.url],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert worker.stdout is not None and worker.stdout.readline().strip() == "listening"
        survivor = hosts("a")  # same L1 file: loses the election
        assert survivor.wait_ready(BOUND) and not survivor.is_listener
        survivor.l1.set("unrelated", "kept")  # only in L1: gone if L1 is cleared
        writer.set("k", "old")
        assert survivor.get("k") == "old"
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
        writer.set("k", "new")  # while the host may have no listener
        wait_for(lambda: survivor.is_listener)
        wait_for(lambda: survivor.get("k") == "new")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
    stats = survivor.stats()["invalidation"]
    assert stats["resyncs"] == 0  # replayed from the position the dead listener saved
    assert survivor.l1.get("unrelated") == "kept"  # L1 not cleared


def test_a_reconnecting_listener_replays_without_clearing(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    a, b = hosts("a"), hosts("b")
    assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
    b.set("k", 1)
    assert a.get("k") == 1
    a.l1.set("mine", "kept")  # only in L1: gone if L1 is cleared
    invalidator = a.invalidator
    assert isinstance(invalidator, StreamInvalidator)
    errors = invalidator.errors
    private_redis_server.pause()  # the listener's XREAD times out: it reconnects
    wait_for(lambda: invalidator.errors > errors)
    private_redis_server.resume()
    for i in range(50):
        b.set(f"other{i}", i)
    b.set("k", 2)
    wait_for(lambda: a.get("k") == 2)
    assert a.l1.get("mine") == "kept"
    assert invalidator.resyncs == 1  # only the first start


def test_trimmed_history_clears_l1(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer, tmp_path: Path
) -> None:
    a, b = hosts("a"), hosts("b")
    assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
    b.set("k", 1)
    assert a.get("k") == 1
    invalidator = a.invalidator
    assert isinstance(invalidator, StreamInvalidator)
    a.close()  # host a's only process stops; its L1 file keeps k and the position
    b.set("k", 2)
    raw = redis.Redis.from_url(private_redis_server.url)
    raw.xtrim(invalidator.stream, maxlen=0, approximate=False)  # the history is gone
    raw.close()
    again = hosts("a")
    assert again.wait_ready(BOUND)
    assert again.get("k") == 2  # L1 was cleared: read from L2
    assert again.stats()["invalidation"]["resyncs"] == 1


def test_a_restarted_server_clears_l1(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    a = hosts("a", circuit_breaker=False)
    assert a.wait_ready(BOUND)
    a.set("k", 1)
    invalidator = a.invalidator
    assert isinstance(invalidator, StreamInvalidator)
    private_redis_server.stop()
    private_redis_server.start()  # empty: no stream, no incarnation token
    wait_for(lambda: invalidator.resyncs == 2)
    assert a.l1.get("k") is None
    assert a.get("k") is None


def test_l1_private_to_the_process_listens_in_every_process(
    private_redis_server: RedisServer,
) -> None:
    caches = [
        TieredCache(
            MemoryDriver(),
            RedisDriver(private_redis_server.url, prefix="p:"),
            invalidation="stream",
        )
        for _ in range(2)
    ]
    try:
        assert all(cache.is_listener and cache.wait_ready(BOUND) for cache in caches)
        caches[0].set("k", 1)
        assert caches[1].get("k") == 1
        caches[0].set("k", 2)
        wait_for(lambda: caches[1].get("k") == 2)
    finally:
        for cache in caches:
            cache.close()


def test_election_survives_fork(tmp_path: Path) -> None:
    election = ListenerElection(tmp_path / "lock")
    elected: list[int] = []
    election.start(lambda: elected.append(os.getpid()))
    assert election.wait_elected(BOUND)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child must not think it holds the parent's lock
        time.sleep(0.1)
        os.write(write, b"1" if not election.elected else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1"
    assert election.elected and election.holder() == os.getpid()
    election.close()


def test_stream_ids_and_bad_options() -> None:
    assert stream_id(b"1700000000000-3") == (1700000000000, 3)
    assert stream_id("5") == (5, 0)
    assert stream_id("10-0") > stream_id("9-99")
    with pytest.raises(ValueError, match="history"):
        StreamInvalidator(None, history=0)
    with pytest.raises(ValueError, match="stream"):
        TieredCache(MemoryDriver(), MemoryDriver(), invalidation="stream")


# ---------------------------------------------------------------- CLIENT TRACKING


def test_tracking_mode_needs_no_publish(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    from nearcache.tiered.tracking import TrackingInvalidator

    a, b = hosts("a", invalidation="tracking"), hosts("b", invalidation="tracking")
    assert isinstance(a.invalidator, TrackingInvalidator)
    assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
    a.set("k", 1)
    assert b.get("k") == 1
    a.set("k", 2)
    wait_for(lambda: b.get("k") == 2)
    a.delete("k")
    wait_for(lambda: b.get("k") is None)
    assert a.stats()["invalidations_sent"] == 0  # the server told b, not a
    raw = redis.Redis.from_url(private_redis_server.url)
    a.set("outside", "v1")
    # the server's notice of a's write may reach b after b's first read and
    # drop that copy (as designed): read until the copy stays
    wait_for(lambda: b.get("outside") == "v1" and b.l1.get("outside") == "v1")
    raw.set("app:outside", b"2")  # written by another client, not through nearcache
    wait_for(lambda: b.l1.get("outside") is None)
    raw.set("elsewhere", b"1")  # outside the prefix: not tracked
    resyncs = b.stats()["resyncs"]
    raw.client_kill_filter(_type="pubsub")  # tracking resumes, L1 cleared
    raw.close()
    wait_for(lambda: b.stats()["resyncs"] > resyncs)


def test_tracking_needs_a_single_redis() -> None:
    with pytest.raises(ValueError, match="tracking"):
        TieredCache(MemoryDriver(), MemoryDriver(), invalidation="tracking")


def test_a_lone_entry_is_not_held_back_by_the_batch_pause(
    hosts: Callable[..., TieredCache], private_redis_server: RedisServer, tmp_path: Path
) -> None:
    # As with pub/sub: the pause follows only a batch of several entries.
    a = hosts("a")
    l1 = ShmDriver(path=tmp_path / "host-b", size="4MiB")
    l2 = RedisDriver(private_redis_server.url, prefix="app:")
    slow = StreamInvalidator(l2.client, "nearcache:invalidate:app:", batch_interval=60.0)
    b = TieredCache(l1, l2, invalidation=slow)
    try:
        assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
        for round_ in range(3):
            before = slow.received
            a.set("k", round_)
            wait_for(lambda before=before: slow.received > before)  # b read a's write (alone)
            assert b.get("k") == round_ and b.l1.contains("k")
            a.set("k", f"new {round_}")
            wait_for(lambda: not b.l1.contains("k"))
    finally:
        b.close()


def test_a_listener_that_applied_nothing_yet_replays_from_the_start() -> None:
    # A listener that started before the stream had an entry saved 0-0; killed
    # before it read the first entries, its successor replays them all (no
    # entry ever added is gone) instead of clearing L1. It cleared L1 before:
    # no entry 0-0 is in the stream to prove the history whole.
    whole = {
        "length": 2,
        "entries-added": 2,
        "first-entry": (b"5-0", {}),
        "max-deleted-entry-id": b"0-0",
    }
    assert _intact(whole, (0, 0))
    trimmed = {**whole, "length": 1, "entries-added": 3, "first-entry": (b"9-0", {})}
    assert not _intact(trimmed, (0, 0))
    deleted = {**whole, "length": 1, "max-deleted-entry-id": b"5-0"}
    assert not _intact(deleted, (0, 0))
    old_redis = {k: v for k, v in whole.items() if k != "entries-added"}
    assert not _intact(old_redis, (0, 0))  # no count of entries added: clear L1
    assert _intact(whole, (5, 0)) and not _intact(trimmed, (5, 0))
