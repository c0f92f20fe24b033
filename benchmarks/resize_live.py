"""A cache resized live while worker processes use it (the resize goal of
``docs/design/engine.md``, "Resizing a live cache").

A cache of ``--size`` bytes (default 1 GiB) is filled to about half with
"stable" entries (36-byte keys, ``--value-size``-byte values, never written
again); then ``--workers`` processes (default 4) get and set keys of their
own (``--worker-keys`` each), checking every value they read: a stable
value must be whole and its own, a worker's own key must hold the last
value that worker wrote (a value served from a file left behind by the
resize would be an older one).  While
they run the cache is grown to ``--grow`` (2 GiB), then shrunk to
``--shrink`` (256 MiB).  Reported:

* errors and wrong values seen by the workers (goal: 0 and 0);
* stable entries kept by the grow (goal: all);
* after the shrink, the share kept of the newest and of the oldest tenth of
  the stable entries (the newest that fit are kept: ~100% and ~0%);
* memory: the bytes the cache's file (and its spilled values' files)
  hold after the shrink, over the new size (goal: at most 1.1x), and the
  mappings or descriptors that the parent and the workers, having made
  calls since, still hold on the files the resizes replaced (goal: 0: an
  unlinked file's memory is freed once nobody holds it).  The file
  system's used bytes above what they were before are printed too (only
  meaningful when nothing else uses that file system);
* how long each resize took, and the slowest worker call during the run
  (timings: only meaningful on an idle machine).

::

    python benchmarks/resize_live.py                                  # the goal
    python benchmarks/resize_live.py --size 16MiB --grow 32MiB --shrink 4MiB \\
        --worker-keys 500 --pause 0.5                                 # a quick check

The cache lives in ``--dir`` (default: a fresh directory in /dev/shm).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from nearcache import Cache
from nearcache.units import parse_size


def _stable_key(i: int) -> str:
    return f"stable-{i:029d}"  # 36 characters


def _stable_value(i: int, width: int) -> bytes:
    head = f"{i}:".encode()
    return head + b"s" * (width - len(head))


def _fs_used(path: str) -> int:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _holding(inodes: set[int], within: float = 10.0) -> int:
    """Mappings and descriptors of this process on files with these inodes,
    once none is left or after ``within`` seconds (a mapping of more than
    16 MiB is let go by a thread of the engine's, in the background, soon
    after the call that followed the resize)."""
    deadline = time.monotonic() + within
    while True:
        held = _held_now(inodes)
        if held == 0 or time.monotonic() >= deadline:
            return held
        time.sleep(0.05)


def _held_now(inodes: set[int]) -> int:
    held = 0
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            if len(fields) >= 5 and fields[4].isdigit() and int(fields[4]) in inodes:
                held += 1
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.stat(f"/proc/self/fd/{fd}").st_ino in inodes:
                held += 1
        except OSError:
            pass
    return held


def _worker(path: str, n: int, width: int, stable: int, own: int, stop: str, out: str) -> None:
    """Get and set own keys, read stable ones, until ``stop`` exists and at
    least one call was made after it."""
    c = Cache(path=path)
    last: dict[str, int] = {}
    errors = wrong = ops = 0
    slowest = 0.0
    x = 0x9E3779B97F4A7C15 ^ (n + 1)
    stopping = False
    while True:
        for _ in range(500):
            x ^= (x << 13) & (2**64 - 1)
            x ^= x >> 7
            x ^= (x << 17) & (2**64 - 1)
            ops += 1
            t0 = time.perf_counter()
            try:
                if x % 4 == 0:
                    i = (x >> 8) % stable
                    v = c.get(_stable_key(i))
                    if v is not None and v != _stable_value(i, width):
                        wrong += 1
                else:
                    key = f"w{n}-{(x >> 8) % own:032d}"
                    if x % 4 == 1:
                        c.set(key, ops.to_bytes(8, "little") + b"w" * (width - 8))
                        last[key] = ops
                    else:
                        v = c.get(key)
                        if v is not None and int.from_bytes(v[:8], "little") != last.get(key):
                            wrong += 1
            except Exception:
                errors += 1
            slowest = max(slowest, time.perf_counter() - t0)
        if stopping:
            break
        stopping = os.path.exists(stop)
    # The files the resizes replaced (their inodes, written before `stop`):
    # this process, having made calls since, must hold none of them.
    old = set(json.loads(Path(stop).read_text()))
    report = {"ops": ops, "errors": errors, "wrong": wrong, "slowest_s": slowest}
    report["old_files_held"] = _holding(old)
    Path(out).write_text(json.dumps(report))


def run(args: argparse.Namespace) -> dict[str, Any]:
    size, grow, shrink = (parse_size(s) for s in (args.size, args.grow, args.shrink))
    base = args.dir or tempfile.mkdtemp(
        prefix="nearcache-resize-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    path = os.path.join(base, "cache")
    used_before = _fs_used(base)
    c = Cache(path=path, size=size, fs_reserve=0)
    entry = 16 + 36 + args.value_size
    stable = int(size * args.fill / entry)
    batch: list[tuple[str, bytes]] = []
    for i in range(stable):
        batch.append((_stable_key(i), _stable_value(i, args.value_size)))
        if len(batch) == 10_000:
            c.set_many(dict(batch))
            batch.clear()
    c.set_many(dict(batch))
    filled = len(c)
    stop = os.path.join(base, "stop")
    # Fresh processes that open the cache themselves (a forked child would
    # also inherit this process's handle, which it never uses, and with it
    # the old file: see "Limits" in docs/design/engine.md).
    ctx = multiprocessing.get_context("spawn")
    outs = [os.path.join(base, f"worker-{n}.json") for n in range(args.workers)]
    workers = [
        ctx.Process(
            target=_worker,
            args=(path, n, args.value_size, stable, args.worker_keys, stop, outs[n]),
        )
        for n in range(args.workers)
    ]
    for w in workers:
        w.start()
    time.sleep(args.pause)
    replaced = [os.stat(path).st_ino]
    t0 = time.perf_counter()
    c.resize(grow)
    grow_s = time.perf_counter() - t0
    kept_grow = sum(
        c.get(_stable_key(i)) == _stable_value(i, args.value_size) for i in range(stable)
    )
    time.sleep(args.pause)
    replaced.append(os.stat(path).st_ino)
    t0 = time.perf_counter()
    c.resize(shrink)
    shrink_s = time.perf_counter() - t0
    time.sleep(args.pause)
    Path(stop).write_text(json.dumps(replaced))
    for w in workers:
        w.join()
    reports = [json.loads(Path(o).read_text()) for o in outs]
    tenth = max(1, stable // 10)

    def share(indices: range) -> float:
        hits = sum(c.get(_stable_key(i)) is not None for i in indices)
        return hits / len(indices)

    held = c.stats()["held_bytes"]
    used_after = _fs_used(base) - used_before
    file_bytes = os.stat(path).st_blocks * 512
    spill = os.path.join(base, "cache.spill")
    if os.path.isdir(spill):
        file_bytes += sum(
            os.stat(os.path.join(spill, f)).st_blocks * 512 for f in os.listdir(spill)
        )
    old_held = _holding(set(replaced)) + sum(r["old_files_held"] for r in reports)
    result = {
        "size": size,
        "grow": grow,
        "shrink": shrink,
        "workers": args.workers,
        "stable_entries": stable,
        "entries_before": filled,
        "worker_ops": sum(r["ops"] for r in reports),
        "errors": sum(r["errors"] for r in reports),
        "wrong_values": sum(r["wrong"] for r in reports),
        "kept_by_grow": kept_grow,
        "newest_tenth_kept_by_shrink": share(range(stable - tenth, stable)),
        "oldest_tenth_kept_by_shrink": share(range(tenth)),
        "entries_after": len(c),
        "capacity_after": c.capacity,
        "held_bytes_after": held,
        "file_bytes_after": file_bytes,
        "memory_over_new_size": round(file_bytes / shrink, 3),
        "old_files_still_held": old_held,
        "fs_used_after_minus_before": used_after,
        "grow_s": round(grow_s, 3),
        "shrink_s": round(shrink_s, 3),
        "slowest_worker_call_s": round(max(r["slowest_s"] for r in reports), 4),
        "load_average_at_start": os.getloadavg()[0],
    }
    c.close()
    if not args.dir:
        shutil.rmtree(base, ignore_errors=True)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", default="1GiB", help="initial size (1GiB)")
    p.add_argument("--grow", default="2GiB", help="size grown to (2GiB)")
    p.add_argument("--shrink", default="256MiB", help="size shrunk to (256MiB)")
    p.add_argument("--workers", type=int, default=4, help="worker processes (4)")
    p.add_argument("--value-size", type=int, default=160, help="value bytes (160)")
    p.add_argument("--worker-keys", type=int, default=10_000, help="own keys per worker")
    p.add_argument("--fill", type=float, default=0.5, help="share of the size filled first")
    p.add_argument("--pause", type=float, default=1.0, help="seconds between the steps (1)")
    p.add_argument("--dir", help="directory of the cache (default: a fresh one in /dev/shm)")
    args = p.parse_args()
    result = run(args)
    print(json.dumps(result, indent=1))
    goals = {
        "0 errors": result["errors"] == 0,
        "0 wrong values": result["wrong_values"] == 0,
        "all kept on grow": result["kept_by_grow"] == result["stable_entries"],
        "memory after shrink <= 1.1x": result["memory_over_new_size"] <= 1.1
        and result["old_files_still_held"] == 0,
    }
    for goal, met in goals.items():
        print(f"{goal}: {'met' if met else 'NOT MET'}")


if __name__ == "__main__":
    main()
