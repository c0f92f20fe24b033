//! `nearcache-ffi`: a C ABI over `nearcache-core`.
//!
//! Thin like the PyO3 glue: it converts and forwards. Keys and values are
//! byte slices; values carry the engine's 32-bit flags word, whose native
//! types (bytes 0, str 1, int 2, ...) are the ones the Python package uses,
//! so a value stored through this ABI reads back in Python and the other
//! way round.
//!
//! Conventions of every function:
//!
//! * The return value is an [`NcStatus`]: `NC_OK` or an error code. The
//!   error's message is kept per thread and read with
//!   [`nc_last_error_message`]; a failing call leaves the cache unchanged.
//! * Results are written through out-pointers, only on `NC_OK`.
//! * Values leave the engine through a caller-supplied allocator
//!   ([`NcAllocFn`]): the engine asks for a buffer of the value's length and
//!   copies the value into it, so there is exactly one copy. The allocator
//!   may run with a shard locked: it must only allocate (no calls back into
//!   the cache, no `longjmp`, no exceptions). A get may ask more than once
//!   (an optimistic read that raced a writer is retried); the last buffer
//!   holds the value.
//! * No panic crosses the boundary: each entry point catches unwinding and
//!   reports `NC_PANIC`.
//! * Every key passes through [`engine_key`] on the way in and
//!   [`user_key`] on the way out, the one place that decides how caller
//!   keys map to stored keys.

#![deny(unsafe_op_in_unsafe_fn)]

use std::borrow::Cow;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

use nearcache_core::{keys, Cache, CasOutcome, EntryRef, Error as CoreError, OpenOptions, SetMode};

/// An open cache file. Created by [`nc_open`], released by [`nc_free`].
pub struct NcCache {
    inner: Cache,
}

/// What a call returned.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcStatus {
    /// Success.
    NC_OK = 0,
    /// The cache was closed.
    NC_CLOSED = 1,
    /// The key is empty or longer than `nc_max_key_len()`.
    NC_BAD_KEY = 2,
    /// Key and value do not fit in one entry of this cache (spilling off),
    /// or the value is longer than the spill budget.
    NC_VALUE_TOO_LARGE = 3,
    /// The file exists but was made with other parameters or layout.
    NC_INCOMPATIBLE = 4,
    /// The file is not a nearcache file or fails its checks.
    NC_CORRUPT = 5,
    /// The file or its directory is unsafe to use (owner, symlink, mode).
    NC_PERMISSION = 6,
    /// The file system has no room for the cache file.
    NC_FULL = 7,
    /// An operating-system call failed.
    NC_IO = 8,
    /// incr on an entry that is not a 64-bit counter.
    NC_NOT_A_COUNTER = 9,
    /// incr on a missing key without an initial value.
    NC_NOT_FOUND = 10,
    /// incr would overflow a signed 64-bit counter.
    NC_OVERFLOW = 11,
    /// An argument is out of range (or a required pointer is NULL).
    NC_INVALID_ARGUMENT = 12,
    /// A bug: the engine panicked. The cache is still usable.
    NC_PANIC = 13,
    /// An engine error this version of the ABI has no specific code for.
    NC_OTHER = 14,
    /// A write could not take its shard's lock within the lock timeout
    /// (another live process holds it: stopped, traced), or `nc_open` could
    /// not attach because a process repairing the file alone is stopped,
    /// traced or not finishing (the message names its pid). Nothing changed.
    NC_LOCK_TIMEOUT = 15,
}

use NcStatus::*;

/// How a store treats an existing entry.
#[repr(C)]
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NcSetMode {
    /// Store unconditionally.
    NC_SET = 0,
    /// Store only if the key is absent (or expired).
    NC_ADD = 1,
    /// Store only if the key is present.
    NC_REPLACE = 2,
}

