//! Live resize (`resize.rs`): entries kept on a grow, the newest kept on a
//! shrink, every handle and process following the switch, the old file's
//! memory let go, a resizer killed at every step finished by a survivor,
//! concurrent resizers agreeing, and hostile migration records reset.
//!
//! Child processes are this test binary re-executed with `NC_CHILD` set,
//! running the `child_main` test, which does nothing otherwise.

mod common;
use common::*;
use nearcache_core::layout::{fh, Geometry};
use nearcache_core::{Cache, OpenOptions};
use std::collections::HashMap;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn as_is() -> OpenOptions {
    OpenOptions { size: None, lock_timeout: Duration::from_secs(30), ..OpenOptions::default() }
}

fn spawn_child(role: &str, path: &Path, arg: &str, abort_at: Option<u64>) -> Child {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("NC_CHILD", role)
        .env("NC_PATH", path)
        .env("NC_ARG", arg)
        .stdout(std::process::Stdio::null());
    if let Some(n) = abort_at {
        c.env("NEARCACHE_DEBUG_RESIZE_ABORT_AT", n.to_string());
    }
    c.spawn().unwrap()
}

/// The sequence number a `make_value` value carries.
fn seq_of(key: &[u8], v: &[u8]) -> u64 {
    verify_value(key, v);
    let at = 4 + key.len();
    u64::from_le_bytes(v[at..at + 8].try_into().unwrap())
}

/// A worker: gets and sets its own keys until `stop` exists, checking
/// that every value read is whole, its own, and the last it wrote (a
/// value served from a file left behind would be an older one). Misses
/// are allowed (a shrink evicts). Writes the number of operations to
/// `<path>.done-<tag>`.
fn worker(path: &Path, tag: &str) {
    let c = Cache::open(path, &as_is()).unwrap();
    let stop = path.with_extension("stop");
    let mut last: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ tag.len() as u64 ^ std::process::id() as u64;
    let mut ops = 0u64;
    while !stop.exists() || ops < 2000 {
        for _ in 0..200 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = format!("{tag}-{}", x % 300).into_bytes();
            ops += 1;
            if x >> 60 < 6 {
                if let Some(v) = c.get(&key).unwrap() {
                    let s = seq_of(&key, &v.data);
                    assert_eq!(Some(&s), last.get(&key), "stale or foreign value for {key:?}");
                }
            } else {
                let len = 40 + (x >> 32) as usize % 400;
                c.set(&key, &make_value(&key, ops, len), 0, 0).unwrap();
                last.insert(key, ops);
            }
        }
    }
    std::fs::write(path.with_extension(format!("done-{tag}")), ops.to_string()).unwrap();
}

#[test]
fn child_main() {
    let Ok(role) = std::env::var("NC_CHILD") else { return };
    let path = std::path::PathBuf::from(std::env::var("NC_PATH").unwrap());
    let arg = std::env::var("NC_ARG").unwrap();
    match role.as_str() {
        "worker" => worker(&path, &arg),
        "open-set" => {
            // Wait for the parent's go (all children start together), then
            // open with size `NC_ARG`'s first half and set key k<second>.
            let (size, i) = arg.split_once(':').unwrap();
            let go = path.with_extension("go");
            let start = Instant::now();
            while !go.exists() {
                assert!(start.elapsed() < Duration::from_secs(30), "no go from the parent");
                std::thread::sleep(Duration::from_micros(200));
            }
            let c = Cache::open(&path, &opts(size.parse().unwrap(), 0)).unwrap();
            let k = format!("k{i}").into_bytes();
            c.set(&k, &make_value(&k, i.parse().unwrap(), 100), 0, 0).unwrap();
        }
        "resize" => {
            let c = Cache::open(&path, &as_is()).unwrap();
            let (size, shards) = arg.split_once(':').unwrap();
            c.resize(size.parse().unwrap(), shards.parse().unwrap()).unwrap();
        }
        other => panic!("unknown role {other}"),
    }
}

