//! The tail of a set's latency while the cache evicts, engine only, one
//! process: what the conveyor's passes cost the write that pays them.
//!
//! ```text
//! cargo run --release -p nearcache-core --example set_tails -- SIZE_MIB [SHARDS] [VALUE_BYTES] [MODE]
//! ```
//!
//! A cache of `SIZE_MIB` MiB in the default directory (the engine's shard
//! count unless `SHARDS` is given) is filled with new 36-byte keys and
//! `VALUE_BYTES`-byte values (160 by default) until it first evicts, then
//! as many sets again, every one timed. Prints the mean, p50, p99, p99.9, p99.99 and
//! the maximum of the evicting phase, and how many sets took longer than
//! 20, 50 and 100 us; then, as the noise floor, how often a loop that
//! only reads the clock is held up for more than 20 us. `MODE` pins the
//! eviction mode (`strict`, `lenient` or `adaptive`, the default): new
//! keys that are never read make an adaptive shard lenient, so `strict`
//! is how the strict judgement of a full head is timed. Timings include
//! the scheduler's noise: run it on an idle machine and compare builds one
//! after the other.

use nearcache_core::{Cache, EvictionMode, OpenOptions};
use std::time::Instant;

fn key(i: u64) -> [u8; 36] {
    let mut k = [b'0'; 36];
    let s = format!("{i:016x}-0000-4000-8000-{:011x}", i.wrapping_mul(0x9e37_79b9));
    k.copy_from_slice(&s.as_bytes()[..36]);
    k
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let size_mib: usize = args.first().map(|a| a.parse()).transpose()?.unwrap_or(1024);
    let shards: usize = args.get(1).map(|a| a.parse()).transpose()?.unwrap_or(0);
    let value_bytes: usize = args.get(2).map(|a| a.parse()).transpose()?.unwrap_or(160);
    let mode = match args.get(3).map(String::as_str) {
        None | Some("adaptive") => EvictionMode::Adaptive,
        Some("strict") => EvictionMode::Strict,
        Some("lenient") => EvictionMode::Lenient,
        Some(other) => {
            return Err(format!("MODE is strict, lenient or adaptive, not {other:?}").into())
        }
    };
    let name = format!("set-tails-{}", std::process::id());
    let opts = OpenOptions { size: Some(size_mib << 20), shards, ..Default::default() };
    let cache = Cache::open_named(&name, &opts)?;
    cache.set_eviction_mode(mode)?;
    let path = cache.path().to_path_buf();
    let value = vec![b'v'; value_bytes];

    let mut i = 0u64;
    loop {
        cache.set(&key(i), &value, 0, 0)?;
        i += 1;
        if i % 4096 == 0 && cache.stats()?.evictions > 0 {
            break;
        }
    }
    let fill = i;
    let mut ns: Vec<u32> = Vec::with_capacity(fill as usize);
    for _ in 0..fill {
        let k = key(i);
        let t = Instant::now();
        cache.set(&k, &value, 0, 0)?;
        ns.push(t.elapsed().as_nanos().min(u32::MAX as u128) as u32);
        i += 1;
    }
    let stats = cache.stats()?;
    drop(cache);
    let _ = std::fs::remove_file(&path);

    let mut sorted = ns;
    sorted.sort_unstable();
    let over = |limit: u32| sorted.len() - sorted.partition_point(|&n| n <= limit);
    let q = |p: f64| sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)];
    println!(
        "{size_mib} MiB, {} shards, {value_bytes} B values, {mode:?}: {} evicting sets, {} items held",
        if shards > 0 { shards.to_string() } else { "auto".into() },
        sorted.len(),
        stats.items
    );
    let mean = sorted.iter().map(|&n| n as u64).sum::<u64>() as f64 / sorted.len() as f64;
    println!(
        "mean {mean:.0} ns  p50 {} ns  p99 {} ns  p99.9 {} ns  p99.99 {} ns  max {} ns",
        q(0.5),
        q(0.99),
        q(0.999),
        q(0.9999),
        sorted[sorted.len() - 1]
    );
    println!(
        "sets over 20 us: {}  over 50 us: {}  over 100 us: {}",
        over(20_000),
        over(50_000),
        over(100_000)
    );
    noise_floor();
    Ok(())
}

/// The machine's own stalls: a loop that only reads the clock for a
/// second, and the gaps between two readings longer than 20 us (a
/// preemption, an interrupt, a virtual machine's exit): what no set can
/// be faster than at the tail.
fn noise_floor() {
    let start = Instant::now();
    let mut last = start;
    let mut gaps: Vec<u128> = Vec::new();
    while start.elapsed().as_secs() < 1 {
        let now = Instant::now();
        let gap = (now - last).as_nanos();
        if gap > 20_000 {
            gaps.push(gap);
        }
        last = now;
    }
    gaps.sort_unstable();
    println!(
        "clock-only loop, 1 s: {} gaps over 20 us, {} over 50 us, longest {} ns",
        gaps.len(),
        gaps.iter().filter(|&&g| g > 50_000).count(),
        gaps.last().copied().unwrap_or(0)
    );
}
