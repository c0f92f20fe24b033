//! Fuzz the life of values around the process: sweeps, lone re-opens,
//! zombies, a relative open followed by a `chdir`, descriptor exhaustion.
//!
//! `concurrent` races the engine against a scribbler, where nothing can be
//! promised about the values; here nothing scribbles, so the strongest
//! invariant holds and is checked after every operation: the cache agrees
//! with a model of what was acknowledged. The cache is large enough that
//! nothing is ever evicted (64 keys, values up to 64 KiB spilled, up to
//! 1 KiB inline), so an acknowledged set is readable, whole and exactly,
//! until the fuzzer itself overwrites, deletes or pops it; a read returns
//! that value or (only while this process is out of descriptors, for a
//! spilled value) a miss, never another value.
//!
//! Around the operations:
//! * a background thread sweeps the spill directory with no grace, all the
//!   time, racing every spill, publish, pop and removal;
//! * the handle was opened through a path relative to the scratch
//!   directory, after which the process moved back to its first working
//!   directory;
//! * `Zombie` forks a child that holds a key's shard lock, kills it and
//!   leaves it unreaped while it writes and reads that key;
//! * `Nofile` lowers `RLIMIT_NOFILE` to what is open and fills it, reads,
//!   tries a spilled write, then gives the descriptors back;
//! * `Reopen` races a forked lone opener (which repairs, sweeps and
//!   recounts alone) against this process attaching and spilling on a
//!   second file: both values must survive, and the spilled byte count
//!   must match the files.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nearcache_core::{Cache, Error, OpenOptions};
use nearcache_fuzz::{scratch, value_for, Input};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const KEYS: u8 = 64;
const SPILL_THRESHOLD: usize = 1024;

struct State {
    cache: Cache,
    /// What was acknowledged: key -> value.
    model: Mutex<HashMap<[u8; 2], Vec<u8>>>,
}

fn options() -> OpenOptions {
    OpenOptions {
        size: Some(8 << 20),
        shards: 4,
        spill_threshold: Some(SPILL_THRESHOLD),
        spill_budget: 256 << 20,
        lock_timeout: Duration::from_millis(200),
        ..OpenOptions::default()
    }
}

