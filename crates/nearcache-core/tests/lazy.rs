//! Lazy reservation: a cache file holds memory in proportion to what it
//! stores, not to its configured size.
//!
//! Files live on /dev/shm (tmpfs) where it exists, as in production; the
//! memory a file holds is its allocated blocks (`st_blocks`, what `du`
//! shows). Growth races use this test binary re-executed as a child.

mod common;
use common::TempDir;
use nearcache_core::layout::{sh, HEADER_SIZE};
use nearcache_core::{Cache, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

fn opts(size: usize) -> OpenOptions {
    OpenOptions { size: Some(size), ..OpenOptions::default() }
}

/// Bytes of the file actually allocated (what `du` reports).
fn allocated(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().blocks() * 512
}

fn value(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i * 31 + j) as u8).collect()
}

/// Fixed memory per shard allowed beyond 1.2x the stored bytes: the shard
/// header and first index page (8 KiB), the dead-entry slack (64 KiB), one
/// growth chunk (16 KiB), and the page-rounding of the index and arena ends.
const FIXED_PER_SHARD: u64 = 8 * 1024 + 64 * 1024 + 16 * 1024 + 8 * 1024;

#[test]
fn a_new_large_cache_holds_only_its_headers() {
    let d = TempDir::shm("lazy-new");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(256 << 20)).unwrap();
    let shards = c.shard_count() as u64;
    assert_eq!(std::fs::metadata(&path).unwrap().len(), c.capacity() as u64);
    let held = allocated(&path);
    // The file header page plus two pages per shard (header, first index page).
    assert!(held <= 4096 + shards * 8192, "a new 256 MiB cache holds {held} bytes");
    let stats = c.stats().unwrap();
    assert_eq!(stats.held_bytes, held, "stats report what the file holds");
    // Reads of an empty cache touch nothing new.
    for i in 0..10_000 {
        assert!(c.get(format!("k{i}").as_bytes()).unwrap().is_none());
    }
    assert_eq!(allocated(&path), held);
}

#[test]
fn memory_follows_stored_bytes_for_every_size() {
    for (size, values, len) in [
        (4usize << 20, 1_000usize, 1_600usize),
        (64 << 20, 2_000, 1_600),
        (256 << 20, 2_000, 1_600),
        (256 << 20, 40_000, 1_600),
        (256 << 20, 100_000, 200),
        (1 << 30, 20_000, 8_000),
    ] {
        let d = TempDir::shm("lazy-follow");
        let path = d.file("c");
        let c = Cache::open(&path, &opts(size)).unwrap();
        let shards = c.shard_count() as u64;
        let mut last = allocated(&path);
        for round in 0..4 {
            for i in round * values / 4..(round + 1) * values / 4 {
                c.set(format!("key-{i}").as_bytes(), &value(i, len), 0, 0).unwrap();
            }
            let held = allocated(&path);
            let s = c.stats().unwrap();
            assert_eq!(s.held_bytes, held, "stats agree with st_blocks");
            assert!(held >= last, "held memory never shrinks while filling");
            last = held;
            let bound = s.live_bytes * 12 / 10 + 4096 + shards * FIXED_PER_SHARD;
            assert!(
                held <= bound,
                "size {size}, {} entries of {len} bytes: holds {held} bytes for {} live bytes \
                 (bound {bound})",
                s.items,
                s.live_bytes
            );
        }
        // Still bounded by the file's size, and everything reads back.
        assert!(last <= c.capacity() as u64);
        let s = c.stats().unwrap();
        if s.evictions == 0 {
            for i in (0..values).step_by(97) {
                let v = c.get(format!("key-{i}").as_bytes()).unwrap().unwrap();
                assert_eq!(v.data, value(i, len));
            }
        }
        c.check().unwrap();
    }
}

#[test]
fn overwrites_do_not_grow_memory() {
    // The same 500 keys rewritten 40 times: dead entries are dropped
    // before the shard grows, so memory stays near the live bytes.
    let d = TempDir::shm("lazy-overwrite");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(64 << 20)).unwrap();
    let shards = c.shard_count() as u64;
    for round in 0..40 {
        for i in 0..500 {
            c.set(format!("k{i}").as_bytes(), &value(i + round, 1_000), 0, 0).unwrap();
        }
    }
    let s = c.stats().unwrap();
    let held = allocated(&path);
    assert_eq!(s.items, 500);
    assert!(held <= s.live_bytes * 12 / 10 + 4096 + shards * FIXED_PER_SHARD, "{held} {s:?}");
    assert_eq!(s.evictions, 0, "nothing is evicted while the shards can grow");
    c.check().unwrap();
}

