//! Functional tests of the public engine API.

mod common;
use common::*;
use nearcache_core::layout::Geometry;
use nearcache_core::{Cache, Error, OpenOptions, FLAG_INT};
use std::time::Duration;

#[test]
fn set_get_overwrite_delete() {
    let d = TempDir::new("basic");
    let c = open(&d, "c", 1 << 20, 2);
    assert!(c.get(b"k").unwrap().is_none());
    c.set(b"k", b"one", 7, 0).unwrap();
    let v = c.get(b"k").unwrap().unwrap();
    assert_eq!((v.data.as_slice(), v.flags), (&b"one"[..], 7));
    c.set(b"k", b"two!", 0, 0).unwrap();
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"two!");
    assert_eq!(c.len().unwrap(), 1);
    assert!(c.delete(b"k").unwrap());
    assert!(!c.delete(b"k").unwrap());
    assert!(c.get(b"k").unwrap().is_none());
    assert_eq!(c.len().unwrap(), 0);
    c.check().unwrap();
}

#[test]
fn add_replace_pop_contains_touch() {
    let d = TempDir::new("modes");
    let c = open(&d, "c", 1 << 20, 1);
    assert!(!c.replace(b"a", b"x", 0, 0).unwrap());
    assert!(c.add(b"a", b"1", 0, 0).unwrap());
    assert!(!c.add(b"a", b"2", 0, 0).unwrap());
    assert_eq!(c.get(b"a").unwrap().unwrap().data, b"1");
    assert!(c.replace(b"a", b"3", 0, 0).unwrap());
    assert_eq!(c.get(b"a").unwrap().unwrap().data, b"3");
    assert!(c.contains(b"a").unwrap());
    assert!(c.touch(b"a", 60_000).unwrap());
    let exp = c.expires_at(b"a").unwrap().unwrap();
    assert!(exp > nearcache_core::now_ms());
    assert!(!c.touch(b"zz", 1).unwrap());
    assert_eq!(c.pop(b"a").unwrap().unwrap().data, b"3");
    assert!(c.pop(b"a").unwrap().is_none());
    assert!(!c.contains(b"a").unwrap());
    c.check().unwrap();
}

#[test]
fn ttl_expires_lazily_and_in_compaction() {
    let d = TempDir::new("ttl");
    let c = open(&d, "c", 1 << 20, 1);
    c.set(b"short", b"v", 0, 30).unwrap();
    c.set(b"long", b"v", 0, 60_000).unwrap();
    c.set(b"never", b"v", 0, 0).unwrap();
    assert!(c.get(b"short").unwrap().is_some());
    std::thread::sleep(Duration::from_millis(60));
    assert!(c.get(b"short").unwrap().is_none());
    assert!(c.get(b"long").unwrap().is_some());
    assert_eq!(c.expires_at(b"never").unwrap(), Some(0));
    assert!(c.stats().unwrap().expirations >= 1);
    // add over an expired key succeeds
    c.set(b"gone", b"v", 0, 1).unwrap();
    std::thread::sleep(Duration::from_millis(5));
    assert!(c.add(b"gone", b"new", 0, 0).unwrap());
    c.check().unwrap();
}

#[test]
fn counters() {
    let d = TempDir::new("incr");
    let c = open(&d, "c", 1 << 20, 1);
    assert_eq!(c.incr(b"n", 5, Some(10), 0).unwrap(), 15);
    assert_eq!(c.incr(b"n", -20, Some(0), 0).unwrap(), -5);
    assert!(matches!(c.incr(b"missing", 1, None, 0), Err(Error::NotFound)));
    c.set(b"max", &i64::MAX.to_le_bytes(), FLAG_INT, 0).unwrap();
    assert!(matches!(c.incr(b"max", 1, Some(0), 0), Err(Error::Overflow)));
    assert_eq!(c.get(b"max").unwrap().unwrap().data, i64::MAX.to_le_bytes());
    c.set(b"text", b"abc", 1, 0).unwrap();
    assert!(matches!(c.incr(b"text", 1, Some(0), 0), Err(Error::NotACounter)));
    let v = c.get(b"n").unwrap().unwrap();
    assert_eq!((v.data, v.flags), ((-5i64).to_le_bytes().to_vec(), FLAG_INT));
}

#[test]
fn batches_take_each_shard_once() {
    let d = TempDir::new("many");
    let c = open(&d, "c", 4 << 20, 8);
    let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("key-{i}").into_bytes()).collect();
    let items: Vec<(Vec<u8>, Vec<u8>, u32)> =
        keys.iter().map(|k| (k.clone(), k.repeat(3), 3)).collect();
    c.set_many(&items, 0).unwrap();
    let mut probe = keys.clone();
    probe.push(b"absent".to_vec());
    let got = c.get_many(&probe).unwrap();
    for (i, k) in keys.iter().enumerate() {
        assert_eq!(got[i].as_ref().unwrap().data, k.repeat(3));
    }
    assert!(got[200].is_none());
    assert_eq!(c.delete_many(&probe).unwrap(), 200);
    assert_eq!(c.len().unwrap(), 0);
    c.check().unwrap();
}

