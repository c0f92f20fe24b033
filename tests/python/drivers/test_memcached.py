"""MemcachedDriver specifics: the key hashing rule, counters, deadline headers,
several servers, timeouts."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pymemcache.client.base import Client

from nearcache.drivers import BackendError, MemcachedDriver
from nearcache.drivers.base import NotACounterError
from nearcache.drivers.codec import TAG_DEADLINE, StoreCodec, split_deadline, with_deadline
from nearcache.drivers.memcached import memcached_key
from nearcache.testing import MemcachedServer


@pytest.fixture
def raw(memcached_server: MemcachedServer) -> Iterator[Client]:
    client = Client(memcached_server.address, default_noreply=False)  # writes are seen at once
    yield client
    client.close()


def hashed(prefix: bytes, key: bytes) -> bytes:
    return prefix + b"#" + hashlib.sha256(key).hexdigest().encode()


@pytest.mark.parametrize(
    ("key", "sent"),
    [
        (b"plain:key-1", b"p:plain:key-1"),
        (b"x" * 248, b"p:" + b"x" * 248),
        (b"x" * 249, hashed(b"p:", b"x" * 249)),  # 251 bytes with the prefix
        (b"with space", hashed(b"p:", b"with space")),
        (b"new\nline", hashed(b"p:", b"new\nline")),
        (b"del\x7f", hashed(b"p:", b"del\x7f")),
        ("ключ".encode(), hashed(b"p:", "ключ".encode())),
        (b"\xff42", hashed(b"p:", b"\xff42")),  # int keys
        (b"#abc", hashed(b"p:", b"#abc")),  # could pass for a hash: hashed too
    ],
)
def test_key_rule(key: bytes, sent: bytes) -> None:
    assert memcached_key(b"p:", key) == sent
    assert len(sent) <= 250


def test_prefix_rule() -> None:
    with pytest.raises(ValueError):
        MemcachedDriver(prefix="has space")
    with pytest.raises(ValueError):
        MemcachedDriver(prefix="p" * 186)
    MemcachedDriver(prefix="p" * 185).close()


def test_keys_as_memcached_sees_them(
    memcached_server: MemcachedServer, raw: Client, unique_prefix: str
) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix=unique_prefix)
    driver.set("simple", "v")
    driver.set("with space", 41)
    prefix = unique_prefix.encode()
    assert raw.get(prefix + b"simple") == b"\x11" + bytes(8) + b"\x01v"  # never expires
    assert raw.get(hashed(prefix, b"with space")) == b"41"
    assert raw.incr(hashed(prefix, b"with space"), 1) == 42
    assert driver.get("with space") == 42


def test_counters_keep_their_ttl(
    memcached_server: MemcachedServer, raw: Client, unique_prefix: str
) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix=unique_prefix)
    driver.set("n", 10, ttl=100)
    assert driver.incr("n", 5) == 15  # memcached's own incr
    assert driver.decr("n", 20) == -5  # compare-and-swap below zero
    assert driver.incr("n", 1) == -4  # a negative counter: compare-and-swap again
    left = driver.get_with_ttl("n")[1]
    assert left is not None and 95 <= left <= 102


def test_values_over_the_item_size_are_refused_before_sending(
    memcached_server: MemcachedServer, unique_prefix: str
) -> None:
    driver = MemcachedDriver(memcached_server.address, prefix=unique_prefix, max_value_size=1000)
    driver.set("k", "small")
    with pytest.raises(ValueError):
        driver.set("k", b"x" * 1000)
    assert driver.get("k") == "small"


def test_several_servers_share_the_keys(tmp_path: Path, unique_prefix: str) -> None:
    with MemcachedServer(workdir=tmp_path) as one, MemcachedServer(workdir=tmp_path) as two:
        driver = MemcachedDriver([one.address, two.address], prefix=unique_prefix)
        items = {f"key-{i}": i for i in range(200)}
        driver.set_many(items)
        assert driver.get_many(list(items)) == items
        per_server = []
        for server in (one, two):
            client = Client(server.address)
            keys = [memcached_key(unique_prefix.encode(), k.encode()) for k in items]
            per_server.append(len(client.get_many(keys)))
            client.close()
        assert sum(per_server) == 200
        assert min(per_server) > 50  # spread, not all on one server
        assert driver.delete_many(list(items)) == 200
        assert driver.incr("counter") == 1
        driver.clear()
        driver.close()


def test_a_stopped_or_frozen_server_fails_fast(tmp_path: Path) -> None:
    server = MemcachedServer(workdir=tmp_path)
    server.start()
    driver = MemcachedDriver(server.address, timeout=0.3, connect_timeout=0.3)
    driver.set("k", 1)
    server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError):
            driver.get("k")
        assert time.monotonic() - started < 2.0
    finally:
        server.resume()
    assert driver.get("k") == 1
    server.stop()
    with pytest.raises(BackendError):
        driver.get("k")
    with pytest.raises(BackendError):
        driver.set("k", 2)
    driver.close()
    server.close()


# ---------------------------------------------------------------- deadline headers


def stored(value: Any, deadline_ms: int) -> bytes:
    """What the driver stores for a non-counter ``value`` expiring at ``deadline_ms``."""
    return with_deadline(StoreCodec().encode(value, b""), deadline_ms)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def driver(memcached_server: MemcachedServer, unique_prefix: str) -> Iterator[MemcachedDriver]:
    with MemcachedDriver(memcached_server.address, prefix=unique_prefix) as made:
        yield made


def test_values_carry_their_deadline_counters_do_not(driver: MemcachedDriver, raw: Client) -> None:
    prefix = driver.prefix
    before = now_ms()
    driver.set("ttl", "v", ttl=60)
    driver.set("forever", "v", ttl=0)
    driver.set("counter", 41, ttl=60)
    after = now_ms()
    data = raw.get(prefix + b"ttl")
    deadline, inner = split_deadline(data)
    assert data[0] == TAG_DEADLINE and inner == b"\x01v"
    assert deadline is not None and before + 60_000 <= deadline <= after + 60_000
    assert raw.get(prefix + b"forever") == b"\x11" + bytes(8) + b"\x01v"
    assert raw.get(prefix + b"counter") == b"41"  # memcached's incr still works on it
    assert driver.ttl_resolution == 0.001
    assert driver.counter_ttl_resolution == 2.0


def test_a_short_ttl_expires_to_the_millisecond(driver: MemcachedDriver, raw: Client) -> None:
    """memcached holds the items ~2 s (exptime ceil(0.3) + 1); the driver sees them gone."""
    names = ["get", "many", "with-ttl", "many-with-ttl", "has", "add", "touch", "replace"]
    names += ["delete", "pop", "incr"]
    written = time.monotonic()
    driver.set_many({name: {"value": name} for name in names}, ttl=0.3)
    assert driver.get("get") == {"value": "get"}
    time.sleep(0.5)
    still_held = time.monotonic() - written < 0.95  # memcached keeps them at least 1 s
    if still_held:
        assert raw.get(driver.prefix + b"get") is not None
    assert driver.get("get", "miss") == "miss"
    assert driver.get_many(["many", "get"]) == {}
    assert driver.get_with_ttl("with-ttl", "miss") == ("miss", None)
    assert driver.get_many_with_ttl(["many-with-ttl", "with-ttl"]) == {}
    assert "has" not in driver
    assert driver.add("add", "new", ttl=60) is True
    assert driver.get("add") == "new"
    assert driver.touch("touch", 60) is False
    assert driver.replace("replace", "new") is False
    assert driver.delete("delete") is False
    assert driver.pop("pop", "miss") == "miss"
    assert driver.incr("incr", 2) == 2
    assert driver.get_many(names) == {"add": "new", "incr": 2}


def test_get_with_ttl_is_precise(driver: MemcachedDriver) -> None:
    driver.set("k", "v", ttl=1.5)
    driver.set("j", b"w", ttl=0.75)
    driver.set("forever", "f")
    value, left = driver.get_with_ttl("k")
    assert value == "v" and left is not None and 1.0 < left <= 1.5  # was 2 or 3 whole seconds
    found = driver.get_many_with_ttl(["k", "j", "forever", "missing"])
    assert set(found) == {"k", "j", "forever"}
    assert 1.0 < found["k"][1] <= 1.5  # type: ignore[operator]
    assert found["j"][0] == b"w" and 0.25 < found["j"][1] <= 0.75  # type: ignore[operator]
    assert found["forever"] == ("f", None)


def test_touch_moves_the_deadline_both_ways(driver: MemcachedDriver, raw: Client) -> None:
    driver.set("extended", "v", ttl=0.3)
    assert driver.touch("extended", 30)
    driver.set("shortened", "v", ttl=60)
    assert driver.touch("shortened", 0.3)
    driver.set("forever", "v", ttl=0.3)
    assert driver.touch("forever", 0)
    written = time.monotonic()
    left = driver.get_with_ttl("extended")[1]
    assert left is not None and 29 < left <= 30
    assert raw.get(driver.prefix + b"forever") == b"\x11" + bytes(8) + b"\x01v"
    time.sleep(0.5)
    assert driver.get("extended") == "v"
    if time.monotonic() - written < 0.95:
        assert raw.get(driver.prefix + b"shortened") is not None  # memcached still holds it
    assert driver.get("shortened") is None
    assert driver.get_with_ttl("forever") == ("v", None)


def test_expired_entries_planted_in_memcached(driver: MemcachedDriver, raw: Client) -> None:
    """Items memcached still holds whose deadline passed: no entry, for every call."""
    prefix = driver.prefix
    past = now_ms() - 1000
    for name in ("get", "add", "touch", "replace", "delete", "incr", "decr", "many"):
        raw.set(prefix + name.encode(), stored(name, past), expire=100)
    assert driver.get("get") is None
    assert driver.get_with_ttl("get") == (None, None)
    assert driver.get_many(["get", "many"]) == {}
    assert driver.get_many_with_ttl(["get", "many"]) == {}
    assert not driver.contains("get")
    assert driver.add("add", "new") is True
    assert driver.get("add") == "new"
    assert driver.touch("touch", 60) is False
    assert driver.replace("replace", "new") is False
    assert raw.get(prefix + b"replace") == stored("replace", past)  # left as it was
    assert driver.delete("delete") is False
    assert raw.get(prefix + b"delete") is None  # dropped all the same
    assert driver.delete_many(["many", "get"]) == 0
    assert driver.incr("incr", 3) == 3
    assert driver.decr("decr", 3) == -3
    raw.set(prefix + b"incr", stored("x", past), expire=100)
    with pytest.raises(KeyError):
        driver.incr("incr", default=None)
    assert driver.stats()["rejected"] == 0


def test_racing_adds_over_an_expired_entry_store_once(driver: MemcachedDriver, raw: Client) -> None:
    def race(key: str, racers: int) -> list[int]:
        """Which of ``racers`` threads, started at once, added ``key``."""
        barrier = threading.Barrier(racers)
        wins: list[int] = []

        def add(n: int) -> None:
            barrier.wait()
            if driver.add(key, f"from {n}", ttl=60):
                wins.append(n)

        threads = [threading.Thread(target=add, args=(n,)) for n in range(racers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        return wins

    for round_ in range(5):
        key = f"race-{round_}"
        raw.set(driver.prefix + key.encode(), stored("old", now_ms() - 1), expire=100)
        wins = race(key, 4)
        assert len(wins) == 1
        assert driver.get(key) == f"from {wins[0]}"


def test_values_of_an_older_nearcache_still_read(driver: MemcachedDriver, raw: Client) -> None:
    """No header: memcached's own expiry, seconds left from memcached."""
    prefix = driver.prefix
    raw.set(prefix + b"old", b"\x01text", expire=100)
    raw.set(prefix + b"object", StoreCodec().encode([1, 2], b""), expire=0)
    assert driver.get("old") == "text"
    assert driver.get_many(["old", "object"]) == {"old": "text", "object": [1, 2]}
    value, left = driver.get_with_ttl("old")
    assert value == "text" and left is not None and 98 <= left <= 100
    assert driver.get_many_with_ttl(["object"]) == {"object": ([1, 2], None)}
    assert driver.add("old", "new") is False
    assert driver.touch("old", 30)  # now with a header
    assert split_deadline(raw.get(prefix + b"old"))[1] == b"\x01text"
    assert 29 < driver.get_with_ttl("old")[1] <= 30  # type: ignore[operator]
    assert driver.replace("object", "new") is True
    assert driver.delete("old") is True


