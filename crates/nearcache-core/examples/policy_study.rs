//! Replays a trace through the candidate eviction policies of
//! `nearcache_core::eviction` at given mean entry counts and prints one
//! JSON object per (policy, entries) line. Driven by
//! `benchmarks/policy_study.py`, which writes the traces and runs
//! libCacheSim's policies beside these.
//!
//! ```text
//! cargo run --release -p nearcache-core --example policy_study -- \
//!     TRACE.oracleGeneral ENTRIES[,ENTRIES...] [--shards N] [--policies a,b] [--sizes] \
//!     [--free PERCENT] [--window PERCENT] [--sketch COUNTERS_PER_ENTRY] [--aging N]
//! ```
//!
//! The trace is libCacheSim's oracleGeneral binary format: records of
//! (u32 time, u64 object id, u32 size, i64 next access), little-endian.
//! Without `--sizes` every request counts as one unit (equal entry
//! counts); with it the object sizes count against a byte budget equal to
//! ENTRIES (then a byte count). `--free`: the percent of a shard one
//! compaction frees (the engine's `COMPACT_FREE_PERCENT`, 10 by default);
//! `--window`: the W-TinyLFU window's percent of the cache (1 by default);
//! `--sketch`: sketch counters per entry in each row (1 by default: 2 bytes
//! per entry); `--aging`: the sketch halves every N x the entries
//! additions (10 by default, as TinyLFU); `--counter N`: the per-entry hit
//! counter's largest value (1: a visited bit); `--segments N` with
//! `--fifo-cleaner`: clean the segments in the conveyor's order
//! (`Config::segment_fifo`) instead of where the holes are.

use nearcache_core::eviction::{limit_for_mean, replay, Config, Policy, Walk};
use std::process::ExitCode;

fn read_oracle_general(path: &str, sizes: bool) -> Result<Vec<(u64, u64)>, String> {
    let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
    if data.len() % 24 != 0 {
        return Err(format!(
            "{path}: {} bytes is not a whole number of 24-byte oracleGeneral records",
            data.len()
        ));
    }
    Ok(data
        .chunks_exact(24)
        .map(|r| {
            let id = u64::from_le_bytes(r[4..12].try_into().expect("8 bytes"));
            let size = u32::from_le_bytes(r[12..16].try_into().expect("4 bytes")) as u64;
            (id, if sizes { size.max(1) } else { 1 })
        })
        .collect())
}

