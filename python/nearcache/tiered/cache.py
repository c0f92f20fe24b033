"""The tiered cache: an L1 driver in front of an L2 driver, kept coherent across hosts.

See :mod:`nearcache.tiered` for the read, write, invalidation and failure rules.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Literal, TypeAlias, cast

from nearcache.drivers.base import (
    TTL,
    BackendError,
    Driver,
    EncodedKey,
    Key,
    SerializationError,
    ValueTooLargeError,
    key_bytes,
    ttl_to_ms,
)
from nearcache.keys import check_key_collection, decode_key
from nearcache.tiered.breaker import CircuitBreaker, CircuitOpenError
from nearcache.tiered.election import ListenerElection
from nearcache.tiered.invalidators import (
    _OP_KEYS,
    InvalidationListener,
    Invalidator,
    RedisInvalidator,
    encode_message,
)
from nearcache.tiered.shared import Epoch, Generation, L1Positions, host_origin, shared_path
from nearcache.tiered.stream import StreamInvalidator
from nearcache.tiered.tracking import TrackingInvalidator
from nearcache.units import Duration
from nearcache.units import ttl_to_ms as _duration_ms

__all__ = ["ErrorPolicy", "TieredCache"]

logger = logging.getLogger("nearcache.tiered")

ErrorPolicy: TypeAlias = (
    "Literal['ignore', 'log', 'raise'] | Callable[[BackendError, str, Any], None]"
)
"""What to do when L2 fails: ``"ignore"``, ``"log"``, ``"raise"`` or ``f(error, op, key)``."""

_MISS: Any = object()
_POLICIES = ("ignore", "log", "raise")
_LOG_INTERVAL = 1.0


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

    def on_listening(self) -> None:
        cache = self._target()
        if cache is not None:
            cache._listening()


def _channel_id(invalidator: Invalidator) -> str:
    """A short name for what ``invalidator`` listens to (its server, channel,
    stream or tracked prefix): the election is per host and channel, so caches
    of one L1 file on different channels each have their listener."""
    parts = [type(invalidator).__name__]
    for name in ("url", "channel", "stream", "prefix"):
        value = getattr(invalidator, name, None)
        if isinstance(value, bytes | str):
            parts.append(f"{name}={value!r}")
    return hashlib.blake2b("|".join(parts).encode(), digest_size=6).hexdigest()


def _socket_timeout(client: Any) -> float | None:
    """The socket timeout a redis-py client's connections use, if it can be told."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None) or {}
    timeout = kwargs.get("socket_timeout")
    if timeout is None:  # a cluster client (made lazily: only if it already exists)
        made = vars(client).get("_client")
        nodes = getattr(made, "nodes_manager", None)
        kwargs = getattr(nodes, "connection_kwargs", None) or {}
        timeout = kwargs.get("socket_timeout")
    return float(timeout) if timeout else None


