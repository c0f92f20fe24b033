//! The shard's lock and [`ShardGuard`], the locked view every operation
//! runs on, with the header words it reads and writes.
//!
//! Design:
//! * Every write runs under the shard's lock and sets the `WRITING` word
//!   for its duration (`begin_write`/`end_write`). A locker that inherits
//!   the lock from a dead owner and finds `WRITING` set (or `seq` odd)
//!   repairs the shard (`repair.rs`): a cache may lose entries, it never
//!   returns torn data. A guard dropped while unwinding out of a write
//!   repairs the shard the same way before it unlocks.
//! * Writes that move or rewrite bytes a published slot may lead to
//!   (compactions, resets, repairs, in-place counter updates, a `touch`
//!   of the two-word expiry, a growing index) are also bracketed by
//!   `seq += 1` before and after (`begin_move`/`end_move`, which nest), so
//!   `seq` is odd exactly while entries move. Appends, overwrites and
//!   deletes do not touch `seq`: an entry's bytes never change while a
//!   slot leads to it (an overwrite appends a new entry and repoints the
//!   slot in one atomic store; a delete turns the slot into a tombstone),
//!   except the dead mark of an entry being unlinked, one aligned word a
//!   reader sees old or new.
//! * Header words come from shared memory: the bump pointer, the reserved
//!   arena and the active slot count are checked against the shard's
//!   geometry each time they are read (`bump`, `arena_reserved`,
//!   `active_slots`, `sanity`); a failed check is a [`Corrupt`] that
//!   resets the shard. Counters only lockers read are plain volatile
//!   words; the few read without the lock (`seq`, `ITEMS`,
//!   `LOCK_TIMEOUTS`) are atomic loads of aligned words.
//! * A shard a live resize copied to a new file is sealed (`seal_moved`):
//!   `seq` is left odd for good, so every optimistic get that overlaps or
//!   follows the seal falls back to the lock, and a locker finds
//!   `is_sealed` (under the lock `seq` is otherwise even) and goes to the
//!   new file (`resize.rs`).
//! * An unlocked guard (`ShardGuard::unlocked`) is a view for reads
//!   without the lock (optimistic gets, counters) and for initialisation
//!   while no other process has the file mapped: it never unlocks.

use super::policy::Samples;
use super::{Check, Corrupt, Shard};
use crate::error::{Error, Result};
use crate::layout::*;
use crate::lock::{self, Acquired};
use crate::stats::ShardStats;
use std::cell::Cell;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// A locked shard. Unlocks on drop.
pub(crate) struct ShardGuard<'a> {
    pub(super) shard: &'a Shard,
    locked: bool,
    /// Inside this guard's own begin_write/end_write bracket.
    pub(super) writing: Cell<bool>,
    /// Depth of this guard's begin_move/end_move brackets (`seq` is odd
    /// while it is above zero).
    moving: Cell<u32>,
    /// The policy header's mode bits as this guard first read them
    /// (`ShardGuard::mode`; `MODE_UNREAD` before). Small, as every field
    /// here: a guard is returned by value on every write, and a larger
    /// one cost a set a fifth more time in stack copies.
    pub(super) mode_now: Cell<u16>,
    /// Arena bytes this guard's compactions examined (`note_examined`).
    pub(super) examined: Cell<usize>,
    /// The handle's sampled requests, replayed through the shard's
    /// miniatures once the lock is let go (`Shard::lock_sampled`).
    pub(super) samples: Option<&'a Samples>,
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
            if let Some(samples) = self.samples {
                self.shard.replay_samples(samples);
            }
        }
    }
}

impl Shard {
    pub(super) fn lock_word(&self) -> *mut u32 {
        // SAFETY: offset 0 of the shard (page-aligned), inside the mapping.
        unsafe { self.base.add(sh::MUTEX) as *mut u32 }
    }

    /// Whether the shard header still carries its magic (see `sh::MAGIC`).
    pub(super) fn intact(&self) -> bool {
        // SAFETY: sh::MAGIC is inside the shard header.
        unsafe { ptr::read_volatile(self.base.add(sh::MAGIC) as *const u64) == SHARD_MAGIC }
    }

    /// A shard header word (one of the `sh::` offsets), for access
    /// without the lock: an atomic load of a word another process may be
    /// writing yields an old or a new value, never a torn one.
    pub(super) fn header_atomic(&self, field: usize) -> &AtomicU64 {
        debug_assert!(field + 8 <= SHARD_HEADER_SIZE && field % 8 == 0);
        // SAFETY: field is an sh:: offset, so the word is an aligned u64
        // inside the shard header, in the mapping, which outlives self.
        unsafe { AtomicU64::from_ptr(self.base.add(field) as *mut u64) }
    }

    /// Lock the shard, waiting at most `timeout`. A dead previous owner is
    /// repaired here; a wait that runs out is counted in `lock_timeouts`.
    pub(crate) fn lock(&self, timeout: std::time::Duration) -> Result<ShardGuard<'_>> {
        self.lock_sampled(timeout, None)
    }

    /// `lock`, for a write of a handle whose sampled requests are
    /// `samples`: they are replayed through the miniatures once the lock
    /// is let go (`Shard::replay_samples`).
    pub(crate) fn lock_sampled<'a>(
        &'a self,
        timeout: std::time::Duration,
        samples: Option<&'a Samples>,
    ) -> Result<ShardGuard<'a>> {
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
            examined: Cell::new(0),
            mode_now: Cell::new(super::policy::MODE_UNREAD),
            samples,
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
}

