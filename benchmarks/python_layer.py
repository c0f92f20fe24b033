"""What the Python layer (nearcache.Cache) costs over the raw native calls.

Measures the median time per call, in nanoseconds, of the engine's methods
(``NativeCache.get``/``get_typed``/``set``/``set_typed``) and of
``Cache.get``/``Cache.set`` for a 160-byte bytes value, a short str and a
small int, with a 36-character key (a UUID, as in the seed benchmarks).

Each measurement is ``--rounds`` rounds of ``--number`` calls (unrolled ten
per loop iteration so the loop itself costs little); the rounds of all the
variants are interleaved, so machine-load drift hits them alike, and the
median round is reported.  Run it on a quiet machine::

    python benchmarks/python_layer.py            # prints a Markdown table
    python benchmarks/python_layer.py --json     # machine-readable
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import nearcache
from nearcache import Cache

UNROLL = 10


def _timer(call: Callable[..., Any], args: tuple[Any, ...], number: int) -> Callable[[], float]:
    """A function returning ns per call for one round of ``number`` calls."""
    names = ", ".join(f"a{i}" for i in range(len(args)))
    body = f"f({names})"
    source = (
        f"def run(f, {names}, loops):\n"
        f"    clock = __clock\n"
        f"    start = clock()\n"
        f"    for _ in range(loops):\n"
        + "".join(f"        {body}\n" for _ in range(UNROLL))
        + "    return clock() - start\n"
    )
    namespace: dict[str, Any] = {"__clock": time.perf_counter_ns}
    exec(source, namespace)
    run = namespace["run"]
    loops = max(1, number // UNROLL)

    def one_round() -> float:
        elapsed: int = run(call, *args, loops)
        return elapsed / (loops * UNROLL)

    return one_round


def measure(
    variants: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]], number: int, rounds: int
) -> dict[str, dict[str, float]]:
    """Median and minimum ns/call of every variant, rounds interleaved."""
    timers = {name: _timer(call, args, number) for name, (call, args) in variants.items()}
    samples: dict[str, list[float]] = {name: [] for name in variants}
    for timer in timers.values():
        timer()  # warm-up
    for _ in range(rounds):
        for name, timer in timers.items():
            samples[name].append(timer())
    return {
        name: {"median": statistics.median(values), "min": min(values)}
        for name, values in samples.items()
    }


def run(number: int, rounds: int) -> dict[str, Any]:
    directory = tempfile.mkdtemp(prefix="nearcache-bench-", dir="/dev/shm")
    cache = Cache(path=os.path.join(directory, "bench"), size="64MiB")
    native = cache.native
    key_bytes, key_str, key_int = (str(uuid.uuid4()) for _ in range(3))
    assert len(key_bytes) == 36
    values: dict[str, tuple[str, Any]] = {
        "bytes (160 B)": (key_bytes, os.urandom(160)),
        "str (11 chars)": (key_str, "hello world"),
        "int": (key_int, 1234567),
    }
    for key, value in values.values():
        cache.set(key, value)

    results: dict[str, Any] = {"get": {}, "set": {}}
    for label, (key, value) in values.items():
        gets = measure(
            {
                "native get": (native.get, (key,)),
                "native get_typed": (native.get_typed, (key,)),
                "Cache.get": (cache.get, (key,)),
            },
            number,
            rounds,
        )
        assert cache.get(key) == value
        raw = value if isinstance(value, bytes) else native.get(key)
        sets = measure(
            {
                "native set": (native.set, (key, raw)),
                "native set_typed": (native.set_typed, (key, value)),
                "Cache.set": (cache.set, (key, value)),
            },
            number,
            rounds,
        )
        cache.set(key, value)
        results["get"][label] = gets
        results["set"][label] = sets

    cache.close()
    for name in os.listdir(directory):
        os.unlink(os.path.join(directory, name))
    os.rmdir(directory)
    results["machine"] = {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "nearcache": nearcache.__version__,
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "cpus": os.cpu_count(),
        "number": number,
        "rounds": rounds,
    }
    return results


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def markdown(results: dict[str, Any], statistic: str = "median") -> str:
    lines = [
        f"{statistic} of the rounds, ns per call:",
        "",
        "| operation | value | native (ns) | native typed (ns) | Cache (ns) "
        "| Cache / native | Cache / native typed |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for op in ("get", "set"):
        for label, row in results[op].items():
            base = row[f"native {op}"][statistic]
            typed = row[f"native {op}_typed"][statistic]
            ours = row[f"Cache.{op}"][statistic]
            lines.append(
                f"| {op} | {label} | {base:.0f} | {typed:.0f} | {ours:.0f} "
                f"| {ours / base:.2f}x | {ours / typed:.2f}x |"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--number", type=int, default=200_000, help="calls per round")
    parser.add_argument("--rounds", type=int, default=15, help="rounds per variant")
    parser.add_argument("--json", action="store_true", help="print JSON instead of Markdown")
    args = parser.parse_args()
    results = run(args.number, args.rounds)
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(markdown(results, "median"))
        print()
        print(markdown(results, "min"))
        machine = results["machine"]
        print()
        print(
            f"Python {machine['python']}, nearcache {machine['nearcache']}, "
            f"{machine['cpu']} ({machine['cpus']} CPUs), {machine['platform']}; "
            f"median of {machine['rounds']} rounds of {machine['number']} calls."
        )


if __name__ == "__main__":
    main()
