"""Deterministic key, value and access-pattern generators for the workloads.

Everything is drawn from a :class:`random.Random` seeded by the caller, so two
runs with the same ``--seed`` feed every backend byte-identical data.
"""

from __future__ import annotations

import bisect
import itertools
import pickle
import random
import uuid
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ZipfSampler",
    "binary_values",
    "complex_values",
    "pickled_size",
    "short_keys",
    "uuid_keys",
]


def uuid_keys(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct 36-character UUID strings (the 2010 study's keys)."""
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < count:
        key = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        if key not in seen:
            seen.add(key)
            out.append(key)
    return out


def short_keys(count: int, prefix: str = "key") -> list[str]:
    """``count`` short keys ``key:0`` .. ``key:N-1`` (the diskcache study's keys)."""
    return [f"{prefix}:{i}" for i in range(count)]


def binary_values(rng: random.Random, count: int, mean_size: int, spread: float) -> list[bytes]:
    """``count`` random byte strings whose sizes average ``mean_size``.

    Sizes are uniform in ``mean_size * [1 - spread, 1 + spread]``; ``spread=0``
    gives every value exactly ``mean_size`` bytes.
    """
    if mean_size < 1:
        raise ValueError("mean_size must be positive")
    lo = max(1, round(mean_size * (1.0 - spread)))
    hi = max(lo, round(mean_size * (1.0 + spread)))
    return [rng.randbytes(rng.randint(lo, hi)) for _ in range(count)]


_WORDS = (
    "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
    "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo",
    "sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu",
)  # fmt: skip


def complex_values(
    rng: random.Random, count: int, mean_keys: int, spread: float = 0.5
) -> list[dict[str, Any]]:
    """``count`` dicts averaging ``mean_keys`` keys (the 2004 study's "complex" data).

    Values mix small ints, floats, short strings and short lists, like a row
    or a small record an application would cache.
    """
    lo = max(1, round(mean_keys * (1.0 - spread)))
    hi = max(lo, round(mean_keys * (1.0 + spread)))
    out: list[dict[str, Any]] = []
    for _ in range(count):
        n = rng.randint(lo, hi)
        item: dict[str, Any] = {}
        for i in range(n):
            kind = i % 4
            value: Any
            if kind == 0:
                value = rng.randint(0, 1_000_000)
            elif kind == 1:
                value = rng.random() * 1000.0
            elif kind == 2:
                value = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
            else:
                value = [rng.randint(0, 100) for _ in range(rng.randint(0, 3))]
            item[f"field_{i}"] = value
        out.append(item)
    return out


def pickled_size(values: Sequence[object]) -> int:
    """Mean size in bytes of ``values`` pickled with the highest protocol."""
    if not values:
        return 0
    total = sum(len(pickle.dumps(v, pickle.HIGHEST_PROTOCOL)) for v in values)
    return round(total / len(values))


class ZipfSampler:
    """Draws ranks ``0..n-1`` with probability proportional to ``1/(rank+1)**s``.

    >>> import random
    >>> z = ZipfSampler(1000, 0.99)
    >>> draws = z.sample(random.Random(1), 10000)
    >>> sum(1 for d in draws if d < 10) > sum(1 for d in draws if d >= 990)
    True
    """

    def __init__(self, n: int, s: float) -> None:
        if n < 1:
            raise ValueError("n must be positive")
        self.n = n
        self.s = s
        weights = [1.0 / (i + 1) ** s for i in range(n)]
        self._cum = list(itertools.accumulate(weights))

    def sample(self, rng: random.Random, count: int) -> list[int]:
        """``count`` ranks drawn independently."""
        cum = self._cum
        total = cum[-1]
        hi = self.n - 1
        rand = rng.random
        find = bisect.bisect_left
        return [min(find(cum, rand() * total), hi) for _ in range(count)]

    def probability(self, rank: int) -> float:
        """Probability of drawing ``rank``."""
        prev = self._cum[rank - 1] if rank else 0.0
        return float((self._cum[rank] - prev) / self._cum[-1])
