//! Files, permissions and hostile or corrupt cache files.

mod common;
use common::*;
use nearcache_core::{Cache, Error, OpenOptions};
use proptest::prelude::*;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

#[test]
fn created_file_is_private() {
    let d = TempDir::new("mode");
    let sub = d.file("sub/dir");
    let c = Cache::open(sub.join("c"), &opts(1 << 20, 1)).unwrap();
    let md = std::fs::metadata(c.path()).unwrap();
    assert_eq!(md.mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&sub).unwrap().mode() & 0o777, 0o700);
    // No temporary files are left behind.
    let names: Vec<_> = std::fs::read_dir(&sub).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 1, "{names:?}");
}

#[test]
fn symlink_at_cache_path_is_refused() {
    let d = TempDir::new("symlink");
    let target = d.file("target");
    std::fs::write(&target, b"precious").unwrap();
    std::os::unix::fs::symlink(&target, d.file("c")).unwrap();
    match Cache::open(d.file("c"), &opts(1 << 20, 1)) {
        Err(Error::Permission(m)) => assert!(m.contains("symbolic link"), "{m}"),
        other => panic!("expected Permission, got {other:?}"),
    }
    assert_eq!(std::fs::read(&target).unwrap(), b"precious");
}

#[test]
fn group_writable_file_is_refused_unless_allowed() {
    let d = TempDir::new("gw");
    drop(open(&d, "c", 1 << 20, 1));
    std::fs::set_permissions(d.file("c"), std::fs::Permissions::from_mode(0o666)).unwrap();
    assert!(matches!(Cache::open(d.file("c"), &opts(1 << 20, 1)), Err(Error::Permission(_))));
    let shared = OpenOptions { allow_foreign_owner: true, ..opts(1 << 20, 1) };
    Cache::open(d.file("c"), &shared).unwrap();
}

#[test]
fn world_writable_directory_without_sticky_is_refused() {
    let d = TempDir::new("wwdir");
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    assert!(matches!(Cache::open(d.file("c"), &opts(1 << 20, 1)), Err(Error::Permission(_))));
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    Cache::open(d.file("c"), &opts(1 << 20, 1)).unwrap();
}

#[test]
fn foreign_owner_is_refused() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root to chown a file to another user");
        return;
    }
    let d = TempDir::new("owner");
    drop(open(&d, "c", 1 << 20, 1));
    std::os::unix::fs::chown(d.file("c"), Some(65534), Some(65534)).unwrap();
    match Cache::open(d.file("c"), &opts(1 << 20, 1)) {
        Err(Error::Permission(m)) => assert!(m.contains("owned by uid 65534"), "{m}"),
        other => panic!("expected Permission, got {other:?}"),
    }
    let shared = OpenOptions { allow_foreign_owner: true, ..opts(1 << 20, 1) };
    Cache::open(d.file("c"), &shared).unwrap();
}

