//! Reopening a file this process already has mapped (the registry), and the
//! clean-detach check that lets a lone opener skip repairing every shard.
//!
//! Child processes are this test binary re-executed with `NC_REOPEN_CHILD`
//! set (see `child_main`), or made with `fork` where fork is the point.

mod common;
use common::*;
use nearcache_core::{Cache, Error, OpenOptions};
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The clean-shutdown byte and the attach count of the file header.
fn attach_state(path: &Path) -> (u8, u32) {
    let f = std::fs::File::open(path).unwrap();
    let mut b = [0u8; 8];
    f.read_exact_at(&mut b, 80).unwrap();
    (b[0], u32::from_ne_bytes(b[4..8].try_into().unwrap()))
}

fn spawn_child(role: &str, path: &Path) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("NC_REOPEN_CHILD", role)
        .env("NC_PATH", path)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn wait_for(p: &Path) {
    let start = Instant::now();
    while !p.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "child never signalled");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Held by every test here: they run as threads of one process, and a
/// `fork` (or the fork of a spawn, before its exec) in one test copies the
/// descriptors of another test's cache file into the child, whose shared
/// attach lock then makes that test's next open see the file as still in
/// use ("shared" instead of "repaired" or "clean").
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Child entry point: does nothing unless run as a child.
#[test]
fn child_main() {
    let Ok(role) = std::env::var("NC_REOPEN_CHILD") else { return };
    let path = PathBuf::from(std::env::var("NC_PATH").unwrap());
    let c = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    c.set(b"child", b"was here", 0, 0).unwrap();
    std::fs::write(path.with_extension("attached"), b"").unwrap();
    // "attach": stay attached until told to go (or killed), then detach.
    assert_eq!(role, "attach");
    wait_for(&path.with_extension("go"));
    drop(c);
    std::process::exit(0);
}

#[test]
fn a_second_open_shares_the_mapping() {
    let _serial = serial();
    let d = TempDir::new("share");
    let a = open(&d, "c", 1 << 20, 2);
    let b = open(&d, "c", 1 << 20, 2);
    assert_eq!(a.debug_mapping_address(), b.debug_mapping_address());
    a.set(b"k", b"v", 0, 0).unwrap();
    assert_eq!(b.get(b"k").unwrap().unwrap().data, b"v");
    // size=None shares it too, and a path through another name of the same
    // directory is the same file.
    let dotted = d.0.join(".").join("c");
    let c = Cache::open(&dotted, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    assert_eq!(c.debug_mapping_address(), a.debug_mapping_address());
    assert_eq!(c.path(), dotted);
    assert_eq!(c.lock_timeout(), OpenOptions::default().lock_timeout);
    // Each handle keeps its own lock timeout.
    let short = OpenOptions { lock_timeout: Duration::from_millis(3), ..opts(1 << 20, 2) };
    let e = Cache::open(d.file("c"), &short).unwrap();
    assert_eq!(e.debug_mapping_address(), a.debug_mapping_address());
    assert_eq!(e.lock_timeout(), Duration::from_millis(3));
    assert_eq!(a.lock_timeout(), OpenOptions::default().lock_timeout);
}

#[test]
fn closing_or_dropping_one_handle_leaves_the_others_working() {
    let _serial = serial();
    let d = TempDir::new("close-one");
    let a = open(&d, "c", 1 << 20, 2);
    let b = open(&d, "c", 1 << 20, 2);
    a.set(b"k", b"1", 0, 0).unwrap();
    a.close();
    assert!(matches!(a.get(b"k"), Err(Error::Closed)));
    assert!(!b.is_closed());
    assert_eq!(b.get(b"k").unwrap().unwrap().data, b"1");
    // A closed handle still keeps the mapping: a new open shares it.
    let c = open(&d, "c", 1 << 20, 2);
    assert_eq!(c.debug_mapping_address(), b.debug_mapping_address());
    drop(a);
    b.set(b"k", b"2", 0, 0).unwrap();
    drop(b);
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"2");
    c.check().unwrap();
    drop(c);
    // All gone: the file is mapped again, with its data.
    let e = open(&d, "c", 1 << 20, 2);
    assert_eq!(e.get(b"k").unwrap().unwrap().data, b"2");
}

