//! On-file layout: the file header, the shard geometry and the entry format.
//!
//! ```text
//! file  = [file header, HEADER_SIZE bytes][shard 0][shard 1]...[shard n-1]
//! file header = [fields, 128 bytes][per-CPU counter stripes, from 128]
//! shard = [shard header, SHARD_HEADER_SIZE bytes]
//!         [segment table: two u64 per segment, padded to 64 bytes]
//!         [slot index: slots_per_shard x u64]
//!         [arena: segment_count segments of segment_size bytes, entries
//!          appended in insertion order, 4-byte aligned]
//! segment words = [next segment (u32, u32::MAX: none) << 32 | used bytes (u32)]
//!                 [live bytes: entries not marked dead (u64)]
//! entry = [meta: u32 expires_at_ms low 32 bits,
//!                u32 expires_at_ms high 16 bits | (key_len - 1) << 16]
//!         [len u32: value_len (31 bits) | dead << 31][flags u32]
//!         [key bytes][value bytes][pad to 4]
//! slot  = 0 (empty) | TOMBSTONE
//!       | visited << 63 | tag (31 bits) << 32 | (entry offset / 4 + 1)
//! ```
//!
//! All integers are native-endian (the file is a same-host object). The
//! geometry (shard count, shard size, slot count) is read once from the file
//! header, validated, and kept in process memory: nothing later read from a
//! shard can move a pointer outside that shard, because every offset read
//! from shared memory is checked against the geometry before use.

use crate::error::{Error, Result};
use crate::hash::{DEFAULT_SEED, HASH_XXH3_64};
use crate::lock::MUTEX_BYTES;

/// Entry flag bit the engine reserves: the value is a reference to a file
/// holding the real value (see `spill.rs`). Callers' flags must leave it
/// clear.
pub const FLAG_SPILLED: u32 = 1 << 31;

/// "NEARCACH" — the first eight bytes of every cache file.
pub const MAGIC: [u8; 8] = *b"NEARCACH";
/// Bumped whenever the layout changes incompatibly. Version 2: the shard
/// lock is the engine's futex word (see `lock.rs`), not a pthread mutex.
/// Version 3: the header checksum covers the lazy flag. Version 4: SIEVE's
/// visited mark lives in the slot (31-bit tags), not in the entry; 20-byte
/// entry headers. Version 5: an index of any multiple of 8 slots, its home
/// slots the tag scaled to the slot count (`hash::home_slot`). Version 6:
/// the shard header grouped by writer (see `sh`); `seq` moves only when
/// entries move, and gets validate the slot they read. Version 7: 16-byte
/// entry headers (the tag lives in the slot alone) and entries aligned to
/// 4 bytes, not 8. Version 8: the arena is cut into segments (a segment
/// table before it, five shard header words), compacted a few segments at
/// a time. Version 9: the migration record of a live resize
/// (`fh::MIGRATION`, `fh::MOVED`; see `resize.rs`): an older engine would
/// ignore it and serve entries a resize had moved. Version 10: the
/// conveyor (`shard/conveyor.rs`) compacts segments in bounded passes, its
/// read cursor and progress count in two shard header words, judged bytes
/// left as dead filler entries between passes: an older engine would
/// compact from a write cursor that no longer marks where judging stopped.
/// Version 11: a second word per segment counts its live bytes, and the
/// conveyor frees a segment that holds none without reading it: an older
/// engine would leave the counts stale. Version 12: segments of 72 KiB at
/// least (were 96) and twelve of them at least in a segmented arena (were
/// eight): the same file size has another segment geometry. Version 13:
/// a policy region between the segment table and the index (a frequency
/// sketch and two miniature caches, `shard/policy.rs`), and an eviction
/// that judges new entries against the sketch when the shard runs in its
/// strict mode: an older engine would evict without feeding the sketch.
/// Version 14: three miniature caches (a third that runs SIEVE as a
/// lenient shard does, to choose the young share) of half again as many
/// records as entries: the same file size has another policy region.
/// Version 15: a frequency sketch of 2,048 counters per row at least in
/// shards of 128 KiB or more, a 32nd of a smaller shard (was 64), so a
/// small shard's sketch tells its keys apart: the same file size has
/// another policy region.
pub const LAYOUT_VERSION: u32 = 16;

