"""Redis (or Valkey) through redis-py.

* Connection: a URL (``redis://[user:pass@]host:port/db``, ``rediss://`` for
  TLS, ``unix:///path/to.sock?db=0``) and a pool of connections shared by the
  process's threads (redis-py reopens the pool after ``fork``).
* Timeouts: every connection has a connect timeout and a socket timeout (one
  second by default) and redis-py's own retries are off by default, so a dead
  or stopped server makes a call raise :class:`~nearcache.drivers.base.BackendError`
  within about one timeout instead of hanging.
* Keys: ``prefix + key`` (see :func:`~nearcache.drivers.base.key_bytes`).
  :meth:`RedisDriver.clear` deletes only the keys under the prefix, found
  with ``SCAN`` and removed with ``UNLINK``; it never runs ``FLUSHDB``.  With
  an empty prefix it removes every key of the database, one batch at a time.
* Values: :mod:`nearcache.drivers.codec` (integers as plain decimal, so
  ``incr`` is Redis's own ``INCRBY``; other values through the same
  serializers, compression and signing as :class:`nearcache.Cache`).
* TTL: ``PX`` milliseconds; ``touch`` is ``PEXPIRE`` or ``PERSIST``.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, NoReturn, cast

import redis
import redis.exceptions
from redis.backoff import NoBackoff
from redis.retry import Retry

from nearcache.drivers.base import (
    TTL,
    BackendError,
    CounterOverflowError,
    Driver,
    Key,
    NotACounterError,
    check_counter_args,
    check_key_collection,
    key_bytes,
    ttl_to_ms,
)
from nearcache.drivers.codec import StoreCodec
from nearcache.keys import decode_key
from nearcache.serializers import Compressor, EntryRejected, Serializer

__all__ = ["RedisClusterDriver", "RedisDriver", "RedisSentinelDriver"]

# Create the counter (when missing) and increment it in one atomic step.
# ARGV: delta, initial value ('' = raise when missing), TTL in ms for a new
# counter ('0' = none).  The result is read back with GET: Lua numbers are
# doubles and would round counters above 2**53.
_INCR_SCRIPT = """
local created = false
if redis.call('EXISTS', KEYS[1]) == 0 then
  if ARGV[2] == '' then
    return redis.error_reply('NEARCACHE_MISSING')
  end
  if ARGV[3] == '0' then
    redis.call('SET', KEYS[1], ARGV[2])
  else
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  end
  created = true
end
local r = redis.pcall('INCRBY', KEYS[1], ARGV[1])
if type(r) == 'table' and r.err then
  if created then
    redis.call('DEL', KEYS[1])
  end
  return r
