"""The invalidation channel between hosts: the message format and the Redis pub/sub invalidator.

A message is ``NC1 | origin (16 bytes) | op | (4-byte length, key)*``; every
message carries its sender's random origin so a cache ignores its own.
:class:`RedisInvalidator` holds one subscription on a daemon thread, pings
the server when it is silent, reconnects with a backoff, and reports every
(re)subscription to its listener (messages may have been missed meanwhile).
"""

from __future__ import annotations

import contextlib
import os
import select
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Sequence
from typing import Any

from nearcache.drivers.base import BackendError
from nearcache.tiered.resp import Resp2Reader, command

__all__ = [
    "InvalidationListener",
    "Invalidator",
    "RedisInvalidator",
    "decode_message",
    "encode_message",
]


class InvalidationListener:
    """What an :class:`Invalidator` calls when messages arrive (on its own thread)."""

    def on_invalidate(self, keys: list[bytes]) -> None:
        """Other hosts changed these keys (as :func:`~nearcache.drivers.base.key_bytes`)."""

    def on_clear(self) -> None:
        """Another host cleared the whole cache."""

    def on_resync(self) -> None:
        """The subscription was (re)established: messages may have been missed."""

    def on_listening(self) -> None:
        """A session is up and delivering (after its ``on_resync``, if it had one)."""


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


class ReaderThread:
    """The receiving side of an invalidator: one thread keeping a session alive.

    The thread runs :meth:`_session` (connect, then read until it fails or
    :meth:`close` stops it) again and again: after a drop it retries after
    ``reconnect_delay``, after failed connects with a delay doubling up to
    ``max_reconnect_delay``. ``connected`` is set by the session once it
    reads, and cleared whenever it ends. Subclasses set the attributes
    below in ``__init__`` and define :meth:`_session` and
    :meth:`_thread_name`.
    """

    reconnect_delay: float
    max_reconnect_delay: float
    errors: int
    last_error: str | None
    _listener: InvalidationListener | None
    _thread: threading.Thread | None
    _stop: threading.Event
    _connected: threading.Event

    def _thread_name(self) -> str:
        raise NotImplementedError

    def _session(self) -> None:
        raise NotImplementedError

    def start(self, listener: InvalidationListener) -> None:
        """Start the receiving thread, delivering to ``listener``."""
        self._listener = listener
        self._stop.clear()
        thread = threading.Thread(target=self._run, name=self._thread_name(), daemon=True)
        self._thread = thread
        thread.start()

    @property
    def connected(self) -> bool:
        """Whether the receiving session is up and reading."""
        return self._connected.is_set()

    def wait_connected(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the receiving session."""
        return self._connected.wait(timeout)

    def _run(self) -> None:
        delay = self.reconnect_delay
        while not self._stop.is_set():
            try:
                self._session()
                delay = self.reconnect_delay
            except Exception as exc:  # the receiver must survive anything
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


class RedisInvalidator(ReaderThread, Invalidator):
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

        ``batch_interval``: after handling more than one message from one
        read, the thread pauses this long before waiting for more, so a
        burst of writes is handled in a few batches rather than one thread
        switch per message (each switch takes the GIL from the
        application's threads).  It bounds the extra delay of an
        invalidation during a burst; after a lone message the thread waits
        for the next one at once (a pause there delayed the next write's
        invalidation by up to the interval, plus the wake-up, on a loaded
        machine).
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
        #: Whether a forked child starts its own subscription (False when a
        #: listener election decides which process of the host listens).
        self.restart_after_fork = True
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

    def _thread_name(self) -> str:
        return f"nearcache-invalidation-{self.channel.decode()}"

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
            sock.sendall(self._subscribe_commands(connection))
            reader = Resp2Reader()
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
                        sock.sendall(command(b"PING"))
                        ping_sent = now
                    continue
                data = sock.recv(65536)
                if not data:
                    raise self._redis.exceptions.ConnectionError("the server closed the connection")
                last_heard, ping_sent = now, None
                replies = reader.feed(data)
                for reply in replies:
                    self._handle(listener, reply)
                if self.batch_interval and len(replies) > 1:  # a burst: let the next gather
                    self._stop.wait(self.batch_interval)
        finally:
            self._connection = None
            with contextlib.suppress(Exception):
                connection.disconnect()

    def _subscribe_commands(self, connection: Any) -> bytes:
        """What to send on a new connection to start receiving (here: SUBSCRIBE)."""
        return command(b"SUBSCRIBE", self.channel)

    def _handle(self, listener: InvalidationListener, reply: Any) -> None:
        if not isinstance(reply, list) or not reply:
            return  # PING replies and the like
        kind = reply[0]
        if kind == b"message" and len(reply) == 3:
            self._deliver(listener, reply[2])
        elif kind == b"subscribe":
            # Subscribed (again): anything sent meanwhile was missed. L1 is
            # cleared before the channel reports ready, so a write made once
            # `wait_ready` returned is not wiped by this clear.
            self.subscriptions += 1
            listener.on_resync()
            listener.on_listening()
            self._connected.set()

    def _deliver(self, listener: InvalidationListener, data: bytes) -> None:
        decoded = decode_message(data)
        if decoded is None:
            self.ignored += 1
            return
        origin, op, keys = decoded
        if origin == self.origin:
            return
        if op == _OP_KEYS:
            listener.on_invalidate(keys)
        elif op == _OP_CLEAR:
            listener.on_clear()
        else:
            self.ignored += 1
            return
        self.received += 1  # once applied: whoever sees the count grow sees the effect

    def _after_fork_in_child(self) -> None:
        self._connected.clear()
        self._connection = None  # the parent's: never close it from here
        self._pid = os.getpid()
        self.origin = uuid.uuid4().bytes
        running = self._thread is not None and not self._stop.is_set()
        self._thread = None  # the parent's thread does not exist here
        if running and self.restart_after_fork and self._listener is not None:
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


_after_fork: weakref.WeakSet[RedisInvalidator] = weakref.WeakSet()


def _restart_invalidators_in_child() -> None:
    for invalidator in list(_after_fork):
        invalidator._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_restart_invalidators_in_child)
