"""Tiered caching: a fast L1 on each host in front of a shared L2.

::

    host A                               host B
    app -> TieredCache                   app -> TieredCache
           |  1. get: L1 first                  |
           v                                    v
    L1: nearcache (shared memory)        L1: nearcache (shared memory)
           |  2. L1 miss: L2, fill L1           ^
           |  3. write: L2, L1, publish         |  4. drop the key from L1
           v                                    |
    L2: Redis / Valkey / memcached  +  Redis pub/sub channel

Reads
    L1 first; on a miss, L2 (:meth:`~nearcache.drivers.base.Driver.get_with_ttl`),
    then the value is copied into L1 with a TTL of ``min(what is left in L2,
    l1_ttl)``.  An L1 hit costs one L1 lookup and nothing else.
Writes
    ``set``/``add``/``replace``/``touch``/``incr``/``delete``/``clear`` go to
    L2 first, then update (or drop) this host's L1 copy, then publish an
    invalidation that makes every other host drop its L1 copy.
Cross-host invalidation
    Over Redis pub/sub (:class:`RedisInvalidator`): it works with a stock
    Redis or Valkey, whatever the L2 is.  Every message carries the sender's
    random id, so a cache ignores its own messages.
Healing
    Pub/sub is fire-and-forget: a host whose subscription drops misses the
    messages sent meanwhile.  Two rules make that heal: whenever the
    subscription is (re)established, L1 is cleared; and no L1 copy ever
    lives longer than ``l1_ttl`` (default 60 s), so even an invalidation lost
    without any disconnect (a publisher that failed after writing L2)
    expires within ``l1_ttl``.
Races
    A read that fetched an old value from L2 just before another write must
    not leave it in L1.  Every write and every invalidation received bumps an
    epoch; a read fills L1 and then, if the epoch moved since before its L2
    read, drops what it filled.  An invalidation is applied as "bump, then
    delete", so any interleaving ends with the stale copy gone.
Failures
    When L2 (or the invalidation channel) fails, the cache keeps serving L1
    hits and applies a policy, separately for reads and writes
    (``on_get_error``, ``on_set_error``): ``"ignore"``, ``"log"`` (the
    default; at most one record per second), ``"raise"`` (the
    :class:`~nearcache.drivers.base.BackendError` propagates) or a callable
    ``policy(error, operation, key)``.  Under any policy but ``"raise"`` a
    failed read is a miss, and a failed ``set`` still updates this host's L1
    (so the host reads its own writes during an outage; the copy lives at
    most ``l1_ttl`` and is cleared when the channel reconnects); a failed
    ``add``/``replace``/``touch``/``delete`` returns False.  ``incr`` and
    ``decr`` always raise: a counter cannot be made up locally.  With
    ``"raise"``, a failed write drops this host's L1 copy before raising.
    Drivers use socket timeouts, so a dead server fails a call within about
    one timeout rather than hanging it.

Several processes on one host that share a shared-memory L1 each run their
own subscription; they then also drop each other's fresh writes from L1 (one
extra L2 read per write), which keeps every process's reads coherent.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import select
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal, TypeAlias

from nearcache.drivers.base import (
    TTL,
    BackendError,
    Driver,
    Key,
    SerializationError,
    ValueTooLargeError,
    key_bytes,
    ttl_to_ms,
)
from nearcache.units import Duration
from nearcache.units import ttl_to_ms as _duration_ms

__all__ = [
    "ErrorPolicy",
    "InvalidationListener",
    "Invalidator",
    "RedisInvalidator",
    "TieredCache",
]

logger = logging.getLogger("nearcache.tiered")

ErrorPolicy: TypeAlias = (
    "Literal['ignore', 'log', 'raise'] | Callable[[BackendError, str, Any], None]"
)
"""What to do when L2 fails: ``"ignore"``, ``"log"``, ``"raise"`` or ``f(error, op, key)``."""

_MISS: Any = object()
_POLICIES = ("ignore", "log", "raise")
_LOG_INTERVAL = 1.0


# ----------------------------------------------------------------------------- invalidation


class InvalidationListener:
    """What an :class:`Invalidator` calls when messages arrive (on its own thread)."""

    def on_invalidate(self, keys: list[bytes]) -> None:
        """Other hosts changed these keys (as :func:`~nearcache.drivers.base.key_bytes`)."""

    def on_clear(self) -> None:
        """Another host cleared the whole cache."""

    def on_resync(self) -> None:
        """The subscription was (re)established: messages may have been missed."""


class Invalidator:
    """A channel carrying "drop these keys" messages between hosts.

    Subclasses implement :meth:`start`, :meth:`publish`, :meth:`publish_clear`
    and :meth:`close`; :class:`RedisInvalidator` is the one nearcache ships.
    """

    #: Random id carried by every message this invalidator sends.
    origin: bytes

    def start(self, listener: InvalidationListener) -> None:
        """Begin delivering other hosts' messages to ``listener``."""
        raise NotImplementedError

    def publish(self, keys: Sequence[bytes]) -> None:
        """Tell other hosts to drop ``keys``; raise BackendError on failure."""
        raise NotImplementedError

    def publish_clear(self) -> None:
        """Tell other hosts to clear their L1; raise BackendError on failure."""
        raise NotImplementedError

    @property
    def connected(self) -> bool:
        """Whether messages are being received right now."""
        raise NotImplementedError

    def wait_connected(self, timeout: float) -> bool:
        """Wait until the subscription is up; return whether it is."""
        raise NotImplementedError

    def stats(self) -> dict[str, Any]:
        """Counters of the channel."""
        return {}

    def close(self) -> None:
        """Stop receiving and release connections."""


