//! Fuzz a hostile writer: while this process has the cache mapped, another
//! party (here: a second mapping of the same file) overwrites arbitrary
//! bytes of the shards between operations.
//!
//! The engine must stay memory-safe and never panic: every offset and
//! length it reads from the file is checked, and a shard found inconsistent
//! is reset (its entries dropped). Reads of a damaged shard are misses or
//! values no larger than an entry may be; writes succeed. Values are not
//! checksummed by the engine (the Python layer signs them when the file is
//! shared with untrusted writers), so their contents are not checked here.
//!
//! The robust mutex words at the start of every shard are never poked: a
//! party that can write the file can always hold or break a lock (denial of
//! service), which is out of scope; see docs/reliability.md. The shard's
//! magic word is poked only by a dedicated step, which checks that the
//! shard then refuses service with `Error::Corrupt` (instead of locking a
//! mutex that may no longer be robust), and then puts the magic back, as
//! reopening the cache would.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nearcache_core::layout::{sh, HEADER_SIZE, SHARD_HEADER_SIZE, SHARD_MAGIC};
use nearcache_core::{Cache, Error, OpenOptions, Update, UpdateOptions};
use nearcache_fuzz::{scratch, value_for, Input};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

/// Bytes at the start of each shard that hold the lock word and its
/// padding (never poked: a word naming a live process costs a bounded
/// wait per operation, which would only slow the fuzzer down).
const MUTEX_BYTES: usize = 8;

struct Target {
    cache: Cache,
    raw: *mut u8,
    len: usize,
}

// SAFETY: the raw mapping is only used from the fuzzing thread.
unsafe impl Send for Target {}
// SAFETY: as above.
unsafe impl Sync for Target {}

fn target() -> &'static Target {
    static T: OnceLock<Target> = OnceLock::new();
    T.get_or_init(|| {
        let path = scratch().join("hostile");
        let opts = OpenOptions {
            size: Some(HEADER_SIZE + 2 * 16 * 1024),
            shards: 2,
            recreate: true,
            ..Default::default()
        };
        let cache = Cache::open(&path, &opts).expect("open scratch cache");
        let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
        let len = cache.capacity();
        // SAFETY: mapping a file we own, MAP_SHARED, its whole length; the
        // mapping lives (leaked) as long as the process.
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
        assert_ne!(p, libc::MAP_FAILED);
        Target { cache, raw: p as *mut u8, len }
    })
}

fn interesting(input: &mut Input<'_>, arena: usize) -> [u8; 8] {
    let v: u64 = match input.u8() % 10 {
        0 => 0,
        1 => 1,
        2 => u64::MAX,
        3 => arena as u64,
        4 => (arena as u64).wrapping_sub(8 * input.u8() as u64),
        5 => 8 * input.u16() as u64,
        6 => (input.u32() as u64) << 32 | (input.u8() as u64 + 1),
        7 => 0x8000_0000_0000_0000,
        _ => input.u64(),
    };
    v.to_ne_bytes()
}

fn poke(t: &Target, input: &mut Input<'_>) {
    let geo = *t.cache.geometry();
    let shard = input.u8() as usize % geo.shard_count;
    let base = HEADER_SIZE + shard * geo.shard_size;
    let index_len = geo.slots_per_shard * 8;
    let arena_off = geo.arena_offset();
    let table_len = geo.index_offset() - geo.segment_table_offset();
    let (start, span) = match input.u8() % 6 {
        0 => (MUTEX_BYTES, SHARD_HEADER_SIZE - MUTEX_BYTES),
        1 => (geo.index_offset(), index_len),
        2 => (arena_off, 512.min(geo.shard_size - arena_off)),
        // The segment table and the policy header after it.
        3 => (geo.segment_table_offset(), table_len),
        // The policy body: sketch and miniatures.
        4 => (geo.policy_body_offset(), geo.policy_size()),
        _ => (MUTEX_BYTES, geo.shard_size - MUTEX_BYTES),
    };
    let off = start + (input.u16() as usize % span);
    let bytes: Vec<u8> = if input.u8() & 1 == 0 {
        let aligned = off & !7;
        let v = interesting(input, geo.arena_size());
        let end = (aligned + 8).min(geo.shard_size);
        if aligned < MUTEX_BYTES {
            return;
        }
        write(t, base + aligned, &v[..end - aligned]);
        return;
    } else {
        let n = input.u8() as usize % 24;
        input.bytes(n).to_vec()
    };
    let n = bytes.len().min(geo.shard_size - off);
    write(t, base + off, &bytes[..n]);
}

/// Write `bytes` at file offset `at`, skipping every shard's magic word.
fn write(t: &Target, at: usize, bytes: &[u8]) {
    assert!(at + bytes.len() <= t.len);
    let geo = t.cache.geometry();
    for (i, &b) in bytes.iter().enumerate() {
        let pos = at + i;
        let in_shard = (pos - HEADER_SIZE) % geo.shard_size;
        if (sh::MAGIC..sh::MAGIC + 8).contains(&in_shard) {
            continue;
        }
        // SAFETY: inside our own MAP_SHARED mapping of the file.
        unsafe { *t.raw.add(pos) = b };
    }
}

