//! The shard's arena: entries appended at the bump pointer, checked each
//! time they are read, and the lazy reservation of its pages.
//!
//! An entry is a 16-byte header (`layout.rs`: meta word with expiry and
//! key length, value length with the dead bit, flags), the key and the
//! value, padded to `ENTRY_ALIGN`. Entries are written whole before the
//! bump pointer covers them and before any slot leads to them (`append`),
//! so the arena below the bump pointer always holds complete entries; a
//! live entry's bytes never change while a slot leads to it, except its
//! dead mark (one aligned word) and writes inside a move.
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
//! A growth that the file system refuses (ENOSPC, EDQUOT, EFBIG) is never
//! an error: the shard evicts within the space it holds, exactly as a full
//! preallocated shard does. A set whose entry exceeds the whole reserved
//! arena fails with `Error::Full` before anything is changed. Since no
//! page is written, or read, before it is reserved, a full tmpfs can never
//! raise SIGBUS. A growth that would leave less of the file system
//! available than the handle's reserve (`OpenOptions::fs_reserve`; one
//! `fstatvfs` per growth step, none once the shard is grown) is refused
//! the same way. `clear` gives a lazy shard's memory back (the pages are
//! punched out after the words are lowered, `release_memory`), and so
//! does `give_back` (`compaction.rs`). Preallocated files (`preallocate`,
//! and every file written before lazy reservation) read both words as
//! "everything".
//!
//! Spilled values (`spill.rs`): an entry flagged `FLAG_SPILLED` holds a
//! reference to a file. An entry that leaves the index is noted
//! (`note_dropped`) and its file removed once the shard lock is released.

use super::{Check, Corrupt, Shard, ShardGuard};
use crate::error::{Error, Result};
use crate::hash::hash_key;
use crate::layout::*;
use crate::spill::{SpillRef, REF_LEN};
use std::cell::RefCell;
use std::ptr;
use std::sync::atomic::Ordering;

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

/// Parsed entry header.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    pub(super) off: usize,
    pub(super) size: usize,
    pub(super) expires: u64,
    pub(super) key_len: usize,
    pub(super) val_len: usize,
    pub(super) flags: u32,
    pub(super) dead: bool,
}

impl Entry {
    pub(super) fn is_dead(&self) -> bool {
        self.dead
    }
    pub(super) fn expired(&self, now: u64) -> bool {
        self.expires != 0 && self.expires <= now
    }
    pub(super) fn val_off(&self) -> usize {
        self.off + ENTRY_HEADER + self.key_len
    }
}

impl Shard {
    /// Reserve the shard's bytes [from, to) in the file (page-rounded),
    /// refused (`ENOSPC`) if it would leave less than the reserve of the
    /// file system available.
    pub(super) fn reserve(&self, from: usize, to: usize) -> std::io::Result<()> {
        let start = from / PAGE * PAGE;
        let end = to.div_ceil(PAGE) * PAGE;
        if end <= start {
            return Ok(());
        }
        crate::file::reserve_keeping(self.fd, self.file_off + start, end - start, self.fs_reserve)
    }

