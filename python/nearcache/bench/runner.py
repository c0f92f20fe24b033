"""Run workloads over backends: selection, skips with reasons, progress, outputs."""

from __future__ import annotations

import contextlib
import datetime
import re
import shutil
import tempfile
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .backends.base import Backend, BackendContext
from .backends.registry import all_backends
from .machine import loadavg, machine_info, package_versions
from .model import BackendStatus, BenchResult, CaseResult, WorkloadResult
from .report import (
    Table,
    load_warning,
    markdown_report,
    pick_reference,
    print_tables,
    terminal_header,
)
from .servers import LocalServer, start_errors, started_servers
from .workloads import default_workloads, get_workload
from .workloads.base import PROFILES, CaseSkipped, Profile, Workload

__all__ = ["RunOptions", "render", "run", "select_backends", "write_outputs"]


@dataclass
class RunOptions:
    """Everything ``nearcache bench`` was asked to do."""

    workloads: Sequence[str] = ()
    backends: Sequence[str] = ()
    exclude: Sequence[str] = ()
    profile: Profile = field(default_factory=lambda: PROFILES["default"])
    seed: int = 2010
    workdir: Path | None = None
    nearcache_dir: Path | None = None
    redis_url: str | None = None
    memcached: tuple[str, int] | None = None
    start_servers: bool = False
    progress: bool = True
    print_tables: bool = True
    command: str = "nearcache bench"
    debug: bool = False
    #: Options of particular workloads (``sizes`` for ``large``; ``traces``,
    #: ``real_traces`` and ``panel`` for ``traces``), see ``Workload.configure``.
    workload_options: dict[str, Any] = field(default_factory=dict)


def select_backends(names: Sequence[str], exclude: Sequence[str]) -> list[type[Backend]]:
    """Backend classes named (all when ``names`` is empty), minus ``exclude``."""
    known = {cls.name: cls for cls in all_backends()}
    for name in [*names, *exclude]:
        if name not in known:
            raise KeyError(f"unknown backend {name!r} (known: {', '.join(known)})")
    chosen = [known[n] for n in dict.fromkeys(names)] if names else list(known.values())
    return [cls for cls in chosen if cls.name not in set(exclude)]


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _tag(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))[:80]


@contextlib.contextmanager
def _servers(
    options: RunOptions,
) -> Iterator[tuple[str | None, tuple[str, int] | None, dict[str, Any], bool]]:
    """Resolve the Redis and memcached endpoints, starting local servers if asked."""
    info: dict[str, Any] = {}
    if not options.start_servers:
        if options.redis_url:
            info["redis"] = f"given: {options.redis_url}"
        if options.memcached:
            info["memcached"] = f"given: {options.memcached[0]}:{options.memcached[1]}"
        yield options.redis_url, options.memcached, info, False
        return
    with started_servers(
        redis=options.redis_url is None, memcached=options.memcached is None
    ) as servers:
        redis_url = options.redis_url
        memcached = options.memcached
        red: LocalServer | None = servers.get("redis")
        mem: LocalServer | None = servers.get("memcached")
        if red is not None:
            redis_url = red.url
            info["redis"] = f"started: {red.version} on {red.url}"
        if mem is not None:
            memcached = ("127.0.0.1", mem.port)
            info["memcached"] = f"started: {mem.version} on 127.0.0.1:{mem.port}"
        for kind, err in start_errors.items():
            info[kind] = f"could not start: {err}"
        yield redis_url, memcached, info, True


def run(
    options: RunOptions, console: Console | None = None
) -> tuple[BenchResult, dict[str, list[Table]]]:
    """Run the selected workloads on the selected backends; return results and tables."""
    console = console or Console()
    names = list(options.workloads) or default_workloads()
    workloads: list[Workload] = [get_workload(n)(options.profile, options.seed) for n in names]
    for w in workloads:
        w.configure(dict(options.workload_options))
    backend_classes = select_backends(options.backends, options.exclude)
    started = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    t_start = time.perf_counter()
    base = options.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="nearcache-bench-", dir=base))
    run_id = f"{started:%Y%m%d%H%M%S}-{workdir.name[-6:]}"
    tables: dict[str, list[Table]] = {}
    try:
        with _servers(options) as (redis_url, memcached, server_info, owned):
            ctx = BackendContext(
                workdir=workdir,
                run_id=run_id,
                redis_url=redis_url,
                memcached=memcached,
                servers_owned=owned,
                options={
                    **({"nearcache_dir": options.nearcache_dir} if options.nearcache_dir else {}),
                    "debug": options.debug,
                },
            )
            statuses = _statuses(backend_classes, ctx)
            available = [cls for cls in backend_classes if _status(statuses, cls.name).available]
            tradeoffs = {cls.name: cls.tradeoff for cls in backend_classes if cls.tradeoff}
            result = BenchResult(
                command=options.command,
                started=started.isoformat(),
                profile={
                    "name": options.profile.name,
                    "repeats": options.profile.repeats,
                    "warmup": options.profile.warmup,
                    "run_seconds": options.profile.run_seconds,
                    "case_seconds": options.profile.case_seconds,
                    "seed": options.seed,
                },
                machine=machine_info(workdir),
                versions=package_versions(),
                backends=statuses,
                servers=server_info,
                reference=pick_reference(cls.name for cls in available) or "",
            )
            if options.print_tables:
                for line in terminal_header(result):
                    console.print(line, highlight=False)
                console.print()
            warning = load_warning(result.machine)
            if warning:
                result.machine["load_warning"] = warning
            for s in statuses:
                if not s.available and options.print_tables:
                    console.print(
                        f"[yellow]skipping {s.name}[/yellow]: {s.reason}", highlight=False
                    )
            plan = [
                (w, [cls for cls in available if w.skip_reason(cls) is None]) for w in workloads
            ]
            total = sum(len(w.cases()) * len(b) for w, b in plan)
            with _progress(console, options.progress) as progress:
                task = progress.add_task("starting", total=total)
                for w, runnable in plan:
                    wres = _run_workload(w, runnable, available, ctx, progress, task)
                    result.workloads.append(wres)
                    tables[w.name] = w.tables(wres, tradeoffs)
                    if options.print_tables:
                        progress.console.rule(f"{w.name}: {w.title}")
                        print_tables(progress.console, tables[w.name])
                    progress.refresh()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    result.duration_s = time.perf_counter() - t_start
    result.machine["loadavg_at_end"] = loadavg()
    return result, tables


