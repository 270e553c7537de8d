//! A Proxmox Backup Server fixed index named where an image is: the disk
//! it holds. With its datastore it is read from the chunks (an image like
//! any other, [`blkimage::open`]); without, what its digests give: its
//! `index_csum` (the `pbs` construction, and `imageio`'s with sha256,
//! which is the same) and blkhash 0.11's construction, both in sha256 and
//! blocks of its chunk size. Anything else needs the chunks: refused,
//! saying so ([`IndexOnly`]).

use crate::{Hashed, Job};
use blkhash::{Algorithm, Construction};
use blkimage::pbs::store::Key;
use blkimage::pbs::{DIGEST_LEN, NoDatastore};
use std::fmt;
use std::io;
use std::path::Path;

/// A checksum asked of an index without its datastore that its digests
/// cannot give: another digest or block size than sha256 and its chunk
/// size.
#[derive(Debug)]
pub struct IndexOnly {
    /// The index's chunk size.
    pub chunk_size: usize,
    /// The digest asked for.
    pub algorithm: Algorithm,
    /// The block size asked for.
    pub block_size: usize,
}

impl fmt::Display for IndexOnly {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a PBS fixed index whose datastore was not found (no directory holding .chunks above \
             it) gives the checksum of the disk it holds only in sha256 with blocks of its chunk \
             size ({} bytes); {} with {}-byte blocks needs the chunks",
            self.chunk_size,
            self.algorithm.name(),
            self.block_size
        )
    }
}

impl std::error::Error for IndexOnly {}

/// The checksum of the disk the index at `index` holds, from its digests
/// alone, as `job` asks: checked whole (its length, its `index_csum`).
/// Nothing is read of the disk: its data and zero bytes are told by the
/// digests (a chunk with the digest of a chunk of zeros is zeros).
pub fn index_checksum(index: &Path, job: &Job) -> io::Result<Hashed> {
    let mut r = blkimage::pbs::open_fidx(index)?;
    let h = r.header().clone();
    if (job.algorithm(), job.block_size()) != (Algorithm::Sha256, h.chunk_size) {
        let e = IndexOnly {
            chunk_size: h.chunk_size,
            algorithm: job.algorithm(),
            block_size: job.block_size(),
        };
        return Err(io::Error::new(io::ErrorKind::InvalidInput, e));
    }
    let zero = Algorithm::Sha256.digest_zeros(h.chunk_size);
    let (full, mut at) = (h.size / h.chunk_size as u64, 0u64);
    let mut stats = blkimage::Stats::default();
    while let Some(digests) = r.next_digests()? {
        for d in digests.chunks_exact(DIGEST_LEN) {
            let len = (h.size - at * h.chunk_size as u64).min(h.chunk_size as u64);
            match at < full && d == zero {
                true => stats.zero += len,
                false => stats.data += len,
            }
            at += 1;
        }
    }
    Ok(Hashed {
        checksum: r.checksum_in(job.construction())?,
        format: "fidx".into(),
        size: h.size,
        block_size: h.chunk_size,
        stats,
        rounded: None,
        decompressed: None,
        resumed_at: 0,
    })
}

/// The checksum of the image `name` as `job` asks ([`crate::hash`] of
/// [`Job::open`]), or of the disk a fixed index holds when its datastore
/// is not found ([`index_checksum`]).
pub fn hash_named(
    name: impl AsRef<std::ffi::OsStr>,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Hashed> {
    let path = Path::new(name.as_ref());
    if let Some(image) = pbs_checkable(path, job)? {
        return hash_pbs_chunks(image, path, job, progress);
    }
    match job.open(name) {
        Ok(input) => crate::hash(input, job, progress),
        Err(e) => match blkimage::cause::<NoDatastore>(&e) {
            Some(nd) => index_checksum(&nd.index, job),
            None => Err(e),
        },
    }
}

/// The backup in its datastore that the index at `path` is, opened, if
/// `job` asks for its checksum in the `pbs` construction, in sha256 and
/// blocks of its chunk size ([`hash_pbs_chunks`] gives it). `None` where
/// that does not apply (another construction, digest or block size, a
/// format forced, not an index, no datastore): the ordinary paths then.
pub fn pbs_checkable(path: &Path, job: &Job) -> io::Result<Option<blkimage::pbs::PbsImage>> {
    if job.construction() != Construction::Pbs
        || job.algorithm() != Algorithm::Sha256
        || job.open_options().format.is_some()
        || !blkimage::pbs::is_fidx_file(path)
    {
        return Ok(None);
    }
    let image = match blkimage::pbs::open_image(path, job.open_options()) {
        Ok(image) => image,
        Err(e) if blkimage::cause::<NoDatastore>(&e).is_some() => return Ok(None),
        Err(e) => return Err(e),
    };
    // The index's digests are keyed exactly when the job's are.
    if image.header().chunk_size != job.block_size() || image.keyed() != job.block_key().is_some() {
        return Ok(None);
    }
    Ok(Some(image))
}

/// The checksum of the backup `image` (the index at `path`,
/// [`pbs_checkable`]): every chunk read and checked against the index
/// ([`blkimage::pbs::PbsImage::check_chunks`], in parallel), then the
/// index's digests are the block digests. One SHA-256 pass, where reading
/// the disk to digest it again takes two.
pub fn hash_pbs_chunks(
    image: blkimage::pbs::PbsImage,
    path: &Path,
    job: &Job,
    progress: &mut dyn FnMut(u64),
) -> io::Result<Hashed> {
    let (data, zero) = image.check_chunks(job.threads(), job.cancel(), progress)?;
    let mut hashed = index_checksum(path, job)?;
    hashed.format = "pbs".into();
    hashed.stats = blkimage::Stats {
        data,
        zero,
        ..Default::default()
    };
    Ok(hashed)
}

/// The key a disk compared with the index at `index` (blkdiff, blksync's
/// `--state`) is hashed with: an encrypted backup's digests are keyed
/// (`SHA-256(chunk || id key)`), so the key named by `open.keyfile` is
/// needed, and checked first against the manifest beside the index where
/// there is one: a wrong key is an error naming both fingerprints, an
/// encrypted backup without a key or a plain one with a key an error
/// saying so, never "every block differs". `None`: no key, plain digests.
pub fn index_key(index: &Path, open: &blkimage::OpenOptions) -> io::Result<Option<Key>> {
    let header = blkimage::pbs::open_fidx(index)?.header().clone();
    let key = match &open.keyfile {
        Some(path) => Some(blkimage::pbs::load_key(path, open)?),
        None => None,
    };
    blkimage::pbs::check_manifest(index, &header, key.as_ref(), true)?;
    Ok(key)
}

/// Whether a disk compared with the index at `index` is hashed with keyed
/// block digests ([`index_key`], its checks made).
pub fn index_keyed(index: &Path, open: &blkimage::OpenOptions) -> io::Result<bool> {
    Ok(index_key(index, open)?.is_some())
}
