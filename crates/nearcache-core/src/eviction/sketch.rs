//! A count-min sketch of 4-bit counters: the frequency estimate that
//! TinyLFU admission compares (Einziger, Friedman and Manes, "TinyLFU",
//! ACM ToS 2017; Caffeine's `FrequencySketch` is the same shape).
//!
//! * Four rows of `width` counters, 16 counters to a `u64` word: with
//!   `width` the next power of two of the shard's entry count, it costs
//!   half a byte per counter, 2 B per entry (rounded up to a power of two).
//!   `counters_per_entry` below 1 trades accuracy for size.
//! * Counters saturate at 15; every `sample` increments (10 x the entry
//!   count) every counter is halved, so old popularity fades (the "reset"
//!   of TinyLFU), and a counter never needs more than 4 bits.
//! * Row `i` indexes with its own 16 bits of one 64-bit remix of the key's
//!   hash, so the sketch shares no bits with the shard choice (hash bits
//!   0..16) or the slot tag (bits 32..63) that an attacker could line up
//!   with a crafted key set; the file's random hash seed keeps the rows
//!   unpredictable as it keeps the slots.
//! * Every word is a plain `u64`: a sketch read from a hostile file can
//!   only hold wrong counts, which bends admission, never memory safety.

/// Count-min sketch with 4-bit counters, halved every `sample` additions.
#[derive(Clone, Debug)]
pub struct Sketch {
    /// Conservative update: an addition raises only the counters at the
    /// key's smallest count (the others already count it and more).
    pub conservative: bool,
    rows: [Vec<u64>; 4],
    mask: usize,
    additions: u64,
    sample: u64,
}

/// Multiplier of the 64-bit remix (splitmix64's finalizer constant).
const MIX: u64 = 0x9e37_79b9_7f4a_7c15;

impl Sketch {
    /// A sketch for a shard holding about `entries` entries, with
    /// `counters_per_row` counters per entry in each row (rounded to a
    /// power of two, at least 16).
    pub fn new(entries: usize, counters_per_entry: f64) -> Sketch {
        Sketch::with_aging(entries, counters_per_entry, 10)
    }

    /// As [`Sketch::new`], halving every `aging` x `entries` additions.
    pub fn with_aging(entries: usize, counters_per_entry: f64, aging: u64) -> Sketch {
        let want = ((entries.max(1) as f64) * counters_per_entry).ceil() as usize;
        let width = want.max(16).next_power_of_two();
        let words = width / 16;
        Sketch {
            conservative: false,
            rows: [vec![0; words], vec![0; words], vec![0; words], vec![0; words]],
            mask: width - 1,
            additions: 0,
            sample: aging.max(1) * entries.max(1) as u64,
        }
    }

    /// Halve every `aging` x `entries` additions from now on (the adaptive
    /// aging of the policies that follow a moving working set).
    pub fn set_aging(&mut self, entries: usize, aging: u64) {
        self.sample = aging.max(1) * entries.max(1) as u64;
        if self.additions >= self.sample {
            self.halve();
        }
    }

    /// Bytes the counters take (what a shard would reserve for them).
    pub fn bytes(&self) -> usize {
        self.rows.iter().map(|r| r.len() * 8).sum()
    }

    fn index(&self, hash: u64, row: usize) -> usize {
        let h = (hash ^ (hash >> 29)).wrapping_mul(MIX);
        ((h >> (16 * row)) as usize) & self.mask
    }

    fn counter(&self, row: usize, i: usize) -> u8 {
        ((self.rows[row][i / 16] >> ((i % 16) * 4)) & 0xf) as u8
    }

    /// The estimated count of `hash`: the smallest of its four counters.
    pub fn estimate(&self, hash: u64) -> u8 {
        (0..4).map(|r| self.counter(r, self.index(hash, r))).min().unwrap_or(0)
    }

    /// Count `hash` `n` times (each counter saturates at 15).
    pub fn add(&mut self, hash: u64, n: u8) {
        if n == 0 {
            return;
        }
        let floor =
            if self.conservative { self.estimate(hash).saturating_add(n).min(15) } else { 0 };
        for r in 0..4 {
            let i = self.index(hash, r);
            let c = self.counter(r, i);
            let next = if self.conservative { c.max(floor) } else { c.saturating_add(n).min(15) };
            let shift = (i % 16) * 4;
            let w = &mut self.rows[r][i / 16];
            *w = (*w & !(0xf << shift)) | ((next as u64) << shift);
        }
        self.additions += n as u64;
        if self.additions >= self.sample {
            self.halve();
        }
    }

    /// Halve every counter (the aging step).
    fn halve(&mut self) {
        for row in &mut self.rows {
            for w in row.iter_mut() {
                *w = (*w >> 1) & 0x7777_7777_7777_7777;
            }
        }
        self.additions /= 2;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_saturate_and_halve() {
        let mut s = Sketch::new(1000, 1.0);
        for _ in 0..20 {
            s.add(42, 1);
        }
        assert_eq!(s.estimate(42), 15);
        assert!(s.estimate(43) <= 1);
        s.halve();
        assert_eq!(s.estimate(42), 7);
    }

    #[test]
    fn ages_after_its_sample() {
        let mut s = Sketch::new(10, 100.0);
        s.add(7, 8);
        // 100 additions (10 x 10 entries) trigger a halving.
        for k in 0..92u64 {
            s.add(1000 + k, 1);
        }
        assert!(s.estimate(7) <= 4, "{}", s.estimate(7));
    }

    #[test]
    fn size_follows_entries() {
        assert_eq!(Sketch::new(1024, 1.0).bytes(), 4 * 1024 / 2);
        assert_eq!(Sketch::new(1024, 0.25).bytes(), 4 * 256 / 2);
    }
}
