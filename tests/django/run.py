#!/usr/bin/env python3
"""Run Django's own cache test suite against nearcache's Django backends.

For each pinned Django version (:data:`PINNED_VERSIONS`) this script

1. downloads Django's source distribution with
   ``pip download --no-binary :all: --no-deps django==<version>`` into a cache
   directory outside the repository (``$NEARCACHE_DJANGO_CACHE``, default
   ``~/.cache/nearcache/django-tests``) and extracts its ``tests/`` directory
   there (Django's test files are never copied into this repository);
2. makes a virtualenv there with exactly that Django: with the running
   interpreter, one virtualenv per running environment, whose ``.pth`` file
   adds the running environment's site-packages after its own (so nearcache,
   redis and pymemcache come from the environment running this script, be it
   a virtualenv or not), or, when that Django needs a newer Python, with the
   oldest suitable interpreter found, the client libraries from PyPI and
   nearcache built from this checkout;
3. runs Django's ``runtests.py`` twice, in parallel with the other versions,
   each run with its own redis-server and memcached on free loopback ports
   (stopped by PID afterwards): once on Django's ``cache`` tests (with
   Django's own Redis and pymemcache backends pointed at those servers), once
   on ``nearcache_djtests.tests`` (subclasses of Django's ``BaseCacheTests``
   for nearcache's backends), with a runner that records every outcome;
4. prints a summary per version, the failures with their tracebacks, and one
   closing line ``django-cache-suite: N passed, N failed, N skipped``.

Exit status 0 when every test passed.  Skips are allowed in Django's own
classes (backends that are not installed, such as pylibmc) and, in
nearcache's classes, only for the tests listed in ``NOT_APPLICABLE``.

Usage::

    tests/django/run.sh                          # the pinned versions
    tests/django/run.sh --django 5.2.19          # one version
    tests/django/run.sh --group nearcache -k cull
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import importlib.util
import json
import os
import shutil
import site
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The Django versions users run now, pinned exactly, with the oldest Python
# each supports: the current release, the current LTS and the previous LTS.
# Bump them when Django releases (`pip index versions django --python-version 3.12`).
PINNED_VERSIONS: dict[str, tuple[int, int]] = {
    "6.1.3": (3, 12),  # current release
    "5.2.19": (3, 10),  # current LTS
    "4.2.30": (3, 8),  # previous LTS
}
# Installed beside Django in a virtualenv of another interpreter than this one
# (nearcache itself is then built from this checkout into it).
FOREIGN_DEPS = ("redis>=5", "pymemcache>=4", "zstandard>=0.22", "msgpack>=1.0", "rich>=13")

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
# Test suites (classes in nearcache_djtests.tests) run by default.
DEFAULT_SUITES = ("nearcache", "nearcache-async", "tiered-redis", "tiered-memcached")
ALL_SUITES = (*DEFAULT_SUITES, "selfcheck-locmem")
# Test ids of nearcache's own classes start with this; their skips count as
# failures unless the test is listed in NOT_APPLICABLE (tests.py), whose skip
# reasons start with NOT_APPLICABLE_MARK.
OURS = "nearcache_djtests."
NOT_APPLICABLE_MARK = "not applicable: "


def log(message: str) -> None:
    """Print a progress line to stderr."""
    print(f"[django-suite] {message}", file=sys.stderr, flush=True)


def cache_root(arg: str | None) -> Path:
    """Return the directory holding sdists, extracted tests and virtualenvs."""
    if arg:
        return Path(arg).expanduser().resolve()
    env = os.environ.get("NEARCACHE_DJANGO_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nearcache" / "django-tests"


def run(cmd: list[str], **kwargs: Any) -> None:
    """Run a command, raising with its output when it fails."""
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(
            f"command failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stdout}\n{proc.stderr}"
        )


def fetch_tests(version: str, root: Path, python: str) -> Path:
    """Download Django's sdist and extract its ``tests/``; return that directory.

    ``python`` runs pip: one whose version the Django release supports (pip
    only offers a release to interpreters it declares support for).
    """
    tests_dir = root / f"django-{version}" / "tests"
    if (tests_dir / "runtests.py").is_file() and (tests_dir / "cache" / "tests.py").is_file():
        return tests_dir
    sdists = root / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    archives = sorted(sdists.glob(f"[Dd]jango-{version}.tar.gz"))
    if not archives:
        log(f"downloading the Django {version} source distribution")
        run(
            [
                python,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--disable-pip-version-check",
                f"django=={version}",
                "-d",
                str(sdists),
            ]
        )
        archives = sorted(sdists.glob(f"[Dd]jango-{version}.tar.gz"))
    if not archives:
        raise RuntimeError(f"pip download left no Django-{version}.tar.gz in {sdists}")
    staging = Path(tempfile.mkdtemp(prefix=f"django-{version}-", dir=root))
    try:
        with tarfile.open(archives[0]) as tar:
            top = f"{tar.getnames()[0].split('/')[0]}/tests/"
            members = [m for m in tar.getmembers() if m.name.startswith(top)]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, members=members, filter="data")
            else:  # Python < 3.11.4: keep plain files and directories inside tests/
                safe = [
                    m
                    for m in members
                    if (m.isfile() or m.isdir())
                    and not Path(m.name).is_absolute()
                    and ".." not in Path(m.name).parts
                ]
                tar.extractall(staging, members=safe)
        shutil.rmtree(tests_dir.parent, ignore_errors=True)
        (staging / top.rstrip("/")).parent.rename(tests_dir.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tests_dir


def python_version(executable: str) -> tuple[int, int] | None:
    """The (major, minor) version of a Python executable, or None if it does not run."""
    try:
        out = subprocess.run(
            [executable, "-c", "import sys, venv; print(*sys.version_info[:2])"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (int(out[0]), int(out[1])) if len(out) == 2 else None


class NoInterpreter(RuntimeError):
    """No installed Python is recent enough for a Django version."""


def find_python(minimum: tuple[int, int]) -> str:
    """This interpreter if it is recent enough, else the oldest installed one that is."""
    if sys.version_info[:2] >= minimum:
        return sys.executable
    candidates = [shutil.which(f"python3.{minor}") for minor in range(minimum[1], 20)]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    candidates += [str(p) for p in sorted(pyenv_root.glob("versions/3.*/bin/python3"))]
    candidates += [
        str(p) for p in sorted(Path("/usr/bin").glob("python3.*")) if p.name[8:].isdigit()
    ]
    found: dict[tuple[int, int], str] = {}
    for candidate in candidates:
        if candidate:
            version = python_version(candidate)
            if version and version >= minimum:
                found.setdefault(version, candidate)
    if not found:
        wanted = ".".join(map(str, minimum))
        raise NoInterpreter(f"no Python >= {wanted} found (looked on PATH and in {pyenv_root})")
    return found[min(found)]


# The file, in a Django virtualenv's site-packages, that adds the running
# environment's site-packages (see running_site_dirs).
RUNNING_ENV_PTH = "nearcache-running-env.pth"


def running_site_dirs() -> list[str]:
    """The site-packages directories of the running interpreter, in its order.

    In a virtualenv these are the virtualenv's (and, if it was made with
    ``--system-site-packages``, the base interpreter's after them); outside
    one, the interpreter's own; the user site-packages last when enabled.
    """
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE and os.path.isdir(site.getusersitepackages()):
        dirs.append(site.getusersitepackages())
    return dirs


def write_running_env_pth(venv_python: Path) -> Path:
    """Make the virtualenv of ``venv_python`` see the running environment's packages.

    A ``.pth`` line that starts with ``import`` is executed at start-up:
    ``site.addsitedir`` appends each directory of :func:`running_site_dirs`
    after the virtualenv's own site-packages (so its pinned Django wins) and
    processes the ``.pth`` files there too (an editable install of nearcache
    is one).  ``--system-site-packages`` is not enough: it exposes the *base*
    interpreter's packages, not those of a virtualenv running this script.
    Returns the path of the ``.pth`` file.
    """
    purelib = subprocess.run(
        [str(venv_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    dirs = running_site_dirs()
    pth = Path(purelib) / RUNNING_ENV_PTH
    pth.write_text(
        f"import site; list(map(site.addsitedir, {dirs!r}))\n",
        encoding="utf-8",
    )
    return pth


def environment_tag() -> str:
    """A short name for the running environment (virtualenvs made for it carry it)."""
    digest = hashlib.sha256(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return f"env-{digest}"


def local_nearcache() -> Path:
    """The directory the running interpreter imports nearcache from."""
    spec = importlib.util.find_spec("nearcache")
    if spec is None or spec.origin is None:
        raise RuntimeError(
            f"nearcache is not importable by {sys.executable}; install it first (pip install -e .)"
        )
    return Path(spec.origin).resolve().parent


def make_venv(version: str, root: Path, base: str) -> Path:
    """Return the Python of a virtualenv with exactly Django ``version`` installed.

    With this interpreter, the virtualenv (one per running environment) sees
    the running environment's site-packages (nearcache, redis, pymemcache...)
    through :func:`write_running_env_pth`, and must import nearcache from the
    same place as this interpreter.  With another one (Django needs a newer
    Python), it gets those packages from PyPI and nearcache built from this
    checkout.
    """
    major, minor = python_version(base) or (0, 0)
    foreign = base != sys.executable
    name = f"django-{version}-py{major}{minor}"
    if not foreign:
        name += f"-{environment_tag()}"
    venv = root / "venvs" / name
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import django; print(django.get_version())"]
    got = ""
    if python.exists():
        got = subprocess.run(check, capture_output=True, text=True, check=False).stdout.strip()
        if got != version:
            shutil.rmtree(venv)
    if got != version:
        log(f"creating a virtualenv with Django {version} (Python {major}.{minor})")
        run([base, "-m", "venv", str(venv)])
        extra = FOREIGN_DEPS if foreign else ()
        run([str(python), "-m", "pip", "install", "--quiet", f"django=={version}", *extra])
    if not foreign:
        # Written after Django is installed (pip then sees a bare virtualenv),
        # and rewritten on every run (the running environment may have moved).
        write_running_env_pth(python)
    got = subprocess.run(check, capture_output=True, text=True, check=False).stdout.strip()
    if got != version:
        raise RuntimeError(f"the virtualenv {venv} has Django {got!r}, not {version}")
    if foreign:
        log(f"building nearcache from this checkout for Python {major}.{minor}")
        env = {
            **os.environ,
            "CARGO_TARGET_DIR": str(root / f"cargo-target-py{major}{minor}"),
            "MATURIN_PEP517_ARGS": "--profile dev",
        }
        run(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--force-reinstall",
                str(REPO),
            ],
            env=env,
        )
    probe = [
        str(python),
        "-c",
        "import nearcache._native, nearcache.contrib.django; print(nearcache.__file__)",
    ]
    proc = subprocess.run(probe, capture_output=True, text=True, check=False, cwd=root)
    if proc.returncode != 0:
        raise RuntimeError(
            f"nearcache is not importable with Django {version} ({python}); "
            f"install it first (pip install -e .)\n{proc.stderr}"
        )
    if not foreign:
        used = Path(proc.stdout.strip()).resolve().parent
        if used != local_nearcache():
            raise RuntimeError(
                f"the virtualenv for Django {version} ({python}) imports nearcache from "
                f"{used}, not from {local_nearcache()} as {sys.executable} does"
            )
    return python


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for_port(port: int, proc: subprocess.Popen[bytes], what: str) -> None:
    """Wait until a server accepts connections on 127.0.0.1:``port``."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{what} did not start listening on 127.0.0.1:{port}")


