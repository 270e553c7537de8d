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

    /// How many of the `len` bytes from `offset` are lent in place (see
    /// [`Source::lendable`]): 0 by default.
    fn lendable(&self, offset: u64, len: usize) -> usize {
        let _ = (offset, len);
        0
    }

    /// Call `f` with the `len` bytes from `offset` in place, once
    /// [`Storage::lendable`] said so (see [`Source::read_in_place`]); the
    /// default copies them.
    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        let mut buf = vec![0u8; len];
        self.read_exact_at(&mut buf, offset)?;
        f(&buf);
        Ok(())
    }

    /// The files the bytes are in (see [`Source::files`]).
    fn files(&self) -> Vec<std::path::PathBuf> {
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

/// A raw file or block device (with direct I/O where it was asked for),
/// with its exact length: reads past it are errors (a qcow2 file need not
/// end on a 512-byte boundary, as [`RawFile::size`] rounds to).
pub struct ImageFile {
    raw: RawFile,
    len: u64,
    /// Fewer blocks allocated than its length: it has holes worth asking
    /// for (a file with none answers every question with data: no call).
    sparse: bool,
}

impl ImageFile {
    /// `raw`, opened from `path`.
    pub fn new(raw: RawFile, path: &std::path::Path) -> io::Result<ImageFile> {
        use std::os::unix::fs::MetadataExt;
        let meta = std::fs::metadata(path)?;
        let len = if meta.is_file() {
            meta.len().min(raw.size())
        } else {
            raw.size()
        };
        let sparse = meta.is_file() && meta.blocks().saturating_mul(512) < meta.len();
        Ok(ImageFile { raw, len, sparse })
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

    fn lendable(&self, offset: u64, len: usize) -> usize {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len => self.raw.lendable(offset, len),
            _ => 0,
        }
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        check_range(offset, len, self.len)?;
        self.raw.read_in_place(offset, len, f)
    }

    fn files(&self) -> Vec<std::path::PathBuf> {
        Source::files(&self.raw)
    }

    fn data_at(&self, offset: u64, len: u64) -> io::Result<(bool, u64)> {
        let len = len.min(self.len.saturating_sub(offset));
        if !self.sparse || len == 0 {
            return Ok((true, len.max(1)));
        }
        let e = self.raw.extents(offset, len)?;
        match e.first() {
            Some(e) if e.offset == offset && e.len > 0 => Ok((!e.kind.is_zero(), e.len)),
            _ => Ok((true, len)),
        }
    }
}
