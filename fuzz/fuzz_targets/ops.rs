//! Fuzz operation sequences against a model.
//!
//! The input is decoded into a sequence of operations (get, set, add,
//! replace, delete, pop, incr, touch, get_many, set_many, delete_many,
//! clear, keys, check) on small caches that evict all the time. A model
//! remembers the latest value of every key. Because the cache may evict or
//! expire any entry at any time, the model cannot say whether a key is
//! present, but it can say what a hit must contain:
//!
//! * a hit returns exactly the latest value and flags stored for the key;
//!   a key that was deleted (and not stored since) never comes back;
//! * add() that declines, replace()/touch()/delete() that succeed, prove
//!   the key was present: the model must agree it could be;
//! * incr() returns the latest counter plus delta, or initial plus delta
//!   (the counter was evicted); NotACounter only for a live non-counter;
//! * a failed set (too large) or set_many leaves the cache unchanged;
//! * a compare-and-swap with a version made stale by a set never stores;
//!   one that stores leaves its value as the key's latest;
//! * bad keys are refused with BadKey; `check()` passes after any sequence.
#![no_main]

use libfuzzer_sys::fuzz_target;
use nearcache_core::layout::{entry_size, MAX_KEY_LEN};
use nearcache_core::{Cache, CasOutcome, Error, OpenOptions, Value, FLAG_INT, FLAG_SPILLED};
use nearcache_fuzz::{scratch, value_for, Input};
use std::collections::HashMap;
use std::sync::OnceLock;

#[derive(Clone, Debug, PartialEq)]
enum Model {
    Absent,
    /// The latest value; `may_expire` once any TTL was involved.
    Val {
        data: Vec<u8>,
        flags: u32,
        may_expire: bool,
    },
}

impl Model {
    fn counter(&self) -> Option<i64> {
        match self {
            Model::Val { data, flags, .. } if *flags == FLAG_INT && data.len() == 8 => {
                Some(i64::from_le_bytes(data[..8].try_into().unwrap()))
            }
            _ => None,
        }
    }
    fn present(&self) -> bool {
        matches!(self, Model::Val { .. })
    }
    fn may_expire(&self) -> bool {
        matches!(self, Model::Val { may_expire: true, .. })
    }
}

const NKEYS: usize = 26;

fn keys() -> &'static Vec<Vec<u8>> {
    static KEYS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    KEYS.get_or_init(|| {
        let mut v: Vec<Vec<u8>> = (0..20).map(|i| format!("k{i}").into_bytes()).collect();
        for len in [200usize, 1000, 3000, 9000] {
            v.push(vec![b'L'; len]);
        }
        v.push(Vec::new()); // empty: invalid
        v.push(vec![b'X'; MAX_KEY_LEN + 1]); // too long: invalid
        assert_eq!(v.len(), NKEYS);
        v
    })
}

fn valid(key: &[u8]) -> bool {
    !key.is_empty() && key.len() <= MAX_KEY_LEN
}

fn caches() -> &'static [Cache; 2] {
    static CACHES: OnceLock<[Cache; 2]> = OnceLock::new();
    CACHES.get_or_init(|| {
        let open = |name: &str, size: usize, shards: usize| {
            let opts =
                // Spilling off: values beyond a shard's limit are refused
                // (the model checks that); spilled values are the
                // `concurrent` target's.
                OpenOptions {
                    size: Some(size),
                    shards,
                    recreate: true,
                    spill_budget: 0,
                    ..Default::default()
                };
            Cache::open(scratch().join(name), &opts).expect("open scratch cache")
        };
        [open("ops-a", 4096 + 16 * 1024, 1), open("ops-b", 4096 + 4 * 16 * 1024, 4)]
    })
}

struct Run<'c> {
    c: &'c Cache,
    model: HashMap<usize, Model>,
}

