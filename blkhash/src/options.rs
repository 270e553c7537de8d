//! How to hash: the digest, the block size, the worker threads, and their limits.

use crate::algorithm::Algorithm;
use crate::construction::Construction;
use std::fmt;
use std::io;
use std::sync::Arc;

/// Smallest block size accepted (the reference's limit).
pub const MIN_BLOCK_SIZE: usize = 512;
/// Largest block size accepted (the reference's limit).
pub const MAX_BLOCK_SIZE: usize = 64 << 20;
/// Largest worker count accepted.
pub const MAX_THREADS: usize = 128;
/// The default block size: 64 KiB.
pub const DEFAULT_BLOCK_SIZE: usize = 64 << 10;

/// Jobs in flight by default: with 1 MiB jobs, workers always find one
/// queued, and memory stays at a few MiB.
pub(crate) const DEFAULT_QUEUE_DEPTH: usize = 16;

/// Bytes of reads a hasher and the readers in front of it keep in flight
/// at most: reads queued or running, and read buffers waiting for a
/// digest worker. Past a few reads in flight a device is busy, and deeper
/// queues of large reads only cost memory (`--io-depth 256 --read-size
/// 64m` asked for 32 GiB), so depths are cut to fit; the defaults (16
/// reads of 1 MiB) are far below it.
pub const IN_FLIGHT_BUDGET: usize = 256 << 20;

/// How many of `depth` things of `bytes` each fit in [`IN_FLIGHT_BUDGET`]:
/// `depth` cut to fit, but at least 1 (a single read larger than the
/// budget still runs).
///
/// ```
/// use blkhash::depth_within_budget;
/// assert_eq!(depth_within_budget(16, 1 << 20), 16);
/// assert_eq!(depth_within_budget(256, 64 << 20), 4);
/// assert_eq!(depth_within_budget(8, 512 << 20), 1);
/// ```
pub fn depth_within_budget(depth: usize, bytes: usize) -> usize {
    depth.min(IN_FLIGHT_BUDGET / bytes.max(1)).max(1)
}

/// Called by a worker after each finished job (see [`Options::on_job_done`]).
/// Defined here, with the options that carry it; the pool only calls it.
#[derive(Clone)]
pub(crate) struct JobDone(pub Arc<dyn Fn() + Send + Sync>);

/// The bytes every block digest is taken with after the block
/// ([`Options::block_key`]); its `Debug` says how long it is, never what.
#[derive(Clone, Default)]
pub(crate) struct BlockKey(pub Arc<[u8]>);

impl fmt::Debug for BlockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockKey({} bytes)", self.0.len())
    }
}

impl fmt::Debug for JobDone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("JobDone")
    }
}

/// Why a hasher could not be made: invalid options, or a worker thread
/// the system would not start.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum OptionsError {
    /// A block size out of range or not a multiple of 512.
    BlockSize(usize),
    /// A thread count out of range.
    Threads(usize),
    /// A digest the construction does not take ([`Construction::takes`]).
    Digest(Construction, Algorithm),
    /// A digest worker thread could not be started: the system's limit on
    /// threads (RLIMIT_NPROC, a pids cgroup) or memory was reached. The
    /// workers already started are stopped.
    ThreadStart {
        /// The OS error number (EAGAIN, typically), if there was one.
        errno: Option<i32>,
    },
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
            OptionsError::Digest(c, a) => write!(f, "{}", unsupported_digest(*c, *a)),
            OptionsError::ThreadStart { errno: Some(e) } => write!(
                f,
                "cannot start a digest thread: {}",
                io::Error::from_raw_os_error(*e)
            ),
            OptionsError::ThreadStart { errno: None } => {
                write!(f, "cannot start a digest thread")
            }
        }
    }
}

impl std::error::Error for OptionsError {}

/// Invalid options are `InvalidInput`; a thread that could not start keeps
/// the kind of its OS error (`WouldBlock` for EAGAIN), so callers can tell
/// a system limit from a mistake.
impl From<OptionsError> for io::Error {
    fn from(e: OptionsError) -> io::Error {
        let kind = match e {
            OptionsError::ThreadStart { errno: Some(n) } => io::Error::from_raw_os_error(n).kind(),
            OptionsError::ThreadStart { errno: None } => io::ErrorKind::Other,
            _ => io::ErrorKind::InvalidInput,
        };
        io::Error::new(kind, e)
    }
}

