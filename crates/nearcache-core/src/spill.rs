//! Values too large to keep inline: one immutable file per value, in a
//! directory beside the cache file.
//!
//! Layout:
//! ```text
//! <cache file>.spill/            directory, 0700, owned by the user
//!     0123456789abcdef           one value: its bytes and nothing else, 0600
//! index entry value (REF_LEN)  = [magic u32 "NCSP"][zero u32][id u64][len u64][xxh3 u64]
//! index entry flags            = the caller's flags | FLAG_SPILLED
//! ```
//!
//! Invariants and the arguments for them:
//! * **A file never changes after it has a name.** A writer fills an
//!   unnamed file (`O_TMPFILE`; where unsupported, a `.tmp-` name no
//!   reader ever opens), links it under a fresh random id, and only then
//!   publishes the index entry
//!   that names it, under the shard lock. A writer killed at any point
//!   leaves the old entry (and at worst an unnamed file the kernel frees,
//!   or a named file nothing references: an orphan, swept below).
//! * **Names come from nothing a user controls**: 64 random bits from the
//!   kernel, as 16 hex digits.
//! * **A reference read from shared memory is validated like any shared
//!   word**: the file is opened `O_NOFOLLOW` relative to the directory
//!   descriptor (a symlink is refused, never followed), must be a regular
//!   file owned by this user with no group/other permission bits, exactly
//!   `len` bytes long, and its bytes must hash to the stored checksum. A
//!   file that fails is refused, counted, and its entry dropped: the get is
//!   a miss, never an error or a partial value.
//! * **Nothing reaches a caller before it is verified.** The checksum is
//!   compared before a get's callback runs (a batch's callback writes the
//!   caller's output, or calls a C allocator, which cannot be taken back);
//!   batch reads load the value into memory and verify it there.
//! * **Only the file refuses itself.** What this process cannot do (open
//!   a descriptor: EMFILE, ENFILE, ENOMEM; reach the directory; read
//!   without an I/O error) is a miss for this process alone
//!   (`Refusal::Local`): the entry and its file stay for everyone else.
//!   The directory is named from the cache's absolute path, resolved once
//!   at open, so a later `chdir` changes nothing.
//! * **Readers never see a half-removed value.** The entry leaves the index
//!   (under the lock) before its file is unlinked (after the lock). A
//!   reader that opened the file keeps reading it whole (POSIX keeps an
//!   unlinked open file); one that finds the name gone re-reads the index,
//!   and finds the new value, or a miss.
//! * **Orphans are swept, live files never are.** A file is an orphan when
//!   no live entry names it. A writer holds a shared `flock` on its file
//!   from before it is linked until its entry is published; a sweep takes
//!   each candidate's exclusive `flock` without waiting (a held one means
//!   "being published": skipped, however long its writer waits for the
//!   shard lock), lists the live references again while it holds it, and
//!   unlinks only a file still unnamed. Files changed less than a grace ago
//!   are spared as well (`SWEEP_GRACE` for sweeps while others are
//!   attached). The process attaching alone sweeps with no grace and
//!   recounts the spilled bytes while it still holds the exclusive attach
//!   lock: nobody else is attached, so nothing is in flight, and nobody
//!   can attach before it is done.
//! * **Bytes are given back exactly once**, by whoever unlinks the file: a
//!   remover whose unlink finds the file already gone (a sweep removed it
//!   from under its removal queue) gives nothing back. A remover that
//!   cannot reach the directory leaves the file, counted, to a sweep.
//!
//! Power loss: files are not fsynced. The index itself lives in a shared
//! mapping that is written back when the kernel chooses (or on `flush`),
//! so after a power loss an entry may survive while its file's data did
//! not, or the other way round; either way the length and checksum checks
//! refuse a file that is not the value its reference describes, so a torn
//! value is never served. An fsync per spill (measured on the benchmark
//! machine's ext4 disk: 2,500 spilled 1 KiB sets/s with it, against
//! 95,500/s on tmpfs) would make the file durable without making the entry
//! that names it durable: it would cost every spill and promise nothing.
//!
//! The bytes held in files are counted in the file header (`fh::SPILL_*`)
//! and bounded by the handle's spill budget (`OpenOptions::spill_budget`):
//! a spill that would pass it first evicts spilled values (SIEVE order,
//! shard by shard; see `Cache::reserve_spill`).

