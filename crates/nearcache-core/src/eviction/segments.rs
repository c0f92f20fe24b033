//! The segment-granular arena: the shard's arena as fixed segments in a
//! FIFO of insertion order, evicted a segment group at a time.
//!
//! This is the arena the engine's shard is moving to: segments of equal
//! size (`Config::segments` per shard; ~256 KiB in the engine, so 8 in a
//! 2 MiB shard), new entries appended to the head segment, a free pool of
//! empty segments. When the head is full and the pool is empty, the hand's
//! segment is merged with the next one (or two, if two do not free one):
//! the policy decides every entry of the group, the survivors are copied
//! in order into the first segment(s) of the group, and the segments
//! emptied go to the pool. The hand then moves past the group, skipping
//! the head, and wraps to the oldest segment (SIEVE over segments).
//!
//! Two ways of running a policy on it are modelled. With
//! `Config::segment_cleaner` (the default of the W-TinyLFU family), the
//! policy evicts one entry at a time with its own hands, exactly as on the
//! entry-granular arena, keeping the live bytes at least two segments (and
//! `Config::segment_slack` percent) under the arena; an evicted entry stays
//! in its segment as a hole, a window entry moved to the newest end is a
//! copy into the head segment, and room is made by merging the two or three
//! adjacent segments (head included) that free one and hold the most hole
//! bytes ([`ArenaShard::clean_for`]). Without it (SIEVE's default, the
//! arena as first designed) the policy sees whole groups at one hand rather
//! than one victim at a time:
//!
//! * `Sieve`: a visited entry survives (its bit cleared), an unvisited one
//!   is evicted.
//! * W-TinyLFU family: a main entry hit since the hand last passed
//!   survives (its counter goes to the sketch); a window entry hit while in
//!   the window is moved to the head segment (CLOCK's reinsertion: a copy);
//!   the group's unhit window entries are candidates and its unhit main
//!   entries victims. While the window is over its share, each candidate
//!   (oldest first) duels the group's next victim exactly as in the
//!   entry-granular model, the loser evicted; candidates under the window's
//!   share stay, as do victims the duels did not reach, unless the main is
//!   over its share (then they go, as the main's hand would evict them).
//!
//! With `Config::segment_fill`, a group whose survivors would fill less
//! than half a segment takes in the next segment too (and so on up to the
//! head), so a merge does not leave a mostly empty segment that only the
//! next pass of the hand would reclaim; without it the group is two or
//! three segments, as first designed.
//!
//! If the survivors of three segments still fill three, the group's
//! survivors are evicted oldest first until two hold them (their second
//! chance is spent: the hand cleared their bits), so every merge frees at
//! least one segment.

use super::{ArenaShard, Ent, Policy, Walk};

impl ArenaShard {
    /// Make room for `size` bytes at the head segment: a new segment from
    /// the pool, or a merge at the hand. False if it cannot be made (an
    /// entry larger than a segment).
    pub(super) fn segment_room(&mut self, size: u64) -> bool {
        if size > self.seg_cap {
            return false;
        }
        // Each merge frees a segment; the bound only guards a bug.
        if self.cleaner {
            return self.clean_for(size);
        }
        for _ in 0..=self.seg_count * 4 + 4 {
            if let Some(&used) = self.seg_used.last() {
                if used + size <= self.seg_cap {
                    return true;
                }
            }
            if self.seg_free > 0 {
                self.open_segment();
                continue;
            }
            self.merge_at_hand();
        }
        false
    }

    /// Take a segment from the pool as the new head.
    fn open_segment(&mut self) {
        self.seg_free -= 1;
        self.seg_used.push(0);
        self.seg_len.push(0);
        self.seg_dead.push(0);
    }

    /// Count the entry at arena position `i` (just evicted or moved) as a
    /// hole of its segment (the cleaner's bookkeeping; an entry still
    /// waiting for the head is counted when it gets there).
    pub(super) fn mark_dead(&mut self, i: usize) {
        let mut start = 0usize;
        for (s, &n) in self.seg_len.iter().enumerate() {
            if i < start + n {
                self.seg_dead[s] += self.arena[i].size;
                return;
            }
            start += n;
        }
    }

