//! The conveyor: eviction and compaction of a segmented arena in passes
//! of bounded size, paid as the head fills.
//!
//! Design (`segments.rs` has the segments themselves):
//! * Two cursors walk the segments in use from oldest to newest, never
//!   into the head: the read cursor `READ` (the next entry to judge) and
//!   the write cursor `HAND` (where the next survivor goes). Each entry
//!   the read cursor passes is judged as SIEVE judges it (dead and expired
//!   entries go; when evicting, unvisited ones go and visited ones stay
//!   with their mark cleared) and a survivor is copied down to the write
//!   cursor, its slot rewritten in place; a dropped live entry's slot
//!   becomes a tombstone. Survivors keep their order (SIEVE's, not
//!   CLOCK's), which is the merge of Segcache (NSDI '21) made continuous.
//! * The write cursor is in segment `w`, the read cursor in `r`, and `r`
//!   is `w` or the segment after it. When the read cursor leaves `r` and
//!   `r` is not `w`, `r` holds nothing any more: it leaves the chain for
//!   the free list. That is how segments come free. When it leaves `w`
//!   itself, `w` ends where its survivors end. When the read cursor
//!   reaches the head it wraps: both cursors go to the tail. A lenient
//!   pass (not a strict shard's) wraps once before the young segments,
//!   the newest twelfth of the chain or half of it (`young_segment`,
//!   `young_share`), so a new entry is
//!   not evicted before that much was appended after it.
//! * A pass judges entries for a bounded number of bytes (`STEP_BUDGET`)
//!   inside one move (`seq` odd, `REWRITING` set), so that a reader waits
//!   for at most one pass. Between passes every segment in use is a
//!   sequence of whole entries: the bytes between the cursors that the
//!   pass already judged are covered by one dead filler entry (`w == r`:
//!   from the write cursor to the read cursor; else from the start of `r`
//!   to the read cursor), so every walk (repair, `check`, resize, the
//!   spill sweep) reads the segments as it always did.
//! * Pay as you go: once every segment is in use and the free list is
//!   empty, while the last `1 / KEEP_AHEAD_WINDOW` (an eighth) of the head fills, a
//!   write whose append crosses a `STEP_BUDGET / KEEP_AHEAD` boundary of
//!   the arena runs one pass (`keep_ahead`), which stops at the first
//!   segment it frees. That window's passes judge `MERGE_SEGMENTS`
//!   segments, more than a segment costs to free (see below), so a free
//!   segment is normally ready when the head fills, and it is freed late
//!   enough not to sit empty for long (an empty segment is memory that
//!   holds no entry). When none is ready, the write that fills the head
//!   runs passes (each its own move) until one frees (`step`).
//! * Progress is bounded: `SINCE_FREE` counts the bytes judged since a
//!   segment last came free; past `MERGE_SEGMENTS - 1` segments of them
//!   an evicting pass evicts every live entry it reads until a segment
//!   frees (visited or not), as the merge of a fixed number of segments
//!   did before. A shard whose live entries fill less than 90% of its
//!   segments' room (the rest dead copies of overwritten entries and
//!   deleted ones) evicts nothing in the first two segments judged since
//!   a segment came free: dead bytes go first, as a compaction of a shard
//!   of one segment does (`COMPACT_FREE_PERCENT`).
//! * A pass looks up the index slot of every live entry it reads, a
//!   cache miss each in an index of any size. It hashes the next live
//!   entries ahead of the read cursor and prefetches their home slots
//!   (`Lookahead`), so that the misses overlap: a pass of 80 entries of
//!   200 bytes took 15 us instead of 22.
//! * Every word is checked: cursors that do not describe a valid state
//!   (a hostile or stale file) are put back at the tail, which is always
//!   safe because every segment is whole entries between passes; entries
//!   are parsed with the same checks as everywhere.

use super::compaction::COMPACT_FREE_PERCENT;
use super::segments::Dropped;
use super::{Check, Corrupt, Entry, Now, ShardGuard};
use crate::hash::tag_of;
use crate::layout::*;
use std::collections::VecDeque;
use std::ptr;

