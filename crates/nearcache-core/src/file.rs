//! Creating, opening, checking and mapping the cache file.
//!
//! Creation is atomic: the file is built unnamed (`O_TMPFILE`, or where
//! that is unsupported under a unique temporary name with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`), mode 0600, sized with `ftruncate` as a
//! sparse file whose header page and shard headers are reserved with
//! `fallocate` (the shards reserve the rest as they fill, see `shard/arena.rs`;
//! with `preallocate`, off tmpfs, or where `fallocate` is unsupported, the
//! whole file is reserved with `posix_fallocate`), so a full tmpfs fails here or at a
//! later growth with a clear error instead of a SIGBUS (and a reserve of the
//! file system, `OpenOptions::fs_reserve`, is left free: checked with
//! `fstatvfs` before each lazy reservation, and once before a whole file is
//! reserved); fully initialised,
//! and then linked to its final name
//! (which never replaces an existing file). A process killed half-way leaves
//! no half-initialised cache (and with `O_TMPFILE` nothing at all); two
//! processes racing to create the same cache both end up on the winner's
//! file.
//!
//! Attachment is tracked with open-file-description (OFD) locks on byte 0:
//! every attached process holds a shared lock. An opener that can take the
//! exclusive lock knows nobody else is attached (first open after a reboot
//! or after every user crashed), so it may re-initialise the robust mutexes
//! (a mutex held across a reboot is never marked dead), repair shards
//! left mid-write, and sweep and recount the spilled values (`spill.rs`),
//! all before it downgrades to a shared lock, so that nobody attaches
//! meanwhile. OFD locks, unlike classic POSIX record locks, are not
//! dropped when some other descriptor of the same file is closed.
//!
//! Openers that find the exclusive lock held wait for it, bounded like
//! every other wait (see `attach_lock`): the holder records its pid in the
//! header (`fh::EXCLUSIVE_PID`), and a holder found stopped, traced or
//! dead at the lock timeout ends the wait with `Error::AttachTimeout`; a
//! working one gets longer (a repair of a large file alone may take
//! longer than a lock wait), never without bound.
//!
//! A process attaches once per mapping, not once per handle: every `Cache`
//! of one file in a process shares one [`Mapping`] (see `registry.rs`),
//! hence one descriptor and one lock, and detaches when the last of them
//! is dropped. A forked child inherits its parent's mappings with their
//! open file descriptions, and so shares their locks: the child's handles
//! keep working, and its own new opens map the file anew.
//!
//! Clean detach. Repairing every shard costs the lone opener a page
//! fault (and a page table) per shard; it is skipped when the file shows
//! that nothing can need it. The header counts attached processes
//! (`fh::ATTACHED`): the lone opener sets it to 1, every other opener adds
//! 1 and takes 1 off when it detaches while others are still attached.
//! The last one out (it takes the exclusive lock at detach) finds 1, only
//! itself, when every process that attached since the last repair
//! detached cleanly: none died holding a shard lock or mid-write. It then
//! records a verified clean detach (`fh::CLEAN_SHUTDOWN` = 2, count 0)
//! before it lets go of the lock. The next lone opener that finds exactly
//! that, on tmpfs (whose files never outlive a reboot, or a power cut half
//! written back), leaves the shards as they are; each shard's magic is
//! still checked before every use (`Shard::lock`), so a damaged shard is
//! refused, and the process that refuses it sets bit 31 of the count, so
//! that no later detach is verified clean and the next lone opener
//! repairs every shard. Anything else: a process that died, a mapping
//! truncated under its holder, a mapping shared with a forked child (the
//! parent and the child cannot tell which of them is the last user of
//! their open file description, so neither takes 1 off), a file written
//! by an engine that does not count: the count is not 1 or the byte not 2,
//! and the next lone opener repairs every shard, as every lone opener did
//! before the count existed.
//!
//! Security: the file must be a regular file owned by the caller and not
//! writable by group or others, in a directory that others cannot write
//! into (or that is sticky, like /dev/shm), unless the caller opts in to
//! sharing with `allow_foreign_owner`. In a sticky world-writable
//! directory another user can take a name before the owner does: the
//! cache file's (the owner's open then fails, as it must) and its spill
//! directory's, so there the spill directory is created at open and one
//! another user made is refused then (`Cache::open`), not at every spill.
//! Sticky directories are not refused outright: /tmp and /dev/shm are
//! where caches live, and taking a name first is a denial of service the
//! owner sees at open, never access to the data.

use crate::error::{Error, Result};
use crate::layout::{fh, header_is_lazy, Geometry, HEADER_SIZE};
use crate::registry::FileId;
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// How to open a cache file.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Requested total size in bytes; `None` opens an existing file as is.
    pub size: Option<usize>,
    /// Requested shard count (power of two), 0 to choose from the size.
    pub shards: usize,
    /// Create the file if it does not exist.
    pub create: bool,
    /// Replace an existing file whose parameters differ (or that is
    /// corrupt) instead of failing.
    pub recreate: bool,
    /// Accept a file owned by another user, or group/other-writable.
    pub allow_foreign_owner: bool,
    /// Longest wait for a shard lock held by another live process. Past
    /// it a read is a miss and a write fails with `Error::LockTimeout`;
    /// both are counted in `lock_timeouts`.
    pub lock_timeout: std::time::Duration,
    /// Reserve the whole file at creation (fail at once if the file system
    /// cannot hold it) instead of reserving space as the shards fill.
    pub preallocate: bool,
    /// Values longer than this are kept in files beside the cache
    /// (`spill.rs`) instead of inline; None: [`DEFAULT_SPILL_THRESHOLD`].
    /// Values that do not fit inline are spilled whatever this says.
    pub spill_threshold: Option<usize>,
    /// Most bytes this handle lets spilled values hold in their files
    /// before it evicts spilled values to make room; 0 disables spilling
    /// (values beyond the inline limit are refused).
    pub spill_budget: u64,
    /// Bytes of the file system this handle leaves free: a shard's growth
    /// or a spilled value's file that would leave less available is
    /// refused as if the file system were full (the shard evicts within
    /// what it holds; a spilled value first makes room by eviction). None:
    /// [`default_fs_reserve`] of the file system's size; `Some(0)` turns
    /// the reserve off.
    pub fs_reserve: Option<u64>,
}