use crate::error::{Error, Result};
use std::cell::Cell;
use std::collections::HashSet;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;
use xxhash_rust::xxh3::xxh3_64;

/// Bytes of a reference stored as the value of a spilled entry.
pub const REF_LEN: usize = 32;
const REF_MAGIC: u32 = u32::from_le_bytes(*b"NCSP");
/// A sweep while other processes are attached spares files younger than
/// this (they may be between being linked and being published).
pub const SWEEP_GRACE: Duration = Duration::from_secs(120);

/// Where a spilled value lives and how to check it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpillRef {
    pub id: u64,
    pub len: u64,
    pub sum: u64,
}

impl SpillRef {
    /// The reference as stored in the index entry.
    pub fn to_bytes(&self) -> [u8; REF_LEN] {
        let mut b = [0u8; REF_LEN];
        b[0..4].copy_from_slice(&REF_MAGIC.to_le_bytes());
        b[8..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..24].copy_from_slice(&self.len.to_le_bytes());
        b[24..32].copy_from_slice(&self.sum.to_le_bytes());
        b
    }

    /// Parse a reference read from shared memory; None if it is not one.
    pub fn parse(b: &[u8]) -> Option<SpillRef> {
        if b.len() != REF_LEN {
            return None;
        }
        let word = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        if u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) != REF_MAGIC
            || b[4..8] != [0; 4]
        {
            return None;
        }
        let r = SpillRef { id: word(8), len: word(16), sum: word(24) };
        (r.id != 0 && r.len != 0).then_some(r)
    }

    /// The file's name in the spill directory.
    pub fn file_name(&self) -> String {
        file_name(self.id)
    }
}

fn file_name(id: u64) -> String {
    format!("{id:016x}")
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("generated names hold no NUL")
}

/// The directory of a cache's spilled values.
pub fn dir_path(cache_path: &Path) -> PathBuf {
    let mut p = cache_path.as_os_str().to_owned();
    p.push(".spill");
    PathBuf::from(p)
}

/// Why a spilled value was not served.
#[derive(Debug)]
pub enum Refusal {
    /// The file is gone: its entry was replaced or removed meanwhile (read
    /// the index again), or someone deleted it.
    Missing,
    /// The file is not what the entry says (a symlink, wrong owner, type,
    /// mode, length or checksum): refused for every process.
    Bad(&'static str),
    /// This process could not open or read the file (out of descriptors or
    /// memory, an I/O error, no access to the directory): a miss here, and
    /// nothing about the value itself; it is never deleted for this.
    Local(&'static str),
}

/// An open spilled value, handed to a get's callback through `EntryRef`.
///
/// Nothing reaches a callback before the value is known good: the cache
/// calls [`ValueFile::check`] (or [`ValueFile::load`]) first, which reads
/// the whole file and compares its checksum, unless this very file was
/// verified before. The copy that follows can then fail only on an I/O
/// error (recorded, see [`ValueFile::failed`]); callers that cannot take
/// back what a callback did (`get_many`'s output, a C allocator) load the
/// value into memory first, so their callback sees verified bytes only.
pub struct ValueFile<'d> {
    file: File,
    len: usize,
    sum: u64,
    failed: Cell<bool>,
    /// Where to record a verified checksum, and under what identity (None:
    /// this very file was verified before, with this checksum, and has not
    /// changed since, or [`ValueFile::check`] verified it).
    verify: Option<(&'d Verified, VerifiedKey, FileIdentity)>,
    /// The value, read and verified (see [`ValueFile::load`]).
    loaded: Option<Vec<u8>>,
}

/// Why a read of a spilled file failed: a file shorter than its length is
/// not the value (refused); any other error is this process's (a miss).
fn read_refusal(e: &io::Error) -> Refusal {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        Refusal::Bad("length")
    } else {
        Refusal::Local("read")
    }
}

impl ValueFile<'_> {
    /// Verify the file before anything is served from it: read it whole
    /// and compare its checksum (skipped for a file verified before).
    pub(crate) fn check(&mut self) -> std::result::Result<(), Refusal> {
        let Some((verified, key, identity)) = self.verify.take() else { return Ok(()) };
        let mut buf = vec![0u8; (64 * 1024).min(self.len)];
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        let mut done = 0usize;
        while done < self.len {
            let n = (self.len - done).min(buf.len());
            self.file.read_exact_at(&mut buf[..n], done as u64).map_err(|e| read_refusal(&e))?;
            hasher.update(&buf[..n]);
            done += n;
        }
        if hasher.digest() != self.sum {
            return Err(Refusal::Bad("checksum"));
        }
        verified.insert(key, identity);
        Ok(())
    }

