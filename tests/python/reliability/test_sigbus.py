"""The SIGBUS path: a cache file truncated under its mappings.

Every case runs in a fresh interpreter, so that a crash or a hang is a
failed test and not a dead test run:

* truncation at every page boundary of a small cache, with Python's
  ``faulthandler`` off, installed before the cache is opened, and installed
  after it (re-installed after every fault, so it is always on top);
* ``kill -BUS`` (a sent signal, not a fault) goes to the disposition the
  process had before nearcache: ignored, a Python handler, or the default;
* a process that faults while it holds a shard lock must not wedge the
  other processes that need that shard.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from nearcache._native import NativeCache

from ._helpers import run_python

SHARD = 16 * 1024
SHARDS = 4
SIZE = 4096 + SHARDS * SHARD
PAGES = SIZE // 4096
# Enough value bytes to fill every shard's arena to its end (the cache
# evicts), so that every truncated page holds entries a get must touch.
VALUE_REPEAT = 40


@pytest.mark.parametrize("faulthandler_mode", ["off", "before", "after"])
def test_truncation_at_every_page_boundary(tmp_path: Path, faulthandler_mode: str) -> None:
    proc = run_python(
        f"""
        import faulthandler, os
        from nearcache._native import NativeCache, CorruptFileError
        mode = {faulthandler_mode!r}
        if mode == "before":
            faulthandler.enable()
        for page in range({PAGES}):
            path = os.path.join({str(tmp_path)!r}, f"c{{page}}")
            cache = NativeCache(path, {SIZE}, {SHARDS})
            keys = [f"k{{i}}" for i in range(300)]
            value = lambda k: k.encode() * {VALUE_REPEAT}
            for k in keys:
                cache.set(k, value(k))
            if mode == "after":
                faulthandler.disable()
                faulthandler.enable()  # installed on top of nearcache's handler
            os.truncate(path, page * 4096)
            outcomes = set()
            for k in keys:
                for op in (lambda: cache.get(k), lambda: cache.set(k, b"new")):
                    try:
                        got = op()
                        outcomes.add("ok" if got in (None, value(k), b"new") else "BAD")
                    except CorruptFileError:
                        outcomes.add("truncated")
            print(page, ",".join(sorted(outcomes)), flush=True)
            del cache
            os.unlink(path)
        """,
        timeout=120,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    assert len(lines) == PAGES, proc.stdout
    for line in lines:
        page, outcomes = line.split()
        assert "BAD" not in outcomes, line
        if int(page) < PAGES - 1:  # some shard page is gone: the handle notices
            assert "truncated" in outcomes, line


@pytest.mark.parametrize("before", ["ignore", "python-handler"])
def test_kill_bus_goes_to_the_previous_disposition_and_keeps_protection(
    tmp_path: Path, before: str
) -> None:
    """A sent SIGBUS is not a fault on our mapping: it reaches the handler
    the process installed before (or is ignored), and a truncation after it
    is still survived."""
    path = str(tmp_path / "c")
    proc = run_python(
        f"""
        import os, signal
        from nearcache._native import NativeCache, CorruptFileError
        seen = []
        if {before!r} == "ignore":
            signal.signal(signal.SIGBUS, signal.SIG_IGN)
        else:
            signal.signal(signal.SIGBUS, lambda s, f: seen.append(s))
        cache = NativeCache({path!r}, {SIZE}, {SHARDS})
        cache.set("k", b"v")
        os.kill(os.getpid(), signal.SIGBUS)
        print("after kill", seen, cache.get("k"), flush=True)
        os.truncate({path!r}, 4096)
        try:
            for i in range(100):
                cache.get(f"k{{i}}")
            print("no fault")
        except CorruptFileError:
            print("truncation survived")
        """,
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    first, second = proc.stdout.splitlines()
    expected_seen = "[]" if before == "ignore" else f"[{int(signal.SIGBUS)}]"
    assert first == f"after kill {expected_seen} b'v'"
    assert second == "truncation survived"


def test_kill_bus_with_the_default_disposition_still_ends_the_process(tmp_path: Path) -> None:
    """As without nearcache: a sent SIGBUS with no handler terminates."""
    path = str(tmp_path / "c")
    proc = run_python(
        f"""
        import os, signal
        from nearcache._native import NativeCache
        cache = NativeCache({path!r}, {SIZE}, {SHARDS})
        os.kill(os.getpid(), signal.SIGBUS)
        print("still alive")
        """,
    )
    assert proc.returncode == -signal.SIGBUS, (proc.returncode, proc.stdout, proc.stderr)


def test_a_fault_inside_a_shard_lock_does_not_wedge_other_processes(tmp_path: Path) -> None:
    """The file is cut to 8192 bytes: shard 0's header page (its lock word)
    stays, its arena pages go. A process faulting inside shard 0's lock
    stays alive; another process must get through at once, not wait for a
    lock whose unlock went to the first process's private pages."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, SHARDS)
    keys = [f"k{i}" for i in range(2000) if cache.shard_of(f"k{i}") == 0][:60]
    for k in keys:
        cache.set(k, k.encode() * 20)  # ~60 entries of ~100 bytes: past page 2
    del cache
    holder_code = f"""
        import time
        from nearcache._native import NativeCache, CorruptFileError
        cache = NativeCache({path!r}, 0, create=False)
        print("ready", flush=True)
        try:
            while True:
                for k in {keys!r}:
                    cache.get(k)
        except CorruptFileError:
            print("faulted", flush=True)
        time.sleep(60)  # stay alive: a dead holder would be easy
        """
    waiter_code = f"""
        import sys, time
        from nearcache._native import NativeCache, CorruptFileError, ShardLockTimeoutError
        cache = NativeCache({path!r}, 0, create=False, lock_timeout_ms=20_000)
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.monotonic()
        try:
            outcome = repr(cache.get({keys[-1]!r}))
        except CorruptFileError:
            outcome = "truncated"
        except ShardLockTimeoutError:
            outcome = "timeout"
        print(outcome, round(time.monotonic() - start, 3), flush=True)
        """
    holder, waiter = (
        subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for code in (holder_code, waiter_code)
    )
    try:
        assert holder.stdout is not None and waiter.stdout is not None
        assert waiter.stdin is not None
        assert holder.stdout.readline().strip() == "ready"
        assert waiter.stdout.readline().strip() == "ready"
        time.sleep(0.05)
        os.truncate(path, 8192)
        assert holder.stdout.readline().strip() == "faulted"
        waiter.stdin.write("go\n")
        waiter.stdin.flush()
        outcome, seconds = waiter.stdout.readline().split()
        assert outcome in ("None", "truncated"), outcome
        assert float(seconds) < 5, "waited on the lock the faulting process held"
    finally:
        for p in (holder, waiter):
            p.kill()
            p.wait()
