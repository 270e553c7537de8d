//! Proxmox Backup Server: a VM disk backup is a fixed index (`.fidx`,
//! [`fidx`]), the digest of each fixed-size chunk of the disk in order,
//! over a datastore of chunks named by their digests. The index is the
//! format; the datastore is its storage.

pub mod fidx;
pub mod image;
pub mod manifest;

/// The datastore: chunks, blobs, keys (the storage layer's).
pub use crate::storage::pbs as store;

pub use fidx::{
    DIGEST_LEN, FIDX_HEADER_LEN, FIDX_MAGIC, FidxError, FidxHeader, FidxReader, is_fidx,
    is_fidx_file, open_fidx,
};

use std::fmt;
use std::path::{Path, PathBuf};

/// A fixed index opened as an image whose datastore was not found: the
/// disk it holds is in the chunks, and only what its digests give (its
/// `index_csum`, blkhash's construction at sha256 and its chunk size) can
/// be had without them. A typed error, so that a caller that can do with
/// the digests (`blkjob::index_checksum`) finds it under the contexts.
#[derive(Debug)]
pub struct NoDatastore {
    /// The index.
    pub index: PathBuf,
    /// Its header, checked.
    pub header: FidxHeader,
}

impl fmt::Display for NoDatastore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a PBS fixed index: the disk it holds is read from its datastore's chunks, and no \
             datastore (a directory holding .chunks) is above it"
        )
    }
}

impl std::error::Error for NoDatastore {}

/// The datastore of the index at `index`: the nearest directory above it
/// that holds a `.chunks` directory (`DATASTORE/[ns/NS/]vm/ID/TIME/X.fidx`).
pub fn find_datastore(index: &Path) -> Option<PathBuf> {
    let index = std::fs::canonicalize(index).ok()?;
    (index.ancestors().skip(1))
        .find(|d| d.join(".chunks").is_dir())
        .map(Path::to_path_buf)
}
