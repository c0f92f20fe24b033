//! Eviction policies as they would run in a shard, simulated.
//!
//! This module is a model, not yet the engine: it replays key sequences
//! through one or more shard-shaped caches and counts hits, so candidate
//! policies can be compared with each other and with libCacheSim's on the
//! same traces before one goes into `shard.rs` (the study and its figures
//! are in `docs/design/engine.md`, "Eviction: the policy study"). What it
//! keeps of the engine's shape, because hit ratios depend on it:
//!
//! * An append-only arena per shard: a miss appends the entry at the end,
//!   nothing is freed in place. When the arena (bytes) or the index (live
//!   entries, three quarters of the slots) is full, one compaction frees
//!   `free_percent` of both (10% in the engine, `COMPACT_FREE_PERCENT`),
//!   choosing victims in arena order from a hand that wraps around, and the
//!   survivors keep their order. Evictions are batched, as in the engine.
//! * Per entry, only what fits the slot word: a saturating hit counter of
//!   `counter_max` (1 = today's visited bit; 3 = two bits, one taken from
//!   the 31-bit tag) and, for the two-queue policies, a queue bit written
//!   only under the lock. A hit raises the counter and does nothing else:
//!   reads write no shared state but that counter, and only when it
//!   changes (so a hot entry stops writing once it saturates).
//! * Per shard, under the lock and bounded: the hands (arena offsets), a
//!   ghost ring of fingerprints ([`ghost`]) and a count-min sketch
//!   ([`sketch`]). The sketch learns a key when it misses (the set takes
//!   the lock anyway) and learns hits through the entries' counters, which
//!   a compaction adds to the sketch as its hand clears them: no write per
//!   hit beyond the counter, no per-process buffer to drain.
//!
//! Policies ([`Policy`]):
//!
//! * `Sieve`: the engine today. The hand clears visited entries and evicts
//!   unvisited ones.
//! * `S3Fifo`: small (10% of the bytes) and main queues on one arena, told
//!   apart by the queue bit; each has its own hand. A new key enters small
//!   unless its fingerprint is in the ghost (then main). The small hand
//!   promotes an entry hit since insertion to main (in place: no copy) and
//!   evicts the others into the ghost; the main hand decrements counters
//!   and evicts entries at zero.
//! * `S3FifoOneHand`: the same queues and ghost, walked by one hand (SIEVE
//!   with ghost-based admission: new keys are on probation until hit).
//! * `WTinyLfu`: a window (`window_percent` of the bytes, default 1%) of
//!   new entries in front of a SIEVE main. When the window is over its
//!   share, its oldest entry (the candidate) meets the next entry the main
//!   hand would evict (the victim): the candidate is promoted and the
//!   victim evicted if the sketch counts the candidate more often,
//!   otherwise the candidate goes. Ties keep the resident, which is what
//!   holds a loop larger than the cache.
//! * `WTinyLfuExact`: the same with every hit counted in the sketch (a
//!   shared write per hit, which the engine cannot afford): the ceiling of
//!   what the counter-based feed loses.

pub mod ghost;
pub mod sketch;

use ghost::Ghost;
use sketch::Sketch;
use std::collections::HashMap;

/// A candidate eviction policy (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// Batched SIEVE, the engine today.
    Sieve,
    /// S3-FIFO: small and main queues with two hands, a ghost of fingerprints.
    S3Fifo,
    /// S3-FIFO's queues and ghost walked by one hand.
    S3FifoOneHand,
    /// Window TinyLFU: a window, a SIEVE main, sketch admission fed by the slot counters.
    WTinyLfu,
    /// Window TinyLFU with every hit counted in the sketch (the ideal feed).
    WTinyLfuExact,
    /// Window TinyLFU whose window size climbs toward the better hit ratio.
    WTinyLfuAdaptive,
    /// Window TinyLFU where a candidate hit while in the window is promoted
    /// without a duel (S3-FIFO's rule for its small queue); only the
    /// candidates never hit meet the sketch.
    WTinyLfuRecency,
}

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 7] = [
        Policy::Sieve,
        Policy::S3Fifo,
        Policy::S3FifoOneHand,
        Policy::WTinyLfu,
        Policy::WTinyLfuExact,
        Policy::WTinyLfuAdaptive,
        Policy::WTinyLfuRecency,
    ];

    /// The policy's name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Sieve => "sieve-batched",
            Policy::S3Fifo => "s3fifo-arena",
            Policy::S3FifoOneHand => "s3fifo-one-hand",
            Policy::WTinyLfu => "wtinylfu-arena",
            Policy::WTinyLfuExact => "wtinylfu-exact-feed",
            Policy::WTinyLfuAdaptive => "wtinylfu-adaptive",
            Policy::WTinyLfuRecency => "wtinylfu-recency",
        }
    }

    /// The policy called `name` (as [`Policy::name`] spells it).
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    fn uses_ghost(self) -> bool {
        matches!(self, Policy::S3Fifo | Policy::S3FifoOneHand)
    }

    fn uses_sketch(self) -> bool {
        matches!(
            self,
            Policy::WTinyLfu
                | Policy::WTinyLfuExact
                | Policy::WTinyLfuAdaptive
                | Policy::WTinyLfuRecency
        )
    }

    /// Whether the hit counters are the sketch's only feed of hits.
    fn counter_feed(self) -> bool {
        matches!(self, Policy::WTinyLfu | Policy::WTinyLfuAdaptive | Policy::WTinyLfuRecency)
    }
}