/// How to hash: digest, block size and worker threads, set builder-style
/// and read back from the [`Hasher`](crate::Hasher) they make.
///
/// ```
/// use blkhash::{Algorithm, Hasher, Options};
/// let opts = Options::new().algorithm(Algorithm::Blake3).block_size(4096).threads(2);
/// let h = Hasher::with_options(opts).unwrap();
/// assert_eq!((h.algorithm(), h.block_size(), h.threads()), (Algorithm::Blake3, 4096, 2));
/// assert!(Options::new().block_size(1000).validate().is_err());
/// ```
#[derive(Clone, Debug)]
pub struct Options {
    pub(crate) construction: Construction,
    pub(crate) algorithm: Algorithm,
    pub(crate) block_size: usize,
    pub(crate) threads: usize,
    pub(crate) queue_depth: Option<usize>,
    pub(crate) job_done: Option<JobDone>,
    pub(crate) block_key: BlockKey,
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
            construction: Construction::Blkhash,
            algorithm: Algorithm::Sha256,
            block_size: DEFAULT_BLOCK_SIZE,
            threads: default_threads(),
            queue_depth: None,
            job_done: None,
            block_key: BlockKey::default(),
        }
    }
    /// How block digests become the checksum (default blkhash 0.11's).
    /// It changes nothing else: set the digest and block size too (a
    /// construction's defaults are [`Construction::default_algorithm`] and
    /// [`Construction::default_block_size`]).
    ///
    /// ```
    /// use blkhash::{checksum_with, Algorithm, Construction, Hasher, Options};
    /// let c = Construction::Imageio;
    /// let opts = Options::new().construction(c).algorithm(Algorithm::Blake2b256).block_size(4 << 20);
    /// let mut h = Hasher::with_options(opts).unwrap();
    /// h.update(b"data");
    /// h.update_zeros(8 << 20);
    /// let mut data = b"data".to_vec();
    /// data.resize(4 + (8 << 20), 0);
    /// assert_eq!(h.finalize(), checksum_with(c, Algorithm::Blake2b256, 4 << 20, &data));
    /// ```
    pub fn construction(mut self, c: Construction) -> Self {
        self.construction = c;
        self
    }
    /// The digest of blocks and of the checksum (default SHA-256).
    pub fn algorithm(mut self, a: Algorithm) -> Self {
        self.algorithm = a;
        self
    }
    /// Bytes per block: a multiple of 512 from 512 to 64 MiB (default 64 KiB).
    pub fn block_size(mut self, n: usize) -> Self {
        self.block_size = n;
        self
    }
    /// Digest workers: 1 to 128 (default one per core).
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
    /// Key the block digests: each is `H(block || key)` instead of
    /// `H(block)` (a full block of zeros' constant too), the outer digest
    /// unchanged. Proxmox Backup Server digests an encrypted backup's
    /// chunks so (`SHA-256(chunk || id key)`), and its index's `index_csum`
    /// is the [`Pbs`](Construction::Pbs) construction of them: a disk
    /// hashed with the backup's id key gives it. Empty (the default): not
    /// keyed. SHA-256 keeps its multi-buffer kernels either way.
    ///
    /// ```
    /// use blkhash::{Algorithm, Construction, Hasher, Options};
    /// let opts = Options::new().construction(Construction::Pbs).block_size(4 << 20);
    /// let mut h = Hasher::with_options(opts.block_key(b"id key")).unwrap();
    /// h.update(b"data");
    /// let mut block = [0u8; 32];
    /// Algorithm::Sha256.digest_into(b"dataid key", &mut block);
    /// let mut want = [0u8; 32];
    /// Algorithm::Sha256.digest_into(&block, &mut want);
    /// assert_eq!(h.finalize().as_bytes(), want);
    /// ```
    pub fn block_key(mut self, key: impl AsRef<[u8]>) -> Self {
        self.block_key = BlockKey(Arc::from(key.as_ref()));
        self
    }
    /// Call `f` on a worker thread each time a job is digested: a caller
    /// that waits for [`reclaim`](crate::Pipeline::reclaim) on some other event (an
    /// eventfd polled by a C program, say) learns when to look again.
    /// Reclaiming then may still find nothing, since buffers come back in
    /// order; `f` must be cheap and must not call into the hasher. It runs
    /// just after the job is made available, so a buffer may come back
    /// before its call.
    ///
    /// ```
    /// use blkhash::{Options, Pipeline};
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use std::sync::Arc;
    /// let jobs = Arc::new(AtomicUsize::new(0));
    /// let seen = jobs.clone();
    /// let opts = Options::new().on_job_done(move || { seen.fetch_add(1, Ordering::Relaxed); });
    /// let mut h = Pipeline::new(opts).unwrap();
    /// h.submit(vec![1u8; 1 << 20]);
    /// h.reclaim_wait().unwrap();
    /// h.finalize().unwrap(); // joins the workers: every call has run
    /// assert_eq!(jobs.load(Ordering::Relaxed), 1);
    /// ```
    pub fn on_job_done(mut self, f: impl Fn() + Send + Sync + 'static) -> Self {
        self.job_done = Some(JobDone(Arc::new(f)));
        self
    }
    /// Check the limits: block size a multiple of 512 in 512 B..=64 MiB,
    /// threads 1..=128, a digest the construction takes.
    ///
    /// ```
    /// use blkhash::{Algorithm, Construction, Options, OptionsError};
    /// let o = Options::new().construction(Construction::Imageio).algorithm(Algorithm::Md5Sha1);
    /// assert_eq!(o.validate(), Err(OptionsError::Digest(Construction::Imageio, Algorithm::Md5Sha1)));
    /// ```
    pub fn validate(&self) -> Result<(), OptionsError> {
        let bs = self.block_size;
        if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&bs) || !bs.is_multiple_of(512) {
            return Err(OptionsError::BlockSize(bs));
        }
        if !(1..=MAX_THREADS).contains(&self.threads) {
            return Err(OptionsError::Threads(self.threads));
        }
        if !self.construction.takes(self.algorithm) {
            return Err(OptionsError::Digest(self.construction, self.algorithm));
        }
        Ok(())
    }
}

/// Why construction `c` does not take digest `a` ([`Construction::takes`]),
/// naming the digests it takes.
///
/// ```
/// use blkhash::{Algorithm, Construction};
/// let msg = blkhash::unsupported_digest(Construction::Imageio, Algorithm::Md5Sha1);
/// assert!(msg.starts_with("the imageio construction takes the digests oVirt imageio computes (md5, sha1, "));
/// assert!(msg.ends_with("), not md5-sha1"));
/// ```
pub fn unsupported_digest(c: Construction, a: Algorithm) -> String {
    let names: Vec<&str> = crate::ALGORITHMS
        .iter()
        .filter_map(|a| a.imageio_name())
        .collect();
    format!(
        "the {c} construction takes the digests oVirt imageio computes ({}), not {a}",
        names.join(", ")
    )
}

/// One worker per core: digesting is CPU-bound, and the caller's thread
/// (reading, ordering, the outer digest) mostly waits on I/O.
pub fn default_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(MAX_THREADS)
}
