//! The ghost queue: fingerprints of recently evicted keys, no values.
//!
//! S3-FIFO (Yang et al., SOSP '23) sends a key that misses while its
//! fingerprint is still in the ghost straight to the main queue: it was
//! evicted from the small queue too early. The ghost is a FIFO ring of
//! 32-bit fingerprints, as long as the main queue holds entries, with a
//! small open-addressing count table for membership; both are bounded by
//! the ring's length, so a hostile file can fill it with chosen
//! fingerprints (admitting keys it should not) but cannot make it grow.

use std::collections::HashMap;

/// Bounded FIFO of fingerprints with membership counts.
#[derive(Clone, Debug)]
pub struct Ghost {
    ring: Vec<u32>,
    next: usize,
    len: usize,
    counts: HashMap<u32, u32>,
}

impl Ghost {
    /// A ghost remembering the last `capacity` fingerprints (at least 1).
    pub fn new(capacity: usize) -> Ghost {
        Ghost { ring: vec![0; capacity.max(1)], next: 0, len: 0, counts: HashMap::new() }
    }

    /// The fingerprint of a key hash (the bits the shard and slot do not use).
    pub fn fingerprint(hash: u64) -> u32 {
        (hash >> 16) as u32
    }

    /// Whether `fp` was evicted within the ghost's memory.
    pub fn contains(&self, fp: u32) -> bool {
        self.counts.contains_key(&fp)
    }

    /// Remember `fp`, forgetting the oldest fingerprint once full.
    pub fn push(&mut self, fp: u32) {
        if self.len == self.ring.len() {
            let old = self.ring[self.next];
            if let Some(c) = self.counts.get_mut(&old) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(&old);
                }
            }
        } else {
            self.len += 1;
        }
        self.ring[self.next] = fp;
        *self.counts.entry(fp).or_insert(0) += 1;
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
}
