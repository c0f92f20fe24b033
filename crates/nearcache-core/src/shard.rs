//! One shard: a robust mutex, an open-addressing slot index and an
//! append-only arena, all inside the shared mapping.
//!
//! Design:
//! * Every write runs under the shard's lock ([`ShardGuard`]) and sets the
//!   `WRITING` word for its duration. A locker that inherits the lock from
//!   a dead owner and finds `WRITING` set (or `seq` odd) repairs the shard
//!   (below): a cache may lose entries, it never returns torn data.
//! * Writes that move or rewrite bytes a published slot may lead to
//!   (compactions, resets, repairs, in-place counter updates, a `touch`
//!   of the two-word expiry, a growing index) are also bracketed by
//!   `seq += 1` before and after, so `seq` is odd exactly while entries
//!   move. Appends, overwrites and deletes do not touch `seq`: an entry's
//!   bytes never change while a slot leads to it (an overwrite appends a
//!   new entry and repoints the slot in one atomic store; a delete turns
//!   the slot into a tombstone), except the dead mark of an entry being
//!   unlinked, one aligned word a reader sees old or new.
//! * Gets are optimistic ([`Shard::get_optimistic`]). A reader loads `seq`
//!   (even), probes the index and copies the value out without the lock,
//!   then checks that `seq` and the slot it followed are unchanged (up to
//!   the visited bit); if not, the copy is thrown away and retried, and
//!   after `OPTIMISTIC_TRIES` (or at once if `seq` is odd: entries are
//!   moving, or a mover died) the reader takes the lock, which waits
//!   properly and repairs. A slot cannot come back to an offset without a
//!   move (the arena only grows between moves), so an unchanged slot and
//!   an unchanged `seq` mean the bytes read were the entry's all along.
//!   The header is laid out so that a reader loads only words in a cache
//!   line that appends, overwrites and deletes leave alone (`layout::sh`):
//!   a write to one key does not pull every reader of the shard's other
//!   keys to memory. Every word the reader loads is read once and checked
//!   against the shard's geometry (entries against the reserved arena,
//!   not the bump pointer) before use, so a torn read can produce garbage
//!   but never an access outside the shard's reserved pages; a failed
//!   check is retried like a torn read, then left to the locked path,
//!   which resets the shard if the check fails there too. A hit writes
//!   nothing shared: the hit counter is striped per CPU (`counters.rs`),
//!   the SIEVE mark is a compare-and-swap on the slot made only while the
//!   bit is clear, and an expired entry is served by the locked path,
//!   which unlinks it.
//! * Writes append a new entry at the bump pointer and publish its slot
//!   last; the old entry (if any) is marked dead after its slot leads to
//!   the new one, and the slot keeps its visited bit. Deletes leave a
//!   tombstone slot. Nothing is freed in place. An overwrite that needs a
//!   compaction first unlinks the old entry and inserts the new one inside
//!   one move, so no reader ever sees the key absent.
//! * When the arena or the index is full, the shard is compacted: dead and
//!   expired entries are dropped, then SIEVE evicts: the hand walks the
//!   arena from oldest to newest, clearing the "visited" bit that a hit
//!   sets and evicting the first unvisited entries, until a fraction of the
//!   shard is free. Survivors slide down in order (memmove, no scratch
//!   buffer) and the index is rebuilt from the 31-bit tags the old slots
//!   carry (the tag gives the home slot): no key is read or hashed, and
//!   entries store nothing of their hash (the arena walk hashes the
//!   survivors' keys again). A shard whose used arena is mostly dead
//!   copies finds its live entries through the index instead of walking
//!   the arena (`gather_from_index`). When the hand is part-way through
//!   the arena and the part behind it can free enough, only that part is
//!   compacted (`compact_from_hand`): entries before the hand are not
//!   read or moved, the survivors' slots are rewritten in place and the
//!   evicted ones' purged cluster by cluster, so a compaction costs what
//!   lies behind the hand, not the whole shard.
//! * Nothing read from shared memory is trusted: every slot offset, entry
//!   length and bump value is checked against the shard's geometry before
//!   it is used. A failed check resets the shard (counted in `corruptions`).
//! * No Rust reference is ever created over shared bytes; all access is
//!   through raw pointers, under the lock.
//!
//! Lazy reservation (files created sparse, `Mapping::lazy`): the memory a
//! shard holds follows what it stores. Two header words, both raised only
//! under the lock and only after `fallocate` reserved the space they
//! cover, bound every access:
//! * `ARENA_RESERVED`: the arena bytes reserved. The bump pointer never
//!   passes it (checked like every shared word: a bump above it is
//!   corruption), so reads (below the bump) and writes (checked against
//!   it) touch only reserved pages. When an entry does not fit below it,
//!   the shard first drops dead entries if they are more than a sixth of
//!   the used arena and at least `DEAD_SLACK` (so it holds at most 1.2x
//!   its live bytes, plus the slack and one growth), then reserves up to
//!   the next `GROW_CHUNK`.
//! * `ACTIVE_SLOTS`: the index slots in use; probes and rebuilds wrap
//!   around at it and never read a slot beyond it. At the index's load limit it
//!   doubles (the new slots are reserved first, then the index is rebuilt
//!   from the arena by a compaction, under `REWRITING`).
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
//!
//! A growth that the file system refuses (ENOSPC, EDQUOT, EFBIG) is never
//! an error: the shard evicts within the space it holds, exactly as a full
//! preallocated shard does. A set whose entry exceeds the whole reserved
//! arena fails with `Error::Full` before anything is changed. Since no
//! page is written, or read, before it is reserved, a full tmpfs can never
//! raise SIGBUS. A growth that would leave less of the file system
//! available than the handle's reserve (`OpenOptions::fs_reserve`; one
//! `fstatvfs` per growth step, none once the shard is grown) is refused
//! the same way. `clear` gives a lazy shard's memory back (the pages are
//! punched out after the words are lowered), and so does `give_back`, to
//! make room for a spilled value: it evicts and compacts, lowers
//! `ARENA_RESERVED` to the bump rounded up to the growth step and punches
//! the pages above, inside a move (readers that overlap it retry). Preallocated files (`preallocate`, and every file written
//! before lazy reservation) read both words as "everything".

use crate::counters::{Counter, Stripes};
use crate::error::{Error, Result};
use crate::hash::{hash_key, home_slot, next_slot, tag_of};
use crate::layout::*;
use crate::lock::{self, Acquired};
use crate::spill::{SpillRef, ValueFile, REF_LEN};
use crate::stats::ShardStats;
use std::cell::{Cell, RefCell};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Percent of the arena (and of the index's load limit) that a compaction
/// frees when it has to evict: the shard is on average half of it short
/// of full. Larger: fewer compactions and less held memory per entry
/// stored; smaller: more frequent compactions. 10% (20% before layout
/// version 7) holds 31 B of overhead per small entry and 93% of held
/// memory live at 1,600-byte values; with compactions that start at the
/// hand (`compact_from_hand`) a cache whose entries are read is no slower
/// for it, one that only inserts pays 60-80% more per evicting set
/// (measurements in engine.md).
pub const COMPACT_FREE_PERCENT: usize = 10;

/// A compaction reads the live entries from the index instead of walking
/// the arena when the used arena holds at least this many bytes per live
/// entry (mostly dead copies): reading the index and sorting the few live
/// entries then costs less than reading every dead byte.
const SPARSE_ARENA_BYTES_PER_ITEM: usize = 1024;

/// Optimistic attempts of a get that saw writers change the shard under
/// it, before it takes the lock. Small: a torn read means a writer is
/// active, and the lock then waits without burning the core.
const OPTIMISTIC_TRIES: usize = 3;

thread_local! {
    /// References of spilled entries this thread removed from an index,
    /// with the base address of their shard: the cache unlinks their files
    /// once the shard lock is released (`Cache::reap`).
    static DROPPED: RefCell<Vec<(usize, [u8; REF_LEN])>> = const { RefCell::new(Vec::new()) };
}

/// Take the references of spilled entries this thread dropped from shards
/// whose base address lies in `within` (one mapping: another cache's
/// references stay for that cache).
pub(crate) fn take_dropped(within: std::ops::Range<usize>) -> Vec<SpillRef> {
    DROPPED.with(|d| {
        let mut d = d.borrow_mut();
        if d.is_empty() {
            return Vec::new();
        }
        let mut out = Vec::new();
        d.retain(|(base, raw)| {
            if within.contains(base) {
                out.extend(SpillRef::parse(raw));
                false
            } else {
                true
            }
        });
        out
    })
}

/// Whether this thread has dropped spilled entries not yet reaped.
#[inline]
pub(crate) fn has_dropped() -> bool {
    DROPPED.with(|d| !d.borrow().is_empty())
}

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
    /// The shard reserves file space as it grows (see the module comment).
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
}

/// Why an entry has no place yet.
enum Room {
    /// Arena offset and slot for the entry.
    Place(usize, usize),
    /// The index reached its load limit.
    IndexFull,
    /// The entry does not fit between the bump pointer and the end of the
    /// reserved arena.
    ArenaFull { bump: usize },
}

// SAFETY: a Shard is a pointer into a MAP_SHARED mapping that outlives it
// (the Region owns the mapping); writes go through the shard's
// process-shared lock, and lock-free reads only load words and copy bytes,
// checked and validated (see the module comment), which is exactly what
// makes cross-thread use sound.
unsafe impl Send for Shard {}
// SAFETY: see Send.
unsafe impl Sync for Shard {}

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

/// A live entry found by a lookup. Under the lock (writes, batches) it
/// stays valid while the guard is held; in an optimistic get its bytes may
/// be changing under the copy, and whatever was made from them is thrown
/// away unless the shard's `seq` shows that nothing changed.
pub struct EntryRef<'g> {
    src: Src<'g>,
    val_len: usize,
    flags: u32,
    expires_ms: u64,
    /// The entry's version (see "Versions" in the module comment); 0 where
    /// the reader does not know it (a spilled value's file).
    version: u64,
}

/// Where an entry's value bytes are.
enum Src<'g> {
    /// In the arena, at this offset.
    Arena { guard: &'g ShardGuard<'g>, off: usize },
    /// In a spilled-value file (`spill.rs`).
    Spilled(&'g ValueFile<'g>),
    /// In private memory: a copy made earlier (`Cache::update` hands its
    /// callback the value it read, outside any lock).
    Owned(&'g [u8]),
}

