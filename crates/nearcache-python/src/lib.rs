//! `nearcache._native`: PyO3 glue over `nearcache-core`.
//!
//! This crate only converts and forwards: Python keys (`bytes`/`str`) and
//! values to byte slices, engine results to Python objects, engine errors
//! to the exception hierarchy below. Policy (serializers, TTL defaults
//! beyond a plain number, stampede protection, tiering) lives in Python.
//!
//! Calls do not release the GIL: they take well under a microsecond, and
//! releasing would cost more than it saves. Under a shard lock only
//! objects that cannot trigger the garbage collector (`bytes`) are
//! created, so no Python code can run while a shard is locked.

use nearcache_core::{
    keys, Cache, CasOutcome, EntryRef, Error as CoreError, EvictionMode, OpenOptions, SetMode,
    FLAG_INT,
};
use pyo3::exceptions::{PyKeyError, PyOverflowError, PyTypeError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple, PyType,
};

const FLAG_BYTES: u32 = 0;
const FLAG_STR: u32 = 1;
const FLAG_FLOAT: u32 = 3;
const FLAG_BOOL: u32 = 4;
const FLAG_NONE: u32 = 5;
const FLAG_USER: u32 = 16;

// ---------------------------------------------------------------- errors

macro_rules! exceptions {
    ($( $static:ident = $name:literal ($($base:expr),*) : $doc:literal ;)*) => {
        $( static $static: PyOnceLock<Py<PyType>> = PyOnceLock::new(); )*

        fn register_exceptions(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            let builtins = py.import("builtins")?;
            let type_ = builtins.getattr("type")?;
            $(
                let bases = PyTuple::new(py, [$( $base(py, &builtins)? ),*])?;
                let ns = PyDict::new(py);
                ns.set_item("__doc__", $doc)?;
                ns.set_item("__module__", "nearcache")?;
                let t = type_.call1(($name, bases, ns))?.cast_into::<PyType>()?;
                m.add($name, &t)?;
                let _ = $static.set(py, t.unbind());
            )*
            Ok(())
        }
    };
}

fn builtin<'py>(
    name: &'static str,
) -> impl Fn(Python<'py>, &Bound<'py, PyModule>) -> PyResult<Bound<'py, PyAny>> {
    move |_py, b| b.getattr(name)
}

fn ours<'py>(
    cell: &'static PyOnceLock<Py<PyType>>,
) -> impl Fn(Python<'py>, &Bound<'py, PyModule>) -> PyResult<Bound<'py, PyAny>> {
    move |py, _b| Ok(cell.get(py).expect("registered in order").bind(py).clone().into_any())
}

exceptions! {
    ERROR = "Error" (builtin("Exception")) : "Base class of every error nearcache raises.";
    CLOSED = "CacheClosedError" (ours(&ERROR)) : "The cache was closed; no further operation is possible.";
    TOO_LARGE = "ValueTooLargeError" (ours(&ERROR), builtin("ValueError")) : "The entry does not fit in a shard; the cache is left unchanged.";
    BAD_KEY = "InvalidKeyError" (ours(&ERROR), builtin("ValueError")) : "The key is empty or longer than the cache accepts.";
    KEY_TYPE = "KeyTypeError" (ours(&ERROR), builtin("TypeError")) : "A key is not a str, bytes or int. Keys are never pickled (equal keys must always map to the same bytes), so other types are refused rather than guessed at.";
    CONFIG = "ConfigurationError" (ours(&ERROR), builtin("ValueError")) : "An option given to nearcache.Cache (or a decorator) is invalid.";
    INVALID = "InvalidArgumentError" (ours(&CONFIG)) : "An argument is outside its documented range (a ConfigurationError, so a ValueError).";
    INCOMPATIBLE = "IncompatibleFileError" (ours(&ERROR)) : "The file exists but was created with other parameters or layout.";
    CORRUPT = "CorruptFileError" (ours(&ERROR)) : "The file is not a nearcache file or fails its consistency checks.";
    PERMISSION = "PermissionDeniedError" (ours(&ERROR), builtin("PermissionError")) : "The file or directory is unsafe to open (foreign owner, symlink, mode).";
    FULL = "CacheFullError" (ours(&ERROR), builtin("OSError")) : "The file system holding the cache has no room for it.";
    OS = "CacheOSError" (ours(&ERROR), builtin("OSError")) : "An operating-system call on the cache file failed.";
    NOT_FOUND = "CacheNotFoundError" (ours(&OS), builtin("FileNotFoundError")) : "The cache file does not exist (opened with create=False).";
    NOT_COUNTER = "NotACounterError" (ours(&ERROR), builtin("TypeError")) : "incr/decr on an entry that does not hold a 64-bit integer.";
    OVERFLOW = "CounterOverflowError" (ours(&ERROR), builtin("OverflowError")) : "incr/decr would overflow a signed 64-bit counter; the value is unchanged.";
    LOCK_TIMEOUT = "ShardLockTimeoutError" (ours(&ERROR), builtin("TimeoutError")) : "A write could not take its shard's lock within the cache's lock timeout: another live process holds it (stopped, traced, dumping core). Nothing was changed; counted in stats()['lock_timeouts'].";
    CONFLICT = "UpdateConflictError" (ours(&ERROR), builtin("RuntimeError")) : "An update lost its compare-and-swap to other writers of the key too many times in a row and gave up; its last attempt wrote nothing.";
}

fn raise(py: Python<'_>, cell: &'static PyOnceLock<Py<PyType>>, msg: String) -> PyErr {
    PyErr::from_type(cell.get(py).expect("module initialised").bind(py).clone(), msg)
}

