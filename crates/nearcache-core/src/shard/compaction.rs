//! Compaction and eviction: dropping dead and expired entries, and SIEVE.
//!
//! Design:
//! * When the arena or the index is full, the shard is compacted: dead and
//!   expired entries are dropped, then SIEVE evicts: the hand walks the
//!   arena from oldest to newest, clearing the "visited" bit that a hit
//!   sets and evicting the first unvisited entries, until a fraction of the
//!   shard is free (`COMPACT_FREE_PERCENT`). The hand wraps round before
//!   the young entries (the newest `1 / YOUNG_SHARE` of the used arena,
//!   or half of it in an adaptive shard whose miniatures chose it:
//!   `young_share`, `policy.rs`) while the older ones can free enough in
//!   two laps, so a new entry lives at least that long (a segmented
//!   shard's conveyor keeps its newest segments young alike:
//!   `conveyor.rs`). Survivors slide down
//!   in order (memmove, no scratch buffer, `Slider`) and the index is
//!   rebuilt from the 31-bit tags the old slots carry (the tag gives the
//!   home slot): no key is read or hashed, and entries store nothing of
//!   their hash (the arena walk hashes the survivors' keys again).
//! * A shard whose used arena is mostly dead copies finds its live entries
//!   through the index instead of walking the arena (`gather_from_index`).
//! * When the hand is part-way through the arena and the part behind it
//!   can free enough, only that part is compacted (`compact_from_hand`):
//!   entries before the hand are not read or moved, the survivors' slots
//!   are rewritten in place and the evicted ones' purged cluster by
//!   cluster, so a compaction costs what lies behind the hand, not the
//!   whole shard.
//!   A strict compaction (`policy.rs`) does the same when the victims
//!   between the hand and the window suffice for the window's candidates;
//!   only when the hand would have to pass the window does it judge over
//!   the whole arena.
//! * Every compaction is a move (`seq` odd while it runs) under
//!   `REWRITING`: a holder that dies inside one leaves the shard to be
//!   reset, not salvaged.
//! * `give_back` makes room on the file system for a spilled value: it
//!   evicts and compacts, lowers `ARENA_RESERVED` to the bump rounded up
//!   to the growth step and punches the pages above, inside a move
//!   (readers that overlap it retry). `evict_spilled` drops spilled
//!   entries in SIEVE order until their files free what a new one needs.

use super::{Check, Corrupt, Entry, Now, ShardGuard};
use crate::hash::tag_of;
use crate::layout::*;
use std::ptr;

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

/// Percent a strict compaction of a shard of one segment frees (the
/// window it judges is what was appended since the last one: see
/// `policy.rs`). Half of `COMPACT_FREE_PERCENT`: on loops and scans the
/// window is room the candidates hold only to lose it, and at 10% the
/// LIRS traces cs and ps stayed 0.01-0.03 under W-TinyLFU (cs@704 0.386
/// against 0.406 at 5%, ps@1,542 0.678 against 0.693); 3% measured the
/// same as 5%.
const STRICT_FREE_PERCENT: usize = 5;

/// A lenient hand wraps round before the newest `1 / YOUNG_SHARE` of the
/// used arena (the young entries) while the older ones can free enough:
/// a new entry stays at least that long. A segmented shard keeps its
/// newest twelfth of segments young alike (`conveyor.rs`,
/// `young_segment`; at `MIN_SEGMENTS`, 12, the head alone). SIEVE's hand
/// otherwise settles where the newest entries are and evicts them as
/// they come, while entries hit before a working set moved keep their
/// marks for a whole lap: on a
/// shifting working set (`nearcache bench traces`, gen-shift, 1,506
/// entries) 0.840 instead of 0.820 (LRU 0.862), at a cost on Zipf of
/// 0.003-0.007 (a one-hit key stays longer); 1/8 gives 0.846 and costs
/// Zipf 0.004-0.011. Measured in engine.md, "Round ten". An adaptive
/// shard keeps half young instead while a working set moves
/// (`policy.rs`, `YOUNG_SHARE_HALF`; "Round eleven").
pub(super) const YOUNG_SHARE: usize = 12;

/// A compaction reads the live entries from the index instead of walking
/// the arena when the used arena holds at least this many bytes per live
/// entry (mostly dead copies): reading the index and sorting the few live
/// entries then costs less than reading every dead byte.
const SPARSE_ARENA_BYTES_PER_ITEM: usize = 1024;

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

