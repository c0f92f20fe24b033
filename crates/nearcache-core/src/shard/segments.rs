//! Segments: the arena cut into fixed pieces, so that the work of one
//! write never grows with the shard.
//!
//! Layout (`layout::Geometry::segments`): the arena is `count` segments of
//! `size` bytes (72 KiB to about 256 KiB: 1/32 of the arena, clamped, then
//! the arena divided evenly); an arena shorter than `MIN_SEGMENTS` (12)
//! minimum segments (shards under about 870 KiB) is one segment, the whole
//! arena, compacted whole as before segments (`compaction.rs`; bounded: the
//! shard is small). A table of two words per segment sits between the
//! shard header and the index: `next (u32) << 32 | used (u32)`, then
//! `live`. `used` is the bytes of entries from the segment's start (the
//! head's lives in `BUMP`, a global arena offset, so that an append writes
//! one word there); `next` links a segment to the next newer one, or the
//! next free one; `live` is the bytes of the segment's entries not marked
//! dead.
//!
//! * Entries keep global arena offsets (`segment * size + offset`):
//!   slots, versions and the optimistic reader are unchanged. An entry
//!   never straddles two segments.
//! * The segments in use form a FIFO in insertion order, `TAIL` (oldest)
//!   to `HEAD` (newest, where appends go). Emptied segments go to a free
//!   list (`FREE`); segments from `FRESH` on were never used. A full head
//!   is sealed (its `used` written to the table) and a new head taken:
//!   from the free list, else a fresh segment (lazy files prefer that to
//!   evicting while the file system allows), else by conveyor passes
//!   (`conveyor.rs`) until one segment frees. A lazy shard refused growth
//!   with nothing else to take evicts within the head itself (SIEVE in
//!   place, then all of it).
//! * Eviction and compaction of the segments before the head is the
//!   conveyor's (`conveyor.rs`): SIEVE at segment granularity with merge
//!   (Segcache, NSDI '21), in passes of bounded size that writes pay as
//!   the head fills, so that no write and no reader waits for more than
//!   one pass whatever the shard's size (`sh::MAX_STEP_BYTES` records the
//!   most one write examined). Strict admission judges a full head in the
//!   write that fills it (`judge_head`: work bounded by the segment), in
//!   moves of about a pass each, its index lookups done between them, so
//!   that readers still wait for one pass at most.
//! * A pass is a move (`seq` odd, `REWRITING` set): readers retry, versions
//!   stay unique (between moves a segment's `used` only grows, and a freed
//!   segment is reused only after the move that freed it), a holder that
//!   dies inside one leaves the shard to be reset. Sealing a head and
//!   taking a new one move nothing: the new head is linked in before
//!   `HEAD` names it, so a repair after a dead holder walks the chain from
//!   `TAIL` to the segment whose `next` is none, and rebuilds the free
//!   list from the segments not on it.
//! * Live bytes: an append adds its entry's size to its segment's `live`,
//!   and whatever marks a live entry dead or drops it (delete, overwrite,
//!   a compaction's drop) subtracts it; a survivor the conveyor copies to
//!   another segment moves its bytes from one count to the other. A
//!   segment taken or freed starts at 0. So `live` is exact between
//!   operations, and a segment whose `live` is 0 holds nothing but dead
//!   bytes: the conveyor frees it without reading it. A holder that dies
//!   in a write leaves the counts to `salvage`, which recounts them from
//!   the entries (and resets the shard inside a move, as for every other
//!   word). A count a hostile file lowered frees live entries without
//!   their slots: such a slot leads to bytes that fail their checks (a
//!   reset), never outside the shard, or to its entry still whole (in a
//!   free segment, or in the head past the bump pointer), which reads as
//!   the value last written for its key; an overwrite through it marks it
//!   dead before appending where it lies (`ShardGuard::replace`), not
//!   after.
//! * Every table and header word is checked before use: `used` within the
//!   segment and the reserved arena, links within the table and below
//!   `FRESH`, walks bounded by the segment count (a cycle ends as
//!   corruption, which resets the shard).

use super::conveyor::Lookahead;
use super::{Check, Corrupt, Entry, Now, ShardGuard};
use crate::hash::tag_of;
use crate::layout::*;
use std::ptr;

/// `m` such that `n * m >> 64` is `n / d` for every arena offset `n`:
/// `floor(2^64 / d) + 1` (or `2^64 / d` for a power of two). Exact while
/// `n < 2^64 / d` (the error `n / 2^64` stays below `1 / d`): arena offsets
/// are below 2^35 (`MAX_SHARD_SIZE`) and segments below 2^20
/// (`SEGMENT_SIZE` plus a little, or a one-segment arena under 870 KiB).
pub(super) fn reciprocal(d: usize) -> u64 {
    assert!(d > 1 && d < 1 << 20, "segment size {d}");
    u64::MAX / d as u64 + 1
}

/// `n / d` for the `m` that `reciprocal(d)` gave.
#[inline]
fn divide(n: usize, m: u64) -> usize {
    ((n as u128 * m as u128) >> 64) as usize
}

fn seg_word(used: u32, next: u32) -> u64 {
    (next as u64) << 32 | used as u64
}

/// The `used` word of a free segment whose pages were given back.
const PUNCHED_MARK: u32 = u32::MAX;

/// How the head is compacted in place.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Start {
    /// Dead and expired entries go (evicting: unvisited ones too).
    Head,
    /// Every entry evicted (evicting only).
    HeadAll,
}

/// The live entries a compaction of segments dropped (`merge` of the head,
/// the conveyor's passes): their slots become tombstones at once and are
/// purged, and the shard's counters settled, once every survivor moved.
#[derive(Default)]
pub(super) struct Dropped {
    purge: Vec<usize>,
    evicted: u64,
    expired: u64,
    bytes: usize,
}

