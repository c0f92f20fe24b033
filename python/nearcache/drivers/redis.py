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

from collections.abc import Iterable, Mapping
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
    key_bytes,
    ttl_to_ms,
)
from nearcache.drivers.codec import StoreCodec
from nearcache.serializers import Compressor, EntryRejected, Serializer

__all__ = ["RedisDriver"]

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

_SCAN_BATCH = 1000
_MISS: Any = object()
_GLOB_SPECIAL = frozenset(b"*?[]\\")


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
            kwargs = client.connection_pool.connection_kwargs
            self.url = f"redis://{kwargs.get('host', '?')}:{kwargs.get('port', '?')}"
        self._client: redis.Redis = client
        self._incr = client.register_script(_INCR_SCRIPT)

    @property
    def client(self) -> redis.Redis:
        """The underlying ``redis.Redis`` client."""
        return self._client

    def _k(self, key: Key) -> bytes:
        return self.prefix + key_bytes(key)

    def _fail(self, exc: redis.exceptions.RedisError) -> NoReturn:
        raise BackendError(f"redis at {_redact(self.url)}: {exc}") from exc

    def _decode(self, data: bytes, k: bytes, default: Any) -> Any:
        try:
            return self._codec.decode(data, k)
        except EntryRejected:
            self.rejected += 1
            return default

    # -- reads -------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """GET."""
        k = self._k(key)
        self._check_open()
        try:
            data = cast("bytes | None", self._client.get(k))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        if data is None:
            return default
        return self._decode(data, k, default)

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """GET and PTTL, pipelined in one round trip."""
        k = self._k(key)
        self._check_open()
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.get(k)
                pipe.pttl(k)
                data, pttl = pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        if data is None:
            return default, None
        value = self._decode(data, k, _MISS)
        if value is _MISS:
            return default, None
        return value, (max(pttl, 1) / 1000 if pttl != -1 else None)

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """MGET."""
        given = list(keys)
        ks = [self._k(key) for key in given]
        self._check_open()
        if not ks:
            return {}
        try:
            values = cast("list[bytes | None]", self._client.mget(ks))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        found: dict[Any, Any] = {}
        for key, k, data in zip(given, ks, values, strict=True):
            if data is not None:
                value = self._decode(data, k, _MISS)
                if value is not _MISS:
                    found[key] = value
        return found

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """MGET and one PTTL per key, pipelined in one round trip."""
        given = list(keys)
        ks = [self._k(key) for key in given]
        self._check_open()
        if not ks:
            return {}
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.mget(ks)
                for k in ks:
                    pipe.pttl(k)
                values, *pttls = pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        found: dict[Any, tuple[Any, float | None]] = {}
        for key, k, data, pttl in zip(given, ks, values, pttls, strict=True):
            if data is not None:
                value = self._decode(data, k, _MISS)
                if value is not _MISS:
                    found[key] = (value, max(pttl, 1) / 1000 if pttl != -1 else None)
        return found

    def contains(self, key: Key) -> bool:
        """EXISTS."""
        k = self._k(key)
        self._check_open()
        try:
            return bool(self._client.exists(k))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    # -- writes ------------------------------------------------------------

    def _write(self, key: Key, value: Any, ttl: TTL, *, nx: bool = False, xx: bool = False) -> bool:
        k = self._k(key)
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        data = self._codec.encode(value, k)
        self._check_open()
        try:
            done = self._client.set(k, data, px=ms or None, nx=nx, xx=xx)
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return bool(done)

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
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    def set_and_publish(
        self, key: Key, value: Any, ttl: TTL, channel: bytes, message: bytes
    ) -> None:
        """SET, then PUBLISH ``message`` on ``channel``, pipelined in one round trip.

        A tiered cache whose invalidations travel through this same server
        uses it so that a write costs one round trip, not two.
        """
        k = self._k(key)
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        data = self._codec.encode(value, k)
        self._check_open()
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.set(k, data, px=ms or None)
                pipe.publish(channel, message)
                pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    def delete_and_publish(self, key: Key, channel: bytes, message: bytes) -> bool:
        """DEL, then PUBLISH, pipelined in one round trip (see :meth:`set_and_publish`)."""
        k = self._k(key)
        self._check_open()
        try:
            with self._client.pipeline(transaction=False) as pipe:
                pipe.delete(k)
                pipe.publish(channel, message)
                deleted, _ = pipe.execute()
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return bool(deleted)

    def delete(self, key: Key) -> bool:
        """DEL."""
        k = self._k(key)
        self._check_open()
        try:
            return bool(self._client.delete(k))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    def delete_many(self, keys: Iterable[Key]) -> int:
        """DEL with every key; duplicates count once."""
        ks = list(dict.fromkeys(self._k(key) for key in keys))
        self._check_open()
        if not ks:
            return 0
        try:
            return int(self._client.delete(*ks))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    def pop(self, key: Key, default: Any = None) -> Any:
        """GETDEL (atomic)."""
        k = self._k(key)
        self._check_open()
        try:
            data = cast("bytes | None", self._client.getdel(k))
        except redis.exceptions.RedisError as exc:
            self._fail(exc)
        return default if data is None else self._decode(data, k, default)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """PEXPIRE, or PERSIST plus EXISTS in one transaction for "never expires"."""
        k = self._k(key)
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        self._check_open()
        try:
            if ms:
                return bool(self._client.pexpire(k, ms))
            with self._client.pipeline(transaction=True) as pipe:
                pipe.persist(k)
                pipe.exists(k)
                _, exists = pipe.execute()
            return bool(exists)
        except redis.exceptions.RedisError as exc:
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
        except redis.exceptions.RedisError as exc:
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
        except redis.exceptions.RedisError as exc:
            self._fail(exc)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Disconnect the pool (unless the client was given by the caller)."""
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


def _redact(url: str) -> str:
    """Hide a password in a URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    creds, _, host = rest.rpartition("@")
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user}:***@{host}" if ":" in creds else f"{scheme}://{user}@{host}"
