//! `blkhash.Hasher`: the blkhash construction as a hashlib-like object.

use crate::buffer::{Exported, RawSlice};
use crate::{check_threads, params, parse_construction};
use blkhash::{Algorithm, Options, OptionsError, Pipeline};
use pyo3::exceptions::{
    PyNotImplementedError, PyOSError, PyOverflowError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Below this, `update` copies the bytes into the hasher's staging buffers
/// keeping the GIL: releasing it would cost more than the copy.
const SMALL_UPDATE: usize = 64 << 10;
/// From this size on, `update` hands the bytes to the workers in place, in
/// pieces of at least `MIN_PIECE`, and waits for them. Below it, the bytes
/// are copied into the hasher's 1 MiB staging jobs instead, which the
/// workers digest while the caller goes on: waiting for small pieces would
/// leave the workers idle (64 KiB updates in place ran at a third of the
/// copying speed on 2 threads).
const IN_PLACE_MIN: usize = 1 << 20;
const MIN_PIECE: usize = 256 << 10;
/// `zero` adds its zeros in steps of as many blocks as have this many bytes
/// of digests (a zero block costs its digest fed to the outer digest: 2 MiB
/// of them take a millisecond or so)...
const ZERO_STEP_DIGESTS: u64 = 2 << 20;
/// ...and looks for signals (Ctrl-C) whenever this long has passed: a
/// terabyte of zeros in small blocks takes minutes, 2**62 bytes days.
const SIGNAL_POLL: Duration = Duration::from_millis(50);

enum State {
    /// Hashing.
    Open(Box<Pipeline<RawSlice>>),
    /// Finalized: the digest, kept so that `digest()` can be called again.
    Done(Vec<u8>),
    /// A `zero()` was interrupted: it holds only part of those zeros.
    Interrupted,
    /// An internal error (a panic) stopped it.
    Broken,
}

/// A blkhash hasher, used like a hashlib object::
///
///     h = blkhash.new("sha256")
///     h.update(b"data")
///     h.zero(1 << 30)
///     print(h.hexdigest())
///
/// Its digest is the blkhash checksum of the bytes given, the same as
/// ``blkhash.checksum()`` of an image holding them, and as blksum and
/// libblkhash 0.11 give. (A raw file's bytes are not the image
/// ``checksum()`` hashes when its size is not a multiple of 512: the image
/// is rounded up to 512 with zeros, as QEMU sees it.)
///
/// Unlike a hashlib object, it cannot continue after ``digest()`` or
/// ``hexdigest()`` (both can be called again and return the same value;
/// ``update()`` and ``zero()`` then raise ValueError), and it cannot be
/// copied: its state lives in worker threads.
///
/// It may be used from several threads: calls on one hasher are serialized
/// (as hashlib does), and the GIL is released while hashing, so that several
/// hashers in several threads run in parallel.
#[pyclass(frozen, module = "blkhash", name = "Hasher")]
pub struct PyHasher {
    construction: blkhash::Construction,
    alg: Algorithm,
    block_size: usize,
    threads: usize,
    state: Mutex<State>,
}

#[pymethods]
impl PyHasher {
    /// The same as ``blkhash.new()``.
    #[new]
    #[pyo3(
        text_signature = "(name=None, data=None, *, block_size=None, threads=None, construction='blkhash')"
    )]
    #[pyo3(signature = (name = None, data = None, *, block_size = None, threads = None, construction = "blkhash"))]
    pub(crate) fn py_new(
        py: Python<'_>,
        name: Option<&str>,
        data: Option<&Bound<'_, PyAny>>,
        block_size: Option<i64>,
        threads: Option<i64>,
        construction: &str,
    ) -> PyResult<PyHasher> {
        let construction = parse_construction(construction)?;
        let (alg, block_size) = params(construction, name, block_size)?;
        let threads = check_threads(threads)?;
        let opts = Options::new()
            .construction(construction)
            .algorithm(alg)
            .block_size(block_size)
            .threads(threads);
        let hasher = Pipeline::new(opts).map_err(options_error)?;
        let h = PyHasher {
            construction,
            alg,
            block_size,
            threads,
            state: Mutex::new(State::Open(Box::new(hasher))),
        };
        if let Some(data) = data {
            h.update(py, data)?;
        }
        Ok(h)
    }

    /// Add the bytes of ``data``: any object with the buffer protocol
    /// (bytes, bytearray, memoryview, mmap, array.array...). From 1 MiB on
    /// it is read in place, without a copy, by the worker threads with the
    /// GIL released; smaller buffers are copied (cheaper than waiting for
    /// small pieces). ``data`` may be reused as soon as the call returns,
    /// and must not be modified by another thread during it (as with
    /// hashlib).
    fn update(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        let exported = Exported::get(data)?;
        let bytes = exported.raw();
        if bytes.len() < SMALL_UPDATE {
            // Uncontended: copy now, keeping the GIL (cheaper than releasing it).
            if let Ok(mut st) = self.state.try_lock() {
                fits(&st, bytes.len() as u64)?;
                return self.with_open(&mut st, |h| h.update(bytes.as_ref()));
            }
        }
        let threads = self.threads;
        // `exported` outlives this call: the workers read the bytes in place.
        py.detach(|| {
            let mut st = self.lock()?;
            fits(&st, bytes.len() as u64)?;
            if bytes.len() < IN_PLACE_MIN {
                self.with_open(&mut st, |h| h.update(bytes.as_ref()))
            } else {
                self.with_open(&mut st, |h| feed(h, bytes, threads))
            }
        })
    }

    /// Add ``length`` bytes of zeros, known to be zeros: nothing is
    /// allocated or read, and whole zero blocks cost no digest (a terabyte
    /// takes seconds with the default block size).
    ///
    /// Ctrl-C stops it (KeyboardInterrupt) within a fraction of a second;
    /// the hasher then holds part of the zeros, so it raises RuntimeError
    /// instead of giving a digest. Raises OverflowError, adding nothing,
    /// past 2**64 - 1 bytes in all: a checksum records the length in 64
    /// bits.
    fn zero(&self, py: Python<'_>, length: u64) -> PyResult<()> {
        py.detach(|| {
            let mut st = self.lock()?;
            fits(&st, length)?;
            // In steps, with a look for signals between them: one call
            // could otherwise run for days with Ctrl-C waiting. The GIL is
            // taken only for that look; the state lock is held throughout,
            // so no other call's bytes slip in between the steps (and no
            // deadlock: nobody waits for that lock while holding the GIL).
            let bs = self.block_size as u64;
            let blocks = ZERO_STEP_DIGESTS / (self.alg.output_len() as u64).max(1);
            let step = blocks.saturating_mul(bs);
            // The first step also completes a block begun earlier: the
            // others then start on block boundaries and cost no staging.
            let mut head = match &*st {
                State::Open(h) => (bs - h.len() % bs) % bs,
                _ => 0,
            };
            let mut left = length;
            let mut since = Instant::now();
            while left > 0 {
                let n = left.min(step.saturating_add(head));
                head = 0;
                self.with_open(&mut st, |h| h.update_zeros(n))?;
                left -= n;
                if left > 0 && since.elapsed() >= SIGNAL_POLL {
                    if let Err(e) = Python::attach(|py| py.check_signals()) {
                        *st = State::Interrupted;
                        return Err(e);
                    }
                    since = Instant::now();
                }
            }
            Ok(())
        })
    }

    /// The checksum of everything added. The first call finishes the
    /// hasher; later calls return the same bytes.
    fn digest<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let d = py.detach(|| self.finish())?;
        Ok(PyBytes::new(py, &d))
    }

    /// The checksum as lowercase hexadecimal, as blksum prints it.
    fn hexdigest(&self, py: Python<'_>) -> PyResult<String> {
        let d = py.detach(|| self.finish())?;
        Ok(blkhash::to_hex(&d))
    }

    /// Not supported: always raises NotImplementedError.
    fn copy(&self) -> PyResult<PyHasher> {
        Err(PyNotImplementedError::new_err(
            "a blkhash hasher cannot be copied: its state lives in its worker \
             threads (blocks being digested); hash the data twice instead",
        ))
    }

    /// The digest's name, as ``blkhash.new()`` takes it (for example "sha256").
    #[getter]
    fn name(&self) -> &'static str {
        self.alg.name()
    }

    /// The size of the checksum in bytes (that of the digest).
    #[getter]
    fn digest_size(&self) -> usize {
        self.alg.output_len()
    }

    /// The blkhash block size in bytes: the data is cut into blocks of this
    /// size, each digested on its own. Not the digest's internal block size,
    /// which hashlib's ``block_size`` is.
    #[getter]
    fn block_size(&self) -> usize {
        self.block_size
    }

    /// The number of digest worker threads.
    #[getter]
    fn threads(&self) -> usize {
        self.threads
    }

    /// How block digests become the checksum: "blkhash", "imageio" or "pbs".
    #[getter]
    fn construction(&self) -> &'static str {
        self.construction.name()
    }

    fn __repr__(&self) -> String {
        format!(
            "<blkhash.Hasher name={} block_size={} threads={}>",
            self.alg.name(),
            self.block_size,
            self.threads
        )
    }
}