impl Dropped {
    /// Drop the live entry `e` found in `slot` (expired at `t`, or evicted).
    pub(super) fn drop_entry(&mut self, g: &ShardGuard<'_>, e: &Entry, slot: usize, t: u64) {
        g.note_dropped(e);
        g.set_slot(slot, TOMBSTONE);
        g.count_live(e.off, e.size, true);
        self.purge.push(slot);
        self.bytes += e.size;
        if e.expired(t) {
            self.expired += 1;
        } else {
            self.evicted += 1;
        }
    }

    /// Purge the tombstones and settle `ITEMS`, `LIVE_BYTES`, the slot
    /// counts and the statistics (one more compaction when `compaction`).
    pub(super) fn settle(self, g: &ShardGuard<'_>, active: usize, compaction: bool) -> Check<()> {
        let tombstones = (g.hdr(sh::TOMBSTONES) as usize).min(active);
        let items_before = (g.hdr(sh::ITEMS) as usize).min(active);
        let mut purged = 0;
        let mut keep = Vec::new();
        for p in self.purge {
            purged += g.purge_cluster(p, active, &mut keep)?;
        }
        let gone = (self.evicted + self.expired) as usize;
        let items_after = items_before.saturating_sub(gone);
        let tombstones_after = (tombstones + gone).saturating_sub(purged);
        g.set_hdr(sh::ITEMS, items_after as u64);
        g.set_hdr(sh::LIVE_BYTES, g.hdr(sh::LIVE_BYTES).saturating_sub(self.bytes as u64));
        g.set_hdr(sh::TOMBSTONES, tombstones_after as u64);
        g.set_hdr(sh::SLOTS_USED, (items_after + tombstones_after) as u64);
        g.add_stat(sh::EVICTIONS, self.evicted);
        g.add_stat(sh::EXPIRATIONS, self.expired);
        if compaction {
            g.bump_stat(sh::COMPACTIONS);
        }
        Ok(())
    }
}

/// The candidates of a judgement of the head (`judge_head`), met in turn
/// by the victims its duel passes find; `lost`: the offsets of those that
/// lost, in order; `came_in`: the refusals' clock before the first came
/// in (`ShardGuard::judgement_clock`).
struct Duel<'c> {
    cands: &'c [(usize, u32)],
    next: usize,
    lost: Vec<usize>,
    came_in: u32,
}

impl Duel<'_> {
    /// Whether a candidate takes `victim`'s place: the next ones meet it
    /// until one is counted more often, and those before it lose.
    fn meet(&mut self, g: &ShardGuard<'_>, victim: u32) -> bool {
        while let Some(&(off, tag)) = self.cands.get(self.next) {
            self.next += 1;
            if g.wins(tag, victim, self.came_in) {
                return true;
            }
            self.lost.push(off);
        }
        false
    }
}

/// Test instrument of this thread's judgements: how many ran, how many
/// moves they made (the most in one), the most bytes one move walked, and
/// how many more moves are followed by a check of the whole shard.
#[cfg(test)]
#[derive(Clone, Copy, Default)]
struct JudgedMoves {
    judgements: usize,
    moves: usize,
    /// The most moves one judgement made.
    most_moves: usize,
    most_bytes: usize,
    /// Moves still to be followed by a check.
    checks: usize,
}

#[cfg(test)]
thread_local! {
    static JUDGED_MOVES: std::cell::Cell<JudgedMoves> =
        const { std::cell::Cell::new(JudgedMoves { judgements: 0, moves: 0, most_moves: 0, most_bytes: 0, checks: 0 }) };
}

impl<'a> ShardGuard<'a> {
    /// Whether the arena is cut into more than one segment.
    pub(super) fn segmented(&self) -> bool {
        self.shard.seg_count > 1
    }

    /// Word `word` (0: links and used bytes, 1: live bytes) of segment `s`.
    fn seg_ptr(&self, s: usize, word: usize) -> *mut u64 {
        assert!(s < self.shard.seg_count && word < SEGMENT_WORDS);
        // SAFETY: the table holds SEGMENT_WORDS words per segment for
        // seg_count segments from table_off, inside the shard
        // (Geometry::arena_offset leaves room for them); 8-aligned (the
        // table starts on a cache line).
        unsafe {
            self.shard.base.add(self.shard.table_off + (s * SEGMENT_WORDS + word) * 8) as *mut u64
        }
    }

    fn seg_raw(&self, s: usize) -> u64 {
        // SAFETY: see seg_ptr; reserved in lazy files (reserve_initial).
        unsafe { ptr::read_volatile(self.seg_ptr(s, 0)) }
    }

    pub(super) fn set_seg(&self, s: usize, used: u32, next: u32) {
        // SAFETY: as in seg_raw; the lock is held.
        unsafe { ptr::write_volatile(self.seg_ptr(s, 0), seg_word(used, next)) }
    }

    /// The live bytes segment `s` counts (unchecked: a hint whose only use
    /// is "0: nothing to read here"; see the module comment).
    pub(super) fn seg_live(&self, s: usize) -> u64 {
        // SAFETY: as in seg_raw.
        unsafe { ptr::read_volatile(self.seg_ptr(s, 1)) }
    }

    pub(super) fn set_seg_live(&self, s: usize, live: u64) {
        // SAFETY: as in seg_raw; the lock is held.
        unsafe { ptr::write_volatile(self.seg_ptr(s, 1), live) }
    }

    /// Add `bytes` to the live count of the segment holding arena offset
    /// `off` (a checked entry's), or subtract them (`gone`). Shards of one
    /// segment keep no count (`LIVE_BYTES` is theirs).
    #[inline]
    pub(super) fn count_live(&self, off: usize, bytes: usize, gone: bool) {
        if !self.segmented() {
            return;
        }
        let s = self.seg_of(off);
        if s < self.shard.seg_count {
            let live = self.seg_live(s);
            let live = if gone {
                live.saturating_sub(bytes as u64)
            } else {
                live.saturating_add(bytes as u64)
            };
            self.set_seg_live(s, live);
        }
    }

    /// The segment holding arena offset `off` (not checked against the
    /// segment count).
    #[inline]
    pub(super) fn seg_of(&self, off: usize) -> usize {
        divide(off, self.shard.seg_recip)
    }

