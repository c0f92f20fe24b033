//! Fuzz the file-open path: whatever the bytes of the file, opening it
//! either fails with an error or yields a cache on which every operation
//! works, and `recreate` always recovers a usable cache.
//!
//! The first input byte picks how the file is built:
//! * 0: the raw input bytes are the whole file;
//! * 1: a header with a valid magic, version and checksum but fuzzed
//!   geometry fields, followed by fuzzed shard bytes;
//! * 2: a genuine cache file holding entries, with fuzzed patches anywhere
//!   (optionally re-checksumming the header so the patch gets past it).
//!
//! Properties: no panic, no crash, no hang; an opened cache serves get/set/
//! delete/incr/keys/stats/check without panicking; after a write and a
//! `clear()` every shard passes `check()`; opening with `recreate` and a
//! size always succeeds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nearcache_core::hash::HASH_XXH3_64;
use nearcache_core::layout::{fh, HEADER_SIZE, LAYOUT_VERSION, MAGIC};
use nearcache_core::{Cache, Error, OpenOptions};
use nearcache_fuzz::{scratch, value_for, Input};
use std::os::unix::fs::FileExt;

const GENUINE_SIZE: usize = HEADER_SIZE + 2 * 16 * 1024;
/// Largest file this target creates (keeps each run fast).
const MAX_FILE: u64 = 4 << 20;

fn put(buf: &mut [u8], off: usize, bytes: &[u8]) {
    buf[off..off + bytes.len()].copy_from_slice(bytes);
}

fn fix_checksum(header: &mut [u8]) {
    let sum = nearcache_core::layout::header_checksum(header);
    put(header, fh::CHECKSUM, &sum.to_ne_bytes());
}

fn exercise(c: &Cache) {
    for i in 0..12u8 {
        let key = [b'k', i];
        // Reads of a damaged shard are misses (the shard is reset), never errors.
        let got = c.get(&key).expect("get on an opened cache");
        if let Some(v) = got {
            assert!(v.data.len() <= c.max_entry_size());
        }
    }
    c.set(b"fresh", b"value", 0, 0).expect("set on an opened cache");
    let _ = c.delete(b"k\x01").expect("delete");
    match c.incr(b"k\x02", 1, Some(0), 0) {
        Ok(_) | Err(Error::NotACounter) | Err(Error::Overflow) => {}
        Err(e) => panic!("incr: {e}"),
    }
    let _ = c.keys().expect("keys");
    let _ = c.stats().expect("stats");
    let _ = c.check();
    // A write leaves every touched shard consistent; clear() resets every
    // shard, and then the whole file must pass its check.
    c.set(b"fresh", b"again", 0, 0).expect("set");
    c.clear().expect("clear");
    for s in 0..c.shard_count() {
        // One write per shard so that every shard has completed a write
        // since it was (maybe) repaired.
        let mut n = 0u32;
        loop {
            let key = format!("s{n}");
            if c.shard_index(key.as_bytes()) == s {
                c.set(key.as_bytes(), b"x", 0, 0).expect("set");
                break;
            }
            n += 1;
        }
    }
    c.clear().expect("clear");
    if let Err(e) = c.check() {
        panic!("check after clear: {e}");
    }
}