/// Values above this many bytes are spilled by default (see
/// `docs/design/engine.md`, "Large values", for the measurement).
pub const DEFAULT_SPILL_THRESHOLD: usize = 128 * 1024;
/// Default spill budget: 1 GiB, like diskcache's default size limit.
pub const DEFAULT_SPILL_BUDGET: u64 = 1 << 30;

/// The reserve a handle leaves free on a file system of `fs_size` bytes
/// when `fs_reserve` is not given: the larger of 8 MiB and 10% of the
/// file system, at most 1 GiB, and at most a quarter of a file system
/// smaller than 32 MiB (8 MiB of Docker's 64 MiB `/dev/shm`, 1 GiB of a
/// host's 24 GiB one, 4 MiB of a 16 MiB tmpfs).
pub fn default_fs_reserve(fs_size: u64) -> u64 {
    (fs_size / 10).clamp(8 << 20, 1 << 30).min(fs_size / 4)
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            size: Some(64 << 20),
            shards: 0,
            create: true,
            recreate: false,
            allow_foreign_owner: false,
            lock_timeout: crate::lock::DEFAULT_LOCK_TIMEOUT,
            preallocate: false,
            spill_threshold: None,
            spill_budget: DEFAULT_SPILL_BUDGET,
            fs_reserve: None,
        }
    }
}

/// Mappings at most this long are retired by the call that follows a
/// resize; longer ones by a thread of their own (see [`Mapping::retire`]).
/// 16 MiB: at most 4,096 pages to tear down, about 10 ms.
pub(crate) const RETIRE_INLINE: usize = 16 << 20;
/// Bytes of a retired mapping replaced per `mmap` (2,048 pages, about 5 ms
/// of page-table teardown).
pub(crate) const RETIRE_CHUNK: usize = 8 << 20;

/// A mapped cache file, shared (`Arc`) by every `Cache` handle of the file
/// in this process (see `registry.rs`).
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) file: File,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// The file is sparse and its shards reserve space as they grow (the
    /// header's LAZY byte, read once at open).
    pub(crate) lazy: bool,
    /// The file's geometry, read once at open.
    pub(crate) geo: Geometry,
    /// The file's `(st_dev, st_ino)`: its key in the registry.
    id: FileId,
    /// The process that mapped the file, and the forks it had made then.
    pid: u32,
    forks: u64,
    /// How this mapping attached (for tests).
    pub(crate) how: Attach,
    /// The open completed: this mapping is attached and its drop detaches.
    attached: bool,
    /// Registration with the SIGBUS handler; released before munmap.
    sigbus: Option<crate::sigbus::Guard>,
    /// [`default_fs_reserve`] of the file's file system, read once at
    /// mapping (0 if it cannot be read), so that opening another handle
    /// costs no `fstatvfs`.
    default_fs_reserve: u64,
    /// A resize moved the file's contents to a new file and this process
    /// followed (`Mapping::retire`).
    retired: std::sync::atomic::AtomicBool,
}

// SAFETY: the mapping is MAP_SHARED memory that is only accessed through
// raw pointers under process-shared locks; moving or sharing the handle
// between threads is no different from sharing it between processes.
unsafe impl Send for Mapping {}
// SAFETY: see Send.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        crate::registry::forget(self.id, self);
        self.detach();
        drop(self.sigbus.take());
        // SAFETY: ptr/len come from a successful mmap and nobody uses the
        // mapping after the last Cache that shares it is dropped.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