_MAGIC = b"NC1"
_OP_KEYS = b"k"
_OP_CLEAR = b"c"
_LEN = struct.Struct(">I")


def encode_message(origin: bytes, op: bytes, keys: Sequence[bytes] = ()) -> bytes:
    """``NC1 | origin (16 bytes) | op (k or c) | (4-byte length, key)*``."""
    parts = [_MAGIC, origin, op]
    for key in keys:
        parts.append(_LEN.pack(len(key)))
        parts.append(key)
    return b"".join(parts)


def decode_message(data: bytes) -> tuple[bytes, bytes, list[bytes]] | None:
    """``(origin, op, keys)``, or None for a malformed message."""
    if len(data) < 20 or not data.startswith(_MAGIC):
        return None
    origin, op = data[3:19], data[19:20]
    keys: list[bytes] = []
    position = 20
    while position < len(data):
        if position + 4 > len(data):
            return None
        (size,) = _LEN.unpack_from(data, position)
        position += 4
        if position + size > len(data):
            return None
        keys.append(data[position : position + size])
        position += size
    return origin, op, keys


class RedisInvalidator(Invalidator):
    """Invalidations over a Redis (or Valkey) pub/sub channel.

    A daemon thread holds the subscription.  It pings the server after
    ``health_check_interval`` seconds of silence and reconnects (with a
    backoff up to ``max_reconnect_delay``) when the connection drops or a
    ping goes unanswered for ``socket_timeout`` seconds; every
    (re)subscription calls the listener's ``on_resync``.  After ``fork`` the
    child starts its own thread.
    """

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        channel: str = "nearcache:invalidate",
        *,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        health_check_interval: float = 1.0,
        reconnect_delay: float = 0.05,
        max_reconnect_delay: float = 2.0,
        batch_interval: float = 0.001,
        **options: Any,
    ) -> None:
        """Prepare the channel (nothing connects until :meth:`start`).

        ``batch_interval``: after handling the messages that have arrived,
        the thread pauses this long before waiting for more, so a burst of
        writes is handled in a few batches rather than one thread switch per
        message (each switch takes the GIL from the application's threads).
        It bounds the extra delay of an invalidation.
        """
        import redis
        from redis.backoff import NoBackoff
        from redis.retry import Retry

        self.url = url
        self.channel = channel.encode()
        self.origin = uuid.uuid4().bytes
        self.socket_timeout = socket_timeout
        self.connect_timeout = connect_timeout
        self.health_check_interval = health_check_interval
        self.reconnect_delay = reconnect_delay
        self.max_reconnect_delay = max_reconnect_delay
        self.batch_interval = batch_interval
        self._redis = redis
        self._client = redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            retry=Retry(NoBackoff(), 0),
            protocol=2,
            **options,
        )
        self._listener: InvalidationListener | None = None
        self._connection: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._connected = threading.Event()
        self._pid = os.getpid()
        self.received = 0
        self.ignored = 0
        self.sent = 0
        self.subscriptions = 0
        self.errors = 0
        self.last_error: str | None = None
        _after_fork.add(self)

    # -- publishing --------------------------------------------------------

    def _publish(self, message: bytes) -> None:
        try:
            self._client.publish(self.channel, message)
        except self._redis.exceptions.RedisError as exc:
            raise BackendError(f"publishing an invalidation failed: {exc}") from exc
        self.sent += 1

    def publish(self, keys: Sequence[bytes]) -> None:
        """PUBLISH one message naming every key."""
        if keys:
            self._publish(encode_message(self.origin, _OP_KEYS, keys))

    def publish_clear(self) -> None:
        """PUBLISH a "clear everything" message."""
        self._publish(encode_message(self.origin, _OP_CLEAR))

    # -- receiving ---------------------------------------------------------

    def start(self, listener: InvalidationListener) -> None:
        """Start the subscriber thread delivering to ``listener``."""
        self._listener = listener
        self._stop.clear()
        thread = threading.Thread(
            target=self._run, name=f"nearcache-invalidation-{self.channel.decode()}", daemon=True
        )
        self._thread = thread
        thread.start()

    @property
    def connected(self) -> bool:
        """Whether the subscription is up."""
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the subscription."""
        return self._connected.wait(timeout)

    def _run(self) -> None:
        delay = self.reconnect_delay
        while not self._stop.is_set():
            try:
                self._session()
                delay = self.reconnect_delay
            except Exception as exc:  # the subscriber must survive anything
                if self._stop.is_set():
                    break  # close() cut the connection under us
                self.errors += 1
                self.last_error = f"{type(exc).__name__}: {exc}"
                if self._connected.is_set():
                    delay = self.reconnect_delay  # a drop: retry quickly at first
                else:
                    delay = min(delay * 2, self.max_reconnect_delay)
            finally:
                self._connected.clear()
            self._stop.wait(delay)

    def _session(self) -> None:
        """One subscription, from connect until it fails or we stop.

        redis-py makes the connection (TLS, AUTH, unix sockets...); the
        subscription itself is read straight from the socket with the small
        RESP2 reader below, which costs about a third of what redis-py's
        pub/sub layer does per message (measured 4-5 µs against 15-18 µs).
        Every process pays it for every write, its own included: a cache
        hears its own messages and drops them by origin.
        """
        listener = self._listener
        assert listener is not None
        pool = self._client.connection_pool
        connection: Any = pool.connection_class(**pool.connection_kwargs)  # outside the pool
        self._connection = connection
        try:
            connection.connect()
            sock = connection._sock  # redis-py made and authenticated it
            if sock is None:
                raise self._redis.exceptions.ConnectionError("connection closed")
            sock.sendall(_command(b"SUBSCRIBE", self.channel))
            reader = _Resp2Reader()
            deadline = time.monotonic() + self.connect_timeout + self.socket_timeout
            last_heard = time.monotonic()
            ping_sent: float | None = None
            while not self._stop.is_set():
                pending = getattr(sock, "pending", None)  # TLS: decrypted but unread
                readable = (pending is not None and pending() > 0) or bool(
                    select.select([sock], [], [], 0.1)[0]
                )
                now = time.monotonic()
                if not readable:
                    if not self._connected.is_set():
                        if now > deadline:
                            raise self._redis.exceptions.TimeoutError("no SUBSCRIBE reply")
                    elif ping_sent is not None:
                        if now - ping_sent > self.socket_timeout:
                            raise self._redis.exceptions.TimeoutError("no PING reply")
                    elif now - last_heard > self.health_check_interval:
                        sock.sendall(_command(b"PING"))
                        ping_sent = now
                    continue
                data = sock.recv(65536)
                if not data:
                    raise self._redis.exceptions.ConnectionError("the server closed the connection")
                last_heard, ping_sent = now, None
                for reply in reader.feed(data):
                    self._handle(listener, reply)
                if self.batch_interval:
                    self._stop.wait(self.batch_interval)
        finally:
            self._connection = None
            with contextlib.suppress(Exception):
                connection.disconnect()

    def _handle(self, listener: InvalidationListener, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            return  # PING replies and the like
        kind = reply[0]
        if kind == b"message" and len(reply) == 3:
            self._deliver(listener, reply[2])
        elif kind == b"subscribe":
            # Subscribed (again): anything sent meanwhile was missed.
            self.subscriptions += 1
            self._connected.set()
            listener.on_resync()

    def _deliver(self, listener: InvalidationListener, data: bytes) -> None:
        decoded = decode_message(data)
        if decoded is None:
            self.ignored += 1
            return
        origin, op, keys = decoded
        if origin == self.origin:
            return
        self.received += 1
        if op == _OP_KEYS:
            listener.on_invalidate(keys)
        elif op == _OP_CLEAR:
            listener.on_clear()
        else:
            self.ignored += 1

    def _after_fork_in_child(self) -> None:
        self._connected.clear()
        self._pid = os.getpid()
        self.origin = uuid.uuid4().bytes
        if self._thread is not None and self._listener is not None and not self._stop.is_set():
            self.start(self._listener)

    def stats(self) -> dict[str, Any]:
        """Messages sent, received, ignored; subscriptions and errors."""
        return {
            "channel": self.channel.decode(),
            "connected": self.connected,
            "sent": self.sent,
            "received": self.received,
            "ignored": self.ignored,
            "subscriptions": self.subscriptions,
            "errors": self.errors,
            "last_error": self.last_error,
        }

    def close(self) -> None:
        """Stop the thread (joined for up to a few seconds) and disconnect."""
        self._stop.set()
        connection = self._connection
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.disconnect()  # wakes the thread at once
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.socket_timeout + self.connect_timeout + 1.0)
        self._thread = None
        with contextlib.suppress(Exception):
            self._client.close()
            self._client.connection_pool.disconnect()
        _after_fork.discard(self)


def _command(*parts: bytes) -> bytes:
    """A command in RESP."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        out.append(b"$%d\r\n%s\r\n" % (len(part), part))
    return b"".join(out)


