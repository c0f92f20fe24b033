//! Fuzz operations while another party rewrites the file *concurrently*.
//!
//! `hostile` changes the file between operations; this target runs a
//! background thread that keeps writing words (mostly plausible ones: small
//! counts, aligned offsets inside the arena, slot-shaped values) into shard
//! headers, index slots and arenas of two caches, one with small shards and
//! one with a large shard, *while* the fuzzer's operations run on them. This
//! is the class of bug a check-then-use of a shared word has (read once to
//! check, read again to use): the bump pointer double fetch in `insert`
//! wrote past the arena under exactly this load.
//!
//! Operations must not crash or panic; they may fail with `Error::Corrupt`
//! (a shard found inconsistent is reset) and reads may return values no
//! longer than an entry may be. The lock words and shard magics are left
//! alone (their defences are tested by dedicated tests). Faults of the
//! process around the engine (no-grace sweeps racing spills, lone
//! re-opens, zombie lock holders, a `chdir` after a relative open,
//! descriptor exhaustion) run in `lifecycle`, without a scribbler, where
//! every read can be held to the model of what was acknowledged.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nearcache_core::layout::{sh, Geometry, HEADER_SIZE, SHARD_HEADER_SIZE};
use nearcache_core::{Cache, Error, OpenOptions, Update, UpdateOptions};
use nearcache_fuzz::{scratch, value_for, Input};
use std::os::fd::AsRawFd;
use std::sync::OnceLock;

struct Target {
    cache: Cache,
}

struct Raw {
    ptr: usize,
    geo: Geometry,
}

fn open(name: &str, size: usize, shards: usize) -> (Target, Raw) {
    let path = scratch().join(name);
    let opts = OpenOptions { size: Some(size), shards, recreate: true, ..Default::default() };
    let cache = Cache::open(&path, &opts).expect("open scratch cache");
    let file = std::fs::OpenOptions::new().read(true).write(true).open(&path).unwrap();
    // SAFETY: mapping a file we own, MAP_SHARED, its whole length; leaked
    // for the life of the process.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            cache.capacity(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let geo = *cache.geometry();
    (Target { cache }, Raw { ptr: p as usize, geo })
}

fn targets() -> &'static [Target; 2] {
    static T: OnceLock<[Target; 2]> = OnceLock::new();
    T.get_or_init(|| {
        let (small, raw_small) = open("concurrent-small", HEADER_SIZE + 4 * 16 * 1024, 4);
        let (large, raw_large) = open("concurrent-large", HEADER_SIZE + 4 * 1024 * 1024, 1);
        std::thread::spawn(move || scribble(&[raw_small, raw_large]));
        [small, large]
    })
}

/// The background writer: never stops (the fuzzing process exits).
fn scribble(raws: &[Raw]) {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    loop {
        for raw in raws {
            let g = &raw.geo;
            let shard = (next() as usize) % g.shard_count;
            let base = HEADER_SIZE + shard * g.shard_size;
            let off = match next() % 5 {
                0 => 8 + 8 * (next() as usize % ((SHARD_HEADER_SIZE - 8) / 8)),
                1 => g.index_offset() + 8 * (next() as usize % g.slots_per_shard),
                2 => g.segment_table_offset() + 8 * (next() as usize % g.segments().0),
                3 => g.policy_body_offset() + 8 * (next() as usize % (g.policy_size() / 8)),
                _ => g.arena_offset() + 8 * (next() as usize % (g.arena_size() / 8)),
            };
            if off == sh::MAGIC {
                continue;
            }
            let arena = g.arena_size() as u64;
            let v = match next() % 6 {
                0 => 0,
                1 => next() % 64,
                2 => (next() % (arena + 64)) & !7,
                3 => (next() << 32) | (next() % (arena / 8 + 2)),
                4 => u64::MAX - next() % 4,
                _ => next(),
            };
            // SAFETY: an aligned word inside our own MAP_SHARED mapping.
            unsafe { std::ptr::write_volatile((raw.ptr + base + off) as *mut u64, v) };
        }
        std::thread::yield_now();
    }
}

fn ok<T>(r: Result<T, Error>, what: &str) {
    match r {
        Ok(_) | Err(Error::Corrupt(_)) => {}
        Err(Error::NotACounter) | Err(Error::Overflow) => {}
        // Shards reset under the scribbler drop spilled entries without
        // reading their references; their files stay counted against the
        // spill budget until a sweep finds them orphaned (older than the
        // sweep's grace, minutes), so a spilling set may be refused as
        // full meanwhile: a clear error that changes nothing.
        Err(Error::Full(_)) => {}
        // A CAS loop on a shard the scribbler keeps changing may lose every
        // attempt: bounded, then this clear error.
        Err(Error::TooManyConflicts { .. }) => {}
        Err(e) => panic!("{what}: unexpected error under concurrent scribbling: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let t = &targets()[(input.u8() & 1) as usize];
    let c = &t.cache;
    let max_value = (c.max_entry_size() / 4).min(256 * 1024);
    while !input.is_empty() {
        let key = [b'k', input.u8() % 64];
        match input.u8() % 9 {
            0 | 1 => ok(
                c.get(&key).map(|v| {
                    if let Some(v) = v {
                        assert!(v.data.len() <= c.max_entry_size());
                    }
                }),
                "get",
            ),
            2 | 3 => {
                let len = (input.u16() as usize * 8) % max_value;
                ok(c.set(&key, &value_for(&key, input.u8(), len), 0, 0), "set");
            }
            4 => ok(c.delete(&key), "delete"),
            5 => ok(c.incr(&key, input.u8() as i64, Some(0), 0), "incr"),
            6 => {
                let items: Vec<([u8; 2], Vec<u8>, u32)> = (0..input.u8() % 6)
                    .map(|_| {
                        let k = [b'k', input.u8() % 64];
                        (k, value_for(&k, 1, input.u8() as usize * 4), 0)
                    })
                    .collect();
                ok(c.set_many(&items, 0), "set_many");
            }
            7 => {
                // A CAS loop: versions read while the scribbler rewrites the
                // shard's seq and slots.
                let opts = UpdateOptions { ttl_ms: 0, max_conflicts: 4 };
                let grow = input.u8() as usize;
                let r = c.update(
                    &key,
                    |e| {
                        let mut v = e.map_or_else(Vec::new, |e| e.to_vec());
                        v.truncate(max_value.saturating_sub(grow));
                        v.extend(std::iter::repeat_n(b'+', grow));
                        Update::Set(v, 0)
                    },
                    &opts,
                );
                ok(r, "update");
                let version = input.u64();
                ok(c.cas(&key, b"cas", 0, 0, version), "cas");
            }
            _ => {
                let ks: Vec<[u8; 2]> =
                    (0..input.u8() % 8).map(|_| [b'k', input.u8() % 64]).collect();
                ok(c.get_many(&ks), "get_many");
                ok(c.stats(), "stats");
            }
        }
    }
});