/// The shape of one simulated cache.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    /// The policy.
    pub policy: Policy,
    /// Arena bytes of the whole cache (split evenly over the shards).
    pub capacity_bytes: u64,
    /// Most live entries of the whole cache (the index's load limit).
    pub max_items: u64,
    /// Shards (keys are spread by hash, each shard evicts on its own).
    pub shards: usize,
    /// Percent of a shard a compaction frees (the engine's 10).
    pub free_percent: u64,
    /// Largest value of the per-entry hit counter (1: a visited bit).
    pub counter_max: u8,
    /// S3-FIFO's small queue, percent of the bytes.
    pub small_percent: u64,
    /// W-TinyLFU's window, percent of the bytes.
    pub window_percent: u64,
    /// Sketch counters per entry in each of its four rows.
    pub sketch_counters_per_entry: f64,
    /// The sketch halves its counters every `sketch_aging` x entries additions.
    pub sketch_aging: u64,
}

impl Config {
    /// The defaults of `policy` for a cache of `entries` unit-size entries.
    pub fn new(policy: Policy, entries: u64) -> Config {
        Config {
            policy,
            capacity_bytes: entries,
            max_items: entries,
            shards: 1,
            free_percent: 10,
            counter_max: if policy == Policy::Sieve { 1 } else { 3 },
            small_percent: 10,
            window_percent: 1,
            sketch_counters_per_entry: 1.0,
            sketch_aging: 10,
        }
    }
}

/// What a replay counted.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Outcome {
    /// Requests replayed.
    pub requests: u64,
    /// Requests that hit.
    pub hits: u64,
    /// Bytes requested and bytes that hit.
    pub bytes: u64,
    /// Bytes of the requests that hit.
    pub hit_bytes: u64,
    /// Mean live entries over the requests after the first compaction
    /// (the steady state; the whole replay if nothing was evicted).
    pub mean_items: f64,
    /// Compactions, over all shards.
    pub compactions: u64,
}

impl Outcome {
    /// Hits over requests (0 for an empty replay).
    pub fn hit_ratio(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.hits as f64 / self.requests as f64
        }
    }
}

/// One entry of the arena: what the slot word and the entry header carry.
#[derive(Clone, Copy, Debug)]
struct Ent {
    key: u64,
    hash: u64,
    size: u64,
    /// The slot's hit counter (the visited bit when `counter_max` is 1).
    freq: u8,
    /// The slot's queue bit: small (S3-FIFO) or window (W-TinyLFU).
    small: bool,
    /// Chosen for eviction by the compaction under way.
    evicted: bool,
}

/// One shard-shaped cache (see the module docs).
#[derive(Clone, Debug)]
pub struct ArenaShard {
    cfg: Config,
    cap_bytes: u64,
    max_items: u64,
    arena: Vec<Ent>,
    index: HashMap<u64, usize>,
    bytes: u64,
    items: u64,
    small_bytes: u64,
    small_items: u64,
    hand: usize,
    small_hand: usize,
    ghost: Ghost,
    sketch: Sketch,
    compactions: u64,
    /// Bytes and entries the compaction under way leaves at most.
    after_bytes: u64,
    after_items: u64,
    /// The adaptive window: its share in hundredths of a percent, and the
    /// hill climber's state (requests and hits of the sample under way,
    /// the previous sample's hit ratio, the step, signed).
    window_bp: i64,
    climb_requests: u64,
    climb_hits: u64,
    climb_prev: f64,
    climb_step: i64,
}