#[test]
fn handles_shared_across_threads() {
    let _serial = serial();
    let d = TempDir::new("threads");
    let first = open(&d, "c", 1 << 20, 4);
    let addr = first.debug_mapping_address();
    let path = d.file("c");
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let p = path.clone();
            std::thread::spawn(move || {
                for i in 0..200 {
                    let c = Cache::open(&p, &opts(1 << 20, 4)).unwrap();
                    assert_eq!(c.debug_mapping_address(), addr);
                    c.set(format!("t{t}-{i}").as_bytes(), b"x", 0, 0).unwrap();
                    if i % 2 == 0 {
                        c.close();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(first.len().unwrap(), 800);
    first.check().unwrap();
}

#[test]
fn a_file_replaced_at_the_path_is_opened_anew() {
    let _serial = serial();
    let d = TempDir::new("replaced");
    let a = open(&d, "c", 1 << 20, 2);
    a.set(b"k", b"old", 0, 0).unwrap();
    std::fs::remove_file(d.file("c")).unwrap();
    let b = open(&d, "c", 1 << 20, 2);
    assert_ne!(b.debug_mapping_address(), a.debug_mapping_address());
    assert!(b.get(b"k").unwrap().is_none());
    b.set(b"k", b"new", 0, 0).unwrap();
    assert_eq!(a.get(b"k").unwrap().unwrap().data, b"old");
    // Replaced by rename: another cache file moved onto the path.
    let other = open(&d, "other", 1 << 20, 2);
    other.set(b"k", b"renamed", 0, 0).unwrap();
    std::fs::rename(d.file("other"), d.file("c")).unwrap();
    let c = open(&d, "c", 1 << 20, 2);
    assert_eq!(c.debug_mapping_address(), other.debug_mapping_address());
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"renamed");
}

#[test]
fn recreate_goes_around_the_registry() {
    let _serial = serial();
    let d = TempDir::new("recreate");
    let a = open(&d, "c", 1 << 20, 2);
    a.set(b"k", b"v", 0, 0).unwrap();
    // Same parameters: the same file, mapped again (not replaced).
    let same = Cache::open(d.file("c"), &OpenOptions { recreate: true, ..opts(1 << 20, 2) });
    let same = same.unwrap();
    assert_ne!(same.debug_mapping_address(), a.debug_mapping_address());
    assert_eq!(same.get(b"k").unwrap().unwrap().data, b"v");
    // Other parameters: replaced; the old handle keeps the old file.
    let r = Cache::open(d.file("c"), &OpenOptions { recreate: true, ..opts(2 << 20, 4) }).unwrap();
    assert!(r.get(b"k").unwrap().is_none());
    assert_eq!(r.shard_count(), 4);
    assert_eq!(a.get(b"k").unwrap().unwrap().data, b"v");
    let next = open(&d, "c", 2 << 20, 4);
    assert_eq!(next.debug_mapping_address(), r.debug_mapping_address());
}

/// `case` changes the file or its directory and returns an undo. The open
/// with `o` must fail the same way with a handle of the file held (so that
/// the registry has the file) as without.
fn same_error(tag: &str, o: OpenOptions, case: impl Fn(&TempDir) -> Box<dyn Fn()>) {
    let d = TempDir::new(tag);
    let held = open(&d, "c", 1 << 20, 2);
    let undo = case(&d);
    let with = Cache::open(d.file("c"), &o).map(|_| ()).unwrap_err();
    drop(held);
    let without = Cache::open(d.file("c"), &o).map(|_| ()).unwrap_err();
    assert_eq!(format!("{with:?}"), format!("{without:?}"), "{tag}");
    undo();
    Cache::open(d.file("c"), &opts(1 << 20, 2)).unwrap();
}

#[test]
fn a_directory_opened_to_others_refuses_new_files_and_keeps_the_mapped_one() {
    let _serial = serial();
    let d = TempDir::new("dirmode");
    let held = open(&d, "c", 1 << 20, 2);
    held.set(b"k", b"v", 0, 0).unwrap();
    drop(open(&d, "other", 1 << 20, 2)); // made while the directory is private
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o777)).unwrap();
    // The file this process mapped and checked: shared as it is.
    let again = Cache::open(d.file("c"), &opts(1 << 20, 2)).unwrap();
    assert_eq!(again.debug_mapping_address(), held.debug_mapping_address());
    assert_eq!(again.get(b"k").unwrap().unwrap().data, b"v");
    // A file swapped in through the open directory: refused.
    std::fs::rename(d.file("other"), d.file("c")).unwrap();
    let err = Cache::open(d.file("c"), &opts(1 << 20, 2)).map(|_| ()).unwrap_err();
    assert!(format!("{err:?}").contains("world-writable"), "{err:?}");
    // As is any file there once nothing maps it.
    drop((held, again));
    assert!(Cache::open(d.file("c"), &opts(1 << 20, 2)).is_err());
    std::fs::set_permissions(&d.0, std::fs::Permissions::from_mode(0o700)).unwrap();
    Cache::open(d.file("c"), &opts(1 << 20, 2)).unwrap();
}

#[test]
fn incompatible_or_unsafe_opens_fail_as_before() {
    let _serial = serial();
    // (Another size or shard count is no error: the file is resized, see
    // tests/resize.rs.)
    same_error("mode", opts(1 << 20, 2), |d| {
        let p = d.file("c");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
        Box::new(move || {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap()
        })
    });
    same_error("extended", opts(1 << 20, 2), |d| {
        let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
        let len = f.metadata().unwrap().len();
        f.set_len(len + 4096).unwrap();
        Box::new(move || f.set_len(len).unwrap())
    });
    same_error("symlink", opts(1 << 20, 2), |d| {
        let (c, real) = (d.file("c"), d.file("real"));
        std::fs::rename(&c, &real).unwrap();
        std::os::unix::fs::symlink(&real, &c).unwrap();
        Box::new(move || {
            std::fs::remove_file(&c).unwrap();
            std::fs::rename(&real, &c).unwrap();
        })
    });
    same_error("header", opts(1 << 20, 2), |d| {
        // A byte of the checksummed header, changed under the mapping.
        let f = std::fs::OpenOptions::new().read(true).write(true).open(d.file("c")).unwrap();
        let mut b = [0u8];
        f.read_exact_at(&mut b, 56).unwrap();
        f.write_all_at(&[b[0] ^ 0xff], 56).unwrap();
        Box::new(move || f.write_all_at(&b, 56).unwrap())
    });
}

#[test]
fn a_truncated_mapping_is_not_shared() {
    let _serial = serial();
    let d = TempDir::new("truncated");
    let a = open(&d, "c", 1 << 20, 2);
    for i in 0..200 {
        a.set(format!("k{i}").as_bytes(), &[1u8; 300], 0, 0).unwrap();
    }
    let f = std::fs::OpenOptions::new().write(true).open(d.file("c")).unwrap();
    f.set_len(4096).unwrap();
    assert!((0..200).any(|i| a.get(format!("k{i}").as_bytes()).is_err()));
    f.set_len(a.capacity() as u64).unwrap(); // the size is right again, the data gone
    match Cache::open(d.file("c"), &opts(1 << 20, 2)) {
        Ok(b) => {
            // A mapping of its own; its shards were zeroed, and while the
            // broken handle is attached nobody repairs them.
            assert_ne!(b.debug_mapping_address(), a.debug_mapping_address());
            assert!(matches!(b.get(b"k1"), Ok(None) | Err(Error::Corrupt(_))));
        }
        Err(Error::Corrupt(_)) => {}
        Err(e) => panic!("{e:?}"),
    }
}

#[test]
fn a_forked_child_maps_the_file_anew() {
    let _serial = serial();
    let d = TempDir::shm("fork");
    let path = d.file("c");
    let a = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    a.set(b"parent", b"1", 0, 0).unwrap();
    let addr = a.debug_mapping_address();
    // SAFETY: the child only uses the cache and leaves with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = (|| {
            // The inherited handle works.
            if a.get(b"parent").ok()??.data != b"1" {
                return Some(2);
            }
            // A new open does not use the parent's registry entry.
            let b = Cache::open(&path, &opts(1 << 20, 2)).ok()?;
            if b.debug_mapping_address() == addr || b.debug_attach() != "shared" {
                return Some(3);
            }
            b.set(b"child", b"2", 0, 0).ok()?;
            // Its own second open shares its own mapping.
            let c = Cache::open(&path, &opts(1 << 20, 2)).ok()?;
            if c.debug_mapping_address() != b.debug_mapping_address() {
                return Some(4);
            }
            Some(0)
        })()
        .unwrap_or(1);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status));
    assert_eq!(libc::WEXITSTATUS(status), 0);
    assert_eq!(a.get(b"child").unwrap().unwrap().data, b"2");
    // The parent's own entry is still good in the parent.
    let b = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(b.debug_mapping_address(), addr);
    drop((a, b));
    // A mapping that a child may have shared is never verified clean.
    assert_ne!(attach_state(&path).0, 2);
    let r = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(r.debug_attach(), "repaired");
    assert_eq!(r.get(b"child").unwrap().unwrap().data, b"2");
    drop(r);
    // Mapped after the fork: a clean detach again.
    let expect = if d.on_tmpfs() { "clean" } else { "repaired" };
    assert_eq!(attach_state(&path), (2, 0));
    assert_eq!(Cache::open(&path, &opts(1 << 20, 2)).unwrap().debug_attach(), expect);
}

