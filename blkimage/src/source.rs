//! The one interface every image format and transport implements.

use std::io;
use std::path::PathBuf;

/// The most reads a source keeps in flight by default: an NBD export's
/// 16 MiB of 1 MiB reads, a local file's 4 MiB of small ones.
pub const DEFAULT_IO_DEPTH: usize = 16;

/// Bytes of reads a local source read with direct I/O keeps in flight by
/// default (see [`direct_io_depth`]): 4 reads of the default 1 MiB, their
/// buffers at most 8 MiB with those waiting for a digest worker, so that a
/// local file is hashed in 16 MiB. 16 reads of 1 MiB (37 MiB of RSS) read
/// no faster on machine D's disk (docs/performance.md, mapsize).
pub const DIRECT_BYTES_IN_FLIGHT: usize = 4 << 20;

/// Reads of `read_size` bytes in flight by default for a local source read
/// with direct I/O: [`DIRECT_BYTES_IN_FLIGHT`] of them, at least one and
/// at most [`DEFAULT_IO_DEPTH`].
pub fn direct_io_depth(read_size: usize) -> usize {
    (DIRECT_BYTES_IN_FLIGHT / read_size.max(1)).clamp(1, DEFAULT_IO_DEPTH)
}

/// Where some of a source's bytes come from (see [`Source::origin`]): what
/// a record of the image must cover to tell later that it reads the same
/// bytes again.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Origin {
    /// A file or block device of this host, by the path it was opened at:
    /// a record stamps it (device, inode, size, times).
    File {
        /// The path it was opened at.
        path: PathBuf,
        /// What it is to the image.
        role: Role,
    },
    /// Bytes this host cannot look at: an NBD export, a file over HTTP(S).
    Remote(Remote),
}

/// What a file is to the image that reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Role {
    /// The image's own file.
    Image,
    /// More of the image's own guest data (a qcow2 image's external data
    /// file, a vmdk's extents): written with the image, so the image's
    /// dirty bitmaps record writes to it.
    Data,
    /// Below the image in its backing chain: a dirty bitmap of the image
    /// does not watch it.
    Below,
}

/// What identifies bytes read from elsewhere (an NBD export, a file over
/// HTTP(S)), as words a record keeps and compares: the same name and the
/// same version is the same content, as far as anyone can tell from here.
///
/// ```
/// let r = blkimage::Remote {
///     kind: "http".into(),
///     what: "file".into(),
///     name: vec!["https://example.com/disk.img".into()],
///     version: vec![("length".into(), Some("1024".into())), ("ETag".into(), None)],
/// };
/// assert_eq!(r.words(), [Some("https://example.com/disk.img"), Some("1024"), None]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Remote {
    /// What it is, one lowercase word: the record line's first ("nbd",
    /// "http").
    pub kind: String,
    /// What a message calls it: "export", "file".
    pub what: String,
    /// The words that say which one it is (an export's address, TLS or
    /// not, and name; a URL without user, password or query): another
    /// value is another thing.
    pub name: Vec<String>,
    /// The words that say which version of it was read, each with what a
    /// message calls it ("length", "ETag"); `None` where there is none.
    /// Empty for what has no versions to tell (an export).
    pub version: Vec<(String, Option<String>)>,
}

impl Remote {
    /// Its name's words, then its version's values.
    pub fn words(&self) -> Vec<Option<&str>> {
        (self.name.iter().map(|w| Some(w.as_str())))
            .chain(self.version.iter().map(|(_, v)| v.as_deref()))
            .collect()
    }
}

/// `len` bytes read by `read` into a buffer of their own, then given to
/// `f`: what a source or storage that cannot lend its bytes in place does
/// when asked to.
pub(crate) fn copy_to(
    len: usize,
    read: impl FnOnce(&mut [u8]) -> io::Result<()>,
    f: &mut dyn FnMut(&[u8]),
) -> io::Result<()> {
    let mut buf = blkhash::try_zeroed(len, "a read")?;
    read(&mut buf)?;
    f(&buf);
    Ok(())
}

/// The [`Source`] methods a source that wraps another (`self.inner`)
/// passes through unchanged, written once for every such wrapper
/// ([`crate::Window`], [`crate::Masked`]). A macro, not a trait with
/// defaults: a default cannot reach a field of the implementer.
macro_rules! pass_through {
    ($inner:ident: $($method:ident),* $(,)?) => {
        $(pass_through!(@one $inner $method);)*
    };
    (@one $inner:ident format) => {
        fn format(&self) -> &str { self.$inner.format() }
    };
    (@one $inner:ident size) => {
        fn size(&self) -> u64 { self.$inner.size() }
    };
    (@one $inner:ident read_at) => {
        fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
            self.$inner.read_at(buf, offset)
        }
    };
    (@one $inner:ident lendable) => {
        fn lendable(&self, offset: u64, len: usize) -> usize { self.$inner.lendable(offset, len) }
    };
    (@one $inner:ident read_in_place) => {
        fn read_in_place(
            &self,
            offset: u64,
            len: usize,
            f: &mut dyn FnMut(&[u8]),
        ) -> std::io::Result<()> {
            self.$inner.read_in_place(offset, len, f)
        }
    };
    (@one $inner:ident mapped_bytes) => {
        fn mapped_bytes(&self) -> u64 { self.$inner.mapped_bytes() }
    };
    (@one $inner:ident is_direct) => {
        fn is_direct(&self) -> bool { self.$inner.is_direct() }
    };
    (@one $inner:ident default_io_depth) => {
        fn default_io_depth(&self, read_size: usize) -> usize {
            self.$inner.default_io_depth(read_size)
        }
    };
    (@one $inner:ident read_size) => {
        fn read_size(&self, asked: usize) -> usize { self.$inner.read_size(asked) }
    };
    (@one $inner:ident bytes_in_flight) => {
        fn bytes_in_flight(&self) -> Option<usize> { self.$inner.bytes_in_flight() }
    };
    (@one $inner:ident finish) => {
        fn finish(&self) -> std::io::Result<()> { self.$inner.finish() }
    };
    (@one $inner:ident rounded) => {
        fn rounded(&self) -> Option<$crate::Rounded> { self.$inner.rounded() }
    };
    (@one $inner:ident decompressed) => {
        fn decompressed(&self) -> Option<$crate::Decompressed> { self.$inner.decompressed() }
    };
    (@one $inner:ident origin) => {
        fn origin(&self) -> Vec<$crate::Origin> { self.$inner.origin() }
    };
    (@one $inner:ident bitmaps) => {
        fn bitmaps(&self) -> std::io::Result<Vec<$crate::BitmapInfo>> { self.$inner.bitmaps() }
    };
    (@one $inner:ident dirty) => {
        fn dirty(&self, name: &str) -> std::io::Result<$crate::Dirty> { self.$inner.dirty(name) }
    };
}
pub(crate) use pass_through;

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