impl<'a> ShardGuard<'a> {
    /// A view of `shard` without its lock: for reads that validate what
    /// they read (optimistic gets, counters), and for initialisation
    /// while no other process has the file mapped. Never unlocks.
    pub(super) fn unlocked(shard: &'a Shard) -> Self {
        ShardGuard {
            shard,
            locked: false,
            writing: Cell::new(false),
            moving: Cell::new(0),
            examined: Cell::new(0),
            mode_now: Cell::new(super::policy::MODE_UNREAD),
            samples: None,
        }
    }

    pub(super) fn hdr(&self, field: usize) -> u64 {
        debug_assert!(field + 8 <= SHARD_HEADER_SIZE);
        // SAFETY: field is one of the sh:: constants, inside the header.
        unsafe { ptr::read_volatile(self.shard.base.add(field) as *const u64) }
    }

    pub(super) fn set_hdr(&self, field: usize, v: u64) {
        debug_assert!(field + 8 <= SHARD_HEADER_SIZE);
        // SAFETY: as in hdr; the lock is held.
        unsafe { ptr::write_volatile(self.shard.base.add(field) as *mut u64, v) }
    }

    pub(super) fn bump_stat(&self, field: usize) {
        self.add_stat(field, 1);
    }

    pub(super) fn add_stat(&self, field: usize, n: u64) {
        self.set_hdr(field, self.hdr(field).wrapping_add(n));
    }

    /// Start a write: any change to the shard. Sets `WRITING`, which only
    /// lockers read (a dead owner that left it set left the shard
    /// half-written). Optimistic readers never read this word's cache
    /// line, so an append or a delete does not disturb them.
    pub(super) fn begin_write(&self) {
        self.writing.set(true);
        self.set_hdr(sh::WRITING, 1);
        std::sync::atomic::fence(Ordering::Release);
    }

    pub(super) fn end_write(&self) {
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
    pub(super) fn begin_move(&self) {
        let depth = self.moving.get();
        self.moving.set(depth + 1);
        if depth == 0 {
            self.set_hdr(sh::SEQ, self.hdr(sh::SEQ) | 1);
            std::sync::atomic::fence(Ordering::Release);
        }
    }

    pub(super) fn end_move(&self) {
        let depth = self.moving.get();
        debug_assert!(depth > 0);
        self.moving.set(depth.saturating_sub(1));
        if depth <= 1 {
            std::sync::atomic::fence(Ordering::Release);
            self.set_hdr(sh::SEQ, (self.hdr(sh::SEQ) | 1).wrapping_add(1));
        }
    }

    /// `f` inside a move of its own that moves or rewrites entries:
    /// `REWRITING` is set, and stays set until the write ends, so that a
    /// holder that dies in it leaves the shard to be reset (a conveyor
    /// pass, a step of a strict judgement).
    pub(super) fn in_move<R>(&self, f: impl FnOnce() -> Check<R>) -> Check<R> {
        self.begin_move();
        self.set_hdr(sh::REWRITING, 1);
        let r = f();
        self.end_move();
        r
    }

    /// The reserved arena bytes, checked against the arena size (all of
    /// it in a preallocated file).
    pub(super) fn arena_reserved(&self) -> Check<usize> {
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
    pub(super) fn active_slots(&self) -> Check<usize> {
        if !self.shard.lazy {
            return Ok(self.shard.slots);
        }
        let a = self.hdr(sh::ACTIVE_SLOTS);
        if a < self.shard.initial_active as u64 || a > self.shard.slots as u64 {
            return Err(Corrupt("active slot count out of range"));
        }
        Ok(a as usize)
    }

    /// The bump pointer, checked against the head segment and the
    /// reserved arena (a new head not yet reserved has its bump at its
    /// start: nothing below it is read).
    pub(super) fn bump(&self) -> Check<usize> {
        self.bump_in(self.head()?)
    }

    /// `bump` for the head segment `head` the caller read (below the
    /// segment count): the write path reads the head once.
    pub(super) fn bump_in(&self, head: usize) -> Check<usize> {
        if head >= self.shard.seg_count {
            return Err(Corrupt("head segment out of range"));
        }
        let b = self.hdr(sh::BUMP);
        let start = self.seg_start(head) as u64;
        if b < start || b - start > self.shard.seg_size as u64 || b % ENTRY_ALIGN as u64 != 0 {
            return Err(Corrupt("bump pointer outside the head segment"));
        }
        if b > self.arena_reserved()? as u64 && b != start {
            return Err(Corrupt("bump pointer outside the reserved arena"));
        }
        Ok(b as usize)
    }

    /// Cheap checks of the header words before trusting them.
    pub(super) fn sanity(&self) -> Check<()> {
        self.bump()?;
        self.chain()?;
        let slots = self.active_slots()? as u64;
        if self.hdr(sh::SLOTS_USED) > slots
            || self.hdr(sh::TOMBSTONES) > self.hdr(sh::SLOTS_USED)
            || self.hdr(sh::ITEMS) > slots
            || self.hdr(sh::HAND) > self.shard.arena_size as u64
            || self.hdr(sh::READ) > self.shard.arena_size as u64
        {
            return Err(Corrupt("shard header counters out of range"));
        }
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
            used_bytes: self.used_bytes() as u64,
            max_compaction_bytes: self.hdr(sh::MAX_STEP_BYTES),
            capacity_bytes: self.shard.arena_size as u64,
            held_bytes: self.held_bytes(),
            ..ShardStats::default()
        }
    }
}

// ---- sealing a shard a live resize moved (`resize.rs`)

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
}