class _ReplyError(Exception):
    """An error reply from the server."""


class _Resp2Reader:
    """Incremental RESP2 reader for a subscribed connection.

    Arrays, bulk strings, integers, simple strings and errors: all a
    subscriber receives.  :meth:`feed` returns the replies completed by the
    new bytes; an error reply raises.  Pub/sub messages (arrays of bulk
    strings) take a short path without recursion.
    """

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, data: bytes) -> list[Any]:
        buffer = self._buffer + data if self._buffer else data
        replies: list[Any] = []
        position = 0
        size = len(buffer)
        find = buffer.find
        while position < size:
            parsed = None
            if buffer[position] == 0x2A:  # "*": try an array of bulk strings
                parsed = self._bulk_array(buffer, position, find)
            if parsed is None:
                parsed = self._parse(buffer, position)
                if parsed is None:
                    break
            reply, position = parsed
            replies.append(reply)
        self._buffer = buffer[position:]
        return replies

    @staticmethod
    def _bulk_array(
        buffer: bytes, position: int, find: Callable[[bytes, int], int]
    ) -> tuple[list[bytes], int] | None:
        """An array whose items are all bulk strings, else None (also when incomplete)."""
        end = find(b"\r\n", position)
        if end < 0:
            return None
        count = int(buffer[position + 1 : end])
        position = end + 2
        items = []
        for _ in range(count):
            if buffer[position : position + 1] != b"$":
                return None
            end = find(b"\r\n", position)
            if end < 0:
                return None
            length = int(buffer[position + 1 : end])
            start = end + 2
            if length < 0 or len(buffer) < start + length + 2:
                return None
            items.append(buffer[start : start + length])
            position = start + length + 2
        return items, position

    def _parse(self, buffer: bytes, position: int) -> tuple[Any, int] | None:
        end = buffer.find(b"\r\n", position)
        if end < 0:
            return None
        kind, line = buffer[position : position + 1], buffer[position + 1 : end]
        position = end + 2
        if kind == b"$":
            size = int(line)
            if size < 0:
                return None, position
            if len(buffer) < position + size + 2:
                return None
            return buffer[position : position + size], position + size + 2
        if kind == b"*":
            count = int(line)
            items: list[Any] = []
            for _ in range(max(count, 0)):
                parsed = self._parse(buffer, position)
                if parsed is None:
                    return None
                item, position = parsed
                items.append(item)
            return items, position
        if kind == b":":
            return int(line), position
        if kind == b"+":
            return line, position
        if kind == b"-":
            raise _ReplyError(line.decode("utf-8", "replace"))
        raise _ReplyError(f"unexpected reply type {kind!r}")


