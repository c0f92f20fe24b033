//! The cache: one mapped file, split into shards.
//!
//! A key's xxh3 hash picks its shard; every write of one key takes that
//! shard's lock once, and a get reads without it (validated by the shard's
//! sequence word, falling back to the lock; see `shard/optimistic.rs`). Batch
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
//! Room on the file system. Each handle keeps a reserve of the file system
//! free (`OpenOptions::fs_reserve`, resolved once at open): shards do not
//! grow into it (`shard/arena.rs`), and spilled values' files are not written
//! into it (`spill.rs`). When a spilled value finds no room (the reserve,
//! or a full file system), `make_room` evicts spilled values first, then
//! has shards give memory back from a moving hand (`ShardGuard::give_back`,
//! each its share of what is short plus one growth step, so the work
//! follows the value's length), until `fstatvfs` shows the value and the
//! reserve free; the value is written once more, and only then refused,
//! with what was tried.
//!
//! Every handle of one file in a process shares one mapping: opening a file
//! this process already has mapped reuses it (see `registry.rs`), and the
//! file is unmapped, and the process detached from it, when the last handle
//! is dropped.

use crate::counters::{Counter, Stripes};
use crate::error::{Error, Result};
use crate::file::{self, Mapping, OpenOptions};
use crate::hash::{hash_key, shard_of};
use crate::layout::{entry_size, fh, Geometry, FLAG_SPILLED, GROW_CHUNK, HEADER_SIZE, MAX_KEY_LEN};
use crate::resize::{self, Owner, Record};
use crate::shard::{
    self as shard_mod, CasOutcome, Entry0, EntryRef, EvictionMode, Now, Samples, SetMode, Shard,
    ShardGuard,
};
use crate::spill::{Publishing, Refusal, SpillDir, SpillRef, SweepReport, REF_LEN, SWEEP_GRACE};
use crate::stats::ShardStats;
use std::collections::HashSet;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Flag value the engine uses for 64-bit counters (little-endian i64).
pub const FLAG_INT: u32 = 2;

/// One key of a batch: (shard index, key position, hash).
type Planned = (usize, usize, u64);

/// What a get's callback made of an entry: the caller's result for an
/// inline value, or the reference of a spilled one (read after the shard
/// is left, by [`Cache::finish_spilled`]).
enum Hit<R> {
    Value(R),
    Spilled(SpilledHit),
}

impl<R> Hit<R> {
    /// The reference of a spilled `e`, or what `f` makes of an inline one.
    #[inline]
    fn of(e: EntryRef<'_>, f: impl FnOnce(EntryRef<'_>) -> R) -> Self {
        if e.flags() & FLAG_SPILLED != 0 {
            Hit::Spilled(SpilledHit::of(&e))
        } else {
            Hit::Value(f(e))
        }
    }
}

/// A spilled entry as the index showed it.
#[derive(Clone, Copy)]
struct SpilledHit {
    /// None: the entry's bytes are not a reference (refused).
    r: Option<SpillRef>,
    flags: u32,
    expires_ms: u64,
}

impl SpilledHit {
    fn of(e: &EntryRef<'_>) -> Self {
        SpilledHit {
            r: e.spill_ref(),
            flags: e.flags() & !FLAG_SPILLED,
            expires_ms: e.expires_ms(),
        }
    }
}

/// Outcome of reading a spilled value.
enum SpillRead<R> {
    Got(R),
    /// Refused or gone for good: a miss.
    Miss,
    /// The file was gone: the entry was replaced or removed meanwhile; read
    /// the index again.
    Again,
}

/// Gets that find a spilled value's file gone re-read the index this many
/// times (each time means a writer replaced the value meanwhile) before
/// they count the entry as dangling.
const SPILL_READ_TRIES: usize = 4;

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

/// One cache file mapped into this process: the engine proper. The public
/// [`Cache`] routes every call to the `Store` of the file that holds the
/// key now (two during a live resize, see `resize.rs`).
pub(crate) struct Store {
    /// Shared with every other handle of the file in this process.
    map: Arc<Mapping>,
    geo: Geometry,
    shards: Vec<Shard>,
    path: PathBuf,
    max_entry: usize,
    lock_timeout: std::time::Duration,
    closed: AtomicBool,
    /// Values longer than this are spilled (see `spill.rs`).
    spill_threshold: usize,
    /// Most bytes spilled files may hold (0: spilling disabled).
    spill_budget: u64,
    allow_foreign_owner: bool,
    /// The spill directory, opened on first use.
    spill: OnceLock<SpillDir>,
    /// Where the next budget eviction starts (a shard index).
    spill_hand: AtomicUsize,
    /// Bytes of the file system this handle leaves free (`fs_reserve`,
    /// resolved at open; 0: none).
    fs_reserve: u64,
    /// Where the next shard gives memory back for a spilled value.
    room_hand: AtomicUsize,
    /// This handle's sampled requests (reads, hits and misses, and stores
    /// of absent keys), per shard, for the shard's miniature caches
    /// (`shard/policy.rs`): replayed after this handle's next write there.
    read_samples: Samples,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("path", &self.path)
            .field("shards", &self.geo.shard_count)
            .field("capacity", &self.geo.total_size())
            .finish()
    }
}

/// A u64 field of the file header of `m`, as an atomic.
pub(crate) fn header_word(m: &Mapping, field: usize) -> &AtomicU64 {
    debug_assert!(field % 8 == 0 && field + 8 <= fh::FIELDS_END);
    // SAFETY: the header page is mapped as long as `m`; `field` is an
    // 8-aligned offset inside its fields (above), and every process
    // accesses these words only atomically.
    unsafe { &*(m.ptr.add(field) as *const AtomicU64) }
}

/// The per-CPU counters in the file header of `m`.
fn stripes_of(m: &Mapping) -> Stripes {
    // SAFETY: m.ptr is the page-aligned start of the mapping, whose first
    // HEADER_SIZE bytes are the file header; the Stripes live in the Cache
    // (and its Shards) next to the Mapping and are dropped with it.
    unsafe { Stripes::new(m.ptr) }
}