impl Run<'_> {
    fn model(&self, k: usize) -> Model {
        self.model.get(&k).cloned().unwrap_or(Model::Absent)
    }

    fn fits(&self, k: usize, len: usize) -> bool {
        entry_size(keys()[k].len(), len) <= self.c.max_entry_size()
    }

    /// A hit must be the latest value; a miss is always allowed.
    fn check_hit(&self, k: usize, got: Option<&Value>, what: &str) {
        if let Some(v) = got {
            match self.model(k) {
                Model::Absent => panic!("{what}: key {k} came back after its deletion"),
                Model::Val { data, flags, .. } => {
                    assert!(v.data == data && v.flags == flags, "{what}: wrong value for key {k}")
                }
            }
        }
    }

    fn bad_key<T: std::fmt::Debug>(&self, k: usize, r: &Result<T, Error>) -> bool {
        if valid(&keys()[k]) {
            return false;
        }
        assert!(matches!(r, Err(Error::BadKey { .. })), "bad key {k} accepted: {r:?}");
        true
    }

    fn ttl(input: &mut Input<'_>) -> u64 {
        match input.u8() % 8 {
            6 => 1,
            7 => 3_600_000,
            _ => 0,
        }
    }

    fn value(input: &mut Input<'_>, k: usize) -> (Vec<u8>, u32) {
        let len = match input.u8() % 4 {
            0 => input.u8() as usize % 16,
            1 | 2 => input.u8() as usize * 4,
            _ => input.u16() as usize % 9000,
        };
        let flags = match input.u8() % 5 {
            0 => FLAG_INT,
            1 => 16,
            2 => !FLAG_SPILLED, // every bit a caller may use
            _ => 0,
        };
        let len = if flags == FLAG_INT && len % 2 == 0 { 8 } else { len };
        (value_for(&keys()[k], input.u8(), len), flags)
    }

    /// After a failed write, the key reads as it did before (when it
    /// cannot have expired in between).
    fn unchanged(&self, k: usize, before: &Option<Value>) {
        if self.model(k).may_expire() {
            return;
        }
        let now = self.c.get(&keys()[k]).unwrap();
        assert_eq!(&now, before, "a failed write changed key {k}");
    }

    fn step(&mut self, input: &mut Input<'_>) {
        let c = self.c;
        let k = input.u8() as usize % NKEYS;
        let key = &keys()[k];
        match input.u8() % 17 {
            0 | 1 => {
                let r = c.get(key);
                if !self.bad_key(k, &r) {
                    self.check_hit(k, r.unwrap().as_ref(), "get");
                }
            }
            op @ (2..=5) => {
                let (data, flags) = Self::value(input, k);
                // Now and then the bit the engine reserves: refused.
                let reserved = input.u8() % 16 == 0;
                let flags = if reserved { flags | FLAG_SPILLED } else { flags };
                let ttl = Self::ttl(input);
                let before = if valid(key) { c.get(key).unwrap() } else { None };
                self.check_hit(k, before.as_ref(), "get before write");
                let r = match op {
                    2 | 3 => c.set(key, &data, flags, ttl).map(|_| true),
                    4 => c.add(key, &data, flags, ttl),
                    _ => c.replace(key, &data, flags, ttl),
                };
                if self.bad_key(k, &r) {
                    return;
                }
                if reserved {
                    assert!(matches!(r, Err(Error::InvalidArgument(_))), "reserved flags: {r:?}");
                    self.unchanged(k, &before);
                    return;
                }
                if !self.fits(k, data.len()) {
                    assert!(matches!(r, Err(Error::ValueTooLarge { .. })), "oversized: {r:?}");
                    self.unchanged(k, &before);
                    return;
                }
                let stored = r.expect("write of a valid entry");
                let m = self.model(k);
                if op == 4 && !stored {
                    assert!(m.present(), "add declined for key {k}, which was deleted");
                }
                if op == 5 && stored {
                    assert!(m.present(), "replace found key {k}, which was deleted");
                }
                if stored {
                    let may_expire = ttl != 0;
                    self.model.insert(k, Model::Val { data, flags, may_expire });
                }
            }
            6 => {
                let r = c.delete(key);
                if self.bad_key(k, &r) {
                    return;
                }
                if r.unwrap() {
                    assert!(self.model(k).present(), "deleted key {k} was deleted already");
                }
                self.model.insert(k, Model::Absent);
            }
            7 => {
                let r = c.pop(key);
                if self.bad_key(k, &r) {
                    return;
                }
                self.check_hit(k, r.unwrap().as_ref(), "pop");
                self.model.insert(k, Model::Absent);
            }
            8 => {
                let delta = match input.u8() % 6 {
                    0 => i64::MAX,
                    1 => i64::MIN,
                    2 => -(input.u8() as i64),
                    _ => input.u8() as i64,
                };
                let initial = match input.u8() % 4 {
                    0 => None,
                    1 => Some(i64::MAX - 1),
                    _ => Some(input.u8() as i64),
                };
                let ttl = Self::ttl(input);
                let m = self.model(k);
                let r = c.incr(key, delta, initial, ttl);
                if self.bad_key(k, &r) {
                    return;
                }
                let from_model = m.counter().and_then(|cur| cur.checked_add(delta));
                let from_initial = initial.and_then(|i| i.checked_add(delta));
                match r {
                    Ok(v) => {
                        assert!(
                            Some(v) == from_model || Some(v) == from_initial,
                            "incr of key {k} returned {v}; model {m:?}, delta {delta}, \
                             initial {initial:?}"
                        );
                        let may_expire = m.may_expire() || ttl != 0;
                        let data = v.to_le_bytes().to_vec();
                        self.model.insert(k, Model::Val { data, flags: FLAG_INT, may_expire });
                    }
                    Err(Error::NotACounter) => {
                        assert!(m.present() && m.counter().is_none(), "NotACounter for {m:?}")
                    }
                    Err(Error::Overflow) => assert!(
                        (m.counter().is_some() && from_model.is_none())
                            || (initial.is_some() && from_initial.is_none()),
                        "overflow reported for {m:?} + {delta}"
                    ),
                    Err(Error::NotFound) => assert!(initial.is_none()),
                    Err(Error::ValueTooLarge { .. }) => assert!(!self.fits(k, 8)),
                    Err(e) => panic!("incr: {e}"),
                }
            }
            9 => {
                let ttl = Self::ttl(input);
                let r = c.touch(key, ttl);
                if self.bad_key(k, &r) {
                    return;
                }
                if r.unwrap() {
                    assert!(self.model(k).present(), "touch found key {k}, which was deleted");
                    if let Some(Model::Val { may_expire, .. }) = self.model.get_mut(&k) {
                        *may_expire |= ttl != 0;
                    }
                }
            }
            10 => {
                let picks: Vec<usize> =
                    (0..input.u8() % 8).map(|_| input.u8() as usize % 24).collect();
                let ks: Vec<&[u8]> = picks.iter().map(|&i| keys()[i].as_slice()).collect();
                let got = c.get_many(&ks).unwrap();
                assert_eq!(got.len(), ks.len());
                for (&i, g) in picks.iter().zip(&got) {
                    self.check_hit(i, g.as_ref(), "get_many");
                }
            }
            11 => {
                let n = input.u8() % 6;
                let ttl = Self::ttl(input);
                let mut items = Vec::new();
                let mut idx = Vec::new();
                for _ in 0..n {
                    let i = input.u8() as usize % 24;
                    let (data, flags) = Self::value(input, i);
                    items.push((keys()[i].clone(), data, flags));
                    idx.push(i);
                }
                let befores: Vec<Option<Value>> =
                    idx.iter().map(|&i| c.get(&keys()[i]).unwrap()).collect();
                let all_fit = items.iter().zip(&idx).all(|((_, d, _), &i)| self.fits(i, d.len()));
                let r = c.set_many(&items, ttl);
                if all_fit {
                    r.expect("set_many of valid entries");
                    for ((_, data, flags), &i) in items.into_iter().zip(&idx) {
                        let may_expire = ttl != 0;
                        self.model.insert(i, Model::Val { data, flags, may_expire });
                    }
                } else {
                    assert!(matches!(r, Err(Error::ValueTooLarge { .. })), "set_many: {r:?}");
                    // Nothing stored: every key reads as before (duplicates included).
                    let mut seen = std::collections::HashSet::new();
                    for (&i, before) in idx.iter().zip(&befores) {
                        if seen.insert(i) {
                            self.unchanged(i, before);
                        }
                    }
                }
            }
            12 => {
                let picks: Vec<usize> =
                    (0..input.u8() % 6).map(|_| input.u8() as usize % 24).collect();
                let ks: Vec<&[u8]> = picks.iter().map(|&i| keys()[i].as_slice()).collect();
                let n = c.delete_many(&ks).unwrap();
                let mut distinct: Vec<usize> = picks.clone();
                distinct.sort_unstable();
                distinct.dedup();
                let could = distinct.iter().filter(|&&i| self.model(i).present()).count();
                assert!(n <= could, "delete_many removed {n} keys, at most {could} existed");
                for i in distinct {
                    self.model.insert(i, Model::Absent);
                }
            }
            13 => {
                c.clear().unwrap();
                self.model.clear();
            }
            14 => {
                for kb in c.keys().unwrap() {
                    let i =
                        keys().iter().position(|x| *x == kb).expect("keys() returned a stranger");
                    assert!(self.model(i).present(), "keys() lists deleted key {i}");
                }
                let r = c.contains(key);
                if !self.bad_key(k, &r) && r.unwrap() {
                    assert!(self.model(k).present(), "contains() finds deleted key {k}");
                }
            }
            15 => self.cas_step(k, input),
            _ => {
                if let Err(e) = c.check() {
                    panic!("check failed: {e}");
                }
            }
        }
    }

    /// Compare-and-swap: read a version, maybe make it stale with a set,
    /// then CAS with it. A stale version never stores; a stored CAS is the
    /// key's latest value.
    fn cas_step(&mut self, k: usize, input: &mut Input<'_>) {
        let c = self.c;
        let key = &keys()[k];
        let r = c.get_versioned(key);
        if self.bad_key(k, &r) {
            return;
        }
        let got = r.unwrap();
        self.check_hit(k, got.as_ref().map(|(v, _)| v), "get_versioned");
        let version = got.map_or(0, |(_, v)| v);
        let stale = input.u8() & 1 == 0;
        if stale {
            let (data, flags) = Self::value(input, k);
            if !self.fits(k, data.len()) {
                return;
            }
            c.set(key, &data, flags, 0).expect("set");
            self.model.insert(k, Model::Val { data, flags, may_expire: false });
        }
        let (data, flags) = Self::value(input, k);
        let ttl = Self::ttl(input);
        let before = c.get(key).unwrap();
        let r = c.cas(key, &data, flags, ttl, version);
        if !self.fits(k, data.len()) {
            assert!(matches!(r, Err(Error::ValueTooLarge { .. })), "oversized cas: {r:?}");
            self.unchanged(k, &before);
            return;
        }
        match r.expect("cas of a valid entry") {
            CasOutcome::Stored(v) => {
                assert!(!stale, "a CAS with a stale version stored (key {k})");
                assert_ne!(v, 0, "version 0 names a stored value");
                self.model.insert(k, Model::Val { data, flags, may_expire: ttl != 0 });
            }
            CasOutcome::Conflict(_) => self.unchanged(k, &before),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input::new(data);
    let c = &caches()[(input.u8() & 1) as usize];
    c.clear().unwrap();
    let mut run = Run { c, model: HashMap::new() };
    let mut steps = 0;
    while !input.is_empty() && steps < 2000 {
        run.step(&mut input);
        steps += 1;
    }
    if let Err(e) = c.check() {
        panic!("check failed at the end: {e}");
    }
});
