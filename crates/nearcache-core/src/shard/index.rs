//! The shard's index: open addressing with linear probing over 8-byte
//! slot words that follow the shard header.
//!
//! Layout of a slot: `tag (31 bits) | visited (1 bit) | offset / ENTRY_ALIGN
//! + 1 (32 bits)`; 0 is empty, `TOMBSTONE` a deleted key (`layout.rs`).
//! * The tag is 31 bits of the key's hash and gives the home slot
//!   (`home_slot`), so a slot can be placed again (a purge, a rebuild)
//!   without reading or hashing the key, and a probe compares keys only
//!   when the tags match.
//! * The visited bit is SIEVE's mark, set by a hit with a compare-and-swap
//!   on the slot only while it is clear (`mark_visited`): a hit writes
//!   nothing shared once its entry is marked. Every access to a slot is
//!   atomic for that reason.
//! * Probes and rebuilds wrap around at `ACTIVE_SLOTS` (lazy files: the
//!   slots in use, doubled at the load limit of 3/4) and never read a slot
//!   beyond it; every probe is bounded by that count, so an index without
//!   an empty slot (a hostile file) cannot loop forever.
//! * Tombstones are removed cluster by cluster (`purge_cluster`): linear
//!   probing never crosses an empty slot, so the slots of a cluster land
//!   inside it again.

use super::{Check, Corrupt, Entry, ShardGuard};
use crate::hash::{home_slot, next_slot, tag_of};
use crate::layout::*;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};

/// Outcome of an index probe.
pub(super) struct Probe {
    /// Slot and entry of the key, if present (maybe expired).
    pub(super) found: Option<(usize, Entry)>,
    /// First reusable slot on the probe path (tombstone or empty).
    pub(super) free_slot: Option<usize>,
}

impl<'a> ShardGuard<'a> {
    /// Ask the CPU to bring the home slot of `tag` into its cache: a walk
    /// that will look several entries' slots up (the conveyor's pass)
    /// issues these ahead, so that their cache misses overlap instead of
    /// following one another. Only a hint: nothing is read or written.
    #[inline]
    pub(super) fn prefetch_home_slot(&self, tag: u32, active: usize) {
        // home_slot stays below active, as slot_word requires.
        let word = self.slot_word(home_slot(tag, active));
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
            // SAFETY: the address is a slot word inside the mapped index
            // (slot_word); a prefetch reads nothing the program sees and
            // cannot fault.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(word.as_ptr() as *const i8) };
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = word;
    }

    /// Index slot `i` as an atomic word: readers without the lock set its
    /// visited bit with a compare-and-swap (`mark_visited`), so every
    /// access to a slot is atomic.
    fn slot_word(&self, i: usize) -> &AtomicU64 {
        debug_assert!(i < self.shard.slots);
        // SAFETY: every caller passes i < active <= slots (home_slot and
        // next_slot stay below the active count, which active_slots()
        // checks against slots; scans run over 0..active), so the word is
        // inside the index (at index_off, after the segment table); index words are
        // 8-byte aligned (the shard and its header are), live as long as
        // the mapping, and are only ever accessed atomically.
        unsafe { &*(self.shard.base.add(self.shard.index_off + i * 8) as *const AtomicU64) }
    }

    /// Slot `i`, read once.
    pub(super) fn slot(&self, i: usize) -> u64 {
        self.slot_word(i).load(Ordering::Relaxed)
    }

