"""The cache commands of ``nearcache``: ls, get, set, delete, keys, inspect, top,
against real caches in a temporary directory."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nearcache import Cache
from nearcache.cli import main
from nearcache.tools import attached_pids, format_value


@pytest.fixture()
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "caches"
    monkeypatch.setenv("NEARCACHE_DIR", str(directory))
    monkeypatch.setenv("COLUMNS", "80")
    return directory


@pytest.fixture()
def alpha(cache_dir: Path) -> Iterator[Cache]:
    with Cache("alpha", size="1MiB", spill_threshold="1KiB") as c:
        yield c


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_ls(alpha: Cache, cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for i in range(3):
        alpha.set(f"k{i}", i)
    alpha.get("k0")
    alpha.get("absent")
    (cache_dir / "junk").write_bytes(b"not a cache")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import nearcache, sys; c = nearcache.Cache('alpha'); "
            "print('ready', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        assert attached_pids(alpha.path) == [child.pid]
        code, out, _ = _run(capsys, "ls", "--json")
        assert code == 0
        rows = {row["name"]: row for row in json.loads(out)}
        row = rows["alpha"]
        assert row["entries"] == 3 and row["hits"] == 1 and row["misses"] == 1
        assert row["processes"] == 1 and row["pids"] == [child.pid]
        assert row["size_bytes"] == os.path.getsize(alpha.path)
        assert row["held_bytes"] > 0
        assert "error" in rows["junk"]
        code, out, _ = _run(capsys, "ls")
        assert code == 0
        line = next(ln for ln in out.splitlines() if "alpha" in ln)
        assert "0.500" in line and "…" not in out
        assert "junk: not opened" in out
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def test_ls_leaves_out_the_files_kept_beside_a_cache(
    alpha: Cache, cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A tiered cache's listener election and a resize's file in the making
    # are not caches: ls does not report them as unreadable ones.
    alpha.set("k", 1)
    (cache_dir / "alpha.listener-7ff504cc4436").write_bytes(b"123456")
    (cache_dir / "alpha.resize-00000000deadbeef").write_bytes(b"\0" * 64)
    (cache_dir / "alpha.listener-backup").write_bytes(b"not ours")  # not a channel id
    code, out, _ = _run(capsys, "ls", "--json")
    assert code == 0
    names = {row["name"] for row in json.loads(out)}
    assert names == {"alpha", "alpha.listener-backup"}


def test_ls_of_an_empty_directory(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "ls")
    assert code == 0 and "no caches in" in out


def test_get_shows_values_safely(alpha: Cache, capsys: pytest.CaptureFixture[str]) -> None:
    alpha.set("text", "héllo wörld")
    alpha.set("number", 42)
    alpha.set("raw", b"\x00\x01ab")
    alpha.set("escape", "\x1b[31mred")
    alpha.set("object", {"a": [1, 2]})
    assert _run(capsys, "get", "alpha", "text")[1] == "héllo wörld\n"
    assert _run(capsys, "get", "alpha", "number")[1] == "42\n"
    assert _run(capsys, "get", "alpha", "raw")[1] == "b'\\x00\\x01ab'\n"
    assert _run(capsys, "get", "alpha", "escape")[1] == "'\\x1b[31mred'\n"
    code, out, _ = _run(capsys, "get", "alpha", "object")
    assert code == 0 and "not unpickled" in out and "'a'" not in out
    assert _run(capsys, "get", "alpha", "object", "--unpickle")[1] == "{'a': [1, 2]}\n"
    code, out, err = _run(capsys, "get", "alpha", "nope")
    assert code == 1 and out == "" and "no such key" in err


def test_get_never_unpickles_without_asking(
    alpha: Cache, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (f"touch {marker}",))

    alpha.native.set("evil", pickle.dumps(Evil()), flags=16 | 1 << 8)
    code, out, _ = _run(capsys, "get", "alpha", "evil")
    assert code == 0 and "not unpickled" in out
    assert not marker.exists()


def test_get_decodes_json_and_int_keys(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Cache("js", size="1MiB", serializer="json", prefix="app:") as c:
        c.set(7, {"x": [1, "two"]})
        assert _run(capsys, "get", "js", "7", "--int", "--prefix", "app:")[1] == (
            '{"x": [1, "two"]}\n'
        )
        assert _run(capsys, "get", "js", "7", "--int")[0] == 1  # another namespace


def test_set_delete_keys(alpha: Cache, capsys: pytest.CaptureFixture[str]) -> None:
    assert _run(capsys, "set", "alpha", "greeting", "hi")[0] == 0
    assert _run(capsys, "set", "alpha", "count", "12", "--int-value", "--ttl", "1h")[0] == 0
    assert _run(capsys, "set", "alpha", "b\\x00", "raw", "--bytes")[0] == 0
    assert alpha.get("greeting") == "hi"
    assert alpha.get("count") == 12 and 3500 < (alpha.ttl("count") or 0) <= 3600
    assert alpha.get(b"b\x00") == "raw"
    code, out, _ = _run(capsys, "keys", "alpha")
    assert code == 0 and out.splitlines() == ["'b\\x00'", "count", "greeting"]
    code, out, err = _run(capsys, "keys", "alpha", "--limit", "1")
    assert out.splitlines() == ["'b\\x00'"] and "2 more" in err
    code, out, _ = _run(capsys, "delete", "alpha", "greeting", "nope")
    assert code == 0 and out == "deleted 1 of 2\n"
    assert "greeting" not in alpha
    assert _run(capsys, "delete", "alpha", "nope")[0] == 1


def test_keys_of_a_namespace(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with Cache("shared", size="1MiB") as whole:
        a, b = Cache("shared", prefix="a:"), Cache("shared", prefix="b:")
        a.set("one", 1)
        b.set("two", 2)
        assert _run(capsys, "keys", "shared", "--prefix", "a:")[1] == "one\n"
        assert _run(capsys, "keys", "shared")[1].splitlines() == ["a:one", "b:two"]
        assert _run(capsys, "set", "shared", "three", "3", "--prefix", "b:")[0] == 0
        assert b.get("three") == "3" and len(whole) == 3
        a.close()
        b.close()


def test_missing_cache_is_an_error_not_a_new_file(
    cache_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["get", "ghost", "k"],
        ["set", "ghost", "k", "v"],
        ["keys", "ghost"],
        ["inspect", "ghost"],
        ["top", "ghost", "--once"],
    ):
        code, _, err = _run(capsys, *argv)
        assert code == 1 and "no cache file" in err, argv
    assert not (cache_dir / "ghost").exists()


def test_inspect(alpha: Cache, capsys: pytest.CaptureFixture[str]) -> None:
    alpha.set("big", b"x" * 4096)  # above the 1 KiB spill threshold: a file
    alpha.set("small", b"y")
    code, out, _ = _run(capsys, "inspect", "alpha", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["shards"]) == alpha.shard_count
    assert sum(s["items"] for s in data["shards"]) == 2
    assert data["spill"]["files"] == 1 and data["spill"]["bytes"] >= 4096
    code, out, _ = _run(capsys, "inspect", "alpha")
    assert code == 0 and "compactions" in out and "spilled files: 1 in" in out


def test_top_once_and_iterations(alpha: Cache, capsys: pytest.CaptureFixture[str]) -> None:
    alpha.set("k", 1)
    for _ in range(9):
        alpha.get("k")
    alpha.get("miss")
    code, out, _ = _run(capsys, "top", "alpha", "--once", "--interval", "0.05")
    assert code == 0
    labels = ("operations", "hit ratio", "evictions", "lock timeouts", "held memory")
    for label in (*labels, "largest compaction"):
        assert label in out, label
    hit_line = next(ln for ln in out.splitlines() if "hit ratio" in ln)
    assert "0.900" in hit_line  # total: 9 hits, 1 miss
    code, out, _ = _run(capsys, "top", "alpha", "--iterations", "2", "--interval", "0.05")
    assert code == 0 and "nearcache top: alpha" in out


def test_format_value_of_signed_and_unknown_entries() -> None:
    signed = 16 | 1 << 7  # native payload, signed: tag then body
    assert format_value(signed | 1, b"t" * 32 + b"hi") == "hi (signed; signature not checked)"
    assert format_value(16 | 70 << 8, b"abc") == "<serializer id 70, 3 bytes>"