fn state() -> &'static State {
    static S: OnceLock<State> = OnceLock::new();
    S.get_or_init(|| {
        // Open through a relative path, then move back: the handle must
        // keep naming the same spill directory.
        let back = std::env::current_dir().expect("working directory");
        std::env::set_current_dir(scratch()).expect("chdir to scratch");
        let cache = Cache::open("lifecycle", &options()).expect("open the cache");
        std::env::set_current_dir(back).expect("chdir back");
        std::thread::spawn(|| {
            let c = &state().cache;
            loop {
                match c.sweep_spilled(Duration::ZERO) {
                    // Out of descriptors (the `Nofile` operation): this
                    // sweep cannot list the directory; the next one will.
                    Ok(_) | Err(Error::Io { .. }) => {}
                    Err(e) => panic!("a sweep failed: {e}"),
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        State { cache, model: Mutex::new(HashMap::new()) }
    })
}

fn value(key: &[u8], seed: u8, len_byte: u8, spilled: bool) -> Vec<u8> {
    let len =
        if spilled { SPILL_THRESHOLD + 1 + len_byte as usize * 250 } else { len_byte as usize * 4 };
    value_for(key, seed, len)
}

/// The cache agrees with the model for `key` (`local_miss`: a spilled value
/// may miss in this process, out of descriptors).
fn agrees(c: &Cache, model: &HashMap<[u8; 2], Vec<u8>>, key: &[u8; 2], local_miss: bool) {
    let got = c.get(key).expect("get").map(|v| v.data);
    match (model.get(key), got) {
        (None, None) => {}
        (Some(m), Some(g)) => assert!(*m == g, "key {key:?}: another value was returned"),
        (Some(m), None) if local_miss && m.len() > SPILL_THRESHOLD => {}
        (Some(_), None) => panic!("key {key:?}: an acknowledged value vanished"),
        (None, Some(_)) => panic!("key {key:?}: a value that was removed came back"),
    }
}

/// Fork a child that holds the shard lock of `key` (mid-write if `mid`),
/// SIGKILL it once it holds it, and leave it unreaped: returns its pid.
fn zombie_holder(c: &Cache, key: &[u8], mid: bool) -> libc::pid_t {
    let marker = scratch().join(format!("held-{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    // SAFETY: the child only locks a shard, writes a file and sleeps until
    // it is killed; it never returns into the fuzzer.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let m = marker.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            let _ = std::fs::write(m, b"1");
        });
        let hold = Duration::from_secs(60);
        let _ = if mid {
            c.debug_hold_shard_mid_write(key, hold)
        } else {
            c.debug_hold_shard_lock(key, hold)
        };
        // SAFETY: leaving the child without running the fuzzer's exit path.
        unsafe { libc::_exit(0) };
    }
    assert!(pid > 0, "fork failed");
    let start = Instant::now();
    while !marker.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the child never took the lock");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: our child; deliberately not reaped yet.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    let stat = format!("/proc/{pid}/stat");
    while !std::fs::read_to_string(&stat)
        .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
    {
        assert!(start.elapsed() < Duration::from_secs(20), "the child never became a zombie");
        std::thread::sleep(Duration::from_millis(1));
    }
    pid
}

fn reap(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

/// Race a forked lone opener of `path` against this process attaching and
/// spilling; both values must survive and the count match the files.
fn reopen_race(path: &Path, pause_ms: u8) {
    let o = OpenOptions { lock_timeout: Duration::from_secs(10), ..options() };
    // SAFETY: the child opens the file, stores one value and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        Cache::debug_pause_lone_sweep(Duration::from_millis(pause_ms as u64 % 8));
        let ok = Cache::open(path, &o)
            .and_then(|c| c.set(b"child", &value(b"child", 1, 9, true), 0, 0))
            .is_ok();
        // SAFETY: leaving the child without running the fuzzer's exit path.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    assert!(pid > 0, "fork failed");
    let c = Cache::open(path, &o).expect("open beside a lone opener");
    let mine = value(b"parent", 2, pause_ms, true);
    c.set(b"parent", &mine, 0, 0).expect("spill beside a lone opener");
    assert!(c.get(b"parent").unwrap().unwrap().data == mine);
    let mut status = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0, "the lone opener failed");
    assert!(c.get(b"parent").unwrap().unwrap().data == mine, "a lone sweep took a value");
    assert!(c.get(b"child").unwrap().unwrap().data == value(b"child", 1, 9, true));
    let s = c.stats().unwrap();
    let on_disk: u64 = std::fs::read_dir(nearcache_core::spill::dir_path(path))
        .map(|rd| rd.flatten().map(|e| e.metadata().map(|m| m.len()).unwrap_or(0)).sum())
        .unwrap_or(0);
    assert_eq!(s.spilled_bytes, on_disk, "spilled bytes miscounted: {s:?}");
    assert_eq!(s.spill_refused, 0);
}

fn nofile(c: &Cache, model: &HashMap<[u8; 2], Vec<u8>>, key: [u8; 2]) -> Option<Vec<u8>> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit fills lim.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    let open_now = std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(64) as u64;
    let low = libc::rlimit { rlim_cur: open_now + 2, rlim_max: lim.rlim_max };
    // SAFETY: lowering our own soft limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &low) };
    let mut held = Vec::new();
    while let Ok(f) = std::fs::File::open("/dev/null") {
        held.push(f);
    }
    for k in 0..KEYS {
        agrees(c, model, &[b'k', k], true);
    }
    let v = value(&key, 3, 40, true);
    let stored = c.set(&key, &v, 0, 0).is_ok();
    drop(held);
    // SAFETY: restoring our own soft limit.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    stored.then_some(v)
}

fuzz_target!(|data: &[u8]| {
    let st = state();
    let c = &st.cache;
    let mut model = st.model.lock().unwrap_or_else(|p| p.into_inner());
    let mut input = Input::new(data);
    while !input.is_empty() {
        let key = [b'k', input.u8() % KEYS];
        match input.u8() % 12 {
            0..=2 => {
                let v = value(&key, input.u8(), input.u8(), input.u8() & 1 == 0);
                c.set(&key, &v, 0, 0).expect("set");
                model.insert(key, v);
            }
            3 | 4 => agrees(c, &model, &key, false),
            5 => {
                let keys: Vec<[u8; 2]> =
                    (0..input.u8() % 9).map(|_| [b'k', input.u8() % KEYS]).collect();
                let got = c.get_many(&keys).expect("get_many");
                for (k, g) in keys.iter().zip(got) {
                    assert!(model.get(k) == g.map(|v| v.data).as_ref(), "get_many {k:?}");
                }
            }
            6 => {
                let got = c.pop(&key).expect("pop").map(|v| v.data);
                assert!(got == model.remove(&key), "pop {key:?}");
            }
            7 => {
                assert_eq!(c.delete(&key).expect("delete"), model.remove(&key).is_some());
            }
            8 => {
                let mid = input.u8() & 1 == 0;
                let zombie = zombie_holder(c, &key, mid);
                let start = Instant::now();
                let v = value(&key, input.u8(), input.u8(), input.u8() & 1 == 0);
                c.set(&key, &v, 0, 0).expect("a zombie holder blocked a set");
                assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
                // A mid-write victim's shard is salvaged: entries of other
                // keys in it are kept (the hook writes none).
                model.insert(key, v);
                for k in 0..KEYS {
                    agrees(c, &model, &[b'k', k], false);
                }
                reap(zombie);
            }
            9 => {
                if let Some(v) = nofile(c, &model, key) {
                    model.insert(key, v);
                }
                for k in 0..KEYS {
                    agrees(c, &model, &[b'k', k], false);
                }
            }
            10 => {
                let path: PathBuf = scratch().join(format!("lone-{}", input.u8() % 4));
                reopen_race(&path, input.u8());
            }
            _ => {
                for k in 0..KEYS {
                    agrees(c, &model, &[b'k', k], false);
                }
            }
        }
    }
});