    /// Account a new entry of `size` bytes to the head segment.
    pub(super) fn segment_append(&mut self, size: u64) {
        if let (Some(u), Some(l)) = (self.seg_used.last_mut(), self.seg_len.last_mut()) {
            *u += size;
            *l += 1;
        }
    }

    /// Merge the group at the hand (see the module docs).
    fn merge_at_hand(&mut self) {
        self.compactions += 1;
        let head = self.seg_used.len() - 1;
        if self.seg_hand + 2 > head {
            self.seg_hand = 0;
        }
        let h = self.seg_hand;
        let a: usize = self.seg_len[..h].iter().sum();
        let share = self.window_share();
        self.after_bytes = self.cap_bytes - self.seg_cap;
        self.after_items = self.max_items - self.max_items / self.seg_count as u64;
        let mut k = 2.min(head - h);
        let mut b = a + self.seg_len[h..h + k].iter().sum::<usize>();
        let mut moved: Vec<Ent> = Vec::new();
        self.decide(a, b, share, &mut moved);
        loop {
            let survivors = self.group_bytes(a, b);
            let too_full = survivors > (k as u64 - 1) * self.seg_cap && k < 3;
            let sparse = self.fill && survivors < self.seg_cap / 2;
            if !(too_full || sparse) || h + k >= head {
                break;
            }
            let extra = self.seg_len[h + k];
            self.decide(b, b + extra, share, &mut moved);
            b += extra;
            k += 1;
        }
        // Still too full: the survivors go oldest first (bits spent).
        let room = (k as u64 - 1) * self.seg_cap;
        let mut i = a;
        while self.group_bytes(a, b) > room && i < b {
            if !self.arena[i].evicted {
                let main = !self.arena[i].small;
                self.remember(i, !main);
                self.drop_entry(i, false);
            }
            i += 1;
        }
        // Survivors copied in order into the first segment(s) of the group.
        let survivors = self.group_bytes(a, b);
        let live_entries = (a..b).filter(|&j| !self.arena[j].evicted).count();
        self.seg_copied += survivors;
        let mut out_used = Vec::new();
        let mut out_len = Vec::new();
        let mut fill = 0u64;
        let mut n = 0usize;
        for j in a..b {
            let e = &self.arena[j];
            if e.evicted {
                continue;
            }
            if fill + e.size > self.seg_cap {
                out_used.push(fill);
                out_len.push(n);
                fill = 0;
                n = 0;
            }
            fill += e.size;
            n += 1;
        }
        if n > 0 || out_used.is_empty() {
            out_used.push(fill);
            out_len.push(n);
        }
        debug_assert_eq!(out_len.iter().sum::<usize>(), live_entries);
        let kept = out_used.len();
        self.seg_free += k - kept;
        if self.cfg.segment_fifo {
            if h < self.seg_hand {
                self.seg_hand -= (k - kept).min(self.seg_hand - h);
            } else if h == self.seg_hand {
                self.seg_hand = h + kept;
            }
        }
        self.seg_used.splice(h..h + k, out_used);
        self.seg_len.splice(h..h + k, out_len);
        self.seg_dead.splice(h..h + k, std::iter::repeat(0).take(kept));
        self.seg_hand = h + kept;
        // Drop the evicted and moved entries, keep the order.
        let before_hand =
            (0..self.hand).filter(|&j| !self.arena.get(j).is_some_and(|e| e.evicted)).count();
        let before_small =
            (0..self.small_hand).filter(|&j| !self.arena.get(j).is_some_and(|e| e.evicted)).count();
        self.arena.retain(|e| !e.evicted);
        self.hand = before_hand;
        self.small_hand = before_small;
        // The moved window entries go to the head segment.
        for e in moved {
            let fits = self.seg_used.last().is_some_and(|&u| u + e.size <= self.seg_cap);
            if !fits {
                if self.seg_free == 0 {
                    // No room left for the copy: it is evicted instead.
                    self.bytes -= e.size;
                    self.items -= 1;
                    if e.small {
                        self.small_bytes -= e.size;
                        self.small_items -= 1;
                    }
                    if self.cfg.policy.ghost_window() {
                        let fp = super::ghost::Ghost::fingerprint(e.hash);
                        self.window_ghost.push_at(fp, self.inserts);
                    }
                    continue;
                }
                self.open_segment();
            }
            self.seg_moved += e.size;
            self.arena.push(e);
            self.segment_append(e.size);
        }
        self.index.clear();
        for (j, e) in self.arena.iter().enumerate() {
            self.index.insert(e.key, j);
        }
    }

