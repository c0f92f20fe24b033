//! One shard: a robust mutex, an open-addressing slot index and an
//! append-only arena, all inside the shared mapping.
//!
//! The parts, each with its own design comment:
//! * `guard`: the lock and [`ShardGuard`], the only way to a shard's
//!   words; the `WRITING` and `seq` brackets (`begin_write`, `begin_move`)
//!   and the header words, each checked before use.
//! * `index`: the slot words (tag, offset, visited bit), probing,
//!   placing and purging slots, rebuilding the index.
//! * `arena`: the entries (header, key, value), appending, the dead mark,
//!   lazy reservation of the arena's pages.
//! * `optimistic`: gets without the lock, validated by `seq`.
//! * `compaction`: dropping dead entries and SIEVE eviction, from the hand
//!   or over the whole arena; giving memory back; evicting spilled values.
//! * `segments`: the arena cut into fixed segments, a FIFO of them and
//!   a free list, the head and its in-place compaction.
//! * `conveyor`: eviction and compaction of the segments in passes of
//!   bounded size, paid by writes as the head fills.
//! * `repair`: salvage after a dead writer, resets after corruption, the
//!   full invariant check.
//! * `entry_ref`: [`EntryRef`], a found value handed to the caller.
//!
//! This module holds the [`Shard`] itself and the operations (get, set,
//! delete, cas, incr, touch, ...), all on [`ShardGuard`]: the lock
//! precondition is a type.
//!
//! Design:
//! * Writes append a new entry at the bump pointer and publish its slot
//!   last; the old entry (if any) is marked dead after its slot leads to
//!   the new one, and the slot keeps its visited bit. Deletes leave a
//!   tombstone slot. Nothing is freed in place. An overwrite that needs a
//!   compaction first unlinks the old entry and inserts the new one inside
//!   one move, so no reader ever sees the key absent.
//! * Nothing read from shared memory is trusted: every slot offset, entry
//!   length and bump value is checked against the shard's geometry before
//!   it is used. A failed check resets the shard (counted in `corruptions`).
//! * No Rust reference is ever created over shared bytes; all access is
//!   through raw pointers, under the lock.
//!
//! Versions (compare-and-swap, `Cache::cas`): a version names one written
//! state of one key, and costs no byte per entry and no shared word. It is
//! `(seq / 2) << b | (offset / ENTRY_ALIGN + 1)`, where `offset` is the
//! entry's place in the arena, `b` the bits that place needs in this
//! geometry (20 for 2 MiB shards, so 44 bits of generation; at least 31
//! at the largest shard), and `seq` the word above, read even.
//! * Why it names one write: between two moves the arena only grows, so
//!   an offset is written by one append at most; every write that changes
//!   an entry's bytes without a new offset (an in-place counter, `touch`)
//!   or moves entries (compactions, resets, repairs, salvages, `clear`, a
//!   growing index) is a move, and every move adds 2 to `seq`. Appends
//!   (set, add, replace, an overwrite) give the new entry a fresh offset
//!   and leave `seq` alone, so ordinary writes do not change other keys'
//!   versions; only moves do (a CAS may then fail spuriously, never
//!   succeed wrongly). Deletes and expiry make the key absent (version 0).
//!   A separate generation word was considered and left out: `seq` is
//!   already exactly that counter, bumped under the lock by every such
//!   write, and the optimistic reader already loads and validates it.
//! * Readers: an optimistic get builds the version from the `seq` it
//!   loaded before the copy and validated after it (with the slot it
//!   followed), so a version and a value are always read together; under
//!   the lock `seq` is even and stable.
//! * The generation wraps after 2^(64-b) moves of one shard: a version
//!   held across that many moves (2^44 at 2 MiB shards, years of constant
//!   compaction) could name a later entry at the same offset.
//! * Across a shard reset the generation moves on (a reset is a move), and
//!   offsets start again from 0 in the new generation. A new file, or a
//!   shard whose header was lost (file truncated and extended), starts
//!   `seq` at a random even value (`Shard::fresh_seq`): a version read
//!   from the file that used to be at that path then names nothing in the
//!   new one, but for a 2^-(64-b) chance.
//! * A hostile or corrupt file: `seq` and the slots are shared words that
//!   another program can set to anything, so there a CAS can store over a
//!   value it never read, or fail every time (`Cache::update` then gives
//!   up with `TooManyConflicts` after its bound). Never unsafe: a version
//!   is only ever compared, never used to find or read anything; the
//!   entry it is compared with was found and checked like any other. A
//!   program that can write the file can write any value anyway.

mod arena;
mod compaction;
mod conveyor;
mod entry_ref;
mod guard;
mod index;
mod optimistic;
mod policy;
mod repair;
mod segments;

