//! The shard lock: an engine-owned futex lock inside the mapping, with
//! owner-liveness checks and bounded waits.
//!
//! Each shard header starts with one 32-bit lock word:
//!
//! ```text
//! 0                      free
//! pid                    held by a thread of process `pid`
//! pid | WAITERS          held, and someone may sleep on the futex
//! OWNER_GONE [| WAITERS] the holder's process lost the shard (its mapping
//!                        was truncated under it): the next locker repairs
//! ```
//!
//! Uncontended, lock and unlock are one atomic instruction each (no
//! syscall). A contended locker sleeps on the (process-shared) futex in
//! slices of [`WAIT_SLICE`], and between slices checks that the holder's
//! process is alive (`kill(pid, 0)`). A dead holder (even SIGKILLed), a
//! word that names no possible process (scribbled by another program), or
//! `OWNER_GONE` is taken over with a compare-and-swap and reported as
//! [`Acquired::OwnerDied`]: the caller validates and repairs the shard.
//! A live holder that does not let go (stopped with SIGSTOP, under a
//! debugger, dumping core) makes the wait end at its deadline with
//! [`Error::LockTimeout`]: a cache never hangs its caller. At the deadline
//! a holder whose process is still running or runnable (merely preempted on
//! an overloaded machine) gets more time, up to [`OVERLOAD_FACTOR`] times
//! the timeout, so load alone does not turn into spurious timeouts.
//!
//! Why not a robust pthread mutex (what this replaced): glibc asserts and
//! aborts the process on a scribbled mutex word, `pthread_mutex_lock` has
//! no bound, and the kernel's robust-list cleanup writes through the
//! process's own mapping, which the SIGBUS handler may have replaced.
//!
//! Limits, documented in docs/reliability.md: every process sharing a file
//! must live in the same PID namespace (the word holds a pid); if a dead
//! holder's pid is reused by an unrelated process before anyone notices,
//! lockers time out (never hang) until that process exits; a program
//! that can write the file can always break mutual exclusion (then
//! operations return misses, errors or reset shards, never crash).

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Bytes reserved for the lock in each shard header: the 32-bit word and
/// 4 unused bytes, so the next field is 8-byte aligned. It shares its cache
/// line with the words every write changes (see `layout::sh`).
pub const MUTEX_BYTES: usize = 8;

/// Bit set in the lock word while a locker may be sleeping on it.
pub const WAITERS: u32 = 1 << 31;
/// Owner value of a lock whose holder lost the mapping (see module docs).
pub const OWNER_GONE: u32 = WAITERS - 1;
/// Largest pid Linux hands out (`PID_MAX_LIMIT`, 2^22).
const PID_MAX_LIMIT: u32 = 1 << 22;
/// A contended locker re-checks the holder's liveness this often.
pub const WAIT_SLICE: Duration = Duration::from_millis(5);
/// A wait past the timeout goes on, up to this many times the timeout, while
/// the holder's process is running or runnable (not stopped or traced).
pub const OVERLOAD_FACTOR: u32 = 20;
/// Default bound on one lock wait.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_millis(50);

/// How a lock was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Acquired {
    /// The lock was free or released normally.
    Clean,
    /// The previous holder died or lost the shard, or the word was
    /// scribbled: the protected data must be validated and repaired.
    OwnerDied,
}

/// This process's id, cached (a fork resets it through `pthread_atfork`).
static MY_PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn forget_pid_in_child() {
    MY_PID.store(0, Ordering::Relaxed);
}

/// The id written into lock words held by this process.
#[inline]
pub fn my_pid() -> u32 {
    let p = MY_PID.load(Ordering::Relaxed);
    if p != 0 {
        return p;
    }
    static ATFORK: std::sync::Once = std::sync::Once::new();
    ATFORK.call_once(|| {
        // SAFETY: registering a plain function with no preconditions.
        unsafe { libc::pthread_atfork(None, None, Some(forget_pid_in_child)) };
    });
    // SAFETY: getpid has no preconditions.
    let p = unsafe { libc::getpid() } as u32;
    MY_PID.store(p, Ordering::Relaxed);
    p
}

/// Whether a process with id `pid` may still hold a lock. `thorough`: also
/// tell a dead but unreaped process (a zombie) from a live one, which
/// costs a few system calls; lockers ask only once they have waited a
/// slice, so a contended lock of a live holder costs nothing more.
fn holder_alive(owner: u32, thorough: bool) -> bool {
    if owner == 0 || owner >= PID_MAX_LIMIT {
        return false; // OWNER_GONE, or a word no process could have written
    }
    // SAFETY: kill with signal 0 only checks for existence and permission.
    let rc = unsafe { libc::kill(owner as libc::pid_t, 0) };
    let exists = rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    exists && !(thorough && exited(owner))
}

