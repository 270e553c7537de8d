//! The ordering engine: jobs go to the worker pool, their block digests come
//! back in any order and join the outer digest in block order.

use crate::algorithm::{Algorithm, Streaming};
use crate::checksum::Checksum;
use crate::construction::Construction;
use crate::options::{DEFAULT_QUEUE_DEPTH, Options, OptionsError, depth_within_budget};
use crate::pool::{Done, Fill, Job, JobBuf, Lend, Pool};
use crate::zero::is_zero;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io;

/// Bytes of data an internal staging buffer gathers before it becomes a job.
const STAGING_SIZE: usize = 1 << 20;
/// Bytes of repeated zero-block digests given to the outer digest per update:
/// long updates are much faster than one per block (blake3 above all: 16
/// KiB fill its widest SIMD lanes). Under 64 KiB, from the heap's room
/// (see [`zero_run`]).
const ZERO_RUN_BYTES: usize = 32 << 10;

/// What the hasher saw of one block or run of blocks, reported in block order
/// to an observer (see [`Hasher::set_observer`](crate::Hasher::set_observer)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockEvent<'a> {
    /// Block `index` holds data with this digest (a short last block included).
    Data {
        /// The block's index from the start.
        index: u64,
        /// Its digest.
        digest: &'a [u8],
    },
    /// `count` full blocks from `index` read as zeros: their digest is the constant.
    Zeros {
        /// The first block's index.
        index: u64,
        /// How many blocks.
        count: u64,
    },
}

