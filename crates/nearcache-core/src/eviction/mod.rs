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
//! * `Sieve`: the engine's lenient admission. The hand clears visited
//!   entries and evicts unvisited ones; with `Config::young_share` (12 in
//!   the engine since round ten) it wraps round before the newest entries
//!   while the older ones hold a victim.
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
//! * `WTinyLfuAdaptive`, `WTinyLfuRecency`, `WTinyLfuTieBreak`: the window
//!   sized by Caffeine's hill climber; a candidate hit in the window
//!   promoted without a duel; a candidate hit in the window winning ties.
//! * `WTinyLfuAging`: the sketch halves sooner (down to every 1 x the
//!   entries additions) while the window's entries are hit more per entry
//!   than the main's, later (up to `sketch_aging`) otherwise.
//! * `WTinyLfuMargin`: a conservative-update sketch and a duel the
//!   candidate must win by more than one count: on a loop, count-min noise
//!   otherwise lets a quarter of the candidates win and turns the main over.
//! * `WTinyLfuGhost` (the chosen one): the margin duel, a window walked like
//!   CLOCK (a hit window entry is moved to the newest end, so a large window
//!   follows LRU), and a window share of 1-90% that follows two ghosts of
//!   fingerprints as ARC's target does: a key the window evicted (lost its
//!   duel) that misses again within twice the window's size in insertions
//!   grows the window by 4 entries (times ARC's ghost-length ratio); a key
//!   the main evicted that returns within twice the main's size shrinks
//!   it. The age limit is what keeps loops: a loop key comes back after a
//!   whole cycle, later than twice a small window. `WTinyLfuGhostAging`
//!   adds the adaptive aging.
//! * `S3FifoFullGhost`: S3-FIFO whose ghost is as long as the cache.
//! * `TinyLfuSieve` and `WTinyLfuOneHand`: W-TinyLFU with one hand, the
//!   shape of the engine's conveyor, which reads a segmented arena once
//!   from oldest to newest: a window entry is judged where it lies, when
//!   the hand reaches it, and a candidate duels the next unvisited main
//!   entry *ahead* of the hand (read, not cleared). `TinyLfuSieve` judges a
//!   new entry at the hand's first pass (a fixed 1% main share margin);
//!   `WTinyLfuOneHand` keeps window entries while the ghost-adaptive
//!   window is within its share and evicts main entries while the main
//!   part is over its own.
//! * `WTinyLfuLenient`: a fixed FIFO window (the head segment, in the
//!   engine) and the margin duel, whose admission adapts instead of the
//!   window: a losing candidate is admitted anyway when its hash falls
//!   under the shard's lenience (0 to 1), raised by window ghost hits and
//!   lowered by main ghost hits within the cache's entries in insertions.
//!   It needs no window conveyor, but fully lenient it is SIEVE, so it
//!   cannot follow LRU where the working set shifts.
//! * `WTinyLfuSwitch`: the fixed FIFO window and the margin duel, whose
//!   admission has two modes: strict (the duel decides) and lenient (every
//!   candidate admitted: SIEVE behind a FIFO window). `Config::switch`
//!   pins a mode or picks how the mode is chosen ([`Switch`]): a
//!   two-state climber that tries the other mode for one sample every few
//!   and keeps it if its hit ratio was higher; set dueling (DIP's,
//!   Qureshi et al., ISCA '07): a thirty-second of the keys, by hash, is
//!   always judged strictly, another always leniently, and the rest follow
//!   whichever of the two missed less lately; or, the default, miniature
//!   simulation (Waldspurger et al., ATC '17): a thirty-second of the keys
//!   replayed through a strict and a lenient shard 32 times smaller, the
//!   shard choosing its mode from their counts by the engine's own rule
//!   (`shard::policy`, `AdmissionChoice`).
//!
//! `Config::keep_window_hits`: a promoted window candidate keeps its hit
//! counter (so a window entry hit before its duel is spared once by the
//! main hand, as SIEVE spares a new entry hit before the hand reaches it);
//! by default the counter goes to the sketch and is cleared.
//! `Config::head_window` (`WTinyLfuSwitch` with `queues`): the window is
//! the head segment of the engine's shard, judged when full, its older
//! half at a time (`ArenaShard::judge_head`), room being made by the
//! main hand alone.
//!
//! The arena is entry-granular (a compaction frees `free_percent` and
//! slides the survivors down) or, with `Config::segments`, made of fixed
//! segments as the engine's shard is becoming (`segments.rs`). With
//! `Config::queues` the W-TinyLFU family runs as two conveyors of one
//! segment chain would run it (`queues.rs`): one eviction at a time, a
//! promoted candidate copied to the main part's newest end, no holes.

pub mod ghost;
mod queues;
mod segments;
pub mod sketch;

use crate::shard::{AdmissionChoice, MiniTally};
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
    /// S3-FIFO whose ghost remembers as many keys as the cache holds.
    S3FifoFullGhost,
    /// Window TinyLFU where a candidate hit while in the window wins a tie.
    WTinyLfuTieBreak,
    /// Window TinyLFU whose sketch ages faster while the window's entries
    /// are hit more often than the main's.
    WTinyLfuAging,
    /// Window TinyLFU whose window (walked like CLOCK, 1% to most of the
    /// cache) follows ghost hits as ARC's target does.
    WTinyLfuGhost,
    /// `WTinyLfuGhost` with the adaptive aging of `WTinyLfuAging`.
    WTinyLfuGhostAging,
    /// Window TinyLFU with a conservative-update sketch and a duel the
    /// candidate must win by more than one count.
    WTinyLfuMargin,
    /// W-TinyLFU walked by one hand (the engine's conveyor has one): a new
    /// entry is judged when the hand first reaches it; hit meanwhile, or
    /// while the main part has room for its share, it joins the main part,
    /// else it duels the next unvisited main entry ahead (see
    /// `evict_one_hand`).
    TinyLfuSieve,
    /// `WTinyLfuGhost` walked by one hand (the conveyor's): the window is
    /// the entries marked so, kept while under the ghost-adaptive share,
    /// and a candidate duels the next unvisited main entry ahead.
    WTinyLfuOneHand,
    /// Window TinyLFU with a fixed FIFO window (the shard's head segment,
    /// in the engine) and the strict duel, whose *admission* adapts
    /// instead of the window: a candidate that loses its duel is admitted
    /// anyway when its hash falls under the shard's lenience (0 to 1),
    /// which the two ghosts move as `WTinyLfuGhost`'s move its window
    /// (a refused key back soon: more lenient; a main victim back soon:
    /// stricter). Fully lenient it is SIEVE behind a FIFO window.
    WTinyLfuLenient,
    /// Window TinyLFU with a fixed FIFO window and the margin duel, which
    /// is on (strict) or off (every candidate admitted) as `Config::switch`
    /// chooses.
    WTinyLfuSwitch,
}

