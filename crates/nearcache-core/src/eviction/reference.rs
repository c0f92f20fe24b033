//! Plain reference implementations for the model tests: the same policies
//! written the obvious way (lists, one eviction at a time, no arena, no
//! compaction, no hand remapping), so the engine-shaped model can be
//! checked against them on random traces.

use super::key_hash;
use super::sketch::Sketch;
use std::collections::{HashMap, VecDeque};

/// Textbook SIEVE (Zhang et al., NSDI '24): a queue, new keys at the
/// head, a hand moving from the tail toward the head that clears visited
/// bits and evicts the first unvisited key. With a young share, the hand
/// goes back to the tail when it reaches the newest `len / young_share`
/// keys, as long as the older ones hold a victim.
pub struct RefSieve {
    cap: usize,
    /// Oldest first: index 0 is the tail.
    queue: Vec<(u64, bool)>,
    hand: usize,
    young_share: usize,
}

impl RefSieve {
    pub fn new(cap: usize) -> RefSieve {
        RefSieve { cap, queue: Vec::new(), hand: 0, young_share: 0 }
    }

    /// SIEVE that spares the newest `len / young_share` keys.
    pub fn with_young(cap: usize, young_share: usize) -> RefSieve {
        RefSieve { young_share, ..RefSieve::new(cap) }
    }

    pub fn access(&mut self, key: u64) -> bool {
        if let Some(e) = self.queue.iter_mut().find(|e| e.0 == key) {
            e.1 = true;
            return true;
        }
        if self.queue.len() == self.cap {
            let len = self.queue.len();
            let young = len.checked_div(self.young_share).unwrap_or(0);
            let end = if young == 0 || young >= len { len } else { len - young };
            loop {
                if self.hand >= end {
                    self.hand = 0;
                }
                if self.queue[self.hand].1 {
                    self.queue[self.hand].1 = false;
                    self.hand += 1;
                } else {
                    self.queue.remove(self.hand);
                    break;
                }
            }
        }
        self.queue.push((key, false));
        false
    }
}

/// Exact LRU by entry count.
pub struct RefLru {
    cap: usize,
    clock: u64,
    at: HashMap<u64, u64>,
    order: std::collections::BTreeMap<u64, u64>,
}

impl RefLru {
    pub fn new(cap: usize) -> RefLru {
        RefLru { cap, clock: 0, at: HashMap::new(), order: Default::default() }
    }

    pub fn access(&mut self, key: u64) -> bool {
        self.clock += 1;
        let hit = if let Some(t) = self.at.insert(key, self.clock) {
            self.order.remove(&t);
            true
        } else {
            false
        };
        self.order.insert(self.clock, key);
        if self.at.len() > self.cap {
            let (&t, &k) = self.order.iter().next().expect("non-empty");
            self.order.remove(&t);
            self.at.remove(&k);
        }
        hit
    }
}

/// Window TinyLFU as the model runs it, written with two lists: a FIFO
/// window of `window` entries and a SIEVE main; hits raise a counter
/// capped at `counter_max`, which the main's hand adds to the sketch as
/// it clears it (or, with `exact_feed`, every hit goes to the sketch).
pub struct RefWTinyLfu {
    cap: usize,
    window: usize,
    counter_max: u8,
    exact_feed: bool,
    win: VecDeque<(u64, u8)>,
    main: Vec<(u64, u8)>,
    hand: usize,
    pub sketch: Sketch,
}

impl RefWTinyLfu {
    pub fn new(cap: usize, window: usize, counter_max: u8, exact_feed: bool) -> RefWTinyLfu {
        RefWTinyLfu {
            cap,
            window,
            counter_max,
            exact_feed,
            win: VecDeque::new(),
            main: Vec::new(),
            hand: 0,
            sketch: Sketch::new(cap, 1.0),
        }
    }

    pub fn len(&self) -> usize {
        self.win.len() + self.main.len()
    }