fn to_py(py: Python<'_>, e: CoreError) -> PyErr {
    let msg = e.to_string();
    match e {
        CoreError::Closed => raise(py, &CLOSED, msg),
        CoreError::BadKey { .. } => raise(py, &BAD_KEY, msg),
        CoreError::ValueTooLarge { .. } | CoreError::OverSpillBudget { .. } => {
            raise(py, &TOO_LARGE, msg)
        }
        // The engine speaks of its option generically; say it as Python writes it.
        CoreError::Incompatible(_) => raise(py, &INCOMPATIBLE, msg.replace("=true", "=True")),
        CoreError::Corrupt(_) => raise(py, &CORRUPT, msg),
        CoreError::Permission(_) => raise(py, &PERMISSION, msg),
        CoreError::Full(_) => raise(py, &FULL, msg),
        CoreError::NotACounter => raise(py, &NOT_COUNTER, msg),
        CoreError::NotFound => PyKeyError::new_err(msg),
        CoreError::Overflow => raise(py, &OVERFLOW, msg),
        CoreError::InvalidArgument(_) => raise(py, &INVALID, msg),
        // The engine names its options as Rust writes them.
        CoreError::Io { ref source, .. } => os_error(py, source, msg.replace("=false", "=False")),
        CoreError::LockTimeout { .. } | CoreError::AttachTimeout { .. } => {
            raise(py, &LOCK_TIMEOUT, msg)
        }
        CoreError::TooManyConflicts { .. } => raise(py, &CONFLICT, msg),
        // Followed inside the engine; never returned by a public call.
        CoreError::Moved => raise(py, &ERROR, msg),
    }
}

/// A `CacheOSError` (a `CacheNotFoundError` for a missing file) with
/// `errno` and `strerror` set, as `OSError(errno, message)` sets them.
fn os_error(py: Python<'_>, source: &std::io::Error, msg: String) -> PyErr {
    let missing = source.kind() == std::io::ErrorKind::NotFound;
    let cell = if missing { &NOT_FOUND } else { &OS };
    let errno = source.raw_os_error().or(missing.then_some(ENOENT));
    let kind = cell.get(py).expect("module initialised").bind(py).clone();
    match errno {
        Some(errno) => PyErr::from_type(kind, (errno, msg)),
        None => PyErr::from_type(kind, msg),
    }
}

/// The errno of a file that does not exist (2 on every Unix), for the
/// engine's not-found errors that carry a kind but no OS code.
const ENOENT: i32 = 2;

trait OrPy<T> {
    fn or_py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> OrPy<T> for Result<T, CoreError> {
    #[inline]
    fn or_py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

// ---------------------------------------------------------------- keys/values

/// The stored form of an int key (`nearcache_core::keys`): 0xFF then its
/// decimal digits. `True` is 1 and an IntEnum is its value, as for the
/// equal Python ints.
fn int_key(key: &Bound<'_, PyAny>, out: &mut Vec<u8>) -> PyResult<()> {
    match key.extract::<i64>() {
        Ok(i) => keys::encode_int_key(i, out),
        Err(_) => {
            let as_int = key.py().get_type::<PyInt>().call1((key,))?;
            keys::encode_int_key_decimal(as_int.str()?.to_str()?, out).or_py(key.py())?;
        }
    }
    Ok(())
}

/// Run `f` with the full key bytes (prefix + stored form of the key) of a
/// bytes, str or int key. The stored forms are `nearcache_core::keys`'s, so
/// int keys and bytes keys never collide.
#[inline]
fn with_key<R>(
    prefix: &[u8],
    key: &Bound<'_, PyAny>,
    f: impl FnOnce(&[u8]) -> PyResult<R>,
) -> PyResult<R> {
    // Common case: text, or bytes stored as is, with no prefix: no copy.
    let plain: Option<&[u8]> = if let Ok(b) = key.cast_exact::<PyBytes>() {
        Some(b.as_bytes())
    } else if let Ok(s) = key.cast::<PyString>() {
        Some(s.to_str().map_err(|_| unencodable_key(key))?.as_bytes())
    } else if let Ok(b) = key.cast::<PyBytes>() {
        Some(b.as_bytes())
    } else {
        None
    };
    if let Some(raw) = plain {
        if prefix.is_empty() && keys::bytes_key_is_stored_as_is(raw) {
            return f(raw);
        }
        let mut buf = Vec::with_capacity(prefix.len() + raw.len() + 1);
        buf.extend_from_slice(prefix);
        // A str's UTF-8 never starts with 0xFE/0xFF, so this escapes bytes only.
        keys::encode_bytes_key(raw, &mut buf);
        return f(&buf);
    }
    if key.cast::<PyInt>().is_ok() {
        let mut buf = Vec::with_capacity(prefix.len() + 24);
        buf.extend_from_slice(prefix);
        int_key(key, &mut buf)?;
        return f(&buf);
    }
    Err(raise(
        key.py(),
        &KEY_TYPE,
        format!("cache keys must be str, bytes or int, not {}", key.get_type().name()?),
    ))
}

/// `InvalidKeyError` for a str key with lone surrogates (no UTF-8 form).
fn unencodable_key(key: &Bound<'_, PyAny>) -> PyErr {
    let shown = key.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into());
    raise(
        key.py(),
        &BAD_KEY,
        format!("cache key {shown} is not valid Unicode (it has a lone surrogate), so has no UTF-8 form"),
    )
}

/// Iterate a collection of keys; a bare str/bytes/bytearray is refused
/// (iterating it would give its characters or byte values, not one key).
fn key_iter<'py>(keys: &Bound<'py, PyAny>) -> PyResult<Bound<'py, pyo3::types::PyIterator>> {
    if keys.is_instance_of::<PyString>()
        || keys.is_instance_of::<PyBytes>()
        || keys.is_instance_of::<PyByteArray>()
    {
        let kind = keys.get_type().name()?;
        return Err(raise(
            keys.py(),
            &KEY_TYPE,
            format!(
                "expected a collection of keys, got a {kind} ({}); wrap a single key in a list",
                keys.repr()?
            ),
        ));
    }
    keys.try_iter()
}

fn collect_keys(prefix: &[u8], keys: &Bound<'_, PyAny>) -> PyResult<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    for k in key_iter(keys)? {
        let k = k?;
        out.push(with_key(prefix, &k, |b| Ok(b.to_vec()))?);
    }
    Ok(out)
}

/// Borrow the bytes of a bytes/bytearray value.
fn with_value<R>(value: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> PyResult<R>) -> PyResult<R> {
    if let Ok(b) = value.cast::<PyBytes>() {
        f(b.as_bytes())
    } else if let Ok(b) = value.cast::<PyByteArray>() {
        f(&b.to_vec())
    } else {
        Err(PyTypeError::new_err(format!(
            "values must be bytes or bytearray here, not {}",
            value.get_type().name()?
        )))
    }
}

