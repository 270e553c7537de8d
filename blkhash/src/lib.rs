//! The blkhash construction: fast, parallel checksums of disk images.
//!
//! For a digest `H` and block size `B`, the checksum of a byte string of
//! length `L` is
//!
//! ```text
//! H( H(block 0) || H(block 1) || ... || H(block n-1) || le64(L) )
//! ```
//!
//! where the blocks are `B` bytes but for a possibly shorter last one.
//! Two other systems keep checksums of the same shape without the length,
//! oVirt imageio and Proxmox Backup Server ([`Construction`]). A full
//! block of zeros always has the same digest, so ranges known to read as
//! zeros cost no reading and no block digests; the others are digested in
//! parallel by a worker pool and combined in block order. Checksums equal
//! those of blkhash 0.11, the reference C implementation.
//!
//! This crate is only the construction: it does no I/O and knows no image
//! format.
//!
//! ```
//! use blkhash::{Algorithm, Hasher, Options};
//! let mut h = Hasher::with_options(Options::new().algorithm(Algorithm::Blake3)).unwrap();
//! h.update(b"hello");
//! h.update_zeros(1 << 30);
//! let checksum = h.finalize();
//! assert_eq!(checksum.to_hex().len(), 64);
//! ```
//!
//! [`Hasher`] is the everyday type (and [`hash`] the one-call form);
//! [`Pipeline`] takes buffers without a copy and runs reads on the workers,
//! for image readers and bindings.
//!
//! ```
//! let mut h = blkhash::Hasher::new(); // SHA-256, 64 KiB blocks
//! h.update(b"hello");
//! assert_eq!(h.finalize(), blkhash::hash(b"hello"));
//! ```

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

