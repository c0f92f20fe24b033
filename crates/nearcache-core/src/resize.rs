//! Resizing a live cache: a new file of the new geometry, entries moved
//! into it shard by shard while every process keeps working, then an
//! atomic switch that every attached process follows.
//!
//! The record (in the old file's header, `layout::fh`):
//! * `MIGRATION`, one u64 `id << 2 | state`: none, migrating (to the file
//!   `<path>.resize-<id in hex>` beside the cache), moved (that file was
//!   renamed over the cache's path). One compare-and-swap from none to
//!   migrating decides between concurrent resizers; the loser adopts the
//!   winner's result. The new file's name is derived from the id (16 hex
//!   digits after the cache's own name), never read from the file, so a
//!   hostile record cannot name a path outside the cache's directory.
//! * `MOVED`, a bitmap of shard groups already copied (shard `i` in group
//!   `i % groups`; the group count is in the low 5 bits of the id, see
//!   [`groups_for`]).
//!
//! Every operation loads `MIGRATION` (a word that only resizes write, so
//! the load stays a shared read; one relaxed load, see `Cache::keyed`) and
//! takes the slow path only when it is not zero (or the call failed): a key
//! whose group is marked moved goes to the new file, any other to the old
//! one.
//!
//! The new file keeps the old file's hash seed, so the keys of one group
//! go to the same few new shards (those of a grow's old shard, or the one
//! new shard a shrink's group feeds), and only there.
//!
//! Moving a group: lock its shards in the old file (so no writer is inside
//! them), copy their live entries (a spilled value's reference: its file
//! stays where it is, in the spill directory named after the cache's path,
//! which both files share) into the new file oldest first (each shard's
//! arena is in write order; the shards of a group are merged by rank), and
//! only the newest that fit the group's share of the new file (on a shrink
//! the most recently written entries survive across all shards, not the
//! last shards copied, and the new arenas keep the order for the next
//! resize); then seal each shard (`seq` left
//! odd for good, so an optimistic get that overlapped the copy retries,
//! and one that starts later falls back to the lock), set the group's
//! moved bit, and unlock. Lockers check the seal and the bit under the
//! lock (`Store::check_not_moved`) and go to the new file; a pause is one
//! group's copy, never the whole file's.
//!
//! When every group is moved the new file is marked complete (its spill
//! sweeps were held off until then: the old file's unmoved shards named
//! files the new one did not know), renamed over the cache's path (atomic:
//! an opener gets the old file, and follows the record, or the new one),
//! and the record set to moved. A process sees that at its next operation,
//! opens the path, and retires the old mapping (`Mapping::retire`: zero
//! pages in place, the descriptor pointed at /dev/null), so the old file's
//! memory is freed once the last process has followed.
//!
//! Ownership and kills: the resizer holds an exclusive `flock` on the new
//! file for the whole move. A process that finds the record migrating and
//! can take that lock knows the resizer died, and finishes the move
//! itself (groups already moved are skipped; a shard whose lock the dead
//! resizer held is repaired by the robust lock, and its bit decides).
//! Until then unmoved shards work in the old file and moved ones in the
//! new, so a dead resizer blocks nothing. If the new file is gone, its
//! resizer renamed it over the path (nothing else removes it while the
//! record names it): the record is set to moved and the process follows
//! the path, whatever file it names by then (a later resize of the new
//! file may have replaced it already). Only if the path still names the
//! old file itself (a record no resize of ours could leave) is the record
//! reset and the sealed shards emptied: entries are lost, never served
//! from two files.

use crate::cache::{header_word, Store};
use crate::error::{Error, Result};
use crate::file::Mapping;
use crate::layout::{entry_size, fh, Geometry, FLAG_SPILLED};
use crate::shard::Now;
use crate::spill::SpillRef;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// `fh::MIGRATION` states (its low two bits).
pub(crate) const MIGRATING: u64 = 1;
pub(crate) const MOVED: u64 = 2;

/// A decoded migration record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Record {
    None,
    Migrating(u64),
    Moved(u64),
    /// A state no engine writes (or a zero id): corrupt.
    Corrupt,
}

