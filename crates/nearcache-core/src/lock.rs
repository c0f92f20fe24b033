//! Robust, process-shared pthread mutexes living inside the mapping.
//!
//! Each shard header starts with a `pthread_mutex_t` initialised with
//! `PTHREAD_PROCESS_SHARED` and `PTHREAD_MUTEX_ROBUST`. Uncontended, locking
//! is a user-space atomic (no syscall), unlike the fcntl locks older shared
//! caches use. If a holder dies (even by SIGKILL) the kernel marks the mutex
//! and the next locker gets `EOWNERDEAD`: it then owns the mutex, repairs
//! the shard (see `shard.rs`) and calls `pthread_mutex_consistent`.
//!
//! Invariants:
//! * the mutex storage is `MUTEX_BYTES` bytes, 64-byte aligned, at offset 0
//!   of every shard; `pthread_mutex_t` is smaller on every Linux target;
//! * `std::sync::Mutex` is never placed in shared memory (private futexes
//!   lose wake-ups across processes);
//! * a mutex is only (re)initialised by a process that holds the file's
//!   exclusive OFD lock, i.e. when no other process has the file open.

use crate::error::{Error, Result};
use std::io;

/// Bytes reserved for a mutex in each shard header.
pub const MUTEX_BYTES: usize = 64;

const _: () = assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= MUTEX_BYTES);

/// How a lock was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The mutex was free or released normally.
    Clean,
    /// The previous owner died while holding it; the caller must repair the
    /// protected data and then call [`make_consistent`].
    OwnerDied,
}

/// Initialise a robust, process-shared mutex at `m`.
///
/// # Safety
/// `m` must point to `MUTEX_BYTES` writable bytes of the mapping, suitably
/// aligned, that no other process is using as a mutex right now.
pub unsafe fn init(m: *mut libc::pthread_mutex_t) -> Result<()> {
    // SAFETY: an all-zero pthread_mutexattr_t is a valid value to pass to
    // pthread_mutexattr_init, which initialises it before any other use.
    let mut attr: libc::pthread_mutexattr_t = unsafe { std::mem::zeroed() };
    // SAFETY: attr is a local, destroyed on every path below.
    let rc = unsafe { libc::pthread_mutexattr_init(&mut attr) };
    if rc != 0 {
        return Err(Error::io("pthread_mutexattr_init", io::Error::from_raw_os_error(rc)));
    }
    // SAFETY: attr was initialised above; m points to MUTEX_BYTES writable,
    // aligned bytes that nobody else uses as a mutex (caller's contract).
    let result = (|| unsafe {
        let rc = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        if rc != 0 {
            return Err(Error::io(
                "pthread_mutexattr_setpshared",
                io::Error::from_raw_os_error(rc),
            ));
        }
        let rc = libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        if rc != 0 {
            return Err(Error::io("pthread_mutexattr_setrobust", io::Error::from_raw_os_error(rc)));
        }
        std::ptr::write_bytes(m as *mut u8, 0, MUTEX_BYTES);
        let rc = libc::pthread_mutex_init(m, &attr);
        if rc != 0 {
            return Err(Error::io("pthread_mutex_init", io::Error::from_raw_os_error(rc)));
        }
        Ok(())
    })();
    // SAFETY: attr was initialised by pthread_mutexattr_init.
    unsafe { libc::pthread_mutexattr_destroy(&mut attr) };
    result
}

/// Lock the mutex at `m`, blocking.
///
/// # Safety
/// `m` must point to a mutex initialised by [`init`] inside a live mapping.
pub unsafe fn lock(m: *mut libc::pthread_mutex_t) -> Result<Acquired> {
    // SAFETY: m is an initialised mutex in a live mapping (caller's contract).
    match unsafe { libc::pthread_mutex_lock(m) } {
        0 => Ok(Acquired::Clean),
        libc::EOWNERDEAD => Ok(Acquired::OwnerDied),
        libc::ENOTRECOVERABLE => Err(Error::Corrupt(
            "shard lock is unrecoverable (an earlier owner died and nobody repaired it); \
             reopen the cache once no process has it open"
                .into(),
        )),
        rc => Err(Error::io("pthread_mutex_lock", io::Error::from_raw_os_error(rc))),
    }
}

/// Mark a mutex obtained with [`Acquired::OwnerDied`] usable again.
///
/// # Safety
/// The caller must hold `m` (obtained with `OwnerDied`).
pub unsafe fn make_consistent(m: *mut libc::pthread_mutex_t) -> Result<()> {
    // SAFETY: the caller holds m, obtained with EOWNERDEAD.
    match unsafe { libc::pthread_mutex_consistent(m) } {
        0 => Ok(()),
        rc => Err(Error::io("pthread_mutex_consistent", io::Error::from_raw_os_error(rc))),
    }
}

/// Unlock the mutex at `m`.
///
/// # Safety
/// The calling thread must hold `m`.
pub unsafe fn unlock(m: *mut libc::pthread_mutex_t) {
    // SAFETY: the calling thread holds m (caller's contract).
    let rc = unsafe { libc::pthread_mutex_unlock(m) };
    debug_assert_eq!(rc, 0, "pthread_mutex_unlock failed: {rc}");
}
