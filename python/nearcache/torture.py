"""Torture harness: many processes, random kills, continuous verification.

``python -m nearcache.torture --duration 600`` runs N worker processes
(default 8) doing a random mix of ``get``/``get_many``/``set``/``add``/
``set_many``/``delete``/``pop``/``incr``/``cas`` on a deliberately small cache, so
that shards are compacted and entries evicted all the time, while the
coordinator process SIGKILLs random workers at random moments and restarts
them.  Some kills are aimed: the victim is told to lock a shard and leave it
half-written (``NativeCache._debug_hold_shard_mid_write``), the coordinator
waits until the victim's kernel state shows it asleep inside that hook, and
only then kills it, so the kill lands mid-write for certain.

Every value describes itself::

    magic "NCT1" | key length | writer | sequence | expiry ms | flags | key
    | payload (derived from the header) | 8-byte BLAKE2b checksum of all that

and every read is verified as it happens:

* **torn or foreign values**: the checksum must match and the embedded key
  must be the key that was read (``get_many``: each position's own key);
* **flags**: the flags word returned must be the one stored with the value;
* **staleness**: once a worker has seen writer W's value number s for a key,
  it must never again see an older value of W for that key;
* **expiry**: a value read after its embedded expiry time (a lower bound of
  the engine's) is checked against the expiry the engine holds for that very
  value: returning it after that time is an error, and so is a lost TTL;
* **counters**: every counter is created (by ``add``) with a random 31-bit
  *birth* id in its high 32 bits; while the birth id is unchanged its low
  32 bits must grow strictly with every increment a worker makes and never
  shrink between reads.  A counter that vanishes (evicted, deleted, or lost
  with its shard in a reset) is reborn with a new id: counters never go
  backwards, they may only restart.  Some increments are compare-and-swaps
  (read with the version, write only if unchanged) racing the in-place
  ones: one that stored over a write it did not read would take a counter
  back below a count its writer saw;
* **compare-and-swap total**: after the workers stop, 4 processes add 1 to
  one counter 10,000 times each by CAS loops while one of them is SIGKILLed
  mid-loop: the total must be the acknowledged increments, or one more;
* **latency**: every operation is timed; one slower than ``--latency-bound``
  is a violation, and a watchdog flags (and kills) any operation blocked for
  longer than ``--stall-limit``;
* **repair**: after each aimed kill the shard must have been repaired as
  the engine documents (its ``salvages`` counter grows when the complete
  entries were kept, ``resets`` when the shard had to be emptied); the
  entries each repair dropped (``entries_lost``) are reported per kill;
* **bounded waits**: a worker that finds a shard held past the lock timeout
  (by a worker held mid-write) gets a miss or a refused write
  (``ShardLockTimeoutError``), counted, never a hang;
* **crashes**: a worker that dies other than by the coordinator's SIGKILL
  (an exception, SIGSEGV, SIGBUS...) is a violation;
* **spilled values**: a fraction of the sets (``--spill-fraction``) store
  values above the spill threshold (``--spill-threshold``), which the engine
  keeps in files beside the cache; they are verified like every other value,
  and kills land in the middle of writing them.  The engine must never count
  a spilled value as refused (``spill_refused``: a missing, torn or foreign
  file), and at the end a process attaching alone must find exactly one file
  per spilled value (every orphan of a killed writer swept);
* **acknowledged sets**: each worker owns a few keys no one else writes
  or deletes (``o:<slot>:<i>``), a share of them spilled.  After a set of
  one returned, every read must return exactly that value until the key's
  shard shows a reason it may be gone (an eviction, an expiry, a shard
  reset or salvage that lost entries, a lock timeout turning a read into a
  miss): a miss without one is a silent disappearance, a violation;
* **sweeps**: workers sweep the spill directory with no grace
  (``--sweep-weight``) while others spill, publish and pop;
* **lone re-opens during traffic** (``--reopen-interval``): every process
  detaches at once and re-attaches at once, so that one of them opens the
  file alone (repairing, sweeping and recounting the spilled values) while
  the others wait to attach and then write at once;
* **zombies** (``--zombie-fraction`` of the aimed kills): the worker held
  mid-write is SIGKILLed and left unreaped for ``--zombie-hold`` seconds;
  its shard must be taken over and repaired at once all the same;
* **relative opens** (``--relative-fraction`` of worker starts): the
  worker opens the cache through a path relative to its working directory
  and then moves to ``/``;
* **descriptor exhaustion** (``--nofile-weight``): a worker lowers its
  ``RLIMIT_NOFILE`` to what it has open and fills it, reads (spilled values
  may miss then, in that process only), tries a spilled write (refused with
  an error), gives the descriptors back and reads its keys again: nothing
  may be gone for it;
* **at the end** (after ``--settle`` seconds without kills): ``check()``
  must pass, every stored value must still verify, and the engine's
  ``corruptions`` counter must be zero (a kill mid-write is repaired
  through ``salvages``/``resets``; ``corruptions`` only counts
  inconsistencies found in data that claimed to be consistent).

The report gives operations, kills (random and mid-write), shard resets,
evictions, counter rebirths, latency percentiles and the maximum, and the
violations (there must be none; the exit status is 1 otherwise).

Workers are forked from the coordinator and open their own handle on the
cache file, as independent processes would.  Linux only (like nearcache).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import mmap
import os
import random
import resource
import shutil
import signal
import struct
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nearcache import _native
from nearcache.units import parse_size

__all__ = [
    "TortureConfig",
    "TortureReport",
    "counter_regressed",
    "main",
    "make_value",
    "owned_key",
    "parse_value",
    "run",
]

# ----------------------------------------------------------------- shared area

# The coordinator and the workers share one anonymous MAP_SHARED mapping of
# 64-bit words: a few global words, then one block per worker slot.  Each
# word is written by a single process at a time (its slot's worker, or the
# coordinator for the request words), so no lock is needed; a worker killed
# half-way through an update loses at most that update.
_G_STOP = 0
_GLOBAL_WORDS = 8

_OPS = 0  # operations completed
_VIOLATIONS = 1  # violations found by this slot's workers
_MAX_LAT = 2  # slowest operation, ns
_MAX_LAT_OP = 3  # its op code
_OP_START = 4  # CLOCK_MONOTONIC ns when the current operation started, 0 if idle
_HOLD_REQ = 5  # coordinator: key index + 1 to hold mid-write
_HOLDING = 6  # worker: 1 when about to enter the hold
_HITS = 7
_MISSES = 8
_REBIRTHS = 9  # counters found missing and created again
_VERIFIED = 10  # values checked (torn/foreign/flags/stale/expiry)
_STARTS = 11  # worker incarnations started in this slot
_EXPIRY_CHECKS = 12  # values read past their embedded expiry, checked with the engine
_WRITE_TIMEOUTS = 13  # writes refused with ShardLockTimeoutError (a peer held the lock)
_PAUSED = 14  # worker: 1 while detached for a re-open storm
_OWNED = 15  # reads of owned keys checked against their acknowledged value
_HIST = 16  # latency histogram: bucket b counts ops of [2^b, 2^(b+1)) ns
_HIST_BUCKETS = 40
_OWNED_FORGIVEN = _HIST + _HIST_BUCKETS  # owned keys gone with a counted reason
_SWEEPS = _OWNED_FORGIVEN + 1  # sweeps run by this slot's workers
_SWEPT = _OWNED_FORGIVEN + 2  # files they removed
_NOFILE = _OWNED_FORGIVEN + 3  # descriptor-exhaustion episodes
_NOFILE_REFUSED = _OWNED_FORGIVEN + 4  # operations refused for want of a descriptor
_RELATIVE = _OWNED_FORGIVEN + 5  # worker starts that opened through a relative path
_SLOT_WORDS = _HIST + _HIST_BUCKETS + 8
_G_PAUSE = 1  # coordinator: 1 while every process must detach (re-open storm)
_G_CAS_ACKED = 2  # words 2..2+_CAS_TOTAL_PROCS: CAS increments acknowledged per process
_CAS_TOTAL_PROCS = 4
_CAS_TOTAL_KEY = b"cas:total"

_OP_NAMES = (
    "get",
    "get_many",
    "set",
    "add",
    "set_many",
    "delete",
    "pop",
    "incr",
    "counter_get",
    "cas_incr",
    "owned_set",
    "owned_get",
    "sweep",
    "nofile",
)
_OP_WEIGHTS = (34, 10, 22, 6, 3, 6, 2, 9, 5, 3, 4, 6)  # sweep and nofile: from the config
_OWNED_KEYS = 12  # keys each worker owns
_OWNED_SPILL_FRACTION = 0.3  # share of owned values kept in files

_MAGIC = b"NCT1"
_HEAD = struct.Struct("<4sHIQQI")  # magic, key len, writer, seq, expires_ms, flags
_SUM_LEN = 8
_FLAG_BASE = _native.FLAG_USER
_COUNTER_FLAG = _native.FLAG_INT


def _words(area: mmap.mmap) -> memoryview:
    return memoryview(area).cast("Q")


def _slot(slot: int, field: int) -> int:
    return _GLOBAL_WORDS + slot * _SLOT_WORDS + field


# ----------------------------------------------------------------- values


def data_key(i: int) -> bytes:
    """The ``i``-th key holding self-describing values."""
    return b"k:%d" % i


def counter_key(i: int) -> bytes:
    """The ``i``-th counter key."""
    return b"c:%d" % i


def owned_key(slot: int, i: int) -> bytes:
    """The ``i``-th key owned by worker slot ``slot`` (no one else writes it)."""
    return b"o:%d:%d" % (slot, i)


# Shard counters that move when an entry may leave without being deleted:
# a read miss of an owned key is allowed only after one of them moved.
_GONE_REASONS = ("evictions", "expirations", "resets", "entries_lost", "lock_timeouts")


def make_value(key: bytes, writer: int, seq: int, expires_ms: int, flags: int, size: int) -> bytes:
    """A value naming its key, writer, sequence, expiry and flags, with a checksum.

    ``size`` is the payload length; the payload is derived from the header,
    so a value cannot be mistaken for another one that shares its header.
    """
    head = _HEAD.pack(_MAGIC, len(key), writer, seq, expires_ms, flags) + key
    block = hashlib.blake2b(head, digest_size=64).digest()
    payload = (block * (size // 64 + 1))[:size]
    body = head + payload
    return body + hashlib.blake2b(body, digest_size=_SUM_LEN).digest()


@dataclasses.dataclass(frozen=True)
class ValueInfo:
    """What a verified value says about itself."""

    writer: int
    seq: int
    expires_ms: int
    flags: int


def parse_value(key: bytes, value: bytes) -> ValueInfo:
    """Verify ``value`` as a whole value written for ``key``; raise ValueError if not."""
    if len(value) < _HEAD.size + len(key) + _SUM_LEN:
        raise ValueError(f"short value ({len(value)} bytes)")
    body, digest = value[:-_SUM_LEN], value[-_SUM_LEN:]
    if hashlib.blake2b(body, digest_size=_SUM_LEN).digest() != digest:
        raise ValueError("checksum mismatch (torn value)")
    magic, key_len, writer, seq, expires_ms, flags = _HEAD.unpack_from(body)
    if magic != _MAGIC:
        raise ValueError("bad magic")
    stored_key = body[_HEAD.size : _HEAD.size + key_len]
    if stored_key != key:
        raise ValueError(f"foreign value: written for {stored_key!r}")
    head = body[: _HEAD.size + key_len]
    block = hashlib.blake2b(head, digest_size=64).digest()
    size = len(body) - len(head)
    if body[len(head) :] != (block * (size // 64 + 1))[:size]:
        raise ValueError("payload does not match its header")
    return ValueInfo(writer, seq, expires_ms, flags)


def counter_regressed(last: tuple[int, int] | None, value: int, strict: bool) -> bool:
    """Whether counter ``value`` went backwards from ``last`` = (birth, count).

    A counter's high 32 bits are its birth id, the low 32 bits its count.  A
    different birth id means the counter vanished and was created again:
    allowed.  Under the same birth id the count must not shrink, and must
    grow (``strict``) when the observer itself just incremented it.
    """
    if last is None or last[0] != value >> 32:
        return False
    count = value & 0xFFFFFFFF
    return count < last[1] or (strict and count == last[1])


# ----------------------------------------------------------------- config


@dataclasses.dataclass
class TortureConfig:
    """Parameters of one torture run (see ``--help`` for each)."""

    duration: float = 60.0
    workers: int = 8
    size: int = 1 << 20
    shards: int = 8
    keys: int = 3000
    counters: int = 48
    max_value: int = 2048
    kill_interval: float = 0.2
    hold_fraction: float = 0.3
    max_hold: float = 0.05
    latency_bound: float = 2.0
    stall_limit: float = 10.0
    settle: float = 1.0
    ttl_fraction: float = 0.15
    spill_fraction: float = 0.01
    spill_threshold: int = 16384
    sweep_weight: float = 1.0
    reopen_interval: float = 15.0
    zombie_fraction: float = 0.3
    zombie_hold: float = 1.0
    relative_fraction: float = 0.25
    nofile_weight: float = 0.3
    seed: int | None = None
    directory: str | None = None
    keep: bool = False
    #: How the shards admit new entries ("adaptive", "strict", "lenient"):
    #: pinned on the file before the workers start.
    eviction_mode: str = "adaptive"


@dataclasses.dataclass
class TortureReport:
    """Figures of one run; ``violations`` must be 0."""

    duration_s: float
    workers: int
    cache_bytes: int
    shards: int
    seed: int
    operations: int
    ops_per_second: float
    values_verified: int
    hits: int
    misses: int
    kills: int
    kills_random: int
    kills_mid_write: int
    mid_write_kills_repaired: int
    entries_lost_per_mid_write_kill: float
    worker_starts: int
    shard_resets: int
    shard_salvages: int
    entries_lost: int
    lock_timeouts: int
    write_timeouts: int
    corruptions: int
    evictions: int
    compactions: int
    counter_rebirths: int
    expiry_checks: int
    latency_p50_us: float
    latency_p99_us: float
    latency_p999_us: float
    latency_max_ms: float
    latency_max_op: str
    latency_bound_ms: float
    final_check: dict[str, int]
    spill: dict[str, int]
    faults: dict[str, int]
    violations: int
    violation_kinds: dict[str, int]
    violation_samples: list[dict[str, Any]]

    def as_dict(self) -> dict[str, Any]:
        """The report as plain data (for ``--json``)."""
        return dataclasses.asdict(self)

    def render(self) -> str:
        """A human-readable summary."""
        lines = [
            f"nearcache torture: {self.duration_s:.1f} s, {self.workers} workers, "
            f"{self.cache_bytes} byte cache in {self.shards} shards, seed {self.seed}",
            f"  operations          {self.operations:,} ({self.ops_per_second:,.0f}/s), "
            f"{self.values_verified:,} values verified, hits {self.hits:,}, "
            f"misses {self.misses:,}",
            f"  kills survived      {self.kills:,} ({self.kills_random:,} random, "
            f"{self.kills_mid_write:,} mid-write, {self.mid_write_kills_repaired:,} of "
            "them seen repaired)",
            f"  entries lost        {self.entries_lost_per_mid_write_kill:.2f} per mid-write kill; "
            f"{self.entries_lost:,} in all repairs",
            f"  worker starts       {self.worker_starts:,}",
            f"  shard repairs       {self.shard_salvages:,} kept complete entries, "
            f"{self.shard_resets:,} resets; corruptions {self.corruptions:,}",
            f"  lock timeouts       {self.lock_timeouts:,} "
            f"({self.write_timeouts:,} writes refused)",
            f"  evictions           {self.evictions:,} in {self.compactions:,} compactions; "
            f"counter rebirths {self.counter_rebirths:,}; late-read expiry checks "
            f"{self.expiry_checks:,}",
            f"  latency             p50 {self.latency_p50_us:.1f} us, p99 "
            f"{self.latency_p99_us:.1f} us, p99.9 {self.latency_p999_us:.1f} us, "
            f"max {self.latency_max_ms:.2f} ms ({self.latency_max_op}); "
            f"bound {self.latency_bound_ms:.0f} ms",
            f"  final check         {self.final_check}",
            f"  spilled values      {self.spill.get('spilled_values', 0):,} "
            f"({self.spill.get('spilled_bytes', 0):,} bytes) in "
            f"{self.spill.get('files', 0):,} files after a lone reopen",
            f"  faults              {self.faults}",
            f"  violations          {self.violations} {self.violation_kinds or ''}".rstrip(),
        ]
        lines += [f"    {json.dumps(v, sort_keys=True)}" for v in self.violation_samples]
        return "\n".join(lines)


# ----------------------------------------------------------------- worker


class _Worker:
    """One worker process's loop (runs in a forked child)."""

    def __init__(
        self, cfg: TortureConfig, path: str, words: memoryview, slot: int, run_dir: Path
    ) -> None:
        self.cfg = cfg
        self.words = words
        self.slot = slot
        self.base = _slot(slot, 0)
        incarnation = words[self.base + _STARTS] & 0xFFFFFF
        self.writer = ((slot & 0xFF) << 24) | incarnation
        seed = cfg.seed if cfg.seed is not None else 0
        self.rng = random.Random(hash((seed, slot, incarnation, os.getpid())))
        self.violation_fd = os.open(
            run_dir / f"violations-{slot}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600
        )
        self.path = path
        # Some workers open through a relative path, then move away (as
        # daemons do): the engine must keep naming the same files.
        self.relative = self.rng.random() < cfg.relative_fraction
        if self.relative:
            words[self.base + _RELATIVE] += 1
        self.cache = self.open_cache()
        self.max_value = max(16, min(cfg.max_value, self.cache.max_entry_size - 256))
        self.seq = 0
        self.seen: dict[tuple[int, int], int] = {}
        self.counters: dict[int, tuple[int, int]] = {}
        # Owned key index -> (seq, flags, shard counters before the set, spilled).
        self.owned: dict[int, tuple[int, int, tuple[int, ...], bool]] = {}
        self.weights = [*_OP_WEIGHTS, cfg.sweep_weight, cfg.nofile_weight]

    def open_cache(self) -> _native.NativeCache:
        """Open this worker's handle (relative workers: from the cache's
        directory, then move to ``/``)."""
        threshold = self.cfg.spill_threshold
        if not self.relative:
            return _native.NativeCache(self.path, 0, create=False, spill_threshold=threshold)
        os.chdir(os.path.dirname(self.path))
        try:
            return _native.NativeCache(
                os.path.basename(self.path), 0, create=False, spill_threshold=threshold
            )
        finally:
            os.chdir("/")

    # -- bookkeeping

    def violation(self, kind: str, **detail: Any) -> None:
        record = {"kind": kind, "slot": self.slot, "writer": self.writer, "pid": os.getpid()}
        record.update({k: repr(v) if isinstance(v, bytes) else v for k, v in detail.items()})
        os.write(self.violation_fd, (json.dumps(record) + "\n").encode())
        self.words[self.base + _VIOLATIONS] += 1

    def timed(self, op: int, start: int) -> None:
        elapsed = time.perf_counter_ns() - start
        w, b = self.words, self.base
        w[b + _OP_START] = 0
        w[b + _OPS] += 1
        w[b + _HIST + min(max(elapsed, 1).bit_length() - 1, _HIST_BUCKETS - 1)] += 1
        if elapsed > w[b + _MAX_LAT]:
            w[b + _MAX_LAT] = elapsed
            w[b + _MAX_LAT_OP] = op
        if elapsed > self.cfg.latency_bound * 1e9:
            self.violation("slow operation", op=_OP_NAMES[op], ms=elapsed / 1e6)

    def begin(self) -> int:
        self.words[self.base + _OP_START] = time.monotonic_ns()
        return time.perf_counter_ns()

    # -- values

    def pick_ttl(self) -> int | None:
        """A short TTL in ms for some values, None (no expiry) for the others."""
        if self.rng.random() < self.cfg.ttl_fraction:
            return self.rng.randrange(1, 500)
        return None

    def new_value(self, key: bytes, ttl_ms: int | None) -> tuple[bytes, int]:
        """A fresh value for ``key`` to be stored with ``ttl_ms``: (bytes, flags)."""
        self.seq += 1
        r = self.rng.random()
        if r < self.cfg.spill_fraction:
            # Kept in a file beside the cache.
            threshold = self.cfg.spill_threshold
            size = self.rng.randrange(threshold + 1, threshold * 16)
        elif r < 0.7:
            size = self.rng.randrange(0, 256)
        elif r < 0.97:
            size = self.rng.randrange(256, self.max_value)
        else:
            size = self.rng.randrange(self.max_value, max(self.max_value + 1, self.max_value * 8))
            size = min(size, self.cache.max_entry_size - 160 - len(key))
        # The engine computes the expiry from its own clock, read after ours,
        # so the embedded time is a lower bound of the real one.
        expires = time.time_ns() // 1_000_000 + ttl_ms if ttl_ms else 0
        flags = _FLAG_BASE + self.seq % 1000
        return make_value(key, self.writer, self.seq, expires, flags, size), flags

    def verify(self, key_index: int, key: bytes, got: tuple[bytes, int], before_ms: int) -> None:
        value, flags = got
        self.words[self.base + _VERIFIED] += 1
        try:
            info = parse_value(key, value)
        except ValueError as exc:
            self.violation("bad value", key=key, error=str(exc), length=len(value))
            return
        if info.flags != flags:
            self.violation("flags mismatch", key=key, stored=info.flags, returned=flags)
        if info.expires_ms and before_ms > info.expires_ms:
            self.check_expiry(key, info, before_ms)
        seen_key = (key_index, info.writer)
        last = self.seen.get(seen_key)
        if last is not None and info.seq < last:
            self.violation(
                "stale value", key=key, writer=info.writer, seq=info.seq, already_seen=last
            )
        else:
            self.seen[seen_key] = info.seq

    def check_expiry(self, key: bytes, info: ValueInfo, before_ms: int) -> None:
        """A value read after its embedded expiry: ask the engine for the real one.

        The embedded time is a lower bound (the engine reads its clock when
        the set reaches it).  Read the entry's expiry and the value again: if
        the value is unchanged (same writer and sequence, which are never
        reused), that expiry is the one it had when we read it, and it must
        lie after the moment just before our read.
        """
        self.words[self.base + _EXPIRY_CHECKS] += 1
        t = self.begin()
        expires = self.cache.expire_at_ms(key)
        again = self.cache.get_entry(key)
        self.timed(_OP_NAMES.index("get"), t)
        if expires is None or again is None:
            return
        try:
            same = parse_value(key, again[0])
        except ValueError:
            return  # reported by the next read that verifies it
        if (same.writer, same.seq) != (info.writer, info.seq):
            return
        if expires == 0:
            self.violation("expiry lost", key=key, embedded_ms=info.expires_ms)
        elif expires <= before_ms:
            self.violation(
                "expired value returned", key=key, expired_ms=expires, read_at_ms=before_ms
            )

    def observe_counter(self, index: int, value: int, strict: bool) -> None:
        last = self.counters.get(index)
        if counter_regressed(last, value, strict):
            assert last is not None
            self.violation(
                "counter went backwards",
                key=counter_key(index),
                birth=value >> 32,
                count=value & 0xFFFFFFFF,
                previous=last[1],
            )
        self.counters[index] = (value >> 32, value & 0xFFFFFFFF)

    # -- operations

    # -- owned keys: acknowledged sets must stay readable

    def gone_reasons(self, key: bytes) -> tuple[int, ...]:
        """The counters of ``key``'s shard that move when an entry may leave."""
        stats = self.cache.shard_stats()[self.cache.shard_of(key)]
        return tuple(stats[r] for r in _GONE_REASONS)

    def owned_set(self, op: int, spilled: bool) -> None:
        j = self.rng.randrange(_OWNED_KEYS)
        key = owned_key(self.slot, j)
        before = self.gone_reasons(key)
        self.seq += 1
        threshold = self.cfg.spill_threshold
        size = (
            self.rng.randrange(threshold + 1, threshold * 4)
            if spilled
            else self.rng.randrange(0, 256)
        )
        flags = _FLAG_BASE + self.seq % 1000
        value = make_value(key, self.writer, self.seq, 0, flags, size)
        t = self.begin()
        self.cache.set(key, value, None, flags)
        self.timed(op, t)
        # Acknowledged: readable from now on until its shard shows a reason.
        self.owned[j] = (self.seq, flags, before, spilled)

    def check_owned(self, j: int, got: tuple[bytes, int] | None, local_miss: bool = False) -> None:
        """Check a read of owned key ``j`` against its acknowledged value.

        ``local_miss``: this process is out of descriptors, so a spilled
        value may miss here (and only here).
        """
        seq, flags, before, spilled = self.owned[j]
        key = owned_key(self.slot, j)
        self.words[self.base + _OWNED] += 1
        if got is None:
            if local_miss and spilled:
                return
            if self.gone_reasons(key) != before:
                self.words[self.base + _OWNED_FORGIVEN] += 1
            else:
                self.violation("acknowledged value vanished", key=key, seq=seq, spilled=spilled)
            del self.owned[j]
            return
        self.words[self.base + _VERIFIED] += 1
        try:
            info = parse_value(key, got[0])
        except ValueError as exc:
            self.violation("bad value", key=key, error=str(exc), length=len(got[0]))
            return
        if (info.writer, info.seq, got[1]) != (self.writer, seq, flags):
            self.violation(
                "owned key holds another value",
                key=key,
                expected_seq=seq,
                writer=info.writer,
                seq=info.seq,
            )

    def owned_get(self, op: int) -> None:
        if not self.owned:
            self.owned_set(op, self.rng.random() < _OWNED_SPILL_FRACTION)
            return
        j = self.rng.choice(sorted(self.owned))
        t = self.begin()
        got = self.cache.get_entry(owned_key(self.slot, j))
        self.timed(op, t)
        self.check_owned(j, got)

    def sweep(self, op: int) -> None:
        """Sweep the spill directory with no grace while others spill."""
        t = self.begin()
        removed = self.cache._debug_sweep_spilled(0.0)
        self.timed(op, t)
        self.words[self.base + _SWEEPS] += 1
        self.words[self.base + _SWEPT] += removed

    def nofile(self, op: int) -> None:
        """Run out of descriptors, read and write, give them back, read again."""
        self.words[self.base + _NOFILE] += 1
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        held: list[int] = []
        resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 2, hard))
        try:
            with contextlib.suppress(OSError):
                while True:
                    held.append(os.open("/dev/null", os.O_RDONLY))
            for j in sorted(self.owned):
                t = self.begin()
                got = self.cache.get_entry(owned_key(self.slot, j))
                self.timed(op, t)
                self.check_owned(j, got, local_miss=True)
            try:
                self.owned_set(op, spilled=True)
            except OSError:
                # Spilling needs a descriptor: refused, nothing changed.
                self.words[self.base + _OP_START] = 0
                self.words[self.base + _NOFILE_REFUSED] += 1
        finally:
            for fd in held:
                os.close(fd)
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for j in sorted(self.owned):
            t = self.begin()
            got = self.cache.get_entry(owned_key(self.slot, j))
            self.timed(op, t)
            self.check_owned(j, got)

    def pause(self) -> None:
        """Detach for a re-open storm, then attach again with everyone else."""
        words, base = self.words, self.base
        self.cache.close()
        del self.cache  # the mapping goes with the last handle: detached
        words[base + _PAUSED] = 1
        while words[_G_PAUSE] and not words[_G_STOP]:
            time.sleep(0.0002)
        words[base + _OP_START] = time.monotonic_ns()
        self.cache = self.open_cache()
        words[base + _OP_START] = 0
        words[base + _PAUSED] = 0

    def step(self) -> None:
        cfg, rng, cache = self.cfg, self.rng, self.cache
        op = rng.choices(range(len(_OP_NAMES)), self.weights)[0]
        name = _OP_NAMES[op]
        i = rng.randrange(cfg.keys)
        key = data_key(i)
        now_ms = time.time_ns() // 1_000_000
        try:
            if name == "get":
                t = self.begin()
                got = cache.get_entry(key)
                self.timed(op, t)
                self.count_hit(got is not None)
                if got is not None:
                    self.verify(i, key, got, now_ms)
            elif name == "get_many":
                idx = [rng.randrange(cfg.keys) for _ in range(rng.randrange(2, 17))]
                keys = [data_key(j) for j in idx]
                t = self.begin()
                many = cache.get_many(keys)
                self.timed(op, t)
                if len(many) != len(keys):
                    self.violation("get_many length", asked=len(keys), got=len(many))
                for j, k, hit in zip(idx, keys, many, strict=False):
                    self.count_hit(hit is not None)
                    if hit is not None:
                        self.verify(j, k, hit, now_ms)
            elif name in ("set", "add"):
                ttl = self.pick_ttl()
                value, flags = self.new_value(key, ttl)
                t = self.begin()
                if name == "set":
                    cache.set(key, value, ttl, flags)
                else:
                    cache.add(key, value, ttl, flags)
                self.timed(op, t)
            elif name == "set_many":
                idx = rng.sample(range(cfg.keys), rng.randrange(2, 9))
                ttl = self.pick_ttl()
                items = []
                for j in idx:
                    value, flags = self.new_value(data_key(j), ttl)
                    items.append((data_key(j), value, flags))
                t = self.begin()
                cache.set_many(items, ttl)
                self.timed(op, t)
            elif name == "delete":
                if rng.random() < 0.2:
                    key = counter_key(rng.randrange(cfg.counters))
                t = self.begin()
                cache.delete(key)
                self.timed(op, t)
            elif name == "pop":
                t = self.begin()
                popped = cache.pop(key)
                self.timed(op, t)
                self.count_hit(popped is not None)
                if popped is not None:
                    self.verify(i, key, popped, now_ms)
            elif name == "incr":
                self.incr(op)
            elif name == "cas_incr":
                self.cas_incr(op)
            elif name == "counter_get":
                self.counter_get(op)
            elif name == "owned_set":
                self.owned_set(op, rng.random() < _OWNED_SPILL_FRACTION)
            elif name == "owned_get":
                self.owned_get(op)
            elif name == "sweep":
                self.sweep(op)
            else:
                self.nofile(op)
        except _native.ShardLockTimeoutError:
            # A peer held the shard lock past the lock timeout (a worker
            # held mid-write before its kill): the write was refused,
            # nothing changed. Bounded waits are the point; count it.
            self.words[self.base + _OP_START] = 0
            self.words[self.base + _WRITE_TIMEOUTS] += 1
        except Exception as exc:  # every error is a finding, with its traceback
            self.words[self.base + _OP_START] = 0
            self.violation(
                "exception",
                op=name,
                error=f"{type(exc).__name__}: {exc}",
                trace=traceback.format_exc(limit=4),
            )

    def count_hit(self, hit: bool) -> None:
        self.words[self.base + (_HITS if hit else _MISSES)] += 1

    def incr(self, op: int) -> None:
        index = self.rng.randrange(self.cfg.counters)
        key = counter_key(index)
        delta = self.rng.randrange(1, 4)
        for _attempt in range(4):
            t = self.begin()
            try:
                value = self.cache.incr(key, delta, None)
            except KeyError:
                self.timed(op, t)
                birth = self.rng.randrange(1, 1 << 31)
                self.words[self.base + _REBIRTHS] += 1
                t = self.begin()
                self.cache.add(key, (birth << 32).to_bytes(8, "little"), None, _COUNTER_FLAG)
                self.timed(op, t)
                continue
            self.timed(op, t)
            self.observe_counter(index, value, strict=True)
            return

    def cas_incr(self, op: int) -> None:
        """Increment a counter by compare-and-swap (read it with its version,
        write the sum only if the version is unchanged), racing the in-place
        increments of the same counters.  A CAS that stored over a write it
        did not read would take the counter back below a count its writer
        saw: the strict check of that writer's next increment catches it."""
        index = self.rng.randrange(self.cfg.counters)
        key = counter_key(index)
        delta = self.rng.randrange(1, 4)
        for _attempt in range(8):
            t = self.begin()
            got = self.cache.get_entry_versioned(key)
            self.timed(op, t)
            self.count_hit(got is not None)
            if got is None:
                return  # incr creates counters, with their birth id
            value, flags, version = got
            if flags != _COUNTER_FLAG or len(value) != 8:
                self.violation(
                    "counter has a foreign value", key=key, flags=flags, length=len(value)
                )
                return
            old = int.from_bytes(value, "little", signed=True)
            self.observe_counter(index, old, strict=False)
            new = (old + delta).to_bytes(8, "little", signed=True)
            t = self.begin()
            stored, _ = self.cache.cas(key, new, version, None, _COUNTER_FLAG)
            self.timed(op, t)
            if stored:
                self.observe_counter(index, old + delta, strict=True)
                return

    def counter_get(self, op: int) -> None:
        index = self.rng.randrange(self.cfg.counters)
        key = counter_key(index)
        t = self.begin()
        got = self.cache.get_entry(key)
        self.timed(op, t)
        self.count_hit(got is not None)
        if got is None:
            return
        value, flags = got
        if flags != _COUNTER_FLAG or len(value) != 8:
            self.violation("counter has a foreign value", key=key, flags=flags, length=len(value))
            return
        self.observe_counter(index, int.from_bytes(value, "little", signed=True), strict=False)

    def hold(self) -> None:
        """Hold a shard mid-write until the coordinator kills this process."""
        index = self.words[self.base + _HOLD_REQ] - 1
        self.words[self.base + _HOLDING] = 1
        self.cache._debug_hold_shard_mid_write(data_key(index), 3600.0)
        # Only reached if the coordinator gave up on killing us.
        self.words[self.base + _HOLD_REQ] = 0
        self.words[self.base + _HOLDING] = 0

    def loop(self) -> None:
        words, base = self.words, self.base
        while not words[_G_STOP]:
            if words[_G_PAUSE]:
                self.pause()
            elif words[base + _HOLD_REQ]:
                self.hold()
            else:
                self.step()


