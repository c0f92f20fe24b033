//! Values spilled to files beside the cache (`spill.rs`): round trips,
//! removal with the entry, the budget, hostile files, crashes and races.

mod common;
use common::*;
use nearcache_core::spill::{dir_path, SpillRef};
use nearcache_core::{Cache, Error, OpenOptions};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

fn big(seed: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn files(cache_path: &Path) -> Vec<String> {
    match std::fs::read_dir(dir_path(cache_path)) {
        Ok(rd) => {
            let mut v: Vec<String> =
                rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
            v.sort();
            v
        }
        Err(_) => Vec::new(),
    }
}

fn spill_opts(budget: u64) -> OpenOptions {
    OpenOptions { spill_threshold: Some(4096), spill_budget: budget, ..opts(1 << 20, 2) }
}

#[test]
fn values_above_the_threshold_round_trip_through_files() {
    let d = TempDir::new("spill-rt");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    let v = big(1, 3 << 20); // larger than the whole cache
    c.set(b"k", &v, 77, 0).unwrap();
    let got = c.get(b"k").unwrap().unwrap();
    assert_eq!(got.flags, 77, "the caller's flags come back, not the spill bit");
    assert!(got.data == v);
    assert_eq!(files(&path).len(), 1);
    let s = c.stats().unwrap();
    assert_eq!((s.spilled_values, s.spilled_bytes), (1, 3 << 20));
    // Small values stay inline.
    c.set(b"small", &[5u8; 4096], 0, 0).unwrap();
    assert_eq!(files(&path).len(), 1);
    // Directory and file permissions.
    let dir = std::fs::metadata(dir_path(&path)).unwrap();
    assert_eq!(dir.permissions().mode() & 0o777, 0o700);
    let f = std::fs::metadata(dir_path(&path).join(&files(&path)[0])).unwrap();
    assert_eq!(f.permissions().mode() & 0o777, 0o600);
    assert_eq!(f.uid(), dir.uid());
    // Keys list the real length; get_many and pop read the file.
    let mut lens = Vec::new();
    c.for_each_key(|k, e| lens.push((k.to_vec(), e.value_len, e.flags))).unwrap();
    assert!(lens.contains(&(b"k".to_vec(), 3 << 20, 77)), "{lens:?}");
    let many = c.get_many(&[b"k".as_slice(), b"small", b"none"]).unwrap();
    assert!(many[0].as_ref().unwrap().data == v);
    assert_eq!(many[1].as_ref().unwrap().data, vec![5u8; 4096]);
    assert!(many[2].is_none());
    assert!(c.pop(b"k").unwrap().unwrap().data == v);
    assert!(c.get(b"k").unwrap().is_none());
    assert!(files(&path).is_empty(), "pop removes the file");
    assert_eq!(c.stats().unwrap().spilled_bytes, 0);
}

#[test]
fn overwrite_delete_expiry_and_clear_remove_the_file() {
    let d = TempDir::new("spill-rm");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    c.set(b"a", &big(1, 10_000), 0, 0).unwrap();
    let first = files(&path);
    c.set(b"a", &big(2, 20_000), 0, 0).unwrap();
    let second = files(&path);
    assert_eq!(second.len(), 1);
    assert_ne!(first, second, "an overwrite writes a new file and removes the old one");
    c.set(b"a", b"inline now", 0, 0).unwrap();
    assert!(files(&path).is_empty());
    c.set(b"b", &big(3, 10_000), 0, 0).unwrap();
    assert!(c.delete(b"b").unwrap());
    assert!(files(&path).is_empty());
    c.set(b"t", &big(4, 10_000), 0, 30).unwrap();
    std::thread::sleep(Duration::from_millis(60));
    assert!(c.get(b"t").unwrap().is_none());
    assert!(files(&path).is_empty(), "an expired value's file goes with its entry");
    for i in 0..5u8 {
        c.set(&[b'x', i], &big(i, 9_000), 0, 0).unwrap();
    }
    assert_eq!(files(&path).len(), 5);
    c.clear().unwrap();
    assert!(files(&path).is_empty());
    let s = c.stats().unwrap();
    assert_eq!((s.spilled_values, s.spilled_bytes), (0, 0));
    // add/replace decline without leaving a file.
    c.set(b"p", &big(5, 9_000), 0, 0).unwrap();
    assert!(!c.add(b"p", &big(6, 9_000), 0, 0).unwrap());
    assert!(!c.replace(b"q", &big(6, 9_000), 0, 0).unwrap());
    assert_eq!(files(&path).len(), 1);
    assert!(c.get(b"p").unwrap().unwrap().data == big(5, 9_000));
    // A spilled value is not a counter.
    assert!(matches!(c.incr(b"p", 1, None, 0), Err(Error::NotACounter)));
    // The engine's flag bit is refused from callers.
    assert!(matches!(c.set(b"f", b"v", 1 << 31, 0), Err(Error::InvalidArgument(_))));
}

#[test]
fn the_budget_evicts_spilled_values_and_refuses_what_can_never_fit() {
    let d = TempDir::new("spill-budget");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(100_000)).unwrap();
    for i in 0..20u32 {
        c.set(format!("k{i}").as_bytes(), &big(i as u8, 30_000), 0, 0).unwrap();
        let s = c.stats().unwrap();
        assert!(s.spilled_bytes <= 100_000, "{s:?}");
        assert_eq!(files(&path).len() as u64, s.spilled_values);
    }
    // The newest value is there; old ones were evicted.
    assert!(c.get(b"k19").unwrap().unwrap().data == big(19, 30_000));
    assert!(c.get(b"k0").unwrap().is_none());
    match c.set(b"huge", &big(1, 100_001), 0, 0) {
        Err(Error::OverSpillBudget { len: 100_001, budget: 100_000 }) => {}
        other => panic!("expected OverSpillBudget, got {other:?}"),
    }
    let msg = Error::OverSpillBudget { len: 1, budget: 0 }.to_string();
    assert!(msg.contains("spill_budget"), "{msg}");
    // Spilling disabled: the inline limit is the limit.
    let off = Cache::open(&path, &OpenOptions { spill_budget: 0, ..spill_opts(0) }).unwrap();
    assert!(matches!(off.set(b"big", &big(1, 1 << 20), 0, 0), Err(Error::ValueTooLarge { .. })));
}