/// The shards of `m`, whose growths leave `fs_reserve` bytes of the file
/// system free.
fn shards_of(m: &Mapping, geo: &Geometry, fs_reserve: u64) -> Vec<Shard> {
    let stripes = stripes_of(m);
    (0..geo.shard_count)
        .map(|i| {
            // SAFETY: shard i spans [HEADER_SIZE + i*shard_size, +shard_size),
            // inside the mapping of total_size bytes; the Vec<Shard> lives in
            // the Cache next to the Mapping and is dropped with it.
            // The file descriptor stays open as long as the mapping.
            unsafe {
                let off = HEADER_SIZE + i * geo.shard_size;
                let fd = m.file.as_raw_fd();
                Shard::new(m.ptr.add(off), geo, m.lazy, fd, off, stripes, fs_reserve)
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

impl Store {
    /// Open or create the file at `file_path`, whose spill directory and
    /// claims are named after `name` (the cache's path: a resize builds
    /// its new file under a temporary name, and its spilled values live
    /// beside the cache). `origin`: the id of the migration this new file
    /// is built for (see `resize.rs`), recorded in its header at creation,
    /// and the hash seed it keeps from the old file.
    ///
    /// If this process already has the file mapped (through another handle
    /// still alive, closed or not), the new handle shares that mapping,
    /// after the same checks as a first open (see `file::reopen`).
    pub(crate) fn open_as(
        file_path: &Path,
        name: &Path,
        opts: &OpenOptions,
        origin: Option<(u64, u64)>,
    ) -> Result<Store> {
        let (map, first_here) = match file::reopen(file_path, opts) {
            Some(map) => (map, false),
            None => (Store::map_file(file_path, name, opts, origin)?, true),
        };
        let geo = map.geo;
        // The default reserve was read once, when the file was mapped;
        // growths and spills then check it with one fstatvfs each.
        let fs_reserve = map.fs_reserve(opts.fs_reserve);
        let cache = Store {
            max_entry: geo.max_entry_size(),
            geo,
            shards: shards_of(&map, &geo, fs_reserve),
            fs_reserve,
            map,
            path: name.to_path_buf(),
            lock_timeout: opts.lock_timeout,
            closed: AtomicBool::new(false),
            spill_threshold: opts.spill_threshold.unwrap_or(file::DEFAULT_SPILL_THRESHOLD),
            spill_budget: opts.spill_budget,
            allow_foreign_owner: opts.allow_foreign_owner,
            spill: OnceLock::new(),
            // Where the spill sweeps start: this process's id (cached, so
            // opening costs no getpid).
            spill_hand: AtomicUsize::new(crate::lock::my_pid() as usize),
            room_hand: AtomicUsize::new(crate::lock::my_pid() as usize),
            read_samples: Samples::new(geo.shard_count, geo.policy_parts().1),
        };
        if first_here
            && cache.spill_budget > 0
            && !cache.allow_foreign_owner
            && file::in_shared_sticky_dir(name)
        {
            // In a directory every user can create names in (/tmp,
            // /dev/shm), claim `<cache>.spill` now, and refuse one another
            // user made: left for the first spill, the name could be taken
            // by anyone meanwhile, and every spill would fail.
            let dir = SpillDir::open(name, true, false)?.expect("created");
            let _ = cache.spill.set(dir);
        }
        Ok(cache)
    }

    /// Open (or create) and map the file, and register the mapping.
    fn map_file(
        path: &Path,
        name: &Path,
        opts: &OpenOptions,
        origin: Option<(u64, u64)>,
    ) -> Result<Arc<Mapping>> {
        let init = |m: &Mapping, g: &Geometry| {
            if let Some((id, _)) = origin {
                // Before anything else can see the file: its sweeps wait
                // for the migration to fill it (see `resize.rs`).
                header_word(m, fh::MIG_ORIGIN).store(id, Ordering::SeqCst);
                header_word(m, fh::MIG_FILLING).store(1, Ordering::SeqCst);
            }
            let keep = m.fs_reserve(opts.fs_reserve);
            for s in shards_of(m, g, keep) {
                s.init()?;
            }
            Ok(())
        };
        let reattach = |m: &Mapping, g: &Geometry| {
            let keep = m.fs_reserve(opts.fs_reserve);
            for s in shards_of(m, g, keep) {
                s.reattach_exclusive()?;
            }
            Ok(())
        };
        let alone = |m: &Mapping, g: &Geometry| sweep_alone(m, g, name, opts);
        let seed = origin.map(|(_, seed)| seed);
        let map = Arc::new(file::open(path, opts, seed, &init, &reattach, &alone)?.map);
        crate::registry::insert(&map);
        Ok(map)
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
    /// Largest entry (16-byte header + key + value, padded to 4) accepted.
    pub fn max_entry_size(&self) -> usize {
        self.max_entry
    }
    /// Longest value accepted (with a short key): the spill budget, or
    /// with spilling disabled what fits inline.
    pub fn max_value_size(&self) -> u64 {
        if self.spill_budget > 0 {
            self.spill_budget.min(isize::MAX as u64)
        } else {
            (self.max_entry - crate::layout::ENTRY_HEADER - 8) as u64
        }
    }
    /// Values longer than this are spilled to files (see `spill.rs`).
    pub fn spill_threshold(&self) -> usize {
        self.spill_threshold
    }
    /// Longest wait for a shard lock (see [`OpenOptions::lock_timeout`]).
    pub fn lock_timeout(&self) -> std::time::Duration {
        self.lock_timeout
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

    /// The shard of `key` and its hash. Checks only that the handle is
    /// open: a mapping left after a resize, or broken by a truncation, is
    /// zero pages, which fail every shard's checks; the error says which
    /// ([`Store::explain`]) once it happens, so the hot path reads no more
    /// per call.
    #[inline]
    fn route(&self, key: &[u8]) -> Result<(&Shard, u64)> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(Error::Closed);
        }
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(Error::BadKey { len: key.len(), max: MAX_KEY_LEN });
        }
        let h = hash_key(self.geo.seed, key);
        Ok((&self.shards[shard_of(h, self.geo.shard_count)], h))
    }

    /// `e`, from an operation on this file, or the error of a mapping
    /// truncated by another program, which is what made it (see
    /// [`Store::route`]).
    #[cold]
    #[inline(never)]
    pub(crate) fn explain(&self, e: Error) -> Error {
        if matches!(e, Error::Closed | Error::Moved) || self.retired() || !self.map.broken() {
            return e;
        }
        self.live().err().unwrap_or(e)
    }

    /// `Some(r)` (explained) if the failed result `r` of an operation on
    /// this file is final; `None` if the call must be routed again: the
    /// shard moved to a resize's new file, or this process left the file
    /// (its zero pages fail any operation).
    #[cold]
    #[inline(never)]
    fn final_error<T>(&self, r: Result<T>) -> Option<Result<T>> {
        match r {
            Err(Error::Moved) => None,
            Err(_) if self.retired() => None,
            Err(e) => Some(Err(self.explain(e))),
            ok => Some(ok),
        }
    }

    /// Lock `shard` for a change: a timeout is an error, and so is a
    /// shard a resize moved to a new file ([`Error::Moved`], which the
    /// public [`Cache`] follows).
    #[inline]
    fn lock_for_write<'a>(&'a self, shard: &'a Shard) -> Result<ShardGuard<'a>> {
        let g = shard
            .lock_sampled(self.lock_timeout, Some(&self.read_samples))
            .inspect_err(|e| self.noticed(e))?;
        self.check_not_moved(shard, g)
    }

    /// Record a read of the key hashed `h` (hit or miss) if its tag is
    /// sampled (see `read_samples`): a load and a branch for most reads.
    #[inline]
    fn sample_read(&self, h: u64) {
        if self.read_samples.on() {
            self.read_samples.note_read(shard_of(h, self.geo.shard_count), crate::hash::tag_of(h));
        }
    }

    /// `g`, unless its shard was moved by a resize: sealed (`seq` left
    /// odd), or marked in the file's moved bitmap (which survives a repair
    /// of the shard), or the mapping was retired after a resize. One load
    /// of a word the lock holder reads anyway, and of a header word every
    /// process only reads, on the path of every locked operation.
    #[inline]
    fn check_not_moved<'a>(&self, shard: &'a Shard, g: ShardGuard<'a>) -> Result<ShardGuard<'a>> {
        if g.is_sealed() || (self.migration_word() != 0 && self.is_moved(shard.number)) {
            return Err(Error::Moved);
        }
        if self.map.retired() {
            // Locked zero pages: the file was left after a resize.
            return Err(Error::Moved);
        }
        Ok(g)
    }

    /// The file's migration record (`fh::MIGRATION`, see `resize.rs`).
    #[inline]
    pub(crate) fn migration_word(&self) -> u64 {
        header_word(&self.map, fh::MIGRATION).load(Ordering::Acquire)
    }

    /// Whether shard `i` was moved by the migration in progress (its
    /// record says in how many groups the shards move).
    pub(crate) fn is_moved(&self, i: usize) -> bool {
        let groups = crate::resize::groups_of(self.migration_word() >> 2);
        crate::resize::moved_bit(&self.map, i % groups)
    }

    /// The mapping (for `resize.rs`).
    pub(crate) fn mapping(&self) -> &Arc<Mapping> {
        &self.map
    }

    /// The shards (for `resize.rs`).
    pub(crate) fn shard_slice(&self) -> &[Shard] {
        &self.shards
    }

    /// Whether this process left the file after a resize.
    #[inline]
    pub(crate) fn retired(&self) -> bool {
        self.map.retired()
    }

    /// The spill directory, if it exists (for `resize.rs`).
    pub(crate) fn spill_dir_if_any(&self) -> Option<&SpillDir> {
        self.spill_dir(false).ok().flatten()
    }

    /// Store entries copied by a resize, `(key, value, raw flags,
    /// absolute expiry)` in the order given (oldest first), each only if
    /// its key is absent (a newer write to the new file wins), taking each
    /// shard's lock once. A spilled entry's value is its reference and its
    /// flags carry `FLAG_SPILLED`. Returns, per entry, whether it was
    /// stored (an entry too large for this geometry, or refused, is not).
    pub(crate) fn put_moved(&self, entries: &[(&[u8], &[u8], u32, u64)]) -> Vec<bool> {
        let mut stored = vec![false; entries.len()];
        let keys: Vec<&[u8]> = entries.iter().map(|e| e.0).collect();
        let Ok(plan) = self.plan(&keys) else { return stored };
        let mut now = Now::new();
        for run in plan.chunk_by(|a, b| a.0 == b.0) {
            let Ok(g) = self.lock_for_write(&self.shards[run[0].0]) else { continue };
            for &(_, i, h) in run {
                let (k, v, f, e) = entries[i];
                if entry_size(k.len(), v.len()) <= self.max_entry {
                    stored[i] =
                        matches!(g.set(k, h, v, f, e, SetMode::IfAbsent, &mut now), Ok(true));
                }
            }
            drop(g);
            self.reap();
        }
        stored
    }

    /// Count spilled values a resize copied in (`bytes` in `n` files).
    pub(crate) fn count_moved_spills(&self, bytes: u64, n: u64) {
        header_word(&self.map, fh::SPILL_BYTES).fetch_add(bytes, Ordering::Relaxed);
        header_word(&self.map, fh::SPILL_VALUES).fetch_add(n, Ordering::Relaxed);
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
            Ok(g) => self.check_not_moved(shard, g).map(Some),
            Err(Error::LockTimeout { .. }) => Ok(None),
            Err(e) => {
                self.noticed(&e);
                Err(e)
            }
        }
    }

    /// Whether a value of `value_len` bytes under `key` is kept in a file.
    #[inline]
    fn spills(&self, key: &[u8], value_len: usize) -> bool {
        self.spill_budget > 0
            && (value_len > self.spill_threshold
                || entry_size(key.len(), value_len.min(usize::MAX / 2)) > self.max_entry)
    }

    /// Check that `value_len` bytes under `key` can be stored, inline or
    /// spilled.
    fn check_storable(&self, key: &[u8], value_len: usize) -> Result<()> {
        if !self.spills(key, value_len) {
            return self.check_fits(key, value_len);
        }
        self.check_fits(key, REF_LEN)?;
        if value_len as u64 > self.spill_budget {
            return Err(Error::OverSpillBudget {
                len: value_len as u64,
                budget: self.spill_budget,
            });
        }
        Ok(())
    }

    fn check_flags(flags: u32) -> Result<()> {
        if flags & FLAG_SPILLED != 0 {
            return Err(Error::InvalidArgument(format!(
                "flags {flags:#x} use bit 31, which the engine reserves"
            )));
        }
        Ok(())
    }

    fn check_fits(&self, key: &[u8], value_len: usize) -> Result<()> {
        // max_entry <= MAX_ENTRY_SIZE < 2^31, so this also keeps value_len
        // in the entry's 31 bits; saturating: a value near usize::MAX must
        // not wrap to a small size.
        let needed = entry_size(key.len(), value_len.min(usize::MAX / 2));
        if needed > self.max_entry || value_len >= 1 << 31 {
            let spilling = self.spill_budget > 0;
            return Err(Error::ValueTooLarge { needed, max: self.max_entry, spilling });
        }
        Ok(())
    }

    /// Run `f` on the value of `key` (no extra copy: `f` copies straight
    /// from the mapping, or from a spilled value's file, into its own
    /// buffer).
    ///
    /// The read is optimistic: it takes no lock, and if a writer changed
    /// the shard meanwhile, what `f` returned is dropped and the read runs
    /// again (at last under the lock). So `f` may run more than once, on
    /// bytes that were changing; it must only copy them out, and only the
    /// result of a validated run is returned. A spilled value whose file
    /// fails its checks is dropped and reads as a miss.
    #[inline]
    pub fn get_with<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        for _ in 0..SPILL_READ_TRIES {
            let mut now = Now::new();
            let mut intercept = |e: EntryRef<'_>| Hit::of(e, &mut f);
            let hit = match shard.get_optimistic(key, h, &mut now, &mut intercept) {
                Some(hit) => hit,
                None => {
                    let g = self.lock_for_read(shard)?;
                    let hit = g.and_then(|g| g.get(key, h, &mut now, intercept));
                    self.reap();
                    hit
                }
            };
            self.sample_read(h);
            match hit {
                None => return Ok(None),
                Some(Hit::Value(r)) => return Ok(Some(r)),
                Some(Hit::Spilled(s)) => match self.finish_spilled(key, s, false, &mut f) {
                    SpillRead::Got(r) => return Ok(Some(r)),
                    SpillRead::Miss => return Ok(None),
                    SpillRead::Again => continue,
                },
            }
        }
        Ok(None)
    }

    /// [`Cache::get_with`] under the shard lock: `f` runs at most once, on
    /// bytes that do not change (for callers whose `f` cannot run twice).
    #[inline]
    pub fn get_locked_with<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        self.get_once(key, false, f)
    }

    /// [`Cache::get_locked_with`]; with `whole`, a spilled value is
    /// verified in memory before `f` sees it (see [`Cache::read_spilled`]).
    fn get_once<R>(
        &self,
        key: &[u8],
        whole: bool,
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let mut f = Some(f);
        for _ in 0..SPILL_READ_TRIES {
            let Some(g) = self.lock_for_read(shard)? else { return Ok(None) };
            let hit = g.get(key, h, &mut Now::new(), |e| {
                Hit::of(e, |e| (f.take().expect("called once"))(e))
            });
            drop(g);
            self.reap();
            self.sample_read(h);
            match hit {
                None => return Ok(None),
                Some(Hit::Value(r)) => return Ok(Some(r)),
                Some(Hit::Spilled(s)) => {
                    let mut once = |e: EntryRef<'_>| f.take().map(|f| f(e));
                    match self.finish_spilled(key, s, whole, &mut once) {
                        SpillRead::Got(r) => return Ok(r),
                        SpillRead::Miss => return Ok(None),
                        SpillRead::Again => continue,
                    }
                }
            }
        }
        Ok(None)
    }

    /// Read the spilled value `s` of `key` through `f` (`whole`: load and
    /// verify it in memory first, see [`Cache::read_spilled`]).
    fn finish_spilled<R>(
        &self,
        key: &[u8],
        s: SpilledHit,
        whole: bool,
        f: &mut impl FnMut(EntryRef<'_>) -> R,
    ) -> SpillRead<R> {
        match self.read_spilled(&s, whole, f) {
            Ok(out) => SpillRead::Got(out),
            // Replaced or removed since the index was read (the entry
            // leaves the index before its file goes): read the index again.
            // If it still names this file, the file was removed behind the
            // cache's back.
            Err(Refusal::Missing) if self.peek_spill_ref(key) != s.r => SpillRead::Again,
            // This process's own trouble (descriptors, memory, I/O): a miss
            // here; the value stays for everyone else.
            Err(Refusal::Local(_)) => SpillRead::Miss,
            Err(_) => {
                self.refuse_spilled(key, s.r.as_ref());
                SpillRead::Miss
            }
        }
    }

    /// Open the file of the spilled value `s` and read it through `f`:
    /// `f`'s result, or why the file was not served.
    ///
    /// The value is verified before `f` sees it (`f` may write where it
    /// cannot be taken back: a batch's output, a C allocator). With
    /// `whole`, it is read into memory and verified there, and `f` copies
    /// from memory: `f` then never sees anything but the verified value.
    /// Without, `f` copies from the verified file, and a read error in
    /// that copy (an I/O error) makes the caller discard `f`'s result.
    fn read_spilled<R>(
        &self,
        s: &SpilledHit,
        whole: bool,
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> std::result::Result<R, Refusal> {
        let r = s.r.ok_or(Refusal::Bad("not a reference"))?;
        let dir = match self.spill_dir(false) {
            Ok(Some(dir)) => dir,
            // No directory at all (the path is absolute): the value cannot
            // be there.
            Ok(None) => return Err(Refusal::Missing),
            // This process cannot open it (descriptors, permissions).
            Err(_) => return Err(Refusal::Local("spill directory")),
        };
        let mut file = dir.open_value(&r)?;
        if whole {
            file.load()?;
        } else {
            file.check()?;
        }
        let out = f(EntryRef::spilled(&file, s.flags, s.expires_ms));
        if file.failed() {
            Err(Refusal::Local("read"))
        } else {
            Ok(out)
        }
    }

    /// Count a spilled value that was not served.
    fn count_refused(&self) {
        header_word(&self.map, fh::SPILL_REFUSED).fetch_add(1, Ordering::Relaxed);
    }

    /// The spill reference `key` names now, if its value is spilled.
    fn peek_spill_ref(&self, key: &[u8]) -> Option<SpillRef> {
        let (shard, h) = self.route(key).ok()?;
        let g = self.lock_for_read(shard).ok()??;
        // A look, not a read: `contains` semantics would skip the hit
        // count, but the lookup below counts one; that is acceptable for
        // this rare path.
        g.get(key, h, &mut Now::new(), |e| e.spill_ref()).flatten()
    }

    /// A spilled value failed its checks (or its file is gone): count it and
    /// drop its entry if it still names that file (`None`: the entry's bytes
    /// were not a reference at all).
    #[cold]
    fn refuse_spilled(&self, key: &[u8], r: Option<&SpillRef>) {
        self.count_refused();
        let Ok((shard, h)) = self.route(key) else { return };
        let Ok(g) = self.lock_for_write(shard) else { return };
        let mut now = Now::new();
        let names_it = g
            .get(key, h, &mut now, |e| e.flags() & FLAG_SPILLED != 0 && e.spill_ref().as_ref() == r)
            .unwrap_or(false);
        if names_it {
            g.delete(key, h, &mut now);
        }
        drop(g);
        self.reap();
    }

    /// The value and flags of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        self.get_with(key, |e| Value { data: e.to_vec(), flags: e.flags() })
    }

    /// Store `value` with `flags` for `ttl_ms` (0 = never expires).
    ///
    /// Fails with [`Error::Full`], leaving the old value, only when the
    /// file system has no room to grow the key's shard and the entry is
    /// larger than all the space that shard holds, or no room for a
    /// spilled value's file.
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
    /// Values above the spill threshold go to a file (see `spill.rs`).
    /// Inlined into each caller: one call frame fewer on every set.
    #[inline(always)]
    pub fn store(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        mode: SetMode,
    ) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        Self::check_flags(flags)?;
        if self.spills(key, value.len()) {
            return self.store_spilled((shard, h), key, value, flags, ttl_ms, mode);
        }
        self.check_fits(key, value.len())?;
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        let g = self.lock_for_write(shard)?;
        let stored = g.set(key, h, value, flags, exp, mode, &mut now);
        drop(g);
        self.reap();
        stored
    }

    /// Write `value` to a file, then publish an entry naming it.
    fn store_spilled(
        &self,
        (shard, h): (&Shard, u64),
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        mode: SetMode,
    ) -> Result<bool> {
        self.check_storable(key, value.len())?;
        // Cheap early answer for add/replace (the decision that counts is
        // made again under the lock).
        match mode {
            SetMode::IfAbsent if self.contains(key)? => return Ok(false),
            SetMode::IfPresent if !self.contains(key)? => return Ok(false),
            _ => {}
        }
        self.spill_and_publish(
            shard,
            value,
            |g, reference, now| {
                let exp = expires_for(ttl_ms, now);
                g.set(key, h, reference, flags | FLAG_SPILLED, exp, mode, now)
            },
            |stored| matches!(stored, Ok(true)),
        )
    }

    /// The one protocol of spilled writes (sets and compare-and-swaps):
    /// count `value`'s bytes in the spill budget, write its file, then
    /// `publish` an entry naming it (given the reference bytes) under the
    /// shard's lock; `kept` says whether that outcome left an entry naming
    /// the file. A file no entry names is removed, and whoever removes it
    /// gives its bytes back (once: a sweep may have removed it first).
    fn spill_and_publish<T>(
        &self,
        shard: &Shard,
        value: &[u8],
        publish: impl FnOnce(&ShardGuard<'_>, &[u8], &mut Now) -> Result<T>,
        kept: impl FnOnce(&Result<T>) -> bool,
    ) -> Result<T> {
        let len = value.len() as u64;
        // Orphans of writers killed between linking and publishing (or
        // between dropping an entry and removing its file) go here, at most
        // once per SWEEP_GRACE across all processes, as well as when the
        // budget runs short and when a process attaches alone.
        self.sweep_if_due();
        self.reserve_spill(len)?;
        let unreserve = || saturating_sub(header_word(&self.map, fh::SPILL_BYTES), len);
        let (dir, r, publishing) = match self.write_spill(value) {
            Ok(w) => w,
            Err(e) => {
                unreserve();
                return Err(e);
            }
        };
        let mut now = Now::new();
        let out = self.lock_for_write(shard).and_then(|g| publish(&g, &r.to_bytes(), &mut now));
        if kept(&out) {
            header_word(&self.map, fh::SPILL_VALUES).fetch_add(1, Ordering::Relaxed);
        } else if dir.remove(r.id) {
            unreserve();
        }
        // Published (or removed): sweeps may examine the file now.
        drop(publishing);
        self.reap();
        out
    }

    /// Write a spilled value's file. When the file system has no room for
    /// it (full, or its reserve reached), make room by eviction and write
    /// once more; only then refuse, saying what was tried.
    fn write_spill(&self, value: &[u8]) -> Result<(&SpillDir, SpillRef, Publishing)> {
        let dir = self.spill_dir(true)?.expect("created");
        match dir.write(value, self.fs_reserve) {
            Ok((r, publishing)) => Ok((dir, r, publishing)),
            Err(Error::Full(_)) => {
                let tried = self.make_room(dir, value.len() as u64);
                match dir.write(value, self.fs_reserve) {
                    Ok((r, publishing)) => Ok((dir, r, publishing)),
                    Err(Error::Full(msg)) => Err(Error::Full(format!("{msg}; {tried}"))),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Free `len` bytes beyond the reserve on the spill directory's file
    /// system: evict spilled values first (SIEVE, from the spill hand),
    /// then have shards give memory back (`ShardGuard::give_back`, from a
    /// moving hand), each asked for its share plus one growth step, until
    /// `fstatvfs` shows the room. Bounded: one round of the shards each.
    /// Returns what it did, for the error if that was not enough.
    #[cold]
    fn make_room(&self, dir: &SpillDir, len: u64) -> String {
        let want = len.saturating_add(self.fs_reserve);
        match dir.fs_space() {
            Ok((size, _)) if want > size => {
                // No eviction could make this room: evict nothing.
                return format!(
                    "the value and the {} bytes this cache keeps free (the fs_reserve option; 0 \
                     turns it off) exceed the whole file system ({size} bytes), so nothing was \
                     evicted to make room",
                    self.fs_reserve
                );
            }
            _ => {}
        }
        let avail = || dir.fs_space().map(|(_, avail)| avail).unwrap_or(0);
        let short = |avail: u64| want.saturating_sub(avail);
        let n = self.shards.len();
        let mut need = short(avail());
        // Spilled values: one round, until their files hold what is short.
        let (mut spilled, mut given) = (0u64, 0u64);
        for _ in 0..n {
            if spilled >= need {
                break;
            }
            let i = self.spill_hand.fetch_add(1, Ordering::Relaxed) % n;
            if let Ok(g) = self.lock_for_write(&self.shards[i]) {
                spilled += g.evict_spilled(need - spilled, &mut Now::new());
            }
            self.reap();
        }
        if spilled > 0 {
            need = short(avail());
        }
        // Shard memory: each shard its share of what is still short.
        if need > 0 {
            let share = (need.div_ceil(n as u64) as usize).saturating_add(GROW_CHUNK);
            for _ in 0..n {
                let i = self.room_hand.fetch_add(1, Ordering::Relaxed) % n;
                if let Ok(g) = self.lock_for_write(&self.shards[i]) {
                    given += g.give_back(share, &mut Now::new()) as u64;
                }
                self.reap();
                if given >= need && short(avail()) == 0 {
                    break;
                }
            }
        }
        format!(
            "to make room, {spilled} bytes of spilled values were evicted and the shards gave \
             back {given} bytes; the file system has {} bytes available, and this cache keeps \
             {} of them free (the fs_reserve option; 0 turns it off)",
            avail(),
            self.fs_reserve
        )
    }

    /// Count `len` more spilled bytes, first evicting spilled values (SIEVE
    /// order, shard by shard from a moving hand) while the budget would be
    /// passed. Fails, counting nothing, if they cannot make room.
    fn reserve_spill(&self, len: u64) -> Result<()> {
        let bytes = header_word(&self.map, fh::SPILL_BYTES);
        let before = bytes.fetch_add(len, Ordering::AcqRel);
        if before.saturating_add(len) <= self.spill_budget {
            return Ok(());
        }
        let n = self.shards.len();
        let mut swept = false;
        // Two rounds: the first clears visited marks it passes over.
        let mut visits = 0;
        while bytes.load(Ordering::Acquire) > self.spill_budget {
            if visits == 2 * n {
                if swept {
                    saturating_sub(bytes, len);
                    return Err(Error::Full(format!(
                        "the spill budget of {} bytes is held by values being written by \
                         other processes (or by files of values a shard reset dropped, until \
                         a sweep removes them); raise the spill_budget option",
                        self.spill_budget
                    )));
                }
                // Orphans of killed writers may hold the budget.
                swept = true;
                visits = 0;
                let _ = self.sweep_spilled(SWEEP_GRACE);
                continue;
            }
            let i = self.spill_hand.fetch_add(1, Ordering::Relaxed) % n;
            visits += 1;
            let need = bytes.load(Ordering::Acquire).saturating_sub(self.spill_budget);
            let g = match self.lock_for_write(&self.shards[i]) {
                Ok(g) => g,
                // Moved to a resized file: nothing of it to evict here.
                Err(Error::Moved) => continue,
                Err(e) => {
                    saturating_sub(bytes, len);
                    return Err(e);
                }
            };
            g.evict_spilled(need, &mut Now::new());
            drop(g);
            self.reap();
        }
        Ok(())
    }

    /// Remove the files of spilled entries this thread dropped from the
    /// index (after the shard lock is released), and uncount them.
    #[inline]
    fn reap(&self) {
        if shard_mod::has_dropped() {
            self.reap_dropped();
        }
    }

    #[cold]
    fn reap_dropped(&self) {
        let base = self.map.ptr as usize;
        let dropped = shard_mod::take_dropped(base..base + self.map.len);
        if dropped.is_empty() {
            return;
        }
        let dir = self.spill_dir(false);
        for r in dropped {
            // The bytes go back exactly once, by whoever removes the file:
            // here, unless a sweep removed it first (it gave them back), or
            // this process cannot reach the directory (the file stays an
            // orphan, counted, until a sweep removes it). No directory at
            // all: no file to count.
            let gone = match dir {
                Ok(Some(dir)) => dir.remove(r.id),
                Ok(None) => true,
                Err(_) => false,
            };
            if gone {
                saturating_sub(header_word(&self.map, fh::SPILL_BYTES), r.len);
            }
            saturating_sub(header_word(&self.map, fh::SPILL_VALUES), 1);
        }
    }

    /// The spill directory, opened (and with `create`, made) on first use.
    fn spill_dir(&self, create: bool) -> Result<Option<&SpillDir>> {
        if let Some(d) = self.spill.get() {
            return Ok(Some(d));
        }
        match SpillDir::open(&self.path, create, self.allow_foreign_owner)? {
            Some(d) => Ok(Some(self.spill.get_or_init(|| d))),
            None => Ok(None),
        }
    }

    /// The ids of the files live entries name, and their bytes.
    fn referenced_spills(&self) -> Result<(HashSet<u64>, u64)> {
        let mut refs = Vec::new();
        for s in &self.shards {
            self.lock_for_write(s)?.spilled_refs(&mut refs);
        }
        self.reap();
        let bytes = refs.iter().map(|r| r.len).sum();
        Ok((refs.into_iter().map(|r| r.id).collect(), bytes))
    }

    /// Remove spilled files that no live entry names and whose status
    /// changed more than `grace` ago (files younger than that may be
    /// between being linked and being published by another process).
    pub fn sweep_spilled(&self, grace: std::time::Duration) -> Result<SweepReport> {
        self.live()?;
        if crate::resize::sweeps_paused(&self.map) {
            // Entries are moving between two files: neither knows every
            // file the other names.
            return Ok(SweepReport::default());
        }
        let Some(dir) = self.spill_dir(false)? else { return Ok(SweepReport::default()) };
        let report = dir.sweep(grace, &mut || Ok(self.referenced_spills()?.0))?;
        // An orphan's bytes were counted when its writer reserved them and
        // nobody took them back: the writer died before publishing, or
        // its entry vanished in a shard reset (which cannot read the
        // references of a shard it does not trust). Without this the
        // budget would shrink with every such reset until all processes
        // detached.
        saturating_sub(header_word(&self.map, fh::SPILL_BYTES), report.removed_bytes);
        header_word(&self.map, fh::SPILL_SWEPT_MS).store(crate::shard::now_ms(), Ordering::Relaxed);
        Ok(report)
    }

    /// Sweep at most once per `SWEEP_GRACE` across all processes.
    fn sweep_if_due(&self) {
        let word = header_word(&self.map, fh::SPILL_SWEPT_MS);
        let last = word.load(Ordering::Relaxed);
        let now = crate::shard::now_ms();
        if now.saturating_sub(last) >= SWEEP_GRACE.as_millis() as u64
            && word.compare_exchange(last, now, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        {
            let _ = self.sweep_spilled(SWEEP_GRACE);
        }
    }

    /// Remove `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        let removed = g.delete(key, h, &mut Now::new());
        drop(g);
        self.reap();
        Ok(removed)
    }

    /// Delete `key` only if its value is exactly `expected`; returns whether
    /// it deleted. Atomic: one lock hold covers the comparison and the delete.
    /// A spilled value never compares equal (compare-and-delete is meant for
    /// small tokens such as lock owners).
    pub fn delete_if_equals(&self, key: &[u8], expected: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        let removed = g.delete_if_equals(key, h, expected, &mut Now::new());
        drop(g);
        self.reap();
        Ok(removed)
    }

    /// Remove `key` and hand its value to `f`.
    ///
    /// A spilled value's file is opened while the entry is still in the
    /// index, under the shard lock: once the entry is gone the file is an
    /// orphan that any sweep may remove, and an open descriptor keeps it
    /// readable. If this process cannot open it (out of descriptors), the
    /// entry is removed all the same and the pop fails with that error.
    pub fn pop_with<R>(&self, key: &[u8], f: impl FnOnce(EntryRef<'_>) -> R) -> Result<Option<R>> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        let mut f = Some(f);
        let hit = g.pop(key, h, &mut Now::new(), |e| {
            if e.flags() & FLAG_SPILLED == 0 {
                return Ok((f.take().expect("called once"))(e));
            }
            let s = SpilledHit::of(&e);
            // Opened once per handle (the first spilled pop may open the
            // directory under the lock).
            let dir = self.spill_dir(false);
            let opened = match (&s.r, &dir) {
                (None, _) => Err(Refusal::Bad("not a reference")),
                (Some(r), Ok(Some(d))) => d.open_value(r),
                (Some(_), Ok(None)) => Err(Refusal::Missing),
                (Some(_), Err(_)) => Err(Refusal::Local("spill directory")),
            };
            Err(Box::new((s, opened)))
        });
        drop(g);
        let out = match hit {
            None => Ok(None),
            Some(Ok(r)) => Ok(Some(r)),
            Some(Err(spilled)) => {
                let (s, opened) = *spilled;
                let read = opened.and_then(|mut file| {
                    file.check()?;
                    let r = (f.take().expect("called once"))(EntryRef::spilled(
                        &file,
                        s.flags,
                        s.expires_ms,
                    ));
                    if file.failed() {
                        Err(Refusal::Local("read"))
                    } else {
                        Ok(r)
                    }
                });
                match read {
                    Ok(r) => Ok(Some(r)),
                    Err(Refusal::Local(what)) => Err(Error::io(
                        "pop of a spilled value (the entry was removed)",
                        std::io::Error::other(format!(
                            "this process could not read its file ({what}): out of \
                             descriptors or memory, or an I/O error"
                        )),
                    )),
                    Err(_) => {
                        self.count_refused();
                        Ok(None)
                    }
                }
            }
        };
        self.reap();
        out
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
        let present = g.touch(key, h, exp, &mut now);
        drop(g);
        self.reap();
        Ok(present)
    }

    /// Absolute expiry of `key` in Unix ms (0 = never), None if absent.
    pub fn expires_at(&self, key: &[u8]) -> Result<Option<u64>> {
        let (shard, h) = self.route(key)?;
        let Some(g) = self.lock_for_read(shard)? else { return Ok(None) };
        let exp = g.expires_of(key, h, &mut Now::new());
        drop(g);
        self.reap();
        Ok(exp)
    }

    /// Whether `key` is present (does not count as a hit).
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let Some(g) = self.lock_for_read(shard)? else { return Ok(false) };
        let present = g.contains(key, h, &mut Now::new());
        drop(g);
        self.reap();
        Ok(present)
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
        let r = g.incr(key, h, delta, initial, exp, FLAG_INT, &mut now);
        drop(g);
        self.reap();
        r
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
    /// called for each hit, with `i` the key's position. Spilled values are
    /// read after their shard's lock is released.
    pub fn get_many_with<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        mut f: impl FnMut(usize, EntryRef<'_>),
    ) -> Result<()> {
        let mut now = Now::new();
        let mut spilled = Vec::new();
        for run in self.plan(keys)?.chunk_by(|a, b| a.0 == b.0) {
            let Some(g) = self.lock_for_read(&self.shards[run[0].0])? else { continue };
            for &(_, i, h) in run {
                g.get(keys[i].as_ref(), h, &mut now, |e| {
                    if e.flags() & FLAG_SPILLED != 0 {
                        spilled.push((i, SpilledHit::of(&e)));
                    } else {
                        f(i, e)
                    }
                });
            }
        }
        self.reap();
        // `f` writes the caller's output: it must see each key at most
        // once, and only whole, verified values. So spilled values are
        // verified in memory before `f` runs, and a key whose value was
        // replaced meanwhile is read again under the lock (never through
        // optimistic attempts, whose abandoned copies `f` would have made).
        for (i, s) in spilled {
            let key = keys[i].as_ref();
            let mut call = |e: EntryRef<'_>| f(i, e);
            if let SpillRead::Again = self.finish_spilled(key, s, true, &mut call) {
                self.get_once(key, true, |e| f(i, e))?;
            }
        }
        Ok(())
    }

    /// Store many (key, value, flags) items with one TTL, taking each
    /// shard's lock once. All entries are size-checked before anything is
    /// stored, so a too-large item leaves the cache unchanged. On a full
    /// file system an item larger than its shard's held space fails with
    /// [`Error::Full`]: the items before it are stored, that one and the
    /// rest are not. Values above the spill threshold are stored one by
    /// one, after the inline ones.
    pub fn set_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        items: &[(K, V, u32)],
        ttl_ms: u64,
    ) -> Result<()> {
        let mut inline = Vec::with_capacity(items.len());
        let mut large = Vec::new();
        for (i, (k, v, fl)) in items.iter().enumerate() {
            Self::check_flags(*fl)?;
            self.check_storable(k.as_ref(), v.as_ref().len())?;
            if self.spills(k.as_ref(), v.as_ref().len()) {
                large.push(i);
            } else {
                inline.push(i);
            }
        }
        let keys: Vec<&[u8]> = inline.iter().map(|&i| items[i].0.as_ref()).collect();
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        for run in self.plan(&keys)?.chunk_by(|a, b| a.0 == b.0) {
            let g = self.lock_for_write(&self.shards[run[0].0])?;
            for &(_, j, h) in run {
                let (k, v, fl) = &items[inline[j]];
                if let Err(e) =
                    g.set(k.as_ref(), h, v.as_ref(), *fl, exp, SetMode::Always, &mut now)
                {
                    drop(g);
                    self.reap();
                    return Err(e);
                }
            }
            drop(g);
            self.reap();
        }
        for i in large {
            let (k, v, fl) = &items[i];
            self.store(k.as_ref(), v.as_ref(), *fl, ttl_ms, SetMode::Always)?;
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
            drop(g);
            self.reap();
        }
        Ok(n)
    }

    /// Pin how every shard chooses its admission mode (kept in the file:
    /// every process attached sees it; `docs/design/engine.md`,
    /// "Eviction").
    pub fn set_eviction_mode(&self, mode: EvictionMode) -> Result<()> {
        self.live()?;
        for s in &self.shards {
            self.lock_for_write(s)?.pin_eviction(mode);
        }
        Ok(())
    }

    /// The pinned admission mode (the first shard's: every shard is set
    /// alike).
    pub fn eviction_mode(&self) -> Result<EvictionMode> {
        self.live()?;
        Ok(self.lock_for_write(&self.shards[0])?.eviction_mode())
    }

    /// How many shards admit new entries strictly now.
    pub fn strict_shards(&self) -> Result<usize> {
        self.count_shards(|g| g.runs_strict())
    }

    /// How many shards admit leniently now and keep half their entries
    /// young (an adaptive shard on a working set that moves) instead of a
    /// twelfth.
    pub fn young_half_shards(&self) -> Result<usize> {
        self.count_shards(|g| g.runs_young_half())
    }

    /// How many shards `state` holds of, each asked under its lock.
    fn count_shards(&self, state: impl Fn(&ShardGuard<'_>) -> bool) -> Result<usize> {
        self.live()?;
        let mut n = 0;
        for s in &self.shards {
            n += state(&self.lock_for_write(s)?) as usize;
        }
        Ok(n)
    }

    /// Remove every entry (and every spilled value's file).
    pub fn clear(&self) -> Result<()> {
        self.live()?;
        for s in &self.shards {
            self.lock_for_write(s)?.clear();
            self.reap();
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
    /// `hits` and `misses` are 0, and [`Cache::stats`] adds the file's
    /// counters.
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
            spilled_bytes: header_word(&self.map, fh::SPILL_BYTES).load(Ordering::Relaxed),
            spilled_values: header_word(&self.map, fh::SPILL_VALUES).load(Ordering::Relaxed),
            spill_refused: header_word(&self.map, fh::SPILL_REFUSED).load(Ordering::Relaxed),
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

    // ---- versions and compare-and-swap (see "Versions" in shard/mod.rs)

    /// [`Cache::get_with`], plus the version of the entry the value was
    /// read from (never 0). The pair is consistent: the value is the one
    /// that version names. As with `get_with`, `f` may run more than once.
    pub fn get_versioned_with<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(EntryRef<'_>) -> R,
    ) -> Result<Option<(R, u64)>> {
        let (shard, h) = self.route(key)?;
        for _ in 0..SPILL_READ_TRIES {
            let mut now = Now::new();
            let mut intercept = |e: EntryRef<'_>| {
                let version = e.version();
                (Hit::of(e, &mut f), version)
            };
            let hit = match shard.get_optimistic(key, h, &mut now, &mut intercept) {
                Some(hit) => hit,
                None => {
                    let g = self.lock_for_read(shard)?;
                    let hit = g.and_then(|g| g.get(key, h, &mut now, intercept));
                    self.reap();
                    hit
                }
            };
            match hit {
                None => return Ok(None),
                Some((Hit::Value(r), v)) => return Ok(Some((r, v))),
                // A spilled value's file never changes once published (a
                // new value is a new file): what it holds is what the
                // entry with this version named, even if the entry was
                // replaced since (the version is then stale, and a CAS
                // with it fails).
                Some((Hit::Spilled(s), v)) => match self.finish_spilled(key, s, false, &mut f) {
                    SpillRead::Got(r) => return Ok(Some((r, v))),
                    SpillRead::Miss => return Ok(None),
                    SpillRead::Again => continue,
                },
            }
        }
        Ok(None)
    }

    /// The value, flags and version of `key`.
    pub fn get_versioned(&self, key: &[u8]) -> Result<Option<(Value, u64)>> {
        self.get_versioned_with(key, |e| Value { data: e.to_vec(), flags: e.flags() })
    }

    /// The version of `key` now (0: absent), read under the lock. Like a
    /// get, a lock wait that runs out reads as absent (0).
    pub fn version(&self, key: &[u8]) -> Result<u64> {
        let (shard, h) = self.route(key)?;
        let Some(g) = self.lock_for_read(shard)? else { return Ok(0) };
        let v = g.current_version(key, h, &mut Now::new());
        drop(g);
        self.reap();
        Ok(v)
    }

    /// Compare-and-swap: store `value` (with `flags`, for `ttl_ms`, 0 =
    /// never expires) only if `key`'s version is still `expected`; 0
    /// means "only if absent" (an add that reports the version found).
    /// [`CasOutcome::Stored`] carries the new version,
    /// [`CasOutcome::Conflict`] the version found (0: absent), with the
    /// cache unchanged. A CAS may fail although the value did not change
    /// (a compaction moved the shard's entries): read again and retry.
    /// Values above the spill threshold are spilled as by `set`.
    pub fn cas(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        expected: u64,
    ) -> Result<CasOutcome> {
        let (shard, h) = self.route(key)?;
        Self::check_flags(flags)?;
        if self.spills(key, value.len()) {
            return self.cas_spilled((shard, h), key, value, flags, ttl_ms, expected);
        }
        self.check_fits(key, value.len())?;
        let mut now = Now::new();
        let exp = expires_for(ttl_ms, &mut now);
        let g = self.lock_for_write(shard)?;
        let out = g.cas(key, h, value, flags, exp, expected, &mut now);
        drop(g);
        self.reap();
        out
    }

    /// [`Cache::cas`] of a value kept in a file: the file is written
    /// first, outside the lock; the entry naming it is stored only if the
    /// version still matches, and the file removed if not.
    fn cas_spilled(
        &self,
        (shard, h): (&Shard, u64),
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        expected: u64,
    ) -> Result<CasOutcome> {
        self.check_storable(key, value.len())?;
        // Cheap early answer: writing the file is the expensive part. A
        // write's lock wait: a timeout is an error, not an absent key.
        let g = self.lock_for_write(shard)?;
        let current = g.current_version(key, h, &mut Now::new());
        drop(g);
        self.reap();
        if current != expected {
            return Ok(CasOutcome::Conflict(current));
        }
        self.spill_and_publish(
            shard,
            value,
            |g, reference, now| {
                let exp = expires_for(ttl_ms, now);
                g.cas(key, h, reference, flags | FLAG_SPILLED, exp, expected, now)
            },
            |out| matches!(out, Ok(CasOutcome::Stored(_))),
        )
    }

    /// Delete `key` only if its version is `expected` (0 never matches:
    /// an absent key has nothing to delete). Returns whether it deleted.
    pub fn delete_if_version(&self, key: &[u8], expected: u64) -> Result<bool> {
        let (shard, h) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        let removed = g.delete_if_version(key, h, expected, &mut Now::new());
        drop(g);
        self.reap();
        Ok(removed)
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

    /// Test hook: lock the shard of `key` and hold the lock for `hold`
    /// without changing anything, as a writer preempted inside a write
    /// would (seq stays even). Never called in normal use.
    #[doc(hidden)]
    pub fn debug_hold_shard_lock(&self, key: &[u8], hold: std::time::Duration) -> Result<()> {
        let (shard, _) = self.route(key)?;
        let g = self.lock_for_write(shard)?;
        std::thread::sleep(hold);
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

// ---- the public handle: routing every call across a live resize

/// Redirections one call follows before it gives up (each means a resize
/// moved the key's shard, or finished, while the call was under way).
const REDIRECTS: usize = 64;
/// How often (ms) a handle that routes around a migration checks that
/// its resizer is still alive.
const PROBE_MS: u64 = 50;

/// What the record of the file in use says, as [`Cache::routed`] hands it
/// to its caller (a finished resize and a corrupt record are dealt with
/// there).
#[derive(Debug, Clone, Copy)]
enum Found {
    /// No migration: the file is the whole cache.
    Idle,
    /// Migration `id` is moving the file's shards to a new file.
    Migrating(u64),
}

/// What a caller of [`Cache::routed`] made of one attempt.
enum Step<T> {
    Done(T),
    /// Read the record again: the file changed under the call.
    Again,
}

/// One file this handle has used, kept until the handle is dropped (a file
/// left after a resize holds only address space: zero pages).
struct Node {
    store: Store,
    /// The file's migration record (`fh::MIGRATION` in its header), the
    /// word the fast path of every call loads: its address kept here, so
    /// the load follows no pointer of the store.
    record: std::ptr::NonNull<AtomicU64>,
    /// The new file of the migration in progress, with its id.
    next: Mutex<Option<(u64, Arc<Store>)>>,
    /// Unix ms of the last check that the resizer is alive.
    probed_ms: AtomicU64,
}

// SAFETY: `record` points into the mapping `store` holds (an Arc), which
// is shared between threads as the store is; it is only read atomically.
unsafe impl Send for Node {}
// SAFETY: see Send.
unsafe impl Sync for Node {}

impl Node {
    fn new(store: Store) -> Box<Node> {
        let record = std::ptr::NonNull::from(header_word(store.mapping(), fh::MIGRATION));
        Box::new(Node { store, record, next: Mutex::new(None), probed_ms: AtomicU64::new(0) })
    }

    /// Whether the record says no migration, with one relaxed load (the
    /// fast path's only routing check). Relaxed is enough: a call that
    /// misses a migration starting meanwhile is caught by the seal of the
    /// shard it uses (see [`Cache::keyed`]).
    #[inline(always)]
    fn idle(&self) -> bool {
        // SAFETY: the word is in the header page of the mapping `store`
        // holds, which stays mapped (file or zero pages) as long as the
        // node; every process accesses it only atomically.
        unsafe { self.record.as_ref() }.load(Ordering::Relaxed) == 0
    }
}

/// A shared-memory cache mapped into this process.
///
/// Keys are routed to the file that holds them now: one file, except while
/// a resize (`resize.rs`) moves entries to a new file, when keys of moved
/// shards go to the new file; after the switch the handle follows the
/// cache's path to the new file at its next call.
pub struct Cache {
    /// The node of the file in use; always one of `nodes`.
    cur: AtomicPtr<Node>,
    /// Every node this handle has used, freed with the handle. Boxed: `cur`
    /// points into them, so they must not move when the Vec grows.
    #[allow(clippy::vec_box)]
    nodes: Mutex<Vec<Box<Node>>>,
    path: PathBuf,
    /// The options the handle was opened with (files are reopened with
    /// them, as they are, after a resize).
    opts: OpenOptions,
    closed: AtomicBool,
    /// Held while the handle switches files.
    switch: Mutex<()>,
}

impl std::fmt::Debug for Cache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cache")
            .field("path", &self.path)
            .field("shards", &self.geometry().shard_count)
            .field("capacity", &self.capacity())
            .finish()
    }
}

fn lock_ignoring_poison<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether `a` and `b` are the same shard layout (the seed aside).
fn same_shape(a: &Geometry, b: &Geometry) -> bool {
    a.shard_count == b.shard_count && a.shard_size == b.shard_size
}

impl Cache {
    /// Open or create the cache at `path`.
    ///
    /// An existing file whose geometry differs from `opts.size` (and
    /// `opts.shards`) is resized to it, live (see [`Cache::resize`]),
    /// unless `opts.recreate` asks to replace it, or a resize of it is
    /// already under way (this handle then follows that one, and keeps its
    /// result).
    ///
    /// If this process already has the file mapped (through another handle
    /// still alive, closed or not), the new handle shares that mapping,
    /// after the same checks as a first open (see `file::reopen`).
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Cache> {
        // Resolved once, here: a process that changes its working directory
        // later (daemons go to /) still names the same file and spill
        // directory.
        let given = path.as_ref();
        let path = std::path::absolute(given)
            .map_err(|e| Error::io(format!("resolve {}", given.display()), e))?;
        let want = match opts.size {
            Some(size) => Some(Geometry::for_size(size, opts.shards)?),
            None => None,
        };
        let store = match want {
            Some(_) if !opts.recreate => Self::open_existing_or_create(&path, opts)?,
            _ => Store::open_as(&path, &path, opts, None)?,
        };
        let node = Box::into_raw(Node::new(store));
        // SAFETY: `node` comes from Box::into_raw just above; the Box is
        // rebuilt once, here, and kept in `nodes`.
        let boxed = unsafe { Box::from_raw(node) };
        let cache = Cache {
            cur: AtomicPtr::new(node),
            nodes: Mutex::new(vec![boxed]),
            path,
            opts: OpenOptions { size: None, create: false, recreate: false, ..opts.clone() },
            closed: AtomicBool::new(false),
            switch: Mutex::new(()),
        };
        cache.settle_open()?;
        if let (Some(w), Some(size)) = (want, opts.size) {
            let idle = cache.node().store.migration_word() == 0;
            if idle && !same_shape(cache.geometry(), &w) {
                cache.resize(size, opts.shards)?;
            }
        }
        Ok(cache)
    }

    /// The file at `path` as it is, or (none there) created with `opts`'
    /// size: a file of another size is resized by the caller, not refused.
    /// A creator that lost a race to another of another size opens the
    /// winner's file as it is.
    fn open_existing_or_create(path: &Path, opts: &OpenOptions) -> Result<Store> {
        let as_is = OpenOptions { size: None, create: false, ..opts.clone() };
        let mut last = None;
        for _ in 0..4 {
            match Store::open_as(path, path, &as_is, None) {
                Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                other => return other,
            }
            match Store::open_as(path, path, opts, None) {
                // Created meanwhile by another opener, with another size.
                Err(e @ Error::Incompatible(_)) => last = Some(e),
                other => return other,
            }
        }
        Err(last.expect("the loop ran"))
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

    /// The node in use.
    #[inline]
    fn node(&self) -> &Node {
        // SAFETY: `cur` always points to a Node boxed in `self.nodes`,
        // which are freed only when `self` is dropped.
        unsafe { &*self.cur.load(Ordering::Acquire) }
    }

    /// The file in use, for a question about it (its geometry): a file a
    /// finished resize replaced is followed first.
    fn cur_store(&self) -> &Store {
        let node = self.node();
        let moved = matches!(resize::decode(node.store.migration_word()), Record::Moved(_));
        if (moved || node.store.retired()) && !self.is_closed() && self.follow(node).is_ok() {
            return &self.node().store;
        }
        &node.store
    }

    /// Make `store` the file in use.
    fn install(&self, store: Store) {
        if self.closed.load(Ordering::Relaxed) {
            store.close();
        }
        let mut node = Node::new(store);
        let p: *mut Node = &mut *node;
        lock_ignoring_poison(&self.nodes).push(node);
        self.cur.store(p, Ordering::Release);
    }

    /// Open a file of this cache (its path, or a resize's new file) as it
    /// is.
    fn open_store(&self, file_path: &Path) -> Result<Store> {
        Store::open_as(file_path, &self.path, &self.opts, None)
    }

    /// The new file of a migration, at `temp`; `None` if it is no longer
    /// there (renamed over the path since its lock was tried: the move is
    /// over, or about to be recorded so, and the caller reads the record
    /// again).
    fn open_new_file(&self, temp: &Path) -> Result<Option<Store>> {
        match self.open_store(temp) {
            Ok(s) => Ok(Some(s)),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// After an open: follow a finished resize, finish one whose resizer
    /// died, reset a corrupt record.
    fn settle_open(&self) -> Result<()> {
        self.routed(|node, found, _| match found {
            Found::Idle => Ok(Step::Done(())),
            Found::Migrating(id) => {
                Ok(if self.target(node, id)?.is_some() { Step::Done(()) } else { Step::Again })
            }
        })
    }

    /// The routing loop of every call that meets a resize: read the
    /// record of the file in use, follow a finished resize (or a file
    /// this process left), reset a corrupt record, and hand the file and
    /// what its record says (no migration, or migration `id` under way) to
    /// `arm`, until `arm` is done or [`REDIRECTS`] attempts have passed
    /// (the attempt number is `arm`'s third argument).
    ///
    /// The retirement is read after the record, never before:
    /// `Mapping::retire` marks the mapping retired before it replaces its
    /// pages with zeros, and zeros read as "no migration". A file found
    /// not retired after its record was read gave its real record; a
    /// file retired in between (another handle of this process followed a
    /// resize meanwhile) is followed instead. Read the other way round, a
    /// retirement between the two reads handed `arm` the zero pages as an
    /// idle file: an open that then resized published its migration on
    /// them and renamed an empty file over the cache, losing every entry
    /// written since the resize that had retired them (see
    /// `tests/resize.rs`, the racing openers).
    fn routed<T>(&self, mut arm: impl FnMut(&Node, Found, usize) -> Result<Step<T>>) -> Result<T> {
        for attempt in 0..REDIRECTS {
            if attempt >= 8 {
                std::thread::sleep(std::time::Duration::from_micros(100 << (attempt / 8)));
            }
            let node = self.node();
            let w = node.store.migration_word();
            if node.store.retired() {
                self.follow(node)?;
                continue;
            }
            let found = match resize::decode(w) {
                Record::None => Found::Idle,
                Record::Migrating(id) => Found::Migrating(id),
                Record::Moved(_) => {
                    self.follow(node)?;
                    continue;
                }
                Record::Corrupt => {
                    resize::reset_record(&node.store, w)?;
                    continue;
                }
            };
            if let Step::Done(t) = arm(node, found, attempt)? {
                return Ok(t);
            }
        }
        Err(self.kept_moving())
    }

    fn kept_moving(&self) -> Error {
        Error::Corrupt(format!(
            "{}: its resize record kept changing; the call was not done",
            self.path.display()
        ))
    }

    /// Switch from `node`'s file to the file the path names now (a resize
    /// renamed its new file there), and retire `node`'s mapping.
    #[cold]
    fn follow(&self, node: &Node) -> Result<()> {
        let _switching = lock_ignoring_poison(&self.switch);
        if !std::ptr::eq(self.node(), node) {
            return Ok(());
        }
        let store = self.open_store(&self.path)?;
        if store.mapping().id() == node.store.mapping().id() {
            // The path still names this file: its record says "moved"
            // wrongly (no resize of ours leaves that). Reset it.
            drop(store);
            let w = node.store.migration_word();
            if matches!(resize::decode(w), Record::Moved(_)) {
                resize::reset_record(&node.store, w)?;
            }
            return Ok(());
        }
        self.install(store);
        node.store.mapping().retire();
        Ok(())
    }

    /// The new file of migration `id` of `node`'s file, opened once per
    /// handle. Every `PROBE_MS` it also checks that the resizer is alive;
    /// if not, this call finishes the migration and returns `None` (as it
    /// does when the migration turns out finished, or its record was
    /// reset): the caller reads the record again.
    fn target(&self, node: &Node, id: u64) -> Result<Option<Arc<Store>>> {
        let cached = lock_ignoring_poison(&node.next)
            .as_ref()
            .filter(|(i, _)| *i == id)
            .map(|(_, s)| s.clone());
        let now = crate::shard::now_ms();
        let due = now.saturating_sub(node.probed_ms.load(Ordering::Relaxed)) >= PROBE_MS;
        if let Some(s) = &cached {
            if !due {
                return Ok(Some(s.clone()));
            }
        }
        node.probed_ms.store(now, Ordering::Relaxed);
        let temp = resize::temp_path(&self.path, id);
        let word = id << 2 | resize::MIGRATING;
        match resize::take_owner(&temp)? {
            Owner::Busy => {
                let s = match cached {
                    Some(s) => s,
                    None => {
                        let Some(s) = self.open_new_file(&temp)? else { return Ok(None) };
                        let s = Arc::new(s);
                        *lock_ignoring_poison(&node.next) = Some((id, s.clone()));
                        s
                    }
                };
                Ok(Some(s))
            }
            Owner::Taken(owner) => {
                // The resizer died (or finished just now): finish its move.
                if node.store.migration_word() == word {
                    let s = match cached {
                        Some(s) => s,
                        None => match self.open_new_file(&temp)? {
                            Some(s) => Arc::new(s),
                            None => return Ok(None),
                        },
                    };
                    resize::drive(&node.store, &s, id, &self.path, &temp)?;
                }
                drop(owner);
                Ok(None)
            }
            Owner::Gone => {
                // Renamed over the path by its resizer (which may have
                // died before the record said so): the only way a new
                // file of ours goes while its record names it. The move
                // is over, and the path names the cache: that file, or
                // the file of a later resize of it (which may have been
                // quick enough to finish meanwhile: no check of the file's
                // origin, then). Only a path that still names this very
                // file (a record no resize of ours leaves) resets it.
                match self.open_store(&self.path) {
                    Ok(s) if s.mapping().id() != node.store.mapping().id() => {
                        resize::finish_record(&node.store, id)
                    }
                    _ => resize::reset_record(&node.store, word)?,
                }
                Ok(None)
            }
        }
    }

    /// Wait until migration `id` of `node`'s file is over, finishing it if
    /// its resizer dies; bounded like an attach wait.
    fn settle(&self, node: &Node, id: u64) -> Result<()> {
        let start = std::time::Instant::now();
        let cap = self
            .opts
            .lock_timeout
            .saturating_mul(crate::lock::OVERLOAD_FACTOR)
            .max(file::ATTACH_WAIT_FLOOR);
        let word = id << 2 | resize::MIGRATING;
        while node.store.migration_word() == word {
            if self.target(node, id)?.is_none() {
                continue;
            }
            if start.elapsed() >= cap {
                return Err(Error::LockTimeout { waited_ms: start.elapsed().as_millis() as u64 });
            }
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        Ok(())
    }

    /// Run `f` on the file that holds `key` now. `read`: `f` changes
    /// nothing, so it may run again if the file was left meanwhile.
    ///
    /// The fast path (no migration recorded) is one relaxed load of the
    /// record and a branch, then `f` on the file in use, and a branch on
    /// its result. It checks nothing else per call:
    /// * a migration that starts after the load is met by the seal of the
    ///   shard `f` uses (an optimistic get fails its validation, a locker
    ///   gets [`Error::Moved`]): nothing is read from, or written to, a
    ///   shard after it moved;
    /// * a file this process left (retired: zero pages) fails every
    ///   shard's checks (`intact`), so `f` fails, and only then is the
    ///   retirement read;
    /// * a file truncated under the mapping (zero pages too) is named in
    ///   the error only then ([`Store::explain`]).
    ///
    /// Errors, and calls during a migration, take [`Cache::keyed_slow`].
    #[inline(always)]
    fn keyed<T>(
        &self,
        key: &[u8],
        read: bool,
        mut f: impl FnMut(&Store) -> Result<T>,
    ) -> Result<T> {
        let node = self.node();
        if node.idle() {
            let r = f(&node.store);
            if r.is_ok() {
                return r;
            }
            if let Some(e) = node.store.final_error(r) {
                return e;
            }
        }
        self.keyed_slow(key, read, &mut f)
    }

    /// [`Cache::keyed`] past its fast path: one instance per result type
    /// (`f` is a trait object), out of the fast path's way.
    #[cold]
    #[inline(never)]
    fn keyed_slow<T>(
        &self,
        key: &[u8],
        read: bool,
        f: &mut dyn FnMut(&Store) -> Result<T>,
    ) -> Result<T> {
        self.routed(|node, found, attempt| {
            let next;
            let target = match found {
                Found::Idle => &node.store,
                Found::Migrating(id) => {
                    let Some(s) = self.target(node, id)? else { return Ok(Step::Again) };
                    if node.store.is_moved(node.store.shard_index(key)) {
                        next = s;
                        &*next
                    } else {
                        &node.store
                    }
                }
            };
            let r = f(target);
            match &r {
                Err(Error::Moved) if matches!(found, Found::Idle) && attempt >= 2 => {
                    // Sealed with no migration recorded (a record reset
                    // by hand, or a hostile file): empty those shards.
                    resize::reset_record(&node.store, 0)?;
                    Ok(Step::Again)
                }
                Err(Error::Moved) => Ok(Step::Again),
                _ if (read || r.is_err()) && target.retired() => Ok(Step::Again),
                _ => r.map(Step::Done).map_err(|e| target.explain(e)),
            }
        })
    }

    /// Run `f` on the whole cache: one file, so during a migration this
    /// waits for it to end (finishing it if its resizer died). `f` runs
    /// again on the new file if the one it ran on was left meanwhile (what
    /// it read there may have been zeros), so it must be a question or an
    /// idempotent change (`len`, `stats`, `clear`, `check`, a sweep).
    fn whole<T>(&self, mut f: impl FnMut(&Store) -> Result<T>) -> Result<T> {
        self.routed(|node, found, attempt| match found {
            Found::Idle => {
                let r = f(&node.store);
                match &r {
                    // Sealed shards and no migration recorded: see
                    // `keyed_slow`.
                    Err(Error::Moved) if attempt >= 2 => {
                        resize::reset_record(&node.store, 0)?;
                        Ok(Step::Again)
                    }
                    Err(Error::Moved) => Ok(Step::Again),
                    _ if node.store.retired() => Ok(Step::Again),
                    _ => r.map(Step::Done),
                }
            }
            Found::Migrating(id) => {
                self.settle(node, id)?;
                Ok(Step::Again)
            }
        })
    }

    /// Resize the cache, live, to `size` bytes (and `shards` shards, 0 to
    /// choose from the size, as at creation), and return its geometry.
    ///
    /// A new file of the new geometry is built beside the cache, the live
    /// entries are moved into it shard by shard while every process keeps
    /// using the cache (on a shrink, the most recently written that fit;
    /// on a grow, all), and it replaces the old file; every process
    /// attached follows at its next call, and the old file's memory is
    /// freed when the last of them has. If another resize of this cache is
    /// under way, this one waits for it and keeps its result (the
    /// geometry returned is then that one's). A resize to the geometry the
    /// file has does nothing.
    pub fn resize(&self, size: usize, shards: usize) -> Result<Geometry> {
        let want = Geometry::for_size(size, shards)?;
        self.live()?;
        let mut adopted = false;
        self.routed(|node, found, _| {
            self.live()?;
            match found {
                Found::Idle => {
                    if adopted || same_shape(node.store.geometry(), &want) {
                        return Ok(Step::Done(*node.store.geometry()));
                    }
                    if !self.migrate(node, size, shards)? {
                        adopted = true;
                    }
                }
                Found::Migrating(id) => {
                    self.settle(node, id)?;
                    adopted = true;
                }
            }
            Ok(Step::Again)
        })
    }

    /// Move `node`'s file to a new one of `size` bytes and `shards`
    /// shards. False: another resize published its record first.
    fn migrate(&self, node: &Node, size: usize, shards: usize) -> Result<bool> {
        resize::remove_stale(&self.path, node.store.migration_word());
        let want = Geometry::for_size(size, shards)?;
        let groups = resize::groups_for(node.store.geometry().shard_count, want.shard_count);
        let id = resize::new_id(groups)?;
        let temp = resize::temp_path(&self.path, id);
        let opts = OpenOptions { size: Some(size), shards, create: true, ..self.opts.clone() };
        let seed = node.store.geometry().seed;
        let new = Arc::new(Store::open_as(&temp, &self.path, &opts, Some((id, seed)))?);
        // The new file keeps the pinned admission mode (best effort: a
        // shard that cannot be locked now keeps the default).
        if let Ok(mode) = node.store.eviction_mode() {
            let _ = new.set_eviction_mode(mode);
        }
        let Owner::Taken(owner) = resize::take_owner(&temp)? else {
            let _ = std::fs::remove_file(&temp);
            return Err(Error::io(
                format!("lock {}", temp.display()),
                std::io::Error::other("the new file of a resize was taken by another process"),
            ));
        };
        let at = resize::abort_step();
        resize::step(at, 1);
        // The retirement is read after the compare-and-swap: a mapping
        // retired meanwhile (another handle of this process followed a
        // resize that finished first) may have taken it on its zero pages,
        // which read as "no migration". That resize won: adopt it.
        let published = resize::publish(&node.store, id);
        if !published || node.store.retired() {
            let _ = std::fs::remove_file(&temp);
            drop(owner);
            return Ok(false);
        }
        resize::step(at, 2);
        *lock_ignoring_poison(&node.next) = Some((id, new.clone()));
        resize::drive(&node.store, &new, id, &self.path, &temp)?;
        drop(owner);
        self.follow(node)?;
        Ok(true)
    }

    fn live(&self) -> Result<()> {
        if self.closed.load(Ordering::Relaxed) {
            Err(Error::Closed)
        } else {
            Ok(())
        }
    }

    /// The cache's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
    /// The geometry of the file in use.
    pub fn geometry(&self) -> &Geometry {
        self.cur_store().geometry()
    }
    /// Total bytes of the file. A resize in progress is waited for (as by
    /// every whole-cache call, see `whole`): a handle opened while another
    /// opener of the same new size moves the cache reports the new size.
    pub fn capacity(&self) -> usize {
        self.whole(|s| Ok(s.capacity())).unwrap_or_else(|_| self.cur_store().capacity())
    }
    /// Number of shards.
    pub fn shard_count(&self) -> usize {
        self.cur_store().shard_count()
    }
    /// Largest entry (16-byte header + key + value, padded to 4) accepted.
    pub fn max_entry_size(&self) -> usize {
        self.cur_store().max_entry_size()
    }
    /// Longest value accepted (with a short key): the spill budget, or
    /// with spilling disabled what fits inline.
    pub fn max_value_size(&self) -> u64 {
        self.cur_store().max_value_size()
    }
    /// Values longer than this are spilled to files (see `spill.rs`).
    pub fn spill_threshold(&self) -> usize {
        self.cur_store().spill_threshold()
    }
    /// Longest wait for a shard lock (see [`OpenOptions::lock_timeout`]).
    pub fn lock_timeout(&self) -> std::time::Duration {
        self.cur_store().lock_timeout()
    }
    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Relaxed)
    }

    /// Mark the handle closed. Idempotent. Other handles of the file are
    /// not affected; the process detaches from the file when the last
    /// handle sharing its mapping is dropped.
    pub fn close(&self) {
        let _switching = lock_ignoring_poison(&self.switch);
        self.closed.store(true, Ordering::Release);
        for n in lock_ignoring_poison(&self.nodes).iter() {
            n.store.close();
            if let Some((_, s)) = lock_ignoring_poison(&n.next).as_ref() {
                s.close();
            }
        }
    }

    /// Run `f` on the value of `key` (no extra copy: `f` copies straight
    /// from the mapping, or from a spilled value's file, into its own
    /// buffer).
    ///
    /// The read is optimistic: it takes no lock, and if a writer changed
    /// the shard meanwhile, what `f` returned is dropped and the read runs
    /// again (at last under the lock). So `f` may run more than once, on
    /// bytes that were changing; it must only copy them out, and only the
    /// result of a validated run is returned. A spilled value whose file
    /// fails its checks is dropped and reads as a miss.
    #[inline]
    pub fn get_with<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        self.keyed(
            key,
            true,
            #[inline(always)]
            |s| s.get_with(key, &mut f),
        )
    }

    /// [`Cache::get_with`] under the shard lock: `f` runs at most once, on
    /// bytes that do not change (for callers whose `f` cannot run twice).
    #[inline]
    pub fn get_locked_with<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(EntryRef<'_>) -> R,
    ) -> Result<Option<R>> {
        let mut f = Some(f);
        self.keyed(key, false, |s| match f.take() {
            Some(g) => {
                let mut once = Some(g);
                let r = s.get_locked_with(key, |e| (once.take().expect("called once"))(e));
                if let Some(g) = once {
                    // Not called: it may run on the file the key moved to.
                    f = Some(g);
                }
                r
            }
            None => Err(Error::Moved),
        })
    }

    /// The value and flags of `key`.
    pub fn get(&self, key: &[u8]) -> Result<Option<Value>> {
        self.keyed(key, true, |s| s.get(key))
    }

    /// Store `value` with `flags` for `ttl_ms` (0 = never expires).
    ///
    /// Fails with [`Error::Full`], leaving the old value, only when the
    /// file system has no room to grow the key's shard and the entry is
    /// larger than all the space that shard holds, or no room for a
    /// spilled value's file.
    pub fn set(&self, key: &[u8], value: &[u8], flags: u32, ttl_ms: u64) -> Result<()> {
        self.keyed(key, false, |s| s.set(key, value, flags, ttl_ms))
    }

    /// Store only if absent. Returns whether it stored.
    pub fn add(&self, key: &[u8], value: &[u8], flags: u32, ttl_ms: u64) -> Result<bool> {
        self.keyed(key, false, |s| s.add(key, value, flags, ttl_ms))
    }

    /// Store only if present. Returns whether it stored.
    pub fn replace(&self, key: &[u8], value: &[u8], flags: u32, ttl_ms: u64) -> Result<bool> {
        self.keyed(key, false, |s| s.replace(key, value, flags, ttl_ms))
    }

    /// Store under `mode` (set, add or replace); returns whether it stored.
    /// Values above the spill threshold go to a file (see `spill.rs`).
    pub fn store(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        mode: SetMode,
    ) -> Result<bool> {
        self.keyed(key, false, |s| s.store(key, value, flags, ttl_ms, mode))
    }

    /// Remove spilled files that no live entry names and whose status
    /// changed more than `grace` ago (files younger than that may be
    /// between being linked and being published by another process).
    pub fn sweep_spilled(&self, grace: std::time::Duration) -> Result<SweepReport> {
        self.whole(|s| s.sweep_spilled(grace))
    }

    /// Remove `key`; returns whether it was present.
    pub fn delete(&self, key: &[u8]) -> Result<bool> {
        self.keyed(key, false, |s| s.delete(key))
    }

    /// Delete `key` only if its value is exactly `expected`; returns whether
    /// it deleted. Atomic: one lock hold covers the comparison and the delete.
    /// A spilled value never compares equal (compare-and-delete is meant for
    /// small tokens such as lock owners).
    pub fn delete_if_equals(&self, key: &[u8], expected: &[u8]) -> Result<bool> {
        self.keyed(key, false, |s| s.delete_if_equals(key, expected))
    }

    /// Remove `key` and hand its value to `f`.
    ///
    /// A spilled value's file is opened while the entry is still in the
    /// index, under the shard lock: once the entry is gone the file is an
    /// orphan that any sweep may remove, and an open descriptor keeps it
    /// readable. If this process cannot open it (out of descriptors), the
    /// entry is removed all the same and the pop fails with that error.
    pub fn pop_with<R>(&self, key: &[u8], f: impl FnOnce(EntryRef<'_>) -> R) -> Result<Option<R>> {
        let mut f = Some(f);
        self.keyed(key, false, |s| match f.take() {
            Some(g) => {
                let mut once = Some(g);
                let r = s.pop_with(key, |e| (once.take().expect("called once"))(e));
                if matches!(r, Err(Error::Moved)) {
                    f = once;
                }
                r
            }
            None => Err(Error::Moved),
        })
    }

    /// Remove `key` and return its value.
    pub fn pop(&self, key: &[u8]) -> Result<Option<Value>> {
        self.keyed(key, false, |s| s.pop(key))
    }

    /// Give `key` a new TTL (0 = never). Returns whether it was present.
    pub fn touch(&self, key: &[u8], ttl_ms: u64) -> Result<bool> {
        self.keyed(key, false, |s| s.touch(key, ttl_ms))
    }

    /// Absolute expiry of `key` in Unix ms (0 = never), None if absent.
    pub fn expires_at(&self, key: &[u8]) -> Result<Option<u64>> {
        self.keyed(key, true, |s| s.expires_at(key))
    }

    /// Whether `key` is present (does not count as a hit).
    pub fn contains(&self, key: &[u8]) -> Result<bool> {
        self.keyed(key, true, |s| s.contains(key))
    }

    /// Atomically add `delta` to the counter at `key`. A missing key starts
    /// at `initial` (or fails with [`Error::NotFound`] if None) and gets
    /// `ttl_ms`.
    pub fn incr(&self, key: &[u8], delta: i64, initial: Option<i64>, ttl_ms: u64) -> Result<i64> {
        self.keyed(key, false, |s| s.incr(key, delta, initial, ttl_ms))
    }

    /// Look up many keys, taking each shard's lock once. `f(i, entry)` is
    /// called for each hit, with `i` the key's position, at most once per
    /// position. Spilled values are read after their shard's lock is
    /// released. During a resize, keys are looked up one by one.
    pub fn get_many_with<K: AsRef<[u8]>>(
        &self,
        keys: &[K],
        mut f: impl FnMut(usize, EntryRef<'_>),
    ) -> Result<()> {
        let node = self.node();
        if node.idle() {
            let mut seen = vec![false; keys.len()];
            let r = node.store.get_many_with(keys, |i, e| {
                seen[i] = true;
                f(i, e)
            });
            if !matches!(r, Err(Error::Moved)) && !node.store.retired() {
                return r;
            }
            for (i, k) in keys.iter().enumerate() {
                if !seen[i] {
                    self.get_locked_with(k.as_ref(), |e| f(i, e))?;
                }
            }
            return Ok(());
        }
        for (i, k) in keys.iter().enumerate() {
            self.get_locked_with(k.as_ref(), |e| f(i, e))?;
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
    /// rest are not. Values above the spill threshold are stored one by
    /// one, after the inline ones. During a resize, items are stored one
    /// by one.
    pub fn set_many<K: AsRef<[u8]>, V: AsRef<[u8]>>(
        &self,
        items: &[(K, V, u32)],
        ttl_ms: u64,
    ) -> Result<()> {
        let node = self.node();
        if node.idle() {
            let r = node.store.set_many(items, ttl_ms);
            if r.is_ok() {
                return r;
            }
            if let Some(r) = node.store.final_error(r) {
                return r;
            }
        }
        for (k, v, fl) in items {
            Self::check_item(self.cur_store(), k.as_ref(), v.as_ref(), *fl)?;
        }
        for (k, v, fl) in items {
            self.set(k.as_ref(), v.as_ref(), *fl, ttl_ms)?;
        }
        Ok(())
    }

    /// The checks `set_many` makes of every item before storing any.
    fn check_item(s: &Store, key: &[u8], value: &[u8], flags: u32) -> Result<()> {
        Store::check_flags(flags)?;
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(Error::BadKey { len: key.len(), max: MAX_KEY_LEN });
        }
        s.check_storable(key, value.len())
    }

    /// Delete many keys; returns how many were present.
    pub fn delete_many<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<usize> {
        let node = self.node();
        if node.idle() {
            let r = node.store.delete_many(keys);
            if r.is_ok() {
                return r;
            }
            if let Some(r) = node.store.final_error(r) {
                return r;
            }
        }
        let mut n = 0;
        for k in keys {
            n += self.delete(k.as_ref())? as usize;
        }
        Ok(n)
    }

    /// Pin how every shard chooses its admission mode: `Adaptive` (the
    /// default: each shard runs the mode its miniature caches do better
    /// with), `Strict` (frequency-aware admission: resists loops and
    /// scans) or `Lenient` (SIEVE). Kept in the file, for every process.
    pub fn set_eviction_mode(&self, mode: EvictionMode) -> Result<()> {
        self.whole(|s| s.set_eviction_mode(mode))
    }

    /// The pinned admission mode.
    pub fn eviction_mode(&self) -> Result<EvictionMode> {
        self.whole(|s| s.eviction_mode())
    }

    /// How many shards admit new entries strictly now.
    pub fn strict_shards(&self) -> Result<usize> {
        self.whole(|s| s.strict_shards())
    }

    /// How many shards admit leniently now and keep half their entries
    /// young instead of a twelfth.
    pub fn young_half_shards(&self) -> Result<usize> {
        self.whole(|s| s.young_half_shards())
    }

    /// Remove every entry (and every spilled value's file).
    pub fn clear(&self) -> Result<()> {
        self.whole(|s| s.clear())
    }

    /// Number of live entries (expired ones not yet reclaimed included).
    ///
    /// Lock-free: a sum of each shard's item counter, each read atomically
    /// but at slightly different instants (like any count of a cache that
    /// other processes are changing).
    pub fn len(&self) -> Result<usize> {
        self.whole(|s| s.len())
    }

    /// Whether the cache holds no entries.
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.len()? == 0)
    }

    /// Call `f(key, meta)` for every live entry (one shard locked at a time).
    pub fn for_each_key(&self, mut f: impl FnMut(&[u8], &Entry0)) -> Result<()> {
        let all = self.whole(|s| {
            let mut all = Vec::new();
            s.for_each_key(|k, m| all.push((k.to_vec(), *m)))?;
            Ok(all)
        })?;
        for (k, m) in &all {
            f(k, m);
        }
        Ok(())
    }

    /// A snapshot of every live key.
    pub fn keys(&self) -> Result<Vec<Vec<u8>>> {
        self.whole(|s| s.keys())
    }

    /// Counters per shard. Hits and misses are counted per CPU for the
    /// whole file, not per shard (a get writes no shard word): a shard's
    /// `hits` and `misses` are 0, and [`Cache::stats`] adds the file's
    /// counters.
    pub fn shard_stats(&self) -> Result<Vec<ShardStats>> {
        self.whole(|s| s.shard_stats())
    }

    /// Counters summed over all shards (`held_bytes` includes the file
    /// header page), with the file's per-CPU hit and miss counters.
    pub fn stats(&self) -> Result<ShardStats> {
        self.whole(|s| s.stats())
    }

    /// Verify every shard's invariants. A shard that fails is reported as an
    /// error (and left as is, so it can be inspected).
    pub fn check(&self) -> Result<CheckReport> {
        self.whole(|s| s.check())
    }

    /// Write back dirty pages to the file (for caches on disk).
    pub fn flush(&self) -> Result<()> {
        self.whole(|s| s.flush())
    }

    /// [`Cache::get_with`], plus the version of the entry the value was
    /// read from (never 0). The pair is consistent: the value is the one
    /// that version names. As with `get_with`, `f` may run more than once.
    /// A resize gives every entry it moves a new version.
    pub fn get_versioned_with<R>(
        &self,
        key: &[u8],
        mut f: impl FnMut(EntryRef<'_>) -> R,
    ) -> Result<Option<(R, u64)>> {
        self.keyed(key, true, |s| s.get_versioned_with(key, &mut f))
    }

    /// The value, flags and version of `key`.
    pub fn get_versioned(&self, key: &[u8]) -> Result<Option<(Value, u64)>> {
        self.keyed(key, true, |s| s.get_versioned(key))
    }

    /// The version of `key` now (0: absent), read under the lock. Like a
    /// get, a lock wait that runs out reads as absent (0).
    pub fn version(&self, key: &[u8]) -> Result<u64> {
        self.keyed(key, true, |s| s.version(key))
    }

    /// Compare-and-swap: store `value` (with `flags`, for `ttl_ms`, 0 =
    /// never expires) only if `key`'s version is still `expected`; 0
    /// means "only if absent" (an add that reports the version found).
    /// [`CasOutcome::Stored`] carries the new version,
    /// [`CasOutcome::Conflict`] the version found (0: absent), with the
    /// cache unchanged. A CAS may fail although the value did not change
    /// (a compaction, or a resize, moved the shard's entries): read again
    /// and retry. Values above the spill threshold are spilled as by `set`.
    pub fn cas(
        &self,
        key: &[u8],
        value: &[u8],
        flags: u32,
        ttl_ms: u64,
        expected: u64,
    ) -> Result<CasOutcome> {
        self.keyed(key, false, |s| s.cas(key, value, flags, ttl_ms, expected))
    }

    /// Delete `key` only if its version is `expected` (0 never matches:
    /// an absent key has nothing to delete). Returns whether it deleted.
    pub fn delete_if_version(&self, key: &[u8], expected: u64) -> Result<bool> {
        self.keyed(key, false, |s| s.delete_if_version(key, expected))
    }

    /// Atomic read-modify-write of `key`: read its value and version, let
    /// `f` decide from the value (None: absent) what becomes of it, and
    /// write that with [`Cache::cas`] (or [`Cache::delete_if_version`]);
    /// if another writer changed the key in between, read again and call
    /// `f` again. `f` runs outside any lock, on a private copy of the
    /// value, so it may take its time and may run several times; only the
    /// decision of the run that wins is written. Each attempt waits at
    /// most the lock timeout; after `opts.max_conflicts` lost attempts in
    /// a row it fails with [`Error::TooManyConflicts`], the last attempt
    /// having written nothing.
    pub fn update<F>(&self, key: &[u8], mut f: F, opts: &UpdateOptions) -> Result<Updated>
    where
        F: FnMut(Option<EntryRef<'_>>) -> Update,
    {
        let mut conflicts = 0u32;
        loop {
            let read = self.get_versioned_with(key, |e| (e.to_vec(), e.flags(), e.expires_ms()))?;
            let (decision, expected) = match &read {
                Some(((data, flags, exp), v)) => {
                    (f(Some(EntryRef::owned(data, *flags, *exp, *v))), *v)
                }
                None => (f(None), 0),
            };
            let won = match decision {
                Update::Keep => return Ok(Updated::Kept(expected)),
                Update::Set(value, flags) => {
                    match self.cas(key, &value, flags, opts.ttl_ms, expected)? {
                        CasOutcome::Stored(v) => return Ok(Updated::Stored(v)),
                        CasOutcome::Conflict(_) => false,
                    }
                }
                Update::Delete if expected == 0 => return Ok(Updated::Deleted),
                Update::Delete => self.delete_if_version(key, expected)?,
            };
            if won {
                return Ok(Updated::Deleted);
            }
            conflicts += 1;
            if conflicts >= opts.max_conflicts.max(1) {
                return Err(Error::TooManyConflicts { conflicts });
            }
            backoff(conflicts);
        }
    }

    /// Test hook: lock the shard of `key`, leave it half-written (seq odd)
    /// and block for `hold`, as a process stalled or killed inside a write
    /// would. Used by crash-recovery tests; never called in normal use.
    #[doc(hidden)]
    pub fn debug_hold_shard_mid_write(&self, key: &[u8], hold: std::time::Duration) -> Result<()> {
        self.keyed(key, false, |s| s.debug_hold_shard_mid_write(key, hold))
    }

    /// Test hook: lock the shard of `key` and hold the lock for `hold`
    /// without changing anything, as a writer preempted inside a write
    /// would (seq stays even). Never called in normal use.
    #[doc(hidden)]
    pub fn debug_hold_shard_lock(&self, key: &[u8], hold: std::time::Duration) -> Result<()> {
        self.keyed(key, false, |s| s.debug_hold_shard_lock(key, hold))
    }

    /// Test hook: the address of the mapping this handle uses (handles that
    /// share a mapping report the same one).
    #[doc(hidden)]
    pub fn debug_mapping_address(&self) -> usize {
        self.cur_store().debug_mapping_address()
    }

    /// Test hook: how this handle's mapping attached to the file: "created",
    /// "repaired" (alone, every shard repaired), "clean" (alone after a
    /// verified clean detach, shards left as they are) or "shared" (other
    /// processes attached).
    #[doc(hidden)]
    pub fn debug_attach(&self) -> &'static str {
        self.cur_store().debug_attach()
    }

    /// Test hook: make every later lone opener of this process stall for
    /// `pause` inside its sweep of the spill directory, as a process
    /// stopped or slow while it repairs would. Never called in normal use.
    #[doc(hidden)]
    pub fn debug_pause_lone_sweep(pause: std::time::Duration) {
        LONE_SWEEP_PAUSE_MS.store(pause.as_millis() as u64, Ordering::Relaxed);
    }

    /// Index of the shard holding `key` in the file in use.
    pub fn shard_index(&self, key: &[u8]) -> usize {
        self.cur_store().shard_index(key)
    }
}

/// What an [`Cache::update`] callback decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// Store this value with these flags.
    Set(Vec<u8>, u32),
    /// Remove the key.
    Delete,
    /// Leave the key as it is (nothing is written).
    Keep,
}

/// What an [`Cache::update`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Updated {
    /// Stored; the new version.
    Stored(u64),
    /// The key is absent now (deleted by this update, or already absent
    /// when the callback asked for a delete).
    Deleted,
    /// The callback kept the value; the version it saw (0: absent).
    Kept(u64),
}

/// Options of [`Cache::update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateOptions {
    /// TTL of a stored value in ms (0 = never expires).
    pub ttl_ms: u64,
    /// Attempts lost to other writers, in a row, before
    /// [`Error::TooManyConflicts`].
    pub max_conflicts: u32,
}

/// Conflicts an update accepts by default before it gives up. Every lost
/// attempt means another writer's attempt won, so the key moves on; a run
/// this long means the key is written faster than this caller's callback
/// and round trip can follow.
pub const DEFAULT_MAX_CONFLICTS: u32 = 10_000;

impl Default for UpdateOptions {
    fn default() -> Self {
        UpdateOptions { ttl_ms: 0, max_conflicts: DEFAULT_MAX_CONFLICTS }
    }
}

/// Pause after the `n`th conflict in a row of one update: give the core
/// away at first, then sleep a little longer each time (at most 1 ms), so
/// that writers racing for one key spread out instead of colliding again.
fn backoff(n: u32) {
    if n < 4 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(std::time::Duration::from_micros(u64::from(n.min(1000))));
    }
}

/// The first process attached (it holds the exclusive attach lock, so no
/// other process is attached, and none can be between reserving spill
/// bytes, linking a file and publishing its entry): sweep every orphan and
/// recount the spilled bytes and values. Runs before the lock is
/// downgraded, so no process that attaches later can race it.
fn sweep_alone(m: &Mapping, geo: &Geometry, path: &Path, opts: &OpenOptions) -> Result<()> {
    crate::resize::clear_stray_bits(m);
    if crate::resize::sweeps_paused(m) {
        // A migration is under way (or was left by a killed resizer): the
        // files the other file names are not orphans. The next lone
        // opener after it ends sweeps.
        return Ok(());
    }
    let dir = SpillDir::open(path, false, opts.allow_foreign_owner)?;
    let mut refs = Vec::new();
    if dir.is_some() {
        // Reads only: no growth, no reserve to keep.
        for s in shards_of(m, geo, 0) {
            match s.lock(opts.lock_timeout) {
                Ok(g) => g.spilled_refs(&mut refs),
                // A shard left damaged (a clean attach does not repair):
                // its references cannot be read, so nothing can be called
                // an orphan. Refused at its first use, repaired by the next
                // lone opener, which sweeps then.
                Err(Error::Corrupt(_)) => {
                    m.note_damage();
                    return Ok(());
                }
                Err(e) => return Err(e),
            }
        }
    }
    // Entries a repair dropped: their files are orphans now, removed by the
    // sweep below and not counted by the recount; nothing is left to reap.
    let base = m.ptr as usize;
    drop(shard_mod::take_dropped(base..base + m.len));
    let bytes: u64 = refs.iter().map(|r| r.len).sum();
    let ids: HashSet<u64> = refs.iter().map(|r| r.id).collect();
    debug_lone_sweep_pause();
    if let Some(dir) = dir {
        dir.sweep(std::time::Duration::ZERO, &mut || Ok(ids.clone()))?;
    }
    header_word(m, fh::SPILL_BYTES).store(bytes, Ordering::Relaxed);
    header_word(m, fh::SPILL_VALUES).store(ids.len() as u64, Ordering::Relaxed);
    header_word(m, fh::SPILL_SWEPT_MS).store(crate::shard::now_ms(), Ordering::Relaxed);
    Ok(())
}

/// See [`Cache::debug_pause_lone_sweep`].
static LONE_SWEEP_PAUSE_MS: AtomicU64 = AtomicU64::new(0);

fn debug_lone_sweep_pause() {
    let ms = LONE_SWEEP_PAUSE_MS.load(Ordering::Relaxed);
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// Lower a shared counter by `n`, stopping at 0 (a recount by a process
/// attaching alone may have set it lower than what was counted in).
fn saturating_sub(word: &AtomicU64, n: u64) {
    let _ = word.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| Some(v.saturating_sub(n)));
}