pub(crate) fn decode(word: u64) -> Record {
    let id = word >> 2;
    match (word & 3, id) {
        (0, 0) => Record::None,
        (MIGRATING, id) if id != 0 => Record::Migrating(id),
        (MOVED, id) if id != 0 => Record::Moved(id),
        _ => Record::Corrupt,
    }
}

/// Bytes of entries a new file of geometry `g` takes from a resize: 85%
/// of its arenas, so that the first writes after the move do not evict
/// what it just copied (a compaction frees 40%).
pub(crate) fn move_budget(g: &Geometry) -> u64 {
    (g.shard_count as u64 * g.arena_size() as u64) / 100 * 85
}

/// The word of the moved bitmap holding group `g`.
fn bitmap_word(m: &Mapping, g: usize) -> &std::sync::atomic::AtomicU64 {
    header_word(m, fh::MOVED + (g % fh::MOVE_GROUPS) / 64 * 8)
}

/// Whether group `g` is marked moved.
pub(crate) fn moved_bit(m: &Mapping, g: usize) -> bool {
    bitmap_word(m, g).load(Ordering::Acquire) & (1 << (g % 64)) != 0
}

fn set_moved_bit(m: &Mapping, g: usize) {
    bitmap_word(m, g).fetch_or(1 << (g % 64), Ordering::SeqCst);
}

/// A process attached alone (no migration can be under way) found the
/// record none: a moved bit left in it (a hostile or damaged file) is
/// cleared, so that the next migration does not skip those groups.
pub(crate) fn clear_stray_bits(m: &Mapping) {
    if header_word(m, fh::MIGRATION).load(Ordering::SeqCst) == 0 {
        for w in 0..fh::MOVE_GROUPS / 64 {
            header_word(m, fh::MOVED + w * 8).store(0, Ordering::SeqCst);
        }
    }
}

/// Whether spill sweeps must wait: a migration is under way from this file
/// (or its record is corrupt), or this file is still being filled by one.
pub(crate) fn sweeps_paused(m: &Mapping) -> bool {
    header_word(m, fh::MIGRATION).load(Ordering::Acquire) & 3 != 0
        || header_word(m, fh::MIG_FILLING).load(Ordering::Acquire) != 0
}

/// The new file of migration `id` of the cache at `path`: a name derived
/// from the id alone, in the cache's directory.
pub(crate) fn temp_path(path: &Path, id: u64) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".resize-{id:016x}"));
    PathBuf::from(name)
}

/// A fresh migration id for a move in `groups` groups (a power of two up
/// to `fh::MOVE_GROUPS`): 57 random bits (never all zero), then the log2
/// of the group count in the low 5 bits, so that every process reads the
/// grouping with the record.
pub(crate) fn new_id(groups: usize) -> Result<u64> {
    let random = (crate::hash::random_seed()? >> 7).max(1);
    Ok(random << 5 | groups.trailing_zeros() as u64)
}

/// The group count migration `id` moves shards in (see [`new_id`]).
pub(crate) fn groups_of(id: u64) -> usize {
    1 << (id & 31)
}

/// In how many groups shards move from a file of `old` shards to one of
/// `new` (both powers of two): the group of shard `i` is `i % groups`.
/// The hash seed is kept, so the keys of old shard `i` go to the new
/// shards `j` with `j % old == i` (a grow) or to new shard `i % new` (a
/// shrink). One old shard per group (up to the bitmap's 1,024 bits) on a
/// grow; on a shrink, the old shards that feed one new shard form a group
/// (their entries merge in recency order), but never more than
/// [`MAX_GROUP`] of them (a group is locked whole while it moves: the
/// pause stays bounded).
pub(crate) fn groups_for(old: usize, new: usize) -> usize {
    let mut g = old.min(fh::MOVE_GROUPS);
    if new < g {
        g = new.max(old / MAX_GROUP).min(fh::MOVE_GROUPS);
    }
    g.max(1)
}

/// Most old shards moved under one lock hold (see [`groups_for`]).
pub(crate) const MAX_GROUP: usize = 4;

