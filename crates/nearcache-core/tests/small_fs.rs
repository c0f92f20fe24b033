//! A cache on a small tmpfs: the reserve of the file system it leaves free
//! (`fs_reserve`), and a spilled value stored by eviction rather than
//! refused (docs/reliability.md, "A small /dev/shm").
//!
//! Each test mounts its own 16 MiB tmpfs, which needs root (or
//! CAP_SYS_ADMIN); elsewhere the tests say why and return.

mod common;
use common::{make_value, TempDir};
use nearcache_core::file::default_fs_reserve;
use nearcache_core::{Cache, Error, OpenOptions};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;
const FS_SIZE: u64 = 16 * MIB;
const RESERVE: u64 = 4 * MIB;

/// A 16 MiB tmpfs mounted on a fresh directory, unmounted on drop.
struct SmallFs {
    dir: TempDir,
}

impl SmallFs {
    fn mount(tag: &str) -> Option<SmallFs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let dir = TempDir::new(tag);
        let size = format!("size={}m,mode=0700", FS_SIZE / MIB);
        let done = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &size, "tmpfs"])
            .arg(&dir.0)
            .output()
            .ok()?;
        if !done.status.success() {
            eprintln!(
                "skipped: mount -t tmpfs failed: {}",
                String::from_utf8_lossy(&done.stderr).trim()
            );
            return None;
        }
        Some(SmallFs { dir })
    }

    fn path(&self) -> &Path {
        &self.dir.0
    }

    /// Available bytes, as `df` shows them.
    fn avail(&self) -> u64 {
        // SAFETY: a zeroed statvfs is a valid out-parameter.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        let c = std::ffi::CString::new(self.path().as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: c is a valid path, st a valid out-parameter.
        assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir.0).output();
    }
}

fn opts(fs_reserve: Option<u64>) -> OpenOptions {
    OpenOptions { size: Some(FS_SIZE as usize), shards: 8, fs_reserve, ..OpenOptions::default() }
}

/// Set twice what the cache could hold in 1.6 KB values; every set must
/// succeed (a shard that may not grow evicts).
fn fill(c: &Cache) -> u64 {
    let n = 2 * FS_SIZE / 1600;
    for i in 0..n {
        let k = format!("fragment-{i}");
        c.set(k.as_bytes(), &make_value(k.as_bytes(), i, 1600), 0, 0).unwrap();
    }
    n
}

/// Every entry still held reads back whole and right.
fn check_held(c: &Cache, n: u64) -> usize {
    let mut held = 0;
    for i in 0..n {
        let k = format!("fragment-{i}");
        if let Some(v) = c.get(k.as_bytes()).unwrap() {
            assert_eq!(v.data, make_value(k.as_bytes(), i, 1600), "{k}");
            held += 1;
        }
    }
    held
}

#[test]
fn the_default_reserve() {
    assert_eq!(default_fs_reserve(64 * MIB), 8 * MIB, "Docker's /dev/shm");
    assert_eq!(default_fs_reserve(24 << 30), 1 << 30, "capped at 1 GiB");
    assert_eq!(default_fs_reserve(1 << 30), (1 << 30) / 10, "10%");
    assert_eq!(default_fs_reserve(16 * MIB), 4 * MIB, "a quarter of a small one");
    assert_eq!(default_fs_reserve(0), 0);
}

#[test]
fn a_growing_cache_leaves_the_reserve_free() {
    let Some(fs) = SmallFs::mount("reserve") else { return };
    let c = Cache::open(fs.path().join("c"), &opts(Some(RESERVE))).unwrap();
    let n = fill(&c);
    assert!(fs.avail() >= RESERVE, "{} bytes left, {RESERVE} reserved", fs.avail());
    assert!(fs.avail() < RESERVE + 2 * MIB, "the cache grew up to the reserve: {}", fs.avail());
    let held = check_held(&c, n);
    assert!(held > 1000, "{held} entries held");
    assert!(c.stats().unwrap().evictions > 0);
}

#[test]
fn without_a_reserve_the_cache_takes_the_file_system() {
    let Some(fs) = SmallFs::mount("noreserve") else { return };
    let c = Cache::open(fs.path().join("c"), &opts(Some(0))).unwrap();
    let n = fill(&c);
    assert!(fs.avail() < RESERVE / 2, "{} bytes left with fs_reserve 0", fs.avail());
    assert!(check_held(&c, n) > 1000);
}

#[test]
fn the_default_reserve_applies() {
    let Some(fs) = SmallFs::mount("default") else { return };
    let c = Cache::open(fs.path().join("c"), &opts(None)).unwrap();
    fill(&c);
    let keep = default_fs_reserve(FS_SIZE);
    assert!(fs.avail() >= keep, "{} bytes left, {keep} reserved by default", fs.avail());
}

