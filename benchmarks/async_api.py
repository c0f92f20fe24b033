"""What a read costs through nearcache.aio.AsyncCache, per store, against the sync call.

For each store, one round is ``--number`` sequential reads of one hit
(36-character key, 160-byte value), timed as ns per read:

* ``sync``: the driver's (or Cache's) own ``get`` in a plain loop;
* ``async``: ``await cache.get(key)`` in a coroutine, on one asyncio loop;
* ``async, thread hop`` (shared memory only): the same cache forced through
  the bounded thread pool, i.e. what the inline path saves.

Redis and memcached run on loopback (started on free ports for the run).
Rounds of all variants are interleaved and the median round is reported::

    python benchmarks/async_api.py                # Markdown table
    python benchmarks/async_api.py --number 2000  # shorter
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import nearcache
from nearcache import Cache
from nearcache.aio import AsyncCache
from nearcache.aio._runtime import Offloader
from nearcache.aio._stores import ThreadStore
from nearcache.drivers import MemcachedDriver, RedisDriver, ShmDriver
from nearcache.testing import MemcachedServer, RedisServer

KEY = str(uuid.uuid4())
VALUE = os.urandom(160)


def sync_round(get: Callable[[str], Any], number: int) -> float:
    start = time.perf_counter_ns()
    for _ in range(number):
        get(KEY)
    return (time.perf_counter_ns() - start) / number


def async_round(loop: asyncio.AbstractEventLoop, cache: AsyncCache, number: int) -> float:
    async def reads() -> float:
        get = cache.get
        start = time.perf_counter_ns()
        for _ in range(number):
            await get(KEY)
        return (time.perf_counter_ns() - start) / number

    return loop.run_until_complete(reads())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=20_000, help="reads per round (shm)")
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    directory = tempfile.mkdtemp(prefix="nearcache-async-bench-", dir="/dev/shm")
    with RedisServer() as redis_server, MemcachedServer() as memcached_server:
        shm_cache = Cache(path=os.path.join(directory, "c"), size="16MiB")
        redis_driver = RedisDriver(redis_server.url)
        memcached_driver = MemcachedDriver(memcached_server.address)
        for store in (shm_cache, redis_driver, memcached_driver):
            store.set(KEY, VALUE)
        hop = AsyncCache(shm_cache)
        hop._store = ThreadStore(ShmDriver(cache=shm_cache), Offloader(1))
        hop._inline_get = None
        variants: list[tuple[str, str, Any, int]] = [
            ("shared memory", "sync Cache.get", shm_cache.get, args.number),
            ("shared memory", "async, inline", AsyncCache(shm_cache), args.number),
            ("shared memory", "async, thread hop", hop, args.number // 10),
            ("Redis (loopback)", "sync RedisDriver.get", redis_driver.get, args.number // 10),
            (
                "Redis (loopback)",
                "async, redis.asyncio",
                AsyncCache(redis_driver),
                args.number // 10,
            ),
            (
                "memcached (loopback)",
                "sync MemcachedDriver.get",
                memcached_driver.get,
                args.number // 10,
            ),
            (
                "memcached (loopback)",
                "async, bounded pool",
                AsyncCache(memcached_driver),
                args.number // 10,
            ),
        ]
        loop = asyncio.new_event_loop()
        load_before = os.getloadavg()[0]
        rounds: dict[int, list[float]] = {i: [] for i in range(len(variants))}
        for _ in range(args.rounds):
            for i, (_, _, target, number) in enumerate(variants):
                if isinstance(target, AsyncCache):
                    rounds[i].append(async_round(loop, target, number))
                else:
                    rounds[i].append(sync_round(target, number))
        load_after = os.getloadavg()[0]
        print(
            f"nearcache {nearcache.__version__}, Python {platform.python_version()}, "
            f"{os.cpu_count()} CPUs, load average {load_before:.2f} before, "
            f"{load_after:.2f} after; median of {args.rounds} rounds\n"
        )
        print("| store | call | ns per read | vs. sync |")
        print("|---|---|---:|---:|")
        base = 0.0
        for i, (store, call, target, _) in enumerate(variants):
            median = statistics.median(rounds[i])
            if not isinstance(target, AsyncCache):
                base = median
            print(f"| {store} | {call} | {median:,.0f} | {median / base:.2f}x |")
        loop.close()


if __name__ == "__main__":
    main()
