//! The eviction policy's shared state: a frequency sketch, two miniature
//! caches and the file's admission mode, in a policy header after the
//! segment table and a policy body after the index.
//!
//! Design (the study behind it: `docs/design/engine.md`, "Eviction: the
//! policy study", rounds five to seven; the model is `eviction::Policy::
//! WTinyLfuSwitch` with `Config::head_window`):
//! * Two admission modes. *Lenient* is SIEVE as the engine always ran it:
//!   every new entry is admitted and the hand evicts unvisited entries.
//!   *Strict* is W-TinyLFU's: the newest entries (the window: the head
//!   segment of a segmented shard, the entries appended since the last
//!   compaction in a shard of one segment) are judged when the window
//!   fills; one hit since it came in keeps an entry, and an unhit one
//!   (the candidate) meets the entry the SIEVE hand would evict next (the
//!   victim): the candidate stays and the victim goes if the sketch
//!   counts the candidate more than once more often, otherwise the
//!   candidate goes. That keeps a loop or a scan larger than the cache
//!   from turning the cache over, which no recency policy can.
//! * The file's mode (`EvictionMode`, in every shard's header): lenient
//!   (the default), strict, or adaptive: each shard runs the mode of the
//!   miniature with more hits lately, turning strict only on a clear win
//!   (strict admission costs writes more). A lenient file learns nothing:
//!   neither structure is fed.
//! * The sketch: a count-min sketch of four rows of 4-bit counters,
//!   conservative update, halved every ten times the shard's entries
//!   additions (TinyLFU's reset). It learns a key when the key is stored
//!   absent (the set holds the lock anyway) and when the hand clears an
//!   entry's visited bit (its hits): a hit writes nothing but the slot's
//!   bit, as before. Keyed by the entry's 31-bit tag. A lenient shard of an
//!   adaptive file counts only the sampled keys (the strict miniature's
//!   duels read their counts).
//! * Choosing the mode: miniature simulation (Waldspurger et al., ATC
//!   '17). Keys whose tag falls in one group of 2^k (k at most 5 while a
//!   miniature keeps 80 to 160 entries, more to keep it within its
//!   records; k follows the shard's capacity in entries, not its count,
//!   so it does not move while the shard fills) are replayed through two
//!   miniature caches of the shard's capacity over 2^k entries, one strict
//!   and one lenient (a FIFO window of 4% and a CLOCK main part of records
//!   that hold the tag and a visited bit, found through an index of
//!   fingerprints). A read is a request (hit or miss; each handle samples
//!   its lock-free reads and replays them at its next write to the shard:
//!   `Store::read_samples`); a store of an absent key puts the key in the
//!   miniatures. Hits are halved every four times a miniature's entries of
//!   sampled requests. A new sample rate empties them.
//! * Every word is a hint. The region is read with the same distrust as
//!   the rest of the shard: lengths, cursors and index slots are clamped
//!   to the region's geometry before use, so a hostile or torn region can
//!   make the policy choose badly, never make it read or write outside the
//!   region. Only lockers read or write it.
//!
//! Layout (`Geometry::policy_offset`, `policy_body_offset`,
//! `policy_size`): the 64-byte header (the words in `pol`); the body: the
//! sketch (`4 x width / 16` words), then two miniatures, each a 64-byte
//! header (`mini`), `minis + minis / 8` u32 records (the main part's
//! places, then the window's ring) and an index of u16 slots (record + 1;
//! 0 empty), twice the records rounded up to a power of two.

use super::ShardGuard;
use crate::layout::ENTRY_HEADER;
use std::ptr;

/// Words of the policy region's header.
mod pol {
    /// Bits 0-1: the mode of the file (0 lenient, the default; 1 strict;
    /// 2 adaptive); bit 8: adaptive, the miniatures chose strict.
    pub const MODE: usize = 0;
    /// Sketch additions since it was last halved.
    pub const SKETCH_ADDS: usize = 8;
    /// log2 of the miniatures' sample rate.
    pub const SAMPLE: usize = 16;
    /// Sampled requests since the miniatures' hits were last halved.
    pub const MINI_REQUESTS: usize = 24;
    /// The hits of the strict and of the lenient miniature, lately.
    pub const MINI_HITS: usize = 32;
    /// A shard of one segment: the arena offset where the window starts
    /// (the bump pointer after the last compaction).
    pub const WINDOW: usize = 48;
}

