//! Several processes on one cache file: no torn or foreign values under
//! concurrent eviction, and recovery from a process SIGKILLed while it holds
//! a shard lock mid-write.
//!
//! Child processes are this test binary re-executed with `NC_CHILD` set,
//! running the `child_main` test, which does nothing otherwise.

mod common;
use common::*;
use nearcache_core::{Cache, OpenOptions};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

fn spawn_child(role: &str, path: &Path, arg: &str) -> Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("NC_CHILD", role)
        .env("NC_PATH", path)
        .env("NC_ARG", arg)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

fn hammer(path: &Path, seed: u64, ops: usize) {
    // This test is about torn values: a generous lock timeout keeps a
    // holder descheduled on a loaded machine from failing a write.
    let opts =
        OpenOptions { size: None, lock_timeout: Duration::from_secs(30), ..OpenOptions::default() };
    let c = Cache::open(path, &opts).unwrap();
    let mut x = seed | 1;
    for i in 0..ops {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let key = format!("key-{}", x % 500).into_bytes();
        match (x >> 40) % 10 {
            0..=5 => {
                if let Some(v) = c.get(&key).unwrap() {
                    verify_value(&key, &v.data);
                }
            }
            6..=8 => {
                let len = 40 + (x >> 32) as usize % 1500;
                c.set(&key, &make_value(&key, i as u64, len), 0, 0).unwrap();
            }
            _ => {
                let keys: Vec<Vec<u8>> =
                    (0..8).map(|j| format!("key-{}", (x + j) % 500).into_bytes()).collect();
                for (k, v) in keys.iter().zip(c.get_many(&keys).unwrap()) {
                    if let Some(v) = v {
                        verify_value(k, &v.data);
                    }
                }
                c.delete(&key).unwrap();
            }
        }
    }
}

#[test]
fn child_main() {
    let Ok(role) = std::env::var("NC_CHILD") else { return };
    let path = std::path::PathBuf::from(std::env::var("NC_PATH").unwrap());
    let arg = std::env::var("NC_ARG").unwrap();
    match role.as_str() {
        "hammer" => hammer(&path, arg.parse().unwrap(), 60_000),
        "hold" => {
            let c =
                Cache::open(&path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
            // Signal readiness from inside the lock, then hang until killed.
            let marker = path.with_extension("locked");
            let key = arg.into_bytes();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                std::fs::write(marker, b"1").unwrap();
            });
            c.debug_hold_shard_mid_write(&key, Duration::from_secs(60)).unwrap();
        }
        "hold-lock" => {
            let c =
                Cache::open(&path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
            let marker = path.with_extension("locked");
            let key = arg.into_bytes();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                std::fs::write(marker, b"1").unwrap();
            });
            c.debug_hold_shard_lock(&key, Duration::from_secs(60)).unwrap();
        }
        "lone-open" => {
            // Open alone and stall inside the lone opener's sweep (`arg` ms),
            // as a process stopped or slow while it repairs would.
            let marker = path.with_extension("sweeping");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::write(marker, b"1").unwrap();
            });
            Cache::debug_pause_lone_sweep(Duration::from_millis(arg.parse().unwrap()));
            let opts = OpenOptions { size: None, ..spill_options() };
            let c = Cache::open(&path, &opts).unwrap();
            assert_ne!(c.debug_attach(), "shared", "the child must open alone");
            std::fs::write(path.with_extension("opened"), b"1").unwrap();
            // Stay attached a little, as a real process would.
            std::thread::sleep(Duration::from_millis(200));
        }
        "chdir" => {
            // Opened through a relative path (the working directory is the
            // cache's), then the process moves away, as daemons do.
            let opts = OpenOptions { size: None, ..spill_options() };
            let c = Cache::open(path.file_name().unwrap(), &opts).unwrap();
            std::env::set_current_dir("/").unwrap();
            let v =
                c.get(arg.as_bytes()).unwrap().expect("a relative open still reads after chdir");
            verify_value(arg.as_bytes(), &v.data);
            c.set(b"from-child", &make_value(b"from-child", 1, 50_000), 0, 0).unwrap();
        }
        "nofile" => {
            // Out of descriptors: reads of spilled values miss here, and
            // must not delete them for every other process.
            let opts = OpenOptions { size: None, ..spill_options() };
            let c = Cache::open(&path, &opts).unwrap();
            let key = arg.as_bytes();
            let mut held = Vec::new();
            // SAFETY: setrlimit with a valid struct; lowers our own limit.
            unsafe {
                let lim = libc::rlimit { rlim_cur: 64, rlim_max: 64 };
                assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
            }
            while let Ok(f) = std::fs::File::open("/dev/null") {
                held.push(f);
            }
            let got = c.get(key).unwrap();
            let many = c.get_many(&[key]).unwrap();
            drop(held);
            assert!(got.is_none() && many[0].is_none(), "read with no descriptor left?");
            let v = c.get(key).unwrap().expect("the value survives a local EMFILE");
            verify_value(key, &v.data);
        }
        other => panic!("unknown role {other}"),
    }
}