    /// Read the value into memory and verify it: copies are then served
    /// from memory and cannot fail.
    pub(crate) fn load(&mut self) -> std::result::Result<(), Refusal> {
        let mut data = vec![0u8; self.len];
        self.file.read_exact_at(&mut data, 0).map_err(|e| read_refusal(&e))?;
        if let Some((verified, key, identity)) = self.verify.take() {
            if xxh3_64(&data) != self.sum {
                return Err(Refusal::Bad("checksum"));
            }
            verified.insert(key, identity);
        }
        self.loaded = Some(data);
        Ok(())
    }

    /// Copy the value into `dst` (exactly `len` bytes). A read error is
    /// recorded (see [`ValueFile::failed`]).
    pub(crate) fn read_into(&self, dst: &mut [u8]) {
        debug_assert_eq!(dst.len(), self.len);
        debug_assert!(self.verify.is_none(), "served before it was checked");
        if let Some(data) = &self.loaded {
            dst.copy_from_slice(data);
        } else if self.file.read_exact_at(dst, 0).is_err() {
            self.failed.set(true);
        }
    }

    /// Write the value to `w` through a buffer. An error of `w` is
    /// returned; a failed read is recorded (see [`ValueFile::failed`]).
    pub(crate) fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        debug_assert!(self.verify.is_none(), "served before it was checked");
        if let Some(data) = &self.loaded {
            return w.write_all(data);
        }
        let mut buf = vec![0u8; (64 * 1024).min(self.len)];
        let mut done = 0usize;
        while done < self.len {
            let n = (self.len - done).min(buf.len());
            if self.file.read_exact_at(&mut buf[..n], done as u64).is_err() {
                self.failed.set(true);
                // Keep the promised length: what was made is discarded.
                buf[..n].fill(0);
            }
            w.write_all(&buf[..n])?;
            done += n;
        }
        Ok(())
    }

    /// Whether a copy failed to read the file (an I/O error after the
    /// value was verified: what the copy made must be discarded).
    pub fn failed(&self) -> bool {
        self.failed.get()
    }
    /// The value's length.
    pub fn len(&self) -> usize {
        self.len
    }
    /// True for an empty value (never spilled; for clippy's sake).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A spilled file's reference (id, length, checksum).
type VerifiedKey = (u64, u64, u64);
/// What identifies one unchanged file: inode, and the change time, which
/// any write, truncation, rename or link of the file moves (a process can
/// set a file's modification time, never its change time).
type FileIdentity = (u64, i64, i64);

/// Files whose checksum this process already verified. Spilled files never
/// change once named, so a second read of the same file (same reference,
/// same inode, same change time) skips the checksum: the cost of a get is
/// then the copy alone. Bounded: cleared when full.
#[derive(Debug, Default)]
struct Verified(std::sync::Mutex<std::collections::HashMap<VerifiedKey, FileIdentity>>);

const VERIFIED_MAX: usize = 4096;

impl Verified {
    fn contains(&self, key: &VerifiedKey, identity: &FileIdentity) -> bool {
        let map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        map.get(key) == Some(identity)
    }
    fn insert(&self, key: VerifiedKey, identity: FileIdentity) {
        let mut map = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= VERIFIED_MAX {
            map.clear();
        }
        map.insert(key, identity);
    }
}

