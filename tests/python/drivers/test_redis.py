"""RedisDriver specifics: prefix-only clear, stored format, security, timeouts."""

from __future__ import annotations

import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from nearcache.drivers import BackendError, RedisDriver
from nearcache.testing import RedisServer

SIGNING_KEY = b"0123456789abcdef0123456789abcdef"


@pytest.fixture
def raw(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def test_clear_removes_only_its_prefix(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    mine = RedisDriver(redis_server.url, prefix=unique_prefix + "mine:")
    other = RedisDriver(redis_server.url, prefix=unique_prefix + "other:")
    mine.set_many({f"k{i}": i for i in range(2500)})  # several SCAN batches
    other.set("k1", "kept")
    raw.set(unique_prefix + "unprefixed", b"kept")
    mine.clear()
    assert mine.get_many([f"k{i}" for i in range(2500)]) == {}
    assert other.get("k1") == "kept"
    assert raw.get(unique_prefix + "unprefixed") == b"kept"
    mine.close()
    other.close()


def test_glob_characters_in_the_prefix_are_literal(
    redis_server: RedisServer, unique_prefix: str
) -> None:
    star = RedisDriver(redis_server.url, prefix=unique_prefix + "a*")
    literal = RedisDriver(redis_server.url, prefix=unique_prefix + "ab")
    odd = RedisDriver(redis_server.url, prefix=unique_prefix + "[x]?\\")
    literal.set("k", 1)
    odd.set("k", 2)
    star.set("k", 3)
    star.clear()
    assert literal.get("k") == 1
    assert odd.get("k") == 2
    odd.clear()
    assert odd.get("k") is None
    assert literal.get("k") == 1


def test_stored_format_is_readable_by_other_clients(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    driver = RedisDriver(redis_server.url, prefix=unique_prefix)
    driver.set("n", 41, ttl=60)
    driver.set("s", "text")
    driver.set(7, b"int key")
    assert raw.get(unique_prefix + "n") == b"41"
    assert raw.incr(unique_prefix + "n") == 42  # counters are plain Redis integers
    assert driver.get("n") == 42
    assert 0 < raw.pttl(unique_prefix + "n") <= 60_000
    assert raw.get(unique_prefix + "s") == b"\x01text"
    assert raw.get(unique_prefix.encode() + b"\xff7") == b"\x00int key"


def test_foreign_and_other_serializer_values_are_misses(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    pickler = RedisDriver(redis_server.url, prefix=unique_prefix)
    jsoner = RedisDriver(redis_server.url, prefix=unique_prefix, serializer="json")
    pickler.set("obj", {"a": (1, 2)})
    assert jsoner.get("obj", "miss") == "miss"  # never unpickled
    assert jsoner.stats()["rejected"] == 1
    raw.set(unique_prefix + "foreign", b"plain text written by someone else")
    assert pickler.get("foreign", "miss") == "miss"
    jsoner.set("j", {"a": [1]})
    assert jsoner.get("j") == {"a": [1]}


def test_signing_rejects_planted_values(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    signed = RedisDriver(redis_server.url, prefix=unique_prefix, signing_key=SIGNING_KEY)
    signed.set("obj", [1, 2])
    assert signed.get("obj") == [1, 2]
    unsigned_pickle = b"\x10" + (16 | 1 << 8).to_bytes(4, "little") + pickle.dumps("evil")
    raw.set(unique_prefix + "obj", unsigned_pickle)
    assert signed.get("obj", "miss") == "miss"
    assert signed.get_many(["obj"]) == {}
    # A valid signed value moved to another key does not verify either.
    signed.set("a", "for a")
    raw.copy(unique_prefix + "a", unique_prefix + "b")
    assert signed.get("b", "miss") == "miss"
    assert signed.stats()["rejected"] == 3
    assert signed.incr("counter") == 1  # counters stay plain integers


def test_compression(redis_server: RedisServer, raw: redis.Redis, unique_prefix: str) -> None:
    driver = RedisDriver(redis_server.url, prefix=unique_prefix, compress="zstd")
    page = "<p>lorem ipsum</p>" * 1000
    driver.set("page", page)
    assert len(raw.get(unique_prefix + "page") or b"") < len(page) // 4
    assert driver.get("page") == page


def test_a_given_client_is_used_and_left_open(redis_server: RedisServer) -> None:
    client = redis.Redis.from_url(redis_server.url)
    driver = RedisDriver(client=client, prefix="given:")
    driver.set("k", 1)
    driver.close()
    assert client.get("given:k") == b"1"
    client.delete("given:k")
    client.close()


def test_password_is_redacted() -> None:
    driver = RedisDriver("redis://user:secret@127.0.0.1:1/0")
    assert "secret" not in repr(driver)
    assert "secret" not in str(driver.stats())


def test_a_stopped_server_fails_fast(tmp_path: Path) -> None:
    server = RedisServer(workdir=tmp_path)
    server.start()
    driver = RedisDriver(server.url, socket_timeout=0.5, connect_timeout=0.5)
    driver.set("k", 1)
    server.stop()
    with pytest.raises(BackendError) as info:
        driver.get("k")
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
    server.start()
    assert driver.get("k") is None  # the restarted server is empty, and reachable
    driver.close()
    server.close()


def test_a_frozen_server_times_out(private_redis_server: RedisServer) -> None:
    driver = RedisDriver(private_redis_server.url, socket_timeout=0.3, connect_timeout=0.3)
    driver.set("k", 1)
    private_redis_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(BackendError):
            driver.get("k")
        with pytest.raises(BackendError):
            driver.incr("n")
        assert time.monotonic() - started < 2.0
    finally:
        private_redis_server.resume()
    assert driver.get("k") == 1
    driver.close()


# -------------------------------------------------- writes sent straight on a connection


def _clients_named(raw: redis.Redis, name: str) -> int:
    return sum(1 for client in raw.client_list() if client.get("name") == name)


def test_an_error_reply_leaves_the_connection_in_step(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    driver = RedisDriver(redis_server.url, prefix=unique_prefix)
    driver.set("kept", "value", ttl=60)
    raw.rpush(unique_prefix + "a-list", b"x")  # GET on it is an error reply; PTTL is not
    for _ in range(3):
        with pytest.raises(BackendError, match="WRONGTYPE"):
            driver.get_with_ttl("a-list")
        value, left = driver.get_with_ttl("kept")  # the PTTL reply was read, not left behind
        assert value == "value" and left is not None and 0 < left <= 60
    driver.close()


def test_pipelined_writes_reuse_one_connection_and_give_it_back(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    name = unique_prefix.strip(":").replace(":", "-") + "-conn"
    driver = RedisDriver(redis_server.url, prefix=unique_prefix, client_name=name)
    for i in range(200):
        driver.set(f"k{i}", i)
        driver.set_and_publish(f"k{i}", i, None, b"some-channel", b"message")
    assert driver.get_many([f"k{i}" for i in range(200)]) == {f"k{i}": i for i in range(200)}
    # one connection kept for the writes, one in the pool for MGET: not one per write
    assert _clients_named(raw, name) == 2
    given = redis.Redis.from_url(redis_server.url, client_name=name + "-given")
    borrowing = RedisDriver(client=given, prefix=unique_prefix)
    borrowing.set("k", 1)
    borrowing.close()  # hands its connection back to the caller's pool
    pool = given.connection_pool
    assert len(pool._in_use_connections) == 0  # type: ignore[attr-defined]
    given.close()
    driver.close()


def test_a_forked_child_writes_on_its_own_connection(
    redis_server: RedisServer, unique_prefix: str
) -> None:
    import multiprocessing

    driver = RedisDriver(redis_server.url, prefix=unique_prefix)
    driver.set("before", 0)

    def child() -> None:
        for i in range(50):
            driver.set(f"child-{i}", i)

    process = multiprocessing.get_context("fork").Process(target=child)
    process.start()
    for i in range(50):
        driver.set(f"parent-{i}", i)
        assert driver.get_with_ttl(f"parent-{i}") == (i, None)
    process.join(30)
    assert process.exitcode == 0
    assert driver.get_many([f"child-{i}" for i in range(50)]) == {
        f"child-{i}": i for i in range(50)
    }
    driver.close()


def test_scripts_are_loaded_again_after_a_script_flush(
    redis_server: RedisServer, raw: redis.Redis, unique_prefix: str
) -> None:
    driver = RedisDriver(redis_server.url, prefix=unique_prefix)
    stream = (unique_prefix + "stream").encode()
    entry = {"name": stream, "maxlen": 100, "fields": {b"m": b"one"}}
    driver.set_and_append("k", 1, None, entry)
    raw.script_flush()
    driver.set_and_append("k", 2, None, entry)
    assert driver.delete_and_append("k", entry) is True
    assert raw.xlen(stream) == 3
    assert driver.get("k") is None
    driver.close()


def test_a_small_pool_is_not_starved_by_kept_connections(
    redis_server: RedisServer, unique_prefix: str
) -> None:
    import threading

    driver = RedisDriver(redis_server.url, prefix=unique_prefix, max_connections=2)
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(100):
                driver.set(f"{n}-{i}", i)
                assert driver.get(f"{n}-{i}") == i  # a pool command beside the kept ones
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    driver.close()