impl Mapping {
    fn new(file: File, ptr: *mut u8, geo: Geometry, lazy: bool, id: FileId) -> Mapping {
        let len = geo.total_size();
        let sigbus = Some(crate::sigbus::register(ptr, len, file.as_raw_fd()));
        let default_fs_reserve = fs_reserve_of(file.as_raw_fd(), None);
        Mapping {
            file,
            ptr,
            len,
            lazy,
            geo,
            id,
            pid: crate::lock::my_pid(),
            forks: crate::registry::forks(),
            how: Attach::Created,
            attached: false,
            sigbus,
            default_fs_reserve,
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Let go of the file's memory after a resize moved its contents to a
    /// new file that every handle of this process follows (`resize.rs`):
    /// the mapping is replaced in place by private zero pages (pointers
    /// into it stay valid; an operation still in flight on it reads zeros
    /// and is redone on the new file) and the descriptor now names
    /// `/dev/null`, so this process no longer holds the file. The range
    /// itself is unmapped when the last handle drops the mapping.
    ///
    /// Replacing pages costs the kernel a page-table teardown for every
    /// page this process touched: about 2.6 µs a page on the 2-core test
    /// machine, 0.67 s for a 1 GiB file it had filled, paid by the call
    /// that noticed the switch (the slowest worker call, 0.48-0.76 s, of
    /// `benchmarks/resize_live.py`). So a mapping longer than
    /// [`RETIRE_INLINE`] is let go by a thread of its own, in chunks of
    /// [`RETIRE_CHUNK`] (each `mmap` holds the process's memory map lock
    /// only that long, so page faults of other threads wait at most
    /// that), while the call goes on with the new file. Everything the
    /// retirement is for holds from the start: the flag is set at once,
    /// and the old file's shards are all sealed (a resize retires a file
    /// only once every shard moved), so a call in flight on a part not yet
    /// replaced is sent to the new file as one on zeros is.
    pub(crate) fn retire(self: &Arc<Self>) {
        if self.retired.swap(true, Ordering::SeqCst) {
            return;
        }
        crate::registry::forget(self.id, Arc::as_ptr(self));
        if self.len > RETIRE_INLINE {
            let m = Arc::clone(self);
            let spawned = std::thread::Builder::new()
                .name("nearcache-retire".into())
                .spawn(move || m.release_retired());
            if spawned.is_ok() {
                return;
            }
        }
        self.release_retired();
    }

    /// The work of [`Mapping::retire`]: zero pages in place of the file's,
    /// chunk by chunk, then the descriptor pointed at `/dev/null`.
    fn release_retired(&self) {
        if let Some(g) = &self.sigbus {
            let mut off = 0;
            while off < self.len {
                let n = RETIRE_CHUNK.min(self.len - off);
                // SAFETY: off < len: the chunk [off, off + n) lies inside
                // the mapping, which `self` keeps mapped.
                g.retire(unsafe { self.ptr.add(off) }, n);
                off += n;
            }
        }
        if let Ok(null) = File::open("/dev/null") {
            // SAFETY: both descriptors are open; dup3 atomically makes our
            // descriptor number name /dev/null, closing the cache file's
            // description (and with it this process's attach lock).
            unsafe { libc::dup3(null.as_raw_fd(), self.file.as_raw_fd(), libc::O_CLOEXEC) };
        }
    }

    /// Whether [`Mapping::retire`] ran (or is running: the flag is set
    /// before the pages are replaced, so a read of the mapping followed
    /// by this check finding `false` read the file, not zeros).
    #[inline]
    pub(crate) fn retired(&self) -> bool {
        self.retired.load(Ordering::Acquire)
    }

    /// The file's `(st_dev, st_ino)`.
    pub(crate) fn id(&self) -> FileId {
        self.id
    }

    /// The header's count of attached processes (see the module comment).
    fn attach_count(&self) -> &AtomicU32 {
        // SAFETY: fh::ATTACHED is a 4-aligned u32 inside the header page of
        // the mapping, which lives as long as self; it is only accessed
        // atomically.
        unsafe { AtomicU32::from_ptr(self.ptr.add(fh::ATTACHED) as *mut u32) }
    }

    /// The header's record of the exclusive attach lock's holder.
    fn exclusive_pid(&self) -> &AtomicU32 {
        // SAFETY: fh::EXCLUSIVE_PID is a 4-aligned u32 inside the header
        // page of the mapping, which lives as long as self; it is only
        // accessed atomically (and read with pread by waiting openers).
        unsafe { AtomicU32::from_ptr(self.ptr.add(fh::EXCLUSIVE_PID) as *mut u32) }
    }

    fn clean_state(&self) -> u8 {
        // SAFETY: a byte inside the header.
        unsafe { std::ptr::read_volatile(self.ptr.add(fh::CLEAN_SHUTDOWN)) }
    }

    fn set_clean_state(&self, v: u8) {
        // SAFETY: a byte inside the header.
        unsafe { std::ptr::write_volatile(self.ptr.add(fh::CLEAN_SHUTDOWN), v) };
    }

    /// A shard of this file was found damaged: no detach may be verified
    /// clean until a lone opener has repaired every shard.
    pub(crate) fn note_damage(&self) {
        if !self.broken() {
            self.attach_count().fetch_or(DAMAGE_SEEN, Ordering::SeqCst);
        }
    }

    /// Whether the file records a verified clean detach, on tmpfs (asked
    /// by the lone opener, under the exclusive lock).
    fn detached_clean(&self) -> bool {
        self.clean_state() == VERIFIED_CLEAN
            && self.attach_count().load(Ordering::SeqCst) == 0
            && (self.lazy || on_tmpfs(self.file.as_raw_fd()))
    }

    /// Detach this process from the file: the last handle of the mapping is
    /// gone (see the module comment). The last one out goes back to the
    /// shared lock at once, before closing: were the open file description
    /// shared after all (a child made without `fork`), an exclusive lock
    /// kept with it would block every later opener.
    fn detach(&self) {
        if !self.attached || self.broken() {
            return;
        }
        if self.pid != crate::lock::my_pid() || crate::registry::forks() != self.forks {
            // Shared with a forked child, or inherited from the parent.
            return;
        }
        if try_exclusive(&self.file) {
            self.exclusive_pid().store(crate::lock::my_pid(), Ordering::SeqCst);
            let count = self.attach_count();
            if count.load(Ordering::SeqCst) == 1 {
                count.store(0, Ordering::SeqCst);
                self.set_clean_state(VERIFIED_CLEAN);
            } else {
                self.set_clean_state(LAST_OUT);
            }
            self.exclusive_pid().store(0, Ordering::SeqCst);
            release_exclusive(&self.file);
        } else {
            self.attach_count().fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Whether another program truncated the file under the mapping (the
    /// SIGBUS handler then replaced the mapping with private zero pages).
    #[inline]
    pub(crate) fn broken(&self) -> bool {
        self.retired() || self.sigbus.as_ref().is_some_and(|g| g.broken())
    }

    /// Write back dirty pages (meaningful for caches on a disk file system).
    pub(crate) fn flush(&self) -> Result<()> {
        // SAFETY: the range is exactly the live mapping.
        let rc = unsafe { libc::msync(self.ptr as *mut libc::c_void, self.len, libc::MS_SYNC) };
        if rc != 0 {
            return Err(Error::last_os("msync"));
        }
        Ok(())
    }

    /// Current size of the file on disk (to detect truncation by others).
    pub(crate) fn file_len(&self) -> Result<u64> {
        Ok(self.file.metadata().map_err(|e| Error::io("fstat cache file", e))?.len())
    }
}

/// `fh::CLEAN_SHUTDOWN` values (see the module comment).
const ATTACHED_NOW: u8 = 0;
const LAST_OUT: u8 = 1;
const VERIFIED_CLEAN: u8 = 2;
/// Bit of `fh::ATTACHED` set when a damaged shard is found.
const DAMAGE_SEEN: u32 = 1 << 31;

/// How a mapping attached to its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Attach {
    /// It created the file.
    Created,
    /// Alone, and it repaired every shard.
    Repaired,
    /// Alone after a verified clean detach: the shards were left as they are.
    Clean,
    /// Other processes were attached.
    Shared,
}

/// The result of opening: the mapping, its geometry, and whether this
/// process was alone (and so re-initialised the locks).
pub(crate) struct Opened {
    pub(crate) map: Mapping,
    /// This process was alone and re-initialised the locks.
    #[allow(dead_code)]
    pub(crate) exclusive: bool,
}

fn cpath(p: &Path) -> Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| Error::InvalidArgument(format!("path {p:?} contains a NUL byte")))
}

fn ofd_lock(fd: i32, kind: i32, wait: bool) -> io::Result<()> {
    // SAFETY: a zeroed flock is a valid argument; fields set below.
    let mut fl: libc::flock = unsafe { std::mem::zeroed() };
    fl.l_type = kind as libc::c_short;
    fl.l_whence = libc::SEEK_SET as libc::c_short;
    fl.l_start = 0;
    fl.l_len = 1;
    let cmd = if wait { libc::F_OFD_SETLKW } else { libc::F_OFD_SETLK };
    loop {
        // SAFETY: fd is an open descriptor; fl is a valid flock.
        let rc = unsafe { libc::fcntl(fd, cmd, &mut fl) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Take the exclusive attach lock if nobody else is attached (Ok(true));
/// otherwise a shared one (Ok(false)), waiting while another process holds
/// the exclusive lock: a lone opener repairing or sweeping, or a last
/// process detaching.
///
/// The wait is bounded like every other wait of the engine: past
/// `timeout` it ends with [`Error::AttachTimeout`] if the holder recorded
/// in the header (`fh::EXCLUSIVE_PID`) is stopped, traced or dead. A
/// holder that is working (running, runnable, in a disk wait, or asleep
/// for a moment) gets up to `OVERLOAD_FACTOR` times the timeout and at
/// least [`ATTACH_WAIT_FLOOR`], since repairing a large file alone can
/// take longer than one lock wait. It polls (`F_OFD_SETLKW` cannot be
/// bounded): each try asks for the exclusive lock first, so that if the
/// holder died half-way and nobody else is attached, this opener repairs.
fn attach_lock(file: &File, timeout: std::time::Duration) -> Result<bool> {
    let fd = file.as_raw_fd();
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_micros(100);
    loop {
        match ofd_lock(fd, libc::F_WRLCK, false) {
            Ok(()) => return Ok(true),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {}
            Err(e) => return Err(Error::io("OFD write lock", e)),
        }
        match ofd_lock(fd, libc::F_RDLCK, false) {
            Ok(()) => return Ok(false),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {}
            Err(e) => return Err(Error::io("OFD read lock", e)),
        }
        let waited = start.elapsed();
        if waited >= timeout {
            let holder = exclusive_holder(file);
            let cap = timeout.saturating_mul(crate::lock::OVERLOAD_FACTOR).max(ATTACH_WAIT_FLOOR);
            let stuck = holder.is_some_and(|pid| !crate::lock::holder_working(pid));
            if stuck || waited >= cap {
                return Err(Error::AttachTimeout { waited_ms: waited.as_millis() as u64, holder });
            }
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(crate::lock::WAIT_SLICE);
    }
}

/// A working holder of the exclusive attach lock gets at least this long
/// (see [`attach_lock`]).
pub const ATTACH_WAIT_FLOOR: std::time::Duration = std::time::Duration::from_secs(10);

/// The pid recorded as the exclusive attach lock's holder, read from the
/// file (the waiter has not mapped it yet).
fn exclusive_holder(file: &File) -> Option<u32> {
    use std::os::unix::fs::FileExt;
    let mut b = [0u8; 4];
    file.read_exact_at(&mut b, fh::EXCLUSIVE_PID as u64).ok()?;
    Some(u32::from_ne_bytes(b)).filter(|&p| p != 0)
}

/// Downgrade the exclusive attach lock to a shared one (atomic).
fn downgrade(fd: i32) -> Result<()> {
    ofd_lock(fd, libc::F_RDLCK, false).map_err(|e| Error::io("OFD lock downgrade", e))
}

/// Go back from the exclusive attach lock to the shared one.
pub(crate) fn release_exclusive(file: &File) {
    // Converting a lock we hold to a read lock cannot conflict.
    let _ = ofd_lock(file.as_raw_fd(), libc::F_RDLCK, false);
}

/// Is this process the only one attached? (Used at detach time.)
pub(crate) fn try_exclusive(file: &File) -> bool {
    ofd_lock(file.as_raw_fd(), libc::F_WRLCK, false).is_ok()
}

/// The effective uid that owns (and may open) private caches.
fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn check_file(file: &File, path: &Path, allow_foreign: bool, me: u32) -> Result<std::fs::Metadata> {
    let md = file.metadata().map_err(|e| Error::io(format!("fstat {}", path.display()), e))?;
    check_meta(&md, path, allow_foreign, me)?;
    Ok(md)
}

/// The checks of the cache file itself: a regular file, and unless
/// `allow_foreign`, owned by `me` (the effective uid) and not writable by
/// others.
fn check_meta(md: &std::fs::Metadata, path: &Path, allow_foreign: bool, me: u32) -> Result<()> {
    if !md.file_type().is_file() {
        return Err(Error::Permission(format!("{} is not a regular file", path.display())));
    }
    if !allow_foreign {
        if md.uid() != me {
            return Err(Error::Permission(format!(
                "{} is owned by uid {}, not by this user (uid {me}); pass \
                 allow_foreign_owner to share a cache between users",
                path.display(),
                md.uid()
            )));
        }
        if md.mode() & 0o022 != 0 {
            return Err(Error::Permission(format!(
                "{} is writable by group or others (mode {:o})",
                path.display(),
                md.mode() & 0o7777
            )));
        }
    }
    Ok(())
}

/// The checks of the cache's directory (`me`: the effective uid).
fn check_dir(dir: &Path, allow_foreign: bool, me: u32) -> Result<()> {
    let md = std::fs::symlink_metadata(dir)
        .map_err(|e| Error::io(format!("stat {}", dir.display()), e))?;
    if md.file_type().is_symlink() && !allow_foreign {
        // Whoever controls the link chooses where the cache lives.
        return Err(Error::Permission(format!(
            "directory {} is a symbolic link; pass allow_foreign_owner to follow it",
            dir.display()
        )));
    }
    let md = if md.file_type().is_symlink() {
        std::fs::metadata(dir).map_err(|e| Error::io(format!("stat {}", dir.display()), e))?
    } else {
        md
    };
    if !md.is_dir() {
        return Err(Error::Permission(format!("{} is not a directory", dir.display())));
    }
    if !allow_foreign && md.uid() != me && md.uid() != 0 {
        // Another user's directory: they can replace or remove the file.
        return Err(Error::Permission(format!(
            "directory {} belongs to uid {}, not to this user (uid {me}) or root; pass \
             allow_foreign_owner to share a cache between users",
            dir.display(),
            md.uid()
        )));
    }
    let sticky = md.mode() & 0o1000 != 0;
    if !allow_foreign && md.mode() & 0o002 != 0 && !sticky {
        return Err(Error::Permission(format!(
            "directory {} is world-writable without the sticky bit: anyone could replace \
             the cache file",
            dir.display()
        )));
    }
    Ok(())
}

/// Whether the directory of `path` lets every user create names in it
/// (world-writable; sticky, or `check_dir` would have refused it): another
/// user could then take the name of the cache's spill directory first.
pub(crate) fn in_shared_sticky_dir(path: &Path) -> bool {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::metadata(dir).is_ok_and(|md| md.mode() & 0o002 != 0)
}

/// Create `dir` (and parents) with mode 0700 if missing.
pub fn ensure_private_dir(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    match std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir) {
        Ok(()) => Ok(()),
        Err(e) => Err(Error::io(format!("mkdir {}", dir.display()), e)),
    }
}

/// `/dev/shm/nearcache-<uid>` (falls back to the temp dir without /dev/shm),
/// created 0700 and checked to belong to this user.
pub fn default_directory() -> Result<PathBuf> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    let base = if Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!("nearcache-{uid}"));
    ensure_private_dir(&dir)?;
    let md = std::fs::symlink_metadata(&dir)
        .map_err(|e| Error::io(format!("stat {}", dir.display()), e))?;
    if md.file_type().is_symlink() || !md.is_dir() {
        return Err(Error::Permission(format!("{} is not a plain directory", dir.display())));
    }
    if md.uid() != uid {
        return Err(Error::Permission(format!(
            "{} belongs to uid {}, not to this user",
            dir.display(),
            md.uid()
        )));
    }
    if md.mode() & 0o077 != 0 {
        return Err(Error::Permission(format!(
            "{} is accessible by others (mode {:o}); expected 0700",
            dir.display(),
            md.mode() & 0o7777
        )));
    }
    Ok(dir)
}

fn open_existing(path: &Path) -> Result<Option<File>> {
    let c = cpath(path)?;
    // SAFETY: c is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::ENOENT) => Ok(None),
            Some(libc::ELOOP) => Err(Error::Permission(format!(
                "{} is a symbolic link; refusing to follow it",
                path.display()
            ))),
            Some(libc::EACCES) | Some(libc::EPERM) => {
                Err(Error::Permission(format!("{}: {e}", path.display())))
            }
            _ => Err(Error::io(format!("open {}", path.display()), e)),
        };
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(Some(unsafe { File::from_raw_fd(fd) }))
}

fn map(file: &File, len: usize) -> Result<*mut u8> {
    // SAFETY: mapping a regular file we hold open, MAP_SHARED, whole length.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Error::last_os("mmap cache file"));
    }
    Ok(p as *mut u8)
}

/// The geometry, and whether the file is lazily reserved.
fn read_header(file: &File, len: u64) -> Result<(Geometry, bool)> {
    let mut buf = vec![0u8; HEADER_SIZE];
    use std::os::unix::fs::FileExt;
    if len < HEADER_SIZE as u64 {
        return Err(Error::Corrupt(format!(
            "file of {len} bytes is too short for a nearcache header"
        )));
    }
    file.read_exact_at(&mut buf, 0).map_err(|e| Error::io("read cache header", e))?;
    if buf[fh::READY] == 0 {
        return Err(Error::Corrupt("file was never fully initialised".into()));
    }
    Ok((Geometry::read_header(&buf, len)?, header_is_lazy(&buf)))
}

/// Reserve `len` bytes of the file from `off` (`fallocate`, mode 0: the
/// size is unchanged, ranges already reserved cost nothing). Retries EINTR.
pub(crate) fn reserve(fd: i32, off: usize, len: usize) -> io::Result<()> {
    loop {
        // SAFETY: fd is an open descriptor; fallocate reads no memory of ours.
        let rc = unsafe { libc::fallocate(fd, 0, off as libc::off_t, len as libc::off_t) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// Size and available bytes (for an unprivileged user, as `df` shows
/// them) of the file system of `fd`.
pub(crate) fn fs_space(fd: i32) -> io::Result<(u64, u64)> {
    // SAFETY: a zeroed statvfs is a valid out-parameter; fd is open (an
    // O_PATH descriptor will do).
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstatvfs(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let frsize = st.f_frsize as u64;
    Ok(((st.f_blocks as u64).saturating_mul(frsize), (st.f_bavail as u64).saturating_mul(frsize)))
}

impl Mapping {
    /// The reserve in bytes a handle of this mapping keeps free on the
    /// file system: `option`, or the default read at mapping.
    pub(crate) fn fs_reserve(&self, option: Option<u64>) -> u64 {
        option.unwrap_or(self.default_fs_reserve)
    }
}

/// The reserve in bytes a handle keeps on the file system of `fd`: the
/// option, or [`default_fs_reserve`] of the file system's size (none if
/// it cannot be read).
pub(crate) fn fs_reserve_of(fd: i32, option: Option<u64>) -> u64 {
    match option {
        Some(bytes) => bytes,
        None => fs_space(fd).map(|(size, _)| default_fs_reserve(size)).unwrap_or(0),
    }
}

/// `ENOSPC` if taking `len` more bytes of the file system of `fd` would
/// leave less than `keep` bytes available: a reserve is refused exactly
/// as a full file system. One `fstatvfs`, none when `keep` is 0; a file
/// system that cannot tell is not refused here.
pub(crate) fn check_fs_reserve(fd: i32, keep: u64, len: u64) -> io::Result<()> {
    if keep == 0 {
        return Ok(());
    }
    match fs_space(fd) {
        Ok((_, avail)) if avail < keep.saturating_add(len) => {
            Err(io::Error::from_raw_os_error(libc::ENOSPC))
        }
        _ => Ok(()),
    }
}

/// [`reserve`], refused (`ENOSPC`) if it would leave less than `keep`
/// bytes of the file system available.
pub(crate) fn reserve_keeping(fd: i32, off: usize, len: usize, keep: u64) -> io::Result<()> {
    check_fs_reserve(fd, keep, len as u64)?;
    reserve(fd, off, len)
}

/// Whether `fd` is a file on tmpfs (`/dev/shm` and the like).
fn on_tmpfs(fd: i32) -> bool {
    // SAFETY: a zeroed statfs is a valid out-parameter; fd is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let rc = unsafe { libc::fstatfs(fd, &mut st) };
    rc == 0 && st.f_type == libc::TMPFS_MAGIC
}

/// Whether an error of a growth reservation means "no room" (full file
/// system, quota, file size limit), as opposed to a broken call.
pub(crate) fn is_no_room(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EFBIG) | Some(libc::EDQUOT))
}

/// Open or create the cache file at `path`. `init_shards` is called on a
/// freshly created mapping; `reattach` when this process is alone.
pub(crate) fn open(
    path: &Path,
    opts: &OpenOptions,
    seed: Option<u64>,
    init_shards: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
    reattach: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
    alone: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
) -> Result<Opened> {
    let wanted = match opts.size {
        Some(size) => Some(Geometry::for_size(size, opts.shards)?),
        None => None,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if opts.create && !dir.exists() {
        ensure_private_dir(dir)?;
    }
    let me = euid();
    check_dir(dir, opts.allow_foreign_owner, me)?;
    for _attempt in 0..8 {
        if let Some(file) = open_existing(path)? {
            let md = check_file(&file, path, opts.allow_foreign_owner, me)?;
            let (len, id) = (md.len(), (md.dev(), md.ino()));
            let exclusive = attach_lock(&file, opts.lock_timeout)?;
            let (geo, lazy) = match read_header(&file, len) {
                Ok(g) => g,
                Err(e @ (Error::Corrupt(_) | Error::Incompatible(_)))
                    if opts.recreate && wanted.is_some() =>
                {
                    let _ = e;
                    remove_if_same(path, &file)?;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if let Some(w) = wanted {
                if w.shard_count != geo.shard_count || w.shard_size != geo.shard_size {
                    if opts.recreate {
                        remove_if_same(path, &file)?;
                        continue;
                    }
                    return Err(Error::Incompatible(format!(
                        "{} holds {} shards of {} bytes ({} bytes in all) but {} shards of {} \
                         bytes were requested; open it with its own parameters (size=None) or \
                         pass recreate=true to replace it",
                        path.display(),
                        geo.shard_count,
                        geo.shard_size,
                        geo.total_size(),
                        w.shard_count,
                        w.shard_size
                    )));
                }
            }
            let ptr = map(&file, geo.total_size())?;
            let mut m = Mapping::new(file, ptr, geo, lazy, id);
            if exclusive {
                // Openers waiting meanwhile can tell a stopped holder.
                m.exclusive_pid().store(crate::lock::my_pid(), Ordering::SeqCst);
                if m.detached_clean() {
                    m.how = Attach::Clean;
                } else {
                    reattach(&m, &geo)?;
                    m.how = Attach::Repaired;
                }
                // Still alone: what only a lone process may do (the spill
                // sweep and recount) happens before anyone else attaches.
                alone(&m, &geo)?;
                // We are alone (exclusive lock): the only one counted.
                m.attach_count().store(1, Ordering::SeqCst);
                m.set_clean_state(ATTACHED_NOW);
                m.exclusive_pid().store(0, Ordering::SeqCst);
                downgrade(m.file.as_raw_fd())?;
            } else {
                m.attach_count().fetch_add(1, Ordering::SeqCst);
                m.how = Attach::Shared;
            }
            m.attached = true;
            return Ok(Opened { map: m, exclusive });
        }
        if !opts.create {
            return Err(Error::io(
                format!("no cache file at {}", path.display()),
                io::Error::new(io::ErrorKind::NotFound, "none is made with create=false"),
            ));
        }
        let geo = wanted.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} does not exist and no size was given",
                path.display()
            ))
        })?;
        if let Some(opened) = create(path, &geo, seed, opts, init_shards, alone)? {
            return Ok(opened);
        }
        // Lost a creation race: open the winner's file.
    }
    Err(Error::Io {
        context: format!("open {}", path.display()),
        source: io::Error::other("the file kept changing while opening it"),
    })
}

/// This process's mapping of `path`, if it has one that a normal open with
/// `opts` would accept as it is: shared instead of mapping the file again.
///
/// The checks of a normal open are made again, from a stat of the path
/// instead of the opened descriptor: the path must still name the mapped
/// file (same device and inode: a file replaced on disk is opened anew),
/// not through a symbolic link; the file must pass the permission and
/// ownership checks; it must still have its size and
/// a valid header describing the mapped geometry, and the geometry must be
/// the one asked for (or `size` is None). The mapping must not have been
/// broken by a truncation. `recreate` always opens normally. `None` on any
/// doubt: the caller then opens normally, which reports any error exactly
/// as before.
///
/// The directory is not checked again (one `stat` less: a third of the
/// cost of a reopen). Its check keeps a normal open from using a file that
/// someone else could have planted or swapped in; here the path names the
/// very file this process already opened and checked, still ours and
/// private by the file checks above, so a directory that became writable
/// to others since changes nothing that is mapped. (A file swapped in
/// through it has another inode, and gets a normal open, which refuses.)
pub(crate) fn reopen(path: &Path, opts: &OpenOptions) -> Option<Arc<Mapping>> {
    if opts.recreate || crate::registry::is_empty() {
        return None;
    }
    let md = std::fs::symlink_metadata(path).ok()?;
    let m = crate::registry::lookup((md.dev(), md.ino()))?;
    if m.broken() || md.len() != m.len as u64 {
        return None;
    }
    if let Some(size) = opts.size {
        let w = Geometry::for_size(size, opts.shards).ok()?;
        if w.shard_count != m.geo.shard_count || w.shard_size != m.geo.shard_size {
            return None;
        }
    }
    check_meta(&md, path, opts.allow_foreign_owner, euid()).ok()?;
    // The header as a normal open would read it, from the mapping.
    let mut buf = [0u8; HEADER_SIZE];
    // SAFETY: the mapping starts with the HEADER_SIZE-byte file header,
    // whose fields end with LAZY; they are copied out, never referenced.
    unsafe { std::ptr::copy_nonoverlapping(m.ptr, buf.as_mut_ptr(), fh::LAZY + 8) };
    if buf[fh::READY] == 0 || Geometry::read_header(&buf, md.len()).ok()? != m.geo {
        return None;
    }
    Some(m)
}

/// Unlink `path` if it still names the file we have open.
///
/// The check and the unlink run under an exclusive `flock` of the
/// directory, taken by every remover: otherwise two recreators could both
/// see the old file, one replace it, and the other then unlink the
/// replacement, leaving them on different files. (A creator never needs the
/// lock: `link` never replaces a name, so while the old file is at `path`
/// nobody can publish a new one there.)
fn remove_if_same(path: &Path, file: &File) -> Result<()> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let dir_file = std::fs::File::open(dir)
        .map_err(|e| Error::io(format!("open directory {}", dir.display()), e))?;
    loop {
        // SAFETY: dir_file is an open descriptor; the lock is released when
        // it is closed at the end of this function.
        if unsafe { libc::flock(dir_file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            break;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(Error::io(format!("flock {}", dir.display()), e));
        }
    }
    let ours = file.metadata().map_err(|e| Error::io("fstat", e))?;
    if let Ok(md) = std::fs::symlink_metadata(path) {
        if md.ino() == ours.ino() && md.dev() == ours.dev() {
            std::fs::remove_file(path)
                .map_err(|e| Error::io(format!("remove {}", path.display()), e))?;
        }
    }
    Ok(())
}

/// Where a new cache file lives until it is published under its name.
enum Staging {
    /// An unnamed file (`O_TMPFILE`): a creator killed before publishing
    /// leaves nothing behind, not even its reserved memory on tmpfs.
    Anonymous,
    /// A uniquely named temporary file beside the target (file systems
    /// without `O_TMPFILE`, or no /proc to link it from).
    Named(PathBuf),
}

fn create_error(what: &Path, e: io::Error) -> Error {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => Error::Full(format!("creating {}: {e}", what.display())),
        Some(libc::EACCES) | Some(libc::EPERM) => {
            Error::Permission(format!("creating {}: {e}", what.display()))
        }
        _ => Error::io(format!("create {}", what.display()), e),
    }
}