fn build_file(input: &mut Input<'_>, path: &std::path::Path) -> Option<()> {
    let _ = std::fs::remove_file(path);
    match input.u8() % 3 {
        0 => {
            std::fs::write(path, input.rest()).ok()?;
        }
        1 => {
            let mut header = vec![0u8; HEADER_SIZE];
            put(&mut header, fh::MAGIC, &MAGIC);
            put(&mut header, fh::VERSION, &LAYOUT_VERSION.to_ne_bytes());
            put(&mut header, fh::HASH_ID, &HASH_XXH3_64.to_ne_bytes());
            put(&mut header, fh::SEED, &input.u64().to_ne_bytes());
            let shard_count = 1u32 << (input.u8() % 20);
            let shard_count = if input.u8() == 0 { input.u32() } else { shard_count };
            put(&mut header, fh::SHARD_COUNT, &shard_count.to_ne_bytes());
            put(&mut header, fh::HEADER_SIZE, &(HEADER_SIZE as u32).to_ne_bytes());
            let shard_size = (input.u16() as u64) * 4096;
            let shard_size = if input.u8() == 0 { input.u64() } else { shard_size };
            put(&mut header, fh::SHARD_SIZE, &shard_size.to_ne_bytes());
            // Any multiple of 8 is a valid slot count (layout version 5).
            let slots = match input.u8() % 3 {
                0 => 1u64 << (input.u8() % 40),
                1 => 8 * u64::from(input.u32() % (1 << 24)),
                _ => input.u64(),
            };
            put(&mut header, fh::SLOTS, &slots.to_ne_bytes());
            let total = (shard_count as u64)
                .checked_mul(shard_size)
                .and_then(|b| b.checked_add(HEADER_SIZE as u64))
                .unwrap_or(u64::MAX);
            let total_field = if input.u8() == 0 { input.u64() } else { total };
            put(&mut header, fh::TOTAL_SIZE, &total_field.to_ne_bytes());
            // Lazy or preallocated (or neither: refused).
            header[fh::LAZY] = input.u8() % 3;
            fix_checksum(&mut header);
            header[fh::READY] = input.u8() | 1;
            let len = if input.u8() == 0 { input.u32() as u64 } else { total };
            if len > MAX_FILE {
                return None;
            }
            let f = std::fs::File::create(path).ok()?;
            f.set_len(len).ok()?;
            let head = &header[..HEADER_SIZE.min(len as usize)];
            f.write_all_at(head, 0).ok()?;
            // Fuzzed shard bytes, repeated over the first shard(s).
            let body = input.rest();
            if !body.is_empty() && len > HEADER_SIZE as u64 {
                let mut off = HEADER_SIZE as u64;
                let end = len.min(HEADER_SIZE as u64 + 64 * 1024);
                while off < end {
                    let n = body.len().min((end - off) as usize);
                    f.write_all_at(&body[..n], off).ok()?;
                    off += n as u64;
                }
            }
        }
        _ => {
            let opts = OpenOptions { size: Some(GENUINE_SIZE), shards: 2, ..Default::default() };
            {
                let c = Cache::open(path, &opts).expect("create a genuine cache");
                for i in 0..40u8 {
                    let key = [b'k', i];
                    c.set(&key, &value_for(&key, i, 1 + i as usize * 13), i as u32, 0).unwrap();
                }
                c.incr(b"k\x02", 5, Some(0), 0).unwrap_or(0);
            }
            let f = std::fs::OpenOptions::new().read(true).write(true).open(path).ok()?;
            let fix = input.u8() & 1 == 1;
            for _ in 0..(input.u8() % 8 + 1) {
                let off = input.u32() as usize % GENUINE_SIZE;
                let n = (input.u8() as usize % 64).min(GENUINE_SIZE - off);
                let bytes = input.bytes(n);
                f.write_all_at(bytes, off as u64).ok()?;
            }
            if fix {
                let mut header = vec![0u8; HEADER_SIZE];
                f.read_exact_at(&mut header, 0).ok()?;
                fix_checksum(&mut header);
                f.write_all_at(&header[..fh::FIXED_END + 8], 0).ok()?;
            }
        }
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let path = scratch().join("open");
    if build_file(&mut input, &path).is_none() {
        return;
    }
    let as_is = OpenOptions { size: None, create: false, ..Default::default() };
    if let Ok(c) = Cache::open(&path, &as_is) {
        exercise(&c);
    }
    let replace =
        OpenOptions { size: Some(GENUINE_SIZE), shards: 2, recreate: true, ..Default::default() };
    match Cache::open(&path, &replace) {
        Ok(c) => exercise(&c),
        Err(e) => panic!("recreate failed: {e}"),
    }
});
