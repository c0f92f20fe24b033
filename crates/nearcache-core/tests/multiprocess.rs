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
