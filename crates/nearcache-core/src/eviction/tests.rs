//! Model tests: the engine-shaped simulation against the plain reference
//! implementations on random traces, and the policies' behaviour on the
//! access patterns they are chosen for.

use super::reference::{RefLru, RefSieve, RefWTinyLfu, RefWTinyLfuGhost};
use super::*;

/// Deterministic xorshift64* generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A random trace mixing skewed popularity, one-time keys and short loops,
/// so hits, admissions, rejections and sketch aging all happen.
fn random_trace(seed: u64, len: usize, space: u64) -> Vec<u64> {
    let mut rng = Rng(seed | 1);
    let mut out = Vec::with_capacity(len);
    let mut fresh = 1u64 << 40;
    while out.len() < len {
        match rng.below(10) {
            0 => {
                // a short scan of keys never seen again
                for _ in 0..rng.below(space / 2 + 1) {
                    fresh += 1;
                    out.push(fresh);
                }
            }
            1 => {
                // a loop over a range
                let start = rng.below(space);
                let n = rng.below(space) + 1;
                for k in start..start + n {
                    out.push(k);
                }
            }
            _ => {
                // skewed: the square of a uniform favours small ids
                for _ in 0..20 {
                    let u = rng.below(1 << 16);
                    out.push(u * u * space / (1 << 32));
                }
            }
        }
    }
    out.truncate(len);
    out
}

/// `len` requests cycling through `keys` keys in order, each of size 1: a
/// loop, larger than the cache in the tests that use it.
fn looped_trace(len: u64, keys: u64) -> Vec<(u64, u64)> {
    (0..len).map(|i| (i % keys, 1)).collect()
}

fn unit(trace: &[u64]) -> Vec<(u64, u64)> {
    trace.iter().map(|&k| (k, 1)).collect()
}

/// One eviction at a time (a compaction frees one entry): the model must
/// then make exactly the reference's choices.
fn batch_of_one(policy: Policy, cap: u64) -> Config {
    let mut c = Config::new(policy, cap);
    c.free_percent = 0;
    c
}

#[test]
fn sieve_with_single_evictions_is_textbook_sieve() {
    for seed in 1..=6u64 {
        let cap = 5 + seed * 11;
        let trace = random_trace(seed, 4_000, cap * 4);
        let mut model = ArenaShard::new(batch_of_one(Policy::Sieve, cap), cap, cap);
        let mut reference = RefSieve::new(cap as usize);
        for (i, &k) in trace.iter().enumerate() {
            assert_eq!(model.access(k, 1), reference.access(k), "seed {seed}, request {i}");
        }
    }
}

#[test]
fn sieve_sparing_its_young_entries_is_the_reference() {
    // The engine's lenient admission since round ten: the hand wraps
    // round before the newest twelfth (here also a quarter and a half).
    for seed in 1..=6u64 {
        for share in [2usize, 4, 12] {
            let cap = 5 + seed * 11;
            let trace = random_trace(seed, 4_000, cap * 4);
            let mut cfg = batch_of_one(Policy::Sieve, cap);
            cfg.young_share = share;
            let mut model = ArenaShard::new(cfg, cap, cap);
            let mut reference = RefSieve::with_young(cap as usize, share);
            for (i, &k) in trace.iter().enumerate() {
                assert_eq!(
                    model.access(k, 1),
                    reference.access(k),
                    "seed {seed}, share {share}, request {i}"
                );
            }
        }
    }
}

#[test]
fn sparing_the_young_entries_follows_a_shifting_working_set() {
    // SIEVE's hand settles among the newest entries of a moving working
    // set and evicts them as they come; sparing the newest twelfth lifts
    // it towards LRU's level, and costs a skewed random trace little.
    let ratio = |young: usize, trace: &[(u64, u64)]| {
        let mut c = Config::new(Policy::Sieve, 1_000);
        c.young_share = young;
        replay(c, trace.iter().copied()).hit_ratio()
    };
    let shift = unit(&shifting_trace(5, 60_000, 2_000));
    let (sieve, young) = (ratio(0, &shift), ratio(12, &shift));
    let mut lru = RefLru::new(1_000);
    let lru = shift.iter().filter(|&&(k, _)| lru.access(k)).count() as f64 / shift.len() as f64;
    eprintln!("shifting: SIEVE {sieve:.4}, sparing the young {young:.4}, LRU {lru:.4}");
    assert!(young > sieve + 0.005, "SIEVE {sieve} sparing the young {young}");
}