use arena::Entry;
pub(crate) use arena::{has_dropped, take_dropped};
pub use compaction::COMPACT_FREE_PERCENT;
pub use entry_ref::EntryRef;
use entry_ref::Src;
pub(crate) use guard::ShardGuard;
use index::Probe;
pub use policy::EvictionMode;
pub(crate) use policy::Samples;
pub(crate) use policy::{AdmissionChoice, MiniTally};

use crate::counters::{Counter, Stripes};
use crate::error::{Error, Result};
use crate::hash::{hash_key, tag_of};
use crate::layout::*;
use crate::lock;
use crate::spill::SpillRef;
use crate::stats::ShardStats;
use std::ptr;
use std::sync::atomic::Ordering;

/// Shard corruption found while reading shared memory.
#[derive(Debug)]
pub(crate) struct Corrupt(pub &'static str);

type Check<T> = std::result::Result<T, Corrupt>;

/// Position of one shard in the mapping, with its geometry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shard {
    base: *mut u8,
    slots: usize,
    arena_off: usize,
    arena_size: usize,
    /// The shard reserves file space as it grows (see `arena.rs`).
    lazy: bool,
    /// The cache file, for `fallocate`, and the shard's offset in it.
    fd: i32,
    /// Bytes of the file system a growth leaves free (`fs_reserve`).
    fs_reserve: u64,
    file_off: usize,
    initial_active: usize,
    /// The file's hash seed: entries' keys are hashed again with it.
    seed: u64,
    /// The largest entry a write stores (`Geometry::max_entry_size`).
    max_entry: usize,
    /// The file's per-CPU hit and miss counters.
    stripes: Stripes,
    /// Bits of a version that hold the entry's offset (see "Versions").
    ver_bits: u32,
    /// Segments of the arena and their size (`segments.rs`).
    seg_count: usize,
    seg_size: usize,
    /// `seg_size`'s reciprocal for `ShardGuard::seg_of` (a multiply, not a
    /// division, on every write).
    seg_recip: u64,
    /// Offsets of the segment table and of the index in the shard.
    table_off: usize,
    index_off: usize,
    /// The policy region (`policy.rs`): the offsets of its header and of
    /// its body, the body's size, the sketch's counters per row and each
    /// miniature's main records.
    policy_off: usize,
    policy_body_off: usize,
    policy_size: usize,
    sketch_width: usize,
    mini_records: usize,
    /// Probes of the refusals' record (`Geometry::refusal_probes`) and
    /// where the record starts in the policy body (its last bytes).
    refusal_probes: usize,
    refusals_off: usize,
    /// The shard's number in its file (where its handle keeps what it
    /// sampled of it: `policy::Samples`).
    pub(crate) number: usize,
}

// SAFETY: a Shard is a pointer into a MAP_SHARED mapping that outlives it
// (the Region owns the mapping); writes go through the shard's
// process-shared lock, and lock-free reads only load words and copy bytes,
// checked and validated (see the module comment), which is exactly what
// makes cross-thread use sound.
unsafe impl Send for Shard {}

// SAFETY: see Send.
unsafe impl Sync for Shard {}

/// Why an entry has no place yet.
enum Room {
    /// Arena offset and slot for the entry.
    Place(usize, usize),
    /// The index reached its load limit.
    IndexFull,
    /// The entry does not fit between the bump pointer and the end of the
    /// reserved arena (but fits in the head segment).
    ArenaFull { bump: usize },
    /// The entry does not fit in the head segment.
    HeadFull { bump: usize },
}

/// What a write tried already to make room in a segmented shard.
#[derive(Default)]
struct RoomState {
    /// A step dropped dead entries instead of growing.
    dropped_dead: bool,
    /// The file system refused to grow the arena.
    grow_refused: bool,
}

/// How `set` treats an existing entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    /// Store unconditionally.
    Always,
    /// Store only if the key is absent (or expired).
    IfAbsent,
    /// Store only if the key is present (and not expired).
    IfPresent,
}

/// Outcome of a compare-and-swap ([`crate::Cache::cas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CasOutcome {
    /// Stored; the new version of the key.
    Stored(u64),
    /// Not stored: the key's version was not the expected one. This is the
    /// version found (0: the key was absent).
    Conflict(u64),
}

/// Bits of a version that hold `offset / ENTRY_ALIGN + 1` for an arena of
/// `arena_size` bytes (the rest holds the generation).
fn version_offset_bits(arena_size: usize) -> u32 {
    let most = (arena_size / ENTRY_ALIGN + 1) as u64;
    (u64::BITS - most.leading_zeros()).clamp(1, 40)
}

