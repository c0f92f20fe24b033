"""NearCache in real deployment shapes: gunicorn with ``--preload``, workers
running as another user (``--user``), a worker killed by gunicorn's
timeout (SIGKILL) in the middle of a request, and deploys that change
``OPTIONS["size"]`` while the previous deploy still serves.

Each test starts its own gunicorn master on a free loopback port, serving
``gunicorn_site.py`` (beside this file), and stops it by PID.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("django")
if importlib.util.find_spec("gunicorn") is None:
    pytest.skip("gunicorn is not installed (pip install gunicorn)", allow_module_level=True)

from nearcache import Cache
from nearcache.bench.workloads.e2e import fetch

HERE = Path(__file__).resolve().parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


class Server:
    """A gunicorn master on a loopback port."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, log: Path) -> None:
        self.proc = proc
        self.port = port
        self.log = log

    def get(self, path: str, timeout: float = 30.0) -> str:
        status, body = fetch(self.port, path, timeout)
        assert status == 200, f"GET {path}: {status} {body[:300]!r} | {self.tail()}"
        return body.decode()

    def workers(self) -> list[int]:
        return _children(self.proc.pid)

    def tail(self) -> str:
        return " | ".join(self.log.read_text(errors="replace").splitlines()[-5:])


@contextlib.contextmanager
def gunicorn(tmp_path: Path, *args: str, workers: int = 2, **env: str) -> Iterator[Server]:
    """Serve gunicorn_site with ``args``; stop the master (and its workers) by PID."""
    port = _free_port()
    log = tmp_path / "gunicorn.log"
    pids = tmp_path / "pids"
    pids.mkdir(exist_ok=True)
    pids.chmod(0o777)
    environment = {
        **os.environ,
        "GUNICORN_SITE_CACHE": str(tmp_path / "site.cache"),
        "GUNICORN_SITE_PIDS": str(pids),
        # Explicit: a settings module left in os.environ by an earlier test
        # (importing a Django site sets it) must not replace this site's.
        "DJANGO_SETTINGS_MODULE": "gunicorn_site",
        **env,
    }
    argv = [
        sys.executable, "-m", "gunicorn", "gunicorn_site:application",
        "--pythonpath", str(HERE),
        "--bind", f"127.0.0.1:{port}",
        "--workers", str(workers),
        "--worker-tmp-dir", "/dev/shm",
        "--graceful-timeout", "2",
        *args,
    ]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, env=environment, stdout=out, stderr=out)
    server = Server(proc, port, log)
    try:
        deadline = time.monotonic() + 60
        while len(server.workers()) < workers or fetch(port, "/whoami/", 2)[0] != 200:
            assert proc.poll() is None, f"gunicorn exited: {server.tail()}"
            assert time.monotonic() < deadline, f"gunicorn not ready: {server.tail()}"
            time.sleep(0.1)
        yield server
    finally:
        workers_left = server.workers()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for pid in workers_left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _spread(server: Server, path: str, timeout: float = 30.0) -> dict[int, str]:
    """GET ``path`` until every worker answered; return {worker pid: answer}.

    Requests go out in concurrent bursts, one per worker: a sync worker
    serves one request at a time, so while one is busy the others must
    accept. Sequential requests can keep landing on the worker that just
    answered (it is on a CPU when the next request arrives), which on a
    loaded two-core machine starved one worker for 200 requests in a row.
    """
    answers: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    expected = len(server.workers())
    with ThreadPoolExecutor(max_workers=expected) as pool:
        while len(answers) < expected and time.monotonic() < deadline:
            for body in pool.map(lambda _: server.get(path), range(expected)):
                value, pid = body.rsplit(" ", 1)
                answers[int(pid)] = value
            time.sleep(0.01)
    return answers


