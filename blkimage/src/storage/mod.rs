//! Where bytes come from: a file or block device read with pread or from
//! memory maps ([`file`], [`mapped`]), a file over HTTP(S) ([`http`]), an
//! NBD export ([`nbd`]), or memory. The bottom layer of the crate: nothing
//! here knows an image format (`crate::formats` reads these bytes) or how
//! an input is opened (`crate::open`).
//!
//! A format reads its image through [`Storage`]: bytes at offsets, nothing
//! of guest offsets. A file, and a file over HTTP(S), are also read as raw
//! images (`crate::formats::raw`); an NBD export is a [`Source`](crate::Source) of its own,
//! since the server already presents guest bytes.

pub mod compressed;
pub mod file;
pub mod http;
pub mod mapped;
pub mod nbd;
pub mod pbs;
pub mod readpath;

pub use file::{ImageFile, RawFile};
pub use readpath::MapReads;

use crate::source::Origin;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Random-access bytes an image (or its external data file) lives in.
/// Reads come from several threads at once.
pub trait Storage: Send + Sync {
    /// The length in bytes.
    fn len(&self) -> u64;

    /// True if there are no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Fill `buf` from `offset`; an error if any byte is past the end.
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// Called once all was read: an error if the bytes may have changed.
    fn finish(&self) -> io::Result<()> {
        Ok(())
    }

    /// True if reads bypass the page cache (see [`crate::Source::is_direct`]).
    fn is_direct(&self) -> bool {
        false
    }

    /// How many of the `len` bytes from `offset` are lent in place (see
    /// [`crate::Source::lendable`]): 0 by default.
    fn lendable(&self, offset: u64, len: usize) -> usize {
        let _ = (offset, len);
        0
    }

    /// Call `f` with the `len` bytes from `offset` in place, once
    /// [`Storage::lendable`] said so (see [`crate::Source::read_in_place`]); the
    /// default copies them.
    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        crate::source::copy_to(len, |buf| self.read_exact_at(buf, offset), f)
    }

    /// Bytes lent from memory maps so far (see [`crate::Source::mapped_bytes`]).
    fn mapped_bytes(&self) -> u64 {
        0
    }

    /// Where the bytes come from (see [`crate::Source::origin`]): a file as the
    /// image's own ([`crate::Role::Image`]; whoever reads it as something
    /// else says so).
    fn origin(&self) -> Vec<Origin> {
        Vec::new()
    }

    /// Whether the bytes from `offset` on hold data, as far as the storage
    /// knows cheaply, and for how many of the next `len` (at least 1):
    /// `(false, n)` for a hole of `n` bytes, which reads as zeros. Every
    /// byte may be data unless the storage knows better.
    fn data_at(&self, offset: u64, len: u64) -> io::Result<(bool, u64)> {
        let _ = offset;
        Ok((true, len))
    }

    /// Reads of `read_size` bytes this storage wants in flight, if it
    /// says: one across a network does (see [`crate::Source::default_io_depth`]).
    fn default_io_depth(&self, read_size: usize) -> Option<usize> {
        let _ = read_size;
        None
    }

    /// See [`crate::Source::bytes_in_flight`].
    fn bytes_in_flight(&self) -> Option<usize> {
        None
    }
}

pub(crate) fn past_end(offset: u64, len: usize, size: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("read of {len} bytes at offset {offset:#x} is past the end ({size:#x} bytes)"),
    )
}

pub(crate) fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(past_end(offset, len, size)),
    }
}

impl Storage for Vec<u8> {
    fn len(&self) -> u64 {
        self.as_slice().len() as u64
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), Storage::len(self))?;
        let start = offset as usize;
        buf.copy_from_slice(&self[start..start + buf.len()]);
        Ok(())
    }

    /// Bytes in memory are lent where they are.
    fn lendable(&self, offset: u64, len: usize) -> usize {
        match check_range(offset, len, Storage::len(self)) {
            Ok(()) => len,
            Err(_) => 0,
        }
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        check_range(offset, len, Storage::len(self))?;
        f(&self[offset as usize..offset as usize + len]);
        Ok(())
    }
}

impl Storage for File {
    fn len(&self) -> u64 {
        self.metadata().map(|m| m.len()).unwrap_or(0)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}