/// Who holds the resizer's lock of a migration's new file.
pub(crate) enum Owner {
    /// We hold it now: the resizer is dead (or it is us, starting).
    Taken(File),
    /// A live resizer holds it.
    Busy,
    /// The file is gone (renamed over the path, or removed).
    Gone,
}

/// Try to take the exclusive `flock` of the resizer on the new file
/// `temp`, through a descriptor of its own (a lock is per open file
/// description, so another thread of the resizer's own process is refused
/// too).
pub(crate) fn take_owner(temp: &Path) -> Result<Owner> {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(temp.as_os_str()))
        .map_err(|_| Error::InvalidArgument(format!("path {temp:?} contains a NUL byte")))?;
    // SAFETY: c is a valid NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC) };
    if fd < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENOENT) {
            return Ok(Owner::Gone);
        }
        return Err(Error::io(format!("open {}", temp.display()), e));
    }
    // SAFETY: a fresh descriptor we own.
    let f = unsafe { File::from_raw_fd(fd) };
    // SAFETY: f is open; the lock goes with its description.
    if unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        Ok(Owner::Taken(f))
    } else {
        Ok(Owner::Busy)
    }
}

/// Test hook: `NEARCACHE_DEBUG_RESIZE_ABORT_AT=N` makes the resizing
/// process abort at step N of a migration (1: new file made, 2: record
/// published, 3..: after each group moved, before its locks are released,
/// then: new file complete, renamed, record moved). Read once per move.
pub(crate) fn abort_step() -> u64 {
    std::env::var("NEARCACHE_DEBUG_RESIZE_ABORT_AT").ok().and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Test hook: `NEARCACHE_DEBUG_RESIZE_PAUSE_MS=N` makes a resizer sleep N
/// ms after each group it moves (a slow resizer, for tests of processes
/// that meet a migration under way).
fn pause_per_group() -> Option<std::time::Duration> {
    std::env::var("NEARCACHE_DEBUG_RESIZE_PAUSE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis)
}

/// Abort here if the test hook asks for step `n`.
pub(crate) fn step(at: u64, n: u64) {
    if at != 0 && at == n {
        std::process::abort();
    }
}

/// A new file no record names is left to its maker this long (it takes its
/// lock and publishes its record within moments of making the file) before
/// [`remove_stale`] takes it for the leftover of a killed resizer.
pub(crate) const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// Remove new files of migrations that never published their record (a
/// resizer killed between making the file and the compare-and-swap, or
/// the loser of one that died before removing its file): any
/// `<name>.resize-<hex>` beside the cache that is not the migration
/// `record` names, unchanged for [`STALE_AFTER`], and whose resizer's lock
/// is free.
pub(crate) fn remove_stale(path: &Path, record: u64) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else { return };
    let Ok(list) = std::fs::read_dir(dir) else { return };
    let mut prefix = name.to_owned();
    prefix.push(".resize-");
    let prefix = prefix.as_encoded_bytes().to_vec();
    for e in list.flatten() {
        let n = e.file_name();
        let b = n.as_encoded_bytes();
        let Some(hex) = b.strip_prefix(prefix.as_slice()) else { continue };
        let Some(id) = std::str::from_utf8(hex).ok().and_then(|h| u64::from_str_radix(h, 16).ok())
        else {
            continue;
        };
        if hex.len() != 16 || matches!(decode(record), Record::Migrating(i) if i == id) {
            continue;
        }
        let temp = temp_path(path, id);
        let age = std::fs::symlink_metadata(&temp)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok());
        if !age.is_some_and(|a| a >= STALE_AFTER) {
            continue;
        }
        if let Ok(Owner::Taken(_lock)) = take_owner(&temp) {
            let _ = std::fs::remove_file(&temp);
        }
    }
}

/// Publish migration `id` in `old`'s record. False: another resize's
/// record (or a corrupt one) is there.
pub(crate) fn publish(old: &Store, id: u64) -> bool {
    header_word(old.mapping(), fh::MIGRATION)
        .compare_exchange(0, id << 2 | MIGRATING, Ordering::SeqCst, Ordering::SeqCst)
        .is_ok()
}

