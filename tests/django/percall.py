#!/usr/bin/env python3
"""Per-call cost of Django cache backends in one process (nanoseconds per call).

Compares nearcache's Django backend with Django's local-memory and file
backends on the calls a view makes: ``get`` (hit and miss), ``set``,
``incr``, ``get_many`` of 10 keys, and ``await aget`` in an event loop (where
Django's default async methods hop to a thread with ``sync_to_async``).
Keys are Django's (``:1:key``), values 160-character strings, the cache warm.
Each figure is the best of ``--repeat`` runs of ``--number`` calls.

    python tests/django/percall.py [--number 20000] [--repeat 7]

This measures the per-call overhead of each backend's Python code; the
multi-process comparison (8 workers, as in the diskcache study) is
``nearcache bench django-8proc``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

import django
from django.conf import settings


def best_ns(fn: Callable[[], Any], number: int, repeat: int) -> float:
    """Best time per call of ``fn`` over ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def best_async_ns(backend: Any, key: str, number: int, repeat: int) -> float:
    """Best time per ``await backend.aget(key)`` in a running event loop."""

    async def run() -> float:
        start = time.perf_counter()
        for _ in range(number):
            await backend.aget(key)
        return (time.perf_counter() - start) / number * 1e9

    return min(asyncio.run(run()) for _ in range(repeat))


def main() -> None:
    """Build the backends, time each call, print a Markdown table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=20000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()

    settings.configure(CACHES={}, INSTALLED_APPS=[])
    django.setup()
    from django.core.cache.backends.filebased import FileBasedCache
    from django.core.cache.backends.locmem import LocMemCache

    from nearcache.contrib.django import NearCache

    scratch = tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else None)
    try:
        params: dict[str, Any] = {"TIMEOUT": None, "OPTIONS": {"MAX_ENTRIES": 1000}}
        backends: dict[str, Any] = {
            "nearcache NearCache, MAX_ENTRIES=None": NearCache(
                os.path.join(scratch, "a"), {"TIMEOUT": None, "OPTIONS": {"MAX_ENTRIES": None}}
            ),
            "nearcache NearCache, MAX_ENTRIES=1000": NearCache(os.path.join(scratch, "b"), params),
            "Django LocMemCache, MAX_ENTRIES=1000": LocMemCache("percall", params),
            "Django FileBasedCache (tmpfs), MAX_ENTRIES=1000": FileBasedCache(
                os.path.join(scratch, "files"), params
            ),
        }
        value = "v" * 160
        keys = [f"key{i}" for i in range(500)]
        n, r = args.number, args.repeat
        print(
            f"Python {platform.python_version()}, Django {django.get_version()}, "
            f"{platform.machine()}, {os.cpu_count()} CPUs; best of {r} x {n} calls; ns per call\n"
        )
        print("| backend | get hit | get miss | set | incr | get_many(10) | await aget |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, backend in backends.items():
            backend.clear()
            backend.set_many(dict.fromkeys(keys, value))
            backend.set("counter", 0)
            slow = "FileBased" in name
            m = max(1, n // 10) if slow else n
            row = [
                best_ns(lambda b=backend: b.get("key1"), m, r),
                best_ns(lambda b=backend: b.get("absent"), m, r),
                best_ns(lambda b=backend: b.set("key2", value), m, r),
                best_ns(lambda b=backend: b.incr("counter"), m, r),
                best_ns(lambda b=backend: b.get_many(keys[:10]), max(1, m // 10), r),
                best_async_ns(backend, "key1", max(1, m // 10), r),
            ]
            print(f"| {name} | " + " | ".join(f"{x:,.0f}" for x in row) + " |")
            backend.clear()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
