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
//! * The file's mode (`EvictionMode`, in every shard's header): adaptive
//!   (the default: each shard runs the mode of the miniature with more
//!   hits lately, turning strict only on a clear win, as strict admission
//!   costs writes more, and lenient only when lenient admission hits
//!   surely more, by more than chance on the sampled reads where the two
//!   miniatures disagreed lately: a strict shard with reads stays strict
//!   on a tie or a lead of a hit, as what it holds would not be won back
//!   soon; until its miniatures have seen enough, a shard admits
//!   strictly unless lenient admission already hits more, so that a loop
//!   is held from its start; a shard strict by choice that turned lenient
//!   turns strict again on a lead of more than a deviation for two
//!   periods, `AdmissionChoice::next`), strict, or lenient. A lenient
//!   file learns nothing: neither structure is fed.
//! * The young share of an adaptive shard's lenient admission: a twelfth
//!   (`YOUNG_SHARE`, see `compaction.rs`), or half (`YOUNG_SHARE_HALF`)
//!   while its lenient CLOCK miniature hits clearly more than its SIEVE
//!   one, as on a working set that moves (engine.md, "Round eleven").
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
//!   so it does not move while the shard fills) are replayed through three
//!   miniature caches of the shard's capacity over 2^k entries: one
//!   strict and one lenient (a FIFO window of 4% and a CLOCK main part),
//!   which choose the mode, and one that runs SIEVE as a lenient shard
//!   does (records in the order their keys came, with the holes of those
//!   evicted, closed up when the appends reach the last record; a twelfth
//!   of them young), which with the CLOCK one chooses the young share.
//!   Records hold the tag and a visited bit and are found through an
//!   index of fingerprints. A read is a request (hit or miss); a store of an
//!   absent key puts the key in the miniatures. Hits are halved every four
//!   times a miniature's entries of sampled requests. A new sample rate
//!   empties them.
//! * What strict admission refused, and whether it came back. An adaptive
//!   shard that admits strictly follows the candidates it refuses (a
//!   probe each, one place per tag: 32 or 64 places, `refusals`) from
//!   the earliest they can have come in (a segmented shard: the start of
//!   their judgement's window; a shard of one segment, whose judgements
//!   leave part of the window for the next: their group in the window's
//!   queue by arrival, `WindowArrivals`), and learns at the store of an absent key whether one came
//!   back within three quarters of the shard's entries in requests, where
//!   a recency policy would still have held it, or stayed away that long.
//!   Eight in a row that came back turn it lenient at once, with the way
//!   back of a shard that turned lenient by choice (engine.md, "Round
//!   sixteen"): the new keys of a working set that moved come back within
//!   a few hundred requests of the move, long before the miniatures' one
//!   key in 32 can tell; a key of a loop larger than the cache comes back
//!   only after more requests than the cache holds entries. The clock is
//!   the sampled requests the miniatures replayed, and those a handle
//!   holds for its next replay.
//! * Two locks. The shard's lock guards the sketch, the window and the
//!   pin; the miniatures have a lock of their own (`Minis`), only ever
//!   tried. Each handle keeps its sampled requests per shard (`Samples`,
//!   as many as a miniature has records: a run of hits as long as the
//!   shard's entries; reads are lock-free, stores are noted by the
//!   write) and replays them
//!   after its next write to the shard has let go of the shard's lock, if
//!   the miniatures' lock is free; else they wait for its next write. So
//!   a write holds the shard's lock no longer for the miniatures, and no
//!   one ever waits for them.
//! * Every word is a hint. The region is read with the same distrust as
//!   the rest of the shard: lengths, cursors and index slots are clamped
//!   to the region's geometry before use, so a hostile or torn region can
//!   make the policy choose badly, never make it read or write outside the
//!   region. Every word is read and written as an atomic (the two lock
//!   holders share the header, and the miniatures read the sketch).
//!
//! Layout (`Geometry::policy_offset`, `policy_body_offset`,
//! `policy_size`): the 64-byte header (the words in `pol`); the body: the
//! sketch (`4 x width / 16` words), then three miniatures, each a 64-byte
//! header (`mini`), `minis + minis / 2` u32 records (the main part's
//! places, then the window's ring, an eighth, of the strict and CLOCK
//! ones; the SIEVE one's in order) and an index of u16 slots (record + 1;
//! 0 empty), twice the records rounded up to a power of two; then, the
//! body's last bytes, the refusals' record (a 64-byte header, the words in
//! `refusals`, and its probes; none in the smallest shards).

use super::compaction::YOUNG_SHARE;
use super::{Shard, ShardGuard};
use crate::layout::{sh, ENTRY_HEADER};
use crate::lock;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::OnceLock;

/// Words of the policy region's header.
mod pol {
    /// Bits 0-1: the mode of the file (0 lenient; 1 strict; 2 adaptive,
    /// which a new file's shards are set to); bit 8: adaptive, the
    /// miniatures chose strict.
    pub const MODE: usize = 0;
    /// Sketch additions since it was last halved.
    pub const SKETCH_ADDS: usize = 8;
    /// log2 of the miniatures' sample rate.
    pub const SAMPLE: usize = 16;
    /// Low 32 bits: sampled requests (reads and stores) since the
    /// miniatures' hits were last halved; high 32 bits: sampled reads,
    /// lately (halved with the hits).
    pub const MINI_REQUESTS: usize = 24;
    /// The hits of the strict and of the lenient miniature, lately.
    pub const MINI_HITS: usize = 32;
    /// A shard of one segment: the arena offset where the window starts
    /// (the bump pointer after the last compaction).
    pub const WINDOW: usize = 48;
    /// The miniatures' lock (a 32-bit word: 0 free, else the holder's
    /// pid; see `Minis`).
    pub const MINIS_LOCK: usize = 56;
}

/// Words of a miniature's header.
mod mini {
    /// Records of the main part in use (the strict miniature); records
    /// that hold a key (the lenient ones).
    pub const MAIN_LEN: usize = 0;
    /// The CLOCK hand over the main part (strict); SIEVE's hand, a record
    /// (lenient).
    pub const HAND: usize = 8;
    /// The window ring: its oldest record and its length (strict); the
    /// records appended since the last close-up, holes counted
    /// (lenient, `WIN_LEN`).
    pub const WIN_START: usize = 16;
    pub const WIN_LEN: usize = 24;
    /// The SIEVE miniature's hits, lately (in its header only: the
    /// policy header is full).
    pub const HITS: usize = 32;
    /// Sampled reads on which the strict and the CLOCK miniature
    /// disagreed, lately: in the strict one's header, those it hit and
    /// the CLOCK one missed; in the CLOCK one's, the other way round.
    pub const ONLY_HITS: usize = 40;
}

/// Words of the refusals' record, the policy body's last
/// `Geometry::refusals_size` bytes: the candidates a strict adaptive
/// shard refused lately, to learn whether they come back soon
/// (`ShardGuard::note_refused`, `note_return`).
mod refusals {
    /// The shard's clock: low 32 bits, the sampled requests (reads and
    /// stores) the miniatures replayed or dropped (wrapping); high 32
    /// bits, the horizon in those requests (three quarters of a
    /// miniature's entries: as many requests as three quarters of the
    /// shard's entries). Written by the miniatures' lock holder alone.
    pub const CLOCK: usize = 0;
    /// Low 32 bits: refused candidates that came back within the horizon,
    /// in a row; high 32 bits: the clock at the last of them.
    pub const RUN: usize = 8;
    /// The clock at the last two judgements of the window: low 32 bits,
    /// the last; high 32 bits, the one before (`ShardGuard::
    /// judgement_clock`).
    pub const JUDGED: usize = 16;
    /// A shard of one segment: its window in arrival order, oldest first,
    /// in `ARRIVAL_GROUPS` words (`WindowArrivals`): high 32 bits, how
    /// many of the window's entries; low 32 bits, the clock by which
    /// they had not come in (0 words: none).
    pub const ARRIVALS: usize = 24;
    /// The probes (`Geometry::refusal_probes`, 32 or 64) from here, one
    /// place per tag (`probe_place`): 0 empty, else bit 63, the clock by
    /// which the refused candidate had not come in (`judgement_clock`, or
    /// its group's in `ARRIVALS`) in bits 31-62, the tag in bits 0-30.
    pub const PROBE: usize = crate::layout::REFUSALS_HEADER;
}

/// Groups of the window's entries by arrival (`refusals::ARRIVALS`).
const ARRIVAL_GROUPS: usize = 4;

/// A probe word holds a candidate (`refusals::PROBE`).
const PROBE_SET: u64 = 1 << 63;
/// The bits of a tag a probe keeps (tags are 31 bits: bit 31 of a sample
/// marks a store).
const PROBE_TAG: u64 = (1 << 31) - 1;

/// The window of a shard of one segment by arrival, for one judgement
/// (`ShardGuard::window_arrivals`): groups of entries, oldest first, each
/// with the clock by which its entries had not come in.
pub(super) struct WindowArrivals {
    groups: Vec<(usize, u32)>,
}

impl WindowArrivals {
    /// The entries the groups hold.
    fn len(&self) -> usize {
        self.groups.iter().map(|g| g.0).sum()
    }

    /// Take `n` entries out of the queue, from its newest end or its
    /// oldest, emptied groups with them.
    fn take(&mut self, mut n: usize, newest: bool) {
        while n > 0 {
            let at = if newest { self.groups.len().wrapping_sub(1) } else { 0 };
            let Some(group) = self.groups.get_mut(at) else { break };
            let taken = group.0.min(n);
            group.0 -= taken;
            n -= taken;
            if group.0 == 0 {
                self.groups.remove(at);
            }
        }
    }

    /// The clock by which the window's entry at `pos` (0: the oldest) had
    /// not come in; 0 without a record.
    pub(super) fn came_in(&self, pos: usize) -> u32 {
        let mut before = 0;
        for &(count, clock) in &self.groups {
            before += count;
            if pos < before {
                return clock;
            }
        }
        self.groups.last().map_or(0, |g| g.1)
    }
}

/// The place among `probes` of the probe for the key of `tag`: its tag's
/// bits mixed (the low bits choose the miniatures' sample).
fn probe_place(tag: u64, probes: usize) -> usize {
    ((tag ^ tag << 31).wrapping_mul(MIX) >> 32) as usize % probes
}