    /// The cleaner: the policy chooses its victims one at a time with its
    /// own hands, exactly as on the entry-granular arena, and they stay in
    /// their segments as holes; room is made by merging the group of two
    /// (or three) consecutive segments, the head included, that frees a
    /// segment and holds the most hole bytes (a log-structured cleaner's
    /// greedy choice). While no group frees a segment, the policy evicts.
    fn clean_for(&mut self, size: u64) -> bool {
        loop {
            // Window entries moved to the head while the policy evicted
            // wait at the arena's end for room in the head segment.
            while let Some(&m) = self.seg_pending.first() {
                if !self.head_room(m) {
                    break;
                }
                self.seg_pending.remove(0);
                let at: usize = self.seg_len.iter().sum();
                let dead = self.arena[at].evicted;
                self.segment_append(m);
                if dead {
                    if let Some(d) = self.seg_dead.last_mut() {
                        *d += m;
                    }
                }
            }
            if self.seg_pending.is_empty() {
                if let Some(&used) = self.seg_used.last() {
                    if used + size <= self.seg_cap {
                        return true;
                    }
                }
                if self.seg_free > 0 {
                    self.open_segment();
                    continue;
                }
            }
            if let Some((h, k)) = self.best_group() {
                self.compactions += 1;
                self.merge_holes(h, k);
                continue;
            }
            if self.items == 0 {
                return false;
            }
            self.evict_one();
        }
    }

    /// The group `(first segment, segments)` to merge, if any frees one.
    fn best_group(&self) -> Option<(usize, usize)> {
        if self.cfg.segment_fifo {
            return self.fifo_group();
        }
        // The head may be merged too: the window's losers are its holes.
        let n = self.seg_used.len();
        let mut best: Option<(u64, usize, usize)> = None;
        for h in 0..n {
            for k in 2..=3usize {
                if h + k > n {
                    break;
                }
                let used: u64 = self.seg_used[h..h + k].iter().sum();
                let holes: u64 = self.seg_dead[h..h + k].iter().sum();
                let live = used - holes;
                let kept = live.div_ceil(self.seg_cap).max(1) as usize;
                if kept < k && !matches!(best, Some((x, _, _)) if x >= holes) {
                    best = Some((holes, h, k));
                }
            }
        }
        best.map(|(_, h, k)| (h, k))
    }

    /// `Config::segment_fifo`: a segment of holes alone (not the head), or
    /// the fewest segments from the cleaning cursor (up to four, never the
    /// head) that free one.
    fn fifo_group(&self) -> Option<(usize, usize)> {
        let n = self.seg_used.len();
        if n < 2 {
            return None;
        }
        let last = n - 1; // the head
        if let Some(h) =
            (0..last).find(|&h| self.seg_used[h] > 0 && self.seg_used[h] == self.seg_dead[h])
        {
            return Some((h, 1));
        }
        let start = if self.seg_hand + 2 > last { 0 } else { self.seg_hand };
        for k in 2..=4usize {
            if start + k > last {
                break;
            }
            let used: u64 = self.seg_used[start..start + k].iter().sum();
            let holes: u64 = self.seg_dead[start..start + k].iter().sum();
            let kept = (used - holes).div_ceil(self.seg_cap).max(1) as usize;
            if kept < k {
                return Some((start, k));
            }
        }
        None
    }

    /// Merge segments `h..h + k`: live entries copied in order into the
    /// first, holes dropped, emptied segments to the pool.
    fn merge_holes(&mut self, h: usize, k: usize) {
        let a: usize = self.seg_len[..h].iter().sum();
        let b = a + self.seg_len[h..h + k].iter().sum::<usize>();
        let live = self.group_bytes(a, b);
        self.seg_copied += live;
        let (out_used, out_len) = self.pack(a, b);
        let kept = out_used.len();
        self.seg_free += k - kept;
        self.seg_used.splice(h..h + k, out_used);
        self.seg_len.splice(h..h + k, out_len);
        self.seg_dead.splice(h..h + k, std::iter::repeat(0).take(kept));
        self.drop_evicted(a, b);
    }

