"""State the processes of a host share through their L1 file.

* The **generation**: change counters, one per stripe of keys (the key's
  stored bytes hashed into :data:`STRIPES` stripes) and one for changes to
  every key (clears).  A write moves its key's stripe before it updates L1,
  an invalidation before it is applied.  A read that fills L1 from L2, or a
  write that stores its value in L1, compares its key's generation (the two
  counters) before and after, and drops its copy when it moved: whichever
  process applied the other change, a stale copy never stays.  Changes to
  other keys leave the copy alone, except the few that share its stripe: a
  single counter for the whole host made every fill and write of a busy
  host drop its copy, since some other key had always changed during the
  L2 round trip, and L1 emptied under writes.
* The listener's **position** in the invalidation stream
  (:class:`L1Positions`).
* The **host origin**: the id this host stamps on its invalidations, the
  same in every process that opens the same L1 file, so the host's listener
  skips its own host's messages.

Keys start with a NUL byte, which applications do not use; they live in L1
like any entry (clearing L1 drops them, which only makes readers and writers
more careful; eviction likewise: a counter that is created again starts at a
random value, never where the lost one was).  With an L1 private to the
process (``MemoryDriver``), the counters live in the process.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import socket
import uuid
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

from nearcache.drivers.base import Driver
from nearcache.tiered.stream import PositionStore

__all__ = ["STRIPES", "Epoch", "Generation", "L1Positions", "host_origin", "shared_path"]

#: Stripes of the generation: keys that hash to the same stripe share a
#: counter, so a change to one drops racing copies of the others. Each
#: counter is an L1 entry: 1,024 of them took half of the 96.7 KiB L1 of
#: ``nearcache bench django-8proc --backends tiered`` and its gets went to
#: L2 (p50 108-117 us); 64 take about 3 KiB (p50 456-472 ns; one counter
#: for the host: 0.9-1.1 us, and 190-230 us with 59 KiB values).
STRIPES = 64

_GENERATION_KEY = b"\x00nearcache:generation"
_STRIPE_KEY = _GENERATION_KEY + b":"

#: A key's generation: the every-key counter and its stripe's.
Epoch = tuple[int, int]
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


def _stripe(raw: bytes) -> bytes:
    """The L1 key of the counter of the stripe of the stored key bytes ``raw``."""
    return _STRIPE_KEY + b"%d" % (zlib.crc32(raw) % STRIPES)


class Generation:
    """The change counters (see the module doc); shared when L1 is.

    Keys are given as their stored bytes (``key_bytes``), as invalidation
    messages carry them, so every process and host picks the same stripe.
    """

    def __init__(self, l1: Driver) -> None:
        self.shared = shared_path(l1) is not None
        self._l1 = l1
        self._local: dict[bytes, int] = {}

    def _read(self, name: bytes) -> int:
        if not self.shared:
            return self._local.get(name, 0)
        value = self._l1.get(name)
        return value if isinstance(value, int) else self._create(name)

    def _create(self, name: bytes) -> int:
        """A counter that is absent (never made, evicted or cleared), made now.

        It starts at a random value, so a reader that saw a lost counter
        cannot see its value again; whoever makes it first wins.
        """
        start = secrets.randbits(48)
        self._l1.add(name, start, 0)
        value = self._l1.get(name)
        # Not kept (an L1 that refuses or drops it at once): the next read
        # makes another random one, so a comparison fails and a copy drops.
        return value if isinstance(value, int) else start

    def current(self, raw: bytes) -> Epoch:
        """The generation of the key ``raw`` now."""
        return self._read(_GENERATION_KEY), self._read(_stripe(raw))

    def current_many(self, raws: Iterable[bytes]) -> dict[bytes, Epoch]:
        """The generations of several keys, read together."""
        every = self._read(_GENERATION_KEY)
        names = {raw: _stripe(raw) for raw in raws}
        stripes = set(names.values())
        found: Mapping[Any, Any] = self._l1.get_many(list(stripes)) if self.shared else {}
        # Each stripe read once; one absent from L1 is made once (`_read`).
        counters = {
            name: value if isinstance(value := found.get(name), int) else self._read(name)
            for name in stripes
        }
        return {raw: (every, counters[name]) for raw, name in names.items()}

    def bump(self, raws: Iterable[bytes] | None = None) -> None:
        """Move the counters of the keys ``raws`` on (None: of every key)."""
        names = [_GENERATION_KEY] if raws is None else sorted({_stripe(raw) for raw in raws})
        for name in names:
            if self.shared:
                # A counter lost meanwhile restarts at random (see _create).
                self._l1.incr(name, 1, default=secrets.randbits(48))
            else:
                self._local[name] = self._local.get(name, 0) + 1

    @staticmethod
    def after_own_bump(before: Epoch) -> Epoch:
        """The generation a key has after one bump of its own, if nothing else changed it."""
        every, stripe = before
        return every, stripe + 1


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