/// What one pass did.
#[derive(Default)]
pub(super) struct Pass {
    /// A segment went to the free list.
    pub(super) freed: bool,
    /// Arena bytes judged.
    pub(super) examined: usize,
    /// Nothing to judge: the chain is the head alone, or a wrap found
    /// nothing to do.
    pub(super) stuck: bool,
}

/// The most segments a lenient pass keeps young (`young_segment`): 16 MiB
/// of 256 KiB segments, a twelfth of a shard of 192 MiB; larger shards
/// keep a smaller share young, so that the walk that tells stays short.
const MAX_YOUNG_SEGMENTS: usize = 64;

/// The arena bytes whose crossing pays one pass (`keep_ahead`): a power
/// of two, so that the test is a shift.
const CHUNK: u64 = (STEP_BUDGET / KEEP_AHEAD) as u64;
const _: () = assert!(CHUNK.is_power_of_two());

/// What passing over a segment of nothing but dead bytes costs a pass's
/// budget: about one entry's header read, so that a pass that frees many
/// such segments stays bounded by its budget like any other.
const SKIP_COST: usize = 64;

/// How many live entries ahead of the read cursor a pass hashes and whose
/// home slots it prefetches: a pass looks up the slot of every live entry
/// it reads, each a cache miss in an index of any size, and eight in
/// flight hide most of them.
const LOOKAHEAD: usize = 8;

/// The tags of the live entries just ahead of the read cursor, each hashed
/// once and its home slot prefetched (also a strict judgement's two walks
/// over the head, `judge_head`). Only a cache: an entry whose tag is
/// not queued (the first of a segment, one after a skip) is hashed where
/// it is, and the queue starts again after it.
#[derive(Default)]
pub(super) struct Lookahead {
    /// (arena offset, tag) of the entries ahead, in arena order.
    tags: VecDeque<(usize, u32)>,
    /// Arena offset of the next entry to look at.
    next: usize,
    key: Vec<u8>,
}

impl Lookahead {
    /// The tag of live entry `e`, read by the pass in segment bytes ending
    /// at `end`; hashes and prefetches the live entries after it.
    pub(super) fn tag_of(
        &mut self,
        g: &ShardGuard<'_>,
        e: &Entry,
        end: usize,
        active: usize,
    ) -> u32 {
        let tag = match self.tags.front() {
            Some(&(off, tag)) if off == e.off => {
                self.tags.pop_front();
                tag
            }
            _ => {
                self.tags.clear();
                self.next = e.off + e.size;
                tag_of(g.entry_hash(e, &mut self.key))
            }
        };
        // Dead entries ahead are passed over, but count: the look-ahead
        // reads a bounded number of headers per entry judged.
        let mut looked = 0;
        while self.tags.len() < LOOKAHEAD && self.next < end && looked < 2 * LOOKAHEAD {
            looked += 1;
            // An entry that fails its checks stops the look-ahead; the
            // pass meets it and deals with it.
            let Ok(ahead) = g.entry(self.next, end) else {
                self.next = end;
                break;
            };
            self.next += ahead.size;
            if !ahead.is_dead() {
                let t = tag_of(g.entry_hash(&ahead, &mut self.key));
                g.prefetch_home_slot(t, active);
                self.tags.push_back((ahead.off, t));
            }
        }
        tag
    }
}

/// The conveyor's cursors as segment and offset within it.
#[derive(Clone, Copy)]
struct Cursors {
    w: usize,
    wp: usize,
    r: usize,
    rp: usize,
}