@dataclass
class Servers:
    """Local redis-server and memcached processes started for the run."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)

    def start(self, redis_var: str | None, memcached_var: str | None, workdir: Path) -> None:
        """Start redis-server and/or memcached on free loopback ports.

        The address of each server is put in :attr:`env` under the given
        variable name (None: that server is not needed).
        """
        if redis_var:
            binary = shutil.which("redis-server")
            if binary is None:
                raise RuntimeError("redis-server is not installed (Debian: redis-server)")
            port = free_port()
            proc = subprocess.Popen(
                [
                    binary,
                    "--port",
                    str(port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(workdir),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.procs.append(proc)
            wait_for_port(port, proc, "redis-server")
            self.env[redis_var] = f"redis://127.0.0.1:{port}"
        if memcached_var:
            binary = shutil.which("memcached")
            if binary is None:
                raise RuntimeError("memcached is not installed (Debian: memcached)")
            port = free_port()
            cmd = [binary, "-l", "127.0.0.1", "-p", str(port), "-U", "0", "-m", "64"]
            if os.geteuid() == 0:
                cmd += ["-u", "root"]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.procs.append(proc)
            wait_for_port(port, proc, "memcached")
            self.env[memcached_var] = f"127.0.0.1:{port}"

    def stop(self) -> None:
        """Stop the servers this object started (by PID)."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass
