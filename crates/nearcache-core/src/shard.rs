//! One shard: a robust mutex, an open-addressing slot index and an
//! append-only arena, all inside the shared mapping.
//!
//! Design:
//! * Every operation runs under the shard's mutex ([`ShardGuard`]).
//! * A change to the index or arena is bracketed by `seq += 1` before and
//!   after, so `seq` is odd exactly while the shard is half-written. A
//!   locker that inherits the mutex from a dead owner (`EOWNERDEAD`) and
//!   finds `seq` odd resets the shard: a cache may lose a shard's entries,
//!   it never returns torn data.
//! * Writes append a new entry at the bump pointer and publish its slot
//!   last; the old entry (if any) is marked dead. Deletes leave a
//!   tombstone slot. Nothing is freed in place.
//! * When the arena or the index is full, the shard is compacted: dead and
//!   expired entries are dropped, then SIEVE evicts: the hand walks the
//!   arena from oldest to newest, clearing the "visited" bit that a hit
//!   sets and evicting the first unvisited entries, until a fraction of the
//!   shard is free. Survivors slide down in order (memmove, no scratch
//!   buffer) and the index is rebuilt from the hashes stored in entries.
//! * Nothing read from shared memory is trusted: every slot offset, entry
//!   length and bump value is checked against the shard's geometry before
//!   it is used. A failed check resets the shard (counted in `corruptions`).
//! * No Rust reference is ever created over shared bytes; all access is
//!   through raw pointers, under the lock.

use crate::error::{Error, Result};
use crate::hash::{first_slot, tag_of};
use crate::layout::*;
use crate::lock::{self, Acquired};
use crate::stats::ShardStats;
use std::cell::Cell;
use std::ptr;

/// Percent of the arena (and of the index's load limit) that a compaction
/// frees when it has to evict. Larger: fewer, longer compactions and a
/// smaller average fill; smaller: more frequent compactions. 20% keeps the
/// hit ratio at or above LRU's at the same byte budget (see the hit-ratio
/// tests) while a compaction still moves little data.
pub const COMPACT_FREE_PERCENT: usize = 20;

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
}

// SAFETY: a Shard is a pointer into a MAP_SHARED mapping that outlives it
// (the Region owns the mapping); all access goes through the shard's
// process-shared mutex, which is exactly what makes cross-thread use sound.
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

/// A live entry found by a lookup, valid while the guard is held.
pub struct EntryRef<'g> {
    guard: &'g ShardGuard<'g>,
    val_off: usize,
    val_len: usize,
    flags: u32,
    expires_ms: u64,
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
        // SAFETY: val_off..val_off+val_len was checked to lie inside the
        // arena's used part when this EntryRef was made, and the lock is
        // still held (the EntryRef borrows the guard).
        unsafe { self.guard.shard.copy_out(self.val_off, dst.as_mut_ptr(), self.val_len) }
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
    hash: u64,
    expires: u64,
    key_len: usize,
    val_len: usize,
    flags: u32,
    state: u32,
}