impl<'g> EntryRef<'g> {
    /// A spilled value, opened and checked by the cache.
    pub(crate) fn spilled(file: &'g ValueFile<'g>, flags: u32, expires_ms: u64) -> Self {
        EntryRef { src: Src::Spilled(file), val_len: file.len(), flags, expires_ms, version: 0 }
    }

    /// A value already copied out of the cache (`version`: the one it was
    /// read with).
    pub(crate) fn owned(data: &'g [u8], flags: u32, expires_ms: u64, version: u64) -> Self {
        EntryRef { src: Src::Owned(data), val_len: data.len(), flags, expires_ms, version }
    }

    /// The version of the entry this value was read from (0 for a reader
    /// of a spilled value's file, which does not know it).
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The reference of a spilled entry, as read from the arena; None for
    /// an inline entry or bytes that are not a reference.
    pub(crate) fn spill_ref(&self) -> Option<SpillRef> {
        if self.flags & FLAG_SPILLED == 0 || self.val_len != REF_LEN {
            return None;
        }
        let mut b = [0u8; REF_LEN];
        self.copy_to(&mut b);
        SpillRef::parse(&b)
    }
}

impl EntryRef<'_> {
    /// Length of the value in bytes.
    pub fn len(&self) -> usize {
        self.val_len
    }
    /// True if the value is empty.
    pub fn is_empty(&self) -> bool {
        self.val_len == 0
    }
    /// Whether the value is read from a spilled file (see `spill.rs`)
    /// rather than from shared memory.
    pub fn is_spilled(&self) -> bool {
        matches!(self.src, Src::Spilled(_))
    }
    /// The entry's flags word.
    pub fn flags(&self) -> u32 {
        self.flags
    }
    /// Absolute expiry in Unix milliseconds, 0 for never.
    pub fn expires_ms(&self) -> u64 {
        self.expires_ms
    }
    /// Copy the value into `dst`, which must be exactly `len()` bytes.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.val_len, "destination has the wrong length");
        match self.src {
            // SAFETY: off..off+val_len was checked to lie inside the
            // arena's used part when this EntryRef was made; the mapping
            // lives as long as the guard it borrows. Without the lock the
            // bytes may change while they are copied: the copy is then
            // discarded.
            Src::Arena { guard, off } => unsafe {
                guard.shard.copy_out(off, dst.as_mut_ptr(), self.val_len)
            },
            // A failed read or checksum is recorded in the file: the cache
            // discards what was made from this copy.
            Src::Spilled(file) => file.read_into(dst),
            Src::Owned(data) => dst.copy_from_slice(data),
        }
    }
    /// Write the value to `w` in chunks (through a small buffer that stays
    /// in the CPU cache): for a destination that can grow without being
    /// zeroed first, such as a Python `bytes` writer, this is one pass over
    /// the value's memory instead of two. An error from `w` is returned; a
    /// spilled value that fails its checks is recorded as with
    /// [`EntryRef::copy_to`].
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        match self.src {
            Src::Arena { guard, off } => {
                let mut buf = [0u8; 16 * 1024];
                let mut done = 0;
                while done < self.val_len {
                    let n = (self.val_len - done).min(buf.len());
                    // SAFETY: off..off+val_len lies inside the arena's used
                    // part (checked when this EntryRef was made); buf has n
                    // writable bytes.
                    unsafe { guard.shard.copy_out(off + done, buf.as_mut_ptr(), n) };
                    w.write_all(&buf[..n])?;
                    done += n;
                }
                Ok(())
            }
            Src::Spilled(file) => file.write_to(w),
            Src::Owned(data) => w.write_all(data),
        }
    }

    /// The value as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.val_len];
        self.copy_to(&mut v);
        v
    }
}

/// Parsed entry header.
#[derive(Debug, Clone, Copy)]
struct Entry {
    off: usize,
    size: usize,
    expires: u64,
    key_len: usize,
    val_len: usize,
    flags: u32,
    dead: bool,
}

impl Entry {
    fn is_dead(&self) -> bool {
        self.dead
    }
    fn expired(&self, now: u64) -> bool {
        self.expires != 0 && self.expires <= now
    }
    fn val_off(&self) -> usize {
        self.off + ENTRY_HEADER + self.key_len
    }
}

/// Where the entries of a compaction start: a bit per `ENTRY_ALIGN` bytes
/// of the used arena, with running counts, so that an index slot's offset
/// maps to the ordinal of its entry (entries are in arena order) in O(1).
/// Bytes: the used arena / 32, and half that again for the counts.
struct EntryStarts {
    bits: Vec<u64>,
    before: Vec<u32>,
}

impl EntryStarts {
    fn new(entries: &[Entry], bump: usize) -> Self {
        let mut bits = vec![0u64; bump / ENTRY_ALIGN / 64 + 1];
        for e in entries {
            let w = e.off / ENTRY_ALIGN;
            bits[w / 64] |= 1 << (w % 64);
        }
        let mut before = Vec::with_capacity(bits.len());
        let mut count = 0u32;
        for b in &bits {
            before.push(count);
            count += b.count_ones();
        }
        EntryStarts { bits, before }
    }

    /// Ordinal of the entry starting at `off`, if one does.
    fn ordinal(&self, off: usize) -> Option<usize> {
        if off % ENTRY_ALIGN != 0 {
            return None;
        }
        let w = off / ENTRY_ALIGN;
        let b = *self.bits.get(w / 64)?;
        let bit = 1u64 << (w % 64);
        if b & bit == 0 {
            return None;
        }
        Some((self.before[w / 64] + (b & (bit - 1)).count_ones()) as usize)
    }
}

/// What a compaction gathers before it evicts: the live entries in arena
/// order, their SIEVE marks and their tags.
struct Survivors {
    entries: Vec<Entry>,
    visited: Vec<bool>,
    /// The tag of each entry's slot (the home slot it goes back to).
    tags: Vec<u32>,
}

/// A compaction's survivors sliding down in arena order: `write` is
/// where the next one goes; survivors that lie back to back are moved
/// together, one copy per run (most of the arena after the hand's stop is
/// one run).
struct Slider {
    write: usize,
    /// The pending run: `len` bytes at `src`, going to `dst`.
    src: usize,
    dst: usize,
    len: usize,
}

impl Slider {
    fn new(write: usize) -> Self {
        Slider { write, src: 0, dst: write, len: 0 }
    }

    /// Keep `e` (survivors come in arena order): returns its new offset.
    fn keep(&mut self, g: &ShardGuard<'_>, e: &Entry) -> usize {
        if e.off != self.src + self.len {
            self.flush(g);
            (self.src, self.dst) = (e.off, self.write);
        }
        self.len += e.size;
        let at = self.write;
        self.write += e.size;
        at
    }

    /// Move the pending run; returns the end of the survivors.
    fn flush(&mut self, g: &ShardGuard<'_>) -> usize {
        if self.len > 0 && self.src != self.dst {
            // SAFETY: both ranges are inside the used arena (dst < src,
            // the run's entries were checked below the bump pointer);
            // ptr::copy handles the overlap.
            unsafe { ptr::copy(g.arena_ptr(self.src), g.arena_ptr(self.dst), self.len) };
        }
        self.len = 0;
        self.write
    }
}

/// Outcome of an index probe.
struct Probe {
    /// Slot and entry of the key, if present (maybe expired).
    found: Option<(usize, Entry)>,
    /// First reusable slot on the probe path (tombstone or empty).
    free_slot: Option<usize>,
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

    /// Reserve the shard's bytes [from, to) in the file (page-rounded),
    /// refused (`ENOSPC`) if it would leave less than the reserve of the
    /// file system available.
    fn reserve(&self, from: usize, to: usize) -> std::io::Result<()> {
        let start = from / PAGE * PAGE;
        let end = to.div_ceil(PAGE) * PAGE;
        if end <= start {
            return Ok(());
        }
        crate::file::reserve_keeping(self.fd, self.file_off + start, end - start, self.fs_reserve)
    }

    /// Reserve the shard header and the initial index (lazy files): what
    /// must be held before anything of the shard is written.
    fn reserve_initial(&self) -> Result<()> {
        if !self.lazy {
            return Ok(());
        }
        self.reserve(0, SHARD_HEADER_SIZE + self.initial_active * 8).map_err(|e| {
            if crate::file::is_no_room(&e) {
                Error::Full(format!(
                    "cannot reserve a shard header: {e} (the file system is full, or down to \
                     the {} bytes this cache leaves free: the fs_reserve option, 0 turns it off)",
                    self.fs_reserve
                ))
            } else {
                Error::io("fallocate shard header", e)
            }
        })
    }

    fn lock_word(&self) -> *mut u32 {
        // SAFETY: offset 0 of the shard (page-aligned), inside the mapping.
        unsafe { self.base.add(sh::MUTEX) as *mut u32 }
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
        let g = ShardGuard {
            shard: self,
            locked: false,
            writing: Cell::new(false),
            moving: Cell::new(0),
        };
        if self.lazy {
            g.set_hdr(sh::ACTIVE_SLOTS, self.initial_active as u64);
        }
        g.set_hdr(sh::SEQ, self.fresh_seq());
        g.repair();
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
        let g = ShardGuard {
            shard: self,
            locked: false,
            writing: Cell::new(false),
            moving: Cell::new(0),
        };
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

    /// Whether the shard header still carries its magic (see `sh::MAGIC`).
    fn intact(&self) -> bool {
        // SAFETY: sh::MAGIC is inside the shard header.
        unsafe { ptr::read_volatile(self.base.add(sh::MAGIC) as *const u64) == SHARD_MAGIC }
    }

    /// A shard header word (one of the `sh::` offsets), for access
    /// without the lock: an atomic load of a word another process may be
    /// writing yields an old or a new value, never a torn one.
    fn header_atomic(&self, field: usize) -> &AtomicU64 {
        debug_assert!(field + 8 <= SHARD_HEADER_SIZE && field % 8 == 0);
        // SAFETY: field is an sh:: offset, so the word is an aligned u64
        // inside the shard header, in the mapping, which outlives self.
        unsafe { AtomicU64::from_ptr(self.base.add(field) as *mut u64) }
    }

    /// The live-entry counter, read without the lock (one aligned word) and
    /// bounded by the slot count, since it comes from shared memory.
    pub(crate) fn items_unlocked(&self) -> usize {
        (self.header_atomic(sh::ITEMS).load(Ordering::Relaxed) as usize).min(self.slots)
    }

    /// Lock the shard, waiting at most `timeout`. A dead previous owner is
    /// repaired here; a wait that runs out is counted in `lock_timeouts`.
    pub(crate) fn lock(&self, timeout: std::time::Duration) -> Result<ShardGuard<'_>> {
        if !self.intact() {
            return Err(Error::Corrupt(
                "a shard header was zeroed or overwritten by another program (file truncated \
                 and extended, or written over); the next process to open the cache while \
                 no other has it open repairs it, or reopen it with recreate"
                    .into(),
            ));
        }
        // SAFETY: the lock word is an aligned u32 at offset 0 of the shard,
        // inside the mapping, which outlives self.
        let how = match unsafe { lock::lock(self.lock_word(), timeout) } {
            Ok(how) => how,
            Err(e) => {
                if matches!(e, Error::LockTimeout { .. }) {
                    self.count_lock_timeout();
                }
                return Err(e);
            }
        };
        let g = ShardGuard {
            shard: self,
            locked: true,
            writing: Cell::new(false),
            moving: Cell::new(0),
        };
        if how == Acquired::OwnerDied {
            g.repair_after_owner_death();
        }
        Ok(g)
    }

