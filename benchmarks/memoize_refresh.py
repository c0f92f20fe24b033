"""What a caller waits for when a memoized entry has gone stale.

With ``stale_ttl`` the entry outlives its TTL; the first caller after expiry
takes the refresh lock.  Without ``background`` that caller recomputes in its
call; with ``background=True`` it gets the stale value and a daemon thread
recomputes.  This measures that caller's latency for a function that takes
``--work`` milliseconds (a ``time.sleep``, standing in for a query), over
``--rounds`` rounds, both variants interleaved in one run, and reports the
median and maximum in microseconds.  Every round makes the entry stale by
rewriting its logical expiry (no sleeping for the TTL), then waits for the
background refresh to finish before the next round.

    python benchmarks/memoize_refresh.py             # Markdown table
    python benchmarks/memoize_refresh.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import nearcache
from nearcache import Cache


def make_stale(cache: Cache, key: str) -> None:
    value, delta, _ = cache.get(key)
    cache.set(key, (value, delta, time.time() - 1), ttl=600)


def measure(rounds: int, work_ms: float) -> dict[str, dict[str, float]]:
    directory = tempfile.mkdtemp(prefix="nearcache-refresh-bench-")
    cache = Cache(path=os.path.join(directory, "cache"), size="4MiB")
    runs = {"background": 0, "foreground": 0}

    def make(background: bool) -> Any:
        name = "background" if background else "foreground"

        @cache.memoize(ttl=60, stale_ttl=600, background=background, name=name)
        def query(x: int) -> int:
            runs[name] += 1
            time.sleep(work_ms / 1000)
            return x

        return query

    variants = {"foreground": make(False), "background": make(True)}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    try:
        for func in variants.values():
            func(1)
        for _ in range(rounds):
            for name, func in variants.items():
                key = func.cache_key(1)
                make_stale(cache, key)
                before = runs[name]
                start = time.perf_counter_ns()
                func(1)
                samples[name].append((time.perf_counter_ns() - start) / 1000)
                deadline = time.monotonic() + 10
                while runs[name] == before or cache.lock(key).locked():
                    if time.monotonic() > deadline:
                        raise RuntimeError("the refresh did not finish")
                    time.sleep(0.001)
    finally:
        cache.close()
        os.unlink(os.path.join(directory, "cache"))
        os.rmdir(directory)
    return {
        name: {"median_us": statistics.median(values), "max_us": max(values)}
        for name, values in samples.items()
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--work", type=float, default=20.0, help="the function's milliseconds")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = measure(args.rounds, args.work)
    meta = {
        "python": platform.python_version(),
        "nearcache": nearcache.__version__,
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
        "rounds": args.rounds,
        "work_ms": args.work,
    }
    if args.json:
        json.dump({"meta": meta, "results": results}, sys.stdout, indent=1)
        print()
        return 0
    print(f"Stale-entry caller latency, function of {args.work:g} ms, {args.rounds} rounds")
    print(f"(Python {meta['python']}, {meta['cpus']} CPUs, load {meta['load_average']:.2f})\n")
    print("| memoize | median µs | max µs |")
    print("|---|---:|---:|")
    for name in ("foreground", "background"):
        figures = results[name]
        print(f"| {name} | {figures['median_us']:,.0f} | {figures['max_us']:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