/// Metadata of a live entry passed to `for_each_live`.
#[derive(Debug, Clone, Copy)]
pub struct Entry0 {
    pub value_len: usize,
    pub flags: u32,
    pub expires_ms: u64,
}

/// The current Unix time in ms, read at most once per operation.
pub(crate) struct Now(Option<u64>);

impl Now {
    pub(crate) fn new() -> Now {
        Now(None)
    }
    pub(crate) fn get(&mut self) -> u64 {
        *self.0.get_or_insert_with(now_ms)
    }
}

/// The time this process's engine clock is held at (`set_clock_override_ms`),
/// in Unix milliseconds; 0 (outside tests) means the real clock.
static CLOCK_OVERRIDE_MS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Unix time in milliseconds, as this process's engine sees it (the real
/// clock, unless a test held it with `set_clock_override_ms`).
pub fn now_ms() -> u64 {
    let held = CLOCK_OVERRIDE_MS.load(std::sync::atomic::Ordering::Relaxed);
    if held != 0 {
        return held;
    }
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A test hook: hold this process's engine clock at `unix_ms` (0 lets it
/// run again), so tests of expiry need not sleep. Only this process is
/// affected: expiry times written meanwhile are on the held clock, and
/// other processes read them with their own. Bindings expose it as a debug
/// call (Perl's `Cache::Near::_set_time_override`, as Cache::FastMmap's).
pub fn set_clock_override_ms(unix_ms: u64) {
    CLOCK_OVERRIDE_MS.store(unix_ms, std::sync::atomic::Ordering::Relaxed);
}

impl Shard {
    /// # Safety
    /// `base` must point to `geo.shard_size` bytes of a live shared mapping
    /// that outlives the returned value, found at `file_off` in the file
    /// open as `fd`, which stays open as long as the mapping. A growth
    /// leaves `fs_reserve` bytes of the file system free.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn new(
        base: *mut u8,
        geo: &Geometry,
        lazy: bool,
        fd: i32,
        file_off: usize,
        stripes: Stripes,
        fs_reserve: u64,
    ) -> Shard {
        Shard {
            base,
            slots: geo.slots_per_shard,
            arena_off: geo.arena_offset(),
            arena_size: geo.arena_size(),
            lazy,
            fd,
            fs_reserve,
            file_off,
            initial_active: geo.initial_active_slots(),
            seed: geo.seed,
            max_entry: geo.max_entry_size(),
            stripes,
            ver_bits: version_offset_bits(geo.arena_size()),
            seg_count: geo.segments().0,
            seg_size: geo.segments().1,
            seg_recip: segments::reciprocal(geo.segments().1),
            table_off: geo.segment_table_offset(),
            index_off: geo.index_offset(),
            policy_off: geo.policy_offset(),
            policy_body_off: geo.policy_body_offset(),
            policy_size: geo.policy_size(),
            sketch_width: geo.policy_parts().0,
            mini_records: geo.policy_parts().1,
            refusal_probes: geo.refusal_probes(),
            refusals_off: geo.policy_size() - geo.refusals_size(),
            number: file_off.saturating_sub(HEADER_SIZE) / geo.shard_size.max(1),
        }
    }

    /// The version of the entry at arena offset `off` while the shard's
    /// `seq` reads `seq` (even): see "Versions" in the module comment.
    #[inline]
    fn version(&self, seq: u64, off: usize) -> u64 {
        // The shift drops the generation's high bits (it wraps); the low
        // part is never 0, so neither is a version.
        ((seq >> 1) << self.ver_bits) | (off / ENTRY_ALIGN + 1) as u64
    }

    /// A fresh, unpredictable starting `seq` (even) for a shard whose
    /// header was zeroed (a new file, or a header lost and rebuilt), so
    /// that versions read from an earlier file at this path, or before the
    /// loss, do not name entries of the new one (see "Versions").
    fn fresh_seq(&self) -> u64 {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let mut salt = [0u8; 24];
        salt[..8].copy_from_slice(&nanos.to_le_bytes());
        salt[8..16].copy_from_slice(&(self.base as u64).to_le_bytes());
        salt[16..].copy_from_slice(&(crate::lock::my_pid() as u64).to_le_bytes());
        hash_key(self.file_off as u64, &salt) & !1
    }

    /// Initialise the mutex and reset the shard. Only while no other process
    /// has the file mapped (creation, or holding the exclusive OFD lock).
    pub(crate) fn init(&self) -> Result<()> {
        self.reserve_initial()?;
        // SAFETY: the caller guarantees exclusivity; the header region is
        // SHARD_HEADER_SIZE bytes inside the shard.
        unsafe {
            ptr::write_bytes(self.base, 0, SHARD_HEADER_SIZE);
            lock::init(self.lock_word());
        }
        let g = ShardGuard::unlocked(self);
        if self.lazy {
            g.set_hdr(sh::ACTIVE_SLOTS, self.initial_active as u64);
        }
        g.set_hdr(sh::SEQ, self.fresh_seq());
        g.repair();
        g.pin_eviction(EvictionMode::default());
        g.set_hdr(sh::MAGIC, SHARD_MAGIC);
        Ok(())
    }

    /// Re-initialise the mutex of a shard while no other process is
    /// attached (after a reboot or a crash of everyone), keeping the data
    /// unless the shard was left half-written.
    pub(crate) fn reattach_exclusive(&self) -> Result<bool> {
        // Idempotent; a shard whose pages were lost (file truncated and
        // extended) gets its header back before it is written.
        self.reserve_initial()?;
        // SAFETY: exclusive (caller holds the file's exclusive OFD lock).
        unsafe { lock::init(self.lock_word()) };
        self.free_minis_lock();
        let g = ShardGuard::unlocked(self);
        let damaged = g.hdr(sh::MAGIC) != SHARD_MAGIC;
        g.set_hdr(sh::MAGIC, SHARD_MAGIC);
        if damaged {
            // The header was lost with its seq: start the versions afresh.
            g.set_hdr(sh::SEQ, self.fresh_seq());
            g.repair();
            g.bump_stat(sh::RESETS);
            return Ok(true);
        }
        Ok(g.repair_after_owner_death())
    }

    /// The live-entry counter, read without the lock (one aligned word) and
    /// bounded by the slot count, since it comes from shared memory.
    pub(crate) fn items_unlocked(&self) -> usize {
        (self.header_atomic(sh::ITEMS).load(Ordering::Relaxed) as usize).min(self.slots)
    }

    /// Counters of this shard, read without the lock (one word each).
    pub(crate) fn stats_unlocked(&self) -> ShardStats {
        let g = ShardGuard::unlocked(self);
        g.stats()
    }
}