/// Encode a native Python value as (payload, flag). Exact types only, so a
/// subclass (an IntEnum, a str subclass) is left to the serializer.
fn encode_native(value: &Bound<'_, PyAny>) -> PyResult<(Vec<u8>, u32)> {
    if let Ok(b) = value.cast_exact::<PyBytes>() {
        Ok((b.as_bytes().to_vec(), FLAG_BYTES))
    } else if let Ok(s) = value.cast_exact::<PyString>() {
        Ok((s.to_str()?.as_bytes().to_vec(), FLAG_STR))
    } else if value.is_exact_instance_of::<PyBool>() {
        Ok((vec![value.is_truthy()? as u8], FLAG_BOOL))
    } else if value.is_exact_instance_of::<PyInt>() {
        let v: i64 = value.extract().map_err(|_| {
            PyOverflowError::new_err("int outside the signed 64-bit range (serialize it instead)")
        })?;
        Ok((v.to_le_bytes().to_vec(), FLAG_INT))
    } else if value.is_exact_instance_of::<PyFloat>() {
        let v: f64 = value.extract()?;
        Ok((v.to_le_bytes().to_vec(), FLAG_FLOAT))
    } else if value.is_none() {
        Ok((Vec::new(), FLAG_NONE))
    } else {
        Err(PyTypeError::new_err(format!(
            "{} is not a natively stored type (bytes, str, int, float, bool, None)",
            value.get_type().name()?
        )))
    }
}

/// A raw hit: the value and its flags.
type RawHit<'py> = (Bound<'py, PyBytes>, u32);

/// Values at least this long in shared memory are written into their
/// `bytes` object in chunks rather than into a zeroed buffer: one pass over
/// the value's memory instead of two. A spilled value is read with one
/// `pread` into the zeroed buffer instead: one system call beats a chunked
/// copy there (both measured: `benchmarks/results/value-sizes.md`).
const CHUNKED_COPY: usize = 64 * 1024;

/// A new `bytes` holding the entry's value, copied straight from the
/// mapping or its spilled file (a `bytes` object cannot start the garbage
/// collector).
fn value_bytes<'py>(py: Python<'py>, e: &EntryRef<'_>) -> PyResult<Bound<'py, PyBytes>> {
    if e.len() >= CHUNKED_COPY && !e.is_spilled() {
        return PyBytes::new_with_writer(py, e.len(), |w| Ok(e.write_to(w)?));
    }
    PyBytes::new_with(py, e.len(), |buf| {
        e.copy_to(buf);
        Ok(())
    })
}

/// The entry's value and flags.
fn raw_hit<'py>(py: Python<'py>, e: &EntryRef<'_>) -> PyResult<RawHit<'py>> {
    value_bytes(py, e).map(|b| (b, e.flags()))
}

/// What a typed read copied out under the lock.
enum Fetched<'py> {
    Bytes(Bound<'py, PyBytes>),
    Small(u32, usize, [u8; 16]),
    Text(Vec<u8>),
    Other(u32, Bound<'py, PyBytes>),
}

/// Copy an entry out under the lock, creating only `bytes` objects there.
fn fetch<'py>(py: Python<'py>, e: EntryRef<'_>) -> PyResult<Fetched<'py>> {
    let flags = e.flags();
    let n = e.len();
    match flags {
        FLAG_BYTES => Ok(Fetched::Bytes(value_bytes(py, &e)?)),
        FLAG_STR => Ok(Fetched::Text(e.to_vec())),
        FLAG_INT | FLAG_FLOAT | FLAG_BOOL | FLAG_NONE if n <= 16 => {
            let mut buf = [0u8; 16];
            e.copy_to(&mut buf[..n]);
            Ok(Fetched::Small(flags, n, buf))
        }
        _ => Ok(Fetched::Other(flags, value_bytes(py, &e)?)),
    }
}

/// Turn fetched data into the Python value; `None` if a native payload is
/// malformed (treated as a miss: never hand out a wrong value).
fn decode<'py>(py: Python<'py>, f: Fetched<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
    Ok(Some(match f {
        Fetched::Bytes(b) => b.into_any(),
        Fetched::Text(v) => match std::str::from_utf8(&v) {
            Ok(s) => PyString::new(py, s).into_any(),
            Err(_) => return Ok(None),
        },
        Fetched::Small(FLAG_INT, 8, b) => {
            i64::from_le_bytes(b[..8].try_into().expect("8")).into_pyobject(py)?.into_any()
        }
        Fetched::Small(FLAG_FLOAT, 8, b) => {
            PyFloat::new(py, f64::from_le_bytes(b[..8].try_into().expect("8"))).into_any()
        }
        Fetched::Small(FLAG_BOOL, 1, b) if b[0] <= 1 => {
            PyBool::new(py, b[0] == 1).to_owned().into_any()
        }
        Fetched::Small(FLAG_NONE, 0, _) => py.None().into_bound(py),
        Fetched::Small(..) => return Ok(None),
        Fetched::Other(flags, b) => {
            PyTuple::new(py, [flags.into_pyobject(py)?.into_any(), b.into_any()])?.into_any()
        }
    }))
}

fn ttl_arg(py: Python<'_>, ttl_ms: Option<i64>, default: u64) -> PyResult<u64> {
    match ttl_ms {
        None => Ok(default),
        Some(t) if t >= 0 => Ok(t as u64),
        Some(t) => Err(raise(py, &INVALID, format!("ttl_ms must be >= 0 or None, got {t}"))),
    }
}

// ---------------------------------------------------------------- class

static MISSING: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

