"""``e2e``: Django backends behind a real WSGI server, under a real HTTP load generator.

What a user switching ``CACHES`` sees: gunicorn (``-w 8``, sync and
gthread workers) serves a small Django site (:mod:`.e2e_site`) on a
loopback port, configured with the backend under test at its defaults (only
``BACKEND`` and ``LOCATION`` given, as a new user would), and ``wrk`` (a
separate process, from Debian's ``wrk`` package) loads it.  Each backend and
case gets a fresh server:

1. **warm-up** from a cold cache: :data:`WALKERS` client threads walk every
   URL of the view in the same order, so each key is missed by several
   requests at once, as when a site restarts under load;
2. **timed run**: ``wrk -t2 -c16 -d<seconds>s`` over random URLs;
3. figures: requests/s, latency p50/p99 (wrk's), errors (socket errors and
   non-2xx responses), hit ratio during the timed run, worker CPU per
   request (``/proc/<pid>/stat`` of the workers), computations at warm-up
   and how many of them were duplicates (a key computed again while its
   cache already held or was computing it), and memory held: the workers'
   RSS and PSS, and for file-backed stores the disk/tmpfs blocks of the
   store (``du``) against the bytes stored.

The site logs every computation to a per-process file, so duplicates are
counted the same way for every backend (per process for ``LocMemCache``,
whose cache is per process).  Cases: the fragments view (10 cached 1.6 KB
fragments of a pool of 2,000 per request, through ``get_or_set``), the page
view under Django's ``cache_page``, and the same under nearcache's
stampede-free ``cache_page`` (which locks through the backend's ``add`` on
other backends).  Besides the registered Django backends, each case has
rows for ``DummyCache`` (no cache), ``TieredNearCache`` over the run's
Redis, and a view that does no work (the ceiling).

The workload runs only when named (``nearcache bench e2e``) and is skipped,
with the reason, when gunicorn or wrk is missing.  Servers listen on
127.0.0.1 only and are stopped by PID, each phase bounded in time.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..backends.base import Backend, BackendContext, Capacity
from ..model import CaseResult, Measurement, WorkloadResult
from ..plots import barh_panels
from ..report import Table, fmt_bytes, fmt_int, fmt_ratio, pick_reference
from .base import Case, Workload

__all__ = ["E2e", "e2e_missing"]

LOOPBACK = "127.0.0.1"
SITE = "nearcache.bench.workloads.e2e_site:application"
#: Client threads of the warm-up, each walking every URL in the same order.
WALKERS = 4
NEARCACHE = "nearcache.contrib.django.NearCache"
DUMMY_BACKEND = "django.core.cache.backends.dummy.DummyCache"

_PARAMS: dict[str, dict[str, Any]] = {
    "tiny": {"workers": 2, "threads": 2, "seconds": 1, "connections": 4, "wrk_threads": 1},
    "quick": {"workers": 8, "threads": 4, "seconds": 3, "connections": 16, "wrk_threads": 2},
    "default": {"workers": 8, "threads": 4, "seconds": 10, "connections": 16, "wrk_threads": 2},
}

#: Registered bench backends that are Django cache backends, and how a new
#: user would configure each (``None``: no LOCATION needed).
DJANGO_BACKENDS: dict[str, str] = {
    "django-nearcache": NEARCACHE,
    "django-locmem": "django.core.cache.backends.locmem.LocMemCache",
    "django-filebased": "django.core.cache.backends.filebased.FileBasedCache",
    "django-redis": "django.core.cache.backends.redis.RedisCache",
    "django-memcached": "django.core.cache.backends.memcached.PyMemcacheCache",
    "django-diskcache": "diskcache.DjangoCache",
    "django-db": "django.core.cache.backends.db.DatabaseCache",
}
#: Rows the workload adds itself: no cache, the tiered backend, the ceiling.
DUMMY = "django-dummy"
TIERED = "django-tiered-redis"
NOWORK = "no-work view"
OURS = frozenset({"django-nearcache", TIERED})

_WRK_SCRIPT = """
local counter = 0
local threads = 0
function setup(thread)
  thread:set("id", threads)
  threads = threads + 1