/// Open the file a new cache is built in, before it gets its name.
fn open_staging(path: &Path) -> Result<(File, Staging)> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if Path::new("/proc/self/fd").is_dir() {
        let cdir = cpath(dir)?;
        // SAFETY: cdir is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                cdir.as_ptr(),
                libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd >= 0 {
            // SAFETY: fresh descriptor we own.
            return Ok((unsafe { File::from_raw_fd(fd) }, Staging::Anonymous));
        }
        let e = io::Error::last_os_error();
        if !matches!(
            e.raw_os_error(),
            Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
        ) {
            return Err(create_error(path, e));
        }
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}-{nanos}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let c = cpath(&tmp)?;
    // SAFETY: c is a valid NUL-terminated path.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(create_error(&tmp, io::Error::last_os_error()));
    }
    // SAFETY: fresh descriptor we own.
    Ok((unsafe { File::from_raw_fd(fd) }, Staging::Named(tmp)))
}

/// Give the staged file its final name; fails with EEXIST if a racing
/// creator published first. Never replaces an existing file.
fn publish(file: &File, staging: &Staging, path: &Path) -> io::Result<()> {
    let target = cpath(path).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
    let rc = match staging {
        Staging::Anonymous => {
            let proc_path = CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))
                .expect("no NUL in a formatted path");
            // SAFETY: both are valid NUL-terminated paths; linking an
            // O_TMPFILE file through /proc needs no privilege.
            unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    proc_path.as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            }
        }
        Staging::Named(tmp) => {
            let c = cpath(tmp).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
            // SAFETY: both are valid NUL-terminated paths.
            unsafe { libc::link(c.as_ptr(), target.as_ptr()) }
        }
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

