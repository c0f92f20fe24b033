//! The process-wide registry of mapped cache files.
//!
//! Opening a file that this process already has mapped reuses that mapping
//! (see `file::reopen`): no `open`, attach lock, header read, `mmap` or
//! page faults, only a stat of the path and the checks every open makes.
//!
//! What is keyed: a file's identity, `(st_dev, st_ino)` of the opened file,
//! to a *weak* reference to its [`Mapping`]. The `Cache` handles hold the
//! strong references, so the registry never keeps a file mapped: the
//! mapping is unmapped, and its entry removed, when the last handle that
//! shares it is dropped.
//!
//! Invariants:
//! * An entry names a mapping made by the process recorded in it. After a
//!   fork the child's copy of the registry still holds the parent's
//!   entries; they are treated as absent. The child keeps using the handles
//!   it inherited (the same mapping and open file description, see
//!   `file.rs`), but a new open in the child maps the file anew, with its
//!   own attach lock, and replaces the entry in the child's registry.
//! * An entry is only a hint: whoever finds one still checks that the path
//!   names that file and passes the checks of a normal open (see
//!   `file::reopen`), and otherwise opens normally.
//! * No `Arc<Mapping>` is dropped while the registry lock is held (a
//!   mapping's drop takes the lock to remove its entry); a `Weak` may be,
//!   since dropping one never runs the mapping's drop.
//! * The lock is taken around `fork` (`pthread_atfork`), so a child never
//!   inherits it held by a thread that does not exist in the child.
//!
//! Forks are also counted here: a mapping made before a fork shares its
//! open file description, and so its attach lock, with the child, and its
//! detach can then no longer tell whether it is the last one out.

use crate::file::Mapping;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Once, Weak};

/// A file's identity: `(st_dev, st_ino)`.
pub(crate) type FileId = (u64, u64);

struct Entry {
    /// The process that mapped the file.
    pid: u32,
    map: Weak<Mapping>,
}

type Map = BTreeMap<FileId, Entry>;

static REGISTRY: Mutex<Map> = Mutex::new(BTreeMap::new());
/// Forks this process made (counted in the parent).
static FORKS: AtomicU64 = AtomicU64::new(0);
static ATFORK: Once = Once::new();

thread_local! {
    /// The registry lock, held by the forking thread across `fork`.
    static HELD: RefCell<Option<MutexGuard<'static, Map>>> = const { RefCell::new(None) };
}

fn lock() -> MutexGuard<'static, Map> {
    // Nothing panics under the lock; a poisoned map is still consistent.
    REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
}

extern "C" fn before_fork() {
    ensure_atfork();
    let g = lock();
    // If this thread's locals are gone (a fork from a thread-local
    // destructor) the guard is dropped here: the lock is then not held
    // across that fork, as before the registry existed.
    let _ = HELD.try_with(|h| *h.borrow_mut() = Some(g));
}

fn release_after_fork() {
    let _ = HELD.try_with(|h| h.borrow_mut().take());
}

extern "C" fn after_fork_parent() {
    FORKS.fetch_add(1, Ordering::SeqCst);
    release_after_fork();
}

extern "C" fn after_fork_child() {
    release_after_fork();
}

fn ensure_atfork() {
    ATFORK.call_once(|| {
        // SAFETY: registering plain functions with no preconditions; they
        // only take and release the registry lock and bump a counter.
        unsafe {
            libc::pthread_atfork(Some(before_fork), Some(after_fork_parent), Some(after_fork_child))
        };
    });
}

/// Forks made by this process so far. A mapping remembers the count it saw
/// when it was made; a different count at its detach means a child may
/// share its open file description.
pub(crate) fn forks() -> u64 {
    ensure_atfork();
    FORKS.load(Ordering::SeqCst)
}

/// Whether no file is registered (then an open need not stat the path
/// first to look for one).
pub(crate) fn is_empty() -> bool {
    lock().is_empty()
}

/// The live mapping of file `id` made by this process, if any.
pub(crate) fn lookup(id: FileId) -> Option<Arc<Mapping>> {
    let me = crate::lock::my_pid();
    let g = lock();
    let e = g.get(&id)?;
    if e.pid != me {
        return None; // inherited through fork
    }
    // Returned, so dropped by the caller after the lock is released.
    e.map.upgrade()
}

/// Register `map` as this process's mapping of its file.
pub(crate) fn insert(map: &Arc<Mapping>) {
    ensure_atfork();
    let entry = Entry { pid: crate::lock::my_pid(), map: Arc::downgrade(map) };
    // The entry replaced, if any, is dropped under the lock: only a Weak.
    lock().insert(map.id(), entry);
}

/// Remove the entry of file `id` if it names the mapping at `map` (called
/// while that mapping is dropped; a newer mapping of the file keeps its
/// entry).
pub(crate) fn forget(id: FileId, map: *const Mapping) {
    let mut g = lock();
    if g.get(&id).is_some_and(|e| std::ptr::eq(e.map.as_ptr(), map)) {
        g.remove(&id);
    }
}
