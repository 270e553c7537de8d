//! A Proxmox Backup Server fixed index opened as the disk it holds.

use crate::formats::pbs::{self, NoDatastore};
use crate::open::{Input, OpenOptions};
use std::io;
use std::path::Path;

/// The disk the index at `path` holds. Its datastore is looked for above
/// it; without one, an error carrying [`NoDatastore`] (what the index
/// alone gives is the caller's to take).
pub fn open(path: &Path, _opts: &OpenOptions) -> io::Result<Input> {
    let header = pbs::open_fidx(path)?.header().clone();
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        NoDatastore {
            index: path.to_path_buf(),
            header,
        },
    ))
}
