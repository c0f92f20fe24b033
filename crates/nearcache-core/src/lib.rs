//! nearcache-core: a multi-process shared-memory cache engine.
//!
//! One fixed-size file is mapped `MAP_SHARED` by every process that opens
//! it. The file is split into power-of-two many shards; each shard has a
//! robust process-shared lock, an open-addressing index and an append-only
//! arena evicted by SIEVE during compaction. Writers take the shard's lock;
//! gets read optimistically, validated by the shard's sequence word, and
//! write nothing shared on a hit. See the module docs:
//!
//! * [`layout`] — the on-file format and its geometry checks,
//! * [`lock`] — the futex shard lock, owner-death recovery, bounded waits,
//! * `shard` — index, arena, compaction, eviction and optimistic reads,
//! * `counters` — hit and miss counters striped per CPU,
//! * [`eviction`] — candidate eviction policies simulated in the shard's shape
//!   (the policy study; not yet used by `shard`),
//! * [`file`] — safe creation, attachment and permission checks,
//! * `registry` — one mapping per file and process, shared by its handles,
//! * [`cache`] — the public API routing keys to shards,
//! * [`keys`] — the injective stored form of text, bytes and integer keys
//!   that every binding uses,
//! * `sigbus` — surviving a file truncated by another program while mapped.
//!
//! This crate has no Python dependency; all `unsafe` code of nearcache lives
//! here, each block with a `SAFETY:` comment.
//!
//! ```
//! use nearcache_core::{Cache, OpenOptions};
//! let dir = std::env::temp_dir().join(format!("nc-doc-{}", std::process::id()));
//! let cache = Cache::open(dir.join("doc"), &OpenOptions { size: Some(1 << 20), ..Default::default() })?;
//! cache.set(b"greeting", b"hello", 0, 0)?;
//! assert_eq!(cache.get(b"greeting")?.unwrap().data, b"hello");
//! assert_eq!(cache.incr(b"hits", 1, Some(0), 0)?, 1);
//! # drop(cache); std::fs::remove_dir_all(dir).unwrap();
//! # Ok::<(), nearcache_core::Error>(())
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

pub mod cache;
mod counters;
pub mod error;
pub mod eviction;
pub mod file;
pub mod hash;
pub mod keys;
pub mod layout;
pub mod lock;
mod registry;
mod resize;
mod shard;
mod sigbus;
pub mod spill;
pub mod stats;

pub use cache::{
    Cache, CheckReport, Update, UpdateOptions, Updated, Value, DEFAULT_MAX_CONFLICTS, FLAG_INT,
};
pub use error::{Error, Result};
pub use file::{default_directory, OpenOptions};
pub use layout::{FLAG_SPILLED, LAYOUT_VERSION, MAX_KEY_LEN};
pub use shard::{
    now_ms, set_clock_override_ms, CasOutcome, Entry0, EntryRef, EvictionMode, SetMode,
    COMPACT_FREE_PERCENT,
};
pub use stats::ShardStats;
