"""Live resize from Python: ``Cache.resize``, ``Cache(size=...)`` on an existing
file, ``nearcache resize``, and forked workers that keep working (and never
read a value older than their own last write) while the file grows and
shrinks under them."""

from __future__ import annotations

import json
import multiprocessing
import os
import time
from pathlib import Path

import pytest

import nearcache
from nearcache import Cache
from nearcache.cli import main


def _fill(c: Cache, n: int, width: int = 100) -> None:
    for i in range(n):
        c.set(f"k{i}", f"{i}:" + "x" * width)


def _kept(c: Cache, n: int) -> list[bool]:
    out = []
    for i in range(n):
        v = c.get(f"k{i}")
        assert v is None or v.startswith(f"{i}:"), v
        out.append(v is not None)
    return out


def test_resize_grows_keeping_every_entry(tmp_path: Path) -> None:
    c = Cache(path=tmp_path / "c", size="1MiB", shards=2)
    other = Cache(path=tmp_path / "c")
    _fill(c, 2000)
    assert c.resize("4MiB", shards=4) == {"capacity": c.capacity, "shards": 4}
    assert all(_kept(c, 2000)) and all(_kept(other, 2000))
    assert len(other) == 2000 and other.shard_count == 4
    assert c.check()["entries"] == 2000


def test_resize_shrinks_keeping_the_newest(tmp_path: Path) -> None:
    c = Cache(path=tmp_path / "c", size="8MiB", shards=8)
    n = 12_000
    _fill(c, n, 180)
    assert all(_kept(c, n))
    c.resize("1MiB", shards=4)
    kept = _kept(c, n)
    count = sum(kept)
    assert 1000 < count < n // 2
    assert all(kept[n - count // 10 :]), "a recent entry was dropped"
    assert not any(kept[: n // 2]), "an old entry was kept"


def test_bad_arguments_change_nothing(tmp_path: Path) -> None:
    c = Cache(path=tmp_path / "c", size="1MiB", shards=2)
    c.set("k", "v")
    with pytest.raises(nearcache.InvalidArgumentError):
        c.resize("4MiB", shards=3)
    with pytest.raises(ValueError):
        c.resize("lots")
    assert c.shard_count == 2 and c.get("k") == "v"
    c.close()
    with pytest.raises(nearcache.CacheClosedError):
        c.resize("4MiB")


def test_cli_resize_prints_before_and_after(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "c"
    c = Cache(path=path, size="1MiB")
    _fill(c, 500)
    assert main(["resize", str(path), "2MiB", "--shards", "2", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["before"]["entries"] == report["after"]["entries"] == 500
    assert report["before"]["size_bytes"] == 2**20
    assert report["after"]["shards"] == 2 and report["after"]["size_bytes"] > 1.5 * 2**20
    assert c.capacity == report["after"]["size_bytes"]
    assert main(["resize", str(path), "1MiB"]) == 0
    out = capsys.readouterr().out
    assert "before" in out and "after" in out and "entries" in out
    assert main(["resize", str(path), "1MiB", "--shards", "3"]) == 1
    assert "power of two" in capsys.readouterr().err
    assert main(["resize", str(tmp_path / "missing"), "1MiB"]) == 1
    assert not (tmp_path / "missing").exists()


def _worker(path: str, tag: str, stop: str, result: str) -> None:
    """Get and set this worker's own keys until ``stop`` exists; every value
    read must be the last one this worker wrote (or a miss after a shrink)."""
    c = Cache(path=path)
    last: dict[str, int] = {}
    errors = ops = 0
    while not os.path.exists(stop) or ops < 2000:
        for i in range(200):
            key = f"{tag}-{(ops * 7 + i) % 300}"
            ops += 1
            try:
                if i % 3:
                    v = c.get(key)
                    if v is not None and v != last.get(key):
                        errors += 1
                else:
                    c.set(key, ops)
                    last[key] = ops
            except Exception:
                errors += 1
    Path(result).write_text(json.dumps({"ops": ops, "errors": errors}))


def test_forked_workers_through_a_grow_and_a_shrink(tmp_path: Path) -> None:
    path = str(tmp_path / "c")
    c = Cache(path=path, size="2MiB", shards=4)
    _fill(c, 1000)
    stop = str(tmp_path / "stop")
    ctx = multiprocessing.get_context("fork")
    workers = [
        ctx.Process(target=_worker, args=(path, f"w{n}", stop, str(tmp_path / f"w{n}.json")))
        for n in range(3)
    ]
    for w in workers:
        w.start()
    time.sleep(0.3)
    c.resize("4MiB", shards=8)
    assert all(_kept(c, 1000)), "the grow lost an entry"
    time.sleep(0.3)
    c.resize("1MiB", shards=2)
    time.sleep(0.3)
    Path(stop).touch()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    for n in range(3):
        report = json.loads((tmp_path / f"w{n}.json").read_text())
        assert report["errors"] == 0 and report["ops"] >= 2000, report
    assert c.check()["shards"] == 2