/// Bytes of the header of a shard's refusals' record, the policy body's
/// last part (`shard/policy.rs`); its probes follow, 8 bytes each
/// (`Geometry::refusal_probes`).
pub const REFUSALS_HEADER: usize = 64;
/// Fewest counters per row of a shard's frequency sketch (4 KiB in all),
/// in shards of 128 KiB or more (a 32nd of a smaller one). The sketch
/// counts the keys of about ten times a shard's entries in additions
/// before it halves: a small shard sees more keys than an eighth of its
/// index slots tells apart (64 counters, before), its counters fill up,
/// and a duel becomes a coin toss. Shards of 1 MiB or more have as many
/// already; a smaller one holds up to 5% fewer entries (engine.md,
/// "Round twelve").
const MIN_SKETCH: usize = 2048;
/// Size of the file header; shards start here, page-aligned.
pub const HEADER_SIZE: usize = 4096;
/// Shard sizes are multiples of this.
pub const PAGE: usize = 4096;
/// Bytes of a shard header (lock, counters, statistics): four cache lines.
pub const SHARD_HEADER_SIZE: usize = 256;
/// Bytes of an entry header. The entry stores nothing of its key's hash:
/// the 31-bit tag a compaction needs to rebuild the index (the tag gives
/// the home slot) is in the slot that leads to the entry; repairs, `check`
/// and the eviction of spilled values hash the key bytes again with the
/// file's seed.
pub const ENTRY_HEADER: usize = 16;
/// Entries start at multiples of this, and their sizes are padded to it.
/// Every word of an entry header is a u32 (the 48-bit expiry is two of
/// them, changed together only inside a move, see `Shard::touch`), so 4
/// bytes are all the alignment entries need; 8 would pad half of all
/// entries by 4 bytes.
pub const ENTRY_ALIGN: usize = 4;
/// Smallest shard accepted.
pub const MIN_SHARD_SIZE: usize = 16 * 1024;
/// Largest shard accepted (offsets are stored as u32 multiples of 4).
pub const MAX_SHARD_SIZE: usize = 1 << 34;
/// Most shards a file may have (the hash's low 16 bits pick the shard).
pub const MAX_SHARDS: usize = 1 << 16;
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 64 * 1024;
/// Largest entry any cache accepts: value lengths are stored in 31 bits
/// (larger values are spilled to files, see `spill.rs`).
pub const MAX_ENTRY_SIZE: usize = (1 << 31) - ENTRY_ALIGN;
/// Latest expiry an entry can carry (48 bits of Unix ms: the year 10889);
/// later ones are stored as this.
pub const MAX_EXPIRES_MS: u64 = (1 << 48) - 1;
/// A lazy file's arena grows by reservations of this many bytes (or the
/// entry being written, if larger): the most a shard holds beyond its
/// entries, and the spacing of `fallocate` calls while a shard fills.
pub const GROW_CHUNK: usize = 16 * 1024;
/// Dead bytes a lazy shard may carry before it compacts instead of
/// growing (a compaction moves the live entries: doing one every few
/// overwrites of a small shard would slow sets down).
pub const DEAD_SLACK: usize = 64 * 1024;
/// Index slots a lazy shard starts with (one page of slots); the index
/// doubles, up to `slots_per_shard`, when it reaches its load limit.
pub const MIN_ACTIVE_SLOTS: usize = 512;
/// Target size of an arena segment (`shard/segments.rs`): the unit a
/// segment is freed in, whatever the shard's size. A shard's segments are 1/32 of its arena clamped between
/// `MIN_SEGMENT_SIZE` and this, then the arena divided evenly among as many
/// as fit (a step then frees a small part of a small shard: a segmented
/// shard holds up to about one segment less than its arena); an arena
/// shorter than `MIN_SEGMENTS` minimum segments is one segment (compacted
/// whole, as before segments: bounded because small).
pub const SEGMENT_SIZE: usize = 256 * 1024;
/// Segments the conveyor judges at most to free one (`shard/conveyor.rs`:
/// past `MERGE_SEGMENTS - 1` segments judged without one coming free it
/// evicts regardless of marks). Four: a segment comes free without forcing
/// while fewer than three in four entries were visited since the hand
/// last passed.
pub const MERGE_SEGMENTS: usize = 4;
/// Arena bytes one conveyor pass judges at most (`shard/conveyor.rs`):
/// what a reader of the shard waits for at most, and what one write pays
/// when the cache is full. 8 KiB: about 40 entries of 200 bytes, about
/// 10 us (16 KiB passes made a set's p99.9 about 31 us, 8 KiB about 15).
pub const STEP_BUDGET: usize = 8 * 1024;
/// Conveyor passes paid per `STEP_BUDGET` of appends while the last
/// `1 / KEEP_AHEAD_WINDOW` of the head fills and no segment is free (one
/// pass each `STEP_BUDGET / KEEP_AHEAD` bytes appended): up to 32 bytes
/// judged per byte appended over an eighth of a segment, the
/// `MERGE_SEGMENTS` segments it takes at most to free one, so a free
/// segment is ready when the head fills.
pub const KEEP_AHEAD: usize = 32;
/// The part of the head (one over this) whose filling pays conveyor passes.
pub const KEEP_AHEAD_WINDOW: usize = 8;
/// Smallest segment: an entry with the longest key (64 KiB) and a spilled
/// value's reference must fit in one. Smaller segments waste less of a
/// shard (a segmented shard holds about a segment less than its arena): a
/// 2 MiB shard has 24 segments of about 74 KiB where it had 18 of 97 KiB.
pub const MIN_SEGMENT_SIZE: usize = 72 * 1024;
/// Words per segment in the segment table: links and used bytes, then
/// live bytes (`shard/segments.rs`).
pub const SEGMENT_WORDS: usize = 2;
/// Fewest segments of a segmented arena: a smaller one is a single
/// segment (shards under about 870 KiB), compacted whole. Twelve: a 1 MiB
/// shard (thirteen segments) is segmented. A segmented shard holds up to
/// one segment less than its arena (the head fills while the others are
/// full), so few segments would waste much of a small shard.
pub const MIN_SEGMENTS: usize = 12;
/// Segment link meaning "none" (the newest segment's next, an empty free list).
pub const NO_SEGMENT: u32 = u32::MAX;
/// Default target size of one shard when the caller leaves the count open:
/// small enough that a compaction pause stays short.
pub const TARGET_SHARD_SIZE: usize = 2 * 1024 * 1024;