/// Options of [`nc_open`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcOpenOptions {
    /// Total size in bytes; 0 opens an existing file as it is.
    pub size: u64,
    /// Shard count (a power of two), 0 to choose from the size.
    pub shards: u32,
    /// Create the file if it does not exist.
    pub create: bool,
    /// Replace an existing file made with other parameters, or corrupt.
    pub recreate: bool,
    /// Accept a file owned by another user or writable by group/others.
    pub allow_foreign_owner: bool,
    /// Longest wait for a shard lock held by another live process, in
    /// milliseconds; 0 takes the engine's default. Past it a read is a miss
    /// and a write fails with `NC_LOCK_TIMEOUT`.
    pub lock_timeout_ms: u32,
    /// Values longer than this many bytes are kept in files in a directory
    /// beside the cache file (`<path>.spill/`) instead of inline; 0 takes
    /// the engine's default (128 KiB). Values too large for a shard are
    /// spilled whatever this says (unless spilling is off).
    pub spill_threshold: u64,
    /// Most bytes the spilled values' files may hold; past it spilled
    /// values are evicted, and a longer value fails with
    /// `NC_VALUE_TOO_LARGE`. 0 takes the engine's default (1 GiB).
    pub spill_budget: u64,
    /// Disable spilling (`spill_threshold` and `spill_budget` are then
    /// ignored): every value is kept inline, and one too large for a shard
    /// fails with `NC_VALUE_TOO_LARGE`.
    pub no_spill: bool,
    /// Bytes of the file system the cache leaves free: a shard does not
    /// grow, nor a spilled value's file get written, past it (the shard
    /// evicts; a spilled value first makes room by eviction). 0 takes the
    /// engine's default: the larger of 8 MiB and 10% of the file system,
    /// at most 1 GiB.
    pub fs_reserve: u64,
    /// Leave no reserve (`fs_reserve` is then ignored).
    pub no_fs_reserve: bool,
}

/// A byte string passed in: `len` bytes at `ptr` (`ptr` may be NULL if
/// `len` is 0).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcBytes {
    pub ptr: *const u8,
    pub len: usize,
}

/// One item of [`nc_set_many`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NcItem {
    pub key: NcBytes,
    pub value: NcBytes,
    pub flags: u32,
}

/// Counters summed over all shards, plus the file's geometry.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcStats {
    pub hits: u64,
    pub misses: u64,
    pub sets: u64,
    pub deletes: u64,
    pub evictions: u64,
    pub expirations: u64,
    pub resets: u64,
    pub corruptions: u64,
    pub compactions: u64,
    pub items: u64,
    pub live_bytes: u64,
    pub used_bytes: u64,
    pub capacity_bytes: u64,
    pub shards: u64,
    pub file_bytes: u64,
    /// Lock waits that gave up after the lock timeout (reads missed,
    /// writes failed).
    pub lock_timeouts: u64,
    /// Repairs that kept a dead writer's shard, dropping only what it was
    /// writing (`resets` counts the repairs that had to empty the shard).
    pub salvages: u64,
    /// Entries that repairs dropped.
    pub entries_lost: u64,
    /// Bytes of the file actually reserved (a sparse file on tmpfs grows
    /// as its shards fill; elsewhere this is the whole file).
    pub held_bytes: u64,
    /// Bytes held in the files of spilled values.
    pub spilled_bytes: u64,
    /// Values kept in files (spilled).
    pub spilled_values: u64,
    /// Spilled values whose file was missing or failed its checks (owner,
    /// mode, type, length, checksum): not served, and dropped.
    pub spill_refused: u64,
    /// The most arena bytes one compaction pass examined in any shard (the
    /// bound on what a reader of that shard can wait for).
    pub max_compaction_bytes: u64,
}

/// What [`nc_check`] found.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct NcCheckReport {
    pub shards: u64,
    pub entries: u64,
    pub live_bytes: u64,
    /// Shards that were reset because they failed the check.
    pub repaired_shards: u64,
}

/// Asked for a buffer of `len` bytes to receive a value with `flags`;
/// returns it, or NULL to skip the copy. Runs under a shard lock, or, in
/// [`nc_get`], during an optimistic read: then it may be asked again for
/// the same key (the read raced a writer and is retried), and the buffer
/// it returned before is abandoned by the engine: the allocator frees or
/// reuses it. Only the buffer of the last call holds the value.
pub type NcAllocFn = extern "C" fn(ctx: *mut c_void, len: usize, flags: u32) -> *mut u8;

/// Like [`NcAllocFn`] for the `index`-th key of a multi-get.
pub type NcAllocAtFn =
    extern "C" fn(ctx: *mut c_void, index: usize, len: usize, flags: u32) -> *mut u8;

/// Called once per live key with its (decoded) bytes, value length, flags
/// and absolute expiry in Unix ms (0 = never). Runs under a shard lock.
pub type NcKeyFn = extern "C" fn(
    ctx: *mut c_void,
    key: *const u8,
    key_len: usize,
    value_len: usize,
    flags: u32,
    expires_ms: u64,
);

// ---------------------------------------------------------------- errors

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn remember(msg: String) {
    let c = CString::new(msg.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|slot| *slot.borrow_mut() = c);
}

