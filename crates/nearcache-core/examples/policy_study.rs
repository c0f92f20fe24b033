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
//! (`Config::segment_fifo`) instead of where the holes are; `--queues`: the
//! W-TinyLFU family as two conveyors of one segment chain would run it
//! (`Config::queues`: one eviction at a time, no holes), each policy's
//! limit found for its own mean; `--ghost-floor F`: a window ghost hit
//! also counts when the key came back within F x the cache's entries in
//! insertions, whatever the window's size (`Config::ghost_age_floor`).
//! `--keep-window-hits`: a promoted window candidate keeps its hit counter
//! (`Config::keep_window_hits`); `--head-window` (`wtinylfu-switch` with
//! `--queues`): the window is the head segment, judged when full
//! (`Config::head_window`); `--mini-counted-hits`: the miniatures learn
//! hits through the hit counters only (`Config::mini_counted_hits`);
//! `--switch MODE`: how `wtinylfu-switch`
//! chooses its admission (`strict`, `lenient`, `climb`, `duel` or `mini`, the
//! default; `Config::switch`).
//! Each line has the mean live bytes (`mean_bytes`) beside the mean
//! entries.

use nearcache_core::eviction::{limit_for_mean, replay, Config, Policy, Switch, Walk};
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

/// The value after `flag` on the command line.
fn arg<'a>(it: &mut std::slice::Iter<'a, String>, flag: &str) -> Result<&'a String, String> {
    it.next().ok_or_else(|| format!("{flag} needs a value"))
}

/// The value after `flag`, parsed.
fn parsed<T: std::str::FromStr>(
    it: &mut std::slice::Iter<'_, String>,
    flag: &str,
) -> Result<T, String> {
    let v = arg(it, flag)?;
    v.parse().map_err(|_| format!("bad {flag} {v}"))
}