/// Offsets of the file header fields.
pub mod fh {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const HASH_ID: usize = 12;
    pub const SEED: usize = 16;
    pub const SHARD_COUNT: usize = 24;
    pub const HEADER_SIZE: usize = 28;
    pub const SHARD_SIZE: usize = 32;
    pub const SLOTS: usize = 40;
    pub const TOTAL_SIZE: usize = 48;
    pub const CREATED_MS: usize = 56;
    /// xxh3 of bytes [0, CHECKSUM), the immutable fields above, and of the
    /// LAZY word below, also written once, at creation (`header_checksum`).
    pub const CHECKSUM: usize = 64;
    /// 1 once the creator finished initialising every shard.
    pub const READY: usize = 72;
    /// A u32: the pid of the process holding the exclusive attach lock
    /// while it repairs or sweeps alone (0: none recorded), so that an
    /// opener waiting for it can tell a stopped holder from a busy one
    /// (`file.rs`). Outside the checksum; ignored by older engines.
    pub const EXCLUSIVE_PID: usize = 76;
    /// A byte: 0 while attached; 1 after the last process detached; 2 after
    /// the last process detached and found that every process attached
    /// since the last repair of the shards detached cleanly (`file.rs`).
    pub const CLEAN_SHUTDOWN: usize = 80;
    /// A u32 in the same word: processes attached (bit 31: a damaged shard
    /// was found), counted for the clean-detach check (`file.rs`).
    pub const ATTACHED: usize = 84;
    /// 1 if the file is sparse and its shards reserve space as they grow
    /// (see `shard/arena.rs`); 0 in files allocated in full at creation (every
    /// file written before lazy reservation, and `preallocate`).
    pub const LAZY: usize = 88;
    /// Bytes held in spilled-value files (`spill.rs`), a u64 changed
    /// atomically by every process; recounted by a process attaching alone.
    pub const SPILL_BYTES: usize = 96;
    /// Spilled values (files) live entries name, counted like SPILL_BYTES.
    pub const SPILL_VALUES: usize = 104;
    /// Spilled values refused (symlink, owner, mode, length or checksum
    /// wrong, file missing) and dropped.
    pub const SPILL_REFUSED: usize = 112;
    /// Unix ms of the last sweep of the spill directory (`spill.rs`).
    pub const SPILL_SWEPT_MS: usize = 120;
    /// The migration record of a live resize (`resize.rs`), one u64 so
    /// that a compare-and-swap publishes it whole: `id << 2 | state`,
    /// state 0 none, 1 migrating (entries are moving, shard by shard, to
    /// the file `<name>.resize-<id in hex>` beside this one), 2 moved
    /// (that file was renamed over this one's path: reopen the path). The
    /// id is 62 random bits, so a record left by an earlier resize can
    /// never be taken for the current one; the new file's name is derived
    /// from it (hex digits only), never read from the file. State 3 is
    /// never written: a file showing it is corrupt.
    pub const MIGRATION: usize = 128;
    /// In a file built by a resize: the migration id it was built for
    /// (0 in a file made by an ordinary open), so that a process that
    /// finds the temporary name gone can tell whether the path already
    /// names the file its migration built.
    pub const MIG_ORIGIN: usize = 136;
    /// In a file built by a resize: 1 while entries are still being moved
    /// into it (its spill sweeps are skipped: the old file's unmoved
    /// shards name spilled files it does not know yet), 0 once complete.
    pub const MIG_FILLING: usize = 144;
    /// The moved bitmap of a migration: bit g (word g / 64) set once the
    /// shards `i` with `i % groups` = g have been copied to the new file
    /// and sealed (`groups`, a power of two up to 1,024, is carried in the
    /// low 5 bits of the migration's id: see `resize::groups_for`). One
    /// shard per bit on a grow, up to the default shard count's cap.
    pub const MOVED: usize = 256;
    /// Bits of the moved bitmap.
    pub const MOVE_GROUPS: usize = 1024;
    /// End of the fields above.
    pub const FIELDS_END: usize = MOVED + MOVE_GROUPS / 8;
    /// Fields [0, FIXED_END) are written once at creation.
    pub const FIXED_END: usize = 64;
    /// Per-CPU hit and miss counters, from here to the end of the header
    /// (see `counters.rs`).
    pub const STRIPES: usize = FIELDS_END;
}

/// Offsets of the shard header fields (u64 each unless noted).
///
/// The header is four cache lines, grouped by who writes them, so that a
/// get without the lock reads only a line that ordinary writes leave alone:
///
/// ```text
/// line 0   written by every write, by the lock holder: the lock word, the
///          write marker, the bump pointer and the per-write counters
/// line 1   read by every optimistic get; written only when entries move
///          (compaction, reset, repair) or the shard grows: seq, magic,
///          reserved arena, active slots
/// line 2   written by compactions and deletes
/// line 3   written rarely (repairs, lock timeouts)
/// ```
pub mod sh {
    /// The lock word (a u32; the rest of its 8 bytes is unused).
    pub const MUTEX: usize = 0;
    /// Nonzero while the lock holder is changing the shard (any write): a
    /// dead owner that left it set left the shard half-written, and the
    /// next locker repairs it.
    pub const WRITING: usize = 8;
    /// End of the used part of the arena (bump pointer).
    pub const BUMP: usize = 16;
    /// Bytes of live entries in the arena.
    pub const LIVE_BYTES: usize = 24;
    /// Live entries.
    pub const ITEMS: usize = 32;
    /// Slots that are not empty (live + tombstones).
    pub const SLOTS_USED: usize = 40;
    /// Tombstone slots.
    pub const TOMBSTONES: usize = 48;
    pub const SETS: usize = 56;
    /// Odd while a write moves or rewrites bytes that a published slot may
    /// lead to (compactions, resets, repairs, in-place counter updates, a
    /// growing index): optimistic readers validate against it. Appends,
    /// overwrites and deletes leave it alone (see `shard/guard.rs`).
    pub const SEQ: usize = 64;
    /// SHARD_MAGIC, written when the shard is initialised. Checked before
    /// every lock and every optimistic get: a shard header zeroed or
    /// overwritten behind our back (file truncated and extended again,
    /// say) no longer holds a lock word that the engine wrote.
    pub const MAGIC: usize = 72;
    /// Lazy files only: bytes of the arena reserved in the file (from the
    /// arena's start), the high-water mark of growth. Only raised, under
    /// the lock, after the space was reserved. 0 in preallocated files.
    pub const ARENA_RESERVED: usize = 80;
    /// Lazy files only: slots of the index in use (`initial_active_slots`,
    /// doubled up to `slots_per_shard`); the index words up to
    /// there are reserved, the rest of the index is a hole never touched.
    /// 0 in preallocated files.
    pub const ACTIVE_SLOTS: usize = 88;
    /// The most arena bytes one write's compactions examined (a statistic,
    /// written only inside a move: the line is then being written anyway).
    pub const MAX_STEP_BYTES: usize = 96;
    /// Bytes of free segments' pages given back (`give_back`): they lie
    /// below `ARENA_RESERVED` but are not held.
    pub const PUNCHED: usize = 104;
    /// The conveyor's read cursor (`shard/conveyor.rs`): arena offset of
    /// the next entry it judges (`HAND` is its write cursor). Written only
    /// inside moves.
    pub const READ: usize = 112;
    /// Bytes the conveyor judged since a segment last came free: past
    /// `MERGE_SEGMENTS - 1` segments of them it evicts regardless of marks.
    /// Written only inside moves.
    pub const SINCE_FREE: usize = 120;