    /// Where segment `s` starts in the arena.
    pub(super) fn seg_start(&self, s: usize) -> usize {
        s * self.shard.seg_size
    }

    /// A segment index read from the header, checked below `FRESH`.
    pub(super) fn seg_hdr(&self, field: usize) -> Check<usize> {
        let s = self.hdr(field);
        if s >= self.fresh()? as u64 {
            return Err(Corrupt("segment word out of range"));
        }
        Ok(s as usize)
    }

    /// Segments used so far (`FRESH`), checked.
    pub(super) fn fresh(&self) -> Check<usize> {
        let f = self.hdr(sh::FRESH);
        if f == 0 || f > self.shard.seg_count as u64 {
            return Err(Corrupt("fresh segment mark out of range"));
        }
        Ok(f as usize)
    }

    /// The head segment (appends go there), checked.
    pub(super) fn head(&self) -> Check<usize> {
        self.seg_hdr(sh::HEAD)
    }

    /// The bytes used in segment `s` (checked: within the segment and the
    /// reserved arena). The head's come from `BUMP`.
    pub(super) fn seg_used(&self, s: usize) -> Check<usize> {
        // `s` is checked by the caller, so the head word is compared with
        // it unchecked (a head out of range is met by `head()` on the
        // write path).
        if s as u64 == self.hdr(sh::HEAD) {
            return Ok(self.bump_in(s)? - self.seg_start(s));
        }
        let used = self.seg_raw(s) as u32 as usize;
        if used > self.shard.seg_size
            || used % ENTRY_ALIGN != 0
            || used > 0 && self.seg_start(s) + used > self.arena_reserved()?
        {
            return Err(Corrupt("segment used bytes out of range"));
        }
        Ok(used)
    }

    /// The segment after `s` in its list, checked.
    pub(super) fn seg_next(&self, s: usize) -> Check<Option<usize>> {
        let next = (self.seg_raw(s) >> 32) as u32;
        if next == NO_SEGMENT {
            return Ok(None);
        }
        if next as usize >= self.fresh()? {
            return Err(Corrupt("segment link out of range"));
        }
        Ok(Some(next as usize))
    }

    /// The end of the used part of the segment holding arena offset `off`:
    /// what a probed entry there is checked against by repairs and `check`
    /// (the write path's probes use the reserved arena).
    pub(super) fn used_end(&self, off: usize) -> Check<usize> {
        let s = self.seg_of(off);
        if s >= self.shard.seg_count {
            return Err(Corrupt("offset beyond the last segment"));
        }
        Ok(self.seg_start(s) + self.seg_used(s)?)
    }

    /// The bump pointer and the end of the head segment (appends stop
    /// there), both checked, the head read once.
    pub(super) fn head_room(&self) -> Check<(usize, usize)> {
        let head = self.head()?;
        Ok((self.bump_in(head)?, self.seg_start(head) + self.shard.seg_size))
    }

    /// Where an entry of `size` bytes goes without a compaction or growth:
    /// the bump pointer, if the entry fits both the head and the reserved
    /// arena; None if it does not.
    #[inline]
    pub(super) fn room_in_head(&self, size: usize) -> Check<Option<usize>> {
        let (off, head_end) = self.head_room()?;
        let end = self.arena_reserved()?.min(head_end);
        Ok((off <= end && size <= end - off).then_some(off))
    }

    /// The segments in use, oldest first (tail to head), checked: the walk
    /// follows at most one link per segment and must end at the head.
    pub(super) fn chain(&self) -> Check<Vec<usize>> {
        let head = self.head()?;
        let mut s = self.seg_hdr(sh::TAIL)?;
        let mut out = vec![s];
        while s != head {
            s = self.seg_next(s)?.ok_or(Corrupt("segment chain ends before the head"))?;
            out.push(s);
            if out.len() > self.shard.seg_count {
                return Err(Corrupt("segment chain has a cycle"));
            }
        }
        Ok(out)
    }

    /// Call `f` on every entry of the segments in use, oldest first.
    pub(super) fn walk_entries(&self, mut f: impl FnMut(&Entry) -> Check<()>) -> Check<()> {
        for s in self.chain()? {
            let end = self.seg_start(s) + self.seg_used(s)?;
            let mut off = self.seg_start(s);
            while off < end {
                let e = self.entry(off, end)?;
                f(&e)?;
                off += e.size;
            }
        }
        Ok(())
    }

    /// Bytes used in the segments in use (statistics, heuristics).
    pub(super) fn used_bytes(&self) -> usize {
        let head_used = match self.head() {
            Ok(h) => self.hdr(sh::BUMP).saturating_sub(self.seg_start(h) as u64),
            Err(_) => 0,
        };
        self.hdr(sh::SEALED_BYTES).saturating_add(head_used).min(self.shard.arena_size as u64)
            as usize
    }

    /// An empty shard's segment words: segment 0 is the head and the tail.
    pub(super) fn reset_segments(&self) {
        self.set_hdr(sh::HEAD, 0);
        self.set_hdr(sh::TAIL, 0);
        self.set_hdr(sh::FREE, NO_SEGMENT as u64);
        self.set_hdr(sh::FRESH, 1);
        self.set_hdr(sh::SEALED_BYTES, 0);
        self.set_hdr(sh::READ, 0);
        self.set_hdr(sh::SINCE_FREE, 0);
        if self.hdr(sh::PUNCHED) != 0 {
            // Segments given back lie below the mark: lowering it is always
            // safe (the next growth reserves again, a no-op for held pages).
            self.set_hdr(sh::ARENA_RESERVED, 0);
            self.set_hdr(sh::PUNCHED, 0);
        }
        self.set_seg(0, 0, NO_SEGMENT);
        self.set_seg_live(0, 0);
    }