/// The status of an engine error, remembering its message.
fn fail(e: CoreError) -> NcStatus {
    remember(e.to_string());
    // The engine may grow variants; those get NC_OTHER until given a code.
    #[allow(unreachable_patterns)]
    match e {
        CoreError::Closed => NC_CLOSED,
        CoreError::BadKey { .. } => NC_BAD_KEY,
        CoreError::ValueTooLarge { .. } | CoreError::OverSpillBudget { .. } => NC_VALUE_TOO_LARGE,
        CoreError::Incompatible(_) => NC_INCOMPATIBLE,
        CoreError::Corrupt(_) => NC_CORRUPT,
        CoreError::Permission(_) => NC_PERMISSION,
        CoreError::Full(_) => NC_FULL,
        CoreError::Io { .. } => NC_IO,
        CoreError::NotACounter => NC_NOT_A_COUNTER,
        CoreError::NotFound => NC_NOT_FOUND,
        CoreError::Overflow => NC_OVERFLOW,
        CoreError::InvalidArgument(_) => NC_INVALID_ARGUMENT,
        CoreError::LockTimeout { .. } | CoreError::AttachTimeout { .. } => NC_LOCK_TIMEOUT,
        _ => NC_OTHER,
    }
}

fn invalid(msg: impl Into<String>) -> NcStatus {
    remember(format!("invalid argument: {}", msg.into()));
    NC_INVALID_ARGUMENT
}

/// Run an entry point's body, turning a panic into `NC_PANIC`.
fn guard(body: impl FnOnce() -> Result<(), NcStatus>) -> NcStatus {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => NC_OK,
        Ok(Err(status)) => status,
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            remember(format!("internal error (panic) in nearcache: {what}"));
            NC_PANIC
        }
    }
}

trait OrStatus<T> {
    fn or_status(self) -> Result<T, NcStatus>;
}

impl<T> OrStatus<T> for Result<T, CoreError> {
    #[inline]
    fn or_status(self) -> Result<T, NcStatus> {
        self.map_err(fail)
    }
}

/// The message of the last failing call on this thread (empty if none).
/// Valid until the next call on this thread.
#[no_mangle]
pub extern "C" fn nc_last_error_message() -> *const c_char {
    LAST_ERROR.with(|slot| slot.borrow().as_ptr())
}

// ---------------------------------------------------------------- keys

/// The stored form of a caller's key: the engine's encoding of a bytes
/// key ([`nearcache_core::keys`]), shared with the Python package. Text
/// passed as UTF-8 is stored unchanged (the same key as the equal Python
/// `str`); bytes starting with 0xFE/0xFF are escaped, so they never
/// collide with the Python package's int keys.
#[inline]
pub fn engine_key(raw: &[u8]) -> Cow<'_, [u8]> {
    if keys::bytes_key_is_stored_as_is(raw) {
        Cow::Borrowed(raw)
    } else {
        let mut out = Vec::with_capacity(raw.len() + 1);
        keys::encode_bytes_key(raw, &mut out);
        Cow::Owned(out)
    }
}

/// The caller's form of a stored key, or None for a key this ABI cannot
/// name (the Python package's int keys, and foreign stored forms).
#[inline]
pub fn user_key(stored: &[u8]) -> Option<&[u8]> {
    match keys::decode_key(stored) {
        keys::DecodedKey::Bytes(b) => Some(b),
        _ => None,
    }
}

// ---------------------------------------------------------------- helpers

/// # Safety
/// `ptr` must be NULL or point at `len` readable bytes that stay valid and
/// unchanged for `'a`.
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> Result<&'a [u8], NcStatus> {
    if len == 0 {
        return Ok(&[]);
    }
    if ptr.is_null() {
        return Err(invalid("NULL pointer with a non-zero length"));
    }
    // SAFETY: non-NULL, and the caller guarantees `len` readable bytes.
    Ok(unsafe { std::slice::from_raw_parts(ptr, len) })
}

/// # Safety
/// `c` must be NULL or a pointer returned by `nc_open` and not yet freed.
unsafe fn cache<'a>(c: *const NcCache) -> Result<&'a Cache, NcStatus> {
    if c.is_null() {
        return Err(invalid("NULL cache handle"));
    }
    // SAFETY: the caller guarantees `c` came from nc_open and is not freed.
    Ok(unsafe { &(*c).inner })
}

/// # Safety
/// `out` must be NULL or valid for a write of `T`.
unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: non-NULL and valid for writes per the caller.
        unsafe { out.write(v) }
    }
}

fn copy_out(e: &EntryRef<'_>, dst: *mut u8) {
    if dst.is_null() {
        return;
    }
    // SAFETY: the allocator contract: a non-NULL result points at a
    // writable buffer of exactly `e.len()` bytes, not aliased by anything
    // the engine reads.
    let buf = unsafe { std::slice::from_raw_parts_mut(dst, e.len()) };
    e.copy_to(buf);
}

