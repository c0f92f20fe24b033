"""Fault test of the tiered cache: simulated hosts over a real local Redis, Cluster or Sentinel.

``nearcache tiered-faults --l2 redis --duration 600`` starts the servers on
loopback, then ``--hosts`` simulated hosts (one L1 file each) of
``--processes`` worker processes each, all writing, reading and deleting
``--keys`` keys at random through :class:`~nearcache.tiered.TieredCache`
(stream invalidation, one listener per host).  Meanwhile the coordinator
injects a fault every ``--fault-interval`` seconds, at random:

* **kill**: SIGKILL a worker (often the host's listener) and start it again;
* **restart**: stop and start a Redis server (``redis``: the server, losing
  its data; ``cluster``: one node; ``sentinel``: kill the primary, let the
  sentinels promote the replica, restart the old one);
* **pause**: SIGSTOP a server for 0.2-2 s (a network partition as seen from
  the clients), then SIGCONT.

Workers use ``on_set_error="raise"``: a write that fails drops the host's L1
copy, so no L1 keeps a value L2 may not have.  While traffic runs, a sampler
compares every host's L1 with L2 for random keys and measures how long a
stale L1 copy was seen (the **staleness**, sampled).  When the time is up,
traffic stops (the processes stay, so every host keeps its listener) and,
after ``--settle`` seconds for listeners to catch up, the **invariant** is
checked: every L1 copy equals the L2 value.  Copies
that disagree then are reported as violations; they are checked again after
``l1_ttl`` (they must be gone: the bound that holds in every failure case).

The report: operations, faults by kind, lost invalidations repaired by
replay (entries replayed by a listener that took over or reconnected), L1
clears (history gone: a restarted server), violations, maximum staleness.
Exit status 1 when there were violations.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["FaultConfig", "main", "run"]


@dataclass
class FaultConfig:
    """What to run (see the module doc)."""

    l2: str = "redis"
    duration: float = 60.0
    hosts: int = 2
    processes: int = 2
    keys: int = 200
    fault_interval: float = 2.0
    l1_ttl: float = 5.0
    settle: float = 3.0
    seed: int = 1
    directory: str | None = None
    kinds: tuple[str, ...] = ("kill", "restart", "pause")


@dataclass
class FaultReport:
    """What happened."""

    config: dict[str, Any]
    operations: int = 0
    write_errors: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    replayed: int = 0
    l1_clears: int = 0
    takeovers: int = 0
    stale_samples: int = 0
    max_staleness_ms: float = 0.0
    violations: int = 0
    violations_after_l1_ttl: int = 0
    examples: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data."""
        return dict(self.__dict__)

    def render(self) -> str:
        """The report as text."""
        lines = [
            f"tiered fault run: L2 {self.config['l2']}, {self.config['duration']} s, "
            f"{self.config['hosts']} hosts x {self.config['processes']} processes, "
            f"{self.config['keys']} keys, l1_ttl {self.config['l1_ttl']} s",
            f"operations: {self.operations:,} ({self.write_errors:,} writes failed by policy)",
            "faults: " + ", ".join(f"{k} {v}" for k, v in sorted(self.faults.items())),
            f"listener elections: {self.takeovers}; invalidations replayed after a gap: "
            f"{self.replayed}; L1 clears (first starts, history gone): {self.l1_clears}",
            f"staleness seen while running: max {self.max_staleness_ms:.1f} ms "
            f"({self.stale_samples} stale samples)",
            f"violations after settling: {self.violations}; "
            f"after l1_ttl: {self.violations_after_l1_ttl}",
        ]
        lines += [f"  {example}" for example in self.examples[:10]]
        return "\n".join(lines)


# ----------------------------------------------------------------------------- servers


class _Servers:
    """The L2 servers of the run, and how to hurt them."""

    def __init__(self, kind: str, workdir: Path) -> None:
        from nearcache.testing.servers import (
            RedisClusterServers,
            RedisSentinelServers,
            RedisServer,
        )

        self.kind = kind
        self.single: RedisServer | None = None
        self.cluster: RedisClusterServers | None = None
        self.sentinel: RedisSentinelServers | None = None
        if kind == "redis":
            self.single = RedisServer(workdir=workdir)
            self.single.start()
            self.url = self.single.url
        elif kind == "cluster":
            self.cluster = RedisClusterServers(workdir=workdir)
            self.cluster.start()
            self.url = self.cluster.url
        elif kind == "sentinel":
            self.sentinel = RedisSentinelServers(workdir=workdir)
            self.sentinel.start()
            self.url = self.sentinel.url
        else:
            raise ValueError(f"--l2 is redis, cluster or sentinel, not {kind!r}")

    def data_servers(self) -> list[Any]:
        if self.single is not None:
            return [self.single]
        if self.cluster is not None:
            return list(self.cluster.nodes)
        assert self.sentinel is not None
        return self.sentinel.servers

    def restart(self, rng: random.Random) -> None:
        if self.sentinel is not None:
            old = self.sentinel.kill_primary()
            with contextlib.suppress(Exception):
                self.sentinel.wait_promoted(old.port, timeout=20)
            old.extra_args = ["--replicaof", old.host, str(self.sentinel.primary_port() or 0)]
            old.start()
            return
        server = rng.choice(self.data_servers())
        server.stop()
        server.start()
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.wait_ok(20)

    def pause(self, rng: random.Random) -> None:
        server = rng.choice([s for s in self.data_servers() if s.running])
        server.pause()
        time.sleep(rng.uniform(0.2, 2.0))
        server.resume()

    def close(self) -> None:
        for group in (self.single, self.cluster, self.sentinel):
            if group is not None:
                group.close()