#[test]
fn clear_gives_the_memory_back() {
    let d = TempDir::shm("lazy-clear");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(64 << 20)).unwrap();
    let empty = allocated(&path);
    for i in 0..20_000 {
        c.set(format!("k{i}").as_bytes(), &value(i, 1_000), 0, 0).unwrap();
    }
    assert!(allocated(&path) > 20 << 20);
    c.clear().unwrap();
    assert_eq!(allocated(&path), empty, "a cleared cache holds what a new one does");
    assert_eq!(c.stats().unwrap().held_bytes, empty);
    c.check().unwrap();
    // And grows again.
    for i in 0..2_000 {
        c.set(format!("k{i}").as_bytes(), &value(i, 1_000), 0, 0).unwrap();
    }
    assert_eq!(c.get(b"k1999").unwrap().unwrap().data, value(1_999, 1_000));
    assert_eq!(c.stats().unwrap().held_bytes, allocated(&path));
    c.check().unwrap();
}

#[test]
fn a_full_cache_grows_to_its_size_and_evicts_as_before() {
    let d = TempDir::shm("lazy-full");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(4 << 20)).unwrap();
    for i in 0..20_000 {
        c.set(format!("k{i}").as_bytes(), &value(i, 700), 0, 0).unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.evictions > 0);
    assert!(s.held_bytes <= c.capacity() as u64);
    // Every arena is reserved in full; the index only as far as it is used.
    assert!(s.held_bytes >= s.capacity_bytes, "a full cache holds its arenas");
    let v = c.get(b"k19999").unwrap().unwrap();
    assert_eq!(v.data, value(19_999, 700));
    c.check().unwrap();
}