#[test]
fn wtinylfu_with_single_evictions_matches_the_reference() {
    for exact in [false, true] {
        let policy = if exact { Policy::WTinyLfuExact } else { Policy::WTinyLfu };
        for seed in 1..=3u64 {
            let cap = 100 + seed * 37;
            let trace = random_trace(seed, 5_000, cap * 3);
            let cfg = batch_of_one(policy, cap);
            let window = (cap * cfg.window_percent / 100) as usize;
            let mut model = ArenaShard::new(cfg, cap, cap);
            let mut reference = RefWTinyLfu::new(cap as usize, window, cfg.counter_max, exact);
            for (i, &k) in trace.iter().enumerate() {
                assert_eq!(
                    model.access(k, 1),
                    reference.access(k),
                    "{policy:?}, seed {seed}, request {i}"
                );
            }
            assert_eq!(model.len() as usize, reference.len());
        }
    }
}

#[test]
fn one_hand_policies_hold_a_loop_larger_than_the_cache() {
    // 1,000 keys in a loop through a cache of 800: SIEVE and LRU hold
    // nothing; a duel against the next victim ahead of the one hand keeps
    // most of the main part in place, as two hands do.
    let trace: Vec<u64> = (0..40).flat_map(|_| 0..1_000u64).collect();
    let sieve = replay(Config::new(Policy::Sieve, 800), unit(&trace)).hit_ratio();
    assert!(sieve < 0.05, "SIEVE {sieve}");
    for policy in [Policy::TinyLfuSieve, Policy::WTinyLfuOneHand, Policy::WTinyLfuGhost] {
        let h = replay(Config::new(policy, 800), unit(&trace)).hit_ratio();
        assert!(h > 0.6, "{policy:?} {h}");
    }
}

/// A trace whose working set moves (Zipf-like over a window of keys that
/// slides by half its width every phase), so the adaptive window grows.
fn shifting_trace(seed: u64, len: usize, space: u64) -> Vec<u64> {
    let mut rng = Rng(seed | 1);
    let phases = 6;
    (0..len)
        .map(|i| {
            let base = (i * phases / len) as u64 * space / 2;
            let u = rng.below(1 << 16);
            base + u * u * space / (1 << 32)
        })
        .collect()
}

/// The trace of the tests of the ghost-adaptive window for `seed`: the
/// cache's entry count, and random requests, a shifting working set (so
/// the window grows), then random requests again.
fn adaptive_trace(seed: u64) -> (u64, Vec<u64>) {
    let cap = 90 + seed * 41;
    let mut trace = random_trace(seed, 6_000, cap * 3);
    trace.extend(shifting_trace(seed, 6_000, cap * 2));
    trace.extend(random_trace(seed + 10, 4_000, cap * 3));
    (cap, trace)
}

#[test]
fn ghost_window_with_single_evictions_matches_the_reference() {
    for seed in 1..=4u64 {
        let (cap, trace) = adaptive_trace(seed);
        let cfg = batch_of_one(Policy::WTinyLfuGhost, cap);
        let mut model = ArenaShard::new(cfg, cap, cap);
        let ghost_len = (cap * cfg.ghost_percent / 100) as usize;
        let mut reference = RefWTinyLfuGhost::new(cap as usize, ghost_len, cfg.counter_max);
        let mut largest = 0.0f64;
        for (i, &k) in trace.iter().enumerate() {
            assert_eq!(model.access(k, 1), reference.access(k), "seed {seed}, request {i}");
            assert_eq!(model.window_share(), reference.share(), "seed {seed}, request {i}");
            largest = largest.max(reference.share());
        }
        assert_eq!(model.len() as usize, reference.len());
        // The shifting part made the window follow its ghost: the test
        // covers the adaptation, not a window stuck at 1%.
        assert!(largest > 0.1, "seed {seed}: the window never grew ({largest})");
    }
}

