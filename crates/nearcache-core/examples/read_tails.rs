//! The tail of a get's latency while another process's sets evict, engine
//! only: how long readers wait for the moves of a writer's evictions (the
//! conveyor's passes, the strict judgement's steps).
//!
//! ```text
//! cargo run --release -p nearcache-core --example read_tails -- SIZE_MIB [MODE] [SECONDS]
//! ```
//!
//! A cache of `SIZE_MIB` MiB (the engine's shard count) in the default
//! directory, its eviction mode pinned to `MODE` (`strict`, the default,
//! `lenient` or `adaptive`), holds 20,000 hot keys with 160-byte values. A
//! writer (this binary again, in a process of its own) stores new 36-byte
//! keys with 160-byte values that nobody reads, as fast as it can; once
//! the cache evicts, this process gets the hot keys for `SECONDS` (15 by
//! default), every get timed, and then stops the writer. A hot key is hit
//! and kept; one evicted all the same is stored again. Prints the gets'
//! mean, p50, p99, p99.9, p99.99 and maximum, how many took longer than
//! 20, 50 and 100 us, and the writer's sets in the same time. A reader
//! that finds its shard in a move waits for it to end (up to 50 us), and
//! then for the lock: a move longer than that shows as gets over 50 us.
//! Two processes on two cores: run it on an idle machine and compare
//! builds one after the other.

use nearcache_core::{Cache, EvictionMode, OpenOptions};
use std::time::{Duration, Instant};

const HOT_KEYS: u64 = 20_000;
const VALUE_BYTES: usize = 160;
/// A key the reader stores when it is done: the writer stops on it.
const STOP_KEY: &[u8] = b"read-tails-stop";

fn key(i: u64) -> [u8; 36] {
    let mut k = [b'0'; 36];
    let s = format!("{i:016x}-0000-4000-8000-{:011x}", i.wrapping_mul(0x9e37_79b9));
    k.copy_from_slice(&s.as_bytes()[..36]);
    k
}

fn open(name: &str, size_mib: usize) -> Result<Cache, Box<dyn std::error::Error>> {
    let opts = OpenOptions { size: Some(size_mib << 20), ..Default::default() };
    Ok(Cache::open_named(name, &opts)?)
}

/// The writer's process: new keys from far above the hot ones, until the
/// reader stores `STOP_KEY`.
fn write_until_stopped(name: &str, size_mib: usize) -> Result<(), Box<dyn std::error::Error>> {
    let cache = open(name, size_mib)?;
    let value = vec![b'w'; VALUE_BYTES];
    let mut i = 1u64 << 40;
    while cache.get(STOP_KEY)?.is_none() {
        for _ in 0..4096 {
            cache.set(&key(i), &value, 0, 0)?;
            i += 1;
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--writer") {
        return write_until_stopped(&args[1], args[2].parse()?);
    }
    let size_mib: usize = args.first().map(|a| a.parse()).transpose()?.unwrap_or(1024);
    let mode = match args.get(1).map(String::as_str) {
        None | Some("strict") => EvictionMode::Strict,
        Some("lenient") => EvictionMode::Lenient,
        Some("adaptive") => EvictionMode::Adaptive,
        Some(other) => {
            return Err(format!("MODE is strict, lenient or adaptive, not {other:?}").into())
        }
    };
    let seconds: u64 = args.get(2).map(|a| a.parse()).transpose()?.unwrap_or(15);
    let name = format!("read-tails-{}", std::process::id());
    let cache = open(&name, size_mib)?;
    cache.set_eviction_mode(mode)?;
    let path = cache.path().to_path_buf();
    let value = vec![b'v'; VALUE_BYTES];
    let hot: Vec<[u8; 36]> = (0..HOT_KEYS).map(key).collect();
    for k in &hot {
        cache.set(k, &value, 0, 0)?;
    }
    let mut writer = std::process::Command::new(std::env::current_exe()?)
        .args(["--writer", &name, &size_mib.to_string()])
        .spawn()?;

    // Read the hot keys (untimed) until the writer's sets evict.
    let mut j = 0usize;
    let mut get =
        |cache: &Cache, timed: Option<&mut Vec<u32>>| -> Result<(), nearcache_core::Error> {
            let k = &hot[j % hot.len()];
            j = j.wrapping_add(7919);
            let t = Instant::now();
            let hit = cache.get(k)?.is_some();
            if let Some(ns) = timed {
                ns.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
            }
            if !hit {
                cache.set(k, &value, 0, 0)?;
            }
            Ok(())
        };
    while cache.stats()?.evictions == 0 {
        for _ in 0..4096 {
            get(&cache, None)?;
        }
    }
    let before = cache.stats()?;
    let mut ns: Vec<u32> = Vec::with_capacity(1 << 24);
    let end = Instant::now() + Duration::from_secs(seconds);
    while Instant::now() < end {
        for _ in 0..1024 {
            get(&cache, Some(&mut ns))?;
        }
    }
    let after = cache.stats()?;
    cache.set(STOP_KEY, b"1", 0, 0)?;
    let status = writer.wait()?;
    drop(cache);
    let _ = std::fs::remove_file(&path);
    if !status.success() {
        return Err(format!("the writer failed: {status}").into());
    }

    ns.sort_unstable();
    let over = |limit: u32| ns.len() - ns.partition_point(|&n| n <= limit);
    let q = |p: f64| ns[((ns.len() as f64 * p) as usize).min(ns.len() - 1)];
    let mean = ns.iter().map(|&n| n as u64).sum::<u64>() as f64 / ns.len() as f64;
    println!(
        "{size_mib} MiB, {mode:?}: {} gets timed in {seconds} s; meanwhile {} sets (the \
         writer's, and the reader's of hot keys it missed) and {} evictions",
        ns.len(),
        after.sets - before.sets,
        after.evictions - before.evictions
    );
    println!(
        "get mean {mean:.0} ns  p50 {} ns  p99 {} ns  p99.9 {} ns  p99.99 {} ns  max {} ns",
        q(0.5),
        q(0.99),
        q(0.999),
        q(0.9999),
        ns[ns.len() - 1]
    );
    println!(
        "gets over 20 us: {}  over 50 us: {}  over 100 us: {}",
        over(20_000),
        over(50_000),
        over(100_000)
    );
    Ok(())
}
