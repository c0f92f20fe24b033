"""One cache used from many threads of one process and from forked children
at the same time (the gunicorn ``--preload`` pattern): no torn or foreign
value, no lost counter increment, a clean check at the end."""

from __future__ import annotations

import sys
import threading
import time
import warnings
from pathlib import Path

import pytest

import nearcache
from nearcache._native import NativeCache
from nearcache.torture import data_key, make_value, parse_value

from ._helpers import Child, run_python

KEYS = 200


def work(cache: NativeCache, writer: int, ops: int, errors: list[str]) -> int:
    """Mixed reads and writes of self-describing values; returns increments made."""
    increments = 0
    for n in range(ops):
        i = (n * 7919 + writer * 104729) % KEYS
        key = data_key(i)
        if n % 3 == 0:
            cache.set(key, make_value(key, writer, n, 0, 16, n % 1500), None, 16)
        else:
            got = cache.get_entry(key)
            if got is not None:
                try:
                    info = parse_value(key, got[0])
                except ValueError as exc:
                    errors.append(f"{key!r}: {exc}")
                    continue
                if info.flags != got[1]:
                    errors.append(f"{key!r}: flags {got[1]} for a value stored with {info.flags}")
        cache.incr("hits", 1)
        increments += 1
        if n % 50 == 0:
            cache.get_many([data_key(j) for j in range(i, min(i + 10, KEYS))])
    return increments


def _thread_main(
    cache: NativeCache, writer: int, ops: int, errors: list[str], counts: list[int]
) -> None:
    try:
        counts.append(work(cache, writer, ops, errors))
    except BaseException as exc:  # reported by the test
        errors.append(repr(exc))


def _run_threads_and_children(path: str, threads: int, children: int, ops: int) -> None:
    cache = NativeCache(path, 8 << 20, 8)
    errors: list[str] = []
    counts: list[int] = []
    pool = [
        threading.Thread(target=_thread_main, args=(cache, w, ops, errors, counts))
        for w in range(threads)
    ]
    for t in pool:
        t.start()

    def child(writer: int) -> tuple[int, list[str]]:
        # Half of the work through the inherited handle, half through a new one.
        child_errors: list[str] = []
        done = work(cache, writer, ops // 2, child_errors)
        own = NativeCache(path, 0, create=False)
        done += work(own, writer + 1000, ops // 2, child_errors)
        return done, child_errors

    forked = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads running
        for c in range(children):
            forked.append(Child(lambda c=c: child(100 + c)))
            time.sleep(0.01)
    results = [f.wait(timeout=120) for f in forked]
    for t in pool:
        t.join(timeout=120)
    assert all(r.ok for r in results), [r.error for r in results]
    for r in results:
        errors.extend(r.value[1])
    assert errors == []
    assert len(counts) == threads
    total = sum(counts) + sum(r.value[0] for r in results)
    # No increment lost (the cache is far from full: nothing was evicted).
    assert cache.get_typed("hits") == total
    assert cache.stats()["evictions"] == 0
    cache.check()


def test_threads_and_forked_children_share_one_cache(tmp_path: Path) -> None:
    _run_threads_and_children(str(tmp_path / "c"), threads=4, children=3, ops=20000)


@pytest.mark.skipif(
    getattr(sys, "_is_gil_enabled", lambda: True)(),
    reason="needs a free-threaded (no-GIL) Python build; this interpreter has a GIL",
)
def test_free_threaded_many_threads_and_children(tmp_path: Path) -> None:
    _run_threads_and_children(str(tmp_path / "c"), threads=16, children=2, ops=3000)


def test_close_while_other_threads_are_using_the_cache(tmp_path: Path) -> None:
    cache = NativeCache(str(tmp_path / "c"), 1 << 20, 4)
    outcomes: list[str] = []

    def loop() -> None:
        try:
            n = 0
            while True:
                n += 1
                cache.set(f"k{n % 100}", b"x" * (n % 500))
                cache.get(f"k{(n * 3) % 100}")
        except nearcache.CacheClosedError:
            outcomes.append("closed")
        except BaseException as exc:
            outcomes.append(repr(exc))

    pool = [threading.Thread(target=loop) for _ in range(4)]
    for t in pool:
        t.start()
    time.sleep(0.2)
    cache.close()
    for t in pool:
        t.join(timeout=10)
    assert outcomes == ["closed"] * 4


def test_forked_child_closing_its_inherited_handle_does_not_block_others(
    tmp_path: Path,
) -> None:
    """Regression: the attach lock belongs to the open file description that
    a forked child shares with its parent; the child's close() used to make
    it exclusive for both, and every newcomer blocked."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, 1 << 20, 4)
    cache.set("k", b"v")

    def close_inherited() -> None:
        cache.close()

    assert Child(close_inherited).wait().ok
    assert cache.get("k") == b"v"  # the parent is unaffected...
    proc = run_python(  # ...but can a newcomer still open the cache?
        f"""
        import signal
        signal.alarm(3)
        from nearcache._native import NativeCache
        print(NativeCache({path!r}, 0, create=False).get("k"))
        """
    )
    assert proc.returncode == 0, f"newcomer blocked or failed: {proc.stderr[-300:]}"
    assert proc.stdout.strip() == "b'v'"