    pub fn access(&mut self, key: u64) -> bool {
        let h = key_hash(key);
        let max = self.counter_max;
        let found = self
            .win
            .iter_mut()
            .chain(self.main.iter_mut())
            .find(|e| e.0 == key)
            .map(|e| e.1 = (e.1 + 1).min(max));
        if found.is_some() {
            if self.exact_feed {
                self.sketch.add(h, 1);
            }
            return true;
        }
        self.sketch.add(h, 1);
        while self.win.len() + self.main.len() == self.cap {
            self.evict();
        }
        self.win.push_back((key, 0));
        false
    }

    /// The main's next victim: SIEVE, counters drained into the sketch.
    fn victim(&mut self) -> usize {
        loop {
            if self.hand >= self.main.len() {
                self.hand = 0;
            }
            let (k, f) = self.main[self.hand];
            if f == 0 {
                return self.hand;
            }
            self.main[self.hand].1 = 0;
            if !self.exact_feed {
                self.sketch.add(key_hash(k), f);
            }
            self.hand += 1;
        }
    }

    fn evict(&mut self) {
        if !self.win.is_empty() && (self.win.len() > self.window || self.main.is_empty()) {
            let (ck, cf) = self.win.pop_front().expect("non-empty");
            // Room in the main queue (one entry is being freed): move in.
            if self.main.len() < (self.cap - 1).saturating_sub(self.window) {
                self.main.push((ck, cf));
                return;
            }
            if self.main.is_empty() {
                return;
            }
            let v = self.victim();
            let ch = key_hash(ck);
            let feed = if self.exact_feed { 0 } else { cf };
            let fc = self.sketch.estimate(ch).saturating_add(feed);
            let fv = self.sketch.estimate(key_hash(self.main[v].0));
            if !self.exact_feed {
                self.sketch.add(ch, cf);
            }
            if fc > fv {
                self.main.remove(v);
                self.hand = v;
                self.main.push((ck, 0));
            }
        } else if !self.main.is_empty() {
            let v = self.victim();
            self.main.remove(v);
            self.hand = v;
        } else {
            self.win.pop_front();
        }
    }
}

/// The ghost-adaptive Window TinyLFU (`Policy::WTinyLfuGhost`) written
/// with lists: a window deque walked like CLOCK (a hit entry goes to the
/// back, its counter to the sketch), a SIEVE main, a conservative-update
/// sketch fed by misses and cleared counters, a duel the candidate wins by
/// more than one count, and two ghost deques of (fingerprint, insertion
/// stamp) whose hits move the window's target as ARC's does, when the key
/// came back within twice the evicting queue's size in insertions.
pub struct RefWTinyLfuGhost {
    cap: usize,
    ghost_len: usize,
    counter_max: u8,
    win: VecDeque<(u64, u8)>,
    main: Vec<(u64, u8)>,
    hand: usize,
    sketch: Sketch,
    target: f64,
    window_ghost: VecDeque<(u32, u64)>,
    main_ghost: VecDeque<(u32, u64)>,
    inserts: u64,
}

