"""Before/after comparison of the native hot paths, noise-robust.

Runs this file's measurement in two Python environments (each with its own
build of nearcache installed), alternating between them for ``--rounds``
rounds, and reports per operation the minimum per-call time each side ever
reached (the minimum of ``--repeat`` timings of ``--loops`` calls, over all
rounds) and their ratio. On a machine shared with other work the minimum is
far more stable than a median: interference only ever adds time.

Run: python benchmarks/native_ab.py --before /path/to/venv-a/bin/python \\
         --after /path/to/venv-b/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import timeit
import uuid

ROWS = {
    "get hit": "cache.get(bk)",
    "get miss": "cache.get(missing)",
    "set 160 B": "cache.set(bk, value)",
    "get_typed hit": "cache.get_typed(bk)",
    "set_typed 160 B": "cache.set_typed(bk, value)",
    "incr": "cache.incr(b'counter')",
}


def measure(loops: int, repeat: int) -> dict[str, float]:
    """Minimum ns per call of each row, in this interpreter's nearcache."""
    from nearcache import _native

    directory = tempfile.mkdtemp()
    cache = _native.NativeCache(os.path.join(directory, "bench"), 64 << 20)
    keys = [str(uuid.uuid4()).encode() for _ in range(1000)]
    value = os.urandom(160)
    for k in keys:
        cache.set(k, value)
    env = {"cache": cache, "bk": keys[7], "missing": b"x" * 36, "value": value}
    return {
        name: min(timeit.Timer(stmt, globals=env).repeat(repeat, loops)) / loops * 1e9
        for name, stmt in ROWS.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", help="python of the 'before' environment")
    ap.add_argument("--after", help="python of the 'after' environment")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loops", type=int, default=5000)
    ap.add_argument("--repeat", type=int, default=101)
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        print(json.dumps(measure(args.loops, args.repeat)))
        return
    if not (args.before and args.after):
        ap.error("--before and --after are required")
    best: dict[str, dict[str, float]] = {"before": {}, "after": {}}
    for _ in range(args.rounds):
        for side, python in (("before", args.before), ("after", args.after)):
            out = subprocess.run(
                [
                    python,
                    os.path.abspath(__file__),
                    "--measure",
                    *("--loops", str(args.loops), "--repeat", str(args.repeat)),
                ],
                capture_output=True,
                text=True,
                check=True,
                cwd=tempfile.gettempdir(),  # import the environment's nearcache
            ).stdout
            for name, ns in json.loads(out).items():
                best[side][name] = min(ns, best[side].get(name, float("inf")))
    print(f"load average {os.getloadavg()[0]:.1f}; {args.rounds} alternating rounds")
    print(f"{'operation':<18}{'before ns':>11}{'after ns':>10}{'after/before':>14}")
    for name in ROWS:
        b, a = best["before"][name], best["after"][name]
        print(f"{name:<18}{b:>11.1f}{a:>10.1f}{a / b:>14.2f}")


if __name__ == "__main__":
    main()
