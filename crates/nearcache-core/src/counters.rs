//! Hit and miss counters striped per CPU, in the file header.
//!
//! A get must not write a word that other cores write too: on a many-core
//! host that one cache line, bouncing between cores on every read, is what
//! stops reads from scaling. So hits and misses are not kept in the shard
//! header (where every get of the shard would write them) but in
//! `STRIPE_COUNT` stripes, one per CPU number modulo the stripe count, each
//! on its own 128-byte span (two cache lines: adjacent-line prefetchers pair
//! lines, so 64 bytes would still share). A process adds to the stripe of
//! the CPU it runs on (`sched_getcpu`: the vDSO or rseq, no system call). Several processes can land on
//! the same stripe (same CPU after preemption, CPU numbers beyond the
//! stripe count, or a thread that migrated since it last asked: it asks
//! every 64 adds), so the add is atomic; it is uncontended in the common
//! case, where the line stays in the core's cache.
//!
//! Layout, from `fh::STRIPES` to the end of the file header:
//!
//! ```text
//! stripe = [hits u64][misses u64][unused, to 128 bytes]
//! ```
//!
//! The words come from shared memory, so sums wrap.

use crate::layout::{fh, HEADER_SIZE};
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes per stripe: two cache lines.
pub const STRIPE_BYTES: usize = 128;
/// Stripes in the file header.
pub const STRIPE_COUNT: usize = (HEADER_SIZE - fh::STRIPES) / STRIPE_BYTES;

// The stripes start after the header's fields and end inside the header.
const _: () = assert!(fh::STRIPES >= fh::FIELDS_END && fh::STRIPES % 8 == 0);
const _: () = assert!(fh::STRIPES + STRIPE_COUNT * STRIPE_BYTES <= HEADER_SIZE);
const _: () = assert!(STRIPE_COUNT >= 16);

/// Which counter of a stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Hits = 0,
    Misses = 1,
}

/// The stripes of one mapped file.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Stripes {
    base: *mut u8,
}

// SAFETY: a pointer into a MAP_SHARED mapping that outlives the value; every
// access is an atomic operation on an aligned word.
unsafe impl Send for Stripes {}
// SAFETY: see Send.
unsafe impl Sync for Stripes {}

impl Stripes {
    /// # Safety
    /// `header` must point to the file header (`HEADER_SIZE` bytes,
    /// page-aligned) of a live mapping that outlives the returned value.
    pub(crate) unsafe fn new(header: *mut u8) -> Stripes {
        // SAFETY: fh::STRIPES < HEADER_SIZE (caller's contract covers it).
        Stripes { base: unsafe { header.add(fh::STRIPES) } }
    }

    fn word(&self, stripe: usize, c: Counter) -> &AtomicU64 {
        debug_assert!(stripe < STRIPE_COUNT);
        // SAFETY: stripe < STRIPE_COUNT, so the word lies inside the file
        // header; it is 8-byte aligned (the header is page-aligned, and
        // fh::STRIPES and STRIPE_BYTES are multiples of 8). The mapping
        // outlives self, and the word is only ever accessed atomically.
        unsafe {
            AtomicU64::from_ptr(self.base.add(stripe * STRIPE_BYTES + c as usize * 8) as *mut u64)
        }
    }

    /// Add one to counter `c` of the calling CPU's stripe.
    #[inline]
    pub(crate) fn add(&self, c: Counter) {
        self.word(current_stripe(), c).fetch_add(1, Ordering::Relaxed);
    }

    /// Sum of counter `c` over every stripe.
    pub(crate) fn sum(&self, c: Counter) -> u64 {
        (0..STRIPE_COUNT)
            .fold(0u64, |acc, s| acc.wrapping_add(self.word(s, c).load(Ordering::Relaxed)))
    }
}

/// Calls of [`current_stripe`] between two `sched_getcpu` calls.
const STRIPE_REFRESH: u32 = 64;

std::thread_local! {
    /// This thread's stripe and how many more calls may reuse it.
    static STRIPE: std::cell::Cell<(u32, u32)> = const { std::cell::Cell::new((0, 0)) };
}

/// The stripe of the CPU this thread ran on recently. Any stripe is
/// correct (adds are atomic); the CPU's own keeps the line local. The CPU
/// is asked every `STRIPE_REFRESH` calls only: `sched_getcpu` costs about
/// 3 ns where glibc does not read it from rseq (glibc 2.36: the vDSO), a
/// tenth of a whole get, and a thread that migrated meanwhile merely adds
/// to another CPU's stripe for a while.
#[inline]
fn current_stripe() -> usize {
    STRIPE.with(|c| {
        let (stripe, left) = c.get();
        if left > 0 {
            c.set((stripe, left - 1));
            return stripe as usize;
        }
        // SAFETY: sched_getcpu has no preconditions; it returns -1 on error.
        let cpu = unsafe { libc::sched_getcpu() };
        let stripe = (cpu.max(0) as usize % STRIPE_COUNT) as u32;
        c.set((stripe, STRIPE_REFRESH - 1));
        stripe as usize
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_are_summed_over_stripes() {
        let mut page = vec![0u64; HEADER_SIZE / 8];
        // SAFETY: a HEADER_SIZE-byte, 8-aligned buffer that outlives `s`.
        let s = unsafe { Stripes::new(page.as_mut_ptr() as *mut u8) };
        for _ in 0..5 {
            s.add(Counter::Hits);
        }
        s.add(Counter::Misses);
        s.word(STRIPE_COUNT - 1, Counter::Hits).fetch_add(u64::MAX, Ordering::Relaxed);
        assert_eq!(s.sum(Counter::Hits), 4, "sums wrap");
        assert_eq!(s.sum(Counter::Misses), 1);
    }
}