/// Refused candidates that came back within the horizon, in a row, that
/// turn a shard that admits strictly by choice lenient (engine.md, "Round
/// sixteen").
const RETURNS_TO_LEAVE: u64 = 8;

/// The miniatures: strict admission (0), lenient admission walked like
/// CLOCK (1), lenient admission as a shard runs it, SIEVE keeping a
/// twelfth of its entries young (2).
const MINIS: usize = 3;

const PIN_MASK: u64 = 3;
/// The miniatures chose strict admission.
const RUNS_STRICT: u64 = 1 << 8;
/// The bits of `MODE` that mean something (a guard keeps them in a u16).
const MODE_BITS: u64 = PIN_MASK | CHOICE_BITS | YOUNG_HALF;
/// A guard that has not read `MODE` yet (`ShardGuard::mode`).
pub(super) const MODE_UNREAD: u16 = u16::MAX;
/// The miniatures have seen enough to choose (their first period of
/// `MINI_DECAY` times their entries of sampled requests): until then an
/// adaptive shard admits strictly, so that a loop is held from the start
/// and a workload that favours recency costs strict admission's writes
/// only while the shard warms up.
const WARM: u64 = 1 << 9;
/// Adaptive, lenient admission: the miniatures chose to keep the newest
/// half of the entries young instead of a twelfth (`young_share`).
const YOUNG_HALF: u64 = 1 << 10;
/// Adaptive, lenient admission: the periods left in which the shard turns
/// strict again on a lead beyond a deviation (`AdmissionChoice::
/// way_back`), bits 11-12.
const WAY_BACK_SHIFT: u32 = 11;
const WAY_BACK_MASK: u64 = 3 << WAY_BACK_SHIFT;
/// The bits of `MODE` that hold the miniatures' choice
/// (`AdmissionChoice::mode_bits`).
const CHOICE_BITS: u64 = RUNS_STRICT | WARM | WAY_BACK_MASK;
/// A shard strict by choice that turns lenient may turn strict again on a
/// lead beyond a deviation until this many of its miniatures' periods
/// have ended: the rest of the one in which it turned, and the next.
const WAY_BACK_PERIODS: u8 = 2;

/// How a file's shards choose their admission mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EvictionMode {
    /// Each shard runs the mode its miniature caches do better with: the
    /// default, set in every shard of a new file.
    #[default]
    Adaptive,
    /// Every new entry must win its place against the entry it would
    /// evict: frequency-aware, resists loops and scans.
    Strict,
    /// Every new entry is admitted (SIEVE): recency-friendly; learns
    /// nothing, so it costs the least per read and write (see the module
    /// docs). Files made before adaptive admission became the default
    /// (their pin is 0) stay lenient.
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

/// The log2 of the miniatures' sample rate for a shard of `items` entries
/// and miniatures of `recs` records, moved from `log2`: one key in
/// `2^MINI_RATE_LOG2` while that leaves a miniature `MINI_ENTRIES` entries
/// or more (80 to 160), fewer while it would leave it under about 48, more
/// while it would hold more entries than its records. Each bound has room
/// to spare on the other side, as a rate that moved back and forth would
/// empty the miniatures at every move; and a rate leaves its records'
/// bound only for one within it, so that small miniatures, whose records
/// leave no room between the two bounds, settle instead of swinging
/// between two rates.
fn sample_rate(items: usize, recs: usize, mut log2: u32) -> u32 {
    let within = |log2: u32| items >> log2 <= recs;
    // Each step moves towards a rate the bounds keep: at most 31 up, or
    // down to the first one within them.
    for _ in 0..64 {
        let cap = items >> log2;
        if log2 < 31 && (!within(log2) || log2 < MINI_RATE_LOG2 && cap >= 5 * MINI_ENTRIES / 2) {
            log2 += 1;
        } else if log2 > 0
            && within(log2 - 1)
            && (log2 <= MINI_RATE_LOG2 && cap < 3 * MINI_ENTRIES / 4
                || log2 > MINI_RATE_LOG2 && items >> (log2 - 1) <= recs * 3 / 4)
        {
            log2 -= 1;
        } else {
            break;
        }
    }
    log2
}

/// The young share (`compaction.rs`, `YOUNG_SHARE`) of an adaptive shard
/// whose CLOCK miniature hits clearly more than its SIEVE one: a working
/// set that moves (engine.md, "Round eleven"). CLOCK puts a new key
/// behind its hand, where it waits a whole lap; SIEVE keeping half its
/// entries young hits as CLOCK does, within a hit or two, where the
/// twelfth differs by a few in a hundred either way.
pub(super) const YOUNG_SHARE_HALF: usize = 2;

/// An adaptive shard keeps half its entries young once the lenient
/// CLOCK miniature's hits lately exceed the SIEVE miniature's by a
/// 1/`YOUNG_WIN_RATIO` part and `YOUNG_WIN_HITS` more, and goes back to a
/// twelfth on the same lead the other way. Both hit within a hit or two of
/// each other where the share does not matter (a cache holding most of a
/// skewed set), and that must not move the share back and forth.
const YOUNG_WIN_RATIO: u64 = 64;
const YOUNG_WIN_HITS: u64 = 2;

/// The miniatures' hits are halved every this many times their entries
/// of sampled requests.
const MINI_DECAY: u64 = 4;

/// A lenient shard turns strict when its strict miniature's hits lately
/// exceed the lenient one's by a 1/`STRICT_WIN_RATIO` part and
/// `STRICT_WIN_HITS` more.
const STRICT_WIN_RATIO: u64 = 4;
const STRICT_WIN_HITS: u64 = 4;

/// Whether the miniature that alone hit `x` of the sampled reads on
/// which two miniatures disagreed lately (the other alone hit `y`) leads
/// by more than `half_deviations` halves of the standard deviation its
/// lead would have were both as good, plus one (a sign test: then each
/// disagreement goes either way with even odds, and the lead's deviation
/// is the square root of their number).
fn ahead_beyond_chance(x: u64, y: u64, half_deviations: u64) -> bool {
    // x - y - 1 > half_deviations * sqrt(x + y) / 2, squared: no floating
    // point, no integer square root.
    let lead = x.saturating_sub(y);
    lead > 1
        && (lead - 1).saturating_mul(lead - 1).saturating_mul(4)
            > x.saturating_add(y).saturating_mul(half_deviations * half_deviations)
}

/// Lenient admission hits surely more: by more than half a deviation. A
/// strict shard turns lenient only on such a lead (engine.md, "Round
/// thirteen").
fn surely_ahead(x: u64, y: u64) -> bool {
    ahead_beyond_chance(x, y, 1)
}

/// Strict admission hits well more: by more than a whole deviation. The
/// way back to strict admission for a shard that just left it
/// (`AdmissionChoice::next`). Half a deviation there, a bar chance clears
/// now and then when it is tested at every sampled read for two periods,
/// took shards of the scarab trace back to strict where lenient admission
/// was the better (engine.md, "Round fourteen").
fn well_ahead(x: u64, y: u64) -> bool {
    ahead_beyond_chance(x, y, 2)
}

/// What the strict and the lenient (CLOCK) miniature counted lately: the
/// input of an adaptive shard's choice of admission (`AdmissionChoice`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MiniTally {
    /// Sampled reads each miniature hit, lately.
    pub strict_hits: u64,
    pub lenient_hits: u64,
    /// Sampled reads one hit and the other missed, lately.
    pub strict_only: u64,
    pub lenient_only: u64,
    /// Sampled reads, lately.
    pub reads: u64,
    /// This request ended the miniatures' first period or a later one (its
    /// counts were just halved).
    pub warmed: bool,
}

/// An adaptive shard's choice of admission, as the miniatures left it: the
/// engine keeps it in the `MODE` word (`RUNS_STRICT`, `WARM`,
/// `WAY_BACK_MASK`), and the model (`eviction::Switch::Mini`) runs the
/// same rule.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct AdmissionChoice {
    /// The miniatures chose strict admission.
    pub strict: bool,
    /// The miniatures have seen enough to choose (`WARM`): until then the
    /// shard admits strictly whatever `strict` says.
    pub warm: bool,
    /// A shard strict by choice that just turned lenient: the miniatures'
    /// periods left (ends of a period to come, `WAY_BACK_PERIODS` at most)
    /// in which it turns strict again on a lead beyond a deviation
    /// (`well_ahead`), not only on a clear win.
    pub way_back: u8,
}

impl AdmissionChoice {
    /// The choice an adaptive shard's `MODE` word holds.
    fn of_mode(mode: u64) -> AdmissionChoice {
        AdmissionChoice {
            strict: mode & RUNS_STRICT != 0,
            warm: mode & WARM != 0,
            way_back: ((mode & WAY_BACK_MASK) >> WAY_BACK_SHIFT) as u8,
        }
    }

    /// The choice's bits of the `MODE` word.
    fn mode_bits(self) -> u64 {
        (if self.strict { RUNS_STRICT } else { 0 })
            | (if self.warm { WARM } else { 0 })
            | ((self.way_back as u64) << WAY_BACK_SHIFT) & WAY_BACK_MASK
    }

    /// The choice after the candidates a shard refused came back, eight
    /// in a row (`RETURNS_TO_LEAVE`): lenient, with the way back a shard
    /// strict by choice gets when it turns lenient (a shard still warming
    /// up too: it has refused what a working set that moved asks for
    /// again, which is no lapse of chance either).
    pub fn after_returns(self) -> AdmissionChoice {
        if self.admits_strictly() {
            AdmissionChoice { strict: false, warm: true, way_back: WAY_BACK_PERIODS }
        } else {
            self
        }
    }

    /// Whether the shard admits strictly.
    pub fn admits_strictly(self) -> bool {
        self.strict || !self.warm
    }