/// How `WTinyLfuSwitch` chooses between its strict and lenient admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Switch {
    /// Always strict: the duel decides.
    Strict,
    /// Always lenient: every candidate is admitted.
    Lenient,
    /// A two-state climber: after `SWITCH_EVERY` samples of `SWITCH_SAMPLE`
    /// x the entry limit requests in the kept mode, one sample in the
    /// other; the other is kept if its hit ratio beat the last sample's by
    /// more than `SWITCH_MARGIN`. Starts strict.
    Climb,
    /// Set dueling: the keys whose hash falls in one of `DUEL_GROUPS`
    /// groups are always strict, another group's always lenient; a
    /// saturating counter (`DUEL_PSEL`) adds the strict leaders' misses and
    /// subtracts the lenient leaders'; the others are lenient while it is
    /// positive.
    Duel,
    /// Miniature simulation (Waldspurger et al., ATC '17): the keys whose
    /// hash falls in one of `MINI_RATE` groups (fewer in small shards)
    /// are replayed through two shards of as many times fewer entries,
    /// one pinned strict and one lenient; their hits lately, and the
    /// requests one of them alone hit (all halved every four of their
    /// entry limits of sampled requests), choose the mode by the engine's
    /// rule (`AdmissionChoice::next`): strict while they warm up, lenient
    /// on a lead beyond chance, strict again on a clear win.
    Mini,
}

impl Switch {
    /// The mode's name on the command line.
    pub fn from_name(name: &str) -> Option<Switch> {
        match name {
            "strict" => Some(Switch::Strict),
            "lenient" => Some(Switch::Lenient),
            "climb" => Some(Switch::Climb),
            "duel" => Some(Switch::Duel),
            "mini" => Some(Switch::Mini),
            _ => None,
        }
    }
}

/// `Switch::Climb`'s sample, in multiples of the entry limit (long enough
/// to see a loop a little longer than the cache come round), how many
/// samples it keeps a mode before trying the other, and by how much the
/// other must do better.
const SWITCH_SAMPLE: u64 = 8;
const SWITCH_EVERY: u32 = 3;
const SWITCH_MARGIN: f64 = 0.002;
/// `Switch::Duel`: the key space in this many groups by hash (group 0
/// strict leaders, group 1 lenient leaders), and the counter's bound.
const DUEL_GROUPS: u64 = 32;
const DUEL_PSEL: i64 = 1024;
/// `Switch::Mini`: one key in this many is replayed through the miniature
/// shards, fewer while a miniature would hold under `MINI_ENTRIES`.
const MINI_RATE: u64 = 32;
const MINI_ENTRIES: u64 = 64;
/// `Switch::Mini`: the miniatures' hits are halved every this many x
/// their entry limit of sampled requests.
const MINI_DECAY: u64 = 4;

impl Policy {
    /// Every policy, in report order.
    pub const ALL: [Policy; 17] = [
        Policy::Sieve,
        Policy::S3Fifo,
        Policy::S3FifoOneHand,
        Policy::WTinyLfu,
        Policy::WTinyLfuExact,
        Policy::WTinyLfuAdaptive,
        Policy::WTinyLfuRecency,
        Policy::S3FifoFullGhost,
        Policy::WTinyLfuTieBreak,
        Policy::WTinyLfuAging,
        Policy::WTinyLfuGhost,
        Policy::WTinyLfuGhostAging,
        Policy::WTinyLfuMargin,
        Policy::TinyLfuSieve,
        Policy::WTinyLfuOneHand,
        Policy::WTinyLfuLenient,
        Policy::WTinyLfuSwitch,
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
            Policy::S3FifoFullGhost => "s3fifo-full-ghost",
            Policy::WTinyLfuTieBreak => "wtinylfu-tiebreak",
            Policy::WTinyLfuAging => "wtinylfu-aging",
            Policy::WTinyLfuGhost => "wtinylfu-ghost",
            Policy::WTinyLfuGhostAging => "wtinylfu-ghost-aging",
            Policy::WTinyLfuMargin => "wtinylfu-margin",
            Policy::TinyLfuSieve => "tinylfu-sieve",
            Policy::WTinyLfuOneHand => "wtinylfu-one-hand",
            Policy::WTinyLfuLenient => "wtinylfu-lenient",
            Policy::WTinyLfuSwitch => "wtinylfu-switch",
        }
    }

    /// The policy called `name` (as [`Policy::name`] spells it).
    pub fn from_name(name: &str) -> Option<Policy> {
        Policy::ALL.into_iter().find(|p| p.name() == name)
    }

    fn uses_ghost(self) -> bool {
        matches!(self, Policy::S3Fifo | Policy::S3FifoOneHand | Policy::S3FifoFullGhost)
    }

    fn uses_sketch(self) -> bool {
        self.is_wtinylfu() || matches!(self, Policy::TinyLfuSieve | Policy::WTinyLfuOneHand)
    }

    fn is_wtinylfu(self) -> bool {
        matches!(
            self,
            Policy::WTinyLfu
                | Policy::WTinyLfuExact
                | Policy::WTinyLfuAdaptive
                | Policy::WTinyLfuRecency
                | Policy::WTinyLfuTieBreak
                | Policy::WTinyLfuAging
                | Policy::WTinyLfuGhost
                | Policy::WTinyLfuGhostAging
                | Policy::WTinyLfuMargin
                | Policy::WTinyLfuLenient
                | Policy::WTinyLfuSwitch
        )
    }

    /// Whether the segment-granular arena models this policy (SIEVE and
    /// the W-TinyLFU family; the S3-FIFO variants are entry-granular only).
    pub fn segment_ready(self) -> bool {
        self == Policy::Sieve || self.is_wtinylfu()
    }

    /// Whether the two-conveyor form (`Config::queues`) models this policy
    /// (the W-TinyLFU family: a window at the newest end, a main part).
    pub fn queue_ready(self) -> bool {
        self.is_wtinylfu()
    }

    /// Whether the duel is the strict one (conservative sketch, margin 1).
    fn strict_duel(self) -> bool {
        matches!(
            self,
            Policy::WTinyLfuMargin
                | Policy::WTinyLfuGhost
                | Policy::WTinyLfuGhostAging
                | Policy::TinyLfuSieve
                | Policy::WTinyLfuOneHand
                | Policy::WTinyLfuLenient
                | Policy::WTinyLfuSwitch
        )
    }

    /// Whether the hit counters are the sketch's only feed of hits.
    fn counter_feed(self) -> bool {
        self.uses_sketch() && self != Policy::WTinyLfuExact
    }

    /// Whether the window follows the window and main ghosts.
    fn ghost_window(self) -> bool {
        matches!(self, Policy::WTinyLfuGhost | Policy::WTinyLfuGhostAging | Policy::WTinyLfuOneHand)
    }

    /// Whether the two ghosts are kept (the window's or the admission's
    /// adaptation follows them).
    fn keeps_ghosts(self) -> bool {
        self.ghost_window() || self == Policy::WTinyLfuLenient
    }

    /// Whether the sketch's aging follows the window's and main's hits.
    fn adaptive_aging(self) -> bool {
        matches!(self, Policy::WTinyLfuAging | Policy::WTinyLfuGhostAging)
    }

    /// How the window's candidates are chosen by default.
    fn default_walk(self) -> Walk {
        match self {
            Policy::WTinyLfuAdaptive => Walk::Sieve,
            Policy::WTinyLfuGhost | Policy::WTinyLfuGhostAging => Walk::Clock,
            _ => Walk::Fifo,
        }
    }
}