    /// SIEVE hand: arena offset where the next eviction scan starts (in a
    /// segmented shard, the conveyor's write cursor).
    pub const HAND: usize = 128;
    /// Nonzero while a write that moves or clears entries (compaction,
    /// reset) runs: a holder that dies then leaves nothing to salvage.
    pub const REWRITING: usize = 136;
    pub const DELETES: usize = 144;
    pub const EVICTIONS: usize = 152;
    pub const EXPIRATIONS: usize = 160;
    pub const RESETS: usize = 168;
    pub const COMPACTIONS: usize = 176;
    /// Set by the first process that saw this shard's data fail a check.
    pub const CORRUPTIONS: usize = 184;
    /// Lock waits that ran out of time (updated atomically, without the lock).
    pub const LOCK_TIMEOUTS: usize = 192;
    /// Repairs after a holder died mid-write that kept the complete entries.
    pub const SALVAGES: usize = 200;
    /// Entries dropped by repairs and resets after a crash or corruption.
    pub const ENTRIES_LOST: usize = 208;
    /// The newest segment, where entries are appended (`BUMP` lies in it).
    /// Segment words (see `shard/segments.rs`) change when a segment fills
    /// and when a compaction step merges segments: about once per segment
    /// of appends.
    pub const HEAD: usize = 216;
    /// The oldest segment in use; the chain runs from it to `HEAD`.
    pub const TAIL: usize = 224;
    /// First segment of the free list (`NO_SEGMENT`: empty).
    pub const FREE: usize = 232;
    /// Segments [0, FRESH) have been used; the others were never written.
    pub const FRESH: usize = 240;
    /// Bytes used in the segments before the head (the head's are
    /// `BUMP` minus its start).
    pub const SEALED_BYTES: usize = 248;
}

/// Value of `sh::MAGIC` in every initialised shard ("NCSHARD1").
pub const SHARD_MAGIC: u64 = u64::from_ne_bytes(*b"NCSHARD1");

/// Offsets inside an entry header.
pub mod eh {
    /// u32: the low 32 bits of the expiry in Unix ms (0 = never, with
    /// `META_HI`'s low half). `META_LO` and `META_HI` together hold the
    /// meta word of `entry_meta`; changed in place only by `touch`, inside
    /// a move.
    pub const META_LO: usize = 0;
    /// u32: the expiry's high 16 bits | (key length - 1) << 16.
    pub const META_HI: usize = 4;
    /// u32: value length (31 bits) | LEN_DEAD.
    pub const LEN: usize = 8;
    /// u32: the caller's flags.
    pub const FLAGS: usize = 12;
}

/// Bit of the entry's length word: overwritten, deleted or expired; space
/// reclaimed at the next compaction. Set in place (one aligned word).
pub const LEN_DEAD: u32 = 1 << 31;

/// The meta word of an entry.
#[inline]
pub fn entry_meta(expires_ms: u64, key_len: usize) -> u64 {
    debug_assert!((1..=MAX_KEY_LEN).contains(&key_len));
    expires_ms.min(MAX_EXPIRES_MS) | ((key_len as u64 - 1) << 48)
}

/// Slot value of a deleted entry's slot.
pub const TOMBSTONE: u64 = u64::MAX;
/// Slot bit: the entry was read since the SIEVE hand last passed it. Kept
/// in the slot, not the entry, so that a reader without the lock can set
/// it with one compare-and-swap on a word whose meaning it knows (see
/// `Shard::mark_visited`). Tags are 31 bits: this bit is never part of one.
pub const SLOT_VISITED: u64 = 1 << 63;

const _: () = assert!(MUTEX_BYTES <= sh::WRITING);
const _: () = assert!(ENTRY_HEADER + MAX_KEY_LEN + 4096 <= MIN_SEGMENT_SIZE);
const _: () = assert!(sh::SETS + 8 <= sh::SEQ && sh::SEQ % 64 == 0);
const _: () = assert!(sh::ACTIVE_SLOTS + 8 <= sh::HAND && sh::HAND % 64 == 0);
const _: () = assert!(sh::PUNCHED + 8 <= 128);
const _: () = assert!(sh::SEALED_BYTES + 8 <= SHARD_HEADER_SIZE);

/// Bytes an entry with these lengths occupies in the arena.
#[inline]
pub fn entry_size(key_len: usize, value_len: usize) -> usize {
    (ENTRY_HEADER + key_len + value_len).next_multiple_of(ENTRY_ALIGN)
}