impl<'a> ShardGuard<'a> {
    /// Look up a live entry, expiring it lazily. Corruption resets the shard
    /// and reads as a miss.
    fn lookup_live(&self, key: &[u8], hash: u64, now: &mut Now) -> Option<(usize, Entry)> {
        let res = (|| {
            let p = self.probe(key, hash, Some(self.arena_reserved()?))?;
            Ok(p.found)
        })();
        match res {
            Ok(Some((i, e))) => {
                if e.expires != 0 && e.expired(now.get()) {
                    self.begin_write();
                    self.unlink(i, &e);
                    self.end_write();
                    self.bump_stat(sh::EXPIRATIONS);
                    None
                } else {
                    Some((i, e))
                }
            }
            Ok(None) => None,
            Err(c) => {
                self.recover(c);
                None
            }
        }
    }

    /// Run `f` on the live entry for `key`, counting a hit or a miss and
    /// marking the entry visited for SIEVE.
    pub(crate) fn get<R>(
        &self,
        key: &[u8],
        hash: u64,
        now: &mut Now,
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> Option<R> {
        match self.lookup_live(key, hash, now) {
            Some((i, e)) => {
                self.mark_visited(i, e.off);
                self.shard.stripes.add(Counter::Hits);
                Some(f(EntryRef {
                    src: Src::Arena { guard: self, off: e.val_off() },
                    val_len: e.val_len,
                    flags: e.flags,
                    expires_ms: e.expires,
                    version: self.version_of(&e),
                }))
            }
            None => {
                self.shard.stripes.add(Counter::Misses);
                None
            }
        }
    }

    /// Is `key` live? Counts nothing, marks nothing.
    pub(crate) fn contains(&self, key: &[u8], hash: u64, now: &mut Now) -> bool {
        self.lookup_live(key, hash, now).is_some()
    }

    /// Expiry of the live entry (0 = never), or None.
    pub(crate) fn expires_of(&self, key: &[u8], hash: u64, now: &mut Now) -> Option<u64> {
        self.lookup_live(key, hash, now).map(|(_, e)| e.expires)
    }

    /// Store `value` under `key`. Returns false when `mode` declined.
    /// The caller has checked that the entry fits (`max_entry_size`).
    /// Fails with `Error::Full` (nothing changed) only when the shard
    /// cannot hold the entry even empty and the file system has no room
    /// to grow it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn set(
        &self,
        key: &[u8],
        hash: u64,
        value: &[u8],
        flags: u32,
        expires: u64,
        mode: SetMode,
        now: &mut Now,
    ) -> Result<bool> {
        let existing = self.lookup_live(key, hash, now);
        match (mode, &existing) {
            (SetMode::IfAbsent, Some(_)) | (SetMode::IfPresent, None) => return Ok(false),
            _ => {}
        }
        let size = entry_size(key.len(), value.len());
        self.ensure_can_hold(size)?;
        self.begin_write();
        let bump_before = self.hdr(sh::BUMP);
        let stored = match existing {
            Some((i, e)) if self.replace(i, &e, key, hash, value, flags, expires, size) => true,
            Some((i, e)) => {
                // No room without a compaction or growth: the key leaves
                // the index and comes back inside one move, so that no
                // optimistic reader sees it absent meanwhile.
                self.begin_move();
                self.unlink(i, &e);
                let stored = self.insert(key, hash, value, flags, expires, size, now);
                self.end_move();
                stored
            }
            None => {
                self.note_miss(tag_of(hash));
                self.insert(key, hash, value, flags, expires, size, now)
            }
        };
        if stored {
            self.bump_stat(sh::SETS);
            self.keep_ahead(bump_before, now);
        }
        self.end_write();
        Ok(stored)
    }