    /// After a dead holder: rebuild `HEAD`, `BUMP`, `SEALED_BYTES` and the
    /// free list from the chain. The chain is followed from `TAIL` to the
    /// segment with no next (a head being replaced was linked to its
    /// successor before `HEAD` named it). Returns the chain.
    pub(super) fn salvage_segments(&self) -> Check<Vec<usize>> {
        let fresh = self.fresh()?;
        let mut s = self.seg_hdr(sh::TAIL)?;
        let mut chain = vec![s];
        while let Some(n) = self.seg_next(s)? {
            s = n;
            chain.push(s);
            if chain.len() > fresh {
                return Err(Corrupt("segment chain has a cycle"));
            }
        }
        let head = s;
        let start = self.seg_start(head);
        let bump = self.hdr(sh::BUMP) as usize;
        let reserved = self.arena_reserved()?;
        let head_used = if self.hdr(sh::HEAD) == head as u64
            && bump >= start
            && bump - start <= self.shard.seg_size
            && bump <= reserved
            && bump % ENTRY_ALIGN == 0
        {
            bump - start
        } else {
            (self.seg_raw(head) as u32 as usize).min(self.shard.seg_size)
        };
        let mut sealed = 0;
        self.set_hdr(sh::HEAD, head as u64);
        self.set_hdr(sh::BUMP, (start + head_used) as u64);
        for &c in &chain[..chain.len() - 1] {
            sealed += self.seg_used(c)?;
        }
        self.set_hdr(sh::SEALED_BYTES, sealed as u64);
        let mut on_chain = vec![false; fresh];
        for &c in &chain {
            on_chain[c] = true;
        }
        self.set_hdr(sh::FREE, NO_SEGMENT as u64);
        let mut punched = 0;
        for f in (0..fresh).rev() {
            if !on_chain[f] {
                let mark = if self.seg_raw(f) as u32 == PUNCHED_MARK {
                    punched += self.seg_pages(f, usize::MAX).map_or(0, |(a, b)| b - a);
                    PUNCHED_MARK
                } else {
                    0
                };
                self.set_seg(f, mark, self.hdr(sh::FREE) as u32);
                self.set_seg_live(f, 0);
                self.set_hdr(sh::FREE, f as u64);
            }
        }
        self.set_hdr(sh::PUNCHED, punched as u64);
        // The conveyor's cursors: on the chain, or both back at the tail.
        let (hand, read) = (self.hdr(sh::HAND) as usize, self.hdr(sh::READ) as usize);
        let (w, r) = (hand / self.shard.seg_size, read / self.shard.seg_size);
        if w >= fresh || !on_chain[w] || w == head || r >= fresh || !on_chain[r] {
            self.set_hdr(sh::HAND, self.seg_start(chain[0]) as u64);
            self.set_hdr(sh::READ, self.seg_start(chain[0]) as u64);
        }
        Ok(chain)
    }

    /// Seal the head (its used bytes go to the table) and make `new` (an
    /// empty segment taken off the free list or fresh) the head: linked
    /// first, named by `HEAD` after, so a repair finds it either way.
    fn seal_and_take(&self, new: usize) -> Check<()> {
        let head = self.head()?;
        let used = self.seg_used(head)?;
        self.set_seg(new, 0, NO_SEGMENT);
        self.set_seg_live(new, 0);
        self.set_seg(head, used as u32, new as u32);
        self.add_stat(sh::SEALED_BYTES, used as u64);
        self.set_hdr(sh::HEAD, new as u64);
        self.set_hdr(sh::BUMP, self.seg_start(new) as u64);
        // Nothing of the new head is judged yet.
        self.set_window_start(self.seg_start(new));
        Ok(())
    }

    /// Put an emptied segment on the free list.
    pub(super) fn push_free(&self, s: usize) {
        self.set_seg(s, 0, self.hdr(sh::FREE) as u32);
        self.set_seg_live(s, 0);
        self.set_hdr(sh::FREE, s as u64);
    }

    /// Take a segment off the free list. In a lazy file everything below
    /// `ARENA_RESERVED` is reserved (growth reserves from the mark up); a
    /// segment that reaches above it grows the mark as entries are
    /// appended, like a fresh one.
    /// `within`: only a segment that holds that many bytes below the
    /// reserved mark (the file system refused to grow it).
    fn take_free(&self, within: Option<usize>) -> Check<Option<usize>> {
        let reserved = self.arena_reserved()?;
        let mut prev: Option<usize> = None;
        let mut walked = 0;
        let mut cur = match self.hdr(sh::FREE) {
            f if f == NO_SEGMENT as u64 => None,
            _ => Some(self.seg_hdr(sh::FREE)?),
        };
        while let Some(s) = cur {
            let next = self.seg_next(s)?;
            let mut fits = within.map_or(true, |n| self.seg_start(s) + n <= reserved);
            let punched = self.seg_raw(s) as u32 == PUNCHED_MARK;
            if fits && punched {
                // Its pages were given back: reserve them again first.
                let a = self.shard.arena_off + self.seg_start(s);
                fits = self.shard.reserve(a, a + self.shard.seg_size).is_ok();
                if fits {
                    let pages = self.seg_pages(s, usize::MAX).map_or(0, |(a, b)| b - a);
                    self.set_hdr(sh::PUNCHED, self.hdr(sh::PUNCHED).saturating_sub(pages as u64));
                }
            }
            if fits {
                let link = next.map_or(NO_SEGMENT, |n| n as u32);
                match prev {
                    None => self.set_hdr(sh::FREE, link as u64),
                    Some(p) => self.set_seg(p, self.seg_raw(p) as u32, link),
                }
                return Ok(Some(s));
            }
            walked += 1;
            if walked > self.shard.seg_count {
                return Err(Corrupt("free list has a cycle"));
            }
            (prev, cur) = (Some(s), next);
        }
        Ok(None)
    }

    /// The free list (bounded walk, checked).
    fn free_list(&self) -> Check<Vec<usize>> {
        let mut out = Vec::new();
        if self.hdr(sh::FREE) == NO_SEGMENT as u64 {
            return Ok(out);
        }
        let mut s = Some(self.seg_hdr(sh::FREE)?);
        while let Some(seg) = s {
            out.push(seg);
            if out.len() > self.shard.seg_count {
                return Err(Corrupt("free list has a cycle"));
            }
            s = self.seg_next(seg)?;
        }
        Ok(out)
    }