/// The 64-bit hash of a key id (splitmix64): what the engine's xxh3 gives.
pub fn key_hash(key: u64) -> u64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl ArenaShard {
    /// A shard of `cap_bytes` arena bytes and at most `max_items` entries.
    pub fn new(cfg: Config, cap_bytes: u64, max_items: u64) -> ArenaShard {
        let max_items = max_items.max(1);
        let ghost_len = if cfg.policy.uses_ghost() {
            (max_items * (100 - cfg.small_percent) / 100) as usize
        } else {
            1
        };
        let sketch_entries = if cfg.policy.uses_sketch() { max_items as usize } else { 1 };
        ArenaShard {
            cfg,
            cap_bytes: cap_bytes.max(1),
            max_items,
            arena: Vec::new(),
            index: HashMap::new(),
            bytes: 0,
            items: 0,
            small_bytes: 0,
            small_items: 0,
            hand: 0,
            small_hand: 0,
            ghost: Ghost::new(ghost_len),
            sketch: Sketch::with_aging(
                sketch_entries,
                cfg.sketch_counters_per_entry,
                cfg.sketch_aging,
            ),
            compactions: 0,
            after_bytes: 0,
            after_items: 0,
            window_bp: cfg.window_percent as i64 * 100,
            climb_requests: 0,
            climb_hits: 0,
            climb_prev: -1.0,
            climb_step: 625,
        }
    }

    /// Live entries.
    pub fn len(&self) -> u64 {
        self.items
    }

    /// Whether the shard holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items == 0
    }

    /// Whether `key` is held.
    pub fn contains(&self, key: u64) -> bool {
        self.index.contains_key(&key)
    }

    /// Compactions so far.
    pub fn compactions(&self) -> u64 {
        self.compactions
    }

    /// Bytes of the bounded per-shard structures (ghost ring, sketch).
    pub fn policy_bytes(&self) -> usize {
        (if self.cfg.policy.uses_ghost() { self.ghost.bytes() } else { 0 })
            + (if self.cfg.policy.uses_sketch() { self.sketch.bytes() } else { 0 })
    }

    /// A cache-aside request: a get, and a set of `size` bytes on a miss.
    /// True on a hit.
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        let hit = self.lookup(key, size);
        if self.cfg.policy == Policy::WTinyLfuAdaptive {
            self.climb(hit);
        }
        hit
    }

    /// Caffeine's hill climber, per shard and under the lock: every sample
    /// of `CLIMB_SAMPLE` x the entry limit requests, move the window by the step (6.25%
    /// of the cache at first, shrinking 2% a sample) in the direction that
    /// last raised the hit ratio, reversing when it fell; a jump of the hit
    /// ratio by more than 5 points restarts with the full step. The window
    /// stays between 1% and 80%. The counts are the shard's own (misses are
    /// seen under the lock; hits through the per-CPU hit counters the
    /// engine already keeps).
    fn climb(&mut self, hit: bool) {
        self.climb_requests += 1;
        self.climb_hits += hit as u64;
        if self.climb_requests < CLIMB_SAMPLE * self.max_items {
            return;
        }
        let ratio = self.climb_hits as f64 / self.climb_requests as f64;
        self.climb_requests = 0;
        self.climb_hits = 0;
        if self.climb_prev >= 0.0 {
            let delta = ratio - self.climb_prev;
            if delta < 0.0 {
                self.climb_step = -self.climb_step;
            }
            if delta.abs() > 0.05 {
                self.climb_step = 625 * self.climb_step.signum();
            } else {
                self.climb_step = self.climb_step * 98 / 100;
            }
        }
        self.climb_prev = ratio;
        self.window_bp = (self.window_bp + self.climb_step).clamp(100, 8_000);
    }

    fn lookup(&mut self, key: u64, size: u64) -> bool {
        let hash = key_hash(key);
        if let Some(&i) = self.index.get(&key) {
            let max = self.cfg.counter_max;
            let e = &mut self.arena[i];
            if e.freq < max {
                e.freq += 1;
            }
            if self.cfg.policy == Policy::WTinyLfuExact {
                self.sketch.add(hash, 1);
            }
            return true;
        }
        if self.cfg.policy.uses_sketch() {
            self.sketch.add(hash, 1);
        }
        self.insert(key, hash, size);
        false
    }

    fn insert(&mut self, key: u64, hash: u64, size: u64) {
        if size > self.cap_bytes {
            return; // larger than the whole arena: refused, as the engine does
        }
        if self.bytes + size > self.cap_bytes || self.items + 1 > self.max_items {
            self.compact(size);
        }
        let small = match self.cfg.policy {
            Policy::Sieve => false,
            Policy::S3Fifo | Policy::S3FifoOneHand => {
                !self.ghost.contains(Ghost::fingerprint(hash))
            }
            Policy::WTinyLfu
            | Policy::WTinyLfuExact
            | Policy::WTinyLfuAdaptive
            | Policy::WTinyLfuRecency => true,
        };
        self.index.insert(key, self.arena.len());
        self.arena.push(Ent { key, hash, size, freq: 0, small, evicted: false });
        self.bytes += size;
        self.items += 1;
        if small {
            self.small_bytes += size;
            self.small_items += 1;
        }
    }

    /// Free `free_percent` of the arena and of the item limit (and at least
    /// `need` bytes), then drop the victims and slide the survivors down.
    fn compact(&mut self, need: u64) {
        self.compactions += 1;
        let free = (self.cap_bytes * self.cfg.free_percent / 100).max(need).max(1);
        let items_after =
            (self.max_items * (100 - self.cfg.free_percent) / 100).min(self.max_items - 1);
        self.after_bytes = self.cap_bytes - free.min(self.cap_bytes);
        self.after_items = items_after;
        while (self.cap_bytes - self.bytes < free || self.items > items_after) && self.items > 0 {
            self.evict_one();
        }
        // Slide the survivors down in order; the hands follow their entries.
        let mut before_hand = 0;
        let mut before_small = 0;
        let mut out = Vec::with_capacity(self.arena.len());
        for (i, e) in self.arena.iter().enumerate() {
            if e.evicted {
                continue;
            }
            if i < self.hand {
                before_hand += 1;
            }
            if i < self.small_hand {
                before_small += 1;
            }
            out.push(*e);
        }
        self.arena = out;
        self.hand = before_hand;
        self.small_hand = before_small;
        self.index.clear();
        for (i, e) in self.arena.iter().enumerate() {
            self.index.insert(e.key, i);
        }
    }

    fn drop_entry(&mut self, i: usize, to_ghost: bool) {
        let e = &mut self.arena[i];
        e.evicted = true;
        self.bytes -= e.size;
        self.items -= 1;
        if e.small {
            self.small_bytes -= e.size;
            self.small_items -= 1;
        }
        if to_ghost {
            let fp = Ghost::fingerprint(e.hash);
            self.ghost.push(fp);
        }
    }

    fn promote(&mut self, i: usize) {
        let e = &mut self.arena[i];
        e.small = false;
        self.small_bytes -= e.size;
        self.small_items -= 1;
    }

    /// The next live entry at or after `from` (wrapping) with `small`
    /// equal to `want` (any entry when `want` is None). None if there is none.
    fn next_from(&self, from: usize, want: Option<bool>) -> Option<usize> {
        let n = self.arena.len();
        if n == 0 {
            return None;
        }
        let start = if from >= n { 0 } else { from };
        let mut i = start;
        loop {
            let e = &self.arena[i];
            let wanted = match want {
                None => true,
                Some(s) => e.small == s,
            };
            if !e.evicted && wanted {
                return Some(i);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
            if i == start {
                return None;
            }
        }
    }

    /// Advance the main hand to the next entry it would evict (clearing
    /// counters on the way, as SIEVE clears visited bits) and return it.
    /// `decrement`: counters go down by one per pass (S3-FIFO's main) rather
    /// than to zero. `want`: which entries the hand walks.
    fn main_victim(&mut self, want: Option<bool>, decrement: bool) -> Option<usize> {
        // At most counter_max + 1 passes over the arena.
        let limit = (self.arena.len() + 1) * (self.cfg.counter_max as usize + 2);
        let mut i = self.hand;
        for _ in 0..limit {
            i = self.next_from(i, want)?;
            let e = &mut self.arena[i];
            if e.freq == 0 {
                self.hand = i;
                return Some(i);
            }
            if decrement {
                e.freq -= 1;
            } else {
                let n = e.freq;
                e.freq = 0;
                let h = e.hash;
                if self.cfg.policy.counter_feed() {
                    self.sketch.add(h, n);
                }
            }
            i += 1;
        }
        None
    }

    /// The window's next candidate. The fixed window is a FIFO: its oldest
    /// entry. The adaptive window, which may grow to most of the cache, is
    /// walked like SIEVE so that it approximates LRU as Caffeine's window
    /// does: an entry hit since the hand last passed is skipped (its count
    /// goes to the sketch) and stays in the window.
    fn window_candidate(&mut self) -> Option<usize> {
        let mut passes = 0;
        loop {
            let c = self.next_from(self.small_hand, Some(true))?;
            self.small_hand = c + 1;
            let e = self.arena[c];
            if self.cfg.policy != Policy::WTinyLfuAdaptive
                || e.freq == 0
                || passes > self.small_items
            {
                return Some(c);
            }
            passes += 1;
            self.arena[c].freq = 0;
            self.sketch.add(e.hash, e.freq);
        }
    }

    /// Choose one victim and mark it evicted.
    fn evict_one(&mut self) {
        match self.cfg.policy {
            Policy::Sieve => {
                if let Some(v) = self.main_victim(None, false) {
                    self.drop_entry(v, false);
                    self.hand = v + 1;
                }
            }
            Policy::S3FifoOneHand => {
                let limit = (self.arena.len() + 1) * (self.cfg.counter_max as usize + 2);
                let mut i = self.hand;
                for _ in 0..limit {
                    let Some(j) = self.next_from(i, None) else { return };
                    let e = self.arena[j];
                    if e.small {
                        if e.freq > 0 {
                            self.arena[j].freq = 0;
                            self.promote(j);
                        } else {
                            self.drop_entry(j, true);
                            self.hand = j + 1;
                            return;
                        }
                    } else if e.freq > 0 {
                        self.arena[j].freq -= 1;
                    } else {
                        self.drop_entry(j, false);
                        self.hand = j + 1;
                        return;
                    }
                    i = j + 1;
                }
            }
            Policy::S3Fifo => {
                let small_target = self.cap_bytes * self.cfg.small_percent / 100;
                if self.small_items > 0
                    && (self.small_bytes > small_target || self.small_items == self.items)
                {
                    // The small queue is FIFO: its oldest entry goes or moves to main.
                    while let Some(j) = self.next_from(self.small_hand, Some(true)) {
                        self.small_hand = j + 1;
                        if self.arena[j].freq > 0 {
                            self.arena[j].freq = 0;
                            self.promote(j);
                            if self.small_bytes <= small_target {
                                break;
                            }
                        } else {
                            self.drop_entry(j, true);
                            return;
                        }
                    }
                }
                if let Some(v) = self.main_victim(Some(false), true) {
                    self.drop_entry(v, false);
                    self.hand = v + 1;
                } else if let Some(j) = self.next_from(self.small_hand, Some(true)) {
                    self.drop_entry(j, true);
                    self.small_hand = j + 1;
                }
            }
            Policy::WTinyLfu
            | Policy::WTinyLfuExact
            | Policy::WTinyLfuAdaptive
            | Policy::WTinyLfuRecency => {
                let bp = self.window_bp as u64;
                let window = self.cap_bytes * bp / 10_000;
                let window_items = self.after_items * bp / 10_000;
                let main_items = self.items - self.small_items;
                let main_bytes = self.bytes - self.small_bytes;
                if self.small_items > 0 && (self.small_bytes > window || main_items == 0) {
                    let Some(c) = self.window_candidate() else { return };
                    let cand = self.arena[c];
                    // While the main queue has room for its share of what the
                    // compaction leaves, the window's oldest moves in freely
                    // (the cache is filling); after that, it must win its place.
                    if main_bytes + cand.size <= self.after_bytes.saturating_sub(window)
                        && main_items < self.after_items.saturating_sub(window_items)
                    {
                        self.promote(c);
                        return;
                    }
                    let Some(v) = self.main_victim(Some(false), false) else {
                        self.drop_entry(c, false);
                        return;
                    };
                    let feed = if self.cfg.policy.counter_feed() { cand.freq } else { 0 };
                    let fc = self.sketch.estimate(cand.hash).saturating_add(feed);
                    let fv = self.sketch.estimate(self.arena[v].hash);
                    if self.cfg.policy.counter_feed() {
                        self.sketch.add(cand.hash, cand.freq);
                    }
                    let hit_in_window = self.cfg.policy == Policy::WTinyLfuRecency && cand.freq > 0;
                    if fc > fv || hit_in_window {
                        self.drop_entry(v, false);
                        self.hand = v + 1;
                        self.arena[c].freq = 0;
                        self.promote(c);
                    } else {
                        self.drop_entry(c, false);
                    }
                } else if let Some(v) = self.main_victim(Some(false), false) {
                    self.drop_entry(v, false);
                    self.hand = v + 1;
                } else if let Some(c) = self.next_from(self.small_hand, Some(true)) {
                    self.drop_entry(c, false);
                    self.small_hand = c + 1;
                }
            }
        }
    }
}