fn ttl_of(ttl_ms: i64) -> Result<u64, NcStatus> {
    u64::try_from(ttl_ms).map_err(|_| invalid(format!("ttl must be >= 0 ms, got {ttl_ms}")))
}

// ---------------------------------------------------------------- open/close

/// Open (or create) the cache file at `path` (a NUL-terminated file name).
///
/// # Safety
/// `path` must be a NUL-terminated string, `opts` valid for reads and
/// `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn nc_open(
    path: *const c_char,
    opts: *const NcOpenOptions,
    out: *mut *mut NcCache,
) -> NcStatus {
    guard(|| {
        if path.is_null() || opts.is_null() || out.is_null() {
            return Err(invalid("nc_open needs a path, options and an out-pointer"));
        }
        // SAFETY: non-NULL and NUL-terminated per the contract.
        let path = unsafe { CStr::from_ptr(path) };
        let path = PathBuf::from(std::ffi::OsStr::new(
            std::str::from_utf8(path.to_bytes()).map_err(|_| invalid("path is not UTF-8"))?,
        ));
        // SAFETY: non-NULL and readable per the contract.
        let o = unsafe { *opts };
        let size = usize::try_from(o.size).map_err(|_| invalid("size too large"))?;
        let opts = OpenOptions {
            size: if size == 0 { None } else { Some(size) },
            shards: o.shards as usize,
            create: o.create,
            recreate: o.recreate,
            allow_foreign_owner: o.allow_foreign_owner,
            lock_timeout: if o.lock_timeout_ms == 0 {
                nearcache_core::lock::DEFAULT_LOCK_TIMEOUT
            } else {
                std::time::Duration::from_millis(u64::from(o.lock_timeout_ms))
            },
            spill_threshold: match o.spill_threshold {
                0 => None,
                t => Some(usize::try_from(t).unwrap_or(usize::MAX)),
            },
            spill_budget: match (o.no_spill, o.spill_budget) {
                (true, _) => 0,
                (false, 0) => nearcache_core::file::DEFAULT_SPILL_BUDGET,
                (false, b) => b,
            },
            fs_reserve: match (o.no_fs_reserve, o.fs_reserve) {
                (true, _) => Some(0),
                (false, 0) => None,
                (false, b) => Some(b),
            },
            ..OpenOptions::default()
        };
        let inner = Cache::open(path, &opts).or_status()?;
        // SAFETY: `out` is non-NULL and writable per the contract.
        unsafe { out.write(Box::into_raw(Box::new(NcCache { inner }))) };
        Ok(())
    })
}

/// Unmap the file; every later call on `c` fails with `NC_CLOSED`.
/// Idempotent. The handle itself stays allocated until [`nc_free`].
///
/// # Safety
/// `c` must be NULL or a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_close(c: *const NcCache) -> NcStatus {
    // SAFETY: forwarded contract.
    guard(|| unsafe { cache(c) }.map(Cache::close))
}

/// Close and release the handle. NULL is ignored.
///
/// # Safety
/// `c` must be NULL or a handle from `nc_open` not yet freed; it must not
/// be used afterwards.
#[no_mangle]
pub unsafe extern "C" fn nc_free(c: *mut NcCache) {
    if c.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `c` came from Box::into_raw in nc_open and is freed once.
        drop(unsafe { Box::from_raw(c) });
    }));
}

/// Whether the handle was closed.
///
/// # Safety
/// `c` must be a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_is_closed(c: *const NcCache) -> bool {
    // SAFETY: forwarded contract.
    unsafe { cache(c) }.map(Cache::is_closed).unwrap_or(true)
}

/// Size of the mapping in bytes.
///
/// # Safety
/// `c` must be a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_capacity(c: *const NcCache) -> usize {
    // SAFETY: forwarded contract.
    unsafe { cache(c) }.map(Cache::capacity).unwrap_or(0)
}

/// Number of shards.
///
/// # Safety
/// `c` must be a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_shard_count(c: *const NcCache) -> usize {
    // SAFETY: forwarded contract.
    unsafe { cache(c) }.map(Cache::shard_count).unwrap_or(0)
}

/// Largest key + value (+ entry header) one entry may take.
///
/// # Safety
/// `c` must be a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_max_entry_size(c: *const NcCache) -> usize {
    // SAFETY: forwarded contract.
    unsafe { cache(c) }.map(Cache::max_entry_size).unwrap_or(0)
}

