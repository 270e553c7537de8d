//! The hasher for readers: buffers handed over without a copy, and reads
//! that run on the digest workers.

use crate::algorithm::Algorithm;
use crate::checksum::Checksum;
use crate::construction::Construction;
use crate::options::{Options, OptionsError};
use crate::order::{BlockEvent, Engine};
use crate::pool::{Fill, Lend};
use std::fmt;
use std::io;

/// A [`Hasher`](crate::Hasher) that also takes data without copying it:
///
/// - [`submit`](Pipeline::submit) hands over a buffer of type `B` (aligned
///   buffers for direct I/O, a caller's memory in the C library); it comes
///   back from [`reclaim`](Pipeline::reclaim) once its blocks are digested.
/// - [`submit_with`](Pipeline::submit_with) hands over a read: a worker runs
///   it into its own buffer and digests the bytes while they are in its
///   cache. A read can fail, so [`finalize`](Pipeline::finalize) returns a
///   `Result`: no checksum for data not all read.
/// - [`submit_lent`](Pipeline::submit_lent) hands over bytes a worker
///   digests where they are (a memory map of a file: no copy at all); a
///   lend can fail too, after the fact.
///
/// The ways of giving data mix freely; the checksum only depends on the bytes.
///
/// ```
/// use blkhash::{Options, Pipeline};
/// let mut p = Pipeline::new(Options::new()).unwrap();
/// let mut buf = vec![7u8; 1 << 20];
/// for _ in 0..4 {
///     p.submit(buf);
///     buf = p.reclaim_wait().unwrap(); // a digested buffer, ready to refill
/// }
/// assert_eq!(p.finalize().unwrap(), blkhash::hash(vec![7u8; 4 << 20]));
/// ```
pub struct Pipeline<B = Vec<u8>>(Engine<B>);

impl<B: AsRef<[u8]> + Send + 'static> Pipeline<B> {
    /// A pipeline with `opts`, or why they are invalid or its worker
    /// threads could not start ([`OptionsError::ThreadStart`]).
    pub fn new(opts: Options) -> Result<Self, OptionsError> {
        Engine::new(opts).map(Pipeline)
    }

    engine_methods!();

    /// Hand over a buffer to digest without copying it (but for a part that
    /// straddles a block boundary left by an earlier call). It comes back from
    /// [`reclaim`](Pipeline::reclaim) or [`reclaim_wait`](Pipeline::reclaim_wait)
    /// once its blocks are digested. Waits while the queue is full.
    /// Panics past 2^64 - 1 bytes in all, as [`update`](Pipeline::update).
    pub fn submit(&mut self, buf: B) {
        self.0.submit(buf);
    }

    /// A buffer given to [`submit`](Pipeline::submit) and now digested, if any.
    pub fn reclaim(&mut self) -> Option<B> {
        self.0.reclaim()
    }

    /// Like [`reclaim`](Pipeline::reclaim), but waits for a submitted buffer
    /// still in flight; `None` only if none is.
    pub fn reclaim_wait(&mut self) -> Option<B> {
        self.0.reclaim_wait()
    }

    /// Add `len` bytes that `fill` produces (reads, typically) on a worker
    /// thread, into that worker's own page-aligned buffer, which it then
    /// digests while the bytes are in its cache. Fills run in parallel and in
    /// any order; their bytes join the checksum in call order.
    ///
    /// If a fill fails, nothing after it counts: this call, or
    /// [`finalize`](Pipeline::finalize), returns the error. Panics past
    /// 2^64 - 1 bytes in all, as [`update`](Pipeline::update).
    ///
    /// ```
    /// use blkhash::{Options, Pipeline};
    /// let mut p: Pipeline = Pipeline::new(Options::new()).unwrap();
    /// for i in 0..8u8 {
    ///     p.submit_with(1 << 20, Box::new(move |buf| { buf.fill(i); Ok(()) })).unwrap();
    /// }
    /// let sum = p.finalize().unwrap();
    ///
    /// // A failed fill fails the checksum, even if the caller ignores the error.
    /// for len in [65536, 4096] {
    ///     let mut failing: Pipeline = Pipeline::new(Options::new()).unwrap();
    ///     let _ = failing.submit_with(len, Box::new(|_| Err(std::io::Error::other("disk on fire"))));
    ///     assert!(failing.finalize().is_err());
    /// }
    /// ```
    pub fn submit_with(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        self.0.submit_with(len, fill)
    }

    /// Add `len` bytes that `lend` lends in place on a worker thread (a
    /// memory map of a file, say), which digests them there without a
    /// copy. Lends run in parallel and in any order; their bytes join the
    /// checksum in call order. `lend` must call its argument once with
    /// exactly `len` bytes; a lend that fails, even after lending its
    /// bytes (a mapping cut short under the worker), fails the checksum as
    /// a failed fill does. Panics past 2^64 - 1 bytes in all, as
    /// [`update`](Pipeline::update).
    ///
    /// ```
    /// use blkhash::{Options, Pipeline};
    /// use std::sync::Arc;
    /// let data: Arc<[u8]> = vec![9u8; 4 << 20].into();
    /// let mut p: Pipeline = Pipeline::new(Options::new()).unwrap();
    /// for i in 0..4 {
    ///     let data = data.clone();
    ///     p.submit_lent(1 << 20, Box::new(move |f| {
    ///         f(&data[i << 20..(i + 1) << 20]);
    ///         Ok(())
    ///     })).unwrap();
    /// }
    /// assert_eq!(p.finalize().unwrap(), blkhash::hash(&data[..]));
    ///
    /// // Bytes lent, then found not to be the source's: no checksum.
    /// let mut cut: Pipeline = Pipeline::new(Options::new()).unwrap();
    /// let _ = cut.submit_lent(65536, Box::new(|f| {
    ///     f(&[0u8; 65536]);
    ///     Err(std::io::Error::other("the file shrank while it was read"))
    /// }));
    /// assert!(cut.finalize().is_err());
    /// ```
    pub fn submit_lent(&mut self, len: usize, lend: Lend) -> io::Result<()> {
        self.0.submit_lent(len, lend)
    }

    /// [`update_zeros`](Pipeline::update_zeros) as the fills' other half:
    /// an error, not an abort, if memory for a partial block cannot be had,
    /// and an earlier failure's error; after an error nothing counts, as
    /// after a failed fill.
    ///
    /// ```
    /// use blkhash::{Options, Pipeline};
    /// let mut p: Pipeline = Pipeline::new(Options::new()).unwrap();
    /// p.add_zeros(100_000).unwrap();
    /// assert_eq!(p.finalize().unwrap(), blkhash::hash(vec![0u8; 100_000]));
    /// ```
    pub fn add_zeros(&mut self, len: u64) -> io::Result<()> {
        self.0.add_zeros(len)
    }

    /// Finish: the checksum of everything given, or the error of the first
    /// fill or lend that failed.
    pub fn finalize(mut self) -> io::Result<Checksum> {
        self.0.drain();
        match self.0.failed() {
            Some(e) => Err(e),
            None => Ok(self.0.checksum()),
        }
    }
}

impl<B> fmt::Debug for Pipeline<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_as("Pipeline", f)
    }
}
