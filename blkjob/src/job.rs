//! The one description of a hashing job: asked for as a [`JobSpec`] (from a
//! command line, Python keywords or blksync's plan), checked once into a
//! [`Job`] that every operation of this crate takes.

use blkhash::{Algorithm, Construction, MAX_THREADS, Options};
use blkimage::OpenOptions;
use blkimage::pbs::store::Key;
use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// Bytes per read when none is asked for.
pub const DEFAULT_READ_SIZE: usize = 1 << 20;
/// Reads and digest jobs queued ahead of the digest workers by default.
pub const DEFAULT_QUEUE_DEPTH: usize = 16;
/// The largest queue depth accepted.
pub const MAX_QUEUE_DEPTH: usize = 128;
/// The largest io depth (reads in flight on reading threads) accepted.
pub const MAX_IO_DEPTH: usize = 256;
/// The smallest read size accepted, and what every read size is a multiple of.
pub const MIN_READ_SIZE: usize = 4096;
/// The largest read size accepted.
pub const MAX_READ_SIZE: usize = 256 << 20;

/// A hashing job as asked for: every field optional but the open options,
/// each `None` taking the default (the digest and block size: a saved map's
/// where [`JobSpec::resolve`] is given one, else the construction's:
/// sha256 and 64 KiB for blkhash 0.11's).
///
/// ```
/// use blkjob::{JobError, JobSpec};
/// let job = JobSpec { block_size: Some(1 << 20), ..Default::default() }.build().unwrap();
/// assert_eq!(job.block_size(), 1 << 20);
/// assert_eq!(job.read_size(), 1 << 20);
/// let bad = JobSpec { block_size: Some(1000), ..Default::default() }.build();
/// assert_eq!(bad.unwrap_err(), JobError::BlockSize(1000));
///
/// // oVirt imageio's checksum: BLAKE2b-256 and 4 MiB blocks unless asked otherwise.
/// use blkhash::{Algorithm, Construction};
/// let job = JobSpec { construction: Construction::Imageio, ..Default::default() }.build().unwrap();
/// assert_eq!((job.algorithm(), job.block_size()), (Algorithm::Blake2b256, 4 << 20));
/// // A digest imageio does not compute is refused there.
/// let md5_sha1 = JobSpec { construction: Construction::Imageio, digest: Some(Algorithm::Md5Sha1), ..Default::default() };
/// assert_eq!(md5_sha1.build().unwrap_err(), JobError::Digest(Construction::Imageio, Algorithm::Md5Sha1));
/// ```
#[derive(Clone, Debug, Default)]
pub struct JobSpec {
    /// How block digests become the checksum; its defaults are the
    /// digest's and block size's.
    pub construction: Construction,
    /// The digest of the blocks and of the checksum.
    pub digest: Option<Algorithm>,
    /// Bytes per block.
    pub block_size: Option<usize>,
    /// Digest threads (default: one per core).
    pub threads: Option<usize>,
    /// Reads and digest jobs queued ahead of the digest workers.
    pub queue_depth: Option<usize>,
    /// Bytes per read, before rounding up to whole blocks.
    pub read_size: Option<usize>,
    /// Reads in flight apart from the digest threads (`None`: the reader's
    /// default for the input, [`blkimage::read_image`]).
    pub io_depth: Option<usize>,
    /// How images are opened (format, cache, NBD options...).
    pub open: OpenOptions,
    /// Set (by Ctrl-C, SIGTERM, a Python signal handler): the job stops
    /// between reads with an "interrupted" error.
    pub cancel: Arc<AtomicBool>,
    /// Key the block digests with the Proxmox Backup Server key of
    /// `open.keyfile`, if one is named (`SHA-256(block || id key)`, as an
    /// encrypted backup's index holds them): what maps compared with an
    /// encrypted backup's index need. The `pbs` construction keys them
    /// whenever a key file is named, whatever this says; the others only
    /// if this is set (a key file alone is then the key of a datastore
    /// read, and blkhash 0.11's checksum of the disk stays the plain one).
    pub keyed: bool,
}

impl JobSpec {
    /// The job, every value checked, with the defaults for what was not
    /// asked for.
    pub fn build(self) -> Result<Job, JobError> {
        self.resolve(None)
    }

