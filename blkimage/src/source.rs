//! The one interface every image format and transport implements.

use std::io;

/// What a guest range holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExtentKind {
    /// Bytes to read (they may still turn out to be zeros).
    Data,
    /// Allocated, but known to read as zeros: never read.
    Zero,
    /// Unallocated (a hole): reads as zeros, never read.
    Hole,
}

impl ExtentKind {
    /// True if the range reads as zeros without reading it.
    pub fn is_zero(self) -> bool {
        !matches!(self, ExtentKind::Data)
    }
}

/// A guest range and what it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    /// Guest offset of the first byte.
    pub offset: u64,
    /// Bytes in the range.
    pub len: u64,
    /// What the range holds.
    pub kind: ExtentKind,
}

impl Extent {
    /// The offset just past the range.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// A random-access image: its guest-visible size, a map of its ranges, and
/// their bytes. Reads may come from several threads at once.
pub trait Source: Send + Sync {
    /// The format, for messages and reports: "raw", "qcow2", ...
    fn format(&self) -> &str;

    /// The guest-visible size in bytes.
    fn size(&self) -> u64;

    /// Extents covering a non-empty prefix of `[offset, offset + len)`
    /// (`len > 0`, within the size), in order and contiguous.
    fn extents(&self, offset: u64, len: u64) -> io::Result<Vec<Extent>>;

    /// Fill `buf` with the guest bytes at `offset` (all of it, or an error).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;

    /// True if reads bypass the page cache (direct I/O): such a source
    /// wants many reads in flight (see [`crate::read_image`]).
    fn is_direct(&self) -> bool {
        false
    }

    /// Called once all was read: report anything that makes the bytes read
    /// untrustworthy (a file that shrank while we read it).
    fn finish(&self) -> io::Result<()> {
        Ok(())
    }
}
