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

/// Overwrite the (only) spilled file with same-length bytes that fail the
/// checksum.
fn corrupt_only_file(path: &Path, v: &[u8]) {
    let f = only_file(path);
    let mut other = v.to_vec();
    other[v.len() / 2] ^= 0x5a;
    std::thread::sleep(Duration::from_millis(5));
    std::fs::write(&f, &other).unwrap();
}

#[test]
fn get_many_never_hands_a_refused_spilled_value_to_its_callback() {
    // The callback of get_many writes the caller's output (a C allocator,
    // a Python list); a value that fails its checksum must never reach it.
    let d = TempDir::new("spill-many-refused");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    let v = big(4, 60_000);
    c.set(b"bad", &v, 3, 0).unwrap();
    c.set(b"fine", b"inline", 0, 0).unwrap();
    // Read once, so the file is in the verified set; the rewrite moves its
    // change time and must be checked again.
    assert!(c.get(b"bad").unwrap().unwrap().data == v);
    corrupt_only_file(&path, &v);
    let mut seen: Vec<(usize, usize)> = Vec::new();
    c.get_many_with(&[b"bad".as_slice(), b"fine"], |i, e| seen.push((i, e.len()))).unwrap();
    assert_eq!(seen, vec![(1, 6)], "the refused value reached the callback");
    assert_eq!(c.stats().unwrap().spill_refused, 1);
    assert!(!c.contains(b"bad").unwrap(), "a corrupt file's entry is dropped");
    // Never verified before: refused before the callback too.
    c.set(b"bad", &v, 3, 0).unwrap();
    corrupt_only_file(&path, &v);
    let many = c.get_many(&[b"bad".as_slice()]).unwrap();
    assert!(many[0].is_none());
    assert_eq!(c.stats().unwrap().spill_refused, 2);
}