/// A compressed image decompressed into an unnamed temporary file, for a
/// format that needs random access (see [`Source::decompressed`]): what
/// the commands say once per input, as they say [`Rounded`].
///
/// ```
/// let d = blkimage::Decompressed {
///     compression: "gzip",
///     dir: "/tmp".into(),
///     len: 1 << 30,
///     allocated: 3 << 20,
/// };
/// assert_eq!(
///     d.to_string(),
///     "gzip-compressed: decompressed into an unnamed temporary file in /tmp, \
///      1073741824 bytes taking 3145728 bytes of disk space (3.0 MiB; removed when done)"
/// );
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decompressed {
    /// The compression: "gzip", "xz", "zstd".
    pub compression: &'static str,
    /// The directory of the temporary file (`TMPDIR`, else `/tmp`).
    pub dir: PathBuf,
    /// The decompressed file's length in bytes.
    pub len: u64,
    /// The disk space it takes (zeros are left as holes).
    pub allocated: u64,
}

impl std::fmt::Display for Decompressed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}-compressed: decompressed into an unnamed temporary file in {}, {} bytes \
             taking {} bytes of disk space ({:.1} MiB; removed when done)",
            self.compression,
            self.dir.display(),
            self.len,
            self.allocated,
            self.allocated as f64 / f64::from(1 << 20)
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
        copy_to(len, |buf| self.read_at(buf, offset), f)
    }

    /// Of the bytes lent so far ([`Source::read_in_place`]), how many were
    /// read from memory maps (the rest were copied: a file measured to
    /// read faster with copies, see [`crate::MapReads`]); for reports.
    fn mapped_bytes(&self) -> u64 {
        0
    }

    /// True if reads bypass the page cache (direct I/O): such a source
    /// wants many reads in flight (see [`crate::read_image`]).
    fn is_direct(&self) -> bool {
        false
    }

    /// Reads of `read_size` bytes this source wants in flight on reading
    /// threads when none are asked for: [`direct_io_depth`] for
    /// direct I/O, else 0 (reads run on the digest threads, which a page
    /// cache or a local server keeps busy). A source behind a network
    /// (an NBD export) wants more, to hide its latency.
    fn default_io_depth(&self, read_size: usize) -> usize {
        if self.is_direct() {
            direct_io_depth(read_size)
        } else {
            0
        }
    }

    /// The bytes of each read, given the read size asked for: that, unless
    /// the source decodes in units whose parts would be decoded once by
    /// one read while the reads of the others wait for it (a backup's
    /// chunks: whole chunks are read).
    fn read_size(&self, asked: usize) -> usize {
        asked
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

    /// How the image was decompressed, if it was compressed (a qcow2 image
    /// in a `.gz`, `.xz` or `.zst` file) and so decompressed into a
    /// temporary file to be read in any order. `None` for every other
    /// source. The commands say so once per input.
    fn decompressed(&self) -> Option<Decompressed> {
        None
    }

    /// Where its bytes come from, in the order it opened them: the image
    /// file, its external data file, its backing chain ([`Role`] says
    /// which); for an image QEMU serves, every regular file or block
    /// device qemu-nbd has open (vmdk extents included); an NBD export's
    /// address and name; each file read over HTTP(S) with the version it
    /// was opened at. What a record of the image must cover to tell that
    /// the guest content changed; empty for bytes in memory. A new
    /// transport says its own here ([`Origin::Remote`]): whoever records
    /// it needs no change.
    fn origin(&self) -> Vec<Origin> {
        Vec::new()
    }

    /// The dirty bitmaps this source offers (a qcow2 image's persistent
    /// bitmaps; an NBD export's `qemu:dirty-bitmap:` contexts). Empty for
    /// a source that has none.
    fn bitmaps(&self) -> io::Result<Vec<crate::bitmap::BitmapInfo>> {
        Ok(Vec::new())
    }

    /// The ranges bitmap `name` marks dirty. An error, naming the bitmap
    /// and the reason, for a bitmap that is not there, is in use
    /// (inconsistent), or does not cover exactly the image's size; a
    /// source without bitmaps says so ([`io::ErrorKind::Unsupported`]).
    /// Whether a disabled bitmap may be used is the caller's choice:
    /// [`crate::bitmap::BitmapInfo::enabled`] says.
    fn dirty(&self, name: &str) -> io::Result<crate::bitmap::Dirty> {
        let _ = name;
        Err(crate::bitmap::unsupported(self.format()))
    }
}
