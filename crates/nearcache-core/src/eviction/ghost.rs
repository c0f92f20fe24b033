//! The ghost queue: fingerprints of recently evicted keys, no values.
//!
//! S3-FIFO (Yang et al., SOSP '23) sends a key that misses while its
//! fingerprint is still in the ghost straight to the main queue: it was
//! evicted from the small queue too early. The ghost is a FIFO ring of
//! 32-bit fingerprints, as long as the main queue holds entries, with a
//! small open-addressing count table for membership; both are bounded by
//! the ring's length, so a hostile file can fill it with chosen
//! fingerprints (admitting keys it should not) but cannot make it grow.
//!
//! Each fingerprint may carry a stamp (the shard's insertion count when it
//! was pushed), so a policy can ask how long ago a returning key was
//! evicted ([`Ghost::age`]): the adaptive window counts a ghost hit only
//! when the key came back soon enough for a larger window (or main) to
//! have kept it.

use std::collections::HashMap;

/// Bounded FIFO of fingerprints with membership counts.
#[derive(Clone, Debug)]
pub struct Ghost {
    ring: Vec<u32>,
    next: usize,
    len: usize,
    /// Per fingerprint: how many ring places hold it, and the newest stamp.
    counts: HashMap<u32, (u32, u64)>,
}

impl Ghost {
    /// A ghost remembering the last `capacity` fingerprints (at least 1).
    pub fn new(capacity: usize) -> Ghost {
        let n = capacity.max(1);
        Ghost { ring: vec![0; n], next: 0, len: 0, counts: HashMap::new() }
    }

    /// The fingerprint of a key hash (the bits the shard and slot do not use).
    pub fn fingerprint(hash: u64) -> u32 {
        (hash >> 16) as u32
    }

    /// Whether `fp` was evicted within the ghost's memory.
    pub fn contains(&self, fp: u32) -> bool {
        self.counts.contains_key(&fp)
    }

    /// How long ago (in the stamps' unit) `fp` was last pushed, if it is
    /// remembered.
    pub fn age(&self, fp: u32, now: u64) -> Option<u64> {
        self.counts.get(&fp).map(|&(_, at)| now.saturating_sub(at))
    }

    /// Fingerprints remembered (at most the capacity).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Remember `fp`, forgetting the oldest fingerprint once full.
    pub fn push(&mut self, fp: u32) {
        self.push_at(fp, 0);
    }

    /// Remember `fp` with the stamp `at`, forgetting the oldest once full.
    pub fn push_at(&mut self, fp: u32, at: u64) {
        if self.len == self.ring.len() {
            let old = self.ring[self.next];
            if let Some(c) = self.counts.get_mut(&old) {
                c.0 -= 1;
                if c.0 == 0 {
                    self.counts.remove(&old);
                }
            }
        } else {
            self.len += 1;
        }
        self.ring[self.next] = fp;
        let c = self.counts.entry(fp).or_insert((0, at));
        c.0 += 1;
        c.1 = at;
        self.next = (self.next + 1) % self.ring.len();
    }

    /// Bytes the ring takes (4 per remembered key).
    pub fn bytes(&self) -> usize {
        self.ring.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forgets_the_oldest() {
        let mut g = Ghost::new(3);
        for fp in 1..=3 {
            g.push(fp);
        }
        assert!(g.contains(1) && g.contains(3));
        g.push(4);
        assert!(!g.contains(1));
        assert!(g.contains(2) && g.contains(4));
        g.push(4);
        g.push(4);
        assert!(!g.contains(2) && !g.contains(3) && g.contains(4));
    }

    #[test]
    fn ages_count_from_the_newest_push() {
        let mut g = Ghost::new(4);
        g.push_at(7, 10);
        g.push_at(8, 12);
        g.push_at(7, 15);
        assert_eq!(g.age(7, 20), Some(5));
        assert_eq!(g.age(8, 20), Some(8));
        assert_eq!(g.age(9, 20), None);
        assert_eq!(g.len(), 3);
        for fp in 20..24 {
            g.push_at(fp, 30);
        }
        assert_eq!(g.age(7, 40), None);
    }
}