/// The methods `Hasher` and `Pipeline` share: both wrap one engine and say
/// the same of it, so the text and the code are written once.
macro_rules! engine_methods {
    () => {
        /// The digest.
        pub fn algorithm(&self) -> Algorithm {
            self.0.algorithm()
        }

        /// How the block digests become the checksum.
        pub fn construction(&self) -> Construction {
            self.0.construction()
        }

        /// Bytes per block.
        pub fn block_size(&self) -> usize {
            self.0.block_size()
        }

        /// Digest workers.
        pub fn threads(&self) -> usize {
            self.0.threads()
        }

        /// The digest of a full block of zeros.
        pub fn zero_digest(&self) -> &[u8] {
            self.0.zero_digest()
        }

        /// Bytes given so far.
        pub fn len(&self) -> u64 {
            self.0.len()
        }

        /// True if nothing was given yet.
        pub fn is_empty(&self) -> bool {
            self.0.len() == 0
        }

        /// Call `f` for every block, in block order, as its digest joins the
        /// checksum: the block digests stay reachable (block maps, diffs).
        ///
        /// ```
        /// use blkhash::{BlockEvent, Hasher, Options};
        /// use std::sync::{Arc, Mutex};
        /// let seen = Arc::new(Mutex::new(Vec::new()));
        /// let log = seen.clone();
        /// let mut h = Hasher::with_options(Options::new().block_size(512)).unwrap();
        /// h.set_observer(move |e| log.lock().unwrap().push(match e {
        ///     BlockEvent::Data { index, .. } => format!("data {index}"),
        ///     BlockEvent::Zeros { index, count } => format!("zeros {index}+{count}"),
        /// }));
        /// h.update([1u8; 512]);
        /// h.update_zeros(1024);
        /// h.update([2u8; 100]);
        /// h.finalize();
        /// assert_eq!(*seen.lock().unwrap(), ["data 0", "zeros 1+2", "data 3"]);
        /// ```
        pub fn set_observer(&mut self, f: impl FnMut(BlockEvent<'_>) + Send + 'static) {
            self.0.set_observer(f);
        }

        /// Add bytes, copied into internal buffers. Whole blocks of zeros are
        /// found here and not copied: they cost a scan, not a digest.
        ///
        /// # Panics
        ///
        /// If the total would pass 2^64 - 1 bytes, the most a checksum
        /// records (its length is a le64); nothing is added then. Check
        /// with [`len`](Self::len) first where a caller controls the length.
        pub fn update(&mut self, data: impl AsRef<[u8]>) {
            self.0.update(data.as_ref());
        }

        /// Add `len` bytes that read as zeros. Full zero blocks are neither
        /// allocated nor digested: their digest is a constant.
        ///
        /// # Panics
        ///
        /// If the total would pass 2^64 - 1 bytes, as [`update`](Self::update).
        pub fn update_zeros(&mut self, len: u64) {
            self.0.update_zeros(len);
        }
    };
}

mod algorithm;
mod checksum;
mod construction;
mod hasher;
mod memory;
mod options;
mod order;
mod pipeline;
mod pool;
mod zero;

pub use algorithm::{ALGORITHMS, Algorithm, Streaming, UnknownAlgorithm};
pub use checksum::{Checksum, ParseChecksumError, to_hex};
pub use construction::{CONSTRUCTIONS, Construction, UnknownConstruction};
pub use hasher::Hasher;
pub use memory::{
    Room, address_space_limited, leaves_headroom, one_heap_under_a_limit, out_of_memory, room,
    room_for_thread, try_zeroed,
};
pub use options::{
    DEFAULT_BLOCK_SIZE, IN_FLIGHT_BUDGET, MAX_BLOCK_SIZE, MAX_THREADS, MIN_BLOCK_SIZE, Options,
    OptionsError, default_threads, depth_within_budget, unsupported_digest,
};
pub use order::{BlockEvent, zero_run};
pub use pipeline::Pipeline;
pub use pool::{Fill, Lend};
pub use zero::is_zero;

/// The checksum of `data` with the defaults (SHA-256, 64 KiB blocks, one
/// worker per core), in one call. Panics if its workers cannot start, as
/// [`Hasher::new`].
///
/// ```
/// let c = blkhash::hash(b"hello");
/// assert_eq!(c.algorithm(), blkhash::Algorithm::Sha256);
/// assert_eq!(c, blkhash::checksum_of(blkhash::Algorithm::Sha256, 65536, b"hello"));
/// ```
pub fn hash(data: impl AsRef<[u8]>) -> Checksum {
    let mut h = Hasher::new();
    h.update(data);
    h.finalize()
}

/// The checksum of `data` computed directly from the definition, with no
/// pool and no zero shortcut: the model the [`Hasher`] is tested against.
///
/// ```
/// use blkhash::{checksum_of, Algorithm, Hasher, Options};
/// let data = vec![3u8; 100_000];
/// let mut h = Hasher::with_options(Options::new().block_size(4096)).unwrap();
/// h.update(&data);
/// assert_eq!(h.finalize(), checksum_of(Algorithm::Sha256, 4096, &data));
/// ```
pub fn checksum_of(alg: Algorithm, block_size: usize, data: &[u8]) -> Checksum {
    checksum_with(Construction::Blkhash, alg, block_size, data)
}

/// [`checksum_of`] in any [`Construction`]: the model of each, from its
/// definition.
///
/// ```
/// use blkhash::{checksum_of, checksum_with, Algorithm, Construction};
/// let data = vec![3u8; 5 << 20];
/// let ours = checksum_with(Construction::Blkhash, Algorithm::Sha256, 4 << 20, &data);
/// assert_eq!(ours, checksum_of(Algorithm::Sha256, 4 << 20, &data));
/// let pbs = checksum_with(Construction::Pbs, Algorithm::Sha256, 4 << 20, &data);
/// assert_ne!(pbs.as_bytes(), ours.as_bytes()); // no length at the end
/// ```
pub fn checksum_with(
    construction: Construction,
    alg: Algorithm,
    block_size: usize,
    data: &[u8],
) -> Checksum {
    let mut outer = alg.streaming();
    let mut d = vec![0u8; alg.output_len()];
    for block in data.chunks(block_size) {
        alg.digest_into(block, &mut d);
        outer.update(&d);
    }
    if construction.appends_length() {
        outer.update(&(data.len() as u64).to_le_bytes());
    }
    Checksum::new(alg, outer.finalize()).with_construction(construction)
}