#[test]
fn four_processes_never_see_torn_or_foreign_values() {
    let d = TempDir::new("mp");
    let path = d.file("c");
    // Small: 4 shards of 64 KiB for ~500 keys of up to 1.5 KB, so constant eviction.
    let c = Cache::open(&path, &opts(4096 + 4 * 64 * 1024, 4)).unwrap();
    let kids: Vec<Child> =
        (0..4).map(|i| spawn_child("hammer", &path, &(i * 7919 + 1).to_string())).collect();
    hammer(&path, 12345, 20_000);
    for mut k in kids {
        assert!(k.wait().unwrap().success(), "a child saw a torn or foreign value");
    }
    let s = c.stats().unwrap();
    assert!(s.evictions > 0, "the test must force eviction: {s:?}");
    assert_eq!(s.resets, 0);
    c.check().unwrap();
}

#[test]
fn sigkill_inside_a_shard_lock_does_not_wedge() {
    let d = TempDir::new("kill");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    for i in 0..200 {
        c.set(format!("k{i}").as_bytes(), b"value", 0, 0).unwrap();
    }
    let victim_key = "k7";
    let shard = c.shard_index(victim_key.as_bytes());
    let mut child = spawn_child("hold", &path, victim_key);
    let marker = path.with_extension("locked");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "child never took the lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The child is inside the lock, mid-write. Kill it.
    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let t = Instant::now();
    let got = c.get(victim_key.as_bytes()).unwrap();
    let waited = t.elapsed();
    assert!(waited < Duration::from_millis(100), "recovery took {waited:?}");
    // The half-written shard (scribbled index, seq odd) was repaired from
    // its arena: every complete entry kept, nothing torn, consistent at once.
    assert_eq!(got.unwrap().data, b"value");
    c.check().unwrap();
    let st = c.shard_stats().unwrap();
    assert_eq!((st[shard].salvages, st[shard].resets, st[shard].entries_lost), (1, 0, 0));
    assert_eq!(st[1 - shard].salvages + st[1 - shard].resets, 0);
    let kept = (0..200).filter(|i| c.get(format!("k{i}").as_bytes()).unwrap().is_some()).count();
    assert_eq!(kept, 200, "the killed holder was writing nothing: nothing may be lost");
    c.set(victim_key.as_bytes(), b"again", 0, 0).unwrap();
    assert_eq!(c.get(victim_key.as_bytes()).unwrap().unwrap().data, b"again");
    c.check().unwrap();
}

#[test]
fn sigkill_inside_a_segmented_shard_keeps_every_complete_entry() {
    // One 4 MiB shard (32 segments), filled over several of them and past
    // capacity (so the chain has been merged and segments reused), then a
    // holder killed mid-write: the repair walks the segment chain from its
    // tail and keeps every complete entry.
    let d = TempDir::new("killseg");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(4096 + (4 << 20), 1)).unwrap();
    assert!(c.geometry().segments().0 > 1);
    let n = 30_000;
    for i in 0..n {
        c.set(format!("k{i}").as_bytes(), &make_value(b"v", i, 200), 0, 0).unwrap();
    }
    assert!(c.stats().unwrap().evictions > 0);
    let held: Vec<u64> =
        (0..n).filter(|i| c.get(format!("k{i}").as_bytes()).unwrap().is_some()).collect();
    assert!(held.len() > 5_000, "{} entries held", held.len());
    let victim = format!("k{}", held[held.len() / 2]);
    let mut child = spawn_child("hold", &path, &victim);
    let marker = path.with_extension("locked");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "child never took the lock");
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: kill has no memory-safety preconditions; the pid is our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    for &i in &held {
        let v = c.get(format!("k{i}").as_bytes()).unwrap().expect("a complete entry was lost");
        assert_eq!(v.data, make_value(b"v", i, 200));
    }
    c.check().unwrap();
    let st = c.stats().unwrap();
    assert_eq!((st.salvages, st.resets, st.entries_lost), (1, 0, 0));
    // It goes on evicting and merging segments afterwards.
    for i in n..n + 20_000 {
        c.set(format!("k{i}").as_bytes(), &make_value(b"v", i, 200), 0, 0).unwrap();
    }
    c.check().unwrap();
}

