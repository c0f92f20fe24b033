//! Creating, opening, checking and mapping the cache file.
//!
//! Creation is atomic: the file is built unnamed (`O_TMPFILE`, or where
//! that is unsupported under a unique temporary name with
//! `O_CREAT|O_EXCL|O_NOFOLLOW`), mode 0600, space reserved with
//! `posix_fallocate` so a full tmpfs fails here with a clear error instead
//! of a SIGBUS later, fully initialised, and then linked to its final name
//! (which never replaces an existing file). A process killed half-way leaves
//! no half-initialised cache (and with `O_TMPFILE` nothing at all); two
//! processes racing to create the same cache both end up on the winner's
//! file.
//!
//! Attachment is tracked with open-file-description (OFD) locks on byte 0:
//! every attached process holds a shared lock. An opener that can take the
//! exclusive lock knows nobody else is attached (first open after a reboot
//! or after every user crashed), so it may re-initialise the robust mutexes
//! (a mutex held across a reboot is never marked dead) and repair shards
//! left mid-write. OFD locks, unlike classic POSIX record locks, are not
//! dropped when some other descriptor of the same file is closed.
//!
//! Security: the file must be a regular file owned by the caller and not
//! writable by group or others, in a directory that others cannot write
//! into (or that is sticky, like /dev/shm), unless the caller opts in to
//! sharing with `allow_foreign_owner`.

use crate::error::{Error, Result};
use crate::layout::{fh, Geometry, HEADER_SIZE};
use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

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
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            size: Some(64 << 20),
            shards: 0,
            create: true,
            recreate: false,
            allow_foreign_owner: false,
        }
    }
}

/// A mapped cache file.
#[derive(Debug)]
pub(crate) struct Mapping {
    pub(crate) file: File,
    pub(crate) ptr: *mut u8,
    pub(crate) len: usize,
    /// Registration with the SIGBUS handler; released before munmap.
    sigbus: Option<crate::sigbus::Guard>,
}

// SAFETY: the mapping is MAP_SHARED memory that is only accessed through
// raw pointers under process-shared locks; moving or sharing the handle
// between threads is no different from sharing it between processes.
unsafe impl Send for Mapping {}
// SAFETY: see Send.
unsafe impl Sync for Mapping {}

impl Drop for Mapping {
    fn drop(&mut self) {
        drop(self.sigbus.take());
        // SAFETY: ptr/len come from a successful mmap and nobody uses the
        // mapping after the Cache that owns it is dropped.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

impl Mapping {
    fn new(file: File, ptr: *mut u8, len: usize) -> Mapping {
        let sigbus = Some(crate::sigbus::register(ptr, len));
        Mapping { file, ptr, len, sigbus }
    }

    /// Whether another program truncated the file under the mapping (the
    /// SIGBUS handler then replaced the mapping with private zero pages).
    #[inline]
    pub(crate) fn broken(&self) -> bool {
        self.sigbus.as_ref().is_some_and(|g| g.broken())
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

/// The result of opening: the mapping, its geometry, and whether this
/// process was alone (and so re-initialised the locks).
pub(crate) struct Opened {
    pub(crate) map: Mapping,
    pub(crate) geo: Geometry,
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

/// Try to take the exclusive attach lock; otherwise wait for a shared one.
fn attach_lock(fd: i32) -> Result<bool> {
    match ofd_lock(fd, libc::F_WRLCK, false) {
        Ok(()) => Ok(true),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EACCES)) => {
            ofd_lock(fd, libc::F_RDLCK, true).map_err(|e| Error::io("OFD read lock", e))?;
            Ok(false)
        }
        Err(e) => Err(Error::io("OFD write lock", e)),
    }
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

fn check_file(file: &File, path: &Path, allow_foreign: bool) -> Result<u64> {
    let md = file.metadata().map_err(|e| Error::io(format!("fstat {}", path.display()), e))?;
    use std::os::unix::fs::MetadataExt;
    if !md.file_type().is_file() {
        return Err(Error::Permission(format!("{} is not a regular file", path.display())));
    }
    if !allow_foreign {
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
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
    Ok(md.len())
}

fn check_dir(dir: &Path, allow_foreign: bool) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::symlink_metadata(dir)
        .map_err(|e| Error::io(format!("stat {}", dir.display()), e))?;
    let md = if md.file_type().is_symlink() {
        // A symlinked directory is fine if its target passes the checks.
        std::fs::metadata(dir).map_err(|e| Error::io(format!("stat {}", dir.display()), e))?
    } else {
        md
    };
    if !md.is_dir() {
        return Err(Error::Permission(format!("{} is not a directory", dir.display())));
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
    use std::os::unix::fs::MetadataExt;
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

fn read_header(file: &File, len: u64) -> Result<Geometry> {
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
    Geometry::read_header(&buf, len)
}

/// Open or create the cache file at `path`. `init_shards` is called on a
/// freshly created mapping; `reattach` when this process is alone.
pub(crate) fn open(
    path: &Path,
    opts: &OpenOptions,
    init_shards: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
    reattach: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
) -> Result<Opened> {
    let wanted = match opts.size {
        Some(size) => Some(Geometry::for_size(size, opts.shards)?),
        None => None,
    };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    if opts.create && !dir.exists() {
        ensure_private_dir(dir)?;
    }
    check_dir(dir, opts.allow_foreign_owner)?;
    for _attempt in 0..8 {
        if let Some(file) = open_existing(path)? {
            let len = check_file(&file, path, opts.allow_foreign_owner)?;
            let exclusive = attach_lock(file.as_raw_fd())?;
            let geo = match read_header(&file, len) {
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
            let m = Mapping::new(file, ptr, geo.total_size());
            if exclusive {
                reattach(&m, &geo)?;
                downgrade(m.file.as_raw_fd())?;
            }
            return Ok(Opened { map: m, geo, exclusive });
        }
        if !opts.create {
            return Err(Error::io(
                format!("open {}", path.display()),
                io::Error::from(io::ErrorKind::NotFound),
            ));
        }
        let geo = wanted.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} does not exist and no size was given",
                path.display()
            ))
        })?;
        if let Some(opened) = create(path, &geo, init_shards)? {
            return Ok(opened);
        }
        // Lost a creation race: open the winner's file.
    }
    Err(Error::Io {
        context: format!("open {}", path.display()),
        source: io::Error::other("the file kept changing while opening it"),
    })
}

/// Unlink `path` if it still names the file we have open.
fn remove_if_same(path: &Path, file: &File) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
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
    init_shards: &dyn Fn(&Mapping, &Geometry) -> Result<()>,
) -> Result<Option<Opened>> {
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
    // SAFETY: fd is open for writing.
    let rc = unsafe { libc::posix_fallocate(fd, 0, total as libc::off_t) };
    if rc != 0 {
        let e = io::Error::from_raw_os_error(rc);
        return Err(cleanup(match rc {
            libc::ENOSPC | libc::EFBIG => {
                Error::Full(format!("cannot reserve {total} bytes for {}: {e}", path.display()))
            }
            _ => Error::io("posix_fallocate", e),
        }));
    }
    let ptr = map(&file, total).map_err(cleanup)?;
    let m = Mapping::new(file, ptr, total);
    ofd_lock(fd, libc::F_WRLCK, false).map_err(|e| cleanup(Error::io("OFD lock new file", e)))?;
    let mut header = vec![0u8; HEADER_SIZE];
    geo.write_header(&mut header, crate::shard::now_ms());
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
    downgrade(fd)?;
    Ok(Some(Opened { map: m, geo: *geo, exclusive: true }))
}