/// The chosen policy follows a moving working set as LRU does, and still
/// holds part of a loop larger than the cache (where LRU holds nothing).
#[test]
fn ghost_window_follows_shifts_and_holds_loops() {
    let shift = unit(&shifting_trace(5, 60_000, 2_000));
    let mut lru = RefLru::new(1_000);
    let lru_ratio =
        shift.iter().filter(|&&(k, _)| lru.access(k)).count() as f64 / shift.len() as f64;
    let ratio = |p: Policy, trace: &[(u64, u64)]| {
        let mut c = Config::new(p, 1_000);
        c.free_percent = 2;
        replay(c, trace.iter().copied()).hit_ratio()
    };
    let ghost = ratio(Policy::WTinyLfuGhost, &shift);
    let fixed = ratio(Policy::WTinyLfuMargin, &shift);
    let sieve = ratio(Policy::Sieve, &shift);
    eprintln!("ghost {ghost}, fixed window {fixed}, SIEVE {sieve}, LRU {lru_ratio}");
    // Measured: ghost 0.551, fixed window 0.414, SIEVE 0.460, LRU 0.597
    // (short phases: the window spends part of each growing).
    assert!(ghost > fixed + 0.1, "ghost {ghost} vs fixed window {fixed}");
    assert!(ghost > sieve + 0.05, "ghost {ghost} vs SIEVE {sieve}");
    assert!(ghost > lru_ratio - 0.06, "ghost {ghost} vs LRU {lru_ratio}");
    let looped = looped_trace(60_000, 1_250);
    let r = ratio(Policy::WTinyLfuGhost, &looped);
    assert!(r > 0.65, "loop: {r}");
}

/// The segment-granular arena keeps its books: every segment within its
/// size, the segments in use and in the pool always the configured count,
/// the bytes of the segments the live entries plus the holes the cleaner
/// has not merged yet, and the hit ratio close to the entry-granular
/// arena's at the same mean entry count.
/// The segment arena's books after a request: segment bytes are live
/// bytes plus holes (plus moves waiting for the head), every entry is in a
/// segment or waiting, segments in use and the pool make `segments`, none
/// is over its size, and the index holds the live entries.
fn assert_segment_books(shard: &ArenaShard, segments: usize, at: &str) {
    let used: u64 = shard.seg_used.iter().sum();
    let dead: u64 = shard.seg_dead.iter().sum();
    let pending: u64 = shard.seg_pending.iter().sum();
    assert_eq!(used - dead + pending, shard.bytes, "{at}");
    let entries: usize = shard.seg_len.iter().sum();
    assert_eq!(entries + shard.seg_pending.len(), shard.arena.len(), "{at}");
    assert_eq!(shard.seg_used.len() + shard.seg_free, segments, "{at}");
    assert!(shard.seg_used.iter().all(|&u| u <= shard.seg_cap), "{at}");
    assert!(shard.index.len() as u64 == shard.items, "{at}");
}

#[test]
fn segments_keep_their_books_and_the_hit_ratio() {
    let trace = unit(&random_trace(21, 30_000, 4_000));
    for policy in [Policy::Sieve, Policy::WTinyLfuGhost] {
        let mut c = Config::new(policy, 1_000);
        c.segments = 8;
        let mut shard = ArenaShard::new(c, 1_000, 1_000);
        for (i, &(k, s)) in trace.iter().enumerate() {
            shard.access(k, s);
            assert_segment_books(&shard, 8, &format!("{policy:?}, request {i}"));
        }
        assert!(shard.compactions() > 10, "{policy:?}");
        assert!(shard.copied_bytes() > 0, "{policy:?}");
        // Same mean entry count on both arenas: hit ratios within 0.03.
        let entry = Config::new(policy, 1_000);
        let a = replay(entry, trace.iter().copied());
        let target = a.mean_items.round() as u64;
        let limit = limit_for_mean(c, target, &trace);
        let mut seg = c;
        seg.max_items = limit;
        seg.capacity_bytes = limit;
        let b = replay(seg, trace.iter().copied());
        // Measured (a scan-heavy trace, low ratios): SIEVE 0.066 on
        // entries, 0.027 on segments (whole groups of a scan's keys go at
        // once, and its mean is 3.5% lower: the calibration moves by
        // segments); the ghost-adaptive W-TinyLFU 0.031 / 0.037.
        assert!((b.mean_items - a.mean_items).abs() < 0.05 * a.mean_items, "{a:?} vs {b:?}");
        eprintln!("{policy:?}: entries {a:?}, segments {b:?}");
        let gap = (a.hit_ratio() - b.hit_ratio()).abs();
        assert!(gap < 0.05, "{policy:?}: entries {a:?} vs segments {b:?}");
    }
}

