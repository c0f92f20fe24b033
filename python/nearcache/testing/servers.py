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
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import ClassVar, TypeVar

__all__ = [
    "MemcachedServer",
    "RedisClusterServers",
    "RedisSentinelServers",
    "RedisServer",
    "SentinelServer",
    "ServerError",
    "ServerProcess",
    "free_port",
]

_S = TypeVar("_S", bound="ServerProcess")
_G = TypeVar("_G", bound="_ServerGroup")


class ServerError(RuntimeError):
    """A server process could not be started or did not become ready."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _all_threads_stopped(pid: int) -> bool:
    """Whether every thread of ``pid`` is stopped by a signal (``/proc`` state T).

    Where ``/proc`` is not available this answers True at once (the caller
    then relies on the signal alone).
    """
    tasks = Path(f"/proc/{pid}/task")
    try:
        tids = os.listdir(tasks)
    except OSError:
        return True
    for tid in tids:
        try:
            stat = (tasks / tid / "stat").read_text()
        except OSError:
            continue  # the thread ended
        # The state follows the parenthesised command name, which may itself
        # contain spaces or parentheses: take the text after the last ')'.
        state = stat[stat.rfind(")") + 2 :][:1]
        if state not in ("T", "t"):
            return False
    return True


class ServerProcess:
    """One server process that this process started and alone may stop."""

    #: Executable name, looked up on ``PATH``.
    binary: ClassVar[str] = ""
    #: Request sent to check readiness, and the prefix of a good reply.
    probe: ClassVar[bytes] = b""
    probe_reply: ClassVar[bytes] = b""
    #: The option printing the executable's version.
    version_option: ClassVar[str] = "--version"

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

    @classmethod
    def version(cls) -> str:
        """The first line the executable prints for its version ("" when unknown)."""
        executable = cls.available()
        if executable is None:
            return ""
        try:
            out = subprocess.run(
                [executable, cls.version_option],
                capture_output=True,
                text=True,
                timeout=10,
                check=False,
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        text = (out.stdout or out.stderr).strip()
        return text.splitlines()[0] if text else ""

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

    def pause(self, timeout: float = 5.0) -> None:
        """Freeze the server (SIGSTOP): it keeps its port but answers nothing.

        ``kill`` only queues the signal; a server thread running on another
        core can still answer a request or two before the kernel stops it.
        So this waits until every thread of the server is seen stopped
        (state ``T`` in ``/proc``), so that the next request is certain to
        go unanswered.
        """
        if self._process is None or not self.running:
            return
        pid = self._process.pid
        os.kill(pid, signal.SIGSTOP)
        _wait_until(
            lambda: _all_threads_stopped(pid),
            timeout,
            f"{self.binary} (pid {pid}) did not stop within {timeout} s",
            interval=0.001,
        )

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

    def __init__(
        self,
        port: int | None = None,
        workdir: str | os.PathLike[str] | None = None,
        extra_args: Sequence[str] = (),
    ):
        """Prepare a redis-server; ``extra_args`` are appended to its command line."""
        super().__init__(port, workdir)
        self.extra_args = list(extra_args)

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
            *self.extra_args,
        ]


class MemcachedServer(ServerProcess):
    """memcached on 127.0.0.1 (TCP only), 64 MiB, default 1 MiB items."""

    binary = "memcached"
    probe = b"version\r\n"
    probe_reply = b"VERSION"
    version_option = "-V"

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


def _redis_command(host: str, port: int, *args: str, timeout: float = 2.0) -> bytes:
    """Send one command in RESP and return the raw reply (enough for INFO-like checks)."""
    request = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg.encode()
        request.append(b"$%d\r\n%s\r\n" % (len(data), data))
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.sendall(b"".join(request))
        reply = b""
        while True:
            chunk = sock.recv(65536)
            reply += chunk
            if not chunk or (reply.endswith(b"\r\n") and _complete(reply)):
                return reply


def _wait_until(
    condition: Callable[[], bool], timeout: float, failure: str, interval: float = 0.05
) -> None:
    """Poll ``condition`` until it holds; raise ServerError(``failure``) after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise ServerError(failure)
        time.sleep(interval)


