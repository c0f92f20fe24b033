//! The cache: one mapped file, split into shards.
//!
//! A key's xxh3 hash picks its shard; every operation on one key takes that
//! shard's lock once. Batch operations group keys by shard and take each
//! shard's lock once for the whole group. TTLs are absolute Unix
//! milliseconds stored in the entry (0 = never), so every process agrees
//! on them.
//!
//! `close()` marks the handle closed (later calls fail with
//! [`Error::Closed`]); the mapping itself is released when the handle is
//! dropped, so a call racing with close on another thread never touches
//! unmapped memory.

use crate::error::{Error, Result};
use crate::file::{self, Mapping, OpenOptions};
use crate::hash::{hash_key, shard_of};
use crate::layout::{entry_size, fh, Geometry, HEADER_SIZE, MAX_KEY_LEN};
use crate::shard::{Entry0, EntryRef, Now, SetMode, Shard};
use crate::stats::ShardStats;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

/// Flag value the engine uses for 64-bit counters (little-endian i64).
pub const FLAG_INT: u32 = 2;

/// One key of a batch: (shard index, key position, hash).
type Planned = (usize, usize, u64);

/// A value copied out of the cache, with its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Value {
    pub data: Vec<u8>,
    pub flags: u32,
}

/// Result of [`Cache::check`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub shards: usize,
    pub entries: u64,
    pub live_bytes: u64,
    /// Shards that were reset because they failed the check.
    pub repaired_shards: usize,
}

/// A shared-memory cache file mapped into this process.
pub struct Cache {
    map: Mapping,
    geo: Geometry,
    shards: Vec<Shard>,
    path: PathBuf,
    max_entry: usize,
    closed: AtomicBool,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("path", &self.path)
            .field("shards", &self.geo.shard_count)
            .field("capacity", &self.geo.total_size())
            .finish()
    }
}

fn shards_of(m: &Mapping, geo: &Geometry) -> Vec<Shard> {
    (0..geo.shard_count)
        .map(|i| {
            // SAFETY: shard i spans [HEADER_SIZE + i*shard_size, +shard_size),
            // inside the mapping of total_size bytes; the Vec<Shard> lives in
            // the Cache next to the Mapping and is dropped with it.
            unsafe { Shard::new(m.ptr.add(HEADER_SIZE + i * geo.shard_size), geo) }
        })
        .collect()
}

/// Expiry timestamp for a TTL in ms (0 = never).
fn expires_for(ttl_ms: u64, now: &mut Now) -> u64 {
    if ttl_ms == 0 {
        0
    } else {
        now.get().saturating_add(ttl_ms)
    }
}

impl Cache {
    /// Open or create the cache at `path`.
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Cache> {
        let path = path.as_ref();
        let init = |m: &Mapping, g: &Geometry| {
            for s in shards_of(m, g) {
                s.init()?;
            }
            Ok(())
        };
        let reattach = |m: &Mapping, g: &Geometry| {
            for s in shards_of(m, g) {
                s.reattach_exclusive()?;
            }
            // SAFETY: CLEAN_SHUTDOWN is a byte inside the header; we are alone.
            unsafe { std::ptr::write_volatile(m.ptr.add(fh::CLEAN_SHUTDOWN), 0u8) };
            Ok(())
        };
        let opened = file::open(path, opts, &init, &reattach)?;
        let shards = shards_of(&opened.map, &opened.geo);
        Ok(Cache {
            max_entry: opened.geo.max_entry_size(),
            geo: opened.geo,
            shards,
            map: opened.map,
            path: path.to_path_buf(),
            closed: AtomicBool::new(false),
        })
    }