#[test]
fn reattach_after_everyone_died_repairs_mid_write_shards() {
    // A file whose shard was left mid-write by a process that is gone, and
    // nobody attached: the next opener is alone, re-initialises the locks
    // and repairs that shard from its arena.
    let d = TempDir::new("reattach");
    let path = d.file("c");
    {
        let c = Cache::open(&path, &opts(1 << 20, 1)).unwrap();
        c.set(b"a", b"1", 0, 0).unwrap();
    }
    let mut child = spawn_child("hold", &path, "a");
    let marker = path.with_extension("locked");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(20));
        std::thread::sleep(Duration::from_millis(5));
    }
    // SAFETY: our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let c = Cache::open(&path, &opts(1 << 20, 1)).unwrap();
    c.check().unwrap();
    assert_eq!(c.get(b"a").unwrap().unwrap().data, b"1");
    let st = c.stats().unwrap();
    assert_eq!((st.salvages, st.resets), (1, 0));
    c.set(b"a", b"2", 0, 0).unwrap();
    c.check().unwrap();
}

#[test]
fn racing_creators_end_on_one_file() {
    let d = TempDir::new("race");
    let path = d.file("c");
    let handles: Vec<_> = (0..8)
        .map(|i| {
            let p = path.clone();
            std::thread::spawn(move || {
                let c = Cache::open(&p, &opts(1 << 20, 2)).unwrap();
                c.set(format!("t{i}").as_bytes(), b"x", 0, 0).unwrap();
                c
            })
        })
        .collect();
    let caches: Vec<Cache> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for c in &caches {
        assert_eq!(c.len().unwrap(), 8);
    }
    let leftovers = std::fs::read_dir(&d.0).unwrap().count();
    assert_eq!(leftovers, 1, "temporary files left behind");
}

fn spill_options() -> OpenOptions {
    OpenOptions {
        spill_threshold: Some(4096),
        spill_budget: 64 << 20,
        lock_timeout: Duration::from_secs(10),
        ..opts(1 << 20, 2)
    }
}

fn wait_for(marker: &Path, what: &str) {
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "child never {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn spill_files(path: &Path) -> Vec<(String, u64)> {
    let dir = nearcache_core::spill::dir_path(path);
    let mut v: Vec<(String, u64)> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| {
                let e = e.unwrap();
                (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len())
            })
            .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn a_lone_openers_sweep_spares_a_value_stored_while_it_runs() {
    // The lone opener sweeps orphans and recounts spilled bytes; a process
    // that attaches meanwhile and stores a spilled value must keep it, and
    // the count must include it.
    let d = TempDir::new("lone-sweep");
    let path = d.file("c");
    {
        let c = Cache::open(&path, &spill_options()).unwrap();
        c.set(b"old", &make_value(b"old", 0, 30_000), 0, 0).unwrap();
    }
    let mut child = spawn_child("lone-open", &path, "1500");
    wait_for(&path.with_extension("sweeping"), "started its sweep");
    let c = Cache::open(&path, &OpenOptions { size: None, ..spill_options() }).unwrap();
    c.set(b"new", &make_value(b"new", 1, 40_000), 0, 0).unwrap();
    verify_value(b"new", &c.get(b"new").unwrap().expect("read back at once").data);
    assert!(child.wait().unwrap().success());
    let got = c.get(b"new").unwrap();
    assert!(got.is_some(), "the lone opener's sweep deleted a value stored during it");
    verify_value(b"new", &got.unwrap().data);
    verify_value(b"old", &c.get(b"old").unwrap().unwrap().data);
    let on_disk: u64 = spill_files(&path).iter().map(|f| f.1).sum();
    let s = c.stats().unwrap();
    assert_eq!((s.spilled_bytes, s.spilled_values), (on_disk, 2), "{s:?}");
    assert_eq!(s.spill_refused, 0);
}

#[test]
fn an_open_waiting_for_a_stopped_lone_opener_fails_within_its_lock_timeout() {
    let d = TempDir::new("stopped-opener");
    let path = d.file("c");
    drop(Cache::open(&path, &spill_options()).unwrap());
    let mut child = spawn_child("lone-open", &path, "60000");
    wait_for(&path.with_extension("sweeping"), "started its sweep");
    // SAFETY: our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGSTOP) };
    let (tx, rx) = std::sync::mpsc::channel();
    let p = path.clone();
    std::thread::spawn(move || {
        let t = Instant::now();
        let o = OpenOptions {
            size: None,
            lock_timeout: Duration::from_millis(200),
            ..OpenOptions::default()
        };
        let r = Cache::open(&p, &o).map(|_| ());
        let _ = tx.send((r, t.elapsed()));
    });
    let got = rx.recv_timeout(Duration::from_secs(15));
    // SAFETY: our child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let (r, waited) = got.expect("Cache::open waited without bound for a stopped opener");
    match r {
        Err(nearcache_core::Error::AttachTimeout { .. }) => {}
        other => panic!("expected a lock timeout, got {other:?} after {waited:?}"),
    }
    let msg = r.unwrap_err().to_string();
    assert!(msg.contains(&child.id().to_string()), "the error names the holder: {msg}");
    assert!(waited < Duration::from_secs(3), "waited {waited:?}");
    // The stopped opener is gone: the next open repairs and works.
    let c = Cache::open(&path, &OpenOptions { size: None, ..OpenOptions::default() }).unwrap();
    c.set(b"k", b"v", 0, 0).unwrap();
}