/// Words of a miniature's header.
mod mini {
    /// Records of the main part in use.
    pub const MAIN_LEN: usize = 0;
    /// The CLOCK hand over the main part.
    pub const HAND: usize = 8;
    /// The window ring: its oldest record and its length.
    pub const WIN_START: usize = 16;
    pub const WIN_LEN: usize = 24;
}

const PIN_MASK: u64 = 3;
/// The miniatures chose strict admission; a new shard starts lenient.
const RUNS_STRICT: u64 = 1 << 8;

/// How a file's shards choose their admission mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionMode {
    /// Each shard runs the mode its miniature caches do better with.
    Adaptive,
    /// Every new entry must win its place against the entry it would
    /// evict: frequency-aware, resists loops and scans.
    Strict,
    /// Every new entry is admitted (SIEVE): recency-friendly, and the
    /// default: the other two cost more per write (see the module docs).
    Lenient,
}

impl EvictionMode {
    fn pin(self) -> u64 {
        match self {
            EvictionMode::Lenient => 0,
            EvictionMode::Strict => 1,
            EvictionMode::Adaptive => 2,
        }
    }
}

/// The margin a candidate must win its duel by: a count-min sketch
/// overestimates, and on a loop its noise would otherwise let about a
/// quarter of the candidates in (the study's `wtinylfu-margin`).
const ADMIT_MARGIN: u8 = 1;

/// The sketch halves its counters every this many times the shard's
/// entries additions.
const SKETCH_AGING: u64 = 10;

/// The miniatures sample one key in `2^MINI_RATE_LOG2` at most (the
/// study's rate), fewer while that would leave them under about
/// `MINI_ENTRIES` entries: each sampled request costs a replay in both
/// under the shard's lock.
const MINI_RATE_LOG2: u32 = 5;
const MINI_ENTRIES: usize = 64;

/// The miniatures' hits are halved every this many times their entries
/// of sampled requests.
const MINI_DECAY: u64 = 4;

/// A lenient shard turns strict when its strict miniature's hits lately
/// exceed the lenient one's by a 1/`STRICT_WIN_RATIO` part and
/// `STRICT_WIN_HITS` more.
const STRICT_WIN_RATIO: u64 = 4;
const STRICT_WIN_HITS: u64 = 4;

/// The window's share of a miniature, in percent.
const MINI_WINDOW_PERCENT: usize = 4;

/// Multiplier of the sketch's remix of a tag (splitmix64's).
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// The visited bit of a miniature's record; the rest is the tag (never 0).
const REC_VISITED: u32 = 1 << 31;