    /// Append a new entry for a key known to be absent. Inside begin/end.
    /// Returns false if no room could be made (only possible while another
    /// program rewrites the shard under us); the key is then absent.
    ///
    /// Every shared word that decides where the entry goes (bump pointer,
    /// slot counter, the chosen slot) is read once into a local, checked,
    /// and only the local is used: a writer that changes the word between
    /// our check and our write cannot move the write out of the arena.
    #[allow(clippy::too_many_arguments)]
    fn insert(
        &self,
        key: &[u8],
        hash: u64,
        value: &[u8],
        flags: u32,
        expires: u64,
        size: usize,
        now: &mut Now,
    ) -> bool {
        debug_assert!(value.len() <= u32::MAX as usize && key.len() <= MAX_KEY_LEN);
        // Growth (lazy files) and dropping dead entries may take a few
        // rounds; one eviction always makes room for an entry that the
        // reserved arena can hold (`ensure_can_hold`); if even that fails
        // the shard is reset, and after a reset an entry fits unless the
        // shard is being rewritten concurrently: then give up, not loop.
        let mut evicted = false;
        let mut dropped_dead = false;
        let mut state = RoomState::default();
        for _attempt in 0..8 {
            let room = (|| -> Check<Room> {
                let (off, head_end) = self.head_room()?;
                let reserved = self.arena_reserved()?;
                let active = self.active_slots()?;
                if self.hdr(sh::SLOTS_USED) as usize >= active * 3 / 4 {
                    return Ok(Room::IndexFull);
                }
                if size > head_end - off {
                    return Ok(Room::HeadFull { bump: off });
                }
                if off > reserved || size > reserved - off {
                    return Ok(Room::ArenaFull { bump: off });
                }
                Ok(match self.probe(key, hash, Some(reserved))?.free_slot {
                    Some(slot) => Room::Place(off, slot),
                    None => Room::IndexFull,
                })
            })();
            let room = match room {
                Ok(r) if self.segmented() && !matches!(r, Room::Place(..)) => {
                    match self.make_room_segmented(r, size, now, &mut state) {
                        Ok(true) => continue,
                        Ok(false) => Ok(Room::HeadFull { bump: 0 }),
                        Err(c) => Err(c),
                    }
                }
                Ok(Room::HeadFull { bump }) => Ok(Room::ArenaFull { bump }),
                r => r,
            };
            let (off, slot) = match room {
                Ok(Room::Place(off, slot)) => (off, slot),
                Ok(_) if evicted || self.segmented() => {
                    self.recover(Corrupt("no room after compaction"));
                    evicted = false;
                    continue;
                }
                Ok(Room::IndexFull) => {
                    let active = self.active_slots().unwrap_or(self.shard.slots);
                    // Doubling the index rebuilds it in a compaction that
                    // need not evict; without room to double, evict.
                    // One move: a reader must not see the new slot count
                    // before the index is rebuilt for it.
                    self.begin_move();
                    let grown = self.grow_index(active);
                    evicted = !grown;
                    self.compact(size, !grown, now);
                    self.end_move();
                    continue;
                }
                Ok(Room::ArenaFull { bump } | Room::HeadFull { bump }) => {
                    let reserved = self.arena_reserved().unwrap_or(0);
                    let dead = bump.saturating_sub(self.hdr(sh::LIVE_BYTES) as usize);
                    if self.shard.lazy && reserved < self.shard.arena_size {
                        // Keep the held memory within 1.2x the live bytes
                        // (plus DEAD_SLACK): drop dead entries before
                        // growing when they are more than a sixth of the
                        // used arena. The slack spaces these compactions
                        // out when a small shard is mostly rewritten.
                        if !dropped_dead && dead * 6 > bump && dead >= DEAD_SLACK {
                            dropped_dead = true;
                            self.compact(0, false, now);
                            continue;
                        }
                        if self.grow_arena(reserved, bump + size) {
                            continue;
                        }
                    }
                    evicted = true;
                    self.compact(size, true, now);
                    continue;
                }
                Err(c) => {
                    self.recover(c);
                    continue;
                }
            };
            // Checked above on these very values: off + size <= reserved
            // <= arena_size.
            self.append(off, size, key, value, flags, expires);
            self.add_stat(sh::ITEMS, 1);
            if self.slot(slot) == TOMBSTONE {
                self.set_hdr(sh::TOMBSTONES, self.hdr(sh::TOMBSTONES).saturating_sub(1));
            } else {
                self.add_stat(sh::SLOTS_USED, 1);
            }
            // Publish last.
            self.set_slot(slot, Self::slot_value(hash, off));
            return true;
        }
        false
    }

