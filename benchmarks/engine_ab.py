"""Before/after comparison of the engine's hot paths in Rust, in one process.

Builds one small program that links two versions of ``nearcache-core``
(``--before``, a git revision, and ``--after``, a revision or the working
tree), each as its own crate, and runs their calls in alternation for
``--rounds`` rounds: per operation, the minimum ns per call each side ever
reached (the minimum of 5 timings of 100,000 calls per round) and their
ratio, then the mean of all those timings and its ratio (the minimum
leaves out the windows where an engine that batches its work did it; the
mean counts them). Both sides run in the same process on the same machine state, so
load from other programs hits both alike; the minimum filters the rest
(interference only ever adds time). A 64 MiB cache with 1,000 keys of 36
bytes and 160-byte values, as ``native_ab.py`` measures through Python.

Run: python benchmarks/engine_ab.py --before main --after WORKTREE
(build in a temporary directory: about two minutes; ``--keep DIR`` keeps it
for another run).

``--instructions`` counts instead of timing: each side runs each operation
alone under valgrind's cachegrind (with its branch simulation), 500,000 and
then 1,000,000 calls, and the difference gives the instructions and the
mispredicted branches per call, free of the machine's noise (they leave out
what memory costs, which the timings include). The mispredictions come from
cachegrind's simple predictor (2-bit counters indexed by address): two
builds whose code lies differently can differ for that alone; a hint, not
a measure.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parent.parent

WORKSPACE = """[workspace]
resolver = "2"
members = ["crates/nearcache-core"]
[workspace.package]
version = "{version}"
edition = "2021"
license = "MIT OR Apache-2.0"
rust-version = "1.80"
"""

PROGRAM_TOML = """[package]
name = "engine-ab"
version = "0.1.0"
edition = "2021"

[dependencies]
before = {{ package = "nearcache-core", path = "{before}" }}
after = {{ package = "nearcache-core", path = "{after}" }}

[profile.release]
lto = "fat"
codegen-units = 1
panic = "unwind"
"""

# The operations `run` measures, in the order of its match arms.
OPS = ["get_with hit", "get_with miss", "set 160 B", "get hit (Value)"]

PROGRAM = r"""
use std::hint::black_box;
use std::time::Instant;

const OPS: [&str; @N@] = [@OPS@];

fn key(i: usize) -> Vec<u8> {
    format!("{i:08x}-0000-4000-8000-{i:012x}").into_bytes()
}

macro_rules! side {
    ($name:ident, $krate:ident) => {
        mod $name {
            use super::*;
            pub struct S {
                c: $krate::Cache,
                keys: Vec<Vec<u8>>,
                missing: Vec<u8>,
                value: Vec<u8>,
            }
            pub fn open(dir: &std::path::Path) -> S {
                let o = $krate::OpenOptions {
                    size: Some(64 << 20),
                    recreate: true,
                    ..Default::default()
                };
                let c = $krate::Cache::open(dir.join(stringify!($name)), &o).unwrap();
                let keys: Vec<Vec<u8>> = (0..1000).map(key).collect();
                let value = vec![0xabu8; 160];
                for k in &keys {
                    c.set(k, &value, 0, 0).unwrap();
                }
                S { c, keys, missing: key(99_999_999), value }
            }
            /// ns per call of operation `op` over `n` calls.
            pub fn run(s: &S, op: usize, n: usize) -> f64 {
                let t = Instant::now();
                let mut out = [0u8; 160];
                match op {
                    0 => for i in 0..n {
                        let k = black_box(&s.keys[i % 1000]);
                        black_box(s.c.get_with(k, |e| e.copy_to(&mut out)).unwrap());
                    },
                    1 => for _ in 0..n {
                        black_box(s.c.get_with(black_box(&s.missing), |_| ()).unwrap());
                    },
                    2 => for i in 0..n {
                        s.c.set(black_box(&s.keys[i % 1000]), black_box(&s.value), 0, 0).unwrap();
                    },
                    _ => for i in 0..n {
                        black_box(s.c.get(black_box(&s.keys[i % 1000])).unwrap());
                    },
                }
                t.elapsed().as_nanos() as f64 / n as f64
            }
        }
    };
}
side!(side_before, before);
side!(side_after, after);

