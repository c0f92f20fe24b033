//! Surviving a cache file truncated by another program while it is mapped.
//!
//! Touching a page of a `MAP_SHARED` mapping that lies past the end of its
//! file raises SIGBUS, which would kill the process. nearcache installs one
//! process-wide SIGBUS handler, chained to the one installed before it.
//! When a *fault* (`si_code > 0`) hits an address inside a registered cache
//! mapping, the handler:
//!
//! 1. abandons every shard lock this process holds in that mapping whose
//!    lock word is still backed by the file (`fstat`): the word becomes
//!    `OWNER_GONE` and waiters are woken, so other processes take the lock
//!    over and repair the shard instead of waiting on a lock whose unlock
//!    would now go to private memory;
//! 2. replaces the whole mapping, in place, with private zero pages
//!    (`mmap(MAP_FIXED | MAP_ANONYMOUS)`) and marks it broken; the faulting
//!    instruction then re-executes on zeros, the operation in flight ends
//!    harmlessly, and every later call on that handle fails with a clear
//!    "file was truncated" error.
//!
//! Anything else is passed on unchanged: faults outside our mappings, and
//! signals sent with `kill`/`raise` (`si_code <= 0`), go to the previous
//! handler, or get the default action (for a sent SIGBUS: the process
//! ends, as it would without nearcache). One exception makes the handler
//! work when a fatal-error reporter such as Python's `faulthandler` was
//! installed *after* it: such a reporter restores its predecessor (us) and
//! re-raises the signal with `raise()`. When this process sends itself a
//! SIGBUS while one of our mappings is backed by a file now shorter than
//! the mapping, the handler breaks that mapping and returns; the faulting
//! instruction re-executes on zeros. (The reporter has printed its
//! message by then; the process survives.) `errno` is saved and restored.
//!
//! Invariants:
//! * the registry is a fixed array of atomics: the handler takes no lock and
//!   allocates nothing, and calls only async-signal-safe functions (`fstat`,
//!   `mmap`, `futex`, `sigaction`, `raise`, `getpid`);
//! * a region is unregistered before its mapping is unmapped.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::Once;

const SLOTS: usize = 256;

struct Region {
    start: AtomicUsize,
    len: AtomicUsize,
    fd: AtomicI32,
    broken: AtomicBool,
}

#[allow(clippy::declare_interior_mutable_const)]
const EMPTY: Region = Region {
    start: AtomicUsize::new(0),
    len: AtomicUsize::new(0),
    fd: AtomicI32::new(-1),
    broken: AtomicBool::new(false),
};

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

