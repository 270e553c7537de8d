//! The outer digest of a checksum, fed from the block digests a map
//! holds (zero blocks as counts): what a map's checksum is checked with,
//! and how a checksum in another construction is derived from a map.

use crate::{MapError, Piece, Pieces};
use blkhash::{Algorithm, Checksum, Construction};
use std::io;

/// The outer digest of a checksum, given the block digests in order: zero
/// blocks as a count, their digests hashed a batch at a time.
pub(crate) struct Outer {
    algorithm: Algorithm,
    digest: Box<dyn blkhash::Streaming>,
    /// `batch` zero-block digests in a row ([`blkhash::zero_run`]).
    zeros: Vec<u8>,
    batch: usize,
    len: usize,
}

impl Outer {
    pub(crate) fn new(algorithm: Algorithm, zero_digest: &[u8]) -> Outer {
        let (zeros, batch) = blkhash::zero_run(zero_digest);
        Outer {
            algorithm,
            digest: algorithm.streaming(),
            zeros,
            batch,
            len: zero_digest.len(),
        }
    }

    pub(crate) fn data(&mut self, digests: &[u8]) {
        self.digest.update(digests);
    }

    pub(crate) fn zeros(&mut self, count: u64) {
        let never = std::sync::atomic::AtomicBool::new(false);
        let _ = self.zeros_until(count, &never);
    }

    /// [`Outer::zeros`], stopped with an "interrupted" error once `cancel`
    /// is set (checked once per batch, about a millisecond).
    pub(crate) fn zeros_until(
        &mut self,
        mut count: u64,
        cancel: &std::sync::atomic::AtomicBool,
    ) -> Result<(), MapError> {
        while count > 0 {
            if cancel.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(MapError::Io(io::Error::new(
                    io::ErrorKind::Interrupted,
                    "interrupted",
                )));
            }
            let k = count.min(self.batch as u64);
            self.digest.update(&self.zeros[..k as usize * self.len]);
            count -= k;
        }
        Ok(())
    }

    /// The checksum of an image of `size` bytes (blkhash 0.11's, what a
    /// map holds).
    pub(crate) fn checksum(self, size: u64) -> Checksum {
        self.checksum_with(Construction::Blkhash, size)
    }

    /// The checksum of an image of `size` bytes in `construction`.
    pub(crate) fn checksum_with(mut self, construction: Construction, size: u64) -> Checksum {
        if construction.appends_length() {
            self.digest.update(&size.to_le_bytes());
        }
        let bytes = self.digest.finalize();
        Checksum::from_bytes(self.algorithm, &bytes)
            .expect("a digest of the algorithm's length")
            .with_construction(construction)
    }
}

/// The image checksum of the map `pieces` reads, in `construction`: the
/// one its header holds for blkhash 0.11's (`None` for a part), else
/// derived from the block digests as they stream by (no map in memory).
///
/// ```
/// use blkhash::{checksum_with, Algorithm, Construction, Options};
/// use blkmap::Map;
/// let data = vec![5u8; 10_000];
/// let map = Map::compute(Options::new().block_size(4096), &data).unwrap();
/// let c = Construction::Imageio;
/// let got = blkmap::checksum_in(map.pieces(), c).unwrap();
/// assert_eq!(got, Some(checksum_with(c, Algorithm::Sha256, 4096, &data)));
/// // A digest imageio does not compute has no imageio checksum.
/// let md5_sha1 = Map::compute(Options::new().algorithm(Algorithm::Md5Sha1), &data).unwrap();
/// assert!(blkmap::checksum_in(md5_sha1.pieces(), c).is_err());
/// ```
pub fn checksum_in(
    mut pieces: impl Pieces,
    construction: Construction,
) -> Result<Option<Checksum>, MapError> {
    let h = pieces.header().clone();
    if construction == Construction::Blkhash {
        return Ok(h.checksum);
    }
    if !construction.takes(h.algorithm) {
        let msg = blkhash::unsupported_digest(construction, h.algorithm);
        return Err(MapError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            msg,
        )));
    }
    let mut outer = Outer::new(h.algorithm, &zero_digest(h.algorithm, h.block_size));
    while let Some(p) = pieces.next_piece()? {
        match p {
            Piece::Zeros(n) => outer.zeros(n),
            Piece::Data(d) => outer.data(d),
        }
    }
    Ok(Some(outer.checksum_with(construction, h.size)))
}

/// The digest of a block of `block_size` zeros: a map records no digest
/// for such a block, and a block digest equal to this one marks it.
///
/// ```
/// let map = blkmap::Map::compute(blkhash::Options::new(), &[0u8; 100]).unwrap();
/// let zero = blkmap::zero_digest(map.algorithm(), map.block_size());
/// assert_eq!(zero, map.zero_digest());
/// ```
pub fn zero_digest(algorithm: Algorithm, block_size: usize) -> Vec<u8> {
    algorithm.digest_zeros(block_size)
}
