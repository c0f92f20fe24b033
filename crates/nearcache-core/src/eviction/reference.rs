//! Plain reference implementations for the model tests: the same policies
//! written the obvious way (lists, one eviction at a time, no arena, no
//! compaction, no hand remapping), so the engine-shaped model can be
//! checked against them on random traces.

use super::key_hash;
use super::sketch::Sketch;
use std::collections::{HashMap, VecDeque};

/// Textbook SIEVE (Zhang et al., NSDI '24): a queue, new keys at the
/// head, a hand moving from the tail toward the head that clears visited
/// bits and evicts the first unvisited key.
pub struct RefSieve {
    cap: usize,
    /// Oldest first: index 0 is the tail.
    queue: Vec<(u64, bool)>,
    hand: usize,
}

impl RefSieve {
    pub fn new(cap: usize) -> RefSieve {
        RefSieve { cap, queue: Vec::new(), hand: 0 }
    }

    pub fn access(&mut self, key: u64) -> bool {
        if let Some(e) = self.queue.iter_mut().find(|e| e.0 == key) {
            e.1 = true;
            return true;
        }
        if self.queue.len() == self.cap {
            loop {
                if self.hand >= self.queue.len() {
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