class _GuardedL2:
    """The L2 driver's methods, each behind the circuit breaker."""

    def __init__(self, l2: Driver, breaker: CircuitBreaker) -> None:
        self._l2 = l2
        self._breaker = breaker

    def __getattr__(self, name: str) -> Callable[..., Any]:
        method = getattr(self._l2, name)
        breaker = self._breaker

        def call(*args: Any) -> Any:
            breaker.before_call()
            try:
                result = method(*args)
            except BackendError as exc:
                breaker.failure(exc)
                raise
            except Exception:
                breaker.success()  # L2 answered (a missing counter, a bad value...)
                raise
            breaker.success()
            return result

        call.__name__ = name
        setattr(self, name, call)
        return call


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
        circuit_breaker: CircuitBreaker | Mapping[str, Any] | bool = True,
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
            circuit_breaker: ``True`` (the default) for a
                :class:`~nearcache.tiered.breaker.CircuitBreaker` with its
                default policy, sharing its state through L1 with the other
                processes of the host; a dict of its options (``failures``,
                ``backoff``, ``max_backoff``, ``probe_timeout``); a breaker;
                or ``False`` to call L2 whatever happened before.
        """
        super().__init__(default_ttl=l2.default_ttl)
        for policy in (on_get_error, on_set_error):
            if not callable(policy) and policy not in _POLICIES:
                raise ValueError(f"an error policy is one of {_POLICIES} or a callable")
        self._l1 = l1
        self._l2 = l2
        if isinstance(circuit_breaker, CircuitBreaker):
            self._breaker = circuit_breaker
        elif isinstance(circuit_breaker, Mapping):
            self._breaker = CircuitBreaker(l1, **circuit_breaker)
        else:
            self._breaker = CircuitBreaker(l1, failures=1 if circuit_breaker else 0)
        self._l2c = cast(Driver, _GuardedL2(l2, self._breaker))
        self._l1_get = l1.bound_get()
        # Keys are encoded once, at the door of each operation; a tier whose
        # driver encodes with key_bytes is handed those bytes (EncodedKey).
        self._l2_encoded = l2.accepts_encoded_keys
        self._l1_ttl_ms = (_duration_ms(l1_ttl) or 0) if l1_ttl is not None else 0
        self.on_get_error = on_get_error
        self.on_set_error = on_set_error
        self.ttl_resolution = max(l1.ttl_resolution, l2.ttl_resolution)
        self.max_value_size = l2.max_value_size
        self._generation = Generation(l1)
        self._log_after = 0.0
        self._log_suppressed = 0
        self._lock = threading.Lock()
        self._l1_hits = 0
        self._l2_hits = 0
        self._misses = 0
        self._l2_errors = 0
        self._l2_skipped = 0
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
            and not isinstance(self._invalidator, TrackingInvalidator)
            and self._l2.name == "redis"
            and getattr(self._l2, "url", None) == self._invalidator.url
            and hasattr(self._l2, "set_and_publish")
        )
        self._co_append = isinstance(self._invalidator, StreamInvalidator) and hasattr(
            self._l2, "set_and_append"
        )
        self._election: ListenerElection | None = None
        self._takeovers = 0
        self._takeover_clears = 0
        self._taking_over = False
        invalidator = self._invalidator
        if invalidator is None:
            return
        listener = _Listener(self, invalidator)
        path = shared_path(l1)
        if isinstance(invalidator, StreamInvalidator):
            invalidator.set_positions(L1Positions(l1, invalidator.stream))
        if path is not None:
            # One listener per host and channel, in every invalidation mode:
            # the processes sharing this L1 elect it; the others only publish.
            self._election = ListenerElection(f"{path}.listener-{_channel_id(invalidator)}")
            if isinstance(invalidator, RedisInvalidator):
                invalidator.restart_after_fork = False  # the election decides
            self._election.start(lambda: self._elected(invalidator, listener))
        else:
            invalidator.start(listener)
        if ready_timeout > 0:
            self.wait_ready(ready_timeout)

    def _elected(self, invalidator: Invalidator, listener: InvalidationListener) -> None:
        """This process became the host's listener (on the election thread)."""
        election = self._election
        if election is not None and election.took_over:
            # Another process listened before and is gone: what was sent
            # meanwhile reached no one here, so the first session must replay
            # it (a stream whose history is intact) or clear L1 (see _resync).
            self._takeovers += 1
            self._taking_over = True
        invalidator.start(listener)

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
        redis_family = self._l2.name in ("redis", "redis-cluster", "redis-sentinel")
        if spec == "stream" or (spec == "auto" and self._l2.name != "redis" and redis_family):
            if not redis_family:
                raise ValueError("invalidation='stream' needs a Redis L2 (the stream lives there)")
            client = self._l2.client  # type: ignore[attr-defined]
            timeout = _socket_timeout(client)
            return StreamInvalidator(
                client,
                channel,
                origin=host_origin(self._l1),
                block=min(0.5, timeout / 2) if timeout else 0.5,
            )
        if spec == "tracking":
            url = getattr(self._l2, "url", None) if self._l2.name == "redis" else None
            if url is None:
                raise ValueError("invalidation='tracking' needs a single Redis server as L2")
            return TrackingInvalidator(url, prefix)
        if spec == "auto":
            url = getattr(self._l2, "url", None) if self._l2.name == "redis" else None
            return None if url is None else RedisInvalidator(url, channel)
        if spec.startswith(("redis://", "rediss://", "unix://", "valkey://")):
            return RedisInvalidator(spec.replace("valkey://", "redis://", 1), channel)
        raise ValueError(
            "invalidation must be an Invalidator, a redis:// URL, 'stream', 'tracking', 'auto' "
            "or None, "
            f"not {spec!r}"
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
    def breaker(self) -> CircuitBreaker:
        """The circuit breaker in front of L2."""
        return self._breaker

    @property
    def invalidator(self) -> Invalidator | None:
        """The cross-host invalidation channel, if any."""
        return self._invalidator

    @property
    def counter_ttl_resolution(self) -> float:
        """The coarser of the two tiers' resolutions for counters."""
        return max(self._l1.counter_ttl_resolution, self._l2.counter_ttl_resolution)

    @property
    def l1_ttl(self) -> float | None:
        """The longest an L1 copy lives, in seconds (None: unbounded)."""
        return self._l1_ttl_ms / 1000 if self._l1_ttl_ms else None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def wait_ready(self, timeout: float = 5.0) -> bool:
        """Wait until the host listens for invalidations (True at once without a channel).

        With one listener per host, a process that lost the election is
        ready once another live process holds the listener's lock.
        """
        invalidator = self._invalidator
        if invalidator is None:
            return True
        election = self._election
        if election is None:
            return invalidator.wait_connected(timeout)
        deadline = time.monotonic() + timeout
        while True:
            if election.elected:
                return invalidator.wait_connected(max(0.0, deadline - time.monotonic()))
            if election.held_elsewhere:  # another process (or cache) of the host listens
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    @property
    def is_listener(self) -> bool:
        """Whether this process applies the host's invalidations (always, without election)."""
        if self._invalidator is None:
            return False
        return self._election is None or self._election.elected

    # -- policy and bookkeeping ----------------------------------------------

    def _failed(self, policy: ErrorPolicy, exc: BackendError, operation: str, key: Any) -> None:
        """Apply ``policy`` to an L2 failure; returns unless the policy raises."""
        if isinstance(exc, CircuitOpenError):
            self._l2_skipped += 1
        else:
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

    def _door(self, key: Key) -> tuple[EncodedKey, Key]:
        """Encode ``key``, once for the whole operation: (its bytes, for the
        generation and the invalidations; what L2 is handed, the same bytes
        when its driver takes them)."""
        raw = EncodedKey(key_bytes(key), key)
        return raw, (raw if self._l2_encoded else key)

    def _doors(self, keys: Iterable[Key]) -> tuple[list[EncodedKey], list[Key]]:
        """:meth:`_door` for several keys: (their bytes, what L2 is handed)."""
        given = list(keys)
        raws = [EncodedKey(key_bytes(key), key) for key in given]
        return raws, (list(raws) if self._l2_encoded else given)

    def _bump(self, raws: Iterable[bytes] | None = None) -> None:
        """Move the generation of the keys ``raws`` on (None: of every key)."""
        self._generation.bump(raws)

    def _epoch(self, raw: bytes) -> Epoch:
        return self._generation.current(raw)

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

    def _fill(self, key: Key, raw: bytes, value: Any, left: float | None, epoch: Epoch) -> None:
        """Copy an L2 hit into L1, unless a write or invalidation of the key raced it."""
        bound = self._l1_ttl_ms / 1000
        ttl = bound if left is None else (min(left, bound) if bound else left)
        self._l1_store(key, value, ttl)
        if self._epoch(raw) != epoch:
            self._fills_dropped += 1
            self._l1.delete(key)

    def _publish(self, raws: list[EncodedKey]) -> None:
        invalidator = self._invalidator
        if invalidator is None or getattr(invalidator, "server_side", False):
            return
        raw: list[bytes] = list(raws)
        try:
            invalidator.publish(raw)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "invalidate", raw[0] if len(raw) == 1 else raw)
        else:
            self._invalidations_sent += 1

    def _message(self, raw: bytes) -> tuple[bytes, bytes]:
        """(channel, message) invalidating the key ``raw``, for pipelined writes."""
        invalidator = self._invalidator
        assert isinstance(invalidator, RedisInvalidator)
        return invalidator.channel, encode_message(invalidator.origin, _OP_KEYS, [raw])

    # -- called by the invalidation thread -----------------------------------

    def _invalidate(self, keys: list[bytes]) -> None:
        self._generation.bump(keys)
        # Messages carry stored key bytes (key_bytes); decode them back to
        # the keys they encode, so that int keys and escaped bytes keys match.
        if len(keys) == 1:
            self._l1.delete(decode_key(keys[0]))
        else:
            self._l1.delete_many([decode_key(key) for key in keys])
        # Counted once applied: whoever sees the count grow sees the effect.
        self._invalidations_received += 1

    def _clear_l1(self, *, received: bool = False) -> None:
        self._bump(None)
        self._l1.clear()
        if received:
            self._clears_received += 1

    def _resync(self) -> None:
        self._resyncs += 1
        if self._taking_over:
            self._takeover_clears += 1  # a takeover that could not replay
        self._clear_l1()

    def _listening(self) -> None:
        self._taking_over = False  # the first session after a takeover is up

    # -- reads ---------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> Any:
        """L1, then L2 (filling L1)."""
        value = self._l1_get(key, _MISS)
        if value is not _MISS:
            self._l1_hits += 1
            return value
        return self._get_l2(key, default)

    def _get_l2(self, key: Key, default: Any) -> Any:
        raw, l2_key = self._door(key)
        epoch = self._epoch(raw)
        try:
            value, left = self._l2c.get_with_ttl(l2_key, _MISS)
        except BackendError as exc:
            self._misses += 1
            self._failed(self.on_get_error, exc, "get", key)
            return default
        if value is _MISS:
            self._misses += 1
            return default
        self._l2_hits += 1
        self._fill(key, raw, value, left, epoch)
        return value

    def get_with_ttl(self, key: Key, default: Any = None) -> tuple[Any, float | None]:
        """From L2, which knows the true TTL (and fill L1)."""
        raw, l2_key = self._door(key)
        epoch = self._epoch(raw)
        try:
            value, left = self._l2c.get_with_ttl(l2_key, _MISS)
        except BackendError as exc:
            self._failed(self.on_get_error, exc, "get", key)
            return default, None
        if value is _MISS:
            return default, None
        self._fill(key, raw, value, left, epoch)
        return value, left

    def get_many(self, keys: Iterable[Key]) -> dict[Any, Any]:
        """L1 for all, then one L2 request for the misses."""
        check_key_collection(keys)
        wanted = list(keys)
        found = self._l1.get_many(wanted)
        self._l1_hits += len(found)
        missing = [key for key in wanted if key not in found]
        if not missing:
            return found
        try:
            fetched = self._fetch_many(missing)
        except BackendError as exc:
            self._misses += len(missing)
            self._failed(self.on_get_error, exc, "get_many", missing)
            return found
        self._l2_hits += len(fetched)
        self._misses += len(missing) - len(fetched)
        for key, value in fetched.items():
            found[key] = value[0]
        return found

    def _fetch_many(self, keys: list[Key]) -> dict[Any, tuple[Any, float | None]]:
        """``{key: (value, left)}`` from L2 for ``keys``, each encoded once, filling L1."""
        raws, l2_keys = self._doors(keys)
        by_raw = self._generation.current_many(raws)
        fetched = self._l2c.get_many_with_ttl(l2_keys)
        result: dict[Any, tuple[Any, float | None]] = {}
        for key, raw, l2_key in zip(keys, raws, l2_keys, strict=True):
            hit = fetched.get(l2_key, _MISS)
            if hit is not _MISS:
                result[key] = hit
                self._fill(key, raw, hit[0], hit[1], by_raw[raw])
        return result

    def get_many_with_ttl(self, keys: Iterable[Key]) -> dict[Any, tuple[Any, float | None]]:
        """From L2 in one request (it knows the true TTLs), filling L1."""
        check_key_collection(keys)
        wanted = list(keys)
        if not wanted:
            return {}
        try:
            return self._fetch_many(wanted)
        except BackendError as exc:
            self._failed(self.on_get_error, exc, "get_many", wanted)
            return {}

    def keys(self) -> list[Key]:
        """L2's keys, as L2's driver lists them (L1 holds a subset of them).

        ``memoize``'s ``invalidate_all`` lists keys this way.  A failing L2
        raises whatever ``on_get_error`` says: an empty listing would pass
        for an empty cache.

        Raises:
            BackendError: L2 failed (or its circuit breaker is open).
            NotImplementedError: L2 cannot list its keys (memcached).
        """
        return self._l2c.keys()

    def contains(self, key: Key) -> bool:
        """In L1, or else in L2."""
        if self._l1.contains(key):
            return True
        try:
            return self._l2c.contains(self._door(key)[1])
        except BackendError as exc:
            self._failed(self.on_get_error, exc, "contains", key)
            return False

    # -- writes --------------------------------------------------------------

    def set(self, key: Key, value: Any, ttl: TTL = None) -> None:
        """L2, then this host's L1, then the invalidation."""
        raw, l2_key = self._door(key)
        before = self._epoch(raw) if self._generation.shared else None
        try:
            if self._co_append:
                invalidator = cast(StreamInvalidator, self._invalidator)
                entry = invalidator.xadd_args(invalidator.message([raw]))
                self._l2c.set_and_append(l2_key, value, ttl, entry)  # type: ignore[attr-defined]
                self._invalidations_sent += 1
            elif self._co_publish:
                channel, message = self._message(raw)
                self._l2c.set_and_publish(l2_key, value, ttl, channel, message)  # type: ignore[attr-defined]
                self._invalidations_sent += 1
            else:
                self._l2c.set(l2_key, value, ttl)
        except BackendError as exc:
            self._write_failed(exc, "set", key, [raw])
            self._bump([raw])
            self._l1_store(key, value, self._l1_ttl_for(ttl))
            return
        self._bump([raw])
        self._l1_store(key, value, self._l1_ttl_for(ttl))
        if before is not None and self._epoch(raw) != Generation.after_own_bump(before):
            # Another process changed this key (or one of its stripe)
            # meanwhile, maybe from another host through the listener: do
            # not keep a copy that might be older than L2.
            self._fills_dropped += 1
            self._l1.delete(key)
        if not (self._co_publish or self._co_append):
            self._publish([raw])

    def _write_failed(
        self, exc: BackendError, operation: str, key: Any, raws: list[EncodedKey]
    ) -> None:
        if self.on_set_error == "raise":
            self._bump(raws)
            if isinstance(key, list):
                self._l1.delete_many(key)
            else:
                self._l1.delete(key)
        self._failed(self.on_set_error, exc, operation, key)

    def set_many(self, mapping: Mapping[Key, Any], ttl: TTL = None) -> None:
        """L2, then L1, then one invalidation for every key."""
        check_key_collection(mapping)
        items = dict(mapping)
        if not items:
            return
        raws, l2_keys = self._doors(items)
        l1_ttl = self._l1_ttl_for(ttl)
        try:
            self._l2c.set_many(dict(zip(l2_keys, items.values(), strict=True)), ttl)
        except BackendError as exc:
            self._write_failed(exc, "set_many", list(items), raws)
            self._bump(raws)
            self._l1_set_many(items, l1_ttl)
            return
        self._bump(raws)
        self._l1_set_many(items, l1_ttl)
        self._publish(raws)

    def _l1_set_many(self, items: dict[Key, Any], l1_ttl: float) -> None:
        try:
            self._l1.set_many(items, l1_ttl)
        except (ValueTooLargeError, SerializationError):
            for key, value in items.items():
                self._l1_store(key, value, l1_ttl)

    def _l2_write(self, operation: str, key: Key, *args: Any) -> tuple[Any, EncodedKey]:
        """(L2's answer to ``operation`` on ``key``, or None if L2 failed and
        the write policy let it pass; the key's bytes)."""
        raw, l2_key = self._door(key)
        try:
            return getattr(self._l2c, operation)(l2_key, *args), raw
        except BackendError as exc:
            self._write_failed(exc, operation, key, [raw])
            return None, raw

    def add(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """L2 add; on success, L1 and the invalidation."""
        added, raw = self._l2_write("add", key, value, ttl)
        if added:
            self._bump([raw])
            self._l1_store(key, value, self._l1_ttl_for(ttl))
            self._publish([raw])
        return bool(added)

    def replace(self, key: Key, value: Any, ttl: TTL = None) -> bool:
        """L2 replace; on success, L1 and the invalidation."""
        replaced, raw = self._l2_write("replace", key, value, ttl)
        if replaced is None:
            return False
        self._bump([raw])
        if replaced:
            self._l1_store(key, value, self._l1_ttl_for(ttl))
            self._publish([raw])
        else:
            self._l1.delete(key)
        return bool(replaced)

    def touch(self, key: Key, ttl: TTL = None) -> bool:
        """L2 touch, then the L1 copy's TTL (bounded by ``l1_ttl``)."""
        touched, raw = self._l2_write("touch", key, ttl)
        if touched is None:
            return False
        if touched:
            self._l1.touch(key, self._l1_ttl_for(ttl))
            self._publish([raw])  # a shorter TTL must not be outlived elsewhere
        else:
            self._bump([raw])
            self._l1.delete(key)
        return bool(touched)

    def incr(self, key: Key, delta: int = 1, default: int | None = 0) -> int:
        """L2 incr; the L1 copy is dropped (and other hosts told)."""
        raw, l2_key = self._door(key)
        try:
            result = self._l2c.incr(l2_key, delta, default)
        except BackendError as exc:
            self._write_failed(exc, "incr", key, [raw])
            raise
        except KeyError:
            raise KeyError(key) from None  # the caller's key, not its bytes
        self._bump([raw])
        self._l1.delete(key)
        self._publish([raw])
        return result

    def delete(self, key: Key) -> bool:
        """L2, this host's L1, and the invalidation.

        L1 drops the key before and after the L2 call: a read of this host
        that fetched the old value while the delete was in flight cannot
        leave it behind.
        """
        raw, l2_key = self._door(key)
        self._bump([raw])
        self._l1.delete(key)
        try:
            return self._delete_l2(key, raw, l2_key)
        finally:
            self._bump([raw])
            self._l1.delete(key)

    def _delete_l2(self, key: Key, raw: EncodedKey, l2_key: Key) -> bool:
        try:
            if self._co_append:
                invalidator = cast(StreamInvalidator, self._invalidator)
                entry = invalidator.xadd_args(invalidator.message([raw]))
                deleted: bool = self._l2c.delete_and_append(l2_key, entry)  # type: ignore[attr-defined]
                self._invalidations_sent += 1
                return deleted
            if self._co_publish:
                channel, message = self._message(raw)
                deleted = self._l2c.delete_and_publish(l2_key, channel, message)  # type: ignore[attr-defined]
                self._invalidations_sent += 1
                return deleted
            deleted = self._l2c.delete(l2_key)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "delete", key)
            return False
        self._publish([raw])
        return deleted

    def delete_many(self, keys: Iterable[Key]) -> int:
        """L2, this host's L1, and one invalidation."""
        check_key_collection(keys)
        wanted = list(keys)
        if not wanted:
            return 0
        raws, l2_keys = self._doors(wanted)
        self._bump(raws)
        self._l1.delete_many(wanted)
        try:
            count = self._l2c.delete_many(l2_keys)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "delete_many", wanted)
            return 0
        finally:
            self._bump(raws)  # again: see delete
            self._l1.delete_many(wanted)
        self._publish(raws)
        return count

    def pop(self, key: Key, default: Any = None) -> Any:
        """L2 pop (atomic where L2 is); L1 and other hosts drop the key."""
        raw, l2_key = self._door(key)
        self._bump([raw])
        self._l1.delete(key)
        try:
            value = self._l2c.pop(l2_key, _MISS)
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "pop", key)
            return default
        finally:
            self._bump([raw])  # again: see delete
            self._l1.delete(key)
        if value is _MISS:
            return default
        self._publish([raw])
        return value

    def clear(self) -> None:
        """L2 (see its driver for the scope), this host's L1, and every other host's L1."""
        self._clear_l1()
        try:
            self._l2c.clear()
        except BackendError as exc:
            self._failed(self.on_set_error, exc, "clear", None)
            return
        finally:
            self._clear_l1()  # again: see delete
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
        if self._election is not None:
            self._election.close()  # another process of the host takes over
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
            "l2_skipped": self._l2_skipped,
            "invalidations_sent": self._invalidations_sent,
            "invalidations_received": self._invalidations_received,
            "clears_received": self._clears_received,
            "resyncs": self._resyncs,
            "takeovers": self._takeovers,
            "takeover_clears": self._takeover_clears,
            "l1_rejected": self._l1_rejected,
            "fills_dropped": self._fills_dropped,
            "l1_ttl": self.l1_ttl,
            "l1": self._l1.stats(),
            "l2": self._l2.stats(),
            "breaker": self._breaker.stats(),
            "listener": self.is_listener,
        }
        if self._invalidator is not None:
            stats["invalidation"] = self._invalidator.stats()
        return stats

    def __repr__(self) -> str:
        return f"<TieredCache l1={self._l1!r} l2={self._l2!r}>"