impl PyHasher {
    fn lock(&self) -> PyResult<MutexGuard<'_, State>> {
        // A panic while hashing marks the state Broken before unwinding ends
        // (see with_open), so a poisoned lock still holds a usable state.
        Ok(self.state.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Run `f` on the open hasher. A panic inside becomes an error and
    /// breaks the hasher: its workers are joined before this returns, so
    /// none still reads a caller's buffer.
    fn with_open(&self, st: &mut State, f: impl FnOnce(&mut Pipeline<RawSlice>)) -> PyResult<()> {
        match st {
            State::Open(h) => {
                if catch_unwind(AssertUnwindSafe(|| f(h))).is_ok() {
                    return Ok(());
                }
                // Dropping the hasher joins its workers.
                *st = State::Broken;
                Err(broken())
            }
            State::Done(_) => Err(PyValueError::new_err(
                "blkhash hasher already finished: its digest was taken, so no \
                 more data can be added (make a new hasher)",
            )),
            State::Interrupted => Err(interrupted()),
            State::Broken => Err(broken()),
        }
    }

    /// Finalize once; the digest afterwards.
    fn finish(&self) -> PyResult<Vec<u8>> {
        let mut st = self.lock()?;
        match std::mem::replace(&mut *st, State::Broken) {
            State::Open(h) => match catch_unwind(AssertUnwindSafe(|| h.finalize())) {
                Ok(Ok(sum)) => {
                    let d = sum.as_bytes().to_vec();
                    *st = State::Done(d.clone());
                    Ok(d)
                }
                Ok(Err(e)) => Err(PyRuntimeError::new_err(format!("blkhash: {e}"))),
                Err(_) => Err(broken()),
            },
            State::Done(d) => {
                *st = State::Done(d.clone());
                Ok(d)
            }
            State::Interrupted => {
                *st = State::Interrupted;
                Err(interrupted())
            }
            State::Broken => Err(broken()),
        }
    }
}

fn broken() -> PyErr {
    PyRuntimeError::new_err("blkhash hasher stopped by an internal error")
}

fn interrupted() -> PyErr {
    PyRuntimeError::new_err(
        "blkhash hasher interrupted in zero(): it holds only part of those \
         zeros, so its digest would be wrong (make a new hasher)",
    )
}

/// ValueError for options out of range; OSError with the errno (EAGAIN:
/// BlockingIOError) when the system would not start the worker threads,
/// a limit on threads the caller may wait out.
fn options_error(e: OptionsError) -> PyErr {
    match e {
        OptionsError::ThreadStart { errno: Some(n) } => {
            let reason = blkjob::reason(&std::io::Error::from_raw_os_error(n));
            PyOSError::new_err((n, format!("cannot start a digest thread: {reason}")))
        }
        OptionsError::ThreadStart { errno: None } => PyOSError::new_err(e.to_string()),
        _ => PyValueError::new_err(e.to_string()),
    }
}

/// OverflowError unless `more` bytes fit: a checksum records the length
/// in 64 bits, so a hasher takes at most 2**64 - 1 bytes in all. Checked
/// before anything is added, so the call is as if not made.
fn fits(st: &State, more: u64) -> PyResult<()> {
    match st {
        State::Open(h) if h.len().checked_add(more).is_none() => {
            Err(PyOverflowError::new_err(format!(
                "a blkhash hasher takes at most 2**64 - 1 bytes in all: it has {}, \
                 {more} more would pass that",
                h.len()
            )))
        }
        _ => Ok(()),
    }
}

/// Hand `bytes` to the workers in place, in pieces of whole blocks (one per
/// worker, so that one call keeps them all busy, but not smaller than
/// `MIN_PIECE`), and wait until every piece is digested: then no worker
/// holds a pointer into the caller's buffer, which the caller may reuse as
/// soon as we return.
fn feed(h: &mut Pipeline<RawSlice>, bytes: RawSlice, threads: usize) {
    let len = bytes.len();
    let bs = h.block_size();
    // Bytes that complete a block begun by an earlier call: the first piece
    // takes them, so that the others start on block boundaries.
    let head = ((bs - (h.len() % bs as u64) as usize) % bs).min(len);
    let piece = (len - head)
        .div_ceil(threads.max(1))
        .max(MIN_PIECE)
        .next_multiple_of(bs);
    let mut pieces = 0;
    let mut start = 0;
    let mut end = (head + piece).min(len);
    loop {
        h.submit(bytes.sub(start, end));
        pieces += 1;
        if end == len {
            break;
        }
        start = end;
        end = (end + piece).min(len);
    }
    for _ in 0..pieces {
        // None only when nothing is in flight: then no piece is either.
        if h.reclaim_wait().is_none() {
            break;
        }
    }
}