fn run() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut positional = Vec::new();
    let mut shards = 1usize;
    let mut policies: Vec<Policy> = Policy::ALL.to_vec();
    let mut sizes = false;
    let mut free = 10u64;
    let mut window = None;
    let mut sketch = None;
    let mut aging = None;
    let mut walk = None;
    let mut wmax = None;
    let mut ghost = None;
    let mut step = None;
    let mut ghost_age = None;
    let mut tie_break = false;
    let mut conservative = false;
    let mut plain = false;
    let mut segments = 0u64;
    let mut no_fill = false;
    let mut group = false;
    let mut slack = None;
    let mut margin = None;
    let mut counter = None;
    let mut fifo_cleaner = false;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--shards" => {
                let v = it.next().ok_or("--shards needs a value")?;
                shards = v.parse().map_err(|_| format!("bad --shards {v}"))?;
            }
            "--policies" => {
                let v = it.next().ok_or("--policies needs a value")?;
                policies = v
                    .split(',')
                    .map(|n| Policy::from_name(n).ok_or(format!("unknown policy {n}")))
                    .collect::<Result<_, _>>()?;
            }
            "--sizes" => sizes = true,
            "--ghost-age" => {
                let v = it.next().ok_or("--ghost-age needs a value")?;
                let f: f64 = v.parse().map_err(|_| format!("bad --ghost-age {v}"))?;
                if !(0.0..=100.0).contains(&f) {
                    return Err(format!("--ghost-age {f}: 0 (off) to 100 x the queue"));
                }
                ghost_age = Some(f);
            }
            "--tiebreak" => tie_break = true,
            "--conservative" => conservative = true,
            "--plain-duel" => plain = true,
            "--no-fill" => no_fill = true,
            "--group" => group = true,
            "--fifo-cleaner" => fifo_cleaner = true,
            "--slack" => {
                let v = it.next().ok_or("--slack needs a value")?;
                let f: u64 = v.parse().map_err(|_| format!("bad --slack {v}"))?;
                if f > 50 {
                    return Err(format!("--slack {f}: 0 to 50 percent of the arena"));
                }
                slack = Some(f);
            }
            "--segments" => {
                let v = it.next().ok_or("--segments needs a value")?;
                segments = v.parse().map_err(|_| format!("bad --segments {v}"))?;
                if !(4..=1024).contains(&segments) {
                    return Err(format!("--segments {segments}: 4 to 1024 segments per shard"));
                }
            }
            "--counter" => {
                let v = it.next().ok_or("--counter needs a value")?;
                let c: u8 = v.parse().map_err(|_| format!("bad --counter {v}"))?;
                if !(1..=3).contains(&c) {
                    return Err(format!("--counter {c}: 1 (a visited bit) to 3 (two bits)"));
                }
                counter = Some(c);
            }
            "--margin" => {
                let v = it.next().ok_or("--margin needs a value")?;
                margin = Some(v.parse::<u8>().map_err(|_| format!("bad --margin {v}"))?);
            }
            "--walk" => {
                let v = it.next().ok_or("--walk needs a value")?;
                walk = Some(Walk::from_name(v).ok_or(format!("--walk {v}: fifo, sieve or clock"))?);
            }
            "--wmax" => {
                let v = it.next().ok_or("--wmax needs a value")?;
                let w: u64 = v.parse().map_err(|_| format!("bad --wmax {v}"))?;
                if !(1..=99).contains(&w) {
                    return Err(format!("--wmax {w}: 1 to 99 percent"));
                }
                wmax = Some(w);
            }
            "--ghost" => {
                let v = it.next().ok_or("--ghost needs a value")?;
                let g: u64 = v.parse().map_err(|_| format!("bad --ghost {v}"))?;
                if !(1..=400).contains(&g) {
                    return Err(format!("--ghost {g}: 1 to 400 percent of the entries"));
                }
                ghost = Some(g);
            }
            "--step" => {
                let v = it.next().ok_or("--step needs a value")?;
                let f: f64 = v.parse().map_err(|_| format!("bad --step {v}"))?;
                if !(0.01..=1000.0).contains(&f) {
                    return Err(format!("--step {f}: 0.01 to 1000 entries"));
                }
                step = Some(f);
            }
            "--sketch" => {
                let v = it.next().ok_or("--sketch needs a value")?;
                let f: f64 = v.parse().map_err(|_| format!("bad --sketch {v}"))?;
                if !(0.01..=16.0).contains(&f) {
                    return Err(format!("--sketch {f}: 0.01 to 16 counters per entry"));
                }
                sketch = Some(f);
            }
            "--aging" => {
                let v = it.next().ok_or("--aging needs a value")?;
                let a: u64 = v.parse().map_err(|_| format!("bad --aging {v}"))?;
                if !(1..=100).contains(&a) {
                    return Err(format!("--aging {a}: 1 to 100 x the entries"));
                }
                aging = Some(a);
            }
            "--window" => {
                let v = it.next().ok_or("--window needs a value")?;
                let w: u64 = v.parse().map_err(|_| format!("bad --window {v}"))?;
                if !(1..=80).contains(&w) {
                    return Err(format!("--window {w}: 1 to 80 percent"));
                }
                window = Some(w);
            }
            "--free" => {
                let v = it.next().ok_or("--free needs a value")?;
                free = v.parse().map_err(|_| format!("bad --free {v}"))?;
                if !(1..=50).contains(&free) {
                    return Err(format!("--free {free}: a compaction frees 1 to 50 percent"));
                }
            }
            _ => positional.push(a.clone()),
        }
    }
    let [trace, entries] = positional.as_slice() else {
        return Err("usage: policy_study TRACE ENTRIES[,ENTRIES...] [--shards N] \
                    [--policies a,b] [--sizes] [--free PERCENT] [--window PERCENT] [--sketch COUNTERS_PER_ENTRY] [--aging N]"
            .into());
    };
    let requests = read_oracle_general(trace, sizes)?;
    let targets: Vec<u64> = entries
        .split(',')
        .map(|e| e.parse().map_err(|_| format!("bad entry count {e}")))
        .collect::<Result<_, _>>()?;
    for &target in &targets {
        // The limit whose mean occupancy is the target: found once, with
        // SIEVE (every policy fills to the limit and frees the same share).
        let mut base = Config::new(Policy::Sieve, target);
        base.shards = shards;
        base.free_percent = free;
        base.segments = segments;
        let shared = if sizes { target } else { limit_for_mean(base, target, &requests) };
        for &policy in &policies {
            let mut cfg = Config::new(policy, target);
            cfg.shards = shards;
            cfg.free_percent = free;
            cfg.segments = segments;
            cfg.segment_fill = !no_fill;
            if group {
                cfg.segment_cleaner = false;
            }
            if let Some(f) = slack {
                cfg.segment_slack = f;
            }
            if segments > 0 && !cfg.policy.segment_ready() {
                return Err(format!(
                    "--segments: {} is modelled on the entry-granular arena only",
                    policy.name()
                ));
            }
            if let Some(w) = window {
                cfg.window_percent = w;
            }
            if let Some(a) = aging {
                cfg.sketch_aging = a;
            }
            if let Some(f) = sketch {
                cfg.sketch_counters_per_entry = f;
            }
            if let Some(w) = walk {
                cfg.walk = w;
            }
            if let Some(w) = wmax {
                cfg.window_max_percent = w;
            }
            if let Some(g) = ghost {
                cfg.ghost_percent = g;
            }
            if let Some(f) = step {
                cfg.ghost_step = f;
            }
            if let Some(f) = ghost_age {
                cfg.ghost_age = f;
            }
            cfg.segment_fifo = fifo_cleaner;
            if let Some(c) = counter {
                cfg.counter_max = c;
            }
            cfg.tie_break |= tie_break;
            cfg.conservative |= conservative;
            if plain {
                cfg.conservative = false;
                cfg.admit_margin = 0;
            }
            if let Some(m) = margin {
                cfg.admit_margin = m;
            }
            // On segments, what a merge frees depends on the policy's
            // choices: each policy's limit is found for its own mean.
            let limit = if segments > 0 && !sizes {
                let mut c = cfg;
                c.capacity_bytes = target;
                c.max_items = target;
                limit_for_mean(c, target, &requests)
            } else {
                shared
            };
            if sizes {
                // A byte budget: the item limit does not bind.
                cfg.max_items = u64::MAX / 4;
            } else {
                cfg.max_items = limit;
                cfg.capacity_bytes = limit;
            }
            let o = replay(cfg, requests.iter().copied());
            println!(
                "{{\"policy\":\"{}\",\"free\":{},\"target\":{},\"limit\":{},\"mean_items\":{:.1},\
                 \"requests\":{},\"hits\":{},\"hit_ratio\":{:.6},\"byte_hit_ratio\":{:.6},\
                 \"compactions\":{},\"segments\":{},\"copied_per_request\":{:.3}}}",
                policy.name(),
                free,
                target,
                if sizes { cfg.capacity_bytes } else { cfg.max_items },
                o.mean_items,
                o.requests,
                o.hits,
                o.hit_ratio(),
                if o.bytes > 0 { o.hit_bytes as f64 / o.bytes as f64 } else { 0.0 },
                o.compactions,
                segments,
                o.copied_bytes as f64 / o.requests.max(1) as f64,
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("policy_study: {e}");
            ExitCode::FAILURE
        }
    }
}