def _statuses(classes: Sequence[type[Backend]], ctx: BackendContext) -> list[BackendStatus]:
    out = []
    for cls in classes:
        try:
            reason = cls.unavailable(ctx)
        except Exception as exc:
            reason = _one_line(exc)
        out.append(
            BackendStatus(
                name=cls.name,
                title=cls.title,
                scope=cls.scope.value,
                available=reason is None,
                reason=reason or "",
                version=cls.version(),
                tradeoff=cls.tradeoff,
            )
        )
    return out


def _status(statuses: Sequence[BackendStatus], name: str) -> BackendStatus:
    for s in statuses:
        if s.name == name:
            return s
    raise KeyError(name)


class _NullProgress:
    """Stands in for rich's Progress when progress display is off."""

    def __init__(self, console: Console) -> None:
        self.console = console

    def add_task(self, description: str, total: int) -> int:
        return 0

    def update(self, task: int, **kwargs: Any) -> None:
        return None

    def advance(self, task: int, advance: float = 1) -> None:
        return None

    def refresh(self) -> None:
        return None


@contextlib.contextmanager
def _progress(console: Console, enabled: bool) -> Iterator[Any]:
    if not enabled:
        yield _NullProgress(console)
        return
    # auto_refresh=False: no refresh thread, so forking worker processes is safe.
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        auto_refresh=False,
        transient=True,
    )
    with progress:
        yield progress


def _run_workload(
    w: Workload,
    runnable: Sequence[type[Backend]],
    available: Sequence[type[Backend]],
    ctx: BackendContext,
    progress: Any,
    task: int,
) -> WorkloadResult:
    t0 = time.perf_counter()
    w.prepare()
    wres = WorkloadResult(
        name=w.name, title=w.title, seed=w.seed, description=w.description, params=w.params()
    )
    for case in w.cases():
        cres = CaseResult(case=case.id, label=case.label, params=dict(case.params))
        for cls in available:
            reason = w.skip_reason(cls)
            if reason is not None:
                cres.skipped[cls.name] = reason
        for cls in runnable:
            progress.update(task, description=f"{w.name} {case.label}: {cls.name}")
            progress.refresh()
            backend: Backend | None = None
            try:
                backend = cls(ctx, w.capacity(case), _tag(w.name, case.id, cls.name))
                cres.measurements.append(w.measure(case, backend))
            except CaseSkipped as exc:
                cres.skipped[cls.name] = str(exc)
            except Exception as exc:
                cres.skipped[cls.name] = f"failed: {_one_line(exc)}"
                if ctx.options.get("debug"):
                    traceback.print_exc()
            finally:
                if backend is not None:
                    with contextlib.suppress(Exception):
                        backend.destroy()
            progress.advance(task)
            progress.refresh()
        progress.update(task, description=f"{w.name} {case.label}: extra rows")
        progress.refresh()
        cres.measurements.extend(w.extra_measurements(case, ctx, cres.skipped))
        wres.cases.append(cres)
    wres.duration_s = time.perf_counter() - t0
    return wres


def render(result: BenchResult) -> dict[str, list[Table]]:
    """Rebuild the tables of a result (for ``--load``)."""
    tradeoffs = {b.name: b.tradeoff for b in result.backends if b.tradeoff}
    out: dict[str, list[Table]] = {}
    for wres in result.workloads:
        try:
            cls = get_workload(wres.name)
        except KeyError:
            continue
        w = cls(PROFILES.get(str(result.profile.get("name")), PROFILES["default"]))
        out[wres.name] = w.tables(wres, tradeoffs)
    return out


def write_outputs(
    result: BenchResult,
    tables: dict[str, list[Table]],
    json_path: Path | None = None,
    markdown_path: Path | None = None,
    plot_dir: Path | None = None,
) -> list[Path]:
    """Write the JSON, the Markdown report and the charts that were asked for."""
    written: list[Path] = []
    if json_path is not None:
        result.write(json_path)
        written.append(json_path)
    if markdown_path is not None:
        markdown_path.parent.mkdir(parents=True, exist_ok=True)
        markdown_path.write_text(markdown_report(result, tables), encoding="utf-8")
        written.append(markdown_path)
    if plot_dir is not None:
        from .plots import matplotlib_missing

        reason = matplotlib_missing()
        if reason is not None:
            raise RuntimeError(f"--plot needs matplotlib: {reason}")
        for wres in result.workloads:
            cls = get_workload(wres.name)
            w = cls(PROFILES.get(str(result.profile.get("name")), PROFILES["default"]))
            written.extend(w.plot(wres, plot_dir))
    return written
