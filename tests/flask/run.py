#!/usr/bin/env python3
"""Run Flask-Caching's own tests against nearcache's Flask-Caching backend.

1. Download Flask-Caching's source distribution (the version installed in
   this environment, ``pip download --no-binary :all: --no-deps``) into a
   cache directory outside the repository (``$NEARCACHE_FLASK_CACHE``,
   default ``~/.cache/nearcache/flask-caching-tests``) and extract its
   ``tests/`` there; Flask-Caching's files are never copied into this
   repository.
2. Start a redis-server on a free loopback port (stopped by PID afterwards)
   for the tiered variant.
3. Run, with this interpreter's pytest, in a fresh copy of those tests:

   * ``backend``: Flask-Caching's ``GenericCacheTests`` (its
     ``test_backend_cache.py``), subclassed in
     ``nearcache_flask_backend_tests.py`` for nearcache's backend alone and
     as a tiered cache over Redis.  Every test must pass; none may skip.
   * ``app``: Flask-Caching's application-level tests (``@cached``,
     ``@memoize``, views, templates, signals), with the ``app`` fixture of
     its ``conftest.py`` switched from ``SimpleCache`` to nearcache's
     backend, and its fake ``clock`` replaced by one that really waits (so
     the expiry tests run against nearcache's TTLs).  Tests about another
     backend are deselected by name in :data:`NOT_APPLICABLE`, each with its
     reason.

Prints pytest's summary per group and a closing line
``flask-caching-suite: N passed, N failed, N skipped``; exit status 0 when
both groups passed.

Usage::

    tests/flask/run.sh                # both groups
    tests/flask/run.sh --group backend -k inc_dec
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
GROUPS = ("backend", "app")

# Application-level test files of Flask-Caching run with nearcache as the app's cache.
APP_FILES = (
    "test_cache.py",
    "test_memoize.py",
    "test_view.py",
    "test_templates.py",
    "test_signals.py",
    "test_hash_method.py",
)

# Tests of those files that are about another backend, not the app-level
# behaviour: deselected with the reason, like Django's NOT_APPLICABLE list.
_LONG_CLOCK = "advances the fake clock by a minute or more (real waiting is too slow)"
NOT_APPLICABLE: dict[str, str] = {
    "test_cache.py::test_cache_unlink": "Flask-Caching's RedisCache on its fixed port 6360",
    "test_memoize.py::test_memoize_delete_resets_version_key": _LONG_CLOCK,
    "test_memoize.py::test_memoize_entry_written_late_keeps_its_own_timeout": _LONG_CLOCK,
    "test_memoize.py::test_memoize_version_key_expires_once_its_entries_have": _LONG_CLOCK,
    "test_memoize.py::test_memoize_version_key_outlives_newest_entry": _LONG_CLOCK,
}

_SUMMARY = re.compile(r"(\d+) (passed|failed|skipped|errors?|deselected|xfailed|xpassed)")


def log(message: str) -> None:
    """A progress line on stderr."""
    print(f"[flask-caching-suite] {message}", file=sys.stderr, flush=True)


def cache_root() -> Path:
    """Where the sdist and the extracted tests are kept."""
    env = os.environ.get("NEARCACHE_FLASK_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "nearcache" / "flask-caching-tests"


def fetch_tests(version: str, root: Path) -> Path:
    """Download Flask-Caching ``version``'s sdist and extract its ``tests/``."""
    tests_dir = root / f"flask-caching-{version}" / "tests"
    if (tests_dir / "test_backend_cache.py").is_file():
        return tests_dir
    sdists = root / "sdists"
    sdists.mkdir(parents=True, exist_ok=True)
    pattern = f"[Ff]lask[-_][Cc]aching-{version}.tar.gz"
    if not sorted(sdists.glob(pattern)):
        log(f"downloading the Flask-Caching {version} source distribution")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-binary",
                ":all:",
                "--no-deps",
                "--disable-pip-version-check",
                "--quiet",
                f"flask-caching=={version}",
                "-d",
                str(sdists),
            ],
            check=True,
        )
    archives = sorted(sdists.glob(pattern))
    if not archives:
        raise RuntimeError(f"pip download left no Flask-Caching {version} sdist in {sdists}")
    staging = Path(tempfile.mkdtemp(prefix="flask-caching-", dir=root))
    try:
        with tarfile.open(archives[0]) as tar:
            top = f"{tar.getnames()[0].split('/')[0]}/tests/"
            members = [m for m in tar.getmembers() if m.name.startswith(top)]
            if hasattr(tarfile, "data_filter"):
                tar.extractall(staging, members=members, filter="data")
            else:  # Python < 3.11.4: plain files and directories inside tests/ only
                safe = [
                    m
                    for m in members
                    if (m.isfile() or m.isdir()) and ".." not in Path(m.name).parts
                ]
                tar.extractall(staging, members=safe)
        shutil.rmtree(tests_dir.parent, ignore_errors=True)
        (staging / top.rstrip("/")).parent.rename(tests_dir.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return tests_dir


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    """A redis-server on a free loopback port; (process, URL)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError("redis-server is not installed (Debian: redis-server)")
    for _attempt in range(5):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        args = ["--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--appendonly", "no", "--dir", str(workdir)]
        proc = subprocess.Popen(
            [binary, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    return proc, f"redis://127.0.0.1:{port}/0"
            except OSError:
                time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    raise RuntimeError("redis-server did not start")


def prepare(tests_dir: Path, workdir: Path, group: str) -> Path:
    """A private copy of Flask-Caching's tests with nearcache's pieces added."""
    target = workdir / f"tests-{group}"
    shutil.copytree(tests_dir, target)
    if group == "backend":
        shutil.copy(HERE / "nearcache_flask_backend_tests.py", target / "test_nearcache_backend.py")
    else:
        conftest = target / "conftest.py"
        text = conftest.read_text(encoding="utf-8")
        original = 'app.config["CACHE_TYPE"] = "SimpleCache"'
        if original not in text:
            raise RuntimeError(f"{conftest} no longer sets {original}: update run.py")
        text = text.replace(
            original, "app.config.update(__import__('nearcache_flask_app').app_config())"
        )
        text += (
            "\n\n@pytest.fixture\n"
            "def clock():  # added by nearcache's run.py: time really passes\n"
            "    return __import__('nearcache_flask_app').RealClock()\n"
        )
        conftest.write_text(text, encoding="utf-8")
    return target


def run_group(group: str, target: Path, env: dict[str, str], patterns: list[str]) -> dict[str, int]:
    """Run pytest for one group; return its outcome counts."""
    if group == "backend":
        files = ["test_nearcache_backend.py"]
    else:
        files = [name for name in APP_FILES if (target / name).exists()]
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfEs"]
    cmd += ["-o", "addopts=", "-W", "ignore::DeprecationWarning", *files]
    if group == "app":
        # Exact node ids (pytest's --deselect matches prefixes), applied by the plugin.
        cmd += ["-p", "nearcache_flask_app"]
        env = {**env, "NEARCACHE_FLASK_NOT_APPLICABLE": json.dumps(NOT_APPLICABLE)}
        for test_id, reason in NOT_APPLICABLE.items():
            log(f"not applicable: {test_id}: {reason}")
    for pattern in patterns:
        cmd += ["-k", pattern]
    log(f"{group}: {' '.join(cmd[1:])}")
    proc = subprocess.run(cmd, cwd=target, env=env, capture_output=True, text=True, check=False)
    output = proc.stdout + proc.stderr
    print(f"\n== {group} group (exit {proc.returncode})")
    print(output[-6000:] if proc.returncode else output.strip().splitlines()[-1])
    counts = {"passed": 0, "failed": 0, "skipped": 0, "exit": proc.returncode}
    tail = output.strip().splitlines()[-1] if output.strip() else ""
    for number, word in _SUMMARY.findall(tail):
        key = "failed" if word.startswith("error") else word
        if key in counts:
            counts[key] += int(number)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, fetch, run the groups, print the summary."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", action="append", choices=GROUPS, help="default: both")
    parser.add_argument("-k", dest="patterns", action="append", default=[], metavar="PATTERN")
    args = parser.parse_args(argv)
    try:
        version = metadata.version("flask-caching")
    except metadata.PackageNotFoundError:
        print("flask-caching is not installed (pip install -e '.[test]')")
        print("flask-caching-suite: 0 passed, 1 failed, 0 skipped")
        return 1
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    tests_dir = fetch_tests(version, root)
    workdir = Path(tempfile.mkdtemp(prefix="nearcache-flask-"))
    redis_proc, redis_url = start_redis(workdir)
    totals = {"passed": 0, "failed": 0, "skipped": 0}
    ok = True
    try:
        env = {
            **os.environ,
            "NEARCACHE_FLASK_REDIS": redis_url,
            "NEARCACHE_DIR": str(workdir / "caches"),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p
            ),
            "PYTHONDONTWRITEBYTECODE": "1",
            "CI": "false",  # Flask-Caching's conftest fails, rather than skips, without servers
        }
        for group in args.group or GROUPS:
            counts = run_group(group, prepare(tests_dir, workdir, group), env, args.patterns)
            for key in totals:
                totals[key] += counts[key]
            if (
                counts["exit"] != 0
                or counts["failed"]
                or (group == "backend" and counts["skipped"])
            ):
                ok = False
    finally:
        redis_proc.terminate()
        try:
            redis_proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            redis_proc.kill()
            redis_proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)
    print(
        f"\nflask-caching-suite (Flask-Caching {version}): {totals['passed']} passed, "
        f"{totals['failed']} failed, {totals['skipped']} skipped"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
