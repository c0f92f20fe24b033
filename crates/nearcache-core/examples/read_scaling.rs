//! Aggregate rate of 1..N processes sharing one cache, engine only (no
//! Python): the measurement behind the read path's design notes in
//! `docs/design/engine.md`.
//!
//! ```text
//! cargo run --release -p nearcache-core --example read_scaling -- \
//!     [--mix get|1:10] [--store cache|array] [seconds] [counts...]
//! ```
//!
//! Each count forks that many processes (re-running this binary), which open
//! the same store holding 1,000 UUID-length keys with 160-byte values, wait
//! for a common start instant, and loop over a shuffled key sequence until
//! a common end. `--mix get` (the default) only gets, copying the value
//! into a reused buffer; `--mix 1:10` sets a key before every ten gets.
//! Prints ops/s per count and the ratio to one process. Defaults: 2 s,
//! counts 1, 2 and 4 x the cores.
//!
//! `--store array` replaces the cache by the least any shared store must
//! do: one record of 256 bytes per key in a shared file mapping, a set
//! copies the value in, a get copies it out; no index, no lock, no check
//! (its reads may be torn: a ceiling, not a cache). What a shared cache
//! loses to it is its own doing; what the array loses going from one
//! process to two is the machine's cost of moving written cache lines
//! between cores.

use memmap2::MmapMut;
use nearcache_core::{Cache, OpenOptions};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

const KEYS: usize = 1000;
const VALUE: usize = 160;
/// Bytes per key in the array store.
const RECORD: usize = 256;

fn key(i: usize) -> Vec<u8> {
    format!("{i:08x}-0000-4000-8000-{:012x}", i * 7919).into_bytes()
}

fn now_ns() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos()
}

/// What the processes share.
enum Store {
    Cache(Box<Cache>),
    Array(MmapMut),
}

impl Store {
    fn open(kind: &str, path: &str) -> Store {
        match kind {
            "cache" => Store::Cache(Box::new(
                Cache::open(path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap(),
            )),
            "array" => {
                let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
                // SAFETY: the file is this benchmark's own; other processes
                // write it concurrently, which the array store accepts (its
                // values are never checked).
                Store::Array(unsafe { MmapMut::map_mut(&f) }.unwrap())
            }
            other => panic!("unknown store {other}"),
        }
    }

    fn create(kind: &str, path: &std::path::Path) {
        match kind {
            "cache" => {
                let opts = OpenOptions { size: Some(64 << 20), ..OpenOptions::default() };
                let c = Cache::open(path, &opts).unwrap();
                for i in 0..KEYS {
                    c.set(&key(i), &[b'v'; VALUE], 0, 0).unwrap();
                }
            }
            _ => std::fs::write(path, vec![b'v'; KEYS * RECORD]).unwrap(),
        }
    }

    fn get(&mut self, i: usize, k: &[u8], buf: &mut Vec<u8>) {
        match self {
            Store::Cache(c) => {
                let hit = c
                    .get_with(k, |e| {
                        buf.resize(e.len(), 0);
                        e.copy_to(buf);
                    })
                    .unwrap();
                assert!(hit.is_some());
            }
            Store::Array(m) => {
                buf.resize(VALUE, 0);
                buf.copy_from_slice(&m[i * RECORD..i * RECORD + VALUE]);
            }
        }
    }

    fn set(&mut self, i: usize, k: &[u8], value: &[u8]) {
        match self {
            Store::Cache(c) => c.set(k, value, 0, 0).unwrap(),
            Store::Array(m) => m[i * RECORD..i * RECORD + VALUE].copy_from_slice(value),
        }
    }
}

fn child(kind: &str, mix: &str, path: &str, start_ns: u128, end_ns: u128, seed: usize) {
    let mut store = Store::open(kind, path);
    let keys: Vec<Vec<u8>> = (0..KEYS).map(key).collect();
    let mut order: Vec<usize> = (0..KEYS).collect();
    let mut x = seed as u64 * 2 + 1;
    for i in (1..order.len()).rev() {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        order.swap(i, (x >> 33) as usize % (i + 1));
    }
    let set_every = if mix == "1:10" { 11 } else { usize::MAX };
    let value = vec![seed as u8; VALUE];
    let mut buf = vec![0u8; VALUE];
    while now_ns() < start_ns {
        std::hint::spin_loop();
    }
    let mut ops: u64 = 0;
    'run: loop {
        for &i in &order {
            if ops as usize % set_every == 0 {
                store.set(i, &keys[i], &value);
            } else {
                store.get(i, &keys[i], &mut buf);
            }
            ops += 1;
            if ops % 256 == 0 && now_ns() >= end_ns {
                break 'run;
            }
        }
    }
    println!("{ops}");
}

fn main() {
    let mut args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--child") {
        let n = |i: usize| args[i].parse::<u128>().unwrap();
        child(&args[2], &args[3], &args[4], n(5), n(6), n(7) as usize);
        return;
    }
    let mut option = |name: &str, default: &str| match args.iter().position(|a| a == name) {
        Some(at) => {
            let v = args.remove(at + 1);
            args.remove(at);
            v
        }
        None => default.to_string(),
    };
    let mix = option("--mix", "get");
    let kind = option("--store", "cache");
    assert!(["get", "1:10"].contains(&mix.as_str()), "--mix get or 1:10");
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
    Store::create(&kind, &path);
    let me = std::env::current_exe().unwrap();
    let mut one = None;
    println!("store {kind}, mix {mix}");
    for &n in &counts {
        let start = now_ns() + 300_000_000;
        let end = start + Duration::from_secs_f64(seconds).as_nanos();
        let kids: Vec<_> = (0..n)
            .map(|i| {
                std::process::Command::new(&me)
                    .args(["--child", &kind, &mix, path.to_str().unwrap()])
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
        println!("{n:>3} processes: {:>7.2} M ops/s  {:.2}x", rate / 1e6, rate / base);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