/// What a sweep found.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SweepReport {
    /// Orphaned files (and stale temporary files) removed.
    pub removed: u64,
    /// Their bytes.
    pub removed_bytes: u64,
    /// Files kept because a live entry names them.
    pub referenced: u64,
}

/// Files a sweep locks and examines at once.
const SWEEP_BATCH: usize = 64;

/// A file a sweep holds locked (released when dropped).
struct SweepHold {
    _file: Option<File>,
    size: u64,
}

/// A written spilled file whose entry is not yet published: its shared
/// `flock`, taken before the file got its name, keeps sweeps off it until
/// this is dropped (after the publish, or after the file is removed).
#[derive(Debug)]
pub struct Publishing(#[allow(dead_code)] File);

/// An open spill directory.
#[derive(Debug)]
pub struct SpillDir {
    fd: OwnedFd,
    path: PathBuf,
    verified: Verified,
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

fn fstat(fd: i32) -> io::Result<libc::stat> {
    // SAFETY: st is plain old data written by fstat; fd is an open
    // descriptor of ours.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        if libc::fstat(fd, &mut st) != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// Take a shared `flock` of `file` (a new file nobody else can hold yet:
/// it does not wait).
fn flock_shared(file: &File) -> io::Result<()> {
    loop {
        // SAFETY: flock on our descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn random_id() -> Result<u64> {
    loop {
        let mut b = [0u8; 8];
        // SAFETY: b is 8 writable bytes.
        let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
        if n == 8 {
            let id = u64::from_le_bytes(b);
            if id != 0 {
                return Ok(id);
            }
            continue;
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            return Err(Error::io("getrandom", e));
        }
    }
}

impl SpillDir {
    /// Open the spill directory of the cache at `cache_path`, creating it
    /// (0700) if `create`. Ok(None): it does not exist and `create` is
    /// false. A directory that is a symlink, not ours (unless
    /// `allow_foreign_owner`) or open to group/other is refused.
    pub fn open(
        cache_path: &Path,
        create: bool,
        allow_foreign_owner: bool,
    ) -> Result<Option<Self>> {
        let path = dir_path(cache_path);
        let c = CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::InvalidArgument(format!("{} contains NUL", path.display())))?;
        if create {
            // SAFETY: c is a valid NUL-terminated path.
            if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(match e.raw_os_error() {
                        Some(libc::ENOSPC) => {
                            Error::Full(format!("creating {}: {e}", path.display()))
                        }
                        Some(libc::EACCES) | Some(libc::EPERM) => {
                            Error::Permission(format!("creating {}: {e}", path.display()))
                        }
                        _ => Error::io(format!("create {}", path.display()), e),
                    });
                }
            }
        }
        // SAFETY: c is a valid NUL-terminated path.
        let fd = unsafe {
            libc::open(
                c.as_ptr(),
                libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::ENOENT) if !create => Ok(None),
                Some(libc::ELOOP) | Some(libc::ENOTDIR) => Err(Error::Permission(format!(
                    "{} is not a directory (a symlink or a file): spilled values are kept \
                     only in a real directory",
                    path.display()
                ))),
                _ => Err(Error::io(format!("open {}", path.display()), e)),
            };
        }
        // SAFETY: a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let st =
            fstat(fd.as_raw_fd()).map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        if !allow_foreign_owner && st.st_uid != euid() {
            return Err(Error::Permission(format!(
                "{} belongs to uid {}, not to this user",
                path.display(),
                st.st_uid
            )));
        }
        if !allow_foreign_owner && st.st_mode & 0o077 != 0 {
            return Err(Error::Permission(format!(
                "{} is open to other users (mode {:o}); it must be 0700",
                path.display(),
                st.st_mode & 0o777
            )));
        }
        Ok(Some(SpillDir { fd, path, verified: Verified::default() }))
    }

    /// The directory's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn dirfd(&self) -> i32 {
        self.fd.as_raw_fd()
    }

    fn write_error(&self, len: usize, e: io::Error) -> Error {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) | Some(libc::EFBIG) => Error::Full(format!(
                "spilling a value of {len} bytes into {}: {e}; the previous value is kept",
                self.path.display()
            )),
            _ => Error::io(format!("spill a value into {}", self.path.display()), e),
        }
    }

    /// Write `value` to a new file and give it its name; returns its
    /// reference, and the lock that keeps sweeps off the file until its
    /// entry is published (drop it after the publish). Nothing named is
    /// left behind on failure.
    pub fn write(&self, value: &[u8]) -> Result<(SpillRef, Publishing)> {
        let id = random_id()?;
        let name = file_name(id);
        let r = SpillRef { id, len: value.len() as u64, sum: xxh3_64(value) };
        let (mut file, temp) =
            self.open_unnamed(id).map_err(|e| self.write_error(value.len(), e))?;
        // No fsync: see the module comment ("Power loss").
        let linked = flock_shared(&file)
            .and_then(|()| file.write_all(value))
            .and_then(|()| self.link(&file, temp.as_deref(), &name));
        if let Err(e) = linked {
            if let Some(t) = temp {
                self.unlink(&t);
            }
            return Err(self.write_error(value.len(), e));
        }
        Ok((r, Publishing(file)))
    }

    /// An unnamed file in the directory (`O_TMPFILE`), or, where the file
    /// system lacks it, a uniquely named temporary one.
    fn open_unnamed(&self, id: u64) -> io::Result<(File, Option<String>)> {
        // SAFETY: "." is a valid path relative to our directory fd.
        let fd = unsafe {
            libc::openat(
                self.dirfd(),
                c".".as_ptr(),
                libc::O_TMPFILE | libc::O_WRONLY | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd >= 0 && Path::new("/proc/self/fd").is_dir() {
            // SAFETY: a fresh descriptor we own.
            return Ok((unsafe { File::from_raw_fd(fd) }, None));
        }
        if fd >= 0 {
            // SAFETY: ours, unused.
            unsafe { libc::close(fd) };
        } else {
            let e = io::Error::last_os_error();
            if !matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP) | Some(libc::EISDIR) | Some(libc::EINVAL)
            ) {
                return Err(e);
            }
        }
        let temp = format!(".tmp-{id:016x}");
        let c = cstr(&temp);
        // SAFETY: c is a valid NUL-terminated name relative to our dir fd.
        let fd = unsafe {
            libc::openat(
                self.dirfd(),
                c.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o600 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh descriptor we own.
        Ok((unsafe { File::from_raw_fd(fd) }, Some(temp)))
    }

    /// Give a written file its final name (never replacing another).
    fn link(&self, file: &File, temp: Option<&str>, name: &str) -> io::Result<()> {
        let target = cstr(name);
        let rc = match temp {
            None => {
                let proc_path = cstr(&format!("/proc/self/fd/{}", file.as_raw_fd()));
                // SAFETY: valid NUL-terminated paths; linking an O_TMPFILE
                // file through /proc needs no privilege.
                unsafe {
                    libc::linkat(
                        libc::AT_FDCWD,
                        proc_path.as_ptr(),
                        self.dirfd(),
                        target.as_ptr(),
                        libc::AT_SYMLINK_FOLLOW,
                    )
                }
            }
            Some(t) => {
                let from = cstr(t);
                // SAFETY: valid NUL-terminated names relative to our dir fd.
                let rc = unsafe {
                    libc::linkat(self.dirfd(), from.as_ptr(), self.dirfd(), target.as_ptr(), 0)
                };
                if rc == 0 {
                    self.unlink(t);
                }
                rc
            }
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    /// Open the file `r` names and check it (owner, type, mode, length).
    /// The checksum is checked before anything is served from it
    /// ([`ValueFile::check`], [`ValueFile::load`]).
    ///
    /// Only what the file itself shows refuses it (a symlink, the wrong
    /// type, owner, mode or length): an error of this process (out of
    /// descriptors or memory, no access) is [`Refusal::Local`], a miss here
    /// that must not cost the value to anyone else.
    pub fn open_value(&self, r: &SpillRef) -> std::result::Result<ValueFile<'_>, Refusal> {
        let Ok(len) = usize::try_from(r.len) else { return Err(Refusal::Bad("length")) };
        let name = cstr(&r.file_name());
        // SAFETY: name is a valid NUL-terminated name relative to our dir fd.
        let fd = unsafe {
            libc::openat(
                self.dirfd(),
                name.as_ptr(),
                libc::O_RDONLY
                    | libc::O_NOFOLLOW
                    | libc::O_NOCTTY
                    | libc::O_NONBLOCK
                    | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            let e = io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::ENOENT) => Refusal::Missing,
                Some(libc::ELOOP) => Refusal::Bad("symlink"),
                _ => Refusal::Local("open"),
            });
        }
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        let st = fstat(file.as_raw_fd()).map_err(|_| Refusal::Local("stat"))?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Err(Refusal::Bad("not a regular file"));
        }
        if st.st_uid != euid() || st.st_mode & 0o077 != 0 {
            return Err(Refusal::Bad("owner or mode"));
        }
        if st.st_size as u64 != r.len {
            return Err(Refusal::Bad("length"));
        }
        let key = (r.id, r.len, r.sum);
        let identity = (st.st_ino, st.st_ctime, st.st_ctime_nsec);
        let verify = if self.verified.contains(&key, &identity) {
            None
        } else {
            Some((&self.verified, key, identity))
        };
        Ok(ValueFile { file, len, sum: r.sum, failed: Cell::new(false), verify, loaded: None })
    }

    /// Remove the file of `id`; whether this call removed it. The spilled
    /// bytes are given back by whoever removes a file, exactly once: a
    /// remover whose unlink finds the file gone (a sweep took it first)
    /// gives nothing back.
    pub fn remove(&self, id: u64) -> bool {
        self.unlink(&file_name(id))
    }

    fn unlink(&self, name: &str) -> bool {
        let c = cstr(name);
        // SAFETY: valid NUL-terminated name relative to our dir fd.
        unsafe { libc::unlinkat(self.dirfd(), c.as_ptr(), 0) == 0 }
    }

    /// Remove every file no live entry names, and temporary files of killed
    /// writers. Names that are not ours are left alone. `referenced` lists
    /// the ids live entries name; it is called once, and again before each
    /// batch of removals.
    ///
    /// A file is removed only if all of these hold: its status changed
    /// `grace` ago or earlier; no writer holds it (a spiller holds a shared
    /// `flock` on its file from before it is linked until its entry is
    /// published, see [`SpillDir::write`], so a file being published is
    /// never taken, however long its writer waits for the shard lock); and,
    /// with its exclusive `flock` held by the sweep, `referenced` still
    /// does not name it (a writer that published after the first listing
    /// released its lock only after publishing, so the second listing
    /// sees it). The sweep unlinks while it holds the lock.
    pub fn sweep(
        &self,
        grace: Duration,
        referenced: &mut dyn FnMut() -> Result<HashSet<u64>>,
    ) -> Result<SweepReport> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let mut report = SweepReport::default();
        let first = referenced()?;
        let mut candidates = Vec::new();
        for name in self.list()? {
            let id = if name.len() == 16 {
                match u64::from_str_radix(&name, 16) {
                    Ok(id)
                        if name
                            .bytes()
                            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) =>
                    {
                        Some(id)
                    }
                    _ => continue,
                }
            } else if name.starts_with(".tmp-") {
                None
            } else {
                continue;
            };
            if let Some(id) = id {
                if first.contains(&id) {
                    report.referenced += 1;
                    continue;
                }
            }
            let c = cstr(&name);
            // SAFETY: st is plain old data; c is a valid name relative to
            // our dir fd; AT_SYMLINK_NOFOLLOW: a symlink is examined itself.
            let st = unsafe {
                let mut st: libc::stat = std::mem::zeroed();
                if libc::fstatat(self.dirfd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) != 0
                {
                    continue;
                }
                st
            };
            let changed = st.st_ctime as f64 + st.st_ctime_nsec as f64 * 1e-9;
            if now - changed < grace.as_secs_f64() {
                continue;
            }
            candidates.push((name, id));
        }
        // In batches, so that the locks held stay few.
        for batch in candidates.chunks(SWEEP_BATCH) {
            let mut locked = Vec::with_capacity(batch.len());
            for (name, id) in batch {
                if let Some(held) = self.lock_for_sweep(name) {
                    locked.push((name, *id, held));
                }
            }
            if locked.is_empty() {
                continue;
            }
            let now_named =
                if locked.iter().any(|l| l.1.is_some()) { referenced()? } else { HashSet::new() };
            for (name, id, held) in locked {
                if id.is_some_and(|id| now_named.contains(&id)) {
                    report.referenced += 1;
                    continue;
                }
                if self.unlink(name) {
                    report.removed += 1;
                    report.removed_bytes += held.size;
                }
                drop(held);
            }
        }
        Ok(report)
    }

    /// Take the exclusive `flock` of the file `name` without waiting: None
    /// if a writer holds it (or it vanished). A file that cannot be opened
    /// to be locked (a symlink or other non-file under one of our names) is
    /// returned unlocked: no writer of ours makes one.
    fn lock_for_sweep(&self, name: &str) -> Option<SweepHold> {
        let c = cstr(name);
        // SAFETY: valid NUL-terminated name relative to our dir fd.
        let fd = unsafe {
            libc::openat(
                self.dirfd(),
                c.as_ptr(),
                libc::O_RDONLY
                    | libc::O_NOFOLLOW
                    | libc::O_NOCTTY
                    | libc::O_NONBLOCK
                    | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return match io::Error::last_os_error().raw_os_error() {
                Some(libc::ELOOP) => Some(SweepHold { _file: None, size: 0 }),
                _ => None,
            };
        }
        // SAFETY: a fresh descriptor we own.
        let file = unsafe { File::from_raw_fd(fd) };
        let st = fstat(file.as_raw_fd()).ok()?;
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            return Some(SweepHold { _file: None, size: 0 });
        }
        // SAFETY: flock on our descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return None;
        }
        Some(SweepHold { _file: Some(file), size: st.st_size as u64 })
    }

    /// The names in the directory.
    fn list(&self) -> Result<Vec<String>> {
        let err = |e| Error::io(format!("list {}", self.path.display()), e);
        // SAFETY: dup of our open directory fd; fdopendir takes ownership
        // of the duplicate and closedir releases it.
        unsafe {
            let dup = libc::fcntl(self.dirfd(), libc::F_DUPFD_CLOEXEC, 0);
            if dup < 0 {
                return Err(err(io::Error::last_os_error()));
            }
            let d = libc::fdopendir(dup);
            if d.is_null() {
                let e = io::Error::last_os_error();
                libc::close(dup);
                return Err(err(e));
            }
            libc::rewinddir(d);
            let mut names = Vec::new();
            loop {
                let ent = libc::readdir(d);
                if ent.is_null() {
                    break;
                }
                let name = std::ffi::CStr::from_ptr((*ent).d_name.as_ptr());
                if let Ok(s) = name.to_str() {
                    if s != "." && s != ".." {
                        names.push(s.to_owned());
                    }
                }
            }
            libc::closedir(d);
            Ok(names)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reference_round_trips_and_garbage_is_not_one() {
        let r = SpillRef { id: 7, len: 1 << 40, sum: 0xdead_beef };
        assert_eq!(SpillRef::parse(&r.to_bytes()), Some(r));
        assert_eq!(SpillRef::parse(&[0u8; REF_LEN]), None);
        assert_eq!(SpillRef::parse(&r.to_bytes()[..31]), None);
        let mut b = r.to_bytes();
        b[5] = 1;
        assert_eq!(SpillRef::parse(&b), None);
        assert_eq!(r.file_name(), "0000000000000007");
    }
}
