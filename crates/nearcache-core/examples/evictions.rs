//! A full cache at work, engine only: the cost of eviction per operation
//! and what the cache holds, for the two access patterns that bound it.
//! The measurement behind "Compactions that start at the hand" in
//! `docs/design/engine.md`.
//!
//! ```text
//! cargo run --release -p nearcache-core --example evictions -- [value bytes...]
//! ```
//!
//! An 8 MiB cache (in the default directory) and UUID-length keys, for
//! each value size (default 16, 160 and 1,600 bytes):
//!
//! * `insert-only`: sets of 200,000 keys in turn, none ever read: every set
//!   evicts, SIEVE degenerates to FIFO and each compaction slides what it
//!   keeps (the case `engine_full/set_*_evicting` in the criterion bench
//!   times).
//! * `cache-aside`: 400,000 keys drawn with a skew (u^4: a quarter of the
//!   keys get about 70% of the draws); a get, and a set after each miss.
//!   Hits set SIEVE's marks, so the hand stops part-way through the arena.
//!
//! Each pattern runs 1 M warm-up operations then 3 M timed ones and prints
//! ns per operation, the hit ratio, compactions per 1,000 sets and the
//! entries held at the end. Run builds to compare one after the other on
//! an idle machine; single-process figures, one core.

use nearcache_core::{Cache, OpenOptions};
use std::time::Instant;

const CACHE_BYTES: usize = 8 << 20;
const WARM_UP: usize = 1_000_000;
const TIMED: usize = 3_000_000;

fn key(i: usize) -> Vec<u8> {
    format!("{i:08x}-0000-4000-8000-{i:012x}").into_bytes()
}

/// A small xorshift generator: the same draws in every build.
struct Draws(u64);

impl Draws {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[derive(Clone, Copy)]
enum Pattern {
    InsertOnly,
    CacheAside,
}

struct Outcome {
    ns_per_op: f64,
    hit_ratio: f64,
    compactions_per_1k_sets: f64,
    items: u64,
}

fn run(pattern: Pattern, value_len: usize) -> Outcome {
    let dir = nearcache_core::default_directory()
        .expect("a default directory")
        .join(format!("evictions-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create the directory");
    let opts = OpenOptions { size: Some(CACHE_BYTES), recreate: true, ..Default::default() };
    let cache = Cache::open(dir.join("c"), &opts).expect("open the cache");
    let key_count = match pattern {
        Pattern::InsertOnly => 200_000,
        Pattern::CacheAside => 400_000,
    };
    let keys: Vec<Vec<u8>> = (0..key_count).map(key).collect();
    let value = vec![7u8; value_len];
    let mut draws = Draws(0x9E37_79B9_7F4A_7C15);
    let mut next = 0usize;
    let mut ops = |n: usize| -> (u64, u64) {
        let (mut hits, mut sets) = (0u64, 0u64);
        for _ in 0..n {
            let k = match pattern {
                Pattern::InsertOnly => {
                    next = (next + 1) % key_count;
                    &keys[next]
                }
                Pattern::CacheAside => {
                    let u = draws.unit();
                    &keys[((u * u * u * u) * key_count as f64) as usize]
                }
            };
            if matches!(pattern, Pattern::CacheAside) && cache.get(k).unwrap().is_some() {
                hits += 1;
            } else {
                cache.set(k, &value, 0, 0).unwrap();
                sets += 1;
            }
        }
        (hits, sets)
    };
    ops(WARM_UP);
    let before = cache.stats().unwrap();
    let start = Instant::now();
    let (hits, sets) = ops(TIMED);
    let elapsed = start.elapsed();
    let after = cache.stats().unwrap();
    drop(cache);
    let _ = std::fs::remove_dir_all(&dir);
    Outcome {
        ns_per_op: elapsed.as_nanos() as f64 / TIMED as f64,
        hit_ratio: hits as f64 / TIMED as f64,
        compactions_per_1k_sets: (after.compactions - before.compactions) as f64 * 1000.0
            / sets.max(1) as f64,
        items: after.items,
    }
}

fn main() {
    let sizes: Vec<usize> =
        std::env::args().skip(1).map(|a| a.parse().expect("value sizes are byte counts")).collect();
    let sizes = if sizes.is_empty() { vec![16, 160, 1600] } else { sizes };
    println!("pattern      value  ns/op  hit ratio  compactions/1k sets  entries held");
    for pattern in [Pattern::InsertOnly, Pattern::CacheAside] {
        for &size in &sizes {
            let o = run(pattern, size);
            let name = match pattern {
                Pattern::InsertOnly => "insert-only",
                Pattern::CacheAside => "cache-aside",
            };
            println!(
                "{name:<12} {size:>5} {:>6.0} {:>10.3} {:>20.2} {:>13}",
                o.ns_per_op, o.hit_ratio, o.compactions_per_1k_sets, o.items
            );
        }
    }
}
