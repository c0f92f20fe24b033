"""The circuit breaker in front of L2: a paused Redis costs one timeout per back-off per host."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nearcache.drivers import BackendError, MemoryDriver, RedisDriver, ShmDriver
from nearcache.testing import RedisServer
from nearcache.tiered import TieredCache
from nearcache.tiered.breaker import CircuitBreaker, CircuitOpenError

BOUND = 5.0


def wait_for(condition: Callable[[], bool], timeout: float = BOUND) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.005)


@pytest.fixture
def processes(
    private_redis_server: RedisServer, tmp_path: Path
) -> Iterator[Callable[..., TieredCache]]:
    """Tiered caches standing for processes of one host: one L1 file, one Redis."""
    made: list[TieredCache] = []

    def make(**breaker: Any) -> TieredCache:
        l1 = ShmDriver(path=tmp_path / "l1", size="4MiB")
        l2 = RedisDriver(private_redis_server.url, socket_timeout=0.2, connect_timeout=0.2)
        options = {"backoff": 0.3, "max_backoff": 1.2, **breaker}
        cache = TieredCache(
            l1, l2, invalidation=None, on_get_error="ignore", circuit_breaker=options
        )
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


def test_a_paused_l2_is_called_once_per_backoff(
    processes: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    cache = processes(backoff=60.0, max_backoff=60.0)
    cache.set("hot", "from L1")
    private_redis_server.pause()
    try:
        assert cache.get("miss-0") is None  # waits one socket timeout, opens the breaker
        assert cache.breaker.state == "open"
        for i in range(1, 11):
            assert cache.get(f"miss-{i}") is None  # not sent to L2
        assert cache.get("hot") == "from L1"
        cache.set("written", "locally")  # L2 skipped, L1 still updated
        assert cache.get("written") == "locally"
        stats = cache.stats()
        assert stats["l2_errors"] == 1
        assert stats["l2_skipped"] == 11
        assert stats["breaker"]["opened"] == 1
        assert stats["breaker"]["rejected"] == 11
    finally:
        private_redis_server.resume()


def test_the_open_state_is_shared_by_the_host(
    processes: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    first, second = processes(backoff=60.0, max_backoff=60.0), processes()
    private_redis_server.pause()
    try:
        assert first.get("a") is None
        assert second.get("b") is None  # learns from the L1 file, never calls L2
        assert second.stats()["l2_errors"] == 0
        assert second.stats()["l2_skipped"] == 1
        assert second.breaker.state == "open"
    finally:
        private_redis_server.resume()


def test_half_open_lets_one_probe_through_and_closes_on_success(
    processes: Callable[..., TieredCache], private_redis_server: RedisServer
) -> None:
    first, second = processes(), processes()
    private_redis_server.pause()
    try:
        assert first.get("a") is None
        wait_for(lambda: first.breaker.state == "half-open")
        assert first.get("b") is None  # the probe: fails, the back-off doubles
        assert first.stats()["breaker"]["probes"] == 1
        assert first.stats()["breaker"]["backoff"] == pytest.approx(0.6)
        assert first.stats()["l2_errors"] == 2
        assert first.breaker.state == "open"
    finally:
        private_redis_server.resume()
    wait_for(lambda: second.breaker.state == "half-open")
    second.set("c", 1)  # the probe succeeds and closes the breaker for the host
    assert first.breaker.state == "closed"
    assert first.l2.get("c") == 1
    first.set("d", 2)
    assert first.l2.get("d") == 2


def test_one_probe_per_host_at_a_time(tmp_path: Path) -> None:
    l1 = ShmDriver(path=tmp_path / "l1", size="4MiB")
    a = CircuitBreaker(l1, backoff=0.05, max_backoff=0.1)
    b = CircuitBreaker(ShmDriver(path=tmp_path / "l1"), backoff=0.05, max_backoff=0.1)
    a.before_call()
    a.failure(BackendError("down"))
    with pytest.raises(CircuitOpenError):
        b.before_call()
    time.sleep(0.06)
    a.before_call()  # a probes
    with pytest.raises(CircuitOpenError, match="another process probes"):
        b.before_call()
    a.success()
    b.before_call()  # closed again
    b.success()
    assert b.state == "closed"


def test_failures_threshold_and_disabled_breaker() -> None:
    breaker = CircuitBreaker(MemoryDriver(), failures=3, backoff=10.0, max_backoff=10.0)
    for _ in range(2):
        breaker.before_call()
        breaker.failure(BackendError("down"))
    breaker.before_call()  # two failures: still closed
    breaker.failure(BackendError("down"))
    with pytest.raises(CircuitOpenError):
        breaker.before_call()
    off = CircuitBreaker(None, failures=0)
    for _ in range(5):
        off.failure(BackendError("down"))
        off.before_call()
    assert off.state == "closed"


@pytest.mark.parametrize(
    "options",
    [{"failures": -1}, {"backoff": 0}, {"backoff": 5.0, "max_backoff": 1.0}, {"probe_timeout": 0}],
)
def test_bad_policies_are_rejected(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="circuit breaker"):
        CircuitBreaker(None, **options)


def test_raise_policy_raises_circuit_open_errors(private_redis_server: RedisServer) -> None:
    l2 = RedisDriver(private_redis_server.url, socket_timeout=0.2, connect_timeout=0.2)
    cache = TieredCache(
        MemoryDriver(), l2, invalidation=None, on_get_error="raise", on_set_error="raise"
    )
    private_redis_server.pause()
    try:
        with pytest.raises(BackendError) as first:
            cache.get("a")
        assert not isinstance(first.value, CircuitOpenError)
        with pytest.raises(CircuitOpenError):
            cache.get("b")
    finally:
        private_redis_server.resume()
        cache.close()
