//! Surviving a cache file truncated by another program while it is mapped.
//!
//! Touching a page of a `MAP_SHARED` mapping that lies past the end of its
//! file raises SIGBUS, which would kill the process. nearcache installs one
//! process-wide SIGBUS handler (chained to any previous one). When the
//! faulting address lies inside a registered cache mapping, the handler
//! replaces that whole mapping, in place, with private zero pages
//! (`mmap(MAP_FIXED | MAP_ANONYMOUS)`) and marks the mapping broken; the
//! faulting instruction then re-executes on zeros. Zeros are a valid empty
//! shard, so the operation in flight ends harmlessly (a miss, or a write into
//! the private copy), and every later call on that handle fails with a clear
//! "file was truncated" error. Faults outside our mappings go to the previous
//! handler, or to the default action.
//!
//! Invariants:
//! * the registry is a fixed array of atomics: the handler takes no lock and
//!   allocates nothing;
//! * a region is unregistered before its mapping is unmapped.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

const SLOTS: usize = 256;

struct Region {
    start: AtomicUsize,
    len: AtomicUsize,
    broken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Region =
    Region { start: AtomicUsize::new(0), len: AtomicUsize::new(0), broken: AtomicBool::new(false) };

static REGIONS: [Region; SLOTS] = [EMPTY; SLOTS];
static INSTALL: Once = Once::new();
/// The previous SIGBUS disposition (a `sigaction` stored as raw words).
static PREV_ACTION: AtomicUsize = AtomicUsize::new(0);
static PREV_FLAGS: AtomicUsize = AtomicUsize::new(0);

/// A registered mapping; unregisters on drop.
#[derive(Debug)]
pub(crate) struct Guard {
    slot: Option<usize>,
}

impl Guard {
    /// Whether the handler found this mapping truncated.
    #[inline]
    pub(crate) fn broken(&self) -> bool {
        match self.slot {
            Some(i) => REGIONS[i].broken.load(Ordering::Relaxed),
            None => false,
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            REGIONS[i].len.store(0, Ordering::SeqCst);
            REGIONS[i].broken.store(false, Ordering::SeqCst);
            REGIONS[i].start.store(0, Ordering::SeqCst);
        }
    }
}

/// Register `[start, start+len)`. With more than `SLOTS` live mappings the
/// extra ones are unprotected (they still work; a truncation kills).
pub(crate) fn register(start: *mut u8, len: usize) -> Guard {
    INSTALL.call_once(install);
    for (i, r) in REGIONS.iter().enumerate() {
        if r.start.compare_exchange(0, start as usize, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            r.broken.store(false, Ordering::SeqCst);
            r.len.store(len, Ordering::SeqCst);
            return Guard { slot: Some(i) };
        }
    }
    Guard { slot: None }
}

fn install() {
    // SAFETY: a zeroed sigaction is valid input; we fill handler, flags and
    // an empty mask, and keep the previous action to chain to.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as *const () as usize;
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        let mut old: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, &sa, &mut old) == 0 {
            PREV_ACTION.store(old.sa_sigaction, Ordering::SeqCst);
            PREV_FLAGS.store(old.sa_flags as usize, Ordering::SeqCst);
        }
    }
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let addr = unsafe { (*info).si_addr() } as usize;
    for r in REGIONS.iter() {
        let start = r.start.load(Ordering::SeqCst);
        let len = r.len.load(Ordering::SeqCst);
        if start != 0 && addr >= start && addr < start + len {
            // SAFETY: [start, start+len) is a live mapping of ours (it is
            // unregistered before munmap); replacing it in place with
            // private zero pages keeps every pointer into it valid. mmap is
            // a plain syscall on Linux and safe to call here.
            let p = unsafe {
                libc::mmap(
                    start as *mut libc::c_void,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                r.broken.store(true, Ordering::SeqCst);
                return;
            }
        }
    }
    // Not ours: hand over to the previous handler, or the default action.
    let prev = PREV_ACTION.load(Ordering::SeqCst);
    let flags = PREV_FLAGS.load(Ordering::SeqCst) as libc::c_int;
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // SAFETY: restoring the default disposition; returning re-executes
        // the faulting instruction, which then takes the default action.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
        }
    } else if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: prev was installed as a three-argument handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: prev was installed as a one-argument handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(prev) };
        f(sig);
    }
}
