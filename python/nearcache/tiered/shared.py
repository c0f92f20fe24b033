"""State the processes of a host share through their L1 file.

* The **generation**: a counter bumped before every write's L1 update and
  before every invalidation is applied.  A read that fills L1 from L2, or a
  write that stores its value in L1, compares the generation before and
  after and drops its copy when it moved: whichever process applied the
  other change, a stale copy never stays.
* The listener's **position** in the invalidation stream
  (:class:`L1Positions`).
* The **host origin**: the id this host stamps on its invalidations, the
  same in every process that opens the same L1 file, so the host's listener
  skips its own host's messages.

Keys start with a NUL byte, which applications do not use; they live in L1
like any entry (clearing L1 drops them, which only makes readers and writers
more careful; eviction likewise).  With an L1 private to the process
(``MemoryDriver``), the generation is a plain counter in the process.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import socket
import uuid

from nearcache.drivers.base import Driver
from nearcache.tiered.stream import PositionStore

__all__ = ["Generation", "L1Positions", "host_origin", "shared_path"]

_GENERATION_KEY = b"\x00nearcache:generation"
_POSITION_KEY = b"\x00nearcache:stream-position:"


def shared_path(l1: Driver) -> str | None:
    """The file of a shared-memory L1, or None for a process-private L1."""
    cache = getattr(l1, "cache", None)
    path = getattr(cache, "path", None)
    return str(path) if path else None


def host_origin(l1: Driver) -> bytes:
    """16 bytes naming this host's L1 file (random for a process-private L1)."""
    path = shared_path(l1)
    if path is None:
        return uuid.uuid4().bytes
    identity = f"{socket.gethostname()}|{os.path.realpath(path)}|{os.stat(path).st_ino}"
    return hashlib.sha256(identity.encode()).digest()[:16]


class Generation:
    """The change counter (see the module doc); shared when L1 is."""

    def __init__(self, l1: Driver) -> None:
        self.shared = shared_path(l1) is not None
        self._l1 = l1
        self._local = itertools.count(1)
        self._value = 0

    def current(self) -> int:
        """The generation now."""
        if not self.shared:
            return self._value
        value = self._l1.get(_GENERATION_KEY, 0)
        return value if isinstance(value, int) else 0

    def bump(self) -> int:
        """Move the generation on; return the new value."""
        if not self.shared:
            self._value = next(self._local)
            return self._value
        return self._l1.incr(_GENERATION_KEY)


class L1Positions(PositionStore):
    """The invalidation stream position, kept in L1 (no TTL)."""

    def __init__(self, l1: Driver, stream: bytes) -> None:
        self._l1 = l1
        self._key = _POSITION_KEY + stream

    def load(self) -> str | None:
        """The saved position, or None."""
        value = self._l1.get(self._key)
        return value if isinstance(value, str) else None

    def save(self, position: str) -> None:
        """Record ``position``."""
        self._l1.set(self._key, position, ttl=0)
