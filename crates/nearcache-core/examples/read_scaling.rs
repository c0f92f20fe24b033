//! Aggregate get rate of 1..N processes sharing one cache, engine only (no
//! Python): the measurement behind the read path's design notes in
//! `docs/design/engine.md`.
//!
//! ```text
//! cargo run --release -p nearcache-core --example read_scaling -- [seconds] [counts...]
//! ```
//!
//! Each count forks that many processes (re-running this binary), which open
//! the same 64 MiB cache holding 1,000 UUID-length keys with 160-byte values,
//! wait for a common start instant, and loop `get_with` (copying the value
//! into a reused buffer) over a shuffled key sequence until a common end.
//! Prints ops/s per count and the ratio to one process. Defaults: 2 s,
//! counts 1, 2 and 4 x the cores.

use nearcache_core::{Cache, OpenOptions};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const KEYS: usize = 1000;
const VALUE: usize = 160;

fn key(i: usize) -> Vec<u8> {
    format!("{i:08x}-0000-4000-8000-{:012x}", i * 7919).into_bytes()
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

fn child(path: &str, start_ns: u128, end_ns: u128, seed: usize) {
    let cache = Cache::open(path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let mut order: Vec<usize> = (0..KEYS).collect();
    let mut x = seed as u64 * 2 + 1;
    for i in (1..order.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    let mut buf = vec![0u8; VALUE];
    while now_ns() < start_ns {
        std::hint::spin_loop();
    }
    let mut ops: u64 = 0;
    'run: loop {
        for &i in &order {
            let hit = cache
                .get_with(&keys[i], |e| {
                    buf.resize(e.len(), 0);
                    e.copy_to(&mut buf);
                })
                .unwrap();
            assert!(hit.is_some());
            ops += 1;
            if ops % 256 == 0 && now_ns() >= end_ns {
                break 'run;
            }
        }
    }
    println!("{ops}");
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let n = |i: usize| args[i].parse::<u128>().unwrap();
        child(&args[2], n(3), n(4), n(5) as usize);
        return;
    }
    let seconds: f64 = args.get(1).map(|s| s.parse().unwrap()).unwrap_or(2.0);
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let counts: Vec<usize> = if args.len() > 2 {
        args[2..].iter().map(|s| s.parse().unwrap()).collect()
    } else {
        vec![1, cores, 2 * cores, 4 * cores]
    };
    let dir = std::env::temp_dir().join(format!("nc-read-scaling-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cache");
    {
        let opts = OpenOptions { size: Some(64 << 20), ..OpenOptions::default() };
        let c = Cache::open(&path, &opts).unwrap();
        for i in 0..KEYS {
            c.set(&key(i), &[b'v'; VALUE], 0, 0).unwrap();
        }
    }
    let me = std::env::current_exe().unwrap();
    let mut one = None;
    for &n in &counts {
        let start = now_ns() + 300_000_000;
        let end = start + Duration::from_secs_f64(seconds).as_nanos();
        let kids: Vec<_> = (0..n)
            .map(|i| {
                std::process::Command::new(&me)
                    .args(["--child", path.to_str().unwrap()])
                    .args([start.to_string(), end.to_string(), i.to_string()])
                    .stdout(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let total: u64 = kids
            .into_iter()
            .map(|k| {
                let out = k.wait_with_output().unwrap();
                String::from_utf8(out.stdout).unwrap().trim().parse::<u64>().unwrap()
            })
            .sum();
        let rate = total as f64 / seconds;
        let base = *one.get_or_insert(rate);
        println!("{n:>3} processes: {:>7.2} M gets/s  {:.2}x", rate / 1e6, rate / base);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