end
return redis.call('GET', KEYS[1])
"""

# A write and its entry in the invalidation stream, atomically.
# KEYS: the key, the stream.  ARGV: value, TTL in ms ('0' = none), the
# stream's MAXLEN (approximate), then the entry's field/value pairs.
_SET_APPEND_SCRIPT = """
if ARGV[2] == '0' then
  redis.call('SET', KEYS[1], ARGV[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', unpack(ARGV, 4))
return 1
"""
_DELETE_APPEND_SCRIPT = """
local deleted = redis.call('DEL', KEYS[1])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[1], '*', unpack(ARGV, 2))
return deleted
"""

_SCAN_BATCH = 1000
_MISS: Any = object()
_GLOB_SPECIAL = frozenset(b"*?[]\\")


# Compare-and-delete for delete_if_equals (Redis runs a script atomically).
_DELETE_IF_EQUALS = (
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0"
)


def _glob_escape(prefix: bytes) -> bytes:
    out = bytearray()
    for byte in prefix:
        if byte in _GLOB_SPECIAL:
            out.append(0x5C)  # backslash
        out.append(byte)
    return bytes(out)


class RedisDriver(Driver):
    """A Redis database (or the part of it under ``prefix``) as a cache."""

    name: ClassVar[str] = "redis"
    accepts_encoded_keys: ClassVar[bool] = True
    #: What the client raises when the server fails (each becomes a BackendError).
    _errors: ClassVar[tuple[type[Exception], ...]] = (redis.exceptions.RedisError,)

    def __init__(
        self,
        url: str = "redis://127.0.0.1:6379/0",
        *,
        prefix: str | bytes = b"",
        default_ttl: TTL = None,
        serializer: str | Serializer = "pickle",
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        max_connections: int | None = None,
        retries: int = 0,
        health_check_interval: int = 0,
        client: redis.Redis | None = None,
        **options: Any,
    ) -> None:
        """Connect lazily to ``url`` (nothing is sent until the first call).

        Args:
            url: a redis-py connection URL.
            prefix: prepended to every key; ``clear`` removes only these keys.
            default_ttl: TTL used when a call passes ``ttl=None``.
            serializer: for values that are not bytes/str/int/float/bool/None.
            compress: ``"zstd"`` to compress large values (as in ``Cache``).
            compress_threshold: smallest value compressed.
            signing_key: sign every value (HMAC-SHA256) and treat values that
                do not verify as misses: use it whenever anyone else can
                write to the Redis server and the serializer is pickle.
            socket_timeout: seconds to wait for a reply.
            connect_timeout: seconds to wait for a connection.
            max_connections: pool size limit (``None``: unbounded).
            retries: how many times redis-py retries a command after a
                connection error (0: fail at once; the caller decides).
            health_check_interval: seconds of idleness after which a pooled
                connection is checked with PING before use (0: never).
            client: an existing ``redis.Redis`` (with ``decode_responses``
                off) to use instead of ``url``; it is not closed by ``close``.
            options: more keyword arguments for ``redis.Redis.from_url``.
        """
        super().__init__(default_ttl=default_ttl)
        self.prefix = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        self._codec = StoreCodec(
            serializer,
            compress=compress,
            compress_threshold=compress_threshold,
            signing_key=signing_key,
        )
        self.rejected = 0
        self._owns_client = client is None
        if client is None:
            self.url = url
            client = redis.Redis.from_url(
                url,
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                max_connections=max_connections,
                retry=Retry(NoBackoff(), retries),
                health_check_interval=health_check_interval,
                **options,
            )
        else:
            pool = getattr(client, "connection_pool", None)
            kwargs = pool.connection_kwargs if pool is not None else {}
            self.url = f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        self._client: redis.Redis = client
        self._direct_pool = _direct_pool(client)
        # Connections taken from the pool once for _round_trip and kept: the
        # pool's checkout and checkin cost more than the round trip's packing.
        # The pool still disconnects them on close.  They count against the
        # pool's max_connections, so at most a quarter of a large pool (such
        # as redis-py's default of 100) is kept, none of a small one; beyond
        # that a connection goes back to the pool after its round trip.
        limit = self._direct_pool.max_connections if self._direct_pool else 0
        self._keep = limit // 4 if limit >= 32 else 0
        self._idle: list[Any] = []
        self._idle_pid = os.getpid()
        self._incr = client.register_script(_INCR_SCRIPT)
        self._set_append = client.register_script(_SET_APPEND_SCRIPT)
        self._delete_append = client.register_script(_DELETE_APPEND_SCRIPT)

    @property
    def client(self) -> redis.Redis:
        """The underlying ``redis.Redis`` client."""
        return self._client

    def _k(self, key: Key) -> bytes:
        return self.prefix + key_bytes(key)

    def _fail(self, exc: Exception) -> NoReturn:
        raise BackendError(f"redis at {_redact(self.url)}: {exc}") from exc

    def _round_trip(self, *commands: tuple[Any, ...]) -> list[Any]:
        """Send ``commands`` together and read their replies: one round trip.

        On a plain single-server client (no retries), the commands are packed
        and written on one pooled connection directly, which costs about
        half of what a redis-py ``pipeline()`` does in client CPU (no
        pipeline object, command stack or response callbacks); any other
        client goes through redis-py (a pipeline for several commands).
        Error replies are read in full
        before the first one is raised, so the connection stays usable.
        """
        pool = self._direct_pool
        if pool is None:
            if len(commands) == 1:  # redis-py's own path (retries, redirections)
                return [self._client.execute_command(*commands[0])]  # type: ignore[no-untyped-call]
            with self._client.pipeline(transaction=False) as pipe:
                for args in commands:
                    pipe.execute_command(*args)  # type: ignore[no-untyped-call]
                return pipe.execute()
        idle = self._idle
        if self._idle_pid != os.getpid():  # forked: the parent's connections are not ours
            idle.clear()
            self._idle_pid = os.getpid()
        try:
            connection = idle.pop()
        except IndexError:
            connection = pool.get_connection()  # kept out of the pool from now on
        try:
            connection.send_packed_command([_pack(commands)])
            replies: list[Any] = []
            error: redis.exceptions.ResponseError | None = None
            for _ in commands:
                try:
                    replies.append(connection.read_response())
                except redis.exceptions.ResponseError as exc:
                    error = error or exc
                    replies.append(exc)
        except BaseException:
            connection.disconnect()  # reconnects on its next use
            raise
        finally:
            if len(idle) < self._keep:
                idle.append(connection)
            else:
                pool.release(connection)
        if error is not None:
            raise error
        return replies

    def _script(self, script: Any, keys: list[Any], args: list[Any]) -> Any:
        """Run a registered script: EVALSHA straight on a connection (see
        :meth:`_round_trip`), or through redis-py when the server lacks it."""
        if self._direct_pool is not None:
            with contextlib.suppress(redis.exceptions.NoScriptError):
                return self._round_trip(("EVALSHA", script.sha, len(keys), *keys, *args))[0]
        return script(keys=keys, args=args)  # loads the script when needed

    def _decode(self, data: bytes, k: bytes, default: Any) -> Any:
        try:
            return self._codec.decode(data, k)
        except EntryRejected:
            self.rejected += 1
            return default

    def _key_batch(
        self, keys: Iterable[Key], *, distinct: bool = False
    ) -> tuple[list[Any], list[bytes]]:
        """The keys of a many-key read as given (each once when ``distinct``) and as stored."""
        check_key_collection(keys)
        given = list(dict.fromkeys(keys)) if distinct else list(keys)
        ks = [self._k(key) for key in given]
        self._check_open()
        return given, ks

    def _hits(
        self, given: list[Any], ks: list[bytes], values: Sequence[bytes | None]
    ) -> Iterator[tuple[int, Any, Any]]:
        """``(position, key, value)`` of each of ``values`` (the replies for ``ks``,
        in order) that holds an entry that decodes."""
        for index, (key, k, data) in enumerate(zip(given, ks, values, strict=True)):
            if data is not None:
                value = self._decode(data, k, _MISS)
                if value is not _MISS:
                    yield index, key, value

    def _encode_write(self, key: Key, value: Any, ttl: TTL) -> tuple[bytes, int, bytes]:
        """``(stored key, TTL in ms or 0, stored value)`` of a write, checked in the
        order every write checks them: key, TTL, value, then that the driver is open."""
        k = self._k(key)
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        data = self._codec.encode(value, k)
        self._check_open()
        return k, ms, data

    # -- reads -------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """GET."""
        k = self._k(key)
        self._check_open()
        try:
            data = cast("bytes | None", self._client.get(k))
        except self._errors as exc:
            self._fail(exc)
        if data is None:
            return default
        return self._decode(data, k, default)

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """GET and PTTL, pipelined in one round trip."""
        k = self._k(key)
        self._check_open()
        try:
            data, pttl = self._round_trip(("GET", k), ("PTTL", k))
        except self._errors as exc:
            self._fail(exc)
        if data is None:
            return default, None
        value = self._decode(data, k, _MISS)
        if value is _MISS:
            return default, None
        return value, _seconds_left(pttl)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """MGET."""
        given, ks = self._key_batch(keys)
        if not ks:
            return {}
        try:
            values = cast("list[bytes | None]", self._client.mget(ks))
        except self._errors as exc:
            self._fail(exc)
        return {key: value for _, key, value in self._hits(given, ks, values)}

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """MGET and one PTTL per key, pipelined in one round trip."""
        given, ks = self._key_batch(keys)
        if not ks:
            return {}
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.mget(ks)
                for k in ks:
                    pipe.pttl(k)
                values, *pttls = pipe.execute()
        except self._errors as exc:
            self._fail(exc)
        hits = self._hits(given, ks, values)
        return {key: (value, _seconds_left(pttls[index])) for index, key, value in hits}

    def contains(self, key: Key) -> bool:
        """EXISTS."""
        k = self._k(key)
        self._check_open()
        try:
            return bool(self._client.exists(k))
        except self._errors as exc:
            self._fail(exc)

    # -- writes ------------------------------------------------------------

    def _write(self, key: Key, value: Any, ttl: TTL, *, nx: bool = False, xx: bool = False) -> bool:
        k, ms, data = self._encode_write(key, value, ttl)
        args: tuple[Any, ...] = ("SET", k, data)
        if ms:
            args += ("PX", ms)
        if nx:
            args += ("NX",)
        elif xx:
            args += ("XX",)
        try:
            (done,) = self._round_trip(args)
        except self._errors as exc:
            self._fail(exc)
        return bool(done)

    def delete_if_equals(self, key: Key, value: Any) -> bool:
        """GET, compare and DEL in one Lua script: atomic (the value is
        compared as stored, so it must encode deterministically, as bytes
        and str do)."""
        k = self._k(key)
        data = self._codec.encode(value, k)
        self._check_open()
        try:
            return bool(self._client.eval(_DELETE_IF_EQUALS, 1, k, data))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """SET key value [PX ms]."""
        self._write(key, value, ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """SET key value NX [PX ms]."""
        return self._write(key, value, ttl, nx=True)

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """SET key value XX [PX ms]."""
        return self._write(key, value, ttl, xx=True)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """One pipelined SET per item, in one round trip."""
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        items = []
        for key, value in mapping.items():
            k = self._k(key)
            items.append((k, self._codec.encode(value, k)))
        self._check_open()
        if not items:
            return
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for k, data in items:
                    pipe.set(k, data, px=ms or None)
                pipe.execute()
        except self._errors as exc:
            self._fail(exc)

    def set_and_publish(
        self, key: Key, value: Any, ttl: TTL, channel: bytes, message: bytes
    ) -> None:
        """SET, then PUBLISH ``message`` on ``channel``, pipelined in one round trip.

        A tiered cache whose invalidations travel through this same server
        uses it so that a write costs one round trip, not two.
        """
        k, ms, data = self._encode_write(key, value, ttl)
        write: tuple[Any, ...] = ("SET", k, data, "PX", ms) if ms else ("SET", k, data)
        try:
            self._round_trip(write, ("PUBLISH", channel, message))
        except self._errors as exc:
            self._fail(exc)

    def delete_and_publish(self, key: Key, channel: bytes, message: bytes) -> bool:
        """DEL, then PUBLISH, pipelined in one round trip (see :meth:`set_and_publish`)."""
        k = self._k(key)
        self._check_open()
        try:
            deleted, _ = self._round_trip(("DEL", k), ("PUBLISH", channel, message))
        except self._errors as exc:
            self._fail(exc)
        return bool(deleted)

    def set_and_append(self, key: Key, value: Any, ttl: TTL, entry: Mapping[str, Any]) -> None:
        """SET, then XADD (``entry``: keyword arguments of ``xadd``) in one script.

        One command, one round trip, and atomic: the write and its
        invalidation entry are applied together or not at all.
        """
        k, ms, data = self._encode_write(key, value, ttl)
        try:
            self._script(
                self._set_append,
                [k, entry["name"]],
                [data, ms, entry["maxlen"], *_fields(entry["fields"])],
            )
        except self._errors as exc:
            self._fail(exc)

    def delete_and_append(self, key: Key, entry: Mapping[str, Any]) -> bool:
        """DEL, then XADD, in one script (see :meth:`set_and_append`)."""
        k = self._k(key)
        self._check_open()
        try:
            deleted = self._script(
                self._delete_append,
                [k, entry["name"]],
                [entry["maxlen"], *_fields(entry["fields"])],
            )
        except self._errors as exc:
            self._fail(exc)
        return bool(deleted)

    def delete(self, key: Key) -> bool:
        """DEL."""
        k = self._k(key)
        self._check_open()
        try:
            return bool(self._client.delete(k))
        except self._errors as exc:
            self._fail(exc)

    def delete_many(self, keys: Iterable[Key]) -> int:
        """DEL with every key; duplicates count once."""
        check_key_collection(keys)
        ks = list(dict.fromkeys(self._k(key) for key in keys))
        self._check_open()
        if not ks:
            return 0
        try:
            return int(self._client.delete(*ks))
        except self._errors as exc:
            self._fail(exc)

    def pop(self, key: Key, default: Any = None) -> Any:
        """GETDEL (atomic)."""
        k = self._k(key)
        self._check_open()
        try:
            data = cast("bytes | None", self._client.getdel(k))
        except self._errors as exc:
            self._fail(exc)
        return default if data is None else self._decode(data, k, default)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """PEXPIRE, or PERSIST plus EXISTS in one transaction for "never expires"."""
        return self._touch(key, ttl, transaction=True)

    def _touch(self, key: Key, ttl: TTL, *, transaction: bool) -> bool:
        """PEXPIRE, or PERSIST then EXISTS pipelined (in MULTI/EXEC when ``transaction``)."""
        k = self._k(key)
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        self._check_open()
        try:
            if ms:
                return bool(self._client.pexpire(k, ms))
            with self._client.pipeline(transaction=transaction) as pipe:
                pipe.persist(k)
                pipe.exists(k)
                _, exists = pipe.execute()
            return bool(exists)
        except self._errors as exc:
            self._fail(exc)

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """INCRBY in a script that creates a missing counter with the default TTL."""
        check_counter_args(delta, default)
        k = self._k(key)
        self._check_open()
        initial = "" if default is None else str(default)
        try:
            result = self._incr(keys=[k], args=[delta, initial, self._default_ttl_ms])
        except redis.exceptions.ResponseError as exc:
            message = str(exc)
            if "NEARCACHE_MISSING" in message:
                raise KeyError(key) from None
            if "overflow" in message:
                raise CounterOverflowError("counter would leave the signed 64-bit range") from None
            if "not an integer" in message:
                raise NotACounterError(f"the value under {key!r} is not an integer") from None
            self._fail(exc)
        except self._errors as exc:
            self._fail(exc)
        return int(result)

    def clear(self) -> None:
        """Delete every key under the prefix (SCAN + UNLINK; never FLUSHDB)."""
        self._check_open()
        pattern = _glob_escape(self.prefix) + b"*"
        try:
            batch: list[bytes] = []
            for k in self._client.scan_iter(match=pattern, count=_SCAN_BATCH):
                batch.append(k)
                if len(batch) >= _SCAN_BATCH:
                    self._client.unlink(*batch)
                    batch.clear()
            if batch:
                self._client.unlink(*batch)
        except self._errors as exc:
            self._fail(exc)

    def keys(self) -> list[Key]:
        """The keys under the prefix, without it (SCAN; a snapshot that may
        miss or repeat keys written meanwhile, as SCAN does)."""
        self._check_open()
        pattern = _glob_escape(self.prefix) + b"*"
        cut = len(self.prefix)
        try:
            found = {k[cut:] for k in self._client.scan_iter(match=pattern, count=_SCAN_BATCH)}
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return [decode_key(k) for k in found]

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Disconnect the pool (unless the client was given by the caller)."""
        if not self._closed and self._direct_pool is not None and self._idle_pid == os.getpid():
            while self._idle:
                self._direct_pool.release(self._idle.pop())
        if not self._closed and self._owns_client:
            self._client.close()
            self._client.connection_pool.disconnect()
        super().close()

    def stats(self) -> dict[str, Any]:
        """The connection URL and prefix (counters live in the server's INFO)."""
        return {
            "driver": self.name,
            "url": _redact(self.url),
            "prefix": self.prefix,
            "rejected": self.rejected,
        }

    def __repr__(self) -> str:
        return f"<RedisDriver {_redact(self.url)} prefix={self.prefix!r}>"


def _pack(commands: tuple[tuple[Any, ...], ...]) -> bytes:
    """Commands of bytes, str and int arguments in RESP, ready to send."""
    out = []
    for args in commands:
        out.append(b"*%d\r\n" % len(args))
        for arg in args:
            if isinstance(arg, int):
                arg = b"%d" % arg
            elif isinstance(arg, str):
                arg = arg.encode()
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
    return b"".join(out)


def _direct_pool(client: Any) -> redis.ConnectionPool | None:
    """The pool to write packed commands on directly, when that is safe.

    Only a plain ``ConnectionPool`` (one server: not a cluster, not a
    sentinel-managed pool) and a client that does not retry: those two are
    the cases where redis-py's command path adds nothing but cost.
    """
    pool = getattr(client, "connection_pool", None)
    if type(pool) is not redis.ConnectionPool or not isinstance(client, redis.Redis):
        return None
    retry = client.get_retry()
    if retry is not None and retry.get_retries() != 0:
        return None
    return pool


def _seconds_left(pttl: int) -> float | None:
    """A PTTL reply as seconds left (``None``: the entry never expires), at least 1 ms."""
    return max(pttl, 1) / 1000 if pttl != -1 else None


def _fields(fields: Mapping[Any, Any]) -> list[Any]:
    """A stream entry's fields as the flat list XADD takes."""
    return [item for pair in fields.items() for item in pair]


def _addresses(nodes: str | Sequence[str]) -> list[tuple[str, int]]:
    """``"host:port,host:port"`` or a list of ``"host:port"`` as (host, port) pairs."""
    items = nodes.split(",") if isinstance(nodes, str) else list(nodes)
    pairs = []
    for item in items:
        host, sep, port = item.strip().rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"expected host:port, not {item!r}")
        pairs.append((host.strip("[]"), int(port)))
    if not pairs:
        raise ValueError("no host:port given")
    return pairs


