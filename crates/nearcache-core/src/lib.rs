//! nearcache-core: a multi-process shared-memory cache engine.
//!
//! One fixed-size file is mapped `MAP_SHARED` by every process that opens
//! it. The file is split into power-of-two many shards; each shard has a
//! robust process-shared mutex, an open-addressing index and an append-only
//! arena evicted by SIEVE during compaction. See the module docs:
//!
//! * [`layout`] — the on-file format and its geometry checks,
//! * [`lock`] — robust pthread mutexes and owner-death recovery,
//! * `shard` — index, arena, compaction and eviction,
//! * [`file`] — safe creation, attachment and permission checks,
//! * [`cache`] — the public API routing keys to shards,
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
pub mod error;
pub mod file;
pub mod hash;
pub mod layout;
pub mod lock;
mod shard;
mod sigbus;
pub mod stats;

pub use cache::{Cache, CheckReport, Value, FLAG_INT};
pub use error::{Error, Result};
pub use file::{default_directory, OpenOptions};
pub use layout::{LAYOUT_VERSION, MAX_KEY_LEN};
pub use shard::{now_ms, Entry0, EntryRef, SetMode, COMPACT_FREE_PERCENT};
pub use stats::ShardStats;