impl<'a> ShardGuard<'a> {
    /// The cursors as stored, if they describe a state the conveyor
    /// leaves between passes (checked against the chain's words).
    fn stored_cursors(&self, head: usize) -> Check<Option<Cursors>> {
        let size = self.shard.seg_size;
        let (wh, rh) = (self.hdr(sh::HAND) as usize, self.hdr(sh::READ) as usize);
        let (w, wp, r, rp) = (wh / size, wh % size, rh / size, rh % size);
        let fresh = self.fresh()?;
        if w >= fresh || r >= fresh || w == head {
            return Ok(None);
        }
        let ok = if r == w {
            wp <= rp && rp <= self.seg_used(w)?
        } else {
            self.seg_next(w)? == Some(r)
                && wp == self.seg_used(w)?
                && (r != head && rp <= self.seg_used(r)? || r == head && rp == 0)
        };
        let aligned = rp % ENTRY_ALIGN == 0 && wp % ENTRY_ALIGN == 0;
        Ok((ok && aligned).then_some(Cursors { w, wp, r, rp }))
    }

    /// The cursors, or both at the tail when the stored ones do not
    /// describe a valid state (a fresh or reset shard, a hostile file).
    fn cursors(&self, head: usize, tail: usize) -> Check<Cursors> {
        let at_tail = Cursors { w: tail, wp: 0, r: tail, rp: 0 };
        Ok(self.stored_cursors(head)?.unwrap_or(at_tail))
    }

    /// For `check`: the cursors are valid, or untouched since a reset
    /// (both 0), or the chain is the head alone.
    pub(super) fn check_cursors(&self) -> std::result::Result<(), String> {
        let head = self.head().map_err(|c| c.0.to_string())?;
        let tail = self.seg_hdr(sh::TAIL).map_err(|c| c.0.to_string())?;
        let fresh_state = self.hdr(sh::HAND) == 0 && self.hdr(sh::READ) == 0;
        match self.stored_cursors(head).map_err(|c| c.0.to_string())? {
            Some(_) => Ok(()),
            None if fresh_state || tail == head => Ok(()),
            None => Err(format!(
                "conveyor cursors out of step: hand {} read {}",
                self.hdr(sh::HAND),
                self.hdr(sh::READ)
            )),
        }
    }

    /// The bytes a survivor may fill in segment `s`: the segment, or less
    /// in a lazy file whose reserved mark lies inside it.
    fn seg_cap(&self, s: usize, reserved: usize) -> usize {
        self.shard.seg_size.min(reserved.saturating_sub(self.seg_start(s)))
    }