class JobResult:
    """The outcome of one ``runtests.py`` run (one Django version, one group)."""

    version: str
    group: str
    returncode: int
    log_path: Path
    tests: dict[str, dict[str, Any]]
    error: str = ""


# Test groups: each runs in its own runtests.py process with its own servers.
# "django": Django's own classes in tests/cache/ (locmem, db, filebased, and
# Django's Redis and pymemcache backends against local servers).
# "nearcache": nearcache's classes in nearcache_djtests.tests.
GROUPS = ("django", "nearcache")


def run_job(
    version: str,
    group: str,
    root: Path,
    pythons: dict[str, Path],
    suites: list[str],
    patterns: list[str],
    workdir: Path,
    verbosity: int,
) -> JobResult:
    """Fetch and install Django ``version``, then run one group of its cache suite."""
    tag = f"django-{version}-{group}"
    log_path = workdir / f"{tag}.log"
    servers = Servers()
    try:
        tests_dir = root / f"django-{version}" / "tests"
        python = pythons[version]
        if group == "django":
            servers.start(
                "NEARCACHE_DJTESTS_DJANGO_REDIS", "NEARCACHE_DJTESTS_DJANGO_MEMCACHED", workdir
            )
        else:
            servers.start(
                "NEARCACHE_DJTESTS_REDIS" if "tiered-redis" in suites else None,
                "NEARCACHE_DJTESTS_MEMCACHED" if "tiered-memcached" in suites else None,
                workdir,
            )
        results_path = workdir / f"{tag}.json"
        location_dir = workdir / f"caches-{tag}"
        location_dir.mkdir()
        env = {**os.environ, **servers.env}
        env.update(
            {
                "NEARCACHE_DJTESTS_RESULTS": str(results_path),
                "NEARCACHE_DJTESTS_DIR": str(location_dir),
                "NEARCACHE_DJTESTS_SUITES": ",".join(suites),
                "PYTHONPATH": os.pathsep.join(
                    p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
                ),
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        # runtests.py installs the app of each label's top-level package; the
        # nearcache classes need Django's "cache" test app (its Poll model), so
        # that group also names cache.models, a module that holds no tests.
        labels = ["cache"] if group == "django" else ["cache.models", "nearcache_djtests.tests"]
        cmd = [
            str(python),
            "runtests.py",
            *labels,
            "--settings=nearcache_djtests.settings",
            "--parallel=1",
            "--noinput",
            f"--verbosity={verbosity}",
        ]
        for pattern in patterns:
            cmd += ["-k", pattern]
        log(f"Django {version}: running {' '.join(cmd[1:])}")
        started = time.monotonic()
        with open(log_path, "w", encoding="utf-8") as out:
            proc = subprocess.run(
                cmd, cwd=tests_dir, env=env, stdout=out, stderr=subprocess.STDOUT, check=False
            )
        log(
            f"Django {version}: {group} group finished in {time.monotonic() - started:.0f}s "
            f"(exit {proc.returncode})"
        )
    except RuntimeError as exc:
        return JobResult(version, group, 1, log_path, {}, error=str(exc))
    finally:
        servers.stop()
    tests: dict[str, dict[str, Any]] = {}
    error = ""
    if results_path.exists():
        tests = json.loads(results_path.read_text(encoding="utf-8"))["tests"]
    else:
        error = "the test run wrote no results (it crashed before or while running)"
    return JobResult(version, group, proc.returncode, log_path, tests, error)


def listed_skip(test: dict[str, Any]) -> bool:
    """Whether a skip is one listed in ``NOT_APPLICABLE`` (its reason carries the mark)."""
    return any(detail.startswith(NOT_APPLICABLE_MARK) for detail in test["details"])


def is_ours(name: str) -> bool:
    """Whether a test id belongs to nearcache's classes (whose skips are not allowed)."""
    return name.startswith(OURS)


def summarize(
    results: list[JobResult], versions: list[str], logs: Path, not_run: dict[str, str]
) -> bool:
    """Print the per-version summary; return True when everything passed.

    ``not_run``: pinned versions left out for want of an interpreter, with
    why; the closing line names them.
    """
    ok = True
    totals: Counter[str] = Counter()
    print()
    print("Django's cache test suite (tests/cache/) with nearcache's backends")
    print(
        f"{'Django':>8}  {'run':>5}  {'passed':>6}  {'failed':>6}  {'skipped':>7}"
        "  | against nearcache: run passed"
    )
    for version in versions:
        jobs = [r for r in results if r.version == version]
        tests = {k: v for r in jobs for k, v in r.tests.items()}
        allc = Counter(t["outcome"] for t in tests.values())
        ours = Counter(t["outcome"] for k, t in tests.items() if is_ours(k))
        passed = allc["success"] + allc["expected_failure"]
        failed = allc["failure"] + allc["error"] + allc["unexpected_success"]
        ours_run = sum(ours.values())
        ours_passed = ours["success"] + ours["expected_failure"]
        print(
            f"{version:>8}  {sum(allc.values()):>5}  {passed:>6}  {failed:>6}  {allc['skip']:>7}"
            f"  | {ours_run:>17} {ours_passed:>6}"
        )
        totals.update(passed=passed, failed=failed, skipped=allc["skip"])
        for job in jobs:
            problems = [
                (name, t)
                for name, t in sorted(job.tests.items())
                if t["outcome"] in ("failure", "error", "unexpected_success")
                or (t["outcome"] == "skip" and is_ours(name) and not listed_skip(t))
            ]
            no_ours = job.group == "nearcache" and not any(map(is_ours, job.tests))
            if not (job.error or problems or job.returncode != 0 or no_ours):
                continue
            ok = False
            print(
                f"\n  Django {version}, {job.group} group: FAILED (exit {job.returncode}; "
                f"log: {logs / job.log_path.name})"
            )
            if job.error:
                print("    " + job.error.replace("\n", "\n    "))
            if no_ours and not job.error:
                print("    no test ran against nearcache's backends")
            for name, test in problems:
                print(f"    {test['outcome'].upper()}: {name}")
                for detail in test["details"]:
                    print("      " + detail.rstrip().replace("\n", "\n      "))
            if not problems and not job.error and job.log_path.exists():
                print(job.log_path.read_text(encoding="utf-8", errors="replace")[-4000:])
        skipped: Counter[str] = Counter()
        for name, test in tests.items():
            if test["outcome"] == "skip":
                cls = name.rsplit(".", 1)[0]
                skipped[f"{cls}: {'; '.join(test['details'])}"] += 1
        for what, count in sorted(skipped.items()):
            print(f"    skipped {count:>3} in {what}")
    for version, why in not_run.items():
        print(f"{version:>8}  not run: {why}")
    print()
    left_out = "".join(f"; Django {v} not run ({why})" for v, why in not_run.items())
    print(
        f"django-cache-suite: {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['skipped']} skipped{left_out}"
    )
    return ok


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run every selected version, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--django",
        action="append",
        metavar="VERSION",
        help=f"a Django version to test (repeatable; default: {', '.join(PINNED_VERSIONS)})",
    )
    parser.add_argument(
        "--suite",
        action="append",
        choices=ALL_SUITES,
        help=f"nearcache test classes to run (repeatable; default: {', '.join(DEFAULT_SUITES)})",
    )
    parser.add_argument("-k", dest="patterns", action="append", default=[], metavar="PATTERN")
    parser.add_argument("--cache-dir", help="where sdists, tests and virtualenvs are kept")
    parser.add_argument(
        "--group",
        action="append",
        choices=GROUPS,
        help="django: Django's own classes; nearcache: nearcache's (default: both)",
    )
    parser.add_argument("--jobs", type=int, default=6, help="runtests.py processes at once")
    parser.add_argument("--verbosity", type=int, default=2, help="runtests.py verbosity")
    args = parser.parse_args(argv)

    versions = args.django or list(PINNED_VERSIONS)
    suites = args.suite or list(DEFAULT_SUITES)
    groups = args.group or list(GROUPS)
    root = cache_root(args.cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    # Download and install first, one version at a time (pip is not run twice at once).
    pythons: dict[str, Path] = {}
    # A pinned version whose Python is not installed (Django 6.1 needs 3.12;
    # Debian 12 has 3.11, and no registry this project uses ships another
    # CPython) is left out and named in the closing line, unless it was asked
    # for with --django or NEARCACHE_DJANGO_ALL=1 is set.
    not_run: dict[str, str] = {}
    strict = bool(args.django) or os.environ.get("NEARCACHE_DJANGO_ALL") == "1"
    try:
        for version in list(versions):
            minimum = PINNED_VERSIONS.get(version, (3, 0))
            try:
                base = find_python(minimum)
            except NoInterpreter:
                if strict:
                    raise
                not_run[version] = f"needs Python >= {minimum[0]}.{minimum[1]}, none installed"
                versions.remove(version)
                continue
            fetch_tests(version, root, base)
            pythons[version] = make_venv(version, root, base)
    except RuntimeError as exc:
        print(f"Django {version}: setup failed: {exc}")
        print("django-cache-suite: 0 passed, 1 failed")
        return 1
    shm = Path("/dev/shm")
    workdir = Path(
        tempfile.mkdtemp(prefix="nearcache-djtests-", dir=shm if os.access(shm, os.W_OK) else None)
    )
    keep = root / "last-run"
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            futures = [
                pool.submit(
                    run_job, v, g, root, pythons, suites, args.patterns, workdir, args.verbosity
                )
                for v in versions
                for g in groups
            ]
            results = [f.result() for f in futures]
        shutil.rmtree(keep, ignore_errors=True)
        shutil.copytree(workdir, keep, ignore=shutil.ignore_patterns("caches-*", "dump.rdb"))
        ok = summarize(results, versions, keep, not_run)
        print(f"logs: {keep}")
        return 0 if ok else 1
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
