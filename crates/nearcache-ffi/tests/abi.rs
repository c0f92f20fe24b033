//! The C ABI called the way C calls it: raw pointers, status codes, the
//! allocator callback, and bad arguments answered with codes, not crashes.

use std::ffi::{c_void, CStr, CString};
use std::ptr;

use nearcache_ffi::*;

extern "C" fn alloc_vec(ctx: *mut c_void, len: usize, flags: u32) -> *mut u8 {
    // SAFETY: the tests pass a `*mut (Vec<u8>, u32)` as ctx.
    let out = unsafe { &mut *(ctx as *mut (Vec<u8>, u32)) };
    out.0 = vec![0; len];
    out.1 = flags;
    out.0.as_mut_ptr()
}

extern "C" fn alloc_at(ctx: *mut c_void, index: usize, len: usize, flags: u32) -> *mut u8 {
    // SAFETY: the tests pass a `*mut Vec<Option<(Vec<u8>, u32)>>` as ctx.
    let out = unsafe { &mut *(ctx as *mut Vec<Option<(Vec<u8>, u32)>>) };
    out[index] = Some((vec![0; len], flags));
    out[index].as_mut().unwrap().0.as_mut_ptr()
}

extern "C" fn count_keys(
    ctx: *mut c_void,
    _k: *const u8,
    _kl: usize,
    _vl: usize,
    _f: u32,
    _e: u64,
) {
    // SAFETY: the tests pass a `*mut usize` as ctx.
    unsafe { *(ctx as *mut usize) += 1 };
}

fn message() -> String {
    // SAFETY: nc_last_error_message returns a NUL-terminated string.
    unsafe { CStr::from_ptr(nc_last_error_message()) }.to_string_lossy().into_owned()
}

struct Opened {
    c: *mut NcCache,
    dir: std::path::PathBuf,
}