    /// One pass of the conveyor (see the module comment): judge entries
    /// from the read cursor for about `budget` bytes, stopping after the
    /// first segment freed when `stop_on_free`. Inside a move.
    ///
    /// With `duel` (the strict mode's judgement of the head, `policy.rs`)
    /// the pass evicts only by duels: each unvisited live entry it meets is
    /// a victim offered to `duel`, which returns whether a candidate took
    /// its place (the victim goes); when none did, the pass stops before
    /// the victim, which the next candidates meet first. Visited entries
    /// stay with their mark cleared, as in an evicting pass.
    pub(super) fn conveyor_pass(
        &self,
        evict: bool,
        t: u64,
        budget: usize,
        stop_on_free: bool,
        mut duel: Option<&mut dyn FnMut(u32) -> bool>,
    ) -> Check<Pass> {
        let evict = evict || duel.is_some();
        let size = self.shard.seg_size;
        let head = self.head()?;
        let mut tail = self.seg_hdr(sh::TAIL)?;
        let mut pass = Pass::default();
        if tail == head {
            pass.stuck = true;
            return Ok(pass);
        }
        let active = self.active_slots()?;
        let reserved = self.arena_reserved()?;
        let force_after = (MERGE_SEGMENTS - 1) * size;
        // Without pressure (live entries under 90% of the room segments
        // give them: the rest is dead copies and deleted entries) the first
        // two segments judged since a segment came free only drop the dead
        // and expired; SIEVE evicts only after that.
        let sieve_after = if self.under_pressure(reserved) { 0 } else { 2 * size };
        let mut since_free = (self.hdr(sh::SINCE_FREE) as usize).min(force_after + size);
        let Cursors { mut w, mut wp, mut r, mut rp } = self.cursors(head, tail)?;
        // `w`'s used bytes as its table word says, while `w != r`: the
        // table is written when `w` changes and at the end.
        let mut w_used = self.seg_used(w)?;
        let mut r_used = if r == head { 0 } else { self.seg_used(r)? };
        let mut wraps = 0;
        // Lenient eviction wraps round before the young segments, once a
        // pass (`young_segment`); a pass that only drops the dead does not.
        let spare_young = evict && duel.is_none() && !self.strict();
        let mut advances = 0;
        let mut dropped = Dropped::default();
        let mut ahead = Lookahead::default();
        let sealed_delta = |d: isize| {
            let s = self.hdr(sh::SEALED_BYTES) as isize + d;
            self.set_hdr(sh::SEALED_BYTES, s.max(0) as u64);
        };
        loop {
            if r == head || rp >= r_used {
                let mut young = false;
                if r != head {
                    // The read cursor leaves `r`.
                    advances += 1;
                    if advances > 2 * self.shard.seg_count + 2 {
                        return Err(Corrupt("segment chain has a cycle"));
                    }
                    let next = self
                        .seg_next(r)?
                        .ok_or(Corrupt("a segment before the head has no next"))?;
                    let mut freed_now = false;
                    if r != w {
                        // Everything of `r` was judged: it leaves the chain.
                        self.set_seg(w, wp as u32, next as u32);
                        sealed_delta(wp as isize - w_used as isize - r_used as isize);
                        w_used = wp;
                        self.push_free(r);
                        // An empty segment (a head sealed before it was
                        // written: above a lazy file's reserved mark) frees
                        // no room; it goes to the free list all the same.
                        freed_now = r_used > 0;
                    } else if wp == 0 && w == tail {
                        // The tail kept nothing: it leaves the chain.
                        self.set_hdr(sh::TAIL, next as u64);
                        sealed_delta(-(r_used as isize));
                        self.push_free(w);
                        freed_now = r_used > 0;
                        tail = next;
                        (w, wp, w_used) =
                            (next, 0, if next == head { 0 } else { self.seg_used(next)? });
                    } else {
                        // `w` ends where its survivors end.
                        self.set_seg(w, wp as u32, next as u32);
                        sealed_delta(wp as isize - r_used as isize);
                        w_used = wp;
                    }
                    if freed_now {
                        pass.freed = true;
                        since_free = 0;
                    }
                    r = next;
                    rp = 0;
                    r_used = if r == head { 0 } else { self.seg_used(r)? };
                    young = spare_young && wraps == 0 && self.young_segment(r, head)?;
                }
                if r == head || young {
                    // Wrap: both cursors to the tail (from the head, or
                    // before the young segments).
                    wraps += 1;
                    (w, wp, r, rp) = (tail, 0, tail, 0);
                    if tail == head || wraps > 1 {
                        pass.stuck = !pass.freed;
                        break;
                    }
                    w_used = self.seg_used(tail)?;
                    r_used = w_used;
                }
                if pass.freed && stop_on_free || pass.examined >= budget {
                    break;
                }
                continue;
            }
            if pass.examined >= budget {
                break;
            }
            if (r != w || wp == 0) && self.seg_live(r) == 0 {
                // What is left of `r` holds no live entry (before the read
                // cursor lie only bytes already judged, and no survivor
                // when `w` is elsewhere or kept nothing yet): it goes
                // unread.
                pass.examined += SKIP_COST;
                rp = r_used;
                continue;
            }
            let base = self.seg_start(r);
            let e = self.entry(base + rp, base + r_used)?;
            pass.examined += e.size;
            since_free += e.size;
            rp += e.size;
            if e.is_dead() {
                continue;
            }
            let tag = ahead.tag_of(self, &e, base + r_used, active);
            let slot =
                self.find_slot(tag, e.off, active)?.ok_or(Corrupt("a live entry has no slot"))?;
            let visited = self.slot(slot) & SLOT_VISITED != 0;
            if let Some(duel) = duel.as_mut() {
                if !visited && !e.expired(t) {
                    if duel(tag) {
                        dropped.drop_entry(self, &e, slot, t);
                        continue;
                    }
                    // No candidate beat it: it stays unjudged under the
                    // read cursor.
                    rp -= e.size;
                    pass.examined -= e.size;
                    since_free -= e.size;
                    break;
                }
            } else {
                let force = evict && since_free > force_after;
                let sieve = evict && since_free > sieve_after;
                if !e.expired(t) && (force || sieve && !visited) {
                    dropped.drop_entry(self, &e, slot, t);
                    continue;
                }
            }
            if e.expired(t) {
                dropped.drop_entry(self, &e, slot, t);
                continue;
            }
            if visited && evict {
                self.note_hit(tag);
            }
            if w != r && wp + e.size > self.seg_cap(w, reserved) {
                // `w` is full: it ends here, and survivors go into `r`,
                // below the bytes they come from.
                self.set_seg(w, wp as u32, r as u32);
                sealed_delta(wp as isize - w_used as isize);
                (w, wp, w_used) = (r, 0, r_used);
            }
            let dst = self.seg_start(w) + wp;
            if w != r {
                self.count_live(e.off, e.size, true);
                self.count_live(dst, e.size, false);
            }
            if dst != e.off {
                // SAFETY: both ranges lie in used parts of segments of this
                // pass (the entry was checked; the destination is below
                // the read cursor in `r`, or in `w`'s room up to its cap,
                // which lies in reserved arena); ptr::copy handles the
                // overlap of a survivor moved down within its segment.
                unsafe { ptr::copy(self.arena_ptr(e.off), self.arena_ptr(dst), e.size) };
            }
            let mark = if visited && !evict { SLOT_VISITED } else { 0 };
            self.set_slot(slot, Self::tagged_slot(tag, dst) | mark);
            wp += e.size;
        }
        // Leave every segment whole entries: the judged bytes between the
        // cursors become one dead filler; `w`'s table word ends at its
        // survivors when the cursors are in two segments.
        if w != r {
            self.set_seg(w, wp as u32, r as u32);
            sealed_delta(wp as isize - w_used as isize);
            if rp > 0 {
                self.write_filler(self.seg_start(r), rp);
            }
        } else if rp > wp {
            self.write_filler(self.seg_start(w) + wp, rp - wp);
        }
        self.set_hdr(sh::HAND, (self.seg_start(w) + wp) as u64);
        self.set_hdr(sh::READ, (self.seg_start(r) + rp) as u64);
        self.set_hdr(sh::SINCE_FREE, since_free as u64);
        dropped.settle(self, active, pass.examined > 0)?;
        self.note_examined(pass.examined);
        Ok(pass)
    }