class _LazyClient:
    """A client made on first use: a RedisCluster connects as it is created.

    A cache must be constructible while its servers are down (the calls then
    fail with BackendError), so when the cluster cannot be reached at
    construction the client is made by the first call that can.
    """

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._client: Any = None
        self._lock = threading.Lock()

    def connect(self) -> None:
        """Make the client now (raises what the client's constructor raises)."""
        self._get()

    def _get(self) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._connect()
                client = self._client
        return client

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "connection_pool":
            raise AttributeError(name)  # no connecting for introspection
        return getattr(self._get(), name)

    def register_script(self, script: str) -> Any:
        """A Script bound to this lazy client (nothing is sent yet)."""
        from redis.commands.core import Script

        return Script(self, script.encode())  # type: ignore[arg-type]

    def close(self) -> None:
        """Close the client if it was made."""
        if self._client is not None:
            self._client.close()


class RedisClusterDriver(RedisDriver):
    """A Redis Cluster (redis-py's ``RedisCluster``) as a cache.

    Keys are spread over the cluster's slots; ``get_many`` and the pipelined
    writes are split by node (redis-py groups a pipeline's commands per node
    and sends each group in one round trip), ``clear`` scans every primary.
    Redirections (``MOVED``/``ASK``, during a slot migration or after a
    failover) are followed by redis-py; ``retries`` more attempts are made
    after a connection error, each after refreshing the slot map.
    """

    name: ClassVar[str] = "redis-cluster"
    _errors: ClassVar[tuple[type[Exception], ...]] = (
        redis.exceptions.RedisError,
        redis.exceptions.RedisClusterException,
    )

    def __init__(
        self,
        nodes: str | Sequence[str] = "127.0.0.1:7000",
        *,
        prefix: str | bytes = b"",
        default_ttl: TTL = None,
        serializer: str | Serializer = "pickle",
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        max_connections: int | None = None,
        retries: int = 1,
        health_check_interval: int = 0,
        **options: Any,
    ) -> None:
        """Connect lazily to the cluster that ``nodes`` (seed addresses) belong to.

        The other arguments are :class:`RedisDriver`'s; ``options`` go to
        ``redis.cluster.RedisCluster`` (``password``, ``ssl``...).
        """
        from redis.cluster import ClusterNode, RedisCluster

        seeds = _addresses(nodes)

        def connect() -> RedisCluster:
            return RedisCluster(
                startup_nodes=[ClusterNode(host, port) for host, port in seeds],  # type: ignore[no-untyped-call]
                socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout,
                max_connections=max_connections or 2**31,
                retry=Retry(NoBackoff(), retries),
                health_check_interval=health_check_interval,
                **options,
            )

        client = _LazyClient(connect)
        with contextlib.suppress(*self._errors):
            client.connect()  # learn the slot map now if the cluster is up
        super().__init__(
            prefix=prefix,
            default_ttl=default_ttl,
            serializer=serializer,
            compress=compress,
            compress_threshold=compress_threshold,
            signing_key=signing_key,
            client=cast(redis.Redis, client),
        )
        self._owns_client = True
        self.url = "redis+cluster://" + ",".join(f"{host}:{port}" for host, port in seeds)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """One GET per key, pipelined per node."""
        return {key: value for key, (value, _) in self.get_many_with_ttl(keys).items()}

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """GET and PTTL per key, pipelined per node (MGET cannot span slots)."""
        given, ks = self._key_batch(keys, distinct=True)
        if not ks:
            return {}
        try:
            with self._client.pipeline(transaction=False) as pipe:
                for k in ks:
                    pipe.get(k)
                    pipe.pttl(k)
                replies = pipe.execute()
        except self._errors as exc:
            self._fail(exc)
        values, pttls = replies[0::2], replies[1::2]
        hits = self._hits(given, ks, values)
        return {key: (value, _seconds_left(pttls[index])) for index, key, value in hits}

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """PEXPIRE, or PERSIST then EXISTS (one key: one node) for "never expires"."""
        return self._touch(key, ttl, transaction=False)

    def set_and_append(self, key: Key, value: Any, ttl: TTL, entry: Mapping[str, Any]) -> None:
        """SET and XADD pipelined (the key and the stream are on different slots).

        Not atomic: a client that dies between the two leaves a write without
        its invalidation, healed by ``l1_ttl``.
        """
        k, ms, data = self._encode_write(key, value, ttl)
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.set(k, data, px=ms or None)
                pipe.xadd(**entry)
                pipe.execute()
        except self._errors as exc:
            self._fail(exc)

    def delete_and_append(self, key: Key, entry: Mapping[str, Any]) -> bool:
        """DEL and XADD pipelined (see :meth:`set_and_append`)."""
        k = self._k(key)
        self._check_open()
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.delete(k)
                pipe.xadd(**entry)
                deleted, _ = pipe.execute()
        except self._errors as exc:
            self._fail(exc)
        return bool(deleted)

    def close(self) -> None:
        """Close every node's connections."""
        if not self._closed:
            cast(_LazyClient, self._client).close()
        self._closed = True

    def __repr__(self) -> str:
        return f"<RedisClusterDriver {_redact(self.url)} prefix={self.prefix!r}>"


