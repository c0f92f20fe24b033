"""Sizes and durations as users write them: ``"64MiB"``, ``"1G"``, ``90``, ``"5m"``.

Sizes
=====

:func:`parse_size` accepts a positive ``int`` (bytes) or a string made of a
number (decimals allowed) and an optional unit, case-insensitive, spaces
allowed between them:

==========================  ==========  ===============================
unit                        factor      convention
==========================  ==========  ===============================
(none), ``B``               1           bytes
``K``, ``KiB``              1024        binary (single letters are binary,
``M``, ``MiB``              1024**2     as in ``java -Xmx1G``, ``docker
``G``, ``GiB``              1024**3     -m 1g`` and ``memcached -m``)
``T``, ``TiB``              1024**4
``kB``/``KB``               1000        decimal (SI)
``MB``, ``GB``, ``TB``      1000**n     decimal (SI)
==========================  ==========  ===============================

>>> parse_size("64MiB")
67108864
>>> parse_size("1G") == parse_size("1GiB") == 1024**3
True
>>> parse_size("1GB")
1000000000
>>> parse_size("1.5k")
1536
>>> format_size(64 * 1024 * 1024)
'64 MiB'

Durations and TTLs
==================

:func:`parse_duration` turns a number of seconds (``int``/``float``), a
:class:`datetime.timedelta` or a string such as ``"90"``, ``"1.5s"``,
``"250ms"``, ``"5m"``, ``"2h"``, ``"1d"``, ``"1w"`` or ``"1h30m"`` into
seconds (a ``float``).  Units may be written out, in the singular or
plural, with or without a space: ``ms``/``msec``/``millisecond``,
``s``/``sec``/``second``, ``m``/``min``/``minute``, ``h``/``hr``/``hour``,
``d``/``day``, ``w``/``wk``/``week``; parts may be separated by spaces or
commas (``"1 hour, 30 min"``).

>>> parse_duration("5min") == parse_duration("5 min") == parse_duration("5 minutes") == 300
True
>>> parse_duration("1 hour"), parse_duration("1h30m"), parse_duration("2 days, 3 hrs")
(3600.0, 5400.0, 183600.0)

:func:`ttl_to_ms` is the single place where a user's TTL becomes the
milliseconds the engine stores.  The rule, used by every ``ttl=`` argument
of :class:`nearcache.Cache`:

* ``None``: the cache's default TTL (which itself defaults to "never expires");
* ``0`` (or ``timedelta(0)``, ``"0"``): never expires;
* a positive number of seconds (or a timedelta or a duration string):
  rounded to the nearest millisecond, and never below 1 ms, so a tiny
  positive TTL can never turn into "never expires";
* negative values, NaN, infinities and booleans are rejected with
  :class:`~nearcache.ConfigurationError` (a :class:`ValueError`) /
  :class:`TypeError`.

>>> ttl_to_ms(None) is None
True
>>> ttl_to_ms(0)
0
>>> ttl_to_ms(1.5)
1500
>>> ttl_to_ms(0.0001)
1
>>> from datetime import timedelta
>>> ttl_to_ms(timedelta(minutes=5))
300000
>>> ttl_to_ms("1h30m")
5400000
"""

from __future__ import annotations

import math
import random
import re
import time
from datetime import datetime, timedelta
from typing import Final, TypeAlias

from nearcache.errors import ConfigurationError

__all__ = [
    "MAX_TTL_MS",
    "SIZE_UNITS_HELP",
    "Duration",
    "ExpireAt",
    "Size",
    "expire_at_to_ms",
    "format_size",
    "jittered_ttl",
    "parse_duration",
    "parse_size",
    "ttl_to_ms",
]

#: What a size argument accepts.
Size: TypeAlias = int | str
#: What a TTL/duration argument accepts.
Duration: TypeAlias = int | float | timedelta | str
#: What an ``expire_at`` argument accepts: an aware or naive (local time)
#: datetime, or Unix seconds.
ExpireAt: TypeAlias = datetime | int | float

#: Largest TTL accepted, in milliseconds (about 292 million years): it keeps
#: every expiry time representable as a signed 64-bit Unix millisecond count.
MAX_TTL_MS: Final = 2**63 // 1000

_SIZE_RE: Final = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([kmgtp]?)(i?)(b?)\s*$", re.IGNORECASE)
_EXPONENT: Final = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}