#[test]
fn not_a_cache_file() {
    let d = TempDir::new("garbage");
    std::fs::write(d.file("short"), b"hello").unwrap();
    std::fs::set_permissions(d.file("short"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(Cache::open(d.file("short"), &opts(1 << 20, 1)), Err(Error::Corrupt(_))));
    std::fs::write(d.file("zeros"), vec![0u8; 1 << 20]).unwrap();
    std::fs::set_permissions(d.file("zeros"), std::fs::Permissions::from_mode(0o600)).unwrap();
    assert!(matches!(Cache::open(d.file("zeros"), &opts(1 << 20, 1)), Err(Error::Corrupt(_))));
    // recreate replaces a corrupt file
    let c =
        Cache::open(d.file("zeros"), &OpenOptions { recreate: true, ..opts(1 << 20, 1) }).unwrap();
    c.set(b"k", b"v", 0, 0).unwrap();
}

#[test]
fn truncated_or_extended_file_is_detected() {
    let d = TempDir::new("trunc");
    let c = open(&d, "c", 1 << 20, 1);
    c.set(b"k", b"v", 0, 0).unwrap();
    let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
    f.set_len((2 << 20) as u64).unwrap();
    assert!(matches!(c.check(), Err(Error::Corrupt(_))));
    drop(c);
    assert!(matches!(Cache::open(d.file("c"), &opts(1 << 20, 1)), Err(Error::Corrupt(_))));
}

/// Overwrite bytes of a shard (outside the file header) with arbitrary data
/// and run operations: no crash, no out-of-bounds access; corruption found
/// in the structure resets the shard.
///
/// The bytes are written while nobody is attached, after a clean detach: on
/// tmpfs the next lone opener leaves the shards as they are, so a shard
/// whose magic was overwritten is refused (never used); once a process has
/// seen that, the next lone opener repairs every shard.
fn scramble_and_use(patches: &[(usize, Vec<u8>)], ops: &[(u8, u8)]) {
    let d = TempDir::new("fuzz");
    let size = 64 << 10;
    {
        let c = open(&d, "c", size, 1);
        for i in 0..40u8 {
            c.set(&[b'k', i], &vec![i; 1 + i as usize * 7], i as u32, 0).unwrap();
        }
    }
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
        for (off, bytes) in patches {
            let off = 4096 + 8 + off % (size - 4096 - 8 - bytes.len());
            f.write_all_at(bytes, off as u64).unwrap();
        }
    }
    let run = |c: &Cache| -> Result<(), Error> {
        for &(op, k) in ops {
            let key = [b'k', k % 48];
            match op % 6 {
                0 | 1 => {
                    // Payload bytes are not checksummed (signed values in the
                    // Python layer cover hostile payloads); the structure is:
                    // a hit is bounded by the entry limit.
                    if let Some(v) = c.get(&key)? {
                        assert!(v.data.len() <= c.max_entry_size());
                    }
                }
                2 => c.set(&key, &vec![k % 48; 1 + (k % 48) as usize * 7], (k % 48) as u32, 0)?,
                3 => {
                    c.delete(&key)?;
                }
                4 => {
                    let _ = c.incr(&key, 1, Some(0), 0);
                }
                _ => {
                    let _ = c.keys()?;
                }
            }
        }
        Ok(())
    };
    let mut c = Cache::open(d.file("c"), &opts(size, 1)).unwrap();
    match run(&c) {
        Ok(()) => {}
        Err(Error::Corrupt(m)) if m.contains("zeroed") && c.debug_attach() == "clean" => {
            drop(c);
            c = Cache::open(d.file("c"), &opts(size, 1)).unwrap();
            assert_eq!(c.debug_attach(), "repaired");
            run(&c).unwrap();
        }
        Err(e) => panic!("{e:?}"),
    }
    let _ = c.check();
    // After a reset, the shard is consistent again.
    c.clear().unwrap();
    c.check().unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig { cases: proptest_cases(128), ..ProptestConfig::default() })]
    #[test]
    fn corrupt_shards_never_crash(
        patches in proptest::collection::vec((any::<usize>(), proptest::collection::vec(any::<u8>(), 1..64)), 1..8),
        ops in proptest::collection::vec((any::<u8>(), any::<u8>()), 1..200),
    ) {
        scramble_and_use(&patches, &ops);
    }
}