/// Lock every shard of group `g` of `old`, in index order. A shard whose
/// header is damaged cannot be locked, nor read: it is left out (its group
/// bit still sends its keys to the new file). A lock held too long by a
/// live process: retried a few times, then the error.
fn lock_group<'a>(
    old: &'a Store,
    g: usize,
    groups: usize,
) -> Result<Vec<crate::shard::ShardGuard<'a>>> {
    let shards = old.shard_slice();
    let mut tries = 0;
    'again: loop {
        let mut guards = Vec::new();
        for s in shards.iter().skip(g).step_by(groups) {
            match s.lock(old.lock_timeout()) {
                Ok(gd) => guards.push(gd),
                Err(Error::Corrupt(_)) => {}
                Err(e @ Error::LockTimeout { .. }) => {
                    drop(guards);
                    tries += 1;
                    if tries >= 4 {
                        return Err(e);
                    }
                    continue 'again;
                }
                Err(e) => return Err(e),
            }
        }
        return Ok(guards);
    }
}

/// One live entry being moved: key, value (or spill reference), raw flags,
/// expiry.
type Moving = (Vec<u8>, Vec<u8>, u32, u64);

/// Move every group of `old` not yet moved into `new` (migration `id`),
/// then complete the migration: the new file marked filled, renamed from
/// `temp` over `path`, the record set to moved. The caller holds the
/// resizer's lock on `temp`. Idempotent: a process finishing the move of a
/// dead resizer runs it again.
pub(crate) fn drive(old: &Store, new: &Store, id: u64, path: &Path, temp: &Path) -> Result<()> {
    let at = abort_step();
    let pause = pause_per_group();
    let groups = groups_of(id).min(old.shard_slice().len());
    // Each group's share of the new file, in entry bytes: the new shards
    // its keys go to (the seed is kept), 85% full.
    let share = move_budget(new.geometry()) / groups as u64;
    let mut now = Now::new();
    for g in 0..groups {
        if moved_bit(old.mapping(), g) {
            continue;
        }
        let guards = lock_group(old, g, groups)?;
        // Every live entry of the group's shards with its rank in its
        // shard's arena (0 oldest, 1 newest): merged by rank, the shards'
        // arenas make one order from oldest to newest.
        let mut entries: Vec<(f64, Moving)> = Vec::new();
        for gd in &guards {
            let mut one: Vec<Moving> = Vec::new();
            gd.for_each_live_raw(&mut now, |k, v, f, e| one.push((k.to_vec(), v.to_vec(), f, e)));
            let n = one.len().max(1) as f64;
            entries.extend(one.into_iter().enumerate().map(|(i, m)| ((i + 1) as f64 / n, m)));
        }
        entries.sort_by(|a, b| a.0.total_cmp(&b.0));
        // The newest entries whose sizes fit the share: walk from the
        // newest back, then copy oldest first (the new arenas keep the
        // order).
        let mut used = 0u64;
        let mut first = entries.len();
        while first > 0 {
            let (k, v, _, _) = &entries[first - 1].1;
            let size = entry_size(k.len(), v.len()) as u64;
            if used + size > share {
                break;
            }
            used += size;
            first -= 1;
        }
        let kept: Vec<(&[u8], &[u8], u32, u64)> = entries[first..]
            .iter()
            .map(|(_, (k, v, f, e))| (k.as_slice(), v.as_slice(), *f, *e))
            .collect();
        let stored = new.put_moved(&kept);
        let (mut spilled_bytes, mut spilled_n) = (0u64, 0u64);
        let mut dropped: Vec<SpillRef> = Vec::new();
        for (i, (_, (_, v, f, _))) in entries.iter().enumerate() {
            let r = if f & FLAG_SPILLED != 0 { SpillRef::parse(v) } else { None };
            let stored = i >= first && stored[i - first];
            match (r, stored) {
                (Some(r), true) => {
                    spilled_bytes += r.len;
                    spilled_n += 1;
                }
                (Some(r), false) => dropped.push(r),
                _ => {}
            }
        }
        for gd in &guards {
            gd.seal_moved();
        }
        set_moved_bit(old.mapping(), g);
        step(at, 3 + g as u64);
        drop(guards);
        if let Some(p) = pause {
            std::thread::sleep(p);
        }
        new.count_moved_spills(spilled_bytes, spilled_n);
        if let Some(dir) = old.spill_dir_if_any() {
            for r in dropped {
                dir.remove(r.id);
            }
        }
    }
    let mut n = 3 + groups as u64;
    header_word(new.mapping(), fh::MIG_FILLING).store(0, Ordering::SeqCst);
    step(at, n);
    n += 1;
    std::fs::rename(temp, path)
        .map_err(|e| Error::io(format!("rename {} to {}", temp.display(), path.display()), e))?;
    step(at, n);
    n += 1;
    finish_record(old, id);
    step(at, n);
    Ok(())
}