    /// The head is full: make a new one. From the free list; else a fresh
    /// segment, when `may_grow` (a lazy shard first drops dead entries with
    /// one step when they are more than a sixth of the used bytes, as
    /// before segments); else one evicting step (two if the first had to
    /// wrap). False when no segment could be had.
    pub(super) fn new_head(
        &self,
        now: &mut Now,
        dropped_dead: &mut bool,
        may_grow: bool,
        size: usize,
    ) -> Check<bool> {
        // Strict admission: a full head whose shard has no segment to spare
        // judges its new entries first; losers make room in the head.
        if self.strict()
            && self.hdr(sh::FREE) == NO_SEGMENT as u64
            && self.fresh()? >= self.shard.seg_count
            && self.under_pressure(self.arena_reserved()?)
            && self.judge_head_in_moves(now, size)
        {
            return Ok(true);
        }
        // Without growth, only a segment with room below the reserved mark.
        let within = (self.shard.lazy && !may_grow).then_some(size);
        if let Some(s) = self.take_free(within)? {
            self.seal_and_take(s)?;
            return Ok(true);
        }
        let fresh = self.fresh()?;
        if may_grow && fresh < self.shard.seg_count {
            let used = self.used_bytes();
            let dead = used.saturating_sub(self.hdr(sh::LIVE_BYTES) as usize);
            if self.shard.lazy
                && !*dropped_dead
                && dead * 6 > used
                && dead >= self.shard.seg_size / 2
            {
                *dropped_dead = true;
                let head_used = self.seg_used(self.head()?)?;
                if self.compact_head(now) && self.seg_used(self.head()?)? * 4 <= head_used * 3 {
                    return Ok(true);
                }
                if self.step(false, now) {
                    if let Some(s) = self.take_free(within)? {
                        self.seal_and_take(s)?;
                        return Ok(true);
                    }
                }
            }
            self.set_hdr(sh::FRESH, fresh as u64 + 1);
            self.seal_and_take(fresh)?;
            return Ok(true);
        }
        // A step frees at least one segment; one left empty by a head sealed
        // before it was written may lie above the mark: a few more then.
        for _ in 0..3 {
            if !self.step(true, now) {
                break;
            }
            if let Some(s) = self.take_free(within)? {
                self.seal_and_take(s)?;
                return Ok(true);
            }
        }
        Ok(self.evict_in_head(now))
    }

    /// Record the arena bytes a write's compactions examined (the bound
    /// that `sh::MAX_STEP_BYTES` shows). Inside a move.
    pub(super) fn note_examined(&self, bytes: usize) {
        let total = self.examined.get() + bytes;
        self.examined.set(total);
        if total as u64 > self.hdr(sh::MAX_STEP_BYTES) {
            self.set_hdr(sh::MAX_STEP_BYTES, total as u64);
        }
    }

    /// Compact the head segment in place (dead and expired entries only):
    /// a lazy shard whose head is mostly overwritten copies makes room in
    /// it instead of taking another segment. Inside its own move. Returns
    /// whether anything was dropped.
    pub(super) fn compact_head(&self, now: &mut Now) -> bool {
        self.begin_move();
        self.set_hdr(sh::REWRITING, 1);
        let done = self.merge(false, now.get(), Start::Head).unwrap_or_else(|c| {
            self.recover(c);
            false
        });
        self.end_move();
        done
    }

    /// The last resort of a write that found no segment to take (a lazy
    /// shard on a file system that refuses to grow it, with nothing else
    /// free): SIEVE within the head, in place; if every entry there was
    /// visited, the head's entries are evicted. Inside its own move.
    /// Returns whether anything was dropped.
    fn evict_in_head(&self, now: &mut Now) -> bool {
        self.begin_move();
        self.set_hdr(sh::REWRITING, 1);
        let t = now.get();
        let done = self
            .merge(true, t, Start::Head)
            .and_then(|d| if d { Ok(true) } else { self.merge(true, t, Start::HeadAll) })
            .unwrap_or_else(|c| {
                self.recover(c);
                false
            });
        self.end_move();
        done
    }

    /// Compact the head in place: dead and expired entries go (evicting:
    /// unvisited ones too, or every one with `Start::HeadAll`), survivors
    /// slide down in order and the bump pointer follows them. Ok(false),
    /// with nothing changed, when nothing would go. Inside a move.
    fn merge(&self, evict: bool, t: u64, start: Start) -> Check<bool> {
        let head = self.head()?;
        let active = self.active_slots()?;
        let begin = self.seg_start(head);
        let end = self.bump()?;
        // Judge first: nothing changes unless something goes.
        let mut items = Vec::new();
        let mut key = Vec::new();
        let mut off = begin;
        let mut any_gone = false;
        while off < end {
            let e = self.entry(off, end)?;
            off += e.size;
            if e.is_dead() {
                // Nothing to do for it but not to copy it: it stays out of
                // the list (a head of overwritten copies is mostly these).
                any_gone = true;
                continue;
            }
            let tag = tag_of(self.entry_hash(&e, &mut key));
            let slot =
                self.find_slot(tag, e.off, active)?.ok_or(Corrupt("a live entry has no slot"))?;
            let visited = self.slot(slot) & SLOT_VISITED != 0;
            let gone = e.expired(t) || evict && (start == Start::HeadAll || !visited);
            any_gone |= gone;
            items.push((e, slot, tag, visited, gone));
        }
        self.note_examined(end - begin);
        if !any_gone {
            return Ok(false);
        }
        let mut dropped = Dropped::default();
        let mut write = begin;
        for (e, slot, tag, visited, gone) in items {
            if gone {
                dropped.drop_entry(self, &e, slot, t);
                continue;
            }
            if write != e.off {
                // SAFETY: both ranges lie in the head's used bytes (checked
                // entries); write <= e.off, survivors are copied in order,
                // and ptr::copy handles the overlap.
                unsafe { ptr::copy(self.arena_ptr(e.off), self.arena_ptr(write), e.size) };
            }
            let mark = if visited && !evict { SLOT_VISITED } else { 0 };
            if visited && evict {
                self.note_hit(tag);
            }
            self.set_slot(slot, Self::tagged_slot(tag, write) | mark);
            write += e.size;
        }
        self.set_hdr(sh::BUMP, write as u64);
        self.set_window_start(begin);
        dropped.settle(self, active, true)?;
        Ok(true)
    }

