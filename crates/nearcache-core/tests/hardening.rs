//! Regression tests for the engine-hardening defects, and the concurrent
//! scribbler: a second mapping of the file rewriting header, slot and arena
//! words *while* operations run (not only between them, as the fuzz
//! targets of `security.rs` do).

mod common;
use common::*;
use nearcache_core::layout::{sh, Geometry, HEADER_SIZE, SHARD_HEADER_SIZE};
use nearcache_core::{Cache, Error, Update, UpdateOptions};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A second `MAP_SHARED` mapping of a cache file: what another process
/// writing the file sees and does.
struct RawMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: only raw, volatile word writes go through it; sharing it with a
// thread is what the test is about.
unsafe impl Send for RawMap {}
// SAFETY: see Send.
unsafe impl Sync for RawMap {}

impl RawMap {
    fn new(cache: &Cache) -> RawMap {
        let file = std::fs::OpenOptions::new().read(true).write(true).open(cache.path()).unwrap();
        let len = cache.capacity();
        use std::os::fd::AsRawFd;
        // SAFETY: mapping a file we own, MAP_SHARED, its whole length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        RawMap { ptr: p as *mut u8, len }
    }

    fn read_u64(&self, off: usize) -> u64 {
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: in bounds and aligned (checked above).
        unsafe { std::ptr::read_volatile(self.ptr.add(off) as *const u64) }
    }

    fn write_u64(&self, off: usize, v: u64) {
        assert!(off % 8 == 0 && off + 8 <= self.len);
        // SAFETY: in bounds and aligned (checked above); volatile, as
        // another process's store would be.
        unsafe { std::ptr::write_volatile(self.ptr.add(off) as *mut u64, v) }
    }
}

impl Drop for RawMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new().
        unsafe { libc::munmap(self.ptr as *mut libc::c_void, self.len) };
    }
}

fn shard_base(g: &Geometry, shard: usize) -> usize {
    HEADER_SIZE + shard * g.shard_size
}

/// Keys of `cache` that land in `shard`.
fn keys_in_shard(cache: &Cache, shard: usize, n: usize, tag: &str) -> Vec<Vec<u8>> {
    (0..)
        .map(|i| format!("{tag}-{i}").into_bytes())
        .filter(|k| cache.shard_index(k) == shard)
        .take(n)
        .collect()
}

/// Small xorshift generator: the tests must not depend on a crate's RNG.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

// ---------------------------------------------------------------- defect 5

#[test]
fn set_many_with_duplicate_keys_keeps_the_last_value() {
    let d = TempDir::new("dup");
    let c = open(&d, "c", 4 << 20, 16);
    for batch in 0..50u32 {
        // Many keys over many shards, each given three times with
        // different values; the last occurrence must win.
        let mut items: Vec<(Vec<u8>, Vec<u8>, u32)> = Vec::new();
        for round in 0..3u32 {
            for k in 0..40u32 {
                items.push((
                    format!("k{k}").into_bytes(),
                    format!("{batch}-{round}").into_bytes(),
                    round,
                ));
            }
        }
        c.set_many(&items, 0).unwrap();
        for k in 0..40u32 {
            let v = c.get(format!("k{k}").as_bytes()).unwrap().unwrap();
            assert_eq!(v.data, format!("{batch}-2").into_bytes(), "batch {batch} key {k}");
            assert_eq!(v.flags, 2);
        }
    }
}

// ---------------------------------------------------------------- defect 7

#[test]
fn each_file_gets_its_own_random_seed_kept_for_its_life() {
    let d = TempDir::new("seed");
    let a = open(&d, "a", 1 << 20, 4);
    let b = open(&d, "b", 1 << 20, 4);
    let seed_a = a.geometry().seed;
    assert_ne!(seed_a, b.geometry().seed);
    assert_ne!(seed_a, nearcache_core::hash::DEFAULT_SEED);
    // Where keys land differs between the files (with 4 shards, 64 keys
    // all landing alike by chance has probability 4^-64).
    let same = (0..64).filter(|i| {
        let k = format!("key{i}");
        a.shard_index(k.as_bytes()) == b.shard_index(k.as_bytes())
    });
    assert!(same.count() < 64);
    a.set(b"kept", b"v", 0, 0).unwrap();
    drop(a);
    let again = Cache::open(d.file("a"), &opts(1 << 20, 4)).unwrap();
    assert_eq!(again.geometry().seed, seed_a, "the seed is stable for the file's life");
    assert_eq!(again.get(b"kept").unwrap().unwrap().data, b"v");
}

