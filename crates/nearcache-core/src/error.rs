//! Errors of the engine.
//!
//! One enum, with one variant per thing a caller can act on differently.
//! Every failing operation leaves the cache exactly as it was, except the
//! documented shard reset after a crash or detected corruption.

use std::fmt;
use std::io;

/// Result alias used throughout the engine.
pub type Result<T> = std::result::Result<T, Error>;

/// Everything that can go wrong in the engine.
#[derive(Debug)]
pub enum Error {
    /// An operating-system call failed; `context` says which and on what.
    Io { context: String, source: io::Error },
    /// The cache was closed.
    Closed,
    /// The key is empty or longer than [`crate::MAX_KEY_LEN`].
    BadKey { len: usize, max: usize },
    /// Key, value and entry header do not fit in one entry of this cache
    /// (`spilling`: whether values too large for an entry go to files).
    ValueTooLarge { needed: usize, max: usize, spilling: bool },
    /// A value too large to keep inline is larger than the spill budget.
    OverSpillBudget { len: u64, budget: u64 },
    /// The file exists but was made with other parameters or another layout.
    Incompatible(String),
    /// The file is not a nearcache file or fails a consistency check.
    Corrupt(String),
    /// The file or its directory is unsafe to use (owner, symlink, mode).
    Permission(String),
    /// The file system has no room for the cache file.
    Full(String),
    /// incr/decr on an entry that is not a 64-bit counter.
    NotACounter,
    /// incr/decr on a missing key when no initial value was given.
    NotFound,
    /// incr/decr would overflow a signed 64-bit counter.
    Overflow,
    /// An argument is out of its documented range.
    InvalidArgument(String),
    /// A shard lock was not obtained within the cache's lock timeout: a
    /// live process holds it and does not let go (stopped, traced, dumping
    /// core). Nothing was changed.
    LockTimeout { waited_ms: u64 },
    /// A read-modify-write (`Cache::update`) lost its compare-and-swap to
    /// other writers this many times in a row and gave up; its last
    /// attempt wrote nothing.
    TooManyConflicts { conflicts: u32 },
    /// `open` could not attach within the lock timeout: another process
    /// holds the file's exclusive attach lock (it opened the file alone and
    /// is repairing it) and is stopped, traced or gone without letting go,
    /// or did not finish within the longest wait. `holder` is its pid when
    /// the file records one. Nothing was changed.
    AttachTimeout { waited_ms: u64, holder: Option<u32> },
    /// The shard a key belongs to was moved to a new file by a live resize
    /// (`resize.rs`). The engine follows the move itself and never returns
    /// this from a public call; it exists so that bindings can match every
    /// variant.
    Moved,
}

impl Error {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }

    pub(crate) fn last_os(context: impl Into<String>) -> Self {
        Error::io(context, io::Error::last_os_error())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Io { context, source } => write!(f, "{context}: {source}"),
            Error::Closed => write!(f, "the cache is closed"),
            Error::BadKey { len: 0, .. } => write!(f, "empty key"),
            Error::BadKey { len, max } => {
                write!(f, "key of {len} bytes is longer than the {max}-byte limit")
            }
            Error::ValueTooLarge { needed, max, spilling: true } => write!(
                f,
                "entry of {needed} bytes exceeds the {max}-byte entry limit of this cache \
                 (an entry must fit one arena segment of a shard); the cache was left unchanged"
            ),
            Error::ValueTooLarge { needed, max, spilling: false } => write!(
                f,
                "entry of {needed} bytes exceeds the {max}-byte entry limit of this cache, \
                 and spilling large values to files is off (spill_budget=0): an entry must fit \
                 one arena segment of a shard; set a spill_budget above 0 to keep larger values \
                 in files; the cache was left unchanged"
            ),
            Error::OverSpillBudget { len, budget } => write!(
                f,
                "value of {len} bytes exceeds the {budget}-byte spill budget of this cache \
                 (raise the spill_budget option); the cache was left unchanged"
            ),
            Error::Incompatible(msg) => write!(f, "incompatible cache file: {msg}"),
            Error::Corrupt(msg) => write!(f, "corrupt cache file: {msg}"),
            Error::Permission(msg) => write!(f, "refusing to use cache file: {msg}"),
            Error::Full(msg) => write!(f, "no room for the cache file: {msg}"),
            Error::NotACounter => write!(f, "the value is not a 64-bit integer counter"),
            Error::NotFound => write!(f, "key not found"),
            Error::Overflow => write!(f, "counter would overflow a signed 64-bit integer"),
            Error::InvalidArgument(msg) => write!(f, "invalid argument: {msg}"),
            Error::LockTimeout { waited_ms } => write!(
                f,
                "a shard lock was still held by another process after {waited_ms} ms \
                 (stopped or traced?); the operation was not performed"
            ),
            Error::TooManyConflicts { conflicts } => write!(
                f,
                "the update lost to other writers of the key {conflicts} times in a row and \
                 gave up; its last attempt wrote nothing (raise max_conflicts, or write the \
                 key less often)"
            ),
            Error::AttachTimeout { waited_ms, holder } => {
                write!(f, "could not attach to the cache file after {waited_ms} ms: ")?;
                match holder {
                    Some(pid) => write!(f, "process {pid}")?,
                    None => write!(f, "another process")?,
                }
                write!(
                    f,
                    " holds its exclusive attach lock (it opened the file alone and is \
                     repairing it) and is stopped, traced or not finishing; the file was \
                     not opened"
                )
            }
            Error::Moved => write!(f, "the key's shard was moved to a resized file"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}