fn missing(py: Python<'_>) -> Bound<'_, PyAny> {
    MISSING.get(py).expect("module initialised").bind(py).clone()
}

/// One shared-memory cache file, mapped into this process.
#[pyclass(frozen, module = "nearcache._native")]
struct NativeCache {
    inner: Cache,
    prefix: Vec<u8>,
    default_ttl_ms: u64,
    /// Called as `decoder(flags, payload)` for entries with flags >=
    /// FLAG_USER by the typed reads; returns the value, or MISSING for "treat
    /// as a miss". Without one, those reads return `(flags, payload)`.
    decoder: Option<Py<PyAny>>,
    /// on_lock_timeout="skip": a write that times out on a shard lock is
    /// skipped (reported as "not stored"/"not found") instead of raising.
    skip_lock_timeouts: bool,
}

impl NativeCache {
    /// The result of a write, with the lock-timeout policy applied.
    #[inline]
    fn write_outcome<T>(&self, py: Python<'_>, r: Result<T, CoreError>, skipped: T) -> PyResult<T> {
        match r {
            Err(CoreError::LockTimeout { .. }) if self.skip_lock_timeouts => Ok(skipped),
            r => r.or_py(py),
        }
    }

    /// The Python value of a typed read: `default` on a miss, a malformed
    /// native payload or a decoder's MISSING.
    #[inline]
    fn typed_result<'py>(
        &self,
        py: Python<'py>,
        got: Option<PyResult<Fetched<'py>>>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        match got {
            // The common case first: raw bytes need no decoding.
            Some(Ok(Fetched::Bytes(b))) => Ok(b.into_any()),
            Some(f) => match self.finish(py, f?)? {
                Some(v) => Ok(v),
                None => Ok(default.unwrap_or_else(|| py.None().into_bound(py))),
            },
            None => Ok(default.unwrap_or_else(|| py.None().into_bound(py))),
        }
    }

    /// Decode a fetched entry, through the decoder for user flags. None
    /// means "treat as a miss".
    fn finish<'py>(&self, py: Python<'py>, f: Fetched<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        match (f, &self.decoder) {
            (Fetched::Other(flags, payload), Some(decoder)) => {
                let v = decoder.bind(py).call1((flags, payload))?;
                Ok(if v.is(missing(py)) { None } else { Some(v) })
            }
            (f, _) => decode(py, f),
        }
    }

    /// `get_typed(key, default, version=True)`: `(value, version)`, with
    /// version 0 on a miss. An entry that does not decode (a malformed
    /// native payload, a decoder's MISSING) reads as `default` with its
    /// real version, so that a CAS with it can replace the entry.
    #[cold]
    fn get_typed_versioned<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let got = with_key(&self.prefix, key, |k| {
            self.inner.get_versioned_with(k, |e| fetch(py, e)).or_py(py)
        })?;
        let (got, version) = match got {
            Some((f, v)) => (Some(f), v),
            None => (None, 0),
        };
        let value = self.typed_result(py, got, default)?;
        Ok(PyTuple::new(py, [value, version.into_pyobject(py)?.into_any()])?.into_any())
    }

    /// The result of a CAS: `(stored, version)`, the new version if it
    /// stored, else the version found (0: absent).
    fn cas_result(
        &self,
        py: Python<'_>,
        r: Result<CasOutcome, CoreError>,
    ) -> PyResult<(bool, u64)> {
        match r.or_py(py)? {
            CasOutcome::Stored(v) => Ok((true, v)),
            CasOutcome::Conflict(v) => Ok((false, v)),
        }
    }

    fn store(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &[u8],
        flags: u32,
        ttl: u64,
        mode: SetMode,
    ) -> PyResult<bool> {
        with_key(&self.prefix, key, |k| {
            self.write_outcome(py, self.inner.store(k, value, flags, ttl, mode), false)
        })
    }
}

/// A NativeCache's options, parsed and checked once: opens handles on its
/// file with no argument parsing. Python's `Cache` keeps one per set of
/// options, so that opening the same cache again (per request) costs the
/// engine's open and little more.
///
/// It holds no file, descriptor or mapping: every `open` is a full open of
/// the path, as `NativeCache(...)` makes it (a file replaced or removed
/// meanwhile is noticed there).
#[pyclass(frozen, module = "nearcache._native")]
struct Opener {
    path: std::path::PathBuf,
    /// `create` and `recreate` are set by each open.
    opts: OpenOptions,
    /// With no size: the size of the file created when none exists (the
    /// open first looks for an existing file, as `create=False` does).
    size_if_missing: Option<usize>,
    prefix: Vec<u8>,
    default_ttl_ms: u64,
    decoder: Option<Py<PyAny>>,
    skip_lock_timeouts: bool,
    /// What a `Reader` made by `open_get` pickles as (`__reduce__`'s value).
    reduce_get: Option<Py<PyAny>>,
}

impl Opener {
    /// Open the file: a full open, every time.
    fn open_native(&self, py: Python<'_>, recreate: bool, create: bool) -> PyResult<NativeCache> {
        let mut opts = self.opts.clone();
        opts.recreate = recreate;
        let inner = match self.size_if_missing {
            // The file usually exists: one open, no separate stat.
            Some(size) => {
                opts.create = false;
                match Cache::open(&self.path, &opts) {
                    Err(CoreError::Io { ref source, .. })
                        if create && source.kind() == std::io::ErrorKind::NotFound =>
                    {
                        opts.size = Some(size);
                        opts.create = true;
                        Cache::open(&self.path, &opts)
                    }
                    r => r,
                }
            }
            None => {
                opts.create = create;
                Cache::open(&self.path, &opts)
            }
        }
        .or_py(py)?;
        Ok(NativeCache {
            inner,
            prefix: self.prefix.clone(),
            default_ttl_ms: self.default_ttl_ms,
            decoder: self.decoder.as_ref().map(|d| d.clone_ref(py)),
            skip_lock_timeouts: self.skip_lock_timeouts,
        })
    }
}