#[test]
fn reopening_a_partially_grown_file_keeps_its_entries_and_keeps_growing() {
    let d = TempDir::shm("lazy-reopen");
    let path = d.file("c");
    {
        let c = Cache::open(&path, &opts(32 << 20)).unwrap();
        for i in 0..3_000 {
            c.set(format!("k{i}").as_bytes(), &value(i, 500), 0, 0).unwrap();
        }
    }
    let before = allocated(&path);
    let c = Cache::open(&path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    assert_eq!(allocated(&path), before, "reopening reserves nothing");
    assert_eq!(c.stats().unwrap().held_bytes, before);
    for i in 0..3_000 {
        assert_eq!(c.get(format!("k{i}").as_bytes()).unwrap().unwrap().data, value(i, 500));
    }
    for i in 3_000..6_000 {
        c.set(format!("k{i}").as_bytes(), &value(i, 500), 0, 0).unwrap();
    }
    assert!(allocated(&path) > before);
    assert_eq!(c.len().unwrap(), 6_000);
    c.check().unwrap();
}

#[test]
fn preallocated_files_open_and_work_as_before() {
    // `preallocate` writes exactly the format of files made before lazy
    // reservation (LAZY byte and growth words all zero, every byte held).
    let d = TempDir::shm("lazy-prealloc");
    let path = d.file("c");
    {
        let c = Cache::open(&path, &OpenOptions { preallocate: true, ..opts(8 << 20) }).unwrap();
        assert_eq!(allocated(&path), c.capacity() as u64);
        for i in 0..2_000 {
            c.set(format!("k{i}").as_bytes(), &value(i, 300), 0, 0).unwrap();
        }
    }
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(&path).unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 88).unwrap();
    assert_eq!(b[0], 0, "a preallocated file is marked as such");
    let c = Cache::open(&path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    for i in 0..2_000 {
        assert_eq!(c.get(format!("k{i}").as_bytes()).unwrap().unwrap().data, value(i, 300));
    }
    for i in 0..30_000 {
        c.set(format!("n{i}").as_bytes(), &value(i, 300), 0, 0).unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.evictions > 0);
    assert_eq!(s.held_bytes, c.capacity() as u64);
    c.check().unwrap();
}

/// Child role: open the cache and write `NC_ARG` keys with a prefix.
#[test]
fn child_main() {
    let Ok(prefix) = std::env::var("NC_LAZY_CHILD") else { return };
    let path = std::env::var("NC_PATH").unwrap();
    // A long lock timeout: four writers share one shard on a loaded machine.
    let long = std::time::Duration::from_secs(30);
    let c = Cache::open(
        &path,
        &OpenOptions { size: None, lock_timeout: long, ..OpenOptions::default() },
    )
    .unwrap();
    for i in 0..4_000 {
        c.set(format!("{prefix}{i}").as_bytes(), &value(i, 900), 0, 0).unwrap();
    }
}

#[test]
fn processes_growing_the_same_shards_agree() {
    // One shard, four processes writing into it at once: each growth is
    // made by whoever holds the lock, seen by all.
    let d = TempDir::shm("lazy-race");
    let path = d.file("c");
    let c = Cache::open(&path, &OpenOptions { shards: 1, ..opts(32 << 20) }).unwrap();
    let children: Vec<_> = ["a", "b", "c", "d"]
        .iter()
        .map(|p| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
                .env("NC_LAZY_CHILD", p)
                .env("NC_PATH", &path)
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut ch in children {
        assert!(ch.wait().unwrap().success());
    }
    let s = c.stats().unwrap();
    assert_eq!(s.items, 16_000, "{s:?}");
    assert_eq!(s.evictions, 0);
    assert_eq!(s.held_bytes, allocated(&path));
    assert!(s.held_bytes <= s.live_bytes * 12 / 10 + 4096 + FIXED_PER_SHARD);
    for p in ["a", "b", "c", "d"] {
        for i in (0..4_000).step_by(37) {
            assert_eq!(c.get(format!("{p}{i}").as_bytes()).unwrap().unwrap().data, value(i, 900));
        }
    }
    c.check().unwrap();
}

#[test]
fn scribbled_growth_words_reset_the_shard_and_never_move_an_access() {
    // ARENA_RESERVED and ACTIVE_SLOTS of shard 0 overwritten
    // with values out of range: the shard is reset (counted), operations
    // go on, and nothing reads or writes outside the reserved pages.
    for (arena, active) in [(u64::MAX, 512u64), (0, 3), (1 << 40, 1 << 40), (8, 0)] {
        let d = TempDir::shm("lazy-scribble");
        let path = d.file("c");
        let c = Cache::open(&path, &OpenOptions { shards: 1, ..opts(4 << 20) }).unwrap();
        for i in 0..500 {
            c.set(format!("k{i}").as_bytes(), &value(i, 300), 0, 0).unwrap();
        }
        {
            use std::os::unix::fs::FileExt;
            let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            let shard0 = HEADER_SIZE as u64;
            f.write_all_at(&arena.to_ne_bytes(), shard0 + sh::ARENA_RESERVED as u64).unwrap();
            f.write_all_at(&active.to_ne_bytes(), shard0 + sh::ACTIVE_SLOTS as u64).unwrap();
        }
        for i in 0..500 {
            let _ = c.get(format!("k{i}").as_bytes()).unwrap();
        }
        for i in 0..2_000 {
            c.set(format!("n{i}").as_bytes(), &value(i, 300), 0, 0).unwrap();
        }
        assert_eq!(c.get(b"n1999").unwrap().unwrap().data, value(1_999, 300));
        assert!(c.stats().unwrap().corruptions >= 1);
        assert_eq!(c.stats().unwrap().held_bytes, allocated(&path));
        c.check().unwrap();
    }
}

/// A 1 MiB tmpfs mounted for the test; None (the test then returns
/// early, saying why) when this process may not mount one.
struct SmallTmpfs {
    mnt: PathBuf,
    // Removed after the unmount (fields drop after `Drop::drop`).
    _dir: TempDir,
}

impl SmallTmpfs {
    fn mount() -> Option<SmallTmpfs> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a tmpfs needs root");
            return None;
        }
        let d = TempDir::shm("lazy-mnt");
        let mnt = d.file("fs");
        std::fs::create_dir(&mnt).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m,mode=0700", "tmpfs"])
            .arg(&mnt)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: cannot mount a tmpfs here");
            return None;
        }
        Some(SmallTmpfs { mnt, _dir: d })
    }
}