/// Whether process `pid`, which still exists, has exited: every thread of
/// it is gone and only its zombie waits for a parent to reap it (which may
/// never come: a container's PID 1 that does not reap, a parent that waits
/// for its children only when it exits).
///
/// Asked through a pidfd, which polls readable once the whole thread group
/// has exited, reaped or not; where pidfds are unavailable (Linux before
/// 5.3, a seccomp filter), from /proc: the state of every thread is Z
/// (zombie) or X (dead). A thread-group leader that called pthread_exit
/// shows Z while its other threads run: only all threads count. No answer
/// either way is "not exited": a wait that cannot tell still ends at its
/// timeout.
fn exited(pid: u32) -> bool {
    // SAFETY: pidfd_open takes a pid and flags; it returns a new descriptor
    // that we close below, or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
    if fd >= 0 {
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd; zero timeout.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return n == 1 && p.revents & libc::POLLIN != 0;
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::ESRCH) => true, // reaped meanwhile
        _ => exited_per_proc(pid),
    }
}

/// [`exited`] from /proc: every thread's state is Z or X.
fn exited_per_proc(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read(t.path().join("stat")) else { continue };
        match proc_state(&stat) {
            Some(b'Z') | Some(b'X') => any = true,
            _ => return false,
        }
    }
    any
}

/// The state letter of a /proc/<pid>/stat line ("pid (comm) S ..."): it
/// follows the last ')', since the command may hold any byte.
fn proc_state(stat: &[u8]) -> Option<u8> {
    let close = stat.iter().rposition(|&b| b == b')')?;
    stat.get(close + 2).copied()
}

/// Whether process `pid` is running, runnable or in an uninterruptible
/// wait (state R or D in /proc/<pid>/stat), i.e. will release soon; false
/// for stopped (T), traced (t), sleeping (S) or unknown.
fn holder_running(pid: u32) -> bool {
    let Ok(stat) = std::fs::read(format!("/proc/{pid}/stat")) else { return false };
    matches!(proc_state(&stat), Some(b'R') | Some(b'D'))
}

/// Whether process `pid` is alive and not stopped or traced: running,
/// runnable, in a disk wait or asleep (a process repairing a file alone
/// may sleep a moment, on a page fault or a lock of its own). False for a
/// stopped (T), traced (t), dead or exited one. Used by an opener waiting
/// for the exclusive attach lock.
pub(crate) fn holder_working(pid: u32) -> bool {
    if !holder_alive(pid, true) {
        return false;
    }
    match std::fs::read(format!("/proc/{pid}/stat")) {
        Ok(stat) => matches!(proc_state(&stat), Some(b'R') | Some(b'D') | Some(b'S')),
        // No /proc: alive is all we can tell.
        Err(_) => true,
    }
}

fn futex(word: &AtomicU32, op: libc::c_int, val: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let ts_ptr = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: word is a live, aligned u32; the futex is process-shared
    // (no FUTEX_PRIVATE_FLAG) because the word lives in a MAP_SHARED file.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), op, val, ts_ptr, std::ptr::null::<u32>(), 0)
    };
}

/// The lock word at `w`.
///
/// # Safety
/// `w` must point to an aligned u32 inside a live mapping.
unsafe fn word<'a>(w: *mut u32) -> &'a AtomicU32 {
    // SAFETY: aligned, live (caller's contract); AtomicU32 has the layout of
    // u32, and all access to the word goes through atomics.
    unsafe { AtomicU32::from_ptr(w) }
}

/// Initialise (free) the lock word at `w`.
///
/// # Safety
/// `w` must point to an aligned u32 of the mapping that no other process is
/// using as a lock right now (creation, or holding the exclusive attach lock).
pub unsafe fn init(w: *mut u32) {
    // SAFETY: caller's contract.
    unsafe { word(w) }.store(0, Ordering::Release);
}

/// Lock the word at `w`, waiting at most `timeout`.
///
/// # Safety
/// `w` must point to an aligned u32 lock word inside a live mapping.
pub unsafe fn lock(w: *mut u32, timeout: Duration) -> Result<Acquired> {
    // SAFETY: caller's contract.
    let word = unsafe { word(w) };
    let me = my_pid();
    if word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_ok() {
        held::set(w as usize);
        return Ok(Acquired::Clean);
    }
    let how = lock_slow(word, me, timeout)?;
    held::set(w as usize);
    Ok(how)
}