    /// Whether segment `s` of the chain is young: one of its newest
    /// `seg_count / young_share()` segments (a twelfth, or half while an
    /// adaptive shard's miniatures choose it; at most
    /// `MAX_YOUNG_SEGMENTS`), the head counted, which a lenient pass
    /// reaches only after a wrap round the older ones (`compaction.rs`,
    /// `YOUNG_SHARE`). A walk of
    /// that many links at most: the table says nothing of a segment's
    /// age, and the walk is the bound a hostile link cannot stretch.
    fn young_segment(&self, s: usize, head: usize) -> Check<bool> {
        let young = (self.shard.seg_count / self.young_share()).min(MAX_YOUNG_SEGMENTS);
        let mut at = s;
        for _ in 1..young {
            match self.seg_next(at)? {
                Some(next) if next == head => return Ok(true),
                Some(next) => at = next,
                None => return Ok(false),
            }
        }
        Ok(false)
    }

    /// Whether live entries fill at least 90% of the room the segments give
    /// entries (all but the head's, within the reserved arena): SIEVE then
    /// evicts from the first entry judged; below, dead copies go first
    /// (`COMPACT_FREE_PERCENT` for shards of one segment).
    pub(super) fn under_pressure(&self, reserved: usize) -> bool {
        let size = self.shard.seg_size;
        let room = reserved.min(self.shard.seg_count * size).saturating_sub(size);
        let live = self.hdr(sh::LIVE_BYTES) as usize;
        live.saturating_mul(100) >= room.saturating_mul(100 - COMPACT_FREE_PERCENT)
    }