/// The fixed shape of a cache file, derived from the requested size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub shard_count: usize,
    pub shard_size: usize,
    pub slots_per_shard: usize,
    pub seed: u64,
}

impl Geometry {
    /// Choose a geometry for a file of about `size` bytes with `shards`
    /// shards (0: choose so that shards are about `TARGET_SHARD_SIZE`).
    pub fn for_size(size: usize, shards: usize) -> Result<Geometry> {
        if size < HEADER_SIZE + MIN_SHARD_SIZE {
            return Err(Error::InvalidArgument(format!(
                "size {size} is below the minimum of {} bytes",
                HEADER_SIZE + MIN_SHARD_SIZE
            )));
        }
        let body = size - HEADER_SIZE;
        let shard_count = if shards == 0 {
            (body / TARGET_SHARD_SIZE).clamp(1, 1024).next_power_of_two().min(
                // keep every shard at least MIN_SHARD_SIZE
                prev_power_of_two(body / MIN_SHARD_SIZE),
            )
        } else {
            if !shards.is_power_of_two() || shards > MAX_SHARDS {
                return Err(Error::InvalidArgument(format!(
                    "shard count must be a power of two between 1 and {MAX_SHARDS}, got {shards}"
                )));
            }
            shards
        };
        let shard_size = (body / shard_count) / PAGE * PAGE;
        if shard_size < MIN_SHARD_SIZE {
            return Err(Error::InvalidArgument(format!(
                "size {size} split into {shard_count} shards gives shards of {shard_size} bytes, \
                 below the minimum of {MIN_SHARD_SIZE}"
            )));
        }
        if shard_size > MAX_SHARD_SIZE && shards == 0 {
            return Err(Error::InvalidArgument(format!(
                "size {size} is above the largest cache the automatic shard count makes \
                 ({} bytes: {shard_count} shards of at most {MAX_SHARD_SIZE} bytes); \
                 a larger one needs shards set to a power of two up to {MAX_SHARDS}",
                shard_count * MAX_SHARD_SIZE
            )));
        }
        if shard_size > MAX_SHARD_SIZE {
            return Err(Error::InvalidArgument(format!(
                "shards of {shard_size} bytes exceed the maximum of {MAX_SHARD_SIZE}; use more shards"
            )));
        }
        let slots_per_shard = slots_for_shard(shard_size);
        let g = Geometry { shard_count, shard_size, slots_per_shard, seed: DEFAULT_SEED };
        g.validate()?;
        Ok(g)
    }

    /// Total file size.
    pub fn total_size(&self) -> usize {
        HEADER_SIZE + self.shard_count * self.shard_size
    }

    /// Offset of the segment table inside a shard: right after the
    /// header, so that the header, the table and a lazy shard's initial
    /// index are one reserved prefix.
    pub fn segment_table_offset(&self) -> usize {
        SHARD_HEADER_SIZE
    }

    /// Bytes the segment table takes: two words per segment of the smallest
    /// size the shard could hold, padded to a cache line (a 2 MiB shard: 384
    /// bytes; the largest, 16 GiB: 2.7 MiB, 1/6144 of it).
    fn segment_table_size(&self) -> usize {
        ((self.shard_size / MIN_SEGMENT_SIZE).max(1) * SEGMENT_WORDS * 8).next_multiple_of(64)
    }

    /// Offset of the policy header inside a shard (`shard/policy.rs`):
    /// 64 bytes after the segment table, in the prefix a lazy shard
    /// reserves first.
    pub fn policy_offset(&self) -> usize {
        self.segment_table_offset() + self.segment_table_size()
    }

    /// The policy region's parts: counters per row of the frequency
    /// sketch (a power of two: an eighth of the index slots, at least
    /// `MIN_SKETCH` or what a 32nd of the shard holds, at most 65,536)
    /// and records per miniature cache (a power of two: a 32nd of the
    /// index's load limit, 64 to 256).
    pub fn policy_parts(&self) -> (usize, usize) {
        let floor = MIN_SKETCH.min(prev_power_of_two(self.shard_size / 64));
        let sketch = (self.slots_per_shard / 8).next_power_of_two().clamp(floor, 1 << 16);
        let minis = (self.slots_per_shard * 3 / 4 / 32).next_power_of_two().clamp(64, 256);
        (sketch, minis)
    }

    /// Probes of the refusals' record (`shard/policy.rs`): a quarter of a
    /// miniature's records, 32 or 64 (a shard of 512 KiB and more: 64);
    /// none in a shard whose miniatures have the fewest records (64:
    /// under about 170 KiB), which has no record at all. Its bytes would
    /// be a few of its entries, and the rows its rule helps (a working set
    /// that moves) are larger ones.
    pub fn refusal_probes(&self) -> usize {
        match self.policy_parts().1 {
            ..=64 => 0,
            minis => (minis / 4).min(64),
        }
    }

    /// Bytes of the refusals' record: its header and its probes (none
    /// without probes).
    pub fn refusals_size(&self) -> usize {
        match self.refusal_probes() {
            0 => 0,
            probes => REFUSALS_HEADER + 8 * probes,
        }
    }

    /// Bytes of the policy body: the sketch (four rows of 4-bit counters)
    /// and three miniatures (a 64-byte header, `minis + minis / 2` records
    /// of 4 bytes, and an index of twice as many 2-byte slots, a power of
    /// two), padded to a cache line, then the refusals' record
    /// (`refusals_size`, the last of the body). A 2 MiB shard: 19.3 KiB,
    /// 0.9% of it.
    pub fn policy_size(&self) -> usize {
        let (sketch, minis) = self.policy_parts();
        let records = minis + minis / 2;
        let index = (2 * records).next_power_of_two();
        (4 * sketch / 2 + 3 * (64 + 4 * records + 2 * index)).next_multiple_of(64)
            + self.refusals_size()
    }