#: One sentence on the two size conventions, for the help and errors of
#: every size option.
SIZE_UNITS_HELP: Final = (
    "single letters and 'KiB'/'MiB'/'GiB' are binary (64M = 64MiB = 67,108,864 bytes); "
    "'kB'/'MB'/'GB' are decimal (64MB = 64,000,000 bytes)"
)

# Every spelling of each duration unit (matched case-insensitively, the
# longest first so "min" is not read as "m" followed by "in").
_DURATION_SPELLINGS: Final = {
    0.001: ("milliseconds", "millisecond", "msecs", "msec", "ms"),
    1.0: ("seconds", "second", "secs", "sec", "s"),
    60.0: ("minutes", "minute", "mins", "min", "m"),
    3600.0: ("hours", "hour", "hrs", "hr", "h"),
    86400.0: ("days", "day", "d"),
    604800.0: ("weeks", "week", "wks", "wk", "w"),
}
_DURATION_UNIT: Final = {
    spelling: factor for factor, spellings in _DURATION_SPELLINGS.items() for spelling in spellings
}
_DURATION_PART_RE: Final = re.compile(
    r"(\d+(?:\.\d*)?|\.\d+)\s*("
    + "|".join(sorted(_DURATION_UNIT, key=len, reverse=True))
    + r")?(?![a-z])[\s,]*",
    re.IGNORECASE,
)


def parse_size(value: Size) -> int:
    """Return the number of bytes ``value`` denotes (see the module docs).

    Raises :class:`TypeError` for other types (``bool`` included) and
    :class:`~nearcache.ConfigurationError` (a :class:`ValueError`) for a
    malformed string or a size that is not positive.

    >>> parse_size(4096)
    4096
    >>> parse_size(" 256 mib ")
    268435456
    >>> parse_size("0")
    Traceback (most recent call last):
    ...
    nearcache.ConfigurationError: size must be positive, got '0'
    """
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"size must be an int or a string like '64MiB', got {value!r}")
    if isinstance(value, int):
        if value <= 0:
            raise ConfigurationError(f"size must be positive, got {value!r}")
        return value
    match = _SIZE_RE.match(value)
    if match is None:
        raise ConfigurationError(
            f"cannot parse size {value!r}: expected a number and an optional unit "
            f"such as 'B', 'KiB', 'MiB', 'GiB', 'K', 'M', 'G', 'kB', 'MB', 'GB' ({SIZE_UNITS_HELP})"
        )
    number, letter, binary, byte = match.groups()
    letter = letter.lower()
    if binary and not letter:
        raise ConfigurationError(
            f"cannot parse size {value!r}: 'i' needs a unit letter, as in 'MiB'"
        )
    exponent = _EXPONENT[letter]
    # "M"/"MiB" are binary; "MB" (a unit letter followed by B without i) is SI.
    base = 1000 if (letter and byte and not binary) else 1024
    size = int(float(number) * base**exponent) if "." in number else int(number) * base**exponent
    if size <= 0:
        raise ConfigurationError(f"size must be positive, got {value!r}")
    return size


def format_size(size: int) -> str:
    """Render a byte count with the largest binary unit that divides it exactly.

    >>> format_size(1536)
    '1536 B'
    >>> format_size(2 * 1024**3)
    '2 GiB'
    """
    for exponent, unit in ((4, "TiB"), (3, "GiB"), (2, "MiB"), (1, "KiB")):
        factor = 1024**exponent
        if size >= factor and size % factor == 0:
            return f"{size // factor} {unit}"
    return f"{size} B"


def parse_duration(value: Duration) -> float:
    """Return the number of seconds ``value`` denotes.

    Accepts ``int``/``float`` seconds, a :class:`~datetime.timedelta`, or a
    string of one or more ``<number><unit>`` parts with units ``ms``, ``s``,
    ``m``, ``h``, ``d``, ``w`` (a bare number is seconds).  Negative,
    non-finite and boolean values are rejected.

    >>> parse_duration("250ms")
    0.25
    >>> parse_duration("1d")
    86400.0
    >>> parse_duration(timedelta(seconds=3, milliseconds=500))
    3.5
    """
    if isinstance(value, bool):
        raise TypeError(f"a duration cannot be a bool, got {value!r}")
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, (int, float)):
        seconds = float(value)
    elif isinstance(value, str):
        seconds = _parse_duration_string(value)
    else:
        raise TypeError(
            "a duration must be seconds (int or float), a datetime.timedelta or a string "
            f"such as '5m', got {type(value).__name__}"
        )
    if math.isnan(seconds) or math.isinf(seconds):
        raise ConfigurationError(
            f"a duration must be finite, got {value!r} (use 0 for 'never expires')"
        )
    if seconds < 0:
        raise ConfigurationError(f"a duration cannot be negative, got {value!r}")
    return seconds


