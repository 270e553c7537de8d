//! Proxmox Backup Server fixed indexes (`.fidx`) read as block maps.
//!
//! The parser is `blkimage`'s ([`blkimage::pbs`]: the image layer reads
//! an index over its datastore too); it is re-exported here. An
//! unencrypted chunk's digest is the SHA-256 of its bytes (the last chunk
//! shorter), so a fixed index is the block map of the disk with `sha256`
//! and the chunk size as the block size, and its `index_csum` is the
//! disk's checksum in the [`Pbs`](blkhash::Construction::Pbs)
//! construction. An encrypted backup's digests are keyed: they match an
//! image's only when it is hashed with the same key.

use crate::MapError;
use blkhash::Algorithm;
use blkimage::pbs::DIGEST_LEN;
pub use blkimage::pbs::{
    FIDX_HEADER_LEN, FIDX_MAGIC, FidxError, FidxHeader, FidxReader, is_fidx, is_fidx_file,
    open_fidx,
};
use std::io::{self, Read};

impl From<FidxError> for MapError {
    fn from(e: FidxError) -> MapError {
        match e {
            FidxError::Invalid(why) => MapError::Fidx(why),
            FidxError::Io(e) => MapError::Io(e),
        }
    }
}

/// Visit the chunks of `r` in order, read to its end and checked: their
/// index, and `None` for a full chunk with the digest of a chunk of zeros
/// (a zero block of a map), else their digest.
fn each_chunk<R: Read>(
    r: &mut FidxReader<R>,
    mut visit: impl FnMut(u64, Option<&[u8]>) -> io::Result<()>,
) -> Result<(), MapError> {
    let bs = r.header().chunk_size;
    let zero = crate::zero_digest(Algorithm::Sha256, bs);
    let full = r.header().size / bs as u64;
    let mut index = 0u64;
    while let Some(digests) = r.next_digests()? {
        for d in digests.chunks_exact(DIGEST_LEN) {
            visit(index, (index >= full || d != zero).then_some(d))?;
            index += 1;
        }
    }
    Ok(())
}

/// The block map of the fixed index `r`, as [`fidx_map`] makes it, written
/// to `out` (a new, empty file: a temporary one) and opened there
/// ([`MapFile`](crate::MapFile)): memory bounded by one buffer whatever
/// the index's size, for callers that read a map where it lies (blksync
/// reads an index as its state so).
///
/// ```
/// use blkhash::{checksum_with, Algorithm, Construction};
/// use blkmap::{FidxReader, MapLike, FIDX_MAGIC};
/// // An index of a 5 MiB image of 4 MiB chunks, the first all zeros.
/// let mut data = vec![0u8; 5 << 20];
/// data[4 << 20..].fill(7);
/// let mut digests = Vec::new();
/// for chunk in data.chunks(4 << 20) {
///     let mut d = [0u8; 32];
///     Algorithm::Sha256.digest_into(chunk, &mut d);
///     digests.extend_from_slice(&d);
/// }
/// let csum = checksum_with(Construction::Pbs, Algorithm::Sha256, 4 << 20, &data);
/// let mut file = vec![0u8; 4096];
/// file[..8].copy_from_slice(&FIDX_MAGIC);
/// file[32..64].copy_from_slice(csum.as_bytes());
/// file[64..72].copy_from_slice(&(5u64 << 20).to_le_bytes());
/// file[72..80].copy_from_slice(&(4u64 << 20).to_le_bytes());
/// file.extend_from_slice(&digests);
///
/// let r = FidxReader::new(&file[..]).unwrap();
/// let map = blkmap::fidx_map_file(r, tempfile::tempfile().unwrap()).unwrap();
/// let want = blkhash::checksum_of(Algorithm::Sha256, 4 << 20, &data);
/// assert_eq!(map.header().checksum, Some(want));
/// assert_eq!(map.block(0).unwrap(), None); // a zero block
/// assert_eq!(map.block(1).unwrap().unwrap(), &digests[32..]);
/// ```
pub fn fidx_map_file<R: Read>(
    mut r: FidxReader<R>,
    out: std::fs::File,
) -> Result<crate::MapFile, MapError> {
    let h = r.header().clone();
    let bs = h.chunk_size;
    let template = crate::Header {
        algorithm: Algorithm::Sha256,
        block_size: bs,
        size: h.size,
        range: crate::Range {
            offset: 0,
            len: h.size,
        },
        checksum: Some(crate::merge::placeholder(Algorithm::Sha256)),
        identity: None,
    };
    let mut w = crate::RecordWriter::new(out, &template)?;
    each_chunk(&mut r, |_, digest| match digest {
        None => w.zeros(1),
        Some(d) => w.data(d),
    })?;
    let header = crate::Header {
        checksum: Some(r.checksum()?),
        ..template
    };
    crate::MapFile::from_file(w.finish(&header)?)
}

/// The block map of the fixed index `r`: `sha256` digests of blocks of
/// the chunk size, a chunk whose digest is that of a chunk of zeros kept
/// as a zero block. Memory grows with the digests read, never with what
/// the header claims.
pub fn fidx_map<R: Read>(mut r: FidxReader<R>) -> Result<crate::Map, MapError> {
    let header = r.header().clone();
    let bs = header.chunk_size;
    let builder = crate::MapBuilder::new(Algorithm::Sha256, bs)?;
    let mut observe = builder.observer();
    each_chunk(&mut r, |index, digest| {
        observe(match digest {
            None => blkhash::BlockEvent::Zeros { index, count: 1 },
            Some(digest) => blkhash::BlockEvent::Data { index, digest },
        });
        Ok(())
    })?;
    let checksum = r.checksum()?;
    builder.finish(header.size, &checksum)
}