    /// Offset of the slot index inside a shard.
    pub fn index_offset(&self) -> usize {
        self.policy_offset() + 64
    }

    /// Offset of the policy body inside a shard: after the index, before
    /// the arena, so that a lazy shard reserves it with its first arena
    /// bytes (an empty shard holds none of it).
    pub fn policy_body_offset(&self) -> usize {
        (self.index_offset() + self.slots_per_shard * 8 + 63) & !63
    }

    /// Offset of the arena inside a shard.
    pub fn arena_offset(&self) -> usize {
        self.policy_body_offset() + self.policy_size()
    }

    /// Segments of a shard's arena and their size: 1/32 of the arena
    /// clamped to [`MIN_SEGMENT_SIZE`, `SEGMENT_SIZE`], then the arena
    /// divided evenly among as many as fit (64-byte aligned, so a segment
    /// may be a little above `SEGMENT_SIZE`); one segment (the whole arena)
    /// when that leaves fewer than `MIN_SEGMENTS`.
    pub fn segments(&self) -> (usize, usize) {
        let arena = self.arena_size();
        let size = (arena / 32).clamp(MIN_SEGMENT_SIZE, SEGMENT_SIZE);
        let count = arena / size;
        if count < MIN_SEGMENTS {
            return (1, arena & !(ENTRY_ALIGN - 1));
        }
        (count, (arena / count) & !63)
    }

    /// Bytes of arena per shard.
    pub fn arena_size(&self) -> usize {
        self.shard_size - self.arena_offset()
    }

    /// Index slots a lazy shard starts with.
    pub fn initial_active_slots(&self) -> usize {
        MIN_ACTIVE_SLOTS.min(self.slots_per_shard)
    }

    /// The largest entry (header + key + value, padded) a set accepts.
    /// One segment (an empty segment always holds it; larger values are
    /// spilled to files, see `Cache::spills`), or half the arena of a shard
    /// of one segment (compaction can always make room for it).
    /// Never above `MAX_ENTRY_SIZE`: an entry stores its value length in
    /// 31 bits, and a longer value would be cut (its tail then parsed as
    /// entries of its own).
    pub fn max_entry_size(&self) -> usize {
        let (count, size) = self.segments();
        let most = if count == 1 { self.arena_size() / 2 } else { size };
        most.min(MAX_ENTRY_SIZE) & !(ENTRY_ALIGN - 1)
    }

    /// Check that the geometry is self-consistent and within limits.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::Corrupt(m));
        if self.shard_count == 0
            || !self.shard_count.is_power_of_two()
            || self.shard_count > MAX_SHARDS
        {
            return bad(format!("bad shard count {}", self.shard_count));
        }
        if self.shard_size < MIN_SHARD_SIZE
            || self.shard_size > MAX_SHARD_SIZE
            || self.shard_size % PAGE != 0
        {
            return bad(format!("bad shard size {}", self.shard_size));
        }
        // Checked before arena_offset() multiplies it.
        if self.slots_per_shard % 8 != 0
            || self.slots_per_shard < 64
            || self.slots_per_shard > self.shard_size / 8
        {
            return bad(format!("bad slot count {}", self.slots_per_shard));
        }
        let arena_off = self.arena_offset();
        if arena_off >= self.shard_size || self.shard_size - arena_off < MIN_SHARD_SIZE / 2 {
            return bad(format!(
                "slot index of {} slots leaves no arena in shards of {} bytes",
                self.slots_per_shard, self.shard_size
            ));
        }
        // Entry offsets are stored as u32 multiples of ENTRY_ALIGN (+1).
        if self.arena_size() / ENTRY_ALIGN >= (u32::MAX - 1) as usize {
            return bad("arena too large for 32-bit slot offsets".into());
        }
        self.shard_count
            .checked_mul(self.shard_size)
            .and_then(|b| b.checked_add(HEADER_SIZE))
            .map(|_| ())
            .ok_or_else(|| Error::Corrupt("file size overflows".into()))
    }

    /// Serialise the immutable header fields into `buf` (HEADER_SIZE bytes):
    /// the geometry, and whether the file's shards reserve space lazily.
    pub fn write_header(&self, buf: &mut [u8], created_ms: u64, lazy: bool) {
        buf[..HEADER_SIZE].fill(0);
        buf[fh::MAGIC..fh::MAGIC + 8].copy_from_slice(&MAGIC);
        put_u32(buf, fh::VERSION, LAYOUT_VERSION);
        put_u32(buf, fh::HASH_ID, HASH_XXH3_64);
        put_u64(buf, fh::SEED, self.seed);
        put_u32(buf, fh::SHARD_COUNT, self.shard_count as u32);
        put_u32(buf, fh::HEADER_SIZE, HEADER_SIZE as u32);
        put_u64(buf, fh::SHARD_SIZE, self.shard_size as u64);
        put_u64(buf, fh::SLOTS, self.slots_per_shard as u64);
        put_u64(buf, fh::TOTAL_SIZE, self.total_size() as u64);
        put_u64(buf, fh::CREATED_MS, created_ms);
        buf[fh::LAZY] = lazy as u8;
        put_u64(buf, fh::CHECKSUM, header_checksum(buf));
    }

    /// Parse and validate a file header read from a file of `file_len` bytes.
    pub fn read_header(buf: &[u8], file_len: u64) -> Result<Geometry> {
        if buf.len() < HEADER_SIZE || file_len < HEADER_SIZE as u64 {
            return Err(Error::Corrupt(format!(
                "file of {file_len} bytes is too short for a nearcache header"
            )));
        }
        if buf[fh::MAGIC..fh::MAGIC + 8] != MAGIC {
            return Err(Error::Corrupt("not a nearcache file (bad magic)".into()));
        }
        let version = get_u32(buf, fh::VERSION);
        if version != LAYOUT_VERSION {
            return Err(Error::Incompatible(format!(
                "layout version {version}, this build reads version {LAYOUT_VERSION}"
            )));
        }
        if buf[fh::LAZY] > 1 {
            return Err(Error::Corrupt(format!("lazy flag {} is neither 0 nor 1", buf[fh::LAZY])));
        }
        if header_checksum(buf) != get_u64(buf, fh::CHECKSUM) {
            return Err(Error::Corrupt("header checksum mismatch".into()));
        }
        let hash_id = get_u32(buf, fh::HASH_ID);
        if hash_id != HASH_XXH3_64 {
            return Err(Error::Incompatible(format!("unknown hash algorithm {hash_id}")));
        }
        if get_u32(buf, fh::HEADER_SIZE) as usize != HEADER_SIZE {
            return Err(Error::Incompatible("unexpected header size".into()));
        }
        let g = Geometry {
            shard_count: get_u32(buf, fh::SHARD_COUNT) as usize,
            shard_size: usize::try_from(get_u64(buf, fh::SHARD_SIZE))
                .map_err(|_| Error::Corrupt("shard size overflows".into()))?,
            slots_per_shard: usize::try_from(get_u64(buf, fh::SLOTS))
                .map_err(|_| Error::Corrupt("slot count overflows".into()))?,
            seed: get_u64(buf, fh::SEED),
        };
        g.validate()?;
        if get_u64(buf, fh::TOTAL_SIZE) != g.total_size() as u64 {
            return Err(Error::Corrupt("total size field disagrees with the geometry".into()));
        }
        if file_len != g.total_size() as u64 {
            return Err(Error::Corrupt(format!(
                "file is {file_len} bytes but its header describes {} bytes \
                 (truncated or extended by another program?)",
                g.total_size()
            )));
        }
        Ok(g)
    }
}