    /// Write slot `i` (under the lock).
    pub(super) fn set_slot(&self, i: usize, v: u64) {
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
    pub(super) fn mark_visited(&self, i: usize, off: usize) {
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

    pub(super) fn slot_entry_off(v: u64) -> usize {
        ((v & 0xffff_ffff).wrapping_sub(1).wrapping_mul(ENTRY_ALIGN as u64)) as usize
    }

    /// A slot leading to the entry at `off` (not marked visited).
    pub(super) fn slot_value(hash: u64, off: usize) -> u64 {
        Self::tagged_slot(tag_of(hash), off)
    }

    /// A slot with tag `tag` leading to the entry at `off` (not marked
    /// visited).
    pub(super) fn tagged_slot(tag: u32, off: usize) -> u64 {
        ((tag as u64) << 32) | (off / ENTRY_ALIGN + 1) as u64
    }

    /// The tag of a (non-empty, non-tombstone) slot.
    pub(super) fn slot_tag(v: u64) -> u32 {
        ((v & !SLOT_VISITED) >> 32) as u32
    }

    /// Find `key` in the index. Entries are checked against `bound`, the
    /// reserved arena, by the lock-free reader and by the write path; or,
    /// with None, against the used part of their segment (`used_end`): a
    /// stricter check, for repairs and `check`, that costs a segment
    /// lookup per entry probed (about 40 instructions per set). A slot
    /// that leads past the used part of its segment is a hostile file's
    /// (no writer publishes one): its bytes then parse within the
    /// reserved arena, as they would for the lock-free reader.
    pub(super) fn probe(&self, key: &[u8], hash: u64, bound: Option<usize>) -> Check<Probe> {
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
                let off = Self::slot_entry_off(v);
                let e = match bound {
                    Some(b) => self.entry(off, b)?,
                    None => self.entry(off, self.used_end(off)?)?,
                };
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

    /// Zero the index's active slots (the rest is a hole in a lazy file,
    /// zero and never written). A corrupt slot count falls back to the
    /// initial one, which is always reserved. Returns the active count.
    pub(super) fn zero_index(&self) -> usize {
        let active = self.active_slots().unwrap_or_else(|_| {
            self.set_hdr(sh::ACTIVE_SLOTS, self.shard.initial_active as u64);
            self.shard.initial_active
        });
        // SAFETY: the index is slots*8 bytes at index_off (after the segment table)
        // and active <= slots; in a lazy file these words are reserved.
        unsafe { ptr::write_bytes(self.shard.base.add(self.shard.index_off), 0, active * 8) };
        active
    }

    /// Lazy files: double the index (up to its full size). Reserves the new
    /// slots; the caller rebuilds the index (a compaction) inside the same
    /// write.
    pub(super) fn grow_index(&self, active: usize) -> bool {
        if !self.shard.lazy || active >= self.shard.slots {
            return false;
        }
        let new = (active * 2).min(self.shard.slots);
        let base = self.shard.index_off;
        if self.shard.reserve(base + active * 8, base + new * 8).is_err() {
            return false;
        }
        // The index is stale until the compaction that follows rebuilds it.
        self.set_hdr(sh::REWRITING, 1);
        self.set_hdr(sh::ACTIVE_SLOTS, new as u64);
        true
    }

    /// Remove the entry in slot `i` (it becomes a tombstone).
    pub(super) fn unlink(&self, i: usize, e: &Entry) {
        self.note_dropped(e);
        self.mark_dead(e);
        self.set_slot(i, TOMBSTONE);
        self.add_stat(sh::TOMBSTONES, 1);
        self.set_hdr(sh::ITEMS, self.hdr(sh::ITEMS).saturating_sub(1));
        self.set_hdr(sh::LIVE_BYTES, self.hdr(sh::LIVE_BYTES).saturating_sub(e.size as u64));
    }

    /// The index slot that points at entry `e`.
    pub(super) fn slot_of(&self, e: &Entry) -> Check<Option<usize>> {
        let active = self.active_slots()?;
        let hash = self.entry_hash(e, &mut Vec::new());
        self.find_slot(tag_of(hash), e.off, active)
    }

    /// The slot with tag `tag` that leads to the entry at `off`, if any.
    pub(super) fn find_slot(&self, tag: u32, off: usize, active: usize) -> Check<Option<usize>> {
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
    /// `keep` is scratch space, reused across calls (a pass purges up to
    /// a hundred clusters).
    pub(super) fn purge_cluster(
        &self,
        p: usize,
        active: usize,
        keep: &mut Vec<u64>,
    ) -> Check<usize> {
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
        keep.clear();
        let mut s = start;
        for _ in 0..len {
            let v = self.slot(s);
            if v != TOMBSTONE {
                keep.push(v);
            }
            self.set_slot(s, 0);
            s = next_slot(s, active);
        }
        for &v in keep.iter() {
            self.place(v, active, len)?;
        }
        Ok(len - keep.len())
    }

    /// Store slot value `v` in the first empty slot from its home slot, at
    /// most `bound` probes on (an index rewritten under a compaction, by
    /// a program that ignores the lock, is corruption).
    pub(super) fn place(&self, v: u64, active: usize, bound: usize) -> Check<()> {
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

    /// Rebuild the index of a compacted shard: the kept survivors now lie
    /// at `new_off`. A survivor's home slot is given by the tag its old
    /// slot carried (`home_slot`): no key is read or hashed.
    pub(super) fn rebuild_index(
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
}