def _worker_main(cfg: TortureConfig, path: str, area: mmap.mmap, slot: int, run_dir: Path) -> None:
    """Entry point of a forked worker; never returns."""
    code = 0
    try:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _drop_inherited(path)
        words = _words(area)
        _Worker(cfg, path, words, slot, run_dir).loop()
    except BaseException:
        traceback.print_exc()
        code = 3
    finally:
        os._exit(code)


def _drop_inherited(path: str) -> None:
    """Close the descriptors of the cache (and its spill directory) this
    forked worker inherited from the coordinator's handle, which it never
    uses: they share the coordinator's attach lock, and would keep the file
    attached after the coordinator detached (no open could then be alone).
    The inherited handle itself is never dropped in the child."""
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target in (path, f"{path}.spill"):
            with contextlib.suppress(OSError):
                os.close(int(name))


def _cas_total_main(path: str, area: mmap.mmap, index: int, increments: int) -> None:
    """A forked process adding 1 to one counter ``increments`` times by
    compare-and-swap (read with its version, store only if unchanged, retry
    on a conflict), counting each acknowledged increment in the shared area
    after ``cas`` returned. Never returns."""
    code = 0
    try:
        words = _words(area)
        cache = _native.NativeCache(path, 0, create=False)
        zero = (0).to_bytes(8, "little", signed=True)
        for _ in range(increments):
            while True:
                got = cache.get_entry_versioned(_CAS_TOTAL_KEY)
                if got is None:
                    cache.cas(_CAS_TOTAL_KEY, zero, 0, None, _COUNTER_FLAG)
                    continue
                value, _flags, version = got
                new = (int.from_bytes(value, "little", signed=True) + 1).to_bytes(
                    8, "little", signed=True
                )
                stored, _ = cache.cas(_CAS_TOTAL_KEY, new, version, None, _COUNTER_FLAG)
                if stored:
                    break
            words[_G_CAS_ACKED + index] += 1
    except BaseException:
        traceback.print_exc()
        code = 3
    finally:
        os._exit(code)