#[pymethods]
impl Opener {
    /// Parse and check the options: every check of `NativeCache(...)`
    /// (which builds through this), with the same errors.
    #[new]
    #[pyo3(signature = (path, size, shards=0, *, default_ttl_ms=0, prefix=Vec::new(), allow_foreign_owner=false, decoder=None, lock_timeout_ms=50.0, on_lock_timeout="raise", spill_threshold=None, spill_budget=None, size_if_missing=0, fs_reserve=None, reduce_get=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        size: i64,
        shards: i64,
        default_ttl_ms: i64,
        prefix: Vec<u8>,
        allow_foreign_owner: bool,
        decoder: Option<Bound<'_, PyAny>>,
        lock_timeout_ms: f64,
        on_lock_timeout: &str,
        spill_threshold: Option<u64>,
        spill_budget: Option<u64>,
        size_if_missing: i64,
        fs_reserve: Option<u64>,
        reduce_get: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let skip_lock_timeouts = match on_lock_timeout {
            "raise" => false,
            "skip" => true,
            other => {
                return Err(raise(
                    py,
                    &INVALID,
                    format!("on_lock_timeout must be 'raise' or 'skip', got {other:?}"),
                ))
            }
        };
        if !(0.0..=3.6e6).contains(&lock_timeout_ms) {
            return Err(raise(
                py,
                &INVALID,
                format!("lock_timeout_ms must be between 0 and 3600000, got {lock_timeout_ms}"),
            ));
        }
        if let Some(d) = &decoder {
            if !d.is_callable() {
                return Err(PyTypeError::new_err("decoder must be callable"));
            }
        }
        if size < 0 {
            return Err(raise(py, &INVALID, format!("size must be >= 0, got {size}")));
        }
        if size_if_missing < 0 {
            return Err(raise(
                py,
                &INVALID,
                format!("size_if_missing must be >= 0, got {size_if_missing}"),
            ));
        }
        if !(0..=65536).contains(&shards) {
            return Err(raise(
                py,
                &INVALID,
                format!("shards must be 0 (auto) or a power of two up to 65536, got {shards}"),
            ));
        }
        if default_ttl_ms < 0 {
            return Err(raise(
                py,
                &INVALID,
                format!("default_ttl_ms must be >= 0, got {default_ttl_ms}"),
            ));
        }
        let opts = OpenOptions {
            size: if size == 0 { None } else { Some(size as usize) },
            shards: shards as usize,
            allow_foreign_owner,
            lock_timeout: std::time::Duration::from_secs_f64(lock_timeout_ms / 1000.0),
            spill_threshold: spill_threshold.map(|t| t.min(usize::MAX as u64) as usize),
            spill_budget: spill_budget.unwrap_or(nearcache_core::file::DEFAULT_SPILL_BUDGET),
            fs_reserve,
            ..OpenOptions::default()
        };
        Ok(Opener {
            path,
            size_if_missing: (size == 0 && size_if_missing > 0).then_some(size_if_missing as usize),
            opts,
            prefix,
            default_ttl_ms: default_ttl_ms as u64,
            decoder: decoder.map(Bound::unbind),
            skip_lock_timeouts,
            reduce_get: reduce_get.map(Bound::unbind),
        })
    }

    /// A new handle on the file, opened as `NativeCache(...)` with these
    /// options opens it.
    #[pyo3(signature = (recreate=false, create=true))]
    fn open(&self, py: Python<'_>, recreate: bool, create: bool) -> PyResult<NativeCache> {
        self.open_native(py, recreate, create)
    }

    /// `open`, and the typed `get` of the new handle: a `Reader`'s bound
    /// method, which pickles as `reduce_get` says.
    #[pyo3(signature = (recreate=false, create=true))]
    fn open_get<'py>(
        &self,
        py: Python<'py>,
        recreate: bool,
        create: bool,
    ) -> PyResult<(Bound<'py, NativeCache>, Bound<'py, PyAny>)> {
        let native = Bound::new(py, self.open_native(py, recreate, create)?)?;
        let reader = Reader {
            native: native.clone().unbind(),
            reduce: self.reduce_get.as_ref().map(|r| r.clone_ref(py)),
        };
        let get = Bound::new(py, reader)?.getattr(pyo3::intern!(py, "get"))?;
        Ok((native, get))
    }

    #[getter]
    fn path(&self) -> String {
        self.path.to_string_lossy().into_owned()
    }

    fn __repr__(&self) -> String {
        format!("Opener(path={:?})", self.path)
    }
}

