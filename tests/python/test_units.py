"""Sizes and TTLs as users write them (nearcache.units)."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nearcache.units import (
    MAX_TTL_MS,
    expire_at_to_ms,
    format_size,
    parse_duration,
    parse_size,
    ttl_to_ms,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1", 1),
        ("512B", 512),
        ("1k", 1024),
        ("1K", 1024),
        ("1KiB", 1024),
        ("1kB", 1000),
        ("1KB", 1000),
        ("64MiB", 64 * 1024**2),
        ("64M", 64 * 1024**2),
        ("64mb", 64 * 1000**2),
        ("1G", 1024**3),
        ("1gib", 1024**3),
        ("1GB", 10**9),
        ("2T", 2 * 1024**4),
        ("1.5k", 1536),
        (" 256 MiB ", 256 * 1024**2),
        (".5M", 512 * 1024),
    ],
)
def test_parse_size_units(text: str, expected: int) -> None:
    assert parse_size(text) == expected


def test_parse_size_int_passes_through() -> None:
    assert parse_size(4096) == 4096


@pytest.mark.parametrize("bad", ["", "MiB", "1 X", "1iB", "-1M", "1..2M", "1 2", "0", "0.0001"])
def test_parse_size_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_size(bad)


@pytest.mark.parametrize("bad", [True, 1.5, None, b"1M", [1]])
def test_parse_size_rejects_types(bad: object) -> None:
    with pytest.raises(TypeError):
        parse_size(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [0, -1])
def test_parse_size_rejects_non_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="positive"):
        parse_size(bad)


@given(st.integers(min_value=1, max_value=2**50))
def test_format_size_round_trips(size: int) -> None:
    assert parse_size(format_size(size).replace(" ", "")) == size


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90", 90.0),
        ("1.5", 1.5),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("5m", 300.0),
        ("2h", 7200.0),
        ("1d", 86400.0),
        ("1w", 604800.0),
        ("1h30m", 5400.0),
        ("1h 30m 10s", 5410.0),
        ("0", 0.0),
    ],
)
def test_parse_duration_strings(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "m", "5x", "5m3", "1 2", "-1s", "1.2.3s"])
def test_parse_duration_rejects_malformed(bad: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


@pytest.mark.parametrize("bad", [-1, -0.5, math.nan, math.inf, timedelta(seconds=-1)])
def test_parse_duration_rejects_negative_and_non_finite(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [True, None, b"5", [5]])
def test_parse_duration_rejects_types(bad: object) -> None:
    with pytest.raises(TypeError):
        parse_duration(bad)  # type: ignore[arg-type]


def test_ttl_rule() -> None:
    assert ttl_to_ms(None) is None
    assert ttl_to_ms(0) == 0
    assert ttl_to_ms(0.0) == 0
    assert ttl_to_ms(timedelta(0)) == 0
    assert ttl_to_ms("0") == 0
    assert ttl_to_ms(1) == 1000
    assert ttl_to_ms(1.5) == 1500
    assert ttl_to_ms(0.3) == 300  # no float artefact (0.3 * 1000 = 300.00000000000006)
    assert ttl_to_ms(0.0004) == 1  # a tiny positive TTL never becomes "forever"
    assert ttl_to_ms(timedelta(microseconds=1)) == 1
    assert ttl_to_ms(timedelta(milliseconds=1500)) == 1500
    assert ttl_to_ms(timedelta(days=1)) == 86_400_000
    assert ttl_to_ms("2m") == 120_000


def test_ttl_rejects_bad_values() -> None:
    with pytest.raises(ValueError):
        ttl_to_ms(-1)
    with pytest.raises(ValueError):
        ttl_to_ms(timedelta(milliseconds=-1))
    with pytest.raises(TypeError):
        ttl_to_ms(True)
    with pytest.raises(ValueError, match="too large"):
        ttl_to_ms(MAX_TTL_MS)  # seconds, so a thousand times too large
    with pytest.raises(ValueError):
        ttl_to_ms(math.inf)


@given(st.floats(min_value=0, max_value=10**9, allow_nan=False))
def test_ttl_positive_never_zero(seconds: float) -> None:
    ms = ttl_to_ms(seconds)
    assert ms is not None
    assert (ms == 0) == (seconds == 0)
    assert abs(ms - seconds * 1000) <= max(1.0, seconds * 1e-9 * 1000)


def test_expire_at_numbers_and_datetimes() -> None:
    now = 1_700_000_000.0
    assert expire_at_to_ms(now + 2.5, now=now) == 2500
    assert expire_at_to_ms(now - 1, now=now) == -1000
    aware = datetime.fromtimestamp(now + 60, tz=timezone.utc)
    assert expire_at_to_ms(aware, now=now) == 60_000
    naive_local = datetime.fromtimestamp(now + 30)  # naive datetimes are local time
    assert expire_at_to_ms(naive_local, now=now) == 30_000


def test_expire_at_rejects_bad_values() -> None:
    with pytest.raises(TypeError):
        expire_at_to_ms(True)
    with pytest.raises(TypeError):
        expire_at_to_ms("tomorrow")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        expire_at_to_ms(math.nan)
