"""A Cache opened in a parent keeps working in forked children (gunicorn --preload)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

from nearcache import Cache


def _child_work(cache: Cache, index: int) -> int:
    """What a forked worker does with the parent's cache; returns an exit code."""
    try:
        if cache.get("from-parent") != {"hello": "children"}:
            return 2
        for i in range(200):
            cache.set(f"child{index}:{i}", [index, i])
        cache.incr("children-done")

        @cache.memoize(name="fork.square")
        def square(x: int) -> int:
            cache.incr("square-runs")
            return x * x

        if square(12) != 144:
            return 3
        with cache.lock("fork-lock", timeout=10):
            cache.set("last-locker", index)
        return 0
    except BaseException:
        return 1


def test_cache_opened_before_fork_works_in_children(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "c", size="4MiB") as cache:
        cache.set("from-parent", {"hello": "children"})
        pids = []
        for index in range(4):
            pid = os.fork()
            if pid == 0:
                os._exit(_child_work(cache, index))
            pids.append(pid)
        for pid in pids:
            _, status = os.waitpid(pid, 0)
            assert os.waitstatus_to_exitcode(status) == 0
        assert cache.get("children-done") == 4
        for index in range(4):
            assert cache.get(f"child{index}:199") == [index, 199]
        assert 1 <= cache.get("square-runs") <= 4  # children raced; every one got 144
        assert cache.get("last-locker") in range(4)
        cache.set("parent-after", True)  # the parent's handle still works too
        assert cache.get("parent-after") is True
        assert cache.check()["entries"] == len(cache)


def _pool_task(args: tuple[str, int]) -> int:
    path, value = args
    cache = _POOL_CACHE
    assert cache is not None and cache.path == path
    cache.set(f"pool:{value}", value * 2)
    got = cache.get(f"pool:{value}")
    assert isinstance(got, int)
    return got


_POOL_CACHE: Cache | None = None


def test_multiprocessing_fork_pool_inherits_the_cache(tmp_path: Path) -> None:
    global _POOL_CACHE
    with Cache(path=tmp_path / "c", size="1MiB") as cache:
        _POOL_CACHE = cache
        try:
            with multiprocessing.get_context("fork").Pool(2) as pool:
                results = pool.map(_pool_task, [(cache.path, i) for i in range(20)])
        finally:
            _POOL_CACHE = None
        assert results == [i * 2 for i in range(20)]
        assert cache.get_many([f"pool:{i}" for i in range(20)]) == {
            f"pool:{i}": i * 2 for i in range(20)
        }


def test_parent_and_child_write_concurrently(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "c", size="1MiB") as cache:
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for i in range(2000):
                    cache.set("shared", ("child", i))
                    value = cache.get("shared")
                    if not (isinstance(value, tuple) and value[0] in ("child", "parent")):
                        code = 2
            except BaseException:
                code = 1
            os._exit(code)
        for i in range(2000):
            cache.set("shared", ("parent", i))
            value = cache.get("shared")
            assert isinstance(value, tuple) and value[0] in ("child", "parent")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