/// Longest value accepted (with a short key): the spill budget, or with
/// spilling off what fits in one entry (`nc_max_entry_size` less the entry
/// header and a short key).
///
/// # Safety
/// `c` must be a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_max_value_size(c: *const NcCache) -> u64 {
    // SAFETY: forwarded contract.
    unsafe { cache(c) }.map(Cache::max_value_size).unwrap_or(0)
}

/// Values longer than this many bytes are kept in files beside the cache.
///
/// # Safety
/// `c` must be a live handle from `nc_open`.
#[no_mangle]
pub unsafe extern "C" fn nc_spill_threshold(c: *const NcCache) -> usize {
    // SAFETY: forwarded contract.
    unsafe { cache(c) }.map(Cache::spill_threshold).unwrap_or(0)
}

/// Longest key the engine accepts, in bytes.
#[no_mangle]
pub extern "C" fn nc_max_key_len() -> usize {
    nearcache_core::MAX_KEY_LEN
}

/// The on-file layout version this library reads and writes.
#[no_mangle]
pub extern "C" fn nc_layout_version() -> u32 {
    nearcache_core::LAYOUT_VERSION
}

/// The default directory for cache files (`/dev/shm/nearcache-<uid>`,
/// created 0700 on first use), handed to `alloc` (flags 0) as bytes.
///
/// # Safety
/// `alloc` must follow the [`NcAllocFn`] contract.
#[no_mangle]
pub unsafe extern "C" fn nc_default_directory(alloc: NcAllocFn, ctx: *mut c_void) -> NcStatus {
    guard(|| {
        let dir = nearcache_core::default_directory().or_status()?;
        let s = dir.to_string_lossy();
        let dst = alloc(ctx, s.len(), 0);
        if !dst.is_null() {
            // SAFETY: the allocator returned a writable buffer of s.len() bytes.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), dst, s.len()) };
        }
        Ok(())
    })
}

// ---------------------------------------------------------------- single keys

/// Look `key` up; on a hit, `alloc` receives the value's length and flags
/// and the value is copied into the buffer it returns. `*found` says
/// whether it was a hit.
///
/// # Safety
/// `c` a live handle, `key` `key_len` readable bytes, `found` writable,
/// `alloc` per the [`NcAllocFn`] contract.
#[no_mangle]
pub unsafe extern "C" fn nc_get(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    alloc: NcAllocFn,
    ctx: *mut c_void,
    found: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let hit = cache
            .get_with(&engine_key(key), |e| copy_out(&e, alloc(ctx, e.len(), e.flags())))
            .or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(found, hit.is_some()) };
        Ok(())
    })
}

/// Remove `key` and hand its value to `alloc` as [`nc_get`] does.
///
/// # Safety
/// As [`nc_get`].
#[no_mangle]
pub unsafe extern "C" fn nc_pop(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    alloc: NcAllocFn,
    ctx: *mut c_void,
    found: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let hit = cache
            .pop_with(&engine_key(key), |e| copy_out(&e, alloc(ctx, e.len(), e.flags())))
            .or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(found, hit.is_some()) };
        Ok(())
    })
}

/// Store `value` with `flags` under `key` for `ttl_ms` (0 = never
/// expires), as `mode` (an [`NcSetMode`] value) says; `*stored` says whether it stored (always true
/// for `NC_SET`). A value longer than the spill threshold, or too large
/// for one entry, is kept in a file beside the cache; one longer than the
/// spill budget (or, with spilling off, too large for one entry) fails with
/// `NC_VALUE_TOO_LARGE` and leaves the cache unchanged.
///
/// # Safety
/// `c` a live handle, `key`/`value` readable for their lengths, `stored`
/// NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nc_store(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    flags: u32,
    ttl_ms: i64,
    mode: u32,
    stored: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key, value) =
            unsafe { (cache(c)?, bytes(key, key_len)?, bytes(value, value_len)?) };
        // A plain integer, not the enum: a C caller may pass any value.
        let mode = match mode {
            m if m == NcSetMode::NC_SET as u32 => SetMode::Always,
            m if m == NcSetMode::NC_ADD as u32 => SetMode::IfAbsent,
            m if m == NcSetMode::NC_REPLACE as u32 => SetMode::IfPresent,
            m => return Err(invalid(format!("unknown set mode {m}"))),
        };
        let did = cache.store(&engine_key(key), value, flags, ttl_of(ttl_ms)?, mode).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(stored, did) };
        Ok(())
    })
}

/// Remove `key`; `*deleted` says whether it was present.
///
/// # Safety
/// `c` a live handle, `key` readable, `deleted` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_delete(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    deleted: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let did = cache.delete(&engine_key(key)).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(deleted, did) };
        Ok(())
    })
}

