//! Statistics counters, kept per shard in the shard header and summed on
//! demand, except hits and misses, which gets count per CPU for the whole
//! file (`counters.rs`: a get writes no shard word). Shard counters are
//! updated under the shard lock (`lock_timeouts` atomically, by the
//! lockers that gave up); reading them takes no lock, so
//! a stopped lock holder cannot block `stats()`; totals are sums of
//! word-sized snapshots taken at slightly different instants.

/// Counters of one shard (or their sum over all shards).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ShardStats {
    /// Gets that found a live entry.
    pub hits: u64,
    /// Gets that found nothing (absent, expired or evicted).
    pub misses: u64,
    /// Successful stores (set/add/replace/incr).
    pub sets: u64,
    /// Entries removed by delete, pop or clear.
    pub deletes: u64,
    /// Entries evicted by SIEVE to make room.
    pub evictions: u64,
    /// Entries dropped because their TTL passed.
    pub expirations: u64,
    /// Times the shard was reset after a crash mid-write or corruption.
    pub resets: u64,
    /// Times a consistency check failed while reading the shard.
    pub corruptions: u64,
    /// Compactions run.
    pub compactions: u64,
    /// Live entries now.
    pub items: u64,
    /// Bytes of live entries (headers, keys, values, padding).
    pub live_bytes: u64,
    /// Bytes of the arena in use (live + dead, until compaction).
    pub used_bytes: u64,
    /// Bytes of arena.
    pub capacity_bytes: u64,
    /// Bytes of the file reserved (memory held on tmpfs): the shard
    /// header, the index slots in use and the arena reserved so far in a
    /// lazily reserved file; the whole shard in a preallocated one.
    pub held_bytes: u64,
    /// Lock waits that ran out of time (a get then misses, a write fails
    /// with `Error::LockTimeout`).
    pub lock_timeouts: u64,
    /// Repairs after a process died mid-write that kept every complete
    /// entry (instead of resetting the shard).
    pub salvages: u64,
    /// Entries dropped by repairs and resets after a crash or corruption.
    pub entries_lost: u64,
    /// Bytes held in spilled values' files (whole cache only, from the
    /// file header; 0 per shard).
    pub spilled_bytes: u64,
    /// Spilled values (whole cache only).
    pub spilled_values: u64,
    /// Spilled values refused (file missing, swapped, a symlink, wrong
    /// owner, mode, length or checksum) and dropped (whole cache only).
    pub spill_refused: u64,
    /// The most arena bytes the compactions of one write examined, in any
    /// shard (a maximum, not a sum): one conveyor pass (`STEP_BUDGET`)
    /// whatever the shard's size (`shard/conveyor.rs`), unless the conveyor
    /// fell behind and a write had to free a segment itself. Recorded since the shard was
    /// made (or last reset); summed over shards, the largest.
    pub max_compaction_bytes: u64,
}

impl ShardStats {
    /// Field names and values, in a stable order (for bindings).
    pub fn fields(&self) -> [(&'static str, u64); 21] {
        [
            ("hits", self.hits),
            ("misses", self.misses),
            ("sets", self.sets),
            ("deletes", self.deletes),
            ("evictions", self.evictions),
            ("expirations", self.expirations),
            ("resets", self.resets),
            ("corruptions", self.corruptions),
            ("compactions", self.compactions),
            ("items", self.items),
            ("live_bytes", self.live_bytes),
            ("used_bytes", self.used_bytes),
            ("capacity_bytes", self.capacity_bytes),
            ("lock_timeouts", self.lock_timeouts),
            ("salvages", self.salvages),
            ("entries_lost", self.entries_lost),
            ("held_bytes", self.held_bytes),
            ("spilled_bytes", self.spilled_bytes),
            ("spilled_values", self.spilled_values),
            ("spill_refused", self.spill_refused),
            ("max_compaction_bytes", self.max_compaction_bytes),
        ]
    }
}

/// Sums wrap: counters come from a file that may be corrupt or hostile.
impl std::ops::AddAssign for ShardStats {
    fn add_assign(&mut self, o: ShardStats) {
        self.hits = self.hits.wrapping_add(o.hits);
        self.misses = self.misses.wrapping_add(o.misses);
        self.sets = self.sets.wrapping_add(o.sets);
        self.deletes = self.deletes.wrapping_add(o.deletes);
        self.evictions = self.evictions.wrapping_add(o.evictions);
        self.expirations = self.expirations.wrapping_add(o.expirations);
        self.resets = self.resets.wrapping_add(o.resets);
        self.corruptions = self.corruptions.wrapping_add(o.corruptions);
        self.compactions = self.compactions.wrapping_add(o.compactions);
        self.items = self.items.wrapping_add(o.items);
        self.live_bytes = self.live_bytes.wrapping_add(o.live_bytes);
        self.used_bytes = self.used_bytes.wrapping_add(o.used_bytes);
        self.capacity_bytes = self.capacity_bytes.wrapping_add(o.capacity_bytes);
        self.lock_timeouts = self.lock_timeouts.wrapping_add(o.lock_timeouts);
        self.salvages = self.salvages.wrapping_add(o.salvages);
        self.entries_lost = self.entries_lost.wrapping_add(o.entries_lost);
        self.held_bytes = self.held_bytes.wrapping_add(o.held_bytes);
        self.spilled_bytes = self.spilled_bytes.wrapping_add(o.spilled_bytes);
        self.spilled_values = self.spilled_values.wrapping_add(o.spilled_values);
        self.spill_refused = self.spill_refused.wrapping_add(o.spill_refused);
        self.max_compaction_bytes = self.max_compaction_bytes.max(o.max_compaction_bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_of_hostile_counters_wrap() {
        let mut a = ShardStats { hits: u64::MAX, ..ShardStats::default() };
        a += ShardStats { hits: 2, ..ShardStats::default() };
        assert_eq!(a.hits, 1);
    }

    #[test]
    fn the_largest_compaction_is_a_maximum_and_a_field() {
        let mut a = ShardStats { max_compaction_bytes: 7, ..ShardStats::default() };
        a += ShardStats { max_compaction_bytes: 5, ..ShardStats::default() };
        assert_eq!(a.max_compaction_bytes, 7);
        assert!(a.fields().contains(&("max_compaction_bytes", 7)));
        let names: std::collections::HashSet<_> = a.fields().iter().map(|f| f.0).collect();
        assert_eq!(names.len(), a.fields().len());
    }
}