type Observer = Box<dyn FnMut(BlockEvent<'_>) + Send>;

enum Pending {
    Zeros(u64),
    Job(u64),
}

/// The state every hasher shares: staging, jobs in flight, the order they
/// join the checksum in, the outer digest. [`Hasher`](crate::Hasher) and
/// [`Pipeline`](crate::Pipeline) are the public faces of it.
pub(crate) struct Engine<B> {
    construction: Construction,
    alg: Algorithm,
    block_size: usize,
    out_len: usize,
    zero_digest: Vec<u8>,
    /// The zero-block digest repeated, fed to the outer digest for zero runs.
    zero_run: Vec<u8>,
    /// Zero-block digests in `zero_run` (at least 1, so a 0-byte digest needs no case).
    zero_run_blocks: u64,
    threads: usize,
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

impl<B> Engine<B> {
    /// `Debug` for the public types, under their own name.
    pub(crate) fn fmt_as(&self, name: &str, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(name)
            .field("construction", &self.construction)
            .field("algorithm", &self.alg)
            .field("block_size", &self.block_size)
            .field("threads", &self.threads)
            .field("len", &self.total_len)
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

/// 32 KiB (`ZERO_RUN_BYTES`) of `zero_digest` in a row, and how many:
/// what an outer digest is given per update for a run of zero blocks (the
/// hasher's, and a map's checks). Just the one where even that much
/// cannot be had (blkdiff, two hashers and two maps at 15 MB of address
/// space: "memory allocation of 32768 bytes failed"): only the speed of
/// zero runs depends on its length.
///
/// ```
/// let (run, n) = blkhash::zero_run(&[7u8; 32]);
/// assert_eq!((run.len(), n), (32 << 10, 1024));
/// assert!(run.iter().all(|&b| b == 7));
/// ```
pub fn zero_run(zero_digest: &[u8]) -> (Vec<u8>, usize) {
    let blocks = (ZERO_RUN_BYTES / zero_digest.len().max(1)).max(1);
    let mut run = Vec::new();
    if run.try_reserve_exact(blocks * zero_digest.len()).is_err() {
        return (zero_digest.to_vec(), 1);
    }
    for _ in 0..blocks {
        run.extend_from_slice(zero_digest);
    }
    (run, blocks)
}

impl<B: AsRef<[u8]> + Send + 'static> Engine<B> {
    pub(crate) fn new(opts: Options) -> Result<Self, OptionsError> {
        opts.validate()?;
        let alg = opts.algorithm;
        let bs = opts.block_size;
        let out_len = alg.output_len();
        let key = opts.block_key.0.clone();
        let zero_digest = alg.digest_zeros_keyed(bs, &key);
        let (zero_run, zero_run_blocks) = zero_run(&zero_digest);
        let staging_cap = (STAGING_SIZE / bs).max(1) * bs;
        let max_in_flight = opts.queue_depth.unwrap_or(DEFAULT_QUEUE_DEPTH).max(2);
        let pool = Pool::new(
            opts.threads,
            (alg, key),
            bs,
            zero_digest.clone(),
            opts.job_done,
        )
        .map_err(|e| OptionsError::ThreadStart {
            errno: e.raw_os_error(),
        })?;
        Ok(Engine {
            construction: opts.construction,
            alg,
            threads: opts.threads,
            zero_run_blocks: zero_run_blocks as u64,
            block_size: bs,
            out_len,
            pool,
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

    pub(crate) fn algorithm(&self) -> Algorithm {
        self.alg
    }

    pub(crate) fn construction(&self) -> Construction {
        self.construction
    }

    pub(crate) fn block_size(&self) -> usize {
        self.block_size
    }

    pub(crate) fn threads(&self) -> usize {
        self.threads
    }

    pub(crate) fn zero_digest(&self) -> &[u8] {
        &self.zero_digest
    }

    pub(crate) fn len(&self) -> u64 {
        self.total_len
    }

    /// True if `more` bytes can be added: the checksum records the length
    /// as a le64, so a hash covers at most 2^64 - 1 bytes.
    pub(crate) fn fits(&self, more: u64) -> bool {
        self.total_len.checked_add(more).is_some()
    }

    /// Panic, before anything changes, unless `more` bytes fit (see
    /// [`fits`](Engine::fits)): a wrapped length would be a wrong checksum.
    fn check_len(&self, more: u64) {
        assert!(
            self.fits(more),
            "blkhash: a checksum covers at most 2^64 - 1 bytes: {} given, {more} more",
            self.total_len
        );
    }

    pub(crate) fn set_observer(&mut self, f: impl FnMut(BlockEvent<'_>) + Send + 'static) {
        self.observer = Some(Box::new(f));
    }

    /// Copy bytes into staging. Whole blocks of zeros are found here and not
    /// copied: they cost a scan, not a digest. Aborts, as a `Vec` does, if
    /// memory for staging cannot be had (a `Hasher` has no error to give).
    pub(crate) fn update(&mut self, data: &[u8]) {
        if self.try_update(data).is_err() {
            self.alloc_abort();
        }
    }

    /// [`update`](Self::update), or the error if memory for staging cannot
    /// be had (then some of `data` may be lost: the caller fails the run).
    pub(crate) fn try_update(&mut self, mut data: &[u8]) -> io::Result<()> {
        self.check_len(data.len() as u64);
        let bs = self.block_size;
        while !data.is_empty() {
            let partial = self.staging.len() % bs;
            if partial == 0 && data.len() >= bs && is_zero(&data[..bs]) {
                let mut n = bs;
                while data.len() - n >= bs && is_zero(&data[n..n + bs]) {
                    n += bs;
                }
                self.try_update_zeros(n as u64)?;
                data = &data[n..];
                continue;
            }
            let n = (bs - partial).min(data.len());
            self.stage(&data[..n])?;
            data = &data[n..];
        }
        Ok(())
    }

    /// The abort of a failed allocation of staging, as `Vec` would.
    fn alloc_abort(&self) -> ! {
        std::alloc::handle_alloc_error(
            std::alloc::Layout::array::<u8>(self.staging_cap).expect("a staging size"),
        )
    }

    /// Copy bytes into staging; they must fit in what is left of the block.
    fn stage(&mut self, data: &[u8]) -> io::Result<()> {
        if self.staging.capacity() == 0 {
            let mut staging = self.free.pop().unwrap_or_default();
            staging.clear();
            staging
                .try_reserve_exact(self.staging_cap)
                .map_err(|_| crate::out_of_memory(self.staging_cap, "gathering partial blocks"))?;
            self.staging = staging;
        }
        self.total_len += data.len() as u64;
        self.staging.extend_from_slice(data);
        if self.staging.len() == self.staging_cap {
            self.flush_staging();
        }
        Ok(())
    }

    /// `len` bytes that read as zeros: full zero blocks are neither
    /// allocated nor digested, their digest is a constant. Aborts as
    /// [`update`](Self::update) does.
    pub(crate) fn update_zeros(&mut self, len: u64) {
        if self.try_update_zeros(len).is_err() {
            self.alloc_abort();
        }
    }

    /// [`try_update_zeros`](Self::try_update_zeros) for a caller that
    /// fills too: an error fails the run (nothing after it counts).
    pub(crate) fn add_zeros(&mut self, len: u64) -> io::Result<()> {
        self.check_failure()?;
        self.try_update_zeros(len).inspect_err(|_| {
            self.failure = Some(Failure::Reported);
        })
    }

    /// [`update_zeros`](Self::update_zeros), or the error if memory for
    /// staging cannot be had.
    pub(crate) fn try_update_zeros(&mut self, mut len: u64) -> io::Result<()> {
        self.check_len(len);
        let bs = self.block_size as u64;
        let partial = (self.staging.len() as u64) % bs;
        if partial != 0 {
            let fill = (bs - partial).min(len);
            self.try_update(&crate::try_zeroed(fill as usize, "a partial zero block")?)?;
            len -= fill;
        }
        if len == 0 {
            return Ok(());
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
        self.try_update(&crate::try_zeroed(
            (len % bs) as usize,
            "a partial zero block",
        )?)
    }

    /// Digest `buf` in place but for a part that straddles a block boundary
    /// left by an earlier call; it comes back from `reclaim` once digested.
    pub(crate) fn submit(&mut self, buf: B) {
        let data = buf.as_ref();
        let len = data.len();
        self.check_len(len as u64);
        let bs = self.block_size;
        let mut start = 0;
        let partial = self.staging.len() % bs;
        if partial != 0 {
            start = (bs - partial).min(len);
            if let Err(e) = self.try_update(&data[..start]) {
                self.fail(e);
            }
        }
        let full_end = start + (len - start) / bs * bs;
        if full_end == start {
            // Nothing whole to digest: the bytes were copied, the buffer is free.
            if let Err(e) = self.try_update(&data[start..]) {
                self.fail(e);
            }
            self.reclaimed.push_back(buf);
            return;
        }
        self.flush_staging();
        self.total_len += (full_end - start) as u64;
        // The tail goes to staging after the job, keeping byte order (less
        // than a block: small enough to copy infallibly).
        let tail = data[full_end..].to_vec();
        self.send(JobBuf::External(buf), start, full_end);
        if let Err(e) = self.try_update(&tail) {
            self.fail(e);
        }
    }

    /// Fail the run with `e`, unless it failed already: nothing after
    /// counts, and the caller's next call or finalize returns the error.
    fn fail(&mut self, e: io::Error) {
        if self.failure.is_none() {
            self.failure = Some(Failure::Pending(e));
        }
    }

    pub(crate) fn reclaim(&mut self) -> Option<B> {
        self.collect(false);
        self.reclaimed.pop_front()
    }

    pub(crate) fn reclaim_wait(&mut self) -> Option<B> {
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

    /// `len` bytes that `fill` produces on a worker, into the worker's own
    /// buffer; after a failed fill nothing joins the checksum.
    pub(crate) fn submit_with(&mut self, len: usize, fill: Fill) -> io::Result<()> {
        self.check_len(len as u64);
        self.check_failure()?;
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_size;
        if !self.staging.len().is_multiple_of(bs) || !len.is_multiple_of(bs) {
            // Not on block boundaries: produce the bytes here and copy them.
            let copied = crate::try_zeroed(len, "a read").and_then(|mut tmp| {
                fill(&mut tmp)?;
                self.try_update(&tmp)
            });
            if let Err(e) = copied {
                self.failure = Some(Failure::Reported);
                return Err(e);
            }
            return Ok(());
        }
        self.flush_staging();
        self.total_len += len as u64;
        self.send(JobBuf::Fill(fill), 0, len);
        self.check_failure()
    }

    /// `len` bytes that `lend` lends in place to a worker; after a failed
    /// lend nothing joins the checksum.
    pub(crate) fn submit_lent(&mut self, len: usize, lend: Lend) -> io::Result<()> {
        self.check_len(len as u64);
        self.check_failure()?;
        if len == 0 {
            return Ok(());
        }
        let bs = self.block_size;
        if !self.staging.len().is_multiple_of(bs) || !len.is_multiple_of(bs) {
            // Not on block boundaries: copy the bytes here, and add them
            // only once the lend says they were the source's.
            let mut tmp = Vec::new();
            let lent = tmp
                .try_reserve_exact(len)
                .map_err(|_| crate::out_of_memory(len, "a read"))
                .and_then(|()| {
                    lend(&mut |data: &[u8]| {
                        if data.len() == len {
                            tmp.extend_from_slice(data);
                        }
                    })
                });
            let lent = lent
                .and_then(|()| match tmp.len() == len {
                    true => Ok(()),
                    false => Err(io::Error::other(format!("lent bytes were not {len} bytes"))),
                })
                .and_then(|()| self.try_update(&tmp));
            if let Err(e) = lent {
                self.failure = Some(Failure::Reported);
                return Err(e);
            }
            return Ok(());
        }
        self.flush_staging();
        self.total_len += len as u64;
        self.send(JobBuf::Lend(lend), 0, len);
        self.check_failure()
    }

    /// Wait for every job and feed what they digested.
    pub(crate) fn drain(&mut self) {
        self.flush_staging();
        while self.in_flight > 0 {
            self.collect(true);
        }
        self.advance();
    }

    /// The error of the first fill that failed, if one did.
    pub(crate) fn failed(&mut self) -> Option<io::Error> {
        match self.failure.take()? {
            Failure::Pending(e) => Some(e),
            Failure::Reported => Some(io::Error::other("an earlier read failed")),
        }
    }

    /// The checksum of everything fed; call [`drain`](Engine::drain) first.
    pub(crate) fn checksum(mut self) -> Checksum {
        debug_assert!(self.in_flight == 0 && self.order.is_empty());
        if self.construction.appends_length() {
            self.outer.update(&self.total_len.to_le_bytes());
        }
        Checksum::new(self.alg, self.outer.finalize()).with_construction(self.construction)
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
        // A fill's bytes are read into a worker's buffer, a lend's are
        // mapped pages that count as the process's memory: as many in
        // flight as fit in the budget, whatever the queue depth and read
        // size (other jobs' buffers are the caller's to bound).
        let max = match buf {
            JobBuf::Fill(_) | JobBuf::Lend(_) => {
                depth_within_budget(self.max_in_flight, end - start)
            }
            _ => self.max_in_flight,
        };
        if self.in_flight >= max {
            // Wait until half the queue is done, not just one job: the caller
            // then wakes once per several jobs instead of once per job, which
            // matters when the workers keep every core busy.
            while self.in_flight > max / 2 {
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
        let mut left = n;
        while left > 0 {
            let k = left.min(self.zero_run_blocks);
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
            Some(JobBuf::Fill(_) | JobBuf::Lend(_)) | None => {}
        }
    }
}
