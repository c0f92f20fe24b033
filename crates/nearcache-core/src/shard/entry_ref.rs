//! [`EntryRef`]: a live value found by a lookup, handed to the caller's
//! closure, wherever its bytes are (the arena, a spilled file, a private
//! copy).
//!
//! Under the lock it stays valid while the guard is held. In an optimistic
//! get (`optimistic.rs`) the arena bytes it reads may be changing under
//! the copy: whatever is made from them is thrown away unless `seq` shows
//! that nothing changed. It never creates a Rust reference over shared
//! bytes: values are copied out through raw pointers.

use super::ShardGuard;
use crate::layout::FLAG_SPILLED;
use crate::spill::{SpillRef, ValueFile, REF_LEN};

/// A live entry found by a lookup. Under the lock (writes, batches) it
/// stays valid while the guard is held; in an optimistic get its bytes may
/// be changing under the copy, and whatever was made from them is thrown
/// away unless the shard's `seq` shows that nothing changed.
pub struct EntryRef<'g> {
    pub(super) src: Src<'g>,
    pub(super) val_len: usize,
    pub(super) flags: u32,
    pub(super) expires_ms: u64,
    /// The entry's version (see "Versions" in the module comment); 0 where
    /// the reader does not know it (a spilled value's file).
    pub(super) version: u64,
}

/// Where an entry's value bytes are.
pub(super) enum Src<'g> {
    /// In the arena, at this offset.
    Arena { guard: &'g ShardGuard<'g>, off: usize },
    /// In a spilled-value file (`spill.rs`).
    Spilled(&'g ValueFile<'g>),
    /// In private memory: a copy made earlier (`Cache::update` hands its
    /// callback the value it read, outside any lock).
    Owned(&'g [u8]),
}

impl<'g> EntryRef<'g> {
    /// A spilled value, opened and checked by the cache.
    pub(crate) fn spilled(file: &'g ValueFile<'g>, flags: u32, expires_ms: u64) -> Self {
        EntryRef { src: Src::Spilled(file), val_len: file.len(), flags, expires_ms, version: 0 }
    }

    /// A value already copied out of the cache (`version`: the one it was
    /// read with).
    pub(crate) fn owned(data: &'g [u8], flags: u32, expires_ms: u64, version: u64) -> Self {
        EntryRef { src: Src::Owned(data), val_len: data.len(), flags, expires_ms, version }
    }

    /// The version of the entry this value was read from (0 for a reader
    /// of a spilled value's file, which does not know it).
    pub(crate) fn version(&self) -> u64 {
        self.version
    }

    /// The reference of a spilled entry, as read from the arena; None for
    /// an inline entry or bytes that are not a reference.
    pub(crate) fn spill_ref(&self) -> Option<SpillRef> {
        if self.flags & FLAG_SPILLED == 0 || self.val_len != REF_LEN {
            return None;
        }
        let mut b = [0u8; REF_LEN];
        self.copy_to(&mut b);
        SpillRef::parse(&b)
    }
}

impl EntryRef<'_> {
    /// Length of the value in bytes.
    pub fn len(&self) -> usize {
        self.val_len
    }
    /// True if the value is empty.
    pub fn is_empty(&self) -> bool {
        self.val_len == 0
    }
    /// Whether the value is read from a spilled file (see `spill.rs`)
    /// rather than from shared memory.
    pub fn is_spilled(&self) -> bool {
        matches!(self.src, Src::Spilled(_))
    }
    /// The entry's flags word.
    pub fn flags(&self) -> u32 {
        self.flags
    }
    /// Absolute expiry in Unix milliseconds, 0 for never.
    pub fn expires_ms(&self) -> u64 {
        self.expires_ms
    }
    /// Copy the value into `dst`, which must be exactly `len()` bytes.
    pub fn copy_to(&self, dst: &mut [u8]) {
        assert_eq!(dst.len(), self.val_len, "destination has the wrong length");
        match self.src {
            // SAFETY: off..off+val_len was checked to lie inside the
            // arena's used part when this EntryRef was made; the mapping
            // lives as long as the guard it borrows. Without the lock the
            // bytes may change while they are copied: the copy is then
            // discarded.
            Src::Arena { guard, off } => unsafe {
                guard.shard.copy_out(off, dst.as_mut_ptr(), self.val_len)
            },
            // A failed read or checksum is recorded in the file: the cache
            // discards what was made from this copy.
            Src::Spilled(file) => file.read_into(dst),
            Src::Owned(data) => dst.copy_from_slice(data),
        }
    }
    /// Write the value to `w` in chunks (through a small buffer that stays
    /// in the CPU cache): for a destination that can grow without being
    /// zeroed first, such as a Python `bytes` writer, this is one pass over
    /// the value's memory instead of two. An error from `w` is returned; a
    /// spilled value that fails its checks is recorded as with
    /// [`EntryRef::copy_to`].
    pub fn write_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        match self.src {
            Src::Arena { guard, off } => {
                let mut buf = [0u8; 16 * 1024];
                let mut done = 0;
                while done < self.val_len {
                    let n = (self.val_len - done).min(buf.len());
                    // SAFETY: off..off+val_len lies inside the arena's used
                    // part (checked when this EntryRef was made); buf has n
                    // writable bytes.
                    unsafe { guard.shard.copy_out(off + done, buf.as_mut_ptr(), n) };
                    w.write_all(&buf[..n])?;
                    done += n;
                }
                Ok(())
            }
            Src::Spilled(file) => file.write_to(w),
            Src::Owned(data) => w.write_all(data),
        }
    }

    /// The value as a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.val_len];
        self.copy_to(&mut v);
        v
    }
}