fn fill(c: &Cache, n: usize, len: usize) {
    for i in 0..n {
        let k = format!("k{i}").into_bytes();
        c.set(&k, &make_value(&k, i as u64, len), 0, 0).unwrap();
    }
}

fn present(c: &Cache, n: usize) -> Vec<bool> {
    (0..n)
        .map(|i| {
            let k = format!("k{i}").into_bytes();
            c.get(&k).unwrap().map(|v| assert_eq!(seq_of(&k, &v.data), i as u64)).is_some()
        })
        .collect()
}

/// Mappings and descriptors of this process on the file with inode `ino`
/// (a file a resize replaced: once every handle followed, none).
fn held(ino: u64) -> usize {
    use std::os::unix::fs::MetadataExt;
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let mapped = maps
        .lines()
        .filter(|l| l.split_whitespace().nth(4).and_then(|f| f.parse::<u64>().ok()) == Some(ino))
        .count();
    let fds = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::metadata(e.path()).is_ok_and(|m| m.ino() == ino))
        .count();
    mapped + fds
}

fn ino(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().ino()
}

fn resize_leftovers(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".resize-"))
        .collect()
}

fn shm_dir(tag: &str) -> TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        TempDir::in_dir(shm, tag)
    } else {
        TempDir::new(tag)
    }
}

#[test]
fn a_grow_keeps_every_entry_and_every_handle_follows() {
    let d = shm_dir("grow");
    let a = open(&d, "c", 1 << 20, 4);
    let b = Cache::open(d.file("c"), &as_is()).unwrap();
    fill(&a, 2000, 120);
    assert!(present(&a, 2000).iter().all(|&p| p));
    let old = ino(&d.file("c"));
    assert_eq!(held(old), 2);
    let g = a.resize(4 << 20, 8).unwrap();
    assert_eq!(
        (g.shard_count, g.total_size()),
        (8, Geometry::for_size(4 << 20, 8).unwrap().total_size())
    );
    for c in [&a, &b] {
        assert!(present(c, 2000).iter().all(|&p| p), "an entry was lost by the grow");
        assert_eq!(c.geometry().shard_count, 8);
        assert_eq!(c.len().unwrap(), 2000);
    }
    a.check().unwrap();
    // Both handles followed: nothing of the old file is held.
    assert_eq!(held(old), 0);
    assert!(resize_leftovers(&d.0).is_empty());
    // A new open of the path sees the new file; the same size again is a
    // no-op.
    let c = Cache::open(d.file("c"), &opts(4 << 20, 8)).unwrap();
    assert_eq!(c.debug_mapping_address(), a.debug_mapping_address());
}

#[test]
fn a_shrink_keeps_the_newest_entries() {
    let d = shm_dir("shrink");
    let a = open(&d, "c", 8 << 20, 8);
    let n = 12_000;
    fill(&a, n, 200);
    assert!(present(&a, n).iter().all(|&p| p), "the fill must not evict");
    let old = ino(&d.file("c"));
    let g = a.resize(1 << 20, 4).unwrap();
    assert_eq!(g.shard_count, 4);
    let p = present(&a, n);
    let kept = p.iter().filter(|&&x| x).count();
    assert!(kept > 1000 && kept < n / 2, "kept {kept}");
    // The newest tenth of what was kept is all there; the oldest half of
    // what was written is gone.
    let newest = &p[n - kept / 10..];
    assert!(newest.iter().all(|&x| x), "a recent entry was dropped");
    assert_eq!(p[..n / 2].iter().filter(|&&x| x).count(), 0, "an old entry was kept");
    a.check().unwrap();
    // Writes go on in the new file, with evictions of its own.
    fill(&a, 3000, 200);
    a.check().unwrap();
    assert_eq!(held(old), 0);
}