# ----------------------------------------------------------------------------- workers


def _l2(url: str) -> Any:
    from nearcache.config import from_url

    return from_url(f"{url}{'&' if '?' in url else '?'}prefix=faults:&timeout=0.5")


def _cache(url: str, l1_path: str, l1_ttl: float, **options: Any) -> Any:
    from nearcache.drivers import ShmDriver
    from nearcache.tiered import TieredCache

    l2 = _l2(url)
    return TieredCache(
        ShmDriver(path=l1_path, size="16MiB"),
        l2,
        l1_ttl=l1_ttl,
        invalidation="stream",
        circuit_breaker={"backoff": 0.2, "max_backoff": 1.0},
        **options,
    )


_FIELDS = 5  # per worker slot: operations, failed writes, replayed, resyncs, elections


def _worker(
    url: str, l1_path: str, l1_ttl: float, keys: int, ident: int, slot: int, counts: Any, stop: Any
) -> None:
    from nearcache.drivers import BackendError

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    cache = _cache(url, l1_path, l1_ttl, on_get_error="ignore", on_set_error="raise")
    rng = random.Random(ident * 7919 + os.getpid())
    sequence = 0
    operations = errors = replayed = resyncs = 0
    listening = False
    while True:
        if stop.value:  # traffic stopped: stay alive (the listener keeps applying)
            time.sleep(0.05)
            continue
        key = f"k{rng.randrange(keys)}"
        roll = rng.random()
        try:
            if roll < 0.3:
                sequence += 1
                cache.set(key, (ident, sequence))
            elif roll < 0.35:
                cache.delete(key)
            else:
                cache.get(key)
        except BackendError:
            errors += 1
        operations += 1
        if operations % 50 == 0:  # publish the counters (a kill loses at most 50 ops' worth)
            stats = cache.invalidator.stats()
            # This worker's own slot, without a lock: a SIGKILLed worker
            # must not leave a lock held (its successor reuses the slot).
            base = slot * _FIELDS
            counts[base] += operations
            counts[base + 1] += errors
            counts[base + 2] += stats["replayed"] - replayed
            counts[base + 3] += stats["resyncs"] - resyncs
            if cache.is_listener and not listening:
                counts[base + 4] += 1
            operations = errors = 0
            replayed, resyncs = stats["replayed"], stats["resyncs"]
            listening = cache.is_listener
        if rng.random() < 0.01:
            time.sleep(0.001)


# ----------------------------------------------------------------------------- the run


def run(config: FaultConfig) -> FaultReport:
    """Run the fault test and return the report."""
    from nearcache.drivers import ShmDriver

    report = FaultReport(config=dict(config.__dict__))
    rng = random.Random(config.seed)
    workdir = Path(config.directory or tempfile.mkdtemp(prefix="nearcache-faults-"))
    (workdir / "servers").mkdir(parents=True, exist_ok=True)
    servers = _Servers(config.l2, workdir / "servers")
    context = multiprocessing.get_context("fork")
    slots = config.hosts * config.processes
    counts = context.Array("q", slots * _FIELDS, lock=False)
    stop = context.Value("b", 0, lock=False)
    l1_paths = [str(workdir / f"host{h}") for h in range(config.hosts)]
    observer = _l2(servers.url)  # the coordinator reads L2 directly and listens to nothing
    workers: dict[tuple[int, int], Any] = {}

    def start(host: int, index: int) -> None:
        process = context.Process(
            target=_worker,
            args=(
                servers.url,
                l1_paths[host],
                config.l1_ttl,
                config.keys,
                host * 100 + index,
                host * config.processes + index,
                counts,
                stop,
            ),
            daemon=True,
        )
        process.start()
        workers[(host, index)] = process

    try:
        for host in range(config.hosts):
            for index in range(config.processes):
                start(host, index)
        deadline = time.monotonic() + 30
        while not all(os.path.exists(path) for path in l1_paths):
            if time.monotonic() > deadline:
                raise RuntimeError("the workers did not create their L1 files")
            time.sleep(0.05)
        l1s = [ShmDriver(path=path) for path in l1_paths]
        stale_since: dict[tuple[int, str, Any], float] = {}
        end = time.monotonic() + config.duration
        next_fault = time.monotonic() + config.fault_interval
        while time.monotonic() < end:
            now = time.monotonic()
            if now >= next_fault:
                kind = rng.choice(config.kinds)
                report.faults[kind] = report.faults.get(kind, 0) + 1
                if kind == "kill":
                    victim = rng.choice(list(workers))
                    os.kill(workers[victim].pid, signal.SIGKILL)
                    workers[victim].join()
                    start(*victim)
                elif kind == "restart":
                    servers.restart(rng)
                else:
                    servers.pause(rng)
                next_fault = time.monotonic() + config.fault_interval
            _sample(observer, l1s, config.keys, rng, stale_since, report)
            time.sleep(0.01)
        stop.value = 1  # stop the traffic; the processes (and listeners) live on
        time.sleep(config.settle)
        report.violations = _check(observer, l1s, config.keys, report)
        if report.violations:
            time.sleep(config.l1_ttl)
            report.violations_after_l1_ttl = _check(observer, l1s, config.keys, None)
        totals = [sum(counts[i::_FIELDS]) for i in range(_FIELDS)]
        report.operations, report.write_errors = totals[0], totals[1]
        report.replayed, report.l1_clears, report.takeovers = totals[2], totals[3], totals[4]
        for l1 in l1s:
            l1.close()
    finally:
        for process in workers.values():
            process.terminate()
        for process in workers.values():
            process.join(10)
            if process.is_alive():
                process.kill()
                process.join(5)
        with contextlib.suppress(Exception):
            observer.close()
        servers.close()
    return report


