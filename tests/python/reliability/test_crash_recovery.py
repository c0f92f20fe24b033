"""Crash recovery: processes killed inside locks, racing creators, dead
lock owners across a "reboot", files resized under a mapping, full disks.

Every case runs the dangerous part in a child process, so that a hang or a
crash shows up as a failed test, not as a wedged or dead test run.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from nearcache import _native
from nearcache._native import NativeCache

from ._helpers import (
    Child,
    hold_in_child,
    in_hold,
    key_in_shard,
    kill_and_reap,
    mounted_tmpfs,
    run_python,
)

SIZE = 4096 + 4 * 64 * 1024


def fill(cache: NativeCache, n: int = 200) -> dict[str, bytes]:
    """Store ``n`` small entries (no eviction in SIZE) and return them."""
    data = {f"k{i}": f"value-{i}".encode() * 3 for i in range(n)}
    for key, value in data.items():
        cache.set(key, value)
    return data


def by_shard(cache: NativeCache, data: dict[str, bytes]) -> dict[int, dict[str, bytes]]:
    shards: dict[int, dict[str, bytes]] = {}
    for key, value in data.items():
        shards.setdefault(cache.shard_of(key), {})[key] = value
    return shards


# ------------------------------------------------------------- killed mid-write


def test_killed_holding_a_lock_mid_write_keeps_every_complete_entry(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    data = fill(cache)
    victim = cache.shard_of("k0")

    child = hold_in_child(path, "k0")
    ended = kill_and_reap(child)
    assert ended.signal == signal.SIGKILL

    # The next locker inherits the dead owner's lock, finds the shard
    # half-written (seq odd, index scribbled) and rebuilds its index from
    # the arena: every complete entry is kept, nothing is torn.
    for key, value in data.items():
        assert cache.get(key) == value, key
    stats = cache.shard_stats()[victim]
    assert (stats["salvages"], stats["resets"], stats["entries_lost"]) == (1, 0, 0)
    assert cache.stats()["corruptions"] == 0
    # The shard is usable again, from this process and from others.
    cache.set("k0", b"again")
    assert cache.get("k0") == b"again"
    other = Child(lambda: NativeCache(path, 0, create=False).get("k0"))
    assert other.wait().value == b"again"
    cache.check()


def test_waiters_blocked_on_the_dead_owner_are_released(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    cache.set("k0", b"v")
    holder = hold_in_child(path, "k0")
    # Several processes with a long lock timeout block on the held shard...
    waiters = [
        Child(lambda: NativeCache(path, 0, create=False, lock_timeout_ms=20_000).get("k0"))
        for _ in range(3)
    ]
    time.sleep(0.2)
    # ...and all get through, with the value (the shard was repaired, not
    # reset), once the holder is killed.
    kill_and_reap(holder)
    results = [w.wait(timeout=10) for w in waiters]
    assert all(r.ok for r in results), [r.error for r in results]
    assert [r.value for r in results] == [b"v", b"v", b"v"]
    stats = cache.shard_stats()[cache.shard_of("k0")]
    assert (stats["salvages"], stats["resets"], stats["lock_timeouts"]) == (1, 0, 0)


def test_kill_at_random_moments_inside_operations(tmp_path: Path) -> None:
    """Children writing in a loop are killed at random; nothing is ever torn."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, 4096 + 2 * 32 * 1024, 2)

    def writer(seed: int) -> None:
        c = NativeCache(path, 0, create=False)
        n = 0
        while True:
            n += 1
            key = f"k{(n * 7 + seed) % 300}"
            # The value repeats its key: a torn or foreign value shows.
            c.set(key, key.encode() * (1 + n % 60))
            c.incr("counter", 1)

    rng = random.Random(1234)
    for round_ in range(25):
        children = [Child(lambda s=s: writer(s)) for s in range(2)]
        time.sleep(rng.uniform(0.001, 0.03))
        for child in children:
            kill_and_reap(child)
        for i in range(300):
            got = cache.get(f"k{i}")
            if got is not None:
                unit = f"k{i}".encode()
                assert got == unit * (len(got) // len(unit)), (round_, i)
    assert cache.stats()["corruptions"] == 0
    # A write in every shard first: see test_check_passes_right_after_a_mid_write_repair.
    for shard in range(cache.shard_count):
        cache.set(key_in_shard(cache, shard), b"x")
    cache.check()


@pytest.mark.parametrize("repaired_by", ["lock", "reopen"])
def test_check_passes_right_after_a_mid_write_repair(tmp_path: Path, repaired_by: str) -> None:
    """Regression: the repaired shard used to keep an odd seq until its next
    write, so check() reported it as half-written."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    data = fill(cache)
    kill_and_reap(hold_in_child(path, "k0"))
    if repaired_by == "lock":
        assert cache.get("k0") == data["k0"]  # repairs the shard
    else:
        del cache  # everyone detaches; the next opener is alone and repairs
        cache = NativeCache(path, SIZE, 4)
        assert cache.get("k0") == data["k0"]
    cache.check()


# ------------------------------------------------------------- creation races


def test_racing_creators_end_up_sharing_one_file(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    start = tmp_path / "go"

    def create(i: int) -> tuple[int, int]:
        while not start.exists():
            time.sleep(0.0005)
        c = NativeCache(path, SIZE, 4)
        c.set(f"from-{i}", str(i).encode())
        st = os.stat(path)
        return st.st_ino, os.getpid()

    children = [Child(lambda i=i: create(i)) for i in range(8)]
    time.sleep(0.1)
    start.touch()
    results = [c.wait() for c in children]
    assert all(r.ok for r in results), [r.error for r in results]
    assert len({r.value[0] for r in results}) == 1  # one inode
    cache = NativeCache(path, SIZE, 4)
    assert {cache.get(f"from-{i}") for i in range(8)} == {str(i).encode() for i in range(8)}
    cache.check()
    assert sorted(os.listdir(tmp_path)) == ["c", "go"]  # no temporary files left


def test_creator_killed_before_initialising_never_publishes_a_half_file(
    tmp_path: Path,
) -> None:
    """Creators killed at random moments: the cache path is either absent or
    a complete cache, and nothing else is left behind (the file is built
    unnamed, with O_TMPFILE, and only linked once complete)."""
    rng = random.Random(99)
    big = 4096 + 64 * 1024 * 1024  # large enough that creation takes a while
    for attempt in range(12):
        path = str(tmp_path / f"c{attempt}")
        child = Child(lambda p=path: NativeCache(p, big, 64).set("k", b"v"))
        time.sleep(rng.uniform(0.0, 0.02))
        kill_and_reap(child)
        assert set(os.listdir(tmp_path)) <= {f"c{attempt}"}, "a killed creator left files"
        # Whatever the moment of the kill, opening works: the file is either
        # complete (the creator got that far) or created afresh now.
        cache = NativeCache(path, big, 64)
        assert cache.get("k") in (None, b"v")
        cache.check()
        del cache
        for name in os.listdir(tmp_path):
            os.unlink(tmp_path / name)


# ------------------------------------------------------------- dead owners at reopen


def test_lock_owner_died_then_everyone_detached_then_reopen(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    data = fill(cache)
    victim = cache.shard_of("k0")
    del cache  # detach (dropping the handle; see the close() test below)
    kill_and_reap(hold_in_child(path, "k0"))

    # The first opener is alone: it re-initialises every lock and repairs
    # the shard that was left half-written from its arena; nothing complete
    # is lost.
    def reopen() -> tuple[dict[str, bytes | None], int, int]:
        c = NativeCache(path, SIZE, 4)
        stats = c.shard_stats()[victim]
        return {key: c.get(key) for key in data}, stats["salvages"], stats["resets"]

    result = Child(reopen).wait(timeout=10)
    assert result.ok, result.error
    seen, salvages, resets = result.value
    assert seen == data
    assert (salvages, resets) == (1, 0)


def test_reboot_with_a_lock_held_by_a_process_that_no_longer_exists(tmp_path: Path) -> None:
    """A persistent cache file copied while a lock is held carries a lock
    word that names a process of another boot.  The first opener is alone:
    it must re-initialise the lock instead of waiting on it."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    data = fill(cache)
    victim = cache.shard_of("k0")
    kept = next(key for key in data if cache.shard_of(key) != victim)
    holder = hold_in_child(path, "k0")
    snapshot = tmp_path / "after-reboot"
    shutil.copyfile(path, snapshot)  # the file as the crash left it on disk
    os.chmod(snapshot, 0o600)
    kill_and_reap(holder)
    del cache

    proc = run_python(
        f"""
        import signal
        signal.alarm(10)
        from nearcache._native import NativeCache
        c = NativeCache({str(snapshot)!r}, 0, create=False)
        print(repr(c.get("k0")), repr(c.get({kept!r})))
        print(c.shard_stats()[{victim}]["salvages"])
        """,
        timeout=15,
    )
    assert proc.returncode == 0, proc.stderr
    values, salvages = proc.stdout.splitlines()
    assert values == f"{data['k0']!r} {data[kept]!r}"
    assert int(salvages) == 1


def test_reopen_after_close_does_not_block(tmp_path: Path) -> None:
    """Regression: close() used to keep the attach lock exclusive while the
    handle object lived, and every later open of the file blocked."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    cache.set("k", b"v")
    cache.close()  # the handle object stays alive (as after `with cache:`)
    proc = run_python(
        f"""
        import signal
        signal.alarm(3)
        from nearcache._native import NativeCache
        print(NativeCache({path!r}, {SIZE}, 4).get("k"))
        """
    )
    assert proc.returncode == 0, f"reopen blocked or failed: {proc.stderr[-300:]}"
    assert proc.stdout.strip() == "b'v'"


# ------------------------------------------------------------- resized under the mapping


def test_truncated_file_is_detected_by_check_and_at_open(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    fill(cache)
    os.truncate(path, 4096)
    with pytest.raises(_native.CorruptFileError, match="changed by another program"):
        cache.check()
    with pytest.raises(_native.CorruptFileError, match="truncated or extended"):
        NativeCache(path, 0, create=False)
    fresh = NativeCache(path, SIZE, 4, recreate=True)
    fresh.set("k", b"v")
    assert fresh.get("k") == b"v"
    fresh.check()


def test_extended_file_keeps_working_and_is_detected(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    data = fill(cache)
    with open(path, "ab") as f:
        f.write(b"\xff" * 8192)
    # The mapping still covers the original size: operations are unaffected.
    assert all(cache.get(k) == v for k, v in data.items())
    cache.set("new", b"value")
    with pytest.raises(_native.CorruptFileError, match="changed by another program"):
        cache.check()
    with pytest.raises(_native.CorruptFileError, match="truncated or extended"):
        NativeCache(path, 0, create=False)


def _touch_every_shard_after_truncation(path: str) -> str:
    cache = NativeCache(path, SIZE, 4)
    fill(cache)
    os.truncate(path, 4096)  # someone else shrinks the file under our mapping
    outcomes = []
    for shard in range(cache.shard_count):
        try:
            outcomes.append(repr(cache.get(key_in_shard(cache, shard))))
        except _native.Error as exc:
            outcomes.append(type(exc).__name__)
    return ",".join(outcomes)


def test_truncated_file_does_not_kill_the_process(tmp_path: Path) -> None:
    """Touching a page past the new end of file would raise SIGBUS: the
    engine turns it into a miss for the call in flight and a clear error
    for every later call on that handle."""
    result = Child(lambda: _touch_every_shard_after_truncation(str(tmp_path / "c"))).wait()
    assert result.signal is None, f"killed by {signal.Signals(result.signal).name}"
    assert result.ok, result.error
    outcomes = result.value.split(",")
    assert set(outcomes) <= {"None", "CorruptFileError"}, outcomes
    first_error = outcomes.index("CorruptFileError")
    assert all(o == "CorruptFileError" for o in outcomes[first_error:]), outcomes


def test_truncated_handle_reports_the_truncation(tmp_path: Path) -> None:
    def scenario() -> tuple[str, str]:
        cache = NativeCache(str(tmp_path / "c"), SIZE, 4)
        fill(cache)
        os.truncate(tmp_path / "c", 4096)
        for shard in range(cache.shard_count):  # fault somewhere
            try:
                cache.get(key_in_shard(cache, shard))
            except _native.CorruptFileError:
                break
        errors = []
        for call in (lambda: cache.set("k", b"v"), cache.check):
            try:
                call()
                errors.append("no error")
            except _native.Error as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
        return errors[0], errors[1]

    result = Child(scenario).wait()
    assert result.ok, result.error
    for message in result.value:
        assert message.startswith("CorruptFileError"), message
        assert "truncat" in message, message


def _hammer_one_shard(path: str, ops: int) -> str:
    cache = NativeCache(path, 0, create=False)
    try:
        for n in range(ops):
            cache.set(f"k{n % 50}", b"x" * (n % 100))
            cache.get(f"k{(n * 7) % 50}")
    except _native.CorruptFileError as exc:  # an acceptable way to refuse
        return f"refused: {exc}"
    return "done"


def test_file_truncated_and_extended_back_does_not_wedge(tmp_path: Path) -> None:
    """Regression: the zeroed shard mutexes were no longer robust nor
    process-shared, and contending processes lost wake-ups and blocked
    forever.  A zeroed shard header is now refused with CorruptFileError."""
    path = str(tmp_path / "c")
    size = 4096 + 64 * 1024
    cache = NativeCache(path, size, 1)
    fill(cache, 100)
    os.truncate(path, 4096)
    os.truncate(path, size)  # same size again: every shard page now reads as zeros
    children = [Child(lambda: _hammer_one_shard(path, 30_000)) for _ in range(3)]
    try:
        results = [child.wait(timeout=6) for child in children]
    finally:
        for child in children:
            child.reap()
    assert all(r.ok for r in results), results
    assert all(r.value == "done" or r.value.startswith("refused: ") for r in results), results


# ------------------------------------------------------------- full file systems


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs mounted for the test (root only)."""
    with mounted_tmpfs(tmp_path, "1m") as mnt:
        yield mnt


def test_full_tmpfs_on_create_is_a_clear_error(small_tmpfs: Path) -> None:
    """Creation reserves the file header and every shard's header and
    first index page (8 KiB a shard): a cache whose headers do not fit
    fails at once, clearly, and leaves nothing behind."""
    path = str(small_tmpfs / "c")
    with pytest.raises(_native.CacheFullError, match="cannot reserve"):
        NativeCache(path, 1 << 30, 256)  # 256 shards: 2 MiB of headers
    assert os.listdir(small_tmpfs) == []  # nothing left behind
    # A cache larger than the file system is fine (it holds what it
    # stores); a second one whose headers no longer fit is refused.
    big = NativeCache(path, 64 << 20, 64)
    big.set("k", b"v")
    with pytest.raises(_native.CacheFullError):
        NativeCache(str(small_tmpfs / "d"), 1 << 30, 128)
    assert sorted(os.listdir(small_tmpfs)) == ["c"]
    assert big.get("k") == b"v"


def test_file_size_limit_on_create_is_a_clear_error(tmp_path: Path) -> None:
    """Without a small file system: RLIMIT_FSIZE in a child makes the space
    reservation fail with EFBIG, which must be the same clear error."""
    path = str(tmp_path / "c")

    def create() -> str:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
        try:
            NativeCache(path, 4 << 20, 4)
        except _native.CacheFullError as exc:
            return f"full: {exc}"
        return "created"

    result = Child(create).wait()
    assert result.ok, result.error
    assert result.value.startswith("full: ") and "cannot reserve" in result.value
    assert os.listdir(tmp_path) == []


def test_hold_helper_really_holds_the_lock(tmp_path: Path) -> None:
    """The helper used above: while the child sleeps in the hold, another
    process (with a long lock timeout) cannot lock the shard; other shards
    stay available."""
    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)
    other = key_in_shard(cache, (cache.shard_of("k0") + 1) % 4)
    holder = hold_in_child(path, "k0")
    assert in_hold(holder.pid)
    blocked = Child(lambda: NativeCache(path, 0, create=False, lock_timeout_ms=60_000).get("k0"))
    free = Child(lambda: NativeCache(path, 0, create=False).get(other))
    assert free.wait(timeout=10).ok
    time.sleep(0.2)
    assert os.waitpid(blocked.pid, os.WNOHANG) == (0, 0)  # still blocked
    kill_and_reap(holder)
    assert blocked.wait(timeout=10).ok