@pytest.mark.parametrize(
    "data",
    [
        b"\x11",  # the tag alone
        b"\x11\x01\x02\x03",  # a truncated deadline
        b"\x11" + bytes(8),  # a header around nothing
        b"\x11" + bytes(8) + b"42",  # around a counter
        b"\x11" + bytes(8) + b"\x11" + bytes(8) + b"\x01v",  # around another header
        b"\x11" + b"\xff" * 8 + b"\x7fjunk",  # a far deadline around foreign bytes
    ],
)
def test_hostile_headers_are_rejected_as_misses(
    driver: MemcachedDriver, raw: Client, data: bytes
) -> None:
    mk = driver.prefix + b"bad"
    raw.set(mk, data, expire=100)
    assert driver.get("bad", "miss") == "miss"
    assert driver.get_many(["bad"]) == {}
    assert driver.get_with_ttl("bad", "miss") == ("miss", None)
    assert driver.get_many_with_ttl(["bad"]) == {}
    assert "bad" not in driver
    assert driver.stats()["rejected"] == 5
    with pytest.raises(NotACounterError):
        driver.incr("bad")
    assert driver.add("bad", "new") is False  # an entry is there, unreadable
    assert raw.get(mk) == data
    assert driver.set("bad", "good") is None
    assert driver.get("bad") == "good"


def test_counters_keep_whole_seconds(driver: MemcachedDriver, raw: Client) -> None:
    driver.set("n", 5, ttl=0.3)
    assert raw.get(driver.prefix + b"n") == b"5"
    assert driver.incr("n") == 6  # memcached's own incr
    left = driver.get_with_ttl("n")[1]
    assert left is not None and 1 <= left <= 2  # memcached's whole seconds (ceil + 1)
    assert driver.touch("n", 60)  # memcached's touch
    left = driver.get_with_ttl("n")[1]
    assert left is not None and 59 <= left <= 61