    fn count_lock_timeout(&self) {
        // Updated only through atomics, by lockers that do not hold the lock.
        self.header_atomic(sh::LOCK_TIMEOUTS).fetch_add(1, Ordering::Relaxed);
    }

    /// Counters of this shard, read without the lock (one word each).
    pub(crate) fn stats_unlocked(&self) -> ShardStats {
        let g = ShardGuard {
            shard: self,
            locked: false,
            writing: Cell::new(false),
            moving: Cell::new(0),
        };
        g.stats()
    }

    /// The shard's `seq` word, for an optimistic read: an acquire load,
    /// so the reads that follow it cannot move before it.
    fn seq_acquire(&self) -> u64 {
        // Writers store seq with volatile stores followed (at the start of
        // a write) or preceded (at the end) by release fences.
        self.header_atomic(sh::SEQ).load(Ordering::Acquire)
    }

    /// Whether `seq` still reads `before`: nothing in the shard changed
    /// since the optimistic read that started with it loaded `before`.
    fn seq_unchanged(&self, before: u64) -> bool {
        // The acquire fence keeps every read of the shard above it: they
        // all happened before the second load of seq.
        std::sync::atomic::fence(Ordering::Acquire);
        self.header_atomic(sh::SEQ).load(Ordering::Relaxed) == before
    }

    /// A get without the lock (see the module comment). `f` copies the
    /// value out; it may run more than once, and only the result of a run
    /// that `seq` validated is returned. `None`: take the lock instead (a
    /// writer is active or died mid-write, the entry needs a write to be
    /// served, or the shard failed a check); `Some(None)`: a validated miss.
    pub(crate) fn get_optimistic<R>(
        &self,
        key: &[u8],
        hash: u64,
        now: &mut Now,
        f: &mut impl FnMut(EntryRef<'_>) -> R,
    ) -> Option<Option<R>> {
        if !self.intact() {
            return None;
        }
        // An unlocked view: only its reads are used here, never a write.
        let view = ShardGuard {
            shard: self,
            locked: false,
            writing: Cell::new(false),
            moving: Cell::new(0),
        };
        for _ in 0..OPTIMISTIC_TRIES {
            let before = self.seq_acquire();
            if before & 1 == 1 {
                return None;
            }
            // Entries are bounded by the reserved arena, not the bump
            // pointer: every write moves the bump pointer, and reading it
            // would pull the line that writes change into this core. A
            // published slot leads below the bump pointer; anything else
            // is a torn read, still inside reserved pages.
            let found = match view.arena_reserved().and_then(|bound| view.probe(key, hash, bound)) {
                Ok(p) => p.found,
                // Torn (an entry overwritten or deleted under us, marked
                // dead) or corrupt: retry, and let the lock decide.
                Err(_) => continue,
            };
            let Some((i, e)) = found else {
                if self.seq_unchanged(before) {
                    self.stripes.add(Counter::Misses);
                    return Some(None);
                }
                continue;
            };
            if e.expires != 0 && e.expired(now.get()) {
                return None;
            }
            let r = f(EntryRef {
                src: Src::Arena { guard: &view, off: e.val_off() },
                val_len: e.val_len,
                flags: e.flags,
                expires_ms: e.expires,
                // Validated with the copy: `before` is the seq this read
                // saw from start to end.
                version: self.version(before, e.off),
            });
            let published = ShardGuard::slot_value(hash, e.off);
            if self.seq_unchanged(before) && view.slot(i) & !SLOT_VISITED == published {
                view.mark_visited(i, e.off);
                self.stripes.add(Counter::Hits);
                return Some(Some(r));
            }
        }
        None
    }

    // ---- raw access; every offset is checked by the callers ----

    /// # Safety
    /// `off + len` must be within the arena.
    unsafe fn copy_out(&self, off: usize, dst: *mut u8, len: usize) {
        debug_assert!(off + len <= self.arena_size);
        // SAFETY: off + len is within the arena (caller's contract) and dst
        // has len writable bytes that cannot overlap the mapping.
        unsafe { ptr::copy_nonoverlapping(self.base.add(self.arena_off + off), dst, len) };
    }
}

/// A locked shard. Unlocks on drop.
pub(crate) struct ShardGuard<'a> {
    shard: &'a Shard,
    locked: bool,
    /// Inside this guard's own begin_write/end_write bracket.
    writing: Cell<bool>,
    /// Depth of this guard's begin_move/end_move brackets (`seq` is odd
    /// while it is above zero).
    moving: Cell<u32>,
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        if self.locked {
            if self.writing.get() {
                // Unwinding out of a write (a panic): repair before others
                // see the half-written shard, as if the holder had died.
                // The repair brackets its own moves; `seq` stays odd until
                // it is done.
                self.writing.set(false);
                self.moving.set(0);
                self.repair_after_owner_death();
            }
            // SAFETY: this guard locked the word in Shard::lock.
            unsafe { lock::unlock(self.shard.lock_word()) }
        }
    }
}

impl<'a> ShardGuard<'a> {
    // ---- header and index words ----

    fn hdr(&self, field: usize) -> u64 {
        debug_assert!(field + 8 <= SHARD_HEADER_SIZE);
        // SAFETY: field is one of the sh:: constants, inside the header.
        unsafe { ptr::read_volatile(self.shard.base.add(field) as *const u64) }
    }

    fn set_hdr(&self, field: usize, v: u64) {
        debug_assert!(field + 8 <= SHARD_HEADER_SIZE);
        // SAFETY: as in hdr; the lock is held.
        unsafe { ptr::write_volatile(self.shard.base.add(field) as *mut u64, v) }
    }

    fn bump_stat(&self, field: usize) {
        self.add_stat(field, 1);
    }

    fn add_stat(&self, field: usize, n: u64) {
        self.set_hdr(field, self.hdr(field).wrapping_add(n));
    }

