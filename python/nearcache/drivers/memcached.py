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
the current second it was written.  The driver therefore keeps the expiry of
a value itself, to the millisecond: every value except a counter is stored
behind a deadline header (:func:`nearcache.drivers.codec.with_deadline`), the
Unix time in milliseconds from which it is expired (``0``: never).  Every
call that reads an entry checks it, so a value past its deadline is gone at
once (:attr:`MemcachedDriver.ttl_resolution` is a millisecond), as on Redis
and in shared memory:

* ``get``, ``get_many``, ``contains`` and ``pop`` miss it, and
  ``get_with_ttl``/``get_many_with_ttl`` miss it too; on a live value they
  return the seconds left from the header, with no second request;
* ``add`` stores over it (``gets``, then ``cas``: an entry written meanwhile
  is never overwritten), ``replace`` and ``touch`` find no entry,
  ``delete`` reports none (and drops it, unless rewritten meanwhile);
* ``incr``/``decr`` on it create the counter from ``default``.

``touch`` rewrites the header (``gets``, then ``cas``, retried when the entry
changed meanwhile).  ``replace``, ``touch`` and ``delete`` thus read the entry
first and take two requests; ``delete_many`` reads with one request per
server.  memcached still gets an exptime of ``ceil(ttl) + 1``
seconds, so it frees the item's memory a little after the deadline and never
before it.  TTLs over 30 days are sent as absolute Unix times, as the
protocol requires.

Counters (ints in the signed 64-bit range) stay plain decimal digits, which
memcached's ``incr`` needs, so they carry no header and keep memcached's
whole-second resolution: never dropped before their TTL, gone less than two
seconds after it (:attr:`MemcachedDriver.counter_ttl_resolution`); ``touch``
on a counter is memcached's own ``touch``.  Values written by an older
nearcache, without a header, are still read, with memcached's expiry (their
seconds left come from the meta command ``mg``, as for counters).