/// The reference of `key`'s spilled value, read from the file name.
fn only_file(path: &Path) -> std::path::PathBuf {
    let f = files(path);
    assert_eq!(f.len(), 1, "{f:?}");
    dir_path(path).join(&f[0])
}

#[test]
fn swapped_truncated_or_symlinked_files_are_refused_counted_and_dropped() {
    let d = TempDir::new("spill-hostile");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    let v = big(9, 50_000);

    // Same length, other bytes: the checksum refuses it.
    c.set(b"k", &v, 0, 0).unwrap();
    let f = only_file(&path);
    let mut other = v.clone();
    other[40_000] ^= 1;
    std::fs::write(&f, &other).unwrap();
    assert!(c.get(b"k").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 1);
    assert!(!c.contains(b"k").unwrap(), "a refused value's entry is dropped");
    assert!(files(&path).is_empty());

    // Truncated: the length check refuses it.
    c.set(b"k", &v, 0, 0).unwrap();
    let f = only_file(&path);
    std::fs::OpenOptions::new().write(true).open(&f).unwrap().set_len(10).unwrap();
    assert!(c.get(b"k").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 2);

    // Replaced by a symlink to a file with the right bytes: never followed.
    c.set(b"k", &v, 0, 0).unwrap();
    let f = only_file(&path);
    let elsewhere = d.file("elsewhere");
    std::fs::write(&elsewhere, &v).unwrap();
    std::fs::remove_file(&f).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &f).unwrap();
    assert!(c.get(b"k").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 3);
    assert!(elsewhere.exists(), "the symlink's target is never touched");

    // Made readable by others: refused.
    c.set(b"k", &v, 0, 0).unwrap();
    let f = only_file(&path);
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert!(c.get(b"k").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 4);

    // Deleted behind the cache's back: a miss, counted.
    c.set(b"k", &v, 0, 0).unwrap();
    std::fs::remove_file(only_file(&path)).unwrap();
    assert!(c.get(b"k").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 5);

    // A spill directory open to others, or a symlink, is refused.
    drop(c);
    std::fs::set_permissions(dir_path(&path), std::fs::Permissions::from_mode(0o755)).unwrap();
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap_err();
    assert!(matches!(c, Error::Permission(_)), "{c:?}");
}

#[test]
fn a_forged_reference_in_the_index_is_refused() {
    let d = TempDir::new("spill-forged");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    c.set(b"real", &big(1, 20_000), 0, 0).unwrap();
    let name = &files(&path)[0];
    let id = u64::from_str_radix(name, 16).unwrap();
    // A reference naming the real file with a wrong length or checksum,
    // written as a plain inline value cannot carry the spill flag (refused
    // above), so forge it the way a hostile writer of the file would: by
    // finding the stored reference and flipping its checksum in place.
    let good = SpillRef { id, len: 20_000, sum: xxhash_rust::xxh3::xxh3_64(&big(1, 20_000)) };
    let mut bytes = std::fs::read(&path).unwrap();
    let at =
        bytes.windows(32).position(|w| w == good.to_bytes()).expect("the reference is in the file");
    drop(c);
    bytes[at + 24] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    assert!(c.get(b"real").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 1);
}