/// A merge with no holes to reclaim and no policy choice left still
/// frees a segment: an entry larger than a segment is refused, nothing
/// else changes.
#[test]
fn segments_refuse_an_entry_larger_than_a_segment() {
    for policy in [Policy::Sieve, Policy::WTinyLfuGhost] {
        let mut c = Config::new(policy, 800);
        c.segments = 8;
        let mut shard = ArenaShard::new(c, 800, 800);
        for k in 0..2_000u64 {
            shard.access(k % 900, 1);
        }
        let before = shard.len();
        assert!(!shard.access(1 << 40, 101));
        assert_eq!(shard.len(), before);
        assert!(!shard.contains(1 << 40));
    }
}

#[test]
fn batched_policies_stay_close_to_their_single_eviction_form() {
    // The engine frees 10% at a time: victims are chosen a little early,
    // which costs a little hit ratio but must not change the policy's
    // character.
    for policy in [Policy::Sieve, Policy::WTinyLfu, Policy::WTinyLfuGhost] {
        for seed in 1..=2u64 {
            let cap = 400 + seed * 50;
            let trace = unit(&random_trace(seed * 31, 12_000, cap * 3));
            let single = replay(batch_of_one(policy, cap), trace.iter().copied());
            let batched = replay(Config::new(policy, cap), trace.iter().copied());
            let gap = single.hit_ratio() - batched.hit_ratio();
            assert!(gap.abs() < 0.03, "{policy:?} seed {seed}: {single:?} vs {batched:?}");
        }
    }
}

#[test]
fn the_sawtooth_averages_between_ninety_percent_and_the_limit() {
    let trace = unit(&random_trace(7, 20_000, 3_000));
    for policy in Policy::ALL {
        let o = replay(Config::new(policy, 1_000), trace.iter().copied());
        assert!(o.compactions > 10, "{policy:?}");
        assert!(o.mean_items > 900.0 && o.mean_items <= 1_000.0, "{policy:?}: {o:?}");
    }
}

#[test]
fn limit_for_mean_finds_the_limit_holding_the_mean() {
    let trace = unit(&random_trace(9, 50_000, 4_000));
    let cfg = Config::new(Policy::Sieve, 1_000);
    let limit = limit_for_mean(cfg, 1_000, &trace);
    assert!(limit > 1_000 && limit < 1_120, "{limit}");
    let mut c = cfg;
    c.max_items = limit;
    c.capacity_bytes = limit;
    let o = replay(c, trace.iter().copied());
    assert!((o.mean_items - 1_000.0).abs() < 15.0, "{o:?}");
}

/// A loop over more keys than the cache holds: recency evicts every key
/// just before its reuse; the frequency policies keep a fixed part.
#[test]
fn a_loop_larger_than_the_cache() {
    let trace = looped_trace(60_000, 1_250);
    let ratio = |p| replay(Config::new(p, 1_000), trace.iter().copied()).hit_ratio();
    let sieve = ratio(Policy::Sieve);
    assert!(sieve < 0.05, "{sieve}");
    for p in [Policy::WTinyLfu, Policy::WTinyLfuRecency] {
        let r = ratio(p);
        assert!(r > 0.65, "{p:?}: {r}");
    }
}

/// Skewed popularity with scans: every candidate stays at or above an
/// exact LRU of the same mean entry count.
#[test]
fn skewed_traces_never_fall_below_lru() {
    for seed in [101u64] {
        let trace = random_trace(seed, 30_000, 5_000);
        let mut lru = RefLru::new(1_000);
        let lru_hits = trace.iter().filter(|&&k| lru.access(k)).count() as f64;
        let lru_ratio = lru_hits / trace.len() as f64;
        let reqs = unit(&trace);
        // The limit holding a mean of 1,000 (found with SIEVE: every policy
        // fills to the limit and frees the same share).
        let limit = limit_for_mean(Config::new(Policy::Sieve, 1_000), 1_000, &reqs);
        for policy in Policy::ALL {
            let mut c = Config::new(policy, 1_000);
            c.max_items = limit;
            c.capacity_bytes = limit;
            let r = replay(c, reqs.iter().copied()).hit_ratio();
            assert!(r >= lru_ratio - 0.005, "{policy:?} seed {seed}: {r} < LRU {lru_ratio}");
        }
    }
}