    /// The choice after a sampled request left the miniatures' counts at
    /// `tally`.
    ///
    /// Strict admission costs more per write: once warm, a lenient shard
    /// turns strict only on a clear win. A strict one (by choice, or
    /// warming up) stays strict unless lenient admission hits surely more:
    /// on the reads where the two miniatures disagreed lately, lenient
    /// admission's lead is more than chance would give it
    /// (`surely_ahead`). What strict admission holds is not won back
    /// quickly: a shard that went lenient through a scan or a spell of
    /// misses, where both miniatures hit nothing, lost the part of a loop
    /// it held, and turned strict again it keeps what lenient admission
    /// left (engine.md, "Round nine"); and a shard whose miniatures tied
    /// while it held everything went lenient on the first hit or two
    /// either way, and lost the loop that came next ("Round thirteen"). A
    /// shard without reads (only written to) has no reason to pay strict
    /// admission's writes. A shard still warming up turns lenient as soon
    /// as lenient admission hits more by two (one hit is a coin toss) and
    /// surely more.
    ///
    /// The way back: a lead as slight as the one that lets a strict shard
    /// go lenient (two disagreements to none) can be chance, and a loop
    /// that comes round again shows it was a lapse only once the strict
    /// miniature holds what the lenient one lost, while the lead of all
    /// its hits is still short of a clear win. So for the rest of the
    /// period in which a shard strict by choice turned lenient and the
    /// next (`WAY_BACK_PERIODS`), it turns strict again when the strict
    /// miniature leads on the disagreements by more than a deviation
    /// (`well_ahead`; engine.md, "Round fourteen"). Later, only a clear
    /// win does: a shard lenient for long would otherwise follow every
    /// spell in which strict admission happens to lead. A shard that
    /// turns lenient as its warm-up ends judged a whole period: no way
    /// back.
    pub fn next(self, tally: &MiniTally) -> AdmissionChoice {
        let clearly = |a: u64, b: u64| a > b.saturating_add(b / STRICT_WIN_RATIO + STRICT_WIN_HITS);
        let holds = tally.reads > 0 && !surely_ahead(tally.lenient_only, tally.strict_only);
        let warm = tally.warmed || tally.lenient_hits > tally.strict_hits.saturating_add(1);
        let strict = if !self.warm {
            warm && holds
        } else if !self.strict {
            clearly(tally.strict_hits, tally.lenient_hits)
                || self.way_back > 0 && well_ahead(tally.strict_only, tally.lenient_only)
        } else {
            holds
        };
        let next = AdmissionChoice { strict, warm: self.warm || warm, way_back: 0 };
        let way_back = if next.admits_strictly() {
            0
        } else if self.strict && self.warm {
            WAY_BACK_PERIODS
        } else if tally.warmed {
            self.way_back.saturating_sub(1)
        } else {
            self.way_back
        };
        AdmissionChoice { way_back, ..next }
    }
}

/// The window's share of a miniature, in percent.
const MINI_WINDOW_PERCENT: usize = 4;

/// Multiplier of the sketch's remix of a tag (splitmix64's).
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

/// The visited bit of a miniature's record; the rest is the tag (never 0).
const REC_VISITED: u32 = 1 << 31;

/// A sampled request that was a store of an absent key, not a read (the
/// top bit of a buffered tag: tags are 31 bits).
const STORED: u32 = 1 << 31;

/// Most sampled requests a handle keeps per shard between two of its
/// writes there: as many as a miniature has records (64 to 256,
/// `Geometry::policy_parts`; more are dropped, and the miniatures see a
/// sample of a sample). A strict shard holding most of a loop hits in
/// runs as long as its entries, which the sample rate makes at most a
/// miniature's records of samples. A buffer that keeps only the start of
/// each run drops the same keys at every lap: the miniatures see a
/// shorter loop, which fits them, tie, and the shard goes lenient now and
/// then (16 samples, engine.md, "Round twelve"; 64 in shards of more than
/// 2,000 entries, "Round seventeen"). Reads write nothing in the shard,
/// so they cannot replay: this buffer is what carries a run to the next
/// write. The first `FIRST_SAMPLES` are made at a handle's first sampled
/// request in the shard, the rest at the first run that outlasts them.
fn samples_per_shard(mini_records: usize) -> usize {
    mini_records.clamp(FIRST_SAMPLES, 256)
}

/// Samples a handle keeps per shard before a run outlasts them.
const FIRST_SAMPLES: usize = 64;

/// A handle that samples no reads of a shard asks it for its rate once in
/// this many writes there (a file set to adaptive or strict admission by
/// another process is noticed that late).
const RATE_REFRESH: u32 = 64;

/// A handle that found the miniatures' lock held this many times in a
/// row asks whether its holder's process is still alive.
const HOLDER_CHECK: u32 = 64;

/// One handle's sampled requests, per shard, for the shards' miniature
/// caches. A read takes no lock and a write should hold the shard's lock
/// no longer than it must, so both are kept here (reads by the reader,
/// stores of absent keys by the write, `ShardGuard::note_miss`) and
/// replayed through the miniatures after the handle's next write to the
/// shard has let go of the shard's lock, under the miniatures' own lock
/// (`Shard::replay_samples`). A handle that never writes to a shard tells
/// its miniatures nothing.
pub(crate) struct Samples {
    shards: Box<[ShardSamples]>,
    /// Samples kept per shard between two writes (`samples_per_shard`).
    capacity: usize,
    /// Whether any shard samples reads (an adaptive or strict file): a read
    /// of a lenient file's shard costs this one load.
    on: AtomicBool,
}

#[repr(align(64))]
struct ShardSamples {
    /// The shard's sample rate (log2) as of this handle's last replay.
    log2: AtomicU32,
    /// Requests recorded since the last replay (may run past
    /// `Samples::capacity`).
    len: AtomicU32,
    /// The requests, made at the first one: a handle opens every shard's
    /// record and most handles sample a few shards (an open per request).
    tags: OnceLock<Box<[AtomicU32; FIRST_SAMPLES]>>,
    /// The requests past `FIRST_SAMPLES`, up to `Samples::capacity`, made
    /// at the first run that outlasts the first.
    more: OnceLock<Box<[AtomicU32]>>,
    /// Writes since this handle last asked a lenient shard for its rate.
    writes: AtomicU32,
    /// Replays given up in a row because the miniatures' lock was held.
    busy: AtomicU32,
}

impl Samples {
    /// A handle's samples of a file of `shards` shards whose miniatures
    /// have `mini_records` records each.
    pub(crate) fn new(shards: usize, mini_records: usize) -> Samples {
        let shard = || ShardSamples {
            log2: AtomicU32::new(31),
            len: AtomicU32::new(0),
            tags: OnceLock::new(),
            more: OnceLock::new(),
            writes: AtomicU32::new(0),
            busy: AtomicU32::new(0),
        };
        Samples {
            shards: (0..shards).map(|_| shard()).collect(),
            capacity: samples_per_shard(mini_records),
            on: AtomicBool::new(false),
        }
    }

    /// Whether any shard samples reads (`note_read` is for when one does):
    /// a load and a branch for most reads.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// Record a read of the key of `tag` in shard `i` if the key is
    /// sampled.
    #[inline]
    pub(crate) fn note_read(&self, i: usize, tag: u32) {
        let s = &self.shards[i];
        if tag & ((1u32 << s.log2.load(Relaxed).min(31)) - 1) == 0 {
            self.push(s, tag & !STORED);
        }
    }

    fn push(&self, s: &ShardSamples, tag: u32) {
        let n = s.len.fetch_add(1, Relaxed) as usize;
        let slot = if n < FIRST_SAMPLES {
            let tags = s.tags.get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU32::new(0))));
            &tags[n]
        } else if n < self.capacity {
            let more = s.more.get_or_init(|| {
                (FIRST_SAMPLES..self.capacity).map(|_| AtomicU32::new(0)).collect()
            });
            &more[n - FIRST_SAMPLES]
        } else {
            return;
        };
        slot.store(tag, Relaxed);
    }

    /// Keep shard `s`'s sample rate for this handle's reads; a rate above
    /// one in 2^31 turns the reads' sampling on.
    fn set_rate(&self, s: &ShardSamples, log2: u32) {
        s.log2.store(log2, Relaxed);
        if log2 < 31 && !self.on.load(Relaxed) {
            self.on.store(true, Relaxed);
        }
    }
}

