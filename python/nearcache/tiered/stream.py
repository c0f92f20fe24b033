"""Invalidations in a Redis Stream: ordered, replayed after a disconnect or a takeover.

Every write appends one entry (``XADD <stream> MAXLEN ~ <history> * m
<message>``, pipelined with the write itself, so a write is still one round
trip).  The host's listener reads the stream with ``XREAD BLOCK`` from the
position it applied last, and records that position in the shared L1
after every batch.  A listener that reconnects, or a process that takes the
listening over from a dead one, resumes from the recorded position and
replays what it missed; only when that history is gone does it clear L1:

* the entries after the position were trimmed (the entry at the position is
  no longer the stream's first or a later one, or ``XINFO STREAM``'s
  ``max-deleted-entry-id`` is past it), or
* the stream is not the one the position belongs to: a random *incarnation*
  token kept beside the stream (``<stream>:incarnation``, same hash slot)
  differs, because the server restarted without persistence or the key was
  deleted, or
* L1 has no position (a new L1 file, or its position was evicted).

The stream and its token use one hash slot (``{...}`` hash tag), so on a
Redis Cluster they live on one node; a cluster failover keeps them (they are
replicated like any key).  Positions are stream ids ``ms-seq`` compared as
pairs of integers.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

from nearcache.drivers.base import BackendError
from nearcache.tiered.invalidators import (
    _OP_CLEAR,
    _OP_KEYS,
    InvalidationListener,
    Invalidator,
    ReaderThread,
    decode_message,
    encode_message,
)

__all__ = ["PositionStore", "StreamInvalidator", "stream_id"]

_FIELD = b"m"


def stream_id(text: str | bytes) -> tuple[int, int]:
    """``b"1700000000000-3"`` as ``(1700000000000, 3)``."""
    raw = text.decode() if isinstance(text, bytes) else text
    ms, _, seq = raw.partition("-")
    return int(ms), int(seq or 0)


def _intact(info: dict[str, Any] | None, position: tuple[int, int]) -> bool:
    """Whether every entry after ``position`` is still in the stream.

    The entry at ``position`` itself still being there proves it (entries
    are only trimmed from the front); an empty stream must not have grown
    since.  Trimming exactly up to ``position`` reads as a gap: L1 is then
    cleared, which is safe.
    """
    if info is None:
        return position == (0, 0)
    if stream_id(info.get("max-deleted-entry-id") or b"0-0") > position:
        return False  # XDEL removed an entry after it
    if position == (0, 0):
        # Nothing applied yet (the listener started before the stream had
        # an entry): intact while every entry ever added is still there.
        # Redis before 7 does not count them: L1 is then cleared.
        added = info.get("entries-added")
        return added is not None and int(added) == int(info.get("length", -1))
    first = info.get("first-entry")
    if not first:
        return stream_id(info["last-generated-id"]) <= position
    return stream_id(first[0]) <= position


class PositionStore:
    """Where the host keeps the last applied position (the tiered cache uses its L1)."""

    def load(self) -> str | None:
        """``"<incarnation>|<stream id>"`` or None."""
        raise NotImplementedError

    def save(self, position: str) -> None:
        """Record the position."""
        raise NotImplementedError


class StreamInvalidator(ReaderThread, Invalidator):
    """Invalidations over a Redis Stream (see the module doc).

    Args:
        client: a redis-py client (``Redis``, a Sentinel-managed ``Redis`` or
            ``RedisCluster``) with ``decode_responses`` off; the tiered cache
            passes its L2's.
        stream: the stream key; a ``{...}`` hash tag is added when missing.
        history: entries kept (``MAXLEN ~``): how long a listener may be away
            and still replay instead of clearing L1.
        block: seconds one ``XREAD BLOCK`` waits; keep it below the client's
            socket timeout.
        batch_interval: pause after handling a batch of more than one
            entry, so a burst of writes is read in a few batches rather than
            one thread wake-up per write (each takes the GIL from the
            application's threads); it bounds the extra delay of an
            invalidation during a burst.  A lone entry is followed by no
            pause: the next one is read at once.
        origin: the id stamped on this host's messages (counted as ``own``
            when read back; they are applied like the others).
    """

    def __init__(
        self,
        client: Any,
        stream: str = "nearcache:invalidations",
        *,
        history: int = 100_000,
        block: float = 0.5,
        reconnect_delay: float = 0.05,
        max_reconnect_delay: float = 1.0,
        batch_interval: float = 0.001,
        origin: bytes | None = None,
    ) -> None:
        import redis

        if history < 1:
            raise ValueError("history must be at least 1 entry")
        self._redis = redis
        self._errors = (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)
        self.client = client
        if "{" not in stream:
            stream = "{" + stream + "}"
        self.stream = stream.encode()
        self.incarnation_key = self.stream + b":incarnation"
        self.history = history
        self.block_ms = max(1, int(block * 1000))
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.batch_interval = batch_interval
        self.origin = origin or uuid.uuid4().bytes
        self._listener: InvalidationListener | None = None
        self._positions: PositionStore | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._connected = threading.Event()
        self.sent = 0
        self.received = 0
        self.own = 0
        self.ignored = 0
        self.replayed = 0
        self.resyncs = 0
        self.errors = 0
        self.last_error: str | None = None

    # -- publishing --------------------------------------------------------

    def message(self, keys: Sequence[bytes]) -> bytes:
        """The entry invalidating ``keys``."""
        return encode_message(self.origin, _OP_KEYS, keys)

    def xadd_args(self, message: bytes) -> dict[str, Any]:
        """Keyword arguments of ``client.xadd`` appending ``message``."""
        return {
            "name": self.stream,
            "fields": {_FIELD: message},
            "maxlen": self.history,
            "approximate": True,
        }

    def _append(self, message: bytes) -> None:
        try:
            self.client.xadd(**self.xadd_args(message))
        except (
            self._redis.exceptions.RedisError,
            self._redis.exceptions.RedisClusterException,
        ) as exc:
            raise BackendError(f"appending an invalidation failed: {exc}") from exc
        self.sent += 1

    def publish(self, keys: Sequence[bytes]) -> None:
        """XADD one entry naming every key."""
        if keys:
            self._append(self.message(keys))

    def publish_clear(self) -> None:
        """XADD a "clear everything" entry."""
        self._append(encode_message(self.origin, _OP_CLEAR))

    # -- listening -----------------------------------------------------------

    def set_positions(self, positions: PositionStore) -> None:
        """Where the last applied position is kept (before :meth:`start`)."""
        self._positions = positions

    def _thread_name(self) -> str:
        # Only the host's elected listener starts the reader.
        return "nearcache-invalidation-stream"

    def _incarnation(self) -> str:
        client = self.client
        token = uuid.uuid4().hex
        client.set(self.incarnation_key, token, nx=True)
        current = client.get(self.incarnation_key)
        return (current or token.encode()).decode()

    def _resume(self, listener: InvalidationListener) -> tuple[str, bytes, bytes]:
        """(incarnation, id to read after, last id now): replay from the saved position,
        or clear L1 when the history after it is gone."""
        incarnation = self._incarnation()
        try:
            info = self.client.xinfo_stream(self.stream)
        except self._redis.exceptions.ResponseError:
            info = None  # no stream yet
        last = info["last-generated-id"] if info else b"0-0"
        last = last if isinstance(last, bytes) else str(last).encode()
        saved = self._positions.load() if self._positions is not None else None
        if saved is not None:
            token, _, position = saved.partition("|")
            if token == incarnation and _intact(info, stream_id(position)):
                return incarnation, position.encode(), last  # replay what was missed
        self.resyncs += 1
        listener.on_resync()  # the history is gone: clear L1
        return incarnation, last, last

    def _session(self) -> None:
        listener = self._listener
        assert listener is not None
        incarnation, position, last = self._resume(listener)
        self._save(incarnation, position)
        missed_until = stream_id(last)
        listener.on_listening()
        self._connected.set()
        while not self._stop.is_set():
            reply = self.client.xread({self.stream: position}, count=1000, block=self.block_ms)
            if not reply:
                continue
            batch = 0
            for _, entries in reply:
                batch += len(entries)
                for entry_id, fields in entries:
                    position = entry_id
                    replayed = stream_id(entry_id) <= missed_until
                    self._deliver(listener, fields.get(_FIELD, b""), replayed)
            self._save(incarnation, position)
            if self.batch_interval and batch > 1:  # a burst: let the next batch gather
                self._stop.wait(self.batch_interval)

    def _save(self, incarnation: str, position: bytes) -> None:
        if self._positions is not None:
            self._positions.save(f"{incarnation}|{position.decode()}")

    def _deliver(self, listener: InvalidationListener, data: bytes, replaying: bool) -> None:
        decoded = decode_message(data)
        if decoded is None:
            self.ignored += 1
            return
        origin, op, keys = decoded
        if origin == self.origin:
            # The host's own writes are applied too: a write that timed out
            # may still land later, after a read of this host fetched the
            # value it replaced; only its entry can drop that copy.
            self.own += 1
        if op == _OP_KEYS:
            listener.on_invalidate(keys)
        elif op == _OP_CLEAR:
            listener.on_clear()
        else:
            self.ignored += 1
            return
        # Counted once applied: whoever sees the count grow sees the effect.
        self.received += 1
        if replaying:
            self.replayed += 1

    def stats(self) -> dict[str, Any]:
        """Entries sent, received, replayed; resyncs (L1 cleared) and errors."""
        return {
            "stream": self.stream.decode(),
            "listening": self._thread is not None,
            "connected": self.connected,
            "sent": self.sent,
            "received": self.received,
            "replayed": self.replayed,
            "own": self.own,
            "ignored": self.ignored,
            "resyncs": self.resyncs,
            "errors": self.errors,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        """Stop the reader (within one ``block``); the client belongs to L2."""
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.block_ms / 1000 + 2.0)
        self._thread = None
