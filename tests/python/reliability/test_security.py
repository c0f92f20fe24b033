"""Hostile environment and hostile files: other users' files, planted
symlinks, world-writable directories, crafted headers, bytes changed under
a live mapping, and tampered signed values.

Cases that could crash the interpreter run in a forked child.
"""

from __future__ import annotations

import mmap
import os
import pickle
import pwd
import shutil
import struct
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import nearcache
from nearcache import _native
from nearcache._native import NativeCache

from ._helpers import Child, rewrite_header

SIZE = 4096 + 4 * 64 * 1024
SHARD = 64 * 1024
ITEMS_OFFSET = 88  # shard header: live entry count (u64)

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown files")


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A 0755 directory that other users can traverse (pytest's tmp_path is 0700)."""
    directory = Path(tempfile.mkdtemp(prefix="nearcache-security-"))
    directory.chmod(0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def nobody() -> tuple[int, int]:
    try:
        entry = pwd.getpwnam("nobody")
    except KeyError:
        pytest.skip("no 'nobody' user")
    return entry.pw_uid, entry.pw_gid


# ------------------------------------------------------------------ ownership


@root_only
def test_file_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    NativeCache(path, SIZE, 4).set("k", b"v")
    uid, gid = nobody()
    os.chown(path, uid, gid)
    with pytest.raises(nearcache.PermissionDeniedError, match=f"owned by uid {uid}"):
        NativeCache(path, 0, create=False)
    # Sharing is an explicit choice.
    shared = NativeCache(path, 0, create=False, allow_foreign_owner=True)
    assert shared.get("k") == b"v"


@root_only
def test_another_user_cannot_use_or_replace_our_cache(open_dir: Path) -> None:
    """A second user (nobody) tries to open, and to plant a file in, the
    private directory of another user."""
    directory = open_dir / "private"
    path = str(directory / "c")
    NativeCache(path, SIZE, 4).set("k", b"v")  # creates the directory 0700
    uid, gid = nobody()

    def as_nobody() -> list[str]:
        os.setgid(gid)
        os.setuid(uid)
        outcomes = []
        for attempt in (
            lambda: NativeCache(path, 0, create=False),
            lambda: NativeCache(str(directory / "planted"), SIZE, 4),
        ):
            try:
                attempt()
                outcomes.append("opened")
            except nearcache.Error as exc:
                outcomes.append(type(exc).__name__)
        return outcomes

    result = Child(as_nobody).wait()
    assert result.ok, result.error
    assert result.value == ["PermissionDeniedError", "PermissionDeniedError"]
    assert os.listdir(directory) == ["c"]


@root_only
def test_cache_of_another_user_in_a_shared_directory_is_refused(open_dir: Path) -> None:
    """The other way round: nobody creates a cache; we refuse to use it."""
    directory = open_dir / "shared"
    directory.mkdir()
    uid, gid = nobody()
    os.chown(directory, uid, gid)
    path = str(directory / "c")

    def create_as_nobody() -> None:
        os.setgid(gid)
        os.setuid(uid)
        NativeCache(path, SIZE, 4).set("k", pickle.dumps("planted"))

    assert Child(create_as_nobody).wait().ok
    assert os.stat(path).st_uid == uid
    # Refused for the directory (another user's) before the file is looked at.
    with pytest.raises(nearcache.PermissionDeniedError, match="belongs to uid"):
        NativeCache(path, SIZE, 4)


def test_group_or_world_writable_file_is_refused(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    NativeCache(path, SIZE, 4)
    for mode in (0o620, 0o602, 0o666):
        os.chmod(path, mode)
        with pytest.raises(nearcache.PermissionDeniedError, match="writable by group or others"):
            NativeCache(path, 0, create=False)
    os.chmod(path, 0o600)
    NativeCache(path, 0, create=False)


def test_created_files_and_directories_are_private(tmp_path: Path) -> None:
    path = tmp_path / "new" / "deeper" / "c"
    NativeCache(str(path), SIZE, 4)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.parent.stat().st_mode & 0o777 == 0o700


# ------------------------------------------------------------------ symlinks


@pytest.mark.parametrize("target", ["victim", "cache", "dangling"])
def test_symlink_planted_at_the_cache_path_is_refused(tmp_path: Path, target: str) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious data")
    real_cache = tmp_path / "real-cache"
    NativeCache(str(real_cache), SIZE, 4)
    link = tmp_path / "c"
    pointee = {"victim": victim, "cache": real_cache, "dangling": tmp_path / "nowhere"}[target]
    link.symlink_to(pointee)
    with pytest.raises(nearcache.PermissionDeniedError, match="symbolic link"):
        NativeCache(str(link), SIZE, 4)
    with pytest.raises(nearcache.PermissionDeniedError, match="symbolic link"):
        NativeCache(str(link), SIZE, 4, recreate=True)
    assert victim.read_bytes() == b"precious data"
    assert not (tmp_path / "nowhere").exists()
    assert link.is_symlink()


def test_special_files_at_the_cache_path_are_refused(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    with pytest.raises(nearcache.Error):
        NativeCache(str(tmp_path / "fifo"), SIZE, 4, create=False)
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(nearcache.Error):
        NativeCache(str(tmp_path / "dir"), SIZE, 4)


# ------------------------------------------------------------------ directories


def test_world_writable_directory_is_refused_unless_sticky(tmp_path: Path) -> None:
    directory = tmp_path / "open"
    directory.mkdir()
    os.chmod(directory, 0o777)
    with pytest.raises(nearcache.PermissionDeniedError, match="world-writable"):
        NativeCache(str(directory / "c"), SIZE, 4)
    assert os.listdir(directory) == []
    # The sticky bit (as on /tmp and /dev/shm) stops others from replacing
    # our file: then the directory is acceptable.
    os.chmod(directory, 0o1777)
    NativeCache(str(directory / "c"), SIZE, 4).set("k", b"v")


# ------------------------------------------------------------------ crafted files


@pytest.mark.parametrize(
    "fields",
    [
        {"shard_count": 0},
        {"shard_count": 3},
        {"shard_count": 1 << 31},
        {"shard_size": 0},
        {"shard_size": 4095},
        {"shard_size": 1 << 62},
        {"slots": 0},
        {"slots": 63},
        {"slots": 1 << 20},
        {"total_size": 1},
        {"shard_count": 8, "total_size": 4096 + 8 * SHARD},
    ],
    ids=repr,
)
def test_crafted_header_fields_are_refused(tmp_path: Path, fields: dict[str, int]) -> None:
    path = str(tmp_path / "c")
    NativeCache(path, SIZE, 4).set("k", b"v")
    rewrite_header(path, **fields)

    def open_it() -> str:
        try:
            NativeCache(path, 0, create=False)
        except nearcache.Error as exc:
            return type(exc).__name__
        return "opened"

    result = Child(open_it).wait()
    assert result.signal is None and result.ok, result
    assert result.value == "CorruptFileError"


def test_header_with_an_overflowing_slot_count_is_refused(tmp_path: Path) -> None:
    """Found by fuzzing the open path: 256 + slots * 8 wrapped for slots =
    2**61, the header was accepted and the first lookup indexed far outside
    the mapping (SIGSEGV).  Fixed in the engine; kept as a regression test."""
    path = str(tmp_path / "c")
    NativeCache(path, SIZE, 4).set("k", b"v")
    rewrite_header(path, slots=1 << 61)

    def open_and_read() -> str:
        try:
            NativeCache(path, 0, create=False).get("k")
        except nearcache.Error as exc:
            return type(exc).__name__
        return "opened"

    result = Child(open_and_read).wait()
    assert result.signal is None, f"killed by signal {result.signal}"
    assert result.value == "CorruptFileError"


def _scribble_items_then_write(path: str, items: int) -> str:
    cache = NativeCache(path, 0, create=False)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as raw:
        # Another party with write access changes a counter under our feet.
        struct.pack_into("<Q", raw, 4096 + ITEMS_OFFSET, items)
    try:
        for i in range(2000):  # enough to fill shard 0 and compact it
            cache.set(f"k{i}", b"x" * 200)
    except nearcache.Error as exc:
        return type(exc).__name__
    except BaseException as exc:  # a Rust panic surfaces as PanicException
        return f"{type(exc).__name__}: {exc}"
    return "ok"


@pytest.mark.parametrize("items", [1 << 40, 1 << 62])
def test_corrupted_counter_under_a_live_mapping_is_survived(tmp_path: Path, items: int) -> None:
    """Regression (found by fuzzing): compaction sized a vector from this
    counter, and the process aborted (allocation failure) or panicked."""
    path = str(tmp_path / "c")
    NativeCache(path, 4096 + SHARD, 1)
    result = Child(lambda: _scribble_items_then_write(path, items)).wait()
    assert result.signal is None, f"killed by signal {result.signal}"
    assert result.value == "ok", result.value


def test_garbage_in_a_live_mapping_never_crashes(tmp_path: Path) -> None:
    """Random bytes written over shard data (not the lock words nor the
    counters above) while attached: operations keep working, damaged shards
    are reset, and the file checks clean after a clear()."""
    import random

    path = str(tmp_path / "c")
    cache = NativeCache(path, SIZE, 4)

    def hammer() -> str:
        rng = random.Random(7)
        c = NativeCache(path, 0, create=False)
        with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as raw:
            for round_ in range(300):
                for i in range(30):
                    c.set(f"k{i}", bytes([i]) * (1 + (i * 37 + round_) % 900))
                shard = rng.randrange(4)
                base = 4096 + shard * SHARD
                # Skip the shard header: its lock word and its magic word (a
                # shard whose magic is overwritten refuses service, by design).
                at = base + rng.randrange(256, SHARD - 64)
                raw[at : at + 16] = rng.randbytes(16)
                for i in range(30):
                    got = c.get(f"k{i}")
                    assert got is None or len(got) <= c.max_entry_size
        return "ok"

    result = Child(hammer).wait(timeout=60)
    assert result.signal is None and result.ok, result
    cache.clear()
    for i in range(40):  # a write in every shard, then clear: all sound again
        cache.set(f"w{i}", b"x")
    cache.clear()
    cache.check()


# ------------------------------------------------------------------ signed values


class Boom:
    """Unpickling this object would create a marker file."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_value_tampered_with_in_the_file_is_rejected_never_unpickled(tmp_path: Path) -> None:
    key = b"k" * 32
    cache = nearcache.Cache(path=tmp_path / "c", size="1MiB", signing_key=key)
    marker = str(tmp_path / "pwned")
    cache.set("report", {"owner": "alice", "pad": "A" * 200})
    flags_before = cache.native.get_entry("report")[1]

    raw = (tmp_path / "c").read_bytes()
    body = pickle.dumps({"owner": "alice", "pad": "A" * 200}, protocol=5)
    evil = pickle.dumps(Boom(marker), protocol=5)
    assert len(evil) < len(body)
    at = raw.find(body)
    assert at > 0, "the signed body is stored verbatim after its tag"

    def patch(offset: int, data: bytes) -> None:
        with open(tmp_path / "c", "r+b") as f:
            f.seek(offset)
            f.write(data)

    # 1. One flipped bit in the body.
    patch(at + 10, bytes([raw[at + 10] ^ 1]))
    assert cache.get("report", "MISS") == "MISS"
    assert cache.stats()["signature_failures"] == 1
    # 2. The body replaced by a malicious pickle (same length, tag kept).
    patch(at, evil + b"." * (len(body) - len(evil)))
    assert cache.get("report", "MISS") == "MISS"
    assert cache.get_many(["report"]) == {}
    assert cache.stats()["signature_failures"] == 3
    # 3. The tag replaced too (the attacker does not know the key).
    patch(at - 32, bytes(32))
    assert cache.get("report", "MISS") == "MISS"
    assert not os.path.exists(marker), "a tampered value was unpickled"
    # 4. The flags rewritten to claim "unsigned pickle": still refused.
    cache.native.set("report", evil, flags=nearcache._native.FLAG_USER | 1 << 8)
    assert cache.get("report", "MISS") == "MISS"
    assert not os.path.exists(marker)
    assert cache.stats()["signature_failures"] == 5
    assert flags_before & nearcache.serializers.FLAG_SIGNED
    # An untampered value still verifies.
    cache.set("report", {"owner": "bob"})
    assert cache.get("report") == {"owner": "bob"}


def test_signing_is_what_protects_a_pickle_cache(tmp_path: Path) -> None:
    """The control for the test above: without a key, the same planted
    pickle runs code, which is why shared files need signing or json."""
    marker = tmp_path / "pwned"
    cache = nearcache.Cache(path=tmp_path / "c", size="1MiB")
    cache.native.set("x", pickle.dumps(Boom(str(marker))), flags=_native.FLAG_USER | 1 << 8)
    cache.get("x")
    assert marker.exists()
