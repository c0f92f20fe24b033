"""The driver contract: one pytest suite every driver must pass.

Subclass :class:`DriverContract` in a test module (its name must start with
``Test``) and implement :meth:`DriverContract.make_driver`; pytest then runs
every ``test_*`` method against your driver::

    from nearcache.drivers import RedisDriver
    from nearcache.testing import DriverContract

    class TestMyRedis(DriverContract):
        def make_driver(self, **options):
            return RedisDriver("redis://127.0.0.1:6379/0", prefix=unique(), **options)

``make_driver`` must return a new driver whose storage no other test sees
(a fresh prefix, file or server database), built with the given options;
the suite passes only ``default_ttl``.  Drivers the suite makes are closed
after each test.  A driver that stores nothing (``stores = False``, the
null driver) runs :class:`NullDriverContract` instead.

The suite checks the protocol documented in :mod:`nearcache.drivers.base`:
the same operations, the same TTL behaviour (within the driver's
``ttl_resolution``, and ``counter_ttl_resolution`` for counters) and the
same errors.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

try:
    import pytest
except ImportError:  # nearcache.testing's servers need no pytest; this module does
    raise ImportError(
        "nearcache.testing.contract is a pytest suite: install pytest to use it"
    ) from None

from nearcache.drivers.base import (
    MAX_INT64,
    MIN_INT64,
    CacheClosedError,
    CounterOverflowError,
    Driver,
    InvalidKeyError,
    KeyTypeError,
    NotACounterError,
    SerializationError,
    ValueTooLargeError,
)

__all__ = ["VALUES", "DriverContract", "NullDriverContract"]

#: Values every driver must return with their exact type and content.
VALUES: list[Any] = [
    b"",
    b"bytes \x00\r\n\xff",
    "",
    "text é ✓ \r\n",
    0,
    -1,
    42,
    MAX_INT64,
    MIN_INT64,
    2**64,
    -(2**70),
    1.5,
    -0.25,
    math.inf,
    True,
    False,
    None,
    [1, "two", 3.0],
    {"a": [1, 2], "b": {"c": None}},
    (1, "x", b"y"),
    {1, 2, 3},
    bytearray(b"mutable"),
    b"\x01" * 20_000,
    "long " * 5_000,
]

#: Keys that are awkward for one store or another; all must work and stay distinct.
AWKWARD_KEYS: list[Any] = [
    "plain",
    "with space",
    "new\nline",
    "tab\tand\rcr",
    "nul\x00byte",
    "ключ",
    "#starts-with-hash",
    "x" * 249,
    "y" * 250,
    "z" * 251,
    "w" * 1000,
    b"\xfe\xfd raw",
    7,
    -7,
    10**30,
]

_MISS: Any = object()


class _Factory:
    """Makes drivers through the subclass's hook and closes them afterwards."""

    def __init__(self, make: Callable[..., Driver]) -> None:
        self._make = make
        self.made: list[Driver] = []

    def __call__(self, **options: Any) -> Driver:
        driver = self._make(**options)
        self.made.append(driver)
        return driver

    def close(self) -> None:
        for driver in self.made:
            if not driver.closed:
                driver.close()


