//! The blkhash construction: block digests from the pool, combined in order.

use crate::algorithm::{Algorithm, Streaming};
use crate::checksum::Checksum;
use crate::pool::{Done, Fill, Job, JobBuf, JobDone, Pool};
use crate::zero::is_zero;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;

/// Smallest and largest block sizes accepted (the reference's limits).
pub const MIN_BLOCK_SIZE: usize = 512;
pub const MAX_BLOCK_SIZE: usize = 64 << 20;
/// Largest worker count accepted.
pub const MAX_THREADS: usize = 128;
/// The default block size: 64 KiB.
pub const DEFAULT_BLOCK_SIZE: usize = 64 << 10;

/// Jobs in flight by default: with 1 MiB jobs, workers always find one
/// queued, and memory stays at a few MiB.
const DEFAULT_QUEUE_DEPTH: usize = 16;
/// Bytes of data an internal staging buffer gathers before it becomes a job.
const STAGING_SIZE: usize = 1 << 20;
/// Bytes of repeated zero-block digests given to the outer digest per update:
/// long updates are much faster than one per block (blake3 above all).
const ZERO_RUN_BYTES: usize = 256 << 10;

/// Invalid hasher options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionsError {
    BlockSize(usize),
    Threads(usize),
}

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OptionsError::BlockSize(n) => write!(
                f,
                "invalid block size {n}: must be a multiple of 512 from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}"
            ),
            OptionsError::Threads(n) => {
                write!(f, "invalid thread count {n}: must be 1 to {MAX_THREADS}")
            }
        }
    }
}

impl std::error::Error for OptionsError {}

/// How to hash: digest, block size and worker threads.
///
/// ```
/// use blkhash::{Algorithm, Options};
/// let opts = Options::new().algorithm(Algorithm::Blake3).block_size(4096).threads(2);
/// assert_eq!(opts.get_block_size(), 4096);
/// assert!(Options::new().block_size(1000).validate().is_err());
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    algorithm: Algorithm,
    block_size: usize,
    threads: usize,
    queue_depth: Option<usize>,
    job_done: Option<JobDone>,
}

impl Default for Options {
    fn default() -> Self {
        Self::new()
    }
}

impl Options {
    /// SHA-256, 64 KiB blocks, one worker per available core.
    pub fn new() -> Self {
        Options {
            algorithm: Algorithm::Sha256,
            block_size: DEFAULT_BLOCK_SIZE,
            threads: default_threads(),
            queue_depth: None,
            job_done: None,
        }
    }
    pub fn algorithm(mut self, a: Algorithm) -> Self {
        self.algorithm = a;
        self
    }
    pub fn block_size(mut self, n: usize) -> Self {
        self.block_size = n;
        self
    }
    pub fn threads(mut self, n: usize) -> Self {
        self.threads = n;
        self
    }
    /// Jobs queued or running before a call waits for half of them to
    /// finish (default 16: enough that workers never wait for the caller).
    pub fn queue_depth(mut self, n: usize) -> Self {
        self.queue_depth = Some(n.max(1));
        self
    }
    /// Call `f` on a worker thread each time a job is digested: a caller
    /// that waits for [`reclaim`](Hasher::reclaim) on some other event (an
    /// eventfd polled by a C program, say) learns when to look again.
    /// Reclaiming then may still find nothing, since buffers come back in
    /// order; `f` must be cheap and must not call into the hasher.
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// let jobs = Arc::new(AtomicUsize::new(0));
    /// let seen = jobs.clone();
    /// let opts = Options::new().on_job_done(move || { seen.fetch_add(1, Ordering::Relaxed); });
    /// let mut h = Hasher::new(opts).unwrap();
    /// h.submit(vec![1u8; 1 << 20]);
    /// h.reclaim_wait().unwrap();
    /// assert!(jobs.load(Ordering::Relaxed) >= 1);
    /// ```
    pub fn on_job_done(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.job_done = Some(JobDone(std::sync::Arc::new(f)));
        self
    }
    pub fn get_algorithm(&self) -> Algorithm {
        self.algorithm
    }
    pub fn get_block_size(&self) -> usize {
        self.block_size
    }
    pub fn get_threads(&self) -> usize {
        self.threads
    }
    /// Check the limits: block size a multiple of 512 in 512 B..=64 MiB, threads 1..=128.
    pub fn validate(&self) -> Result<(), OptionsError> {
        let bs = self.block_size;
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) || !bs.is_multiple_of(512) {
            return Err(OptionsError::BlockSize(bs));
        }
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(OptionsError::Threads(self.threads));
        }
        Ok(())
    }
}