#[test]
fn sizes_count_against_the_arena() {
    // Entries of 10 bytes in a 1,000-byte arena: at most 100 held.
    let mut cfg = Config::new(Policy::WTinyLfu, 1_000);
    cfg.max_items = 1_000;
    let mut m = ShardedModel::new(cfg);
    for k in 0..5_000u64 {
        m.access(k, 10);
        assert!(m.len() <= 100);
    }
    // An entry larger than the arena is refused, nothing else changes.
    let before = m.len();
    assert!(!m.access(1 << 50, 2_000));
    assert_eq!(m.len(), before);
}

#[test]
fn shards_split_the_capacity() {
    let mut cfg = Config::new(Policy::Sieve, 4_000);
    cfg.shards = 4;
    let m = ShardedModel::new(cfg);
    assert_eq!(m.shards.len(), 4);
    assert!(m.shards.iter().all(|s| s.max_items == 1_000));
    let trace = unit(&random_trace(3, 40_000, 16_000));
    let o = replay(cfg, trace);
    assert!(o.mean_items <= 4_000.0 && o.mean_items > 3_500.0, "{o:?}");
}

#[test]
fn names_round_trip() {
    for p in Policy::ALL {
        assert_eq!(Policy::from_name(p.name()), Some(p));
    }
    assert_eq!(Policy::from_name("lru"), None);
}

#[test]
fn a_conveyor_order_cleaner_keeps_its_books_and_loses_the_loop() {
    // The cleaner in the order the engine's conveyor cleans (a segment of
    // holes alone at once, else the fewest segments from the cursor):
    // the books balance after every request, and a loop larger than the
    // cache, which the greedy cleaner keeps, is lost: with no holes near
    // the cursor the policy must evict main entries to free a segment.
    let trace = unit(&random_trace(22, 20_000, 4_000));
    let mut c = Config::new(Policy::WTinyLfuGhost, 1_000);
    c.segments = 8;
    c.segment_fifo = true;
    let mut shard = ArenaShard::new(c, 1_000, 1_000);
    for (i, &(k, s)) in trace.iter().enumerate() {
        shard.access(k, s);
        assert_segment_books(&shard, 8, &format!("request {i}"));
        assert!(shard.seg_hand < shard.seg_used.len().max(1), "request {i}");
    }
    let lp = unit(&(0..40).flat_map(|_| 0..1_000u64).collect::<Vec<_>>());
    let mut greedy = Config::new(Policy::WTinyLfuGhost, 800);
    greedy.segments = 8;
    let mut fifo = greedy;
    fifo.segment_fifo = true;
    let (g, f) = (replay(greedy, lp.iter().copied()), replay(fifo, lp.iter().copied()));
    eprintln!("loop of 1,000 in 800: greedy cleaner {g:?}, conveyor order {f:?}");
    assert!(g.hit_ratio() > 0.5, "{g:?}");
    assert!(f.hit_ratio() < g.hit_ratio() - 0.1, "{f:?} vs {g:?}");
}

/// Two conveyors (`Config::queues`): the books after a request. Every key
/// in the index points at a live entry of that key; the live entries are
/// the shard's items and their sizes its live bytes, within the arena and
/// the index limit, the window's likewise; no window entry lies behind
/// the window hand (it takes the window's oldest); both hands are within
/// the vector, whose dead copies `tidy` keeps below the live entries.
fn assert_queue_books(shard: &ArenaShard, at: &str) {
    for (&k, &i) in &shard.index {
        let e = shard.arena[i];
        assert!(e.key == k && !e.evicted, "{at}: key {k} -> {e:?}");
    }
    let live = || shard.arena.iter().filter(|e| !e.evicted);
    assert_eq!(live().count() as u64, shard.items, "{at}");
    assert_eq!(shard.index.len() as u64, shard.items, "{at}");
    assert_eq!(live().map(|e| e.size).sum::<u64>(), shard.bytes, "{at}");
    assert_eq!(live().filter(|e| e.small).count() as u64, shard.small_items, "{at}");
    assert_eq!(live().filter(|e| e.small).map(|e| e.size).sum::<u64>(), shard.small_bytes, "{at}");
    assert!(shard.bytes <= shard.cap_bytes && shard.items <= shard.max_items, "{at}");
    assert!(shard.hand <= shard.arena.len() && shard.small_hand <= shard.arena.len(), "{at}");
    assert!(shard.arena[..shard.small_hand].iter().all(|e| e.evicted || !e.small), "{at}");
    assert!(shard.arena.len() as u64 <= 2 * shard.items + 65, "{at}: {}", shard.arena.len());
}