#[test]
fn too_large_value_leaves_cache_unchanged() {
    // With spilling disabled (spill_budget 0), the inline limit is the limit.
    let d = TempDir::new("large");
    let c =
        Cache::open(d.file("c"), &OpenOptions { spill_budget: 0, ..opts(256 << 10, 1) }).unwrap();
    for i in 0..50u32 {
        c.set(format!("k{i}").as_bytes(), &[i as u8; 1000], 0, 0).unwrap();
    }
    c.set(b"victim", b"old", 0, 0).unwrap();
    let before = c.stats().unwrap();
    let big = vec![0u8; c.max_entry_size()];
    match c.set(b"victim", &big, 0, 0) {
        Err(Error::ValueTooLarge { .. }) => {}
        other => panic!("expected ValueTooLarge, got {other:?}"),
    }
    let items: Vec<(&[u8], &[u8], u32)> = vec![(b"k1", b"x", 0), (b"victim", &big, 0)];
    assert!(matches!(c.set_many(&items, 0), Err(Error::ValueTooLarge { .. })));
    let after = c.stats().unwrap();
    assert_eq!(before, after, "a refused set must not change anything");
    assert_eq!(c.get(b"victim").unwrap().unwrap().data, b"old");
    assert_eq!(c.get(b"k1").unwrap().unwrap().data, vec![1u8; 1000]);
    // The largest accepted entry does fit, to the byte (header, 6-byte
    // key, value); one byte more does not.
    let header = nearcache_core::layout::ENTRY_HEADER;
    let fits = vec![1u8; c.max_entry_size() - header - 6];
    let over = vec![1u8; fits.len() + 1];
    assert!(matches!(c.set(b"victim", &over, 0, 0), Err(Error::ValueTooLarge { .. })));
    c.set(b"victim", &fits, 0, 0).unwrap();
    assert_eq!(c.get(b"victim").unwrap().unwrap().data.len(), fits.len());
    c.check().unwrap();
}

#[test]
fn bad_keys_are_rejected() {
    let d = TempDir::new("keys");
    let c = open(&d, "c", 1 << 20, 1);
    assert!(matches!(c.set(b"", b"v", 0, 0), Err(Error::BadKey { .. })));
    let long = vec![b'k'; nearcache_core::MAX_KEY_LEN + 1];
    assert!(matches!(c.get(&long), Err(Error::BadKey { .. })));
    assert!(matches!(c.get_many(&[b"ok".to_vec(), Vec::new()]), Err(Error::BadKey { .. })));
}

#[test]
fn eviction_keeps_the_shard_consistent() {
    let d = TempDir::new("evict");
    let c = open(&d, "c", 128 << 10, 1);
    for i in 0..5000u32 {
        c.set(
            format!("key-{i}").as_bytes(),
            &vec![(i % 251) as u8; 100 + (i as usize % 300)],
            0,
            0,
        )
        .unwrap();
        if i % 3 == 0 {
            let _ = c.get(format!("key-{}", i / 2).as_bytes()).unwrap();
        }
    }
    let s = c.stats().unwrap();
    assert!(s.evictions > 0 && s.compactions > 0);
    assert!(s.items > 0);
    c.check().unwrap();
    // Whatever survives has the right contents.
    for i in 0..5000u32 {
        if let Some(v) = c.get(format!("key-{i}").as_bytes()).unwrap() {
            assert_eq!(v.data, vec![(i % 251) as u8; 100 + (i as usize % 300)]);
        }
    }
}

#[test]
fn clear_keys_stats() {
    let d = TempDir::new("clear");
    let c = open(&d, "c", 1 << 20, 4);
    for i in 0..100 {
        c.set(format!("{i}").as_bytes(), b"v", 0, 0).unwrap();
    }
    let mut keys = c.keys().unwrap();
    keys.sort();
    assert_eq!(keys.len(), 100);
    assert_eq!(c.shard_stats().unwrap().len(), 4);
    assert_eq!(c.stats().unwrap().items, 100);
    c.clear().unwrap();
    assert_eq!(c.len().unwrap(), 0);
    assert!(c.keys().unwrap().is_empty());
}

