"""A default cache on a small /dev/shm: does it leave room for the other users?

Docker gives a container a 64 MiB ``/dev/shm``.  Other programs use it too
(PostgreSQL's parallel queries, Python's ``multiprocessing``).  This script
reproduces the case of issue "A cache of any size": on a 64 MiB tmpfs with
20 MiB taken by another program's file, a default ``Cache("app")`` is filled
with 1.6 KB values (twice what the file could hold), then one 300 KB value
(above the 128 KiB spill threshold: it goes to a file beside the cache) is
set.  It reports ``df`` before and after, what the cache holds, and the
300 KB value's outcome, next to the goals: a stated reserve of the file
system left free, and the value stored (by eviction) rather than refused.

The tmpfs is made by the script:

- as root: ``mount -t tmpfs -o size=64m tmpfs DIR`` on a fresh directory
  (unmounted at the end);
- otherwise: the script runs itself again under ``unshare --user
  --map-root-user --mount`` (a private mount namespace, where an
  unprivileged user may mount a tmpfs, when the kernel allows user
  namespaces);
- or ``--dir DIR`` names a small tmpfs you made (a container started with
  ``--shm-size=64m``: ``--dir /dev/shm``; the other program's file and the
  cache are written there and removed at the end).

A loop-mounted disk image is not used: off tmpfs the engine reserves the
whole file when it is created, so it would not show what a tmpfs does.

    python benchmarks/small_shm.py            # text
    python benchmarks/small_shm.py --json     # one JSON object

Exit status 0 when measured (whatever the outcome), 2 when no tmpfs could
be made (the reason on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Any

MIB = 1 << 20
FS_SIZE = 64 * MIB
OTHER_BYTES = 20 * MIB
VALUE_BYTES = 1600
BIG_VALUE = 300_000
#: The reserve the goal asks a default cache to leave free (the engine's
#: default once it has one; see docs/reliability.md).
GOAL_RESERVE = 8 * MIB
_INNER = "NEARCACHE_SMALL_SHM_INNER"


def df(path: str) -> dict[str, int]:
    """Size, used and available bytes of the file system of ``path`` (as ``df`` shows)."""
    st = os.statvfs(path)
    size = st.f_blocks * st.f_frsize
    free = st.f_bfree * st.f_frsize
    return {"size": size, "used": size - free, "avail": st.f_bavail * st.f_frsize}


def measure(directory: str) -> dict[str, Any]:
    """Fill ``directory`` (a small tmpfs) as the issue did; return what happened."""
    os.environ["NEARCACHE_DIR"] = directory
    from nearcache import Cache

    report: dict[str, Any] = {"dir": directory, "df_empty": df(directory)}
    other = os.path.join(directory, "other-program")
    with open(other, "wb") as f:
        f.write(b"\0" * OTHER_BYTES)
    report["df_other"] = df(directory)
    cache = Cache("app")
    try:
        report["cache"] = {
            "size": cache.capacity,
            "shards": cache.shard_count,
            "spill_threshold": cache.spill_threshold,
        }
        value = os.urandom(VALUE_BYTES)
        sets = 2 * cache.capacity // VALUE_BYTES
        errors: dict[str, int] = {}
        for i in range(sets):
            try:
                cache.set(f"fragment-{i}", value)
            except Exception as exc:
                errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
        stats = cache.stats()
        report["filled"] = {
            "sets": sets,
            "set_errors": errors,
            "entries": len(cache),
            "held_bytes": stats["held_bytes"],
            "live_bytes": stats["live_bytes"],
            "evictions": stats["evictions"],
        }
        report["df_filled"] = df(directory)
        big = os.urandom(BIG_VALUE)
        try:
            cache.set("big", big)
            stored = cache.get("big") == big
            report["big_value"] = {"stored": stored, "error": ""}
        except Exception as exc:
            report["big_value"] = {"stored": False, "error": f"{type(exc).__name__}: {exc}"}
        report["df_after_big"] = df(directory)
        report["after_big"] = {"entries": len(cache), "held_bytes": cache.stats()["held_bytes"]}
        path = cache.path
    finally:
        cache.close()
    shutil.rmtree(path + ".spill", ignore_errors=True)
    for name in (path, other):
        with contextlib.suppress(OSError):
            os.unlink(name)
    report["goals"] = {
        "reserve_bytes": GOAL_RESERVE,
        "reserve_left": report["df_filled"]["avail"] >= GOAL_RESERVE,
        "big_value_stored": report["big_value"]["stored"],
    }
    return report


def _mounted_run() -> dict[str, Any]:
    """Mount a 64 MiB tmpfs on a fresh directory, measure, unmount."""
    mountpoint = tempfile.mkdtemp(prefix="nearcache-small-shm-")
    try:
        options = f"size={FS_SIZE // MIB}m,mode=0700"
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", options, "tmpfs", mountpoint],
            check=True,
            capture_output=True,
            text=True,
        )
        try:
            report = measure(mountpoint)
            report["tmpfs"] = "mount -t tmpfs -o size=64m"
            return report
        finally:
            subprocess.run(["umount", mountpoint], check=False, capture_output=True)
    finally:
        with contextlib.suppress(OSError):
            os.rmdir(mountpoint)


def run(directory: str | None) -> dict[str, Any]:
    """Measure on ``directory``, or on a tmpfs made here (see the module docs)."""
    if directory is not None:
        report = measure(directory)
        report["tmpfs"] = f"given: {directory}"
        return report
    if os.geteuid() == 0:
        return _mounted_run()
    if os.environ.get(_INNER):
        raise RuntimeError("inside a user namespace, but mounting a tmpfs failed")
    unshare = shutil.which("unshare")
    if unshare is None:
        raise RuntimeError("not root and no unshare(1): pass --dir with a small tmpfs")
    done = subprocess.run(
        [unshare, "--user", "--map-root-user", "--mount", sys.executable, __file__, "--json"],
        env={**os.environ, _INNER: "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(
            "not root, and unshare --user --map-root-user --mount failed (user namespaces "
            f"disabled?): {done.stderr.strip()[-300:]}; pass --dir with a small tmpfs"
        )
    report: dict[str, Any] = json.loads(done.stdout)
    report["tmpfs"] += " (in a user namespace: unshare --user --map-root-user --mount)"
    return report


def _mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def text(report: dict[str, Any]) -> str:
    """The report for a terminal."""
    lines = [f"tmpfs: {report['tmpfs']}"]
    for key, label in (
        ("df_empty", "empty"),
        ("df_other", f"another program's {_mib(OTHER_BYTES)} file"),
        ("df_filled", "+ Cache('app') filled with 1.6 KB values"),
        ("df_after_big", "+ a 300 KB value"),
    ):
        d = report[key]
        lines.append(
            f"df {label:>42}: size {_mib(d['size'])}, used {_mib(d['used'])}, "
            f"avail {_mib(d['avail'])} ({100 * d['used'] / d['size']:.0f}%)"
        )
    c, f = report["cache"], report["filled"]
    lines.append(
        f"cache: {_mib(c['size'])} file, {c['shards']} shards; {f['sets']:,} sets, "
        f"errors {f['set_errors'] or 'none'}; holds {f['entries']:,} entries, "
        f"{_mib(f['held_bytes'])} held, {f['evictions']:,} evictions"
    )
    big = report["big_value"]
    lines.append(f"300 KB value: {'stored' if big['stored'] else 'refused: ' + big['error']}")
    g = report["goals"]
    lines.append(
        f"goal, {_mib(g['reserve_bytes'])} left free: {'met' if g['reserve_left'] else 'NOT met'}; "
        f"goal, 300 KB value stored: {'met' if g['big_value_stored'] else 'NOT met'}"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", help="an existing small tmpfs to use instead of mounting one")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    try:
        report = run(args.dir)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        detail = getattr(exc, "stderr", "") or ""
        print(f"small_shm: no small tmpfs: {exc} {detail}".strip(), file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else text(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
