"""The most a store shared between processes can scale, measured through Python.

``nearcache bench scaling`` reports how the aggregate rate of 1..N processes
grows when they share one cache.  Part of what a mix with writes loses is the
machine's, not the cache's: a value written on one core must travel to the
core that reads it next.  This script measures that part alone, with the
least any shared store can do: one 256-byte record per key in one
``MAP_SHARED`` mapping, a set copies 160 bytes in (``region[s] = value``), a
get copies them out (``region[s]``), one C call per operation like
``NativeCache.get``.  No index, no lock, no check: its reads may be torn, it
is a ceiling, not a cache.

Each process runs the same loop as the scaling workload's mixes (1,000 keys
in a random order of its own; ``--mix 1:10`` sets a key before every ten
gets, ``--mix get`` only gets) for ``--seconds``, all started together.
Prints the aggregate rate for each process count and the ratio to one.

    python benchmarks/shared_array_ceiling.py [--mix 1:10|get] [--seconds 2] [--procs 1,2]
"""

from __future__ import annotations

import argparse
import mmap
import multiprocessing
import os
import random
import time

KEYS = 1000
RECORD = 256
VALUE = 160
STREAM = 1 << 16


def worker(
    region: mmap.mmap,
    set_every: int,
    seconds: float,
    start: float,
    seed: int,
    out: multiprocessing.Queue[int],
) -> None:
    slices = [slice(i * RECORD, i * RECORD + VALUE) for i in range(KEYS)]
    rng = random.Random(seed)
    stream = [rng.choice(slices) for _ in range(STREAM)]
    value = bytes([seed % 256]) * VALUE
    get, put = region.__getitem__, region.__setitem__
    while time.monotonic() < start:
        pass
    end = start + seconds
    ops = 0
    while time.monotonic() < end:
        for i in range(0, STREAM, set_every):
            if set_every < STREAM:
                put(stream[i], value)
            for j in range(i + 1, min(i + set_every, STREAM)):
                get(stream[j])
        ops += STREAM
    out.put(ops)


def run(procs: int, set_every: int, seconds: float) -> float:
    region = mmap.mmap(-1, KEYS * RECORD, flags=mmap.MAP_SHARED)
    ctx = multiprocessing.get_context("fork")
    out: multiprocessing.Queue[int] = ctx.Queue()
    start = time.monotonic() + 0.3
    workers = [
        ctx.Process(target=worker, args=(region, set_every, seconds, start, seed, out))
        for seed in range(procs)
    ]
    for w in workers:
        w.start()
    total = sum(out.get() for _ in workers)
    for w in workers:
        w.join()
    return total / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mix", choices=["1:10", "get"], default="1:10")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--procs", default=f"1,{os.cpu_count() or 1}")
    args = ap.parse_args()
    set_every = 11 if args.mix == "1:10" else STREAM
    base = None
    print(f"shared array, mix {args.mix}, {os.cpu_count()} cores")
    for n in (int(p) for p in args.procs.split(",")):
        rate = run(n, set_every, args.seconds)
        base = base or rate
        print(f"{n:>3} processes: {rate / 1e6:7.2f} M ops/s  {rate / base:.2f}x")


if __name__ == "__main__":
    main()
