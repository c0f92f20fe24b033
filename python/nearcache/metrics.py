"""Metrics: the counters of :meth:`stats` as Prometheus and OpenTelemetry metrics.

One function, :func:`samples`, turns the ``stats()`` of named caches into
metric samples; three exporters present them:

* :class:`PrometheusCollector` (extra ``nearcache[prometheus]``): a
  ``prometheus_client`` collector, read at every scrape;
* :func:`format_prometheus`: the text exposition format with no dependency
  (``nearcache stats NAME --prometheus``, a node-exporter textfile);
* :func:`instrument_otel` (extra ``nearcache[otel]``): observable
  OpenTelemetry instruments on a meter.

Names and labels
================

Every sample carries ``cache`` (the name it was registered under) and
``tier``: the driver's name for a plain cache (``shm``, ``memory``,
``redis``, ``memcached``), and for a :class:`~nearcache.TieredCache`
``tiered`` for its own counters plus ``l1`` and ``l2`` for each tier's.

=====================================  =======  ==============================================
metric                                 type     meaning
=====================================  =======  ==============================================
``nearcache_hits_total``               counter  reads that found a live entry
``nearcache_misses_total``             counter  reads that found nothing
``nearcache_hit_ratio``                gauge    hits / (hits + misses) since the counters began
``nearcache_sets_total``               counter  writes
``nearcache_deletes_total``            counter  deletes
``nearcache_evictions_total``          counter  live entries dropped to make room
``nearcache_expirations_total``        counter  entries dropped because their TTL passed
``nearcache_resets_total``             counter  shards reset after a holder died mid-write
``nearcache_corruptions_total``        counter  corrupt shards detected (and reset)
``nearcache_compactions_total``        counter  shard compactions
``nearcache_items``                    gauge    live entries
``nearcache_live_bytes`` ...           gauge    bytes of live entries (also ``used_bytes``,
                                                ``capacity_bytes``)
``nearcache_lock_timeouts_total``      counter  async lock acquisitions that gave up
``nearcache_max_compaction_bytes``     gauge    most arena bytes one write's compactions read,
                                                in any shard (a maximum: bounded work per write)
``nearcache_l1_hits_total``            counter  tiered: reads served by this host's L1
``nearcache_l2_hits_total``            counter  tiered: L1 misses served by L2
``nearcache_l2_errors_total``          counter  tiered: failed L2 (or channel) operations
``nearcache_invalidations_sent_total`` counter  tiered: invalidation messages published
``nearcache_invalidations_received``   counter  tiered: messages from other hosts applied
``nearcache_resyncs_total``            counter  tiered: (re)subscriptions, each clearing L1
``nearcache_takeover_clears_total``    counter  tiered: listener takeovers that cleared L1
                                                (could not replay; also ``_takeovers_total``)
``nearcache_breaker_open``             gauge    tiered: 1 while the L2 circuit breaker is open
                                                or half-open (L2 calls fail fast)
``nearcache_breaker_rejected_total``   counter  tiered: L2 calls not made, the breaker being
                                                open (also ``_opened_total``, ``_probes_total``)
``nearcache_invalidation_connected``   gauge    tiered: 1 while the channel is subscribed
``nearcache_invalidation_lag_*``       both     :class:`InvalidationLagProbe`: delivery time
                                                of invalidation messages on this host
=====================================  =======  ==============================================

Any other numeric field of a driver's ``stats()`` is exported as a gauge
``nearcache_<field>`` (``nearcache_<field>_total`` for the known counters).
Counters of a shared-memory cache are the file's, shared by every process
that opens it; a tiered cache's own counters are this process's.  The
Grafana queries in ``docs/metrics.md`` aggregate each kind correctly.

>>> from nearcache import Cache
>>> cache = Cache("metrics-demo", size="1MiB")
>>> cache.set("k", 1); _ = cache.get("k"); _ = cache.get("nope")
>>> text = format_prometheus(samples({"demo": cache}))
>>> for line in text.splitlines():
...     if line.startswith("nearcache_hit"):
...         print(line)
nearcache_hits_total{cache="demo",tier="shm"} 1
nearcache_hit_ratio{cache="demo",tier="shm"} 0.5
>>> cache.clear()
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from nearcache.tiered import InvalidationListener

__all__ = [
    "InvalidationLagProbe",
    "PrometheusCollector",
    "Sample",
    "format_prometheus",
    "instrument_otel",
    "samples",
]

PREFIX: Final = "nearcache_"

#: stats() fields that only ever grow (exported as counters, ``_total``).
COUNTERS: Final = frozenset(
    {
        "hits",
        "misses",
        "sets",
        "deletes",
        "evictions",
        "expirations",
        "resets",
        "corruptions",
        "compactions",
        "signature_failures",
        "decode_errors",
        "rejected",
        "lock_timeouts",
        "spill_refused",
        "l1_hits",
        "l2_hits",
        "l2_errors",
        "invalidations_sent",
        "invalidations_received",
        "clears_received",
        "resyncs",
        "takeovers",
        "takeover_clears",
        "l1_rejected",
        "fills_dropped",
        "invalidation_lag_count",
        "invalidation_lag_seconds_sum",
        # the invalidation channel's
        "sent",
        "received",
        "ignored",
        "subscriptions",
        "errors",
    }
)

HELP: Final = {
    "hits": "Reads that found a live entry.",
    "misses": "Reads that found nothing.",
    "hit_ratio": "hits / (hits + misses) since the counters began.",
    "sets": "Writes.",
    "deletes": "Deletes.",
    "evictions": "Live entries dropped to make room.",
    "expirations": "Entries dropped because their TTL passed.",
    "resets": "Shards reset after a process died holding their lock mid-write.",
    "corruptions": "Corrupt shards detected and reset.",
    "compactions": "Shard compactions.",
    "items": "Live entries.",
    "entries": "Live entries.",
    "shards": "Independently locked shards of the cache file.",
    "file_bytes": "Size of the cache file.",
    "live_bytes": "Bytes of live entries.",
    "used_bytes": "Bytes used in the shards (live and dead entries).",
    "capacity_bytes": "Bytes the shards can hold.",
    "held_bytes": "Bytes of memory the cache file holds (reserved as the shards fill).",
    "lock_timeouts": "Lock acquisitions that gave up after their timeout.",
    "spilled_bytes": "Bytes of the values kept in files beside the cache.",
    "spilled_values": "Values kept in files beside the cache.",
    "spill_refused": "Spilled values refused (file missing, changed or not the cache's own).",
    "max_compaction_bytes": "Most arena bytes one write's compactions examined, in any shard.",
    "l1_hits": "Tiered reads served by this host's L1.",
    "l2_hits": "Tiered reads that missed L1 and were served by L2.",
    "l2_errors": "Failed L2 or invalidation-channel operations.",
    "invalidations_sent": "Invalidation messages published.",
    "invalidations_received": "Invalidation messages from other hosts applied.",
    "resyncs": "Invalidation channel (re)subscriptions, each clearing L1.",
    "takeovers": "Times this process became its host's listener after another one.",
    "takeover_clears": "Takeovers of the listener that could not replay and cleared L1.",
    "breaker_open": "1 while the L2 circuit breaker is open or half-open.",
    "breaker_opened": "Times the L2 circuit breaker opened.",
    "breaker_rejected": "L2 calls not made because the circuit breaker was open.",
    "breaker_probes": "Half-open probe calls to L2.",
    "invalidation_connected": "1 while the invalidation channel is subscribed.",
    "invalidation_lag_count": "Lag probes received back.",
    "invalidation_lag_seconds_sum": "Seconds of lag of all the probes received back.",
    "invalidation_lag_seconds_last": "Lag of the last probe received back.",
    "invalidation_lag_seconds_max": "Longest lag of a probe received back.",
    "invalidation_lag_probes_pending": "Probes sent and not (yet) received back.",
}

_SKIP: Final = frozenset({"driver", "l1", "l2", "invalidation", "l1_ttl"})


@dataclass(frozen=True)
class Sample:
    """One metric value: ``name`` without the ``nearcache_`` prefix or ``_total``."""

    name: str
    kind: str  # "counter" or "gauge"
    value: float
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def full_name(self) -> str:
        """The Prometheus name (``nearcache_<name>``, ``_total`` for counters)."""
        return f"{PREFIX}{self.name}_total" if self.kind == "counter" else PREFIX + self.name


def _stats_of(cache: Any) -> dict[str, Any]:
    if isinstance(cache, Mapping):
        return dict(cache)
    return dict(cache.stats())


def _flat(stats: Mapping[str, Any], labels: dict[str, str]) -> Iterator[Sample]:
    for name, value in stats.items():
        if name in _SKIP or isinstance(value, (str, bytes, list, dict)) or value is None:
            continue
        if isinstance(value, bool):
            yield Sample(name, "gauge", float(value), labels)
        elif isinstance(value, (int, float)) and math.isfinite(value):
            kind = "counter" if name in COUNTERS else "gauge"
            yield Sample(name, kind, float(value), labels)
    hits, misses = stats.get("hits"), stats.get("misses")
    if isinstance(hits, int) and isinstance(misses, int):
        yield Sample("hit_ratio", "gauge", hits / (hits + misses) if hits + misses else 0.0, labels)


def _driver_tier(stats: Mapping[str, Any]) -> str:
    driver = stats.get("driver")
    return driver if isinstance(driver, str) else "shm"


def samples(caches: Mapping[str, Any]) -> list[Sample]:
    """Samples of every cache in ``{name: cache}``.

    A cache is anything with ``stats()`` (:class:`~nearcache.Cache`, a
    driver, a :class:`~nearcache.TieredCache`, an
    :class:`~nearcache.aio.AsyncCache`, an :class:`InvalidationLagProbe`),
    a stats dict itself, or a list of those exported under one name.
    """
    out: list[Sample] = []
    for name, given in caches.items():
        for cache in given if isinstance(given, (list, tuple)) else [given]:
            out.extend(_samples_of(name, cache))
    return out


def _samples_of(name: str, cache: Any) -> list[Sample]:
    out: list[Sample] = []
    stats = _stats_of(cache)
    if stats.get("driver") == "tiered":
        labels = {"cache": name, "tier": "tiered"}
        own = {k: v for k, v in stats.items() if k not in ("l1", "l2", "invalidation")}
        out.extend(_flat(own, labels))
        hits = stats.get("l1_hits", 0) + stats.get("l2_hits", 0)
        total = hits + stats.get("misses", 0)
        out.append(Sample("hit_ratio", "gauge", hits / total if total else 0.0, labels))
        channel = stats.get("invalidation")
        if isinstance(channel, Mapping):
            connected = 1.0 if channel.get("connected") else 0.0
            out.append(Sample("invalidation_connected", "gauge", connected, labels))
            for key in ("errors", "subscriptions", "ignored"):
                value = channel.get(key)
                if isinstance(value, int):
                    out.append(Sample(f"invalidation_{key}", "counter", value, labels))
        breaker = stats.get("breaker")
        if isinstance(breaker, Mapping):
            is_open = float(breaker.get("state", "closed") != "closed")
            out.append(Sample("breaker_open", "gauge", is_open, labels))
            for key in ("opened", "rejected", "probes"):
                value = breaker.get(key)
                if isinstance(value, int):
                    out.append(Sample(f"breaker_{key}", "counter", value, labels))
        for tier in ("l1", "l2"):
            tier_stats = stats.get(tier)
            if isinstance(tier_stats, Mapping):
                out.extend(_flat(tier_stats, {"cache": name, "tier": tier}))
    else:
        out.extend(_flat(stats, {"cache": name, "tier": _driver_tier(stats)}))
    return out


# ------------------------------------------------------------ invalidation lag


class _ProbeReceiver(InvalidationListener):
    """Hands the probe's subscription's messages to the probe."""

    def __init__(self, probe: InvalidationLagProbe) -> None:
        self._probe = probe

    def on_invalidate(self, keys: list[bytes]) -> None:
        self._probe._received(keys)


LAG_PROBE_PREFIX: Final = b"nearcache.lagprobe:"


class InvalidationLagProbe:
    """Measures how long a tiered cache's invalidation messages take to arrive.

    The messages carry no send time, so the probe sends its own: each
    :meth:`probe` publishes, through the tiered cache's own invalidator, an
    invalidation of the key ``nearcache.lagprobe:<probe id>:<monotonic ns>``
    (a key no cache holds), and a subscription of the probe's own on the same
    channel measures when it comes back.  Publisher and receiver share this
    host's clock, and the path (PUBLISH, the server's fan-out, a subscriber
    thread reading the socket) is the one every host's cache listens on.
    Each probe costs every subscribed process one tiny message.

    :meth:`stats` (and so the metrics) gives ``invalidation_lag_seconds_last``,
    ``..._max``, and the counters ``invalidation_lag_seconds_sum`` and
    ``invalidation_lag_count`` (their rates' quotient is the mean lag).
    The Prometheus collector calls :meth:`probe` at every scrape when
    ``probe_on_collect`` is true (the default), so a scrape reports the
    lag of the previous scrape's probe.
    """

    def __init__(self, tiered: Any, *, probe_on_collect: bool = True) -> None:
        from nearcache.tiered import RedisInvalidator

        invalidator = tiered.invalidator
        if not isinstance(invalidator, RedisInvalidator):
            raise TypeError("the lag probe needs a tiered cache with a Redis invalidation channel")
        self._publish = invalidator.publish
        self._id = uuid.uuid4().hex.encode()
        self._mine = LAG_PROBE_PREFIX + self._id + b":"
        self.probe_on_collect = probe_on_collect
        self.count = 0
        self.total = 0.0
        self.last: float | None = None
        self.max = 0.0
        self.lost = 0
        self._pending = 0
        self._lock = threading.Lock()
        self._receiver = RedisInvalidator(invalidator.url, invalidator.channel.decode())
        self._receiver.start(_ProbeReceiver(self))

    def wait_ready(self, timeout: float = 5.0) -> bool:
        """Wait until the probe's subscription is up."""
        return self._receiver.wait_connected(timeout)

    def probe(self) -> None:
        """Send one probe message (its lag is recorded when it arrives)."""
        key = self._mine + str(time.monotonic_ns()).encode()
        self._publish([key])
        with self._lock:
            self._pending += 1

    def _received(self, keys: list[bytes]) -> None:
        now = time.monotonic_ns()
        for key in keys:
            if not key.startswith(self._mine):
                continue
            try:
                sent = int(key[len(self._mine) :])
            except ValueError:
                continue
            lag = max(0, now - sent) / 1e9
            with self._lock:
                self.count += 1
                self.total += lag
                self.last = lag
                self.max = max(self.max, lag)
                self._pending = max(0, self._pending - 1)

    def stats(self) -> dict[str, Any]:
        """The lag figures so far (seconds); ``driver`` is ``invalidation``."""
        with self._lock:
            stats: dict[str, Any] = {
                "driver": "invalidation",
                "invalidation_lag_count": self.count,
                "invalidation_lag_seconds_sum": self.total,
                "invalidation_lag_seconds_max": self.max,
                "invalidation_lag_probes_pending": self._pending,
            }
            if self.last is not None:
                stats["invalidation_lag_seconds_last"] = self.last
        return stats

    def close(self) -> None:
        """Stop the probe's subscription."""
        self._receiver.close()


# ------------------------------------------------------------------ text format


def _label_value(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 2**63 else repr(value)


def format_prometheus(items: Iterable[Sample]) -> str:
    """The Prometheus text exposition format (version 0.0.4) of ``items``."""
    by_name: dict[str, list[Sample]] = {}
    for sample in items:
        by_name.setdefault(sample.full_name, []).append(sample)
    lines: list[str] = []
    for full_name, group in by_name.items():
        base = group[0].name
        lines.append(f"# HELP {full_name} {HELP.get(base, f'nearcache stats field {base}.')}")
        lines.append(f"# TYPE {full_name} {group[0].kind}")
        for sample in group:
            labels = ",".join(f'{k}="{_label_value(v)}"' for k, v in sorted(sample.labels.items()))
            lines.append(f"{full_name}{{{labels}}} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------- Prometheus


class PrometheusCollector:
    """A ``prometheus_client`` collector reading the caches' stats at each scrape.

    >>> from prometheus_client import CollectorRegistry, generate_latest
    >>> from nearcache import Cache
    >>> registry = CollectorRegistry()
    >>> collector = PrometheusCollector({"sessions": Cache("prom-demo", size="1MiB")})
    >>> registry.register(collector)
    >>> b'nearcache_items{cache="sessions",tier="shm"} 0.0' in generate_latest(registry)
    True
    """

    def __init__(self, caches: Mapping[str, Any] | None = None) -> None:
        self._caches: dict[str, Any] = dict(caches or {})
        self._lock = threading.Lock()

    def add(self, name: str, cache: Any) -> None:
        """Export ``cache`` under the label ``cache=name`` from now on."""
        with self._lock:
            self._caches[name] = cache

    def remove(self, name: str) -> None:
        """Stop exporting ``name``."""
        with self._lock:
            self._caches.pop(name, None)

    def describe(self) -> list[Any]:
        """Nothing up front: the metric names depend on the caches' drivers."""
        return []

    def collect(self) -> Iterator[Any]:
        """The metric families of every cache, read now."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            caches = dict(self._caches)
        for given in caches.values():
            for item in given if isinstance(given, (list, tuple)) else [given]:
                if isinstance(item, InvalidationLagProbe) and item.probe_on_collect:
                    try:
                        item.probe()
                    except Exception:  # a failed probe must not fail the scrape
                        continue
        families: dict[str, Any] = {}
        for sample in samples(caches):
            family = families.get(sample.full_name)
            if family is None:
                doc = HELP.get(sample.name, f"nearcache stats field {sample.name}.")
                if sample.kind == "counter":
                    family = CounterMetricFamily(
                        PREFIX + sample.name, doc, labels=["cache", "tier"]
                    )
                else:
                    family = GaugeMetricFamily(sample.full_name, doc, labels=["cache", "tier"])
                families[sample.full_name] = family
            family.add_metric([sample.labels["cache"], sample.labels["tier"]], sample.value)
        yield from families.values()


# ---------------------------------------------------------------- OpenTelemetry


class _Snapshot:
    """The samples of one collection, shared by every instrument's callback."""

    def __init__(self, caches: Mapping[str, Any], max_age: float) -> None:
        self.caches = caches
        self.max_age = max_age
        self._taken = -math.inf
        self._by_name: dict[str, list[Sample]] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> list[Sample]:
        with self._lock:
            now = time.monotonic()
            if now - self._taken > self.max_age:
                self._by_name = {}
                for sample in samples(self.caches):
                    self._by_name.setdefault(sample.name, []).append(sample)
                self._taken = now
            return self._by_name.get(name, [])


def instrument_otel(
    caches: Mapping[str, Any], meter_provider: Any = None, *, max_age: float = 0.5
) -> list[Any]:
    """Observable OpenTelemetry instruments (``nearcache.<field>``) for ``caches``.

    Counters become observable counters, the rest observable gauges; each
    observation carries the ``cache`` and ``tier`` attributes.  The caches'
    stats are read once per collection (snapshots younger than ``max_age``
    seconds are reused by the other instruments).  Returns the instruments.
    """
    from opentelemetry import metrics
    from opentelemetry.metrics import CallbackOptions, Observation

    meter = (meter_provider or metrics.get_meter_provider()).get_meter("nearcache")
    snapshot = _Snapshot(caches, max_age)
    kinds = {sample.name: sample.kind for sample in samples(caches)}
    instruments = []
    for name, kind in sorted(kinds.items()):

        def observe(options: CallbackOptions, name: str = name) -> Iterable[Observation]:
            return [Observation(s.value, s.labels) for s in snapshot.get(name)]

        doc = HELP.get(name, f"nearcache stats field {name}.")
        unit = "By" if name.endswith("bytes") else "1"
        if kind == "counter":
            instrument = meter.create_observable_counter(
                f"nearcache.{name}", callbacks=[observe], unit=unit, description=doc
            )
        else:
            instrument = meter.create_observable_gauge(
                f"nearcache.{name}", callbacks=[observe], unit=unit, description=doc
            )
        instruments.append(instrument)
    return instruments