/// One worker per core: digesting is CPU-bound, and the caller's thread
/// (reading, ordering, the outer digest) mostly waits on I/O.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(MAX_THREADS)
}

/// What the hasher saw of one block or run of blocks, reported in block order
/// to an observer (see [`Hasher::set_observer`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockEvent<'a> {
    /// Block `index` holds data with this digest (a short last block included).
    Data { index: u64, digest: &'a [u8] },
    /// `count` full blocks from `index` read as zeros: their digest is the constant.
    Zeros { index: u64, count: u64 },
}

type Observer = Box<dyn FnMut(BlockEvent<'_>) + Send>;

enum Pending {
    Zeros(u64),
    Job(u64),
}

/// Computes a blkhash checksum.
///
/// Data goes in by copy ([`update`](Hasher::update)), as known zeros
/// ([`update_zeros`](Hasher::update_zeros), which neither allocates nor
/// digests anything for full zero blocks), or by handing over a buffer
/// ([`submit`](Hasher::submit), zero-copy: the buffer comes back from
/// [`reclaim`](Hasher::reclaim) once digested). The three can be mixed in any
/// way; the checksum only depends on the bytes.
///
/// ```
/// use blkhash::{Hasher, Options};
/// let mut h = Hasher::new(Options::new()).unwrap();
/// h.update(b"some data");
/// h.update_zeros(1 << 40); // 1 TiB of zeros, in well under a minute
/// h.update(b"more data");
/// println!("{}", h.finalize());
/// ```
///
/// The same content always gives the same checksum:
///
/// ```
/// use blkhash::{Hasher, Options};
/// let opts = Options::new().block_size(4096);
/// let mut a = Hasher::new(opts.clone()).unwrap();
/// a.update(&[0u8; 10000]);
/// let mut b = Hasher::new(opts).unwrap();
/// b.update_zeros(5000);
/// b.update(&[0u8; 5000]);
/// assert_eq!(a.finalize(), b.finalize());
/// ```
pub struct Hasher<B = Vec<u8>> {
    alg: Algorithm,
    block_size: usize,
    out_len: usize,
    zero_digest: Vec<u8>,
    /// The zero-block digest repeated, fed to the outer digest for zero runs.
    zero_run: Vec<u8>,
    outer: Box<dyn Streaming>,
    total_len: u64,
    staging: Vec<u8>,
    staging_cap: usize,
    free: Vec<Vec<u8>>,
    pool: Pool<B>,
    order: VecDeque<Pending>,
    done: HashMap<u64, Done<B>>,
    next_seq: u64,
    in_flight: usize,
    max_in_flight: usize,
    reclaimed: VecDeque<B>,
    observer: Option<Observer>,
    next_block: u64,
    /// The first fill that failed: nothing after it joins the checksum.
    failure: Option<Failure>,
}

enum Failure {
    Pending(io::Error),
    Reported,
}

impl<B> fmt::Debug for Hasher<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hasher")
            .field("algorithm", &self.alg)
            .field("block_size", &self.block_size)
            .field("len", &self.total_len)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// A hasher is a writer: `io::copy(&mut file, &mut hasher)` hashes a file
/// (every byte read; the image commands skip holes instead).
///
/// ```
/// use blkhash::{Hasher, Options};
/// let mut h = Hasher::new(Options::new()).unwrap();
/// std::io::copy(&mut &[5u8; 100_000][..], &mut h).unwrap();
/// assert_eq!(h.finalize(), blkhash::hash([5u8; 100_000]));
/// ```
impl<B: AsRef<[u8]> + Send + 'static> io::Write for Hasher<B> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.update_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Hasher<Vec<u8>> {
    /// A hasher whose zero-copy buffers are `Vec<u8>`.
    pub fn new(opts: Options) -> Result<Self, OptionsError> {
        Hasher::with_buffers(opts)
    }
}