    /// The job, with the digest and block size that were not asked for
    /// taken from `saved` (a saved map's), else the defaults.
    pub fn resolve(self, saved: Option<(Algorithm, usize)>) -> Result<Job, JobError> {
        let keyed = self.keyed || self.construction == Construction::Pbs;
        // Keyed digests are an encrypted backup's: its chunks' size, 4 MiB.
        let default_block_size = match keyed && self.open.keyfile.is_some() {
            true => Construction::Pbs.default_block_size(),
            false => self.construction.default_block_size(),
        };
        let algorithm = self
            .digest
            .or(saved.map(|s| s.0))
            .unwrap_or(self.construction.default_algorithm());
        let block_size = self
            .block_size
            .or(saved.map(|s| s.1))
            .unwrap_or(default_block_size);
        let threads = self.threads.unwrap_or_else(blkhash::default_threads);
        let queue_depth = self.queue_depth.unwrap_or(DEFAULT_QUEUE_DEPTH);
        let read_size = self.read_size.unwrap_or(DEFAULT_READ_SIZE);
        check_block_size(block_size)?;
        if !self.construction.takes(algorithm) {
            return Err(JobError::Digest(self.construction, algorithm));
        }
        if !(1..=MAX_THREADS).contains(&threads) {
            return Err(JobError::Threads(threads));
        }
        if !(1..=MAX_QUEUE_DEPTH).contains(&queue_depth) {
            return Err(JobError::QueueDepth(queue_depth));
        }
        check_read_size(read_size)?;
        if let Some(d) = self.io_depth.filter(|d| *d > MAX_IO_DEPTH) {
            return Err(JobError::IoDepth(d));
        }
        let block_key = match (&self.open.keyfile, keyed) {
            (Some(path), true) => {
                if algorithm != Algorithm::Sha256 {
                    return Err(JobError::KeyedDigest(algorithm));
                }
                let key = blkimage::pbs::load_key(path, &self.open)
                    .map_err(|e| JobError::Key(e.to_string()))?;
                Some(key)
            }
            _ => None,
        };
        let mut open = self.open;
        open.exact_size = exact_size(self.construction);
        Ok(Job {
            construction: self.construction,
            algorithm,
            block_size,
            threads,
            queue_depth,
            read_size,
            io_depth: self.io_depth,
            open,
            cancel: self.cancel,
            keyed: self.keyed,
            block_key,
        })
    }
}

/// Whether a raw image is hashed at its bytes' exact size
/// ([`OpenOptions::exact_size`]) in `construction`: oVirt imageio's file
/// backend hashes a file at its size, and Proxmox's backup client backs a
/// file up at its size, so their constructions give what they give; blkhash
/// 0.11's sees a raw file as QEMU does, its size rounded up to 512 (its
/// checksums stay what they were).
///
/// ```
/// use blkhash::Construction;
/// assert!(!blkjob::exact_size(Construction::Blkhash));
/// assert!(blkjob::exact_size(Construction::Imageio));
/// assert!(blkjob::exact_size(Construction::Pbs));
/// ```
pub fn exact_size(construction: Construction) -> bool {
    match construction {
        Construction::Blkhash => false,
        Construction::Imageio | Construction::Pbs => true,
    }
}

/// A block size: a multiple of 512 from 512 to 64 MiB (blkhash's rule,
/// [`Options::validate`]).
pub fn check_block_size(n: usize) -> Result<usize, JobError> {
    match Options::new().block_size(n).validate() {
        Ok(()) => Ok(n),
        Err(_) => Err(JobError::BlockSize(n as u64)),
    }
}

/// A read size: a multiple of 4 KiB from 4 KiB to 256 MiB.
pub fn check_read_size(n: usize) -> Result<usize, JobError> {
    if !n.is_multiple_of(MIN_READ_SIZE) || !(MIN_READ_SIZE..=MAX_READ_SIZE).contains(&n) {
        return Err(JobError::ReadSize(n as u64));
    }
    Ok(n)
}

/// Why a [`JobSpec`] is not a job: the value asked for, and (in the
/// message) the rule it breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum JobError {
    /// Not a multiple of 512 from 512 to 64 MiB.
    BlockSize(u64),
    /// Not 1 to 128.
    Threads(usize),
    /// Not 1 to 128.
    QueueDepth(usize),
    /// Not a multiple of 4 KiB from 4 KiB to 256 MiB.
    ReadSize(u64),
    /// More than 256.
    IoDepth(usize),
    /// Block digests keyed with a PBS key in another digest than sha256.
    KeyedDigest(Algorithm),
    /// The key file could not be read or opened (the reason, naming it).
    Key(String),
    /// A digest the construction does not take ([`Construction::takes`]):
    /// imageio's checksum of a digest oVirt imageio does not compute.
    Digest(Construction, Algorithm),
}

impl fmt::Display for JobError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            JobError::BlockSize(n) => write!(
                f,
                "block size must be a multiple of 512 from 512 to 64m, not {n}"
            ),
            JobError::Threads(n) => write!(f, "threads must be 1 to {MAX_THREADS}, not {n}"),
            JobError::QueueDepth(n) => {
                write!(f, "queue depth must be 1 to {MAX_QUEUE_DEPTH}, not {n}")
            }
            JobError::ReadSize(n) => write!(
                f,
                "read size must be a multiple of 4k from 4k to 256m, not {n}"
            ),
            JobError::IoDepth(n) => write!(f, "io depth must be 0 to {MAX_IO_DEPTH}, not {n}"),
            JobError::KeyedDigest(a) => write!(
                f,
                "a Proxmox Backup Server key keys sha256 block digests (an encrypted backup's), \
                 not {a}"
            ),
            JobError::Key(why) => write!(f, "{why}"),
            JobError::Digest(c, a) => f.write_str(&blkhash::unsupported_digest(*c, *a)),
        }
    }
}

