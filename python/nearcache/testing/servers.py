"""Throw-away redis-server and memcached processes on loopback ports.

The contract suite and nearcache's own tests run against real servers, never
mocks.  These helpers start one on a free ``127.0.0.1`` port, wait until it
answers, and stop it by the PID they started (they never touch any other
process).  A stopped server can be started again on the same port, which is
how the outage tests simulate a restart; :meth:`ServerProcess.pause` freezes
it (``SIGSTOP``) to simulate a server that accepts connections but never
answers.

>>> with RedisServer() as server:            # doctest: +SKIP
...     print(server.url)
redis://127.0.0.1:40163/0
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TypeVar

__all__ = [
    "MemcachedServer",
    "RedisServer",
    "ServerError",
    "ServerProcess",
    "free_port",
]

_S = TypeVar("_S", bound="ServerProcess")


class ServerError(RuntimeError):
    """A server process could not be started or did not become ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    """One server process that this process started and alone may stop."""

    #: Executable name, looked up on ``PATH``.
    binary: ClassVar[str] = ""
    #: Request sent to check readiness, and the prefix of a good reply.
    probe: ClassVar[bytes] = b""
    probe_reply: ClassVar[bytes] = b""

    host = "127.0.0.1"

    def __init__(self, port: int | None = None, workdir: str | os.PathLike[str] | None = None):
        """Prepare (not start) a server; ``port=None`` picks a free port at start."""
        self.port = port or 0
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=f"nearcache-{self.binary}-"))
        self._process: subprocess.Popen[bytes] | None = None

    @classmethod
    def available(cls) -> str | None:
        """Path of the server executable, or None when it is not installed."""
        return shutil.which(cls.binary)

    # -- to be provided by subclasses --------------------------------------

    def command(self, executable: str) -> list[str]:
        """The command line starting the server on ``self.port``."""
        raise NotImplementedError

    # -- lifecycle ---------------------------------------------------------

    @property
    def pid(self) -> int | None:
        """PID of the running server, or None."""
        return self._process.pid if self.running and self._process else None

    @property
    def running(self) -> bool:
        """Whether the process was started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (on the same port as before, after a stop) and wait for it."""
        if self.running:
            return
        executable = self.available()
        if executable is None:
            raise ServerError(f"{self.binary} is not installed")
        attempts = 1 if self.port else 5
        last_error = ""
        for _ in range(attempts):
            port_was_chosen = not self.port
            if port_was_chosen:
                self.port = free_port(self.host)
            log = open(self.workdir / f"{self.binary}-{self.port}.log", "ab")  # noqa: SIM115
            try:
                self._process = subprocess.Popen(
                    self.command(executable),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.workdir,
                    start_new_session=True,
                )
            finally:
                log.close()
            if self._wait_ready(timeout):
                return
            last_error = self._log_tail()
            self._terminate()
            if port_was_chosen:
                self.port = 0  # maybe someone took the port: try another one
        raise ServerError(f"{self.binary} did not become ready: {last_error}")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running:
                return False
            if self.ping(0.5):
                return True
            time.sleep(0.01)
        return False

    def ping(self, timeout: float = 0.5) -> bool:
        """Whether the server answers its readiness probe within ``timeout``."""
        try:
            with socket.create_connection((self.host, self.port), timeout=timeout) as sock:
                sock.sendall(self.probe)
                reply = sock.recv(64)
        except OSError:
            return False
        return reply.startswith(self.probe_reply)

    def _log_tail(self) -> str:
        path = self.workdir / f"{self.binary}-{self.port}.log"
        try:
            return path.read_text(errors="replace")[-2000:]
        except OSError:
            return "(no log)"

    def _terminate(self, timeout: float = 5.0) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            self.resume()  # a paused process cannot handle SIGTERM
            process.terminate()
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout)
        self._process = None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM to its PID, SIGKILL after ``timeout``)."""
        self._terminate(timeout)

    def kill(self) -> None:
        """Kill the server at once (SIGKILL to its PID), as a crash would."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(5.0)
        self._process = None

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): it keeps its port but answers nothing."""
        if self._process is not None and self.running:
            os.kill(self._process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Unfreeze a paused server (SIGCONT)."""
        if self._process is not None and self.running:
            os.kill(self._process.pid, signal.SIGCONT)

    def close(self) -> None:
        """Stop the server and remove its working directory if we made it."""
        self.stop()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self: _S) -> _S:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"pid={self.pid}" if self.running else "stopped"
        return f"<{type(self).__name__} {self.host}:{self.port} {state}>"


class RedisServer(ServerProcess):
    """redis-server without persistence, bound to 127.0.0.1."""

    binary = "redis-server"
    probe = b"PING\r\n"
    probe_reply = b"+PONG"

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0``."""
        return f"redis://{self.host}:{self.port}/0"

    def command(self, executable: str) -> list[str]:
        """redis-server with every option on the command line (no config file)."""
        return [
            executable,
            "--port",
            str(self.port),
            "--bind",
            self.host,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
            "--databases",
            "16",
        ]


class MemcachedServer(ServerProcess):
    """memcached on 127.0.0.1 (TCP only), 64 MiB, default 1 MiB items."""

    binary = "memcached"
    probe = b"version\r\n"
    probe_reply = b"VERSION"

    def __init__(
        self,
        port: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        memory_mb: int = 64,
    ):
        """Prepare a memcached with ``memory_mb`` MiB of item memory."""
        super().__init__(port, workdir)
        self.memory_mb = memory_mb

    @property
    def address(self) -> str:
        """``127.0.0.1:<port>``, as the memcached driver takes it."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``memcached://127.0.0.1:<port>``."""
        return f"memcached://{self.address}"

    def command(self, executable: str) -> list[str]:
        """memcached in the foreground, UDP off."""
        argv = [
            executable,
            "-l",
            self.host,
            "-p",
            str(self.port),
            "-U",
            "0",
            "-m",
            str(self.memory_mb),
            "-t",
            "2",
        ]
        if os.geteuid() == 0:
            argv += ["-u", "root"]  # memcached refuses to run as root without it
        return argv