class _Base:
    """Fixtures shared by both contracts."""

    def make_driver(self, **options: Any) -> Driver:
        """Return a new driver with isolated storage, built with ``options``."""
        raise NotImplementedError("subclasses of the driver contract implement make_driver")

    @pytest.fixture
    def make(self) -> Iterator[_Factory]:
        """A factory of drivers closed at the end of the test."""
        factory = _Factory(self.make_driver)
        yield factory
        factory.close()

    @pytest.fixture
    def driver(self, make: _Factory) -> Driver:
        """A driver built with no options."""
        return make()

    # -- checks every driver shares, storing or not ------------------------

    def test_rejects_bad_key_types(self, driver: Driver) -> None:
        for key in (1.5, None, ("a",), ["a"], object()):
            with pytest.raises(KeyTypeError):
                driver.get(key)  # type: ignore[arg-type]
            with pytest.raises(TypeError):
                driver.set(key, 1)  # type: ignore[arg-type]

    def test_rejects_a_bare_string_as_a_key_collection(self, driver: Driver) -> None:
        driver.set("a", 1)
        for keys in ("abc", b"abc"):
            for method in (driver.get_many, driver.get_many_with_ttl, driver.delete_many):
                with pytest.raises(KeyTypeError, match="collection of keys"):
                    method(keys)
        assert driver.get("a", "gone") in (1, "gone")  # nothing deleted (a no-store driver: gone)

    def test_rejects_the_empty_key(self, driver: Driver) -> None:
        for key in ("", b""):
            with pytest.raises(InvalidKeyError):
                driver.set(key, 1)
            with pytest.raises(ValueError):
                driver.get(key)

    def test_rejects_bad_ttls(self, driver: Driver) -> None:
        for ttl in (-1, -0.5, math.nan, math.inf, "soon", timedelta(seconds=-1)):
            with pytest.raises(ValueError):
                driver.set("bad-ttl", 1, ttl=ttl)
        with pytest.raises(TypeError):
            driver.set("bad-ttl", 1, ttl=True)
        assert driver.get("bad-ttl", _MISS) is _MISS

    def test_counter_arguments_are_checked(self, driver: Driver) -> None:
        with pytest.raises(TypeError):
            driver.incr("args", 1.5)  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            driver.incr("args", True)
        with pytest.raises(CounterOverflowError):
            driver.incr("args", 2**63)
        assert driver.get("args", _MISS) is _MISS

    def test_closed_driver_raises(self, make: _Factory) -> None:
        driver = make()
        driver.close()
        assert driver.closed
        with pytest.raises(CacheClosedError):
            driver.get("k")
        with pytest.raises(CacheClosedError):
            driver.set("k", 1)
        driver.close()  # closing twice is fine

    def test_context_manager_closes(self, make: _Factory) -> None:
        with make() as driver:
            driver.set("k", 1)
        assert driver.closed


