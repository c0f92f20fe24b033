//! Property tests: random operation sequences against a model map.
//!
//! With a cache large enough to never evict, the engine must agree with the
//! model exactly. With a small cache it may forget entries (eviction), but
//! a get may only ever return the last value set for that key, never
//! anything else.

mod common;
use common::*;
use nearcache_core::{EvictionMode, FLAG_INT};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Op {
    Set(u8, u16, u8),
    Get(u8),
    Delete(u8),
    Add(u8, u16),
    Replace(u8, u16),
    Incr(u8, i8),
    Pop(u8),
    GetMany(Vec<u8>),
    Clear,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (any::<u8>(), 0u16..2000, any::<u8>()).prop_map(|(k, n, b)| Op::Set(k, n, b)),
        4 => any::<u8>().prop_map(Op::Get),
        1 => any::<u8>().prop_map(Op::Delete),
        1 => (any::<u8>(), 0u16..500).prop_map(|(k, n)| Op::Add(k, n)),
        1 => (any::<u8>(), 0u16..500).prop_map(|(k, n)| Op::Replace(k, n)),
        1 => (any::<u8>(), any::<i8>()).prop_map(|(k, d)| Op::Incr(k, d)),
        1 => any::<u8>().prop_map(Op::Pop),
        1 => proptest::collection::vec(any::<u8>(), 0..20).prop_map(Op::GetMany),
        1 => Just(Op::Clear),
    ]
}

/// Key `k` of a space of `space` keys.
fn key_of(k: u8, space: u8) -> Vec<u8> {
    format!("key-{}", k % space).into_bytes()
}

fn value(n: u16, b: u8) -> Vec<u8> {
    let mut v = vec![b; n as usize];
    v.extend_from_slice(&n.to_le_bytes());
    v
}

/// (value, flags) per key.
type Model = HashMap<Vec<u8>, (Vec<u8>, u32)>;

fn run(ops: &[Op], size: usize, shards: usize, may_evict: bool) {
    run_with(ops, opts(size, shards), may_evict)
}

fn run_with(ops: &[Op], options: nearcache_core::OpenOptions, may_evict: bool) {
    run_keys(ops, options, may_evict, 64, EvictionMode::Lenient)
}

