"""Start local redis-server and memcached for a run (``--start-servers``).

Each server listens on a free port of 127.0.0.1 only, keeps nothing on disk,
and is stopped by its PID (SIGTERM, then SIGKILL) when the run ends.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = ["LocalServer", "free_port", "start_memcached", "start_redis", "started_servers"]

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_listening(port: int, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with status {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"server did not listen on port {port} within {timeout:.0f}s")


@dataclass
class LocalServer:
    """A server process this run started."""

    kind: str
    port: int
    proc: subprocess.Popen[bytes]
    version: str = ""
    argv: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` or ``127.0.0.1:PORT``."""
        if self.kind == "redis":
            return f"redis://{LOOPBACK}:{self.port}/0"
        return f"{LOOPBACK}:{self.port}"

    def stop(self) -> None:
        """Stop the process by PID: SIGTERM, then SIGKILL after 5 seconds."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5.0)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5.0)


def _version(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (out.stdout or out.stderr).strip().splitlines()[0] if (out.stdout or out.stderr) else ""


def start_redis(binary: str = "redis-server", timeout: float = 10.0) -> LocalServer:
    """Start redis-server on a free loopback port, without persistence."""
    path = shutil.which(binary)
    if path is None:
        raise FileNotFoundError(f"{binary} not found on PATH")
    port = free_port()
    argv = [
        path,
        "--port", str(port),
        "--bind", LOOPBACK,
        "--save", "",
        "--appendonly", "no",
        "--protected-mode", "yes",
        "--daemonize", "no",
        "--logfile", "",
        "--loglevel", "warning",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc, timeout)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return LocalServer("redis", port, proc, _version([path, "--version"]), argv)


def start_memcached(
    binary: str = "memcached", memory_mb: int = 1024, timeout: float = 10.0
) -> LocalServer:
    """Start memcached on a free loopback port (TCP only)."""
    path = shutil.which(binary)
    if path is None:
        raise FileNotFoundError(f"{binary} not found on PATH")
    port = free_port()
    argv = [path, "-l", LOOPBACK, "-p", str(port), "-U", "0", "-m", str(memory_mb), "-t", "2"]
    if os.geteuid() == 0:  # memcached refuses to run as root without -u
        argv += ["-u", pwd.getpwuid(0).pw_name]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_listening(port, proc, timeout)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return LocalServer("memcached", port, proc, _version([path, "-V"]), argv)


@contextlib.contextmanager
def started_servers(redis: bool = True, memcached: bool = True) -> Iterator[dict[str, LocalServer]]:
    """Start the requested servers; stop them when the block exits.

    A server whose binary is missing or fails to start is left out of the
    returned mapping (its backends are then skipped with a reason); the
    exception text is kept under ``"<kind>-error"`` in :data:`start_errors`.
    """
    servers: dict[str, LocalServer] = {}
    start_errors.clear()
    try:
        for kind, wanted, starter in (
            ("redis", redis, start_redis),
            ("memcached", memcached, start_memcached),
        ):
            if not wanted:
                continue
            try:
                servers[kind] = starter()
            except Exception as exc:
                start_errors[kind] = f"{type(exc).__name__}: {exc}"
        yield servers
    finally:
        for server in servers.values():
            server.stop()


#: Why a requested server could not be started, by kind (filled by started_servers).
start_errors: dict[str, str] = {}