/// Remove `key` only if its value is exactly `expected` (atomic).
///
/// # Safety
/// As [`nc_delete`], with `expected` readable for `expected_len` bytes.
#[no_mangle]
pub unsafe extern "C" fn nc_delete_if_equals(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    expected: *const u8,
    expected_len: usize,
    deleted: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key, expected) =
            unsafe { (cache(c)?, bytes(key, key_len)?, bytes(expected, expected_len)?) };
        let did = cache.delete_if_equals(&engine_key(key), expected).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(deleted, did) };
        Ok(())
    })
}

/// [`nc_get`], plus the entry's version: on a hit `*version` is the
/// version of the value copied out (never 0), on a miss 0. A version is
/// an opaque number naming one written state of one key: any change to
/// the key (set, add, replace, incr, delete, expiry, eviction, a
/// compaction that moves it) gives it another one. Pass it to [`nc_cas`]
/// or [`nc_delete_if_version`].
///
/// # Safety
/// As [`nc_get`]; `version` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_get_versioned(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    alloc: NcAllocFn,
    ctx: *mut c_void,
    found: *mut bool,
    version: *mut u64,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let hit = cache
            .get_versioned_with(&engine_key(key), |e| copy_out(&e, alloc(ctx, e.len(), e.flags())))
            .or_status()?;
        // SAFETY: forwarded contract.
        unsafe {
            put(found, hit.is_some());
            put(version, hit.map_or(0, |(_, v)| v));
        }
        Ok(())
    })
}

/// Compare-and-swap: store `value` with `flags` for `ttl_ms` (0 = never
/// expires) only if `key`'s version is `expected_version` (0: only if the
/// key is absent). `*stored` says whether it stored; `*current_version`
/// (may be NULL) receives the new version if it stored, else the version
/// found (0 if absent), with the cache unchanged. A CAS may fail although
/// the value did not change (a compaction moved the key): read it again
/// with [`nc_get_versioned`] and retry.
///
/// # Safety
/// `c` a live handle, `key` and `value` readable, `stored` and
/// `current_version` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_cas(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
    flags: u32,
    ttl_ms: i64,
    expected_version: u64,
    stored: *mut bool,
    current_version: *mut u64,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key, value) =
            unsafe { (cache(c)?, bytes(key, key_len)?, bytes(value, value_len)?) };
        let out = cache
            .cas(&engine_key(key), value, flags, ttl_of(ttl_ms)?, expected_version)
            .or_status()?;
        let (did, version) = match out {
            CasOutcome::Stored(v) => (true, v),
            CasOutcome::Conflict(v) => (false, v),
        };
        // SAFETY: forwarded contract.
        unsafe {
            put(stored, did);
            put(current_version, version);
        }
        Ok(())
    })
}

/// Remove `key` only if its version is `expected_version` (0 never
/// matches); `*deleted` says whether it did.
///
/// # Safety
/// As [`nc_delete`].
#[no_mangle]
pub unsafe extern "C" fn nc_delete_if_version(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    expected_version: u64,
    deleted: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let did = cache.delete_if_version(&engine_key(key), expected_version).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(deleted, did) };
        Ok(())
    })
}

/// Give `key` a new TTL (0 = never); `*found` says whether it was present.
///
/// # Safety
/// As [`nc_delete`].
#[no_mangle]
pub unsafe extern "C" fn nc_touch(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    ttl_ms: i64,
    found: *mut bool,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let did = cache.touch(&engine_key(key), ttl_of(ttl_ms)?).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(found, did) };
        Ok(())
    })
}

/// The absolute expiry of `key` in Unix ms (0 = never) in `*expires_ms`;
/// `*found` false if absent.
///
/// # Safety
/// As [`nc_delete`], with `expires_ms` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_expires_at(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    found: *mut bool,
    expires_ms: *mut u64,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let exp = cache.expires_at(&engine_key(key)).or_status()?;
        // SAFETY: forwarded contract.
        unsafe {
            put(found, exp.is_some());
            put(expires_ms, exp.unwrap_or(0));
        }
        Ok(())
    })
}

/// Atomically add `delta` to the signed 64-bit counter at `key`; the new
/// value goes to `*result`. A missing key starts at `initial` if
/// `has_initial` (and gets `ttl_ms`), else fails with `NC_NOT_FOUND`.
///
/// # Safety
/// As [`nc_delete`], with `result` NULL or writable.
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn nc_incr(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    delta: i64,
    has_initial: bool,
    initial: i64,
    ttl_ms: i64,
    result: *mut i64,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let initial = has_initial.then_some(initial);
        let v = cache.incr(&engine_key(key), delta, initial, ttl_of(ttl_ms)?).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(result, v) };
        Ok(())
    })
}