#[cold]
fn lock_slow(word: &AtomicU32, me: u32, timeout: Duration) -> Result<Acquired> {
    let start = Instant::now();
    loop {
        let cur = word.load(Ordering::Relaxed);
        if cur == 0 {
            // Having waited, take it as contended: others may sleep too.
            if word.compare_exchange(0, me | WAITERS, Ordering::Acquire, Ordering::Relaxed).is_ok()
            {
                return Ok(Acquired::Clean);
            }
            continue;
        }
        // After a first slice of waiting, a holder that exited but was not
        // reaped (a zombie) counts as dead.
        if !holder_alive(cur & !WAITERS, start.elapsed() >= WAIT_SLICE) {
            if word
                .compare_exchange(cur, me | WAITERS, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return Ok(Acquired::OwnerDied);
            }
            continue;
        }
        if cur & WAITERS == 0
            && word
                .compare_exchange(cur, cur | WAITERS, Ordering::Relaxed, Ordering::Relaxed)
                .is_err()
        {
            continue;
        }
        let waited = start.elapsed();
        if waited >= timeout {
            // A holder that is merely slow (preempted on a loaded machine,
            // faulting pages in) gets up to OVERLOAD_FACTOR times longer; a
            // stopped or traced one does not.
            let cap = timeout.saturating_mul(OVERLOAD_FACTOR);
            if waited >= cap || !holder_running(cur & !WAITERS) {
                return Err(Error::LockTimeout { waited_ms: waited.as_millis() as u64 });
            }
        }
        let slice = WAIT_SLICE.min(if waited < timeout {
            timeout - waited
        } else {
            timeout.saturating_mul(OVERLOAD_FACTOR).saturating_sub(waited)
        });
        futex(word, libc::FUTEX_WAIT, cur | WAITERS, Some(slice));
    }
}

/// Unlock the word at `w`.
///
/// # Safety
/// The calling thread must hold the lock at `w`.
pub unsafe fn unlock(w: *mut u32) {
    held::set(0);
    // SAFETY: caller's contract.
    let word = unsafe { word(w) };
    if word.swap(0, Ordering::Release) & WAITERS != 0 {
        futex(word, libc::FUTEX_WAKE, 1, None);
    }
}

/// Try the word at `w` as a lock over hints (state that may be left
/// half-updated, like the eviction policy's miniatures): never waits, so
/// a live holder, even a stopped one, only makes the caller skip its work.
/// With `check_holder` (a system call: ask it now and then), a holder
/// whose process is gone, or a word no process could have written, is
/// taken over. Returns whether the caller holds the lock.
///
/// # Safety
/// `w` must point to an aligned u32 inside a live mapping.
pub(crate) unsafe fn try_lock_hint(w: *mut u32, check_holder: bool) -> bool {
    // SAFETY: caller's contract.
    let word = unsafe { word(w) };
    let me = my_pid();
    match word.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed) {
        Ok(_) => true,
        Err(owner) => {
            check_holder
                && !holder_alive(owner, true)
                && word.compare_exchange(owner, me, Ordering::Acquire, Ordering::Relaxed).is_ok()
        }
    }
}

/// Let go of a lock taken by [`try_lock_hint`].
///
/// # Safety
/// The calling thread must hold the lock at `w`.
pub(crate) unsafe fn unlock_hint(w: *mut u32) {
    // SAFETY: caller's contract.
    unsafe { word(w) }.store(0, Ordering::Release);
}

/// Mark a lock held by this process as lost (`OWNER_GONE`) and wake every
/// waiter; the next locker repairs. Async-signal-safe (one CAS, one
/// syscall): used by the SIGBUS handler.
///
/// # Safety
/// `w` must point to an aligned u32 that is still backed by the file.
pub(crate) unsafe fn abandon(w: *mut u32) {
    // SAFETY: caller's contract.
    let word = unsafe { word(w) };
    let cur = word.load(Ordering::Relaxed);
    if cur & !WAITERS == my_pid()
        && word
            .compare_exchange(cur, OWNER_GONE | WAITERS, Ordering::Release, Ordering::Relaxed)
            .is_ok()
    {
        futex(word, libc::FUTEX_WAKE, i32::MAX as u32, None);
    }
}

/// Which lock word each thread holds right now, in a fixed array of
/// atomics the SIGBUS handler can read without locking or allocating.
/// A thread holds at most one shard lock at a time.
pub(crate) mod held {
    use super::*;
    use std::cell::Cell;

