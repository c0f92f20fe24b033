//! Helpers shared by the integration tests.
#![allow(dead_code)]

use nearcache_core::{Cache, OpenOptions};
use std::path::PathBuf;

/// A fresh private directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        TempDir::in_dir(&std::env::temp_dir(), tag)
    }
    /// A fresh private directory under `parent` (e.g. /dev/shm, for tmpfs),
    /// never shared: its name carries the process id and a counter, and it
    /// is created with `create_dir`, which fails if the name exists (tests
    /// run in parallel threads: two directories named after the clock could
    /// be one, and two tests would then share a cache file).
    #[allow(dead_code)]
    pub fn in_dir(parent: &std::path::Path, tag: &str) -> TempDir {
        use std::os::unix::fs::PermissionsExt;
        use std::sync::atomic::{AtomicU64, Ordering};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        loop {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let p = parent.join(format!("nc-test-{tag}-{}-{n}", std::process::id()));
            match std::fs::create_dir(&p) {
                Ok(()) => {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
                    return TempDir(p);
                }
                // Left by an earlier process that had this id.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => panic!("cannot create {}: {e}", p.display()),
            }
        }
    }
    /// A fresh private directory on tmpfs (/dev/shm), where caches live in
    /// production, or in the temp dir on a machine without one.
    #[allow(dead_code)]
    pub fn shm(tag: &str) -> TempDir {
        let shm = std::path::Path::new("/dev/shm");
        if shm.is_dir() {
            TempDir::in_dir(shm, tag)
        } else {
            TempDir::new(tag)
        }
    }
    /// Whether the directory is on tmpfs (`shm` found /dev/shm).
    #[allow(dead_code)]
    pub fn on_tmpfs(&self) -> bool {
        self.0.starts_with("/dev/shm")
    }
    pub fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn opts(size: usize, shards: usize) -> OpenOptions {
    OpenOptions { size: Some(size), shards, ..OpenOptions::default() }
}

pub fn open(dir: &TempDir, name: &str, size: usize, shards: usize) -> Cache {
    Cache::open(dir.file(name), &opts(size, shards)).unwrap()
}

/// A value that names its key and carries a checksum of itself.
pub fn make_value(key: &[u8], seq: u64, len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&(key.len() as u32).to_le_bytes());
    v.extend_from_slice(key);
    v.extend_from_slice(&seq.to_le_bytes());
    let mut x = seq ^ 0x9e37_79b9;
    while v.len() < len.max(v.len() + 8) - 8 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        v.push((x >> 56) as u8);
    }
    let sum = fnv1a(&v);
    v.extend_from_slice(&sum.to_le_bytes());
    v
}

fn fnv1a(b: &[u8]) -> u64 {
    // FNV-1a: independent of the engine's own hash.
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for &x in b {
        h = (h ^ x as u64).wrapping_mul(0x100_0000_01b3);
    }
    h
}

/// Panics unless `v` is a whole value written for `key`.
pub fn verify_value(key: &[u8], v: &[u8]) {
    assert!(v.len() >= 4 + key.len() + 16, "short value for {key:?}");
    let (body, sum) = v.split_at(v.len() - 8);
    assert_eq!(fnv1a(body), u64::from_le_bytes(sum.try_into().unwrap()), "torn value for {key:?}");
    let kl = u32::from_le_bytes(body[..4].try_into().unwrap()) as usize;
    assert_eq!(&body[4..4 + kl], key, "value of another key returned");
}

/// Property-test cases: `PROPTEST_CASES` when set (the fuzz smoke run and
/// longer local runs raise it), else `default`.
#[allow(dead_code)]
pub fn proptest_cases(default: u32) -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