    /// Open or create `name` in [`file::default_directory`].
    pub fn open_named(name: &str, opts: &OpenOptions) -> Result<Cache> {
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(Error::InvalidArgument(format!(
                "cache name {name:?} must be a plain file name"
            )));
        }
        Cache::open(file::default_directory()?.join(name), opts)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The file's geometry.
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }
    /// Total bytes of the file.
    pub fn capacity(&self) -> usize {
        self.geo.total_size()
    }
    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.geo.shard_count
    }
    /// Largest entry (32-byte header + key + value, padded to 8) accepted.
    pub fn max_entry_size(&self) -> usize {
        self.max_entry
    }
    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Mark the handle closed. Idempotent.
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) && file::try_exclusive(&self.map.file) {
            // Last one out: record a clean shutdown (informational), then
            // go back to the shared lock at once. The lock belongs to the
            // open file description, which a forked child shares with its
            // parent: keeping it exclusive would block every later opener.
            // SAFETY: a byte inside the header.
            unsafe { std::ptr::write_volatile(self.map.ptr.add(fh::CLEAN_SHUTDOWN), 1u8) };
            file::release_exclusive(&self.map.file);
        }
    }

    #[inline]
    fn live(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            Err(Error::Closed)
        } else if self.map.broken() {
            Err(Error::Corrupt(format!(
                "{} was truncated by another program while mapped; its contents are gone \
                 from this handle: reopen it",
                self.path.display()
            )))
        } else {
            Ok(())
        }
    }

    #[inline]
    fn route(&self, key: &[u8]) -> Result<(&Shard, u64)> {
        self.live()?;
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(Error::BadKey { len: key.len(), max: MAX_KEY_LEN });
        }
        let h = hash_key(self.geo.seed, key);
        Ok((&self.shards[shard_of(h, self.geo.shard_count)], h))
    }

    fn check_fits(&self, key: &[u8], value_len: usize) -> Result<()> {
        let needed = entry_size(key.len(), value_len);
        if needed > self.max_entry {
            return Err(Error::ValueTooLarge { needed, max: self.max_entry });
        }
        Ok(())
    }

    /// Run `f` on the value of `key` under the shard lock (no extra copy:
    /// `f` copies straight from the mapping into its own buffer).
    #[inline]
    pub fn get_with<R>(&self, key: &[u8], f: impl FnOnce(EntryRef<'_>) -> R) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let g = shard.lock()?;
        Ok(g.get(key, h, &mut Now::new(), f))
    }

    /// The value and flags of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        self.get_with(key, |e| Value { data: e.to_vec(), flags: e.flags() })
    }

    /// Store `value` with `flags` for `ttl_ms` (0 = never expires).
    pub fn set(&self, key: &[u8], value: &[u8], flags: u32, ttl_ms: u64) -> Result<()> {
        self.store(key, value, flags, ttl_ms, SetMode::Always).map(|_| ())
    }

    /// Store only if absent. Returns whether it stored.
    pub fn add(&self, key: &[u8], value: &[u8], flags: u32, ttl_ms: u64) -> Result<bool> {
        self.store(key, value, flags, ttl_ms, SetMode::IfAbsent)
    }

    /// Store only if present. Returns whether it stored.
    pub fn replace(&self, key: &[u8], value: &[u8], flags: u32, ttl_ms: u64) -> Result<bool> {
        self.store(key, value, flags, ttl_ms, SetMode::IfPresent)
    }

    /// Store under `mode` (set, add or replace); returns whether it stored.
    pub fn store(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        mode: SetMode,
    ) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        self.check_fits(key, value.len())?;
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        let g = shard.lock()?;
        Ok(g.set(key, h, value, flags, exp, mode, &mut now))
    }

    /// Remove `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = shard.lock()?;
        Ok(g.delete(key, h, &mut Now::new()))
    }

    /// Delete `key` only if its value is exactly `expected`; returns whether
    /// it deleted. Atomic: one lock hold covers the comparison and the delete.
    pub fn delete_if_equals(&self, key: &[u8], expected: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = shard.lock()?;
        Ok(g.delete_if_equals(key, h, expected, &mut Now::new()))
    }

    /// Remove `key` and hand its value to `f`.
    pub fn pop_with<R>(&self, key: &[u8], f: impl FnOnce(EntryRef<'_>) -> R) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let g = shard.lock()?;
        Ok(g.pop(key, h, &mut Now::new(), f))
    }

    /// Remove `key` and return its value.
    pub fn pop(&self, key: &[u8]) -> Result<Option<Value>> {
        self.pop_with(key, |e| Value { data: e.to_vec(), flags: e.flags() })
    }

    /// Give `key` a new TTL (0 = never). Returns whether it was present.
    pub fn touch(&self, key: &[u8], ttl_ms: u64) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        let g = shard.lock()?;
        Ok(g.touch(key, h, exp, &mut now))
    }

    /// Absolute expiry of `key` in Unix ms (0 = never), None if absent.
    pub fn expires_at(&self, key: &[u8]) -> Result<Option<u64>> {
        let (shard, h) = self.route(key)?;
        let g = shard.lock()?;
        Ok(g.expires_of(key, h, &mut Now::new()))
    }

    /// Whether `key` is present (does not count as a hit).
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = shard.lock()?;
        Ok(g.contains(key, h, &mut Now::new()))
    }

    /// Atomically add `delta` to the counter at `key`. A missing key starts
    /// at `initial` (or fails with [`Error::NotFound`] if None) and gets
    /// `ttl_ms`.
    pub fn incr(&self, key: &[u8], delta: i64, initial: Option<i64>, ttl_ms: u64) -> Result<i64> {
        let (shard, h) = self.route(key)?;
        self.check_fits(key, 8)?;
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        let g = shard.lock()?;
        g.incr(key, h, delta, initial, exp, FLAG_INT, &mut now)
    }

    /// Plan a batch: (shard, key position, hash) for every key, sorted by
    /// shard, so that each run of one shard is served under one lock hold.
    /// One allocation, whatever the shard count.
    fn plan<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Planned>> {
        self.live()?;
        let mut plan = Vec::with_capacity(keys.len());
        for (i, k) in keys.iter().enumerate() {
            let k = k.as_ref();
            if k.is_empty() || k.len() > MAX_KEY_LEN {
                return Err(Error::BadKey { len: k.len(), max: MAX_KEY_LEN });
            }
            let h = hash_key(self.geo.seed, k);
            plan.push((shard_of(h, self.geo.shard_count), i, h));
        }
        plan.sort_unstable_by_key(|p| p.0);
        Ok(plan)
    }

    /// Look up many keys, taking each shard's lock once. `f(i, entry)` is
    /// called for each hit, with `i` the key's position.
    pub fn get_many_with<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        mut f: impl FnMut(usize, EntryRef<'_>),
    ) -> Result<()> {
        let mut now = Now::new();
        for run in self.plan(keys)?.chunk_by(|a, b| a.0 == b.0) {
            let g = self.shards[run[0].0].lock()?;
            for &(_, i, h) in run {
                g.get(keys[i].as_ref(), h, &mut now, |e| f(i, e));
            }
        }
        Ok(())
    }

    /// Values of many keys (None for misses), in order.
    pub fn get_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Value>>> {
        let mut out = vec![None; keys.len()];
        self.get_many_with(keys, |i, e| {
            out[i] = Some(Value { data: e.to_vec(), flags: e.flags() })
        })?;
        Ok(out)
    }

    /// Store many (key, value, flags) items with one TTL, taking each
    /// shard's lock once. All entries are size-checked before anything is
    /// stored, so a too-large item leaves the cache unchanged.
    pub fn set_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        items: &[(K, V, u32)],
        ttl_ms: u64,
    ) -> Result<()> {
        for (k, v, _) in items {
            self.check_fits(k.as_ref(), v.as_ref().len())?;
        }
        let keys: Vec<&[u8]> = items.iter().map(|(k, _, _)| k.as_ref()).collect();
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        for run in self.plan(&keys)?.chunk_by(|a, b| a.0 == b.0) {
            let g = self.shards[run[0].0].lock()?;
            for &(_, i, h) in run {
                let (k, v, fl) = &items[i];
                g.set(k.as_ref(), h, v.as_ref(), *fl, exp, SetMode::Always, &mut now);
            }
        }
        Ok(())
    }

    /// Delete many keys; returns how many were present.
    pub fn delete_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<usize> {
        let mut now = Now::new();
        let mut n = 0;
        for run in self.plan(keys)?.chunk_by(|a, b| a.0 == b.0) {
            let g = self.shards[run[0].0].lock()?;
            for &(_, i, h) in run {
                n += g.delete(keys[i].as_ref(), h, &mut now) as usize;
            }
        }
        Ok(n)
    }

    /// Remove every entry.
    pub fn clear(&self) -> Result<()> {
        self.live()?;
        for s in &self.shards {
            s.lock()?.clear();
        }
        Ok(())
    }

    /// Number of live entries (expired ones not yet reclaimed included).
    ///
    /// Lock-free: a sum of each shard's item counter, each read atomically
    /// but at slightly different instants (like any count of a cache that
    /// other processes are changing).
    pub fn len(&self) -> Result<usize> {
        self.live()?;
        Ok(self.shards.iter().map(|s| s.items_unlocked()).sum())
    }

    /// Whether the cache holds no entries.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Call `f(key, meta)` for every live entry (one shard locked at a time).
    pub fn for_each_key(&self, mut f: impl FnMut(&[u8], &Entry0)) -> Result<()> {
        self.live()?;
        let mut now = Now::new();
        for s in &self.shards {
            s.lock()?.for_each_live(&mut now, &mut f);
        }
        Ok(())
    }

    /// A snapshot of every live key.
    pub fn keys(&self) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.for_each_key(|k, _| out.push(k.to_vec()))?;
        Ok(out)
    }

    /// Counters per shard.
    pub fn shard_stats(&self) -> Result<Vec<ShardStats>> {
        self.live()?;
        self.shards.iter().map(|s| Ok(s.lock()?.stats())).collect()
    }

    /// Counters summed over all shards.
    pub fn stats(&self) -> Result<ShardStats> {
        let mut total = ShardStats::default();
        for s in self.shard_stats()? {
            total += s;
        }
        Ok(total)
    }

    /// Verify every shard's invariants. A shard that fails is reported as an
    /// error (and left as is, so it can be inspected); see [`Cache::repair`].
    pub fn check(&self) -> Result<CheckReport> {
        self.live()?;
        let file_len = self.map.file_len()?;
        if file_len != self.geo.total_size() as u64 {
            return Err(Error::Corrupt(format!(
                "file is now {file_len} bytes, {} expected (changed by another program)",
                self.geo.total_size()
            )));
        }
        let mut r = CheckReport { shards: self.shards.len(), ..CheckReport::default() };
        for (i, s) in self.shards.iter().enumerate() {
            let (n, b) =
                s.lock()?.check().map_err(|m| Error::Corrupt(format!("shard {i}: {m}")))?;
            r.entries += n;
            r.live_bytes += b;
        }
        Ok(r)
    }

    /// Write back dirty pages to the file (for caches on disk).
    pub fn flush(&self) -> Result<()> {
        self.live()?;
        self.map.flush()
    }

    /// Test hook: lock the shard of `key`, leave it half-written (seq odd)
    /// and block for `hold`, as a process stalled or killed inside a write
    /// would. Used by crash-recovery tests; never called in normal use.
    #[doc(hidden)]
    pub fn debug_hold_shard_mid_write(&self, key: &[u8], hold: std::time::Duration) -> Result<()> {
        let (shard, _) = self.route(key)?;
        let g = shard.lock()?;
        g.scribble_mid_write();
        std::thread::sleep(hold);
        // Survived the hold: repair what we scribbled.
        g.reset_after_scribble();
        drop(g);
        Ok(())
    }

    /// Index of the shard holding `key`.
    pub fn shard_index(&self, key: &[u8]) -> usize {
        shard_of(hash_key(self.geo.seed, key), self.geo.shard_count)
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        self.close();
    }
}
