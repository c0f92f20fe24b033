"""Memory a cache file holds against the bytes stored in it.

For several configured sizes and amounts stored (1.6 KB values, like the
e2e benchmark's fragments), a fresh cache on /dev/shm is filled and the
script prints: the file's allocated bytes (``du``, ``st_blocks``), the
engine's ``held_bytes``, the live bytes stored, their ratio, and the
writing process's shared-memory RSS (``RssShmem``, the cache pages it has
touched).

    python benchmarks/lazy_memory.py
"""

from __future__ import annotations

import os
import platform
import shutil
import tempfile

from nearcache import _native

MIB = 1 << 20


def rss_shmem() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    print(f"python {platform.python_version()}, {platform.machine()}, {os.cpu_count()} cpus")
    header = (
        f"{'size':>8} {'shards':>6} {'stored (live)':>14} {'du':>10} {'held_bytes':>11} "
        f"{'du/live':>8} {'RssShmem':>10}"
    )
    print(header)
    for size_mib in (64, 256, 1024):
        for entries in (0, 2_000, 20_000, 100_000):
            d = tempfile.mkdtemp(prefix="nc-mem-", dir=base)
            try:
                path = os.path.join(d, "c")
                cache = _native.NativeCache(path, size_mib * MIB)
                value = os.urandom(1600)
                for i in range(entries):
                    cache.set(f"fragment-{i}", value)
                stats = cache.stats()
                du = os.stat(path).st_blocks * 512
                live = stats["live_bytes"]
                ratio = f"{du / live:.2f}" if live else "-"
                print(
                    f"{size_mib:>6}Mi {stats['shards']:>6} {live / MIB:>11.1f}MiB "
                    f"{du / MIB:>7.1f}MiB {stats['held_bytes'] / MIB:>8.1f}MiB {ratio:>8} "
                    f"{rss_shmem() / MIB:>7.1f}MiB"
                )
                cache.close()
                del cache
            finally:
                shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