impl<'a> ShardGuard<'a> {
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
        if self.segmented() {
            self.begin_write();
            let given = self.give_back_segments(need, now).unwrap_or_else(|c| {
                self.recover(c);
                0
            });
            self.end_write();
            return given;
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

    /// Compact: drop dead and expired entries, then (if `evict`)
    /// SIEVE-evict until at least `need` bytes and COMPACT_FREE_PERCENT of
    /// the reserved arena and of the index load limit are free. Without
    /// `evict`, entries are evicted only if the index cannot hold the
    /// survivors. Inside begin/end_write.
    pub(super) fn compact(&self, need: usize, evict: bool, now: &mut Now) {
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
        // Strict admission judges the window first: from the hand when the
        // victims after it suffice, else over the whole arena.
        let strict = evict && self.strict();
        if evict && self.compact_from_hand(need, bump, reserved, active, items, t, strict)? {
            return Ok(());
        }
        self.note_examined(bump);
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
            Self::eviction_targets(need, arena, active, strict)
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
        let window = self.window_start();
        // The first window entry left unjudged: the window starts there.
        let mut unjudged = None;
        if strict && n > 0 {
            // The entries appended since the last compaction, and those it
            // left, are the window (`policy.rs`): each unhit one meets the
            // hand's next victim among the older entries, and one of the
            // two goes, until the compaction has freed what it must.
            let first = entries.iter().position(|e| e.off >= window).unwrap_or(n);
            let arrivals = self.window_arrivals(n - first);
            for c in first..n {
                if visited[c] || !keep[c] {
                    continue;
                }
                if arena.saturating_sub(live_bytes) >= free_bytes_target && live_items <= max_items
                {
                    unjudged = Some(c);
                    break;
                }
                let mut victim = None;
                for _ in 0..2 * n + 1 {
                    let i = idx;
                    if keep[i] && entries[i].off < window {
                        if !visited[i] {
                            victim = Some(i);
                            break;
                        }
                        visited[i] = false;
                        self.note_hit(tags[i]);
                    }
                    idx = if i + 1 == n { 0 } else { i + 1 };
                }
                let Some(v) = victim else { break };
                let gone = if self.wins(tags[c], tags[v], arrivals.came_in(c - first)) {
                    idx = if v + 1 == n { 0 } else { v + 1 };
                    v
                } else {
                    c
                };
                keep[gone] = false;
                live_bytes -= entries[gone].size;
                live_items -= 1;
                evicted += 1;
                let e = entries[gone];
                self.note_dropped(&e);
            }
            self.note_window_judged(arrivals, unjudged.unwrap_or(n) - first);
        }
        // Lenient: the hand wraps before the young entries while the older
        // ones can free enough (at most two laps of them).
        let young_from =
            if strict { n } else { Self::young_from(&entries, bump, self.young_share()) };
        let mut wrap_at = if young_from == 0 { n } else { young_from };
        if idx >= wrap_at {
            idx = 0;
        }
        let mut steps = 0;
        let mut stop = idx;
        while (arena.saturating_sub(live_bytes) < free_bytes_target || live_items > max_items)
            && n > 0
            && steps < 2 * n + 1
        {
            if wrap_at < n && steps > 2 * wrap_at {
                wrap_at = n;
            }
            let e = &entries[idx];
            if keep[idx] {
                if visited[idx] {
                    visited[idx] = false;
                    self.note_hit(tags[idx]);
                } else {
                    keep[idx] = false;
                    live_bytes -= e.size;
                    live_items -= 1;
                    evicted += 1;
                    let e = *e;
                    self.note_dropped(&e);
                }
            }
            idx = if idx + 1 >= wrap_at { 0 } else { idx + 1 };
            stop = idx;
            steps += 1;
        }
        // Slide survivors down, preserving order.
        let mut new_off = vec![0usize; n];
        let mut slider = Slider::new(0);
        let mut new_hand = None;
        let mut new_window = None;
        for (i, e) in entries.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            if i >= stop && new_hand.is_none() {
                new_hand = Some(slider.write);
            }
            if new_window.is_none() && (!evict && e.off >= window || unjudged == Some(i)) {
                new_window = Some(slider.write);
            }
            new_off[i] = slider.keep(self, e);
        }
        let write = slider.flush(self);
        // The window starts at its first entry left unjudged (a compaction
        // that only dropped dead entries judged none), else at the end.
        self.set_window_start(new_window.unwrap_or(write));
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
    /// `strict`: the window (the entries from `window_start` on, at the
    /// end of the part behind the hand) is judged as the full strict
    /// compaction judges it, its candidates meeting the victims the hand
    /// finds before the window.
    ///
    /// Ok(false), with nothing changed, when it does not apply: the hand
    /// at the start (a full compaction is the same work), dead copies
    /// before the hand worth reclaiming (more than the compaction frees),
    /// or not enough to free behind the hand (the hand has to wrap around;
    /// strict: it would have to pass the window's start; lenient: the
    /// young entries' start).
    #[allow(clippy::too_many_arguments)]
    fn compact_from_hand(
        &self,
        need: usize,
        bump: usize,
        reserved: usize,
        active: usize,
        items: usize,
        t: u64,
        strict: bool,
    ) -> Check<bool> {
        let hand = self.hdr(sh::HAND) as usize;
        let (free_target, max_items) = Self::eviction_targets(need, reserved, active, strict);
        let live_bytes = (self.hdr(sh::LIVE_BYTES) as usize).min(bump);
        let window = self.window_start();
        if hand == 0
            || hand >= bump
            || bump - live_bytes > free_target
            || strict && !(hand < window && window <= bump)
            || !strict && hand >= Self::young_start(bump, self.young_share())
        {
            return Ok(false);
        }
        // What lies behind the hand, and the slot of each live entry.
        self.note_examined(bump - hand);
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
        let mut cleared = Vec::new();
        // Strict: the window's entries are the candidates, and the hand
        // stops at the window; lenient: the hand stops at the young
        // entries (a full compaction wraps it round).
        let (judged, candidates) = if strict {
            let w = region.iter().position(|e| e.off >= window).unwrap_or(region.len());
            (w, w..region.len())
        } else {
            (Self::young_from(&region, bump, self.young_share()), 0..0)
        };
        let mut hand_at = 0;
        let mut unjudged = None;
        // The hand's next victim before `judged`: visited entries it passes
        // are kept with their mark cleared. None: it reached the window.
        let mut next_victim = |hand_at: &mut usize, drop: &[bool], visited: &mut [bool]| {
            while *hand_at < judged {
                let k = *hand_at;
                *hand_at += 1;
                if drop[k] {
                    continue;
                }
                if !visited[k] {
                    return Some(k);
                }
                visited[k] = false;
                cleared.push(tags[k]);
            }
            None
        };
        let first = candidates.start;
        let arrivals = self.window_arrivals(if strict { candidates.len() } else { 0 });
        for c in candidates {
            if drop[c] || visited[c] {
                continue;
            }
            if met(freed, items_after) {
                unjudged = Some(c);
                break;
            }
            let Some(v) = next_victim(&mut hand_at, &drop, &mut visited) else {
                return Ok(false);
            };
            // The loser goes; a candidate that loses leaves the hand on its
            // victim, which the next candidate meets.
            let gone = if self.wins(tags[c], tags[v], arrivals.came_in(c - first)) {
                v
            } else {
                hand_at = v;
                c
            };
            drop[gone] = true;
            freed += region[gone].size;
            items_after = items_after.saturating_sub(1);
            evicted += 1;
        }
        while !met(freed, items_after) {
            let Some(v) = next_victim(&mut hand_at, &drop, &mut visited) else {
                return Ok(false);
            };
            drop[v] = true;
            freed += region[v].size;
            items_after = items_after.saturating_sub(1);
            evicted += 1;
        }
        let stop = hand_at;
        if strict {
            self.note_window_judged(arrivals, unjudged.unwrap_or(region.len()) - first);
        }
        // The hits the hand cleared reach the sketch (`policy.rs`).
        for tag in cleared {
            self.note_hit(tag);
        }
        // Slide the survivors down and point their slots at them; the
        // slots of the live entries dropped become tombstones.
        let mut slider = Slider::new(hand);
        let mut new_hand = None;
        let mut new_window = None;
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
            if unjudged.is_some_and(|u| k >= u) && new_window.is_none() {
                new_window = Some(slider.write);
            }
            let at = slider.keep(self, e);
            let mark = if visited[k] { SLOT_VISITED } else { 0 };
            let v = Self::tagged_slot(tags[k], at) | mark;
            if self.slot(slots[k]) != v {
                self.set_slot(slots[k], v);
            }
        }
        let write = slider.flush(self);
        // The window starts at its first entry left unjudged, else at the
        // end.
        self.set_window_start(new_window.unwrap_or(write));
        let mut purged = 0;
        let mut keep = Vec::new();
        for p in purge {
            purged += self.purge_cluster(p, active, &mut keep)?;
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

    /// The first of `entries` (in arena order) among the young: those in
    /// the newest `1 / share` of the used arena (`young_share`), which a
    /// lenient hand passes over.
    fn young_from(entries: &[Entry], bump: usize, share: usize) -> usize {
        let young = Self::young_start(bump, share);
        entries.partition_point(|e| e.off < young)
    }

    /// The arena offset where the young entries start in a used arena of
    /// `bump` bytes, the newest `1 / share` of it young.
    fn young_start(bump: usize, share: usize) -> usize {
        bump - bump / share
    }

    /// What an evicting compaction must reach: free arena bytes (`need`
    /// at least, and a share of the reserved arena) and the most live
    /// entries it may leave (that share below the index's load limit of
    /// 3/4). The share is COMPACT_FREE_PERCENT, or STRICT_FREE_PERCENT for
    /// a `strict` compaction.
    fn eviction_targets(
        need: usize,
        reserved: usize,
        active: usize,
        strict: bool,
    ) -> (usize, usize) {
        let percent = if strict { STRICT_FREE_PERCENT } else { COMPACT_FREE_PERCENT };
        (need.max(reserved * percent / 100), active * 3 / 4 * (100 - percent) / 100)
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
}