// ---------------------------------------------------------------- many keys

/// # Safety
/// `keys` must be NULL (with `n` 0) or point at `n` readable [`NcBytes`],
/// each valid per [`bytes`].
unsafe fn key_list(keys: *const NcBytes, n: usize) -> Result<Vec<Vec<u8>>, NcStatus> {
    if n == 0 {
        return Ok(Vec::new());
    }
    if keys.is_null() {
        return Err(invalid("NULL key array with a non-zero count"));
    }
    // SAFETY: non-NULL, `n` elements per the contract.
    let keys = unsafe { std::slice::from_raw_parts(keys, n) };
    keys.iter()
        // SAFETY: each element valid per the contract.
        .map(|k| unsafe { bytes(k.ptr, k.len) }.map(|b| engine_key(b).into_owned()))
        .collect()
}

/// Look up `n` keys, taking each shard's lock once; for each hit,
/// `alloc(ctx, index, len, flags)` gets a buffer for the value.
///
/// # Safety
/// `c` a live handle, `keys` per [`key_list`], `alloc` per the
/// [`NcAllocAtFn`] contract.
#[no_mangle]
pub unsafe extern "C" fn nc_get_many(
    c: *const NcCache,
    keys: *const NcBytes,
    n: usize,
    alloc: NcAllocAtFn,
    ctx: *mut c_void,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, keys) = unsafe { (cache(c)?, key_list(keys, n)?) };
        cache
            .get_many_with(&keys, |i, e| copy_out(&e, alloc(ctx, i, e.len(), e.flags())))
            .or_status()
    })
}

/// Store `n` items with one TTL, taking each shard's lock once. Every
/// item is size-checked first: one too-large item stores nothing.
///
/// # Safety
/// `c` a live handle, `items` NULL (with `n` 0) or `n` readable [`NcItem`]s
/// whose byte strings are readable.
#[no_mangle]
pub unsafe extern "C" fn nc_set_many(
    c: *const NcCache,
    items: *const NcItem,
    n: usize,
    ttl_ms: i64,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        if n == 0 {
            return Ok(());
        }
        if items.is_null() {
            return Err(invalid("NULL item array with a non-zero count"));
        }
        // SAFETY: non-NULL, `n` elements per the contract.
        let items = unsafe { std::slice::from_raw_parts(items, n) };
        let mut triples = Vec::with_capacity(n);
        for it in items {
            // SAFETY: each byte string readable per the contract.
            let (k, v) =
                unsafe { (bytes(it.key.ptr, it.key.len)?, bytes(it.value.ptr, it.value.len)?) };
            triples.push((engine_key(k), v, it.flags));
        }
        cache.set_many(&triples, ttl_of(ttl_ms)?).or_status()
    })
}

/// Delete `n` keys; `*deleted` gets how many were present.
///
/// # Safety
/// `c` a live handle, `keys` per [`key_list`], `deleted` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_delete_many(
    c: *const NcCache,
    keys: *const NcBytes,
    n: usize,
    deleted: *mut usize,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, keys) = unsafe { (cache(c)?, key_list(keys, n)?) };
        let did = cache.delete_many(&keys).or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(deleted, did) };
        Ok(())
    })
}

/// Remove every entry.
///
/// # Safety
/// `c` a live handle.
#[no_mangle]
pub unsafe extern "C" fn nc_clear(c: *const NcCache) -> NcStatus {
    // SAFETY: forwarded contract.
    guard(|| unsafe { cache(c) }?.clear().or_status())
}

/// Resize the cache live to `size` bytes (`shards`: a power of two, or 0
/// to choose from the size): a new file of that geometry is built beside
/// the cache, the live entries moved into it shard by shard while every
/// process keeps using the cache (on a shrink the most recently written
/// that fit), and every process follows it at its next call. If another
/// resize is under way, this one waits for it and keeps its result. The
/// geometry the cache has then goes to `*capacity` (bytes) and `*shards`.
///
/// # Safety
/// `c` a live handle, `capacity` and `shards_out` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_resize(
    c: *const NcCache,
    size: usize,
    shards: usize,
    capacity: *mut usize,
    shards_out: *mut usize,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let g = unsafe { cache(c) }?.resize(size, shards).or_status()?;
        // SAFETY: forwarded contract.
        unsafe {
            put(capacity, g.total_size());
            put(shards_out, g.shard_count);
        }
        Ok(())
    })
}

/// Number of live entries (`*count`), lock-free.
///
/// # Safety
/// `c` a live handle, `count` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn nc_len(c: *const NcCache, count: *mut usize) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let n = unsafe { cache(c) }?.len().or_status()?;
        // SAFETY: forwarded contract.
        unsafe { put(count, n) };
        Ok(())
    })
}