/// How the window hand picks its candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Walk {
    /// The window's oldest entry, hit or not.
    Fifo,
    /// The oldest entry not hit since the hand last passed; a hit one is
    /// skipped in place (its counter goes to the sketch).
    Sieve,
    /// The oldest entry not hit since it was (re)inserted; a hit one is
    /// moved to the newest end of the window (its counter goes to the
    /// sketch): FIFO with reinsertion, CLOCK, which follows LRU closely.
    Clock,
}

impl Walk {
    /// The walk called `name` (`fifo`, `sieve`, `clock`).
    pub fn from_name(name: &str) -> Option<Walk> {
        match name {
            "fifo" => Some(Walk::Fifo),
            "sieve" => Some(Walk::Sieve),
            "clock" => Some(Walk::Clock),
            _ => None,
        }
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
    /// How the window hand picks its candidate.
    pub walk: Walk,
    /// The ghost-adaptive window's largest share, percent of the cache.
    pub window_max_percent: u64,
    /// Each ghost's length, percent of the entry limit.
    pub ghost_percent: u64,
    /// The ghost-adaptive window's step per ghost hit, in entries (times
    /// ARC's ratio of the other ghost's length to this one's).
    pub ghost_step: f64,
    /// Count a ghost hit only if the key came back within this many times
    /// the evicting queue's size in insertions (a queue that much larger
    /// would have kept it); 0: every ghost hit counts, as in ARC.
    pub ghost_age: f64,
    /// A window ghost hit also counts when the key came back within this
    /// share of the cache's entries in insertions, whatever the window's
    /// size (0: only `ghost_age` decides).
    pub ghost_age_floor: f64,
    /// A candidate hit while in the window wins a tie in the duel.
    pub tie_break: bool,
    /// The sketch's conservative update (see [`Sketch::conservative`]).
    pub conservative: bool,
    /// A candidate must count more than the victim plus this to win.
    pub admit_margin: u8,
    /// Segments per shard for the segment-granular arena (`segments.rs`);
    /// 0: the entry-granular arena, a compaction freeing `free_percent`
    /// (or, with `queues`, one entry at a time).
    pub segments: u64,
    /// A merge takes in further segments while its survivors would fill
    /// less than half a segment.
    pub segment_fill: bool,
    /// On segments, the policy evicts with its own hands and a cleaner
    /// merges the group with the most holes (see `segments.rs`); otherwise
    /// the policy decides whole groups at one hand.
    pub segment_cleaner: bool,
    /// With the cleaner, percent of the arena kept free of live entries
    /// (at least two segments) so that holes gather into whole segments.
    pub segment_slack: u64,
    /// With the cleaner, clean as the engine's conveyor can: a segment of
    /// nothing but holes is freed at once wherever it is; otherwise the
    /// group merged starts where the last one left off (oldest to newest,
    /// never the head, wrapping) and is the fewest segments, up to four,
    /// that free one. The default cleaner picks the group holding the most
    /// holes anywhere.
    pub segment_fifo: bool,
    /// Two conveyors in one segment chain (`queues.rs`; the W-TinyLFU
    /// family, entry-granular arena only): one eviction at a time whenever
    /// the arena or the index is full (no `free_percent` batch), a
    /// promoted candidate copied to the main part's newest end, and no
    /// holes, the conveyors compacting as they go.
    pub queues: bool,
    /// A promoted window candidate keeps its hit counter (otherwise it
    /// goes to the sketch and is cleared).
    pub keep_window_hits: bool,
    /// How `WTinyLfuSwitch` chooses its admission mode.
    pub switch: Switch,
    /// `WTinyLfuSwitch` with `queues`: the window is the head segment,
    /// judged when it fills rather than one candidate at a time as it
    /// overflows (see `ArenaShard::judge_head`).
    pub head_window: bool,
    /// `Switch::Mini`: the miniatures learn a sampled key's hits only
    /// through the shard's hit counters, as the engine could without a
    /// write per hit: a miss is replayed at once (the set holds the lock),
    /// a hit when the main hand clears the entry's counter (as many as the
    /// counter holds, at most `counter_max`).
    pub mini_counted_hits: bool,
    /// `Sieve`: the hand wraps round before the newest `live entries /
    /// young_share` entries while the older ones have a victim (the
    /// engine's lenient admission since round ten, which counts the
    /// newest twelfth of the used arena's bytes); 0: never.
    pub young_share: usize,
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
            // SIEVE and the engine's policy keep a visited bit; the others
            // were studied with a two-bit counter.
            counter_max: if matches!(
                policy,
                Policy::Sieve | Policy::TinyLfuSieve | Policy::WTinyLfuOneHand
            ) {
                1
            } else {
                3
            },
            small_percent: 10,
            window_percent: 1,
            // The engine's sketch: a quarter of a counter per index slot and
            // row, about half a counter per entry (`shard/policy.rs`).
            sketch_counters_per_entry: if matches!(
                policy,
                Policy::TinyLfuSieve | Policy::WTinyLfuOneHand
            ) {
                0.5
            } else {
                1.0
            },
            sketch_aging: 10,
            walk: policy.default_walk(),
            window_max_percent: 90,
            ghost_percent: 25,
            ghost_step: 4.0,
            ghost_age: if policy == Policy::WTinyLfuLenient { 1.0 } else { 2.0 },
            ghost_age_floor: 0.0,
            tie_break: policy == Policy::WTinyLfuTieBreak,
            conservative: policy.strict_duel(),
            admit_margin: policy.strict_duel() as u8,
            segments: 0,
            segment_fill: true,
            segment_cleaner: policy != Policy::Sieve,
            segment_slack: 10,
            segment_fifo: false,
            queues: false,
            keep_window_hits: policy == Policy::WTinyLfuSwitch,
            switch: Switch::Mini,
            head_window: false,
            mini_counted_hits: false,
            young_share: 0,
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
    /// Bytes a segment-granular arena copied: survivors of merges, and
    /// window entries moved to the head; with `Config::queues`, the main
    /// conveyor's survivors, window entries moved to the window's newest
    /// end and candidates promoted to the main part's.
    pub copied_bytes: u64,
    /// Mean live entries over the requests after the first compaction
    /// (the steady state; the whole replay if nothing was evicted).
    pub mean_items: f64,
    /// Mean live bytes over the same requests.
    pub mean_bytes: f64,
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
    /// hill climber's state (the sample under way, the previous sample's
    /// hit ratio, the step, signed).
    window_bp: i64,
    climb_sample: HitSample,
    climb_prev: f64,
    climb_step: i64,
    /// The ghost-adaptive window: its target in entries, the ghosts of
    /// window candidates that lost their duel and of main victims, and the
    /// shard's insertions so far (the ghosts' clock).
    win_target: f64,
    window_ghost: Ghost,
    main_ghost: Ghost,
    inserts: u64,
    /// Adaptive aging: the current multiple, and the sample under way
    /// (requests; hits on window and on main entries; sums of the window's
    /// and the main's entry counts).
    aging: u64,
    age_requests: u64,
    age_hits: [u64; 2],
    age_sizes: [u64; 2],
    /// The segment-granular arena (`seg_cap` 0: entry-granular): bytes
    /// and entries per segment in use, oldest first (the last is the
    /// head); segments in the free pool; the hand (a segment index); bytes
    /// copied by merges (with `Config::queues`, survivors the main
    /// conveyor passed) and by moves to the head (and, with `queues`,
    /// promotions to the main part's newest end).
    seg_cap: u64,
    fill: bool,
    cleaner: bool,
    seg_count: usize,
    seg_used: Vec<u64>,
    seg_len: Vec<usize>,
    seg_free: usize,
    seg_hand: usize,
    seg_copied: u64,
    seg_moved: u64,
    seg_pending: Vec<u64>,
    seg_dead: Vec<u64>,
    /// `TinyLfuSieve`: the key being inserted was in the window ghost (it
    /// goes straight to the main part).
    straight_to_main: bool,
    /// `WTinyLfuLenient`: the share of duel losers admitted anyway (0 to 1).
    lenience: f64,
    /// `Config::queues`: times the model's vector was tidied (`tidy`).
    tidied: u64,
    /// `WTinyLfuSwitch`'s mode and its chooser's state.
    mode: ModeState,
    /// `Switch::Mini`: the strict and the lenient miniature shards.
    minis: Option<Box<[ArenaShard; 2]>>,
}

/// `WTinyLfuSwitch`: the climber's mode kept (true: lenient), whether it
/// is trying the other, its sample under way, the dueling counter, and
/// the miniatures' counts and choice.
#[derive(Clone, Copy, Debug, Default)]
struct ModeState {
    lenient: bool,
    trying: bool,
    sample_under_way: HitSample,
    /// The hit ratio of the last sample in the kept mode.
    base: f64,
    /// Samples in the kept mode since the last try.
    kept: u32,
    /// Misses of the strict leaders minus the lenient leaders'.
    psel: i64,
    /// `Switch::Mini`: one key in `sample` is replayed; the hits of the
    /// strict and the lenient miniatures lately, the requests one of them
    /// alone hit lately, sampled requests lately and since the counts were
    /// last halved; the choice they made, by the engine's rule.
    sample: u64,
    mini_hits: [u64; 2],
    mini_only: [u64; 2],
    mini_reads: u64,
    mini_requests: u64,
    choice: AdmissionChoice,
}

/// The requests and hits of a climber's sample under way.
#[derive(Clone, Copy, Debug, Default)]
struct HitSample {
    requests: u64,
    hits: u64,
}

impl HitSample {
    /// Count one request; at the `len`th, the sample's hit ratio (and the
    /// next sample starts).
    fn record(&mut self, hit: bool, len: u64) -> Option<f64> {
        self.requests += 1;
        self.hits += hit as u64;
        if self.requests < len {
            return None;
        }
        let ratio = self.hits as f64 / self.requests as f64;
        *self = HitSample::default();
        Some(ratio)
    }
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
        let mut shard = ArenaShard::bare(cfg, cap_bytes, max_items);
        if cfg.policy == Policy::WTinyLfuSwitch && cfg.switch == Switch::Mini {
            let mut sample = MINI_RATE;
            while sample > 1 && shard.max_items / sample < MINI_ENTRIES {
                sample /= 2;
            }
            shard.mode.sample = sample;
            let mini = |switch| {
                let c = Config { switch, ..cfg };
                ArenaShard::bare(c, (cap_bytes / sample).max(1), (shard.max_items / sample).max(1))
            };
            shard.minis = Some(Box::new([mini(Switch::Strict), mini(Switch::Lenient)]));
        }
        shard
    }

