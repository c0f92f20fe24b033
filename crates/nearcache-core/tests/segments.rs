//! Segmented arenas (`shard/segments.rs`): the work one write does is
//! bounded by a few segments whatever the shard's size, and what the cache
//! returns stays right while segments are merged.

mod common;

use common::TempDir;
use nearcache_core::layout::{Geometry, HEADER_SIZE, MERGE_SEGMENTS, SEGMENT_SIZE};
use nearcache_core::{Cache, OpenOptions};
use proptest::prelude::*;
use std::collections::HashMap;

fn open(d: &TempDir, shard_size: usize, shards: usize) -> Cache {
    let opts = OpenOptions {
        size: Some(HEADER_SIZE + shards * shard_size),
        shards,
        ..OpenOptions::default()
    };
    Cache::open(d.file("c"), &opts).unwrap()
}

fn value(i: u64, len: usize) -> Vec<u8> {
    (0..len).map(|j| (i as usize * 31 + j * 7) as u8).collect()
}

/// The most arena bytes one write examined in a segmented shard, as
/// measured: one step from the hand (and, when that reached the head, one
/// from the tail) of `MERGE_SEGMENTS` segments. (The code's worst case is a
/// few such steps per write, see `shard/segments.rs`; a workload that
/// needs more than two is a regression this test reports.)
fn bound(segment: usize) -> u64 {
    (2 * MERGE_SEGMENTS * segment) as u64
}

#[test]
fn work_per_write_does_not_grow_with_the_shard() {
    let mut seen = Vec::new();
    for mib in [1usize, 4, 16, 64] {
        let d = TempDir::new("bound");
        let c = open(&d, mib << 20, 1);
        let g: Geometry = *c.geometry();
        // 36-byte keys, 160-byte values: the workload, written to
        // twice the shard's size; every third key is read back
        // soon (visited), so steps keep some entries and merge them.
        let n = (2 * (mib << 20) / 212) as u64;
        for i in 0..n {
            let k = format!("{:036}", i);
            c.set(k.as_bytes(), &value(i, 160), 0, 0).unwrap();
            if i % 3 == 0 && i > 100 {
                let back = format!("{:036}", i - 100);
                if let Some(v) = c.get(back.as_bytes()).unwrap() {
                    assert_eq!(v.data, value(i - 100, 160));
                }
            }
        }
        let s = c.stats().unwrap();
        assert!(s.evictions > 0 && s.compactions > 0, "{mib} MiB: {s:?}");
        c.check().unwrap();
        let (count, size) = g.segments();
        seen.push((mib, count, size, s.max_compaction_bytes, s.items));
        if count > 1 {
            assert!(
                s.max_compaction_bytes <= bound(size) && size <= 2 * SEGMENT_SIZE,
                "{mib} MiB shard: one write examined {} bytes (bound {})",
                s.max_compaction_bytes,
                bound(size)
            );
        } else {
            // One segment: compacted whole (a write may compact twice: its
            // hand's part, then all of it), bounded by the (small) shard.
            assert!(
                s.max_compaction_bytes <= 2 * g.arena_size() as u64,
                "{} {}",
                s.max_compaction_bytes,
                g.arena_size()
            );
        }
    }
    println!("shard MiB, segments, segment bytes, most bytes one write examined, entries held");
    for row in &seen {
        println!("{row:?}");
    }
    // The largest shard does no more work per write than the 4 MiB one
    // (both segmented): the bound is the segment, not the shard.
    let four = seen.iter().find(|r| r.0 == 4).unwrap().3;
    let big = seen.iter().find(|r| r.0 == 64).unwrap().3;
    assert!(big <= 2 * four.max(MERGE_SEGMENTS as u64 * SEGMENT_SIZE as u64), "{seen:?}");
}

#[derive(Debug, Clone)]
enum Op {
    Set(u16, u16),
    Get(u16),
    Delete(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0u16..3000, 0u16..4000).prop_map(|(k, n)| Op::Set(k, n)),
        3 => (0u16..3000).prop_map(Op::Get),
        1 => (0u16..3000).prop_map(Op::Delete),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    /// A 2 MiB shard (18 segments) filled several times over with values
    /// of up to 4 KB: every answer agrees with a map (a miss is allowed:
    /// eviction; a wrong value never is), and the shard checks clean.
    #[test]
    fn never_wrong_while_segments_merge(ops in proptest::collection::vec(op(), 2000..4000)) {
        let d = TempDir::new("segmodel");
        let c = open(&d, 2 << 20, 1);
        assert!(c.geometry().segments().0 > 1);
        let mut m: HashMap<u16, Vec<u8>> = HashMap::new();
        for (i, o) in ops.iter().enumerate() {
            match *o {
                Op::Set(k, n) => {
                    let v = value(k as u64 * 7919 + n as u64, n as usize);
                    c.set(&k.to_le_bytes(), &v, 0, 0).unwrap();
                    m.insert(k, v);
                }
                Op::Get(k) => match (c.get(&k.to_le_bytes()).unwrap(), m.get(&k)) {
                    (Some(got), Some(want)) => prop_assert_eq!(&got.data, want),
                    (Some(got), None) => prop_assert!(false, "{k}: {} bytes never set", got.data.len()),
                    (None, _) => { m.remove(&k); }
                },
                Op::Delete(k) => {
                    c.delete(&k.to_le_bytes()).unwrap();
                    m.remove(&k);
                }
            }
            if i % 500 == 499 {
                c.check().unwrap();
            }
        }
        c.check().unwrap();
        let s = c.stats().unwrap();
        prop_assert_eq!(s.resets, 0);
        prop_assert_eq!(s.corruptions, 0);
    }
}