end
function init(args)
  math.randomseed(2010 + id)
end
request = function()
  local kind = "%(kind)s"
  local p
  if kind == "fragments" then
    p = "/fragments/" .. math.random(0, 999999999) .. "/"
  elseif kind == "page" then
    p = "/page/" .. math.random(0, %(pages)d - 1) .. "/"
  else
    p = "/nowork/"
  end
  return wrk.format("GET", p)
end
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "E2E-JSON {\\"requests\\": %%d, \\"duration_us\\": %%d, \\"bytes\\": %%d, "
    .. "\\"connect\\": %%d, \\"read\\": %%d, \\"write\\": %%d, \\"status\\": %%d, "
    .. "\\"timeout\\": %%d, \\"p50_us\\": %%d, \\"p90_us\\": %%d, \\"p99_us\\": %%d, "
    .. "\\"max_us\\": %%d}\\n",
    summary.requests, summary.duration, summary.bytes, e.connect, e.read, e.write,
    e.status, e.timeout, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.max))
end
"""


def e2e_missing() -> str | None:
    """Why the workload cannot run here (None: gunicorn and wrk are available)."""
    missing = []
    if importlib.util.find_spec("gunicorn") is None:
        missing.append("gunicorn (pip install gunicorn)")
    if shutil.which("wrk") is None:
        missing.append("wrk (apt-get install wrk)")
    if importlib.util.find_spec("django") is None:
        missing.append("Django")
    return f"needs {' and '.join(missing)}" if missing else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


# ----------------------------------------------------------------- /proc readers


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def _cpu_ticks(pid: int) -> int:
    """utime + stime of ``pid`` in clock ticks (0 if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return 0
    return int(fields[11]) + int(fields[12])


def _memory(pid: int) -> tuple[int, int]:
    """(RSS, PSS) of ``pid`` in bytes, from smaps_rollup (0, 0 if unreadable)."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1]) * 1024
            elif line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    except OSError:
        pass
    return rss, pss


def disk_usage(path: Path) -> tuple[int, int]:
    """(blocks held, apparent bytes) of a file or a directory tree, as ``du`` counts."""
    held = apparent = 0
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in paths:
        with contextlib.suppress(OSError):
            st = p.stat()
            held += st.st_blocks * 512
            apparent += st.st_size
    return held, apparent


# --------------------------------------------------------------------- the server


@dataclass
class Site:
    """What one server run serves: the CACHES setting and the page decorator."""

    name: str
    caches: dict[str, Any]
    page_decorator: str = "django"
    store_path: Path | None = None
    sqlite: Path | None = None


class Gunicorn:
    """A gunicorn master serving the e2e site on a loopback port, stopped by PID."""

    def __init__(
        self, site: Site, worker_class: str, workers: int, threads: int, log_dir: Path
    ) -> None:
        self.port = _free_port()
        self.workers = workers
        env = dict(os.environ)
        env.update(
            {
                "NEARCACHE_E2E_CACHES": json.dumps(site.caches),
                "NEARCACHE_E2E_LOG_DIR": str(log_dir),
                "NEARCACHE_E2E_PAGE_DECORATOR": site.page_decorator,
                "DJANGO_SETTINGS_MODULE": "nearcache.bench.workloads.e2e_site",
            }
        )
        if site.sqlite is not None:
            env["NEARCACHE_E2E_SQLITE"] = str(site.sqlite)
        self.env = env
        argv = [
            sys.executable, "-m", "gunicorn", SITE,
            "--bind", f"{LOOPBACK}:{self.port}",
            "--workers", str(workers),
            "--worker-class", worker_class,
            "--timeout", "60",
            "--graceful-timeout", "3",
            "--log-level", "warning",
            "--worker-tmp-dir", "/dev/shm" if Path("/dev/shm").is_dir() else tempfile.gettempdir(),
        ]  # fmt: skip
        if worker_class == "gthread":
            argv += ["--threads", str(threads)]
        self.argv = argv
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            argv, env=env, stdout=subprocess.DEVNULL, stderr=self.stderr, start_new_session=True
        )

    def wait_ready(self, timeout: float = 60.0) -> list[int]:
        """Wait until every worker is up and the site answers; return the worker PIDs."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"gunicorn exited with status {self.proc.returncode}: {self.log()}"
                )
            workers = _children(self.proc.pid)
            if len(workers) >= self.workers and fetch(self.port, "/nowork/")[0] == 200:
                return workers
            time.sleep(0.1)
        raise RuntimeError(f"gunicorn not ready within {timeout:.0f} s: {self.log()}")

    def worker_pids(self) -> list[int]:
        return _children(self.proc.pid)

    def log(self) -> str:
        self.stderr.seek(0)
        text = self.stderr.read().decode("utf-8", "replace").strip().splitlines()
        return " | ".join(text[-3:])[:400]

    def stop(self) -> None:
        """SIGTERM the master (it stops its workers), SIGKILL what is left, by PID."""
        workers = self.worker_pids()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.stderr.close()