impl ShardGuard<'_> {
    fn pol(&self, field: usize) -> u64 {
        self.shard.pol_word(field).load(Relaxed)
    }

    fn set_pol(&self, field: usize, v: u64) {
        self.shard.pol_word(field).store(v, Relaxed);
    }

    /// The policy header's `MODE` as this guard first read it: the
    /// miniatures may change the adaptive choice at any moment, and one
    /// write should run one mode from start to end.
    fn mode(&self) -> u64 {
        let m = self.mode_now.get();
        if m != MODE_UNREAD {
            return m as u64;
        }
        let m = (self.pol(pol::MODE) & MODE_BITS) as u16;
        self.mode_now.set(m);
        m as u64
    }

    /// Whether the policy learns at all: not in a file that admits
    /// leniently (SIEVE, which needs neither the sketch nor the
    /// miniatures), nor before a lazy shard reserved its body.
    fn learns(&self) -> bool {
        self.shard.learns_in(self.mode())
    }

    /// The share of a lenient shard's entries kept young, as a divisor:
    /// a twelfth (`YOUNG_SHARE`), or half in an adaptive shard whose
    /// miniatures chose it.
    pub(super) fn young_share(&self) -> usize {
        let mode = self.mode();
        if self.shard.policy_armed() && mode & PIN_MASK == 2 && mode & YOUNG_HALF != 0 {
            YOUNG_SHARE_HALF
        } else {
            YOUNG_SHARE
        }
    }

    /// Whether the shard admits new entries strictly now.
    pub(super) fn strict(&self) -> bool {
        let mode = self.mode();
        if !self.shard.policy_armed() {
            return false;
        }
        match mode & PIN_MASK {
            1 => true,
            2 => AdmissionChoice::of_mode(mode).admits_strictly(),
            _ => false,
        }
    }

    /// Whether the sketch counts every key: in a shard that admits
    /// strictly by choice (pinned, or adaptive on a clear win), not in one
    /// warming up, which counts the sampled keys as a lenient shard does
    /// (its duels then keep the resident unless a sampled candidate was
    /// seen more often; a write costs what it does in a lenient shard).
    fn counts_all(&self) -> bool {
        let mode = self.mode();
        self.shard.policy_armed()
            && (mode & PIN_MASK == 1
                || mode & PIN_MASK == 2 && AdmissionChoice::of_mode(mode).strict)
    }

    /// Whether the shard runs strict now (`strict`, for statistics).
    pub(crate) fn runs_strict(&self) -> bool {
        self.strict()
    }

    /// Whether the shard admits leniently now, half its entries young
    /// (`young_share`, for statistics).
    pub(crate) fn runs_young_half(&self) -> bool {
        !self.strict() && self.young_share() == YOUNG_SHARE_HALF
    }

    /// Pin the mode (or let the miniatures choose again).
    pub(crate) fn pin_eviction(&self, m: EvictionMode) {
        let word = self.shard.pol_word(pol::MODE);
        let _ = word.fetch_update(Relaxed, Relaxed, |mode| Some(mode & !PIN_MASK | m.pin()));
        self.mode_now.set(MODE_UNREAD);
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
    /// shard starts afresh). The miniatures' lock is left as it is: its
    /// holder, if any, replays on into emptied records (a hint gone
    /// wrong, never a wrong read).
    pub(super) fn reset_policy(&self) {
        let pin = self.pol(pol::MODE) & PIN_MASK;
        for field in (0..pol::MINIS_LOCK).step_by(8) {
            self.set_pol(field, 0);
        }
        self.set_pol(pol::MODE, pin);
        self.mode_now.set(MODE_UNREAD);
        if self.shard.policy_armed() {
            for off in (0..self.shard.policy_size).step_by(8) {
                self.shard.body_u64(off).store(0, Relaxed);
            }
        }
    }

    // ---- what the policy learns ----

    /// A key of `tag` missed (a set of an absent key).
    pub(super) fn note_miss(&self, tag: u32) {
        if !self.learns() {
            return;
        }
        if self.follows_refusals_now() && self.strict() {
            self.note_return(tag);
        }
        let sampled = self.shard.sampled(tag);
        if sampled || self.counts_all() {
            self.sketch_add(tag);
        }
        if let Some(samples) = self.samples.filter(|_| sampled) {
            if let Some(s) = samples.shards.get(self.shard.number) {
                samples.push(s, tag | STORED);
            }
        }
    }

    /// The hand cleared the visited bit of the entry of `tag`: a hit, or
    /// several, for the sketch.
    pub(super) fn note_hit(&self, tag: u32) {
        if self.learns() && (self.shard.sampled(tag) || self.counts_all()) {
            self.sketch_add(tag);
        }
    }

    /// Whether a candidate of `cand` (a tag) takes the place of `victim`.
    /// One that does not is a refusal, followed (`note_refused`) from
    /// `came_in`, the clock at the start of its judgement's window
    /// (`judgement_clock`).
    pub(super) fn wins(&self, cand: u32, victim: u32, came_in: u32) -> bool {
        let wins = self.shard.wins(cand, victim);
        if !wins {
            self.note_refused(cand, came_in);
        }
        wins
    }

    /// Whether this shard follows what it refuses now: it has a
    /// refusals' record and chooses its mode (not pinned).
    fn follows_refusals_now(&self) -> bool {
        self.mode() & PIN_MASK == 2 && self.shard.follows_refusals()
    }

    /// The clock of the refusals' record, with the sampled requests this
    /// handle made since its last replay (the miniatures count them only
    /// after this write: a strict shard holding a loop hits in runs of
    /// hundreds, and a key refused before the run would look back soon
    /// after it), and its horizon (at least one sampled request).
    fn refusals_clock(&self) -> (u32, u32) {
        let word = self.shard.refusals_word(refusals::CLOCK).load(Relaxed);
        let pending = self
            .samples
            .and_then(|s| s.shards.get(self.shard.number))
            .map_or(0, |s| s.len.load(Relaxed));
        ((word as u32).wrapping_add(pending), ((word >> 32) as u32).max(1))
    }

    /// The clock by which the candidates of a judgement of a segmented
    /// shard's head had not come in yet: the earliest a refusal can be
    /// followed from. A key refused long after it came in (a strict
    /// shard holding a loop fills its window slowly, between runs of
    /// hits) must not look back soon. A segmented shard keeps the newer
    /// half of its head in the window, so its candidates came in since
    /// the judgement before the last. (A shard of one segment knows more:
    /// `window_arrivals`.)
    pub(super) fn judgement_clock(&self) -> u32 {
        if !self.shard.follows_refusals() {
            return 0;
        }
        (self.shard.refusals_word(refusals::JUDGED).load(Relaxed) >> 32) as u32
    }

    /// When the entries of the window of a shard of one segment came in,
    /// at the start of a strict judgement of its `len` entries. A
    /// judgement stops once it freed enough, and the entries it left
    /// wait for the next in the window, so the window is a queue whose
    /// older part came in before the last judgement, maybe long before
    /// (a strict shard on a loop leaves part of its window at most
    /// judgements). The record keeps the queue's groups: those left
    /// before, and after them the entries that came in since the last
    /// judgement. Entries of the queue that died since (an overwrite, a
    /// delete) are taken from its newest groups: the rest then look older
    /// than they are, which follows fewer refusals, never a loop's.
    pub(super) fn window_arrivals(&self, len: usize) -> WindowArrivals {
        let mut arrivals = WindowArrivals { groups: Vec::new() };
        if len == 0 || !self.follows_refusals_now() {
            return arrivals;
        }
        for i in 0..ARRIVAL_GROUPS {
            let word = self.shard.refusals_word(refusals::ARRIVALS + 8 * i).load(Relaxed);
            if word >> 32 != 0 {
                arrivals.groups.push(((word >> 32) as usize, word as u32));
            }
        }
        arrivals.take(arrivals.len().saturating_sub(len), true);
        let new = len - arrivals.len();
        if new > 0 {
            let last_judged = self.shard.refusals_word(refusals::JUDGED).load(Relaxed) as u32;
            arrivals.groups.push((new, last_judged));
        }
        arrivals
    }

    /// A strict judgement of a shard of one segment ended, the first
    /// `passed` entries of its window (judged, or hit and kept) out of
    /// it: the rest wait in the record (`window_arrivals`), the oldest
    /// groups merged into one (the older clock) to fit.
    pub(super) fn note_window_judged(&self, mut arrivals: WindowArrivals, passed: usize) {
        if !self.follows_refusals_now() {
            return;
        }
        arrivals.take(passed, false);
        while arrivals.groups.len() > ARRIVAL_GROUPS {
            let (count, _) = arrivals.groups.remove(1);
            arrivals.groups[0].0 += count;
        }
        for i in 0..ARRIVAL_GROUPS {
            let word = arrivals.groups.get(i).map_or(0, |&(count, clock)| {
                (count.min(u32::MAX as usize) as u64) << 32 | clock as u64
            });
            self.shard.refusals_word(refusals::ARRIVALS + 8 * i).store(word, Relaxed);
        }
        self.note_judged();
    }

    /// A judgement of the window ended (`judgement_clock`).
    pub(super) fn note_judged(&self) {
        if !self.follows_refusals_now() {
            return;
        }
        let (now, _) = self.refusals_clock();
        let word = self.shard.refusals_word(refusals::JUDGED);
        word.store(word.load(Relaxed) << 32 | now as u64, Relaxed);
    }

    /// An adaptive shard refused the candidate of `tag`, which came in
    /// after the clock read `came_in`: keep it as a probe from then in its
    /// place if that is free, or holds one that stayed away past the
    /// horizon (its verdict). A place that holds a probe still waiting (or
    /// this key's, whose first refusal counts) keeps it; a candidate that
    /// may have come in longer than the horizon ago is not followed.
    fn note_refused(&self, tag: u32, came_in: u32) {
        if !self.follows_refusals_now() {
            return;
        }
        let (now, horizon) = self.refusals_clock();
        if now.wrapping_sub(came_in) > horizon {
            return;
        }
        let tag = tag as u64 & PROBE_TAG;
        let word = self.refusal_probe(probe_place(tag, self.shard.refusal_probes));
        let probe = word.load(Relaxed);
        if probe & PROBE_SET != 0 {
            if now.wrapping_sub((probe >> 31) as u32) <= horizon {
                return;
            }
            self.stayed_away(word);
        }
        word.store(PROBE_SET | (came_in as u64) << 31 | tag, Relaxed);
    }

    /// Probe `i` of the refusals' record.
    fn refusal_probe(&self, i: usize) -> &AtomicU64 {
        self.shard.refusals_word(refusals::PROBE + 8 * (i % self.shard.refusal_probes))
    }

    /// The probe in `word` stayed away past the horizon: strict admission
    /// was right to refuse it, and the run of returns ends.
    fn stayed_away(&self, word: &AtomicU64) {
        word.store(0, Relaxed);
        self.shard.refusals_word(refusals::RUN).store(0, Relaxed);
    }

    /// A key of `tag` was stored absent in a shard that admits strictly by
    /// choice. The probe in the key's place came back if it is the key's,
    /// or stayed away if it is past the horizon: the stores of absent keys
    /// fall on every place in turn, so one that stayed away is found soon
    /// after its horizon. The run of returns counts those within the
    /// horizon of the last (an older run is over); at `RETURNS_TO_LEAVE`
    /// the shard turns lenient (`AdmissionChoice::after_returns`) and
    /// forgets its probes.
    fn note_return(&self, tag: u32) {
        let probes = self.shard.refusal_probes;
        let word = self.refusal_probe(probe_place(tag as u64 & PROBE_TAG, probes));
        let probe = word.load(Relaxed);
        if probe & PROBE_SET == 0 {
            return;
        }
        let (now, horizon) = self.refusals_clock();
        if now.wrapping_sub((probe >> 31) as u32) > horizon {
            self.stayed_away(word);
            return;
        }
        if probe & PROBE_TAG != tag as u64 & PROBE_TAG {
            return;
        }
        word.store(0, Relaxed);
        let run_word = self.shard.refusals_word(refusals::RUN);
        let run = run_word.load(Relaxed);
        let last = (run >> 32) as u32;
        let run = if now.wrapping_sub(last) > horizon { 1 } else { (run as u32 as u64) + 1 };
        if run < RETURNS_TO_LEAVE {
            run_word.store((now as u64) << 32 | run, Relaxed);
            return;
        }
        run_word.store(0, Relaxed);
        for i in 0..probes {
            self.refusal_probe(i).store(0, Relaxed);
        }
        let mode = self.shard.pol_word(pol::MODE);
        let _ = mode.fetch_update(Relaxed, Relaxed, |mode| {
            let next = AdmissionChoice::of_mode(mode).after_returns();
            let new = mode & !CHOICE_BITS | next.mode_bits();
            (mode & PIN_MASK == 2 && new != mode).then_some(new)
        });
    }

    /// Count the key of `tag` once (conservative update). Only the shard's
    /// lock holder writes the sketch.
    fn sketch_add(&self, tag: u32) {
        let shard = self.shard;
        let idx: [usize; 4] = std::array::from_fn(|r| shard.sketch_index(tag, r));
        let floor = (0..4).map(|r| shard.counter(r, idx[r])).min().unwrap_or(0);
        if floor < 15 {
            for (r, &i) in idx.iter().enumerate() {
                if shard.counter(r, i) == floor {
                    // Wrapping: the nibble was under 15 when read, but
                    // another program may have written the word since.
                    let w = shard.sketch_word(r, i);
                    w.store(w.load(Relaxed).wrapping_add(1 << ((i % 16) * 4)), Relaxed);
                }
            }
        }
        let adds = self.pol(pol::SKETCH_ADDS).saturating_add(1);
        let items = (self.hdr(sh::ITEMS) as usize).clamp(64, shard.slots);
        if adds >= SKETCH_AGING * items as u64 {
            for w in 0..shard.sketch_width / 4 {
                let w = shard.body_u64(w * 8);
                w.store((w.load(Relaxed) >> 1) & 0x7777_7777_7777_7777, Relaxed);
            }
            self.set_pol(pol::SKETCH_ADDS, adds / 2);
        } else {
            self.set_pol(pol::SKETCH_ADDS, adds);
        }
    }

    /// The arena offset where a shard of one segment's window starts.
    pub(super) fn window_start(&self) -> usize {
        self.pol(pol::WINDOW) as usize
    }

    pub(super) fn set_window_start(&self, off: usize) {
        self.set_pol(pol::WINDOW, off as u64);
    }
}