class DriverContract(_Base):
    """The contract of a driver that stores what it is given."""

    # -- basic reads and writes --------------------------------------------

    def test_missing_key_returns_default(self, driver: Driver) -> None:
        assert driver.get("missing") is None
        assert driver.get("missing", "fallback") == "fallback"
        assert driver.get_with_ttl("missing", "d") == ("d", None)
        assert "missing" not in driver

    @pytest.mark.parametrize("index", range(len(VALUES)))
    def test_values_round_trip_with_their_type(self, driver: Driver, index: int) -> None:
        value = VALUES[index]
        driver.set("value", value)
        got = driver.get("value", _MISS)
        assert type(got) is type(value)
        assert got == value
        assert driver.get_many(["value"]) == {"value": value}

    def test_none_is_a_value_not_a_miss(self, driver: Driver) -> None:
        driver.set("none", None)
        assert driver.get("none", "default") is None
        assert "none" in driver

    def test_values_are_stored_by_value(self, driver: Driver) -> None:
        stored = [1, 2]
        driver.set("list", stored)
        stored.append(3)
        got = driver.get("list")
        assert got == [1, 2]
        got.append(4)
        assert driver.get("list") == [1, 2]

    def test_set_overwrites(self, driver: Driver) -> None:
        driver.set("k", "one")
        driver.set("k", 2)
        assert driver.get("k") == 2

    @pytest.mark.parametrize("index", range(len(AWKWARD_KEYS)))
    def test_awkward_keys_work(self, driver: Driver, index: int) -> None:
        key = AWKWARD_KEYS[index]
        driver.set(key, ("value of", index))
        assert driver.get(key) == ("value of", index)
        assert driver.get_many([key]) == {key: ("value of", index)}
        assert driver.delete(key)
        assert driver.get(key, _MISS) is _MISS

    def test_awkward_keys_stay_distinct(self, driver: Driver) -> None:
        driver.set_many({key: i for i, key in enumerate(AWKWARD_KEYS)})
        assert driver.get_many(AWKWARD_KEYS) == {key: i for i, key in enumerate(AWKWARD_KEYS)}

    def test_key_equivalences(self, driver: Driver) -> None:
        driver.set("same", 1)
        assert driver.get(b"same") == 1
        driver.set(1, "int key")
        driver.set("1", "str key")
        assert driver.get(1) == "int key"
        assert driver.get("1") == "str key"
        assert driver.get(True) == "int key"

    def test_serialization_failure_changes_nothing(self, driver: Driver) -> None:
        driver.set("keep", "old")
        with pytest.raises(SerializationError):
            driver.set("keep", lambda: None)
        with pytest.raises(SerializationError):
            driver.set_many({"keep": "new", "other": lambda: None})
        assert driver.get("keep") == "old"
        assert driver.get("other", _MISS) is _MISS

    def test_value_too_large_changes_nothing(self, driver: Driver) -> None:
        limit = driver.max_value_size
        if limit is None or limit > 64 * 1024 * 1024:
            pytest.skip("this driver has no practical value size limit")
        driver.set("big", "small")
        with pytest.raises(ValueTooLargeError):
            driver.set("big", b"x" * (limit + 1))
        assert driver.get("big") == "small"

    # -- conditional writes ------------------------------------------------

    def test_add(self, driver: Driver) -> None:
        assert driver.add("k", "first") is True
        assert driver.add("k", "second") is False
        assert driver.get("k") == "first"

    def test_replace(self, driver: Driver) -> None:
        assert driver.replace("k", "value") is False
        assert driver.get("k", _MISS) is _MISS
        driver.set("k", "old")
        assert driver.replace("k", "new") is True
        assert driver.get("k") == "new"

    def test_get_or_set(self, driver: Driver) -> None:
        calls: list[int] = []

        def factory() -> list[int]:
            calls.append(1)
            return [7]

        assert driver.get_or_set("k", factory) == [7]
        assert driver.get_or_set("k", factory) == [7]
        assert len(calls) == 1

    # -- deletes -----------------------------------------------------------

    def test_delete(self, driver: Driver) -> None:
        driver.set("k", 1)
        assert driver.delete("k") is True
        assert driver.delete("k") is False
        assert driver.get("k", _MISS) is _MISS

    def test_delete_many_counts_live_keys(self, driver: Driver) -> None:
        driver.set_many({"a": 1, "b": 2, "c": 3})
        assert driver.delete_many(["a", "b", "missing", "a"]) == 2
        assert driver.get_many(["a", "b", "c"]) == {"c": 3}
        assert driver.delete_many([]) == 0

    def test_pop(self, driver: Driver) -> None:
        driver.set("k", {"v": 1})
        assert driver.pop("k") == {"v": 1}
        assert driver.pop("k", "gone") == "gone"

    def test_clear(self, driver: Driver) -> None:
        driver.set_many({f"k{i}": i for i in range(50)})
        driver.clear()
        assert driver.get_many([f"k{i}" for i in range(50)]) == {}
        driver.set("after", 1)
        assert driver.get("after") == 1

    # -- many ----------------------------------------------------------------

    def test_get_many_returns_hits_keyed_as_given(self, driver: Driver) -> None:
        driver.set_many({"a": 1, b"b": [2], 3: "three"})
        assert driver.get_many(["a", "b", 3, "missing"]) == {"a": 1, "b": [2], 3: "three"}
        assert driver.get_many([]) == {}

    # -- counters ----------------------------------------------------------

    def test_incr_and_decr(self, driver: Driver) -> None:
        assert driver.incr("n") == 1
        assert driver.incr("n", 10) == 11
        assert driver.decr("n", 20) == -9
        assert driver.incr("n", -1) == -10
        assert driver.decr("n", -15) == 5
        assert driver.get("n") == 5
        assert type(driver.get("n")) is int

    def test_incr_creates_from_default(self, driver: Driver) -> None:
        assert driver.incr("fresh", 5, default=10) == 15
        assert driver.decr("fresh2", 5, default=1) == -4
        assert driver.get_many(["fresh", "fresh2"]) == {"fresh": 15, "fresh2": -4}

    def test_incr_missing_without_default_raises_key_error(self, driver: Driver) -> None:
        with pytest.raises(KeyError):
            driver.incr("nope", default=None)
        with pytest.raises(KeyError):
            driver.decr("nope", default=None)
        assert driver.get("nope", _MISS) is _MISS

    def test_incr_counts_stored_ints(self, driver: Driver) -> None:
        driver.set("n", 41)
        assert driver.incr("n") == 42
        driver.set("neg", -5)
        assert driver.incr("neg", 2) == -3

    @pytest.mark.parametrize(
        "value", ["5", b"5", 5.0, True, None, [5], 2**64], ids=lambda v: type(v).__name__
    )
    def test_incr_on_non_counter_raises(self, driver: Driver, value: Any) -> None:
        driver.set("v", value)
        with pytest.raises(NotACounterError):
            driver.incr("v")
        with pytest.raises(NotACounterError):
            driver.decr("v")
        assert driver.get("v") == value

    def test_incr_overflow_leaves_the_value(self, driver: Driver) -> None:
        driver.set("max", MAX_INT64)
        with pytest.raises(CounterOverflowError):
            driver.incr("max")
        assert driver.get("max") == MAX_INT64
        driver.set("min", MIN_INT64)
        with pytest.raises(CounterOverflowError):
            driver.decr("min")
        assert driver.get("min") == MIN_INT64
        with pytest.raises(CounterOverflowError):
            driver.incr("fresh", 1, default=MAX_INT64)
        assert driver.get("fresh", _MISS) is _MISS

    def test_incr_is_atomic_across_threads(self, driver: Driver) -> None:
        threads, rounds = 4, 40
        driver.set("shared", 0)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for _ in range(rounds):
                    driver.incr("shared", 3)
                    driver.decr("shared", 1)
            except BaseException as exc:  # reported below
                errors.append(exc)

        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
        assert not errors
        assert driver.get("shared") == threads * rounds * 2

    # -- TTL -----------------------------------------------------------------

    def test_touch(self, driver: Driver) -> None:
        assert driver.touch("missing", 10) is False
        driver.set("k", 1)
        assert driver.touch("k", 10) is True
        assert driver.touch("k", 0) is True
        assert driver.get("k") == 1

    def test_ttl_forms_are_accepted(self, driver: Driver) -> None:
        for ttl in (60, 60.5, timedelta(minutes=1), "1m", "250ms", 0, None):
            driver.set("forms", ttl, ttl=ttl)
            assert driver.get("forms") == ttl

    def test_long_ttls_are_kept(self, driver: Driver) -> None:
        # memcached reads exptimes over 30 days as Unix times: drivers must convert.
        driver.set("year", 1, ttl=365 * 86400)
        driver.set("month", 1, ttl=timedelta(days=31))
        assert driver.get_many(["year", "month"]) == {"year": 1, "month": 1}
        value, left = driver.get_with_ttl("year")
        assert value == 1
        assert left is not None and 364 * 86400 < left <= 366 * 86400

    def test_get_with_ttl(self, driver: Driver) -> None:
        driver.set("forever", "f")
        driver.set("hour", "h", ttl=3600)
        assert driver.get_with_ttl("forever") == ("f", None)
        value, left = driver.get_with_ttl("hour")
        assert value == "h"
        assert left is not None and 3600 - 5 < left <= 3600 + driver.ttl_resolution

    def test_get_many_with_ttl(self, driver: Driver) -> None:
        driver.set("forever", "f")
        driver.set("hour", "h", ttl=3600)
        found = driver.get_many_with_ttl(["forever", "hour", "missing"])
        assert set(found) == {"forever", "hour"}
        assert found["forever"] == ("f", None)
        value, left = found["hour"]
        assert value == "h"
        assert left is not None and 3600 - 5 < left <= 3600 + driver.ttl_resolution
        assert driver.get_many_with_ttl([]) == {}

    def test_expiry(self, make: _Factory) -> None:
        """Every way of giving an entry a TTL, checked with a single wait per group.

        Entries must live at least their TTL and be gone within
        ``ttl_resolution`` after it (counters: ``counter_ttl_resolution``),
        for every call that reads or writes them.  An entry's TTL starts
        when its write returns at the latest, so each group's deadline
        counts from its last write: a loaded machine, where the ~15 writes
        take longer than the TTL, makes the test wait longer, never fail.
        """
        driver = make()
        short = 0.3
        defaulted = make(default_ttl=short)
        assert defaulted.default_ttl == pytest.approx(short)
        start = time.monotonic()

        driver.set("set", "v", ttl=short)
        driver.set("set-td", "v", ttl=timedelta(seconds=short))
        driver.set("forever", "v", ttl=0)
        driver.set("default-forever", "v")
        assert driver.add("add", "v", ttl=short)
        driver.set("replace", "old")
        assert driver.replace("replace", "v", ttl=short)
        driver.set_many({"many1": "v", "many2": ["v"], "many3": "v"}, ttl=short)
        driver.set("touched-short", "v")
        assert driver.touch("touched-short", short)
        driver.set("touched-forever", "v", ttl=short)
        assert driver.touch("touched-forever", 0)
        driver.set("counter", 1, ttl=short)
        assert driver.incr("counter") == 2  # keeps the TTL
        driver.set("counter-down", 1, ttl=short)
        assert driver.decr("counter-down", 3) == -2  # so does decr, below zero
        last_write = time.monotonic()

        defaulted.set("d-set", "v")
        defaulted.set("d-forever", "v", ttl=0)
        assert defaulted.incr("d-counter") == 1  # created with the default TTL
        defaulted.set("d-touched", "v", ttl=0)
        assert defaulted.touch("d-touched")  # ttl=None: back to the default
        d_last_write = time.monotonic()

        expiring = [
            "set",
            "set-td",
            "add",
            "replace",
            "many1",
            "many2",
            "many3",
            "touched-short",
        ]
        counters = ["counter", "counter-down"]
        staying = ["forever", "default-forever", "touched-forever"]
        d_expiring = ["d-set", "d-touched"]
        d_counters = ["d-counter"]
        d_staying = ["d-forever"]

        # Nothing has lived its TTL yet while less than it passed since the first write.
        if time.monotonic() - start < short * 0.8:
            every = expiring + counters + staying
            assert set(driver.get_many(every)) == set(every)
            d_every = d_expiring + d_counters + d_staying
            assert set(defaulted.get_many(d_every)) == set(d_every)
        value, left = driver.get_with_ttl("set")
        if value is not None:
            assert left is not None and 0 < left <= short + driver.ttl_resolution

        def wait_until(moment: float) -> None:
            time.sleep(max(0.0, moment - time.monotonic()))

        margin = driver.ttl_resolution + 0.05
        wait_until(last_write + short + margin)
        assert driver.get_many(expiring) == {}
        # An expired entry is no entry, whatever the call.
        assert driver.get("set", _MISS) is _MISS
        assert driver.get_with_ttl("set", "d") == ("d", None)
        assert driver.get_many_with_ttl(["set", "set-td"]) == {}
        assert "set-td" not in driver
        assert driver.touch("set", 10) is False
        assert driver.replace("set-td", "new") is False
        assert driver.delete("many1") is False
        assert driver.delete_many(["many2", "many3"]) == 0
        assert driver.pop("touched-short", "gone") == "gone"
        assert driver.add("set", "again") is True
        assert driver.get("set") == "again"
        assert driver.incr("add", 5) == 5  # a new counter, from the default 0
        assert driver.get_many(["set-td", "many1", "many2"]) == {}
        wait_until(d_last_write + short + defaulted.ttl_resolution + 0.05)
        assert defaulted.get_many(d_expiring) == {}
        wait_until(last_write + short + driver.counter_ttl_resolution + 0.05)
        assert driver.get_many(counters) == {}
        wait_until(d_last_write + short + defaulted.counter_ttl_resolution + 0.05)
        assert defaulted.get_many(d_counters) == {}
        assert set(driver.get_many(staying)) == set(staying)
        assert set(defaulted.get_many(d_staying)) == set(d_staying)

    def test_stats_is_a_dict(self, driver: Driver) -> None:
        driver.set("k", 1)
        stats = driver.stats()
        assert stats["driver"] == driver.name