#[test]
fn two_conveyors_keep_their_books() {
    for (seed, policy) in
        [(31u64, Policy::WTinyLfuGhost), (32, Policy::WTinyLfuGhost), (33, Policy::WTinyLfu)]
    {
        // Sizes of 1 to 8 bytes in 2,400 bytes and at most 600 entries:
        // either limit binds at times.
        let mut rng = Rng(seed);
        let mut trace = random_trace(seed, 15_000, 2_000);
        trace.extend(shifting_trace(seed, 15_000, 1_500));
        let mut c = Config::new(policy, 600);
        c.queues = true;
        let mut shard = ArenaShard::new(c, 2_400, 600);
        for (i, &k) in trace.iter().enumerate() {
            let size = 1 + (key_hash(k ^ seed) % 8) * (rng.below(4) > 0) as u64;
            shard.access(k, size);
            assert_queue_books(&shard, &format!("{policy:?} seed {seed}, request {i}"));
        }
        assert!(shard.compactions() > 1_000, "{policy:?}: {}", shard.compactions());
        assert!(shard.tidied > 10, "{policy:?}: tidied {}", shard.tidied);
        assert!(shard.seg_moved > 0 && shard.seg_copied > 0, "{policy:?}");
    }
}

/// The main part's order was already promotion order on the arena (the
/// window hand takes the window's oldest entry, so promotions come in
/// arena order): copying a winner to the main part's newest end changes
/// no decision. The two conveyors make exactly the choices of the
/// entry-granular arena freeing one entry at a time, sizes included.
#[test]
fn two_conveyors_make_the_single_eviction_choices() {
    for seed in 1..=4u64 {
        let (cap, trace) = adaptive_trace(seed);
        let mut queued = batch_of_one(Policy::WTinyLfuGhost, cap);
        queued.queues = true;
        let bytes = cap * 3;
        let mut a = ArenaShard::new(batch_of_one(Policy::WTinyLfuGhost, cap), bytes, cap);
        let mut b = ArenaShard::new(queued, bytes, cap);
        for (i, &k) in trace.iter().enumerate() {
            let size = 1 + key_hash(k) % 5;
            assert_eq!(a.access(k, size), b.access(k, size), "seed {seed}, request {i}");
            assert_eq!(a.window_share(), b.window_share(), "seed {seed}, request {i}");
        }
        assert_eq!((a.len(), a.bytes), (b.len(), b.bytes), "seed {seed}");
        assert!(b.tidied > 0, "seed {seed}");
    }
}

/// On a Zipf-like trace with loops, the two conveyors stay within 0.03 of
/// the entry-granular `wtinylfu-ghost` with single evictions (the same
/// mean count: both hold the limit), and far above LRU on the loops.
#[test]
fn two_conveyors_hit_as_the_entry_granular_arena() {
    let mut rng = Rng(77);
    let mut trace = Vec::new();
    while trace.len() < 200_000 {
        if rng.below(3) == 0 {
            // five cycles of a loop over 1,300 keys, more than the cache holds
            for _ in 0..5 {
                trace.extend(100_000..101_300u64);
            }
        } else {
            for _ in 0..5_000 {
                let u = rng.below(1 << 16);
                trace.push(u * u * 5_000 / (1 << 32));
            }
        }
    }
    let reqs = unit(&trace);
    let single = replay(batch_of_one(Policy::WTinyLfuGhost, 1_000), reqs.iter().copied());
    let mut c = Config::new(Policy::WTinyLfuGhost, 1_000);
    c.queues = true;
    let queued = replay(c, reqs.iter().copied());
    let mut lru = RefLru::new(1_000);
    let lru_ratio = trace.iter().filter(|&&k| lru.access(k)).count() as f64 / trace.len() as f64;
    eprintln!("single evictions {single:?}, two conveyors {queued:?}, LRU {lru_ratio}");
    assert!((queued.mean_items - single.mean_items).abs() < 5.0, "{single:?} vs {queued:?}");
    let gap = queued.hit_ratio() - single.hit_ratio();
    assert!(gap.abs() < 0.03, "{single:?} vs {queued:?}");
    assert!(queued.hit_ratio() > lru_ratio + 0.05, "{queued:?} vs LRU {lru_ratio}");
    assert!(queued.copied_bytes > 0, "{queued:?}");
}

