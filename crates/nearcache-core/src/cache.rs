//! The cache: one mapped file, split into shards.
//!
//! A key's xxh3 hash picks its shard; every write of one key takes that
//! shard's lock once, and a get reads without it (validated by the shard's
//! sequence word, falling back to the lock; see `shard.rs`). Batch
//! operations group keys by shard and take each shard's lock once for the
//! whole group. TTLs are absolute Unix
//! milliseconds stored in the entry (0 = never), so every process agrees
//! on them.
//!
//! `close()` marks the handle closed (later calls fail with
//! [`Error::Closed`]); the mapping itself is released when the handle is
//! dropped, so a call racing with close on another thread never touches
//! unmapped memory.
//!
//! Every handle of one file in a process shares one mapping: opening a file
//! this process already has mapped reuses it (see `registry.rs`), and the
//! file is unmapped, and the process detached from it, when the last handle
//! is dropped.

use crate::counters::{Counter, Stripes};
use crate::error::{Error, Result};
use crate::file::{self, Mapping, OpenOptions};
use crate::hash::{hash_key, shard_of};
use crate::layout::{entry_size, Geometry, HEADER_SIZE, MAX_KEY_LEN};
use crate::shard::{Entry0, EntryRef, Now, SetMode, Shard, ShardGuard};
use crate::stats::ShardStats;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

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
    /// Shared with every other handle of the file in this process.
    map: Arc<Mapping>,
    geo: Geometry,
    shards: Vec<Shard>,
    path: PathBuf,
    max_entry: usize,
    lock_timeout: std::time::Duration,
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

/// The per-CPU counters in the file header of `m`.
fn stripes_of(m: &Mapping) -> Stripes {
    // SAFETY: m.ptr is the page-aligned start of the mapping, whose first
    // HEADER_SIZE bytes are the file header; the Stripes live in the Cache
    // (and its Shards) next to the Mapping and are dropped with it.
    unsafe { Stripes::new(m.ptr) }
}

