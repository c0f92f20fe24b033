//! Two conveyors in one segment chain (`Config::queues`): the W-TinyLFU
//! family as the engine's segmented shard could run it with a second
//! conveyor.
//!
//! The shard's segments form one FIFO chain: the main part at the old
//! end, the window (the newest entries) at the new end, new entries
//! appended to the head segment. Two conveyors (each a pair of cursors
//! that reads entries, judges them, copies the survivors down and frees a
//! segment once it has emptied it) walk the chain:
//!
//! * the main conveyor is the SIEVE main hand: from the main part's oldest
//!   entry toward its newest, wrapping, it clears the hit counters it
//!   passes (into the sketch) and stops at the first unhit main entry, the
//!   victim;
//! * the window conveyor sits at the boundary between the main part and
//!   the window: while the window is over its share it takes the window's
//!   oldest entry; a hit one is copied to the head (CLOCK), an unhit one
//!   duels the main victim; a winner is copied to the main part's newest
//!   end (which is where that conveyor writes) and the victim is evicted,
//!   a loser goes to the window ghost.
//!
//! The policy's decisions are exactly `evict_one`'s with one eviction at a
//! time. What this form changes is where a promoted candidate goes (its
//! copy at the main part's newest end, so the main part's order is
//! promotion order) and what the arena costs: both conveyors compact as
//! they go, so there are no holes and no cleaner slack, only fragments
//! (the head partly filled and each conveyor's gap, at most a segment
//! each), which are accounted outside the model from the live bytes.
//!
//! In the model's vector a moved entry leaves a dead copy behind; each
//! hand filters its own queue, so the interleaving of window and main
//! entries in the vector does not matter, only each queue's order.
//! [`ArenaShard::tidy`] drops the dead copies once they outnumber the live
//! entries (amortized constant work per eviction; the hands follow their
//! entries).

use super::ArenaShard;

impl ArenaShard {
    /// Evict one entry at a time until `size` more bytes and one more
    /// entry fit (the caller refuses an entry larger than the arena).
    pub(super) fn conveyor_room(&mut self, size: u64) {
        let full = |s: &ArenaShard| s.bytes + size > s.cap_bytes || s.items >= s.max_items;
        if !full(self) {
            return;
        }
        self.compactions += 1;
        // What the evictions leave at most: the new entry's room, as a
        // compaction freeing exactly it would.
        self.after_bytes = self.cap_bytes.saturating_sub(size);
        self.after_items = self.max_items - 1;
        while full(self) && self.items > 0 {
            self.evict_one();
        }
        self.tidy();
    }

    /// Copy a promoted window entry (its queue bit already cleared) to the
    /// main part's newest end: the window conveyor writes it where it reads.
    pub(super) fn move_to_main(&mut self, i: usize) {
        let e = self.arena[i];
        self.arena[i].evicted = true;
        self.seg_moved += e.size;
        self.index.insert(e.key, self.arena.len());
        self.arena.push(e);
    }

    /// Drop the dead entries from the model's vector once they outnumber
    /// the live ones, keeping the order; the hands move to the live entry
    /// they pointed at (or the next one).
    pub(super) fn tidy(&mut self) {
        if self.arena.len() <= 2 * self.items as usize + 64 {
            return;
        }
        self.drop_evicted(0, self.arena.len());
        self.tidied += 1;
    }
}