// ---- the region, as any process sees it ----

impl Shard {
    /// A word of the policy header (the constants in `pol`). Atomic: the
    /// shard's lock holder and the miniatures' share the header.
    fn pol_word(&self, field: usize) -> &AtomicU64 {
        debug_assert!(field + 8 <= 64 && field % 8 == 0);
        // SAFETY: a word of the 64-byte policy header, which lies inside
        // the shard before the index, 8-aligned (it follows the segment
        // table of 8-byte words); the mapping outlives self.
        unsafe { AtomicU64::from_ptr(self.base.add(self.policy_off + field) as *mut u64) }
    }

    /// A pointer `off` bytes into the policy body, which holds `bytes`
    /// more from there.
    fn body_ptr(&self, off: usize, bytes: usize) -> *mut u8 {
        assert!(off + bytes <= self.policy_size && off % bytes == 0);
        // SAFETY: off..off + bytes is inside the body (checked), which lies
        // inside the shard between the index and the arena.
        unsafe { self.base.add(self.policy_body_off + off) }
    }

    fn body_u64(&self, off: usize) -> &AtomicU64 {
        // SAFETY: body_ptr checks the word is inside the body and aligned
        // to its size within it; the body starts 64-aligned. Every word of
        // the region is read and written as an atomic.
        unsafe { AtomicU64::from_ptr(self.body_ptr(off, 8) as *mut u64) }
    }

    /// Whether the shard has a refusals' record (not one whose
    /// miniatures have the fewest records: `Geometry::refusal_probes`),
    /// in a body that may be used.
    fn follows_refusals(&self) -> bool {
        self.refusal_probes > 0 && self.policy_armed()
    }

    /// A word of the refusals' record (the constants in `refusals`), the
    /// body's last bytes (`follows_refusals`).
    fn refusals_word(&self, field: usize) -> &AtomicU64 {
        self.body_u64(self.refusals_off + field)
    }

    fn body_u32(&self, off: usize) -> &AtomicU32 {
        // SAFETY: as in body_u64.
        unsafe { AtomicU32::from_ptr(self.body_ptr(off, 4) as *mut u32) }
    }

    fn body_u16(&self, off: usize) -> &AtomicU16 {
        // SAFETY: as in body_u64.
        unsafe { AtomicU16::from_ptr(self.body_ptr(off, 2) as *mut u16) }
    }

    /// Whether the policy body may be used: always in a preallocated
    /// file; in a lazy one while the arena holds reserved bytes (its
    /// first growth reserves the body; `release_memory` gives both back).
    fn policy_armed(&self) -> bool {
        !self.lazy || self.header_atomic(sh::ARENA_RESERVED).load(Relaxed) != 0
    }

    /// Whether the policy learns under the mode word `mode` (not a lenient
    /// file's, and the body reserved).
    fn learns_in(&self, mode: u64) -> bool {
        mode & PIN_MASK != 0 && self.policy_armed()
    }

    /// Whether the policy learns now (`learns_in` the header's mode).
    fn policy_learns(&self) -> bool {
        self.learns_in(self.pol_word(pol::MODE).load(Relaxed))
    }

    /// The sample rate (log2) for a handle's reads of this shard: the
    /// miniatures' while the policy learns, else 31 (2^31 never matches).
    fn read_rate(&self) -> u32 {
        if self.policy_learns() {
            (self.pol_word(pol::SAMPLE).load(Relaxed) as u32).min(31)
        } else {
            31
        }
    }

    /// Whether the key of `tag` is in the miniatures' sample. A lenient
    /// shard counts only those keys in its sketch (the strict miniature's
    /// duels read their counts): the sketch costs it a sampled part of its
    /// writes and of its hand's work, not all of it; a strict shard counts
    /// every key.
    fn sampled(&self, tag: u32) -> bool {
        tag & ((1u32 << self.pol_word(pol::SAMPLE).load(Relaxed).min(31)) - 1) == 0
    }

    // ---- the sketch ----

    fn sketch_word(&self, row: usize, i: usize) -> &AtomicU64 {
        let width = self.sketch_width;
        debug_assert!(row < 4 && i < width);
        self.body_u64((row * width / 16 + i / 16) * 8)
    }

    fn sketch_index(&self, tag: u32, row: usize) -> usize {
        let h = ((tag as u64) ^ ((tag as u64) << 31)).wrapping_mul(MIX);
        ((h >> (16 * row)) as usize) & (self.sketch_width - 1)
    }

    fn counter(&self, row: usize, i: usize) -> u8 {
        ((self.sketch_word(row, i).load(Relaxed) >> ((i % 16) * 4)) & 0xf) as u8
    }

    /// The sketch's estimate of how often the key of `tag` was seen.
    fn estimate(&self, tag: u32) -> u8 {
        (0..4).map(|r| self.counter(r, self.sketch_index(tag, r))).min().unwrap_or(0)
    }

    /// Whether a candidate of `cand` (a tag) takes the place of `victim`.
    fn wins(&self, cand: u32, victim: u32) -> bool {
        self.estimate(cand) > self.estimate(victim).saturating_add(ADMIT_MARGIN)
    }

    // ---- replaying a handle's samples ----

    /// After a write of a handle whose samples are `samples`:
    /// replay them through the miniatures if their lock is free (else
    /// they wait for the handle's next write), or, in a shard that
    /// samples nothing, ask now and then whether that changed.
    #[inline]
    pub(crate) fn replay_samples(&self, samples: &Samples) {
        let Some(s) = samples.shards.get(self.number) else { return };
        if s.len.load(Relaxed) != 0 {
            self.replay_now(samples, s);
        } else if s.log2.load(Relaxed) >= 31 {
            let writes = s.writes.load(Relaxed).wrapping_add(1);
            s.writes.store(writes, Relaxed);
            if writes % RATE_REFRESH == 1 {
                self.refresh_rate(samples, s);
            }
        }
    }

    /// Ask a shard that samples nothing for its rate (its file may have
    /// been set to adaptive or strict admission since).
    #[cold]
    fn refresh_rate(&self, samples: &Samples, s: &ShardSamples) {
        samples.set_rate(s, self.read_rate());
    }

    /// `replay_samples` with samples to replay.
    fn replay_now(&self, samples: &Samples, s: &ShardSamples) {
        let busy = s.busy.load(Relaxed);
        let Some(minis) = self.try_minis(busy % HOLDER_CHECK == HOLDER_CHECK - 1) else {
            s.busy.store(busy.wrapping_add(1), Relaxed);
            return;
        };
        s.busy.store(0, Relaxed);
        let len = s.len.swap(0, Relaxed) as usize;
        if let Some(tags) = s.tags.get().filter(|_| self.policy_learns()) {
            let more = s.more.get().map_or(&[][..], |more| &more[..]);
            let n = len.min(FIRST_SAMPLES + more.len());
            for t in tags.iter().chain(more).take(n) {
                let tag = t.load(Relaxed);
                minis.replay(tag & !STORED, tag & STORED == 0);
            }
            // The requests past the buffer were not kept, but they were
            // made: the refusals' clock counts them.
            minis.tick(len - n);
        }
        let log2 = self.read_rate();
        drop(minis);
        samples.set_rate(s, log2);
    }

    /// Free the miniatures' lock while no other process has the file
    /// mapped (a holder from before is gone: its pid may name another
    /// process by now).
    pub(super) fn free_minis_lock(&self) {
        self.pol_word(pol::MINIS_LOCK).store(0, Relaxed);
    }

    /// The miniatures, if their lock is free (or its holder died: asked
    /// only when `check_holder`, it costs a system call).
    fn try_minis(&self, check_holder: bool) -> Option<Minis<'_>> {
        // SAFETY: the lock word is the low half of the 8-aligned
        // `MINIS_LOCK` word of the policy header, inside the mapping.
        let word = unsafe { self.base.add(self.policy_off + pol::MINIS_LOCK) as *mut u32 };
        // `then`, not `then_some`: a Minis made and dropped would unlock.
        // SAFETY: as above.
        unsafe { lock::try_lock_hint(word, check_holder) }.then(|| Minis { shard: self, word })
    }
}

/// The miniatures, under their own lock: a replay is work no write needs
/// done before it returns, so it runs after the shard's lock is let go,
/// and a handle that finds the miniatures busy leaves its samples for
/// later. The lock is only ever tried (never waited for), and its holder
/// touches the miniatures, their header words (`SAMPLE`, `MINI_*`) and
/// the adaptive choice in `MODE`; it reads the sketch, which the shard's
/// lock holder writes. Every word is an atomic and every value a hint,
/// so what the two see of each other's half-done work can make the
/// policy choose badly, never read or write outside the region.
struct Minis<'a> {
    shard: &'a Shard,
    word: *mut u32,
}

