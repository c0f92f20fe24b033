"""The ``nearcache`` command.

::

    nearcache --version
    nearcache bench [WORKLOAD ...] [--quick] [--out DIR | --no-save] [--json FILE]
                    [--markdown FILE] [--plot DIR] [--redis URL] [--memcached HOST:PORT]
                    [--start-servers] [--backends NAME,...] [--exclude NAME,...]
                    [--sizes SIZE,...]
    nearcache bench --list              workloads and backends, and why some would be skipped
    nearcache bench --load FILE         re-render a saved JSON result (tables, --markdown, --plot)
    nearcache ls [--json]               this user's caches: size, memory, entries, hit ratio
    nearcache get NAME KEY [--unpickle] a value, shown safely (pickles only with --unpickle)
    nearcache set NAME KEY VALUE [--ttl T] [--int-value]
    nearcache delete NAME KEY...
    nearcache keys NAME [--limit N]     live keys (get/set/delete/keys take --prefix P)
    nearcache inspect NAME [--json]     per-shard fill, evictions, compactions, spilled files
    nearcache top NAME [--interval S] [--once | --iterations N]   live counters
    nearcache stats NAME|PATH [--json|--prometheus]  a cache's counters
    nearcache clear NAME|PATH           remove every entry of a cache
    nearcache info NAME|PATH [--check]  a cache file's geometry (and a consistency check)
    nearcache torture [--duration S] [--workers N] [--json]   kill-and-verify torture test

``NAME`` is a cache name under the default directory (``$NEARCACHE_DIR``, else
``/dev/shm/nearcache-<uid>``), as in ``Cache("name")``; anything containing a
``/`` is a path.
"""

from __future__ import annotations

import argparse
import datetime
import difflib
import json
import os
import shlex
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["QUICK_TIME", "build_parser", "main", "version_text"]

#: What ``--quick`` takes, as its help says (measured: see the CHANGELOG).
QUICK_TIME = "about 2 minutes on 2 idle cores, charts included (--no-save: none)"