    /// Run one pass inside its own move; corruption resets the shard.
    fn pass_in_move(&self, evict: bool, t: u64, budget: usize) -> Option<Pass> {
        self.in_move(|| self.conveyor_pass(evict, t, budget, true, None))
            .map_err(|c| self.recover(c))
            .ok()
    }

    /// Free one segment: passes (each its own move, so readers wait for
    /// one pass at most) until one comes free; `evict`: SIEVE evicts, else
    /// only dead and expired entries go, and the step gives up after
    /// `MERGE_SEGMENTS` segments judged. Returns whether a segment went to
    /// the free list. Corruption resets the shard (which empties it: the
    /// caller finds room then).
    pub(super) fn step(&self, evict: bool, now: &mut Now) -> bool {
        let t = now.get();
        // With the forced eviction, a segment frees within MERGE_SEGMENTS
        // judged, plus a wrap's worth.
        let limit = (MERGE_SEGMENTS + 2) * self.shard.seg_size;
        let mut judged = 0;
        while judged < limit {
            let Some(p) = self.pass_in_move(evict, t, STEP_BUDGET) else { return false };
            if p.freed {
                return true;
            }
            if p.stuck || !evict && judged >= MERGE_SEGMENTS * self.shard.seg_size {
                return false;
            }
            judged += p.examined.max(1);
        }
        false
    }

    /// Pay as you go (see the module comment): after a write moved the
    /// bump pointer from `before`, a pass of `STEP_BUDGET` for each
    /// `STEP_BUDGET / KEEP_AHEAD` boundary of the arena the append crossed,
    /// while the head's last `1 / KEEP_AHEAD_WINDOW` fills, no segment is
    /// free and none was ever left unused. Stops at the first segment freed.
    #[inline]
    pub(super) fn keep_ahead(&self, before: u64, now: &mut Now) {
        // Most writes land outside the head's last eighth, and most of the
        // rest cross no boundary: two loads, a multiply and a shift decide.
        // The window test comes first: it is false for seven writes in
        // eight, while the boundary test, true about one write in three at
        // 200-byte entries and in no pattern, would be mispredicted on
        // most writes (cachegrind's branch simulation of a loop of sets:
        // 0.62 mispredictions per set in the other order, 0.28 in this
        // one). Words out of step are met by the write path's checks.
        let after = self.hdr(sh::BUMP);
        let size = self.shard.seg_size as u64;
        let head_end = self.hdr(sh::HEAD).saturating_add(1).saturating_mul(size);
        match head_end.checked_sub(after) {
            Some(room) if room.saturating_mul(KEEP_AHEAD_WINDOW as u64) <= size => {}
            _ => return,
        }
        if after / CHUNK == before / CHUNK || !self.segmented() {
            return;
        }
        self.pay_passes(before, after, now);
    }

    /// The rest of `keep_ahead`, for a write that crossed a boundary.
    #[cold]
    #[inline(never)]
    fn pay_passes(&self, before: u64, after: u64, now: &mut Now) {
        // In strict mode the head is judged when it fills, and the losers
        // make room there: passes paid ahead would evict without a duel.
        if self.hdr(sh::FREE) != NO_SEGMENT as u64
            || self.hdr(sh::FRESH) < self.shard.seg_count as u64
            || self.strict()
        {
            return;
        }
        let crossed = if after > before { (after / CHUNK - before / CHUNK) as usize } else { 1 };
        let t = now.get();
        // A large append pays several passes, each its own move: a reader
        // waits for one pass at most.
        for _ in 0..crossed.min(MERGE_SEGMENTS * KEEP_AHEAD) {
            match self.pass_in_move(true, t, STEP_BUDGET) {
                Some(p) if !p.freed && !p.stuck => {}
                _ => break,
            }
        }
    }
}
