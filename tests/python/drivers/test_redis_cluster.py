"""Redis Cluster and Sentinel as cache servers: the contract, node restart, resharding, failover.

Real servers on loopback: a three-primary cluster made with ``redis-cli
--cluster create`` (one per module), and a primary, a replica and three
sentinels (one per test that kills the primary).
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from nearcache.config import from_url
from nearcache.drivers import BackendError, MemoryDriver
from nearcache.drivers.redis import RedisClusterDriver, RedisSentinelDriver
from nearcache.errors import ConfigurationError
from nearcache.testing import DriverContract
from nearcache.testing.servers import RedisClusterServers, RedisSentinelServers
from nearcache.tiered import TieredCache

_numbers = itertools.count()
BOUND = 30.0


def wait_for(condition: Callable[[], bool], timeout: float = BOUND) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


def _require_cluster_tools() -> None:
    import os

    if RedisClusterServers.available() is not None:
        return
    message = "redis-server and redis-cli are needed (apt-get install redis-server redis-tools)"
    if os.environ.get("CI") or os.environ.get("NEARCACHE_REQUIRE_SERVERS"):
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    _require_cluster_tools()
    with RedisClusterServers(workdir=tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


@pytest.fixture
def sentinel(tmp_path: Path) -> Iterator[RedisSentinelServers]:
    _require_cluster_tools()
    with RedisSentinelServers(workdir=tmp_path / "sentinel") as servers:
        yield servers


# ------------------------------------------------------------------------- contract


class TestClusterContract(DriverContract):
    @pytest.fixture(autouse=True)
    def _cluster(self, cluster: RedisClusterServers, unique_prefix: str) -> None:
        self.nodes = cluster.addresses
        self.prefix = unique_prefix

    def make_driver(self, **options: Any) -> RedisClusterDriver:
        return RedisClusterDriver(self.nodes, prefix=f"{self.prefix}{next(_numbers)}:", **options)


class TestTieredOverClusterContract(DriverContract):
    @pytest.fixture(autouse=True)
    def _cluster(self, cluster: RedisClusterServers, unique_prefix: str) -> None:
        self.nodes = cluster.addresses
        self.prefix = unique_prefix

    def make_driver(self, **options: Any) -> TieredCache:
        l2 = RedisClusterDriver(self.nodes, prefix=f"{self.prefix}{next(_numbers)}:", **options)
        return TieredCache(MemoryDriver(), l2)


# ------------------------------------------------------------------------- cluster


def test_keys_spread_over_every_primary(cluster: RedisClusterServers, unique_prefix: str) -> None:
    driver = RedisClusterDriver(cluster.url.removeprefix("redis+cluster://"), prefix=unique_prefix)
    items = {f"k{i}": i for i in range(300)}
    driver.set_many(items)
    assert driver.get_many(list(items)) == items
    for node in cluster.nodes:
        client = redis.Redis(host=node.host, port=node.port)
        assert client.dbsize() > 0
        client.close()
    assert driver.delete_many(list(items)) == 300
    driver.close()


def test_url_and_dict_configuration(cluster: RedisClusterServers, unique_prefix: str) -> None:
    driver = from_url(f"{cluster.url}?prefix={unique_prefix}&timeout=0.5")
    assert isinstance(driver, RedisClusterDriver)
    driver.set("k", "v")
    assert driver.get("k") == "v"
    driver.close()
    with pytest.raises(ConfigurationError, match="unknown option 'prefx'"):
        from_url(f"{cluster.url}?prefx=a")
    with pytest.raises(ConfigurationError, match="host:port"):
        from_url("redis+cluster://127.0.0.1")


def test_a_cluster_that_is_down_fails_calls_not_construction() -> None:
    driver = RedisClusterDriver("127.0.0.1:1", connect_timeout=0.2, socket_timeout=0.2)
    with pytest.raises(BackendError):
        driver.get("k")
    driver.close()


def _traffic(
    cache: TieredCache, stop: threading.Event, errors: list[str], written: dict[str, int]
) -> None:
    counter = itertools.count()
    while not stop.is_set():
        n = next(counter)
        key = f"key{n % 200}"
        try:
            cache.set(key, n)
            written[key] = n
            cache.get(f"key{(n * 7) % 200}")
        except BackendError as exc:
            errors.append(str(exc))


def test_resharding_during_traffic(cluster: RedisClusterServers, unique_prefix: str) -> None:
    l2 = RedisClusterDriver(cluster.addresses, prefix=unique_prefix)
    failures: list[str] = []
    cache = TieredCache(
        MemoryDriver(),
        l2,
        on_get_error=lambda exc, op, key: failures.append(f"{op}: {exc}"),
        on_set_error=lambda exc, op, key: failures.append(f"{op}: {exc}"),
    )
    stop, errors, written = threading.Event(), list[str](), dict[str, int]()
    worker = threading.Thread(target=_traffic, args=(cache, stop, errors, written))
    worker.start()
    try:
        time.sleep(0.2)
        cluster.reshard(cluster.nodes[0], cluster.nodes[1], 1000)  # ~16 s of keys move
        cluster.reshard(cluster.nodes[1], cluster.nodes[0], 1000)
        time.sleep(0.2)
    finally:
        stop.set()
        worker.join()
    assert not errors and not failures, (errors + failures)[:5]
    assert len(written) == 200
    assert cache.l2.get_many(list(written)) == written  # every last write landed in L2
    cache.close()


def test_a_node_restart_during_traffic(tmp_path: Path, unique_prefix: str) -> None:
    _require_cluster_tools()
    with RedisClusterServers(workdir=tmp_path / "cluster") as own:
        l2 = RedisClusterDriver(own.addresses, prefix=unique_prefix, socket_timeout=1.0)
        failed: list[str] = []
        cache = TieredCache(
            MemoryDriver(),
            l2,
            on_get_error=lambda exc, op, key: failed.append(f"{op}: {exc}"),
            on_set_error=lambda exc, op, key: failed.append(f"{op}: {exc}"),
            circuit_breaker={"backoff": 0.1, "max_backoff": 0.2},
        )
        stop, errors, written = threading.Event(), list[str](), dict[str, int]()
        worker = threading.Thread(target=_traffic, args=(cache, stop, errors, written))
        worker.start()
        try:
            time.sleep(0.2)
            own.nodes[2].stop()
            wait_for(lambda: len(failed) > 0)  # its slots fail, by the policy
            cache.l1.set("hot", 1)  # a copy only L1 has
            assert cache.get("hot") == 1  # L1 keeps serving
            own.nodes[2].start()  # the same member again (nodes.conf), without data
            own.wait_ok()

            def recovered() -> bool:  # every node takes writes again
                cache.set_many({f"probe{i}": i for i in range(50)})
                try:
                    return len(cache.l2.get_many([f"probe{i}" for i in range(50)])) == 50
                except BackendError:
                    return False

            wait_for(recovered)
            count = len(failed)
            time.sleep(0.5)
            failed_after = failed[count:]
        finally:
            stop.set()
            worker.join()
        assert not errors
        assert not failed_after, failed_after[:5]
        cache.set("after", "ok")
        assert cache.l2.get("after") == "ok"
        cache.close()


# ------------------------------------------------------------------------- sentinel


def test_sentinel_failover_during_traffic(
    sentinel: RedisSentinelServers, unique_prefix: str
) -> None:
    driver = from_url(f"{sentinel.url}?prefix={unique_prefix}&timeout=0.3&connect_timeout=0.3")
    assert isinstance(driver, RedisSentinelDriver)
    failed: list[str] = []
    cache = TieredCache(
        MemoryDriver(),
        driver,
        on_get_error=lambda exc, op, key: failed.append(op),
        on_set_error=lambda exc, op, key: failed.append(op),
        circuit_breaker={"backoff": 0.1, "max_backoff": 0.2},
    )
    cache.l1.set("hot", "cached")  # a copy only L1 has
    stop, errors, written = threading.Event(), list[str](), dict[str, int]()
    worker = threading.Thread(target=_traffic, args=(cache, stop, errors, written))
    worker.start()
    try:
        time.sleep(0.2)
        old = sentinel.kill_primary()
        wait_for(lambda: len(failed) > 0)  # L2 calls fail by the policy...
        assert cache.get("hot") == "cached"  # ...while L1 hits are served
        promoted = sentinel.wait_promoted(old.port)

        def reaches_promoted() -> bool:
            cache.set("after-failover", promoted.port)
            raw = redis.Redis(host=promoted.host, port=promoted.port)
            try:
                return raw.exists(unique_prefix + "after-failover") == 1
            finally:
                raw.close()

        wait_for(reaches_promoted)  # reconnected to the new primary on its own
    finally:
        stop.set()
        worker.join()
    assert not errors
    count = len(failed)
    for i in range(20):
        cache.set(f"later{i}", i)
        assert cache.get(f"later{i}") == i
    assert len(failed) == count
    assert cache.l2.get_many([f"later{i}" for i in range(20)]) == {
        f"later{i}": i for i in range(20)
    }
    cache.close()


def test_sentinel_url_errors() -> None:
    with pytest.raises(ConfigurationError, match="SERVICE"):
        from_url("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ConfigurationError, match="unknown option"):
        from_url("redis+sentinel://127.0.0.1:26379/svc?prefx=a")
    driver = from_url("redis+sentinel://user:secret@127.0.0.1:1/svc/3?timeout=0.2")
    assert isinstance(driver, RedisSentinelDriver)
    assert driver.url == "redis+sentinel://127.0.0.1:1/svc/3"
    with pytest.raises(BackendError):  # no sentinel answers
        driver.get("k")
    driver.close()


# ------------------------------------------------------------------ invalidation


def test_two_hosts_over_the_cluster_see_each_others_writes(
    cluster: RedisClusterServers, unique_prefix: str, tmp_path: Path
) -> None:
    from nearcache.drivers import ShmDriver
    from nearcache.tiered.stream import StreamInvalidator

    hosts = [
        TieredCache(
            ShmDriver(path=tmp_path / f"host{i}", size="4MiB"),
            RedisClusterDriver(cluster.addresses, prefix=unique_prefix),
        )
        for i in range(2)
    ]
    a, b = hosts
    try:
        assert isinstance(a.invalidator, StreamInvalidator)  # the default on a cluster
        assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
        for i in range(20):
            a.set(f"k{i}", "old")
            assert b.get(f"k{i}") == "old"
        for i in range(20):  # keys on every node; one stream, in order
            a.set(f"k{i}", "new")
        wait_for(lambda: all(b.get(f"k{i}") == "new" for i in range(20)))
    finally:
        for cache in hosts:
            cache.close()


def test_invalidations_survive_a_sentinel_failover(
    sentinel: RedisSentinelServers, unique_prefix: str, tmp_path: Path
) -> None:
    from nearcache.drivers import ShmDriver

    def host(name: str) -> TieredCache:
        driver = RedisSentinelDriver(
            [f"{s.host}:{s.port}" for s in sentinel.sentinels],
            sentinel.service,
            prefix=unique_prefix,
            socket_timeout=0.3,
            connect_timeout=0.3,
        )
        return TieredCache(
            ShmDriver(path=tmp_path / name, size="4MiB"),
            driver,
            on_get_error="ignore",
            on_set_error="ignore",
            circuit_breaker={"backoff": 0.1, "max_backoff": 0.2},
        )

    a, b = host("a"), host("b")
    try:
        assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
        a.set("k", 1)
        assert b.get("k") == 1
        raw = redis.Redis(host=sentinel.primary.host, port=sentinel.primary.port)
        raw.wait(1, 2000)  # the replica has everything so far
        raw.close()
        old = sentinel.kill_primary()
        sentinel.wait_promoted(old.port)

        def written() -> bool:
            a.set("k", 2)
            try:
                return bool(a.l2.get("k") == 2)
            except BackendError:  # L2 itself is not through the failover yet
                return False

        wait_for(written)
        wait_for(lambda: b.get("k") == 2)  # b's listener reconnected to the new primary
    finally:
        a.close()
        b.close()


def test_cluster_failover_keeps_invalidations_flowing(tmp_path: Path, unique_prefix: str) -> None:
    """A primary killed in a cluster with replicas: its replica is promoted, hosts carry on."""
    from nearcache.drivers import ShmDriver

    _require_cluster_tools()
    with RedisClusterServers(replicas_per_primary=1, workdir=tmp_path / "cluster") as own:

        def host(name: str) -> TieredCache:
            return TieredCache(
                ShmDriver(path=tmp_path / name, size="4MiB"),
                RedisClusterDriver(own.addresses, prefix=unique_prefix, socket_timeout=0.3),
                on_get_error="ignore",
                on_set_error="ignore",
                circuit_breaker={"backoff": 0.1, "max_backoff": 0.2},
            )

        a, b = host("a"), host("b")
        try:
            assert a.wait_ready(BOUND) and b.wait_ready(BOUND)
            a.set("k", 1)
            assert b.get("k") == 1
            stream = a.invalidator.stream  # type: ignore[union-attr]
            primary = a.l2.client.get_node_from_key(stream)  # type: ignore[attr-defined]
            owner = next(node for node in own.nodes if node.port == primary.port)
            for node in own.nodes:  # replicas have everything so far
                raw = redis.Redis(host=node.host, port=node.port)
                if raw.info("replication")["role"] == "master":
                    assert raw.wait(1, int(BOUND * 1000)) == 1
                raw.close()
            owner.kill()

            def written() -> bool:
                a.set("k", 2)
                try:
                    return bool(a.l2.get("k") == 2)
                except BackendError:  # L2 itself is not through the failover yet
                    return False

            wait_for(written)  # the replica was promoted; the slot map refreshed
            wait_for(lambda: b.get("k") == 2)  # b's listener resumed on the promoted node
            assert b.invalidator.stats()["resyncs"] == 1  # type: ignore[union-attr]
        finally:
            a.close()
            b.close()
