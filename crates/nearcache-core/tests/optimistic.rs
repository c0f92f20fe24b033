//! The lock-free read path: gets that race writers, compactions, the
//! moves of a strict judgement and a stalled writer return whole values
//! or misses, never torn ones, never spin, and write nothing in the shard
//! on a hit.

mod common;
use common::*;
use nearcache_core::{Cache, EvictionMode, OpenOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Every byte of this i64 is 0x01: adding it changes all eight bytes.
const FLIP: i64 = 0x0101_0101_0101_0101;

/// One small shard: writers overwrite few keys with values of changing
/// length, so compactions (which move every entry) run all the time under
/// the readers.
/// A cache whose lock waits are long: on a loaded 2-core machine a
/// thread preempted while it holds the shard lock can outlast the default
/// wait, and a read that times out reads as a miss; the tests below are
/// about what readers see, not about lock waits.
fn open_patient(dir: &TempDir, size: usize, shards: usize) -> Cache {
    let o = OpenOptions { lock_timeout: Duration::from_secs(10), ..opts(size, shards) };
    Cache::open(dir.file("c"), &o).unwrap()
}

#[test]
fn readers_racing_writers_and_compactions_see_only_whole_values() {
    let dir = TempDir::new("opt-race");
    let cache = Arc::new(open_patient(&dir, 64 * 1024, 1));
    let keys: Vec<Vec<u8>> = (0..40).map(|i| format!("key-{i}").into_bytes()).collect();
    for k in &keys {
        cache.set(k, &make_value(k, 0, 64), 0, 0).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for w in 0..2u64 {
        let (cache, keys, stop) = (cache.clone(), keys.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = w;
            while !stop.load(Ordering::Relaxed) {
                i += 2;
                let k = &keys[(i * 7 % keys.len() as u64) as usize];
                let len = 40 + (i * 131 % 3000) as usize;
                cache.set(k, &make_value(k, i, len), 0, 0).unwrap();
                if i % 97 == 0 {
                    cache.delete(k).unwrap();
                }
                if i % 31 == 0 {
                    // In place: the counter stays a small multiple of FLIP,
                    // whose bytes all change at once; a torn read is not one.
                    let delta = if i % 62 == 0 { FLIP } else { -FLIP };
                    let _ = cache.incr(b"counter", delta, Some(0), 0);
                }
            }
        }));
    }
    for r in 0..2usize {
        let (cache, keys, stop, hits) = (cache.clone(), keys.clone(), stop.clone(), hits.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let k = &keys[i % keys.len()];
                if let Some(v) = cache.get(k).unwrap() {
                    verify_value(k, &v.data);
                    hits.fetch_add(1, Ordering::Relaxed);
                }
                if let Some(v) = cache.get(b"counter").unwrap() {
                    let n = i64::from_le_bytes(v.data.try_into().expect("a counter is 8 bytes"));
                    assert_eq!(n % FLIP, 0, "torn counter {n:#x}");
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let st = cache.stats().unwrap();
    assert!(hits.load(Ordering::Relaxed) > 1000, "readers barely hit: {st:?}");
    assert!(st.compactions > 10, "no compactions raced the readers: {st:?}");
    assert_eq!(st.resets + st.corruptions, 0, "{st:?}");
    cache.check().unwrap();
}

/// Strict admission judges a full head in several moves (the duels in
/// passes, the compaction in steps, `shard/segments.rs`), and readers go
/// on between them: what they find there must be whole. One segmented
/// shard pinned strict; a writer stores new keys nobody reads (candidates
/// that lose their duels) and rewrites a hot set the readers read (hit in
/// the window, they stay and slide down as the head is compacted).
#[test]
fn readers_between_the_moves_of_a_strict_judgement_see_only_whole_values() {
    let dir = TempDir::new("opt-strict");
    let cache = Arc::new(open_patient(&dir, 4 << 20, 1));
    cache.set_eviction_mode(EvictionMode::Strict).unwrap();
    let hot: Vec<Vec<u8>> = (0..200).map(|i| format!("hot-{i}").into_bytes()).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let hits = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    {
        let (cache, hot, stop) = (cache.clone(), hot.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let k = format!("cold-{i}").into_bytes();
                cache.set(&k, &make_value(&k, i, 120 + (i % 80) as usize), 0, 0).unwrap();
                if i % 4 == 0 {
                    let k = &hot[(i / 4 % hot.len() as u64) as usize];
                    cache.set(k, &make_value(k, i, 100 + (i % 200) as usize), 0, 0).unwrap();
                }
            }
        }));
    }
    for r in 0..2usize {
        let (cache, hot, stop, hits) = (cache.clone(), hot.clone(), stop.clone(), hits.clone());
        threads.push(std::thread::spawn(move || {
            let mut i = r;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let k = &hot[i * 13 % hot.len()];
                if let Some(v) = cache.get(k).unwrap() {
                    verify_value(k, &v.data);
                    hits.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let st = cache.stats().unwrap();
    assert_eq!(cache.strict_shards().unwrap(), 1);
    assert!(hits.load(Ordering::Relaxed) > 1000, "readers barely hit: {st:?}");
    assert!(st.evictions > 1000 && st.compactions > 100, "no judgements raced the readers: {st:?}");
    assert_eq!(st.resets + st.corruptions, 0, "{st:?}");
    cache.check().unwrap();
}

fn shard_bytes(cache: &Cache) -> Vec<u8> {
    // The file through the page cache: the same pages the mapping shows.
    let all = std::fs::read(cache.path()).unwrap();
    all[4096..].to_vec()
}

#[test]
fn a_hit_writes_nothing_in_the_shard() {
    let dir = TempDir::new("opt-nowrite");
    let cache = open(&dir, "c", 1 << 20, 2);
    cache.set(b"hot", b"value", 0, 0).unwrap();
    cache.set(b"ttl", b"value", 0, 60_000).unwrap();
    // The first hit of each marks the entry visited for SIEVE (one bit of
    // its index slot); later hits and misses write nothing in the shards.
    for k in [&b"hot"[..], b"ttl"] {
        assert!(cache.get(k).unwrap().is_some());
    }
    let before = shard_bytes(&cache);
    let hits_before = cache.stats().unwrap().hits;
    for _ in 0..1000 {
        assert_eq!(cache.get(b"hot").unwrap().unwrap().data, b"value");
        assert!(cache.get(b"ttl").unwrap().is_some());
        assert!(cache.get(b"absent").unwrap().is_none());
    }
    assert!(before == shard_bytes(&cache), "a get wrote into a shard");
    let st = cache.stats().unwrap();
    assert_eq!(st.hits - hits_before, 2000);
    assert!(st.misses >= 1000);
}

#[test]
fn hits_and_misses_from_every_handle_add_up() {
    let dir = TempDir::new("opt-stats");
    let a = open(&dir, "c", 1 << 20, 4);
    let attach = OpenOptions { size: None, ..OpenOptions::default() };
    let b = Cache::open(dir.file("c"), &attach).unwrap();
    a.set(b"k", b"v", 0, 0).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (path, attach) = (dir.file("c"), attach.clone());
            std::thread::spawn(move || {
                let c = Cache::open(path, &attach).unwrap();
                for _ in 0..500 {
                    assert!(c.get(b"k").unwrap().is_some());
                    assert!(c.get(b"nope").unwrap().is_none());
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    for c in [&a, &b] {
        let st = c.stats().unwrap();
        assert_eq!((st.hits, st.misses), (2000, 2000));
    }
    // Per-shard counters no longer carry hits (a get writes no shard word).
    assert!(a.shard_stats().unwrap().iter().all(|s| s.hits == 0 && s.misses == 0));
}

#[test]
fn a_writer_stalled_mid_write_sends_readers_to_the_lock_not_a_spin() {
    let dir = TempDir::new("opt-stalled");
    let opts = OpenOptions {
        size: Some(1 << 20),
        shards: 1,
        lock_timeout: Duration::from_millis(20),
        ..OpenOptions::default()
    };
    let cache = Arc::new(Cache::open(dir.file("c"), &opts).unwrap());
    cache.set(b"k", b"v", 0, 0).unwrap();
    assert!(cache.get(b"k").unwrap().is_some());
    let holder = {
        let cache = cache.clone();
        std::thread::spawn(move || {
            cache.debug_hold_shard_mid_write(b"k", Duration::from_millis(400))
        })
    };
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    // The shard is half-written (its seq is odd): no optimistic read may
    // return what is there; the get waits for the lock, runs out of time,
    // and reads as a counted miss.
    assert!(cache.get(b"k").unwrap().is_none());
    assert!(t.elapsed() < Duration::from_millis(300), "the get did not give up");
    assert!(cache.stats().unwrap().lock_timeouts >= 1);
    holder.join().unwrap().unwrap();
    cache.check().unwrap();
}

#[test]
fn a_first_hit_needs_no_lock_and_marks_the_entry_for_sieve() {
    let dir = TempDir::new("opt-firsthit");
    let opts = OpenOptions {
        size: Some(64 * 1024),
        shards: 1,
        lock_timeout: Duration::from_millis(20),
        ..OpenOptions::default()
    };
    let cache = Arc::new(Cache::open(dir.file("c"), &opts).unwrap());
    cache.set(b"read", b"v", 0, 0).unwrap();
    cache.set(b"unread", b"v", 0, 0).unwrap();
    let holder = {
        let cache = cache.clone();
        std::thread::spawn(move || cache.debug_hold_shard_lock(b"read", Duration::from_millis(300)))
    };
    std::thread::sleep(Duration::from_millis(50));
    // Another process holds the shard's lock (a preempted writer): the
    // first hit of a new entry is served and marked without it. Through
    // the lock it would have timed out and read as a miss.
    assert_eq!(cache.get(b"read").unwrap().unwrap().data, b"v");
    assert_eq!(cache.stats().unwrap().lock_timeouts, 0);
    holder.join().unwrap().unwrap();
    // The mark counts for SIEVE: the oldest entries are "read" then
    // "unread"; the first eviction spares "read" and takes "unread".
    let mut i = 0u32;
    while cache.stats().unwrap().evictions == 0 {
        cache.set(format!("filler-{i}").as_bytes(), &[7u8; 200], 0, 0).unwrap();
        i += 1;
    }
    assert!(cache.get(b"unread").unwrap().is_none());
    assert!(cache.get(b"read").unwrap().is_some());
    cache.check().unwrap();
}

fn seq_of_shard0(cache: &Cache) -> u64 {
    let bytes = shard_bytes(cache);
    let at = nearcache_core::layout::sh::SEQ;
    u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
}

/// Appends, overwrites and deletes leave `seq` (the word optimistic readers
/// validate against) alone; only writes that move entries change it.
#[test]
fn only_writes_that_move_entries_change_seq() {
    let dir = TempDir::new("opt-seq");
    let cache = open(&dir, "c", 64 * 1024, 1);
    let seq = seq_of_shard0(&cache);
    assert_eq!(seq % 2, 0);
    for i in 0..20 {
        cache.set(format!("k{i}").as_bytes(), b"first", 0, 0).unwrap();
    }
    cache.set(b"k1", b"second", 0, 0).unwrap();
    cache.delete(b"k2").unwrap();
    assert_eq!(seq_of_shard0(&cache), seq, "an ordinary write moved seq");
    // A touch rewrites the two words of an entry's expiry, and an
    // in-place counter update 8 possibly unaligned bytes: both are moves
    // (a reader must not see half of each), and so are compactions.
    cache.touch(b"k3", 60_000).unwrap();
    assert_eq!(seq_of_shard0(&cache), seq + 2);
    cache.incr(b"n", 1, Some(0), 0).unwrap();
    assert_eq!(seq_of_shard0(&cache), seq + 2);
    cache.incr(b"n", 1, None, 0).unwrap();
    let after_incr = seq_of_shard0(&cache);
    assert_eq!(after_incr, seq + 4);
    while cache.stats().unwrap().compactions == 0 {
        cache.set(b"k1", &[9u8; 500], 0, 0).unwrap();
    }
    let after = seq_of_shard0(&cache);
    assert!(after > after_incr && after % 2 == 0, "{after}");
    cache.check().unwrap();
}

/// An overwrite replaces the slot in one store: a reader finds the old
/// value or the new one, never neither, also while compactions (which
/// take the key out of the index and put it back inside one move) run.
#[test]
fn an_overwritten_key_never_reads_as_absent() {
    let dir = TempDir::new("opt-overwrite");
    let cache = Arc::new(open_patient(&dir, 64 * 1024, 1));
    let keys: Vec<Vec<u8>> = (0..30).map(|i| format!("key-{i}").into_bytes()).collect();
    for k in &keys {
        cache.set(k, &make_value(k, 0, 64), 0, 0).unwrap();
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (cache, keys, stop) = (cache.clone(), keys.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                let k = &keys[(i % keys.len() as u64) as usize];
                cache.set(k, &make_value(k, i, 40 + (i * 37 % 600) as usize), 0, 0).unwrap();
            }
        })
    };
    let readers: Vec<_> = (0..2)
        .map(|r| {
            let (cache, keys, stop) = (cache.clone(), keys.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    i += 1;
                    let k = &keys[i % keys.len()];
                    let v = cache.get(k).unwrap();
                    let v = v
                        .unwrap_or_else(|| panic!("{} read as absent", String::from_utf8_lossy(k)));
                    verify_value(k, &v.data);
                    n += 1;
                }
                n
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
    let reads: u64 = readers.into_iter().map(|t| t.join().unwrap()).sum();
    let st = cache.stats().unwrap();
    assert!(reads > 1000, "{reads} reads");
    assert!(st.compactions > 10, "no compactions raced the readers: {st:?}");
    assert_eq!(st.evictions + st.lock_timeouts + st.resets, 0, "{st:?}");
    cache.check().unwrap();
}
