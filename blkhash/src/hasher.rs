//! The everyday hasher: bytes in, a checksum out.

use crate::algorithm::Algorithm;
use crate::checksum::Checksum;
use crate::construction::Construction;
use crate::options::{Options, OptionsError};
use crate::order::{BlockEvent, Engine};
use std::fmt;
use std::io;

/// Computes a blkhash checksum of bytes given by copy
/// ([`update`](Hasher::update), or as an [`io::Write`]) or known to be zeros
/// ([`update_zeros`](Hasher::update_zeros), which neither allocates nor
/// digests anything for full zero blocks). Blocks are digested in parallel
/// by a pool of workers; the checksum only depends on the bytes.
///
/// For buffers handed over without a copy, or reads run on the workers, see
/// [`Pipeline`](crate::Pipeline).
///
/// ```
/// use blkhash::Hasher;
/// let mut h = Hasher::new();
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
/// let mut a = Hasher::with_options(opts.clone()).unwrap();
/// a.update([0u8; 10000]);
/// let mut b = Hasher::with_options(opts).unwrap();
/// b.update_zeros(5000);
/// b.update([0u8; 5000]);
/// assert_eq!(a.finalize(), b.finalize());
/// ```
pub struct Hasher(Engine<Vec<u8>>);

impl Hasher {
    /// A hasher with the defaults: SHA-256, 64 KiB blocks, one worker per core.
    ///
    /// # Panics
    ///
    /// If a worker thread cannot be started (the system's limit on threads
    /// was reached), as `std::thread::spawn` does;
    /// [`with_options`](Hasher::with_options) returns that as an error.
    pub fn new() -> Self {
        Hasher::with_options(Options::new()).unwrap_or_else(|e| panic!("blkhash: {e}"))
    }

    /// A hasher with `opts`, or why they are invalid or its worker threads
    /// could not start ([`OptionsError::ThreadStart`]).
    ///
    /// ```
    /// use blkhash::{Algorithm, Hasher, Options};
    /// let h = Hasher::with_options(Options::new().algorithm(Algorithm::Blake3)).unwrap();
    /// assert_eq!(h.algorithm(), Algorithm::Blake3);
    /// assert!(Hasher::with_options(Options::new().threads(0)).is_err());
    /// ```
    pub fn with_options(opts: Options) -> Result<Self, OptionsError> {
        Engine::new(opts).map(Hasher)
    }

    engine_methods!();

    /// Finish: the checksum of everything given.
    pub fn finalize(mut self) -> Checksum {
        // Nothing here can fail: only a Pipeline's fills can.
        self.0.drain();
        self.0.checksum()
    }
}

impl Default for Hasher {
    fn default() -> Self {
        Hasher::new()
    }
}

impl fmt::Debug for Hasher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt_as("Hasher", f)
    }
}

/// A hasher is a writer: `io::copy(&mut file, &mut hasher)` hashes a file
/// (every byte read; the image commands skip holes instead). Past 2^64 - 1
/// bytes a write fails with `InvalidInput` instead of panicking.
///
/// ```
/// use blkhash::Hasher;
/// let mut h = Hasher::new();
/// std::io::copy(&mut &[5u8; 100_000][..], &mut h).unwrap();
/// assert_eq!(h.finalize(), blkhash::hash([5u8; 100_000]));
/// ```
impl io::Write for Hasher {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.0.fits(buf.len() as u64) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a blkhash checksum covers at most 2^64 - 1 bytes",
            ));
        }
        self.0.update(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