#[test]
fn a_clean_detach_lets_the_next_lone_opener_skip_the_repair() {
    let _serial = serial();
    let d = TempDir::shm("clean");
    let path = d.file("c");
    let expect = if d.on_tmpfs() { "clean" } else { "repaired" };
    let a = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(a.debug_attach(), "created");
    assert_eq!(attach_state(&path), (0, 1));
    a.set(b"k", b"v", 0, 0).unwrap();
    drop(a);
    assert_eq!(attach_state(&path), (2, 0));
    let b = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(b.debug_attach(), expect);
    assert_eq!(attach_state(&path), (0, 1));
    assert_eq!(b.get(b"k").unwrap().unwrap().data, b"v");
    b.check().unwrap();
    // A file from an engine that did not count (byte 1, any count).
    drop(b);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().write_all_at(&[1], 80).unwrap();
    assert_eq!(Cache::open(&path, &opts(1 << 20, 2)).unwrap().debug_attach(), "repaired");
}

#[test]
fn another_process_that_detached_cleanly_keeps_the_detach_clean() {
    let _serial = serial();
    let d = TempDir::shm("two-clean");
    let path = d.file("c");
    drop(Cache::open(&path, &opts(1 << 20, 2)).unwrap());
    let mut child = spawn_child("attach", &path);
    wait_for(&path.with_extension("attached"));
    let a = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(a.debug_attach(), "shared");
    assert_eq!(attach_state(&path).1, 2);
    std::fs::write(path.with_extension("go"), b"").unwrap();
    assert!(child.wait().unwrap().success());
    assert_eq!(attach_state(&path).1, 1);
    drop(a);
    assert_eq!(attach_state(&path), (2, 0));
    let expect = if d.on_tmpfs() { "clean" } else { "repaired" };
    let b = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(b.debug_attach(), expect);
    assert_eq!(b.get(b"child").unwrap().unwrap().data, b"was here");
}