#[test]
fn orphans_are_swept_on_a_lone_open_and_live_files_never_are() {
    let d = TempDir::new("spill-sweep");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    c.set(b"live", &big(1, 20_000), 0, 0).unwrap();
    let live = files(&path);
    // Files a killed writer left: one linked but never published, one
    // temporary; and a name that is not ours.
    std::fs::write(dir_path(&path).join("00000000deadbeef"), b"orphan").unwrap();
    std::fs::write(dir_path(&path).join(".tmp-00000000deadbeef"), b"half").unwrap();
    std::fs::write(dir_path(&path).join("README"), b"not ours").unwrap();
    // While attached, young files are spared.
    let r = c.sweep_spilled(Duration::from_secs(120)).unwrap();
    assert_eq!(r.removed, 0);
    assert_eq!(files(&path).len(), 4);
    let r = c.sweep_spilled(Duration::ZERO).unwrap();
    assert_eq!((r.removed, r.referenced), (2, 1));
    let mut expect = live.clone();
    expect.push("README".into());
    expect.sort();
    assert_eq!(files(&path), expect);
    // Lone open after a crash: orphans go at once, the count is recounted.
    std::fs::write(dir_path(&path).join("00000000deadbeef"), b"orphan").unwrap();
    drop(c);
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    assert_eq!(files(&path), expect);
    let s = c.stats().unwrap();
    assert_eq!((s.spilled_values, s.spilled_bytes), (1, 20_000));
    assert!(c.get(b"live").unwrap().unwrap().data == big(1, 20_000));
}

#[test]
fn a_sweep_gives_back_the_budget_of_values_lost_in_a_shard_reset() {
    let d = TempDir::new("spill-reset");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    c.set(b"lost", &big(3, 20_000), 0, 0).unwrap();
    assert_eq!(c.stats().unwrap().spilled_bytes, 20_000);
    // The shard is reset (as after a holder killed inside a compaction):
    // the entry is gone without its reference being read.
    c.debug_hold_shard_mid_write(b"lost", Duration::from_millis(1)).unwrap();
    assert!(c.get(b"lost").unwrap().is_none());
    assert_eq!(c.stats().unwrap().spilled_bytes, 20_000, "still counted: the file is an orphan");
    let r = c.sweep_spilled(Duration::ZERO).unwrap();
    assert_eq!((r.removed, r.removed_bytes), (1, 20_000));
    assert_eq!(c.stats().unwrap().spilled_bytes, 0, "the sweep gave the budget back");
    assert!(files(&path).is_empty());
}

#[test]
fn a_reader_racing_overwrites_and_deletes_sees_old_new_or_nothing() {
    let d = TempDir::new("spill-race");
    let path = d.file("c");
    let c = std::sync::Arc::new(Cache::open(&path, &spill_opts(256 << 20)).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if i % 7 == 6 {
                    c.delete(b"k").unwrap();
                } else {
                    c.set(b"k", &make_value(b"k", i, 8_000 + (i as usize % 5) * 10_000), 0, 0)
                        .unwrap();
                }
                i += 1;
            }
            i
        })
    };
    let (mut hits, mut misses) = (0, 0);
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < deadline {
        match c.get(b"k").unwrap() {
            Some(v) => {
                verify_value(b"k", &v.data);
                hits += 1;
            }
            None => misses += 1,
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let writes = writer.join().unwrap();
    assert!(hits > 0 && writes > 0, "hits {hits}, misses {misses}, writes {writes}");
    assert_eq!(c.stats().unwrap().spill_refused, 0, "a race is not a refusal");
    c.delete(b"k").unwrap();
    assert!(files(&path).is_empty());
}

#[test]
fn a_file_changed_after_it_was_verified_is_checked_again() {
    // A second read of an unchanged file skips the checksum; any write to
    // the file moves its change time, so the next read checks it again.
    let d = TempDir::new("spill-reverify");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    let v = big(3, 40_000);
    c.set(b"k", &v, 0, 0).unwrap();
    assert!(c.get(b"k").unwrap().unwrap().data == v);
    assert!(c.get(b"k").unwrap().unwrap().data == v);
    let f = only_file(&path);
    let mut other = v.clone();
    other[123] ^= 0x80;
    std::thread::sleep(Duration::from_millis(5));
    std::fs::write(&f, &other).unwrap();
    assert!(c.get(b"k").unwrap().is_none(), "a changed file was served unchecked");
    assert_eq!(c.stats().unwrap().spill_refused, 1);
}

#[test]
fn chunked_writes_of_inline_and_spilled_values_match_copies_and_are_checked() {
    let d = TempDir::new("spill-write-to");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    for (key, len) in [(&b"inline"[..], 3_000usize), (b"spilled", 200_000)] {
        let v = big(7, len);
        c.set(key, &v, 0, 0).unwrap();
        let mut out = Vec::new();
        let got = c.get_with(key, |e| {
            out.clear();
            e.write_to(&mut out).unwrap();
            out.len()
        });
        assert_eq!(got.unwrap(), Some(len));
        assert!(out == v, "write_to of {len} bytes differs");
    }
    // A changed file fails through write_to too: a miss, counted.
    let f = only_file(&path);
    let mut other = big(7, 200_000);
    other[199_999] ^= 1;
    std::thread::sleep(Duration::from_millis(5));
    std::fs::write(&f, &other).unwrap();
    let got = c.get_with(b"spilled", |e| {
        let mut out = Vec::new();
        e.write_to(&mut out).unwrap();
        out
    });
    assert!(got.unwrap().is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 1);
}