#[test]
fn spilled_values_move_with_their_entries() {
    let d = shm_dir("spill");
    let o = OpenOptions { spill_threshold: Some(1000), ..opts(2 << 20, 4) };
    let a = Cache::open(d.file("c"), &o).unwrap();
    for i in 0..40 {
        let k = format!("big{i}").into_bytes();
        a.set(&k, &make_value(&k, i, 5000), 0, 0).unwrap();
    }
    let spill_dir = nearcache_core::spill::dir_path(&d.file("c"));
    let files = || std::fs::read_dir(&spill_dir).unwrap().count();
    assert_eq!(files(), 40);
    a.resize(4 << 20, 8).unwrap();
    for i in 0..40 {
        let k = format!("big{i}").into_bytes();
        assert_eq!(seq_of(&k, &a.get(&k).unwrap().unwrap().data), i);
    }
    assert_eq!(a.stats().unwrap().spilled_values, 40);
    // Overwrites and deletes in the new file remove the old files.
    a.delete(b"big0").unwrap();
    a.set(b"big1", b"small now", 0, 0).unwrap();
    assert_eq!(files(), 38);
    // A sweep after the move finds no orphan and removes nothing named.
    let r = a.sweep_spilled(Duration::ZERO).unwrap();
    assert_eq!(r.removed, 0);
    assert_eq!(files(), 38);
}

#[test]
fn processes_keep_working_through_a_grow_and_a_shrink() {
    let d = shm_dir("live");
    let path = d.file("c");
    let a = open(&d, "c", 2 << 20, 8);
    // Entries nobody overwrites: all must survive the grow.
    fill(&a, 1500, 100);
    let first = ino(&path);
    let workers: Vec<Child> =
        ["w0", "w1", "w2"].iter().map(|t| spawn_child("worker", &path, t, None)).collect();
    std::thread::sleep(Duration::from_millis(300));
    a.resize(4 << 20, 16).unwrap();
    let second = ino(&path);
    assert!(present(&a, 1500).iter().all(|&p| p), "the grow lost an entry");
    std::thread::sleep(Duration::from_millis(300));
    a.resize(1 << 20, 4).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(path.with_extension("stop"), b"1").unwrap();
    for mut w in workers {
        assert!(w.wait().unwrap().success(), "a worker failed (error, or a wrong value)");
    }
    for t in ["w0", "w1", "w2"] {
        let ops: u64 = std::fs::read_to_string(path.with_extension(format!("done-{t}")))
            .unwrap()
            .parse()
            .unwrap();
        assert!(ops >= 2000);
    }
    a.check().unwrap();
    assert_eq!(a.geometry().shard_count, 4);
    // This process let go of both old files.
    assert_eq!(held(first) + held(second), 0);
    assert!(resize_leftovers(&d.0).is_empty());
}

/// Steps of a migration of a 4-shard file (see `resize::abort_step`): 1
/// file made, 2 record published, 3..=6 a group moved each, 7 new file
/// complete, 8 renamed, 9 record moved.
const STEPS: u64 = 9;

#[test]
fn a_resizer_killed_at_any_step_leaves_a_usable_cache() {
    for step in 1..=STEPS {
        let d = shm_dir("kill");
        let path = d.file("c");
        let a = open(&d, "c", 1 << 20, 4);
        fill(&a, 800, 100);
        let mut child = spawn_child("resize", &path, &format!("{}:8", 4 << 20), Some(step));
        let status = child.wait().unwrap();
        assert!(!status.success(), "step {step}: the resizer was meant to abort");
        // The survivor: every entry there, whole and current, whichever
        // file it is served from; then writes and reads go on.
        assert!(present(&a, 800).iter().all(|&p| p), "step {step}: an entry was lost");
        for i in 0..800 {
            let k = format!("k{i}").into_bytes();
            a.set(&k, &make_value(&k, 1000 + i, 100), 0, 0).unwrap();
        }
        let shards = a.geometry().shard_count;
        assert_eq!(shards, if step <= 1 { 4 } else { 8 }, "step {step}");
        a.check().unwrap();
        // A fresh process's view agrees.
        drop(a);
        let b = Cache::open(&path, &as_is()).unwrap();
        for i in 0..800 {
            let k = format!("k{i}").into_bytes();
            assert_eq!(seq_of(&k, &b.get(&k).unwrap().unwrap().data), 1000 + i, "step {step}");
        }
        // A new file left by a resizer killed before it published is
        // removed by the next resize, once it is a minute old (its maker
        // might still be about to publish it before that).
        let left = resize_leftovers(&d.0);
        assert_eq!(left.len(), usize::from(step <= 1), "step {step}: {left:?}");
        b.resize(2 << 20, 0).unwrap();
        assert_eq!(resize_leftovers(&d.0), left, "step {step}: a young file was removed");
        for name in &left {
            let f = std::fs::File::options().write(true).open(d.0.join(name)).unwrap();
            f.set_modified(std::time::SystemTime::now() - Duration::from_secs(120)).unwrap();
        }
        b.resize(1 << 20, 4).unwrap();
        assert!(resize_leftovers(&d.0).is_empty(), "step {step}: {:?}", resize_leftovers(&d.0));
    }
}