/// Requests per hill-climbing sample, in multiples of the shard's entry
/// limit (Caffeine samples 10x; 2x follows shifting working sets faster).
const CLIMB_SAMPLE: u64 = 2;

/// A cache of `cfg.shards` shards, keys spread by hash.
#[derive(Clone, Debug)]
pub struct ShardedModel {
    shards: Vec<ArenaShard>,
}

impl ShardedModel {
    /// The cache `cfg` describes.
    pub fn new(cfg: Config) -> ShardedModel {
        let n = cfg.shards.max(1).next_power_of_two();
        let per_bytes = (cfg.capacity_bytes / n as u64).max(1);
        let per_items = (cfg.max_items / n as u64).max(1);
        ShardedModel {
            shards: (0..n).map(|_| ArenaShard::new(cfg, per_bytes, per_items)).collect(),
        }
    }

    fn shard(&mut self, key: u64) -> &mut ArenaShard {
        let n = self.shards.len();
        &mut self.shards[(key_hash(key) as usize) & (n - 1)]
    }

    /// A cache-aside request (see [`ArenaShard::access`]).
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        self.shard(key).access(key, size)
    }

    /// Live entries over all shards.
    pub fn len(&self) -> u64 {
        self.shards.iter().map(|s| s.len()).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Compactions over all shards.
    pub fn compactions(&self) -> u64 {
        self.shards.iter().map(|s| s.compactions()).sum()
    }

    /// Bytes of the policies' bounded structures over all shards.
    pub fn policy_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.policy_bytes()).sum()
    }
}