/// Overwrite a shard's magic word: the shard must refuse service with
/// Error::Corrupt; then restore the magic (as a reopen would).
fn damage_magic(t: &Target, input: &mut Input<'_>) {
    let c = &t.cache;
    let geo = *c.geometry();
    let shard = input.u8() as usize % geo.shard_count;
    let at = HEADER_SIZE + shard * geo.shard_size + sh::MAGIC;
    let bad = input.u64();
    if bad == SHARD_MAGIC {
        return;
    }
    let key =
        (0u32..).map(|n| format!("m{n}")).find(|k| c.shard_index(k.as_bytes()) == shard).unwrap();
    // SAFETY: the magic word lies inside our own mapping of the file.
    unsafe { std::ptr::write_unaligned(t.raw.add(at) as *mut u64, bad) };
    assert!(matches!(c.get(key.as_bytes()), Err(Error::Corrupt(_))), "damaged shard served a get");
    assert!(
        matches!(c.set(key.as_bytes(), b"v", 0, 0), Err(Error::Corrupt(_))),
        "damaged shard took a set"
    );
    // SAFETY: as above.
    unsafe { std::ptr::write_unaligned(t.raw.add(at) as *mut u64, SHARD_MAGIC) };
}

fn op(c: &Cache, input: &mut Input<'_>) {
    let key = [b'k', input.u8() % 40];
    match input.u8() % 14 {
        0 | 1 => {
            if let Some(v) = c.get(&key).expect("get") {
                assert!(v.data.len() <= c.max_entry_size());
            }
        }
        2 | 3 => {
            let len = input.u8() as usize * 8;
            c.set(&key, &value_for(&key, input.u8(), len), 0, 0).expect("set");
        }
        4 => {
            c.delete(&key).expect("delete");
        }
        5 => match c.incr(&key, input.u8() as i64, Some(0), 0) {
            Ok(_) | Err(Error::NotACounter) | Err(Error::Overflow) => {}
            Err(e) => panic!("incr: {e}"),
        },
        6 => {
            let ks: Vec<[u8; 2]> = (0..input.u8() % 8).map(|_| [b'k', input.u8() % 40]).collect();
            c.get_many(&ks).expect("get_many");
        }
        7 => {
            let items: Vec<([u8; 2], Vec<u8>, u32)> = (0..input.u8() % 6)
                .map(|_| {
                    let k = [b'k', input.u8() % 40];
                    (k, value_for(&k, 1, input.u8() as usize), 0)
                })
                .collect();
            c.set_many(&items, 0).expect("set_many");
        }
        8 => {
            c.keys().expect("keys");
            c.stats().expect("stats");
        }
        9 => {
            let _ = c.check();
        }
        10 => {
            c.touch(&key, input.u8() as u64).expect("touch");
            c.pop(&key).expect("pop");
        }
        11 => {
            let _ = c.add(&key, b"added", 0, 0).expect("add");
            let _ = c.replace(&key, b"replaced", 0, 0).expect("replace");
        }
        // Versions read from a scribbled shard (its seq and slots are the
        // attacker's) may make a CAS fail or store wrongly, never unsafe.
        12 => {
            let version = match input.u8() % 3 {
                0 => c.get_versioned(&key).expect("get_versioned").map_or(0, |(_, v)| v),
                1 => c.version(&key).expect("version"),
                _ => input.u64(),
            };
            let len = input.u8() as usize * 4;
            c.cas(&key, &value_for(&key, input.u8(), len), 0, 0, version).expect("cas");
            c.delete_if_version(&key, version).expect("delete_if_version");
        }
        _ => {
            let opts = UpdateOptions { ttl_ms: 0, max_conflicts: 3 };
            match c.update(&key, |e| Update::Set(e.map_or(vec![1], |e| e.to_vec()), 0), &opts) {
                Ok(_) | Err(Error::TooManyConflicts { .. }) => {}
                Err(e) => panic!("update: {e}"),
            }
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let t = target();
    let c = &t.cache;
    c.clear().unwrap();
    for i in 0..30u8 {
        let key = [b'k', i];
        c.set(&key, &value_for(&key, i, i as usize * 9), 0, 0).unwrap();
    }
    let mut input = Input::new(data);
    let mut steps = 0;
    while !input.is_empty() && steps < 1000 {
        let choice = input.u8();
        if choice == 255 {
            damage_magic(t, &mut input);
        } else if choice % 3 == 0 {
            poke(t, &mut input);
        } else {
            op(c, &mut input);
        }
        steps += 1;
    }
    // Recovery: a write to every shard, then clear(): the file is sound again.
    for s in 0..c.shard_count() {
        let key =
            (0u32..).map(|n| format!("s{n}")).find(|k| c.shard_index(k.as_bytes()) == s).unwrap();
        c.set(key.as_bytes(), b"x", 0, 0).unwrap();
    }
    c.clear().unwrap();
    if let Err(e) = c.check() {
        panic!("check after recovery: {e}");
    }
});