/// A resizer killed after renaming its new file over the path, before its
/// record said so, and the cache resized again from the path meanwhile:
/// a process still on the first file finds the first new file gone and
/// the path naming a later one. The migration is over (its file was
/// renamed into place; only that removes it), so that process follows
/// the path; it must not take the gone file for a removed one and reset
/// its record (it would go on, alone, on the first file, emptied).
#[test]
fn a_process_left_behind_by_two_resizes_follows_the_path() {
    let d = shm_dir("chain");
    let path = d.file("c");
    let a = open(&d, "c", 1 << 20, 4);
    fill(&a, 800, 100);
    // 4 groups: step 3 + 4 = the new file complete, 8 = renamed.
    let mut child = spawn_child("resize", &path, &format!("{}:8", 4 << 20), Some(8));
    assert!(!child.wait().unwrap().success(), "the resizer was meant to abort");
    // Another handle opens the path (the first new file, whole) and
    // resizes it again.
    let b = Cache::open(&path, &as_is()).unwrap();
    b.resize(8 << 20, 16).unwrap();
    assert!(present(&b, 800).iter().all(|&p| p));
    // The first handle, still on the first file, follows to the last.
    assert!(present(&a, 800).iter().all(|&p| p), "an entry was lost");
    assert_eq!(a.geometry().shard_count, 16);
    a.set(b"after", b"both see it", 0, 0).unwrap();
    assert_eq!(b.get(b"after").unwrap().unwrap().data, b"both see it");
}

#[test]
fn concurrent_resizers_agree_on_one_result() {
    let d = shm_dir("race");
    let path = d.file("c");
    let a = open(&d, "c", 1 << 20, 4);
    fill(&a, 500, 100);
    // A slow resizer in another process (150 ms per shard moved).
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("NC_CHILD", "resize")
        .env("NC_PATH", &path)
        .env("NC_ARG", format!("{}:2", 2 << 20))
        .env("NEARCACHE_DEBUG_RESIZE_PAUSE_MS", "150")
        .stdout(std::process::Stdio::null());
    let mut child = c.spawn().unwrap();
    let f = std::fs::File::open(&path).unwrap();
    let start = Instant::now();
    loop {
        let mut w = [0u8; 8];
        f.read_exact_at(&mut w, fh::MIGRATION as u64).unwrap();
        if u64::from_ne_bytes(w) & 3 == 1 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the resizer never started");
        std::thread::sleep(Duration::from_millis(1));
    }
    // This resize finds that one under way: it waits, and keeps its result.
    let g = a.resize(4 << 20, 8).unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(
        (g.shard_count, g.total_size()),
        (2, Geometry::for_size(2 << 20, 2).unwrap().total_size())
    );
    assert_eq!(a.geometry(), &g);
    assert!(present(&a, 500).iter().all(|&p| p));
    assert!(resize_leftovers(&d.0).is_empty());
}

