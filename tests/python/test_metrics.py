"""Metrics: samples from stats(), the Prometheus collector and text format, OpenTelemetry."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from nearcache import Cache
from nearcache.aio import AsyncCache
from nearcache.drivers import MemoryDriver, RedisDriver, ShmDriver
from nearcache.metrics import PrometheusCollector, format_prometheus, instrument_otel, samples
from nearcache.testing import RedisServer
from nearcache.tiered import TieredCache

prometheus_client = pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402


def parse(text: str) -> dict[tuple[str, str, str], float]:
    """{(sample name, cache, tier): value} of a text exposition (checked by the parser)."""
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, sample.labels["cache"], sample.labels["tier"])] = sample.value
    return out


@pytest.fixture
def cache(tmp_path: Path) -> Any:
    with Cache(path=tmp_path / "m", size="1MiB") as opened:
        yield opened


def test_samples_follow_the_engine_counters(cache: Cache) -> None:
    for i in range(10):
        cache.set(i, "x")
    for i in range(15):
        cache.get(i)
    stats = cache.stats()
    found = {(s.full_name, s.kind): s.value for s in samples({"c": cache})}
    assert found[("nearcache_hits_total", "counter")] == stats["hits"] == 10
    assert found[("nearcache_misses_total", "counter")] == stats["misses"] == 5
    assert found[("nearcache_hit_ratio", "gauge")] == pytest.approx(10 / 15)
    assert found[("nearcache_items", "gauge")] == 10
    assert found[("nearcache_evictions_total", "counter")] == stats["evictions"]
    assert found[("nearcache_resets_total", "counter")] == stats["resets"]
    assert found[("nearcache_capacity_bytes", "gauge")] == stats["capacity_bytes"]
    assert found[("nearcache_max_compaction_bytes", "gauge")] == stats["max_compaction_bytes"]


def test_the_largest_compaction_is_a_gauge(cache: Cache) -> None:
    for i in range(20_000):  # several times the 1 MiB cache: compactions evict
        cache.set(i, b"v" * 150)
    stats = cache.stats()
    assert stats["max_compaction_bytes"] > 0
    found = {(s.full_name, s.kind): s.value for s in samples({"c": cache})}
    assert found[("nearcache_max_compaction_bytes", "gauge")] == stats["max_compaction_bytes"]
    text = format_prometheus(samples({"c": cache}))
    assert "# TYPE nearcache_max_compaction_bytes gauge" in text
    assert "# HELP nearcache_max_compaction_bytes Most arena bytes" in text


def test_text_format_parses_and_escapes(cache: Cache) -> None:
    cache.get("nope")
    text = format_prometheus(samples({'we"ird\\name\n': cache}))
    parsed = parse(text)
    assert parsed[("nearcache_misses_total", 'we"ird\\name\n', "shm")] == 1
    assert parsed[("nearcache_hit_ratio", 'we"ird\\name\n', "shm")] == 0


def test_collector_exports_every_tier(
    cache: Cache, redis_server: RedisServer, unique_prefix: str, tmp_path: Path
) -> None:
    tiered = TieredCache(
        ShmDriver(path=tmp_path / "l1", size="1MiB"),
        RedisDriver(redis_server.url, prefix=unique_prefix),
        invalidation=redis_server.url,
        channel=f"{unique_prefix}ch",
    )
    assert tiered.wait_ready(5)
    tiered.set("a", 1)
    tiered.l1.delete("a")
    assert tiered.get("a") == 1  # L2 hit
    assert tiered.get("a") == 1  # L1 hit
    assert tiered.get("b") is None  # miss
    memory = MemoryDriver()
    memory.get("x")
    registry = prometheus_client.CollectorRegistry()
    collector = PrometheusCollector({"local": cache})
    collector.add("stack", tiered)
    collector.add("mem", memory)
    registry.register(collector)
    parsed = parse(prometheus_client.generate_latest(registry).decode())
    assert parsed[("nearcache_l1_hits_total", "stack", "tiered")] == 1
    assert parsed[("nearcache_l2_hits_total", "stack", "tiered")] == 1
    assert parsed[("nearcache_misses_total", "stack", "tiered")] == 1
    assert parsed[("nearcache_hit_ratio", "stack", "tiered")] == pytest.approx(2 / 3)
    assert parsed[("nearcache_invalidation_connected", "stack", "tiered")] == 1
    assert parsed[("nearcache_invalidations_sent_total", "stack", "tiered")] == 1
    assert ("nearcache_items", "stack", "l1") in parsed
    assert parsed[("nearcache_rejected_total", "stack", "l2")] == 0
    assert parsed[("nearcache_misses_total", "mem", "memory")] == 1
    assert ("nearcache_items", "local", "shm") in parsed
    collector.remove("stack")
    parsed = parse(prometheus_client.generate_latest(registry).decode())
    assert not any(cache_name == "stack" for _, cache_name, _ in parsed)
    tiered.close()


def _dead_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


@pytest.mark.parametrize("breaker", [False, True], ids=["no-breaker", "breaker"])
def test_l2_errors_are_counted(tmp_path: Path, breaker: bool) -> None:
    tiered = TieredCache(
        ShmDriver(path=tmp_path / "l1", size="1MiB"),
        RedisDriver(f"redis://127.0.0.1:{_dead_port()}/0", connect_timeout=0.2),
        invalidation=None,
        on_get_error="ignore",
        circuit_breaker=breaker,
    )
    for _ in range(3):
        assert tiered.get("k") is None
    found = {(s.full_name, s.labels["tier"]): s.value for s in samples({"t": tiered})}
    if breaker:  # the first failure opens it: the next two calls are not made
        assert found[("nearcache_l2_errors_total", "tiered")] == 1
        assert found[("nearcache_breaker_rejected_total", "tiered")] == 2
        assert found[("nearcache_breaker_opened_total", "tiered")] == 1
        assert found[("nearcache_breaker_open", "tiered")] == 1
    else:
        assert found[("nearcache_l2_errors_total", "tiered")] == 3
        assert found.get(("nearcache_breaker_open", "tiered"), 0) == 0
    tiered.close()


def test_async_lock_timeouts_are_exported(tmp_path: Path) -> None:
    acache = AsyncCache(path=tmp_path / "a", size="1MiB")

    async def main() -> None:
        held = acache.lock("busy")
        assert await held.acquire()
        assert not await acache.lock("busy").acquire(timeout=0.01)
        await held.release()

    asyncio.run(main())
    found = {s.full_name: s.value for s in samples({"a": acache})}
    assert found["nearcache_lock_timeouts_total"] == 1
    acache.driver.close()


def test_cli_prints_the_prometheus_format(tmp_path: Path) -> None:
    with Cache(path=tmp_path / "clicache", size="1MiB") as cache:
        cache.set("a", 1)
        cache.get("a")
    out = subprocess.run(
        [sys.executable, "-m", "nearcache", "stats", str(tmp_path / "clicache"), "--prometheus"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    parsed = parse(out)
    assert parsed[("nearcache_hits_total", "clicache", "shm")] == 1
    assert parsed[("nearcache_entries", "clicache", "shm")] == 1
    assert parsed[("nearcache_max_compaction_bytes", "clicache", "shm")] == 0


def test_opentelemetry_instruments(cache: Cache) -> None:
    sdk_metrics = pytest.importorskip("opentelemetry.sdk.metrics")
    export = pytest.importorskip("opentelemetry.sdk.metrics.export")
    reader = export.InMemoryMetricReader()
    provider = sdk_metrics.MeterProvider(metric_readers=[reader])
    cache.set("k", 1)
    cache.get("k")
    cache.get("missing")
    instruments = instrument_otel({"c": cache}, provider)
    assert len(instruments) > 10
    data = reader.get_metrics_data()
    points: dict[str, tuple[dict[str, Any], float]] = {}
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    points[metric.name] = (dict(point.attributes), point.value)
    assert points["nearcache.hits"] == ({"cache": "c", "tier": "shm"}, 1)
    assert points["nearcache.misses"] == ({"cache": "c", "tier": "shm"}, 1)
    assert points["nearcache.hit_ratio"][1] == 0.5
    provider.shutdown()


def test_invalidation_lag_probe(
    redis_server: RedisServer, unique_prefix: str, tmp_path: Path
) -> None:
    from nearcache.metrics import InvalidationLagProbe

    def host(name: str) -> TieredCache:
        return TieredCache(
            ShmDriver(path=tmp_path / f"l1-{name}", size="1MiB"),
            RedisDriver(redis_server.url, prefix=unique_prefix),
            invalidation=redis_server.url,
            channel=f"{unique_prefix}lag",
        )

    tiered, other_host = host("a"), host("b")
    assert tiered.wait_ready(5) and other_host.wait_ready(5)
    probe = InvalidationLagProbe(tiered)
    assert probe.wait_ready(5)
    registry = prometheus_client.CollectorRegistry()
    registry.register(PrometheusCollector({"stack": [tiered, probe]}))
    prometheus_client.generate_latest(registry)  # the first scrape sends a probe
    deadline = time.monotonic() + 5
    while probe.count == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    parsed = parse(prometheus_client.generate_latest(registry).decode())
    assert parsed[("nearcache_invalidation_lag_count_total", "stack", "invalidation")] >= 1
    last = parsed[("nearcache_invalidation_lag_seconds_last", "stack", "invalidation")]
    assert 0 < last < 5
    assert parsed[("nearcache_l1_hits_total", "stack", "tiered")] == 0
    # The other host received the probe like any invalidation (and dropped
    # nothing); its subscriber may hear it a little after the probe's own.
    deadline = time.monotonic() + 5
    while other_host.stats()["invalidations_received"] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert other_host.stats()["invalidations_received"] >= 1
    probe.close()
    tiered.close()
    other_host.close()
    with pytest.raises(TypeError, match="Redis invalidation channel"):
        InvalidationLagProbe(TieredCache(MemoryDriver(), MemoryDriver(), invalidation=None))