#[pymethods]
impl NativeCache {
    #[new]
    #[pyo3(signature = (path, size, shards=0, *, default_ttl_ms=0, prefix=Vec::new(), recreate=false, allow_foreign_owner=false, create=true, decoder=None, lock_timeout_ms=50.0, on_lock_timeout="raise", spill_threshold=None, spill_budget=None, fs_reserve=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        path: std::path::PathBuf,
        size: i64,
        shards: i64,
        default_ttl_ms: i64,
        prefix: Vec<u8>,
        recreate: bool,
        allow_foreign_owner: bool,
        create: bool,
        decoder: Option<Bound<'_, PyAny>>,
        lock_timeout_ms: f64,
        on_lock_timeout: &str,
        spill_threshold: Option<u64>,
        spill_budget: Option<u64>,
        fs_reserve: Option<u64>,
    ) -> PyResult<Self> {
        Opener::new(
            py,
            path,
            size,
            shards,
            default_ttl_ms,
            prefix,
            allow_foreign_owner,
            decoder,
            lock_timeout_ms,
            on_lock_timeout,
            spill_threshold,
            spill_budget,
            0,
            fs_reserve,
            None,
        )?
        .open_native(py, recreate, create)
    }

    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }
    #[getter]
    fn capacity(&self) -> usize {
        self.inner.capacity()
    }
    #[getter]
    fn shard_count(&self) -> usize {
        self.inner.shard_count()
    }
    #[getter]
    fn max_entry_size(&self) -> usize {
        self.inner.max_entry_size()
    }
    #[getter]
    fn max_value_size(&self) -> u64 {
        self.inner.max_value_size()
    }
    #[getter]
    fn spill_threshold(&self) -> usize {
        self.inner.spill_threshold()
    }
    #[getter]
    fn default_ttl_ms(&self) -> u64 {
        self.default_ttl_ms
    }
    #[getter]
    fn lock_timeout_ms(&self) -> f64 {
        self.inner.lock_timeout().as_secs_f64() * 1000.0
    }
    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }
    #[getter]
    fn prefix<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.prefix)
    }

    // ---- raw bytes path

    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        with_key(&self.prefix, key, |k| {
            self.inner.get_with(k, |e| value_bytes(py, &e)).or_py(py)?.transpose()
        })
    }

    fn get_entry<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        with_key(&self.prefix, key, |k| {
            let got = self.inner.get_with(k, |e| raw_hit(py, &e)).or_py(py)?;
            got.transpose()
        })
    }

    #[pyo3(signature = (key, value, ttl_ms=None, flags=0))]
    fn set(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl_ms: Option<i64>,
        flags: u32,
    ) -> PyResult<()> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        with_value(value, |v| self.store(py, key, v, flags, ttl, SetMode::Always)).map(|_| ())
    }

    #[pyo3(signature = (key, value, ttl_ms=None, flags=0))]
    fn add(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl_ms: Option<i64>,
        flags: u32,
    ) -> PyResult<bool> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        with_value(value, |v| self.store(py, key, v, flags, ttl, SetMode::IfAbsent))
    }

    #[pyo3(signature = (key, value, ttl_ms=None, flags=0))]
    fn replace(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl_ms: Option<i64>,
        flags: u32,
    ) -> PyResult<bool> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        with_value(value, |v| self.store(py, key, v, flags, ttl, SetMode::IfPresent))
    }

    fn pop<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32)>> {
        with_key(&self.prefix, key, |k| {
            self.write_outcome(py, self.inner.pop_with(k, |e| raw_hit(py, &e)), None)?.transpose()
        })
    }

    // ---- typed path

    #[pyo3(signature = (key, default=None, *, version=false))]
    fn get_typed<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
        version: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        if version {
            return self.get_typed_versioned(py, key, default);
        }
        let got =
            with_key(&self.prefix, key, |k| self.inner.get_with(k, |e| fetch(py, e)).or_py(py))?;
        self.typed_result(py, got, default)
    }

    #[pyo3(signature = (key, value, ttl_ms=None))]
    fn set_typed(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl_ms: Option<i64>,
    ) -> PyResult<()> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        if let Ok(b) = value.cast_exact::<PyBytes>() {
            // Fast path: no intermediate copy.
            return self.store(py, key, b.as_bytes(), FLAG_BYTES, ttl, SetMode::Always).map(|_| ());
        }
        let (payload, flags) = encode_native(value)?;
        self.store(py, key, &payload, flags, ttl, SetMode::Always).map(|_| ())
    }

    #[pyo3(signature = (key, value, ttl_ms=None))]
    fn add_typed(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        ttl_ms: Option<i64>,
    ) -> PyResult<bool> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        let (payload, flags) = encode_native(value)?;
        self.store(py, key, &payload, flags, ttl, SetMode::IfAbsent)
    }

    #[pyo3(signature = (key, default=None))]
    fn pop_typed<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let got = with_key(&self.prefix, key, |k| {
            self.write_outcome(py, self.inner.pop_with(k, |e| fetch(py, e)), None)
        })?;
        self.typed_result(py, got, default)
    }

    // ---- the rest

    fn delete(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        with_key(&self.prefix, key, |k| self.write_outcome(py, self.inner.delete(k), false))
    }

    /// Delete `key` only if its raw value equals `value` (atomic).
    fn delete_if_equals(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        with_value(value, |v| {
            with_key(&self.prefix, key, |k| {
                self.write_outcome(py, self.inner.delete_if_equals(k, v), false)
            })
        })
    }

    // ---- versions and compare-and-swap

    /// The raw value, flags and version of `key`, or None.
    fn get_entry_versioned<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
    ) -> PyResult<Option<(Bound<'py, PyBytes>, u32, u64)>> {
        with_key(&self.prefix, key, |k| {
            let got = self.inner.get_versioned_with(k, |e| raw_hit(py, &e)).or_py(py)?;
            got.map(|(hit, v)| hit.map(|(b, f)| (b, f, v))).transpose()
        })
    }

    /// Store raw `value` with `flags` only if `key`'s version is `version`
    /// (0: only if absent); returns `(stored, version)`.
    #[pyo3(signature = (key, value, version, ttl_ms=None, flags=0))]
    fn cas(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        version: u64,
        ttl_ms: Option<i64>,
        flags: u32,
    ) -> PyResult<(bool, u64)> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        with_value(value, |v| {
            with_key(&self.prefix, key, |k| {
                self.cas_result(py, self.inner.cas(k, v, flags, ttl, version))
            })
        })
    }

    /// `cas` of a natively stored value (bytes, str, int, float, bool, None).
    #[pyo3(signature = (key, value, version, ttl_ms=None))]
    fn cas_typed(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        value: &Bound<'_, PyAny>,
        version: u64,
        ttl_ms: Option<i64>,
    ) -> PyResult<(bool, u64)> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        let (payload, flags) = encode_native(value)?;
        with_key(&self.prefix, key, |k| {
            self.cas_result(py, self.inner.cas(k, &payload, flags, ttl, version))
        })
    }

    /// Delete `key` only if its version is `version` (0 never matches).
    fn delete_if_version(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        version: u64,
    ) -> PyResult<bool> {
        with_key(&self.prefix, key, |k| self.inner.delete_if_version(k, version).or_py(py))
    }

    #[pyo3(signature = (key, ttl_ms=None))]
    fn touch(&self, py: Python<'_>, key: &Bound<'_, PyAny>, ttl_ms: Option<i64>) -> PyResult<bool> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        with_key(&self.prefix, key, |k| self.write_outcome(py, self.inner.touch(k, ttl), false))
    }

    fn expire_at_ms(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        with_key(&self.prefix, key, |k| self.inner.expires_at(k).or_py(py))
    }

    fn ttl_ms(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Option<u64>> {
        let exp = self.expire_at_ms(py, key)?;
        Ok(exp.map(|e| if e == 0 { 0 } else { e.saturating_sub(nearcache_core::now_ms()).max(1) }))
    }

    #[pyo3(
        signature = (key, delta=1, initial=Some(0), ttl_ms=None),
        text_signature = "($self, key, delta=1, initial=0, ttl_ms=None)"
    )]
    fn incr(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        delta: i128,
        initial: Option<i128>,
        ttl_ms: Option<i64>,
    ) -> PyResult<i64> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        let narrow = |v: i128| {
            i64::try_from(v).map_err(|_| {
                raise(py, &OVERFLOW, format!("{v} is outside the signed 64-bit range"))
            })
        };
        let delta = narrow(delta)?;
        let initial = initial.map(narrow).transpose()?;
        with_key(&self.prefix, key, |k| self.inner.incr(k, delta, initial, ttl).or_py(py))
    }

    fn contains(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        with_key(&self.prefix, key, |k| self.inner.contains(k).or_py(py))
    }

    fn __contains__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        self.contains(py, key)
    }

    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        if self.prefix.is_empty() {
            self.inner.len().or_py(py)
        } else {
            let mut n = 0;
            self.inner.for_each_key(|k, _| n += k.starts_with(&self.prefix) as usize).or_py(py)?;
            Ok(n)
        }
    }

    fn get_many<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let keys = collect_keys(&self.prefix, keys)?;
        let mut out: Vec<Option<PyResult<RawHit<'py>>>> = (0..keys.len()).map(|_| None).collect();
        self.inner
            .get_many_with(&keys, |i, e| {
                out[i] = Some(raw_hit(py, &e));
            })
            .or_py(py)?;
        let items: Vec<Bound<'py, PyAny>> = out
            .into_iter()
            .map(|o| match o {
                Some(r) => r.and_then(|t| Ok(t.into_pyobject(py)?.into_any())),
                None => Ok(py.None().into_bound(py)),
            })
            .collect::<PyResult<_>>()?;
        PyList::new(py, items)
    }

    fn get_many_typed<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyList>> {
        let keys = collect_keys(&self.prefix, keys)?;
        let mut out: Vec<Option<PyResult<Fetched<'py>>>> = (0..keys.len()).map(|_| None).collect();
        self.inner.get_many_with(&keys, |i, e| out[i] = Some(fetch(py, e))).or_py(py)?;
        let items: Vec<Bound<'py, PyAny>> = out
            .into_iter()
            .map(|o| match o {
                Some(f) => Ok(self.finish(py, f?)?.unwrap_or_else(|| missing(py))),
                None => Ok(missing(py)),
            })
            .collect::<PyResult<_>>()?;
        PyList::new(py, items)
    }

    /// Hits of many keys as a dict {key: value} (keys as given; misses and
    /// rejected entries left out), one lock hold per shard.
    fn get_many_map<'py>(
        &self,
        py: Python<'py>,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let originals: Vec<Bound<'py, PyAny>> = key_iter(keys)?.collect::<PyResult<_>>()?;
        let raw: Vec<Vec<u8>> = originals
            .iter()
            .map(|k| with_key(&self.prefix, k, |b| Ok(b.to_vec())))
            .collect::<PyResult<_>>()?;
        let mut out: Vec<Option<PyResult<Fetched<'py>>>> = (0..raw.len()).map(|_| None).collect();
        self.inner.get_many_with(&raw, |i, e| out[i] = Some(fetch(py, e))).or_py(py)?;
        let d = PyDict::new(py);
        for (key, got) in originals.iter().zip(out) {
            if let Some(f) = got {
                if let Some(v) = match f? {
                    Fetched::Bytes(b) => Some(b.into_any()),
                    other => self.finish(py, other)?,
                } {
                    d.set_item(key, v)?;
                }
            }
        }
        Ok(d)
    }

    #[pyo3(signature = (items, ttl_ms=None))]
    fn set_many(
        &self,
        py: Python<'_>,
        items: &Bound<'_, PyAny>,
        ttl_ms: Option<i64>,
    ) -> PyResult<()> {
        let ttl = ttl_arg(py, ttl_ms, self.default_ttl_ms)?;
        let mut triples: Vec<(Vec<u8>, Vec<u8>, u32)> = Vec::new();
        for item in items.try_iter()? {
            let item = item?;
            let (k, v, f): (Bound<'_, PyAny>, Bound<'_, PyAny>, u32) = item.extract()?;
            let key = with_key(&self.prefix, &k, |b| Ok(b.to_vec()))?;
            let val = with_value(&v, |b| Ok(b.to_vec()))?;
            triples.push((key, val, f));
        }
        self.write_outcome(py, self.inner.set_many(&triples, ttl), ())
    }

    fn delete_many(&self, py: Python<'_>, keys: &Bound<'_, PyAny>) -> PyResult<usize> {
        let keys = collect_keys(&self.prefix, keys)?;
        self.write_outcome(py, self.inner.delete_many(&keys), 0)
    }

    /// How the file's shards choose their admission mode: "adaptive" (the
    /// default), "strict" or "lenient".
    fn eviction_mode(&self, py: Python<'_>) -> PyResult<&'static str> {
        Ok(match self.inner.eviction_mode().or_py(py)? {
            EvictionMode::Adaptive => "adaptive",
            EvictionMode::Strict => "strict",
            EvictionMode::Lenient => "lenient",
        })
    }

    /// Pin the admission mode of every shard (kept in the file).
    fn set_eviction_mode(&self, py: Python<'_>, mode: &str) -> PyResult<()> {
        let m = match mode {
            "adaptive" => EvictionMode::Adaptive,
            "strict" => EvictionMode::Strict,
            "lenient" => EvictionMode::Lenient,
            other => {
                return Err(raise(
                    py,
                    &INVALID,
                    format!(
                        "eviction mode must be 'adaptive', 'strict' or 'lenient', got {other:?}"
                    ),
                ))
            }
        };
        self.inner.set_eviction_mode(m).or_py(py)
    }

    /// How many shards admit new entries strictly now.
    fn strict_shards(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.strict_shards().or_py(py)
    }

    /// How many shards admit leniently now and keep half their entries
    /// young instead of a twelfth.
    fn young_half_shards(&self, py: Python<'_>) -> PyResult<usize> {
        self.inner.young_half_shards().or_py(py)
    }

    /// Remove every entry (only this prefix's entries when a prefix is set).
    fn clear(&self, py: Python<'_>) -> PyResult<()> {
        if self.prefix.is_empty() {
            return self.inner.clear().or_py(py);
        }
        let mut mine = Vec::new();
        self.inner
            .for_each_key(|k, _| {
                if k.starts_with(&self.prefix) {
                    mine.push(k.to_vec())
                }
            })
            .or_py(py)?;
        self.inner.delete_many(&mine).or_py(py).map(|_| ())
    }

    fn keys<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut out = Vec::new();
        self.inner
            .for_each_key(|k, _| {
                if let Some(rest) = k.strip_prefix(self.prefix.as_slice()) {
                    out.push(rest.to_vec())
                }
            })
            .or_py(py)?;
        PyList::new(py, out.iter().map(|k| PyBytes::new(py, k)))
    }

    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.inner.stats().or_py(py)?;
        let d = PyDict::new(py);
        for (k, v) in s.fields() {
            d.set_item(k, v)?;
        }
        d.set_item("shards", self.inner.shard_count())?;
        d.set_item("file_bytes", self.inner.capacity())?;
        Ok(d)
    }

    fn shard_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let all = self.inner.shard_stats().or_py(py)?;
        let list = PyList::empty(py);
        for s in all {
            let d = PyDict::new(py);
            for (k, v) in s.fields() {
                d.set_item(k, v)?;
            }
            list.append(d)?;
        }
        Ok(list)
    }

    fn check<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let r = self.inner.check().or_py(py)?;
        let d = PyDict::new(py);
        d.set_item("shards", r.shards)?;
        d.set_item("entries", r.entries)?;
        d.set_item("live_bytes", r.live_bytes)?;
        Ok(d)
    }

    fn shard_of(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<usize> {
        with_key(&self.prefix, key, |k| {
            if self.inner.is_closed() {
                return Err(to_py(py, CoreError::Closed));
            }
            Ok(self.inner.shard_index(k))
        })
    }

    fn flush(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.flush().or_py(py)
    }

    /// Resize the file live to `size` bytes (`shards`: 0 to choose from
    /// the size); returns the geometry the cache has then, as
    /// `{"capacity", "shards"}` (another resize already under way wins).
    /// The GIL is released: the move takes as long as copying the entries.
    #[pyo3(signature = (size, shards = 0))]
    fn resize<'py>(
        &self,
        py: Python<'py>,
        size: usize,
        shards: usize,
    ) -> PyResult<Bound<'py, PyDict>> {
        let g = py.detach(|| self.inner.resize(size, shards)).or_py(py)?;
        let d = PyDict::new(py);
        d.set_item("capacity", g.total_size())?;
        d.set_item("shards", g.shard_count)?;
        Ok(d)
    }

    fn close(&self) {
        self.inner.close()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, _exc: &Bound<'_, PyTuple>) {
        self.inner.close()
    }

    fn __repr__(&self) -> String {
        format!(
            "NativeCache(path={:?}, capacity={}, shards={}{})",
            self.inner.path(),
            self.inner.capacity(),
            self.inner.shard_count(),
            if self.inner.is_closed() { ", closed" } else { "" }
        )
    }

    /// Test hook for crash-recovery tests: lock the key's shard, leave it
    /// half-written and sleep `seconds` (the caller is expected to be
    /// killed meanwhile). Releases the GIL while sleeping.
    fn _debug_hold_shard_mid_write(
        &self,
        py: Python<'_>,
        key: &Bound<'_, PyAny>,
        seconds: f64,
    ) -> PyResult<()> {
        let k = with_key(&self.prefix, key, |k| Ok(k.to_vec()))?;
        let d = std::time::Duration::from_secs_f64(seconds.max(0.0));
        py.detach(|| self.inner.debug_hold_shard_mid_write(&k, d)).or_py(py)
    }

    /// Test hook for the torture harness: sweep the spill directory now,
    /// sparing files changed less than `grace` seconds ago; returns the
    /// files removed. Releases the GIL.
    fn _debug_sweep_spilled(&self, py: Python<'_>, grace: f64) -> PyResult<u64> {
        let d = std::time::Duration::from_secs_f64(grace.max(0.0));
        py.detach(|| self.inner.sweep_spilled(d)).map(|r| r.removed).or_py(py)
    }
}