impl Drop for Opened {
    fn drop(&mut self) {
        // SAFETY: c came from nc_open and is freed once.
        unsafe { nc_free(self.c) };
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn options(size: u64) -> NcOpenOptions {
    NcOpenOptions {
        size,
        shards: 0,
        create: true,
        recreate: false,
        allow_foreign_owner: false,
        lock_timeout_ms: 0,
        spill_threshold: 0,
        spill_budget: 0,
        no_spill: false,
        fs_reserve: 0,
        no_fs_reserve: false,
    }
}

fn open(name: &str, size: u64) -> Opened {
    open_with(name, options(size))
}

fn open_with(name: &str, opts: NcOpenOptions) -> Opened {
    let dir = std::env::temp_dir().join(format!("nc-ffi-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
    let path = CString::new(dir.join("c").to_str().unwrap()).unwrap();
    let mut c = ptr::null_mut();
    // SAFETY: valid path, options and out-pointer.
    let st = unsafe { nc_open(path.as_ptr(), &opts, &mut c) };
    assert_eq!(st, NcStatus::NC_OK, "{}", message());
    Opened { c, dir }
}

#[test]
fn set_get_round_trip_keeps_value_and_flags() {
    let o = open("rt", 1 << 20);
    let mut stored = false;
    // SAFETY: all pointers valid for their lengths.
    unsafe {
        let st = nc_store(o.c, b"k".as_ptr(), 1, b"value".as_ptr(), 5, 1, 0, 0, &mut stored);
        assert_eq!(st, NcStatus::NC_OK);
        assert!(stored);
        let mut got = (Vec::new(), 0u32);
        let mut found = false;
        let ctx = &mut got as *mut _ as *mut c_void;
        assert_eq!(nc_get(o.c, b"k".as_ptr(), 1, alloc_vec, ctx, &mut found), NcStatus::NC_OK);
        assert!(found);
        assert_eq!(got, (b"value".to_vec(), 1));
        // add refuses an existing key, replace a missing one.
        nc_store(o.c, b"k".as_ptr(), 1, b"x".as_ptr(), 1, 0, 0, 1, &mut stored);
        assert!(!stored);
        nc_store(o.c, b"m".as_ptr(), 1, b"x".as_ptr(), 1, 0, 0, 2, &mut stored);
        assert!(!stored);
        let mut v = 0i64;
        assert_eq!(nc_incr(o.c, b"n".as_ptr(), 1, -5, true, 0, 0, &mut v), NcStatus::NC_OK);
        assert_eq!(v, -5);
        assert_eq!(
            nc_incr(o.c, b"k".as_ptr(), 1, 1, true, 0, 0, &mut v),
            NcStatus::NC_NOT_A_COUNTER
        );
        let mut n = 0usize;
        nc_keys(o.c, count_keys, &mut n as *mut _ as *mut c_void);
        assert_eq!(n, 2);
    }
}

#[test]
fn many_keys_in_one_call() {
    let o = open("many", 1 << 20);
    let items = [
        NcItem {
            key: NcBytes { ptr: b"a".as_ptr(), len: 1 },
            value: NcBytes { ptr: b"1".as_ptr(), len: 1 },
            flags: 0,
        },
        NcItem {
            key: NcBytes { ptr: b"b".as_ptr(), len: 1 },
            value: NcBytes { ptr: b"22".as_ptr(), len: 2 },
            flags: 7,
        },
    ];
    let keys = [
        NcBytes { ptr: b"a".as_ptr(), len: 1 },
        NcBytes { ptr: b"zz".as_ptr(), len: 2 },
        NcBytes { ptr: b"b".as_ptr(), len: 1 },
    ];
    let mut out: Vec<Option<(Vec<u8>, u32)>> = vec![None; 3];
    // SAFETY: arrays valid for their counts.
    unsafe {
        assert_eq!(nc_set_many(o.c, items.as_ptr(), 2, 0), NcStatus::NC_OK);
        let ctx = &mut out as *mut _ as *mut c_void;
        assert_eq!(nc_get_many(o.c, keys.as_ptr(), 3, alloc_at, ctx), NcStatus::NC_OK);
    }
    assert_eq!(out, vec![Some((b"1".to_vec(), 0)), None, Some((b"22".to_vec(), 7))]);
}

#[test]
fn bad_arguments_are_codes_with_messages_and_change_nothing() {
    let o = open_with("bad", NcOpenOptions { no_spill: true, ..options(1 << 20) });
    let mut stored = false;
    // SAFETY: the invalid pointers are NULL, which the ABI checks.
    unsafe {
        assert_eq!(
            nc_store(o.c, ptr::null(), 3, b"v".as_ptr(), 1, 0, 0, 0, &mut stored),
            NcStatus::NC_INVALID_ARGUMENT
        );
        assert!(message().contains("NULL"), "{}", message());
        assert_eq!(
            nc_store(o.c, b"k".as_ptr(), 0, b"v".as_ptr(), 1, 0, 0, 0, &mut stored),
            NcStatus::NC_BAD_KEY
        );
        assert_eq!(
            nc_store(o.c, b"k".as_ptr(), 1, b"v".as_ptr(), 1, 0, -1, 0, &mut stored),
            NcStatus::NC_INVALID_ARGUMENT
        );
        assert_eq!(
            nc_store(o.c, b"k".as_ptr(), 1, b"v".as_ptr(), 1, 0, 0, 9, &mut stored),
            NcStatus::NC_INVALID_ARGUMENT
        );
        assert!(message().contains("set mode"), "{}", message());
        let big = vec![0u8; 2 << 20];
        assert_eq!(
            nc_store(o.c, b"k".as_ptr(), 1, big.as_ptr(), big.len(), 0, 0, 0, &mut stored),
            NcStatus::NC_VALUE_TOO_LARGE
        );
        assert!(message().contains("entry limit"), "{}", message());
        assert!(message().contains("left unchanged"), "{}", message());
        let mut n = 99usize;
        assert_eq!(nc_len(o.c, &mut n), NcStatus::NC_OK);
        assert_eq!(n, 0, "nothing was stored by the failing calls");
        assert_eq!(nc_len(ptr::null(), &mut n), NcStatus::NC_INVALID_ARGUMENT);
        let mut c = ptr::null_mut();
        assert_eq!(nc_open(ptr::null(), ptr::null(), &mut c), NcStatus::NC_INVALID_ARGUMENT);
        assert!(c.is_null());
        // A closed cache answers NC_CLOSED.
        assert_eq!(nc_close(o.c), NcStatus::NC_OK);
        assert!(nc_is_closed(o.c));
        assert_eq!(nc_clear(o.c), NcStatus::NC_CLOSED);
    }
}

#[test]
fn keys_use_the_engine_encoding_both_ways() {
    // A bytes key starting with 0xFF is escaped on the way in and
    // unescaped on the way out; the int key 5 (0xFF '5', as the Python
    // package stores it) stays invisible to this ABI.
    assert_eq!(engine_key(b"plain").as_ref(), b"plain");
    assert_eq!(engine_key(b"\xff5").as_ref(), b"\xfe\xff5");
    assert_eq!(user_key(b"\xfe\xff5"), Some(&b"\xff5"[..]));
    assert_eq!(user_key(b"\xff5"), None);
    let o = open("keys", 1 << 20);
    let mut stored = false;
    let mut found = false;
    let mut got: (Vec<u8>, u32) = (Vec::new(), 0);
    // SAFETY: all pointers valid for their lengths.
    unsafe {
        nc_store(o.c, b"\xff5".as_ptr(), 2, b"bytes".as_ptr(), 5, 0, 0, 0, &mut stored);
        let ctx = &mut got as *mut _ as *mut c_void;
        nc_get(o.c, b"\xff5".as_ptr(), 2, alloc_vec, ctx, &mut found);
    }
    assert!(found);
    assert_eq!(got.0, b"bytes");
    let mut n = 0usize;
    // SAFETY: valid handle and callback.
    unsafe { nc_keys(o.c, count_keys, &mut n as *mut _ as *mut c_void) };
    assert_eq!(n, 1, "the escaped key is listed once, as the caller's key");
}

fn get(c: *mut NcCache, key: &[u8]) -> Option<(Vec<u8>, u32)> {
    let mut got = (Vec::new(), 0u32);
    let mut found = false;
    let ctx = &mut got as *mut _ as *mut c_void;
    // SAFETY: valid handle, key and out-pointers.
    let st = unsafe { nc_get(c, key.as_ptr(), key.len(), alloc_vec, ctx, &mut found) };
    assert_eq!(st, NcStatus::NC_OK, "{}", message());
    found.then_some(got)
}

fn store(c: *mut NcCache, key: &[u8], value: &[u8]) -> NcStatus {
    let mut stored = false;
    // SAFETY: valid handle, key, value and out-pointer.
    unsafe {
        nc_store(c, key.as_ptr(), key.len(), value.as_ptr(), value.len(), 3, 0, 0, &mut stored)
    }
}

fn stats(c: *mut NcCache) -> NcStats {
    let mut s = NcStats::default();
    // SAFETY: valid handle and out-pointer.
    assert_eq!(unsafe { nc_stats(c, &mut s) }, NcStatus::NC_OK, "{}", message());
    s
}

#[test]
fn large_values_spill_to_files_within_the_budget() {
    let o = open_with("spill", NcOpenOptions { spill_budget: 4 << 20, ..options(1 << 20) });
    // SAFETY: live handle.
    let (max_entry, max_value, threshold) =
        unsafe { (nc_max_entry_size(o.c), nc_max_value_size(o.c), nc_spill_threshold(o.c)) };
    assert_eq!(max_value, 4 << 20, "the spill budget bounds values");
    assert_eq!(threshold, 128 * 1024, "0 takes the engine's default threshold");
    let big: Vec<u8> = (0..max_entry + 1).map(|i| (i % 251) as u8).collect();
    assert_eq!(store(o.c, b"big", &big), NcStatus::NC_OK, "{}", message());
    assert_eq!(
        get(o.c, b"big"),
        Some((big.clone(), 3)),
        "a value over the entry limit round-trips"
    );
    let s = stats(o.c);
    assert_eq!((s.spilled_values, s.spilled_bytes), (1, big.len() as u64));
    assert_eq!(s.spill_refused, 0);
    let spill_dir = o.dir.join("c.spill");
    assert_eq!(std::fs::read_dir(&spill_dir).unwrap().count(), 1, "one file beside the cache");

    let over = vec![7u8; (4 << 20) + 1];
    assert_eq!(store(o.c, b"big", &over), NcStatus::NC_VALUE_TOO_LARGE);
    assert!(message().contains("spill_budget"), "{}", message());
    assert!(message().contains("left unchanged"), "{}", message());
    assert_eq!(get(o.c, b"big"), Some((big, 3)), "the refused value lost nothing");

    let mut deleted = false;
    // SAFETY: valid handle, key and out-pointer.
    unsafe { nc_delete(o.c, b"big".as_ptr(), 3, &mut deleted) };
    assert!(deleted);
    assert_eq!(stats(o.c).spilled_values, 0);
}

#[test]
fn the_spill_threshold_and_no_spill_options_apply() {
    let o = open_with("threshold", NcOpenOptions { spill_threshold: 1000, ..options(1 << 20) });
    // SAFETY: live handle.
    assert_eq!(unsafe { nc_spill_threshold(o.c) }, 1000);
    assert_eq!(store(o.c, b"inline", &[1u8; 1000]), NcStatus::NC_OK);
    assert_eq!(store(o.c, b"spilled", &[2u8; 1001]), NcStatus::NC_OK);
    assert_eq!(stats(o.c).spilled_values, 1, "only the value over the threshold spills");
    assert_eq!(get(o.c, b"spilled").map(|v| v.0), Some(vec![2u8; 1001]));

    let off = open_with(
        "nospill",
        NcOpenOptions { no_spill: true, spill_budget: 1 << 30, ..options(1 << 20) },
    );
    // SAFETY: live handle.
    let (max_entry, max_value) = unsafe { (nc_max_entry_size(off.c), nc_max_value_size(off.c)) };
    assert!(max_value < max_entry as u64, "no_spill: only what fits inline");
    assert_eq!(
        store(off.c, b"k", &vec![0u8; max_value as usize]),
        NcStatus::NC_OK,
        "{}",
        message()
    );
    assert_eq!(store(off.c, b"k", &vec![0u8; max_entry + 1]), NcStatus::NC_VALUE_TOO_LARGE);
    assert!(message().contains("entry limit"), "{}", message());
    assert_eq!(stats(off.c).spilled_values, 0);
    assert!(!off.dir.join("c.spill").exists(), "no_spill makes no directory");
}

fn get_versioned(c: *mut NcCache, key: &[u8]) -> (Option<(Vec<u8>, u32)>, u64) {
    let mut got = (Vec::new(), 0u32);
    let (mut found, mut version) = (false, 99u64);
    let ctx = &mut got as *mut _ as *mut c_void;
    // SAFETY: valid handle, key and out-pointers.
    let st = unsafe {
        nc_get_versioned(c, key.as_ptr(), key.len(), alloc_vec, ctx, &mut found, &mut version)
    };
    assert_eq!(st, NcStatus::NC_OK, "{}", message());
    (found.then_some(got), version)
}

fn cas(c: *mut NcCache, key: &[u8], value: &[u8], expected: u64) -> (NcStatus, bool, u64) {
    let (mut stored, mut current) = (false, 99u64);
    // SAFETY: valid handle, key, value and out-pointers.
    let st = unsafe {
        nc_cas(
            c,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            5,
            0,
            expected,
            &mut stored,
            &mut current,
        )
    };
    (st, stored, current)
}

#[test]
fn cas_through_the_abi_stores_only_against_the_current_version() {
    let o = open("cas", 1 << 20);
    assert_eq!(get_versioned(o.c, b"k"), (None, 0));
    let (st, stored, v1) = cas(o.c, b"k", b"one", 0);
    assert_eq!((st, stored), (NcStatus::NC_OK, true));
    assert_ne!(v1, 0);
    assert_eq!(get_versioned(o.c, b"k"), (Some((b"one".to_vec(), 5)), v1));
    // Add-if-absent fails on a present key and reports its version.
    assert_eq!(cas(o.c, b"k", b"x", 0), (NcStatus::NC_OK, false, v1));
    let (_, stored, v2) = cas(o.c, b"k", b"two", v1);
    assert!(stored && v2 != v1);
    // The stale version changes nothing.
    assert_eq!(cas(o.c, b"k", b"stale", v1), (NcStatus::NC_OK, false, v2));
    assert_eq!(get(o.c, b"k"), Some((b"two".to_vec(), 5)));
    // current_version may be NULL.
    let mut stored = true;
    // SAFETY: valid handle, key, value; a NULL version pointer is allowed.
    let st = unsafe {
        nc_cas(o.c, b"k".as_ptr(), 1, b"z".as_ptr(), 1, 0, 0, v1, &mut stored, ptr::null_mut())
    };
    assert_eq!((st, stored), (NcStatus::NC_OK, false));
    // Compare-and-delete.
    let mut deleted = true;
    // SAFETY: valid handle, key and out-pointer.
    unsafe {
        assert_eq!(nc_delete_if_version(o.c, b"k".as_ptr(), 1, v1, &mut deleted), NcStatus::NC_OK);
        assert!(!deleted);
        assert_eq!(nc_delete_if_version(o.c, b"k".as_ptr(), 1, 0, &mut deleted), NcStatus::NC_OK);
        assert!(!deleted);
        assert_eq!(nc_delete_if_version(o.c, b"k".as_ptr(), 1, v2, &mut deleted), NcStatus::NC_OK);
        assert!(deleted);
    }
    assert_eq!(get_versioned(o.c, b"k"), (None, 0));
    assert_eq!(cas(o.c, b"k", b"x", v2), (NcStatus::NC_OK, false, 0));
}

#[test]
fn cas_bad_arguments_are_codes_and_change_nothing() {
    let o = open("casbad", 1 << 20);
    let (_, _, v) = cas(o.c, b"k", b"keep", 0);
    // Negative TTL, reserved flag bit, empty key, NULL value with a length.
    let mut stored = true;
    // SAFETY: each call passes valid pointers except the documented bad one.
    unsafe {
        let st =
            nc_cas(o.c, b"k".as_ptr(), 1, b"x".as_ptr(), 1, 0, -1, v, &mut stored, ptr::null_mut());
        assert_eq!(st, NcStatus::NC_INVALID_ARGUMENT);
        assert!(message().contains("ttl"), "{}", message());
        let st = nc_cas(
            o.c,
            b"k".as_ptr(),
            1,
            b"x".as_ptr(),
            1,
            1 << 31,
            0,
            v,
            &mut stored,
            ptr::null_mut(),
        );
        assert_eq!(st, NcStatus::NC_INVALID_ARGUMENT);
        let st =
            nc_cas(o.c, b"".as_ptr(), 0, b"x".as_ptr(), 1, 0, 0, v, &mut stored, ptr::null_mut());
        assert_eq!(st, NcStatus::NC_BAD_KEY);
        let st =
            nc_cas(o.c, b"k".as_ptr(), 1, ptr::null(), 4, 0, 0, v, &mut stored, ptr::null_mut());
        assert_eq!(st, NcStatus::NC_INVALID_ARGUMENT);
        let st = nc_cas(
            ptr::null(),
            b"k".as_ptr(),
            1,
            b"x".as_ptr(),
            1,
            0,
            0,
            v,
            &mut stored,
            ptr::null_mut(),
        );
        assert_eq!(st, NcStatus::NC_INVALID_ARGUMENT);
        let mut d = true;
        assert_eq!(nc_delete_if_version(o.c, b"".as_ptr(), 0, v, &mut d), NcStatus::NC_BAD_KEY);
    }
    assert!(stored, "out-pointers are written only on NC_OK");
    assert_eq!(get_versioned(o.c, b"k"), (Some((b"keep".to_vec(), 5)), v));
}

#[test]
fn a_refused_spilled_value_never_reaches_the_allocator() {
    // The allocator's call is the C caller's hit signal (and its buffer the
    // caller's to free): a spilled value whose file fails its checksum must
    // be refused before it is called, in nc_get_many and nc_get alike.
    let o = open_with("refused", NcOpenOptions { spill_threshold: 4096, ..options(1 << 20) });
    let value: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    let corrupt = || {
        let spill = o.dir.join("c.spill");
        let name: std::path::PathBuf =
            std::fs::read_dir(&spill).unwrap().next().unwrap().unwrap().path();
        let mut bytes = std::fs::read(&name).unwrap();
        bytes[50_000] ^= 0x5a;
        std::thread::sleep(std::time::Duration::from_millis(5));
        std::fs::write(&name, &bytes).unwrap();
    };
    let keys = [NcBytes { ptr: b"big".as_ptr(), len: 3 }];
    let mut stored = false;
    // SAFETY: all pointers valid for their lengths; ctx types match the
    // allocators.
    unsafe {
        let st =
            nc_store(o.c, b"big".as_ptr(), 3, value.as_ptr(), value.len(), 0, 0, 0, &mut stored);
        assert_eq!(st, NcStatus::NC_OK);
        corrupt();
        let mut out: Vec<Option<(Vec<u8>, u32)>> = vec![None];
        let ctx = &mut out as *mut _ as *mut c_void;
        assert_eq!(nc_get_many(o.c, keys.as_ptr(), 1, alloc_at, ctx), NcStatus::NC_OK);
        assert!(out[0].is_none(), "nc_get_many handed out a refused value");

        let st =
            nc_store(o.c, b"big".as_ptr(), 3, value.as_ptr(), value.len(), 0, 0, 0, &mut stored);
        assert_eq!(st, NcStatus::NC_OK);
        corrupt();
        let mut got: (Vec<u8>, u32) = (Vec::new(), 0);
        let mut found = true;
        let ctx = &mut got as *mut _ as *mut c_void;
        assert_eq!(nc_get(o.c, b"big".as_ptr(), 3, alloc_vec, ctx, &mut found), NcStatus::NC_OK);
        assert!(!found);
        assert!(got.0.is_empty(), "nc_get called the allocator for a refused value");
    }
}

#[test]
fn a_resize_keeps_the_entries_and_reports_the_new_geometry() {
    let o = open("resize", 1 << 20);
    let mut stored = false;
    let (mut capacity, mut shards) = (0usize, 0usize);
    // SAFETY: all pointers valid for their lengths.
    unsafe {
        let st = nc_store(o.c, b"k".as_ptr(), 1, b"value".as_ptr(), 5, 1, 0, 0, &mut stored);
        assert_eq!(st, NcStatus::NC_OK);
        assert_eq!(nc_resize(o.c, 4 << 20, 4, &mut capacity, &mut shards), NcStatus::NC_OK);
        assert_eq!((shards, nc_shard_count(o.c)), (4, 4));
        assert_eq!(capacity, nc_capacity(o.c));
        assert!(capacity > 3 << 20 && capacity <= 4 << 20, "{capacity}");
        let mut got = (Vec::<u8>::new(), 0u32);
        let mut found = false;
        let ctx = &mut got as *mut _ as *mut c_void;
        assert_eq!(nc_get(o.c, b"k".as_ptr(), 1, alloc_vec, ctx, &mut found), NcStatus::NC_OK);
        assert!(found);
        assert_eq!(got.0, b"value");
        // Not a power of two: refused, nothing changed.
        let st = nc_resize(o.c, 4 << 20, 3, ptr::null_mut(), ptr::null_mut());
        assert_eq!(st, NcStatus::NC_INVALID_ARGUMENT);
        assert_eq!(nc_shard_count(o.c), 4);
    }
}