    /// Index slot `i` as an atomic word: readers without the lock set its
    /// visited bit with a compare-and-swap (`mark_visited`), so every
    /// access to a slot is atomic.
    fn slot_word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.shard.slots);
        // SAFETY: every caller passes i < active <= slots (home_slot and
        // next_slot stay below the active count, which active_slots()
        // checks against slots; scans run over 0..active), so the word is
        // inside the index that follows the shard header; index words are
        // 8-byte aligned (the shard and its header are), live as long as
        // the mapping, and are only ever accessed atomically.
        unsafe { &*(self.shard.base.add(SHARD_HEADER_SIZE + i * 8) as *const AtomicU64) }
    }

    /// Slot `i`, read once.
    fn slot(&self, i: usize) -> u64 {
        self.slot_word(i).load(Ordering::Relaxed)
    }

    /// Write slot `i` (under the lock).
    fn set_slot(&self, i: usize, v: u64) {
        self.slot_word(i).store(v, Ordering::Relaxed)
    }

    /// SIEVE's "visited" mark for the entry at `off`, found in slot `i`:
    /// set the slot's visited bit unless it is set already (a hit writes
    /// nothing shared once its entry is marked). Without the lock this is
    /// a compare-and-swap against the slot's value for exactly that entry:
    /// if a writer changed the slot meanwhile, nothing is written. A bit
    /// set on a slot that a compaction rebuilt for another entry at the
    /// same offset with the same tag only marks that entry: the mark
    /// guides eviction, it never changes what a slot leads to.
    fn mark_visited(&self, i: usize, off: usize) {
        let v = self.slot(i);
        if v & SLOT_VISITED == 0 && Self::slot_entry_off(v) == off && v != 0 && v != TOMBSTONE {
            let _ = self.slot_word(i).compare_exchange(
                v,
                v | SLOT_VISITED,
                Ordering::Relaxed,
                Ordering::Relaxed,
            );
        }
    }

    fn arena_ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.shard.arena_size);
        // SAFETY: off is within the arena (checked by callers).
        unsafe { self.shard.base.add(self.shard.arena_off + off) }
    }

    /// Start a write: any change to the shard. Sets `WRITING`, which only
    /// lockers read (a dead owner that left it set left the shard
    /// half-written). Optimistic readers never read this word's cache
    /// line, so an append or a delete does not disturb them.
    fn begin_write(&self) {
        self.writing.set(true);
        self.set_hdr(sh::WRITING, 1);
        std::sync::atomic::fence(Ordering::Release);
    }

    fn end_write(&self) {
        std::sync::atomic::fence(Ordering::Release);
        if self.hdr(sh::REWRITING) != 0 {
            self.set_hdr(sh::REWRITING, 0);
        }
        self.set_hdr(sh::WRITING, 0);
        self.writing.set(false);
    }

    /// Start a move: a write that moves or rewrites bytes a published slot
    /// may lead to, or the index itself (compaction, reset, repair, an
    /// in-place counter, a growing index). `seq` is odd until the
    /// outermost `end_move`, so an optimistic reader that overlapped it
    /// throws its copy away. Brackets nest.
    fn begin_move(&self) {
        let depth = self.moving.get();
        self.moving.set(depth + 1);
        if depth == 0 {
            self.set_hdr(sh::SEQ, self.hdr(sh::SEQ) | 1);
            std::sync::atomic::fence(Ordering::Release);
        }
    }

    fn end_move(&self) {
        let depth = self.moving.get();
        debug_assert!(depth > 0);
        self.moving.set(depth.saturating_sub(1));
        if depth <= 1 {
            std::sync::atomic::fence(Ordering::Release);
            self.set_hdr(sh::SEQ, (self.hdr(sh::SEQ) | 1).wrapping_add(1));
        }
    }

    /// The reserved arena bytes, checked against the arena size (all of
    /// it in a preallocated file).
    fn arena_reserved(&self) -> Check<usize> {
        if !self.shard.lazy {
            return Ok(self.shard.arena_size);
        }
        let r = self.hdr(sh::ARENA_RESERVED);
        if r > self.shard.arena_size as u64 || r % ENTRY_ALIGN as u64 != 0 {
            return Err(Corrupt("reserved arena size out of range"));
        }
        Ok(r as usize)
    }

    /// The index slots in use, checked (all of them in a preallocated file).
    fn active_slots(&self) -> Check<usize> {
        if !self.shard.lazy {
            return Ok(self.shard.slots);
        }
        let a = self.hdr(sh::ACTIVE_SLOTS);
        if a < self.shard.initial_active as u64 || a > self.shard.slots as u64 {
            return Err(Corrupt("active slot count out of range"));
        }
        Ok(a as usize)
    }

    /// The bump pointer, checked against the reserved arena.
    fn bump(&self) -> Check<usize> {
        let b = self.hdr(sh::BUMP);
        if b > self.arena_reserved()? as u64 || b % ENTRY_ALIGN as u64 != 0 {
            return Err(Corrupt("bump pointer outside the reserved arena"));
        }
        Ok(b as usize)
    }

    /// Zero the index's active slots (the rest is a hole in a lazy file,
    /// zero and never written). A corrupt slot count falls back to the
    /// initial one, which is always reserved. Returns the active count.
    fn zero_index(&self) -> usize {
        let active = self.active_slots().unwrap_or_else(|_| {
            self.set_hdr(sh::ACTIVE_SLOTS, self.shard.initial_active as u64);
            self.shard.initial_active
        });
        // SAFETY: the index is slots*8 bytes right after the shard header
        // and active <= slots; in a lazy file these words are reserved.
        unsafe { ptr::write_bytes(self.shard.base.add(SHARD_HEADER_SIZE), 0, active * 8) };
        active
    }

    /// Lazy files: reserve the arena up to `end` rounded up to a growth
    /// chunk. False if the file system has no room (nothing changed).
    fn grow_arena(&self, reserved: usize, end: usize) -> bool {
        let new = end.div_ceil(GROW_CHUNK).saturating_mul(GROW_CHUNK).min(self.shard.arena_size);
        if !self.shard.lazy || new <= reserved {
            return false;
        }
        let a = self.shard.arena_off;
        if self.shard.reserve(a + reserved, a + new).is_err() {
            return false;
        }
        self.set_hdr(sh::ARENA_RESERVED, new as u64);
        true
    }

    /// Lazy files: double the index (up to its full size). Reserves the new
    /// slots; the caller rebuilds the index (a compaction) inside the same
    /// write.
    fn grow_index(&self, active: usize) -> bool {
        if !self.shard.lazy || active >= self.shard.slots {
            return false;
        }
        let new = (active * 2).min(self.shard.slots);
        let base = SHARD_HEADER_SIZE;
        if self.shard.reserve(base + active * 8, base + new * 8).is_err() {
            return false;
        }
        // The index is stale until the compaction that follows rebuilds it.
        self.set_hdr(sh::REWRITING, 1);
        self.set_hdr(sh::ACTIVE_SLOTS, new as u64);
        true
    }

    /// Before a write of an entry of `size` bytes changes anything: make
    /// sure the shard can hold it once empty. Fails with `Error::Full`
    /// only if the arena reserved so far is smaller than the entry and
    /// the file system refuses more.
    pub(crate) fn ensure_can_hold(&self, size: usize) -> Result<()> {
        let Ok(reserved) = self.arena_reserved() else { return Ok(()) };
        if size <= reserved || self.grow_arena(reserved, size) {
            return Ok(());
        }
        Err(Error::Full(format!(
            "an entry of {size} bytes needs more memory for its shard ({reserved} bytes held) \
             and the file system has no room; nothing was changed"
        )))
    }

    /// Bytes of the file this shard holds (reserved pages).
    fn held_bytes(&self) -> u64 {
        if !self.shard.lazy {
            return (self.shard.arena_off + self.shard.arena_size) as u64;
        }
        let active = self.active_slots().unwrap_or(self.shard.initial_active);
        let reserved = self.arena_reserved().unwrap_or(0);
        let index_end = (SHARD_HEADER_SIZE + active * 8).div_ceil(PAGE);
        let mut pages = index_end;
        if reserved > 0 {
            let from = (self.shard.arena_off / PAGE).max(index_end);
            let to = (self.shard.arena_off + reserved).div_ceil(PAGE);
            pages += to.saturating_sub(from);
        }
        (pages * PAGE) as u64
    }

    /// Cheap checks of the header words before trusting them.
    fn sanity(&self) -> Check<()> {
        self.bump()?;
        let slots = self.active_slots()? as u64;
        if self.hdr(sh::SLOTS_USED) > slots
            || self.hdr(sh::TOMBSTONES) > self.hdr(sh::SLOTS_USED)
            || self.hdr(sh::ITEMS) > slots
            || self.hdr(sh::HAND) > self.shard.arena_size as u64
        {
            return Err(Corrupt("shard header counters out of range"));
        }
        Ok(())
    }

    /// Read and check the entry at arena offset `off` (below `bump`).
    fn entry(&self, off: usize, bump: usize) -> Check<Entry> {
        if off % ENTRY_ALIGN != 0 || off > bump || bump - off < ENTRY_HEADER {
            return Err(Corrupt("entry offset outside the used arena"));
        }
        let p = self.arena_ptr(off);
        // SAFETY: off + ENTRY_HEADER <= bump <= arena_size, checked above.
        // Volatile reads: each word is read once into a local, and only the
        // checked local is used afterwards.
        // Every field is a u32 at a multiple of 4 from an entry start,
        // which is a multiple of ENTRY_ALIGN (checked above) in a shard
        // whose arena starts on a cache line: the reads are aligned.
        let (meta_lo, meta_hi, len, flags) = unsafe {
            (
                ptr::read_volatile(p.add(eh::META_LO) as *const u32),
                ptr::read_volatile(p.add(eh::META_HI) as *const u32),
                ptr::read_volatile(p.add(eh::LEN) as *const u32),
                ptr::read_volatile(p.add(eh::FLAGS) as *const u32),
            )
        };
        let meta = (meta_hi as u64) << 32 | meta_lo as u64;
        let key_len = (meta >> 48) as usize + 1;
        let val_len = (len & !LEN_DEAD) as usize;
        let size = entry_size(key_len, val_len);
        // No write stores an entry above the geometry's limit: a larger one
        // is a scribbled header (its lengths parse whatever the bits).
        if size > bump - off || size > self.shard.max_entry {
            return Err(Corrupt("entry length outside the used arena"));
        }
        Ok(Entry {
            off,
            size,
            expires: meta & MAX_EXPIRES_MS,
            key_len,
            val_len,
            flags,
            dead: len & LEN_DEAD != 0,
        })
    }

    /// Mark a checked entry dead (one aligned word).
    fn mark_dead(&self, e: &Entry) {
        // SAFETY: e was checked by entry(); the header is inside the arena.
        unsafe {
            ptr::write(self.arena_ptr(e.off + eh::LEN) as *mut u32, e.val_len as u32 | LEN_DEAD)
        }
    }

    /// Write the meta word of the entry header at `p` (two u32 words).
    ///
    /// # Safety
    /// `p` is an entry start inside the reserved arena (a multiple of
    /// ENTRY_ALIGN), with room for the header; the lock is held, and a
    /// published entry's meta is written only inside a move.
    unsafe fn write_meta(&self, p: *mut u8, meta: u64) {
        // SAFETY: per the contract above; both words are 4-aligned.
        unsafe {
            ptr::write(p.add(eh::META_LO) as *mut u32, meta as u32);
            ptr::write(p.add(eh::META_HI) as *mut u32, (meta >> 32) as u32);
        }
    }

    /// The hash of a checked entry's key, computed again from its bytes
    /// (`key` is scratch space for them).
    fn entry_hash(&self, e: &Entry, key: &mut Vec<u8>) -> u64 {
        key.resize(e.key_len, 0);
        // SAFETY: the key bytes lie inside the checked entry.
        unsafe { self.shard.copy_out(e.off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len) };
        hash_key(self.shard.seed, key)
    }

    fn key_equals(&self, e: &Entry, key: &[u8]) -> bool {
        if e.key_len != key.len() {
            return false;
        }
        // SAFETY: the key bytes lie inside the checked entry; memcmp reads
        // through raw pointers, no reference to shared memory is created.
        unsafe {
            libc::memcmp(
                self.arena_ptr(e.off + ENTRY_HEADER) as *const libc::c_void,
                key.as_ptr() as *const libc::c_void,
                key.len(),
            ) == 0
        }
    }

    fn slot_entry_off(v: u64) -> usize {
        ((v & 0xffff_ffff).wrapping_sub(1).wrapping_mul(ENTRY_ALIGN as u64)) as usize
    }

    /// A slot leading to the entry at `off` (not marked visited).
    fn slot_value(hash: u64, off: usize) -> u64 {
        Self::tagged_slot(tag_of(hash), off)
    }

    /// A slot with tag `tag` leading to the entry at `off` (not marked
    /// visited).
    fn tagged_slot(tag: u32, off: usize) -> u64 {
        ((tag as u64) << 32) | (off / ENTRY_ALIGN + 1) as u64
    }

    /// The tag of a (non-empty, non-tombstone) slot.
    fn slot_tag(v: u64) -> u32 {
        ((v & !SLOT_VISITED) >> 32) as u32
    }

    /// Find `key` in the index. Entries are checked against `bound` (the
    /// bump pointer under the lock, the reserved arena without it).
    fn probe(&self, key: &[u8], hash: u64, bound: usize) -> Check<Probe> {
        let active = self.active_slots()?;
        let tag = tag_of(hash);
        let mut i = home_slot(tag, active);
        let mut free_slot = None;
        for _ in 0..active {
            // Acquire: a slot published by a writer that the lock does not
            // exclude leads to an entry whose bytes were stored before it.
            let v = self.slot_word(i).load(Ordering::Acquire);
            if v == 0 {
                return Ok(Probe { found: None, free_slot: free_slot.or(Some(i)) });
            }
            if v == TOMBSTONE {
                free_slot.get_or_insert(i);
            } else if Self::slot_tag(v) == tag {
                let e = self.entry(Self::slot_entry_off(v), bound)?;
                if self.key_equals(&e, key) {
                    if e.is_dead() {
                        return Err(Corrupt("index points at a dead entry"));
                    }
                    return Ok(Probe { found: Some((i, e)), free_slot });
                }
            }
            i = next_slot(i, active);
        }
        Ok(Probe { found: None, free_slot })
    }

    /// A live entry leaves the index: if it names a spilled file, queue the
    /// file for removal once the lock is released.
    fn note_dropped(&self, e: &Entry) {
        if e.flags & FLAG_SPILLED != 0 && e.val_len == REF_LEN {
            let mut raw = [0u8; REF_LEN];
            // SAFETY: the value bytes lie inside the checked entry.
            unsafe { self.shard.copy_out(e.val_off(), raw.as_mut_ptr(), REF_LEN) };
            DROPPED.with(|d| d.borrow_mut().push((self.shard.base as usize, raw)));
        }
    }

    /// Remove the entry in slot `i` (it becomes a tombstone).
    fn unlink(&self, i: usize, e: &Entry) {
        self.note_dropped(e);
        self.mark_dead(e);
        self.set_slot(i, TOMBSTONE);
        self.add_stat(sh::TOMBSTONES, 1);
        self.set_hdr(sh::ITEMS, self.hdr(sh::ITEMS).saturating_sub(1));
        self.set_hdr(sh::LIVE_BYTES, self.hdr(sh::LIVE_BYTES).saturating_sub(e.size as u64));
    }

    /// Reset the shard to empty (mutex untouched). Counts nothing. Inside
    /// an enclosing write the shard stays marked as mid-write.
    fn reset_data(&self) {
        let nested = self.writing.get();
        self.begin_write();
        self.begin_move();
        self.set_hdr(sh::REWRITING, 1);
        self.zero_index();
        if self.arena_reserved().is_err() {
            // Lowering the mark is always safe: the next growth reserves
            // again (fallocate of reserved space is a no-op).
            self.set_hdr(sh::ARENA_RESERVED, 0);
        }
        for f in [sh::BUMP, sh::LIVE_BYTES, sh::ITEMS, sh::SLOTS_USED, sh::TOMBSTONES, sh::HAND] {
            self.set_hdr(f, 0);
        }
        self.end_move();
        if !nested {
            self.end_write();
        }
    }

    /// Reset after a crash or at initialisation: empty data and an even seq
    /// (whatever write the dead owner left open is over).
    fn repair(&self) {
        debug_assert!(!self.writing.get());
        self.reset_data();
    }

    /// After taking the lock over from a dead holder (or, when attaching
    /// alone, from a crashed one): keep every complete entry, drop only the
    /// one being written. Returns whether anything had to be repaired.
    ///
    /// Writes append the entry, then advance the bump pointer, then publish
    /// the slot; deletes mark the entry dead before they touch the index. So
    /// the arena below the bump pointer holds complete entries, and the live
    /// ones are exactly those not marked dead: the index and the counters
    /// are rebuilt from them. An entry written but not yet published is
    /// kept (it is complete); one not yet covered by the bump pointer is
    /// gone. A holder that died while moving or clearing entries
    /// (`REWRITING`) leaves nothing trustworthy: the shard is reset.
    fn repair_after_owner_death(&self) -> bool {
        let mid_write = self.hdr(sh::WRITING) != 0 || self.hdr(sh::SEQ) & 1 == 1;
        if !mid_write && self.sanity().is_ok() {
            return false;
        }
        let items_before = self.hdr(sh::ITEMS).min(self.shard.slots as u64);
        if self.hdr(sh::REWRITING) == 0 {
            if let Ok(kept) = self.salvage() {
                self.add_stat(sh::ENTRIES_LOST, items_before.saturating_sub(kept));
                self.bump_stat(sh::SALVAGES);
                return true;
            }
        }
        self.add_stat(sh::ENTRIES_LOST, items_before);
        self.repair();
        self.bump_stat(sh::RESETS);
        true
    }

    /// Rebuild the index and counters from the arena. Fails (leaving the
    /// shard for a reset) if the arena itself does not parse.
    fn salvage(&self) -> Check<u64> {
        let bump = self.bump()?;
        let mut live = Vec::new();
        let mut off = 0;
        while off < bump {
            let e = self.entry(off, bump)?;
            if !e.is_dead() {
                live.push(e);
            }
            off += e.size;
        }
        let active = self.active_slots()?;
        if live.len() > active * 3 / 4 {
            return Err(Corrupt("more live entries than the index holds"));
        }
        self.begin_write();
        self.begin_move();
        self.zero_index();
        let mut items = 0u64;
        let mut live_bytes = 0u64;
        let mut key = Vec::new();
        for e in &live {
            let hash = self.entry_hash(e, &mut key);
            // A key found twice (never by our writers; possible in a
            // scribbled file) keeps its later entry.
            let slot = match self.probe(&key, hash, bump) {
                Ok(Probe { found: Some((i, old)), .. }) => {
                    self.mark_dead(&old);
                    items -= 1;
                    live_bytes -= old.size as u64;
                    Some(i)
                }
                Ok(Probe { found: None, free_slot }) => free_slot,
                Err(c) => {
                    self.end_move();
                    self.end_write();
                    return Err(c);
                }
            };
            let Some(slot) = slot else {
                self.end_move();
                self.end_write();
                return Err(Corrupt("index full while salvaging"));
            };
            self.set_slot(slot, Self::slot_value(hash, e.off));
            items += 1;
            live_bytes += e.size as u64;
        }
        self.set_hdr(sh::ITEMS, items);
        self.set_hdr(sh::SLOTS_USED, items);
        self.set_hdr(sh::TOMBSTONES, 0);
        self.set_hdr(sh::LIVE_BYTES, live_bytes);
        if self.hdr(sh::HAND) > bump as u64 {
            self.set_hdr(sh::HAND, 0);
        }
        self.end_move();
        self.end_write();
        Ok(items)
    }

    /// Handle corruption found during an operation: reset and count it.
    fn recover(&self, _why: Corrupt) {
        self.add_stat(sh::ENTRIES_LOST, self.hdr(sh::ITEMS).min(self.shard.slots as u64));
        self.reset_data();
        self.bump_stat(sh::CORRUPTIONS);
        self.bump_stat(sh::RESETS);
    }

    /// Look up a live entry, expiring it lazily. Corruption resets the shard
    /// and reads as a miss.
    fn lookup_live(&self, key: &[u8], hash: u64, now: &mut Now) -> Option<(usize, Entry)> {
        let res = (|| {
            let bump = self.bump()?;
            let p = self.probe(key, hash, bump)?;
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

    // ---- operations ----

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
            None => self.insert(key, hash, value, flags, expires, size, now),
        };
        if stored {
            self.bump_stat(sh::SETS);
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
        for _attempt in 0..8 {
            let room = (|| -> Check<Room> {
                let off = self.bump()?;
                let reserved = self.arena_reserved()?;
                let active = self.active_slots()?;
                if self.hdr(sh::SLOTS_USED) as usize >= active * 3 / 4 {
                    return Ok(Room::IndexFull);
                }
                if off > reserved || size > reserved - off {
                    return Ok(Room::ArenaFull { bump: off });
                }
                Ok(match self.probe(key, hash, off)?.free_slot {
                    Some(slot) => Room::Place(off, slot),
                    None => Room::IndexFull,
                })
            })();
            let (off, slot) = match room {
                Ok(Room::Place(off, slot)) => (off, slot),
                Ok(_) if evicted => {
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
                Ok(Room::ArenaFull { bump }) => {
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

    /// Write an entry at arena offset `off`, at the bump pointer, and move
    /// the bump pointer over it. The caller checked `off + size` against
    /// the reserved arena on the very values it passes, and publishes a
    /// slot for the entry afterwards (nothing leads to it before).
    #[allow(clippy::too_many_arguments)]
    fn append(&self, off: usize, size: usize, key: &[u8], value: &[u8], flags: u32, expires: u64) {
        debug_assert!(off + size <= self.shard.arena_size);
        debug_assert_eq!(size, entry_size(key.len(), value.len()));
        let p = self.arena_ptr(off);
        // SAFETY: off + size <= reserved <= arena_size (the caller checked
        // the values it passed, which nothing else can change); we write
        // the header, key and value into the unused tail of the arena.
        // The header's u32 words are aligned: `off` is a multiple of
        // ENTRY_ALIGN (every entry size is).
        unsafe {
            self.write_meta(p, entry_meta(expires, key.len()));
            ptr::write(p.add(eh::LEN) as *mut u32, value.len() as u32);
            ptr::write(p.add(eh::FLAGS) as *mut u32, flags);
            ptr::copy_nonoverlapping(key.as_ptr(), p.add(ENTRY_HEADER), key.len());
            ptr::copy_nonoverlapping(value.as_ptr(), p.add(ENTRY_HEADER + key.len()), value.len());
        }
        // The entry's bytes are in place before the bump pointer covers
        // them (a repair after a kill trusts what lies below the bump) and
        // before any slot leads to them (a reader's acquire load of the
        // slot then sees them whole).
        std::sync::atomic::fence(Ordering::Release);
        self.set_hdr(sh::BUMP, (off + size) as u64);
        self.add_stat(sh::LIVE_BYTES, size as u64);
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
        let room = (|| -> Check<Option<usize>> {
            let off = self.bump()?;
            let reserved = self.arena_reserved()?;
            Ok((off <= reserved && size <= reserved - off).then_some(off))
        })();
        // A failed check is met again, and repaired, on the insert path.
        let Ok(Some(off)) = room else { return false };
        self.append(off, size, key, value, flags, expires);
        // The key keeps its SIEVE mark: an overwrite is a use of the key,
        // and a slot published already marked spares the next reader the
        // compare-and-swap that would pull the slot's line back to it.
        let visited = self.slot(i) & SLOT_VISITED;
        self.set_slot(i, Self::slot_value(hash, off) | visited);
        self.note_dropped(e);
        self.mark_dead(e);
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

    /// Lazy files, on an empty shard: give the memory beyond the initial
    /// index back to the file system. The words are lowered first (an
    /// empty index is valid at any size), then the pages punched out: a
    /// holder killed in between leaves pages held that the words no longer
    /// count, which the next growth reserves again at no cost.
    fn release_memory(&self) {
        if !self.shard.lazy || self.hdr(sh::ITEMS) != 0 || self.hdr(sh::BUMP) != 0 {
            return;
        }
        self.set_hdr(sh::ACTIVE_SLOTS, self.shard.initial_active as u64);
        self.set_hdr(sh::ARENA_RESERVED, 0);
        let keep = (SHARD_HEADER_SIZE + self.shard.initial_active * 8).div_ceil(PAGE) * PAGE;
        let end = self.shard.arena_off + self.shard.arena_size;
        if end > keep {
            // Best effort: a file system that cannot punch holes keeps the
            // pages, which stay reserved for the next growth.
            // SAFETY: fd is the open cache file; the range is this shard's.
            unsafe {
                libc::fallocate(
                    self.shard.fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (self.shard.file_off + keep) as libc::off_t,
                    (end - keep) as libc::off_t,
                );
            }
        }
    }

    /// Lazy files: give back about `need` bytes of the memory this shard
    /// holds, to make room on the file system for something else (a
    /// spilled value). Evicts (SIEVE) and compacts until `need` bytes of
    /// the reserved arena are free, lowers `ARENA_RESERVED` to the bump
    /// rounded up to the growth step, and punches out the pages above it,
    /// as `release_memory` does for an empty shard: the word is lowered
    /// first, then the pages punched, inside a move (`seq` odd), so an
    /// optimistic reader that overlapped it retries, and a holder killed
    /// in between leaves pages held that no word counts, which the next
    /// growth reserves again at no cost. Returns the arena bytes no longer
    /// reserved (0 for a preallocated file).
    pub(crate) fn give_back(&self, need: usize, now: &mut Now) -> usize {
        if !self.shard.lazy || need == 0 {
            return 0;
        }
        let Ok(reserved) = self.arena_reserved() else { return 0 };
        if reserved == 0 {
            return 0;
        }
        self.begin_write();
        let bump = self.bump().unwrap_or(reserved);
        if reserved.saturating_sub(bump) < need.min(reserved) {
            self.compact(need.min(reserved), true, now);
        }
        self.begin_move();
        let mut given = 0;
        if let (Ok(bump), Ok(reserved)) = (self.bump(), self.arena_reserved()) {
            let keep = bump.div_ceil(GROW_CHUNK).saturating_mul(GROW_CHUNK).min(reserved);
            if keep < reserved {
                self.set_hdr(sh::ARENA_RESERVED, keep as u64);
                let a = self.shard.arena_off;
                // Whole pages only: the page holding the new mark may hold
                // live bytes below it. The arena ends the shard, whose size
                // is a multiple of the page.
                let (from, to) =
                    ((a + keep).div_ceil(PAGE) * PAGE, (a + reserved).div_ceil(PAGE) * PAGE);
                // Best effort, as in release_memory: a file system that
                // cannot punch holes keeps the pages for the next growth.
                // SAFETY: fd is the open cache file; [from, to) lies in
                // this shard's arena, above its bump, whose bytes no slot
                // leads to and nobody reads while seq is odd.
                if to > from {
                    unsafe {
                        libc::fallocate(
                            self.shard.fd,
                            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                            (self.shard.file_off + from) as libc::off_t,
                            (to - from) as libc::off_t,
                        );
                    }
                }
                given = reserved - keep;
            }
        }
        self.end_move();
        self.end_write();
        given
    }

    /// Call `f(key, value_len, flags, expires)` for each live entry, in
    /// arena order. Stops early on corruption (after resetting).
    pub(crate) fn for_each_live(&self, now: &mut Now, mut f: impl FnMut(&[u8], &Entry0)) {
        let res = (|| {
            let bump = self.bump()?;
            let mut off = 0;
            let mut key = Vec::new();
            let t = now.get();
            while off < bump {
                let e = self.entry(off, bump)?;
                if !e.is_dead() && !e.expired(t) {
                    key.resize(e.key_len, 0);
                    // SAFETY: key bytes inside the checked entry.
                    unsafe { self.shard.copy_out(off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len) };
                    let value_len = match self.spilled_ref(&e) {
                        Some(r) => r.len as usize,
                        None => e.val_len,
                    };
                    f(
                        &key,
                        &Entry0 {
                            value_len,
                            flags: e.flags & !FLAG_SPILLED,
                            expires_ms: e.expires,
                        },
                    );
                }
                off += e.size;
            }
            Ok(())
        })();
        if let Err(c) = res {
            self.recover(c);
        }
    }

    /// Call `f` on every entry not marked dead (live or expired), in arena
    /// order. Reads only.
    fn walk_indexed(&self, mut f: impl FnMut(&Entry)) -> Check<()> {
        let bump = self.bump()?;
        let mut off = 0;
        while off < bump {
            let e = self.entry(off, bump)?;
            if !e.is_dead() {
                f(&e);
            }
            off += e.size;
        }
        Ok(())
    }

    /// The reference of a spilled entry, None for an inline one (or a
    /// spilled one whose reference does not parse: its get refuses it).
    fn spilled_ref(&self, e: &Entry) -> Option<SpillRef> {
        if e.flags & FLAG_SPILLED == 0 || e.val_len != REF_LEN {
            return None;
        }
        let mut raw = [0u8; REF_LEN];
        // SAFETY: the value bytes lie inside the checked entry.
        unsafe { self.shard.copy_out(e.val_off(), raw.as_mut_ptr(), REF_LEN) };
        SpillRef::parse(&raw)
    }

    /// Append the references of every spilled entry not marked dead
    /// (expired ones included: their files are still theirs). A shard
    /// that fails its checks is reset (its files become orphans).
    pub(crate) fn spilled_refs(&self, out: &mut Vec<SpillRef>) {
        if let Err(c) = self.walk_indexed(|e| out.extend(self.spilled_ref(e))) {
            self.recover(c);
        }
    }

    /// Drop spilled entries until their files hold at least `need` bytes:
    /// expired ones first as met, then SIEVE order (a visited entry loses
    /// its mark and is spared once; the caller's next round takes it).
    /// Returns the bytes whose files are now queued for removal.
    pub(crate) fn evict_spilled(&self, need: u64, now: &mut Now) -> u64 {
        let t = now.get();
        let mut spilled = Vec::new();
        let walked = self.walk_indexed(|e| {
            if let Some(r) = self.spilled_ref(e) {
                spilled.push((*e, r.len));
            }
        });
        if let Err(c) = walked {
            self.recover(c);
            return 0;
        }
        if spilled.is_empty() {
            return 0;
        }
        self.begin_write();
        let (mut evicted, mut queued) = (0, 0);
        for (e, len) in &spilled {
            if queued >= need {
                break;
            }
            // The slot of each entry, found by its hash and offset; its
            // visited bit spares the entry once.
            let Ok(Some(i)) = self.slot_of(e) else { continue };
            let v = self.slot(i);
            if !e.expired(t) && v & SLOT_VISITED != 0 {
                self.set_slot(i, v & !SLOT_VISITED);
                continue;
            }
            self.unlink(i, e);
            evicted += 1;
            queued += len;
        }
        self.end_write();
        self.add_stat(sh::EVICTIONS, evicted);
        queued
    }

    /// The index slot that points at entry `e`.
    fn slot_of(&self, e: &Entry) -> Check<Option<usize>> {
        let active = self.active_slots()?;
        let hash = self.entry_hash(e, &mut Vec::new());
        self.find_slot(tag_of(hash), e.off, active)
    }

    /// Compact: drop dead and expired entries, then (if `evict`)
    /// SIEVE-evict until at least `need` bytes and COMPACT_FREE_PERCENT of
    /// the reserved arena and of the index load limit are free. Without
    /// `evict`, entries are evicted only if the index cannot hold the
    /// survivors. Inside begin/end_write.
    fn compact(&self, need: usize, evict: bool, now: &mut Now) {
        self.begin_move();
        if let Err(c) = self.try_compact(need, evict, now) {
            self.recover(c);
        }
        self.end_move();
    }

    fn try_compact(&self, need: usize, evict: bool, now: &mut Now) -> Check<()> {
        let bump = self.bump()?;
        let reserved = self.arena_reserved()?;
        let active = self.active_slots()?;
        self.set_hdr(sh::REWRITING, 1);
        let t = now.get();
        // The items counter comes from shared memory: bound it before
        // trusting it as an allocation size.
        let items = (self.hdr(sh::ITEMS) as usize).min(active);
        if evict && self.compact_from_hand(need, bump, reserved, active, items, t)? {
            return Ok(());
        }
        let mut kept = if items.saturating_mul(SPARSE_ARENA_BYTES_PER_ITEM) <= bump {
            self.gather_from_index(bump, active, items)?
        } else {
            self.gather_from_arena(bump, active, items)?
        };
        let (mut live_bytes, expired) = self.drop_expired(&mut kept, t);
        let Survivors { entries, mut visited, tags } = kept;
        let mut keep = vec![true; entries.len()];
        let arena = reserved;
        let (free_bytes_target, max_items) = if evict {
            Self::eviction_targets(need, arena, active)
        } else {
            (0, active * 3 / 4 - 1)
        };
        let mut live_items = entries.len();
        let n = entries.len();
        // SIEVE: start at the hand, wrap around; at most two passes (the
        // first clears every visited bit).
        let hand = self.hdr(sh::HAND) as usize;
        let start = entries.iter().position(|e| e.off >= hand).unwrap_or(0);
        let mut evicted = 0u64;
        let mut idx = start;
        let mut steps = 0;
        let mut stop = start;
        while (arena.saturating_sub(live_bytes) < free_bytes_target || live_items > max_items)
            && n > 0
            && steps < 2 * n + 1
        {
            let e = &entries[idx];
            if keep[idx] {
                if visited[idx] {
                    visited[idx] = false;
                } else {
                    keep[idx] = false;
                    live_bytes -= e.size;
                    live_items -= 1;
                    evicted += 1;
                    let e = *e;
                    self.note_dropped(&e);
                }
            }
            idx = if idx + 1 == n { 0 } else { idx + 1 };
            stop = idx;
            steps += 1;
        }
        // Slide survivors down, preserving order.
        let mut new_off = vec![0usize; n];
        let mut slider = Slider::new(0);
        let mut new_hand = None;
        for (i, e) in entries.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if i >= stop && new_hand.is_none() {
                new_hand = Some(slider.write);
            }
            new_off[i] = slider.keep(self, e);
        }
        let write = slider.flush(self);
        let kept = n as u64 - evicted;
        self.rebuild_index(&tags, &keep, &visited, &new_off, active)?;
        self.set_hdr(sh::BUMP, write as u64);
        self.set_hdr(sh::LIVE_BYTES, write as u64);
        self.set_hdr(sh::ITEMS, kept);
        self.set_hdr(sh::SLOTS_USED, kept);
        self.set_hdr(sh::TOMBSTONES, 0);
        self.set_hdr(sh::HAND, new_hand.unwrap_or(0) as u64);
        self.add_stat(sh::EVICTIONS, evicted);
        self.add_stat(sh::EXPIRATIONS, expired);
        self.bump_stat(sh::COMPACTIONS);
        Ok(())
    }

    /// An evicting compaction of the arena from the SIEVE hand on, when
    /// that part alone can free what the full one would: the entries
    /// before the hand are not read, not moved, and keep their slots. The
    /// survivors behind the hand slide down, their slots are rewritten in
    /// place, and the slots of the entries dropped become tombstones that
    /// are then purged by re-placing the clusters they sit in. Its cost
    /// follows the part of the arena behind the hand, not the whole shard.
    ///
    /// Ok(false), with nothing changed, when it does not apply: the hand
    /// at the start (a full compaction is the same work), dead copies
    /// before the hand worth reclaiming (more than the compaction frees),
    /// or not enough to free behind the hand (the hand has to wrap around).
    #[allow(clippy::too_many_arguments)]
    fn compact_from_hand(
        &self,
        need: usize,
        bump: usize,
        reserved: usize,
        active: usize,
        items: usize,
        t: u64,
    ) -> Check<bool> {
        let hand = self.hdr(sh::HAND) as usize;
        let (free_target, max_items) = Self::eviction_targets(need, reserved, active);
        let live_bytes = (self.hdr(sh::LIVE_BYTES) as usize).min(bump);
        if hand == 0 || hand >= bump || bump - live_bytes > free_target {
            return Ok(false);
        }
        // What lies behind the hand, and the slot of each live entry.
        let mut region = Vec::new();
        let mut off = hand;
        while off < bump {
            let e = self.entry(off, bump)?;
            off += e.size;
            region.push(e);
        }
        let mut slots = vec![usize::MAX; region.len()];
        let mut tags = vec![0u32; region.len()];
        let mut visited = vec![false; region.len()];
        let mut key = Vec::new();
        for (k, e) in region.iter().enumerate() {
            if e.is_dead() {
                continue;
            }
            let tag = tag_of(self.entry_hash(e, &mut key));
            let Some(slot) = self.find_slot(tag, e.off, active)? else {
                return Err(Corrupt("a live entry has no slot"));
            };
            slots[k] = slot;
            tags[k] = tag;
            visited[k] = self.slot(slot) & SLOT_VISITED != 0;
        }
        // Decide before changing anything: dead and expired entries go,
        // then SIEVE evicts from the hand until the targets are met.
        let tombstones = (self.hdr(sh::TOMBSTONES) as usize).min(active);
        let mut drop = vec![false; region.len()];
        let mut freed = 0usize;
        let mut items_after = items;
        let mut expired = 0u64;
        for (k, e) in region.iter().enumerate() {
            if e.is_dead() || e.expired(t) {
                drop[k] = true;
                freed += e.size;
                if !e.is_dead() {
                    items_after = items_after.saturating_sub(1);
                    expired += 1;
                }
            }
        }
        let met = |freed: usize, items_after: usize| {
            reserved.saturating_sub(bump - freed) >= free_target
                && items_after + tombstones <= max_items
        };
        let mut evicted = 0u64;
        let mut stop = region.len();
        for k in 0..region.len() {
            if met(freed, items_after) {
                stop = k;
                break;
            }
            if drop[k] {
                continue;
            }
            if visited[k] {
                visited[k] = false;
            } else {
                drop[k] = true;
                freed += region[k].size;
                items_after = items_after.saturating_sub(1);
                evicted += 1;
            }
        }
        if !met(freed, items_after) {
            return Ok(false);
        }
        // Slide the survivors down and point their slots at them; the
        // slots of the live entries dropped become tombstones.
        let mut slider = Slider::new(hand);
        let mut new_hand = None;
        let mut purge = Vec::new();
        let mut dropped_live_bytes = 0;
        for (k, e) in region.iter().enumerate() {
            if drop[k] {
                if !e.is_dead() {
                    dropped_live_bytes += e.size;
                    self.note_dropped(e);
                    self.set_slot(slots[k], TOMBSTONE);
                    purge.push(slots[k]);
                }
                continue;
            }
            if k >= stop && new_hand.is_none() {
                new_hand = Some(slider.write);
            }
            let at = slider.keep(self, e);
            let mark = if visited[k] { SLOT_VISITED } else { 0 };
            let v = Self::tagged_slot(tags[k], at) | mark;
            if self.slot(slots[k]) != v {
                self.set_slot(slots[k], v);
            }
        }
        let write = slider.flush(self);
        let mut purged = 0;
        for p in purge {
            purged += self.purge_cluster(p, active)?;
        }
        // Every slot this compaction marked was purged (and so were the
        // older tombstones of those clusters); saturating: the counters
        // come from shared memory.
        let tombstones_after =
            (tombstones + evicted as usize + expired as usize).saturating_sub(purged);
        self.set_hdr(sh::BUMP, write as u64);
        self.set_hdr(sh::LIVE_BYTES, live_bytes.saturating_sub(dropped_live_bytes) as u64);
        self.set_hdr(sh::ITEMS, items_after as u64);
        self.set_hdr(sh::TOMBSTONES, tombstones_after as u64);
        self.set_hdr(sh::SLOTS_USED, (items_after + tombstones_after) as u64);
        self.set_hdr(sh::HAND, new_hand.unwrap_or(0) as u64);
        self.add_stat(sh::EVICTIONS, evicted);
        self.add_stat(sh::EXPIRATIONS, expired);
        self.bump_stat(sh::COMPACTIONS);
        Ok(true)
    }

    /// What an evicting compaction must reach: free arena bytes (`need`
    /// at least, and COMPACT_FREE_PERCENT of the reserved arena) and the
    /// most live entries it may leave (COMPACT_FREE_PERCENT below the
    /// index's load limit of 3/4).
    fn eviction_targets(need: usize, reserved: usize, active: usize) -> (usize, usize) {
        (
            need.max(reserved * COMPACT_FREE_PERCENT / 100),
            active * 3 / 4 * (100 - COMPACT_FREE_PERCENT) / 100,
        )
    }

    /// The slot with tag `tag` that leads to the entry at `off`, if any.
    fn find_slot(&self, tag: u32, off: usize, active: usize) -> Check<Option<usize>> {
        let want = Self::tagged_slot(tag, off);
        let mut s = home_slot(tag, active);
        for _ in 0..active {
            match self.slot(s) {
                0 => return Ok(None),
                v if v != TOMBSTONE && v & !SLOT_VISITED == want => return Ok(Some(s)),
                _ => s = next_slot(s, active),
            }
        }
        Ok(None)
    }

    /// Remove the tombstones of the cluster (run of used slots) around
    /// slot `p`: its other slots are cleared and placed again from their
    /// home slots, which lie inside the cluster (linear probing never
    /// crosses an empty slot), so they land inside it. Returns the
    /// tombstones removed (0 if `p` is no longer a tombstone: a cluster
    /// purged before already took it).
    fn purge_cluster(&self, p: usize, active: usize) -> Check<usize> {
        if self.slot(p) != TOMBSTONE {
            return Ok(0);
        }
        let prev = |i: usize| if i == 0 { active - 1 } else { i - 1 };
        let mut start = p;
        let mut len = 1;
        while self.slot(prev(start)) != 0 {
            start = prev(start);
            len += 1;
            if len >= active {
                return Err(Corrupt("index has no empty slot"));
            }
        }
        let mut end = next_slot(p, active);
        while self.slot(end) != 0 {
            end = next_slot(end, active);
            len += 1;
            if len >= active {
                return Err(Corrupt("index has no empty slot"));
            }
        }
        let mut keep = Vec::with_capacity(len);
        let mut s = start;
        for _ in 0..len {
            let v = self.slot(s);
            if v != TOMBSTONE {
                keep.push(v);
            }
            self.set_slot(s, 0);
            s = next_slot(s, active);
        }
        for &v in &keep {
            self.place(v, active, len)?;
        }
        Ok(len - keep.len())
    }

    /// The entries of the used arena not marked dead, in arena order, with
    /// their SIEVE marks and tags: a walk of the arena (each key hashed
    /// again for its tag), then one pass over the index for the marks.
    /// What a compaction of a mostly live shard reads.
    fn gather_from_arena(&self, bump: usize, active: usize, items: usize) -> Check<Survivors> {
        let mut entries = Vec::with_capacity(items + 16);
        let mut tags = Vec::with_capacity(items + 16);
        let mut key = Vec::new();
        let mut off = 0;
        while off < bump {
            let e = self.entry(off, bump)?;
            off += e.size;
            if !e.is_dead() {
                // Hashing the key again (its bytes share the header's
                // cache lines, which the walk has just read) costs less
                // than finding each entry's slot: measured in engine.md.
                tags.push(tag_of(self.entry_hash(&e, &mut key)));
                entries.push(e);
            }
        }
        let visited = self.visited_marks(&EntryStarts::new(&entries, bump), entries.len(), active);
        Ok(Survivors { entries, visited, tags })
    }

    /// As `gather_from_arena`, from the index alone: one pass over the
    /// slots reads each live entry's offset, mark and tag, and the entries
    /// are read at those offsets and sorted back into arena order. A shard
    /// that is mostly dead copies (a few keys overwritten again and again)
    /// is compacted without reading the dead bytes: a 2 MiB shard holding
    /// 30 live entries reads 256 KiB of index instead of 2 MiB of arena.
    /// The slots must lead to distinct, non-overlapping, live entries below
    /// the bump pointer; anything else is corruption (the shard is reset).
    fn gather_from_index(&self, bump: usize, active: usize, items: usize) -> Check<Survivors> {
        let mut found: Vec<(Entry, bool, u32)> = Vec::with_capacity(items + 16);
        for s in 0..active {
            let v = self.slot(s);
            if v == 0 || v == TOMBSTONE {
                continue;
            }
            let e = self.entry(Self::slot_entry_off(v), bump)?;
            if e.is_dead() {
                return Err(Corrupt("index points at a dead entry"));
            }
            found.push((e, v & SLOT_VISITED != 0, Self::slot_tag(v)));
        }
        found.sort_unstable_by_key(|(e, _, _)| e.off);
        let mut end = 0;
        for (e, _, _) in &found {
            if e.off < end {
                return Err(Corrupt("index entries overlap"));
            }
            end = e.off + e.size;
        }
        Ok(Survivors {
            entries: found.iter().map(|f| f.0).collect(),
            visited: found.iter().map(|f| f.1).collect(),
            tags: found.iter().map(|f| f.2).collect(),
        })
    }

    /// Drop the expired entries from what a gatherer found (queueing their
    /// spilled files), in place: the survivors keep their order. Returns
    /// the bytes of the survivors and the count of entries dropped.
    fn drop_expired(&self, kept: &mut Survivors, t: u64) -> (usize, u64) {
        let (mut live_bytes, mut expired) = (0, 0);
        let mut w = 0;
        for r in 0..kept.entries.len() {
            let e = &kept.entries[r];
            if e.expired(t) {
                self.note_dropped(e);
                expired += 1;
                continue;
            }
            live_bytes += e.size;
            if w != r {
                kept.entries[w] = kept.entries[r];
                kept.visited[w] = kept.visited[r];
                kept.tags[w] = kept.tags[r];
            }
            w += 1;
        }
        kept.entries.truncate(w);
        kept.visited.truncate(w);
        kept.tags.truncate(w);
        (live_bytes, expired)
    }

    /// SIEVE's marks for the `n` entries that `starts` locates, read from
    /// the visited bits of the index's slots (one pass over the index).
    fn visited_marks(&self, starts: &EntryStarts, n: usize, active: usize) -> Vec<bool> {
        let mut visited = vec![false; n];
        for s in 0..active {
            let v = self.slot(s);
            if v != TOMBSTONE && v & SLOT_VISITED != 0 {
                if let Some(k) = starts.ordinal(Self::slot_entry_off(v)) {
                    visited[k] = true;
                }
            }
        }
        visited
    }

    /// Rebuild the index of a compacted shard: the kept survivors now lie
    /// at `new_off`. A survivor's home slot is given by the tag its old
    /// slot carried (`home_slot`): no key is read or hashed.
    fn rebuild_index(
        &self,
        tags: &[u32],
        keep: &[bool],
        visited: &[bool],
        new_off: &[usize],
        active: usize,
    ) -> Check<()> {
        if self.zero_index() != active {
            return Err(Corrupt("active slot count changed during compaction"));
        }
        for (i, &tag) in tags.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            // The index was zeroed above and kept entries are fewer than
            // the slots, so a free slot exists; the bound only matters if
            // another program writes into the index meanwhile.
            let mark = if visited[i] { SLOT_VISITED } else { 0 };
            self.place(Self::tagged_slot(tag, new_off[i]) | mark, active, active)?;
        }
        Ok(())
    }

    /// Store slot value `v` in the first empty slot from its home slot, at
    /// most `bound` probes on (an index rewritten under a compaction, by
    /// a program that ignores the lock, is corruption).
    fn place(&self, v: u64, active: usize, bound: usize) -> Check<()> {
        let mut s = home_slot(Self::slot_tag(v), active);
        let mut probes = 0;
        while self.slot(s) != 0 {
            probes += 1;
            if probes > bound {
                return Err(Corrupt("index rewritten during compaction"));
            }
            s = next_slot(s, active);
        }
        self.set_slot(s, v);
        Ok(())
    }

    /// Counters of this shard.
    pub(crate) fn stats(&self) -> ShardStats {
        ShardStats {
            sets: self.hdr(sh::SETS),
            deletes: self.hdr(sh::DELETES),
            evictions: self.hdr(sh::EVICTIONS),
            expirations: self.hdr(sh::EXPIRATIONS),
            resets: self.hdr(sh::RESETS),
            corruptions: self.hdr(sh::CORRUPTIONS),
            lock_timeouts: self.hdr(sh::LOCK_TIMEOUTS),
            salvages: self.hdr(sh::SALVAGES),
            entries_lost: self.hdr(sh::ENTRIES_LOST),
            compactions: self.hdr(sh::COMPACTIONS),
            items: self.hdr(sh::ITEMS),
            live_bytes: self.hdr(sh::LIVE_BYTES),
            used_bytes: self.hdr(sh::BUMP),
            capacity_bytes: self.shard.arena_size as u64,
            held_bytes: self.held_bytes(),
            ..ShardStats::default()
        }
    }

    /// Verify every invariant of the shard. Returns (entries, live bytes).
    pub(crate) fn check(&self) -> std::result::Result<(u64, u64), String> {
        let s = |c: Corrupt| c.0.to_string();
        if self.hdr(sh::SEQ) & 1 == 1 || self.hdr(sh::WRITING) != 0 {
            return Err("shard marked mid-write outside a write".into());
        }
        self.sanity().map_err(s)?;
        let bump = self.bump().map_err(s)?;
        let mut off = 0;
        let mut live = 0u64;
        let mut live_bytes = 0u64;
        while off < bump {
            let e = self.entry(off, bump).map_err(s)?;
            if !e.is_dead() {
                live += 1;
                live_bytes += e.size as u64;
                // The index must lead to exactly this entry.
                let mut key = Vec::new();
                let hash = self.entry_hash(&e, &mut key);
                let p = self.probe(&key, hash, bump).map_err(s)?;
                match p.found {
                    Some((_, f)) if f.off == off => {}
                    _ => {
                        return Err(format!("live entry at {off} is not reachable from the index"))
                    }
                }
            }
            off += e.size;
        }
        let mut used = 0u64;
        let mut tombs = 0u64;
        for i in 0..self.active_slots().map_err(s)? {
            match self.slot(i) {
                0 => {}
                TOMBSTONE => {
                    used += 1;
                    tombs += 1;
                }
                v => {
                    used += 1;
                    let e = self.entry(Self::slot_entry_off(v), bump).map_err(s)?;
                    if e.is_dead() {
                        return Err(format!("slot {i} points at a dead entry"));
                    }
                }
            }
        }
        if live != self.hdr(sh::ITEMS) {
            return Err(format!("items counter {} but {live} live entries", self.hdr(sh::ITEMS)));
        }
        if live_bytes != self.hdr(sh::LIVE_BYTES) {
            return Err(format!(
                "live_bytes counter {} but entries hold {live_bytes}",
                self.hdr(sh::LIVE_BYTES)
            ));
        }
        if used != self.hdr(sh::SLOTS_USED) || tombs != self.hdr(sh::TOMBSTONES) {
            return Err("slot counters disagree with the index".into());
        }
        if used - tombs != live {
            return Err("index holds a different number of entries than the arena".into());
        }
        Ok((live, live_bytes))
    }

    /// Test hook: undo `scribble_mid_write` by resetting the shard.
    pub(crate) fn reset_after_scribble(&self) {
        self.recover(Corrupt("test hook"));
        self.end_move();
        self.end_write();
    }

    /// Test hook: leave the shard half-written (seq odd, scribbled index),
    /// as a process killed mid-write would.
    pub(crate) fn scribble_mid_write(&self) {
        self.begin_write();
        self.begin_move();
        for i in 0..self.shard.slots.min(8) {
            self.set_slot(i, 0x0bad_0bad_0bad_0bad);
        }
    }
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

// ---- live resize (`resize.rs`): sealing a moved shard and copying it out

impl ShardGuard<'_> {
    /// Seal the shard after a resize copied it to the new file: `seq` is
    /// left odd for good, so every optimistic get that overlaps or follows
    /// the seal falls back to the lock, and every locker sees
    /// [`ShardGuard::is_sealed`] and goes to the new file instead.
    pub(crate) fn seal_moved(&self) {
        std::sync::atomic::fence(Ordering::Release);
        self.set_hdr(sh::SEQ, self.hdr(sh::SEQ) | 1);
        std::sync::atomic::fence(Ordering::SeqCst);
    }

    /// Whether the shard was sealed by a resize. Under the lock `seq` is
    /// even unless sealed: a holder that died mid-move left it odd, and
    /// the locker that inherited the lock repaired the shard first.
    pub(crate) fn is_sealed(&self) -> bool {
        self.moving.get() == 0 && self.hdr(sh::SEQ) & 1 == 1
    }

    /// Empty a sealed shard and make it usable again (an abandoned
    /// migration whose new file is gone).
    pub(crate) fn reset_sealed(&self) {
        self.reset_data();
    }

    /// Call `f(key, value bytes, raw flags, expires)` for each live entry,
    /// oldest first (arena order, the eviction order of a FIFO arena). A
    /// spilled entry's value bytes are its reference, and its flags carry
    /// `FLAG_SPILLED`. A shard that fails its checks is reset: what it held
    /// is lost, never copied torn.
    pub(crate) fn for_each_live_raw(
        &self,
        now: &mut Now,
        mut f: impl FnMut(&[u8], &[u8], u32, u64),
    ) {
        let res = (|| {
            let bump = self.bump()?;
            let t = now.get();
            let (mut off, mut key, mut val) = (0, Vec::new(), Vec::new());
            while off < bump {
                let e = self.entry(off, bump)?;
                if !e.is_dead() && !e.expired(t) {
                    key.resize(e.key_len, 0);
                    val.resize(e.val_len, 0);
                    // SAFETY: key and value bytes lie inside the entry that
                    // `entry` checked against the bump pointer.
                    unsafe {
                        self.shard.copy_out(off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len);
                        self.shard.copy_out(e.val_off(), val.as_mut_ptr(), e.val_len);
                    }
                    f(&key, &val, e.flags, e.expires);
                }
                off += e.size;
            }
            Ok(())
        })();
        if let Err(c) = res {
            self.recover(c);
        }
    }
}