#[test]
fn a_spilled_value_is_stored_by_evicting() {
    let Some(fs) = SmallFs::mount("spill") else { return };
    let c = Cache::open(fs.path().join("c"), &opts(Some(RESERVE))).unwrap();
    let n = fill(&c);
    let before = check_held(&c, n);
    // 300 KB: above the spill threshold, more than the reserve leaves.
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + 3) as u8).collect();
    assert!(fs.avail() < RESERVE + big.len() as u64, "the case needs a full file system");
    let held = c.stats().unwrap().held_bytes;
    c.set(b"big", &big, 0, 0).unwrap();
    // The shards gave memory back (no spilled value to evict yet).
    let given = held - c.stats().unwrap().held_bytes;
    assert!(given >= 200_000, "{given} bytes given back");
    assert_eq!(c.get(b"big").unwrap().unwrap().data, big);
    assert!(fs.avail() >= RESERVE, "the reserve is kept: {}", fs.avail());
    // The room came from the shards (above): pages reserved past their
    // bump pointers first, then evicted entries if those were not enough;
    // which of the two sufficed depends on where each shard's last growth
    // step ended. Nothing was added, and what is left reads back right.
    let after = check_held(&c, n);
    assert!(after <= before && after > 0, "{before} entries before, {after} after");
    // The cache keeps working after giving memory back: it grows again
    // up to the reserve, and the spilled value stays.
    let n2 = fill(&c);
    assert!(check_held(&c, n2) > 1000);
    assert!(fs.avail() >= RESERVE);
    assert_eq!(c.check().unwrap().repaired_shards, 0);
    if let Some(v) = c.get(b"big").unwrap() {
        assert_eq!(v.data, big);
    }
    // A second big value evicts the first spilled values before shards.
    for i in 0..4 {
        let k = format!("big-{i}");
        c.set(k.as_bytes(), &big, 0, 0).unwrap();
        assert_eq!(c.get(k.as_bytes()).unwrap().unwrap().data, big);
    }
    assert!(fs.avail() >= RESERVE);
}

#[test]
fn readers_see_whole_values_while_shards_give_memory_back() {
    let Some(fs) = SmallFs::mount("readers") else { return };
    let c = Cache::open(fs.path().join("c"), &opts(Some(RESERVE))).unwrap();
    let n = fill(&c);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let big: Vec<u8> = (0..300_000u32).map(|i| (i * 13 + 1) as u8).collect();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let (c, stop) = (&c, &stop);
            s.spawn(move || {
                let mut i = t;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let k = format!("fragment-{}", i % n);
                    if let Some(v) = c.get(k.as_bytes()).unwrap() {
                        assert_eq!(v.data, make_value(k.as_bytes(), i % n, 1600), "{k}");
                    }
                    i += 7;
                }
            });
        }
        // Each round refills the shards up to the reserve, then a spilled
        // value makes room (spilled values go first, then shard memory).
        for round in 0..4 {
            for i in 0..2000 {
                let k = format!("fragment-{}", (round * 2000 + i) % n);
                let seq = (round * 2000 + i) % n;
                c.set(k.as_bytes(), &make_value(k.as_bytes(), seq, 1600), 0, 0).unwrap();
            }
            let k = format!("big-{round}");
            c.set(k.as_bytes(), &big, 0, 0).unwrap();
            assert_eq!(c.get(k.as_bytes()).unwrap().unwrap().data, big);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert!(fs.avail() >= RESERVE);
    assert_eq!(c.check().unwrap().repaired_shards, 0);
}

#[test]
fn a_value_no_eviction_can_make_room_for_is_refused_and_says_why() {
    let Some(fs) = SmallFs::mount("refuse") else { return };
    let c = Cache::open(fs.path().join("c"), &opts(Some(RESERVE))).unwrap();
    c.set(b"old", b"kept", 0, 0).unwrap();
    let huge = vec![7u8; (FS_SIZE - RESERVE + MIB) as usize];
    match c.set(b"old", &huge, 0, 0) {
        Err(Error::Full(msg)) => {
            assert!(msg.contains("nothing was evicted"), "{msg}");
            assert!(msg.contains("fs_reserve"), "{msg}");
        }
        other => panic!("expected Error::Full, got {other:?}"),
    }
    assert_eq!(c.get(b"old").unwrap().unwrap().data, b"kept", "the old value is kept");
    assert!(fs.avail() >= RESERVE);
}

#[test]
fn when_eviction_is_not_enough_the_error_says_what_was_tried() {
    let Some(fs) = SmallFs::mount("tried") else { return };
    // Another program holds 10 MiB: with a 4 MiB reserve, 2 MiB are left.
    std::fs::write(fs.path().join("other"), vec![1u8; (10 * MIB) as usize]).unwrap();
    let c = Cache::open(fs.path().join("c"), &opts(Some(RESERVE))).unwrap();
    c.set(b"small", b"v", 0, 0).unwrap();
    match c.set(b"big", &vec![7u8; (3 * MIB) as usize], 0, 0) {
        Err(Error::Full(msg)) => {
            assert!(msg.contains("to make room"), "{msg}");
            assert!(msg.contains("fs_reserve"), "{msg}");
        }
        other => panic!("expected Error::Full, got {other:?}"),
    }
    assert!(c.get(b"big").unwrap().is_none());
    assert!(fs.avail() >= RESERVE);
    c.set(b"after", b"works", 0, 0).unwrap();
    assert_eq!(c.get(b"after").unwrap().unwrap().data, b"works");
}

#[test]
fn a_preallocated_file_checks_the_reserve_at_creation() {
    let Some(fs) = SmallFs::mount("prealloc") else { return };
    let o = OpenOptions {
        size: Some((FS_SIZE - 2 * MIB) as usize),
        shards: 4,
        preallocate: true,
        fs_reserve: Some(RESERVE),
        ..OpenOptions::default()
    };
    match Cache::open(fs.path().join("c"), &o) {
        Err(Error::Full(msg)) => assert!(msg.contains("fs_reserve"), "{msg}"),
        other => panic!("expected Error::Full, got {other:?}"),
    }
    assert!(!fs.path().join("c").exists(), "nothing is left behind");
    let c = Cache::open(fs.path().join("c"), &OpenOptions { fs_reserve: Some(0), ..o }).unwrap();
    c.set(b"k", b"v", 0, 0).unwrap();
}
