"""Per-call cost of the native module's hot paths, from Python.

36-character UUID-shaped keys and 160-byte values (the seeds' medium
dataset), single process. Each figure is the median over `--repeat` runs of
the mean per-call time in a tight loop of `--loops` calls (a single call is
too short to time on its own). A dict lookup is measured the same way as
the floor.

Run: python benchmarks/native_ops.py
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import timeit
import uuid

from nearcache import _native


def per_call_ns(stmt: str, env: dict[str, object], loops: int, repeat: int) -> float:
    """Median over `repeat` runs of the mean time of `stmt` in a compiled loop."""
    timer = timeit.Timer(stmt, globals=env)
    return statistics.median(t / loops * 1e9 for t in timer.repeat(repeat, loops))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--loops", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=31)
    args = ap.parse_args()

    d = tempfile.mkdtemp()
    cache = _native.NativeCache(os.path.join(d, "bench"), 64 << 20)
    keys = [str(uuid.uuid4()) for _ in range(1000)]
    bkeys = [k.encode() for k in keys]
    value = os.urandom(160)
    for k in bkeys:
        cache.set(k, value)
    floor = dict.fromkeys(bkeys, value)
    k, bk = keys[7], bkeys[7]
    missing = b"x" * 36
    env: dict[str, object] = {
        "floor": floor,
        "cache": cache,
        "k": k,
        "bk": bk,
        "missing": missing,
        "value": value,
    }
    rows = {
        "pass (loop overhead)": "pass",
        "dict.get (floor)": "floor.get(bk)",
        "get hit (bytes key)": "cache.get(bk)",
        "get hit (str key)": "cache.get(k)",
        "get miss": "cache.get(missing)",
        "set 160 B": "cache.set(bk, value)",
        "get_typed hit": "cache.get_typed(bk)",
        "set_typed 160 B": "cache.set_typed(bk, value)",
        "incr": "cache.incr(b'counter')",
        "attribute (no-op call)": "cache.max_entry_size",
    }
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus")
    print(f"{'operation':<24}{'median ns/call':>16}")
    for name, stmt in rows.items():
        print(f"{name:<24}{per_call_ns(stmt, env, args.loops, args.repeat):>16.1f}")


if __name__ == "__main__":
    main()