/// The typed read of one handle, as `nearcache.Cache.get` (an unsigned
/// cache's `get` is this class's bound method: a call goes from Python
/// straight to the engine, with no Python frame). Unlike a `NativeCache`
/// method it pickles (as its opener's `reduce_get`: reopening the cache),
/// and its errors name `get`.
#[pyclass(frozen, module = "nearcache._native")]
struct Reader {
    native: Py<NativeCache>,
    reduce: Option<Py<PyAny>>,
}

#[pymethods]
impl Reader {
    /// Return the value of `key`, or `default` on a miss.
    ///
    /// With `version=True`, `(value, version)`: the version names this
    /// value for a compare-and-swap (`NativeCache.get_typed`'s).
    #[pyo3(signature = (key, default=None, *, version=false))]
    fn get<'py>(
        &self,
        py: Python<'py>,
        key: &Bound<'py, PyAny>,
        default: Option<Bound<'py, PyAny>>,
        version: bool,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.native.get().get_typed(py, key, default, version)
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        match &self.reduce {
            Some(r) => Ok(r.bind(py).clone()),
            None => Err(PyTypeError::new_err("this cache's get cannot be pickled")),
        }
    }
}

/// `/dev/shm/nearcache-<uid>`, created 0700 on first use.
#[pyfunction]
fn default_directory(py: Python<'_>) -> PyResult<String> {
    Ok(nearcache_core::default_directory().or_py(py)?.to_string_lossy().into_owned())
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    register_exceptions(m)?;
    let py = m.py();
    let sentinel = py.import("builtins")?.getattr("object")?.call0()?;
    m.add("MISSING", &sentinel)?;
    let _ = MISSING.set(py, sentinel.unbind());
    m.add_class::<NativeCache>()?;
    m.add_class::<Opener>()?;
    m.add_class::<Reader>()?;
    m.add_function(wrap_pyfunction!(default_directory, m)?)?;
    m.add("FLAG_BYTES", FLAG_BYTES)?;
    m.add("FLAG_STR", FLAG_STR)?;
    m.add("FLAG_INT", FLAG_INT)?;
    m.add("FLAG_FLOAT", FLAG_FLOAT)?;
    m.add("FLAG_BOOL", FLAG_BOOL)?;
    m.add("FLAG_NONE", FLAG_NONE)?;
    m.add("FLAG_USER", FLAG_USER)?;
    m.add("LAYOUT_VERSION", nearcache_core::LAYOUT_VERSION)?;
    m.add("MAX_KEY_LEN", nearcache_core::MAX_KEY_LEN)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
