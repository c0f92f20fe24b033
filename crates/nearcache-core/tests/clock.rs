//! The test hook that holds a process's engine clock
//! (`set_clock_override_ms`, Cache::FastMmap's `_set_time_override` in
//! Perl): expiry follows the held clock, and 0 lets the real clock run
//! again. Its own test binary: the hook is process-wide, so it must not
//! share a process with the other tests' expiry checks.

mod common;
use common::*;
use nearcache_core::{now_ms, set_clock_override_ms};

#[test]
fn expiry_follows_the_held_clock() {
    let d = TempDir::new("clock");
    let c = open(&d, "c", 1 << 20, 1);
    let t = 4_000_000_000_000; // far from now: the real clock would not pass for it
    set_clock_override_ms(t);
    assert_eq!(now_ms(), t);
    c.set(b"k", b"v", 0, 1000).unwrap();
    set_clock_override_ms(t + 999);
    assert_eq!(c.get(b"k").unwrap().unwrap().data, b"v", "alive 1 ms before its expiry");
    set_clock_override_ms(t + 1000);
    assert!(c.get(b"k").unwrap().is_none(), "expired at its expiry time");
    set_clock_override_ms(0);
    let real = now_ms();
    assert!(real < t && real > 1_600_000_000_000, "0 lets the real clock run again: {real}");
    c.set(b"r", b"v", 0, 60_000).unwrap();
    assert!(c.get(b"r").unwrap().is_some());
}