/// Call `visit` for every live key this ABI can name (one shard locked at
/// a time).
///
/// # Safety
/// `c` a live handle; `visit` per the [`NcKeyFn`] contract.
#[no_mangle]
pub unsafe extern "C" fn nc_keys(c: *const NcCache, visit: NcKeyFn, ctx: *mut c_void) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        cache
            .for_each_key(|k, meta| {
                if let Some(k) = user_key(k) {
                    visit(ctx, k.as_ptr(), k.len(), meta.value_len, meta.flags, meta.expires_ms)
                }
            })
            .or_status()
    })
}

/// Counters summed over all shards.
///
/// # Safety
/// `c` a live handle, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn nc_stats(c: *const NcCache, out: *mut NcStats) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        if out.is_null() {
            return Err(invalid("NULL stats out-pointer"));
        }
        let s = cache.stats().or_status()?;
        let st = NcStats {
            hits: s.hits,
            misses: s.misses,
            sets: s.sets,
            deletes: s.deletes,
            evictions: s.evictions,
            expirations: s.expirations,
            resets: s.resets,
            corruptions: s.corruptions,
            compactions: s.compactions,
            items: s.items,
            live_bytes: s.live_bytes,
            used_bytes: s.used_bytes,
            capacity_bytes: s.capacity_bytes,
            shards: cache.shard_count() as u64,
            file_bytes: cache.capacity() as u64,
            lock_timeouts: s.lock_timeouts,
            salvages: s.salvages,
            entries_lost: s.entries_lost,
            held_bytes: s.held_bytes,
            spilled_bytes: s.spilled_bytes,
            spilled_values: s.spilled_values,
            spill_refused: s.spill_refused,
            max_compaction_bytes: s.max_compaction_bytes,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(st) };
        Ok(())
    })
}

/// Verify every shard, resetting the ones that fail.
///
/// # Safety
/// `c` a live handle, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn nc_check(c: *const NcCache, out: *mut NcCheckReport) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let cache = unsafe { cache(c)? };
        if out.is_null() {
            return Err(invalid("NULL report out-pointer"));
        }
        let r = cache.check().or_status()?;
        let rep = NcCheckReport {
            shards: r.shards as u64,
            entries: r.entries,
            live_bytes: r.live_bytes,
            repaired_shards: r.repaired_shards as u64,
        };
        // SAFETY: non-NULL and writable per the contract.
        unsafe { out.write(rep) };
        Ok(())
    })
}

/// Test hook for crash-recovery tests: lock `key`'s shard, leave it
/// half-written and sleep `hold_ms` (the caller is expected to be killed
/// meanwhile).
///
/// # Safety
/// As [`nc_delete`].
#[no_mangle]
pub unsafe extern "C" fn nc_debug_hold_shard_mid_write(
    c: *const NcCache,
    key: *const u8,
    key_len: usize,
    hold_ms: u64,
) -> NcStatus {
    guard(|| {
        // SAFETY: forwarded contract.
        let (cache, key) = unsafe { (cache(c)?, bytes(key, key_len)?) };
        let hold = std::time::Duration::from_millis(hold_ms);
        cache.debug_hold_shard_mid_write(&engine_key(key), hold).or_status()
    })
}

/// Test hook: hold this process's engine clock at `unix_ms` (Unix time in
/// milliseconds; 0 lets it run again), so that tests of expiry need not
/// sleep (Cache::Near's `_set_time_override`, as Cache::FastMmap's). Other
/// processes keep their own clocks.
#[no_mangle]
pub extern "C" fn nc_debug_set_clock_ms(unix_ms: u64) {
    nearcache_core::set_clock_override_ms(unix_ms);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_nc_panic_with_its_message() {
        let st = guard(|| panic!("boom in the engine"));
        assert_eq!(st, NC_PANIC);
        // SAFETY: nc_last_error_message returns a NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(nc_last_error_message()) }.to_string_lossy().into_owned();
        assert!(msg.contains("boom in the engine"), "{msg}");
        assert_eq!(guard(|| Ok(())), NC_OK);
    }

    #[test]
    fn engine_errors_map_to_codes_and_keep_their_message() {
        let st = fail(CoreError::Corrupt("bad magic".into()));
        assert_eq!(st, NC_CORRUPT);
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(nc_last_error_message()) }.to_string_lossy().into_owned();
        assert!(msg.contains("bad magic"), "{msg}");
        assert_eq!(fail(CoreError::LockTimeout { waited_ms: 50 }), NC_LOCK_TIMEOUT);
    }
}