def _l2_values(observer: Any, keys: list[str]) -> dict[str, Any] | None:
    from nearcache.drivers import BackendError

    try:
        return dict(observer.get_many(keys))
    except BackendError:
        return None


def _sample(
    observer: Any,
    l1s: list[Any],
    keys: int,
    rng: random.Random,
    stale_since: dict[tuple[int, str, Any], float],
    report: FaultReport,
) -> None:
    """Compare a few keys' L1 copies with L2; time how long each stale copy is seen."""
    wanted = [f"k{rng.randrange(keys)}" for _ in range(5)]
    now = time.monotonic()
    l2 = _l2_values(observer, wanted)
    if l2 is None:
        return
    for host, l1 in enumerate(l1s):
        copies = l1.get_many(wanted)
        for key in wanted:
            if key in copies and copies[key] != l2.get(key):
                report.stale_samples += 1
                stale_since.setdefault((host, key, copies[key]), now)
    for marker, since in list(stale_since.items()):
        host, key, stale = marker
        if l1s[host].get(key) != stale:
            report.max_staleness_ms = max(report.max_staleness_ms, (now - since) * 1000)
            del stale_since[marker]


def _check(observer: Any, l1s: list[Any], keys: int, report: FaultReport | None) -> int:
    """Every host's L1 copy must equal the L2 value; return the disagreements."""
    names = [f"k{i}" for i in range(keys)]
    l2 = None
    for _ in range(100):
        l2 = _l2_values(observer, names)
        if l2 is not None:
            break
        time.sleep(0.1)
    if l2 is None:
        raise RuntimeError("L2 did not answer after the run")
    bad = 0
    for host, l1 in enumerate(l1s):
        copies = l1.get_many(names)
        for key, copy in copies.items():
            if copy != l2.get(key):
                bad += 1
                if report is not None:
                    report.examples.append(f"host {host} L1 {key}={copy!r}, L2 {l2.get(key)!r}")
    return bad


def main(argv: list[str] | None = None) -> int:
    """``nearcache tiered-faults``: returns 0 when there were no violations."""
    parser = argparse.ArgumentParser(
        prog="nearcache tiered-faults", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--l2", choices=["redis", "cluster", "sentinel"], default="redis")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of traffic")
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--processes", type=int, default=2, help="worker processes per host")
    parser.add_argument("--keys", type=int, default=200)
    parser.add_argument("--fault-interval", type=float, default=2.0)
    parser.add_argument("--l1-ttl", type=float, default=5.0)
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--faults",
        default="kill,restart,pause",
        help="kinds of fault to inject, comma-separated (default: kill,restart,pause)",
    )
    parser.add_argument("--dir", help="working directory (default: a new temporary one)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    config = FaultConfig(
        l2=args.l2,
        duration=args.duration,
        hosts=args.hosts,
        processes=args.processes,
        keys=args.keys,
        fault_interval=args.fault_interval,
        l1_ttl=args.l1_ttl,
        settle=args.settle,
        seed=args.seed,
        directory=args.dir,
        kinds=tuple(kind for kind in args.faults.split(",") if kind),
    )
    unknown = set(config.kinds) - {"kill", "restart", "pause"}
    if unknown or not config.kinds:
        parser.error(f"--faults takes kill, restart and pause, not {sorted(unknown)}")
    report = run(config)
    print(json.dumps(report.as_dict(), indent=2) if args.json else report.render())
    return 0 if report.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