def _parse_duration_string(text: str) -> float:
    stripped = text.strip()
    position = 0
    total = 0.0
    while position < len(stripped):
        match = _DURATION_PART_RE.match(stripped, position)
        if match is None or match.end() == position:
            break
        number, unit = match.groups()
        if unit is None and (position != 0 or match.end() != len(stripped)):
            break  # a bare number (seconds) is only allowed as the whole string
        total += float(number) * (_DURATION_UNIT[unit.lower()] if unit else 1.0)
        position = match.end()
    if not stripped or position != len(stripped):
        raise ConfigurationError(
            f"cannot parse duration {text!r}: expected seconds or parts like "
            "'250ms', '30s', '5m', '5 min', '2h', '1 hour', '1d', '1w'"
        )
    return total


def ttl_to_ms(ttl: Duration | None) -> int | None:
    """Convert a user TTL to engine milliseconds (see the rule in the module docs).

    >>> ttl_to_ms("250ms")
    250
    >>> ttl_to_ms(-1)
    Traceback (most recent call last):
    ...
    nearcache.ConfigurationError: a duration cannot be negative, got -1
    """
    if ttl is None:
        return None
    if type(ttl) is int and 0 <= ttl <= MAX_TTL_MS // 1000:
        return ttl * 1000
    if isinstance(ttl, timedelta):
        exact_us = (ttl.days * 86400 + ttl.seconds) * 1_000_000 + ttl.microseconds
        if exact_us < 0:
            raise ConfigurationError(f"a duration cannot be negative, got {ttl!r}")
        ms = (exact_us + 500) // 1000
        if ms == 0 and exact_us > 0:
            ms = 1
    else:
        seconds = parse_duration(ttl)
        ms = round(seconds * 1000)
        if ms == 0 and seconds > 0:
            ms = 1
    if ms > MAX_TTL_MS:
        raise ConfigurationError(f"TTL too large: {ttl!r}")
    return ms


def expire_at_to_ms(expire_at: ExpireAt, now: float | None = None) -> int:
    """Milliseconds from ``now`` (default: the current time) until ``expire_at``.

    ``expire_at`` is a :class:`~datetime.datetime` (naive ones are local
    time, as :meth:`datetime.timestamp` treats them) or Unix seconds.  The
    result is rounded to the nearest millisecond and may be zero or negative
    when the moment is already past; callers treat that as "already expired".

    >>> expire_at_to_ms(1_000_010.5, now=1_000_000.0)
    10500
    >>> expire_at_to_ms(10.0, now=20.0)
    -10000
    """
    if isinstance(expire_at, bool):
        raise TypeError(f"expire_at cannot be a bool, got {expire_at!r}")
    if isinstance(expire_at, datetime):
        target = expire_at.timestamp()
    elif isinstance(expire_at, (int, float)):
        target = float(expire_at)
    else:
        raise TypeError(
            "expire_at must be a datetime or Unix seconds (int or float), "
            f"got {type(expire_at).__name__}"
        )
    if math.isnan(target) or math.isinf(target):
        raise ValueError(f"expire_at must be finite, got {expire_at!r}")
    if now is None:
        now = time.time()
    ms = round((target - now) * 1000)
    if ms > MAX_TTL_MS:
        raise ValueError(f"expire_at too far in the future: {expire_at!r}")
    return ms


def jittered_ttl(ttl: float, jitter: float) -> float:
    """``ttl`` seconds shortened by a random part of up to ``jitter`` (a
    fraction in ``[0, 1)``), so entries set together expire apart (CHI's
    ``expires_variance``).  ``0`` (never expires) stays ``0``, and the result
    is never longer than ``ttl`` nor shorter than ``ttl * (1 - jitter)``.

    >>> jittered_ttl(0, 0.5), jittered_ttl(60, 0)
    (0, 60)
    >>> all(45 <= jittered_ttl(60, 0.25) <= 60 for _ in range(1000))
    True
    """
    if not 0 <= jitter < 1:
        raise ConfigurationError(f"jitter must be a fraction in [0, 1), got {jitter!r}")
    if not ttl or not jitter:
        return ttl
    return ttl * (1.0 - jitter * random.random())