The deadline is wall-clock time: hosts sharing memcached servers need
synchronized clocks (NTP), as memcached's absolute exptimes already do.  A
host whose clock runs ahead sees values expire early by as much, one whose
clock lags sees them late (until memcached's own expiry drops them).

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
from nearcache.drivers.codec import (
    StoreCodec,
    deadline_of,
    is_counter,
    split_deadline,
    with_deadline,
)
from nearcache.serializers import Compressor, EntryRejected, Serializer, UndecodableEntry

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


def _now_ms() -> int:
    """Wall-clock Unix time in milliseconds (the clock of deadline headers)."""
    return time.time_ns() // 1_000_000


def _expired(data: bytes, now_ms: int) -> bool:
    """Whether stored bytes carry a deadline header that has passed.

    A malformed header is not expired: the entry is there, unreadable (a
    read rejects it).
    """
    deadline = deadline_of(data)
    return deadline is not None and 0 < deadline <= now_ms


def _deadline_left(deadline: int, now_ms: int) -> float | None:
    """Seconds left (``get_with_ttl``) of a live value's deadline header (0: never)."""
    return None if deadline == 0 else max(deadline - now_ms, 1) / 1000


def _seconds_left(remaining: int | None) -> float | None:
    """Seconds left (``get_with_ttl``) from the reply of ``mg <key> t``."""
    if remaining is None:
        return 0.001  # expired between the get and the mg
    return None if remaining < 0 else float(max(remaining, 1))


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
    #: Values keep their own deadline (see the module documentation).
    ttl_resolution: float = 0.001
    #: Counters keep memcached's whole seconds, sent as ``ceil(ttl) + 1``.
    counter_ttl_resolution: float = 2.0
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

    def _expiry(self, ttl: TTL) -> tuple[int, int]:
        """(deadline in Unix ms, memcached exptime) of ``ttl``; ``(0, 0)``: never."""
        ms = ttl_to_ms(ttl, self._default_ttl_ms)
        if not ms:
            return 0, 0
        seconds = math.ceil(ms / 1000) + 1
        if seconds > _RELATIVE_LIMIT:
            return _now_ms() + ms, int(time.time()) + seconds
        return _now_ms() + ms, seconds

    def _encode(self, value: Any, full: bytes, deadline: int) -> bytes:
        """The stored bytes of ``value``: behind a deadline header unless a counter."""
        data = self._codec.encode(value, full)
        if not is_counter(data):
            data = with_deadline(data, deadline)
        if len(data) > self.max_value_size:
            raise ValueTooLargeError(
                f"value of {len(data)} bytes exceeds max_value_size={self.max_value_size}"
            )
        return data

    def _stored(self, key: Key, value: Any, ttl: TTL) -> tuple[bytes, bytes, int]:
        """``(memcached key, stored bytes, exptime)`` of a write of ``value``."""
        mk, full = self._keys(key)
        deadline, exptime = self._expiry(ttl)
        return mk, self._encode(value, full, deadline), exptime

    def _open(self, data: bytes, full: bytes, now_ms: int) -> tuple[Any, int | None]:
        """``(value, deadline)`` of stored bytes, ``(_MISS, None)`` when they are
        past their deadline or rejected.

        The deadline is ``None`` for bytes without a header (a counter, or a
        value written by an older nearcache: memcached keeps their TTL), ``0``
        for a value that never expires.
        """
        try:
            deadline, inner = split_deadline(data)
            if deadline and deadline <= now_ms:
                return _MISS, None
            return self._codec.decode(inner, full), deadline
        except EntryRejected:
            self.rejected += 1
            return _MISS, None

    def _fail(self, exc: Exception) -> NoReturn:
        if isinstance(exc, MemcacheServerError) and "too large" in str(exc):
            raise ValueTooLargeError(f"memcached refused the value: {exc}") from exc
        raise BackendError(f"memcached at {', '.join(self.servers)}: {exc}") from exc

    # -- reads -------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """get (a value past its deadline is a miss)."""
        mk, full = self._keys(key)
        self._check_open()
        try:
            data = self._client(mk).get(mk, default=None)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        if data is None:
            return default
        value = self._open(data, full, _now_ms())[0]
        return default if value is _MISS else value

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """get; the seconds left come from the deadline header.

        A counter or a value without a header asks memcached (the meta
        command ``mg <key> t``, whole seconds).
        """
        mk, full = self._keys(key)
        self._check_open()
        try:
            client = self._client(mk)
            data = client.get(mk, default=None)
            if data is None:
                return default, None
            now = _now_ms()
            value, deadline = self._open(data, full, now)
            if value is _MISS:
                return default, None
            if deadline is not None:
                return value, _deadline_left(deadline, now)
            reply = client.raw_command(b"mg " + mk + b" t")
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return value, _seconds_left(_remaining(reply))

    def _fetch_many(self, keys: Iterable[Key]) -> list[tuple[Any, bytes, bytes, bytes]]:
        """``[(key, memcached key, full key, stored bytes)]`` of the keys
        memcached holds, with one ``get`` per server (decoded by the caller)."""
        wanted: dict[bytes, list[tuple[Any, bytes]]] = {}
        for key in keys:
            mk, full = self._keys(key)
            wanted.setdefault(mk, []).append((key, full))
        self._check_open()
        found: list[tuple[Any, bytes, bytes, bytes]] = []
        try:
            for client, mks in self._by_server(wanted).items():
                for mk, data in client.get_many(mks).items():
                    found.extend((key, mk, full, data) for key, full in wanted[mk])
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return found

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """get with many keys, one request per server."""
        check_key_collection(keys)
        now = _now_ms()
        found: dict[Any, Any] = {}
        for key, _, full, data in self._fetch_many(keys):
            value = self._open(data, full, now)[0]
            if value is not _MISS:
                found[key] = value
        return found

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """get with many keys, one request per server; then ``mg <key> t`` for
        each hit without a deadline header (a counter, an older value)."""
        check_key_collection(keys)
        now = _now_ms()
        found: dict[Any, tuple[Any, float | None]] = {}
        ask: list[tuple[Any, bytes, Any]] = []
        for key, mk, full, data in self._fetch_many(keys):
            value, deadline = self._open(data, full, now)
            if value is _MISS:
                continue
            if deadline is None:
                ask.append((key, mk, value))
            else:
                found[key] = (value, _deadline_left(deadline, now))
        try:
            for key, mk, value in ask:
                reply = self._client(mk).raw_command(b"mg " + mk + b" t")
                found[key] = (value, _seconds_left(_remaining(reply)))
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return found

    # -- writes ------------------------------------------------------------

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """set."""
        mk, data, exptime = self._stored(key, value, ttl)
        self._check_open()
        try:
            self._client(mk).set(mk, data, expire=exptime, noreply=False)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """add; over a value past its deadline, ``gets`` then ``cas``."""
        mk, data, exptime = self._stored(key, value, ttl)
        self._check_open()
        client = self._client(mk)
        try:
            for _ in range(_CAS_ATTEMPTS):
                if client.add(mk, data, expire=exptime, noreply=False):
                    return True
                old, cas = client.gets(mk)
                if cas is None:
                    continue  # gone since the add: add again
                if not _expired(old, _now_ms()):
                    return False
                if client.cas(mk, data, cas, expire=exptime, noreply=False):
                    return True
                # rewritten (False) or gone (None) since the gets: start over
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        raise BackendError(f"add on {key!r} lost {_CAS_ATTEMPTS} races in a row")

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """replace a live entry: ``gets``, then ``cas``."""
        mk, data, exptime = self._stored(key, value, ttl)
        self._check_open()
        client = self._client(mk)
        try:
            for _ in range(_CAS_ATTEMPTS):
                old, cas = client.gets(mk)
                if cas is None or _expired(old, _now_ms()):
                    return False
                stored = client.cas(mk, data, cas, expire=exptime, noreply=False)
                if stored is not False:
                    return bool(stored)  # True: replaced; None: gone since the gets
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        raise BackendError(f"replace on {key!r} lost {_CAS_ATTEMPTS} races in a row")

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """set for every item, pipelined per server."""
        deadline, exptime = self._expiry(ttl)
        items: dict[bytes, bytes] = {}
        for key, value in mapping.items():
            mk, full = self._keys(key)
            items[mk] = self._encode(value, full, deadline)
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

    def _drop(self, client: Any, mk: bytes, data: bytes, cas: bytes) -> bool:
        """Delete the entry ``gets`` returned; whether it was live.

        A value past its deadline is deleted only if nobody rewrote it since
        (meta delete with its CAS token), and counts as no entry.
        """
        if _expired(data, _now_ms()):
            client.raw_command(b"md " + mk + b" C" + cas)
            return False
        return bool(client.delete(mk, noreply=False))

    def delete(self, key: Key) -> bool:
        """gets, then delete (a value past its deadline counts as no entry)."""
        mk, _ = self._keys(key)
        self._check_open()
        try:
            client = self._client(mk)
            data, cas = client.gets(mk)
            return cas is not None and self._drop(client, mk, data, cas)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)

    def delete_many(self, keys: Iterable[Key]) -> int:
        """gets with every distinct key (one request per server), then delete."""
        check_key_collection(keys)
        mks = list(dict.fromkeys(self._keys(key)[0] for key in keys))
        self._check_open()
        count = 0
        try:
            for client, group in self._by_server(mks).items():
                for mk, (data, cas) in client.gets_many(group).items():
                    count += self._drop(client, mk, data, cas)
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        return count

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """Rewrite the deadline header (``gets``, then ``cas``); a counter
        gets memcached's ``touch``."""
        mk, _ = self._keys(key)
        deadline, exptime = self._expiry(ttl)
        self._check_open()
        client = self._client(mk)
        try:
            for _ in range(_CAS_ATTEMPTS):
                data, cas = client.gets(mk)
                if cas is None:
                    return False
                if is_counter(data):
                    return bool(client.touch(mk, expire=exptime, noreply=False))
                try:
                    old, inner = split_deadline(data)
                    if not inner:
                        raise UndecodableEntry("an empty stored value")
                except EntryRejected:
                    self.rejected += 1  # not nearcache's: no entry to touch
                    return False
                if old and old <= _now_ms():
                    return False
                stored = client.cas(
                    mk, with_deadline(inner, deadline), cas, expire=exptime, noreply=False
                )
                if stored is not False:
                    return bool(stored)  # True: touched; None: gone since the gets
        except (MemcacheError, OSError) as exc:
            self._fail(exc)
        raise BackendError(f"touch on {key!r} lost {_CAS_ATTEMPTS} races in a row")

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
        self,
        client: Any,
        mk: bytes,
        key: Key,
        delta: int,
        default: int | None,
        over: bytes | None = None,
    ) -> int | None:
        """Create a missing counter (with ``cas`` over the expired value whose
        CAS token is ``over``); None when someone else wrote the key first."""
        if default is None:
            raise KeyError(key)
        result = default + delta
        if not MIN_INT64 <= result <= MAX_INT64:
            raise CounterOverflowError("counter would leave the signed 64-bit range")
        exptime = self._expiry(None)[1]
        if over is None:
            stored = client.add(mk, b"%d" % result, expire=exptime, noreply=False)
        else:
            stored = client.cas(mk, b"%d" % result, over, expire=exptime, noreply=False)
        return result if stored else None

    def _incr_cas(
        self, client: Any, mk: bytes, full: bytes, key: Key, delta: int, default: int | None
    ) -> int | None:
        """One compare-and-swap attempt; None when the entry changed meanwhile."""
        data, cas = client.gets(mk)
        if cas is None:
            return self._create(client, mk, key, delta, default)
        now = _now_ms()
        if _expired(data, now):
            return self._create(client, mk, key, delta, default, over=cas)
        value = self._open(data, full, now)[0]
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