def _wait_zombie(pid: int, limit: float) -> bool:
    """Wait until killed process ``pid`` is a zombie (exited, not reaped)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        if stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X"):
            return True
        time.sleep(0.0005)
    return False


# ----------------------------------------------------------------- coordinator


def _in_hold(pid: int) -> bool | None:
    """Whether ``pid``'s main thread sleeps in the hold hook (None: cannot tell).

    The worker sleeps nowhere else, so a nanosleep means it is inside
    ``_debug_hold_shard_mid_write``, holding the shard lock mid-write.
    """
    try:
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        return None
    if wchan in ("", "0"):
        return None
    return "nanosleep" in wchan


class _Coordinator:
    def __init__(self, cfg: TortureConfig) -> None:
        self.cfg = cfg
        self.seed = cfg.seed if cfg.seed is not None else random.randrange(1 << 32)
        cfg.seed = self.seed
        self.rng = random.Random(self.seed)
        base = cfg.directory or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
        # Absolute: workers that move to / still name the same files.
        self.run_dir = Path(tempfile.mkdtemp(prefix="nearcache-torture-", dir=base)).resolve()
        self.path = str(self.run_dir / "torture.cache")
        self.cache = _native.NativeCache(
            self.path, cfg.size, cfg.shards, recreate=True, spill_threshold=cfg.spill_threshold
        )
        self.cache.set_eviction_mode(cfg.eviction_mode)
        self.area = mmap.mmap(-1, (_GLOBAL_WORDS + cfg.workers * _SLOT_WORDS) * 8)
        self.words = _words(self.area)
        self.pids: dict[int, int] = {}  # slot -> pid
        self.kills_random = 0
        self.kills_mid_write = 0
        self.repaired = 0
        self.lost_in_aimed_kills = 0
        self.violations: list[dict[str, Any]] = []
        self.zombies: list[tuple[int, float]] = []  # (pid, reap at monotonic time)
        self.zombie_kills = 0
        self.storms = 0

    def violation(self, kind: str, **detail: Any) -> None:
        self.violations.append({"kind": kind, "slot": "coordinator", **detail})

    def start(self, slot: int) -> None:
        self.words[_slot(slot, _HOLD_REQ)] = 0
        self.words[_slot(slot, _HOLDING)] = 0
        self.words[_slot(slot, _OP_START)] = 0
        self.words[_slot(slot, _STARTS)] += 1
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - runs in the child, which exits
            _worker_main(self.cfg, self.path, self.area, slot, self.run_dir)
        self.pids[slot] = pid

    def kill(self, slot: int) -> None:
        pid = self.pids.pop(slot)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
        if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
            self.exited(slot, pid, status)

    def exited(self, slot: int, pid: int, status: int) -> None:
        if os.WIFSIGNALED(status):
            how = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
        else:
            how = f"exit status {os.WEXITSTATUS(status)}"
        self.violation("worker died on its own", worker_slot=slot, pid=pid, how=how)

    def reap(self) -> None:
        """Restart workers that died without being killed (each is a violation)."""
        for slot, pid in list(self.pids.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del self.pids[slot]
                self.exited(slot, pid, status)
                self.start(slot)

    def watchdog(self) -> None:
        now = time.monotonic_ns()
        for slot in list(self.pids):
            started = self.words[_slot(slot, _OP_START)]
            if started and now - started > self.cfg.stall_limit * 1e9:
                self.violation("operation blocked", worker_slot=slot, seconds=(now - started) / 1e9)
                self.kill(slot)
                self.start(slot)

    def kill_leave_zombie(self, slot: int) -> bool:
        """SIGKILL the worker of ``slot`` and leave it unreaped (a zombie) for
        ``--zombie-hold`` seconds; whether it was seen a zombie."""
        pid = self.pids.pop(slot)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        self.zombies.append((pid, time.monotonic() + self.cfg.zombie_hold))
        self.zombie_kills += 1
        return _wait_zombie(pid, self.cfg.stall_limit)

    def reap_zombies(self, everything: bool = False) -> None:
        now = time.monotonic()
        for pid, at in list(self.zombies):
            if everything or now >= at:
                self.zombies.remove((pid, at))
                _, status = os.waitpid(pid, 0)
                if not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
                    self.exited(-1, pid, status)

    def reopen_storm(self) -> None:
        """Every process detaches, then all attach again at once: one of them
        opens alone (repair, sweep, recount) while the others wait, then
        write at once."""
        w = self.words
        w[_G_PAUSE] = 1
        deadline = time.monotonic() + self.cfg.stall_limit
        while not all(w[_slot(s, _PAUSED)] for s in self.pids):
            if time.monotonic() > deadline:
                self.violation("workers did not detach for a re-open")
                break
            self.reap()
            time.sleep(0.001)
        self.cache.close()
        del self.cache  # the coordinator detaches too (zombies hold nothing)
        w[_G_PAUSE] = 0
        time.sleep(self.rng.uniform(0, 0.005))
        self.cache = _native.NativeCache(
            self.path, 0, create=False, spill_threshold=self.cfg.spill_threshold
        )
        self.storms += 1

    def kill_random(self) -> None:
        slot = self.rng.choice(sorted(self.pids))
        self.kill(slot)
        self.kills_random += 1
        self.start(slot)

    def kill_mid_write(self) -> None:
        slot = self.rng.choice(sorted(self.pids))
        pid = self.pids[slot]
        index = self.rng.randrange(self.cfg.keys)
        key = data_key(index)
        shard = self.cache.shard_of(key)
        before = self.cache.shard_stats()[shard]
        self.words[_slot(slot, _HOLDING)] = 0
        self.words[_slot(slot, _HOLD_REQ)] = index + 1
        deadline = time.monotonic() + self.cfg.stall_limit
        confirmed: bool | None = False
        while time.monotonic() < deadline:
            if self.words[_slot(slot, _HOLDING)]:
                confirmed = _in_hold(pid)
                if confirmed is not False:
                    break
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:  # died on its own before reaching the hold
                del self.pids[slot]
                self.exited(slot, pid, status)
                self.words[_slot(slot, _HOLD_REQ)] = 0
                self.start(slot)
                return
            time.sleep(0.0005)
        if confirmed is None:  # no /proc/<pid>/wchan: give the worker time to lock
            time.sleep(0.02)
        if confirmed is False:
            self.violation("worker never reached the hold", worker_slot=slot)
            self.kill(slot)
            self.start(slot)
            return
        time.sleep(self.rng.uniform(0, self.cfg.max_hold))
        if self.rng.random() < self.cfg.zombie_fraction:
            # Killed and not reaped: its shard must be taken over all the same.
            if not self.kill_leave_zombie(slot):
                self.violation("killed worker never became a zombie", worker_slot=slot)
        else:
            self.kill(slot)
        self.kills_mid_write += 1
        # Lock the shard (repairing it if nobody has yet), then look.
        self.cache.contains(key)
        after = self.cache.shard_stats()[shard]
        repairs = (after["resets"] + after["salvages"]) - (before["resets"] + before["salvages"])
        if repairs > 0:
            self.repaired += 1
            self.lost_in_aimed_kills += after["entries_lost"] - before["entries_lost"]
        elif confirmed:
            self.violation("mid-write kill not repaired", shard=shard, resets=after["resets"])
        self.start(slot)

    def run(self) -> TortureReport:
        cfg = self.cfg
        stats0 = self.cache.stats()
        started = time.monotonic()
        try:
            for slot in range(cfg.workers):
                self.start(slot)
            deadline = started + cfg.duration
            next_kill = started + self.next_kill_delay()
            next_storm = started + self.next_storm_delay()
            # The last `settle` seconds run without kills, so the final check
            # sees a cache that was repaired and then used, as in production.
            last_kill = deadline - cfg.settle
            while (now := time.monotonic()) < deadline:
                if now >= next_kill and now < last_kill:
                    if self.rng.random() < cfg.hold_fraction:
                        self.kill_mid_write()
                    else:
                        self.kill_random()
                    next_kill = time.monotonic() + self.next_kill_delay()
                if now >= next_storm and now < last_kill:
                    self.reopen_storm()
                    next_storm = time.monotonic() + self.next_storm_delay()
                self.reap()
                self.reap_zombies()
                self.watchdog()
                wake = min(next_kill, next_storm, deadline)
                time.sleep(min(0.01, max(0.0, wake - time.monotonic())))
            self.stop()
        finally:
            for slot in list(self.pids):
                self.kill(slot)
            self.reap_zombies(everything=True)
        elapsed = time.monotonic() - started
        return self.finish(stats0, elapsed)

    def next_kill_delay(self) -> float:
        """Seconds until the next kill: exponential, so kills land at random moments."""
        if self.cfg.kill_interval <= 0:
            return math.inf
        return self.rng.expovariate(1 / self.cfg.kill_interval)

    def next_storm_delay(self) -> float:
        """Seconds until the next re-open storm (exponential)."""
        if self.cfg.reopen_interval <= 0:
            return math.inf
        return self.rng.expovariate(1 / self.cfg.reopen_interval)

    def stop(self) -> None:
        self.words[_G_STOP] = 1
        deadline = time.monotonic() + self.cfg.stall_limit
        while self.pids and time.monotonic() < deadline:
            for slot, pid in list(self.pids.items()):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    del self.pids[slot]
                    if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0:
                        self.exited(slot, pid, status)
            time.sleep(0.005)
        for slot in list(self.pids):
            self.violation("worker did not stop", worker_slot=slot)

    def final_scan(self) -> dict[str, int]:
        try:
            report = self.cache.check()
        except _native.Error as exc:
            self.violation("final check failed", error=f"{type(exc).__name__}: {exc}")
            report = {}
        for i in range(self.cfg.keys):
            key = data_key(i)
            got = self.cache.get_entry(key)
            if got is not None:
                try:
                    info = parse_value(key, got[0])
                except ValueError as exc:
                    self.violation("bad value at the end", key=repr(key), error=str(exc))
                    continue
                if info.flags != got[1]:
                    self.violation("flags mismatch at the end", key=repr(key))
        for i in range(self.cfg.counters):
            got = self.cache.get_entry(counter_key(i))
            if got is not None and (got[1] != _COUNTER_FLAG or len(got[0]) != 8):
                self.violation("foreign counter at the end", key=repr(counter_key(i)))
        return dict(report)

    def spill_scan(self) -> dict[str, int]:
        """Attach alone (every worker is gone): orphans of killed spill
        writers must be swept, one file per spilled value left."""
        path = self.cache.path
        self.cache.close()
        del self.cache  # the mapping goes with the last handle: the next open is alone
        self.cache = _native.NativeCache(path, 0, create=False)
        stats = self.cache.stats()
        spill_dir = f"{path}.spill"
        files = len(os.listdir(spill_dir)) if os.path.isdir(spill_dir) else 0
        if files != stats["spilled_values"]:
            self.violation(
                "spill files left over", files=files, spilled_values=stats["spilled_values"]
            )
        return {
            "spilled_values": stats["spilled_values"],
            "spilled_bytes": stats["spilled_bytes"],
            "files": files,
        }

    def cas_total(self) -> dict[str, int]:
        """Processes racing compare-and-swap increments of one counter, one
        of them SIGKILLed mid-loop: the total must be the sum of the
        acknowledged increments, or one more (the killed process's last,
        stored but not yet acknowledged). Run after the workers stopped,
        so nothing evicts the counter; a shard reset (a kill inside a
        compaction) is the one counted reason for it to vanish."""
        w, n = self.words, 10_000
        self.cache.delete(_CAS_TOTAL_KEY)
        shard = self.cache.shard_of(_CAS_TOTAL_KEY)
        resets0 = self.cache.shard_stats()[shard]["resets"]
        pids = []
        for index in range(_CAS_TOTAL_PROCS):
            w[_G_CAS_ACKED + index] = 0
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:  # pragma: no cover - runs in the child, which exits
                _cas_total_main(self.path, self.area, index, n)
            pids.append(pid)
        victim = self.rng.randrange(_CAS_TOTAL_PROCS)
        # Mid-loop: once the victim has acknowledged a random share of the
        # first half (the second half leaves the coordinator time to be
        # scheduled on a loaded machine).
        at = self.rng.randrange(1, n // 2)
        deadline = time.monotonic() + self.cfg.stall_limit
        while w[_G_CAS_ACKED + victim] < at and time.monotonic() < deadline:
            time.sleep(0.0002)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[victim], signal.SIGKILL)
        for index, pid in enumerate(pids):
            _, status = os.waitpid(pid, 0)
            if index != victim and not (os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0):
                self.exited(-1, pid, status)
        acked = sum(w[_G_CAS_ACKED + i] for i in range(_CAS_TOTAL_PROCS))
        got = self.cache.get_entry(_CAS_TOTAL_KEY)
        total = int.from_bytes(got[0], "little", signed=True) if got is not None else -1
        reset = self.cache.shard_stats()[shard]["resets"] != resets0
        if not reset and not acked <= total <= acked + 1:
            self.violation("CAS increments lost or doubled", total=total, acknowledged=acked)
        return {
            "cas_total_processes": _CAS_TOTAL_PROCS,
            "cas_total_acknowledged": acked,
            "cas_total_final": total,
            "cas_total_reset": int(reset),
        }

    def finish(self, stats0: dict[str, int], elapsed: float) -> TortureReport:
        cfg, w = self.cfg, self.words
        cas_total = self.cas_total()
        final_check = self.final_scan()
        stats = self.cache.stats()
        if stats["corruptions"] != stats0["corruptions"]:
            self.violation(
                "engine counted corruptions",
                corruptions=stats["corruptions"] - stats0["corruptions"],
            )
        if stats["spill_refused"] != stats0["spill_refused"]:
            self.violation(
                "spilled values refused",
                refused=stats["spill_refused"] - stats0["spill_refused"],
            )
        spill = self.spill_scan()
        samples = list(self.violations)
        kinds: dict[str, int] = {}
        for v in self.violations:
            kinds[v["kind"]] = kinds.get(v["kind"], 0) + 1
        worker_violations = 0
        for slot in range(cfg.workers):
            worker_violations += w[_slot(slot, _VIOLATIONS)]
            log = self.run_dir / f"violations-{slot}.jsonl"
            if not log.exists():
                continue
            for n, line in enumerate(log.read_text().splitlines()):
                try:
                    record = json.loads(line)
                except ValueError:  # a line cut short by a kill
                    continue
                kinds[record["kind"]] = kinds.get(record["kind"], 0) + 1
                if n < 5:
                    samples.append(record)

        def total(field: int) -> int:
            return sum(w[_slot(s, field)] for s in range(cfg.workers))

        hist = [total(_HIST + b) for b in range(_HIST_BUCKETS)]
        max_slot = max(range(cfg.workers), key=lambda s: w[_slot(s, _MAX_LAT)])
        ops = total(_OPS)
        violations = len(self.violations) + worker_violations
        report = TortureReport(
            duration_s=round(elapsed, 3),
            workers=cfg.workers,
            cache_bytes=self.cache.capacity,
            shards=self.cache.shard_count,
            seed=self.seed,
            operations=ops,
            ops_per_second=round(ops / elapsed, 1) if elapsed else 0.0,
            values_verified=total(_VERIFIED),
            hits=total(_HITS),
            misses=total(_MISSES),
            kills=self.kills_random + self.kills_mid_write,
            kills_random=self.kills_random,
            kills_mid_write=self.kills_mid_write,
            mid_write_kills_repaired=self.repaired,
            entries_lost_per_mid_write_kill=round(self.lost_in_aimed_kills / self.repaired, 3)
            if self.repaired
            else 0.0,
            worker_starts=total(_STARTS),
            shard_resets=stats["resets"] - stats0["resets"],
            shard_salvages=stats["salvages"] - stats0["salvages"],
            entries_lost=stats["entries_lost"] - stats0["entries_lost"],
            lock_timeouts=stats["lock_timeouts"] - stats0["lock_timeouts"],
            write_timeouts=total(_WRITE_TIMEOUTS),
            corruptions=stats["corruptions"] - stats0["corruptions"],
            evictions=stats["evictions"] - stats0["evictions"],
            compactions=stats["compactions"] - stats0["compactions"],
            counter_rebirths=total(_REBIRTHS),
            expiry_checks=total(_EXPIRY_CHECKS),
            latency_p50_us=_percentile(hist, 0.5) / 1e3,
            latency_p99_us=_percentile(hist, 0.99) / 1e3,
            latency_p999_us=_percentile(hist, 0.999) / 1e3,
            latency_max_ms=w[_slot(max_slot, _MAX_LAT)] / 1e6,
            latency_max_op=_OP_NAMES[w[_slot(max_slot, _MAX_LAT_OP)]],
            latency_bound_ms=cfg.latency_bound * 1e3,
            final_check=final_check,
            spill=spill,
            faults={
                "reopen_storms": self.storms,
                "zombie_kills": self.zombie_kills,
                "sweeps": total(_SWEEPS),
                "swept_files": total(_SWEPT),
                "nofile_episodes": total(_NOFILE),
                "nofile_refused_writes": total(_NOFILE_REFUSED),
                "relative_opens": total(_RELATIVE),
                "owned_reads": total(_OWNED),
                "owned_gone_with_reason": total(_OWNED_FORGIVEN),
                **cas_total,
            },
            violations=violations,
            violation_kinds=kinds,
            violation_samples=samples[:20],
        )
        self.cache.close()
        if not cfg.keep and violations == 0:
            shutil.rmtree(self.run_dir, ignore_errors=True)
        return report


def _percentile(hist: Sequence[int], q: float) -> float:
    """Upper edge (ns) of the histogram bucket holding quantile ``q``."""
    n = sum(hist)
    if n == 0:
        return 0.0
    rank = q * n
    seen = 0
    for b, count in enumerate(hist):
        seen += count
        if seen >= rank:
            return float(2 ** (b + 1))
    return float(2 ** len(hist))


def run(cfg: TortureConfig) -> TortureReport:
    """Run the torture test described by ``cfg`` and return its report.

    Must be called from the main thread of a process that may fork (the
    workers are forked from it).
    """
    if cfg.workers < 1:
        raise ValueError("workers must be at least 1")
    if cfg.keys < 16 or cfg.counters < 1:
        raise ValueError("keys must be at least 16 and counters at least 1")
    return _Coordinator(cfg).run()


# ----------------------------------------------------------------- command line


def _parser() -> argparse.ArgumentParser:
    d = TortureConfig()
    p = argparse.ArgumentParser(
        prog="nearcache torture",
        description="Hammer a small cache from many processes while killing them; "
        "verify every value, counter and latency; exit 1 on any violation.",
    )
    p.add_argument("--duration", type=float, default=d.duration, help="seconds to run")
    p.add_argument("--workers", type=int, default=d.workers, help="worker processes")
    p.add_argument("--size", default=str(d.size), help="cache size (bytes or e.g. 1MiB)")
    p.add_argument("--shards", type=int, default=d.shards, help="shard count (power of two)")
    p.add_argument("--keys", type=int, default=d.keys, help="distinct value keys")
    p.add_argument("--counters", type=int, default=d.counters, help="distinct counter keys")
    p.add_argument("--max-value", type=int, default=d.max_value, help="usual largest payload")
    p.add_argument(
        "--kill-interval",
        type=float,
        default=d.kill_interval,
        help="mean seconds between kills (0: no kills)",
    )
    p.add_argument(
        "--hold-fraction",
        type=float,
        default=d.hold_fraction,
        help="share of kills aimed mid-write",
    )
    p.add_argument(
        "--max-hold",
        type=float,
        default=d.max_hold,
        help="longest wait (s) before killing a worker held mid-write",
    )
    p.add_argument(
        "--latency-bound",
        type=float,
        default=d.latency_bound,
        help="seconds an operation may take before it counts as a violation",
    )
    p.add_argument(
        "--stall-limit",
        type=float,
        default=d.stall_limit,
        help="seconds after which a blocked operation is killed by the watchdog",
    )
    p.add_argument(
        "--settle",
        type=float,
        default=d.settle,
        help="seconds at the end without kills, before the final check",
    )
    p.add_argument(
        "--spill-fraction",
        type=float,
        default=d.spill_fraction,
        help="fraction of sets whose value is above the spill threshold (kept in a file)",
    )
    p.add_argument(
        "--spill-threshold",
        default=str(d.spill_threshold),
        help="values longer than this are kept in files beside the cache",
    )
    p.add_argument(
        "--sweep-weight",
        type=float,
        default=d.sweep_weight,
        help="weight of no-grace spill sweeps among worker operations (0: none)",
    )
    p.add_argument(
        "--reopen-interval",
        type=float,
        default=d.reopen_interval,
        help="mean seconds between re-open storms, where one process opens alone (0: none)",
    )
    p.add_argument(
        "--zombie-fraction",
        type=float,
        default=d.zombie_fraction,
        help="share of mid-write kills whose victim is left unreaped for a while",
    )
    p.add_argument(
        "--zombie-hold",
        type=float,
        default=d.zombie_hold,
        help="seconds a killed worker stays a zombie before it is reaped",
    )
    p.add_argument(
        "--relative-fraction",
        type=float,
        default=d.relative_fraction,
        help="share of worker starts that open through a relative path, then chdir to /",
    )
    p.add_argument(
        "--nofile-weight",
        type=float,
        default=d.nofile_weight,
        help="weight of descriptor-exhaustion episodes among worker operations (0: none)",
    )
    p.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    p.add_argument("--dir", default=None, help="directory for the run (default: /dev/shm)")
    p.add_argument(
        "--eviction-mode",
        choices=("adaptive", "strict", "lenient"),
        default=d.eviction_mode,
        help="how the shards admit new entries when full (pinned on the file)",
    )
    p.add_argument("--keep", action="store_true", help="keep the run directory")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point; returns 0 when there were no violations."""
    args = _parser().parse_args(argv)
    cfg = TortureConfig(
        duration=args.duration,
        workers=args.workers,
        size=parse_size(args.size),
        shards=args.shards,
        keys=args.keys,
        counters=args.counters,
        max_value=args.max_value,
        kill_interval=args.kill_interval,
        hold_fraction=args.hold_fraction,
        max_hold=args.max_hold,
        latency_bound=args.latency_bound,
        stall_limit=args.stall_limit,
        settle=args.settle,
        seed=args.seed,
        directory=args.dir,
        keep=args.keep,
        spill_fraction=args.spill_fraction,
        spill_threshold=parse_size(args.spill_threshold),
        sweep_weight=args.sweep_weight,
        reopen_interval=args.reopen_interval,
        zombie_fraction=args.zombie_fraction,
        zombie_hold=args.zombie_hold,
        relative_fraction=args.relative_fraction,
        nofile_weight=args.nofile_weight,
        eviction_mode=args.eviction_mode,
    )
    report = run(cfg)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    else:
        print(report.render())
    return 0 if report.violations == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