/// Whether a header (validated by `read_header`) describes a lazily
/// reserved file.
pub fn header_is_lazy(buf: &[u8]) -> bool {
    buf[fh::LAZY] == 1
}

/// The header checksum: xxh3 of the fixed fields and of the LAZY word,
/// which is also written once, at creation, but lies outside the fixed
/// fields (a flipped flag would make every shard header look damaged).
/// Layout version 3: version 2 summed the fixed fields only.
pub fn header_checksum(buf: &[u8]) -> u64 {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(&buf[..fh::FIXED_END]);
    h.update(&buf[fh::LAZY..fh::LAZY + 8]);
    h.digest()
}

/// Index slots of a shard of `shard_size` bytes: one per 64 bytes of shard,
/// a multiple of 8 (a cache line of slots), at least 64. At the index's
/// load limit (3/4) that is an entry per 85 bytes: small entries (a 20-byte
/// header, short key and value) fill the arena about when they fill the
/// index. Not rounded to a power of two, so that the entries a shard holds
/// grow smoothly with its size (a power of two doubled the index, and the
/// entries held, at some sizes and not at others).
pub fn slots_for_shard(shard_size: usize) -> usize {
    (shard_size / 64).next_multiple_of(8).max(64)
}

fn prev_power_of_two(n: usize) -> usize {
    if n == 0 {
        1
    } else {
        1 << (usize::BITS - 1 - n.leading_zeros())
    }
}

