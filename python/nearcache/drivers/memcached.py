"""memcached through pymemcache.

Servers
-------
One ``"host:port"`` (or ``"/path/to.sock"``), or several: keys are spread
over them by rendezvous hashing.  Each server has a pool of connections
shared by the process's threads.  Every connection has a connect timeout
and a socket timeout (one second by default), so a dead or stopped server
makes a call raise :class:`~nearcache.drivers.base.BackendError` within about
one timeout instead of hanging.

Keys: the hashing rule
----------------------
memcached's text protocol accepts keys of at most 250 bytes without spaces
or control characters.  The driver sends ``prefix + key`` (the key as bytes,
see :func:`~nearcache.drivers.base.key_bytes`) unchanged when

* ``prefix + key`` is at most 250 bytes,
* every byte of the key is printable ASCII (``0x21``-``0x7E``: no space,
  control character, DEL or non-ASCII byte), and
* the key does not start with ``#``;

otherwise it sends ``prefix + "#" + sha256(key).hexdigest()`` (65 bytes
after the prefix).  Keys that start with ``#`` are always hashed, so a
hashed key can never collide with a key sent as it is; two different keys
share a memcached key only if SHA-256 collides.  The prefix itself must be
printable ASCII and at most 185 bytes.

TTL
---
memcached counts time in whole seconds, and an item set with an exptime of
``n`` seconds lives between ``n - 1`` and ``n`` seconds, depending on where in
the current second it was written.  The driver therefore sends
``ceil(ttl) + 1`` seconds: an entry is never dropped before its TTL and is
gone less than two seconds after it (:attr:`MemcachedDriver.ttl_resolution`).
TTLs over 30 days are sent as absolute Unix times, as the protocol requires.

Values and counters
-------------------
Values use :mod:`nearcache.drivers.codec`; integers are plain decimal.
memcached's own counters are unsigned 64-bit (``decr`` stops at 0), so the
driver uses the server's ``incr`` when that is exact (a non-negative delta on
a non-negative counter; a result above 2**63-1 is undone and raises
``OverflowError``) and otherwise a compare-and-swap loop (``gets``/``cas``)
that keeps the entry's remaining TTL (read with the meta command ``mg``,
memcached 1.6+).  Either way the result is the same signed 64-bit arithmetic
as every other driver.

Values larger than :attr:`MemcachedDriver.max_value_size` (1 MiB less 512
bytes of item overhead, memcached's default item size) are refused before
anything is sent: memcached itself would drop the old value on a failed
oversized ``set``.

clear
-----
memcached cannot delete by prefix, so :meth:`MemcachedDriver.clear` runs
``flush_all`` on every server, removing *all* their items (as Django's
memcached backends do).  Give the cache servers of its own if that matters.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NoReturn

from pymemcache.client.base import PooledClient  # type: ignore[import-untyped]
from pymemcache.client.rendezvous import RendezvousHash  # type: ignore[import-untyped]
from pymemcache.exceptions import (  # type: ignore[import-untyped]
    MemcacheClientError,
    MemcacheError,
    MemcacheServerError,
)

from nearcache.drivers.base import (
    MAX_INT64,
    MIN_INT64,
    TTL,
    BackendError,
    CounterOverflowError,
    Driver,
    Key,
    NotACounterError,
    ValueTooLargeError,
    check_counter_args,
    check_key_collection,
    key_bytes,
    ttl_to_ms,
)
from nearcache.drivers.codec import StoreCodec
from nearcache.serializers import Compressor, EntryRejected, Serializer

__all__ = ["MAX_KEY_LENGTH", "MemcachedDriver", "memcached_key"]

MAX_KEY_LENGTH = 250
_MAX_PREFIX = MAX_KEY_LENGTH - 65
_SAFE_BYTES = bytes(range(0x21, 0x7F))
_RELATIVE_LIMIT = 30 * 24 * 3600  # exptimes above this are absolute Unix times
_DEFAULT_MAX_VALUE = 1024 * 1024 - 512
_CAS_ATTEMPTS = 1000
_MISS: Any = object()


def memcached_key(prefix: bytes, key: bytes) -> bytes:
    """Apply the hashing rule (see the module documentation) to ``prefix + key``."""
    if (
        len(prefix) + len(key) <= MAX_KEY_LENGTH
        and not key.translate(None, _SAFE_BYTES)
        and not key.startswith(b"#")
    ):
        return prefix + key
    return prefix + b"#" + hashlib.sha256(key).hexdigest().encode()


def _remaining(reply: bytes) -> int | None:
    """Seconds left from an ``mg <key> t`` reply (-1: never expires), None on a miss."""
    if not reply.startswith(b"HD"):
        return None
    for token in reply.split()[1:]:
        if token.startswith(b"t"):
            return int(token[1:])
    raise MemcacheClientError(f"unexpected meta get reply {reply!r} (memcached 1.6+ needed)")


class _Serde:
    """pymemcache serde: the driver hands over bytes it encoded itself.

    Values are kept as the stored bytes here and decoded by the driver,
    which knows the unhashed key that signatures bind to.  memcached's
    flags word is always 0.
    """

    __slots__ = ()

    def serialize(self, key: bytes, value: bytes) -> tuple[bytes, int]:
        return value, 0

    def deserialize(self, key: bytes, value: bytes, flags: int) -> bytes:
        return value


class MemcachedDriver(Driver):
    """One or more memcached servers as a cache."""

    name: ClassVar[str] = "memcached"
    accepts_encoded_keys: ClassVar[bool] = True
    ttl_resolution: float = 2.0
    max_value_size: int

    def __init__(
        self,
        servers: str | Sequence[str] = "127.0.0.1:11211",
        *,
        prefix: str | bytes = b"",
        default_ttl: TTL = None,
        serializer: str | Serializer = "pickle",
        compress: str | Compressor | None = None,
        compress_threshold: int | str = 1024,
        signing_key: bytes | str | None = None,
        connect_timeout: float = 1.0,
        timeout: float = 1.0,
        max_pool_size: int | None = None,
        max_value_size: int = _DEFAULT_MAX_VALUE,
    ) -> None:
        """Prepare clients for ``servers`` (connections open on first use).

        Args:
            servers: ``"host:port"``, a unix socket path, or a list of them.
            prefix: prepended to every key (printable ASCII, at most 185 bytes).
            default_ttl: TTL used when a call passes ``ttl=None``.
            serializer: for values that are not bytes/str/int/float/bool/None.
            compress: ``"zstd"`` to compress large values (as in ``Cache``).
            compress_threshold: smallest value compressed.
            signing_key: sign every value (HMAC-SHA256, bound to the
                unhashed key) and treat values that do not verify as misses.
            connect_timeout: seconds to wait for a connection.
            timeout: seconds to wait for a reply.
            max_pool_size: connections per server (``None``: unbounded).
            max_value_size: largest serialized value sent; match the
                server's ``-I`` setting less about 512 bytes.
        """
        super().__init__(default_ttl=default_ttl)
        self.prefix = prefix.encode() if isinstance(prefix, str) else bytes(prefix)
        if len(self.prefix) > _MAX_PREFIX or self.prefix.translate(None, _SAFE_BYTES):
            raise ValueError("a memcached prefix is printable ASCII, at most 185 bytes")
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        if not self.servers:
            raise ValueError("at least one memcached server is needed")
        self.max_value_size = max_value_size
        self._codec = StoreCodec(
            serializer,
            compress=compress,
            compress_threshold=compress_threshold,
            signing_key=signing_key,
        )
        self.rejected = 0
        serde = _Serde()
        self._clients: dict[str, Any] = {
            server: PooledClient(
                server,
                serde=serde,
                connect_timeout=connect_timeout,
                timeout=timeout,
                no_delay=True,
                max_pool_size=max_pool_size,
                default_noreply=False,
            )
            for server in self.servers
        }
        self._single = self._clients[self.servers[0]] if len(self.servers) == 1 else None
        self._ring = RendezvousHash(list(self.servers))

    # -- helpers -----------------------------------------------------------

    def _keys(self, key: Key) -> tuple[bytes, bytes]:
        """(memcached key, full key that signatures bind to)."""
        raw = key_bytes(key)
        return memcached_key(self.prefix, raw), self.prefix + raw

    def _client(self, mk: bytes) -> Any:
        if self._single is not None:
            return self._single
        return self._clients[self._ring.get_node(mk)]

    def _by_server(self, mks: Iterable[bytes]) -> dict[Any, list[bytes]]:
        groups: dict[Any, list[bytes]] = {}
        for mk in mks:
            groups.setdefault(self._client(mk), []).append(mk)
        return groups

    def _exptime(self, ttl: TTL) -> int:
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        if not ms:
            return 0
        seconds = math.ceil(ms / 1000) + 1
        if seconds > _RELATIVE_LIMIT:
            return int(time.time()) + seconds
        return seconds

    def _encode(self, value: Any, full: bytes) -> bytes:
        data = self._codec.encode(value, full)
        if len(data) > self.max_value_size:
            raise ValueTooLargeError(
                f"value of {len(data)} bytes exceeds max_value_size={self.max_value_size}"
            )
        return data

    def _decode(self, data: bytes, full: bytes, default: Any) -> Any:
        try:
            return self._codec.decode(data, full)
        except EntryRejected:
            self.rejected += 1
            return default

    def _fail(self, exc: Exception) -> NoReturn:
        if isinstance(exc, MemcacheServerError) and "too large" in str(exc):
            raise ValueTooLargeError(f"memcached refused the value: {exc}") from exc
        raise BackendError(f"memcached at {', '.join(self.servers)}: {exc}") from exc

    # -- reads -------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """get."""
        mk, full = self._keys(key)
        self._check_open()
        try:
            data = self._client(mk).get(mk, default=None)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return default if data is None else self._decode(data, full, default)

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """get, then the meta command ``mg <key> t`` for the seconds left."""
        mk, full = self._keys(key)
        self._check_open()
        try:
            client = self._client(mk)
            data = client.get(mk, default=None)
            if data is None:
                return default, None
            reply = client.raw_command(b"mg " + mk + b" t")
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        value = self._decode(data, full, _MISS)
        if value is _MISS:
            return default, None
        remaining = _remaining(reply)
        if remaining is None:
            return value, 0.001  # expired between the two calls
        return value, (None if remaining < 0 else float(max(remaining, 1)))

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """get with many keys, one request per server."""
        check_key_collection(keys)
        wanted: dict[bytes, list[tuple[Any, bytes]]] = {}
        for key in keys:
            mk, full = self._keys(key)
            wanted.setdefault(mk, []).append((key, full))
        self._check_open()
        found: dict[Any, Any] = {}
        try:
            for client, mks in self._by_server(wanted).items():
                for mk, data in client.get_many(mks).items():
                    for key, full in wanted[mk]:
                        value = self._decode(data, full, _MISS)
                        if value is not _MISS:
                            found[key] = value
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return found

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """get with many keys, then ``mg <key> t`` for each hit."""
        check_key_collection(keys)
        given = list(keys)
        values = self.get_many(given)
        found: dict[Any, tuple[Any, float | None]] = {}
        try:
            for key, value in values.items():
                mk, _ = self._keys(key)
                remaining = _remaining(self._client(mk).raw_command(b"mg " + mk + b" t"))
                if remaining is None:
                    left: float | None = 0.001  # expired meanwhile
                else:
                    left = None if remaining < 0 else float(max(remaining, 1))
                found[key] = (value, left)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return found

    # -- writes ------------------------------------------------------------

    def _store(self, command: str, key: Key, value: Any, ttl: TTL) -> bool:
        mk, full = self._keys(key)
        exptime = self._exptime(ttl)
        data = self._encode(value, full)
        self._check_open()
        try:
            method = getattr(self._client(mk), command)
            return bool(method(mk, data, expire=exptime, noreply=False))
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """set."""
        self._store("set", key, value, ttl)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """add."""
        return self._store("add", key, value, ttl)

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """replace."""
        return self._store("replace", key, value, ttl)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """set for every item, pipelined per server."""
        exptime = self._exptime(ttl)
        items: dict[bytes, bytes] = {}
        for key, value in mapping.items():
            mk, full = self._keys(key)
            items[mk] = self._encode(value, full)
        self._check_open()
        try:
            for client, mks in self._by_server(items).items():
                failed = client.set_many(
                    {mk: items[mk] for mk in mks}, expire=exptime, noreply=False
                )
                if failed:
                    raise BackendError(f"memcached did not store {len(failed)} keys")
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    def delete(self, key: Key) -> bool:
        """delete."""
        mk, _ = self._keys(key)
        self._check_open()
        try:
            return bool(self._client(mk).delete(mk, noreply=False))
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    def delete_many(self, keys: Iterable[Key]) -> int:
        """delete for every distinct key."""
        check_key_collection(keys)
        mks = list(dict.fromkeys(self._keys(key)[0] for key in keys))
        self._check_open()
        count = 0
        try:
            for mk in mks:
                count += bool(self._client(mk).delete(mk, noreply=False))
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return count

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """touch."""
        mk, _ = self._keys(key)
        exptime = self._exptime(ttl)
        self._check_open()
        try:
            return bool(self._client(mk).touch(mk, expire=exptime, noreply=False))
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """Signed 64-bit increment (see the module documentation)."""
        check_counter_args(delta, default)
        mk, full = self._keys(key)
        self._check_open()
        client = self._client(mk)
        try:
            for _ in range(_CAS_ATTEMPTS):
                result: int | None
                if delta >= 0:
                    try:
                        result = client.incr(mk, delta, noreply=False)
                    except MemcacheClientError:
                        result = self._incr_cas(client, mk, full, key, delta, default)
                    else:
                        if result is None:
                            result = self._create(client, mk, key, delta, default)
                        elif result > MAX_INT64:
                            client.decr(mk, delta, noreply=False)
                            raise CounterOverflowError(
                                "counter would leave the signed 64-bit range"
                            )
                else:
                    result = self._incr_cas(client, mk, full, key, delta, default)
                if result is not None:
                    return int(result)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        raise BackendError(f"incr on {key!r} lost {_CAS_ATTEMPTS} races in a row")

    def _create(
        self, client: Any, mk: bytes, key: Key, delta: int, default: int | None
    ) -> int | None:
        """Create a missing counter; None when someone else created it first."""
        if default is None:
            raise KeyError(key)
        result = default + delta
        if not MIN_INT64 <= result <= MAX_INT64:
            raise CounterOverflowError("counter would leave the signed 64-bit range")
        if client.add(mk, b"%d" % result, expire=self._exptime(None), noreply=False):
            return result
        return None

    def _incr_cas(
        self, client: Any, mk: bytes, full: bytes, key: Key, delta: int, default: int | None
    ) -> int | None:
        """One compare-and-swap attempt; None when the entry changed meanwhile."""
        data, cas = client.gets(mk)
        if cas is None:
            return self._create(client, mk, key, delta, default)
        value = self._decode(data, full, _MISS)
        if type(value) is not int or not MIN_INT64 <= value <= MAX_INT64:
            raise NotACounterError(f"the value under {key!r} is not an integer")
        result = value + delta
        if not MIN_INT64 <= result <= MAX_INT64:
            raise CounterOverflowError("counter would leave the signed 64-bit range")
        remaining = _remaining(client.raw_command(b"mg " + mk + b" t"))
        if remaining is None:
            return None  # gone since gets: start over
        exptime = 0 if remaining < 0 else max(remaining, 1)
        if client.cas(mk, b"%d" % result, cas, expire=exptime, noreply=False):
            return result
        return None

    def clear(self) -> None:
        """flush_all on every server (memcached cannot delete by prefix)."""
        self._check_open()
        try:
            for client in self._clients.values():
                client.flush_all(noreply=False)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    # -- lifecycle ---------------------------------------------------------

    def close(self) -> None:
        """Close every pooled connection."""
        if not self._closed:
            for client in self._clients.values():
                client.close()
        super().close()

    def stats(self) -> dict[str, Any]:
        """Servers, prefix, and how many stored values were rejected."""
        return {
            "driver": self.name,
            "servers": list(self.servers),
            "prefix": self.prefix,
            "rejected": self.rejected,
        }

    def __repr__(self) -> str:
        return f"<MemcachedDriver {','.join(self.servers)} prefix={self.prefix!r}>"
