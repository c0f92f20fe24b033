"""Bytes a full cache spends per entry beyond its key and value.

A fresh 64 MiB cache on tmpfs (a private directory under /dev/shm, else the
temporary directory) is filled with 36-byte keys and values of 16, 160 and
1,600 bytes, in batches of new keys, until it has evicted more than twice
the entries it holds (steady state).  Then 20 more batches of 5,000 new keys
are set and after each the script samples ``stats()``.  It prints, as means
over the samples: entries held, overhead per entry (held bytes minus live
key + value bytes, over entries), the part of that which is the entry
header and padding, and the share of held memory and of the file that is
live key + value bytes (utilisation).

    python benchmarks/entry_footprint.py [--size-mib 64] [--values 16,160,1600]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import tempfile

from nearcache import _native

KEY_BYTES = 36
#: The engine's entry header (layout.rs: ENTRY_HEADER) and alignment.
ENTRY_HEADER = 16
ALIGN = 4


def keys(start: int, count: int) -> list[bytes]:
    return [format(i, "x").rjust(KEY_BYTES, "k").encode() for i in range(start, start + count)]


def measure(directory: str, size: int, value_bytes: int) -> dict[str, float]:
    path = os.path.join(directory, f"footprint-{value_bytes}")
    cache = _native.NativeCache(path, size, recreate=True)
    value = b"v" * value_bytes
    written = 0
    try:
        while True:
            for key in keys(written, 100_000):
                cache.set(key, value)
            written += 100_000
            stats = cache.stats()
            if stats["evictions"] > 2 * stats["items"]:
                break
        samples = []
        for _ in range(20):
            for key in keys(written, 5_000):
                cache.set(key, value)
            written += 5_000
            stats = cache.stats()
            samples.append((stats["items"], stats["held_bytes"], stats["file_bytes"]))
    finally:
        cache.close()
        os.unlink(path)
    items = sum(s[0] for s in samples) / len(samples)
    held = sum(s[1] for s in samples) / len(samples)
    file_bytes = samples[-1][2]
    live = items * (KEY_BYTES + value_bytes)
    entry = (ENTRY_HEADER + KEY_BYTES + value_bytes + ALIGN - 1) // ALIGN * ALIGN
    return {
        "items": items,
        "overhead": (held - live) / items,
        "header": entry - KEY_BYTES - value_bytes,
        "util_held": live / held,
        "util_file": live / file_bytes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64)
    parser.add_argument("--values", default="16,160,1600", help="value sizes, comma-separated")
    args = parser.parse_args()
    parent = "/dev/shm" if os.path.isdir("/dev/shm") else None
    directory = tempfile.mkdtemp(prefix="nc-footprint-", dir=parent)
    try:
        print(f"{platform.node()} {platform.machine()} python {platform.python_version()}")
        print(f"{args.size_mib} MiB cache, {KEY_BYTES}-byte keys, in {directory}")
        print(
            "| value | entries | overhead / entry | of which header + padding "
            "| utilisation (held) | utilisation (file) |"
        )
        print("|---:|---:|---:|---:|---:|---:|")
        for value_bytes in (int(v) for v in args.values.split(",")):
            m = measure(directory, args.size_mib << 20, value_bytes)
            print(
                f"| {value_bytes:,} B | {m['items']:,.0f} | {m['overhead']:.0f} B "
                f"| {m['header']:.0f} B | {m['util_held']:.3f} | {m['util_file']:.3f} |"
            )
    finally:
        shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
