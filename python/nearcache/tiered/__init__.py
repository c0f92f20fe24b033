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
Circuit breaker
    After a failure, L2 is not called at all for a back-off period (one
    second, doubling after each failed probe up to ten): L2 calls fail at
    once with :class:`~nearcache.tiered.breaker.CircuitOpenError` and go
    through the policy above (counted as ``l2_skipped``).  Then one caller
    of the host probes L2; its success closes the breaker.  The state is
    kept in the shared L1, so during an outage a host pays about one
    timeout per back-off period, not one per call
    (:mod:`nearcache.tiered.breaker`).

Ordered invalidations (``invalidation="stream"``, the default for Redis
Cluster and Sentinel L2s)
    Every write appends its invalidation to a Redis Stream in the same
    round trip (atomically, in one script, on a single server); the host's
    listener reads the stream in order and records the last applied position
    in the shared L1, so a listener that reconnects or takes over replays
    what it missed and clears L1 only when that history is gone
    (:mod:`nearcache.tiered.stream`).
One listener per host
    With a shared-memory L1, in every invalidation mode (pub/sub, tracking,
    stream), the processes of a host elect one listener per channel with an
    OFD lock beside the L1 file; the others subscribe to nothing (they still
    publish their writes), and the lock moves when its holder dies
    (:mod:`nearcache.tiered.election`).  A new listener that cannot replay
    what was sent meanwhile (pub/sub, tracking, a stream whose history is
    gone) clears the host's L1, counted in ``stats()["takeover_clears"]``.
    The change counter that guards the races above is kept in the shared L1
    (:mod:`nearcache.tiered.shared`).  The listener applies the writes of the
    host's other processes too (it skips only its own messages), dropping
    their fresh L1 copies: one extra L2 read per write, which keeps every
    process's reads coherent.
"""

from __future__ import annotations

from nearcache.tiered.breaker import CircuitBreaker, CircuitOpenError
from nearcache.tiered.cache import ErrorPolicy, TieredCache
from nearcache.tiered.election import ListenerElection
from nearcache.tiered.invalidators import (
    InvalidationListener,
    Invalidator,
    RedisInvalidator,
    decode_message,
    encode_message,
)
from nearcache.tiered.stream import StreamInvalidator
from nearcache.tiered.tracking import TrackingInvalidator

__all__ = [
    "CircuitBreaker",
    "CircuitOpenError",
    "ErrorPolicy",
    "InvalidationListener",
    "Invalidator",
    "ListenerElection",
    "RedisInvalidator",
    "StreamInvalidator",
    "TieredCache",
    "TrackingInvalidator",
    "decode_message",
    "encode_message",
]