impl Entry {
    fn is_dead(&self) -> bool {
        self.state & STATE_DEAD != 0
    }
    fn expired(&self, now: u64) -> bool {
        self.expires != 0 && self.expires <= now
    }
    fn val_off(&self) -> usize {
        self.off + ENTRY_HEADER + self.key_len
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
    /// that outlives the returned value.
    pub(crate) unsafe fn new(base: *mut u8, geo: &Geometry) -> Shard {
        Shard {
            base,
            slots: geo.slots_per_shard,
            arena_off: geo.arena_offset(),
            arena_size: geo.arena_size(),
        }
    }

    fn mutex(&self) -> *mut libc::pthread_mutex_t {
        // SAFETY: offset 0 of the shard, inside the mapping.
        unsafe { self.base.add(sh::MUTEX) as *mut libc::pthread_mutex_t }
    }

    /// Initialise the mutex and reset the shard. Only while no other process
    /// has the file mapped (creation, or holding the exclusive OFD lock).
    pub(crate) fn init(&self) -> Result<()> {
        // SAFETY: the caller guarantees exclusivity; the header region is
        // SHARD_HEADER_SIZE bytes inside the shard.
        unsafe {
            ptr::write_bytes(self.base, 0, SHARD_HEADER_SIZE);
            lock::init(self.mutex())?;
        }
        let g = ShardGuard { shard: self, locked: false, writing: Cell::new(false) };
        g.repair();
        g.set_hdr(sh::MAGIC, SHARD_MAGIC);
        Ok(())
    }

    /// Re-initialise the mutex of a shard while no other process is
    /// attached (after a reboot or a crash of everyone), keeping the data
    /// unless the shard was left half-written.
    pub(crate) fn reattach_exclusive(&self) -> Result<bool> {
        // SAFETY: exclusive (caller holds the file's exclusive OFD lock).
        unsafe { lock::init(self.mutex())? };
        let g = ShardGuard { shard: self, locked: false, writing: Cell::new(false) };
        let damaged = g.hdr(sh::MAGIC) != SHARD_MAGIC;
        g.set_hdr(sh::MAGIC, SHARD_MAGIC);
        if damaged || g.hdr(sh::SEQ) & 1 == 1 || g.sanity().is_err() {
            g.repair();
            g.bump_stat(sh::RESETS);
            return Ok(true);
        }
        Ok(false)
    }

    /// Whether the shard header still carries its magic (see `sh::MAGIC`).
    fn intact(&self) -> bool {
        // SAFETY: sh::MAGIC is inside the shard header.
        unsafe { ptr::read_volatile(self.base.add(sh::MAGIC) as *const u64) == SHARD_MAGIC }
    }

    /// The live-entry counter, read without the lock (one aligned word) and
    /// bounded by the slot count, since it comes from shared memory.
    pub(crate) fn items_unlocked(&self) -> usize {
        // SAFETY: sh::ITEMS is an aligned u64 inside the shard header; a
        // volatile read of a word another process may be writing yields an
        // old or a new value, never a torn one on the supported targets.
        let n = unsafe { ptr::read_volatile(self.base.add(sh::ITEMS) as *const u64) };
        (n as usize).min(self.slots)
    }

    /// Lock the shard. A dead previous owner is repaired here.
    pub(crate) fn lock(&self) -> Result<ShardGuard<'_>> {
        if !self.intact() {
            return Err(Error::Corrupt(
                "a shard header was zeroed or overwritten by another program (file truncated \
                 and extended, or written over); reopen the cache with recreate"
                    .into(),
            ));
        }
        // SAFETY: the mutex was initialised at creation or attach time and
        // lives as long as the mapping, which outlives self.
        let how = unsafe { lock::lock(self.mutex())? };
        let g = ShardGuard { shard: self, locked: true, writing: Cell::new(false) };
        if how == Acquired::OwnerDied {
            if g.hdr(sh::SEQ) & 1 == 1 || g.sanity().is_err() {
                g.repair();
                g.bump_stat(sh::RESETS);
            }
            // SAFETY: we hold the mutex, obtained with EOWNERDEAD.
            unsafe { lock::make_consistent(self.mutex())? };
        }
        Ok(g)
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
}

impl Drop for ShardGuard<'_> {
    fn drop(&mut self) {
        if self.locked {
            // SAFETY: this guard locked the mutex in Shard::lock.
            unsafe { lock::unlock(self.shard.mutex()) }
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

    fn slot(&self, i: usize) -> u64 {
        debug_assert!(i < self.shard.slots);
        // SAFETY: i is masked by slots-1 by every caller, so the word is
        // inside the index that follows the shard header.
        unsafe { ptr::read(self.shard.base.add(SHARD_HEADER_SIZE + i * 8) as *const u64) }
    }

    fn set_slot(&self, i: usize, v: u64) {
        debug_assert!(i < self.shard.slots);
        // SAFETY: as in slot; the lock is held.
        unsafe { ptr::write(self.shard.base.add(SHARD_HEADER_SIZE + i * 8) as *mut u64, v) }
    }

    fn arena_ptr(&self, off: usize) -> *mut u8 {
        debug_assert!(off <= self.shard.arena_size);
        // SAFETY: off is within the arena (checked by callers).
        unsafe { self.shard.base.add(self.shard.arena_off + off) }
    }

    fn begin_write(&self) {
        self.writing.set(true);
        self.set_hdr(sh::SEQ, self.hdr(sh::SEQ) | 1);
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
    }

    fn end_write(&self) {
        std::sync::atomic::fence(std::sync::atomic::Ordering::Release);
        self.set_hdr(sh::SEQ, (self.hdr(sh::SEQ) | 1).wrapping_add(1));
        self.writing.set(false);
    }

    /// The bump pointer, checked against the arena size.
    fn bump(&self) -> Check<usize> {
        let b = self.hdr(sh::BUMP);
        if b > self.shard.arena_size as u64 || b % 8 != 0 {
            return Err(Corrupt("bump pointer outside the arena"));
        }
        Ok(b as usize)
    }

    /// Cheap checks of the header words before trusting them.
    fn sanity(&self) -> Check<()> {
        self.bump()?;
        let slots = self.shard.slots as u64;
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
        if off % 8 != 0 || off > bump || bump - off < ENTRY_HEADER {
            return Err(Corrupt("entry offset outside the used arena"));
        }
        let p = self.arena_ptr(off);
        // SAFETY: off + ENTRY_HEADER <= bump <= arena_size, checked above.
        let (hash, expires, key_len, val_len, flags, state) = unsafe {
            (
                ptr::read(p.add(eh::HASH) as *const u64),
                ptr::read(p.add(eh::EXPIRES) as *const u64),
                ptr::read(p.add(eh::KEY_LEN) as *const u32) as usize,
                ptr::read(p.add(eh::VAL_LEN) as *const u32) as usize,
                ptr::read(p.add(eh::FLAGS) as *const u32),
                ptr::read(p.add(eh::STATE) as *const u32),
            )
        };
        let size = entry_size(key_len, val_len);
        if key_len == 0 || key_len > MAX_KEY_LEN || size > bump - off {
            return Err(Corrupt("entry length outside the used arena"));
        }
        Ok(Entry { off, size, hash, expires, key_len, val_len, flags, state })
    }

    fn set_state(&self, e: &Entry, state: u32) {
        // SAFETY: e was checked by entry(); the header is inside the arena.
        unsafe { ptr::write(self.arena_ptr(e.off + eh::STATE) as *mut u32, state) }
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
        ((v & 0xffff_ffff).wrapping_sub(1).wrapping_mul(8)) as usize
    }

    fn slot_value(hash: u64, off: usize) -> u64 {
        ((tag_of(hash) as u64) << 32) | (off / 8 + 1) as u64
    }

    /// Find `key` in the index.
    fn probe(&self, key: &[u8], hash: u64, bump: usize) -> Check<Probe> {
        let mask = self.shard.slots - 1;
        let tag = tag_of(hash);
        let mut i = first_slot(hash, mask);
        let mut free_slot = None;
        for _ in 0..self.shard.slots {
            let v = self.slot(i);
            if v == 0 {
                return Ok(Probe { found: None, free_slot: free_slot.or(Some(i)) });
            }
            if v == TOMBSTONE {
                free_slot.get_or_insert(i);
            } else if (v >> 32) as u32 == tag {
                let e = self.entry(Self::slot_entry_off(v), bump)?;
                if e.hash == hash && self.key_equals(&e, key) {
                    if e.is_dead() {
                        return Err(Corrupt("index points at a dead entry"));
                    }
                    return Ok(Probe { found: Some((i, e)), free_slot });
                }
            }
            i = (i + 1) & mask;
        }
        Ok(Probe { found: None, free_slot })
    }

    /// Remove the entry in slot `i` (it becomes a tombstone).
    fn unlink(&self, i: usize, e: &Entry) {
        self.set_state(e, e.state | STATE_DEAD);
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
        // SAFETY: the index is slots*8 bytes right after the shard header.
        unsafe {
            ptr::write_bytes(self.shard.base.add(SHARD_HEADER_SIZE), 0, self.shard.slots * 8);
        }
        for f in [sh::BUMP, sh::LIVE_BYTES, sh::ITEMS, sh::SLOTS_USED, sh::TOMBSTONES, sh::HAND] {
            self.set_hdr(f, 0);
        }
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

    /// Handle corruption found during an operation: reset and count it.
    fn recover(&self, _why: Corrupt) {
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
            Some((_, e)) => {
                if e.state & STATE_VISITED == 0 {
                    self.set_state(&e, e.state | STATE_VISITED);
                }
                self.bump_stat(sh::HITS);
                Some(f(EntryRef {
                    guard: self,
                    val_off: e.val_off(),
                    val_len: e.val_len,
                    flags: e.flags,
                    expires_ms: e.expires,
                }))
            }
            None => {
                self.bump_stat(sh::MISSES);
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
    ) -> bool {
        let existing = self.lookup_live(key, hash, now);
        match (mode, &existing) {
            (SetMode::IfAbsent, Some(_)) | (SetMode::IfPresent, None) => return false,
            _ => {}
        }
        let size = entry_size(key.len(), value.len());
        self.begin_write();
        if let Some((i, e)) = existing {
            // The old value is being replaced whatever happens next.
            self.unlink(i, &e);
        }
        self.insert(key, hash, value, flags, expires, size, now);
        self.bump_stat(sh::SETS);
        self.end_write();
        true
    }

    /// Append a new entry for a key known to be absent. Inside begin/end.
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
    ) {
        let max_load = self.shard.slots * 3 / 4;
        let fits = |g: &Self| -> Check<bool> {
            Ok(g.bump()? + size <= g.shard.arena_size
                && (g.hdr(sh::SLOTS_USED) as usize) < max_load)
        };
        match fits(self) {
            Ok(true) => {}
            Ok(false) => self.compact(size, now),
            Err(c) => self.recover(c),
        }
        // After compaction (or a reset) there is room: compaction frees at
        // least `size` bytes and a quarter of the slots.
        let slot = match self.bump().and_then(|b| self.probe(key, hash, b)) {
            Ok(p) => p.free_slot,
            Err(c) => {
                self.recover(c);
                Some(first_slot(hash, self.shard.slots - 1))
            }
        };
        let Some(slot) = slot else {
            // Index full of tombstones and nothing found: compaction clears
            // tombstones, so this cannot happen after it; be safe anyway.
            self.recover(Corrupt("index has no free slot"));
            return self.insert(key, hash, value, flags, expires, size, now);
        };
        let off = self.bump().unwrap_or(0);
        debug_assert!(off + size <= self.shard.arena_size);
        let p = self.arena_ptr(off);
        // SAFETY: off + size <= arena_size (room ensured above); we write
        // the header, key and value into the unused tail of the arena.
        unsafe {
            ptr::write(p.add(eh::HASH) as *mut u64, hash);
            ptr::write(p.add(eh::EXPIRES) as *mut u64, expires);
            ptr::write(p.add(eh::KEY_LEN) as *mut u32, key.len() as u32);
            ptr::write(p.add(eh::VAL_LEN) as *mut u32, value.len() as u32);
            ptr::write(p.add(eh::FLAGS) as *mut u32, flags);
            ptr::write(p.add(eh::STATE) as *mut u32, 0);
            ptr::copy_nonoverlapping(key.as_ptr(), p.add(ENTRY_HEADER), key.len());
            ptr::copy_nonoverlapping(value.as_ptr(), p.add(ENTRY_HEADER + key.len()), value.len());
        }
        self.set_hdr(sh::BUMP, (off + size) as u64);
        self.add_stat(sh::LIVE_BYTES, size as u64);
        self.add_stat(sh::ITEMS, 1);
        let prev = self.slot(slot);
        if prev == TOMBSTONE {
            self.set_hdr(sh::TOMBSTONES, self.hdr(sh::TOMBSTONES).saturating_sub(1));
        } else {
            self.add_stat(sh::SLOTS_USED, 1);
        }
        // Publish last.
        self.set_slot(slot, Self::slot_value(hash, off));
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
            guard: self,
            val_off: e.val_off(),
            val_len: e.val_len,
            flags: e.flags,
            expires_ms: e.expires,
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
                // SAFETY: header of a checked entry; the lock is held. A
                // single aligned word: no seq bracket needed.
                unsafe { ptr::write(self.arena_ptr(e.off + eh::EXPIRES) as *mut u64, expires) };
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
                // SAFETY: as above; a single word written under the lock.
                unsafe { ptr::write_unaligned(p, new.to_le_bytes()) };
                self.bump_stat(sh::SETS);
                Ok(new)
            }
            None => {
                let start = initial.ok_or(Error::NotFound)?;
                let new = start.checked_add(delta).ok_or(Error::Overflow)?;
                self.begin_write();
                let size = entry_size(key.len(), 8);
                self.insert(key, hash, &new.to_le_bytes(), counter_flag, expires, size, now);
                self.bump_stat(sh::SETS);
                self.end_write();
                Ok(new)
            }
        }
    }

    /// Drop every entry.
    pub(crate) fn clear(&self) {
        let items = self.hdr(sh::ITEMS);
        self.reset_data();
        self.add_stat(sh::DELETES, items);
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
                    f(
                        &key,
                        &Entry0 { value_len: e.val_len, flags: e.flags, expires_ms: e.expires },
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

    /// Compact: drop dead and expired entries, then SIEVE-evict until at
    /// least `need` bytes and COMPACT_FREE_PERCENT of the arena and of the
    /// index load limit are free. Inside begin/end_write.
    fn compact(&self, need: usize, now: &mut Now) {
        if let Err(c) = self.try_compact(need, now) {
            self.recover(c);
        }
    }

    fn try_compact(&self, need: usize, now: &mut Now) -> Check<()> {
        let bump = self.bump()?;
        let t = now.get();
        // The items counter comes from shared memory: bound it before
        // trusting it as an allocation size.
        let cap = (self.hdr(sh::ITEMS) as usize).min(self.shard.slots) + 16;
        let mut entries: Vec<Entry> = Vec::with_capacity(cap);
        let mut keep: Vec<bool> = Vec::with_capacity(entries.capacity());
        let mut off = 0;
        let mut live_bytes = 0usize;
        let mut expired = 0u64;
        while off < bump {
            let e = self.entry(off, bump)?;
            off += e.size;
            if e.is_dead() {
                continue;
            }
            if e.expired(t) {
                expired += 1;
                continue;
            }
            live_bytes += e.size;
            entries.push(e);
            keep.push(true);
        }
        let arena = self.shard.arena_size;
        let free_bytes_target = need.max(arena * COMPACT_FREE_PERCENT / 100);
        let max_items = self.shard.slots * 3 / 4 * (100 - COMPACT_FREE_PERCENT) / 100;
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
        while (arena - live_bytes < free_bytes_target || live_items > max_items)
            && steps < 2 * n + 1
        {
            let e = &mut entries[idx];
            if keep[idx] {
                if e.state & STATE_VISITED != 0 {
                    e.state &= !STATE_VISITED;
                } else {
                    keep[idx] = false;
                    live_bytes -= e.size;
                    live_items -= 1;
                    evicted += 1;
                }
            }
            idx = if idx + 1 == n { 0 } else { idx + 1 };
            stop = idx;
            steps += 1;
        }
        // Slide survivors down, preserving order; rebuild the index.
        // SAFETY: the index is slots*8 bytes right after the shard header.
        unsafe {
            ptr::write_bytes(self.shard.base.add(SHARD_HEADER_SIZE), 0, self.shard.slots * 8);
        }
        let mask = self.shard.slots - 1;
        let mut write = 0usize;
        let mut new_hand = None;
        for (i, e) in entries.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if i >= stop && new_hand.is_none() {
                new_hand = Some(write);
            }
            if e.off != write {
                // SAFETY: both ranges are inside the used arena (write <=
                // e.off, e.off + size <= bump); ptr::copy handles overlap.
                unsafe { ptr::copy(self.arena_ptr(e.off), self.arena_ptr(write), e.size) };
            }
            // SAFETY: the moved header is inside the arena.
            unsafe { ptr::write(self.arena_ptr(write + eh::STATE) as *mut u32, e.state) };
            let mut s = first_slot(e.hash, mask);
            while self.slot(s) != 0 {
                s = (s + 1) & mask;
            }
            self.set_slot(s, Self::slot_value(e.hash, write));
            write += e.size;
        }
        let kept = n as u64 - evicted;
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

    /// Counters of this shard.
    pub(crate) fn stats(&self) -> ShardStats {
        ShardStats {
            hits: self.hdr(sh::HITS),
            misses: self.hdr(sh::MISSES),
            sets: self.hdr(sh::SETS),
            deletes: self.hdr(sh::DELETES),
            evictions: self.hdr(sh::EVICTIONS),
            expirations: self.hdr(sh::EXPIRATIONS),
            resets: self.hdr(sh::RESETS),
            corruptions: self.hdr(sh::CORRUPTIONS),
            compactions: self.hdr(sh::COMPACTIONS),
            items: self.hdr(sh::ITEMS),
            live_bytes: self.hdr(sh::LIVE_BYTES),
            used_bytes: self.hdr(sh::BUMP),
            capacity_bytes: self.shard.arena_size as u64,
        }
    }

    /// Verify every invariant of the shard. Returns (entries, live bytes).
    pub(crate) fn check(&self) -> std::result::Result<(u64, u64), String> {
        let s = |c: Corrupt| c.0.to_string();
        if self.hdr(sh::SEQ) & 1 == 1 {
            return Err("seq is odd outside a write".into());
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
                let mut key = vec![0u8; e.key_len];
                // SAFETY: key bytes inside the checked entry.
                unsafe { self.shard.copy_out(off + ENTRY_HEADER, key.as_mut_ptr(), e.key_len) };
                let p = self.probe(&key, e.hash, bump).map_err(s)?;
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
        for i in 0..self.shard.slots {
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
        self.end_write();
    }

    /// Test hook: leave the shard half-written (seq odd, scribbled index),
    /// as a process killed mid-write would.
    pub(crate) fn scribble_mid_write(&self) {
        self.begin_write();
        for i in 0..self.shard.slots.min(8) {
            self.set_slot(i, 0x0bad_0bad_0bad_0bad);
        }
    }
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

/// Unix time in milliseconds.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