    /// Reserve the shard header and the initial index (lazy files): what
    /// must be held before anything of the shard is written.
    pub(super) fn reserve_initial(&self) -> Result<()> {
        if !self.lazy {
            return Ok(());
        }
        self.reserve(0, self.index_off + self.initial_active * 8).map_err(|e| {
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

    /// # Safety
    /// `off + len` must be within the arena.
    pub(super) unsafe fn copy_out(&self, off: usize, dst: *mut u8, len: usize) {
        debug_assert!(off + len <= self.arena_size);
        // SAFETY: off + len is within the arena (caller's contract) and dst
        // has len writable bytes that cannot overlap the mapping.
        unsafe { ptr::copy_nonoverlapping(self.base.add(self.arena_off + off), dst, len) };
    }
}

impl<'a> ShardGuard<'a> {
    pub(super) fn arena_ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.shard.arena_size);
        // SAFETY: off is within the arena (checked by callers).
        unsafe { self.shard.base.add(self.shard.arena_off + off) }
    }

    /// Lazy files: reserve the arena up to `end` rounded up to a growth
    /// chunk. False if the file system has no room (nothing changed).
    pub(super) fn grow_arena(&self, reserved: usize, end: usize) -> bool {
        let new = end.div_ceil(GROW_CHUNK).saturating_mul(GROW_CHUNK).min(self.shard.arena_size);
        if !self.shard.lazy || new <= reserved {
            return false;
        }
        let a = self.shard.arena_off;
        // The first growth reserves the policy body too (`policy.rs`): it
        // is in use while the arena holds anything.
        let from = if reserved == 0 { self.shard.policy_body_off } else { a + reserved };
        if self.shard.reserve(from, a + new).is_err() {
            return false;
        }
        self.set_hdr(sh::ARENA_RESERVED, new as u64);
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
    pub(super) fn held_bytes(&self) -> u64 {
        if !self.shard.lazy {
            return (self.shard.arena_off + self.shard.arena_size) as u64;
        }
        let active = self.active_slots().unwrap_or(self.shard.initial_active);
        let reserved = self.arena_reserved().unwrap_or(0);
        let index_end = (self.shard.index_off + active * 8).div_ceil(PAGE);
        let mut pages = index_end;
        if reserved > 0 {
            // The policy body is reserved with the first arena bytes.
            let from = (self.shard.policy_body_off / PAGE).max(index_end);
            let to = (self.shard.arena_off + reserved).div_ceil(PAGE);
            pages += to.saturating_sub(from);
        }
        ((pages * PAGE) as u64).saturating_sub(self.hdr(sh::PUNCHED))
    }

    /// Read and check the entry at arena offset `off` (below `bump`).
    pub(super) fn entry(&self, off: usize, bump: usize) -> Check<Entry> {
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

    /// Mark a checked live entry dead (one aligned word) and take it out of
    /// its segment's live count, as `append` put it in.
    pub(super) fn mark_dead(&self, e: &Entry) {
        // SAFETY: e was checked by entry(); the header is inside the arena.
        unsafe {
            ptr::write(self.arena_ptr(e.off + eh::LEN) as *mut u32, e.val_len as u32 | LEN_DEAD)
        }
        self.count_live(e.off, e.size, true);
    }

    /// Write the meta word of the entry header at `p` (two u32 words).
    ///
    /// # Safety
    /// `p` is an entry start inside the reserved arena (a multiple of
    /// ENTRY_ALIGN), with room for the header; the lock is held, and a
    /// published entry's meta is written only inside a move.
    pub(super) unsafe fn write_meta(&self, p: *mut u8, meta: u64) {
        // SAFETY: per the contract above; both words are 4-aligned.
        unsafe {
            ptr::write(p.add(eh::META_LO) as *mut u32, meta as u32);
            ptr::write(p.add(eh::META_HI) as *mut u32, (meta >> 32) as u32);
        }
    }

    /// Cover `len` bytes at arena offset `off` with one dead entry (a
    /// one-byte key, the rest its value): bytes a compaction pass already
    /// judged, so that walks read whole entries (`shard/conveyor.rs`).
    /// `len` is a multiple of `ENTRY_ALIGN` of at least one entry, and
    /// every byte of the range lies in reserved arena that no slot leads to.
    pub(super) fn write_filler(&self, off: usize, len: usize) {
        let val_len = len - ENTRY_HEADER - 1;
        assert!(
            off % ENTRY_ALIGN == 0
                && len >= entry_size(1, 0)
                && entry_size(1, val_len) == len
                && off + len <= self.shard.arena_size
        );
        let p = self.arena_ptr(off);
        // SAFETY: the header lies inside the arena (asserted above) at an
        // entry start; the caller's range is judged bytes under the lock,
        // inside a move; the words are 4-aligned (ENTRY_ALIGN).
        unsafe {
            self.write_meta(p, entry_meta(0, 1));
            ptr::write(p.add(eh::LEN) as *mut u32, val_len as u32 | LEN_DEAD);
            ptr::write(p.add(eh::FLAGS) as *mut u32, 0);
        }
    }

    /// The hash of a checked entry's key, computed again from its bytes
    /// (`key` is scratch space for them).
    pub(super) fn entry_hash(&self, e: &Entry, key: &mut Vec<u8>) -> u64 {
        key.resize(e.key_len, 0);
        // SAFETY: the key bytes lie inside the checked entry.
        unsafe { self.shard.copy_out(e.off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len) };
        hash_key(self.shard.seed, key)
    }

    pub(super) fn key_equals(&self, e: &Entry, key: &[u8]) -> bool {
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

    /// A live entry leaves the index: if it names a spilled file, queue the
    /// file for removal once the lock is released.
    pub(super) fn note_dropped(&self, e: &Entry) {
        if e.flags & FLAG_SPILLED != 0 && e.val_len == REF_LEN {
            let mut raw = [0u8; REF_LEN];
            // SAFETY: the value bytes lie inside the checked entry.
            unsafe { self.shard.copy_out(e.val_off(), raw.as_mut_ptr(), REF_LEN) };
            DROPPED.with(|d| d.borrow_mut().push((self.shard.base as usize, raw)));
        }
    }

    /// Write an entry at arena offset `off`, at the bump pointer, and move
    /// the bump pointer over it. The caller checked `off + size` against
    /// the reserved arena on the very values it passes, and publishes a
    /// slot for the entry afterwards (nothing leads to it before).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn append(
        &self,
        off: usize,
        size: usize,
        key: &[u8],
        value: &[u8],
        flags: u32,
        expires: u64,
    ) {
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
        self.count_live(off, size, false);
    }

    /// Lazy files, on an empty shard: give the memory beyond the initial
    /// index back to the file system. The words are lowered first (an
    /// empty index is valid at any size), then the pages punched out: a
    /// holder killed in between leaves pages held that the words no longer
    /// count, which the next growth reserves again at no cost.
    pub(super) fn release_memory(&self) {
        if !self.shard.lazy || self.hdr(sh::ITEMS) != 0 || self.hdr(sh::BUMP) != 0 {
            return;
        }
        self.set_hdr(sh::ACTIVE_SLOTS, self.shard.initial_active as u64);
        self.set_hdr(sh::ARENA_RESERVED, 0);
        let keep = (self.shard.index_off + self.shard.initial_active * 8).div_ceil(PAGE) * PAGE;
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

    /// Call `f` on every entry not marked dead (live or expired), in arena
    /// order. Reads only.
    pub(super) fn walk_indexed(&self, mut f: impl FnMut(&Entry)) -> Check<()> {
        self.walk_entries(|e| {
            if !e.is_dead() {
                f(e);
            }
            Ok(())
        })
    }

    /// The reference of a spilled entry, None for an inline one (or a
    /// spilled one whose reference does not parse: its get refuses it).
    pub(super) fn spilled_ref(&self, e: &Entry) -> Option<SpillRef> {
        if e.flags & FLAG_SPILLED == 0 || e.val_len != REF_LEN {
            return None;
        }
        let mut raw = [0u8; REF_LEN];
        // SAFETY: the value bytes lie inside the checked entry.
        unsafe { self.shard.copy_out(e.val_off(), raw.as_mut_ptr(), REF_LEN) };
        SpillRef::parse(&raw)
    }
}