#[test]
fn hostile_migration_records_are_reset_never_followed_elsewhere() {
    let d = shm_dir("hostile");
    let path = d.file("c");
    let words: [u64; 8] = [
        3,
        1,
        2,
        0xdead_beef << 2 | 1,
        0xdead_beef << 2 | 2,
        u64::MAX,
        // An id whose hex reads like a path is still 16 hex digits.
        0x2f2e_2e2f << 2 | 1,
        0,
    ];
    for (n, &w) in words.iter().enumerate() {
        let _ = std::fs::remove_file(&path);
        let a = open(&d, "c", 1 << 20, 4);
        fill(&a, 300, 100);
        drop(a);
        let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        f.write_all_at(&w.to_ne_bytes(), fh::MIGRATION as u64).unwrap();
        // Half the groups claim to be moved.
        f.write_all_at(&0b1010u64.to_ne_bytes(), fh::MOVED as u64).unwrap();
        let before = listing(d.0.parent().unwrap());
        let c = Cache::open(&path, &as_is()).unwrap();
        // Usable: entries written now are read back, from one file.
        for i in 0..300 {
            let k = format!("k{i}").into_bytes();
            c.set(&k, &make_value(&k, 7000 + i, 100), 0, 0).unwrap();
        }
        let again = Cache::open(&path, &as_is()).unwrap();
        for i in 0..300 {
            let k = format!("k{i}").into_bytes();
            assert_eq!(seq_of(&k, &again.get(&k).unwrap().unwrap().data), 7000 + i, "case {n}");
        }
        c.check().unwrap();
        let after = listing(d.0.parent().unwrap());
        assert_eq!(before, after, "case {n}: a file appeared outside the cache's directory");
        assert!(resize_leftovers(&d.0).is_empty(), "case {n}");
        // And a resize still works from there.
        c.resize(2 << 20, 0).unwrap();
        assert!(present_from(&again, 300, 7000), "case {n}");
    }
}

/// The names in `dir`, but the directories of tests running meanwhile.
fn listing(dir: &Path) -> Vec<std::ffi::OsString> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| !n.to_string_lossy().starts_with("nc-test-"))
        .collect();
    v.sort();
    v
}

fn present_from(c: &Cache, n: usize, base: u64) -> bool {
    (0..n).all(|i| {
        let k = format!("k{i}").into_bytes();
        c.get(&k).unwrap().is_some_and(|v| seq_of(&k, &v.data) == base + i as u64)
    })
}

#[test]
fn opening_with_another_size_resizes_and_waits_for_nobody() {
    let d = shm_dir("reopen");
    let a = open(&d, "c", 1 << 20, 4);
    fill(&a, 500, 100);
    let start = Instant::now();
    let b = open(&d, "c", 2 << 20, 0);
    assert!(start.elapsed() < Duration::from_secs(10));
    assert_eq!(b.capacity(), Geometry::for_size(2 << 20, 0).unwrap().total_size());
    assert!(present(&a, 500).iter().all(|&p| p));
    assert_eq!(a.capacity(), b.capacity());
}

#[test]
fn a_shrink_after_a_grow_still_keeps_the_newest() {
    let d = shm_dir("regrow");
    let a = open(&d, "c", 8 << 20, 8);
    let n = 12_000;
    fill(&a, n, 200);
    a.resize(16 << 20, 16).unwrap();
    assert!(present(&a, n).iter().all(|&p| p));
    a.resize(1 << 20, 4).unwrap();
    let p = present(&a, n);
    let kept = p.iter().filter(|&&x| x).count();
    let newest = p[n - kept / 10..].iter().filter(|&&x| x).count();
    assert!(newest * 100 >= (kept / 10) * 97, "newest kept: {newest} of {}", kept / 10);
    let oldest = p[..n / 2].iter().filter(|&&x| x).count();
    assert!(oldest * 100 <= n / 2, "oldest kept: {oldest} of {}", n / 2);
    a.check().unwrap();
}

