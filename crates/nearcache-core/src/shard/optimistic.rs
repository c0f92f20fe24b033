//! Gets without the lock ([`Shard::get_optimistic`]).
//!
//! Protocol: a reader loads `seq`
//! (even), probes the index and copies the value out without the lock,
//! then checks that `seq` and the slot it followed are unchanged (up to
//! the visited bit); if not, the copy is thrown away and retried, and
//! after `OPTIMISTIC_TRIES` (or if `seq` stays odd for `MOVE_WAIT`:
//! entries are moving, or a mover died) the reader takes the lock, which
//! waits properly and repairs. A move is short (one bounded conveyor pass
//! in a segmented shard), so a reader that finds one in progress spins
//! until it ends rather than queue behind the writer's whole operation. A slot cannot come back to an offset without a
//! move (the arena only grows between moves), so an unchanged slot and
//! an unchanged `seq` mean the bytes read were the entry's all along.
//! The header is laid out so that a reader loads only words in a cache
//! line that appends, overwrites and deletes leave alone (`layout::sh`):
//! a write to one key does not pull every reader of the shard's other
//! keys to memory. Every word the reader loads is read once and checked
//! against the shard's geometry (entries against the reserved arena,
//! not the bump pointer) before use, so a torn read can produce garbage
//! but never an access outside the shard's reserved pages; a failed
//! check is retried like a torn read, then left to the locked path,
//! which resets the shard if the check fails there too.
//!
//! A hit writes
//! nothing shared: the hit counter is striped per CPU (`counters.rs`),
//! the SIEVE mark is a compare-and-swap on the slot made only while the
//! bit is clear, and an expired entry is served by the locked path,
//! which unlinks it.

use super::{EntryRef, Now, Shard, ShardGuard, Src};
use crate::counters::Counter;
use crate::layout::*;
use std::sync::atomic::Ordering;

/// Optimistic attempts of a get that saw writers change the shard under
/// it, before it takes the lock. Small: a torn read means a writer is
/// active, and the lock then waits without burning the core.
const OPTIMISTIC_TRIES: usize = 3;

/// How long an optimistic get waits for a move to end (`seq` even again)
/// before it takes the lock. A move of a segmented shard is one conveyor
/// pass (`layout::STEP_BUDGET` judged, tens of microseconds), while the
/// lock waits for the writer's whole operation; a mover that died or was
/// preempted leaves the reader to the lock after this.
const MOVE_WAIT: std::time::Duration = std::time::Duration::from_micros(50);

impl Shard {
    /// The shard's `seq` word, for an optimistic read: an acquire load,
    /// so the reads that follow it cannot move before it.
    fn seq_acquire(&self) -> u64 {
        // Writers store seq with volatile stores followed (at the start of
        // a write) or preceded (at the end) by release fences.
        self.header_atomic(sh::SEQ).load(Ordering::Acquire)
    }

    /// Whether `seq` still reads `before`: nothing in the shard changed
    /// since the optimistic read that started with it loaded `before`.
    fn seq_unchanged(&self, before: u64) -> bool {
        // The acquire fence keeps every read of the shard above it: they
        // all happened before the second load of seq.
        std::sync::atomic::fence(Ordering::Acquire);
        self.header_atomic(sh::SEQ).load(Ordering::Relaxed) == before
    }

    /// Spin until `seq` is even (the move in progress ended), for at most
    /// `MOVE_WAIT`; returns the even `seq`, or None (take the lock).
    fn wait_for_move_end(&self) -> Option<u64> {
        let start = std::time::Instant::now();
        loop {
            for _ in 0..64 {
                std::hint::spin_loop();
            }
            let seq = self.seq_acquire();
            if seq & 1 == 0 {
                return Some(seq);
            }
            if start.elapsed() > MOVE_WAIT {
                return None;
            }
        }
    }

    /// A get without the lock (see the module comment). `f` copies the
    /// value out; it may run more than once, and only the result of a run
    /// that `seq` validated is returned. `None`: take the lock instead (a
    /// writer is active or died mid-write, the entry needs a write to be
    /// served, or the shard failed a check); `Some(None)`: a validated miss.
    pub(crate) fn get_optimistic<R>(
        &self,
        key: &[u8],
        hash: u64,
        now: &mut Now,
        f: &mut impl FnMut(EntryRef<'_>) -> R,
    ) -> Option<Option<R>> {
        if !self.intact() {
            return None;
        }
        // An unlocked view: only its reads are used here, never a write.
        let view = ShardGuard::unlocked(self);
        for _ in 0..OPTIMISTIC_TRIES {
            let mut before = self.seq_acquire();
            if before & 1 == 1 {
                before = self.wait_for_move_end()?;
            }
            // Entries are bounded by the reserved arena, not the bump
            // pointer: every write moves the bump pointer, and reading it
            // would pull the line that writes change into this core. A
            // published slot leads below the bump pointer; anything else
            // is a torn read, still inside reserved pages.
            let found =
                match view.arena_reserved().and_then(|bound| view.probe(key, hash, Some(bound))) {
                    Ok(p) => p.found,
                    // Torn (an entry overwritten or deleted under us, marked
                    // dead) or corrupt: retry, and let the lock decide.
                    Err(_) => continue,
                };
            let Some((i, e)) = found else {
                if self.seq_unchanged(before) {
                    self.stripes.add(Counter::Misses);
                    return Some(None);
                }
                continue;
            };
            if e.expires != 0 && e.expired(now.get()) {
                return None;
            }
            let r = f(EntryRef {
                src: Src::Arena { guard: &view, off: e.val_off() },
                val_len: e.val_len,
                flags: e.flags,
                expires_ms: e.expires,
                // Validated with the copy: `before` is the seq this read
                // saw from start to end.
                version: self.version(before, e.off),
            });
            let published = ShardGuard::slot_value(hash, e.off);
            if self.seq_unchanged(before) && view.slot(i) & !SLOT_VISITED == published {
                view.mark_visited(i, e.off);
                self.stripes.add(Counter::Hits);
                return Some(Some(r));
            }
        }
        None
    }
}
