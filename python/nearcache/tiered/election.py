"""One invalidation listener per host: the processes sharing an L1 file elect one.

The election is an open-file-description lock (``F_OFD_SETLK``, or
``flock`` where OFD locks are missing) on a file beside the L1 cache file
(``<cache file>.listener-<channel id>``: one election per channel, in every
invalidation mode).  Every process polls for the lock on a daemon
thread (every ``poll_interval`` seconds, 20 ms by default); the one that
holds it runs the invalidation listener, the others subscribe to nothing.
The kernel drops the lock when its holder dies, however it dies (SIGKILL
included), so another process takes over within one poll interval.

After ``fork`` the child closes its copy of the descriptor (the lock stays
with the parent's open file description) and polls on its own.  A process
that wins the lock after finding it held (:attr:`ListenerElection.took_over`)
is taking over from a listener that died or closed: what was sent in between
reached nobody on the host, so its first session replays or clears L1.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import threading
import weakref
from collections.abc import Callable
from pathlib import Path

__all__ = ["ListenerElection"]

_OFD_SETLK = getattr(fcntl, "F_OFD_SETLK", None)
# struct flock on Linux: short l_type, short l_whence, off_t l_start, off_t l_len, pid_t l_pid
_FLOCK = struct.Struct("hhqqi4x")


def _try_lock(fd: int) -> bool:
    """Take the exclusive lock on ``fd`` without waiting; False when another holds it."""
    try:
        if _OFD_SETLK is not None:
            fcntl.fcntl(fd, _OFD_SETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
        else:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
            return False
        raise
    return True


class ListenerElection:
    """Elects the one process of a host that listens for invalidations.

    ``on_elected`` is called (on the election thread) when this process
    becomes the listener; it stays the listener until it exits or
    :meth:`close` is called.
    """

    def __init__(self, lock_path: str | os.PathLike[str], poll_interval: float = 0.02) -> None:
        self.lock_path = Path(lock_path)
        self.poll_interval = poll_interval
        self._fd: int | None = None
        self._elected = threading.Event()
        self._held_elsewhere = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._on_elected: Callable[[], None] | None = None
        self.elections = 0
        #: Whether this process won the lock after finding it held by another
        #: (a takeover, not a first election).
        self.took_over = False
        _after_fork.add(self)

    @property
    def elected(self) -> bool:
        """Whether this process is the host's listener."""
        return self._elected.is_set()

    @property
    def held_elsewhere(self) -> bool:
        """Whether the last attempt found the lock held by another process (or cache)."""
        return self._held_elsewhere.is_set()

    def holder(self) -> int | None:
        """PID of the current listener as it wrote it in the lock file (None if unknown)."""
        try:
            text = self.lock_path.read_text().strip()
        except OSError:
            return None
        return int(text) if text.isdigit() else None

    def start(self, on_elected: Callable[[], None]) -> None:
        """Start competing for the lock."""
        self._on_elected = on_elected
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._run, name="nearcache-listener-election", daemon=True
        )
        self._thread.start()

    def wait_elected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds to become the listener."""
        return self._elected.wait(timeout)

    def _run(self) -> None:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        self._fd = fd
        while not self._stop.is_set():
            if _try_lock(fd):
                self.took_over = self._held_elsewhere.is_set()
                self._held_elsewhere.clear()
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self.elections += 1
                self._elected.set()
                callback = self._on_elected
                if callback is not None:
                    callback()
                return  # the lock is held until the descriptor is closed
            self._held_elsewhere.set()
            self._stop.wait(self.poll_interval)

    def close(self) -> None:
        """Stop competing; a listener gives the lock up (another process takes over)."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(1.0)
        self._thread = None
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._elected.clear()
        self._held_elsewhere.clear()
        _after_fork.discard(self)

    def _after_fork_in_child(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)  # the parent's description keeps the lock
        self._elected.clear()
        self._held_elsewhere.clear()
        if self._thread is not None and not self._stop.is_set() and self._on_elected:
            self.start(self._on_elected)


_after_fork: weakref.WeakSet[ListenerElection] = weakref.WeakSet()


def _restart_elections_in_child() -> None:
    for election in list(_after_fork):
        election._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_elections_in_child)