def fetch(port: int, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    """One GET over a new loopback connection: (status, body); (0, b"") on a socket error."""
    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        conn.close()


def warm_up(port: int, paths: list[str], walkers: int = WALKERS, timeout: float = 120.0) -> int:
    """``walkers`` threads each GET every path in order, starting together; return errors."""
    errors = [0]
    barrier = threading.Barrier(walkers)
    deadline = time.monotonic() + timeout

    def walk() -> None:
        barrier.wait()
        for p in paths:
            if time.monotonic() > deadline:
                errors[0] += 1
                return
            if fetch(port, p)[0] != 200:
                errors[0] += 1

    threads = [threading.Thread(target=walk, daemon=True) for _ in range(walkers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    return errors[0]


def run_wrk(port: int, kind: str, seconds: int, connections: int, threads: int) -> dict[str, Any]:
    """Load the site with wrk for ``seconds``; return its summary (latencies in µs)."""
    from .e2e_site import PAGES

    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(_WRK_SCRIPT % {"kind": kind, "pages": PAGES})
    try:
        argv = [
            "wrk", f"-t{threads}", f"-c{connections}", f"-d{seconds}s", "--timeout", "10s",
            "-s", script.name, f"http://{LOOPBACK}:{port}",
        ]  # fmt: skip
        out = subprocess.run(
            argv, capture_output=True, text=True, timeout=seconds + 60, check=False
        )
    finally:
        os.unlink(script.name)
    match = re.search(r"^E2E-JSON (.*)$", out.stdout, re.MULTILINE)
    if match is None:
        raise RuntimeError(f"wrk gave no summary (status {out.returncode}): {out.stderr[-300:]}")
    summary: dict[str, Any] = json.loads(match.group(1))
    summary["argv"] = " ".join([*argv[:-3], f"http://{LOOPBACK}:PORT"])
    return summary


def read_computes(log_dir: Path) -> list[tuple[int, str]]:
    """Every computation logged so far: (worker pid, what)."""
    out: list[tuple[int, str]] = []
    for f in sorted(log_dir.glob("computes-*")):
        pid = int(f.name.rsplit("-", 1)[1])
        out.extend((pid, line) for line in f.read_text().split())
    return out


def _duplicated(computes: list[tuple[int, str]], per_process: bool) -> list[str]:
    """The keys computed more than once (per process for local caches)."""
    seen: set[tuple[int, str]] = set()
    again = []
    for pid, what in computes:
        key = (pid if per_process else 0, what)
        if key in seen:
            again.append(what)
        seen.add(key)
    return again


def duplicates(computes: list[tuple[int, str]], per_process: bool) -> int:
    """Computations of a key its cache had already computed (per process for local caches)."""
    seen = {(pid if per_process else 0, what) for pid, what in computes}
    return len(computes) - len(seen)


# ------------------------------------------------------------------- the workload


class E2e(Workload):
    """Django backends under gunicorn and wrk: req/s, latency, hit ratio, CPU, memory."""

    name = "e2e"
    title = "Django site under gunicorn, loaded by wrk: every Django backend at its defaults"
    seed = "a user's end-to-end test (gunicorn -w 8, wrk -t2 -c16)"
    description = (
        "gunicorn (-w 8, sync and gthread workers) serves a small Django site on loopback, "
        "configured with each Django backend at its defaults; a warm-up where 4 clients walk "
        "every URL in the same order (each key missed by several requests at once), then wrk "
        "over random URLs. Fragments view: 10 cached 1.6 KB fragments of a pool of 2,000 per "
        "request, through get_or_set; page view: a 2 ms page under Django's cache_page, and "
        "under nearcache's stampede-free cache_page. Rows for DummyCache (no cache), "
        "TieredNearCache over Redis and a view that does no work (the ceiling)."
    )
    #: Not part of a plain ``nearcache bench``: needs gunicorn and wrk, and minutes.
    only_when_named: ClassVar[bool] = True

    def params(self) -> dict[str, Any]:
        from . import e2e_site

        return {
            **_PARAMS[self.profile.name],
            "walkers": WALKERS,
            "fragments": e2e_site.FRAGMENTS,
            "per_request": e2e_site.PER_REQUEST,
            "pages": e2e_site.PAGES,
            "gunicorn": _version("gunicorn"),
            "wrk": _wrk_version(),
        }

    def cases(self) -> list[Case]:
        out = []
        for worker_class in ("sync", "gthread"):
            for view, label in (
                ("fragments", "fragments view"),
                ("page", "cache_page view (Django's cache_page)"),
                ("page-sf", "cache_page view (nearcache's stampede-free cache_page)"),
            ):
                out.append(
                    Case(
                        f"{worker_class}-{view}",
                        f"{label}, gunicorn {worker_class}",
                        {"worker_class": worker_class, "view": view},
                    )
                )
        return out

    def capacity(self, case: Case) -> Capacity:
        return Capacity()

    def skip_reason(self, backend: type[Backend]) -> str | None:
        missing = e2e_missing()
        if missing is not None:
            return missing
        if backend.name not in DJANGO_BACKENDS:
            return "not a Django cache backend"
        return None

    # -- one run -----------------------------------------------------------------

    def _site(self, name: str, ctx: BackendContext, tag: str, view: str) -> Site:
        decorator = "nearcache" if view == "page-sf" else "django"
        scratch = ctx.workdir / f"e2e-{tag}"
        scratch.mkdir(parents=True, exist_ok=True)
        prefix = f"nearcache-e2e:{ctx.run_id}:{tag}"
        if name == DUMMY:
            return Site(
                name, {"default": {"BACKEND": DUMMY_BACKEND}},
                decorator,
            )  # fmt: skip
        if name == TIERED:
            l1 = _shm_path(ctx, f"e2e-{tag}-l1")
            caches = {
                "default": {
                    "BACKEND": "nearcache.contrib.django.TieredNearCache",
                    "LOCATION": f"{ctx.redis_url}?prefix={prefix}:",
                    "OPTIONS": {"l1": {"driver": "nearcache", "path": str(l1)}},
                }
            }
            return Site(name, caches, decorator, store_path=l1)
        backend = DJANGO_BACKENDS[name]
        entry: dict[str, Any] = {"BACKEND": backend}
        store: Path | None = None
        sqlite: Path | None = None
        if name == "django-nearcache":
            store = _shm_path(ctx, f"e2e-{tag}")
            entry["LOCATION"] = str(store)
        elif name in ("django-filebased", "django-diskcache"):
            store = scratch / "store"
            entry["LOCATION"] = str(store)
        elif name == "django-redis":
            entry["LOCATION"] = ctx.redis_url
            entry["KEY_PREFIX"] = prefix
        elif name == "django-memcached":
            assert ctx.memcached is not None
            entry["LOCATION"] = f"{ctx.memcached[0]}:{ctx.memcached[1]}"
            entry["KEY_PREFIX"] = prefix
        elif name == "django-db":
            entry["LOCATION"] = "e2e_cache"
            sqlite = scratch / "db.sqlite3"
        return Site(name, {"default": entry}, decorator, store_path=store, sqlite=sqlite)

    def _run(self, site: Site, case: Case, ctx: BackendContext, tag: str) -> Measurement:
        p = _PARAMS[self.profile.name]
        view = str(case.params["view"])
        worker_class = str(case.params["worker_class"])
        log_dir = ctx.workdir / f"e2e-{tag}" / "computes"
        log_dir.mkdir(parents=True, exist_ok=True)
        if site.sqlite is not None:
            _create_cache_table(site)
        server = Gunicorn(site, worker_class, p["workers"], p["threads"], log_dir)
        try:
            server.wait_ready()
            from . import e2e_site

            kind = "page" if view.startswith("page") else view
            if site.name == NOWORK:
                kind = "nowork"
                paths: list[str] = []
            elif kind == "fragments":
                blocks = e2e_site.FRAGMENTS // e2e_site.PER_REQUEST
                paths = [f"/fragments/block/{b}/" for b in range(blocks)]
            else:
                paths = [f"/page/{n}/" for n in range(e2e_site.PAGES)]
            probe = paths[0] if paths else "/nowork/"
            status, body = fetch(server.port, probe)
            if status != 200:
                raise RuntimeError(f"GET {probe}: status {status}: {body[:200]!r} {server.log()}")
            # The probe request is the warm-up's first (its computations count there).
            t0 = time.perf_counter()
            warm_errors = warm_up(server.port, paths) if paths else 0
            warm_s = time.perf_counter() - t0
            warm = read_computes(log_dir)
            workers = server.worker_pids()
            cpu0 = sum(_cpu_ticks(pid) for pid in workers)
            summary = run_wrk(server.port, kind, p["seconds"], p["connections"], p["wrk_threads"])
            cpu1 = sum(_cpu_ticks(pid) for pid in workers)
            after = read_computes(log_dir)
            mem = [_memory(pid) for pid in server.worker_pids()]
            master_rss, master_pss = _memory(server.proc.pid)
            store_held, store_apparent = (
                disk_usage(site.store_path) if site.store_path is not None else (0, 0)
            )
            stats = _nearcache_stats(site)
        finally:
            server.stop()
        requests = float(summary["requests"])
        duration_s = summary["duration_us"] / 1e6
        lookups = requests * (e2e_site.PER_REQUEST if kind == "fragments" else 1)
        run_computes = len(after) - len(warm)
        per_process = site.name == "django-locmem"
        errors = sum(summary[k] for k in ("connect", "read", "write", "status", "timeout"))
        ticks = os.sysconf("SC_CLK_TCK")
        metrics = {
            "req_per_s": requests / duration_s if duration_s else 0.0,
            "requests": requests,
            "p50_ms": summary["p50_us"] / 1000,
            "p90_ms": summary["p90_us"] / 1000,
            "p99_ms": summary["p99_us"] / 1000,
            "max_ms": summary["max_us"] / 1000,
            "errors": float(errors),
            # Requests in flight when wrk stops computed without being counted: clamp at 0.
            "hit_ratio": max(0.0, 1 - run_computes / lookups)
            if lookups and kind != "nowork"
            else 0.0,
            "cpu_us_per_request": (cpu1 - cpu0) / ticks * 1e6 / requests if requests else 0.0,
            "warmup_computes": float(len(warm)),
            "warmup_duplicates": float(duplicates(warm, per_process)),
            "warmup_errors": float(warm_errors),
            "warmup_s": warm_s,
            "run_computes": float(run_computes),
            "workers_rss_bytes": float(sum(m[0] for m in mem)),
            "workers_pss_bytes": float(sum(m[1] for m in mem)),
            "master_rss_bytes": float(master_rss),
            "master_pss_bytes": float(master_pss),
            "store_held_bytes": float(store_held),
            "store_apparent_bytes": float(store_apparent),
        }
        if stats:
            metrics["stored_bytes"] = float(stats.get("live_bytes", 0))
            metrics["stored_items"] = float(stats.get("items", 0))
            for key in ("get_or_set_computes", "get_or_set_waits", "get_or_set_fallbacks",
                        "page_renders", "page_waits", "page_fallbacks"):  # fmt: skip
                if key in stats:
                    metrics[key] = float(stats[key])
        info = {
            "caches": site.caches,
            "page_decorator": site.page_decorator,
            "gunicorn": " ".join(server.argv[2:]).replace(str(server.port), "PORT"),
            "wrk": summary["argv"],
            "socket_errors": {k: summary[k] for k in ("connect", "read", "write", "timeout")},
            "non_2xx": summary["status"],
            "workers": len(mem),
            "warmup_duplicated": _duplicated(warm, per_process)[:20],
        }
        return Measurement(backend=site.name, metrics=metrics, runs=[], info=info)

    def measure(self, case: Case, backend: Backend) -> Measurement:
        tag = f"{case.id}-{backend.name}"
        site = self._site(backend.name, backend.ctx, tag, str(case.params["view"]))
        try:
            return self._run(site, case, backend.ctx, tag)
        finally:
            _clean(site, backend.ctx)

    def extra_measurements(
        self, case: Case, ctx: BackendContext, skipped: dict[str, str]
    ) -> list[Measurement]:
        """DummyCache, TieredNearCache over Redis and the no-work view, beside the backends."""
        missing = e2e_missing()
        extras = [DUMMY, TIERED, NOWORK]
        if missing is not None:
            for name in extras:
                skipped[name] = missing
            return []
        out = []
        for name in extras:
            if name == TIERED and not ctx.redis_url:
                skipped[name] = "no Redis server (use --start-servers or --redis-url)"
                continue
            tag = f"{case.id}-{name}".replace(" ", "_")
            site = (
                Site(
                    NOWORK, {"default": {"BACKEND": "django.core.cache.backends.dummy.DummyCache"}}
                )
                if name == NOWORK
                else self._site(name, ctx, tag, str(case.params["view"]))
            )
            try:
                out.append(self._run(site, case, ctx, tag))
            except Exception as exc:
                skipped[name] = f"failed: {type(exc).__name__}: {exc}".splitlines()[0][:200]
            finally:
                _clean(site, ctx)
        return out

    # -- output ------------------------------------------------------------------

    def tables(self, result: WorkloadResult, tradeoffs: dict[str, str]) -> list[Table]:
        out = []
        for case in result.cases:
            out.append(_case_table(case))
        goals = _goal_notes(result)
        if goals:
            out.append(
                Table(
                    "e2e: goals (ratios within this run)",
                    ["goal", "measured", "met"],
                    goals,
                )
            )
        return out

    def plot(self, result: WorkloadResult, outdir: Path) -> list[Path]:
        if not result.cases:
            return []
        panels = []
        for case in result.cases:
            pairs = [(m.backend, m.metrics.get("req_per_s", 0.0)) for m in case.measurements]
            panels.append((case.label, pairs))
        network = {"django-redis", "django-memcached"}
        return [
            barh_panels(
                outdir / "e2e.png",
                "e2e: requests/s, gunicorn -w 8 + wrk -c16 on loopback (higher is better)",
                panels,
                xlabel="requests per second",
                ours=set(OURS),
                network=network,
                log=False,
                columns=3,
            )
        ]


# ----------------------------------------------------------------------- helpers


def _version(dist: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return ""


def _wrk_version() -> str:
    if shutil.which("wrk") is None:
        return ""
    out = subprocess.run(["wrk", "-v"], capture_output=True, text=True, timeout=10, check=False)
    text = (out.stdout or out.stderr).strip().splitlines()
    return text[0] if text else ""


def _shm_path(ctx: BackendContext, name: str) -> Path:
    directory = ctx.options.get("nearcache_dir")
    if directory is None:
        from nearcache import _native

        directory = _native.default_directory()
    return Path(str(directory)) / f"bench-{ctx.run_id}-{name}"


def _nearcache_stats(site: Site) -> dict[str, Any]:
    """The nearcache backend's stats (entries, stored bytes, stampede counters)."""
    if site.name not in OURS or site.store_path is None or not site.store_path.exists():
        return {}
    from nearcache import Cache

    cache = Cache(path=str(site.store_path))
    try:
        stats: dict[str, Any] = dict(cache.stats())
        for counter in ("get_or_set_computes", "get_or_set_waits", "get_or_set_fallbacks",
                        "page_renders", "page_waits", "page_fallbacks"):  # fmt: skip
            stats[counter] = cache.incr("nearcache.django.stats:" + counter, 0, 0, 0)
        # The counters and locks are entries too: stored bytes are Django's.
        return stats
    finally:
        cache.close()


def _create_cache_table(site: Site) -> None:
    env = dict(os.environ)
    env.update(
        {
            "NEARCACHE_E2E_CACHES": json.dumps(site.caches),
            "NEARCACHE_E2E_SQLITE": str(site.sqlite),
            "DJANGO_SETTINGS_MODULE": "nearcache.bench.workloads.e2e_site",
        }
    )
    code = (
        "import django; django.setup(); "
        "from django.core.management import call_command; call_command('createcachetable')"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=120)


def _clean(site: Site, ctx: BackendContext) -> None:
    """Remove what the run stored (files, server-side keys)."""
    if site.store_path is not None:
        with contextlib.suppress(OSError):
            if site.store_path.is_dir():
                shutil.rmtree(site.store_path, ignore_errors=True)
            else:
                site.store_path.unlink()
    entry = site.caches.get("default", {})
    prefix = entry.get("KEY_PREFIX")
    with contextlib.suppress(Exception):
        if site.name == "django-redis" and prefix and ctx.redis_url:
            from ..backends.network import redis_delete_prefix

            redis_delete_prefix(ctx.redis_url, f"{prefix}:")
        if site.name == TIERED and ctx.redis_url:
            from ..backends.network import redis_delete_prefix

            location = str(entry.get("LOCATION", ""))
            redis_delete_prefix(ctx.redis_url, location.split("prefix=", 1)[1])


def _fmt_ms(ms: float) -> str:
    return f"{ms:.1f} ms" if ms >= 1 else f"{ms * 1000:.0f} µs"


def _case_table(case: CaseResult) -> Table:
    ms = sorted(case.measurements, key=lambda m: -m.metrics.get("req_per_s", 0.0))
    reference = pick_reference(m.backend for m in ms)
    ref = case.get(reference) if reference else None
    cols = [
        "backend", "req/s", "p50", "p99", "errors", "hit ratio", "CPU/request",
        "warm-up computes", "duplicates", "workers PSS", "store held (du)", "stored",
    ]  # fmt: skip
    if ref is not None:
        cols.insert(2, f"vs {reference}")
    rows = []
    for m in ms:
        mm = m.metrics
        nowork = m.backend == NOWORK
        row = [
            m.backend,
            fmt_int(mm.get("req_per_s", 0.0)),
            _fmt_ms(mm.get("p50_ms", 0.0)),
            _fmt_ms(mm.get("p99_ms", 0.0)),
            fmt_int(mm.get("errors", 0.0)),
            "-" if nowork else f"{mm.get('hit_ratio', 0.0):.3f}",
            f"{mm.get('cpu_us_per_request', 0.0):,.0f} µs",
            "-" if nowork else fmt_int(mm.get("warmup_computes", 0.0)),
            "-" if nowork else fmt_int(mm.get("warmup_duplicates", 0.0)),
            fmt_bytes(mm.get("workers_pss_bytes", 0.0)),
            fmt_bytes(mm["store_held_bytes"]) if mm.get("store_held_bytes") else "-",
            fmt_bytes(mm["stored_bytes"])
            if mm.get("stored_bytes")
            else (fmt_bytes(mm["store_apparent_bytes"]) if mm.get("store_apparent_bytes") else "-"),
        ]
        if ref is not None:
            theirs = ref.metrics.get("req_per_s", 0.0)
            mine = mm.get("req_per_s", 0.0)
            row.insert(2, fmt_ratio(theirs / mine) if mine and theirs else "-")
        rows.append(row)
    notes = [
        "req/s, p50, p99: wrk's figures for the timed run; errors: socket errors and non-2xx "
        "responses; hit ratio: 1 - computations / cache lookups during the timed run; "
        "CPU/request: user+system CPU of the gunicorn workers over requests served; "
        "duplicates: warm-up computations of a key its cache already held or was computing "
        "(per process for django-locmem); workers PSS: proportional set size of the workers "
        "(shared mappings split between them); store held: blocks of the store's file or "
        "directory (du); stored: bytes of the entries (nearcache's live_bytes, else the "
        "files' apparent size).",
        f"'vs {reference}' > 1: {reference} serves that many times the row's requests per second.",
        "Each row is one warm-up and one timed run on a fresh server (no repeats, whatever the "
        "profile says); rows run one after another, so a changing load on the machine shows as "
        "noise between rows.",
    ]
    for name, reason in sorted(case.skipped.items()):
        if reason != "not a Django cache backend":
            notes.append(f"{name} skipped: {reason}")
    return Table(f"e2e {case.label}", cols, rows, right=set(range(1, len(cols))), notes=notes)


def _goal_notes(result: WorkloadResult) -> list[list[str]]:
    rows = []
    for case in result.cases:
        ours = case.get("django-nearcache")
        if ours is None:
            continue
        om = ours.metrics
        locmem = case.get("django-locmem")
        redis = case.get("django-redis")
        if locmem is not None:
            lm = locmem.metrics
            ok = om["req_per_s"] >= lm["req_per_s"] and om["hit_ratio"] >= lm["hit_ratio"]
            rows.append(
                [
                    f"{case.case}: NearCache vs LocMemCache, defaults (req/s, hit ratio)",
                    f"{om['req_per_s'] / lm['req_per_s']:.2f}x, "
                    f"{om['hit_ratio']:.3f} vs {lm['hit_ratio']:.3f}",
                    _yes(ok),
                ]
            )
        if case.params.get("view") in ("fragments", "page-sf"):
            dup = om.get("warmup_duplicates", 0.0)
            rows.append(
                [
                    f"{case.case}: NearCache warm-up duplicates",
                    fmt_int(dup),
                    "yes" if dup == 0 else "no",
                ]
            )
        if case.params.get("view") == "fragments":
            if redis is not None:
                r = om["req_per_s"] / redis.metrics["req_per_s"]
                rows.append(
                    [
                        f"{case.case}: NearCache / RedisCache req/s (>= 1.8)",
                        f"{r:.2f}x",
                        "yes" if r >= 1.8 else "no",
                    ]
                )
            if locmem is not None:
                r = om["req_per_s"] / locmem.metrics["req_per_s"]
                rows.append(
                    [
                        f"{case.case}: NearCache / LocMemCache req/s (>= 1.1)",
                        f"{r:.2f}x",
                        "yes" if r >= 1.1 else "no",
                    ]
                )
    return rows


def _yes(ok: bool) -> str:
    return "yes" if ok else "no"
