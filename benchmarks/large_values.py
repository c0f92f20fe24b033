"""Round-trip 1 MiB, 100 MiB and 1 GiB values through a cache opened with
default options (64 MiB file, 128 KiB spill threshold, 1 GiB spill budget),
and time each set and get.

    python benchmarks/large_values.py [--dir DIR] [--sizes 1MiB,100MiB,1GiB]

The cache lives in ``DIR`` (default: the default directory, on tmpfs), so
the run can be repeated on a disk file system.  Each value is random bytes;
the get is compared with what was set.  Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

import nearcache
from nearcache import Cache
from nearcache.units import parse_size


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="directory of the cache file")
    parser.add_argument("--sizes", default="1MiB,100MiB,1GiB")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    base = args.dir or nearcache.default_directory()
    workdir = tempfile.mkdtemp(prefix="large-values-", dir=base)
    print(f"nearcache {nearcache.__version__}, Python {platform.python_version()}, {base}")
    print()
    n = args.repeats
    print(f"| value | set (best of {n}) | get (best of {n}) | get MB/s | round trip |")
    print("|---:|---:|---:|---:|---|")
    try:
        with Cache(path=os.path.join(workdir, "c")) as cache:
            for size in sizes:
                value = os.urandom(size)
                set_s = get_s = float("inf")
                ok = True
                for _ in range(args.repeats):
                    t0 = time.perf_counter()
                    cache.set("v", value)
                    t1 = time.perf_counter()
                    got = cache.get("v")
                    t2 = time.perf_counter()
                    ok = ok and got == value
                    del got
                    set_s, get_s = min(set_s, t1 - t0), min(get_s, t2 - t1)
                cache.delete("v")
                print(
                    f"| {size:,} B | {set_s * 1e3:,.1f} ms | {get_s * 1e3:,.1f} ms | "
                    f"{size / get_s / 1e6:,.0f} | {'equal' if ok else 'DIFFERENT'} |"
                )
                if not ok:
                    return 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