impl std::error::Error for JobError {}

impl From<JobError> for io::Error {
    fn from(e: JobError) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidInput, e)
    }
}

/// A checked hashing job: how to open, read and hash an input. Made by
/// [`JobSpec::build`] or [`JobSpec::resolve`]; [`Job::spec`] gives it back
/// as a spec to change and check again.
#[derive(Clone, Debug)]
pub struct Job {
    construction: Construction,
    algorithm: Algorithm,
    block_size: usize,
    threads: usize,
    queue_depth: usize,
    read_size: usize,
    io_depth: Option<usize>,
    open: OpenOptions,
    cancel: Arc<AtomicBool>,
    keyed: bool,
    block_key: Option<Key>,
}

impl Default for Job {
    /// sha256, 64 KiB blocks, and the other defaults.
    fn default() -> Job {
        JobSpec::default().build().expect("the defaults are valid")
    }
}

impl Job {
    /// How block digests become the checksum.
    pub fn construction(&self) -> Construction {
        self.construction
    }

    /// The digest of the blocks and of the checksum.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// Bytes per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Digest threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Reads and digest jobs queued ahead of the digest workers.
    pub fn queue_depth(&self) -> usize {
        self.queue_depth
    }

    /// Bytes per read: the read size asked for, rounded up to whole blocks
    /// (reads then go to the digest workers as they are).
    pub fn read_size(&self) -> usize {
        self.read_size.next_multiple_of(self.block_size)
    }

    /// Reads in flight apart from the digest threads, if asked for.
    pub fn io_depth(&self) -> Option<usize> {
        self.io_depth
    }

    /// How images are opened.
    pub fn open_options(&self) -> &OpenOptions {
        &self.open
    }

    /// The flag that stops the job.
    pub fn cancel(&self) -> &Arc<AtomicBool> {
        &self.cancel
    }

    /// The job as a spec, every value filled in: change it and build again.
    pub fn spec(&self) -> JobSpec {
        JobSpec {
            construction: self.construction,
            digest: Some(self.algorithm),
            block_size: Some(self.block_size),
            threads: Some(self.threads),
            queue_depth: Some(self.queue_depth),
            read_size: Some(self.read_size),
            io_depth: self.io_depth,
            open: self.open.clone(),
            cancel: self.cancel.clone(),
            keyed: self.keyed,
        }
    }

    /// The Proxmox Backup Server key the block digests are keyed with
    /// ([`JobSpec::keyed`]), if they are.
    pub fn block_key(&self) -> Option<&Key> {
        self.block_key.as_ref()
    }

    /// The suffix of every block digest: the key's id key, or nothing.
    pub fn digest_key(&self) -> &[u8] {
        self.block_key.as_ref().map_or(&[], |k| k.id_key())
    }

    /// The same job stopped by `cancel`.
    pub fn with_cancel(mut self, cancel: Arc<AtomicBool>) -> Job {
        self.cancel = cancel;
        self
    }

    /// The hasher's options for this job.
    pub fn hasher_options(&self) -> Options {
        Options::new()
            .construction(self.construction)
            .algorithm(self.algorithm)
            .block_size(self.block_size)
            .threads(self.threads)
            .queue_depth(self.queue_depth)
            .block_key(self.digest_key())
    }

    /// Open the image `name` (a path, an NBD URL, or "-" for standard
    /// input) as this job opens images.
    pub fn open(&self, name: impl AsRef<std::ffi::OsStr>) -> io::Result<blkimage::Input> {
        blkimage::open(name.as_ref(), &self.open)
    }

    /// Open the image `name` to be asked for its dirty bitmap `bitmap`
    /// ([`blkimage::Source::dirty`]): the one place the bitmap's name is
    /// given before it is read, since an NBD server offers a bitmap only
    /// if asked for it while connecting. A stream is an error naming
    /// `what` (see [`crate::seekable`]).
    pub fn open_dirty(
        &self,
        name: impl AsRef<std::ffi::OsStr>,
        bitmap: &str,
        what: &str,
    ) -> io::Result<std::sync::Arc<dyn blkimage::Source>> {
        crate::seekable(open_dirty(name.as_ref(), &self.open, Some(bitmap))?, what)
    }
}

/// [`blkimage::open`] of an image that will be asked for its dirty bitmap
/// `bitmap`, if one is named (see [`Job::open_dirty`]).
pub fn open_dirty(
    name: &std::ffi::OsStr,
    opts: &OpenOptions,
    bitmap: Option<&str>,
) -> io::Result<blkimage::Input> {
    match bitmap {
        None => blkimage::open(name, opts),
        Some(b) => {
            let mut opts = opts.clone();
            opts.nbd.dirty_bitmap = Some(b.to_string());
            blkimage::open(name, &opts)
        }
    }
}
