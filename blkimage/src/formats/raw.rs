//! Raw images: a storage's bytes as they are, read as QEMU reads them. The
//! size is a file's length rounded up to a multiple of 512, the tail
//! reading as zeros, so that a raw file and its conversion to any format
//! agree; the holes are the storage's (SEEK_DATA for a file; a server says
//! nothing of holes).
//!
//! An NBD export needs no format: its server presents guest bytes, so
//! [`crate::nbd::Nbd`] is a [`Source`] of its own.

use crate::source::{Extent, ExtentKind, Origin, Rounded, Source};
use crate::storage::Storage;
use crate::storage::file::RawFile;
use crate::storage::http::Http;
use std::io;

/// A length rounded up to whole 512-byte sectors, as QEMU sees a raw file.
fn rounded_up(len: u64) -> u64 {
    len.next_multiple_of(512)
}

/// [`Source::rounded`] of a raw image of `len` bytes.
fn rounded(len: u64) -> Option<Rounded> {
    let size = rounded_up(len);
    (size != len).then_some(Rounded {
        file_size: len,
        size,
    })
}

/// Fill `buf` from `offset` of a raw image of `len` bytes: what is inside
/// the file from `read`, the rounding's tail zeros.
fn read_rounded(
    len: u64,
    buf: &mut [u8],
    offset: u64,
    read: impl FnOnce(&mut [u8], u64) -> io::Result<()>,
) -> io::Result<()> {
    let in_file = (len.saturating_sub(offset) as usize).min(buf.len());
    let (head, tail) = buf.split_at_mut(in_file);
    tail.fill(0);
    if head.is_empty() {
        return Ok(());
    }
    read(head, offset)
}

impl Source for RawFile {
    fn format(&self) -> &str {
        "raw"
    }

    fn origin(&self) -> Vec<Origin> {
        RawFile::origin(self)
    }

    fn is_direct(&self) -> bool {
        RawFile::is_direct(self)
    }

    fn size(&self) -> u64 {
        rounded_up(self.file_size())
    }

    fn rounded(&self) -> Option<Rounded> {
        rounded(self.file_size())
    }

    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        Ok(vec![self.next_extent(offset, offset + len)?])
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        read_rounded(self.file_size(), buf, offset, |b, o| self.read_bytes(b, o))
    }

    fn lendable(&self, offset: u64, len: usize) -> usize {
        self.lendable_bytes(offset, len)
    }

    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        self.lend(offset, len, f)
    }

    fn mapped_bytes(&self) -> u64 {
        RawFile::mapped_bytes(self)
    }

    fn finish(&self) -> io::Result<()> {
        self.check_shrunk()
    }
}

impl Source for Http {
    fn format(&self) -> &str {
        "raw"
    }

    fn size(&self) -> u64 {
        rounded_up(Storage::len(self))
    }

    fn rounded(&self) -> Option<Rounded> {
        rounded(Storage::len(self))
    }

    /// All data (a server says nothing of holes); the rounding's tail a hole.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>> {
        let (end, file_len) = (offset + len, Storage::len(self));
        let (stop, kind) = match offset < file_len {
            true => (end.min(file_len), ExtentKind::Data),
            false => (end, ExtentKind::Hole),
        };
        Ok(vec![Extent {
            offset,
            len: stop - offset,
            kind,
        }])
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        read_rounded(Storage::len(self), buf, offset, |b, o| self.fetch(b, o))
    }

    /// What the transport asks for (see [`Storage::default_io_depth`]):
    /// latency, not the digest threads, bounds a file across a network.
    fn default_io_depth(&self, read_size: usize) -> usize {
        Storage::default_io_depth(self, read_size).unwrap_or(0)
    }

    fn bytes_in_flight(&self) -> Option<usize> {
        Storage::bytes_in_flight(self)
    }

    fn origin(&self) -> Vec<Origin> {
        Storage::origin(self)
    }
}