// ---------------------------------------------------------------- defect 2

/// Another writer flips shard 0's bump pointer between 0 and the last word
/// of the arena while this process stores entries there. The bump pointer
/// used to be read twice in insert (checked on the first read, used on the
/// second): a set then wrote past the arena, over shard 1's header.
#[test]
fn a_flipped_bump_pointer_never_moves_a_write_out_of_the_arena() {
    let d = TempDir::new("bump");
    let c = Cache::open(d.file("c"), &opts(HEADER_SIZE + 2 * 64 * 1024, 2)).unwrap();
    let g = *c.geometry();
    let victims = keys_in_shard(&c, 1, 20, "victim");
    for k in &victims {
        c.set(k, b"intact", 0, 0).unwrap();
    }
    let raw = Arc::new(RawMap::new(&c));
    let stop = Arc::new(AtomicBool::new(false));
    let bump_word = shard_base(&g, 0) + sh::BUMP;
    let high = (g.arena_size() - 8) as u64;
    let flipper = {
        let (raw, stop) = (raw.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                raw.write_u64(bump_word, 0);
                raw.write_u64(bump_word, high);
            }
        })
    };
    let keys = keys_in_shard(&c, 0, 64, "k");
    let value = vec![7u8; 512];
    for i in 0..200_000usize {
        match c.set(&keys[i % keys.len()], &value, 0, 0) {
            Ok(()) | Err(Error::Corrupt(_)) => {}
            Err(e) => panic!("set failed: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    flipper.join().unwrap();
    for k in &victims {
        let v = c.get(k).expect("shard 1 must be untouched").expect("victim kept");
        assert_eq!(v.data, b"intact");
    }
}

// ---------------------------------------------------------------- the scribbler

/// What a scribbler may write: mostly plausible words (small counts,
/// aligned offsets inside the arena, valid-looking slots), sometimes
/// garbage, because plausible words are what pass the cheap checks.
fn plausible_word(rng: &mut Rng, g: &Geometry) -> u64 {
    match rng.below(6) {
        0 => 0,
        1 => rng.below(64),
        2 => rng.below(g.arena_size() as u64 + 64) & !7,
        3 => (rng.next() << 32) | rng.below((g.arena_size() / 8) as u64 + 2),
        4 => u64::MAX - rng.below(4),
        _ => rng.next(),
    }
}

/// A plausible segment-table word: a link to a segment (or none) and a
/// used count within (or just past) a segment.
fn plausible_segment_word(rng: &mut Rng, g: &Geometry) -> u64 {
    let (count, size) = g.segments();
    let next = if rng.below(4) == 0 { u32::MAX as u64 } else { rng.below(count as u64 + 2) };
    next << 32 | (rng.below(size as u64 + 64) & !3)
}

/// What the operations on the scribbled shard use (how many keys, and
/// values up to how many bytes, capped by what an entry may hold), and
/// whether the scribbler keeps to the refusals' record, so that the rest
/// of the shard works as it should and strict admission's duels (which
/// write the record) go on.
struct Load {
    keys: usize,
    max_value: usize,
    record_only: bool,
}

/// Few keys, values up to 64 KiB: spills, overwrites of every size.
const FEW_LARGE: Load = Load { keys: 200, max_value: 64 * 1024, record_only: false };

/// Rewrite random words of shard `target` (header past the mutex, index
/// and arena) from a second mapping while this process runs operations on
/// every shard. The process must not crash or panic; every shard other than
/// `target` must keep exactly its contents; reads from `target` return
/// values no longer than an entry may be.
fn scribble_while_operating(
    shard_size: usize,
    shards: usize,
    target: usize,
    ops: usize,
    load: Load,
) {
    let d = TempDir::new("scribble");
    let size = HEADER_SIZE + shards * shard_size;
    let c = Arc::new(Cache::open(d.file("c"), &opts(size, shards)).unwrap());
    // Adaptive admission: the policy region is read and written (the
    // scribbler rewrites the mode too, now and then).
    c.set_eviction_mode(nearcache_core::EvictionMode::Adaptive).unwrap();
    let g = *c.geometry();
    let mut others = Vec::new();
    for s in (0..shards).filter(|&s| s != target) {
        for k in keys_in_shard(&c, s, 8, "other") {
            c.set(&k, &k, 0, 0).unwrap();
            others.push(k);
        }
    }
    let raw = Arc::new(RawMap::new(&c));
    let stop = Arc::new(AtomicBool::new(false));
    let scribbles = Arc::new(AtomicU64::new(0));
    let scribbler = {
        let (raw, stop, scribbles) = (raw.clone(), stop.clone(), scribbles.clone());
        let record_only = load.record_only;
        std::thread::spawn(move || {
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ shard_size as u64);
            let base = shard_base(&g, target);
            // The lock word is scribbled too, now and then: a word naming no
            // live process is taken over, one naming a live process (small
            // values: init, kernel threads) costs a bounded wait.
            let header_words = (SHARD_HEADER_SIZE - 8) / 8;
            let segments = g.segments().0 as u64;
            let record = g.refusals_size();
            let record_off = base + g.policy_body_offset() + g.policy_size() - record;
            while !stop.load(Ordering::Relaxed) {
                if record_only {
                    let off = record_off + 8 * rng.below((record / 8) as u64) as usize;
                    let word = match rng.below(3) {
                        0 => rng.below(1 << 12),
                        // A probe's shape: the set bit, a clock, a tag.
                        1 => 1 << 63 | rng.below(1 << 32) << 31 | rng.below(1 << 31),
                        _ => plausible_word(&mut rng, &g),
                    };
                    raw.write_u64(off, word);
                    scribbles.fetch_add(1, Ordering::Relaxed);
                    std::thread::yield_now();
                    continue;
                }
                let off = match rng.below(31) {
                    0 => base, // the lock word (and the unused bytes after it)
                    1..=8 => base + 8 + 8 * rng.below(header_words as u64) as usize,
                    9..=16 => {
                        base + g.index_offset() + 8 * rng.below(g.slots_per_shard as u64) as usize
                    }
                    28..=30 => {
                        // The policy region (sketch, miniatures, mode, and
                        // the refusals' record at its end, if the shard
                        // has one): small values now and then, which pass
                        // as lengths, cursors, clocks and tags.
                        let off = if rng.below(4) == 0 {
                            base + g.policy_offset() + 8 * rng.below(8) as usize
                        } else if record > 0 && rng.below(3) == 0 {
                            record_off + 8 * rng.below((record / 8) as u64) as usize
                        } else {
                            base + g.policy_body_offset()
                                + 8 * rng.below((g.policy_size() / 8) as u64) as usize
                        };
                        if rng.below(2) == 0 {
                            raw.write_u64(off, rng.below(1 << 12));
                            scribbles.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        off
                    }
                    25..=27 => {
                        // The segment table, with words that pass its cheap
                        // checks now and then.
                        let off =
                            base + g.segment_table_offset() + 8 * rng.below(segments) as usize;
                        if rng.below(2) == 0 {
                            raw.write_u64(off, plausible_segment_word(&mut rng, &g));
                            scribbles.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        off
                    }
                    _ => {
                        base + g.arena_offset()
                            + 8 * rng.below((g.arena_size() / 8) as u64) as usize
                    }
                };
                // Keep the shard magic: a zeroed magic makes the shard refuse
                // service (tested in security.rs), which would end the run.
                if off == base + sh::MAGIC {
                    continue;
                }
                raw.write_u64(off, plausible_word(&mut rng, &g));
                scribbles.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let mut rng = Rng(12345);
    let keys = keys_in_shard(&c, target, load.keys, "t");
    let max_value = (c.max_entry_size() / 3).min(load.max_value);
    for _ in 0..ops {
        let k = &keys[rng.below(keys.len() as u64) as usize];
        let r = match rng.below(7) {
            0 | 1 => {
                let len = rng.below(max_value as u64) as usize;
                c.set(k, &vec![1u8; len], 0, 0)
            }
            2 => c.get(k).map(|v| {
                if let Some(v) = v {
                    assert!(v.data.len() <= c.max_entry_size());
                }
            }),
            3 => c.delete(k).map(drop),
            4 => c.incr(k, 1, Some(0), 0).map(drop).or_else(|e| match e {
                Error::NotACounter | Error::Overflow => Ok(()),
                e => Err(e),
            }),
            5 => c
                .set_many(&[(k.as_slice(), b"a".as_slice(), 0), (k.as_slice(), b"b", 0)], 0)
                .map(drop),
            // Versions come from the shard's seq and slots, which the
            // scribbler rewrites: a CAS may then fail or store wrongly,
            // never touch memory outside the shard (checked below).
            _ => c.get_versioned(k).and_then(|got| {
                let version = got.map_or(rng.next(), |(_, v)| v);
                c.cas(k, &[2u8; 64], 0, 0, version)?;
                let opts = UpdateOptions { ttl_ms: 0, max_conflicts: 3 };
                match c.update(k, |_| Update::Set(vec![3u8; 32], 0), &opts) {
                    Ok(_) | Err(Error::TooManyConflicts { .. }) => Ok(()),
                    Err(e) => Err(e),
                }
            }),
        };
        match r {
            Ok(()) | Err(Error::LockTimeout { .. }) => {}
            // The record is policy, not data: scribbled, it may turn the
            // shard's admission, never make it corrupt.
            Err(Error::Corrupt(_)) if !load.record_only => {}
            Err(e) => panic!("unexpected error under scribbling: {e}"),
        }
    }
    stop.store(true, Ordering::Relaxed);
    scribbler.join().unwrap();
    assert!(scribbles.load(Ordering::Relaxed) > 0);
    if load.record_only {
        c.check().expect("a shard whose refusals' record was scribbled passes its check");
    }
    for k in &others {
        let v = c.get(k).unwrap().unwrap_or_else(|| panic!("{k:?} lost from an untouched shard"));
        assert_eq!(&v.data, k, "an untouched shard changed");
    }
}

#[test]
fn scribbled_small_shards_never_crash_or_leak_into_other_shards() {
    scribble_while_operating(16 * 1024, 4, 1, 60_000, FEW_LARGE);
}

#[test]
fn scribbled_large_shards_never_crash_or_leak_into_other_shards() {
    scribble_while_operating(4 << 20, 2, 0, 30_000, FEW_LARGE);
}

/// A shard with a refusals' record (`Geometry::refusal_probes`), over-full
/// with small entries: strict admission refuses candidates and follows
/// them while the scribbler rewrites the record's clock, run and probes
/// (only those, so that the duels go on), then the whole shard.
#[test]
fn scribbled_refusals_record_never_crashes_or_leaks_into_other_shards() {
    for record_only in [true, false] {
        let load = Load { keys: 20_000, max_value: 200, record_only };
        scribble_while_operating(512 * 1024, 2, 1, 120_000, load);
    }
}

#[test]
fn scribbled_last_shard_never_writes_past_the_mapping() {
    scribble_while_operating(16 * 1024, 2, 1, 60_000, FEW_LARGE);
}

/// Defect 1, by property: for every geometry the engine accepts (shards up
/// to 16 GiB), every entry that passes the size check stores its value
/// length without truncation (31 bits since layout version 4).
#[test]
fn every_accepted_entry_length_fits_the_31_bit_length_field() {
    let mut rng = Rng(77);
    for _ in 0..10_000 {
        let shard_size = (16 * 1024 + rng.below(1 << 34) as usize) / 4096 * 4096;
        let shard_size = shard_size.min(nearcache_core::layout::MAX_SHARD_SIZE);
        let slots = nearcache_core::layout::slots_for_shard(shard_size);
        let g = Geometry { shard_count: 1, shard_size, slots_per_shard: slots, seed: 0 };
        if g.validate().is_err() {
            continue;
        }
        let largest_value = g.max_entry_size() - nearcache_core::layout::ENTRY_HEADER - 1;
        assert!(largest_value < 1 << 31, "shard of {shard_size} bytes");
    }
}

// ---------------------------------------------------------------- defect 9

#[test]
fn racing_recreators_end_on_one_file() {
    use std::os::unix::fs::PermissionsExt;
    for round in 0..20 {
        let d = TempDir::new("recreate");
        let path = d.file("c");
        std::fs::write(&path, vec![0u8; 8192]).unwrap(); // not a cache: must be replaced
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let barrier = Arc::new(std::sync::Barrier::new(6));
        let handles: Vec<_> = (0..6)
            .map(|i| {
                let (p, b) = (path.clone(), barrier.clone());
                std::thread::spawn(move || {
                    b.wait();
                    let o = nearcache_core::OpenOptions { recreate: true, ..opts(1 << 20, 2) };
                    let c = Cache::open(&p, &o).unwrap();
                    c.set(format!("t{i}").as_bytes(), b"x", 0, 0).unwrap();
                    c
                })
            })
            .collect();
        let caches: Vec<Cache> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        for c in &caches {
            for i in 0..6 {
                assert!(
                    c.get(format!("t{i}").as_bytes()).unwrap().is_some(),
                    "round {round}: recreators ended on different files"
                );
            }
        }
    }
}

#[test]
fn symlinked_or_foreign_directory_is_refused_unless_allowed() {
    let d = TempDir::new("dirs");
    let real = d.file("real");
    std::fs::create_dir(&real).unwrap();
    std::os::unix::fs::symlink(&real, d.file("link")).unwrap();
    match Cache::open(d.file("link").join("c"), &opts(1 << 20, 1)) {
        Err(Error::Permission(m)) => assert!(m.contains("symbolic link"), "{m}"),
        other => panic!("expected Permission, got {other:?}"),
    }
    let shared = nearcache_core::OpenOptions { allow_foreign_owner: true, ..opts(1 << 20, 1) };
    Cache::open(d.file("link").join("c"), &shared).unwrap();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped the foreign-directory half: needs root to chown");
        return;
    }
    let theirs = d.file("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
    match Cache::open(theirs.join("c"), &opts(1 << 20, 1)) {
        Err(Error::Permission(m)) => assert!(m.contains("belongs to uid 65534"), "{m}"),
        other => panic!("expected Permission, got {other:?}"),
    }
}

/// A panic under a shard lock (here: from the caller's callback, the only
/// foreign code that runs there) unwinds through the guard: the shard is
/// unlocked and consistent for the next locker (a panic inside the engine's
/// own write bracket would also repair the shard first, see `ShardGuard`).
#[test]
fn a_panic_under_the_lock_unlocks_and_leaves_a_consistent_shard() {
    let d = TempDir::new("panic");
    let c = open(&d, "c", 1 << 20, 1);
    for i in 0..50 {
        c.set(format!("k{i}").as_bytes(), b"v", 0, 0).unwrap();
    }
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        c.pop_with(b"k1", |_| panic!("caller code panicked under the lock")).unwrap();
    }));
    assert!(r.is_err());
    c.check().unwrap();
    assert_eq!(c.get(b"k2").unwrap().unwrap().data, b"v");
    c.set(b"k1", b"again", 0, 0).unwrap();
    c.check().unwrap();
}

/// The miniatures' lock (the policy header's word at 56) held by a live
/// process makes writers skip their replays and keep their samples; held
/// by a process that is gone, it is taken over within `HOLDER_CHECK`
/// (64) tries, and the miniatures learn again. Their count of sampled
/// requests (the header's word at 24) tells.
#[test]
fn the_miniatures_lock_is_skipped_while_held_and_taken_from_the_dead() {
    let d = TempDir::new("minis-lock");
    let c = open(&d, "c", 1 << 20, 1);
    c.set_eviction_mode(nearcache_core::EvictionMode::Adaptive).unwrap();
    let g: Geometry = *c.geometry();
    let raw = RawMap::new(&c);
    let pol = shard_base(&g, 0) + g.policy_offset();
    let value = [1u8; 100];
    let keys: Vec<Vec<u8>> = (0..4000).map(|i| format!("k{i}").into_bytes()).collect();
    let round = |n: usize| {
        for (i, k) in keys.iter().enumerate().take(n) {
            c.set(k, &value, 0, 0).unwrap();
            for j in 0..4 {
                c.get(&keys[(i * 7 + j * 13) % n]).unwrap();
            }
        }
    };
    round(keys.len());
    let requests = raw.read_u64(pol + 24);
    assert!(requests > 0, "an adaptive file's miniatures learn nothing");

    // Held by this (live) process: every replay is skipped.
    raw.write_u64(pol + 56, std::process::id() as u64);
    round(keys.len());
    assert_eq!(raw.read_u64(pol + 24), requests, "a replay ran under a live holder's lock");
    assert_eq!(raw.read_u64(pol + 56), std::process::id() as u64);

    // Held by a process that exited: taken over, and released again.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    raw.write_u64(pol + 56, dead as u64);
    round(keys.len());
    assert_ne!(raw.read_u64(pol + 24), requests, "the dead holder's lock was never taken over");
    assert_eq!(raw.read_u64(pol + 56), 0, "the lock was not let go");
    c.check().unwrap();
}