fn main() {
    let rounds: usize = std::env::args().nth(1).unwrap().parse().unwrap();
    let dir = std::path::PathBuf::from(std::env::args().nth(2).unwrap());
    // One side and one operation alone (`--instructions`): `rounds` runs
    // of 100,000 calls.
    if let (Some(side), Some(op)) = (std::env::args().nth(3), std::env::args().nth(4)) {
        let op: usize = op.parse().unwrap();
        if side == "before" {
            let b = side_before::open(&dir);
            for _ in 0..rounds {
                side_before::run(&b, op, 100_000);
            }
        } else {
            let a = side_after::open(&dir);
            for _ in 0..rounds {
                side_after::run(&a, op, 100_000);
            }
        }
        return;
    }
    let (b, a) = (side_before::open(&dir), side_after::open(&dir));
    let mut best = [[f64::MAX; 2]; OPS.len()];
    let mut sum = [[0.0f64; 2]; OPS.len()];
    for _ in 0..rounds {
        for o in 0..OPS.len() {
            for _ in 0..5 {
                let (x, y) = (side_before::run(&b, o, 100_000), side_after::run(&a, o, 100_000));
                best[o] = [best[o][0].min(x), best[o][1].min(y)];
                sum[o] = [sum[o][0] + x, sum[o][1] + y];
            }
        }
    }
    let n = (5 * rounds) as f64;
    for (o, name) in OPS.iter().enumerate() {
        println!("{name}\t{}\t{}\t{}\t{}", best[o][0], best[o][1], sum[o][0] / n, sum[o][1] / n);
    }
}
"""


def export(rev: str, dest: pathlib.Path, version: str) -> None:
    """The engine crate of ``rev`` (or of the working tree) under ``dest``, as
    a workspace of its own with its own version (Cargo refuses two path
    crates of one name and version)."""
    crate = dest / "crates" / "nearcache-core"
    if dest.exists():
        shutil.rmtree(dest)
    crate.parent.mkdir(parents=True)
    if rev == "WORKTREE":
        shutil.copytree(ROOT / "crates" / "nearcache-core", crate)
    else:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", rev, "crates/nearcache-core"],
            capture_output=True,
            check=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    (dest / "Cargo.toml").write_text(WORKSPACE.format(version=version))


def cachegrind(
    program: pathlib.Path, shm: str | None, side: str, op: int, rounds: int
) -> tuple[int, int]:
    """Instructions and mispredicted branches of ``rounds`` runs of 100,000
    calls of ``op`` by ``side`` alone (cache opening included)."""
    with tempfile.TemporaryDirectory(prefix="engine-ab-", dir=shm) as caches:
        err = subprocess.run(
            [
                "valgrind",
                "--tool=cachegrind",
                "--cache-sim=no",
                "--branch-sim=yes",
                f"--cachegrind-out-file={caches}/cachegrind.out",
                str(program),
                str(rounds),
                caches,
                side,
                str(op),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stderr

    def total(label: str) -> int:
        m = re.search(label + r":\s+([\d,]+)", err)
        if not m:
            raise RuntimeError(f"no {label} in valgrind's output:\n{err}")
        return int(m.group(1).replace(",", ""))

    return total("I\\s+refs"), total("Mispredicts")


def count_instructions(program: pathlib.Path, shm: str | None, args: argparse.Namespace) -> int:
    calls = 5 * 100_000
    print(
        f"{args.before} against {args.after}: per call, each side alone under cachegrind "
        f"({calls:,} calls, the difference of runs of {calls:,} and {2 * calls:,})"
    )
    print(
        f"{'operation':<18}{'instr before':>14}{'after':>8}{'after/before':>14}"
        f"{'mispredicted before':>21}{'after':>8}"
    )
    for op, name in enumerate(OPS):
        row = []
        for side in ("before", "after"):
            i5, m5 = cachegrind(program, shm, side, op, 5)
            i10, m10 = cachegrind(program, shm, side, op, 10)
            row.append(((i10 - i5) / calls, (m10 - m5) / calls))
        (ib, mb), (ia, ma) = row
        print(f"{name:<18}{ib:>14.0f}{ia:>8.0f}{ia / ib:>14.3f}{mb:>21.3f}{ma:>8.3f}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--before", default="main", help="git revision (default: main)")
    ap.add_argument("--after", default="WORKTREE", help="git revision, or WORKTREE")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--keep", metavar="DIR", help="build in DIR and keep it")
    ap.add_argument(
        "--instructions",
        action="store_true",
        help="count instructions and mispredicted branches per call (valgrind)",
    )
    args = ap.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        ap.error("--instructions needs valgrind (Debian: apt-get install valgrind)")
    work = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="engine-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        export(args.before, work / "before", "0.0.1")
        export(args.after, work / "after", "0.0.2")
        prog = work / "program"
        (prog / "src").mkdir(parents=True, exist_ok=True)
        (prog / "Cargo.toml").write_text(
            PROGRAM_TOML.format(
                before=work / "before" / "crates" / "nearcache-core",
                after=work / "after" / "crates" / "nearcache-core",
            )
        )
        rust_ops = ", ".join(json.dumps(o) for o in OPS)
        program = PROGRAM.replace("@N@", str(len(OPS))).replace("@OPS@", rust_ops)
        (prog / "src" / "main.rs").write_text(program)
        subprocess.run(["cargo", "build", "--release", "-q"], cwd=prog, check=True)
        shm = "/dev/shm" if os.path.isdir("/dev/shm") else None
        if args.instructions:
            return count_instructions(prog / "target" / "release" / "engine-ab", shm, args)
        load0 = os.getloadavg()[0]
        with tempfile.TemporaryDirectory(prefix="engine-ab-", dir=shm) as caches:
            out = subprocess.run(
                [str(prog / "target" / "release" / "engine-ab"), str(args.rounds), caches],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        print(
            f"{args.before} against {args.after}: {args.rounds} alternating rounds, "
            f"load average {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end"
        )
        print(
            f"{'operation':<18}{'before ns':>11}{'after ns':>10}{'after/before':>14}"
            f"{'mean before':>13}{'mean after':>12}{'after/before':>14}"
        )
        for line in out.splitlines():
            name, b, a, mb, ma = (line.split("\t")[0], *map(float, line.split("\t")[1:]))
            print(
                f"{name:<18}{b:>11.1f}{a:>10.1f}{a / b:>14.3f}"
                f"{mb:>13.1f}{ma:>12.1f}{ma / mb:>14.3f}"
            )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