impl Drop for Minis<'_> {
    fn drop(&mut self) {
        // SAFETY: this holder took the word in Shard::try_minis.
        unsafe { lock::unlock_hint(self.word) }
    }
}

impl Minis<'_> {
    fn pol(&self, field: usize) -> u64 {
        self.shard.pol_word(field).load(Relaxed)
    }

    fn set_pol(&self, field: usize, v: u64) {
        self.shard.pol_word(field).store(v, Relaxed);
    }

    /// The sample rate's log2, moved so that a miniature holds between
    /// `MINI_ENTRIES` and its record count (a move empties them); and the
    /// entries each holds.
    fn sample(&self) -> (u32, usize) {
        let shard = self.shard;
        // The entries the shard holds when full: its arena over the mean
        // entry so far, within the index's load limit. Known from the first
        // entries on, so the rate does not move (and empty the miniatures)
        // while the shard fills.
        let live = shard.header_atomic(sh::LIVE_BYTES).load(Relaxed) as usize;
        let count = shard.header_atomic(sh::ITEMS).load(Relaxed) as usize;
        let limit = shard.slots * 3 / 4;
        let items = if count == 0 || live < count {
            count.min(limit)
        } else {
            (shard.arena_size / (live / count).max(ENTRY_HEADER)).min(limit)
        };
        let start = (self.pol(pol::SAMPLE) as u32).min(31);
        let log2 = sample_rate(items, shard.mini_records, start);
        if log2 != start {
            self.set_pol(pol::SAMPLE, log2 as u64);
            for m in 0..MINIS {
                for w in [mini::MAIN_LEN, mini::HAND, mini::WIN_START, mini::WIN_LEN, mini::HITS] {
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
        (log2, (items >> log2).clamp(1, shard.mini_records))
    }

    fn mini_base(&self, m: usize) -> usize {
        4 * self.shard.sketch_width / 2 + m * (64 + 4 * self.mini_total() + 2 * self.index_len())
    }

    fn mini(&self, m: usize, field: usize) -> usize {
        self.shard.body_u64(self.mini_base(m) + field).load(Relaxed) as usize
    }

    fn set_mini(&self, m: usize, field: usize, v: usize) {
        self.shard.body_u64(self.mini_base(m) + field).store(v as u64, Relaxed);
    }

    /// Record `i` of miniature `m` (`mini_total`).
    fn rec_word(&self, m: usize, i: usize) -> &AtomicU32 {
        assert!(i < self.mini_total());
        self.shard.body_u32(self.mini_base(m) + 64 + 4 * i)
    }

    fn rec(&self, m: usize, i: usize) -> u32 {
        self.rec_word(m, i).load(Relaxed)
    }

    fn set_rec(&self, m: usize, i: usize, v: u32) {
        self.rec_word(m, i).store(v, Relaxed);
    }

    /// Move the refusals' clock on by `requests` sampled requests that
    /// were not replayed (past a handle's buffer).
    fn tick(&self, requests: usize) {
        if requests > 0 {
            self.advance_refusals_clock(requests as u32, None);
        }
    }

    /// Move the refusals' clock on by `requests` sampled requests, and
    /// set its horizon if one is given (in a shard that follows refusals).
    fn advance_refusals_clock(&self, requests: u32, horizon: Option<usize>) {
        if !self.shard.follows_refusals() {
            return;
        }
        let clock = self.shard.refusals_word(refusals::CLOCK);
        let word = clock.load(Relaxed);
        let now = (word as u32).wrapping_add(requests) as u64;
        let horizon = horizon.map_or(word >> 32, |h| h.clamp(1, u32::MAX as usize) as u64);
        clock.store(horizon << 32 | now, Relaxed);
    }

    /// Replay a request for the key of `tag` through both miniatures if
    /// its tag is sampled, and take the mode of the one with more hits.
    /// A read (`counted`) is a request: it hits or misses, and a miss
    /// stores the key (as a cache-aside caller does). A store of an absent
    /// key is not a request of its own (a read missed it first, or nothing
    /// asked for it): it only puts the key in the miniatures.
    fn replay(&self, tag: u32, counted: bool) {
        let (log2, entries) = self.sample();
        if tag & ((1u32 << log2) - 1) != 0 {
            return;
        }
        // The refusals' clock: one more sampled request, and the horizon
        // three quarters of a miniature's entries, as many requests as
        // three quarters of the shard's (`ShardGuard::note_return`).
        self.advance_refusals_clock(1, Some(entries * 3 / 4));
        let fp = (tag & !REC_VISITED).max(1);
        let mut hits = [
            self.pol(pol::MINI_HITS),
            self.pol(pol::MINI_HITS + 8),
            self.mini(2, mini::HITS) as u64,
        ];
        let mut only = [0, 1].map(|m| self.mini(m, mini::ONLY_HITS) as u64);
        let mut hit = [false; MINIS];
        for (m, h) in hits.iter_mut().enumerate() {
            // A store is replayed too (it puts its key in), but only a
            // read counts as a hit.
            let hit_here = match m {
                0 | 1 => self.mini_access(m, fp, entries, counted),
                _ => self.sieve_access(m, fp, entries, counted),
            };
            hit[m] = hit_here && counted;
            *h = h.saturating_add(hit[m] as u64);
        }
        if hit[0] != hit[1] {
            let alone = hit[1] as usize;
            only[alone] = only[alone].saturating_add(1);
        }
        // A store counts towards the period too: a shard only written to
        // (nothing to hit) warms up all the same.
        let word = self.pol(pol::MINI_REQUESTS);
        let mut requests = (word as u32 as u64).saturating_add(1);
        let mut reads = (word >> 32).saturating_add(counted as u64).min(u32::MAX as u64);
        let warmed = requests >= MINI_DECAY * entries as u64;
        if warmed {
            requests = 0;
            reads /= 2;
            hits = hits.map(|h| h / 2);
            only = only.map(|h| h / 2);
        }
        self.set_pol(pol::MINI_REQUESTS, reads << 32 | requests);
        self.set_mini(0, mini::ONLY_HITS, only[0] as usize);
        self.set_mini(1, mini::ONLY_HITS, only[1] as usize);
        self.set_pol(pol::MINI_HITS, hits[0]);
        self.set_pol(pol::MINI_HITS + 8, hits[1]);
        self.set_mini(2, mini::HITS, hits[2] as usize);
        // The young share: half the entries once the CLOCK miniature hits
        // clearly more than the SIEVE one (a working set that moves), a
        // twelfth again on as clear a lead the other way (a skewed,
        // lasting one). The mode: `AdmissionChoice::next`, which reads the
        // CLOCK miniature, as it did before the SIEVE one came.
        let clearly_young =
            |a: u64, b: u64| a > b.saturating_add(b / YOUNG_WIN_RATIO + YOUNG_WIN_HITS);
        let tally = MiniTally {
            strict_hits: hits[0],
            lenient_hits: hits[1],
            strict_only: only[0],
            lenient_only: only[1],
            reads,
            warmed,
        };
        let word = self.shard.pol_word(pol::MODE);
        let _ = word.fetch_update(Relaxed, Relaxed, |mode| {
            let half = if mode & YOUNG_HALF == 0 {
                clearly_young(hits[1], hits[2])
            } else {
                !clearly_young(hits[2], hits[1])
            };
            let next = AdmissionChoice::of_mode(mode).next(&tally);
            let new = mode & !(CHOICE_BITS | YOUNG_HALF)
                | next.mode_bits()
                | if half { YOUNG_HALF } else { 0 };
            (new != mode).then_some(new)
        });
    }

    /// One request for `fp` in miniature `m` (0 strict, 1 lenient CLOCK)
    /// of `entries` entries (a store, not `counted`, does not mark a
    /// present key). Returns whether it hit.
    fn mini_access(&self, m: usize, fp: u32, entries: usize, counted: bool) -> bool {
        let recs = self.shard.mini_records;
        let ring = recs / 8;
        let win_cap = (entries * MINI_WINDOW_PERCENT / 100).clamp(1, ring);
        let main_cap = entries.saturating_sub(win_cap).clamp(1, recs);
        // Every word clamped to the records: a hint, never a bound.
        let mut main_len = self.mini(m, mini::MAIN_LEN).min(recs);
        let mut win_start = self.mini(m, mini::WIN_START) % ring;
        let mut win_len = self.mini(m, mini::WIN_LEN).min(ring);
        if self.mini_hit(m, fp, counted) {
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
                || self.shard.wins(cand & !REC_VISITED, self.rec(m, v) & !REC_VISITED);
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

    /// Whether miniature `m` holds `fp`; a read (`counted`) marks it.
    fn mini_hit(&self, m: usize, fp: u32, counted: bool) -> bool {
        let Some((_, pos)) = self.mini_find(m, fp) else { return false };
        let r = self.rec(m, pos);
        if r & REC_VISITED == 0 && counted {
            self.set_rec(m, pos, r | REC_VISITED);
        }
        true
    }

    /// One request for `fp` in miniature `m` (2) of `entries` entries:
    /// SIEVE as a lenient shard runs it, a twelfth of its entries young,
    /// one eviction at a time. Records hold the keys in
    /// the order they came, with holes where keys were evicted; the hand
    /// walks them oldest first, clearing visited records and evicting the
    /// first unvisited one, and wraps round before the young records (the
    /// newest appends, as many as that share of the keys held). Appends
    /// that reach the last record first close up the holes. Returns
    /// whether it hit.
    fn sieve_access(&self, m: usize, fp: u32, entries: usize, counted: bool) -> bool {
        let total = self.mini_total();
        let cap = entries.clamp(1, self.shard.mini_records);
        let share = YOUNG_SHARE;
        // Every word clamped to the records: a hint, never a bound.
        let mut used = self.mini(m, mini::WIN_LEN).min(total);
        let mut live = self.mini(m, mini::MAIN_LEN).min(used);
        let mut hand = self.mini(m, mini::HAND).min(used);
        if self.mini_hit(m, fp, counted) {
            return true;
        }
        // Evict down to room for one more. Two laps of the older records
        // find an unvisited one (the first clears every mark); a third
        // walks the young too, and a fourth gives up (words out of step).
        let mut wraps = 0;
        while live >= cap && wraps < 4 {
            let young_from = if wraps < 2 { used - live / share } else { used };
            if hand >= young_from {
                hand = 0;
                wraps += 1;
                continue;
            }
            let r = self.rec(m, hand);
            if r & !REC_VISITED != 0 {
                if r & REC_VISITED != 0 {
                    self.set_rec(m, hand, r & !REC_VISITED);
                } else {
                    self.mini_forget(m, hand);
                    self.set_rec(m, hand, 0);
                    live -= 1;
                }
            }
            hand += 1;
        }
        if used == total {
            // Close up the holes; the hand stays on the record it was on.
            let mut to = 0;
            let mut new_hand = 0;
            for from in 0..used {
                if from == hand {
                    new_hand = to;
                }
                let r = self.rec(m, from);
                if r & !REC_VISITED == 0 {
                    continue;
                }
                if from != to {
                    self.mini_move(m, from, to);
                    self.set_rec(m, from, 0);
                }
                to += 1;
            }
            hand = if hand >= used { to } else { new_hand };
            used = to;
            live = to;
        }
        if used < total {
            self.set_rec(m, used, fp);
            self.mini_index(m, fp, used);
            used += 1;
            live += 1;
        }
        self.set_mini(m, mini::MAIN_LEN, live);
        self.set_mini(m, mini::HAND, hand);
        self.set_mini(m, mini::WIN_LEN, used);
        false
    }

    // ---- a miniature's index: fingerprint -> record, linear probing ----

    /// Slots of a miniature's index: twice its records, a power of two.
    fn index_len(&self) -> usize {
        (2 * self.mini_total()).next_power_of_two()
    }

    fn slot_word(&self, m: usize, j: usize) -> &AtomicU16 {
        assert!(j < self.index_len());
        self.shard.body_u16(self.mini_base(m) + 64 + 4 * self.mini_total() + 2 * j)
    }

    fn index_slot(&self, m: usize, j: usize) -> usize {
        self.slot_word(m, j).load(Relaxed) as usize
    }

    fn set_index_slot(&self, m: usize, j: usize, v: usize) {
        self.slot_word(m, j).store(v as u16, Relaxed);
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

    /// Records of a miniature: the strict one's main part, then its window
    /// ring (an eighth); a lenient one's in the order their keys came, with
    /// the holes of those evicted (half again as many records as entries,
    /// so that closing up the holes is paid once per half a miniature of
    /// appends).
    fn mini_total(&self) -> usize {
        self.shard.mini_records + self.shard.mini_records / 2
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

#[cfg(test)]
mod tests {
    use super::{
        mini, pol, sample_rate, surely_ahead, AdmissionChoice, MiniTally, MINI_ENTRIES,
        MINI_RATE_LOG2, RUNS_STRICT, WARM, WAY_BACK_PERIODS, YOUNG_SHARE,
    };
    use crate::cache::Store;
    use crate::eviction::reference::RefSieve;
    use crate::file::OpenOptions;
    use crate::layout::sh;
    use std::sync::atomic::Ordering::Relaxed;
    use std::time::Duration;

    /// A directory of its own for a test's file of one shard, removed
    /// when dropped.
    struct OneShard(std::path::PathBuf);

    impl OneShard {
        fn new(tag: &str) -> OneShard {
            let dir = std::env::temp_dir().join(format!("nearcache-{tag}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            OneShard(dir)
        }

        /// Open the file of `size` bytes (made anew with `recreate`;
        /// every page reserved with `preallocate`).
        fn open(&self, size: usize, recreate: bool, preallocate: bool) -> Store {
            let path = self.0.join("c");
            let opts = OpenOptions {
                size: Some(size),
                shards: 1,
                recreate,
                preallocate,
                ..OpenOptions::default()
            };
            Store::open_as(&path, &path, &opts, None).unwrap()
        }
    }

    impl Drop for OneShard {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// The SIEVE miniature makes the choices of a textbook SIEVE that
    /// spares its newest twelfth (`RefSieve::with_young`, the eviction
    /// model's reference) on random traces: its holes, its close-ups and
    /// its wraps round the young records change nothing it decides.
    #[test]
    fn the_sieve_miniature_is_a_textbook_sieve() {
        let dir = OneShard::new("minis");
        let store = dir.open(1 << 20, true, true);
        let shard = &store.shard_slice()[0];
        let guard = shard.lock(Duration::from_secs(5)).unwrap();
        let minis = guard.shard.try_minis(false).unwrap();
        let recs = shard.mini_records;
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        for (cap, keys) in [(recs, 3 * recs), (recs / 2, recs), (7, 20), (recs, 10 * recs), (1, 3)]
        {
            for w in [mini::MAIN_LEN, mini::HAND, mini::WIN_LEN] {
                minis.set_mini(2, w, 0);
            }
            for j in 0..minis.index_len() {
                minis.set_index_slot(2, j, 0);
            }
            let mut reference = RefSieve::with_young(cap, YOUNG_SHARE);
            for i in 0..20_000 {
                rng ^= rng >> 12;
                rng ^= rng << 25;
                rng ^= rng >> 27;
                // Skewed: half the requests from an eighth of the keys.
                let r = rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 1;
                let key = if r & 1 == 0 { r % (keys as u64 / 8 + 1) } else { r % keys as u64 } + 1;
                let hit = minis.sieve_access(2, key as u32, cap, true);
                assert_eq!(hit, reference.access(key), "{cap} entries, request {i}");
            }
        }
        drop(minis);
        drop(guard);
        drop(store);
    }

    /// A small shard's sketch tells a key seen often from one seen once
    /// after as many additions as it makes before it halves. With an
    /// eighth of a 32 KiB shard's index slots (64 counters per row, the
    /// sketch before layout version 15) the one-hit keys filled its
    /// counters: a key seen six times won none of its duels against keys
    /// seen once, and 77 of them won theirs against it.
    #[test]
    fn a_small_shards_sketch_tells_its_keys_apart() {
        let dir = OneShard::new("sketch");
        let store = dir.open(4096 + (32 << 10), true, true);
        let shard = &store.shard_slice()[0];
        let guard = shard.lock(Duration::from_secs(5)).unwrap();
        guard.pin_eviction(super::EvictionMode::Strict);
        // The 150 entries such a shard holds of 100-byte values.
        shard.header_atomic(sh::ITEMS).store(150, Relaxed);
        let tag = |i: u32| (i.wrapping_mul(0x9e37_79b9) >> 1).max(1);
        // Before the sketch halves (ten times its entries in additions):
        // 16 keys six times, 1,300 keys once.
        for i in 0..1_300u32 {
            guard.sketch_add(tag(10_000 + i));
            if i % 13 == 0 && i < 96 * 13 {
                guard.sketch_add(tag(i / 13 % 16));
            }
        }
        let (mut won, mut lost, mut duels) = (0, 0, 0);
        for f in 0..16 {
            for o in 10_000..11_300 {
                duels += 1;
                won += shard.wins(tag(f), tag(o)) as usize;
                lost += shard.wins(tag(o), tag(f)) as usize;
            }
        }
        let width = shard.sketch_width;
        assert!(won >= duels * 99 / 100, "{width} counters: {won} of {duels} duels won");
        assert_eq!(lost, 0, "{width} counters: a key seen once beat one seen six times");
        drop(guard);
        drop(store);
    }

    /// The rule on its own, from each state. Warming up, a shard admits
    /// strictly until the miniatures' first period ends or lenient
    /// admission leads by two hits and surely; warm and lenient, it turns
    /// strict only on a clear win (a quarter and four hits more); warm and
    /// strict, it stays on a tie or a lead of chance, and goes on a sure
    /// lead or without reads; just gone lenient from strict, it turns
    /// strict again on a lead of more than a deviation until two of the
    /// miniatures' periods have ended.
    #[test]
    fn the_admission_choice_follows_its_rule() {
        let tally = |strict_hits, lenient_hits, strict_only, lenient_only, warmed| MiniTally {
            strict_hits,
            lenient_hits,
            strict_only,
            lenient_only,
            reads: 100,
            warmed,
        };
        let cold = AdmissionChoice::default();
        let strict = AdmissionChoice { strict: true, warm: true, way_back: 0 };
        let lenient = AdmissionChoice { strict: false, warm: true, way_back: 0 };
        // Just gone lenient from strict; one period on.
        let left = AdmissionChoice { way_back: WAY_BACK_PERIODS, ..lenient };
        let later = AdmissionChoice { way_back: 1, ..lenient };
        assert!(cold.admits_strictly() && strict.admits_strictly());
        assert!(!lenient.admits_strictly() && !left.admits_strictly());
        for choice in [cold, strict, lenient, left, later] {
            assert_eq!(AdmissionChoice::of_mode(2 | choice.mode_bits()), choice);
        }
        assert_eq!(AdmissionChoice::of_mode(2), cold);
        assert_eq!(AdmissionChoice::of_mode(2 | WARM | RUNS_STRICT), strict);
        assert_eq!(AdmissionChoice::of_mode(2 | WARM), lenient);
        for (from, counts, to, why) in [
            (cold, tally(50, 51, 0, 1, false), cold, "cold, lenient ahead by one"),
            (cold, tally(50, 52, 0, 2, false), lenient, "cold, lenient surely ahead by two"),
            (cold, tally(50, 52, 10, 12, false), strict, "cold, ahead by two of 22"),
            (cold, tally(50, 50, 3, 3, true), strict, "the first period ends on a tie"),
            (cold, tally(40, 60, 0, 20, true), lenient, "the first period ends, lenient ahead"),
            (lenient, tally(66, 50, 16, 0, false), lenient, "strict well ahead, not clearly"),
            (lenient, tally(67, 50, 17, 0, false), strict, "strict clearly ahead"),
            (strict, tally(50, 51, 20, 21, false), strict, "lenient ahead by chance"),
            (strict, tally(50, 56, 20, 26, false), left, "lenient surely ahead"),
            (left, tally(54, 50, 4, 0, false), strict, "just gone lenient, strict well ahead"),
            (left, tally(52, 50, 2, 0, false), left, "just gone lenient, strict surely ahead"),
            (left, tally(50, 50, 3, 3, true), later, "a period ends"),
            (later, tally(60, 50, 12, 2, false), strict, "a period on, strict well ahead"),
            (later, tally(50, 50, 3, 3, true), lenient, "the second period ends"),
            (lenient, tally(60, 50, 12, 2, false), lenient, "later, strict well ahead"),
        ] {
            assert_eq!(from.next(&counts), to, "{why}");
        }
        let unread = MiniTally { reads: 0, ..tally(0, 0, 0, 0, false) };
        assert_eq!(strict.next(&unread), left, "a strict shard without reads");
        assert_eq!(cold.next(&unread), cold, "warming up without reads");
    }

    /// A strict shard turns lenient only when its lenient miniature's lead,
    /// on the sampled reads where the two disagreed, is more than chance
    /// would give it: a lead of one, or of four in 44 disagreements, keeps
    /// it strict (a single hit turned it lenient before); two with none
    /// the other way, or six in 46, turns it. Without reads it turns
    /// lenient on any count.
    #[test]
    fn a_strict_shard_turns_lenient_on_a_lead_beyond_chance() {
        let dir = OneShard::new("sure");
        let store = dir.open(1 << 20, true, true);
        let shard = &store.shard_slice()[0];
        let guard = shard.lock(Duration::from_secs(5)).unwrap();
        guard.pin_eviction(super::EvictionMode::Adaptive);
        shard.header_atomic(sh::ITEMS).store(10_000, Relaxed);
        let minis = guard.shard.try_minis(false).unwrap();
        let (log2, _) = minis.sample();
        // Sampled at any rate; replayed as a store, which hits nothing.
        let tag = 1u32 << 24;
        assert!(log2 < 24);
        for (strict_only, lenient_only, reads, stays) in [
            (0, 1, 100, true),
            (20, 24, 100, true),
            (0, 2, 100, false),
            (20, 26, 100, false),
            (0, 0, 0, false),
        ] {
            let mode = minis.pol(pol::MODE);
            minis.set_pol(pol::MODE, mode | WARM | RUNS_STRICT);
            minis.set_pol(pol::MINI_REQUESTS, reads << 32);
            minis.set_pol(pol::MINI_HITS, 50);
            minis.set_pol(pol::MINI_HITS + 8, 50 + lenient_only - strict_only);
            minis.set_mini(0, mini::ONLY_HITS, strict_only as usize);
            minis.set_mini(1, mini::ONLY_HITS, lenient_only as usize);
            minis.replay(tag, false);
            let strict = minis.pol(pol::MODE) & RUNS_STRICT != 0;
            assert_eq!(strict, stays, "{strict_only} / {lenient_only} alone, {reads} reads");
            assert_eq!(surely_ahead(lenient_only, strict_only), !stays && reads > 0);
        }
        drop(minis);
        drop(guard);
        drop(store);
    }

    /// Set the refusals' clock of `shard` to `now`, with `horizon`.
    fn set_refusals_clock(shard: &super::Shard, horizon: u64, now: u64) {
        shard.refusals_word(super::refusals::CLOCK).store(horizon << 32 | now, Relaxed);
    }

    /// Forget what the policy of `shard` learnt and let it choose its mode
    /// again (it starts strict, warming up).
    fn reset_to_adaptive(shard: &super::Shard) {
        let g = shard.lock(Duration::from_secs(5)).unwrap();
        g.reset_policy();
        g.pin_eviction(super::EvictionMode::Adaptive);
    }

    /// An adaptive shard that admits strictly turns lenient, with a way
    /// back, once eight of the candidates it refused came back in a row
    /// within the horizon; one that stayed away past it ends the run, and
    /// so does a return later than the horizon after the last. A shard
    /// pinned strict stays strict.
    #[test]
    fn a_strict_shard_turns_lenient_when_what_it_refused_comes_back() {
        let dir = OneShard::new("returns");
        let store = dir.open(1 << 20, true, true);
        let shard = &store.shard_slice()[0];
        let clock = |now: u64| set_refusals_clock(shard, 10, now);
        // Tags whose probes have places of their own.
        let mut places = std::collections::HashSet::new();
        let tags: Vec<u32> = (1u32..)
            .map(|t| t << 8)
            .filter(|&t| places.insert(super::probe_place(t as u64, shard.refusal_probes)))
            .take(shard.refusal_probes)
            .collect();
        assert_eq!(shard.refusal_probes, 64);
        // Refuse `n` keys at `at` that came in `before` earlier, then
        // store them absent again at `back` (each a write of its own, as
        // a set is).
        let before = std::cell::Cell::new(0);
        let refuse_and_return = |n: usize, first: usize, at: u64, back: u64| {
            clock(at);
            for &t in &tags[first..first + n] {
                let g = shard.lock(Duration::from_secs(5)).unwrap();
                assert!(g.strict());
                assert!(!g.wins(t, 1, (at - before.get()) as u32), "the candidate has no count");
            }
            clock(back);
            for &t in &tags[first..first + n] {
                shard.lock(Duration::from_secs(5)).unwrap().note_miss(t);
            }
        };
        let runs_strict = || shard.lock(Duration::from_secs(5)).unwrap().strict();
        let reset = || reset_to_adaptive(shard);
        reset();
        refuse_and_return(7, 1, 100, 105);
        assert!(runs_strict(), "seven came back");
        refuse_and_return(1, 20, 106, 108);
        assert!(!runs_strict(), "eight came back in a row");
        let choice = AdmissionChoice::of_mode(shard.pol_word(pol::MODE).load(Relaxed));
        assert_eq!(
            choice,
            AdmissionChoice { strict: false, warm: true, way_back: WAY_BACK_PERIODS }
        );

        // One that stayed away past the horizon ends the run.
        reset();
        refuse_and_return(4, 1, 100, 105);
        refuse_and_return(1, 30, 105, 200);
        refuse_and_return(4, 40, 200, 205);
        assert!(runs_strict(), "a run of four, one that stayed away, four");
        refuse_and_return(4, 50, 205, 206);
        assert!(!runs_strict(), "eight in a row after it");

        // Returns further apart than the horizon are no run.
        reset();
        for (i, at) in (0..10).zip((100..).step_by(20)) {
            refuse_and_return(1, 50 + i, at, at + 5);
        }
        assert!(runs_strict(), "ten returns, each a horizon after the last");

        // A return is timed from when the candidate came in, and one that
        // came in longer than the horizon before its refusal is not
        // followed.
        reset();
        before.set(6);
        refuse_and_return(8, 1, 100, 105);
        assert!(runs_strict(), "back eleven after they came in");
        before.set(11);
        refuse_and_return(8, 10, 120, 121);
        assert!(runs_strict(), "refused eleven after they came in");
        before.set(10);
        refuse_and_return(8, 20, 140, 140);
        assert!(!runs_strict(), "eight back ten after they came in");
        before.set(0);

        // A pinned shard is left as it is.
        reset();
        shard.lock(Duration::from_secs(5)).unwrap().pin_eviction(super::EvictionMode::Strict);
        refuse_and_return(12, 1, 100, 105);
        assert!(runs_strict());
        drop(store);
    }

    /// The window of a shard of one segment is a queue: a judgement stops
    /// once it freed enough and leaves the rest for the next. The entries
    /// left came in before the last judgement, and their refusals are
    /// timed from the window's start before it (they were timed from the
    /// last judgement, and a strict shard on a loop, which leaves part of
    /// its window at most judgements, saw them come back early).
    #[test]
    fn entries_a_judgement_left_in_the_window_keep_when_they_came_in() {
        let dir = OneShard::new("arrivals");
        let store = dir.open(1 << 20, true, true);
        let shard = &store.shard_slice()[0];
        let guard = || shard.lock(Duration::from_secs(5)).unwrap();
        reset_to_adaptive(shard);
        assert!(guard().strict());
        // A judgement at `at` of a window of `len` entries that lets the
        // first `passed` out; the clocks its positions are timed from.
        let judge = |at: u64, len: usize, passed: usize| {
            set_refusals_clock(shard, 10, at);
            let g = guard();
            let arrivals = g.window_arrivals(len);
            let came_in: Vec<u32> = (0..len).map(|p| arrivals.came_in(p)).collect();
            g.note_window_judged(arrivals, passed);
            came_in
        };
        assert_eq!(judge(100, 4, 4), [0; 4], "before any judgement: the clock's start");
        assert_eq!(judge(110, 6, 4), [100; 6], "came in since the judgement at 100");
        // Two left at 110; four more came in since.
        assert_eq!(judge(120, 6, 1), [100, 100, 110, 110, 110, 110]);
        // One of those from before 110 left; three came in since 120.
        assert_eq!(judge(130, 8, 3), [100, 110, 110, 110, 110, 120, 120, 120]);
        // Two of the window died since (an overwrite, a delete): taken
        // from the newest, the rest look older than they may be.
        assert_eq!(judge(140, 3, 0), [110, 110, 120]);
        // More groups than the record holds: the oldest merge, the older
        // clock kept.
        for (i, at) in (150..200).step_by(10).enumerate() {
            judge(at, 4 + i, 0);
        }
        assert_eq!(judge(200, 9, 9), [110, 110, 110, 110, 110, 160, 170, 180, 190]);
        assert_eq!(judge(210, 2, 0), [200, 200]);
        // A pinned shard keeps no record of its window.
        guard().pin_eviction(super::EvictionMode::Strict);
        assert_eq!(judge(220, 3, 0), [0; 3]);
        drop(store);
    }

    /// From any stored rate, the sample rate settles on one that keeps a
    /// miniature within its records and that it would not move from
    /// again, for shards of any entry count. Miniatures of 64 records
    /// leave no room between their bounds at some counts (521 entries:
    /// 65 at one in eight, 32 at one in sixteen), where the rate used to
    /// swing between the two on every sampled request.
    #[test]
    fn the_sample_rate_settles_within_the_records() {
        let mut items = 1usize;
        while items < 1 << 28 {
            for recs in [64, 128, 256] {
                for start in 0..=31 {
                    let log2 = sample_rate(items, recs, start);
                    assert!(items >> log2 <= recs, "{items} entries, {recs} records: 2^{log2}");
                    assert_eq!(sample_rate(items, recs, log2), log2, "{items}, {recs}, {start}");
                    // No coarser rate than the bounds ask for.
                    let cap = items >> log2;
                    if log2 > MINI_RATE_LOG2 {
                        assert!(items >> (log2 - 1) > recs * 3 / 4, "{items}, {recs}: 2^{log2}");
                    } else if log2 > 0 && items >> (log2 - 1) <= recs {
                        assert!(cap >= 3 * MINI_ENTRIES / 4, "{items}, {recs}: 2^{log2}");
                    }
                }
            }
            items += 1 + items / 50;
        }
    }
}