/// A file larger than the engine retires inline (16 MiB) is let go by a
/// thread of its own, chunk by chunk: every handle follows at once and
/// sees every entry, and the old file's mappings and descriptors are gone
/// soon after, with no call of the handles' waiting for it.
#[test]
fn a_large_file_is_let_go_in_the_background() {
    let d = shm_dir("bigretire");
    let a = open(&d, "c", 48 << 20, 16);
    let b = Cache::open(d.file("c"), &as_is()).unwrap();
    let n = 60_000;
    fill(&a, n, 400); // touches most pages of the 48 MiB file
    let old = ino(&d.file("c"));
    assert_eq!(held(old), 2);
    a.resize(64 << 20, 16).unwrap();
    for c in [&a, &b] {
        assert!(present(c, n).iter().all(|&p| p), "an entry was lost by the grow");
        assert_eq!(c.geometry().shard_count, 16);
    }
    let start = Instant::now();
    while held(old) != 0 {
        assert!(start.elapsed() < Duration::from_secs(20), "the old file is still held");
        std::thread::sleep(Duration::from_millis(10));
    }
    fill(&a, 1000, 400);
    a.check().unwrap();
}

/// Rounds of the racing-openers tests: one round lost an entry about once
/// in 15 before the routing read the record before the retirement (see
/// `Cache::routed`), so 40 rounds catch that in nearly every run, in well
/// under a second.
const OPENER_ROUNDS: usize = 40;

