//! Criterion benchmarks of the engine's hot paths, with the seeds' shapes:
//! 36-character keys and 16/160/1600-byte values.
//!
//! Run: `cargo bench -p nearcache-core --bench engine`

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use nearcache_core::{Cache, OpenOptions};
use std::hint::black_box;

fn key(i: usize) -> Vec<u8> {
    format!("{i:08x}-0000-4000-8000-{i:012x}").into_bytes()
}

fn open(tag: &str, size: usize) -> (Cache, std::path::PathBuf) {
    // In the default directory (tmpfs): the cache's intended home.
    let dir = nearcache_core::default_directory()
        .unwrap()
        .join(format!("bench-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("c");
    let c =
        Cache::open(&path, &OpenOptions { size: Some(size), recreate: true, ..Default::default() })
            .unwrap();
    (c, dir)
}

fn bench(c: &mut Criterion) {
    let (cache, dir) = open("hot", 64 << 20);
    let keys: Vec<Vec<u8>> = (0..10_000).map(key).collect();
    let mut g = c.benchmark_group("engine");
    for &size in &[16usize, 160, 1600] {
        let value = vec![0xabu8; size];
        for k in &keys {
            cache.set(k, &value, 0, 0).unwrap();
        }
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("get_hit", size), &size, |b, _| {
            let mut i = 0;
            let mut out = vec![0u8; size];
            b.iter(|| {
                i = (i + 1) % keys.len();
                cache.get_with(black_box(&keys[i]), |e| e.copy_to(&mut out)).unwrap()
            })
        });
        g.bench_with_input(BenchmarkId::new("set", size), &size, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % keys.len();
                cache.set(black_box(&keys[i]), black_box(&value), 0, 0).unwrap()
            })
        });
    }
    g.bench_function("get_miss", |b| {
        let missing = key(99_999_999);
        b.iter(|| cache.get_with(black_box(&missing), |_| ()).unwrap())
    });
    g.bench_function("incr", |b| {
        b.iter(|| cache.incr(black_box(b"counter"), 1, Some(0), 0).unwrap())
    });
    g.finish();

    // Writes into a full cache: every set pays its share of compaction and
    // SIEVE eviction. 8 MiB, 200,000 keys: each size overflows the cache.
    let mut g = c.benchmark_group("engine_full");
    g.throughput(Throughput::Elements(1));
    let many: Vec<Vec<u8>> = (0..200_000).map(key).collect();
    let mut opened = Vec::new();
    for value_len in [16usize, 160, 1600] {
        let (small, dir) = open(&format!("evict-{value_len}"), 8 << 20);
        let value = vec![7u8; value_len];
        g.bench_function(format!("set_{value_len}_evicting"), |b| {
            let mut i = 0;
            b.iter(|| {
                i = (i + 1) % many.len();
                small.set(black_box(&many[i]), &value, 0, 0).unwrap()
            })
        });
        opened.push((small, dir));
    }
    g.finish();
    drop(cache);
    let _ = std::fs::remove_dir_all(dir);
    for (small, dir) in opened {
        drop(small);
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// Opening per request: open a 64 MiB file, get one key, drop the handle.
/// `shared_mapping`: another handle of the file is alive in the process
/// (its mapping is reused); `alone`: nothing else has the file mapped or
/// attached (after a clean detach on tmpfs, the shards are not swept).
fn bench_open(c: &mut Criterion) {
    let (cache, dir) = open("open", 64 << 20);
    cache.set(b"k", b"v", 0, 0).unwrap();
    let path = dir.join("c");
    let opts = OpenOptions { size: Some(64 << 20), ..Default::default() };
    let mut g = c.benchmark_group("open");
    g.throughput(Throughput::Elements(1));
    g.bench_function("shared_mapping", |b| {
        b.iter(|| Cache::open(black_box(&path), &opts).unwrap().get(b"k").unwrap())
    });
    drop(cache);
    g.bench_function("alone", |b| {
        b.iter(|| Cache::open(black_box(&path), &opts).unwrap().get(b"k").unwrap())
    });
    g.finish();
    let _ = std::fs::remove_dir_all(dir);
}

criterion_group!(benches, bench, bench_open);
criterion_main!(benches);