impl RefWTinyLfuGhost {
    /// `ghost_len`: how many records each ghost keeps.
    pub fn new(cap: usize, ghost_len: usize, counter_max: u8) -> RefWTinyLfuGhost {
        let mut sketch = Sketch::new(cap, 1.0);
        sketch.conservative = true;
        RefWTinyLfuGhost {
            cap,
            ghost_len: ghost_len.max(1),
            counter_max,
            win: VecDeque::new(),
            main: Vec::new(),
            hand: 0,
            sketch,
            target: cap as f64 / 100.0,
            window_ghost: VecDeque::new(),
            main_ghost: VecDeque::new(),
            inserts: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.win.len() + self.main.len()
    }

    /// The window's target share of the cache.
    pub fn share(&self) -> f64 {
        self.target / self.cap as f64
    }

    fn age(ghost: &VecDeque<(u32, u64)>, fp: u32, now: u64) -> Option<u64> {
        ghost.iter().rev().find(|g| g.0 == fp).map(|g| now - g.1)
    }

    fn remember(&mut self, key: u64, window: bool) {
        let fp = (key_hash(key) >> 16) as u32;
        let g = if window { &mut self.window_ghost } else { &mut self.main_ghost };
        if g.len() == self.ghost_len {
            g.pop_front();
        }
        g.push_back((fp, self.inserts));
    }

    pub fn access(&mut self, key: u64) -> bool {
        let max = self.counter_max;
        if let Some(e) = self.win.iter_mut().chain(self.main.iter_mut()).find(|e| e.0 == key) {
            e.1 = (e.1 + 1).min(max);
            return true;
        }
        let h = key_hash(key);
        self.sketch.add(h, 1);
        let fp = (h >> 16) as u32;
        let c = self.cap as f64;
        let (w, m) = (self.window_ghost.len().max(1) as f64, self.main_ghost.len().max(1) as f64);
        if let Some(age) = Self::age(&self.window_ghost, fp, self.inserts) {
            if age as f64 <= 2.0 * self.target {
                self.target = (self.target + 4.0 * (m / w).max(1.0)).min(c * 90.0 / 100.0);
            }
        } else if let Some(age) = Self::age(&self.main_ghost, fp, self.inserts) {
            if age as f64 <= 2.0 * (c - self.target) {
                self.target = (self.target - 4.0 * (w / m).max(1.0)).max(c / 100.0);
            }
        }
        while self.len() >= self.cap {
            self.evict();
        }
        self.inserts += 1;
        self.win.push_back((key, 0));
        false
    }

    /// The main's next victim: SIEVE, counters drained into the sketch.
    fn victim(&mut self) -> usize {
        loop {
            if self.hand >= self.main.len() {
                self.hand = 0;
            }
            let (k, f) = self.main[self.hand];
            if f == 0 {
                return self.hand;
            }
            self.main[self.hand].1 = 0;
            self.sketch.add(key_hash(k), f);
            self.hand += 1;
        }
    }

    /// The window's candidate: CLOCK over the window deque.
    fn candidate(&mut self) -> (u64, u8) {
        let mut passes = 0;
        loop {
            let (k, f) = self.win.pop_front().expect("non-empty window");
            // (the model counts the candidate itself among the window's entries)
            if f == 0 || passes > self.win.len() + 1 {
                return (k, f);
            }
            passes += 1;
            self.sketch.add(key_hash(k), f);
            self.win.push_back((k, 0));
        }
    }

    fn evict(&mut self) {
        let after = (self.cap - 1) as u64;
        let share = self.share();
        let window_bytes = (self.cap as f64 * share) as u64;
        let window_items = (after as f64 * share) as u64;
        let main = self.main.len() as u64;
        if !self.win.is_empty() && (self.win.len() as u64 > window_bytes || self.main.is_empty()) {
            let (ck, cf) = self.candidate();
            if main < after.saturating_sub(window_bytes)
                && main < after.saturating_sub(window_items)
            {
                self.main.push((ck, cf));
                return;
            }
            if self.main.is_empty() {
                self.remember(ck, true);
                return;
            }
            let v = self.victim();
            let ch = key_hash(ck);
            let fc = self.sketch.estimate(ch).saturating_add(cf);
            let fv = self.sketch.estimate(key_hash(self.main[v].0));
            self.sketch.add(ch, cf);
            if fc > fv.saturating_add(1) {
                let (vk, _) = self.main.remove(v);
                self.remember(vk, false);
                self.hand = v;
                self.main.push((ck, 0));
            } else {
                self.remember(ck, true);
            }
        } else if !self.main.is_empty() {
            let v = self.victim();
            let (vk, _) = self.main.remove(v);
            self.remember(vk, false);
            self.hand = v;
        } else if let Some((k, _)) = self.win.pop_front() {
            self.remember(k, true);
        }
    }
}