impl<B: AsRef<[u8]> + Send + 'static> Hasher<B> {
    /// A hasher whose zero-copy buffers are of type `B` (for example aligned
    /// buffers for direct I/O).
    pub fn with_buffers(opts: Options) -> Result<Self, OptionsError> {
        opts.validate()?;
        let alg = opts.algorithm;
        let bs = opts.block_size;
        let out_len = alg.output_len();
        let mut zero_digest = vec![0u8; out_len];
        alg.digest_into(&vec![0u8; bs], &mut zero_digest);
        let zero_run = zero_digest.repeat((ZERO_RUN_BYTES / out_len.max(1)).max(1));
        let staging_cap = (STAGING_SIZE / bs).max(1) * bs;
        let max_in_flight = opts.queue_depth.unwrap_or(DEFAULT_QUEUE_DEPTH).max(2);
        Ok(Hasher {
            alg,
            block_size: bs,
            out_len,
            pool: Pool::new(opts.threads, alg, bs, zero_digest.clone(), opts.job_done),
            zero_digest,
            zero_run,
            outer: alg.streaming(),
            total_len: 0,
            staging: Vec::new(),
            staging_cap,
            free: Vec::new(),
            order: VecDeque::new(),
            done: HashMap::new(),
            next_seq: 0,
            in_flight: 0,
            max_in_flight,
            reclaimed: VecDeque::new(),
            observer: None,
            next_block: 0,
            failure: None,
        })
    }

    /// The algorithm.
    pub fn algorithm(&self) -> Algorithm {
        self.alg
    }

    /// The block size.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The digest of a full block of zeros.
    pub fn zero_digest(&self) -> &[u8] {
        &self.zero_digest
    }

    /// Bytes given so far.
    pub fn len(&self) -> u64 {
        self.total_len
    }

    /// True if nothing was given yet.
    pub fn is_empty(&self) -> bool {
        self.total_len == 0
    }

    /// Call `f` for every block, in block order, as its digest joins the
    /// checksum: the block digests stay reachable (block maps, diffs).
    ///
    /// ```
    /// use blkhash::{BlockEvent, Hasher, Options};
    /// use std::sync::{Arc, Mutex};
    /// let seen = Arc::new(Mutex::new(Vec::new()));
    /// let log = seen.clone();
    /// let mut h = Hasher::new(Options::new().block_size(512)).unwrap();
    /// h.set_observer(move |e| log.lock().unwrap().push(match e {
    ///     BlockEvent::Data { index, .. } => format!("data {index}"),
    ///     BlockEvent::Zeros { index, count } => format!("zeros {index}+{count}"),
    /// }));
    /// h.update(&[1u8; 512]);
    /// h.update_zeros(1024);
    /// h.update(&[2u8; 100]);
    /// h.finalize();
    /// assert_eq!(*seen.lock().unwrap(), ["data 0", "zeros 1+2", "data 3"]);
    /// ```
    pub fn set_observer(&mut self, f: impl FnMut(BlockEvent<'_>) + Send + 'static) {
        self.observer = Some(Box::new(f));
    }

    /// Add bytes, copied into internal buffers. Whole blocks of zeros are
    /// found here and not copied: they cost a scan, not a digest.
    pub fn update(&mut self, data: impl AsRef<[u8]>) {
        self.update_slice(data.as_ref());
    }

    fn update_slice(&mut self, mut data: &[u8]) {
        let bs = self.block_size;
        while !data.is_empty() {
            let partial = self.staging.len() % bs;
            if partial == 0 && data.len() >= bs && is_zero(&data[..bs]) {
                let mut n = bs;
                while data.len() - n >= bs && is_zero(&data[n..n + bs]) {
                    n += bs;
                }
                self.update_zeros(n as u64);
                data = &data[n..];
                continue;
            }
            let n = (bs - partial).min(data.len());
            self.stage(&data[..n]);
            data = &data[n..];
        }
    }

    /// Copy bytes into staging; they must fit in what is left of the block.
    fn stage(&mut self, data: &[u8]) {
        self.total_len += data.len() as u64;
        if self.staging.capacity() == 0 {
            self.staging = self.free.pop().unwrap_or_default();
            self.staging.clear();
            self.staging.reserve_exact(self.staging_cap);
        }
        self.staging.extend_from_slice(data);
        if self.staging.len() == self.staging_cap {
            self.flush_staging();
        }
    }

    /// Add `len` bytes that read as zeros. Full zero blocks are neither
    /// allocated nor digested: their digest is a constant.
    pub fn update_zeros(&mut self, mut len: u64) {
        let bs = self.block_size as u64;
        let partial = (self.staging.len() as u64) % bs;
        if partial != 0 {
            let fill = (bs - partial).min(len);
            self.update(vec![0u8; fill as usize]);
            len -= fill;
        }
        if len == 0 {
            return;
        }
        self.flush_staging();
        self.total_len += len - len % bs;
        let blocks = len / bs;
        if blocks > 0 {
            match self.order.back_mut() {
                Some(Pending::Zeros(n)) => *n += blocks,
                _ => self.order.push_back(Pending::Zeros(blocks)),
            }
            self.advance();
        }
        self.update(vec![0u8; (len % bs) as usize]);
    }

    /// Hand over a buffer to digest without copying it (but for a part that
    /// straddles a block boundary left by an earlier call). It comes back from
    /// [`reclaim`](Hasher::reclaim) or [`reclaim_wait`](Hasher::reclaim_wait)
    /// once its blocks are digested. Waits while the pool is full.
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// let mut h = Hasher::new(Options::new()).unwrap();
    /// let mut buf = vec![7u8; 1 << 20];
    /// for _ in 0..4 {
    ///     h.submit(buf);
    ///     buf = h.reclaim_wait().unwrap(); // a digested buffer, ready to refill
    /// }
    /// let mut copy = Hasher::new(Options::new()).unwrap();
    /// copy.update(&vec![7u8; 4 << 20]);
    /// assert_eq!(h.finalize(), copy.finalize());
    /// ```
    pub fn submit(&mut self, buf: B) {
        let data = buf.as_ref();
        let len = data.len();
        let bs = self.block_size;
        let mut start = 0;
        let partial = self.staging.len() % bs;
        if partial != 0 {
            start = (bs - partial).min(len);
            self.update(&data[..start]);
        }
        let full_end = start + (len - start) / bs * bs;
        if full_end == start {
            // Nothing whole to digest: the bytes were copied, the buffer is free.
            self.update(&data[start..]);
            self.reclaimed.push_back(buf);
            return;
        }
        self.flush_staging();
        self.total_len += (full_end - start) as u64;
        // The tail goes to staging after the job, keeping byte order.
        let tail = data[full_end..].to_vec();
        self.send(JobBuf::External(buf), start, full_end);
        self.update(&tail);
    }

    /// A buffer given to [`submit`](Hasher::submit) and now digested, if any.
    pub fn reclaim(&mut self) -> Option<B> {
        self.collect(false);
        self.reclaimed.pop_front()
    }

    /// Like [`reclaim`](Hasher::reclaim), but waits for a submitted buffer
    /// still in flight; `None` only if none is.
    pub fn reclaim_wait(&mut self) -> Option<B> {
        loop {
            if let Some(b) = self.reclaim() {
                return Some(b);
            }
            if self.in_flight == 0 {
                return None;
            }
            self.collect(true);
        }
    }

    /// Add `len` bytes that `fill` produces (reads, typically) on a worker
    /// thread, into that worker's own page-aligned buffer, which it then
    /// digests while the bytes are in its cache. Fills run in parallel and in
    /// any order; their bytes join the checksum in call order.
    ///
    /// If a fill fails, nothing after it counts: this call, or
    /// [`try_finalize`](Hasher::try_finalize), returns the error.
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// let mut h = Hasher::new(Options::new()).unwrap();
    /// for i in 0..8u8 {
    ///     h.submit_with(1 << 20, Box::new(move |buf| { buf.fill(i); Ok(()) })).unwrap();
    /// }
    /// let sum = h.try_finalize().unwrap();
    ///
    /// // A failed fill fails the checksum, even if the caller ignores the error.
    /// for len in [65536, 4096] {
    ///     let mut failing = Hasher::new(Options::new()).unwrap();
    ///     let _ = failing.submit_with(len, Box::new(|_| Err(std::io::Error::other("disk on fire"))));
    ///     assert!(failing.try_finalize().is_err());
    /// }
    /// ```
    pub fn submit_with(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        self.check_failure()?;
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_size;
        if !self.staging.len().is_multiple_of(bs) || !len.is_multiple_of(bs) {
            // Not on block boundaries: produce the bytes here and copy them.
            let mut tmp = vec![0u8; len];
            if let Err(e) = fill(&mut tmp) {
                self.failure = Some(Failure::Reported);
                return Err(e);
            }
            self.update(&tmp);
            return Ok(());
        }
        self.flush_staging();
        self.total_len += len as u64;
        self.send(JobBuf::Fill(fill), 0, len);
        self.check_failure()
    }

    /// Finish: the checksum of everything given, or the error of the first
    /// fill that failed.
    pub fn try_finalize(mut self) -> io::Result<Checksum> {
        self.flush_staging();
        while self.in_flight > 0 {
            self.collect(true);
        }
        self.advance();
        match self.failure.take() {
            Some(Failure::Pending(e)) => return Err(e),
            Some(Failure::Reported) => return Err(io::Error::other("an earlier read failed")),
            None => {}
        }
        debug_assert!(self.order.is_empty());
        self.outer.update(&self.total_len.to_le_bytes());
        Ok(Checksum::new(self.alg, self.outer.finalize()))
    }

    /// Finish: the checksum of everything given.
    ///
    /// Panics if a [`submit_with`](Hasher::submit_with) fill failed; use
    /// [`try_finalize`](Hasher::try_finalize) with fills that can fail.
    pub fn finalize(self) -> Checksum {
        self.try_finalize()
            .expect("a fill failed: use try_finalize to handle it")
    }

    fn check_failure(&mut self) -> io::Result<()> {
        match self.failure.replace(Failure::Reported) {
            Some(Failure::Pending(e)) => Err(e),
            Some(Failure::Reported) => Err(io::Error::other("an earlier read failed")),
            None => {
                self.failure = None;
                Ok(())
            }
        }
    }

    /// Send the staged bytes as a job (whole blocks, or the short last block at the end).
    fn flush_staging(&mut self) {
        if self.staging.is_empty() {
            return;
        }
        let staged = std::mem::take(&mut self.staging);
        let len = staged.len();
        self.send(JobBuf::Internal(staged), 0, len);
    }

    fn send(&mut self, buf: JobBuf<B>, start: usize, end: usize) {
        if self.in_flight >= self.max_in_flight {
            // Wait until half the queue is done, not just one job: the caller
            // then wakes once per several jobs instead of once per job, which
            // matters when the workers keep every core busy.
            while self.in_flight > self.max_in_flight / 2 {
                self.collect(true);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        self.in_flight += 1;
        self.order.push_back(Pending::Job(seq));
        self.pool.send(Job {
            seq,
            buf,
            start,
            end,
        });
    }

    /// Take finished jobs (waiting for one if `wait`), then feed what is in order.
    fn collect(&mut self, wait: bool) {
        if wait && self.in_flight > 0 {
            let d = self.pool.done.recv().expect("blkhash worker died");
            self.in_flight -= 1;
            self.done.insert(d.seq, d);
        }
        while let Ok(d) = self.pool.done.try_recv() {
            self.in_flight -= 1;
            self.done.insert(d.seq, d);
        }
        self.advance();
    }

    /// Feed the outer digest with everything at the head of the order that is ready.
    fn advance(&mut self) {
        while let Some(front) = self.order.front() {
            match *front {
                Pending::Zeros(n) => {
                    self.order.pop_front();
                    self.feed_zeros(n);
                }
                Pending::Job(seq) => {
                    let Some(d) = self.done.remove(&seq) else {
                        return;
                    };
                    self.order.pop_front();
                    if self.failure.is_some() {
                        continue;
                    }
                    self.feed_job(d);
                }
            }
        }
    }

    fn feed_zeros(&mut self, n: u64) {
        if self.failure.is_some() {
            return;
        }
        if let Some(obs) = self.observer.as_mut() {
            obs(BlockEvent::Zeros {
                index: self.next_block,
                count: n,
            });
        }
        self.next_block += n;
        if self.out_len == 0 {
            return;
        }
        let per_update = (self.zero_run.len() / self.out_len) as u64;
        let mut left = n;
        while left > 0 {
            let k = left.min(per_update);
            self.outer
                .update(&self.zero_run[..k as usize * self.out_len]);
            left -= k;
        }
    }

    fn feed_job(&mut self, mut d: Done<B>) {
        if let Some(e) = d.error.take() {
            self.failure = Some(Failure::Pending(e));
            return;
        }
        self.outer.update(&d.digests);
        if let Some(obs) = self.observer.as_mut() {
            let mut i = 0;
            while i < d.zero.len() {
                let index = self.next_block + i as u64;
                if d.zero[i] {
                    let run = d.zero[i..].iter().take_while(|&&z| z).count();
                    obs(BlockEvent::Zeros {
                        index,
                        count: run as u64,
                    });
                    i += run;
                } else {
                    let digest = &d.digests[i * self.out_len..(i + 1) * self.out_len];
                    obs(BlockEvent::Data { index, digest });
                    i += 1;
                }
            }
        }
        self.next_block += d.zero.len() as u64;
        match d.buf {
            Some(JobBuf::Internal(v)) => {
                if self.free.len() < self.max_in_flight {
                    self.free.push(v);
                }
            }
            Some(JobBuf::External(b)) => self.reclaimed.push_back(b),
            Some(JobBuf::Fill(_)) | None => {}
        }
    }
}