impl Guard {
    /// Retire the mapping `[start, start+len)` this guard registered: a
    /// resize moved its file's contents elsewhere (`resize.rs`). Exactly
    /// what a truncation does: this process's locks in it are abandoned
    /// and the mapping is replaced in place by private zero pages, so the
    /// file's memory can be freed while pointers into the range stay valid.
    pub(crate) fn retire(&self, start: *mut u8, len: usize) -> bool {
        match self.slot {
            Some(i) => break_region(&REGIONS[i], start as usize, len),
            None => {
                // SAFETY: as in break_region: the range is a live mapping
                // of ours, replaced in place.
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
                p != libc::MAP_FAILED
            }
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        if let Some(i) = self.slot {
            REGIONS[i].len.store(0, Ordering::SeqCst);
            REGIONS[i].fd.store(-1, Ordering::SeqCst);
            REGIONS[i].broken.store(false, Ordering::SeqCst);
            REGIONS[i].start.store(0, Ordering::SeqCst);
        }
    }
}

/// Register `[start, start+len)`, a mapping of the open file `fd` (which
/// must stay open while registered). With more than `SLOTS` live mappings
/// the extra ones are unprotected (they still work; a truncation kills).
pub(crate) fn register(start: *mut u8, len: usize, fd: i32) -> Guard {
    INSTALL.call_once(install);
    for (i, r) in REGIONS.iter().enumerate() {
        if r.start.compare_exchange(0, start as usize, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
            r.broken.store(false, Ordering::SeqCst);
            r.fd.store(fd, Ordering::SeqCst);
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

/// Current length of the file behind a region (async-signal-safe).
fn file_len(fd: i32) -> Option<usize> {
    // SAFETY: a zeroed stat is a valid out-parameter; fstat is
    // async-signal-safe and fd is open while the region is registered.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        (libc::fstat(fd, &mut st) == 0).then_some(st.st_size as usize)
    }
}

/// Abandon our locks in region `r` and replace it with zero pages.
fn break_region(r: &Region, start: usize, len: usize) -> bool {
    let backed = file_len(r.fd.load(Ordering::SeqCst)).unwrap_or(0);
    for w in crate::lock::held::WORDS.iter() {
        let addr = w.load(Ordering::Relaxed);
        if addr >= start && addr + 4 <= start + len && addr + 4 <= start + backed {
            // SAFETY: addr is a lock word of this live mapping, still
            // backed by the file (checked just above), aligned.
            unsafe { crate::lock::abandon(addr as *mut u32) };
        }
    }
    // SAFETY: [start, start+len) is a live mapping of ours (it is
    // unregistered before munmap); replacing it in place with private zero
    // pages keeps every pointer into it valid. mmap is a plain syscall.
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
    if p == libc::MAP_FAILED {
        return false;
    }
    r.broken.store(true, Ordering::SeqCst);
    true
}

/// Handle the signal if it is ours; false to pass it on.
fn handle(info: *mut libc::siginfo_t) -> bool {
    // SAFETY: the kernel passes a valid siginfo for SA_SIGINFO handlers.
    let (code, addr, sender) = unsafe {
        let i = &*info;
        (i.si_code, i.si_addr() as usize, if i.si_code <= 0 { i.si_pid() } else { 0 })
    };
    if code > 0 {
        // A real fault: ours if the address lies in one of our mappings.
        for r in REGIONS.iter() {
            let start = r.start.load(Ordering::SeqCst);
            let len = r.len.load(Ordering::SeqCst);
            if start != 0 && addr >= start && addr < start + len {
                return break_region(r, start, len);
            }
        }
        return false;
    }
    // Sent with kill/raise. Only a re-raise from a handler installed after
    // ours, in this process, for a mapping of ours that is now truncated.
    // SAFETY: getpid has no preconditions and is async-signal-safe.
    if sender != unsafe { libc::getpid() } {
        return false;
    }
    let mut handled = false;
    for r in REGIONS.iter() {
        let start = r.start.load(Ordering::SeqCst);
        let len = r.len.load(Ordering::SeqCst);
        if start == 0 || r.broken.load(Ordering::SeqCst) {
            continue;
        }
        if file_len(r.fd.load(Ordering::SeqCst)).is_some_and(|n| n < len) {
            handled |= break_region(r, start, len);
        }
    }
    handled
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: errno is thread-local; saved here and restored on every path
    // that returns, so the interrupted code never sees it change.
    let errno = unsafe { *libc::__errno_location() };
    let restore_errno = || {
        // SAFETY: as above.
        unsafe { *libc::__errno_location() = errno };
    };
    if handle(info) {
        restore_errno();
        return;
    }
    // Not ours: hand over to the previous handler, or the default action.
    let prev = PREV_ACTION.load(Ordering::SeqCst);
    let flags = PREV_FLAGS.load(Ordering::SeqCst) as libc::c_int;
    // SAFETY: as in handle().
    let sent = unsafe { (*info).si_code } <= 0;
    if prev == libc::SIG_IGN && sent {
        // What the process asked for before we came: nothing.
    } else if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // (The kernel never lets a process ignore a real fault: it is
        // fatal either way.)
        // SAFETY: restoring the default disposition. For a fault, returning
        // re-executes the faulting instruction, which then takes the
        // default action; a sent signal is re-raised to take it now.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut());
            if sent {
                libc::raise(libc::SIGBUS);
            }
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
    restore_errno();
}