#[test]
fn get_many_callbacks_see_whole_values_once_while_spilled_values_are_replaced() {
    // A spilled value's file that vanishes (overwritten meanwhile) makes
    // get_many read the key again; an abandoned optimistic attempt must not
    // leave its bytes in the caller's output.
    let d = TempDir::new("spill-many-race");
    let path = d.file("c");
    let c = std::sync::Arc::new(Cache::open(&path, &spill_opts(256 << 20)).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                // Spilled and inline values in turn, and deletes.
                let len = if i % 2 == 0 { 6_000 + (i as usize % 3) * 1_000 } else { 900 };
                if i % 5 == 4 {
                    c.delete(b"k").unwrap();
                } else {
                    c.set(b"k", &make_value(b"k", i, len), 0, 0).unwrap();
                }
                i += 1;
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_millis(1200);
    let mut hits = 0;
    while std::time::Instant::now() < deadline {
        let mut calls = 0;
        let mut last = Vec::new();
        c.get_many_with(&[b"k".as_slice()], |_, e| {
            calls += 1;
            last = e.to_vec();
        })
        .unwrap();
        assert!(calls <= 1, "the callback ran {calls} times for one key");
        if calls == 1 {
            verify_value(b"k", &last);
            hits += 1;
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    writer.join().unwrap();
    assert!(hits > 0);
    assert_eq!(c.stats().unwrap().spill_refused, 0);
}

#[test]
fn a_sweep_and_a_reap_of_one_file_uncount_its_bytes_once() {
    // A popped value's file waits for its remover's reap; a sweep by
    // another thread in that window removes it first. Only the party whose
    // unlink succeeds may give its bytes back.
    let d = TempDir::new("spill-twice");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_opts(64 << 20)).unwrap();
    c.set(b"stays", &big(1, 20_000), 0, 0).unwrap();
    c.set(b"goes", &big(2, 30_000), 0, 0).unwrap();
    assert_eq!(c.stats().unwrap().spilled_bytes, 50_000);
    let got = c
        .pop_with(b"goes", |e| {
            std::thread::scope(|s| {
                s.spawn(|| c.sweep_spilled(Duration::ZERO).unwrap()).join().unwrap();
            });
            e.to_vec()
        })
        .unwrap();
    assert!(got.unwrap() == big(2, 30_000), "the popped value is served whole");
    let s = c.stats().unwrap();
    assert_eq!((s.spilled_bytes, s.spilled_values), (20_000, 1), "{s:?}");
    assert_eq!(files(&path).len(), 1);
    assert!(c.get(b"stays").unwrap().unwrap().data == big(1, 20_000));
}

#[test]
fn pop_of_a_present_spilled_value_returns_it_while_sweeps_run() {
    // pop takes the entry out of the index, then reads its file: a sweep
    // between the two (the file is then unnamed by any entry) must not turn
    // a present key into None.
    let d = TempDir::new("spill-pop-sweep");
    let path = d.file("c");
    let c = std::sync::Arc::new(Cache::open(&path, &spill_opts(256 << 20)).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sweeper = {
        let (c, stop) = (c.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.sweep_spilled(Duration::from_millis(1)).unwrap();
            }
        })
    };
    let deadline = std::time::Instant::now() + Duration::from_millis(1500);
    let mut pops = 0u64;
    while std::time::Instant::now() < deadline {
        let v = make_value(b"k", pops, 9_000);
        c.set(b"k", &v, 0, 0).unwrap();
        // Older than the sweeper's grace: only the entry protects it.
        std::thread::sleep(Duration::from_millis(2));
        let got = c.pop(b"k").unwrap();
        assert!(got.is_some(), "pop {pops} of a present key returned None");
        assert!(got.unwrap().data == v);
        pops += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sweeper.join().unwrap();
    assert_eq!(c.stats().unwrap().spill_refused, 0);
}

#[test]
fn a_spiller_blocked_past_the_sweep_grace_keeps_its_file() {
    // Between linking its file and publishing the entry a spiller waits for
    // the shard lock, up to its (possibly long) lock timeout. A sweep in
    // that window, whatever its grace, must spare the file.
    let d = TempDir::new("spill-blocked");
    let path = d.file("c");
    let o = OpenOptions { lock_timeout: Duration::from_secs(20), ..spill_opts(64 << 20) };
    let c = std::sync::Arc::new(Cache::open(&path, &o).unwrap());
    let holder = {
        let c = c.clone();
        std::thread::spawn(move || c.debug_hold_shard_lock(b"k", Duration::from_millis(800)))
    };
    std::thread::sleep(Duration::from_millis(100));
    let spiller = {
        let c = c.clone();
        std::thread::spawn(move || c.set(b"k", &big(6, 40_000), 0, 0))
    };
    // Wait until the spiller's file is linked (it then waits for the lock).
    let t = std::time::Instant::now();
    while files(&path).is_empty() {
        assert!(t.elapsed() < Duration::from_secs(10), "the spiller never linked its file");
        std::thread::sleep(Duration::from_millis(2));
    }
    // A grace of zero stands for a spiller blocked longer than any grace.
    let r = c.sweep_spilled(Duration::ZERO).unwrap();
    assert_eq!(r.removed, 0, "the sweep removed a file being published");
    holder.join().unwrap().unwrap();
    spiller.join().unwrap().unwrap();
    assert!(c.get(b"k").unwrap().unwrap().data == big(6, 40_000));
    assert_eq!(c.stats().unwrap().spill_refused, 0);
}

#[test]
fn a_spill_directory_another_user_planted_in_a_sticky_directory_is_refused_at_open() {
    // In a sticky world-writable directory (/tmp, /dev/shm) another user
    // can create `<cache>.spill` before the owner does. The open says so
    // at once instead of failing every spill later.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to make a directory owned by another user");
        return;
    }
    let d = TempDir::new("spill-sticky");
    let shared = d.file("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    // The owner's open claims the name at once: nobody can plant it later.
    let mine = shared.join("mine");
    let c = Cache::open(&mine, &spill_opts(64 << 20)).unwrap();
    let md = std::fs::symlink_metadata(dir_path(&mine)).expect("created at open");
    assert!(md.is_dir() && md.uid() == 0 && md.mode() & 0o777 == 0o700, "{md:?}");
    drop(c);
    // Planted before the first open: the open fails, naming the owner.
    let path = shared.join("c");
    std::fs::create_dir(dir_path(&path)).unwrap();
    std::fs::set_permissions(dir_path(&path), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::os::unix::fs::chown(dir_path(&path), Some(4242), Some(4242)).unwrap();
    match Cache::open(&path, &spill_opts(64 << 20)) {
        Err(Error::Permission(m)) => assert!(m.contains("4242"), "{m}"),
        other => panic!("expected a permission error at open, got {other:?}"),
    }
}