/// Spawn `role` holding the lock of `key`'s shard, wait until it holds it,
/// SIGKILL it and leave it unreaped (a zombie): returns it for the reap.
fn zombie_holder(path: &Path, role: &str, key: &str) -> Child {
    let child = spawn_child(role, path, key);
    wait_for(&path.with_extension("locked"), "took the lock");
    std::thread::sleep(Duration::from_millis(20));
    // SAFETY: our child; deliberately not waited for yet.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    // Until the kernel has torn it down it is still running.
    let stat = format!("/proc/{}/stat", child.id());
    let start = Instant::now();
    loop {
        let s = std::fs::read_to_string(&stat).unwrap_or_default();
        if s.rsplit(')').next().is_some_and(|rest| rest.trim_start().starts_with('Z')) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "child never became a zombie: {s}");
        std::thread::sleep(Duration::from_millis(2));
    }
    child
}

#[test]
fn a_killed_but_unreaped_lock_holder_is_taken_over() {
    let d = TempDir::new("zombie");
    let path = d.file("c");
    let c = Cache::open(&path, &opts(1 << 20, 2)).unwrap();
    for i in 0..100 {
        c.set(format!("k{i}").as_bytes(), b"value", 0, 0).unwrap();
    }
    let victim = "k3";
    for role in ["hold-lock", "hold"] {
        let _ = std::fs::remove_file(path.with_extension("locked"));
        let mut zombie = zombie_holder(&path, role, victim);
        let t = Instant::now();
        c.set(victim.as_bytes(), role.as_bytes(), 0, 0)
            .unwrap_or_else(|e| panic!("{role}: a zombie holder blocked a set: {e}"));
        assert!(t.elapsed() < Duration::from_secs(1), "{role}: took {:?}", t.elapsed());
        assert_eq!(c.get(victim.as_bytes()).unwrap().unwrap().data, role.as_bytes());
        let t = Instant::now();
        let kept = (0..100).filter(|i| c.get(format!("k{i}").as_bytes()).unwrap().is_some());
        assert_eq!(kept.count(), 100, "{role}: entries lost");
        assert!(t.elapsed() < Duration::from_secs(1), "{role}: gets took {:?}", t.elapsed());
        c.check().unwrap();
        zombie.wait().unwrap();
    }
    let s = c.stats().unwrap();
    assert_eq!(s.resets, 0, "{s:?}");
    assert_eq!(s.salvages, 1, "the mid-write zombie's shard was salvaged: {s:?}");
}

#[test]
fn a_process_that_moves_away_after_a_relative_open_deletes_nothing() {
    let d = TempDir::new("chdir");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_options()).unwrap();
    let v = make_value(b"shared", 0, 60_000);
    c.set(b"shared", &v, 0, 0).unwrap();
    let status = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_main", "--nocapture", "--test-threads=1"])
        .env("NC_CHILD", "chdir")
        .env("NC_PATH", &path)
        .env("NC_ARG", "shared")
        .current_dir(&d.0)
        .status()
        .unwrap();
    assert!(status.success(), "the child failed to read after chdir");
    assert!(c.get(b"shared").unwrap().unwrap().data == v, "the value was deleted");
    verify_value(b"from-child", &c.get(b"from-child").unwrap().unwrap().data);
    assert!(!Path::new("/c.spill").exists(), "the child wrote under its new directory");
    assert_eq!(c.stats().unwrap().spill_refused, 0);
}

#[test]
fn running_out_of_descriptors_is_a_miss_for_that_process_not_a_deletion() {
    let d = TempDir::new("nofile");
    let path = d.file("c");
    let c = Cache::open(&path, &spill_options()).unwrap();
    let v = make_value(b"big", 0, 60_000);
    c.set(b"big", &v, 0, 0).unwrap();
    let mut child = spawn_child("nofile", &path, "big");
    assert!(child.wait().unwrap().success(), "the child failed");
    assert!(c.get(b"big").unwrap().unwrap().data == v, "an EMFILE elsewhere deleted the value");
    assert_eq!(c.stats().unwrap().spill_refused, 0);
}