    /// Make room for an entry of `size` bytes in a segmented shard
    /// (`segments.rs`): grow the head's reservation, take a new head, or
    /// take a compaction step. Ok(false): no room could be made.
    fn make_room_segmented(
        &self,
        room: Room,
        size: usize,
        now: &mut Now,
        st: &mut RoomState,
    ) -> Check<bool> {
        match room {
            Room::Place(..) => Ok(true),
            Room::IndexFull => {
                // Doubling the index places its slots again (no entry
                // moves); so does an index a quarter tombstones; else a
                // step evicts. One move: a reader must not see the new
                // slot count before the index is rebuilt for it.
                let active = self.active_slots()?;
                self.begin_move();
                let tombstones = self.hdr(sh::TOMBSTONES).saturating_mul(4);
                let r = if self.grow_index(active) || tombstones >= self.hdr(sh::SLOTS_USED) {
                    self.rehash_index(active).map(|_| true)
                } else {
                    Ok(self.step(true, now))
                };
                self.end_move();
                r
            }
            Room::ArenaFull { bump } => {
                // As before segments: keep held memory near the live bytes
                // by dropping the head's dead copies before growing it
                // when dead bytes are more than a sixth of the used ones.
                let used = self.used_bytes();
                let dead = used.saturating_sub(self.hdr(sh::LIVE_BYTES) as usize);
                if !st.dropped_dead && dead * 6 > used && dead >= DEAD_SLACK {
                    st.dropped_dead = true;
                    if self.compact_head(now) {
                        return Ok(true);
                    }
                }
                let reserved = self.arena_reserved()?;
                if !st.grow_refused && self.grow_arena(reserved, bump + size) {
                    return Ok(true);
                }
                st.grow_refused = true;
                self.new_head(now, &mut st.dropped_dead, false, size)
            }
            Room::HeadFull { .. } => {
                self.new_head(now, &mut st.dropped_dead, !st.grow_refused, size)
            }
        }
    }

    /// Overwrite the live entry `e` of `key`, found in slot `i`, without
    /// a move: append the new entry, point the slot at it (one atomic
    /// store: a reader finds the old entry or the new one, never neither;
    /// the visited mark carries over), then mark the old one dead. False,
    /// with nothing changed, when the arena has no room left without a
    /// compaction or growth.
    #[allow(clippy::too_many_arguments)]
    fn replace(
        &self,
        i: usize,
        e: &Entry,
        key: &[u8],
        hash: u64,
        value: &[u8],
        flags: u32,
        expires: u64,
        size: usize,
    ) -> bool {
        // A failed check is met again, and repaired, on the insert path.
        let Ok(Some(off)) = self.room_in_head(size) else { return false };
        // The old entry is marked dead after the new one is published, so
        // that a lock-free reader always finds one of them live; unless it
        // lies where the new one goes (past the bump pointer: only a slot
        // that a hostile file left stale leads there, e.g. into a segment
        // freed unread because its live count was lowered), where marking
        // it afterwards would write into the new entry.
        let stale = e.off < off + size && off < e.off + e.size;
        let retire_old = || {
            self.note_dropped(e);
            self.mark_dead(e);
        };
        if stale {
            retire_old();
        }
        self.append(off, size, key, value, flags, expires);
        // The key keeps its SIEVE mark: an overwrite is a use of the key,
        // and a slot published already marked spares the next reader the
        // compare-and-swap that would pull the slot's line back to it.
        let visited = self.slot(i) & SLOT_VISITED;
        self.set_slot(i, Self::slot_value(hash, off) | visited);
        if !stale {
            retire_old();
        }
        self.set_hdr(sh::LIVE_BYTES, self.hdr(sh::LIVE_BYTES).saturating_sub(e.size as u64));
        true
    }

