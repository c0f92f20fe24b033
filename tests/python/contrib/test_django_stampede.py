"""Stampede-free ``get_or_set`` and ``cache_page`` of the Django backends.

Several processes (forked, so they share the cache file as gunicorn's
workers do) miss the same key at the same moment: one computes, the others
wait for its result.  A holder that dies (SIGKILL) or fails frees the key
for the next caller; one that hangs delays the others by a bounded time.
The shared counters in ``NearCache.stats()`` are checked against what the
processes did.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory, override_settings

from nearcache.bench.backends.djangocaches import ensure_django
from nearcache.contrib.django import STAMPEDE_COUNTERS, NearCache, TieredNearCache, cache_page
from nearcache.locks import Lock

_names = count()
FORK = multiprocessing.get_context("fork")


@pytest.fixture
def location(tmp_path: Path) -> str:
    return str(tmp_path / f"stampede-{next(_names)}")


def make(location: str, **options: Any) -> NearCache:
    options.setdefault("size", "4MiB")
    return NearCache(location, {"OPTIONS": options})


def counters(backend: NearCache) -> dict[str, int]:
    stats = backend.stats()
    return {name: stats[name] for name in STAMPEDE_COUNTERS if stats[name]}


def run_together(procs: int, target: Callable[..., None], *args: Any) -> None:
    """Run ``target(index, barrier, *args)`` in ``procs`` forked processes; all must exit 0."""
    barrier = FORK.Barrier(procs)
    children = [FORK.Process(target=target, args=(i, barrier, *args)) for i in range(procs)]
    for child in children:
        child.start()
    for child in children:
        child.join(60)
    assert [c.exitcode for c in children] == [0] * procs


# --------------------------------------------------------------------- get_or_set


def _slow_get_or_set(index: int, barrier: Any, location: str, log: str) -> None:
    backend = make(location)

    def compute() -> str:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.2)
        return "computed once"

    barrier.wait()
    value = backend.get_or_set("fragment", compute, 60)
    with open(f"{log}.{index}", "w") as f:
        f.write(value)


def test_get_or_set_computes_once_across_processes(location: str, tmp_path: Path) -> None:
    log = str(tmp_path / "computes")
    run_together(6, _slow_get_or_set, location, log)
    assert len(Path(log).read_text().splitlines()) == 1
    assert {Path(f"{log}.{i}").read_text() for i in range(6)} == {"computed once"}
    backend = make(location)
    assert counters(backend) == {"get_or_set_computes": 1, "get_or_set_waits": 5}
    assert backend.get("fragment") == "computed once"


def _die_holding_the_lock(location: str) -> None:
    backend = make(location, stampede_wait=0.5)

    def compute() -> str:
        os.kill(os.getpid(), signal.SIGKILL)
        return "never"

    backend.get_or_set("k", compute)


def test_a_killed_computation_frees_the_key_after_stampede_wait(location: str) -> None:
    child = FORK.Process(target=_die_holding_the_lock, args=(location,))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    backend = make(location, stampede_wait=0.5)
    assert Lock(backend.cache, "django::1:k").locked()  # the dead holder's lock
    start = time.monotonic()
    assert backend.get_or_set("k", lambda: "recomputed") == "recomputed"
    waited = time.monotonic() - start
    assert 0.3 < waited < 5.0  # until the lock expired, then took it over
    assert counters(backend) == {"get_or_set_computes": 2}  # the dead one's and ours
    assert not Lock(backend.cache, "django::1:k").locked()


def test_a_hung_computation_delays_others_by_twice_stampede_wait(location: str) -> None:
    backend = make(location, stampede_wait=0.2)
    hog = Lock(backend.cache, "django::1:k", timeout=0, expire=60)  # outlives the bound
    assert hog.acquire()
    start = time.monotonic()
    assert backend.get_or_set("k", lambda: "anyway") == "anyway"
    assert 0.35 < time.monotonic() - start < 5.0
    assert counters(backend) == {"get_or_set_computes": 1, "get_or_set_fallbacks": 1}
    hog.release()


def test_a_failing_computation_frees_the_key(location: str) -> None:
    backend = make(location)

    def broken() -> str:
        raise RuntimeError("backend down")

    with pytest.raises(RuntimeError, match="backend down"):
        backend.get_or_set("k", broken)
    assert not Lock(backend.cache, "django::1:k").locked()
    assert backend.get_or_set("k", lambda: 1) == 1


def test_get_or_set_keeps_djangos_semantics(location: str) -> None:
    backend = make(location)
    assert backend.get_or_set("plain", "value") == "value"  # not callable: stored as is
    assert backend.get_or_set("plain", "other") == "value"
    assert backend.get_or_set("none", None) is None
    assert backend.has_key("none")
    assert backend.get_or_set("none", "default") is None  # a stored None is a hit
    assert backend.get_or_set("gone", lambda: 7, timeout=0) == 7  # returned, not stored
    assert not backend.has_key("gone")
    assert backend.get_or_set("v", lambda: 2, version=2) == 2
    assert backend.get("v", version=2) == 2 and backend.get("v") is None
    assert counters(backend) == {"get_or_set_computes": 2}
    off = make(location, stampede_wait=0)
    assert off.stampede_lock("x") is None
    assert off.get_or_set("off", lambda: 3) == 3


@pytest.mark.parametrize("bad", [-1, "soon", float("inf")])
def test_bad_stampede_wait(location: str, bad: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="stampede_wait"):
        make(location, stampede_wait=bad)


def test_aget_or_set_waits_without_blocking_the_loop(location: str) -> None:
    backend = make(location)
    holder = backend.stampede_lock(":1:k")
    assert holder is not None and holder.acquire()
    ticks: list[float] = []

    async def scenario() -> Any:
        async def ticker() -> None:
            for _ in range(10):
                ticks.append(time.monotonic())
                await asyncio.sleep(0.01)
            backend.set("k", "from the holder")
            holder.release()

        waiting = asyncio.ensure_future(backend.aget_or_set("k", lambda: "duplicate"))
        await ticker()
        return await waiting

    assert asyncio.run(scenario()) == "from the holder"
    assert len(ticks) == 10
    assert counters(backend) == {"get_or_set_waits": 1}


def test_threads_of_one_process_compute_once(location: str) -> None:
    backend = make(location)
    computes: list[int] = []
    results: list[Any] = []

    def compute() -> int:
        computes.append(1)
        time.sleep(0.1)
        return 42

    threads = [
        threading.Thread(target=lambda: results.append(backend.get_or_set("t", compute)))
        for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(computes), results) == (1, [42] * 8)


def test_tiered_get_or_set_locks_on_the_hosts_l1(tmp_path: Path) -> None:
    l1 = {"driver": "nearcache", "path": str(tmp_path / "l1"), "size": "1MiB"}
    tiered = TieredNearCache("memory://?max_entries=100", {"OPTIONS": {"l1": l1}})
    computes: list[int] = []

    def compute() -> str:
        computes.append(1)
        time.sleep(0.1)
        return "v"

    threads = [threading.Thread(target=tiered.get_or_set, args=("k", compute)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(computes) == 1
    assert tiered.cache.l2.get(":1:k") == "v"
    assert tiered.stats()["get_or_set_computes"] == 1
    tiered.clear()


# --------------------------------------------------------------------- cache_page


@pytest.fixture
def page_settings(location: str) -> Iterator[str]:
    ensure_django()
    caches = {
        "default": {
            "BACKEND": "nearcache.contrib.django.NearCache",
            "LOCATION": location,
            "OPTIONS": {"size": "4MiB"},
        },
        "locmem": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": location,
        },
    }
    with override_settings(CACHES=caches, ALLOWED_HOSTS=["testserver"]):
        yield location


def _page_view(log: str, status: int = 200, private: bool = False) -> Callable[..., Any]:
    def view(request: HttpRequest) -> HttpResponse:
        with open(log, "a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(0.2)
        response = HttpResponse(f"page {request.path} by {os.getpid()}", status=status)
        if private:
            response["Cache-Control"] = "private"
        return response

    return view


def _get_page(index: int, barrier: Any, log: str, alias: str | None) -> None:
    view = cache_page(60, cache=alias)(_page_view(log))
    barrier.wait()
    response = view(RequestFactory().get("/page/1/"))
    with open(f"{log}.{index}", "wb") as f:
        f.write(response.content)


def test_cache_page_renders_once_across_processes(page_settings: str, tmp_path: Path) -> None:
    log = str(tmp_path / "renders")
    run_together(5, _get_page, log, None)
    assert len(Path(log).read_text().splitlines()) == 1
    pages = {Path(f"{log}.{i}").read_bytes() for i in range(5)}
    assert len(pages) == 1 and next(iter(pages)).startswith(b"page /page/1/ by ")
    backend = make(page_settings)
    assert counters(backend) == {"page_renders": 1, "page_waits": 4}


def test_cache_page_on_another_backend_locks_with_add(page_settings: str, tmp_path: Path) -> None:
    log = str(tmp_path / "renders")
    view = cache_page(60, cache="locmem")(_page_view(log))
    threads = [
        threading.Thread(target=view, args=(RequestFactory().get("/page/2/"),)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(Path(log).read_text().splitlines()) == 1


def test_uncacheable_pages_are_not_serialized(page_settings: str, tmp_path: Path) -> None:
    log = str(tmp_path / "renders")
    view = cache_page(60)(_page_view(log, private=True))
    assert view(RequestFactory().get("/private/")).status_code == 200
    # The first render learnt that the page is not cacheable: the next ones
    # render at once, concurrently, without waiting for each other.
    start = time.monotonic()
    threads = [
        threading.Thread(target=view, args=(RequestFactory().get("/private/"),)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(Path(log).read_text().splitlines()) == 5
    assert time.monotonic() - start < 0.6  # 4 renders of 0.2 s in parallel, not in turn


def test_a_failing_view_frees_the_page(page_settings: str, tmp_path: Path) -> None:
    calls: list[int] = []

    def view(request: HttpRequest) -> HttpResponse:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first render fails")
        return HttpResponse("second")

    wrapped = cache_page(60)(view)
    with pytest.raises(RuntimeError):
        wrapped(RequestFactory().get("/flaky/"))
    start = time.monotonic()
    assert wrapped(RequestFactory().get("/flaky/")).content == b"second"
    assert time.monotonic() - start < 1.0  # the lock was released, not left to expire
    assert wrapped(RequestFactory().get("/flaky/")).content == b"second"  # cached now
    assert len(calls) == 2


def _walk_pages(index: int, barrier: Any, log: str, pages: int) -> None:
    def view(request: HttpRequest) -> HttpResponse:
        with open(log, "a") as f:
            f.write(f"{request.path}\n")
        time.sleep(0.003)
        return HttpResponse(f"page {request.path}")

    # Widen the window between learning the Vary headers (the header key's
    # set) and storing the page (this set).
    plain_set = NearCache.set

    def slow_page_set(self: NearCache, key: Any, *args: Any, **kwargs: Any) -> Any:
        if "cache_page" in str(key):
            time.sleep(0.01)
        return plain_set(self, key, *args, **kwargs)

    # ... and the one between a waiter seeing the URL's lock free and its
    # look-up of the page's cache key (in which the first render may start
    # and learn the Vary headers).
    plain_locked = Lock.locked

    def slow_locked(self: Lock) -> bool:
        held = plain_locked(self)
        time.sleep(0.005)
        return held

    NearCache.set = slow_page_set  # type: ignore[method-assign]  # this child only
    Lock.locked = slow_locked  # type: ignore[method-assign]
    wrapped = cache_page(60)(view)
    factory = RequestFactory()
    barrier.wait()
    for n in range(pages):
        assert wrapped(factory.get(f"/walk/{n}/")).status_code == 200


def test_processes_walking_the_same_pages_render_each_once(
    page_settings: str, tmp_path: Path
) -> None:
    # Each page is missed by every process at about the same time, while its
    # first render learns the Vary headers and stores the page: the window
    # where a variant's lock could be taken before the page is stored.
    log = str(tmp_path / "renders")
    run_together(6, _walk_pages, log, 60)
    renders = Path(log).read_text().split()
    assert len(renders) == len(set(renders)) == 60
