"""Process helpers for the reliability tests: forked children, holds, kills,
and small file systems to fill.

Children are forked (not spawned) so that they start in milliseconds; each
one runs a function and leaves with ``os._exit``, never returning into
pytest.  A child that must not run any inherited cleanup (such as dropping a
cache handle it inherited) relies on that.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from nearcache import _native


@dataclass
class ChildResult:
    """How a forked child ended, and what its function returned."""

    exit_code: int | None
    signal: int | None
    value: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and self.error is None


class Child:
    """A forked child running ``fn()``; its result comes back through a pipe."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        read, write = os.pipe()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os.close(read)
            code = 0
            try:
                payload = pickle.dumps(("ok", fn()))
            except BaseException:
                payload = pickle.dumps(("error", traceback.format_exc()))
                code = 1
            try:
                os.write(write, payload)
            finally:
                os._exit(code)
        os.close(write)
        self.pid = pid
        self._read = read

    def kill(self) -> None:
        """SIGKILL the child (it may already be gone)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)

    def reap(self) -> None:
        """SIGKILL the child if it still runs and collect it (idempotent)."""
        self.kill()
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(self._read)

    def wait(self, timeout: float = 30.0) -> ChildResult:
        """Wait for the child; SIGKILL it (and fail) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                self.kill()
                os.waitpid(self.pid, 0)
                os.close(self._read)
                raise TimeoutError(f"child {self.pid} still running after {timeout} s")
            time.sleep(0.005)
        chunks = []
        while chunk := os.read(self._read, 1 << 16):
            chunks.append(chunk)
        os.close(self._read)
        result = ChildResult(
            exit_code=os.WEXITSTATUS(status) if os.WIFEXITED(status) else None,
            signal=os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
        )
        if chunks:
            kind, value = pickle.loads(b"".join(chunks))
            if kind == "ok":
                result.value = value
            else:
                result.error = value
        return result


@contextlib.contextmanager
def mounted_tmpfs(parent: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's syntax: ``1m``) mounted at ``parent/tmpfs``
    for the test and unmounted after it; the test is skipped unless root can
    mount one here."""
    mnt = parent / "tmpfs"
    mnt.mkdir(mode=0o700)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(mnt)],
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def in_hold(pid: int) -> bool:
    """Whether ``pid`` sleeps inside ``_debug_hold_shard_mid_write``.

    The hook sleeps with the shard lock held; the helper processes sleep
    nowhere else, so a nanosleep in the kernel means the lock is held.
    """
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
    except OSError:
        return False
    return "nanosleep" in wchan


def hold_in_child(path: str, key: str, ready_timeout: float = 10.0) -> Child:
    """Fork a child that opens ``path`` and holds ``key``'s shard mid-write.

    Returns once the child is asleep inside the hold (lock taken, shard
    half-written); the caller kills it.
    """

    def hold() -> None:
        cache = _native.NativeCache(path, 0, create=False)
        cache._debug_hold_shard_mid_write(key, 3600.0)

    child = Child(hold)
    deadline = time.monotonic() + ready_timeout
    while not in_hold(child.pid):
        if time.monotonic() > deadline:
            child.kill()
            raise TimeoutError("the child never reached the hold")
        time.sleep(0.002)
    return child


def kill_and_reap(child: Child) -> ChildResult:
    """SIGKILL ``child`` and collect it."""
    child.kill()
    return child.wait()


def run_python(code: str, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter; raises TimeoutExpired if it hangs."""
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def key_in_shard(cache: _native.NativeCache, shard: int, start: int = 0) -> str:
    """The first key ``k<n>`` (n >= start) that lives in ``shard``."""
    n = start
    while cache.shard_of(f"k{n}") != shard:
        n += 1
    return f"k{n}"


# XXH3-64 (seed 0) for inputs of 17 to 128 bytes: enough to re-checksum the
# 64 fixed bytes of a cache file header, as anyone able to write the file
# can (the checksum detects accidents, it is not a signature).
_XXH_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
)
_MASK64 = (1 << 64) - 1
_PRIME64_1 = 0x9E3779B185EBCA87


def _mix16(data: bytes, at: int, secret_at: int) -> int:
    lo = int.from_bytes(data[at : at + 8], "little")
    hi = int.from_bytes(data[at + 8 : at + 16], "little")
    s_lo = int.from_bytes(_XXH_SECRET[secret_at : secret_at + 8], "little")
    s_hi = int.from_bytes(_XXH_SECRET[secret_at + 8 : secret_at + 16], "little")
    product = (lo ^ s_lo) * (hi ^ s_hi)
    return (product & _MASK64) ^ (product >> 64)


def xxh3_64(data: bytes) -> int:
    """XXH3-64 with seed 0, for 17 <= len(data) <= 64."""
    n = len(data)
    if not 17 <= n <= 64:
        raise ValueError("this helper covers inputs of 17 to 64 bytes")
    acc = n * _PRIME64_1
    if n > 32:
        acc += _mix16(data, 16, 32) + _mix16(data, n - 32, 48)
    acc += _mix16(data, 0, 0) + _mix16(data, n - 16, 16)
    h = acc & _MASK64
    h ^= h >> 37
    h = (h * 0x165667919E3779F9) & _MASK64
    return h ^ (h >> 32)


def rewrite_header(path: str, **fields: int) -> None:
    """Change fixed header fields of a cache file and fix its checksum.

    ``fields`` are among shard_count (u32 at 24), shard_size (u64 at 32),
    slots (u64 at 40), total_size (u64 at 48).
    """
    layout = {
        "shard_count": (24, 4),
        "shard_size": (32, 8),
        "slots": (40, 8),
        "total_size": (48, 8),
    }
    with open(path, "r+b") as f:
        header = bytearray(f.read(72))
        for name, value in fields.items():
            at, size = layout[name]
            header[at : at + size] = value.to_bytes(size, "little")
        header[64:72] = xxh3_64(bytes(header[:64])).to_bytes(8, "little")
        f.seek(0)
        f.write(header)