#[test]
fn a_ghost_floor_counts_window_ghost_hits_within_its_share() {
    // A key the window evicted 100 insertions ago: beyond twice a window
    // of 10 entries, within a quarter of a 1,000-entry cache.
    for (floor, grows) in [(0.0, false), (0.25, true), (0.05, false)] {
        let mut cfg = Config::new(Policy::WTinyLfuGhost, 1000);
        cfg.ghost_age_floor = floor;
        let mut s = ArenaShard::new(cfg, 1000, 1000);
        let before = s.win_target;
        s.window_ghost.push_at(Ghost::fingerprint(key_hash(7)), 0);
        s.inserts = 100;
        s.follow_ghosts(key_hash(7));
        assert_eq!(s.win_target > before, grows, "floor {floor}");
    }
}

/// The lenient admission holds a loop larger than the cache as the fixed
/// window does (the loop's keys come back too late to loosen it), and on a
/// shifting working set its ghosts do loosen it. That does not buy the
/// hit ratio back (measured: lenient 0.385, fixed window 0.414, SIEVE
/// 0.460, lenience up to 0.80). Round six found why: a promoted candidate's
/// hit counter was cleared, so even fully lenient it was SIEVE with its
/// newest hits forgotten (`switch_modes_cover_shifts_and_loops`).
#[test]
fn lenient_admission_holds_loops_and_loosens_on_shifts() {
    let ratio = |p: Policy, trace: &[(u64, u64)]| {
        let mut c = Config::new(p, 1_000);
        c.free_percent = 2;
        replay(c, trace.iter().copied()).hit_ratio()
    };
    let looped = looped_trace(60_000, 1_250);
    let r = ratio(Policy::WTinyLfuLenient, &looped);
    assert!(r > 0.65, "loop: {r}");
    let shift = unit(&shifting_trace(5, 60_000, 2_000));
    let lenient = ratio(Policy::WTinyLfuLenient, &shift);
    let fixed = ratio(Policy::WTinyLfuMargin, &shift);
    let sieve = ratio(Policy::Sieve, &shift);
    eprintln!("shifting: lenient {lenient}, fixed window {fixed}, SIEVE {sieve}");
    let mut shard = ArenaShard::new(Config::new(Policy::WTinyLfuLenient, 1_000), 1_000, 1_000);
    let mut most: f64 = 0.0;
    for &(k, s) in &shift {
        shard.access(k, s);
        most = most.max(shard.lenience);
    }
    eprintln!("largest lenience {most}");
    assert!(most > 0.5, "the ghosts never loosened the admission ({most})");
    assert!(lenient < sieve, "lenient {lenient} reached SIEVE {sieve}: update the study");
}

/// A promoted window candidate that loses its hit counter is not spared by
/// the main hand, where SIEVE spares a new entry hit before its hand comes
/// round: that, not the window, is what kept the lenient admission below
/// SIEVE on shifting working sets. With the counter kept, every candidate
/// admitted (`Switch::Lenient`) is at SIEVE's level or above there, and
/// the duel alone (`Switch::Strict`) keeps a loop larger than the cache:
/// the two modes of `WTinyLfuSwitch` cover both, and what the study leaves
/// open is choosing between them.
#[test]
fn switch_modes_cover_shifts_and_loops() {
    let ratio = |sw: Switch, keep: bool, trace: &[(u64, u64)]| {
        let mut c = Config::new(Policy::WTinyLfuSwitch, 1_000);
        c.free_percent = 2;
        c.switch = sw;
        c.keep_window_hits = keep;
        replay(c, trace.iter().copied()).hit_ratio()
    };
    let shift = unit(&shifting_trace(5, 60_000, 2_000));
    let mut sieve = Config::new(Policy::Sieve, 1_000);
    sieve.free_percent = 2;
    let sieve = replay(sieve, shift.iter().copied()).hit_ratio();
    let kept = ratio(Switch::Lenient, true, &shift);
    let cleared = ratio(Switch::Lenient, false, &shift);
    eprintln!("shifting: SIEVE {sieve}, lenient with counters kept {kept}, cleared {cleared}");
    assert!(kept >= sieve - 0.005, "lenient {kept} below SIEVE {sieve}");
    assert!(cleared < kept, "clearing the counters cost nothing ({cleared} vs {kept})");
    let looped = looped_trace(60_000, 1_250);
    let strict = ratio(Switch::Strict, true, &looped);
    let lenient = ratio(Switch::Lenient, true, &looped);
    eprintln!("loop: strict {strict}, lenient {lenient}");
    assert!(strict > 0.65, "strict lost the loop: {strict}");
    assert!(lenient < 0.05, "lenient kept the loop: {lenient}");
}