fn create(
    path: &Path,
    geo: &Geometry,
    seed: Option<u64>,
    opts: &OpenOptions,
    init_shards: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
    alone: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
) -> Result<Option<Opened>> {
    // A random hash seed per file (see hash.rs), fixed for the file's life.
    // (A resize's new file keeps the old file's seed: see `resize.rs`.)
    let seed = match seed {
        Some(seed) => seed,
        None => crate::hash::random_seed()?,
    };
    let geo = &Geometry { seed, ..*geo };
    let (file, staging) = open_staging(path)?;
    let fd = file.as_raw_fd();
    let remove_staged = || {
        if let Staging::Named(tmp) = &staging {
            let _ = std::fs::remove_file(tmp);
        }
    };
    let cleanup = |e: Error| {
        remove_staged();
        e
    };
    let total = geo.total_size();
    let no_room = |what: usize, e: io::Error| {
        if is_no_room(&e) {
            Error::Full(format!("cannot reserve {what} bytes for {}: {e}", path.display()))
        } else {
            Error::io("fallocate", e)
        }
    };
    // A sparse file of the full size whose header page is reserved; the
    // shards reserve their own headers in init_shards and the rest as they
    // fill. Where fallocate is unsupported (or on request) reserve it all.
    // SAFETY: fd is open for writing.
    if unsafe { libc::ftruncate(fd, total as libc::off_t) } != 0 {
        return Err(cleanup(no_room(total, io::Error::last_os_error())));
    }
    // Lazy on tmpfs only, where the file's pages are the memory it holds
    // and fallocate is an in-memory operation. On a disk file system the
    // pages are reclaimable page cache, and fallocate can wait for the
    // journal for milliseconds, which inside a shard lock would cost other
    // processes lock timeouts: reserve everything at creation there.
    // The reserve of the file system (`fs_reserve`) is checked here for
    // the whole file when it is preallocated, and by each growth of a
    // lazy one (`shard/arena.rs`).
    let keep = fs_reserve_of(fd, opts.fs_reserve);
    let lazy = !opts.preallocate
        && on_tmpfs(fd)
        && match reserve_keeping(fd, 0, HEADER_SIZE, keep) {
            Ok(()) => true,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS)) => {
                false
            }
            Err(e) => return Err(cleanup(no_room(HEADER_SIZE, e))),
        };
    if !lazy {
        check_fs_reserve(fd, keep, total as u64).map_err(|e| {
            cleanup(Error::Full(format!(
                "cannot reserve {total} bytes for {} and leave the file system's reserve of \
                 {keep} bytes free (the fs_reserve option; 0 turns it off): {e}",
                path.display()
            )))
        })?;
        // SAFETY: fd is open for writing.
        let rc = unsafe { libc::posix_fallocate(fd, 0, total as libc::off_t) };
        if rc != 0 {
            return Err(cleanup(no_room(total, io::Error::from_raw_os_error(rc))));
        }
    }
    let md = file.metadata().map_err(|e| cleanup(Error::io("fstat new cache file", e)))?;
    let ptr = map(&file, total).map_err(cleanup)?;
    let mut m = Mapping::new(file, ptr, *geo, lazy, (md.dev(), md.ino()));
    ofd_lock(fd, libc::F_WRLCK, false).map_err(|e| cleanup(Error::io("OFD lock new file", e)))?;
    let mut header = vec![0u8; HEADER_SIZE];
    geo.write_header(&mut header, crate::shard::now_ms(), lazy);
    // The creator is attached, alone, and holds the exclusive lock.
    header[fh::ATTACHED..fh::ATTACHED + 4].copy_from_slice(&1u32.to_ne_bytes());
    header[fh::EXCLUSIVE_PID..fh::EXCLUSIVE_PID + 4]
        .copy_from_slice(&crate::lock::my_pid().to_ne_bytes());
    // SAFETY: the mapping is at least HEADER_SIZE bytes and not yet shared.
    unsafe { std::ptr::copy_nonoverlapping(header.as_ptr(), m.ptr, HEADER_SIZE) };
    init_shards(&m, geo).map_err(cleanup)?;
    // SAFETY: READY is inside the header; written last, then published by link.
    unsafe { std::ptr::write_volatile(m.ptr.add(fh::READY), 1u8) };
    let published = publish(&m.file, &staging, path);
    remove_staged();
    if let Err(e) = published {
        if e.raw_os_error() == Some(libc::EEXIST) {
            return Ok(None);
        }
        return Err(Error::io(format!("link {}", path.display()), e));
    }
    // A spill directory left by an earlier file of this name holds nothing
    // this one names.
    alone(&m, geo)?;
    m.exclusive_pid().store(0, Ordering::SeqCst);
    downgrade(fd)?;
    m.attached = true;
    Ok(Some(Opened { map: m, exclusive: true }))
}