    /// `judge_head`, and whether the head then has room for `size` bytes;
    /// corruption resets the shard.
    fn judge_head_in_moves(&self, now: &mut Now, size: usize) -> bool {
        match self.judge_head(now.get()) {
            // Within the reserved arena too (a lazy file the file system
            // refused to grow).
            Ok(()) => matches!(self.room_in_head(size), Ok(Some(_))),
            Err(c) => {
                self.recover(c);
                false
            }
        }
    }

    /// The strict mode's judgement of a full head (`policy.rs`): the
    /// older half of the entries not judged yet (those from the window
    /// start on) is judged oldest first. An entry hit since it came in
    /// stays (with its mark); an unhit one (a candidate) meets the victim
    /// at the conveyor's read cursor, found by duel passes
    /// (`conveyor_pass`): it stays and the victim goes if the sketch
    /// counts it more often, else it goes. Then the head is compacted in
    /// place: the candidates that lost, dead and expired entries go, the
    /// rest slide down, and the window starts after the judged survivors.
    ///
    /// No reader waits for the whole judgement, only for one move of it,
    /// each about a pass (`STEP_BUDGET`): the candidates are found by
    /// reading alone (no move), the duels run in passes of their own, and
    /// the compaction moves in steps with the gap it has opened left as
    /// one dead filler between two (the conveyor's way).
    fn judge_head(&self, t: u64) -> Check<()> {
        let head = self.head()?;
        let active = self.active_slots()?;
        let begin = self.seg_start(head);
        let end = self.bump()?;
        let start = self.window_start();
        let start = if (begin..=end).contains(&start) { start } else { begin };
        let half = start + (end - start) / 2;
        let cands = self.head_candidates(start, half, end, t, active)?;
        #[cfg(test)]
        let moves_before = JUDGED_MOVES.with(|m| {
            m.set(JudgedMoves { judgements: m.get().judgements + 1, ..m.get() });
            m.get().moves
        });
        let came_in = self.judgement_clock();
        let mut duel = Duel { cands: &cands, next: 0, lost: Vec::new(), came_in };
        let mut left = self.shard.seg_size / 2;
        while duel.next < cands.len() && left > 0 {
            let pass = self.in_move(|| {
                let budget = left.min(STEP_BUDGET);
                self.conveyor_pass(true, t, budget, false, Some(&mut |v| duel.meet(self, v)))
            })?;
            #[cfg(test)]
            self.judged_move(pass.examined);
            left = left.saturating_sub(pass.examined);
            if pass.stuck || pass.examined == 0 {
                break;
            }
        }
        self.note_judged();
        // The window starts again at the first candidate the passes did not
        // reach, or after the judged half.
        let unjudged = cands.get(duel.next).map_or(half, |c| c.0);
        self.compact_judged_head(begin, end, &duel.lost, unjudged, t, active)?;
        #[cfg(test)]
        JUDGED_MOVES.with(|m| {
            let now = m.get();
            m.set(JudgedMoves { most_moves: now.most_moves.max(now.moves - moves_before), ..now });
        });
        self.note_examined(end - begin + half - start);
        Ok(())
    }

    /// The candidates of a judgement, oldest first: (arena offset, tag) of
    /// each unhit live entry in `[start, half)` of the head. Reads only
    /// (under the lock, outside any move). Each entry's slot is a cache
    /// miss in a large index: the look-ahead hashes the next few and
    /// prefetches their home slots.
    fn head_candidates(
        &self,
        start: usize,
        half: usize,
        end: usize,
        t: u64,
        active: usize,
    ) -> Check<Vec<(usize, u32)>> {
        let mut cands = Vec::new();
        let mut ahead = Lookahead::default();
        let mut off = start;
        while off < half {
            let e = self.entry(off, end)?;
            off += e.size;
            if e.is_dead() || e.expired(t) {
                continue;
            }
            let tag = ahead.tag_of(self, &e, end, active);
            let slot =
                self.find_slot(tag, e.off, active)?.ok_or(Corrupt("a live entry has no slot"))?;
            if self.slot(slot) & SLOT_VISITED == 0 {
                cands.push((e.off, tag));
            }
        }
        Ok(cands)
    }

