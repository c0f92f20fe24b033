"""What machine and which versions produced a set of figures."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from .backends.base import package_version

__all__ = ["PACKAGES", "filesystem_type", "machine_info", "package_versions"]

#: Distributions whose versions every result records.
PACKAGES = (
    "nearcache",
    "cachetools",
    "cachebox",
    "diskcache",
    "Django",
    "lmdb",
    "redis",
    "pymemcache",
    "msgpack",
    "zstandard",
    "rich",
    "matplotlib",
)


def _read(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def _cpu_model() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_bytes() -> int:
    for line in _read("/proc/meminfo").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return 0


def filesystem_type(path: Path) -> str:
    """The file system type of the mount holding ``path`` (from /proc/mounts)."""
    try:
        target = path.resolve()
    except OSError:
        return ""
    best, best_type = "", ""
    for line in _read("/proc/mounts").splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        mount, fstype = parts[1], parts[2]
        if (str(target) == mount or str(target).startswith(mount.rstrip("/") + "/")) and len(
            mount
        ) > len(best):
            best, best_type = mount, fstype
    return best_type


def _loadavg() -> list[float]:
    """1, 5 and 15-minute load averages: other work on the machine skews every figure."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def loadavg() -> list[float]:
    """Current load averages (recorded again when a run ends)."""
    return _loadavg()


def _git_commit() -> str:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(here), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def machine_info(workdir: Path | None = None) -> dict[str, Any]:
    """CPU, cores, memory, OS and Python of this machine."""
    uname = platform.uname()
    info: dict[str, Any] = {
        "cpu": _cpu_model(),
        "cores": os.cpu_count() or 0,
        "memory_bytes": _memory_bytes(),
        "os": platform.platform(),
        "kernel": uname.release,
        "arch": uname.machine,
        "python": sys.version.split()[0],
        "python_implementation": platform.python_implementation(),
        "python_build": " ".join(platform.python_build()),
        "nearcache_commit": _git_commit(),
        "loadavg_at_start": _loadavg(),
    }
    if workdir is not None:
        info["workdir_fs"] = filesystem_type(workdir)
    shm = Path("/dev/shm")
    if shm.exists():
        info["shm_fs"] = filesystem_type(shm)
    return info


def package_versions() -> dict[str, str]:
    """Installed versions of the measured and supporting packages (missing ones omitted)."""
    out: dict[str, str] = {}
    for dist in PACKAGES:
        version = package_version(dist)
        if version:
            out[dist] = version
    return out
