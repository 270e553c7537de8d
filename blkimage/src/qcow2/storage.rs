//! The bytes under a qcow2 image: a file, a block device, or memory.

use crate::raw::RawFile;
use crate::source::Source;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

/// Random-access bytes a qcow2 image (or its external data file) lives in.
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

    /// True if reads bypass the page cache (see [`Source::is_direct`]).
    fn is_direct(&self) -> bool {
        false
    }

    /// The files the bytes are in (see [`Source::files`]).
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// The files read over HTTP(S) (see [`Source::remote_files`]).
    fn remote_files(&self) -> Vec<crate::http::RemoteFile> {
        Vec::new()
    }

    /// Reads of `read_size` bytes this storage wants in flight, if it
    /// says: one across a network does (see [`Source::default_io_depth`]).
    fn default_io_depth(&self, read_size: usize) -> Option<usize> {
        let _ = read_size;
        None
    }

    /// See [`Source::bytes_in_flight`].
    fn bytes_in_flight(&self) -> Option<usize> {
        None
    }
}

fn past_end(offset: u64, len: usize, size: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("read of {len} bytes at offset {offset:#x} is past the end ({size:#x} bytes)"),
    )
}

fn check_range(offset: u64, len: usize, size: u64) -> io::Result<()> {
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
}

impl Storage for File {
    fn len(&self) -> u64 {
        self.metadata().map(|m| m.len()).unwrap_or(0)
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

/// A raw file or block device (with direct I/O where it was asked for),
/// with its exact length: reads past it are errors (a qcow2 file need not
/// end on a 512-byte boundary, as [`RawFile::size`] rounds to).
pub struct ImageFile {
    raw: RawFile,
    len: u64,
}

impl ImageFile {
    /// `raw`, opened from `path`.
    pub fn new(raw: RawFile, path: &std::path::Path) -> io::Result<ImageFile> {
        let meta = std::fs::metadata(path)?;
        let len = if meta.is_file() {
            meta.len().min(raw.size())
        } else {
            raw.size()
        };
        Ok(ImageFile { raw, len })
    }
}

impl Storage for ImageFile {
    fn len(&self) -> u64 {
        self.len
    }

    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(offset, buf.len(), self.len)?;
        self.raw.read_at(buf, offset)
    }

    fn finish(&self) -> io::Result<()> {
        Source::finish(&self.raw)
    }

    fn is_direct(&self) -> bool {
        self.raw.is_direct()
    }

    fn files(&self) -> Vec<std::path::PathBuf> {
        Source::files(&self.raw)
    }
}