    /// Compact the judged head `[begin, end)` in place: the candidates that
    /// lost (`lost`, in order), dead and expired entries go, the rest slide
    /// down, the bump pointer follows them and the window starts at the
    /// first survivor from `unjudged` on. The entries before the first
    /// that goes stay where they are, their slots as they are: they are
    /// only read, outside any move. From there, moves of `STEP_BUDGET`
    /// bytes walked each; the passes may have moved slots (purging
    /// tombstones), so each survivor's is looked up again.
    fn compact_judged_head(
        &self,
        begin: usize,
        end: usize,
        lost: &[usize],
        unjudged: usize,
        t: u64,
        active: usize,
    ) -> Check<()> {
        let mut lost = lost.iter().copied().peekable();
        let mut window = None;
        let mut off = begin;
        while off < end {
            let e = self.entry(off, end)?;
            while lost.next_if(|&l| l < e.off).is_some() {}
            if e.is_dead() || e.expired(t) || lost.peek() == Some(&e.off) {
                break;
            }
            if e.off >= unjudged && window.is_none() {
                window = Some(e.off);
            }
            off += e.size;
        }
        if off >= end {
            // Nothing goes: nothing moves.
            self.set_window_start(window.unwrap_or(end));
            return Ok(());
        }
        let mut write = off;
        let mut ahead = Lookahead::default();
        let mut step = Vec::new();
        loop {
            // Between two moves, reads alone (readers go on meanwhile): the
            // next step's entries, what becomes of each, and their slots,
            // each a cache miss in a large index.
            #[cfg(test)]
            let from = off;
            let stop = end.min(off.saturating_add(STEP_BUDGET));
            while off < stop {
                let e = self.entry(off, end)?;
                off += e.size;
                if e.is_dead() {
                    continue;
                }
                while lost.next_if(|&l| l < e.off).is_some() {}
                let goes = e.expired(t) || lost.next_if_eq(&e.off).is_some();
                let tag = ahead.tag_of(self, &e, end, active);
                let slot = self
                    .find_slot(tag, e.off, active)?
                    .ok_or(Corrupt("a live entry has no slot"))?;
                step.push((e, slot, tag, goes));
            }
            let done = off >= end;
            // The move: the step's stores alone.
            self.in_move(|| {
                let mut dropped = Dropped::default();
                for (e, slot, tag, goes) in step.drain(..) {
                    if goes {
                        dropped.drop_entry(self, &e, slot, t);
                        continue;
                    }
                    if e.off >= unjudged && window.is_none() {
                        window = Some(write);
                    }
                    // SAFETY: both ranges lie in the head's used bytes
                    // (checked entries); write < e.off (the walk above
                    // stopped at the first entry that goes or is dead, and
                    // the first step passes it), survivors are copied in
                    // order, and ptr::copy handles the overlap.
                    unsafe { ptr::copy(self.arena_ptr(e.off), self.arena_ptr(write), e.size) };
                    let mark = self.slot(slot) & SLOT_VISITED;
                    self.set_slot(slot, Self::tagged_slot(tag, write) | mark);
                    write += e.size;
                }
                if done {
                    self.set_hdr(sh::BUMP, write as u64);
                    self.set_window_start(window.unwrap_or(write));
                } else if off > write {
                    // Readers find whole entries between two moves: what
                    // was walked and not refilled is one dead entry.
                    self.write_filler(write, off - write);
                }
                dropped.settle(self, active, done)
            })?;
            #[cfg(test)]
            self.judged_move(off - from);
            if done {
                return Ok(());
            }
        }
    }

    /// Test instrument: a move of a judgement that walked `bytes` has
    /// ended; while `JudgedMoves::checks` lasts, the shard must be whole.
    #[cfg(test)]
    fn judged_move(&self, bytes: usize) {
        JUDGED_MOVES.with(|m| {
            let mut now = m.get();
            now.moves += 1;
            now.most_bytes = now.most_bytes.max(bytes);
            let check = now.checks > 0;
            now.checks = now.checks.saturating_sub(1);
            m.set(now);
            if check {
                if let Err(e) = self.check_whole() {
                    panic!("between two moves of a judgement: {e}");
                }
            }
        });
    }

    /// Rebuild the index in place from its own slots into `active` slots
    /// (the count after a doubling, or the same to drop tombstones): every
    /// slot is placed again from its tag; no entry is read. Work follows
    /// the index, not the arena: done when the index doubles (a few times
    /// while a shard fills) or is a quarter tombstones. Inside a move.
    pub(super) fn rehash_index(&self, old_active: usize) -> Check<()> {
        let active = self.active_slots()?;
        let mut slots = Vec::with_capacity((self.hdr(sh::ITEMS) as usize).min(active));
        for s in 0..old_active.min(active) {
            let v = self.slot(s);
            if v != 0 && v != TOMBSTONE {
                slots.push(v);
            }
        }
        self.set_hdr(sh::REWRITING, 1);
        self.zero_index();
        for &v in &slots {
            self.place(v, active, active)?;
        }
        self.set_hdr(sh::SLOTS_USED, slots.len() as u64);
        self.set_hdr(sh::TOMBSTONES, 0);
        Ok(())
    }

    /// The whole pages of free segment `s` (shard offsets), if they all
    /// lie below the reserved mark: what `give_back` punches.
    fn seg_pages(&self, s: usize, reserved: usize) -> Option<(usize, usize)> {
        let a = self.shard.arena_off + self.seg_start(s);
        let (from, to) = (a.div_ceil(PAGE) * PAGE, (a + self.shard.seg_size) / PAGE * PAGE);
        (to > from && self.seg_start(s) + self.shard.seg_size <= reserved).then_some((from, to))
    }

    /// Give back memory of a lazy shard: evict (steps) until free segments
    /// hold `need` bytes, then punch the pages of free segments out,
    /// marking them (`PUNCHED_MARK`) so that taking one reserves it again
    /// first. Inside a move. Returns the bytes punched.
    pub(super) fn give_back_segments(&self, need: usize, now: &mut Now) -> Check<usize> {
        let reserved = self.arena_reserved()?;
        let unpunched = |free: &[usize]| {
            free.iter()
                .filter(|&&f| self.seg_raw(f) as u32 != PUNCHED_MARK)
                .filter_map(|&f| self.seg_pages(f, reserved))
                .map(|(a, b)| b - a)
                .sum::<usize>()
        };
        for _ in 0..need.div_ceil(self.shard.seg_size) + 2 {
            if unpunched(&self.free_list()?) >= need || !self.step(true, now) {
                break;
            }
        }
        let free = self.free_list()?;
        self.begin_move();
        let mut given = 0;
        for &f in &free {
            if given >= need || self.seg_raw(f) as u32 == PUNCHED_MARK {
                continue;
            }
            let Some((from, to)) = self.seg_pages(f, reserved) else { continue };
            self.set_seg(f, PUNCHED_MARK, (self.seg_raw(f) >> 32) as u32);
            self.add_stat(sh::PUNCHED, (to - from) as u64);
            given += to - from;
            // SAFETY: fd is the open cache file; [from, to) lies inside a
            // free segment, whose bytes no slot leads to (it was emptied by
            // a move); its mark makes the next user reserve it again.
            unsafe {
                libc::fallocate(
                    self.shard.fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    (self.shard.file_off + from) as libc::off_t,
                    (to - from) as libc::off_t,
                );
            }
        }
        self.end_move();
        Ok(given)
    }