#[test]
fn a_process_that_died_attached_makes_the_next_lone_opener_repair() {
    let _serial = serial();
    let d = TempDir::shm("died");
    let path = d.file("c");
    drop(Cache::open(&path, &opts(1 << 20, 2)).unwrap());
    let mut child = spawn_child("attach", &path);
    wait_for(&path.with_extension("attached"));
    let a = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    drop(a); // last one out, but the child was never taken off the count
    assert_eq!(attach_state(&path), (1, 2));
    let b = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    assert_eq!(b.debug_attach(), "repaired");
    assert_eq!(b.get(b"child").unwrap().unwrap().data, b"was here");
    drop(b);
    assert_eq!(attach_state(&path), (2, 0));
}

#[test]
fn a_damaged_shard_is_refused_then_repaired_by_the_next_lone_opener() {
    let _serial = serial();
    let d = TempDir::shm("damaged");
    let path = d.file("c");
    let a = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    a.set(b"k", b"v", 0, 0).unwrap();
    let (shard, size) = (a.shard_index(b"k"), a.geometry().shard_size);
    drop(a);
    // Written over while nobody is attached, after a clean detach.
    let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&[0u8; 256], (4096 + shard * size) as u64).unwrap();
    let b = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    if b.debug_attach() == "clean" {
        // Left as it is at open, refused before use.
        match b.get(b"k") {
            Err(Error::Corrupt(m)) => assert!(m.contains("zeroed"), "{m}"),
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(matches!(b.set(b"k", b"v2", 0, 0), Err(Error::Corrupt(_))));
        drop(b);
        assert_eq!(attach_state(&path).0, 1);
        let c = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
        assert_eq!(c.debug_attach(), "repaired");
        assert!(c.get(b"k").unwrap().is_none());
        c.set(b"k", b"v3", 0, 0).unwrap();
        c.check().unwrap();
    } else {
        assert!(b.get(b"k").unwrap().is_none());
        b.check().unwrap();
    }
}