_after_fork: weakref.WeakSet[RedisInvalidator] = weakref.WeakSet()


def _restart_invalidators_in_child() -> None:
    for invalidator in list(_after_fork):
        invalidator._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_invalidators_in_child)


# ------------------------------------------------------------------------------- the cache


class _Listener(InvalidationListener):
    """Forwards invalidations to a TieredCache without keeping it alive.

    When the cache was garbage-collected without being closed, the first
    message that arrives stops the invalidator's thread.
    """

    def __init__(self, cache: TieredCache, invalidator: Invalidator) -> None:
        self._cache = weakref.ref(cache)
        self._invalidator = invalidator

    def _target(self) -> TieredCache | None:
        cache = self._cache()
        if cache is None or cache.closed:
            self._invalidator.close()
            return None
        return cache

    def on_invalidate(self, keys: list[bytes]) -> None:
        cache = self._target()
        if cache is not None:
            cache._invalidate(keys)

    def on_clear(self) -> None:
        cache = self._target()
        if cache is not None:
            cache._clear_l1(received=True)

    def on_resync(self) -> None:
        cache = self._target()
        if cache is not None:
            cache._resync()


class TieredCache(Driver):
    """An L1 driver in front of an L2 driver, kept coherent across hosts.

    See the module documentation for the read, write, invalidation and
    failure rules.  The tiered cache owns its tiers and its invalidator:
    :meth:`close` closes them all.
    """

    name: ClassVar[str] = "tiered"

    def __init__(
        self,
        l1: Driver,
        l2: Driver,
        *,
        l1_ttl: Duration | None = 60.0,
        invalidation: Invalidator | str | None = "auto",
        channel: str | None = None,
        on_get_error: ErrorPolicy = "log",
        on_set_error: ErrorPolicy = "log",
        ready_timeout: float = 1.0,
    ) -> None:
        """Put ``l1`` in front of ``l2``.

        Args:
            l1: this host's cache (usually a :class:`~nearcache.drivers.ShmDriver`).
            l2: the shared store (usually Redis or memcached).
            l1_ttl: the longest an L1 copy may live; ``None`` or ``0`` lifts
                the bound (then a lost invalidation may never heal).
            invalidation: an :class:`Invalidator`; a ``redis://`` URL for a
                :class:`RedisInvalidator`; ``"auto"`` (the default) for one on
                the L2's own server when L2 is Redis and none otherwise; or
                ``None`` for no cross-host invalidation (then only ``l1_ttl``
                bounds staleness).
            channel: the pub/sub channel; by default
                ``nearcache:invalidate:<L2 key prefix>``.
            on_get_error: policy for a failed L2 read.
            on_set_error: policy for a failed L2 write or publish.
            ready_timeout: seconds to wait for the invalidation channel before
                returning (0: do not wait).  The first subscription clears
                L1, so without waiting, copies made in the first
                milliseconds are dropped again; a dead server costs at most
                this long, then the cache works without the channel until
                it connects.
        """
        super().__init__(default_ttl=l2.default_ttl)
        for policy in (on_get_error, on_set_error):
            if not callable(policy) and policy not in _POLICIES:
                raise ValueError(f"an error policy is one of {_POLICIES} or a callable")
        self._l1 = l1
        self._l2 = l2
        self._l1_get = l1.bound_get()
        self._l1_ttl_ms = (_duration_ms(l1_ttl) or 0) if l1_ttl is not None else 0
        self.on_get_error = on_get_error
        self.on_set_error = on_set_error
        self.ttl_resolution = max(l1.ttl_resolution, l2.ttl_resolution)
        self.max_value_size = l2.max_value_size
        self._epochs = itertools.count(1)
        self._epoch = 0
        self._log_after = 0.0
        self._log_suppressed = 0
        self._lock = threading.Lock()
        self._l1_hits = 0
        self._l2_hits = 0
        self._misses = 0
        self._l2_errors = 0
        self._invalidations_received = 0
        self._clears_received = 0
        self._resyncs = 0
        self._l1_rejected = 0
        self._fills_dropped = 0
        self._l1_hit_count: Callable[[], int] = lambda: 0
        self.get = self._build_get()  # type: ignore[method-assign, assignment]
        self._invalidations_sent = 0
        self._invalidator = self._make_invalidator(invalidation, channel)
        # When invalidations travel through the L2 Redis itself, a write and
        # its invalidation share one pipelined round trip.
        self._co_publish = (
            isinstance(self._invalidator, RedisInvalidator)
            and self._l2.name == "redis"
            and getattr(self._l2, "url", None) == self._invalidator.url
            and hasattr(self._l2, "set_and_publish")
        )
        if self._invalidator is not None:
            self._invalidator.start(_Listener(self, self._invalidator))
            if ready_timeout > 0:
                self._invalidator.wait_connected(ready_timeout)

    def _build_get(self) -> Callable[[Key, Any], Any]:
        """The hot path as a closure: one call into L1, one comparison, one count.

        An instance attribute shadows :meth:`get`, saving the attribute
        lookups a method makes (an L1 hit must cost little more than the L1
        lookup itself).
        """
        l1_get = self._l1_get
        l2_get = self._get_l2
        miss = _MISS
        hits = 0

        def get(key: Key, default: Any = None) -> Any:
            nonlocal hits
            value = l1_get(key, miss)
            if value is not miss:
                hits += 1
                return value
            return l2_get(key, default)

        def count() -> int:
            return hits

        get.__doc__ = TieredCache.get.__doc__
        self._l1_hit_count = count
        return get

    def _make_invalidator(
        self, spec: Invalidator | str | None, channel: str | None
    ) -> Invalidator | None:
        if spec is None or isinstance(spec, Invalidator):
            return spec
        prefix = getattr(self._l2, "prefix", b"")
        if channel is None:
            channel = "nearcache:invalidate:" + prefix.decode("utf-8", "backslashreplace")
        if spec == "auto":
            url = getattr(self._l2, "url", None) if self._l2.name == "redis" else None
            return None if url is None else RedisInvalidator(url, channel)
        if spec.startswith(("redis://", "rediss://", "unix://", "valkey://")):
            return RedisInvalidator(spec.replace("valkey://", "redis://", 1), channel)
        raise ValueError(
            f"invalidation must be an Invalidator, a redis:// URL, 'auto' or None, not {spec!r}"
        )

    # -- tiers -------------------------------------------------------------

    @property
    def l1(self) -> Driver:
        """This host's tier."""
        return self._l1

    @property
    def l2(self) -> Driver:
        """The shared tier."""
        return self._l2

    @property
    def invalidator(self) -> Invalidator | None:
        """The cross-host invalidation channel, if any."""
        return self._invalidator

    @property
    def l1_ttl(self) -> float | None:
        """The longest an L1 copy lives, in seconds (None: unbounded)."""
        return self._l1_ttl_ms / 1000 if self._l1_ttl_ms else None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def wait_ready(self, timeout: float = 5.0) -> bool:
        """Wait until the invalidation channel is subscribed (True at once without one)."""
        return self._invalidator is None or self._invalidator.wait_connected(timeout)

    # -- policy and bookkeeping ----------------------------------------------

    def _failed(self, policy: ErrorPolicy, exc: BackendError, operation: str, key: Any) -> None:
        """Apply ``policy`` to an L2 failure; returns unless the policy raises."""
        self._l2_errors += 1
        if policy == "raise":
            raise exc
        if policy == "log":
            now = time.monotonic()
            if now >= self._log_after:
                suppressed, self._log_suppressed = self._log_suppressed, 0
                self._log_after = now + _LOG_INTERVAL
                more = f" ({suppressed} similar errors not logged)" if suppressed else ""
                logger.warning("nearcache L2 %s of %r failed: %s%s", operation, key, exc, more)
            else:
                self._log_suppressed += 1
        elif callable(policy):
            policy(exc, operation, key)

    def _bump(self) -> None:
        self._epoch = next(self._epochs)

    def _l1_ttl_for(self, ttl: TTL) -> float:
        """The TTL an L1 copy gets for an L2 entry written with ``ttl``."""
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        bound = self._l1_ttl_ms
        if not ms:
            return bound / 1000
        return (min(ms, bound) if bound else ms) / 1000

    def _l1_store(self, key: Key, value: Any, l1_ttl: float) -> None:
        try:
            self._l1.set(key, value, l1_ttl)
        except (ValueTooLargeError, SerializationError):
            self._l1_rejected += 1
            self._l1.delete(key)

    def _fill(self, key: Key, value: Any, left: float | None, epoch: int) -> None:
        """Copy an L2 hit into L1, unless a write or invalidation raced it."""
        bound = self._l1_ttl_ms / 1000
        ttl = bound if left is None else (min(left, bound) if bound else left)
        self._l1_store(key, value, ttl)
        if self._epoch != epoch:
            self._fills_dropped += 1
            self._l1.delete(key)

    def _publish(self, keys: Iterable[Key]) -> None:
        invalidator = self._invalidator
        if invalidator is None:
            return
        raw = [key_bytes(key) for key in keys]
        try:
            invalidator.publish(raw)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "invalidate", raw[0] if len(raw) == 1 else raw)
        else:
            self._invalidations_sent += 1

    def _message(self, key: Key) -> tuple[bytes, bytes]:
        """(channel, message) invalidating ``key``, for pipelined writes."""
        invalidator = self._invalidator
        assert isinstance(invalidator, RedisInvalidator)
        return invalidator.channel, encode_message(invalidator.origin, _OP_KEYS, [key_bytes(key)])

    # -- called by the invalidation thread -----------------------------------

    def _invalidate(self, keys: list[bytes]) -> None:
        self._bump()
        self._invalidations_received += 1
        if len(keys) == 1:
            self._l1.delete(keys[0])
        else:
            self._l1.delete_many(keys)

    def _clear_l1(self, *, received: bool = False) -> None:
        self._bump()
        if received:
            self._clears_received += 1
        self._l1.clear()

    def _resync(self) -> None:
        self._resyncs += 1
        self._clear_l1()

    # -- reads ---------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """L1, then L2 (filling L1)."""
        value = self._l1_get(key, _MISS)
        if value is not _MISS:
            self._l1_hits += 1
            return value
        return self._get_l2(key, default)

    def _get_l2(self, key: Key, default: Any) -> Any:
        epoch = self._epoch
        try:
            value, left = self._l2.get_with_ttl(key, _MISS)
        except BackendError as exc:
            self._misses += 1
            self._failed(self.on_get_error, exc, "get", key)
            return default
        if value is _MISS:
            self._misses += 1
            return default
        self._l2_hits += 1
        self._fill(key, value, left, epoch)
        return value

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """From L2, which knows the true TTL (and fill L1)."""
        epoch = self._epoch
        try:
            value, left = self._l2.get_with_ttl(key, _MISS)
        except BackendError as exc:
            self._failed(self.on_get_error, exc, "get", key)
            return default, None
        if value is _MISS:
            return default, None
        self._fill(key, value, left, epoch)
        return value, left

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """L1 for all, then one L2 request for the misses."""
        wanted = list(keys)
        found = self._l1.get_many(wanted)
        self._l1_hits += len(found)
        missing = [key for key in wanted if key not in found]
        if not missing:
            return found
        epoch = self._epoch
        try:
            fetched = self._l2.get_many_with_ttl(missing)
        except BackendError as exc:
            self._misses += len(missing)
            self._failed(self.on_get_error, exc, "get_many", missing)
            return found
        self._l2_hits += len(fetched)
        self._misses += len(missing) - len(fetched)
        for key, (value, left) in fetched.items():
            self._fill(key, value, left, epoch)
            found[key] = value
        return found

    def contains(self, key: Key) -> bool:
        """In L1, or else in L2."""
        if self._l1.contains(key):
            return True
        try:
            return self._l2.contains(key)
        except BackendError as exc:
            self._failed(self.on_get_error, exc, "contains", key)
            return False

    # -- writes --------------------------------------------------------------

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """L2, then this host's L1, then the invalidation."""
        try:
            if self._co_publish:
                channel, message = self._message(key)
                self._l2.set_and_publish(key, value, ttl, channel, message)  # type: ignore[attr-defined]
                self._invalidations_sent += 1
            else:
                self._l2.set(key, value, ttl)
        except BackendError as exc:
            self._write_failed(exc, "set", key)
            self._bump()
            self._l1_store(key, value, self._l1_ttl_for(ttl))
            return
        self._bump()
        self._l1_store(key, value, self._l1_ttl_for(ttl))
        if not self._co_publish:
            self._publish((key,))

    def _write_failed(self, exc: BackendError, operation: str, key: Any) -> None:
        if self.on_set_error == "raise":
            self._bump()
            if isinstance(key, list):
                self._l1.delete_many(key)
            else:
                self._l1.delete(key)
        self._failed(self.on_set_error, exc, operation, key)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """L2, then L1, then one invalidation for every key."""
        items = dict(mapping)
        if not items:
            return
        l1_ttl = self._l1_ttl_for(ttl)
        try:
            self._l2.set_many(items, ttl)
        except BackendError as exc:
            self._write_failed(exc, "set_many", list(items))
            self._bump()
            self._l1_set_many(items, l1_ttl)
            return
        self._bump()
        self._l1_set_many(items, l1_ttl)
        self._publish(items)

    def _l1_set_many(self, items: dict[Key, Any], l1_ttl: float) -> None:
        try:
            self._l1.set_many(items, l1_ttl)
        except (ValueTooLargeError, SerializationError):
            for key, value in items.items():
                self._l1_store(key, value, l1_ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """L2 add; on success, L1 and the invalidation."""
        try:
            added = self._l2.add(key, value, ttl)
        except BackendError as exc:
            self._write_failed(exc, "add", key)
            return False
        if added:
            self._bump()
            self._l1_store(key, value, self._l1_ttl_for(ttl))
            self._publish((key,))
        return added

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """L2 replace; on success, L1 and the invalidation."""
        try:
            replaced = self._l2.replace(key, value, ttl)
        except BackendError as exc:
            self._write_failed(exc, "replace", key)
            return False
        self._bump()
        if replaced:
            self._l1_store(key, value, self._l1_ttl_for(ttl))
            self._publish((key,))
        else:
            self._l1.delete(key)
        return replaced

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """L2 touch, then the L1 copy's TTL (bounded by ``l1_ttl``)."""
        try:
            touched = self._l2.touch(key, ttl)
        except BackendError as exc:
            self._write_failed(exc, "touch", key)
            return False
        if touched:
            self._l1.touch(key, self._l1_ttl_for(ttl))
            self._publish((key,))  # a shorter TTL must not be outlived elsewhere
        else:
            self._bump()
            self._l1.delete(key)
        return touched

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """L2 incr; the L1 copy is dropped (and other hosts told)."""
        try:
            result = self._l2.incr(key, delta, default)
        except BackendError as exc:
            self._write_failed(exc, "incr", key)
            raise
        self._bump()
        self._l1.delete(key)
        self._publish((key,))
        return result

    def delete(self, key: Key) -> bool:
        """L2, this host's L1, and the invalidation."""
        self._bump()
        self._l1.delete(key)
        try:
            if self._co_publish:
                channel, message = self._message(key)
                deleted: bool = self._l2.delete_and_publish(key, channel, message)  # type: ignore[attr-defined]
                self._invalidations_sent += 1
                return deleted
            deleted = self._l2.delete(key)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "delete", key)
            return False
        self._publish((key,))
        return deleted

    def delete_many(self, keys: Iterable[Key]) -> int:
        """L2, this host's L1, and one invalidation."""
        wanted = list(keys)
        if not wanted:
            return 0
        self._bump()
        self._l1.delete_many(wanted)
        try:
            count = self._l2.delete_many(wanted)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "delete_many", wanted)
            return 0
        self._publish(wanted)
        return count

    def pop(self, key: Key, default: Any = None) -> Any:
        """L2 pop (atomic where L2 is); L1 and other hosts drop the key."""
        self._bump()
        self._l1.delete(key)
        try:
            value = self._l2.pop(key, _MISS)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "pop", key)
            return default
        if value is _MISS:
            return default
        self._publish((key,))
        return value

    def clear(self) -> None:
        """L2 (see its driver for the scope), this host's L1, and every other host's L1."""
        self._clear_l1()
        try:
            self._l2.clear()
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "clear", None)
            return
        if self._invalidator is not None:
            try:
                self._invalidator.publish_clear()
            except BackendError as exc:
                self._failed(self.on_set_error, exc, "invalidate", None)

    # -- lifecycle -------------------------------------------------------------

    def close(self) -> None:
        """Stop the invalidation channel and close both tiers."""
        if self._closed:
            return
        if self._invalidator is not None:
            self._invalidator.close()
        self._l1.close()
        self._l2.close()
        super().close()

    def stats(self) -> dict[str, Any]:
        """Counters per tier, the invalidation channel's, and each tier's own.

        The counters are this process's (the L1's own stats may cover every
        process on the host).  They are updated without a lock, so under heavy
        multi-threading an increment can occasionally be lost.
        """
        stats: dict[str, Any] = {
            "driver": self.name,
            "l1_hits": self._l1_hits + self._l1_hit_count(),
            "l2_hits": self._l2_hits,
            "misses": self._misses,
            "l2_errors": self._l2_errors,
            "invalidations_sent": self._invalidations_sent,
            "invalidations_received": self._invalidations_received,
            "clears_received": self._clears_received,
            "resyncs": self._resyncs,
            "l1_rejected": self._l1_rejected,
            "fills_dropped": self._fills_dropped,
            "l1_ttl": self.l1_ttl,
            "l1": self._l1.stats(),
            "l2": self._l2.stats(),
        }
        if self._invalidator is not None:
            stats["invalidation"] = self._invalidator.stats()
        return stats

    def __repr__(self) -> str:
        return f"<TieredCache l1={self._l1!r} l2={self._l2!r}>"