    /// The segments (bytes, entries) the live entries of `a..b` fill when
    /// copied in order.
    fn pack(&self, a: usize, b: usize) -> (Vec<u64>, Vec<usize>) {
        let mut out_used = Vec::new();
        let mut out_len = Vec::new();
        let mut fill = 0u64;
        let mut n = 0usize;
        for e in &self.arena[a..b] {
            if e.evicted {
                continue;
            }
            if fill + e.size > self.seg_cap {
                out_used.push(fill);
                out_len.push(n);
                fill = 0;
                n = 0;
            }
            fill += e.size;
            n += 1;
        }
        if n > 0 || out_used.is_empty() {
            out_used.push(fill);
            out_len.push(n);
        }
        (out_used, out_len)
    }

    /// Whether the head segment (or the pool) has room for `size` bytes
    /// now, without a merge: a window entry moved to the head needs it.
    pub(super) fn head_room(&mut self, size: u64) -> bool {
        if self.seg_used.last().is_some_and(|&u| u + size <= self.seg_cap) {
            return true;
        }
        if self.seg_free > 0 && size <= self.seg_cap {
            self.open_segment();
            return true;
        }
        false
    }

    fn group_bytes(&self, a: usize, b: usize) -> u64 {
        self.arena[a..b].iter().filter(|e| !e.evicted).map(|e| e.size).sum()
    }

    /// The policy's decisions over the entries `a..b` of a group.
    fn decide(&mut self, a: usize, b: usize, share: f64, moved: &mut Vec<Ent>) {
        if self.cfg.policy == Policy::Sieve {
            for i in a..b {
                if self.arena[i].freq > 0 {
                    self.arena[i].freq = 0;
                } else {
                    self.drop_entry(i, false);
                }
            }
            return;
        }
        let feed = self.cfg.policy.counter_feed();
        let mut candidates = Vec::new();
        let mut victims = std::collections::VecDeque::new();
        for i in a..b {
            let e = self.arena[i];
            if !e.small {
                if e.freq > 0 {
                    self.arena[i].freq = 0;
                    if feed {
                        self.sketch.add(e.hash, e.freq);
                    }
                } else {
                    victims.push_back(i);
                }
            } else if e.freq > 0 && self.cfg.walk != Walk::Fifo {
                if feed {
                    self.sketch.add(e.hash, e.freq);
                }
                let mut m = e;
                m.freq = 0;
                self.arena[i].evicted = true;
                moved.push(m);
            } else {
                candidates.push(i);
            }
        }
        let window = (self.cap_bytes as f64 * share) as u64;
        let window_items = (self.after_items as f64 * share) as u64;
        for c in candidates {
            if self.small_bytes <= window {
                continue; // the window is within its share: the candidate stays
            }
            let cand = self.arena[c];
            let main_items = self.items - self.small_items;
            let main_bytes = self.bytes - self.small_bytes;
            if main_bytes + cand.size <= self.after_bytes.saturating_sub(window)
                && main_items < self.after_items.saturating_sub(window_items)
            {
                self.promote(c);
                continue;
            }
            let Some(&v) = victims.front() else {
                self.remember(c, true);
                self.drop_entry(c, false);
                continue;
            };
            let bonus = if feed { cand.freq } else { 0 };
            let fc = self.sketch.estimate(cand.hash).saturating_add(bonus);
            let fv = self.sketch.estimate(self.arena[v].hash);
            if feed {
                self.sketch.add(cand.hash, cand.freq);
            }
            let hit_in_window = cand.freq > 0;
            let wins = fc > fv.saturating_add(self.cfg.admit_margin)
                || (self.cfg.policy == Policy::WTinyLfuRecency && hit_in_window)
                || (self.cfg.tie_break && fc == fv && hit_in_window);
            if wins {
                victims.pop_front();
                self.remember(v, false);
                self.drop_entry(v, false);
                self.arena[c].freq = 0;
                self.promote(c);
            } else {
                self.remember(c, true);
                self.drop_entry(c, false);
            }
        }
        // The main over its share of what the merge leaves: its unhit
        // entries at the hand go until it is back within it.
        for v in victims {
            if self.bytes - self.small_bytes <= self.after_bytes.saturating_sub(window) {
                break;
            }
            self.remember(v, false);
            self.drop_entry(v, false);
        }
    }
}