/// The value after `flag`, parsed and within `range` (`what` says the
/// range in the error).
fn ranged<T: std::str::FromStr + PartialOrd + std::fmt::Display>(
    it: &mut std::slice::Iter<'_, String>,
    flag: &str,
    range: std::ops::RangeInclusive<T>,
    what: &str,
) -> Result<T, String> {
    let v: T = parsed(it, flag)?;
    if !range.contains(&v) {
        return Err(format!("{flag} {v}: {what}"));
    }
    Ok(v)
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
    let mut ghost_floor = None;
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
    let mut queues = false;
    let mut keep_window_hits = false;
    let mut head_window = false;
    let mut mini_counted_hits = false;
    let mut switch = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--shards" => shards = parsed(&mut it, "--shards")?,
            "--policies" => {
                let v = arg(&mut it, "--policies")?;
                policies = v
                    .split(',')
                    .map(|n| Policy::from_name(n).ok_or(format!("unknown policy {n}")))
                    .collect::<Result<_, _>>()?;
            }
            "--sizes" => sizes = true,
            "--ghost-age" => {
                ghost_age = Some(ranged::<f64>(
                    &mut it,
                    "--ghost-age",
                    0.0..=100.0,
                    "0 (off) to 100 x the queue",
                )?)
            }
            "--ghost-floor" => {
                ghost_floor =
                    Some(ranged::<f64>(&mut it, "--ghost-floor", 0.0..=1.0, "0 to 1 x the cache")?)
            }
            "--tiebreak" => tie_break = true,
            "--conservative" => conservative = true,
            "--plain-duel" => plain = true,
            "--no-fill" => no_fill = true,
            "--group" => group = true,
            "--fifo-cleaner" => fifo_cleaner = true,
            "--queues" => queues = true,
            "--keep-window-hits" => keep_window_hits = true,
            "--head-window" => head_window = true,
            "--mini-counted-hits" => mini_counted_hits = true,
            "--switch" => {
                let v = arg(&mut it, "--switch")?;
                switch = Some(
                    Switch::from_name(v)
                        .ok_or(format!("--switch {v}: strict, lenient, climb, duel or mini"))?,
                );
            }
            "--slack" => {
                slack =
                    Some(ranged::<u64>(&mut it, "--slack", 0..=50, "0 to 50 percent of the arena")?)
            }
            "--segments" => {
                segments = ranged(&mut it, "--segments", 4..=1024, "4 to 1024 segments per shard")?
            }
            "--counter" => {
                counter = Some(ranged::<u8>(
                    &mut it,
                    "--counter",
                    1..=3,
                    "1 (a visited bit) to 3 (two bits)",
                )?)
            }
            "--margin" => margin = Some(parsed::<u8>(&mut it, "--margin")?),
            "--walk" => {
                let v = arg(&mut it, "--walk")?;
                walk = Some(Walk::from_name(v).ok_or(format!("--walk {v}: fifo, sieve or clock"))?);
            }
            "--wmax" => wmax = Some(ranged::<u64>(&mut it, "--wmax", 1..=99, "1 to 99 percent")?),
            "--ghost" => {
                ghost = Some(ranged::<u64>(
                    &mut it,
                    "--ghost",
                    1..=400,
                    "1 to 400 percent of the entries",
                )?)
            }
            "--step" => {
                step =
                    Some(ranged::<f64>(&mut it, "--step", 0.01..=1000.0, "0.01 to 1000 entries")?)
            }
            "--sketch" => {
                sketch = Some(ranged::<f64>(
                    &mut it,
                    "--sketch",
                    0.01..=16.0,
                    "0.01 to 16 counters per entry",
                )?)
            }
            "--aging" => {
                aging = Some(ranged::<u64>(&mut it, "--aging", 1..=100, "1 to 100 x the entries")?)
            }
            "--window" => {
                window = Some(ranged::<u64>(&mut it, "--window", 1..=80, "1 to 80 percent")?)
            }
            "--free" => {
                free = ranged(&mut it, "--free", 1..=50, "a compaction frees 1 to 50 percent")?
            }
            _ => positional.push(a.clone()),
        }
    }
    let [trace, entries] = positional.as_slice() else {
        return Err("usage: policy_study TRACE ENTRIES[,ENTRIES...] [--shards N] \
                    [--policies a,b] [--sizes] [--free PERCENT] [--window PERCENT] [--sketch COUNTERS_PER_ENTRY] [--aging N]"
            .into());
    };
    if queues && segments > 0 {
        return Err("--queues models its own segment chain: no --segments".into());
    }
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
            cfg.queues = queues;
            if queues && !cfg.policy.queue_ready() {
                return Err(format!(
                    "--queues: {} has no window and main part to convey",
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
            if let Some(f) = ghost_floor {
                cfg.ghost_age_floor = f;
            }
            cfg.segment_fifo = fifo_cleaner;
            if let Some(c) = counter {
                cfg.counter_max = c;
            }
            cfg.keep_window_hits |= keep_window_hits;
            cfg.mini_counted_hits = mini_counted_hits;
            if head_window {
                if !queues || policy != Policy::WTinyLfuSwitch {
                    return Err("--head-window: wtinylfu-switch with --queues only".into());
                }
                cfg.head_window = true;
            }
            if let Some(m) = switch {
                cfg.switch = m;
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
            // choices: each policy's limit is found for its own mean (and
            // with single evictions the mean is the limit, not a sawtooth).
            let limit = if (segments > 0 || queues) && !sizes {
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
                 \"mean_bytes\":{:.1},\
                 \"requests\":{},\"hits\":{},\"hit_ratio\":{:.6},\"byte_hit_ratio\":{:.6},\
                 \"compactions\":{},\"segments\":{},\"copied_per_request\":{:.3}}}",
                policy.name(),
                free,
                target,
                if sizes { cfg.capacity_bytes } else { cfg.max_items },
                o.mean_items,
                o.mean_bytes,
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
