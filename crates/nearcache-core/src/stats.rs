//! Statistics counters, kept per shard in the shard header and summed on
//! demand. Counters are updated under the shard lock; reading them takes
//! each lock briefly, so totals are a consistent sum of per-shard snapshots.

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
}

impl ShardStats {
    /// Field names and values, in a stable order (for bindings).
    pub fn fields(&self) -> [(&'static str, u64); 13] {
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
        ]
    }
}

impl std::ops::AddAssign for ShardStats {
    fn add_assign(&mut self, o: ShardStats) {
        self.hits += o.hits;
        self.misses += o.misses;
        self.sets += o.sets;
        self.deletes += o.deletes;
        self.evictions += o.evictions;
        self.expirations += o.expirations;
        self.resets += o.resets;
        self.corruptions += o.corruptions;
        self.compactions += o.compactions;
        self.items += o.items;
        self.live_bytes += o.live_bytes;
        self.used_bytes += o.used_bytes;
        self.capacity_bytes += o.capacity_bytes;
    }
}