/// Four threads of one process open one new cache with four different
/// sizes at once, and each sets a key: whatever size wins, every handle
/// ends on one file that holds every key. (The handles share one mapping
/// per file: one that follows a resize retires it under the others, whose
/// next read of the record must not take its zero pages for an idle file
/// and resize them.)
#[test]
fn openers_racing_with_different_sizes_all_open_one_cache() {
    for round in 0..OPENER_ROUNDS {
        let d = shm_dir("sizes");
        let path = d.file("c");
        let barrier = std::sync::Barrier::new(4);
        let caches: Vec<Cache> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4usize)
                .map(|i| {
                    let (barrier, path) = (&barrier, &path);
                    s.spawn(move || {
                        barrier.wait();
                        let c = Cache::open(path, &opts((1 + i) << 20, 0)).unwrap();
                        let k = format!("k{i}").into_bytes();
                        c.set(&k, &make_value(&k, i as u64, 100), 0, 0).unwrap();
                        c
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        // Whatever size won, every handle is on that one file and sees
        // every entry.
        let g = *caches[0].geometry();
        for c in &caches {
            for i in 0..4u64 {
                let k = format!("k{i}").into_bytes();
                let v = c.get(&k).unwrap();
                let v = v.unwrap_or_else(|| panic!("round {round}: k{i} lost"));
                assert_eq!(seq_of(&k, &v.data), i);
            }
            assert_eq!(c.geometry(), &g);
        }
        drop(caches);
        assert!(resize_leftovers(&d.0).is_empty());
    }
}

/// The same race between processes: four children open one new cache
/// with four different sizes at once and each sets a key; afterwards the
/// cache holds every key. (Each process maps the files itself, so no
/// process sees another's retired mapping; the record and the rename
/// decide.)
#[test]
fn processes_opening_with_different_sizes_keep_every_entry() {
    for round in 0..OPENER_ROUNDS / 4 {
        let d = shm_dir("psizes");
        let path = d.file("c");
        let go = path.with_extension("go");
        let kids: Vec<Child> = (0..4usize)
            .map(|i| spawn_child("open-set", &path, &format!("{}:{i}", (1 + i) << 20), None))
            .collect();
        std::fs::write(&go, b"").unwrap();
        for mut k in kids {
            assert!(k.wait().unwrap().success(), "round {round}: an opener failed");
        }
        let c = Cache::open(&path, &as_is()).unwrap();
        for i in 0..4u64 {
            let k = format!("k{i}").into_bytes();
            let v = c.get(&k).unwrap().unwrap_or_else(|| panic!("round {round}: k{i} lost"));
            assert_eq!(seq_of(&k, &v.data), i);
        }
        drop(c);
        assert!(resize_leftovers(&d.0).is_empty());
    }
}

/// A hostile record: any state and id, any moved bitmap, and perhaps a
/// file planted under the name the record derives (garbage, or a symbolic
/// link to a file elsewhere). Opening and using the cache then works or
/// fails with an error; it never panics, never touches the file the link
/// points to, and never leaves a file outside the cache's directory.
fn hostile_record(word: u64, bits: &[u64], plant: u8) {
    let d = shm_dir("fuzzrec");
    let path = d.file("c");
    let outside = TempDir::new("fuzzrec-outside");
    let target = outside.file("victim");
    std::fs::write(&target, b"not a cache").unwrap();
    let a = open(&d, "c", 1 << 20, 4);
    fill(&a, 100, 100);
    drop(a);
    let f = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    f.write_all_at(&word.to_ne_bytes(), fh::MIGRATION as u64).unwrap();
    for (i, b) in bits.iter().enumerate() {
        f.write_all_at(&b.to_ne_bytes(), (fh::MOVED + 8 * i) as u64).unwrap();
    }
    let planted = d.0.join(format!("c.resize-{:016x}", word >> 2));
    match plant % 3 {
        1 => std::fs::write(&planted, vec![0xa5u8; 8192]).unwrap(),
        2 => std::os::unix::fs::symlink(&target, &planted).unwrap(),
        _ => {}
    }
    let before = listing(d.0.parent().unwrap());
    // A process that keeps the file open while others come and go.
    let held = Cache::open(&path, &as_is());
    if let Ok(c) = &held {
        for i in 0..100 {
            let k = format!("k{i}").into_bytes();
            if let Ok(Some(v)) = c.get(&k) {
                verify_value(&k, &v.data);
            }
            let _ = c.set(&k, &make_value(&k, 9000 + i, 100), 0, 0);
        }
        let _ = c.check();
        let _ = c.resize(2 << 20, 0);
        for i in 0..100 {
            let k = format!("k{i}").into_bytes();
            if let Ok(Some(v)) = c.get(&k) {
                verify_value(&k, &v.data);
            }
        }
    }
    drop(held);
    assert_eq!(std::fs::read(&target).unwrap(), b"not a cache", "the link's target was written");
    assert_eq!(before, listing(d.0.parent().unwrap()), "a file appeared outside the directory");
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig {
        cases: proptest_cases(24),
        ..proptest::prelude::ProptestConfig::default()
    })]
    #[test]
    fn hostile_records_never_crash_nor_escape(
        word in proptest::prelude::any::<u64>(),
        state in 0u64..4,
        bits in proptest::collection::vec(proptest::prelude::any::<u64>(), 0..16),
        plant in 0u8..3,
    ) {
        hostile_record(word & !3 | state, &bits, plant);
    }
}

#[test]
fn a_resize_keeps_the_pinned_eviction_mode() {
    let d = TempDir::new("resize-mode");
    let c = Cache::open(d.file("c"), &opts(4 << 20, 2)).unwrap();
    assert_eq!(c.eviction_mode().unwrap(), nearcache_core::EvictionMode::Adaptive);
    for mode in [nearcache_core::EvictionMode::Lenient, nearcache_core::EvictionMode::Adaptive] {
        // A resize makes a new file, whose shards start at the default.
        c.set_eviction_mode(mode).unwrap();
        c.resize(c.capacity() + (1 << 20), 2).unwrap();
        assert_eq!(c.eviction_mode().unwrap(), mode);
    }
    c.set_eviction_mode(nearcache_core::EvictionMode::Strict).unwrap();
    c.set(b"k", b"v", 0, 0).unwrap();
    c.resize(8 << 20, 4).unwrap();
    assert_eq!(c.shard_count(), 4);
    assert_eq!(c.eviction_mode().unwrap(), nearcache_core::EvictionMode::Strict);
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"v");
    // Another handle sees the pin: it is kept in the file.
    let other = Cache::open(d.file("c"), &as_is()).unwrap();
    assert_eq!(other.eviction_mode().unwrap(), nearcache_core::EvictionMode::Strict);
}