/// Every byte of the file header's fields, changed in four ways, in a
/// preallocated file (on disk) and in a lazy one (on tmpfs, when there is
/// one): opening fails cleanly, or the byte was not a checked one (a
/// counter, the clean-shutdown state) and the cache works and checks clean.
#[test]
fn corrupt_headers_are_errors() {
    use nearcache_core::layout::fh;
    use std::os::unix::fs::FileExt;
    let shm = std::path::Path::new("/dev/shm");
    let roots: Vec<TempDir> = std::iter::once(TempDir::new("hdr"))
        .chain(shm.is_dir().then(|| TempDir::in_dir(shm, "hdr")))
        .collect();
    for d in &roots {
        for pos in 0..fh::FIELDS_END {
            for change in [|b: u8| b ^ 1, |b: u8| b ^ 0x80, |_: u8| 0, |_: u8| 0xff] {
                let _ = std::fs::remove_file(d.file("c"));
                drop(open(d, "c", 1 << 20, 2));
                let f =
                    std::fs::OpenOptions::new().read(true).write(true).open(d.file("c")).unwrap();
                let mut old = [0u8];
                f.read_exact_at(&mut old, pos as u64).unwrap();
                f.write_all_at(&[change(old[0])], pos as u64).unwrap();
                let r =
                    Cache::open(d.file("c"), &OpenOptions { size: None, ..OpenOptions::default() });
                let what =
                    format!("{}: byte {pos} {:#x} -> {:#x}", d.0.display(), old[0], change(old[0]));
                match r {
                    Ok(c) => {
                        c.set(b"k", b"v", 0, 0).unwrap_or_else(|e| panic!("{what}: set: {e:?}"));
                        c.check().unwrap_or_else(|e| panic!("{what}: check: {e:?}"));
                    }
                    Err(Error::Corrupt(_) | Error::Incompatible(_)) => {}
                    Err(e) => panic!("{what}: {e:?}"),
                }
            }
        }
    }
}

#[test]
fn truncation_while_mapped_does_not_kill_the_process() {
    let d = TempDir::new("sigbus");
    let c = open(&d, "c", 1 << 20, 4);
    for i in 0..500 {
        c.set(format!("k{i}").as_bytes(), &[7u8; 300], 0, 0).unwrap();
    }
    // Another program truncates the file under our mapping.
    let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
    f.set_len(4096).unwrap();
    // The next access past the end faults; the handler swaps in zero pages
    // and the handle reports the truncation from then on.
    let first = (0..500).map(|i| c.get(format!("k{i}").as_bytes())).find(|r| r.is_err());
    match first {
        Some(Err(Error::Corrupt(m))) => assert!(m.contains("truncated"), "{m}"),
        other => panic!("expected a truncation error, got {other:?}"),
    }
    assert!(matches!(c.set(b"k", b"v", 0, 0), Err(Error::Corrupt(_))));
    drop(c);
    // Reopening sees a short file: a clear error; recreate replaces it.
    assert!(matches!(Cache::open(d.file("c"), &opts(1 << 20, 4)), Err(Error::Corrupt(_))));
    let r = Cache::open(d.file("c"), &OpenOptions { recreate: true, ..opts(1 << 20, 4) }).unwrap();
    r.set(b"k", b"v", 0, 0).unwrap();
}

fn shard_offset(shard: usize, shard_size: usize) -> u64 {
    (4096 + shard * shard_size) as u64
}

#[test]
fn zeroed_shard_header_is_an_error_not_a_hang() {
    use std::os::unix::fs::FileExt;
    let d = TempDir::new("zeroed");
    let c = open(&d, "c", 1 << 20, 2);
    c.set(b"k", b"v", 0, 0).unwrap();
    let shard = c.shard_index(b"k");
    let size = c.geometry().shard_size;
    let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
    f.write_all_at(&[0u8; 256], shard_offset(shard, size)).unwrap();
    match c.get(b"k") {
        Err(Error::Corrupt(m)) => assert!(m.contains("zeroed"), "{m}"),
        other => panic!("expected Corrupt, got {other:?}"),
    }
    drop(c);
    // Alone again, the next opener re-initialises and resets that shard.
    let r = Cache::open(d.file("c"), &opts(1 << 20, 2)).unwrap();
    assert!(r.get(b"k").unwrap().is_none());
    r.set(b"k", b"v2", 0, 0).unwrap();
    r.check().unwrap();
}

#[test]
fn huge_items_counter_does_not_abort_compaction() {
    use std::os::unix::fs::FileExt;
    let d = TempDir::new("items");
    let c = open(&d, "c", 64 << 10, 1);
    let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
    f.write_all_at(
        &(1u64 << 62).to_ne_bytes(),
        shard_offset(0, c.geometry().shard_size) + nearcache_core::layout::sh::ITEMS as u64,
    )
    .unwrap();
    for i in 0..2000u32 {
        c.set(format!("k{i}").as_bytes(), &[1u8; 200], 0, 0).unwrap();
    }
    c.clear().unwrap();
    c.check().unwrap();
}