    /// The shard without miniatures.
    fn bare(cfg: Config, cap_bytes: u64, max_items: u64) -> ArenaShard {
        let max_items = max_items.max(1);
        let ghost_len = if cfg.policy.uses_ghost() {
            (max_items * (100 - cfg.small_percent) / 100) as usize
        } else {
            1
        };
        let ghost_len =
            if cfg.policy == Policy::S3FifoFullGhost { max_items as usize } else { ghost_len };
        let sketch_entries = if cfg.policy.uses_sketch() { max_items as usize } else { 1 };
        let adaptive_len = if cfg.policy.keeps_ghosts() || cfg.policy == Policy::TinyLfuSieve {
            (max_items * cfg.ghost_percent / 100).max(1) as usize
        } else {
            1
        };
        let mut sketch =
            Sketch::with_aging(sketch_entries, cfg.sketch_counters_per_entry, cfg.sketch_aging);
        sketch.conservative = cfg.conservative;
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
            sketch,
            compactions: 0,
            after_bytes: 0,
            after_items: 0,
            window_bp: cfg.window_percent as i64 * 100,
            climb_sample: HitSample::default(),
            climb_prev: -1.0,
            climb_step: 625,
            win_target: max_items as f64 * cfg.window_percent as f64 / 100.0,
            window_ghost: Ghost::new(adaptive_len),
            main_ghost: Ghost::new(adaptive_len),
            inserts: 0,
            aging: cfg.sketch_aging,
            age_requests: 0,
            age_hits: [0; 2],
            age_sizes: [0; 2],
            seg_cap: cap_bytes.checked_div(cfg.segments).map_or(0, |c| c.max(1)),
            fill: cfg.segment_fill,
            cleaner: cfg.segment_cleaner && cfg.segments > 0,
            seg_count: cfg.segments as usize,
            seg_used: Vec::new(),
            seg_len: Vec::new(),
            seg_free: cfg.segments as usize,
            seg_hand: 0,
            seg_copied: 0,
            seg_moved: 0,
            seg_pending: Vec::new(),
            seg_dead: Vec::new(),
            straight_to_main: false,
            lenience: 0.0,
            tidied: 0,
            mode: ModeState { lenient: cfg.switch == Switch::Lenient, ..ModeState::default() },
            minis: None,
        }
    }

    /// Bytes copied by the segment-granular arena's merges and moves.
    pub fn copied_bytes(&self) -> u64 {
        self.seg_copied + self.seg_moved
    }

    /// The window's share of the cache now (0 to 1).
    fn window_share(&self) -> f64 {
        if self.cfg.policy.ghost_window() {
            self.win_target / self.max_items as f64
        } else {
            self.window_bp as f64 / 10_000.0
        }
    }

    /// Live entries.
    pub fn len(&self) -> u64 {
        self.items
    }

    /// Live bytes.
    pub fn live_bytes(&self) -> u64 {
        self.bytes
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
            + (if self.cfg.policy.ghost_window() {
                self.window_ghost.bytes() + self.main_ghost.bytes()
            } else {
                0
            })
    }

    /// A cache-aside request: a get, and a set of `size` bytes on a miss.
    /// True on a hit.
    pub fn access(&mut self, key: u64, size: u64) -> bool {
        let hit = self.lookup(key, size);
        if self.cfg.policy == Policy::WTinyLfuAdaptive {
            self.climb(hit);
        }
        if self.cfg.policy == Policy::WTinyLfuSwitch && self.cfg.switch == Switch::Climb {
            self.climb_mode(hit);
        }
        if !(hit && self.cfg.mini_counted_hits) {
            self.feed_minis(key, size, 1);
        }
        if self.cfg.policy.adaptive_aging() {
            self.age_sample();
        }
        hit
    }

    /// Adaptive aging, per shard: over each sample of as many requests as
    /// the entry limit, compare the hits per entry of the window with the
    /// main's; while the window's are higher (new keys are being reused:
    /// the working set moves), the sketch halves one step sooner (down to
    /// every 1 x the entries additions), otherwise one step later (up to
    /// `sketch_aging`). The counts are what the engine can keep: a hit
    /// sees the slot's window bit, the sizes are the shard's counters.
    fn age_sample(&mut self) {
        self.age_requests += 1;
        self.age_sizes[0] += self.small_items;
        self.age_sizes[1] += self.items - self.small_items;
        if self.age_requests < self.max_items {
            return;
        }
        let rate = |h: u64, s: u64| if s == 0 { 0.0 } else { h as f64 / s as f64 };
        let window = rate(self.age_hits[0], self.age_sizes[0]);
        let main = rate(self.age_hits[1], self.age_sizes[1]);
        let next = if window > main {
            self.aging.saturating_sub(1).max(1)
        } else {
            (self.aging + 1).min(self.cfg.sketch_aging)
        };
        if next != self.aging {
            self.aging = next;
            self.sketch.set_aging(self.max_items as usize, next);
        }
        self.age_requests = 0;
        self.age_hits = [0; 2];
        self.age_sizes = [0; 2];
    }

    /// ARC's adaptation of the window target on a miss: a key the window
    /// evicted (lost its duel) coming back means the window was too small,
    /// a key the main evicted coming back means the main was; the target
    /// moves by the step times the ratio of the other ghost's length.
    fn follow_ghosts(&mut self, hash: u64) {
        let fp = Ghost::fingerprint(hash);
        let c = self.max_items as f64;
        let lo = c / 100.0;
        let hi = c * self.cfg.window_max_percent as f64 / 100.0;
        let step = self.cfg.ghost_step;
        let (w, m) = (self.window_ghost.len().max(1) as f64, self.main_ghost.len().max(1) as f64);
        let k = self.cfg.ghost_age;
        let lenient = self.cfg.policy == Policy::WTinyLfuLenient;
        // A ghost hit counts if the key came back within its bound in
        // insertions. The window: twice the evicting queue's size (a queue
        // that much larger would have kept it). The lenient admission:
        // `ghost_age` x the cache's entries (a refused key back that soon
        // would have been a hit in the main part); a loop's keys come back
        // later and move nothing.
        let (window_bound, main_bound) = if lenient {
            (k * c, k * c)
        } else {
            ((k * self.win_target).max(self.cfg.ghost_age_floor * c), k * (c - self.win_target))
        };
        let counts = |age: u64, bound: f64| k == 0.0 || (age as f64) <= bound;
        // The move in entries: + for a window ghost hit, - for a main one.
        let delta = if let Some(age) = self.window_ghost.age(fp, self.inserts) {
            if !counts(age, window_bound) {
                return;
            }
            step * (m / w).max(1.0)
        } else if let Some(age) = self.main_ghost.age(fp, self.inserts) {
            if !counts(age, main_bound) {
                return;
            }
            -step * (w / m).max(1.0)
        } else {
            return;
        };
        // Each bounded on the side it moves toward (a target set outside
        // them by the configuration only comes back as it moves).
        let toward = |v: f64, min: f64, max: f64| if delta > 0.0 { v.min(max) } else { v.max(min) };
        if lenient {
            // Over the entry limit: from strict to fully lenient takes as
            // many hits as the window's target would take to cross the cache.
            self.lenience = toward(self.lenience + delta / c, 0.0, 1.0);
        } else {
            self.win_target = toward(self.win_target + delta, lo, hi);
        }
    }

    /// `Switch::Mini`: replay `requests` requests for `key` through the
    /// miniatures if the key is sampled, and choose the mode after each as
    /// an adaptive shard of the engine does (`AdmissionChoice::next`:
    /// strict while warming up, turning strict on a clear win and lenient
    /// on a lead beyond chance).
    fn feed_minis(&mut self, key: u64, size: u64, requests: u32) {
        let Some(minis) = self.minis.as_mut() else { return };
        let m = &mut self.mode;
        if (key_hash(key) >> 32) % m.sample != 0 {
            return;
        }
        for _ in 0..requests {
            let hit = [0, 1].map(|i| minis[i].access(key, size));
            for (hits, hit) in m.mini_hits.iter_mut().zip(hit) {
                *hits += hit as u64;
            }
            if hit[0] != hit[1] {
                m.mini_only[hit[1] as usize] += 1;
            }
            m.mini_reads += 1;
            m.mini_requests += 1;
            let warmed = m.mini_requests >= MINI_DECAY * minis[0].max_items;
            if warmed {
                m.mini_requests = 0;
                m.mini_reads /= 2;
                m.mini_hits = m.mini_hits.map(|h| h / 2);
                m.mini_only = m.mini_only.map(|h| h / 2);
            }
            m.choice = m.choice.next(&MiniTally {
                strict_hits: m.mini_hits[0],
                lenient_hits: m.mini_hits[1],
                strict_only: m.mini_only[0],
                lenient_only: m.mini_only[1],
                reads: m.mini_reads,
                warmed,
            });
        }
    }

    /// `Switch::Climb`: after `SWITCH_EVERY` samples in the kept mode, one
    /// in the other, which is kept if it did better.
    fn climb_mode(&mut self, hit: bool) {
        let m = &mut self.mode;
        let Some(ratio) = m.sample_under_way.record(hit, SWITCH_SAMPLE * self.max_items) else {
            return;
        };
        if m.trying {
            m.trying = false;
            m.kept = 0;
            if ratio > m.base + SWITCH_MARGIN {
                m.lenient = !m.lenient;
                m.base = ratio;
            }
        } else {
            m.base = ratio;
            m.kept += 1;
            m.trying = m.kept >= SWITCH_EVERY;
        }
    }

    /// `Switch::Duel`: the key's group (0 strict leaders, 1 lenient
    /// leaders, others followers), from hash bits the fingerprint and the
    /// sketch's first rows do not start with.
    fn duel_group(hash: u64) -> u64 {
        (hash >> 44) % DUEL_GROUPS
    }

    /// `Switch::Duel`: a miss of a leader moves the counter.
    fn count_leader_miss(&mut self, hash: u64) {
        let psel = &mut self.mode.psel;
        match ArenaShard::duel_group(hash) {
            0 => *psel = (*psel + 1).min(DUEL_PSEL),
            1 => *psel = (*psel - 1).max(-DUEL_PSEL),
            _ => {}
        }
    }

    /// Whether `WTinyLfuSwitch` admits candidate `hash` whatever its duel.
    fn admits_anyway(&self, hash: u64) -> bool {
        if self.cfg.policy != Policy::WTinyLfuSwitch {
            return false;
        }
        match self.cfg.switch {
            Switch::Strict => false,
            Switch::Lenient => true,
            Switch::Climb => self.mode.lenient != self.mode.trying,
            Switch::Mini => !self.mode.choice.admits_strictly(),
            Switch::Duel => match ArenaShard::duel_group(hash) {
                0 => false,
                1 => true,
                _ => self.mode.psel > 0,
            },
        }
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
        let Some(ratio) = self.climb_sample.record(hit, CLIMB_SAMPLE * self.max_items) else {
            return;
        };
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
            self.age_hits[if e.small { 0 } else { 1 }] += 1;
            if self.cfg.policy == Policy::WTinyLfuExact {
                self.sketch.add(hash, 1);
            }
            return true;
        }
        if self.cfg.policy.uses_sketch() {
            self.sketch.add(hash, 1);
        }
        if self.cfg.policy.keeps_ghosts() {
            self.follow_ghosts(hash);
        }
        if self.cfg.policy == Policy::WTinyLfuSwitch && self.cfg.switch == Switch::Duel {
            self.count_leader_miss(hash);
        }
        if self.cfg.policy == Policy::TinyLfuSieve {
            // A key the window evicted that comes back while remembered
            // was evicted too soon: it goes straight to the main part.
            let fp = Ghost::fingerprint(hash);
            self.straight_to_main = self.window_ghost.contains(fp);
        }
        self.insert(key, hash, size);
        false
    }

    fn insert(&mut self, key: u64, hash: u64, size: u64) {
        if size > self.cap_bytes || (self.seg_cap > 0 && size > self.seg_cap) {
            // Larger than the whole arena (or a segment): refused before
            // anything is evicted for it, as the engine does.
            return;
        }
        if self.cleaner {
            // The policy keeps the live bytes two segments under the
            // arena, one eviction at a time, so holes can gather where
            // the cleaner reclaims them (see `segments.rs`).
            let slack = (2 * self.seg_cap).max(self.cap_bytes * self.cfg.segment_slack / 100);
            let live_cap = self.cap_bytes.saturating_sub(slack).max(size);
            self.after_bytes = live_cap - size;
            self.after_items = self.max_items.saturating_sub(1);
            while self.bytes + size > live_cap && self.items > 0 {
                self.evict_one();
            }
        }
        if self.cfg.head_window && self.small_items >= self.head_entries() {
            self.judge_head();
        }
        if self.seg_cap > 0 {
            if !self.segment_room(size) {
                return; // larger than a segment: refused
            }
        } else if self.cfg.queues {
            self.conveyor_room(size);
        } else if self.bytes + size > self.cap_bytes || self.items + 1 > self.max_items {
            self.compact(size);
        }
        let small = if self.cfg.policy.uses_ghost() {
            !self.ghost.contains(Ghost::fingerprint(hash))
        } else {
            self.cfg.policy.uses_sketch() && !std::mem::take(&mut self.straight_to_main)
        };
        self.inserts += 1;
        self.index.insert(key, self.arena.len());
        self.arena.push(Ent { key, hash, size, freq: 0, small, evicted: false });
        self.bytes += size;
        self.items += 1;
        if self.seg_cap > 0 {
            self.segment_append(size);
        }
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
        if self.cleaner || self.cfg.queues {
            // The key is gone now (the dead entry stays in the model's
            // vector until a merge or `tidy` drops it).
            self.index.remove(&e.key);
        }
        if self.cleaner {
            // The hole stays in its segment.
            self.mark_dead(i);
        }
        let e = &mut self.arena[i];
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

    /// Drop the evicted entries of the model's vector in `a..b`, keeping
    /// the order (a merge of segments, or `tidy`); the hands move with the
    /// entries they pointed at (or the next live ones), and the index is
    /// rebuilt from the live entries.
    fn drop_evicted(&mut self, a: usize, b: usize) {
        let removed_before = |x: usize, arena: &[Ent]| {
            arena[a.min(x)..b.min(x)].iter().filter(|e| e.evicted).count()
        };
        self.hand -= removed_before(self.hand, &self.arena);
        self.small_hand -= removed_before(self.small_hand, &self.arena);
        let mut j = 0usize;
        self.arena.retain(|e| {
            let keep = j < a || j >= b || !e.evicted;
            j += 1;
            keep
        });
        self.index.clear();
        for (i, e) in self.arena.iter().enumerate() {
            if !e.evicted {
                self.index.insert(e.key, i);
            }
        }
    }

    /// Move a window entry to the newest end of the arena (CLOCK's
    /// reinsertion; in the engine, a copy into the head segment).
    fn reinsert(&mut self, i: usize) {
        if self.cleaner {
            // The copy goes to the head segment once the cleaner has made
            // room there (the cleaner is running: this is an eviction).
            let size = self.arena[i].size;
            self.seg_moved += size;
            self.seg_pending.push(size);
            self.mark_dead(i);
        }
        if self.cfg.queues {
            // The window conveyor copies it to the head.
            self.seg_moved += self.arena[i].size;
        }
        let mut e = self.arena[i];
        self.arena[i].evicted = true;
        e.freq = 0;
        self.index.insert(e.key, self.arena.len());
        self.arena.push(e);
    }

    /// Remember an evicted entry in the window or the main ghost.
    fn remember(&mut self, i: usize, window: bool) {
        if !self.cfg.policy.keeps_ghosts() {
            return;
        }
        let fp = Ghost::fingerprint(self.arena[i].hash);
        let g = if window { &mut self.window_ghost } else { &mut self.main_ghost };
        g.push_at(fp, self.inserts);
    }

    /// A window entry joins the main part: its queue bit flips in place,
    /// or with `Config::queues` it is copied to the main part's newest end
    /// (`move_to_main`).
    fn promote(&mut self, i: usize) {
        let e = &mut self.arena[i];
        e.small = false;
        self.small_bytes -= e.size;
        self.small_items -= 1;
        if self.cfg.queues {
            self.move_to_main(i);
        }
    }

    /// The next live entry at or after `from` (wrapping) with `small`
    /// equal to `want` (any entry when `want` is None). None if there is none.
    fn next_from(&self, from: usize, want: Option<bool>) -> Option<usize> {
        self.next_before(from, self.arena.len(), want)
    }

    /// `next_from` among the entries before arena index `end` (wrapping
    /// there).
    fn next_before(&self, from: usize, end: usize, want: Option<bool>) -> Option<usize> {
        let n = end.min(self.arena.len());
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
        self.victim_before(self.arena.len(), want, decrement)
    }

    /// `main_victim` among the entries before arena index `end`: the hand
    /// wraps round there (SIEVE sparing its young entries, which start at
    /// `end`).
    fn victim_before(&mut self, end: usize, want: Option<bool>, decrement: bool) -> Option<usize> {
        // At most counter_max + 1 passes over the entries.
        let limit = (end + 1) * (self.cfg.counter_max as usize + 2);
        let mut i = self.hand;
        for _ in 0..limit {
            i = self.next_before(i, end, want)?;
            let e = &mut self.arena[i];
            if e.freq == 0 {
                self.hand = i;
                return Some(i);
            }
            if decrement {
                e.freq -= 1;
            } else {
                self.clear_counter(i);
            }
            i += 1;
        }
        None
    }

    /// The hand passes entry `i`, hit since it last came by: its counter
    /// is cleared and its hits go where the policy learns them.
    fn clear_counter(&mut self, i: usize) {
        let e = &mut self.arena[i];
        let n = e.freq;
        e.freq = 0;
        let (h, key, size) = (e.hash, e.key, e.size);
        if self.cfg.queues {
            // The main conveyor copies the survivor down.
            self.seg_copied += size;
        }
        if self.cfg.policy.counter_feed() {
            self.sketch.add(h, n);
        }
        if self.cfg.mini_counted_hits {
            self.feed_minis(key, size, n as u32);
        }
    }

    /// Where the young entries start (`Config::young_share`): the arena
    /// index of the oldest of the newest `items / young_share` live
    /// entries. None when there are none, or nothing older.
    fn young_from(&self) -> Option<usize> {
        let share = self.cfg.young_share;
        let young = (self.items as usize).checked_div(share).unwrap_or(0);
        if young == 0 || young >= self.items as usize {
            return None;
        }
        let mut seen = 0;
        for i in (0..self.arena.len()).rev() {
            if !self.arena[i].evicted {
                seen += 1;
                if seen == young {
                    return Some(i);
                }
            }
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
            if self.cfg.walk == Walk::Fifo || e.freq == 0 || passes > self.small_items {
                return Some(c);
            }
            passes += 1;
            self.sketch.add(e.hash, e.freq);
            if self.cfg.walk == Walk::Clock {
                self.reinsert(c);
            } else {
                self.arena[c].freq = 0;
            }
        }
    }

    /// `Config::head_window`: the head segment is full. Its older half is
    /// judged, oldest first, as the engine would judge the head before
    /// sealing it: an entry hit since it came in joins the main part with
    /// its counter; an unhit one joins it if the mode admits it anyway or
    /// while the main part has room, or else duels the main hand's victim:
    /// the winner stays, the loser goes at once. The newer half stays in
    /// the head, so every entry spends between a half and a whole head in
    /// the window.
    fn judge_head(&mut self) {
        self.compactions += 1;
        let mut judge = self.small_items.div_ceil(2);
        while judge > 0 {
            judge -= 1;
            let Some(c) = self.next_from(self.small_hand, Some(true)) else { return };
            self.small_hand = c + 1;
            let cand = self.arena[c];
            // While the main part has room beside a full head (the cache
            // is filling), a candidate joins it freely.
            let main_room = self.items - self.small_items
                < self.max_items.saturating_sub(self.head_entries())
                && self.bytes - self.small_bytes + cand.size
                    <= self
                        .cap_bytes
                        .saturating_sub((self.cap_bytes as f64 * self.window_share()) as u64);
            if cand.freq > 0 || main_room || self.admits_anyway(cand.hash) {
                self.promote(c);
                continue;
            }
            // The victim is the main hand's: it clears (and counts in the
            // sketch) the hit entries it passes, as the conveyor does, and
            // stays at the victim while candidates lose to it.
            let victim = self.main_victim(Some(false), false);
            let fc = self.sketch.estimate(cand.hash);
            match victim {
                Some(v)
                    if fc
                        > self
                            .sketch
                            .estimate(self.arena[v].hash)
                            .saturating_add(self.cfg.admit_margin) =>
                {
                    self.drop_entry(v, false);
                    self.hand = v + 1;
                    self.promote(c);
                }
                _ => self.drop_entry(c, false),
            }
        }
    }

    /// `Config::head_window`: the entries a full head holds.
    fn head_entries(&self) -> u64 {
        ((self.max_items as f64 * self.window_share()) as u64).max(1)
    }

    /// Choose one victim and mark it evicted.
    fn evict_one(&mut self) {
        if self.cfg.head_window {
            // Room is made by the main hand (the conveyor) alone; the head
            // is judged when it fills.
            if let Some(v) = self.main_victim(Some(false), false) {
                self.drop_entry(v, false);
                self.hand = v + 1;
            } else if let Some(c) = self.next_from(self.small_hand, Some(true)) {
                self.drop_entry(c, false);
                self.small_hand = c + 1;
            }
            return;
        }
        match self.cfg.policy {
            Policy::Sieve => {
                let young = self.young_from();
                let victim = match young {
                    Some(end) => self
                        .victim_before(end, None, false)
                        .or_else(|| self.main_victim(None, false)),
                    None => self.main_victim(None, false),
                };
                if let Some(v) = victim {
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
            Policy::TinyLfuSieve => self.evict_one_hand(),
            Policy::WTinyLfuOneHand => self.evict_adaptive_one_hand(),
            Policy::S3Fifo | Policy::S3FifoFullGhost => {
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
            _ => {
                let share = self.window_share();
                let window = (self.cap_bytes as f64 * share) as u64;
                let window_items = (self.after_items as f64 * share) as u64;
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
                        self.remember(c, true);
                        self.drop_entry(c, false);
                        return;
                    };
                    let feed = if self.cfg.policy.counter_feed() { cand.freq } else { 0 };
                    let fc = self.sketch.estimate(cand.hash).saturating_add(feed);
                    let fv = self.sketch.estimate(self.arena[v].hash);
                    // The counter goes to the sketch now, unless a promoted
                    // candidate keeps it: then the main hand adds it when
                    // it clears it (counted once either way).
                    let kept = self.cfg.keep_window_hits;
                    if self.cfg.policy.counter_feed() && !kept {
                        self.sketch.add(cand.hash, cand.freq);
                    }
                    let hit_in_window = cand.freq > 0;
                    // A hash's fraction, from bits the fingerprint and the
                    // sketch's first rows do not start with.
                    let lenient = self.cfg.policy == Policy::WTinyLfuLenient
                        && ((cand.hash >> 40) & 0xff_ffff) as f64 / 16_777_216.0 < self.lenience;
                    let wins = fc > fv.saturating_add(self.cfg.admit_margin)
                        || lenient
                        || self.admits_anyway(cand.hash)
                        || (self.cfg.policy == Policy::WTinyLfuRecency && hit_in_window)
                        || (self.cfg.tie_break && fc == fv && hit_in_window);
                    if wins {
                        self.remember(v, false);
                        self.drop_entry(v, false);
                        self.hand = v + 1;
                        if !kept {
                            self.arena[c].freq = 0;
                        }
                        self.promote(c);
                    } else {
                        if self.cfg.policy.counter_feed() && kept {
                            self.sketch.add(cand.hash, cand.freq);
                        }
                        self.remember(c, true);
                        self.drop_entry(c, false);
                    }
                } else if let Some(v) = self.main_victim(Some(false), false) {
                    self.remember(v, false);
                    self.drop_entry(v, false);
                    self.hand = v + 1;
                } else if let Some(c) = self.next_from(self.small_hand, Some(true)) {
                    self.remember(c, true);
                    self.drop_entry(c, false);
                    self.small_hand = c + 1;
                }
            }
        }
    }
}

impl ArenaShard {
    /// `TinyLfuSieve`: one hand walks the arena from oldest to newest,
    /// wrapping, and stops at the first entry it evicts. A window entry
    /// (not judged since it came in) joins the main part if it was hit
    /// meanwhile or while the main part holds less than its share (99%) of
    /// what the compaction leaves; otherwise it duels the next unvisited
    /// main entry ahead of the hand (read, not cleared): the candidate wins
    /// if the sketch counts it more than that victim plus the margin, and
    /// the loser is evicted (a losing candidate into the window ghost,
    /// whose keys come back straight into the main part). A main entry
    /// hit since the hand last passed is spared, its hit counted; an
    /// unvisited one stays (main entries leave through duels) unless the
    /// hand walked a whole cycle without evicting.
    fn evict_one_hand(&mut self) {
        let cycle = self.arena.len() + 1;
        let mut i = self.hand;
        for walked in 0..3 * cycle {
            let Some(j) = self.next_from(i, None) else { return };
            let e = self.arena[j];
            if e.small || walked >= cycle {
                // Main entries keep their marks while the hand only passes
                // them on its way to the window's entries: the duels'
                // victim search clears them, as a main hand would.
                self.arena[j].freq = 0;
                self.sketch.add(e.hash, e.freq);
            }
            if e.small {
                let main = self.bytes - self.small_bytes;
                let share = 1.0 - self.cfg.window_percent as f64 / 100.0;
                if e.freq > 0 || main + e.size <= (self.after_bytes as f64 * share) as u64 {
                    // Hit since it came in, or the main part has room for
                    // its share of what the compaction leaves: in freely.
                    self.promote(j);
                } else {
                    if let Some(v) = self.duel_ahead(j) {
                        self.promote(j);
                        self.drop_entry(v, false);
                        self.hand = j + 1;
                        return;
                    }
                    self.window_ghost.push_at(Ghost::fingerprint(e.hash), self.inserts);
                    self.drop_entry(j, false);
                    self.hand = j + 1;
                    return;
                }
            } else if e.freq == 0 && walked >= cycle {
                self.drop_entry(j, false);
                self.hand = j + 1;
                return;
            }
            i = j + 1;
        }
    }

    /// `WTinyLfuOneHand`: the ghost-adaptive W-TinyLFU on one hand (see
    /// `Policy::WTinyLfuOneHand`). The window's share is `win_target`; the
    /// hand walks the arena from oldest to newest, wrapping:
    /// * a window entry while the window is within its share stays (a hit
    ///   one has its mark cleared and counted), as in SIEVE;
    /// * a window entry while the window is over its share leaves it: hit
    ///   since the hand last passed, it joins the main part; otherwise it
    ///   joins freely while the main part is within its share, or duels the
    ///   next unvisited main entry ahead (the loser is evicted, into its
    ///   ghost);
    /// * a main entry hit since the hand last passed stays (counted); an
    ///   unvisited one is evicted while the main part is over its share.
    fn evict_adaptive_one_hand(&mut self) {
        let cycle = self.arena.len() + 1;
        let share = self.window_share();
        let window_cap = (self.after_bytes as f64 * share) as u64;
        let main_cap = self.after_bytes.saturating_sub(window_cap);
        let mut i = self.hand;
        for walked in 0..3 * cycle {
            let Some(j) = self.next_from(i, None) else { return };
            let e = self.arena[j];
            let force = walked >= cycle;
            let main = self.bytes - self.small_bytes;
            if e.small {
                self.arena[j].freq = 0;
                self.sketch.add(e.hash, e.freq);
                if self.small_bytes <= window_cap && !force {
                    i = j + 1;
                    continue;
                }
                if e.freq > 0 || main + e.size <= main_cap {
                    self.promote(j);
                    i = j + 1;
                    continue;
                }
                if let Some(v) = self.duel_ahead(j) {
                    self.remember(v, false);
                    self.drop_entry(v, false);
                    self.promote(j);
                } else {
                    self.remember(j, true);
                    self.drop_entry(j, false);
                }
                self.hand = j + 1;
                return;
            }
            if main > main_cap || force {
                // Looking for a main victim: SIEVE's rule.
                if e.freq > 0 && !force {
                    self.arena[j].freq = 0;
                    self.sketch.add(e.hash, e.freq);
                } else {
                    self.remember(j, false);
                    self.drop_entry(j, false);
                    self.hand = j + 1;
                    return;
                }
            }
            i = j + 1;
        }
    }

    /// The duel of the one-hand policies: window entry `j` against the
    /// next main entry the hand would evict (`take_victim`: visited ones
    /// ahead lose their marks, counted). The victim, if `j` wins: the
    /// sketch counts it more than the victim plus the margin.
    fn duel_ahead(&mut self, j: usize) -> Option<usize> {
        let count = self.sketch.estimate(self.arena[j].hash);
        let v = self.take_victim(j + 1)?;
        let victim = self.sketch.estimate(self.arena[v].hash);
        (count > victim.saturating_add(self.cfg.admit_margin)).then_some(v)
    }

    /// The next unvisited main entry at or after `from` (wrapping); the
    /// visited ones before it lose their marks (counted in the sketch).
    fn take_victim(&mut self, from: usize) -> Option<usize> {
        let n = self.arena.len();
        let mut i = if from >= n { 0 } else { from };
        for _ in 0..2 * n {
            let e = self.arena[i];
            if !e.evicted && !e.small {
                if e.freq == 0 {
                    return Some(i);
                }
                self.arena[i].freq = 0;
                self.sketch.add(e.hash, e.freq);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
        None
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

    /// Live bytes over all shards.
    pub fn live_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.live_bytes()).sum()
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Compactions over all shards.
    pub fn compactions(&self) -> u64 {
        self.shards.iter().map(|s| s.compactions()).sum()
    }

    /// Bytes copied by segment merges and moves over all shards.
    pub fn copied_bytes(&self) -> u64 {
        self.shards.iter().map(|s| s.copied_bytes()).sum()
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
    let mut bytes_sum = 0u128;
    let mut counted = 0u64;
    let mut all_sum = 0u128;
    let mut all_bytes = 0u128;
    for (key, size) in requests {
        out.requests += 1;
        out.bytes += size;
        if cache.access(key, size) {
            out.hits += 1;
            out.hit_bytes += size;
        }
        let len = cache.len() as u128;
        let live = cache.live_bytes() as u128;
        all_sum += len;
        all_bytes += live;
        if cache.compactions() > 0 {
            items_sum += len;
            bytes_sum += live;
            counted += 1;
        }
    }
    out.compactions = cache.compactions();
    out.copied_bytes = cache.copied_bytes();
    let mean = |steady: u128, all: u128| {
        if counted > 0 {
            steady as f64 / counted as f64
        } else if out.requests > 0 {
            all as f64 / out.requests as f64
        } else {
            0.0
        }
    };
    out.mean_items = mean(items_sum, all_sum);
    out.mean_bytes = mean(bytes_sum, all_bytes);
    out
}

/// The item limit (per-shard limits summed) whose steady-state mean
/// occupancy under `cfg.policy` is closest to `entries` on `requests`: the
/// engine's count is a sawtooth below its limit, so a cache compared with
/// an LRU of `entries` must hold that many on average, not at its peak.
/// Two rounds of proportional correction from `entries / (1 - f/2)`.
pub fn limit_for_mean(cfg: Config, entries: u64, requests: &[(u64, u64)]) -> u64 {
    let f = if cfg.queues {
        0.0 // one eviction at a time: the count stays at the limit
    } else if cfg.segments > 0 {
        1.0 / cfg.segments as f64
    } else {
        cfg.free_percent as f64 / 100.0
    };
    let mut limit = ((entries as f64) / (1.0 - f / 2.0)).round().max(1.0) as u64;
    // The largest limit known to compact (the first guess is below any
    // that would not: the mean is under the limit).
    let mut low = limit;
    let mut compacted = false;
    for _ in 0..4 {
        let mut c = cfg;
        c.max_items = limit;
        c.capacity_bytes = limit.saturating_mul(cfg.capacity_bytes.max(1)) / cfg.max_items.max(1);
        let o = replay(c, requests.iter().copied());
        compacted = o.compactions > 0 && o.mean_items > 0.0;
        if !compacted {
            // Past the trace's footprint: nothing is evicted. Step back.
            if limit == low {
                break;
            }
            limit = (limit + low) / 2;
            continue;
        }
        low = limit;
        let next = ((limit as f64) * entries as f64 / o.mean_items).round().max(1.0) as u64;
        if next == limit {
            break;
        }
        limit = next;
    }
    if compacted {
        limit
    } else {
        low
    }
}

#[cfg(test)]
pub(crate) mod reference;

#[cfg(test)]
mod tests;