impl ShardGuard<'_> {
    fn pol(&self, field: usize) -> u64 {
        debug_assert!(field + 8 <= 64);
        // SAFETY: a word of the 64-byte policy header (the constants in
        // `pol`), 8-aligned, inside the shard before the index.
        unsafe {
            ptr::read_volatile(self.shard.base.add(self.shard.policy_off + field) as *const u64)
        }
    }

    fn set_pol(&self, field: usize, v: u64) {
        debug_assert!(field + 8 <= 64);
        // SAFETY: as in pol; the lock is held.
        unsafe {
            ptr::write_volatile(self.shard.base.add(self.shard.policy_off + field) as *mut u64, v)
        }
    }

    /// A pointer `off` bytes into the policy body.
    fn body_ptr(&self, off: usize) -> *mut u8 {
        assert!(off < self.shard.policy_size);
        // SAFETY: off is inside the body (checked), which lies inside the
        // shard between the index and the arena.
        unsafe { self.shard.base.add(self.shard.policy_body_off + off) }
    }

    /// Whether the policy body may be used: always in a preallocated
    /// file; in a lazy one while the arena holds reserved bytes (its
    /// first growth reserves the body; `release_memory` gives both back).
    fn armed(&self) -> bool {
        !self.shard.lazy || self.hdr(crate::layout::sh::ARENA_RESERVED) != 0
    }

    /// Whether the shard admits new entries strictly now.
    pub(super) fn strict(&self) -> bool {
        let mode = self.pol(pol::MODE);
        if !self.armed() {
            return false;
        }
        match mode & PIN_MASK {
            1 => true,
            2 => mode & RUNS_STRICT != 0,
            _ => false,
        }
    }

    /// Whether the shard runs strict now (`strict`, for statistics).
    pub(crate) fn runs_strict(&self) -> bool {
        self.strict()
    }

    /// Pin the mode (or let the miniatures choose again).
    pub(crate) fn pin_eviction(&self, m: EvictionMode) {
        let mode = self.pol(pol::MODE);
        self.set_pol(pol::MODE, mode & !PIN_MASK | m.pin());
    }

    /// The pinned mode.
    pub(crate) fn eviction_mode(&self) -> EvictionMode {
        match self.pol(pol::MODE) & PIN_MASK {
            1 => EvictionMode::Strict,
            2 => EvictionMode::Adaptive,
            _ => EvictionMode::Lenient,
        }
    }

    /// Empty the sketch and the miniatures, keeping the pin (a reset
    /// shard starts afresh).
    pub(super) fn reset_policy(&self) {
        let pin = self.pol(pol::MODE) & PIN_MASK;
        for field in (0..64).step_by(8) {
            self.set_pol(field, 0);
        }
        self.set_pol(pol::MODE, pin);
        if self.armed() {
            // SAFETY: the whole body, inside the shard and reserved while
            // armed; the lock is held (or the shard is being initialised
            // by its only user).
            unsafe { ptr::write_bytes(self.body_ptr(0), 0, self.shard.policy_size) };
        }
    }

    // ---- the sketch ----

    fn sketch_word(&self, row: usize, i: usize) -> *mut u64 {
        let width = self.shard.sketch_width;
        debug_assert!(row < 4 && i < width);
        self.body_ptr((row * width / 16 + i / 16) * 8) as *mut u64
    }

    fn sketch_index(&self, tag: u32, row: usize) -> usize {
        let h = ((tag as u64) ^ ((tag as u64) << 31)).wrapping_mul(MIX);
        ((h >> (16 * row)) as usize) & (self.shard.sketch_width - 1)
    }

    fn counter(&self, row: usize, i: usize) -> u8 {
        // SAFETY: sketch_word is inside the region for row < 4, i < width.
        let w = unsafe { ptr::read_volatile(self.sketch_word(row, i)) };
        ((w >> ((i % 16) * 4)) & 0xf) as u8
    }

    /// The sketch's estimate of how often the key of `tag` was seen.
    pub(super) fn estimate(&self, tag: u32) -> u8 {
        (0..4).map(|r| self.counter(r, self.sketch_index(tag, r))).min().unwrap_or(0)
    }

    /// Whether a candidate of `cand` (a tag) takes the place of `victim`.
    pub(super) fn wins(&self, cand: u32, victim: u32) -> bool {
        self.estimate(cand) > self.estimate(victim).saturating_add(ADMIT_MARGIN)
    }

    /// Count the key of `tag` once (conservative update).
    fn sketch_add(&self, tag: u32) {
        let idx: [usize; 4] = std::array::from_fn(|r| self.sketch_index(tag, r));
        let floor = (0..4).map(|r| self.counter(r, idx[r])).min().unwrap_or(0);
        if floor < 15 {
            for (r, &i) in idx.iter().enumerate() {
                if self.counter(r, i) == floor {
                    let p = self.sketch_word(r, i);
                    let shift = (i % 16) * 4;
                    // SAFETY: as in counter; the lock is held. Wrapping: the
                    // nibble was under 15 when read, but another program
                    // may have written the word since.
                    unsafe {
                        ptr::write_volatile(p, ptr::read_volatile(p).wrapping_add(1 << shift))
                    };
                }
            }
        }
        let adds = self.pol(pol::SKETCH_ADDS).saturating_add(1);
        let items = (self.hdr(crate::layout::sh::ITEMS) as usize).clamp(64, self.shard.slots);
        if adds >= SKETCH_AGING * items as u64 {
            self.halve_sketch();
            self.set_pol(pol::SKETCH_ADDS, adds / 2);
        } else {
            self.set_pol(pol::SKETCH_ADDS, adds);
        }
    }

    fn halve_sketch(&self) {
        for w in 0..self.shard.sketch_width / 4 {
            let p = self.body_ptr(w * 8) as *mut u64;
            // SAFETY: the sketch's 4 x width / 16 words open the body; the
            // lock is held.
            unsafe { ptr::write_volatile(p, (ptr::read_volatile(p) >> 1) & 0x7777_7777_7777_7777) };
        }
    }

    // ---- what the policy learns ----

    /// A key of `tag` missed (a set of an absent key).
    pub(super) fn note_miss(&self, tag: u32) {
        if !self.learns() {
            return;
        }
        let sampled = self.sampled(tag);
        if sampled || self.strict() {
            self.sketch_add(tag);
        }
        if sampled {
            self.replay_sampled(tag, false);
        }
    }

    /// The hand cleared the visited bit of the entry of `tag`: a hit, or
    /// several, for the sketch.
    pub(super) fn note_hit(&self, tag: u32) {
        if self.learns() && (self.sampled(tag) || self.strict()) {
            self.sketch_add(tag);
        }
    }

    /// Whether the policy learns at all: not in a file that admits
    /// leniently (the default: SIEVE, which needs neither the sketch nor
    /// the miniatures), nor before a lazy shard reserved its body.
    fn learns(&self) -> bool {
        self.pol(pol::MODE) & PIN_MASK != 0 && self.armed()
    }

    /// Whether the key of `tag` is in the miniatures' sample. A lenient
    /// shard counts only those keys in its sketch (the strict miniature's
    /// duels read their counts): the sketch costs it a sampled part of its
    /// writes and of its hand's work, not all of it; a strict shard counts
    /// every key.
    fn sampled(&self, tag: u32) -> bool {
        tag & ((1u32 << self.pol(pol::SAMPLE).min(31)) - 1) == 0
    }

    /// Sampled reads a handle recorded (lock-free, hits and misses:
    /// `Store::read_samples`), replayed through the miniatures. Returns the
    /// sample rate's log2 for the handle's next samples.
    pub(crate) fn replay_reads(&self, tags: &[u32]) -> u32 {
        if !self.learns() {
            // Samples nothing until the file learns: 2^31 never matches.
            return 31;
        }
        for &tag in tags {
            self.replay_sampled(tag, true);
        }
        (self.pol(pol::SAMPLE) as u32).min(31)
    }

    /// The arena offset where a shard of one segment's window starts.
    pub(super) fn window_start(&self) -> usize {
        self.pol(pol::WINDOW) as usize
    }

    pub(super) fn set_window_start(&self, off: usize) {
        self.set_pol(pol::WINDOW, off as u64);
    }

    // ---- the miniatures ----

    /// The sample rate's log2, moved so that a miniature holds between
    /// `MINI_LEAST` and its record count (a move empties them); and the
    /// entries each holds.
    fn sample(&self) -> (u32, usize) {
        // The entries the shard holds when full: its arena over the mean
        // entry so far, within the index's load limit. Known from the first
        // entries on, so the rate does not move (and empty the miniatures)
        // while the shard fills.
        let live = self.hdr(crate::layout::sh::LIVE_BYTES) as usize;
        let count = self.hdr(crate::layout::sh::ITEMS) as usize;
        let limit = self.shard.slots * 3 / 4;
        let items = if count == 0 || live < count {
            count.min(limit)
        } else {
            (self.shard.arena_size / (live / count).max(ENTRY_HEADER)).min(limit)
        };
        // One key in 2^log2: up to one in `2^MINI_RATE_LOG2` while that
        // leaves a miniature `MINI_ENTRIES` entries or more (80 to 160),
        // then fewer, keeping it within its records. Each bound has room
        // to spare on the other side (a rate that moved back and forth
        // would empty the miniatures at every move).
        let recs = self.shard.mini_records;
        let mut log2 = (self.pol(pol::SAMPLE) as u32).min(31);
        let start = log2;
        for _ in 0..64 {
            let cap = items >> log2;
            if log2 < 31 && (cap > recs || log2 < MINI_RATE_LOG2 && cap >= 5 * MINI_ENTRIES / 2) {
                log2 += 1;
            } else if log2 > 0 && log2 <= MINI_RATE_LOG2 && cap < 3 * MINI_ENTRIES / 4
                || log2 > MINI_RATE_LOG2 && items >> (log2 - 1) <= recs * 3 / 4
            {
                log2 -= 1;
            } else {
                break;
            }
        }
        if log2 != start {
            self.set_pol(pol::SAMPLE, log2 as u64);
            for m in 0..2 {
                for w in [mini::MAIN_LEN, mini::HAND, mini::WIN_START, mini::WIN_LEN] {
                    self.set_mini(m, w, 0);
                }
                for j in 0..self.index_len() {
                    self.set_index_slot(m, j, 0);
                }
            }
            self.set_pol(pol::MINI_REQUESTS, 0);
            self.set_pol(pol::MINI_HITS, 0);
            self.set_pol(pol::MINI_HITS + 8, 0);
        }
        (log2, (items >> log2).clamp(1, self.shard.mini_records))
    }

    fn mini_base(&self, m: usize) -> usize {
        let recs = self.shard.mini_records;
        4 * self.shard.sketch_width / 2 + m * (64 + 4 * (recs + recs / 8) + 2 * self.index_len())
    }

    fn mini(&self, m: usize, field: usize) -> usize {
        // SAFETY: a word of miniature m's header, inside the body, 8-aligned.
        unsafe {
            ptr::read_volatile(self.body_ptr(self.mini_base(m) + field) as *const u64) as usize
        }
    }

    fn set_mini(&self, m: usize, field: usize, v: usize) {
        // SAFETY: as in mini; the lock is held.
        unsafe {
            ptr::write_volatile(self.body_ptr(self.mini_base(m) + field) as *mut u64, v as u64)
        }
    }

    /// Record `i` of miniature `m`: the main part's for `i < minis`, then
    /// the window ring's.
    fn rec_ptr(&self, m: usize, i: usize) -> *mut u32 {
        let recs = self.shard.mini_records;
        assert!(i < recs + recs / 8);
        self.body_ptr(self.mini_base(m) + 64 + 4 * i) as *mut u32
    }

    fn rec(&self, m: usize, i: usize) -> u32 {
        // SAFETY: rec_ptr checks i against the records; 4-aligned.
        unsafe { ptr::read_volatile(self.rec_ptr(m, i)) }
    }

    fn set_rec(&self, m: usize, i: usize, v: u32) {
        // SAFETY: as in rec; the lock is held.
        unsafe { ptr::write_volatile(self.rec_ptr(m, i), v) }
    }

    /// Replay a request for the key of `tag` through both miniatures if
    /// its tag is sampled, and take the mode of the one with more hits.
    /// A read (`counted`) is a request: it hits or misses, and a miss
    /// stores the key (as a cache-aside caller does). A store of an absent
    /// key is not a request of its own (a read missed it first, or nothing
    /// asked for it): it only puts the key in the miniatures.
    fn replay_sampled(&self, tag: u32, counted: bool) {
        let (log2, entries) = self.sample();
        if tag & ((1u32 << log2) - 1) != 0 {
            return;
        }
        let fp = (tag & !REC_VISITED).max(1);
        if !counted {
            for m in 0..2 {
                self.mini_access(m, fp, entries, false);
            }
            return;
        }
        let mut hits = [self.pol(pol::MINI_HITS), self.pol(pol::MINI_HITS + 8)];
        for (m, h) in hits.iter_mut().enumerate() {
            *h = h.saturating_add(self.mini_access(m, fp, entries, true) as u64);
        }
        let mut requests = self.pol(pol::MINI_REQUESTS).saturating_add(1);
        if requests >= MINI_DECAY * entries as u64 {
            requests = 0;
            hits = hits.map(|h| h / 2);
        }
        self.set_pol(pol::MINI_REQUESTS, requests);
        self.set_pol(pol::MINI_HITS, hits[0]);
        self.set_pol(pol::MINI_HITS + 8, hits[1]);
        // Strict admission costs more per write (a full head is judged in
        // one write): a shard turns strict only on a clear win, and back as
        // soon as lenient admission hits more.
        let mode = self.pol(pol::MODE);
        let strict = if mode & RUNS_STRICT == 0 {
            hits[0] > hits[1].saturating_add(hits[1] / STRICT_WIN_RATIO + STRICT_WIN_HITS)
        } else {
            hits[0] >= hits[1]
        };
        if strict != (mode & RUNS_STRICT != 0) {
            self.set_pol(pol::MODE, mode & !RUNS_STRICT | if strict { RUNS_STRICT } else { 0 });
        }
    }

    /// One request for `fp` in miniature `m` (0 strict, 1 lenient) of
    /// `entries` entries (a store, not `counted`, does not mark a present
    /// key). Returns whether it hit.
    fn mini_access(&self, m: usize, fp: u32, entries: usize, counted: bool) -> bool {
        let recs = self.shard.mini_records;
        let ring = recs / 8;
        let win_cap = (entries * MINI_WINDOW_PERCENT / 100).clamp(1, ring);
        let main_cap = entries.saturating_sub(win_cap).clamp(1, recs);
        // Every word clamped to the records: a hint, never a bound.
        let mut main_len = self.mini(m, mini::MAIN_LEN).min(recs);
        let mut win_start = self.mini(m, mini::WIN_START) % ring;
        let mut win_len = self.mini(m, mini::WIN_LEN).min(ring);
        if let Some((_, pos)) = self.mini_find(m, fp) {
            let r = self.rec(m, pos);
            if r & REC_VISITED == 0 && counted {
                self.set_rec(m, pos, r | REC_VISITED);
            }
            return true;
        }
        // A miss: the key enters the window; the oldest over its share
        // are judged, one at a time.
        if win_len == ring {
            self.mini_forget(m, recs + win_start);
            win_start = (win_start + 1) % ring;
            win_len -= 1;
        }
        let at = recs + (win_start + win_len) % ring;
        self.set_rec(m, at, fp);
        self.mini_index(m, fp, at);
        win_len += 1;
        while main_len > main_cap {
            // The shard holds fewer entries than it did: so does the
            // miniature.
            main_len -= 1;
            self.mini_forget(m, main_len);
        }
        while win_len > win_cap {
            let from = recs + win_start;
            let cand = self.rec(m, from);
            win_start = (win_start + 1) % ring;
            win_len -= 1;
            if cand & !REC_VISITED == 0 {
                continue;
            }
            if main_len < main_cap {
                self.mini_move(m, from, main_len);
                main_len += 1;
                continue;
            }
            let v = self.mini_victim(m, main_len);
            let admit = m == 1
                || cand & REC_VISITED != 0
                || self.wins(cand & !REC_VISITED, self.rec(m, v) & !REC_VISITED);
            if admit {
                self.mini_forget(m, v);
                self.mini_move(m, from, v);
                self.set_mini(m, mini::HAND, (v + 1) % main_len);
            } else {
                self.mini_forget(m, from);
            }
        }
        self.set_mini(m, mini::MAIN_LEN, main_len);
        self.set_mini(m, mini::WIN_START, win_start);
        self.set_mini(m, mini::WIN_LEN, win_len);
        false
    }

    // ---- a miniature's index: fingerprint -> record, linear probing ----

    /// Slots of a miniature's index: twice its records, a power of two.
    fn index_len(&self) -> usize {
        let recs = self.shard.mini_records;
        (2 * (recs + recs / 8)).next_power_of_two()
    }

    fn slot_ptr(&self, m: usize, j: usize) -> *mut u16 {
        let recs = self.shard.mini_records;
        assert!(j < self.index_len());
        self.body_ptr(self.mini_base(m) + 64 + 4 * (recs + recs / 8) + 2 * j) as *mut u16
    }

    fn index_slot(&self, m: usize, j: usize) -> usize {
        // SAFETY: slot_ptr checks j against the index; 2-aligned.
        unsafe { ptr::read_volatile(self.slot_ptr(m, j)) as usize }
    }

    fn set_index_slot(&self, m: usize, j: usize, v: usize) {
        // SAFETY: as in index_slot; the lock is held.
        unsafe { ptr::write_volatile(self.slot_ptr(m, j), v as u16) }
    }

    fn home(&self, fp: u32) -> usize {
        ((fp as u64).wrapping_mul(MIX) >> 40) as usize & (self.index_len() - 1)
    }

    /// The record of `fp` in miniature `m`: (index slot, record). A slot
    /// holds a record's position + 1 (0: empty); a slot whose record does
    /// not hold `fp` (another key, or a region a crash or another program
    /// left out of step) is passed over.
    fn mini_find(&self, m: usize, fp: u32) -> Option<(usize, usize)> {
        let (len, total) = (self.index_len(), self.mini_total());
        let mut j = self.home(fp);
        for _ in 0..len {
            let v = self.index_slot(m, j);
            if v == 0 {
                return None;
            }
            if v <= total && self.rec(m, v - 1) & !REC_VISITED == fp {
                return Some((j, v - 1));
            }
            j = (j + 1) & (len - 1);
        }
        None
    }

    /// Records of a miniature: the main part's, then the window ring's.
    fn mini_total(&self) -> usize {
        self.shard.mini_records + self.shard.mini_records / 8
    }

    /// Index `fp`, held in record `pos`.
    fn mini_index(&self, m: usize, fp: u32, pos: usize) {
        let len = self.index_len();
        let mut j = self.home(fp);
        for _ in 0..len {
            if self.index_slot(m, j) == 0 {
                self.set_index_slot(m, j, pos + 1);
                return;
            }
            j = (j + 1) & (len - 1);
        }
    }

    /// Move the key of record `from` to record `to` (its index slot
    /// follows).
    fn mini_move(&self, m: usize, from: usize, to: usize) {
        let r = self.rec(m, from);
        match self.mini_find(m, r & !REC_VISITED) {
            Some((j, pos)) if pos == from => self.set_index_slot(m, j, to + 1),
            _ => self.mini_index(m, r & !REC_VISITED, to),
        }
        self.set_rec(m, to, r);
    }

    /// Drop the key of record `pos` from the index (the record itself is
    /// overwritten by its next use). Backward-shift deletion: the slots
    /// after it move up into the hole while that brings them nearer home.
    fn mini_forget(&self, m: usize, pos: usize) {
        let r = self.rec(m, pos);
        let Some((mut hole, found)) = self.mini_find(m, r & !REC_VISITED) else { return };
        if found != pos {
            return;
        }
        let (len, total) = (self.index_len(), self.mini_total());
        let mut k = (hole + 1) & (len - 1);
        for _ in 0..len {
            let v = self.index_slot(m, k);
            if v == 0 {
                break;
            }
            let home = if v <= total { self.home(self.rec(m, v - 1) & !REC_VISITED) } else { k };
            if (k.wrapping_sub(home) & (len - 1)) >= (k.wrapping_sub(hole) & (len - 1)) {
                self.set_index_slot(m, hole, v);
                hole = k;
            }
            k = (k + 1) & (len - 1);
        }
        self.set_index_slot(m, hole, 0);
    }

    /// The CLOCK victim of miniature `m`'s main part of `len` (> 0)
    /// records: the hand clears visited records until an unvisited one.
    fn mini_victim(&self, m: usize, len: usize) -> usize {
        let mut hand = self.mini(m, mini::HAND) % len;
        for _ in 0..=len {
            let r = self.rec(m, hand);
            if r & REC_VISITED == 0 {
                break;
            }
            self.set_rec(m, hand, r & !REC_VISITED);
            hand = (hand + 1) % len;
        }
        self.set_mini(m, mini::HAND, hand);
        hand
    }
}