    /// Threads tracked at once; later threads' locks are not abandoned on
    /// SIGBUS (they are still released when their process exits).
    pub(crate) const THREADS: usize = 256;
    #[allow(clippy::declare_interior_mutable_const)]
    const FREE: AtomicUsize = AtomicUsize::new(0);
    pub(crate) static WORDS: [AtomicUsize; THREADS] = [FREE; THREADS];
    static CLAIMED: [std::sync::atomic::AtomicBool; THREADS] =
        [const { std::sync::atomic::AtomicBool::new(false) }; THREADS];

    struct Slot(usize);
    impl Drop for Slot {
        fn drop(&mut self) {
            if self.0 < THREADS {
                WORDS[self.0].store(0, Ordering::Relaxed);
                CLAIMED[self.0].store(false, Ordering::Release);
            }
        }
    }

    thread_local! {
        static SLOT: Cell<usize> = const { Cell::new(usize::MAX) };
        static OWNER: std::cell::RefCell<Option<Slot>> = const { std::cell::RefCell::new(None) };
    }

    fn claim() -> usize {
        let i = (0..THREADS)
            .find(|&i| {
                CLAIMED[i]
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            })
            .unwrap_or(THREADS);
        // Released when the thread exits. If thread-local storage is being
        // torn down already, the slot stays claimed (harmless).
        let _ = OWNER.try_with(|o| *o.borrow_mut() = Some(Slot(i)));
        i
    }

    /// Record the lock word this thread now holds (0: none).
    #[inline]
    pub(crate) fn set(addr: usize) {
        let _ = SLOT.try_with(|s| {
            let mut i = s.get();
            if i == usize::MAX {
                if addr == 0 {
                    return;
                }
                i = claim();
                s.set(i);
            }
            if i < THREADS {
                WORDS[i].store(addr, Ordering::Relaxed);
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh() -> Box<u32> {
        Box::new(0)
    }

    #[test]
    fn lock_unlock_and_timeout_against_a_live_holder() {
        let mut w = fresh();
        let p: *mut u32 = &mut *w;
        // SAFETY: p is an aligned, live u32 for the whole test.
        unsafe {
            assert_eq!(lock(p, DEFAULT_LOCK_TIMEOUT).unwrap(), Acquired::Clean);
            // Held by this (live) process: a second locker times out.
            let t = Instant::now();
            assert!(matches!(lock(p, Duration::from_millis(30)), Err(Error::LockTimeout { .. })));
            assert!(t.elapsed() >= Duration::from_millis(30));
            unlock(p);
            assert_eq!(*p, 0);
            assert_eq!(lock(p, DEFAULT_LOCK_TIMEOUT).unwrap(), Acquired::Clean);
            unlock(p);
        }
    }

    #[test]
    fn scribbled_or_dead_owner_is_taken_over() {
        let mut w = fresh();
        let p: *mut u32 = &mut *w;
        for bad in [PID_MAX_LIMIT + 5, u32::MAX, OWNER_GONE, 0x7fff_0000 | WAITERS] {
            // SAFETY: as above.
            unsafe {
                *p = bad;
                assert_eq!(lock(p, DEFAULT_LOCK_TIMEOUT).unwrap(), Acquired::OwnerDied, "{bad:#x}");
                unlock(p);
            }
        }
    }

    #[test]
    fn abandon_hands_the_lock_to_the_next_locker() {
        let mut w = fresh();
        let p: *mut u32 = &mut *w;
        // SAFETY: as above.
        unsafe {
            lock(p, DEFAULT_LOCK_TIMEOUT).unwrap();
            abandon(p);
            assert_eq!(*p & !WAITERS, OWNER_GONE);
            held::set(0);
            assert_eq!(lock(p, DEFAULT_LOCK_TIMEOUT).unwrap(), Acquired::OwnerDied);
            unlock(p);
        }
    }

    #[test]
    fn contended_lock_is_mutually_exclusive() {
        let w = Box::leak(Box::new(0u32)) as *mut u32 as usize;
        let counter = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let c = counter.clone();
                std::thread::spawn(move || {
                    for _ in 0..2000 {
                        // SAFETY: the leaked word lives for the whole process.
                        unsafe {
                            let p = w as *mut u32;
                            lock(p, Duration::from_secs(10)).unwrap();
                            let v = c.load(Ordering::Relaxed);
                            c.store(v + 1, Ordering::Relaxed);
                            unlock(p);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(counter.load(Ordering::Relaxed), 8000);
    }
}