pub(crate) fn put_u32(buf: &mut [u8], off: usize, v: u32) {
    buf[off..off + 4].copy_from_slice(&v.to_ne_bytes());
}
pub(crate) fn put_u64(buf: &mut [u8], off: usize, v: u64) {
    buf[off..off + 8].copy_from_slice(&v.to_ne_bytes());
}
pub(crate) fn get_u32(buf: &[u8], off: usize) -> u32 {
    u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes"))
}
pub(crate) fn get_u64(buf: &[u8], off: usize) -> u64 {
    u64::from_ne_bytes(buf[off..off + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn geometry_defaults() {
        let g = Geometry::for_size(64 << 20, 0).unwrap();
        assert_eq!(g.shard_count, 32);
        assert!(g.total_size() <= 64 << 20);
        // 2 MiB shards: 24 segments of about 74 KiB; an entry fits in one.
        let (count, size) = g.segments();
        assert_eq!(count, 24);
        assert!(size >= MIN_SEGMENT_SIZE && size % 64 == 0 && count * size <= g.arena_size());
        assert_eq!(g.max_entry_size(), size);
        let tiny = Geometry::for_size(HEADER_SIZE + MIN_SHARD_SIZE, 0).unwrap();
        assert_eq!(tiny.shard_count, 1);
    }

    #[test]
    fn the_sketch_has_a_floor_a_small_shard_can_afford() {
        // (shard size, counters per row): a 32nd of the shard up to 128
        // KiB, `MIN_SKETCH` from there until an eighth of the index slots
        // is more (1 MiB), that eighth above.
        for (shard, width) in
            [(16 << 10, 256), (28 << 10, 256), (32 << 10, 512), (128 << 10, 2048), (2 << 20, 4096)]
        {
            let g = Geometry::for_size(HEADER_SIZE + shard, 1).unwrap();
            assert_eq!(g.shard_size, shard);
            assert_eq!(g.policy_parts().0, width, "{shard}-byte shard");
            // Four rows of 4-bit counters: at most a 32nd of the shard
            // where the floor decides.
            if g.slots_per_shard / 8 < width {
                assert!(4 * width / 2 <= shard / 32, "{shard}-byte shard");
            }
            assert!(g.arena_size() >= MIN_SHARD_SIZE / 2);
        }
    }

    /// A shard whose miniatures have the fewest records has no refusals'
    /// record: its policy body is what it was before the record came;
    /// larger shards have 32 or 64 probes after a 64-byte header, the
    /// body's last bytes.
    #[test]
    fn a_small_shard_has_no_refusals_record() {
        for (shard, probes) in [
            (16 << 10, 0),
            (128 << 10, 0),
            (168 << 10, 0),
            (176 << 10, 32),
            (256 << 10, 32),
            (512 << 10, 64),
            (1 << 20, 64),
            (2 << 20, 64),
        ] {
            let g = Geometry::for_size(HEADER_SIZE + shard, 1).unwrap();
            assert_eq!(g.refusal_probes(), probes, "{shard}-byte shard");
            let (sketch, minis) = g.policy_parts();
            let records = minis + minis / 2;
            let index = (2 * records).next_power_of_two();
            let before = (4 * sketch / 2 + 3 * (64 + 4 * records + 2 * index)).next_multiple_of(64);
            let record = if probes == 0 { 0 } else { REFUSALS_HEADER + 8 * probes };
            assert_eq!(g.policy_size(), before + record, "{shard}-byte shard");
        }
    }

    #[test]
    fn entries_are_a_16_byte_header_and_their_bytes_padded_to_4() {
        // 36-byte keys (the benchmarks' UUIDs): 16-, 160- and 1,600-byte
        // values take 68, 212 and 1,652 bytes (72, 216, 1,656 in version 6).
        assert_eq!(entry_size(36, 16), 68);
        assert_eq!(entry_size(36, 160), 212);
        assert_eq!(entry_size(36, 1600), 1652);
        for (k, v) in [(1, 0), (1, 1), (2, 1), (3, 0), (7, 9), (64, 3)] {
            let size = entry_size(k, v);
            assert_eq!(size % ENTRY_ALIGN, 0);
            assert!(size >= ENTRY_HEADER + k + v && size < ENTRY_HEADER + k + v + ENTRY_ALIGN);
        }
        // Every header word is a u32 at a multiple of 4.
        for f in [eh::META_LO, eh::META_HI, eh::LEN, eh::FLAGS] {
            assert!(f % 4 == 0 && f + 4 <= ENTRY_HEADER);
        }
    }

    #[test]
    fn entry_meta_keeps_key_lengths_and_clamps_far_expiries() {
        for (expires, key_len) in [(0, 1), (1, MAX_KEY_LEN), (MAX_EXPIRES_MS, 36), (12_345, 65_535)]
        {
            let m = entry_meta(expires, key_len);
            assert_eq!((m & MAX_EXPIRES_MS, (m >> 48) as usize + 1), (expires, key_len));
        }
        // 9999-12-31 fits; beyond the year 10889 is stored as the latest.
        assert_eq!(entry_meta(253_402_300_799_000, 1) & MAX_EXPIRES_MS, 253_402_300_799_000);
        assert_eq!(entry_meta(u64::MAX, 7), MAX_EXPIRES_MS | (6 << 48));
    }

    #[test]
    fn entry_limit_never_exceeds_the_31_bit_length_field() {
        // A 16 GiB shard: half its arena is far above u32::MAX. Before the
        // cap, a 4 GiB + 64 byte value passed the size check and was stored
        // with its length cut to 64 bytes.
        let g = Geometry {
            shard_count: 1,
            shard_size: MAX_SHARD_SIZE,
            slots_per_shard: 1 << 20,
            seed: 0,
        };
        g.validate().unwrap();
        assert!(g.arena_size() / 2 > u32::MAX as usize);
        assert!(g.max_entry_size() < 1 << 31);
        assert!(entry_size(1, 1 << 31) > g.max_entry_size());
    }

    #[test]
    fn geometry_rejects_bad_requests() {
        assert!(Geometry::for_size(100, 0).is_err());
        assert!(Geometry::for_size(1 << 20, 3).is_err());
        assert!(Geometry::for_size(1 << 20, 1 << 20).is_err());
        assert!(Geometry::for_size(1 << 20, 1024).is_err());
    }

    #[test]
    fn hostile_geometry_is_rejected_without_overflow() {
        let g = Geometry { shard_count: 1, shard_size: 1 << 20, slots_per_shard: 1 << 62, seed: 0 };
        assert!(g.validate().is_err());
        let g = Geometry { shard_count: 1, shard_size: 1 << 20, slots_per_shard: 1 << 20, seed: 0 };
        assert!(g.validate().is_err(), "an index larger than the shard");
    }

    #[test]
    fn header_round_trip_and_corruption() {
        let g = Geometry::for_size(8 << 20, 4).unwrap();
        let mut buf = vec![0u8; HEADER_SIZE];
        for lazy in [false, true] {
            g.write_header(&mut buf, 123, lazy);
            assert_eq!(Geometry::read_header(&buf, g.total_size() as u64).unwrap(), g);
            assert_eq!(header_is_lazy(&buf), lazy);
            assert!(Geometry::read_header(&buf, g.total_size() as u64 - 1).is_err());
            for i in (0..fh::CHECKSUM + 8).chain([fh::LAZY]) {
                for flip in [0x01, 0x40] {
                    let mut b = buf.clone();
                    b[i] ^= flip;
                    let r = Geometry::read_header(&b, g.total_size() as u64);
                    assert!(r.is_err(), "byte {i} ^ {flip:#x}");
                }
            }
        }
    }
}