def _wait_for(path: Path, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, f"{path} never written"
        time.sleep(0.05)
    return int(path.read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_preload_opens_the_cache_in_the_master(tmp_path: Path) -> None:
    with gunicorn(tmp_path, "--preload", workers=3, GUNICORN_SITE_TOUCH="1") as server:
        master = server.proc.pid
        answers = _spread(server, "/get/preloaded-by/")
        assert len(answers) == 3 and master not in answers
        assert set(answers.values()) == {str(master)}  # written before the fork
        writer = int(server.get("/set/shared/yes/"))
        seen = _spread(server, "/get/shared/")
        assert set(seen.values()) == {"yes"} and len(seen) == 3
        assert writer in seen


def _runs_as(uid: int) -> str | None:
    """Why this interpreter cannot run as ``uid`` (None if it can)."""
    # The workers do not exec, but they import modules after switching user.
    try:
        probe = subprocess.run(
            [sys.executable, "-c", "import django, nearcache._native"],
            user=uid,
            capture_output=True,
            text=True,
            check=False,
        )
    except OSError as exc:
        return f"this Python is not usable by uid {uid}: {exc}"
    if probe.returncode != 0:
        return f"this Python is not usable by uid {uid}: {probe.stderr.strip()[-200:]}"
    return None


@pytest.mark.parametrize("preload", [False, True], ids=["workers-open", "master-opens"])
def test_workers_run_as_another_user(tmp_path: Path, preload: bool) -> None:
    nobody = pwd.getpwnam("nobody")
    if os.geteuid() != 0:
        pytest.skip("needs root to start workers as another user")
    if not preload:  # the workers import the site after switching user
        reason = _runs_as(nobody.pw_uid)
        if reason is not None:
            pytest.skip(reason)
    tmp_path.chmod(0o1777)  # like /tmp: nearcache refuses world-writable directories
    args = ["--user", str(nobody.pw_uid), "--group", str(nobody.pw_gid)]
    if preload:
        args.append("--preload")
    env = {"GUNICORN_SITE_TOUCH": "1"} if preload else {}
    with gunicorn(tmp_path, *args, **env) as server:
        _pid, uid = server.get("/whoami/").split()
        assert int(uid) == nobody.pw_uid
        server.get("/set/k/v/")
        assert set(_spread(server, "/get/k/").values()) == {"v"}
        owner = (tmp_path / "site.cache").stat().st_uid
        # Opened by the master (root) before the fork, or by the workers as nobody.
        assert owner == (0 if preload else nobody.pw_uid)


def _hook_missing() -> str | None:
    probe = Cache(size="1MiB", name=f"probe-{os.getpid()}")
    try:
        has = hasattr(probe.native, "_debug_hold_shard_mid_write")
    finally:
        path = probe.path
        probe.close()
        with contextlib.suppress(OSError):
            os.unlink(path)
    return None if has else "the engine was built without its test hooks"


def test_worker_killed_by_the_timeout_mid_write_leaves_the_cache_usable(tmp_path: Path) -> None:
    reason = _hook_missing()
    if reason is not None:
        pytest.skip(reason)
    # The hook holds the shard lock with the shard half-written, in Rust: gunicorn's
    # SIGABRT cannot interrupt it, so after the timeout the master SIGKILLs the worker.
    with gunicorn(tmp_path, "--timeout", "2", workers=2) as server:
        server.get("/set/victim/before/")
        stuck = threading.Thread(
            target=fetch, args=(server.port, "/hold-shard/victim/", 60), daemon=True
        )
        stuck.start()
        killed = _wait_for(tmp_path / "pids" / "victim")
        deadline = time.monotonic() + 30
        while _alive(killed):
            assert time.monotonic() < deadline, "gunicorn did not kill the stuck worker"
            time.sleep(0.1)
        stuck.join(30)
        # The dead worker's shard lock is recovered (the half-written shard is
        # repaired: its complete entries salvaged, or the shard reset), and
        # every worker, the replacement included, carries on.
        server.get("/set/victim/after/")
        assert set(_spread(server, "/get/victim/").values()) == {"after"}
        server.get("/set/other/fine/")
        assert set(_spread(server, "/get/other/").values()) == {"fine"}
        repairs = int(server.get("/stats/").split()[0])
        assert repairs >= 1
        assert killed not in server.workers()


def test_worker_killed_holding_a_stampede_lock(tmp_path: Path) -> None:
    with gunicorn(tmp_path, workers=2) as server:
        stuck = threading.Thread(target=fetch, args=(server.port, "/slow/key/", 90), daemon=True)
        stuck.start()
        holder = _wait_for(tmp_path / "pids" / "key")
        os.kill(holder, signal.SIGKILL)  # as gunicorn's timeout would, mid-computation
        stuck.join(30)
        start = time.monotonic()
        value, pid = server.get("/compute/key/").split()
        # stampede_wait is 1 s: the dead holder's lock expires, and the next
        # caller computes the value instead of waiting for ever.
        assert value == f"by-{pid}"
        assert time.monotonic() - start < 10
        assert int(pid) != holder


def test_deploys_that_change_the_size_resize_the_cache_live(tmp_path: Path) -> None:
    """A second deploy with a bigger ``OPTIONS["size"]`` starts while the first
    still serves, then a third with a smaller one: every request of every
    deploy succeeds, every entry stays, and all serve from the new file."""
    first_dir, second_dir, third_dir = (tmp_path / d for d in ("one", "two", "three"))
    for d in (first_dir, second_dir, third_dir):
        d.mkdir()
    cache = str(tmp_path / "site.cache")
    with gunicorn(first_dir, GUNICORN_SITE_CACHE=cache, GUNICORN_SITE_SIZE="4MiB") as one:
        for i in range(20):
            one.get(f"/set/k{i}/v{i}/")
        before = _spread(one, "/capacity/")
        assert set(before.values()) == {str(4 * 2**20)}
        with gunicorn(second_dir, GUNICORN_SITE_CACHE=cache, GUNICORN_SITE_SIZE="8MiB") as two:
            grown = {int(v) for v in _spread(two, "/capacity/").values()}
            assert len(grown) == 1 and 7 * 2**20 < min(grown) <= 8 * 2**20, grown
            # The first deploy's workers follow at their next request.
            assert {int(v) for v in _spread(one, "/capacity/").values()} == grown
            for server in (one, two):
                for i in range(20):
                    assert server.get(f"/get/k{i}/").split()[0] == f"v{i}"
            two.get("/set/during/two/")
            assert one.get("/get/during/").split()[0] == "two"
        with gunicorn(third_dir, GUNICORN_SITE_CACHE=cache, GUNICORN_SITE_SIZE="2MiB") as three:
            shrunk = {int(v) for v in _spread(three, "/capacity/").values()}
            assert len(shrunk) == 1 and 2**20 < min(shrunk) <= 2 * 2**20, shrunk
            assert {int(v) for v in _spread(one, "/capacity/").values()} == shrunk
            for server in (one, three):
                for i in range(20):
                    assert server.get(f"/get/k{i}/").split()[0] == f"v{i}"
        stats = one.get("/stats/").split()
        assert stats[0] == "0", f"shards repaired: {stats}"
    assert [n for n in os.listdir(tmp_path) if ".resize-" in n] == []
    assert {Cache(path=cache).capacity} == shrunk
