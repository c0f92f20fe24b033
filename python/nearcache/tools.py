"""The cache commands of ``nearcache``: ls, get, set, delete, keys, inspect, top.

They open a cache file through the engine (``NativeCache``) with
``create=False``, so a mistyped name is an error, never a new file.  Values
are shown without trusting the file: native values (bytes, str, int, float,
bool, None) as they are, bytes and text with control characters escaped,
JSON and msgpack bodies decoded (neither runs code), and pickles never
unpickled unless ``--unpickle`` is given (unpickling runs whatever code the
file's writer put in it).

``ls`` counts the processes that map a cache file from ``/proc/*/maps``
(those this user may read: this user's processes), not from the file's own
attach counter, which a killed process leaves raised until the next lone
open.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from nearcache._native import NativeCache

__all__ = [
    "attached_pids",
    "cache_files",
    "format_value",
    "main_delete",
    "main_get",
    "main_inspect",
    "main_keys",
    "main_ls",
    "main_set",
    "main_top",
    "show_key",
]

#: Stats summed by ``top`` into one "operations" rate.
_OPS = ("hits", "misses", "sets", "deletes")


# -- finding and opening caches ---------------------------------------------------


def directory() -> str:
    """Where caches opened by name live (``$NEARCACHE_DIR``, else the engine's
    default), without creating it."""
    from nearcache.cache import DIRECTORY_ENV

    override = os.environ.get(DIRECTORY_ENV)
    if override:
        return override
    from nearcache._native import default_directory

    return default_directory()


def resolve(name: str) -> str:
    """A cache name or a path, as a path: exactly as ``Cache(name)`` resolves it."""
    if os.sep in name or name.startswith("."):
        return name
    from nearcache.cache import _check_name

    _check_name(name)
    return os.path.join(directory(), name)


def open_native(name: str, prefix: str = "") -> NativeCache:
    """The engine's handle on an existing cache file (FileNotFoundError if none)."""
    from nearcache._native import NativeCache
    from nearcache.keys import encode_prefix

    path = resolve(name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no cache file at {path}")
    return NativeCache(path, 0, create=False, prefix=encode_prefix(prefix))


#: Files nearcache keeps beside a cache, which are not caches: a tiered
#: cache's listener election (``<cache>.listener-<channel>``) and a live
#: resize's new file while it fills (``<cache>.resize-<id>``).
_COMPANION = re.compile(r"\.(listener-[0-9a-f]+|resize-[0-9a-f]{16})\Z")


def cache_files(where: str) -> list[Path]:
    """The cache files of ``where`` (spill directories, listener elections and
    a resize's file in the making left out)."""
    base = Path(where)
    if not base.is_dir():
        return []
    return sorted(
        p
        for p in base.iterdir()
        if p.is_file() and not p.is_symlink() and not _COMPANION.search(p.name)
    )


def attached_pids(path: str | os.PathLike[str], exclude_self: bool = True) -> list[int]:
    """Processes (readable to this user) that map the file at ``path``."""
    try:
        st = os.stat(path)
    except OSError:
        return []
    inode = str(st.st_ino)
    pids = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or (exclude_self and int(entry.name) == me):
            continue
        try:
            with open(f"/proc/{entry.name}/maps", encoding="utf-8", errors="replace") as maps:
                for line in maps:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and fields[4] == inode and _same_file(fields[5], st):
                        pids.append(int(entry.name))
                        break
        except OSError:
            continue
    return pids


def _same_file(mapped: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(mapped.rstrip("\n"))
    except OSError:
        return False
    return (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


# -- showing keys and values safely ----------------------------------------------


def _safe_text(text: str) -> str:
    """``text`` as is when printable, else its repr (no terminal escapes run)."""
    return text if text.isprintable() else repr(text)


def show_key(raw: bytes) -> str:
    """A stored key as ``Cache.keys()`` gives it, printable."""
    from nearcache.keys import decode_key

    key = decode_key(raw)
    if isinstance(key, str):
        return _safe_text(key)
    return repr(key)


def format_value(flags: int, payload: bytes, unpickle: bool = False) -> str:
    """An entry's value for a terminal, decoded only where that runs no code.

    >>> format_value(1, "héllo".encode())
    'héllo'
    >>> format_value(0, b"\\x00\\x01ab")
    "b'\\\\x00\\\\x01ab'"
    >>> format_value(2, (42).to_bytes(8, "little", signed=True))
    '42'
    >>> import pickle
    >>> format_value(16 | 1 << 8, pickle.dumps({"a": 1}))  # doctest: +ELLIPSIS
    '<pickle, ... bytes: not unpickled (unpickling runs code from the file); --unpickle shows it>'
    >>> format_value(16 | 1 << 8, pickle.dumps({"a": 1}), unpickle=True)
    "{'a': 1}"
    """
    from nearcache._native import FLAG_USER
    from nearcache.serializers import (
        COMPRESSION_MASK,
        COMPRESSION_SHIFT,
        FLAG_SIGNED,
        NATIVE_MASK,
        SERIALIZER_MASK,
        SERIALIZER_SHIFT,
        SIGNATURE_SIZE,
        decode_native,
    )

    if flags < FLAG_USER:
        return _show_native(decode_native(flags, payload))
    note = ""
    body = payload
    if flags & FLAG_SIGNED:
        body = payload[SIGNATURE_SIZE:]
        note = " (signed; signature not checked)"
    compression = (flags & COMPRESSION_MASK) >> COMPRESSION_SHIFT
    if compression:
        from nearcache.serializers import _default_compressor

        try:
            body = _default_compressor(compression).decompress(body)
        except Exception as exc:
            return f"<compressed with id {compression}, {len(payload)} bytes: {exc}>{note}"
    serializer_id = (flags & SERIALIZER_MASK) >> SERIALIZER_SHIFT
    if serializer_id == 0:
        return _show_native(decode_native(flags & NATIVE_MASK, body)) + note
    if serializer_id == 1:
        if not unpickle:
            return (
                f"<pickle, {len(body)} bytes: not unpickled (unpickling runs code from "
                f"the file); --unpickle shows it>{note}"
            )
        import pickle

        return repr(pickle.loads(body)) + note  # asked for with --unpickle
    if serializer_id == 2:
        return _safe_text(json.dumps(json.loads(body), ensure_ascii=False)) + note
    if serializer_id == 3:
        try:
            import msgpack  # type: ignore[import-untyped]
        except ImportError:
            return f"<msgpack, {len(body)} bytes: install msgpack to show it>{note}"
        return _safe_text(repr(msgpack.unpackb(body, raw=False, strict_map_key=False))) + note
    return f"<serializer id {serializer_id}, {len(body)} bytes>{note}"


def _show_native(value: object) -> str:
    if isinstance(value, str):
        return _safe_text(value)
    return repr(value) if isinstance(value, bytes) else str(value)


# -- commands -----------------------------------------------------------------------


def _console() -> Console:
    from rich.console import Console

    return Console(highlight=False)


def _table(title: str, columns: list[str], right: set[int] | None = None) -> Any:
    from rich.table import Table

    table = Table(title=title, title_justify="left", header_style="bold")
    for i, col in enumerate(columns):
        table.add_column(col, justify="right" if i in (right or set()) else "left", no_wrap=True)
    return table


def _fmt_bytes(n: float) -> str:
    from nearcache.bench.report import fmt_bytes

    return fmt_bytes(n)


def _hit_ratio(hits: float, misses: float) -> str:
    return f"{hits / (hits + misses):.3f}" if hits + misses else "-"


def main_ls(args: argparse.Namespace) -> int:
    """``nearcache ls``: this user's caches with size, memory, entries, hit ratio, processes."""
    where = args.dir or directory()
    rows: list[dict[str, Any]] = []
    for path in cache_files(where):
        row: dict[str, Any] = {"name": path.name, "path": str(path)}
        pids = attached_pids(path)
        try:
            native = open_native(str(path))
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
            rows.append(row)
            continue
        try:
            stats = native.stats()
        finally:
            native.close()
        row.update(
            {
                "size_bytes": stats["file_bytes"],
                "held_bytes": stats["held_bytes"] + stats["spilled_bytes"],
                "entries": stats["items"],
                "hits": stats["hits"],
                "misses": stats["misses"],
                "processes": len(pids),
                "pids": pids,
            }
        )
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    console = _console()
    if not rows:
        console.print(f"no caches in {where}")
        return 0
    table = _table(
        f"caches in {where}",
        ["name", "size", "held", "entries", "hit ratio", "processes"],
        right={1, 2, 3, 4, 5},
    )
    errors = []
    for row in rows:
        if "error" in row:
            errors.append(f"{row['name']}: not opened ({row['error']})")
            continue
        table.add_row(
            _safe_text(row["name"]),
            _fmt_bytes(row["size_bytes"]),
            _fmt_bytes(row["held_bytes"]),
            f"{row['entries']:,}",
            _hit_ratio(row["hits"], row["misses"]),
            str(row["processes"]),
        )
    console.print(table)
    for line in errors:
        console.print(f"  {_safe_text(line)}", soft_wrap=True)
    console.print(
        "  held: memory in use now (pages and spilled files); processes: this user's "
        "that map the file",
        style="dim",
    )
    return 0


def _key(args: argparse.Namespace, text: str) -> str | int | bytes:
    if args.int:
        return int(text)
    if args.bytes:
        return text.encode("utf-8").decode("unicode_escape").encode("latin-1")
    return text


def main_get(args: argparse.Namespace) -> int:
    """``nearcache get NAME KEY``: print the value, shown safely (exit 1 on a miss)."""
    native = open_native(args.name, args.prefix)
    try:
        entry = native.get_entry(_key(args, args.key))
    finally:
        native.close()
    if entry is None:
        print(f"nearcache: {args.key!r}: no such key", file=sys.stderr)
        return 1
    payload, flags = entry
    print(format_value(flags, payload, unpickle=args.unpickle))
    return 0


def main_set(args: argparse.Namespace) -> int:
    """``nearcache set NAME KEY VALUE``: store a str (or an int with ``--int-value``)."""
    from nearcache.units import ttl_to_ms

    native = open_native(args.name, args.prefix)
    try:
        value: str | int = int(args.value) if args.int_value else args.value
        native.set_typed(_key(args, args.key), value, ttl_to_ms(args.ttl))
    finally:
        native.close()
    return 0


def main_delete(args: argparse.Namespace) -> int:
    """``nearcache delete NAME KEY...``: remove keys; exit 1 if none existed."""
    native = open_native(args.name, args.prefix)
    try:
        removed = sum(bool(native.delete(_key(args, k))) for k in args.keys)
    finally:
        native.close()
    print(f"deleted {removed} of {len(args.keys)}")
    return 0 if removed else 1


def main_keys(args: argparse.Namespace) -> int:
    """``nearcache keys NAME``: the live keys (of ``--prefix``'s namespace), sorted."""
    native = open_native(args.name, args.prefix)
    try:
        raw = native.keys()
    finally:
        native.close()
    shown = sorted(show_key(k) for k in raw)
    limit = args.limit if args.limit is not None else len(shown)
    for key in shown[:limit]:
        print(key)
    if len(shown) > limit:
        print(f"... and {len(shown) - limit:,} more", file=sys.stderr)
    return 0


def main_inspect(args: argparse.Namespace) -> int:
    """``nearcache inspect NAME``: geometry, per-shard fill and counters, spilled files."""
    native = open_native(args.name)
    try:
        shards = native.shard_stats()
        stats = native.stats()
        path = native.path
        # What the file holds (TTL and spill threshold are options of each
        # open, not of the file: not shown).
        geometry = {
            "path": path,
            "file_bytes": stats["file_bytes"],
            "held_bytes": stats["held_bytes"],
            "shards": native.shard_count,
            "max_entry_bytes": native.max_entry_size,
            "entries": stats["items"],
            "hits": stats["hits"],
            "misses": stats["misses"],
        }
    finally:
        native.close()
    spill_dir = Path(path + ".spill")
    spill_files = [p for p in spill_dir.rglob("*") if p.is_file()] if spill_dir.is_dir() else []
    spill: dict[str, Any] = {
        "directory": str(spill_dir),
        "files": len(spill_files),
        "bytes": sum(p.stat().st_size for p in spill_files),
    }
    if args.json:
        print(json.dumps({"geometry": geometry, "shards": shards, "spill": spill}, indent=1))
        return 0
    console = _console()
    head = _table(f"nearcache inspect: {_safe_text(args.name)}", ["field", "value"], right={1})
    for k, v in geometry.items():
        head.add_row(k, f"{v:,}" if isinstance(v, int) else _safe_text(str(v)))
    console.print(head)
    table = _table(
        "shards",
        ["shard", "entries", "fill", "evictions", "compactions", "lock timeouts", "spilled"],
        right={0, 1, 2, 3, 4, 5, 6},
    )
    for i, s in enumerate(shards):
        fill = s["used_bytes"] / s["capacity_bytes"] if s["capacity_bytes"] else 0.0
        table.add_row(
            str(i),
            f"{s['items']:,}",
            f"{fill:.1%}",
            f"{s['evictions']:,}",
            f"{s['compactions']:,}",
            f"{s['lock_timeouts']:,}",
            f"{s['spilled_values']:,}",
        )
    console.print(table)
    console.print(
        f"spilled files: {spill['files']:,} in {_safe_text(spill['directory'])} "
        f"({_fmt_bytes(spill['bytes'])})",
        soft_wrap=True,
    )
    return 0


def _top_view(
    name: str, path: str, now: dict[str, int], before: dict[str, int], dt: float, pids: int
) -> RenderableType:
    delta = {k: now[k] - before.get(k, 0) for k in now}
    rate = {k: v / dt if dt > 0 else 0.0 for k, v in delta.items()}
    table = _table(
        f"nearcache top: {name} ({path}) at {time.strftime('%H:%M:%S')}, over {dt:.1f} s",
        ["", "per second", "total"],
        right={1, 2},
    )
    ops = sum(rate[k] for k in _OPS)
    table.add_row("operations", f"{ops:,.0f}", f"{sum(now[k] for k in _OPS):,}")
    table.add_row(
        "gets", f"{rate['hits'] + rate['misses']:,.0f}", f"{now['hits'] + now['misses']:,}"
    )
    table.add_row("sets", f"{rate['sets']:,.0f}", f"{now['sets']:,}")
    table.add_row("deletes", f"{rate['deletes']:,.0f}", f"{now['deletes']:,}")
    table.add_row(
        "hit ratio",
        _hit_ratio(delta["hits"], delta["misses"]),
        _hit_ratio(now["hits"], now["misses"]),
    )
    table.add_row("evictions", f"{rate['evictions']:,.0f}", f"{now['evictions']:,}")
    table.add_row("expirations", f"{rate['expirations']:,.0f}", f"{now['expirations']:,}")
    table.add_row("lock timeouts", f"{rate['lock_timeouts']:,.0f}", f"{now['lock_timeouts']:,}")
    table.add_row("entries", "", f"{now['items']:,}")
    fill = now["used_bytes"] / now["capacity_bytes"] if now["capacity_bytes"] else 0.0
    table.add_row("fill", "", f"{fill:.1%}")
    table.add_row("held memory", "", _fmt_bytes(now["held_bytes"] + now["spilled_bytes"]))
    table.add_row("largest compaction", "", _fmt_bytes(now.get("max_compaction_bytes", 0)))
    table.add_row("processes", "", str(pids))
    view: RenderableType = table
    return view


def _samples(native: NativeCache, interval: float) -> Iterator[tuple[dict[str, int], float]]:
    while True:
        yield dict(native.stats()), time.monotonic()
        time.sleep(interval)


def main_top(args: argparse.Namespace) -> int:
    """``nearcache top NAME``: live counters, refreshed in place (Ctrl-C ends)."""
    from rich.live import Live

    native = open_native(args.name)
    path = native.path
    iterations = 1 if args.once else args.iterations
    console = _console()
    try:
        samples = _samples(native, args.interval)
        before, t0 = next(samples)
        if args.once:
            now, t1 = next(samples)
            console.print(
                _top_view(args.name, path, now, before, t1 - t0, len(attached_pids(path)))
            )
            return 0
        with Live(console=console, auto_refresh=False, transient=False) as live:
            for count, (now, t1) in enumerate(samples, 1):
                view = _top_view(args.name, path, now, before, t1 - t0, len(attached_pids(path)))
                live.update(view, refresh=True)
                before, t0 = now, t1
                if iterations is not None and count >= iterations:
                    break
    except KeyboardInterrupt:
        pass
    finally:
        native.close()
    return 0