/// Miniature simulation chooses the mode: replayed through two shards 32
/// times smaller (a 32nd of the keys), the strict one keeps its part of a
/// loop and the lenient one follows a shifting working set, and the shard
/// takes the mode of the one with more hits. On each trace it does as well
/// as the better of the two modes pinned.
#[test]
fn miniature_simulation_picks_the_better_mode() {
    let ratio = |sw: Switch, trace: &[(u64, u64)]| {
        let mut c = Config::new(Policy::WTinyLfuSwitch, 4_000);
        c.queues = true;
        c.switch = sw;
        replay(c, trace.iter().copied()).hit_ratio()
    };
    let looped = looped_trace(200_000, 5_000);
    let shift = unit(&shifting_trace(5, 200_000, 8_000));
    for (name, trace) in [("loop", &looped), ("shifting", &shift)] {
        let strict = ratio(Switch::Strict, trace);
        let lenient = ratio(Switch::Lenient, trace);
        let mini = ratio(Switch::Mini, trace);
        eprintln!("{name}: strict {strict}, lenient {lenient}, mini {mini}");
        let better = strict.max(lenient);
        assert!(mini > better - 0.01, "{name}: mini {mini}, the better mode {better}");
        assert!((strict - lenient).abs() > 0.03, "{name}: the modes do not differ");
    }
}

/// The window as the engine's head segment would hold it
/// (`Config::head_window`): 4% of the entries, judged when full, its older
/// half at a time. Pinned strict it keeps a loop larger than the cache at
/// least as well as the FIFO window one candidate at a time, and with the
/// miniatures choosing it does as well as the better mode on a loop and
/// on a shifting working set.
#[test]
fn head_window_keeps_loops_and_follows_shifts() {
    let ratio = |sw: Switch, head: bool, trace: &[(u64, u64)]| {
        let mut c = Config::new(Policy::WTinyLfuSwitch, 4_000);
        c.queues = true;
        c.window_percent = 4;
        c.head_window = head;
        c.switch = sw;
        replay(c, trace.iter().copied()).hit_ratio()
    };
    let looped = looped_trace(200_000, 5_000);
    let fifo = ratio(Switch::Strict, false, &looped);
    let head = ratio(Switch::Strict, true, &looped);
    eprintln!("loop, strict: FIFO window {fifo}, head window {head}");
    assert!(head > fifo - 0.01, "the head window lost the loop: {head} against {fifo}");
    let shift = unit(&shifting_trace(5, 200_000, 8_000));
    for (name, trace) in [("loop", &looped), ("shifting", &shift)] {
        let strict = ratio(Switch::Strict, true, trace);
        let lenient = ratio(Switch::Lenient, true, trace);
        let mini = ratio(Switch::Mini, true, trace);
        eprintln!("{name}, head window: strict {strict}, lenient {lenient}, mini {mini}");
        let better = strict.max(lenient);
        assert!(mini > better - 0.01, "{name}: mini {mini}, the better mode {better}");
    }
}

/// Miniatures that learn a sampled key's hits only through the shard's hit
/// counters (`Config::mini_counted_hits`: a miss at once, hits when the
/// main hand clears the counter, at most three) still choose the strict
/// mode on a loop, where a hit-less lenient miniature has nothing to count.
#[test]
fn miniatures_fed_by_the_counters_keep_a_loop() {
    let mut c = Config::new(Policy::WTinyLfuSwitch, 4_000);
    c.queues = true;
    c.window_percent = 4;
    c.head_window = true;
    c.mini_counted_hits = true;
    let looped = looped_trace(200_000, 5_000);
    let counted = replay(c, looped.iter().copied()).hit_ratio();
    c.switch = Switch::Strict;
    let strict = replay(c, looped.iter().copied()).hit_ratio();
    eprintln!("loop: strict {strict}, miniatures fed by the counters {counted}");
    assert!(counted > strict - 0.01, "{counted} against strict {strict}");
}