    /// Delete `key`. Returns whether a live entry was removed.
    pub(crate) fn delete(&self, key: &[u8], hash: u64, now: &mut Now) -> bool {
        match self.lookup_live(key, hash, now) {
            Some((i, e)) => {
                self.begin_write();
                self.unlink(i, &e);
                self.end_write();
                self.bump_stat(sh::DELETES);
                true
            }
            None => false,
        }
    }

    /// Delete `key` only if its value equals `expected` (compare-and-delete,
    /// e.g. releasing a lock only while still its owner).
    pub(crate) fn delete_if_equals(
        &self,
        key: &[u8],
        hash: u64,
        expected: &[u8],
        now: &mut Now,
    ) -> bool {
        let Some((i, e)) = self.lookup_live(key, hash, now) else { return false };
        if e.val_len != expected.len() {
            return false;
        }
        // SAFETY: the value bytes lie inside the checked entry; memcmp reads
        // through raw pointers.
        let same = unsafe {
            libc::memcmp(
                self.arena_ptr(e.val_off()) as *const libc::c_void,
                expected.as_ptr() as *const libc::c_void,
                expected.len(),
            ) == 0
        };
        if same {
            self.begin_write();
            self.unlink(i, &e);
            self.end_write();
            self.bump_stat(sh::DELETES);
        }
        same
    }

    /// The version of the checked entry `e` (under the lock, where `seq`
    /// is even: a move in progress is this guard's own, and no entry is
    /// read inside one).
    fn version_of(&self, e: &Entry) -> u64 {
        self.shard.version(self.hdr(sh::SEQ) & !1, e.off)
    }

    /// The version of `key`'s live entry, 0 if absent (an expired entry
    /// is unlinked on the way).
    pub(crate) fn current_version(&self, key: &[u8], hash: u64, now: &mut Now) -> u64 {
        self.lookup_live(key, hash, now).map_or(0, |(_, e)| self.version_of(&e))
    }