class RedisSentinelDriver(RedisDriver):
    """The primary of a Sentinel-managed Redis (redis-py's ``Sentinel``) as a cache.

    Every new connection asks the sentinels for the current primary, so after
    a failover the calls that fail (within about one socket timeout) drop
    their connections and the next ones reach the promoted primary.
    """

    name: ClassVar[str] = "redis-sentinel"

    def __init__(
        self,
        sentinels: str | Sequence[str] = "127.0.0.1:26379",
        service: str = "mymaster",
        *,
        db: int = 0,
        password: str | None = None,
        username: str | None = None,
        sentinel_password: str | None = None,
        prefix: str | bytes = b"",
        default_ttl: TTL = None,
        serializer: str | Serializer = "pickle",
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        max_connections: int | None = None,
        retries: int = 0,
        health_check_interval: int = 0,
        **options: Any,
    ) -> None:
        """Find the primary of ``service`` through ``sentinels`` (``host:port``).

        ``password``/``username`` are the data servers'; ``sentinel_password``
        the sentinels' own.  The other arguments are :class:`RedisDriver`'s.
        """
        from redis.sentinel import Sentinel

        addresses = _addresses(sentinels)
        sentinel_kwargs: dict[str, Any] = {
            "socket_timeout": socket_timeout,
            "socket_connect_timeout": connect_timeout,
        }
        if sentinel_password is not None:
            sentinel_kwargs["password"] = sentinel_password
        self.sentinel = Sentinel(addresses, sentinel_kwargs=sentinel_kwargs)  # type: ignore[no-untyped-call]
        client = self.sentinel.master_for(  # type: ignore[no-untyped-call]
            service,
            db=db,
            password=password,
            username=username,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
            max_connections=max_connections,
            retry=Retry(NoBackoff(), retries),
            health_check_interval=health_check_interval,
            **options,
        )
        super().__init__(
            prefix=prefix,
            default_ttl=default_ttl,
            serializer=serializer,
            compress=compress,
            compress_threshold=compress_threshold,
            signing_key=signing_key,
            client=client,
        )
        self._owns_client = True
        self.service = service
        hosts = ",".join(f"{host}:{port}" for host, port in addresses)
        self.url = f"redis+sentinel://{hosts}/{service}/{db}"

    def close(self) -> None:
        """Close the primary's pool and the connections to the sentinels."""
        if not self._closed:
            for connection in self.sentinel.sentinels:
                with contextlib.suppress(Exception):
                    connection.close()
        super().close()

    def __repr__(self) -> str:
        return f"<RedisSentinelDriver {_redact(self.url)} prefix={self.prefix!r}>"


def _redact(url: str) -> str:
    """Hide a password in a URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"