#[test]
fn reopen_shares_data_and_checks_parameters() {
    let d = TempDir::new("reopen");
    let a = open(&d, "c", 1 << 20, 2);
    a.set(b"k", b"v", 0, 0).unwrap();
    let b = open(&d, "c", 1 << 20, 2);
    assert_eq!(b.get(b"k").unwrap().unwrap().data, b"v");
    // size=None opens with the file's own parameters.
    let c =
        Cache::open(d.file("c"), &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    assert_eq!(c.shard_count(), 2);
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"v");
    // Same file, other parameters: resized live, entries kept, and every
    // handle follows.
    let g = Cache::open(d.file("c"), &opts(2 << 20, 2)).unwrap();
    assert_eq!(g.capacity(), Geometry::for_size(2 << 20, 2).unwrap().total_size());
    assert_eq!(g.get(b"k").unwrap().unwrap().data, b"v");
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"v");
    assert_eq!(c.capacity(), g.capacity());
    assert_eq!(a.get(b"k").unwrap().unwrap().data, b"v");
    assert_eq!(a.capacity(), g.capacity());
    // Explicit re-create replaces it.
    let r = Cache::open(d.file("c"), &OpenOptions { recreate: true, ..opts(2 << 20, 4) }).unwrap();
    assert_eq!(r.shard_count(), 4);
    assert!(r.get(b"k").unwrap().is_none());
    // The old handles keep working on the old (now unlinked) file.
    assert_eq!(a.get(b"k").unwrap().unwrap().data, b"v");
}

#[test]
fn closed_cache_errors() {
    let d = TempDir::new("closed");
    let c = open(&d, "c", 1 << 20, 1);
    c.close();
    assert!(c.is_closed());
    assert!(matches!(c.get(b"k"), Err(Error::Closed)));
    assert!(matches!(c.set(b"k", b"v", 0, 0), Err(Error::Closed)));
    assert!(matches!(c.clear(), Err(Error::Closed)));
}

#[test]
fn invalid_sizes() {
    let d = TempDir::new("sizes");
    assert!(matches!(Cache::open(d.file("a"), &opts(1000, 0)), Err(Error::InvalidArgument(_))));
    assert!(matches!(Cache::open(d.file("b"), &opts(1 << 20, 3)), Err(Error::InvalidArgument(_))));
    assert!(matches!(
        Cache::open(d.file("c"), &opts(1 << 20, 1 << 17)),
        Err(Error::InvalidArgument(_))
    ));
    assert!(!d.file("a").exists());
    let missing =
        Cache::open(d.file("nope"), &OpenOptions { create: false, ..OpenOptions::default() });
    assert!(matches!(missing, Err(Error::Io { .. })));
}

#[test]
fn close_then_reopen_does_not_block() {
    let d = TempDir::new("close-reopen");
    let a = open(&d, "c", 1 << 20, 1);
    a.set(b"k", b"v", 0, 0).unwrap();
    a.close(); // the handle (and its mapping) stays alive
    let path = d.file("c");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let b = Cache::open(&path, &opts(1 << 20, 1)).unwrap();
        tx.send(b.get(b"k").unwrap().map(|v| v.data)).unwrap();
    });
    let got = rx.recv_timeout(Duration::from_secs(10)).expect("reopen blocked after close");
    assert_eq!(got.as_deref(), Some(&b"v"[..]));
    drop(a);
}

#[test]
fn compare_and_delete() {
    let d = TempDir::new("cad");
    let c = open(&d, "c", 1 << 20, 1);
    c.set(b"lock", b"token-a", 0, 0).unwrap();
    assert!(!c.delete_if_equals(b"lock", b"token-b").unwrap());
    assert!(!c.delete_if_equals(b"lock", b"token-a-longer").unwrap());
    assert!(c.get(b"lock").unwrap().is_some());
    assert!(c.delete_if_equals(b"lock", b"token-a").unwrap());
    assert!(c.get(b"lock").unwrap().is_none());
    assert!(!c.delete_if_equals(b"lock", b"token-a").unwrap());
    c.check().unwrap();
}

#[test]
fn longest_keys_and_latest_expiries_survive_compactions() {
    use nearcache_core::layout::MAX_EXPIRES_MS;
    let d = TempDir::new("extremes");
    let c = open(&d, "c", 1 << 20, 1);
    let long = vec![b'L'; nearcache_core::MAX_KEY_LEN];
    let year_9999 = 253_402_300_799_000u64;
    c.set(&long, b"long", 0, 0).unwrap();
    c.set(b"far", b"far", 0, u64::MAX / 2).unwrap();
    c.set(b"9999", b"9999", 0, year_9999 - nearcache_core::now_ms()).unwrap();
    // Compactions move the entries and rebuild the index from their keys,
    // hashed again: the three must stay reachable with their expiries.
    for i in 0..20_000u32 {
        c.set(format!("filler-{i}").as_bytes(), &[1u8; 200], 0, 0).unwrap();
        if i % 50 == 0 {
            assert_eq!(c.get(&long).unwrap().unwrap().data, b"long");
            assert_eq!(c.get(b"far").unwrap().unwrap().data, b"far");
            assert_eq!(c.get(b"9999").unwrap().unwrap().data, b"9999");
        }
    }
    assert!(c.stats().unwrap().compactions > 3);
    assert_eq!(c.expires_at(b"far").unwrap(), Some(MAX_EXPIRES_MS));
    let at = c.expires_at(b"9999").unwrap().unwrap();
    assert!(at.abs_diff(year_9999) < 60_000, "{at}");
    c.check().unwrap();
}
