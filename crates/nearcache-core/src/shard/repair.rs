//! Repair: what a shard does after a dead writer, after corruption, and
//! the check of every invariant (`Cache::check`, tests).
//!
//! Design:
//! * Writes append the entry, then advance the bump pointer, then publish
//!   the slot; deletes mark the entry dead before they touch the index. So
//!   after a holder died mid-write (`WRITING` set or `seq` odd), the arena
//!   below the bump pointer holds complete entries, and the live ones are
//!   exactly those not marked dead: `salvage` rebuilds the index and the
//!   counters from them, losing at most the entry being written.
//! * A holder that died while moving or clearing entries (`REWRITING`)
//!   leaves nothing trustworthy: the shard is reset (`reset_data`, a move,
//!   so the generation in versions moves on).
//! * A failed check of a shared word during an operation (`Corrupt`) resets
//!   the shard and counts it (`recover`): a hostile or scribbled file can
//!   lose entries, never make the engine read or write outside the shard.
//! * A sealed shard (`guard.rs`) whose migration was abandoned (its new
//!   file is gone) is emptied and unsealed by `reset_sealed`.
//! * Test hooks (`scribble_mid_write`, `reset_after_scribble`) leave a
//!   shard as a killed writer would, and undo it.

use super::{Check, Corrupt, Probe, ShardGuard};
use crate::layout::*;

impl<'a> ShardGuard<'a> {
    /// Reset the shard to empty (mutex untouched). Counts nothing. Inside
    /// an enclosing write the shard stays marked as mid-write.
    pub(super) fn reset_data(&self) {
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
        self.reset_segments();
        self.reset_policy();
        self.end_move();
        if !nested {
            self.end_write();
        }
    }

    /// Reset after a crash or at initialisation: empty data and an even seq
    /// (whatever write the dead owner left open is over).
    pub(super) fn repair(&self) {
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
    pub(super) fn repair_after_owner_death(&self) -> bool {
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
    pub(super) fn salvage(&self) -> Check<u64> {
        self.begin_write();
        self.begin_move();
        let mut live = Vec::new();
        let walked = self.salvage_segments().and_then(|chain| {
            // The live counts are rebuilt with the index, below.
            if self.segmented() {
                for c in chain {
                    self.set_seg_live(c, 0);
                }
            }
            self.walk_entries(|e| {
                if !e.is_dead() {
                    live.push(*e);
                }
                Ok(())
            })?;
            let active = self.active_slots()?;
            if live.len() > active * 3 / 4 {
                return Err(Corrupt("more live entries than the index holds"));
            }
            Ok(())
        });
        if let Err(c) = walked {
            self.end_move();
            self.end_write();
            return Err(c);
        }
        self.zero_index();
        let mut items = 0u64;
        let mut live_bytes = 0u64;
        let mut key = Vec::new();
        for e in &live {
            let hash = self.entry_hash(e, &mut key);
            // A key found twice (never by our writers; possible in a
            // scribbled file) keeps its later entry.
            let slot = match self.probe(&key, hash, None) {
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
            self.count_live(e.off, e.size, false);
            items += 1;
            live_bytes += e.size as u64;
        }
        self.set_hdr(sh::ITEMS, items);
        self.set_hdr(sh::SLOTS_USED, items);
        self.set_hdr(sh::TOMBSTONES, 0);
        self.set_hdr(sh::LIVE_BYTES, live_bytes);
        if !self.segmented() && self.hdr(sh::HAND) > self.hdr(sh::BUMP) {
            self.set_hdr(sh::HAND, 0);
        }
        self.end_move();
        self.end_write();
        Ok(items)
    }

    /// Handle corruption found during an operation: reset and count it.
    pub(super) fn recover(&self, _why: Corrupt) {
        self.add_stat(sh::ENTRIES_LOST, self.hdr(sh::ITEMS).min(self.shard.slots as u64));
        self.reset_data();
        self.bump_stat(sh::CORRUPTIONS);
        self.bump_stat(sh::RESETS);
    }

    /// Verify every invariant of the shard. Returns (entries, live bytes).
    pub(crate) fn check(&self) -> std::result::Result<(u64, u64), String> {
        if self.hdr(sh::SEQ) & 1 == 1 || self.hdr(sh::WRITING) != 0 {
            return Err("shard marked mid-write outside a write".into());
        }
        self.check_whole()
    }

    /// Every invariant of `check` but the first: what a reader finds
    /// between two moves of a write (whole entries, each reachable from
    /// the index, counters that add up).
    pub(super) fn check_whole(&self) -> std::result::Result<(u64, u64), String> {
        let s = |c: Corrupt| c.0.to_string();
        self.sanity().map_err(s)?;
        self.check_segments()?;
        let mut live = 0u64;
        let mut live_bytes = 0u64;
        let mut unreachable = None;
        let mut seg_live = vec![0u64; self.shard.seg_count];
        self.walk_entries(|e| {
            if !e.is_dead() {
                live += 1;
                live_bytes += e.size as u64;
                seg_live[self.seg_of(e.off)] += e.size as u64;
                // The index must lead to exactly this entry.
                let mut key = Vec::new();
                let hash = self.entry_hash(e, &mut key);
                match self.probe(&key, hash, None)?.found {
                    Some((_, f)) if f.off == e.off => {}
                    _ => {
                        unreachable.get_or_insert(e.off);
                    }
                }
            }
            Ok(())
        })
        .map_err(s)?;
        if let Some(off) = unreachable {
            return Err(format!("live entry at {off} is not reachable from the index"));
        }
        if self.segmented() {
            for seg in self.chain().map_err(s)? {
                if self.seg_live(seg) != seg_live[seg] {
                    return Err(format!(
                        "segment {seg} counts {} live bytes but holds {}",
                        self.seg_live(seg),
                        seg_live[seg]
                    ));
                }
            }
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
                    let off = Self::slot_entry_off(v);
                    let e = self.used_end(off).and_then(|end| self.entry(off, end)).map_err(s)?;
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

impl ShardGuard<'_> {
    /// Empty a sealed shard and make it usable again (an abandoned
    /// migration whose new file is gone).
    pub(crate) fn reset_sealed(&self) {
        self.reset_data();
    }
}