fn shards_of(m: &Mapping, geo: &Geometry) -> Vec<Shard> {
    let stripes = stripes_of(m);
    (0..geo.shard_count)
        .map(|i| {
            // SAFETY: shard i spans [HEADER_SIZE + i*shard_size, +shard_size),
            // inside the mapping of total_size bytes; the Vec<Shard> lives in
            // the Cache next to the Mapping and is dropped with it.
            // The file descriptor stays open as long as the mapping.
            unsafe {
                let off = HEADER_SIZE + i * geo.shard_size;
                Shard::new(m.ptr.add(off), geo, m.lazy, m.file.as_raw_fd(), off, stripes)
            }
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
    ///
    /// If this process already has the file mapped (through another handle
    /// still alive, closed or not), the new handle shares that mapping,
    /// after the same checks as a first open (see `file::reopen`).
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Cache> {
        let path = path.as_ref();
        let map = match file::reopen(path, opts) {
            Some(map) => map,
            None => Cache::map_file(path, opts)?,
        };
        let geo = map.geo;
        Ok(Cache {
            max_entry: geo.max_entry_size(),
            geo,
            shards: shards_of(&map, &geo),
            map,
            path: path.to_path_buf(),
            lock_timeout: opts.lock_timeout,
            closed: AtomicBool::new(false),
        })
    }

    /// Open (or create) and map the file, and register the mapping.
    fn map_file(path: &Path, opts: &OpenOptions) -> Result<Arc<Mapping>> {
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
            Ok(())
        };
        let map = Arc::new(file::open(path, opts, &init, &reattach)?.map);
        crate::registry::insert(&map);
        Ok(map)
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
    /// Longest wait for a shard lock (see [`OpenOptions::lock_timeout`]).
    pub fn lock_timeout(&self) -> std::time::Duration {
        self.lock_timeout
    }
    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Mark the handle closed. Idempotent. Other handles of the file are
    /// not affected; the process detaches from the file when the last
    /// handle sharing its mapping is dropped.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
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

    /// Lock `shard` for a change: a timeout is an error.
    #[inline]
    fn lock_for_write<'a>(&self, shard: &'a Shard) -> Result<ShardGuard<'a>> {
        shard.lock(self.lock_timeout).inspect_err(|e| self.noticed(e))
    }

    /// A shard refused as damaged: the next process that attaches alone
    /// must repair every shard (see `file.rs`).
    #[cold]
    fn noticed(&self, e: &Error) {
        if matches!(e, Error::Corrupt(_)) {
            self.map.note_damage();
        }
    }

    /// Lock `shard` for a read: a timeout reads as a miss (`Ok(None)`),
    /// already counted in `lock_timeouts`.
    #[inline]
    fn lock_for_read<'a>(&self, shard: &'a Shard) -> Result<Option<ShardGuard<'a>>> {
        match shard.lock(self.lock_timeout) {
            Ok(g) => Ok(Some(g)),
            Err(Error::LockTimeout { .. }) => Ok(None),
            Err(e) => {
                self.noticed(&e);
                Err(e)
            }
        }
    }

    fn check_fits(&self, key: &[u8], value_len: usize) -> Result<()> {
        // max_entry <= u32::MAX, so this also keeps value_len in 32 bits;
        // saturating: a value near usize::MAX must not wrap to a small size.
        let needed = entry_size(key.len(), value_len.min(usize::MAX / 2));
        if needed > self.max_entry || value_len > u32::MAX as usize {
            return Err(Error::ValueTooLarge { needed, max: self.max_entry });
        }
        Ok(())
    }

    /// Run `f` on the value of `key` (no extra copy: `f` copies straight
    /// from the mapping into its own buffer).
    ///
    /// The read is optimistic: it takes no lock, and if a writer changed
    /// the shard meanwhile, what `f` returned is dropped and the read runs
    /// again (at last under the lock). So `f` may run more than once, on
    /// bytes that were changing; it must only copy them out, and only the
    /// result of a validated run is returned.
    #[inline]
    pub fn get_with<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let mut now = Now::new();
        if let Some(got) = shard.get_optimistic(key, h, &mut now, &mut f) {
            return Ok(got);
        }
        self.get_locked_with(key, f)
    }

    /// [`Cache::get_with`] under the shard lock: `f` runs at most once, on
    /// bytes that do not change (for callers whose `f` cannot run twice).
    #[inline]
    pub fn get_locked_with<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let Some(g) = self.lock_for_read(shard)? else { return Ok(None) };
        Ok(g.get(key, h, &mut Now::new(), f))
    }

    /// The value and flags of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        self.get_with(key, |e| Value { data: e.to_vec(), flags: e.flags() })
    }

    /// Store `value` with `flags` for `ttl_ms` (0 = never expires).
    ///
    /// Fails with [`Error::Full`], leaving the old value, only when the
    /// file system has no room to grow the key's shard and the entry is
    /// larger than all the space that shard holds.
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
        let g = self.lock_for_write(shard)?;
        g.set(key, h, value, flags, exp, mode, &mut now)
    }

    /// Remove `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        Ok(g.delete(key, h, &mut Now::new()))
    }

    /// Delete `key` only if its value is exactly `expected`; returns whether
    /// it deleted. Atomic: one lock hold covers the comparison and the delete.
    pub fn delete_if_equals(&self, key: &[u8], expected: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        Ok(g.delete_if_equals(key, h, expected, &mut Now::new()))
    }

    /// Remove `key` and hand its value to `f`.
    pub fn pop_with<R>(&self, key: &[u8], f: impl FnOnce(EntryRef<'_>) -> R) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
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
        let g = self.lock_for_write(shard)?;
        Ok(g.touch(key, h, exp, &mut now))
    }

    /// Absolute expiry of `key` in Unix ms (0 = never), None if absent.
    pub fn expires_at(&self, key: &[u8]) -> Result<Option<u64>> {
        let (shard, h) = self.route(key)?;
        let Some(g) = self.lock_for_read(shard)? else { return Ok(None) };
        Ok(g.expires_of(key, h, &mut Now::new()))
    }

    /// Whether `key` is present (does not count as a hit).
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let Some(g) = self.lock_for_read(shard)? else { return Ok(false) };
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
        let g = self.lock_for_write(shard)?;
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
        // Stable: within a shard, keys keep their order in the batch, so a
        // key given twice in set_many ends with its last value.
        plan.sort_by_key(|p| p.0);
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
            let Some(g) = self.lock_for_read(&self.shards[run[0].0])? else { continue };
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
    /// stored, so a too-large item leaves the cache unchanged. On a full
    /// file system an item larger than its shard's held space fails with
    /// [`Error::Full`]: the items before it are stored, that one and the
    /// rest are not.
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
            let g = self.lock_for_write(&self.shards[run[0].0])?;
            for &(_, i, h) in run {
                let (k, v, fl) = &items[i];
                g.set(k.as_ref(), h, v.as_ref(), *fl, exp, SetMode::Always, &mut now)?;
            }
        }
        Ok(())
    }

    /// Delete many keys; returns how many were present.
    pub fn delete_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<usize> {
        let mut now = Now::new();
        let mut n = 0;
        for run in self.plan(keys)?.chunk_by(|a, b| a.0 == b.0) {
            let g = self.lock_for_write(&self.shards[run[0].0])?;
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
            self.lock_for_write(s)?.clear();
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
            self.lock_for_write(s)?.for_each_live(&mut now, &mut f);
        }
        Ok(())
    }

    /// A snapshot of every live key.
    pub fn keys(&self) -> Result<Vec<Vec<u8>>> {
        let mut out = Vec::new();
        self.for_each_key(|k, _| out.push(k.to_vec()))?;
        Ok(out)
    }

    /// Counters per shard. Hits and misses are counted per CPU for the
    /// whole file, not per shard (a get writes no shard word): a shard's
    /// `hits` and `misses` hold only what older engines counted in it, and
    /// [`Cache::stats`] adds the file's counters.
    pub fn shard_stats(&self) -> Result<Vec<ShardStats>> {
        self.live()?;
        Ok(self.shards.iter().map(|s| s.stats_unlocked()).collect())
    }

    /// Counters summed over all shards (`held_bytes` includes the file
    /// header page), with the file's per-CPU hit and miss counters.
    pub fn stats(&self) -> Result<ShardStats> {
        let stripes = stripes_of(&self.map);
        let mut total = ShardStats {
            held_bytes: HEADER_SIZE as u64,
            hits: stripes.sum(Counter::Hits),
            misses: stripes.sum(Counter::Misses),
            ..ShardStats::default()
        };
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
            let (n, b) = self
                .lock_for_write(s)?
                .check()
                .map_err(|m| Error::Corrupt(format!("shard {i}: {m}")))?;
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
        let g = self.lock_for_write(shard)?;
        g.scribble_mid_write();
        std::thread::sleep(hold);
        // Survived the hold: repair what we scribbled.
        g.reset_after_scribble();
        drop(g);
        Ok(())
    }

    /// Test hook: the address of the mapping this handle uses (handles that
    /// share a mapping report the same one).
    #[doc(hidden)]
    pub fn debug_mapping_address(&self) -> usize {
        self.map.ptr as usize
    }

    /// Test hook: how this handle's mapping attached to the file: "created",
    /// "repaired" (alone, every shard repaired), "clean" (alone after a
    /// verified clean detach, shards left as they are) or "shared" (other
    /// processes attached).
    #[doc(hidden)]
    pub fn debug_attach(&self) -> &'static str {
        match self.map.how {
            file::Attach::Created => "created",
            file::Attach::Repaired => "repaired",
            file::Attach::Clean => "clean",
            file::Attach::Shared => "shared",
        }
    }

    /// Index of the shard holding `key`.
    pub fn shard_index(&self, key: &[u8]) -> usize {
        shard_of(hash_key(self.geo.seed, key), self.geo.shard_count)
    }
}