def _csv(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def _host_port(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {value!r}")
    return host, int(port)


def version_text() -> str:
    """``nearcache --version``: the package, the file layout it reads, and Python."""
    from nearcache import __version__
    from nearcache._native import LAYOUT_VERSION

    return (
        f"nearcache {__version__} (file layout {LAYOUT_VERSION}, Python {sys.version.split()[0]})"
    )


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors suggest the closest option."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments:"):
            options = [o for a in self._actions for o in a.option_strings]
            hints = []
            for arg in message.split(":", 1)[1].split():
                close = difflib.get_close_matches(arg.split("=")[0], options, n=1)
                if arg.startswith("-") and close:
                    hints.append(f"{arg}: did you mean {close[0]}?")
            if hints:
                message = f"{message} ({'; '.join(hints)})"
        super().error(message)


def _workload_help() -> tuple[str, str]:
    from .bench.workloads import WORKLOADS, default_workloads

    default = default_workloads()
    named = [n for n in WORKLOADS if n not in default]
    return ", ".join(default), ", ".join(named)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``nearcache`` command."""
    parser = _Parser(
        prog="nearcache", description="nearcache: a multi-process shared-memory cache."
    )
    parser.add_argument(
        "--version", action="version", version=version_text(), help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    default, named = _workload_help()
    bench = sub.add_parser(
        "bench",
        help="run the benchmark studies against nearcache and its peers",
        description=(
            "Rerun the seed benchmark studies side by side with every peer that is installed. "
            f"With no WORKLOAD: {default} (no servers, no network; about 15 minutes on 2 idle "
            f"cores). {named} run only when named. Results are saved into a dated folder "
            "(see --out)."
        ),
    )
    bench.add_argument(
        "workloads",
        nargs="*",
        metavar="WORKLOAD",
        help=f"workloads to run (default: {default}; only when named: {named})",
    )
    speed = bench.add_mutually_exclusive_group()
    speed.add_argument(
        "--quick",
        action="store_true",
        help=f"short runs: {QUICK_TIME}; one workload takes seconds",
    )
    speed.add_argument("--profile", choices=("tiny", "quick", "default"), help=argparse.SUPPRESS)
    bench.add_argument("--repeats", type=int, help="timed repeats per figure (median reported)")
    save = bench.add_mutually_exclusive_group()
    save.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="save results.json, results.md and the charts into DIR "
        "(default: nearcache-bench/<date>_<time> under the current directory)",
    )
    save.add_argument("--no-save", action="store_true", help="save nothing unless asked below")
    bench.add_argument("--json", type=Path, metavar="FILE", help="write every figure as JSON")
    bench.add_argument("--markdown", type=Path, metavar="FILE", help="write the tables as Markdown")
    bench.add_argument("--plot", type=Path, metavar="DIR", help="write PNG charts into DIR")
    bench.add_argument("--redis", metavar="URL", help="Redis server for the Redis backends")
    bench.add_argument("--memcached", type=_host_port, metavar="HOST:PORT", help="memcached server")
    bench.add_argument(
        "--start-servers",
        action="store_true",
        help="start redis-server and memcached on free 127.0.0.1 ports for the run",
    )
    bench.add_argument(
        "--backends", type=_csv, default=[], metavar="NAME,...", help="only these backends"
    )
    bench.add_argument(
        "--exclude", type=_csv, default=[], metavar="NAME,...", help="leave these backends out"
    )
    bench.add_argument("--seed", type=int, default=2010, help="random seed of the data (2010)")
    bench.add_argument(
        "--dir", type=Path, metavar="DIR", help="scratch directory for file-based peers (TMPDIR)"
    )
    bench.add_argument(
        "--nearcache-dir", type=Path, metavar="DIR", help="directory of nearcache's files"
    )
    bench.add_argument(
        "--trace",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="a trace for the traces workload (oracleGeneral binary, or text: key [size] a line)",
    )
    bench.add_argument(
        "--real-traces",
        type=_csv,
        default=[],
        metavar="NAME,...|all",
        help="public traces for the traces workload, downloaded once (loop,cs,ps,multi1,...)",
    )
    bench.add_argument(
        "--sizes",
        type=_csv,
        default=[],
        metavar="SIZE,...",
        help="file sizes of the large workload (1GiB,4GiB,16GiB; e.g. 64MiB,1GiB)",
    )
    bench.add_argument("--list", action="store_true", help="list workloads and backends, then exit")
    bench.add_argument("--load", type=Path, metavar="FILE", help="re-render a JSON result")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--debug", action="store_true", help="print tracebacks of failed backends")

    ls = sub.add_parser("ls", help="this user's caches: size, memory, entries, hit ratio")
    ls.add_argument("--dir", metavar="DIR", help="look in DIR (default: where names live)")
    ls.add_argument("--json", action="store_true", help="print JSON")

    def keyed(cmd: str, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(cmd, help=help)
        p.add_argument("name", metavar="NAME|PATH")
        p.add_argument("--prefix", default="", help="the cache's key namespace (Cache(prefix=))")
        kind = p.add_mutually_exclusive_group()
        kind.add_argument("--int", action="store_true", help="keys are ints")
        kind.add_argument("--bytes", action="store_true", help=r"keys are bytes (\x00 escapes)")
        return p

    get = keyed("get", "print one value, shown safely")
    get.add_argument("key", metavar="KEY")
    get.add_argument(
        "--unpickle", action="store_true", help="unpickle pickled values (runs code from the file)"
    )
    set_ = keyed("set", "store a str (or int) value")
    set_.add_argument("key", metavar="KEY")
    set_.add_argument("value", metavar="VALUE")
    set_.add_argument("--ttl", help="time to live: seconds or '5m', '1h'... (default: the cache's)")
    set_.add_argument("--int-value", action="store_true", help="store VALUE as an int")
    delete = keyed("delete", "remove keys")
    delete.add_argument("keys", nargs="+", metavar="KEY")
    keys = keyed("keys", "list the live keys, sorted")
    keys.add_argument("--limit", type=int, metavar="N", help="print at most N keys")

    inspect = sub.add_parser("inspect", help="per-shard fill, evictions, compactions, spills")
    inspect.add_argument("name", metavar="NAME|PATH")
    inspect.add_argument("--json", action="store_true", help="print JSON")

    top = sub.add_parser("top", help="live view of a cache's counters (like top)")
    top.add_argument("name", metavar="NAME|PATH")
    top.add_argument(
        "--interval", type=float, default=1.0, metavar="S", help="refresh period (1 s)"
    )
    once = top.add_mutually_exclusive_group()
    once.add_argument("--once", action="store_true", help="print one view (over one interval)")
    once.add_argument("--iterations", type=int, metavar="N", help="stop after N refreshes")

    stats = sub.add_parser("stats", help="print a cache's counters")
    stats.add_argument("name", metavar="NAME|PATH")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.add_argument("--prometheus", action="store_true", help="print the Prometheus text format")

    clear = sub.add_parser("clear", help="remove every entry of a cache")
    clear.add_argument("name", metavar="NAME|PATH")

    resize = sub.add_parser(
        "resize", help="resize a cache live, keeping its entries (the newest that fit)"
    )
    resize.add_argument("name", metavar="NAME|PATH")
    resize.add_argument("size", metavar="SIZE", help="new size: bytes or '256MiB', '2GiB'...")
    resize.add_argument(
        "--shards", type=int, default=0, metavar="N", help="shard count (default: from the size)"
    )
    resize.add_argument("--json", action="store_true", help="print JSON")

    info = sub.add_parser("info", help="print a cache file's geometry")
    info.add_argument("name", metavar="NAME|PATH")
    info.add_argument("--check", action="store_true", help="verify every shard's invariants")
    info.add_argument("--json", action="store_true", help="print JSON")

    # Options are parsed by nearcache.torture.main (see main() below).
    sub.add_parser("torture", help="multi-process torture test with random kills (see --help)")
    sub.add_parser("tiered-faults", help="fault test of the tiered cache over local Redis")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``nearcache`` command; returns the exit status."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list[:1] == ["torture"]:
        from .torture import main as torture_main

        return torture_main(args_list[1:])
    if args_list[:1] == ["tiered-faults"]:
        from .tiered.faults import main as faults_main

        return faults_main(args_list[1:])
    parser = build_parser()
    args, extra = parser.parse_known_args(args_list)
    if extra:
        # The subcommand's usage, not the top-level one, for its own options.
        sub = _subparser(parser, args.command)
        (sub or parser).error(f"unrecognized arguments: {' '.join(extra)}")
    from . import tools

    commands = {
        "ls": tools.main_ls,
        "get": tools.main_get,
        "set": tools.main_set,
        "delete": tools.main_delete,
        "keys": tools.main_keys,
        "inspect": tools.main_inspect,
        "top": tools.main_top,
        "stats": _stats,
        "clear": _clear,
        "resize": _resize,
        "info": _info,
    }
    try:
        if args.command == "bench":
            return _bench(args, args_list)
        try:
            return commands[args.command](args)
        except (OSError, ValueError, TypeError) as exc:
            return _fail(exc)
    except KeyboardInterrupt:
        return 130


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            found: argparse.ArgumentParser | None = action.choices.get(name)
            return found
    return None


# -- bench -------------------------------------------------------------------------


def _bench(args: argparse.Namespace, argv: list[str]) -> int:
    from rich.console import Console

    from .bench import runner
    from .bench.backends.base import BackendContext
    from .bench.backends.registry import all_backends
    from .bench.model import BenchResult
    from .bench.workloads import PROFILES, WORKLOADS

    # A terminal keeps its own width (tables that do not fit are split or
    # stacked, never cut); logs get COLUMNS, or 200.
    console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else 200)
    err = Console(stderr=True)
    if args.list:
        console.print("[bold]workloads[/bold]")
        for name, cls in WORKLOADS.items():
            console.print(f"  {name:18} {cls.title}", highlight=False)
        console.print("[bold]backends[/bold]")
        ctx = BackendContext(
            workdir=Path("."), run_id="list", redis_url=args.redis, memcached=args.memcached
        )
        for b in all_backends():
            try:
                reason = b.unavailable(ctx)
            except Exception as exc:
                reason = str(exc)
            if reason is not None and args.start_servers and reason.startswith("needs a"):
                binary = {"redis": "redis-server", "memcached": "memcached"}.get(b.server or "")
                if binary and shutil.which(binary):
                    reason = None
            status = "ok" if reason is None else f"[yellow]skipped[/yellow]: {reason}"
            console.print(f"  {b.name:18} {b.title} - {status}", highlight=False)
        return 0

    if args.load is not None:
        result = BenchResult.load(args.load)
        tables = runner.render(result)
        from .bench.report import print_tables, terminal_header

        for line in terminal_header(result):
            console.print(line, highlight=False)
        console.print()
        for w in result.workloads:
            console.rule(f"{w.name}: {w.title}")
            print_tables(console, tables.get(w.name, []))
        for path in runner.write_outputs(result, tables, args.json, args.markdown, args.plot):
            err.print(f"wrote {path}", highlight=False)
        if args.out is not None:
            _save_run(result, tables, args.out, err)
        return 0

    if (args.trace or args.real_traces) and not args.workloads:
        args.workloads = ["traces"]
    for f in args.trace:
        if not f.is_file():
            err.print(f"--trace {f}: no such file")
            return 2
    unknown = [w for w in args.workloads if w not in WORKLOADS]
    if unknown:
        err.print(f"unknown workload(s): {', '.join(unknown)}; known: {', '.join(WORKLOADS)}")
        return 2
    workload_options: dict[str, Any] = {"traces": args.trace, "real_traces": args.real_traces}
    if args.sizes:
        if "large" not in args.workloads:
            err.print("--sizes applies to the large workload: name it (nearcache bench large)")
            return 2
        from .units import parse_size

        try:
            workload_options["sizes"] = [parse_size(s) for s in args.sizes]
        except (TypeError, ValueError) as exc:
            err.print(f"--sizes: {exc}")
            return 2
    profile = PROFILES[args.profile or ("quick" if args.quick else "default")]
    if args.repeats is not None:
        if args.repeats < 1:
            err.print("--repeats must be at least 1")
            return 2
        from dataclasses import replace

        profile = replace(profile, repeats=args.repeats)
    if args.plot is not None:
        from .bench.plots import matplotlib_missing

        reason = matplotlib_missing()
        if reason is not None:
            err.print(f"--plot needs matplotlib: {reason}")
            return 2
    options = runner.RunOptions(
        workloads=args.workloads,
        backends=args.backends,
        exclude=args.exclude,
        profile=profile,
        seed=args.seed,
        workdir=args.dir,
        nearcache_dir=args.nearcache_dir,
        redis_url=args.redis,
        memcached=args.memcached,
        start_servers=args.start_servers,
        progress=not args.no_progress,
        command=shlex.join(["nearcache", *argv]),
        debug=args.debug,
        workload_options=workload_options,
    )
    try:
        result, tables = runner.run(options, console)
    except KeyError as exc:
        err.print(str(exc.args[0]) if exc.args else str(exc))
        return 2
    for path in runner.write_outputs(result, tables, args.json, args.markdown, args.plot):
        err.print(f"wrote {path}", highlight=False)
    if not args.no_save:
        out = args.out or _dated_folder(Path("nearcache-bench"), result.started)
        _save_run(result, tables, out, err)
    err.print(f"done in {result.duration_s:.0f} s", highlight=False)
    return 0


def _dated_folder(base: Path, started: str) -> Path:
    """``base/2026-11-26_074912`` from a result's start time (a suffix if taken)."""
    try:
        when = datetime.datetime.fromisoformat(started)
    except ValueError:
        when = datetime.datetime.now(datetime.timezone.utc)
    folder = base / f"{when:%Y-%m-%d_%H%M%S}"
    n = 2
    while folder.exists():
        folder = base / f"{when:%Y-%m-%d_%H%M%S}-{n}"
        n += 1
    return folder


def _save_run(result: Any, tables: Any, out: Path, err: Any) -> None:
    """Save results.json, results.md and the charts into ``out``; say where."""
    from .bench import runner
    from .bench.plots import matplotlib_missing

    out.mkdir(parents=True, exist_ok=True)
    missing = matplotlib_missing()
    written = runner.write_outputs(
        result, tables, out / "results.json", out / "results.md", None if missing else out
    )
    charts = [p.name for p in written if p.suffix == ".png"]
    err.print(f"saved in {out}/", highlight=False)
    err.print(
        "  results.json, results.md"
        + "".join(f", {name}" for name in charts)
        + (f" (no charts: {missing}; pip install 'nearcache[bench]')" if missing else ""),
        highlight=False,
    )


# -- stats / clear / info ------------------------------------------------------------


def _resolve(name: str) -> str:
    """A cache name or a path, as a path: exactly as ``Cache(name)`` resolves it
    (a name lives in :func:`nearcache.cache.default_directory`, which honours
    ``$NEARCACHE_DIR``)."""
    if os.sep in name or name.startswith("."):
        return name
    from .cache import DIRECTORY_ENV, _check_name

    _check_name(name)
    override = os.environ.get(DIRECTORY_ENV)
    if override:
        return os.path.join(override, name)  # read-only commands create no directory
    from ._native import default_directory

    return os.path.join(default_directory(), name)


def _open_native(name: str) -> Any:
    from ._native import NativeCache
    from .errors import IncompatibleFileError

    path = _resolve(name)
    if not os.path.exists(path):
        raise FileNotFoundError(f"no cache file at {path}")
    try:
        return NativeCache(path, 0, create=False)
    except IncompatibleFileError as exc:
        raise _incompatible_here(exc, path) from exc


def _incompatible_here(exc: Exception, path: str) -> Exception:
    """A file this command cannot read, told in its terms (it opens every file with
    the file's own size, so only the layout can differ): not the ``Cache()``
    arguments the engine's message names."""
    from ._incompatible import engine_facts
    from .errors import IncompatibleFileError

    facts = engine_facts(str(exc))
    if path not in facts:
        facts = f"{facts} ({path})"
    return IncompatibleFileError(
        f"{facts}. This nearcache command reads only files of its own layout: use the "
        "nearcache command of the version that wrote the file, or delete the file once no "
        "process of that version uses it (the next open creates it anew)"
    )


def _print_mapping(title: str, data: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    table.add_column("field")
    table.add_column("value", justify="right")
    for key, value in data.items():
        table.add_row(str(key), f"{value:,}" if isinstance(value, int) else str(value))
    Console().print(table)


def _fail(exc: Exception) -> int:
    print(f"nearcache: {exc}", file=sys.stderr)
    return 1


def _stats(args: argparse.Namespace) -> int:
    try:
        cache = _open_native(args.name)
    except Exception as exc:
        return _fail(exc)
    try:
        stats = dict(cache.stats())
        stats = {"entries": len(cache), **stats}
    finally:
        cache.close()
    if args.prometheus:
        from .metrics import format_prometheus, samples

        name = os.path.basename(os.path.normpath(args.name))
        print(format_prometheus(samples({name: stats})), end="")
    elif args.json:
        print(json.dumps(stats, indent=1, sort_keys=True))
    else:
        _print_mapping(f"nearcache stats: {_resolve(args.name)}", stats)
    return 0


def _clear(args: argparse.Namespace) -> int:
    try:
        cache = _open_native(args.name)
    except Exception as exc:
        return _fail(exc)
    try:
        before = len(cache)
        cache.clear()
    finally:
        cache.close()
    print(f"cleared {_resolve(args.name)}: {before:,} entries removed")
    return 0


def _resize(args: argparse.Namespace) -> int:
    """Resize a cache live and print its entries and size before and after."""
    from .units import parse_size

    try:
        size = parse_size(args.size)
        cache = _open_native(args.name)
    except Exception as exc:
        return _fail(exc)

    def state() -> dict[str, int]:
        stats = cache.stats()
        return {
            "entries": len(cache),
            "size_bytes": cache.capacity,
            "shards": cache.shard_count,
            "held_bytes": stats["held_bytes"],
        }

    try:
        before = state()
        cache.resize(size, args.shards)
        after = state()
    except Exception as exc:
        return _fail(exc)
    finally:
        cache.close()
    if args.json:
        print(json.dumps({"path": _resolve(args.name), "before": before, "after": after}))
        return 0
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"nearcache resize: {_resolve(args.name)}", title_justify="left")
    for column in ("", "before", "after"):
        table.add_column(column, justify="right" if column else "left")
    for key in before:
        table.add_row(key, f"{before[key]:,}", f"{after[key]:,}")
    Console().print(table)
    return 0


def _info(args: argparse.Namespace) -> int:
    try:
        cache = _open_native(args.name)
    except Exception as exc:
        return _fail(exc)
    try:
        data: dict[str, Any] = {
            "path": cache.path,
            "size_bytes": cache.capacity,
            "shards": cache.shard_count,
            "max_entry_bytes": cache.max_entry_size,
            "default_ttl_ms": cache.default_ttl_ms,
            "entries": len(cache),
        }
        if args.check:
            try:
                data.update({f"check_{k}": v for k, v in cache.check().items()})
                data["check"] = "ok"
            except Exception as exc:
                data["check"] = f"FAILED: {exc}"
    finally:
        cache.close()
    if args.json:
        print(json.dumps(data, indent=1))
    else:
        _print_mapping("nearcache info", data)
    return 0 if not str(data.get("check", "ok")).startswith("FAILED") else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