    /// Check the segment words (`Shard::check`): the chain and the free
    /// list are disjoint and together every segment used so far, and
    /// `SEALED_BYTES` is the sum of the sealed segments' used bytes.
    pub(super) fn check_segments(&self) -> std::result::Result<(), String> {
        let s = |c: Corrupt| c.0.to_string();
        let chain = self.chain().map_err(s)?;
        let free = self.free_list().map_err(s)?;
        let fresh = self.fresh().map_err(s)?;
        let mut seen = vec![false; fresh];
        for &c in chain.iter().chain(&free) {
            if std::mem::replace(&mut seen[c], true) {
                return Err(format!("segment {c} is twice in the chain and the free list"));
            }
        }
        if let Some(lost) = seen.iter().position(|&b| !b) {
            return Err(format!("segment {lost} is neither in use nor free"));
        }
        let punched: usize = free
            .iter()
            .filter(|&&f| self.seg_raw(f) as u32 == PUNCHED_MARK)
            .map(|&f| self.seg_pages(f, usize::MAX).map_or(0, |(a, b)| b - a))
            .sum();
        if punched as u64 != self.hdr(sh::PUNCHED) {
            return Err(format!("punched counter {} but {punched}", self.hdr(sh::PUNCHED)));
        }
        let mut sealed = 0;
        for &c in &chain[..chain.len() - 1] {
            sealed += self.seg_used(c).map_err(s)?;
        }
        if sealed as u64 != self.hdr(sh::SEALED_BYTES) {
            return Err(format!(
                "sealed bytes counter {} but the sealed segments hold {sealed}",
                self.hdr(sh::SEALED_BYTES)
            ));
        }
        self.check_cursors()
    }
}

#[cfg(test)]
mod tests {
    use super::{divide, reciprocal, JudgedMoves, JUDGED_MOVES};
    use crate::cache::Store;
    use crate::file::OpenOptions;
    use crate::layout::{Geometry, HEADER_SIZE, MAX_SHARD_SIZE, STEP_BUDGET};
    use crate::EvictionMode;

    /// A strict judgement of a full head keeps readers waiting for one
    /// pass at a time: its duels run in passes of `STEP_BUDGET`, its
    /// compaction in steps of as many bytes, and between two of its moves
    /// the shard is whole (every live entry reachable from the index, the
    /// counters right), as the readers that go on between them find it.
    /// New keys that are never read (nearly every candidate loses) and
    /// keys read back soon after (hit in the window: they stay), in one
    /// shard of 4 and of 8 MiB pinned strict.
    #[test]
    fn a_judgement_moves_a_pass_at_a_time_and_leaves_the_shard_whole() {
        for mib in [4usize, 8] {
            let dir =
                std::env::temp_dir().join(format!("nearcache-judge-{mib}-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join("c");
            let opts = OpenOptions {
                size: Some(HEADER_SIZE + (mib << 20)),
                shards: 1,
                ..OpenOptions::default()
            };
            let store = Store::open_as(&path, &path, &opts, None).unwrap();
            store.set_eviction_mode(EvictionMode::Strict).unwrap();
            let (segments, seg_size) = store.geometry().segments();
            assert!(
                segments > 1 && seg_size > 4 * STEP_BUDGET,
                "{mib} MiB: {segments} x {seg_size}"
            );
            JUDGED_MOVES.with(|m| m.set(JudgedMoves { checks: 80, ..JudgedMoves::default() }));
            let key = |i: usize| format!("{i:036}");
            let value = |i: usize| vec![(i % 251) as u8; 160];
            for i in 0..2 * (mib << 20) / 200 {
                store.set(key(i).as_bytes(), &value(i), 0, 0).unwrap();
                if i % 5 == 0 && i >= 40 {
                    if let Some(v) = store.get(key(i - 40).as_bytes()).unwrap() {
                        assert_eq!(v.data, value(i - 40));
                    }
                }
            }
            let seen = JUDGED_MOVES.with(|m| m.get());
            let stats = store.stats().unwrap();
            assert!(seen.judgements >= 20 && seen.checks == 0, "{mib} MiB: {stats:?}");
            // A judgement that compacts most of a head does it in steps.
            assert!(
                seen.most_moves >= seg_size / 2 / STEP_BUDGET,
                "{mib} MiB: at most {} moves in one of {} judgements",
                seen.most_moves,
                seen.judgements
            );
            // A move walks a pass's bytes, overshot by one entry at most.
            assert!(
                seen.most_bytes <= STEP_BUDGET + 256,
                "{mib} MiB: a move of a judgement walked {} bytes",
                seen.most_bytes
            );
            assert_eq!(stats.resets + stats.corruptions, 0, "{stats:?}");
            for s in store.shard_slice() {
                let g = s.lock(std::time::Duration::from_secs(5)).unwrap();
                g.check().unwrap();
            }
            drop(store);
            let _ = std::fs::remove_dir_all(&dir);
        }
    }

    /// The multiply that replaces a division by the segment size agrees
    /// with the division at every segment size a geometry gives and at
    /// offsets up to the largest arena, around every multiple.
    #[test]
    fn the_reciprocal_divides_exactly() {
        let mut sizes = std::collections::BTreeSet::new();
        for shard in (1usize..=64).map(|m| m << 16).chain([MAX_SHARD_SIZE / 2, MAX_SHARD_SIZE]) {
            if let Ok(g) = Geometry::for_size(HEADER_SIZE + shard, 1) {
                sizes.insert(g.segments().1);
            }
        }
        sizes.extend([4, 64, 96 * 1024, 96 * 1024 + 64, 256 * 1024 + 4032, (1 << 20) - 4]);
        for &d in &sizes {
            let m = reciprocal(d);
            let mut n = 0usize;
            while n < MAX_SHARD_SIZE {
                for x in [n, n + 1, n + d - 1, n.saturating_sub(1), n + d / 2] {
                    assert_eq!(divide(x, m), x / d, "{x} / {d}");
                }
                n += d * 997 + 4;
            }
            for x in [MAX_SHARD_SIZE - 1, MAX_SHARD_SIZE, (MAX_SHARD_SIZE / d) * d - 1] {
                assert_eq!(divide(x, m), x / d, "{x} / {d}");
            }
        }
    }
}