/// Run `ops` over a space of `space` keys (64: mostly overwrites; 255:
/// mostly new keys once the cache is full), the file set to `mode`. The
/// shards are checked (`Cache::check`) every 50 operations and at the end.
fn run_keys(
    ops: &[Op],
    options: nearcache_core::OpenOptions,
    may_evict: bool,
    space: u8,
    mode: EvictionMode,
) {
    let key = |k: u8| key_of(k, space);
    let d = TempDir::new("model");
    let path = d.file("c");
    let c = nearcache_core::Cache::open(&path, &options).unwrap();
    c.set_eviction_mode(mode).unwrap();
    let mut m: Model = HashMap::new();
    // Compare a cache answer with the model; with eviction, a miss is
    // allowed (and forgets the key), a wrong value never is.
    let agree =
        |m: &mut Model, k: &Vec<u8>, got: Option<(Vec<u8>, u32)>| match (got, m.get(k).cloned()) {
            (Some(g), Some(want)) => assert_eq!(g, want, "wrong value for {k:?}"),
            (Some(g), None) => panic!("value {g:?} for a key never set or deleted: {k:?}"),
            (None, Some(_)) => {
                assert!(may_evict, "lost {k:?} without eviction");
                m.remove(k);
            }
            (None, None) => {}
        };
    for (i, o) in ops.iter().enumerate() {
        if i % 50 == 49 {
            c.check().unwrap();
        }
        match o {
            Op::Set(k, n, b) => {
                c.set(&key(*k), &value(*n, *b), 7, 0).unwrap();
                m.insert(key(*k), (value(*n, *b), 7));
            }
            Op::Get(k) => {
                let got = c.get(&key(*k)).unwrap().map(|v| (v.data, v.flags));
                agree(&mut m, &key(*k), got);
            }
            Op::Delete(k) => {
                let was = c.delete(&key(*k)).unwrap();
                let had = m.remove(&key(*k)).is_some();
                assert!(was == had || (may_evict && had && !was));
            }
            Op::Add(k, n) => {
                let added = c.add(&key(*k), &value(*n, 1), 1, 0).unwrap();
                if added {
                    assert!(may_evict || !m.contains_key(&key(*k)));
                    m.insert(key(*k), (value(*n, 1), 1));
                } else {
                    assert!(m.contains_key(&key(*k)), "add refused for an absent key");
                }
            }
            Op::Replace(k, n) => {
                let replaced = c.replace(&key(*k), &value(*n, 2), 2, 0).unwrap();
                if replaced {
                    assert!(m.contains_key(&key(*k)), "replace of an absent key");
                    m.insert(key(*k), (value(*n, 2), 2));
                } else {
                    assert!(may_evict || !m.contains_key(&key(*k)));
                    m.remove(&key(*k));
                }
            }
            Op::Incr(k, dlt) => {
                let kk = key(*k);
                let r = c.incr(&kk, *dlt as i64, Some(100), 0);
                match m.get(&kk).cloned() {
                    Some((v, f)) if f == FLAG_INT && v.len() == 8 => {
                        let new = r.unwrap();
                        let old = i64::from_le_bytes(v.try_into().unwrap());
                        assert!(
                            new == old + *dlt as i64 || (may_evict && new == 100 + *dlt as i64)
                        );
                        m.insert(kk, (new.to_le_bytes().to_vec(), FLAG_INT));
                    }
                    Some(_) => match r {
                        Err(nearcache_core::Error::NotACounter) => {}
                        Ok(new) => {
                            assert!(may_evict && new == 100 + *dlt as i64);
                            m.insert(kk, (new.to_le_bytes().to_vec(), FLAG_INT));
                        }
                        Err(e) => panic!("{e}"),
                    },
                    None => {
                        let new = r.unwrap();
                        assert_eq!(new, 100 + *dlt as i64);
                        m.insert(kk, (new.to_le_bytes().to_vec(), FLAG_INT));
                    }
                }
            }
            Op::Pop(k) => {
                let got = c.pop(&key(*k)).unwrap().map(|v| (v.data, v.flags));
                agree(&mut m, &key(*k), got);
                m.remove(&key(*k));
            }
            Op::GetMany(ks) => {
                let keys: Vec<Vec<u8>> = ks.iter().map(|k| key(*k)).collect();
                let got = c.get_many(&keys).unwrap();
                for (k, g) in keys.iter().zip(got) {
                    agree(&mut m, k, g.map(|v| (v.data, v.flags)));
                }
            }
            Op::Clear => {
                c.clear().unwrap();
                m.clear();
            }
        }
    }
    c.check().unwrap();
    // Every spilled value has exactly one file, and no file is left over.
    let s = c.stats().unwrap();
    let files = std::fs::read_dir(nearcache_core::spill::dir_path(&path)).map_or(0, |d| d.count());
    assert_eq!(files as u64, s.spilled_values, "{s:?}");
    if !may_evict {
        assert_eq!(c.len().unwrap(), m.len());
        for (k, want) in &m {
            let v = c.get(k).unwrap().unwrap();
            assert_eq!(&(v.data, v.flags), want);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: proptest_cases(96), ..ProptestConfig::default() })]

    #[test]
    fn matches_model_without_eviction(ops in proptest::collection::vec(op(), 1..400)) {
        run(&ops, 4 << 20, 4, false);
    }

    #[test]
    fn matches_model_with_spilled_values(ops in proptest::collection::vec(op(), 1..300)) {
        // Values above 1000 bytes go to files: about half of the sets.
        let o = nearcache_core::OpenOptions { spill_threshold: Some(1000), ..opts(4 << 20, 4) };
        run_with(&ops, o, false);
    }

    #[test]
    fn never_wrong_with_a_small_spill_budget(ops in proptest::collection::vec(op(), 1..300)) {
        // A 6 KB budget holds a handful of spilled values: the budget evicts.
        let o = nearcache_core::OpenOptions {
            spill_threshold: Some(500),
            spill_budget: 6_000,
            ..opts(64 << 10, 1)
        };
        run_with(&ops, o, true);
    }

    #[test]
    fn matches_model_when_compactions_read_the_index(
        ops in proptest::collection::vec(
            op().prop_filter("no clear: the shard must fill up", |o| !matches!(o, Op::Clear)),
            300..1200,
        )
    ) {
        // One 192 KiB shard: ~168 KiB of arena for at most 64 keys of up to
        // 2 KB (128 KiB, under the 80% a compaction keeps): no eviction,
        // and every compaction finds at least 1 KiB of used arena per live
        // entry, so it gathers the live entries from the index.
        run(&ops, 4096 + (192 << 10), 1, false);
    }

    #[test]
    fn never_wrong_under_eviction(ops in proptest::collection::vec(op(), 1..600)) {
        // 64 KiB in one shard: ~40 KiB of arena for up to 64 keys of up to 2 KB.
        run(&ops, 64 << 10, 1, true);
    }

    #[test]
    fn never_wrong_when_compactions_start_at_the_hand(
        ops in proptest::collection::vec(
            op().prop_filter("no clear: the shard must fill up", |o| !matches!(o, Op::Clear)),
            200..1000,
        )
    ) {
        // 255 keys for ~40 KiB of arena: most sets store a key the cache
        // no longer holds, so few dead copies pile up and compactions
        // evict from the SIEVE hand on (`compact_from_hand`), marking and
        // purging slots in place, with gets setting visited marks.
        run_keys(&ops, opts(64 << 10, 1), true, 255, EvictionMode::Lenient);
    }

    #[test]
    fn never_wrong_under_strict_and_adaptive_admission(
        ops in proptest::collection::vec(
            op().prop_filter("no clear: the shard must fill up", |o| !matches!(o, Op::Clear)),
            200..1000,
        ),
        adaptive in any::<bool>(),
    ) {
        // As above, admitting strictly: compactions judge the window
        // (from the hand while the victims before the window suffice,
        // else over the whole arena), candidates and victims dropped
        // while gets set marks; or adaptively, the miniatures fed.
        let mode = if adaptive { EvictionMode::Adaptive } else { EvictionMode::Strict };
        run_keys(&ops, opts(64 << 10, 1), true, 255, mode);
    }
}