    /// Compare-and-swap: store `value` only if `key`'s version is
    /// `expected` (0: only if absent). One lock hold covers the comparison
    /// and the store, so two CASes with one version never both store.
    /// Fails with `Error::Full` (nothing changed) as `set` does.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn cas(
        &self,
        key: &[u8],
        hash: u64,
        value: &[u8],
        flags: u32,
        expires: u64,
        expected: u64,
        now: &mut Now,
    ) -> Result<CasOutcome> {
        let current = self.current_version(key, hash, now);
        if current != expected {
            return Ok(CasOutcome::Conflict(current));
        }
        let stored = self.set(key, hash, value, flags, expires, SetMode::Always, now)?;
        // The new entry's version (its offset, and the seq after whatever
        // compaction the store needed). Not stored (only while another
        // program rewrites the shard): report what is there now.
        let now_version = self.current_version(key, hash, now);
        Ok(if stored && now_version != 0 {
            CasOutcome::Stored(now_version)
        } else {
            CasOutcome::Conflict(now_version)
        })
    }

    /// Delete `key` only if its version is `expected` (never for 0).
    pub(crate) fn delete_if_version(
        &self,
        key: &[u8],
        hash: u64,
        expected: u64,
        now: &mut Now,
    ) -> bool {
        let Some((i, e)) = self.lookup_live(key, hash, now) else { return false };
        if expected == 0 || self.version_of(&e) != expected {
            return false;
        }
        self.begin_write();
        self.unlink(i, &e);
        self.end_write();
        self.bump_stat(sh::DELETES);
        true
    }

    /// Remove `key` and hand its value to `f`.
    pub(crate) fn pop<R>(
        &self,
        key: &[u8],
        hash: u64,
        now: &mut Now,
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> Option<R> {
        let (i, e) = self.lookup_live(key, hash, now)?;
        let r = f(EntryRef {
            src: Src::Arena { guard: self, off: e.val_off() },
            val_len: e.val_len,
            flags: e.flags,
            expires_ms: e.expires,
            version: self.version_of(&e),
        });
        self.begin_write();
        self.unlink(i, &e);
        self.end_write();
        self.bump_stat(sh::DELETES);
        Some(r)
    }

    /// Set a new expiry on a live entry.
    pub(crate) fn touch(&self, key: &[u8], hash: u64, expires: u64, now: &mut Now) -> bool {
        match self.lookup_live(key, hash, now) {
            Some((_, e)) => {
                // The expiry spans two words: a move, so that an optimistic
                // reader never judges the entry by half of each expiry.
                self.begin_write();
                self.begin_move();
                // SAFETY: header of a checked entry; the lock is held.
                unsafe { self.write_meta(self.arena_ptr(e.off), entry_meta(expires, e.key_len)) };
                self.end_move();
                self.end_write();
                true
            }
            None => false,
        }
    }

    /// Add `delta` to the 64-bit counter at `key`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn incr(
        &self,
        key: &[u8],
        hash: u64,
        delta: i64,
        initial: Option<i64>,
        expires: u64,
        counter_flag: u32,
        now: &mut Now,
    ) -> Result<i64> {
        match self.lookup_live(key, hash, now) {
            Some((_, e)) => {
                if e.flags != counter_flag || e.val_len != 8 {
                    return Err(Error::NotACounter);
                }
                let p = self.arena_ptr(e.val_off()) as *mut [u8; 8];
                // SAFETY: the 8 value bytes lie inside the checked entry.
                let cur = i64::from_le_bytes(unsafe { ptr::read_unaligned(p) });
                let new = cur.checked_add(delta).ok_or(Error::Overflow)?;
                // A move: the word may be unaligned, and an optimistic
                // reader must not return half of each value.
                self.begin_write();
                self.begin_move();
                // SAFETY: as above; written under the lock.
                unsafe { ptr::write_unaligned(p, new.to_le_bytes()) };
                self.end_move();
                self.end_write();
                self.bump_stat(sh::SETS);
                Ok(new)
            }
            None => {
                let start = initial.ok_or(Error::NotFound)?;
                let new = start.checked_add(delta).ok_or(Error::Overflow)?;
                let size = entry_size(key.len(), 8);
                self.ensure_can_hold(size)?;
                self.begin_write();
                self.note_miss(tag_of(hash));
                let stored =
                    self.insert(key, hash, &new.to_le_bytes(), counter_flag, expires, size, now);
                if stored {
                    self.bump_stat(sh::SETS);
                }
                self.end_write();
                Ok(new)
            }
        }
    }

    /// Drop every entry.
    pub(crate) fn clear(&self) {
        let items = self.hdr(sh::ITEMS);
        let _ = self.walk_indexed(|e| self.note_dropped(e));
        self.begin_move();
        self.reset_data();
        self.add_stat(sh::DELETES, items);
        self.release_memory();
        self.end_move();
    }

    /// Call `f(key, value_len, flags, expires)` for each live entry, in
    /// arena order. Stops early on corruption (after resetting).
    pub(crate) fn for_each_live(&self, now: &mut Now, mut f: impl FnMut(&[u8], &Entry0)) {
        let mut key = Vec::new();
        let t = now.get();
        let res = self.walk_entries(|e| {
            if !e.is_dead() && !e.expired(t) {
                key.resize(e.key_len, 0);
                // SAFETY: key bytes inside the checked entry.
                unsafe { self.shard.copy_out(e.off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len) };
                let value_len = match self.spilled_ref(e) {
                    Some(r) => r.len as usize,
                    None => e.val_len,
                };
                f(
                    &key,
                    &Entry0 { value_len, flags: e.flags & !FLAG_SPILLED, expires_ms: e.expires },
                );
            }
            Ok(())
        });
        if let Err(c) = res {
            self.recover(c);
        }
    }

    /// Call `f(key, value bytes, raw flags, expires)` for each live entry,
    /// oldest first (the segments from tail to head, each in write order:
    /// the eviction order). A spilled entry's value bytes are its
    /// reference, and its flags carry `FLAG_SPILLED`. A shard that fails
    /// its checks is reset: what it held is lost, never copied torn.
    pub(crate) fn for_each_live_raw(
        &self,
        now: &mut Now,
        mut f: impl FnMut(&[u8], &[u8], u32, u64),
    ) {
        let t = now.get();
        let (mut key, mut val) = (Vec::new(), Vec::new());
        let res = self.walk_entries(|e| {
            if !e.is_dead() && !e.expired(t) {
                key.resize(e.key_len, 0);
                val.resize(e.val_len, 0);
                // SAFETY: key and value bytes lie inside the entry that
                // `walk_entries` checked against its segment's used end.
                unsafe {
                    self.shard.copy_out(e.off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len);
                    self.shard.copy_out(e.val_off(), val.as_mut_ptr(), e.val_len);
                }
                f(&key, &val, e.flags, e.expires);
            }
            Ok(())
        });
        if let Err(c) = res {
            self.recover(c);
        }
    }

    /// Append the references of every spilled entry not marked dead
    /// (expired ones included: their files are still theirs). A shard
    /// that fails its checks is reset (its files become orphans).
    pub(crate) fn spilled_refs(&self, out: &mut Vec<SpillRef>) {
        if let Err(c) = self.walk_indexed(|e| out.extend(self.spilled_ref(e))) {
            self.recover(c);
        }
    }
}
