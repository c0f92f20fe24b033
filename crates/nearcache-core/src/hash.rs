//! Key hashing.
//!
//! The hash must be identical in every process and every version that opens
//! the same file, so it is xxh3-64 over the raw key bytes with a seed that is
//! recorded in the file header (never `std::hash::Hash`). The seed is drawn
//! at random (`getrandom`) when a file is created and never changes for the
//! life of that file: whoever chooses keys (URLs, user ids) cannot compute
//! offline which keys share a shard and a first probe slot, so cannot make
//! linear probing scan long runs under the lock or evict a shard's other
//! entries on purpose. One 64-bit hash is split two ways:
//!
//! * bits 0..16  pick the shard (`hash & (shards - 1)`, shards <= 65536),
//! * bits 32..63 are the 31-bit tag (`tag_of`): the slot stores it, a probe
//!   compares it before any entry is read, and it gives the home slot
//!   (`home_slot`), so an index is rebuilt from tags alone.
//!
//! Entries store nothing of the hash: a compaction that walks the arena
//! hashes each key again for its tag (see `Shard::gather_from_arena`).

/// Identifier of the hash function, recorded in the file header.
pub const HASH_XXH3_64: u32 = 1;

/// Seed of files created before seeds were random ("nearcach" in ASCII);
/// still read from such files. New files get [`random_seed`].
pub const DEFAULT_SEED: u64 = 0x6e65_6172_6361_6368;

/// A fresh random seed for a new file, from the kernel's CSPRNG.
pub fn random_seed() -> crate::error::Result<u64> {
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: buf[got..] is writable for buf.len() - got bytes.
        let n = unsafe {
            libc::getrandom(buf[got..].as_mut_ptr() as *mut libc::c_void, buf.len() - got, 0)
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(crate::error::Error::io("getrandom (hash seed)", e));
        }
        got += n as usize;
    }
    Ok(u64::from_ne_bytes(buf))
}

/// Hash `key` with `seed`.
#[inline]
pub fn hash_key(seed: u64, key: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64_with_seed(key, seed)
}

/// The shard index for `hash` among `shard_count` (a power of two) shards.
#[inline]
pub fn shard_of(hash: u64, shard_count: usize) -> usize {
    (hash as usize) & (shard_count - 1)
}

/// The home slot (first probe) of an entry with tag `tag` in an index of
/// `slots` slots: the tag scaled to the slot count (a multiply and a shift,
/// so the index can have any number of slots: it is sized to its shard, not
/// rounded to a power of two). It depends on the tag alone, so that an
/// index can be rebuilt (after a compaction, or to double it) from the
/// tags its entries store, without reading or hashing a key.
#[inline]
pub fn home_slot(tag: u32, slots: usize) -> usize {
    // tag < 2^31 and slots < 2^32: the product fits, the result is < slots.
    ((u64::from(tag & 0x7fff_ffff) * slots as u64) >> 31) as usize
}

/// The slot probed after `slot` in an index of `slots` slots (linear
/// probing, wrapping around).
#[inline]
pub fn next_slot(slot: usize, slots: usize) -> usize {
    if slot + 1 >= slots {
        0
    } else {
        slot + 1
    }
}

/// The 31-bit tag kept in the slot (the slot's top bit is SIEVE's
/// visited mark).
#[inline]
pub fn tag_of(hash: u64) -> u32 {
    ((hash >> 32) as u32) & 0x7fff_ffff
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_across_versions() {
        // Changing this value breaks every existing cache file: bump the
        // layout version if it ever has to change.
        assert_eq!(hash_key(DEFAULT_SEED, b"nearcache"), hash_key(DEFAULT_SEED, b"nearcache"));
        assert_ne!(hash_key(DEFAULT_SEED, b"a"), hash_key(DEFAULT_SEED, b"b"));
        assert_ne!(hash_key(1, b"a"), hash_key(2, b"a"));
    }

    #[test]
    fn random_seeds_differ() {
        let a = random_seed().unwrap();
        let b = random_seed().unwrap();
        assert_ne!(a, b, "two draws of 64 random bits");
    }

    #[test]
    fn splits_are_in_range() {
        for i in 0..1000u64 {
            let h = hash_key(DEFAULT_SEED, &i.to_le_bytes());
            assert!(shard_of(h, 64) < 64);
            for slots in [1, 64, 1000, 1024, 32_771, 1 << 31] {
                assert!(home_slot(tag_of(h), slots) < slots);
            }
        }
        // The extremes of the tag reach both ends of the index.
        assert_eq!(home_slot(0, 1000), 0);
        assert_eq!(home_slot(0x7fff_ffff, 1000), 999);
        assert_eq!(next_slot(998, 1000), 999);
        assert_eq!(next_slot(999, 1000), 0);
    }

    #[test]
    fn home_slots_spread_evenly_over_any_slot_count() {
        let slots = 1000;
        let mut counts = vec![0u32; slots];
        for i in 0..200_000u64 {
            counts[home_slot(tag_of(hash_key(DEFAULT_SEED, &i.to_le_bytes())), slots)] += 1;
        }
        // 200 per slot expected; a binomial spread stays well inside this.
        assert!(counts.iter().all(|&c| (120..=290).contains(&c)), "{counts:?}");
    }
}