/// Replay `(key, size)` requests through a fresh cache of `cfg`.
pub fn replay(cfg: Config, requests: impl IntoIterator<Item = (u64, u64)>) -> Outcome {
    let mut cache = ShardedModel::new(cfg);
    let mut out = Outcome::default();
    let mut items_sum = 0u128;
    let mut counted = 0u64;
    let mut all_sum = 0u128;
    for (key, size) in requests {
        out.requests += 1;
        out.bytes += size;
        if cache.access(key, size) {
            out.hits += 1;
            out.hit_bytes += size;
        }
        let len = cache.len() as u128;
        all_sum += len;
        if cache.compactions() > 0 {
            items_sum += len;
            counted += 1;
        }
    }
    out.compactions = cache.compactions();
    out.mean_items = if counted > 0 {
        items_sum as f64 / counted as f64
    } else if out.requests > 0 {
        all_sum as f64 / out.requests as f64
    } else {
        0.0
    };
    out
}

/// The item limit (per-shard limits summed) whose steady-state mean
/// occupancy under `cfg.policy` is closest to `entries` on `requests`: the
/// engine's count is a sawtooth below its limit, so a cache compared with
/// an LRU of `entries` must hold that many on average, not at its peak.
/// Two rounds of proportional correction from `entries / (1 - f/2)`.
pub fn limit_for_mean(cfg: Config, entries: u64, requests: &[(u64, u64)]) -> u64 {
    let f = cfg.free_percent as f64 / 100.0;
    let mut limit = ((entries as f64) / (1.0 - f / 2.0)).round().max(1.0) as u64;
    for _ in 0..2 {
        let mut c = cfg;
        c.max_items = limit;
        c.capacity_bytes = limit.saturating_mul(cfg.capacity_bytes.max(1)) / cfg.max_items.max(1);
        let o = replay(c, requests.iter().copied());
        if o.compactions == 0 || o.mean_items <= 0.0 {
            break;
        }
        let next = ((limit as f64) * entries as f64 / o.mean_items).round().max(1.0) as u64;
        if next == limit {
            break;
        }
        limit = next;
    }
    limit
}

#[cfg(test)]
mod reference;

#[cfg(test)]
mod tests;