/// Set `old`'s record from migrating `id` to moved (the new file has its
/// path). Idempotent.
pub(crate) fn finish_record(old: &Store, id: u64) {
    let _ = header_word(old.mapping(), fh::MIGRATION).compare_exchange(
        id << 2 | MIGRATING,
        id << 2 | MOVED,
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
}

/// Reset `old`'s record, found as `word`, to none: a corrupt record, a
/// migration whose new file is gone, or (`word` 0) shards found sealed
/// with no migration recorded. Sealed shards are emptied (what was moved
/// out of them is lost with the new file), each under its lock and only
/// while the record still reads `word` (a migration that starts meanwhile
/// seals a shard under the same lock, after); then, for a record that is
/// not none (no migration can publish over it meanwhile), the bitmap is
/// cleared and the record set to none if it still reads `word`.
pub(crate) fn reset_record(old: &Store, word: u64) -> Result<()> {
    let rec = header_word(old.mapping(), fh::MIGRATION);
    for s in old.shard_slice() {
        if rec.load(Ordering::SeqCst) != word {
            return Ok(());
        }
        match s.lock(old.lock_timeout()) {
            Ok(g) => {
                if g.is_sealed() && rec.load(Ordering::SeqCst) == word {
                    g.reset_sealed();
                }
            }
            Err(Error::Corrupt(_)) => {}
            Err(e) => return Err(e),
        }
    }
    if word == 0 || rec.load(Ordering::SeqCst) != word {
        return Ok(());
    }
    for w in 0..fh::MOVE_GROUPS / 64 {
        header_word(old.mapping(), fh::MOVED + w * 8).store(0, Ordering::SeqCst);
    }
    let _ = rec.compare_exchange(word, 0, Ordering::SeqCst, Ordering::SeqCst);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_decode_strictly() {
        assert_eq!(decode(0), Record::None);
        assert_eq!(decode(7 << 2 | MIGRATING), Record::Migrating(7));
        assert_eq!(decode(7 << 2 | MOVED), Record::Moved(7));
        assert_eq!(decode(3), Record::Corrupt);
        assert_eq!(decode(MIGRATING), Record::Corrupt);
        assert_eq!(decode(MOVED), Record::Corrupt);
        assert_eq!(decode(5 << 2), Record::Corrupt);
        assert_eq!(decode(u64::MAX), Record::Corrupt);
    }

    #[test]
    fn groups_keep_the_bitmap_and_the_pause_bounded() {
        assert_eq!(groups_for(4, 8), 4);
        assert_eq!(groups_for(4096, 8192), 1024);
        assert_eq!(groups_for(512, 128), 128);
        assert_eq!(groups_for(512, 1), 128);
        assert_eq!(groups_for(1, 1), 1);
        for g in [1, 2, 64, 1024] {
            assert_eq!(groups_of(new_id(g).unwrap()), g);
        }
    }

    #[test]
    fn temporary_names_stay_beside_the_cache() {
        let p = Path::new("/some/dir/cache");
        for id in [1, u64::MAX >> 2, 0x2f2e2e2f, new_id(1024).unwrap()] {
            let t = temp_path(p, id);
            assert_eq!(t.parent(), p.parent());
            let name = t.file_name().unwrap().to_str().unwrap();
            assert!(name.starts_with("cache.resize-"));
            assert!(name["cache.resize-".len()..].bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }
}