impl Drop for SmallTmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

#[test]
fn a_full_file_system_means_eviction_within_held_space() {
    let Some(fs) = SmallTmpfs::mount() else { return };
    let path = fs.mnt.join("c");
    // 16 MiB configured on a 1 MiB file system.
    let c = Cache::open(&path, &OpenOptions { shards: 2, ..opts(16 << 20) }).unwrap();
    for i in 0..5_000 {
        let key = format!("k{i}");
        c.set(key.as_bytes(), &value(i, 1_200), 0, 0).unwrap();
        assert_eq!(c.get(key.as_bytes()).unwrap().unwrap().data, value(i, 1_200));
        let _ = c.get(format!("k{}", i / 2).as_bytes()).unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.evictions > 0, "{s:?}");
    assert!(s.held_bytes <= 1 << 20, "{s:?}");
    assert_eq!(s.held_bytes, allocated(&path));
    // An entry larger than everything its shard holds: a clear error, and
    // the old value stays.
    c.set(b"big", b"old", 7, 0).unwrap();
    let inline_only =
        Cache::open(&path, &OpenOptions { size: None, spill_budget: 0, ..OpenOptions::default() })
            .unwrap();
    // (Segmented shards take no entry above one segment: a larger one is
    // refused before the file system is asked.)
    match inline_only.set(b"big", &vec![1u8; 2 << 20], 0, 0) {
        Err(nearcache_core::Error::Full(m)) => assert!(m.contains("nothing was changed"), "{m}"),
        Err(nearcache_core::Error::ValueTooLarge { max, .. }) => {
            assert_eq!(max, inline_only.max_entry_size())
        }
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!(inline_only.get(b"big").unwrap().unwrap().data, b"old");
    drop(inline_only);
    // Spilled, the value needs a 2 MiB file on a full file system: ENOSPC
    // is a clear error, the old value stays, and no partial file is left.
    match c.set(b"big", &vec![1u8; 2 << 20], 0, 0) {
        Err(nearcache_core::Error::Full(m)) => {
            assert!(m.contains("previous value is kept"), "{m}")
        }
        other => panic!("expected Full, got {other:?}"),
    }
    assert_eq!(c.get(b"big").unwrap().unwrap().data, b"old");
    let spill_dir = nearcache_core::spill::dir_path(&path);
    assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 0, "a partial file was left");
    assert_eq!(c.stats().unwrap().spilled_bytes, 0);
    c.check().unwrap();
    drop(c);
    // Reopened on the full file system: reads and writes still work.
    let c = Cache::open(&path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    assert_eq!(c.get(b"big").unwrap().unwrap().data, b"old");
    c.set(b"after", b"v", 0, 0).unwrap();
    assert_eq!(c.get(b"after").unwrap().unwrap().data, b"v");
}

#[test]
fn a_segmented_shard_refused_growth_within_its_first_segment_evicts_in_place() {
    // One 8 MiB shard (segments of about 256 KiB) whose growth the file
    // system refuses after about 100 KiB: there is no second segment to
    // take, so sets evict within the head segment itself.
    let Some(fs) = SmallTmpfs::mount() else { return };
    let path = fs.mnt.join("c");
    let opts = OpenOptions {
        shards: 1,
        fs_reserve: Some((1 << 20) - (128 << 10)),
        ..opts(4096 + (8 << 20))
    };
    let c = Cache::open(&path, &opts).unwrap();
    assert!(c.geometry().segments().0 > 1);
    for i in 0..3_000 {
        let key = format!("k{i}");
        c.set(key.as_bytes(), &value(i, 200), 0, 0).unwrap();
        assert_eq!(c.get(key.as_bytes()).unwrap().unwrap().data, value(i, 200));
        let _ = c.get(format!("k{}", i / 2).as_bytes()).unwrap();
    }
    let s = c.stats().unwrap();
    assert!(s.evictions > 0, "{s:?}");
    assert!(s.held_bytes <= 256 << 10, "{s:?}");
    assert_eq!(s.corruptions, 0, "{s:?}");
    c.check().unwrap();
}