class NullDriverContract(_Base):
    """The contract of a driver that stores nothing: every entry expires at once."""

    def test_every_read_misses(self, driver: Driver) -> None:
        driver.set("k", 1)
        driver.set_many({"a": 1, "b": 2})
        assert driver.get("k") is None
        assert driver.get("k", "d") == "d"
        assert driver.get_with_ttl("k", "d") == ("d", None)
        assert driver.get_many(["k", "a", "b"]) == {}
        assert "k" not in driver
        assert driver.pop("k", "d") == "d"

    def test_conditional_writes(self, driver: Driver) -> None:
        assert driver.add("k", 1) is True
        assert driver.add("k", 1) is True
        assert driver.replace("k", 1) is False
        assert driver.touch("k", 10) is False
        assert driver.delete("k") is False
        assert driver.delete_many(["k", "j"]) == 0
        driver.clear()

    def test_counters_start_over_every_time(self, driver: Driver) -> None:
        assert driver.incr("n") == 1
        assert driver.incr("n", 5, default=10) == 15
        assert driver.decr("n") == -1
        with pytest.raises(KeyError):
            driver.incr("n", default=None)
        with pytest.raises(CounterOverflowError):
            driver.incr("n", 1, default=MAX_INT64)

    def test_get_or_set_calls_the_factory_every_time(self, driver: Driver) -> None:
        calls: list[int] = []

        def factory() -> str:
            calls.append(1)
            return "v"

        assert driver.get_or_set("k", factory) == "v"
        assert driver.get_or_set("k", factory) == "v"
        assert len(calls) == 2
