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

/// A raw file's size rounded up to whole 512-byte sectors, as QEMU sees
/// it (see [`Source::rounded`]).
///
/// ```
/// let r = blkimage::Rounded { file_size: 1000, size: 1024 };
/// assert!(r.to_string().starts_with("1000 bytes, hashed as 1024 ("));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rounded {
    /// The file's length in bytes.
    pub file_size: u64,
    /// The guest size: `file_size` rounded up to a multiple of 512.
    pub size: u64,
}

impl std::fmt::Display for Rounded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes, hashed as {} (a raw image's size is rounded up to a multiple of 512, \
             as QEMU does; standard input is hashed as it is)",
            self.file_size, self.size
        )
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

    /// How many of the `len` guest bytes from `offset` this source lends
    /// in place ([`Source::read_in_place`]) instead of copying them: 0 (the
    /// default, and for every source but a file read from memory maps:
    /// [`crate::OpenOptions::map`]); a raw file lends all of them or none,
    /// a qcow2 image the prefix its file holds contiguously.
    fn lendable(&self, offset: u64, len: usize) -> usize {
        let _ = (offset, len);
        0
    }

    /// Call `f` once with the `len` guest bytes from `offset` where they
    /// are, once [`Source::lendable`] said it lends them; an error if they
    /// cannot be had, or turn out not to be the file's (it shrank under
    /// the map: `f` was given zeros). The default copies them with
    /// [`Source::read_at`].
    fn read_in_place(&self, offset: u64, len: usize, f: &mut dyn FnMut(&[u8])) -> io::Result<()> {
        let mut buf = blkhash::try_zeroed(len, "a read")?;
        self.read_at(&mut buf, offset)?;
        f(&buf);
        Ok(())
    }

    /// True if reads bypass the page cache (direct I/O): such a source
    /// wants many reads in flight (see [`crate::read_image`]).
    fn is_direct(&self) -> bool {
        false
    }

    /// Reads of `read_size` bytes this source wants in flight on reading
    /// threads when none are asked for: [`crate::DEFAULT_IO_DEPTH`] for
    /// direct I/O, else 0 (reads run on the digest threads, which a page
    /// cache or a local server keeps busy). A source behind a network
    /// (an NBD export) wants more, to hide its latency.
    fn default_io_depth(&self, read_size: usize) -> usize {
        let _ = read_size;
        if self.is_direct() {
            crate::DEFAULT_IO_DEPTH
        } else {
            0
        }
    }

    /// Bytes of reads in flight at most when the depth is the source's own
    /// ([`Source::default_io_depth`], then the most reads): `None`, the
    /// count alone bounds them. A source behind a network whose reads may
    /// be small (a qcow2 image's scattered clusters over HTTP) asks for
    /// many reads and bounds their bytes, so that small reads keep as many
    /// requests waiting on the latency as large ones do.
    fn bytes_in_flight(&self) -> Option<usize> {
        None
    }

    /// Called once all was read: report anything that makes the bytes read
    /// untrustworthy (a file that shrank while we read it).
    fn finish(&self) -> io::Result<()> {
        Ok(())
    }

    /// The file's own size when the guest size was rounded up from it: a
    /// raw file whose length is not a multiple of 512 reads as QEMU reads
    /// it, its tail zeros up to the next multiple, so its checksum is not
    /// that of its bytes as they are (standard input's is). `None` for
    /// every other source. The commands say so once per input.
    fn rounded(&self) -> Option<Rounded> {
        None
    }

    /// Every file whose bytes this source reads, in the order it opened
    /// them: the image, its external data file, its backing chain; for an
    /// image QEMU serves, every regular file or block device qemu-nbd has
    /// open (vmdk extents included). What a record of the image must cover
    /// to tell that the guest content changed. None for a network export or
    /// bytes in memory.
    fn files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// Every file this source reads over HTTP(S), in the order it opened
    /// them (the image, its data file, its backing chain), each with the
    /// version it was opened at: what a record of the image must cover,
    /// as [`Source::files`] is for files on this host.
    fn remote_files(&self) -> Vec<crate::http::RemoteFile> {
        Vec::new()
    }

    /// The files below the image in its backing chain (a qcow2 image's
    /// backing file, its backing file, ...): what a dirty bitmap of the
    /// image does not watch, since it records writes to the image that
    /// holds it only. Empty for every other source.
    fn backing_files(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }

    /// The dirty bitmaps this source offers (a qcow2 image's persistent
    /// bitmaps; an NBD export's `qemu:dirty-bitmap:` contexts). Empty for
    /// a source that has none.
    fn bitmaps(&self) -> io::Result<Vec<crate::BitmapInfo>> {
        Ok(Vec::new())
    }

    /// The ranges bitmap `name` marks dirty. An error, naming the bitmap
    /// and the reason, for a bitmap that is not there, is in use
    /// (inconsistent), or does not cover exactly the image's size; a
    /// source without bitmaps says so ([`io::ErrorKind::Unsupported`]).
    /// Whether a disabled bitmap may be used is the caller's choice:
    /// [`crate::BitmapInfo::enabled`] says.
    fn dirty(&self, name: &str) -> io::Result<crate::Dirty> {
        let _ = name;
        Err(crate::bitmap::unsupported(self.format()))
    }
}
