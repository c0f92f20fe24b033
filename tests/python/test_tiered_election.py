"""One invalidation listener per host in every mode (pub/sub, tracking, stream).

Four worker processes share one L1 file, as the workers of a gunicorn host
do; a real redis-server on loopback counts their subscriber connections
(``CLIENT LIST``).  Killing the listener hands the role to another worker,
which clears the host's L1 unless it can replay what it missed (a stream
whose history is intact), and counts the clear in ``takeover_clears``.
"""

from __future__ import annotations

import json
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

from nearcache.drivers import RedisDriver, ShmDriver
from nearcache.testing import RedisServer
from nearcache.tiered import TieredCache

BOUND = 20.0
WORKERS = 4

_WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from nearcache.drivers import RedisDriver, ShmDriver
    from nearcache.tiered import TieredCache
    l1_path, url, mode, out = sys.argv[1:5]
    l1 = ShmDriver(path=l1_path, size="4MiB")
    cache = TieredCache(l1, RedisDriver(url, prefix="app:"), invalidation=mode)
    ready = cache.wait_ready(60)
    while True:
        stats = cache.stats()
        report = {
            "pid": os.getpid(),
            "ready": ready,
            "listener": cache.is_listener,
            "connected": cache.invalidator.connected,
            "takeovers": stats["takeovers"],
            "takeover_clears": stats["takeover_clears"],
        }
        with open(out + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(out + ".tmp", out)
        time.sleep(0.02)
    """
)


def wait_for(condition: Callable[[], bool], timeout: float = BOUND) -> float:
    start = time.monotonic()
    while not condition():
        if time.monotonic() - start > timeout:
            pytest.fail(f"condition not met within {timeout} s")
        time.sleep(0.01)
    return time.monotonic() - start


def subscribers(url: str) -> int:
    """Connections of the server holding a subscription or blocked reading the stream."""
    client = redis.Redis.from_url(url)
    try:
        return sum(
            1 for c in client.client_list() if int(c.get("sub", 0)) > 0 or c.get("cmd") == "xread"
        )
    finally:
        client.close()


class Host:
    """Worker processes sharing one L1 file, each reporting its state to a file."""

    def __init__(self, directory: Path, url: str, mode: str) -> None:
        self.directory = directory
        self.url = url
        self.mode = mode
        self.l1_path = directory / "l1"
        self.workers: dict[int, subprocess.Popen[bytes]] = {}

    def start(self, count: int) -> None:
        for n in range(count):
            report = self.directory / f"worker-{n}.json"
            process = subprocess.Popen(
                [sys.executable, "-c", _WORKER, str(self.l1_path), self.url, self.mode, str(report)]
            )
            self.workers[n] = process

    def reports(self) -> list[dict[str, Any]]:
        found = []
        for n, process in self.workers.items():
            path = self.directory / f"worker-{n}.json"
            if process.poll() is None and path.exists():
                found.append(json.loads(path.read_text()))
        return found

    def kill(self, pid: int) -> None:
        for n, process in list(self.workers.items()):
            if process.pid == pid:
                os.kill(pid, signal.SIGKILL)
                process.wait(10)
                (self.directory / f"worker-{n}.json").unlink()
                del self.workers[n]

    def stop(self) -> None:
        for process in self.workers.values():
            process.kill()
            process.wait(10)


@pytest.fixture
def host(private_redis_server: RedisServer, tmp_path: Path) -> Iterator[Callable[[str], Host]]:
    made: list[Host] = []

    def make(mode: str) -> Host:
        made.append(Host(tmp_path, private_redis_server.url, mode))
        return made[-1]

    yield make
    for h in made:
        h.stop()


@pytest.mark.parametrize("mode", ["auto", "tracking", "stream"])
def test_four_workers_of_a_host_hold_one_subscription(
    host: Callable[[str], Host], private_redis_server: RedisServer, tmp_path: Path, mode: str
) -> None:
    # "auto" on a single Redis is pub/sub.
    workers = host(mode)
    workers.start(WORKERS)

    def settled() -> bool:
        reports = workers.reports()
        listeners = [r for r in reports if r["listener"]]
        return (
            len(reports) == WORKERS
            and all(r["ready"] for r in reports)
            and len(listeners) == 1
            and listeners[0]["connected"]
        )

    wait_for(settled)
    assert subscribers(private_redis_server.url) == 1  # was one per worker but for the stream

    # The one listener serves the whole host: a write from another host drops
    # the copy any worker (here: this process) put in the shared L1.
    url = private_redis_server.url
    l1 = ShmDriver(path=workers.l1_path, size="4MiB")
    other = TieredCache(
        ShmDriver(path=tmp_path / "other", size="4MiB"),
        RedisDriver(url, prefix="app:"),
        invalidation=mode,
    )
    try:
        assert other.wait_ready(BOUND)
        other.set("k", 1)
        l1.set("k", 1)
        other.set("k", 2)
        wait_for(lambda: l1.get("k") is None)

        # The listener dies; another worker takes over within a poll interval.
        listener = next(r for r in workers.reports() if r["listener"])
        l1.set("marker", "before the takeover")
        workers.kill(listener["pid"])
        wait_for(settled_after_kill := lambda: _one_listener(workers, WORKERS - 1))
        assert settled_after_kill()
        wait_for(lambda: subscribers(url) == 2)  # the host's one, and the other host's
        successor = next(r for r in workers.reports() if r["listener"])
        assert successor["takeovers"] == 1
        if mode == "stream":
            # The stream's history covers the gap: replayed, L1 kept.
            assert successor["takeover_clears"] == 0
            assert l1.get("marker") == "before the takeover"
        else:
            # Pub/sub and tracking cannot replay: L1 cleared, and counted.
            assert successor["takeover_clears"] == 1
            assert l1.get("marker") is None
        others = [r for r in workers.reports() if r["pid"] != successor["pid"]]
        assert len(others) == WORKERS - 2 and all(r["takeovers"] == 0 for r in others)
        other.set("k", 3)  # the successor listens
        l1.set("k", 2)
        other.set("k", 4)
        wait_for(lambda: l1.get("k") is None)
    finally:
        other.close()
        l1.close()


def _one_listener(workers: Host, count: int) -> bool:
    reports = workers.reports()
    listeners = [r for r in reports if r["listener"]]
    return len(reports) == count and len(listeners) == 1 and listeners[0]["connected"]


def test_caches_of_one_l1_on_different_channels_each_have_a_listener(
    private_redis_server: RedisServer, tmp_path: Path
) -> None:
    url = private_redis_server.url
    l1_path = tmp_path / "l1"
    a = TieredCache(ShmDriver(path=l1_path, size="4MiB"), RedisDriver(url, prefix="a:"))
    b = TieredCache(ShmDriver(path=l1_path, size="4MiB"), RedisDriver(url, prefix="b:"))
    a2 = TieredCache(ShmDriver(path=l1_path, size="4MiB"), RedisDriver(url, prefix="a:"))
    try:
        for cache in (a, b, a2):
            assert cache.wait_ready(BOUND)
        assert b.is_listener and a.is_listener + a2.is_listener == 1
        wait_for(lambda: subscribers(url) == 2)
    finally:
        for cache in (a, b, a2):
            cache.close()
