//! Helpers shared by the integration tests.
#![allow(dead_code)]

use nearcache_core::{Cache, OpenOptions};
use std::path::PathBuf;

/// A fresh private directory removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let nanos =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
        let p = std::env::temp_dir().join(format!("nc-test-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
        TempDir(p)
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