def _replica_unlinked(node: RedisServer) -> bool:
    """Whether ``node`` is a replica whose link to its primary is not up (yet)."""
    try:
        info = _redis_command(node.host, node.port, "INFO", "replication")
    except OSError:
        return True
    return b"role:slave" in info and b"master_link_status:up" not in info


def _wait_replicas_linked(nodes: list[RedisServer], timeout: float) -> None:
    """Wait until every replica among ``nodes`` has finished its first sync."""
    _wait_until(
        lambda: not any(_replica_unlinked(node) for node in nodes),
        timeout,
        "a replica did not finish its first sync with its primary",
    )


def _complete(reply: bytes) -> bool:
    """Whether a single-line or bulk-string reply has fully arrived."""
    if reply[:1] != b"$":
        return True
    header, _, body = reply.partition(b"\r\n")
    size = int(header[1:])
    return size < 0 or len(body) >= size + 2


class _ServerGroup:
    """Servers started and stopped together, in one working directory.

    ``with`` starts them all and closes them all, including after a start
    that failed half-way (some servers may be running by then).
    """

    def __init__(self, workdir: str | os.PathLike[str] | None, prefix: str) -> None:
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix=prefix))

    # -- to be provided by subclasses --------------------------------------

    def start(self, timeout: float = 30.0) -> None:
        """Start every server and wait until they work together."""
        raise NotImplementedError

    def close(self) -> None:
        """Stop every server; remove the working directory if we made it."""
        raise NotImplementedError

    # -- shared ------------------------------------------------------------

    def _remove_workdir(self) -> None:
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self: _G) -> _G:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class RedisClusterServers(_ServerGroup):
    """A Redis Cluster of ``primaries`` (+ ``replicas_per_primary``) nodes on loopback.

    Every node is a :class:`RedisServer` with ``--cluster-enabled yes``; the
    cluster is made with ``redis-cli --cluster create``.  Nodes keep their
    ``nodes.conf`` in their working directory, so a stopped node restarts
    as the same member (with no data: persistence is off).

    >>> with RedisClusterServers() as cluster:      # doctest: +SKIP
    ...     print(cluster.url)
    redis+cluster://127.0.0.1:41001,127.0.0.1:41002,127.0.0.1:41003
    """

    def __init__(
        self,
        primaries: int = 3,
        replicas_per_primary: int = 0,
        workdir: str | os.PathLike[str] | None = None,
        node_timeout_ms: int = 1000,
    ) -> None:
        """Prepare (not start) the nodes."""
        if primaries < 3:
            raise ValueError("a Redis Cluster needs at least 3 primaries")
        super().__init__(workdir, "nearcache-redis-cluster-")
        self.replicas_per_primary = replicas_per_primary
        self.nodes: list[RedisServer] = []
        for index in range(primaries * (1 + replicas_per_primary)):
            node_dir = self.workdir / f"node{index}"
            node_dir.mkdir(parents=True, exist_ok=True)
            port = _free_port_with_bus()
            self.nodes.append(
                RedisServer(
                    port,
                    node_dir,
                    extra_args=[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        str(node_timeout_ms),
                        "--cluster-require-full-coverage",
                        "no",
                    ],
                )
            )

    @classmethod
    def available(cls) -> str | None:
        """Path of redis-cli (needed to create the cluster), or None."""
        if RedisServer.available() is None:
            return None
        return shutil.which("redis-cli")

    @property
    def addresses(self) -> list[str]:
        """``host:port`` of every node."""
        return [f"{node.host}:{node.port}" for node in self.nodes]

    @property
    def url(self) -> str:
        """``redis+cluster://host:port,host:port,...`` (every node as a seed)."""
        return "redis+cluster://" + ",".join(self.addresses)

    def start(self, timeout: float = 30.0) -> None:
        """Start every node, create the cluster and wait until it is ok."""
        cli = self.available()
        if cli is None:
            raise ServerError("redis-server or redis-cli is not installed")
        for node in self.nodes:
            node.start()
        command = [cli, "--cluster", "create", *self.addresses]
        command += ["--cluster-replicas", str(self.replicas_per_primary), "--cluster-yes"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        if result.returncode != 0:
            raise ServerError(f"redis-cli --cluster create failed: {result.stdout}{result.stderr}")
        self.wait_ok(timeout)
        # A replica that never finished its first sync refuses to fail over
        # ("disconnected from master for longer than allowed"), so a cluster
        # with replicas is ready only once every replica's link is up.
        _wait_replicas_linked([node for node in self.nodes if node.running], timeout)

    def cluster_ok(self) -> bool:
        """Whether every running node reports ``cluster_state:ok`` and agrees on all slots."""
        for node in self.nodes:
            if not node.running:
                continue
            try:
                info = _redis_command(node.host, node.port, "CLUSTER", "INFO")
            except OSError:
                return False
            if b"cluster_state:ok" not in info or b"cluster_slots_ok:16384" not in info:
                return False
        return True

    def wait_ok(self, timeout: float = 30.0) -> None:
        """Wait until :meth:`cluster_ok`; raise ServerError after ``timeout``."""
        _wait_until(self.cluster_ok, timeout, "the cluster did not reach cluster_state:ok")

    def node_id(self, node: RedisServer) -> str:
        """The cluster node id of ``node``."""
        reply = _redis_command(node.host, node.port, "CLUSTER", "MYID")
        return reply.split(b"\r\n")[1].decode()

    def reshard(self, source: RedisServer, target: RedisServer, slots: int) -> None:
        """Move ``slots`` slots from ``source`` to ``target`` (``redis-cli --cluster reshard``)."""
        cli = self.available()
        assert cli is not None
        command = [
            cli,
            "--cluster",
            "reshard",
            f"{target.host}:{target.port}",
            "--cluster-from",
            self.node_id(source),
            "--cluster-to",
            self.node_id(target),
            "--cluster-slots",
            str(slots),
            "--cluster-yes",
        ]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise ServerError(f"redis-cli --cluster reshard failed: {result.stdout}{result.stderr}")

    def close(self) -> None:
        """Stop every node and remove the working directory if we made it."""
        for node in self.nodes:
            node.close()
        self._remove_workdir()


def _free_port_with_bus(host: str = "127.0.0.1", offset: int = 10000) -> int:
    """A free port whose cluster bus port (``port + offset``) is free too."""
    for _ in range(100):
        port = free_port(host)
        if port + offset > 65535:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                sock.bind((host, port + offset))
        except OSError:
            continue
        return port
    raise ServerError("no free port pair for a cluster node")


class SentinelServer(RedisServer):
    """redis-server in sentinel mode, monitoring one primary (config file in its workdir)."""

    def __init__(
        self,
        primary: RedisServer,
        service: str = "nearcache",
        quorum: int = 2,
        down_after_ms: int = 500,
        workdir: str | os.PathLike[str] | None = None,
    ) -> None:
        """Prepare a sentinel for ``primary`` under the name ``service``."""
        super().__init__(None, workdir)
        self.primary = primary
        self.service = service
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self._config_port = 0

    def command(self, executable: str) -> list[str]:
        """redis-server <config> --sentinel; the config is written when the port changes.

        Sentinels rewrite their config with what they learn (replicas,
        epochs), so a restart on the same port keeps it.
        """
        config = self.workdir / "sentinel.conf"
        if self._config_port != self.port:
            self._config_port = self.port
            config.write_text(
                f"port {self.port}\n"
                f"bind {self.host}\n"
                f"dir {self.workdir}\n"
                f"sentinel monitor {self.service} {self.primary.host} {self.primary.port} "
                f"{self.quorum}\n"
                f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                f"sentinel failover-timeout {self.service} 2000\n"
                f"sentinel parallel-syncs {self.service} 1\n"
            )
        return [executable, str(config), "--sentinel", "--loglevel", "warning"]


class RedisSentinelServers(_ServerGroup):
    """A primary, ``replicas`` replicas and ``sentinels`` sentinels on loopback.

    :meth:`kill_primary` kills the current primary (SIGKILL); the sentinels
    promote a replica after ``down_after_ms`` plus an election.
    """

    def __init__(
        self,
        replicas: int = 1,
        sentinels: int = 3,
        service: str = "nearcache",
        workdir: str | os.PathLike[str] | None = None,
        down_after_ms: int = 500,
    ) -> None:
        """Prepare (not start) the servers."""
        super().__init__(workdir, "nearcache-redis-sentinel-")
        self.service = service
        self.primary = RedisServer(workdir=self._dir("primary"))
        self.replicas: list[RedisServer] = []
        self._replica_count = replicas
        self.sentinels = [
            SentinelServer(
                self.primary,
                service,
                quorum=max(1, sentinels // 2 + 1),
                down_after_ms=down_after_ms,
                workdir=self._dir(f"sentinel{index}"),
            )
            for index in range(sentinels)
        ]

    def _dir(self, name: str) -> Path:
        path = self.workdir / name
        path.mkdir(parents=True, exist_ok=True)
        return path

    @property
    def url(self) -> str:
        """``redis+sentinel://host:port,host:port/<service>/0`` (the sentinels)."""
        sentinels = ",".join(f"{s.host}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{sentinels}/{self.service}/0"

    @property
    def servers(self) -> list[RedisServer]:
        """The data servers (primary first, at start)."""
        return [self.primary, *self.replicas]

    def start(self, timeout: float = 30.0) -> None:
        """Start the primary, its replicas (``--replicaof``), then the sentinels."""
        self.primary.start()
        for index in range(self._replica_count):
            replica = RedisServer(
                workdir=self._dir(f"replica{index}"),
                extra_args=["--replicaof", self.primary.host, str(self.primary.port)],
            )
            replica.start()
            self.replicas.append(replica)
        # Sentinels skip a replica that was never linked to its primary.
        _wait_replicas_linked(self.replicas, timeout)
        for sentinel in self.sentinels:
            sentinel.start()
        _wait_until(self._replicas_known, timeout, "the sentinels did not discover the replicas")

    def _replicas_known(self) -> bool:
        for sentinel in self.sentinels:
            try:
                reply = _redis_command(
                    sentinel.host, sentinel.port, "SENTINEL", "REPLICAS", self.service
                )
            except OSError:
                return False
            if reply.count(b"role-reported") < self._replica_count:
                return False
            if b"flags\r\n$5\r\nslave" not in reply and self._replica_count:
                return False
        return True

    def primary_port(self) -> int | None:
        """The port the first answering sentinel names as the primary, or None."""
        for sentinel in self.sentinels:
            try:
                reply = _redis_command(
                    sentinel.host,
                    sentinel.port,
                    "SENTINEL",
                    "GET-MASTER-ADDR-BY-NAME",
                    self.service,
                )
            except OSError:
                continue
            lines = reply.split(b"\r\n")
            if len(lines) >= 5 and lines[0] == b"*2":
                return int(lines[4])
        return None

    def current_primary(self) -> RedisServer | None:
        """The data server the sentinels name as primary."""
        port = self.primary_port()
        return next((s for s in self.servers if s.port == port), None)

    def kill_primary(self) -> RedisServer:
        """SIGKILL the current primary; return it (it can be started again as a replica)."""
        primary = self.current_primary()
        if primary is None:
            raise ServerError("the sentinels name no primary")
        primary.kill()
        return primary

    def wait_promoted(self, old_port: int, timeout: float = 30.0) -> RedisServer:
        """Wait until the sentinels name a primary other than ``old_port``."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old_port:
                server = next((s for s in self.servers if s.port == port), None)
                if server is not None and server.running:
                    return server
            time.sleep(0.05)
        raise ServerError("no replica was promoted")

    def close(self) -> None:
        """Stop the sentinels, then the data servers; remove the working directory if ours."""
        for server in [*self.sentinels, *self.replicas, self.primary]:
            server.close()
        self._remove_workdir()
