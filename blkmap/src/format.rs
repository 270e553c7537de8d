//! The binary format: headers, records read and written as a stream, and
//! whole maps read and written.
//!
//! All integers are little-endian. See `blkmap/README.md` for the layout.

use crate::{Body, Map, MapError, Range};
use blkhash::{Algorithm, Checksum, Streaming};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The first 8 bytes of every map. A non-ASCII first byte, CR LF and ^Z
/// catch transfers that mangle binary files (as PNG's signature does).
pub const MAGIC: [u8; 8] = *b"\x89BKM\r\n\x1a\n";
/// The format version written and read.
pub const VERSION: u32 = 1;
/// The largest identity record a map may carry: 64 KiB, the record of an
/// image with a backing chain of hundreds of files (a line of about 100
/// bytes and its path each).
pub const MAX_IDENTITY: usize = 64 << 10;

/// Bytes of the fixed part of the header.
pub(crate) const FIXED_HEADER: usize = 48;
/// Bytes of the digest-name field.
const NAME_FIELD: usize = 16;
/// Bytes of the trailer: SHA-256 of everything before it.
pub(crate) const TRAILER: usize = 32;
/// Record tags.
pub(crate) const TAG_ZEROS: u8 = b'Z';
pub(crate) const TAG_DATA: u8 = b'D';
/// Digest bytes read (and allocated) at a time.
const READ_CHUNK: usize = 1 << 20;

/// The write buffer of [`write_atomic`]: below glibc's least threshold
/// for mapping a block of its own (128 KiB), so that the room asked for
/// first is the block BufWriter then gets. A 1 MiB one was mapped, and
/// unmapping it raised that threshold: BufWriter's then came from the
/// heap, which could not grow under a limit (`ulimit -v 13000`: blkmap
/// aborted, "memory allocation of 1048576 bytes failed").
const WRITE_BUFFER: usize = 64 << 10;
/// Header flag: the records cover one byte range of the image (a part);
/// the range follows the fixed header instead of the checksum.
const FLAG_PARTIAL: u32 = 1;
/// Header flag: an identity record of the input follows the checksum or
/// range.
const FLAG_IDENTITY: u32 = 2;

/// True if `prefix` (the first bytes of a file, at least 8) starts with the
/// map magic.
///
/// ```
/// assert!(blkmap::is_map(&blkmap::MAGIC));
/// assert!(!blkmap::is_map(b"QFI\xfb\0\0\0\x03"));
/// ```
pub fn is_map(prefix: &[u8]) -> bool {
    prefix.starts_with(&MAGIC)
}

/// What a map says of itself before its records: a complete map, or a
/// part (the blocks of one byte range).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Header {
    /// The digest of blocks and checksum.
    pub algorithm: Algorithm,
    /// Bytes per block.
    pub block_size: usize,
    /// The image's guest-visible size in bytes.
    pub size: u64,
    /// The bytes the records cover: all of them for a complete map; for a
    /// part, an offset that is a multiple of the block size and a length
    /// that is one too or reaches the end of the image.
    pub range: Range,
    /// The image checksum for a complete map; `None` for a part.
    pub checksum: Option<Checksum>,
    /// What the writer recorded of the input it read (a checkpoint's), at
    /// most [`MAX_IDENTITY`] bytes; blkmap only keeps it.
    pub identity: Option<Vec<u8>>,
}

impl Header {
    /// True for a part, false for a complete map.
    pub fn is_partial(&self) -> bool {
        self.checksum.is_none()
    }

    /// The checksum of a complete map; a part, which has none, is refused
    /// with [`MapError::Partial`] (merge the parts first).
    ///
    /// ```
    /// let map = blkmap::Map::compute(blkhash::Options::new(), &[1u8; 100]).unwrap();
    /// assert_eq!(map.header().whole().unwrap(), map.checksum());
    /// ```
    pub fn whole(&self) -> Result<&Checksum, MapError> {
        self.checksum.as_ref().ok_or(MapError::Partial {
            range: self.range,
            size: self.size,
        })
    }

    /// The index of the first block the records cover.
    pub fn first_block(&self) -> u64 {
        self.range.offset / self.block_size as u64
    }

    /// Blocks the records cover.
    pub fn blocks(&self) -> u64 {
        self.range.len.div_ceil(self.block_size as u64)
    }

    /// Check the fields agree with each other.
    pub(crate) fn check(&self) -> Result<(), MapError> {
        crate::check_params(self.algorithm, self.block_size)?;
        check_range(self.size, self.block_size, self.range)?;
        if let Some(c) = &self.checksum {
            if c.algorithm() != self.algorithm {
                return Err(invalid("a checksum of another digest"));
            }
            if self.range
                != (Range {
                    offset: 0,
                    len: self.size,
                })
            {
                return Err(invalid("a complete map that does not cover the image"));
            }
        }
        if self
            .identity
            .as_ref()
            .is_some_and(|i| i.len() > MAX_IDENTITY)
        {
            return Err(invalid(format!(
                "an identity record over {MAX_IDENTITY} bytes"
            )));
        }
        Ok(())
    }

    fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.is_partial() {
            flags |= FLAG_PARTIAL;
        }
        if self.identity.is_some() {
            flags |= FLAG_IDENTITY;
        }
        flags
    }

    /// Bytes of the header as written.
    pub(crate) fn encoded_len(&self) -> usize {
        FIXED_HEADER
            + self.checksum.as_ref().map_or(16, |c| c.as_bytes().len())
            + self.identity.as_ref().map_or(0, |i| 4 + i.len())
    }

    /// Write the header: the records follow.
    pub(crate) fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut fixed = [0u8; FIXED_HEADER];
        fixed[..8].copy_from_slice(&MAGIC);
        fixed[8..12].copy_from_slice(&VERSION.to_le_bytes());
        fixed[12..16].copy_from_slice(&self.flags().to_le_bytes());
        let name = self.algorithm.name().as_bytes();
        fixed[16..16 + name.len()].copy_from_slice(name);
        let len = self.algorithm.output_len() as u32;
        fixed[32..36].copy_from_slice(&len.to_le_bytes());
        fixed[36..40].copy_from_slice(&(self.block_size as u32).to_le_bytes());
        fixed[40..48].copy_from_slice(&self.size.to_le_bytes());
        w.write_all(&fixed)?;
        match &self.checksum {
            Some(c) => w.write_all(c.as_bytes())?,
            None => {
                w.write_all(&self.range.offset.to_le_bytes())?;
                w.write_all(&self.range.len.to_le_bytes())?;
            }
        }
        if let Some(id) = &self.identity {
            w.write_all(&(id.len() as u32).to_le_bytes())?;
            w.write_all(id)?;
        }
        Ok(())
    }
}

/// Check `range` can be a part of an image of `size` bytes in blocks of
/// `block_size`: whole blocks, or reaching the end of the image.
pub fn check_range(size: u64, block_size: usize, range: Range) -> Result<(), MapError> {
    let bs = block_size as u64;
    let Range { offset, len } = range;
    // An empty range at the end of the image: what is left to hash of an
    // image whose checkpoint covers it all.
    let at_end = offset == size && len == 0;
    if !offset.is_multiple_of(bs) && !at_end {
        return Err(MapError::Range(format!(
            "the range {offset}+{len} does not start at a block boundary (a multiple of {bs})"
        )));
    }
    if offset > size || len > size - offset {
        return Err(MapError::Range(format!(
            "the range {offset}+{len} ends past the end of the image ({size} bytes)"
        )));
    }
    if !len.is_multiple_of(bs) && offset + len != size {
        return Err(MapError::Range(format!(
            "the range {offset}+{len} neither ends at a block boundary (a multiple of {bs}) nor at the end of the image ({size} bytes)"
        )));
    }
    Ok(())
}

/// A writer that digests what goes through it.
struct DigestWriter<W> {
    inner: W,
    digest: Box<dyn Streaming>,
}

impl<W: Write> Write for DigestWriter<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(b)?;
        self.digest.update(&b[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that digests what it reads (unless the map is known intact).
struct DigestReader<R> {
    inner: R,
    digest: Option<Box<dyn Streaming>>,
}

impl<R: Read> DigestReader<R> {
    fn get(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_exact(buf)?;
        if let Some(d) = &mut self.digest {
            d.update(buf);
        }
        Ok(())
    }
    fn u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.get(&mut b)?;
        Ok(b[0])
    }
    fn u32(&mut self) -> io::Result<u32> {
        let mut b = [0u8; 4];
        self.get(&mut b)?;
        Ok(u32::from_le_bytes(b))
    }
    fn u64(&mut self) -> io::Result<u64> {
        let mut b = [0u8; 8];
        self.get(&mut b)?;
        Ok(u64::from_le_bytes(b))
    }
}

fn invalid(why: impl Into<String>) -> MapError {
    MapError::Invalid(why.into())
}

/// Write the records of `runs` (first block, count, digests or `None` for
/// zeros), in order.
fn write_runs<'a>(
    w: &mut impl Write,
    runs: impl Iterator<Item = crate::Run<'a>>,
) -> io::Result<()> {
    for run in runs {
        let tag = if run.digests.is_some() {
            TAG_DATA
        } else {
            TAG_ZEROS
        };
        w.write_all(&[tag])?;
        w.write_all(&run.count.to_le_bytes())?;
        if let Some(d) = run.digests {
            w.write_all(d)?;
        }
    }
    Ok(())
}

/// Write a header, the records of `runs` and the trailer.
pub(crate) fn write_map<'a>(
    header: &Header,
    runs: impl Iterator<Item = crate::Run<'a>>,
    w: impl Write,
) -> io::Result<()> {
    let mut w = DigestWriter {
        inner: w,
        digest: Algorithm::Sha256.streaming(),
    };
    header.write_to(&mut w)?;
    write_runs(&mut w, runs)?;
    let trailer = w.digest.finalize();
    w.inner.write_all(&trailer)?;
    w.inner.flush()
}

impl Map {
    /// The header this map is written with.
    pub fn header(&self) -> Header {
        Header {
            algorithm: self.algorithm,
            block_size: self.block_size,
            size: self.size,
            range: Range {
                offset: 0,
                len: self.size,
            },
            checksum: Some(self.checksum.clone()),
            identity: self.identity.clone(),
        }
    }

    /// Write the map in the binary format.
    pub fn write_to(&self, w: impl Write) -> io::Result<()> {
        write_map(&self.header(), self.runs(), w)
    }

    /// The map in the binary format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len() as usize);
        self.write_to(&mut v).expect("writing to memory");
        v
    }

    /// Bytes of the map in the binary format.
    pub fn encoded_len(&self) -> u64 {
        (self.header().encoded_len() + TRAILER) as u64
            + 9 * self.body.runs.len() as u64
            + self.body.digests.len() as u64
    }

    /// Read a map and check everything: magic, version, header fields,
    /// record lengths against the size, the digest of its contents, nothing
    /// after it, and the checksum derived from its block digests. A part
    /// (see [`Part`](crate::Part)) is refused: merge the parts first. An
    /// identity record is kept ([`Map::identity`]).
    ///
    /// Memory grows with the digests actually read, never with what a
    /// header claims.
    pub fn read(r: impl Read) -> Result<Map, MapError> {
        let mut reader = MapReader::new(r)?;
        let h = reader.header().clone();
        let checksum = h.whole()?.clone();
        let body = reader.read_body()?;
        Map::assemble(h.algorithm, h.block_size, h.size, checksum, body)?.with_identity(h.identity)
    }

    /// [`read`](Map::read) from bytes in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Map, MapError> {
        Map::read(bytes)
    }

    /// Read the map saved at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Map, MapError> {
        Map::read(BufReader::with_capacity(
            1 << 20,
            open_map_file(path.as_ref())?,
        ))
    }

    /// Save the map at `path` atomically: written to a temporary file in the
    /// same directory, flushed to disk, renamed over `path`, and the
    /// directory flushed. `path` is the old file or the new one, never a
    /// part of one. It must be a map, an empty file or a missing one, not a
    /// link, a directory or a device ([`crate::guard`]): anything else is
    /// refused and left as it was.
    pub fn save(&self, path: impl AsRef<Path>) -> io::Result<()> {
        self.save_guarded(path, &[])
    }

    /// [`save`](Map::save), refused also when `path` is one of `inputs`
    /// (the image the map is of, by any of its names).
    pub fn save_guarded(
        &self,
        path: impl AsRef<Path>,
        inputs: &[crate::guard::Input<'_>],
    ) -> io::Result<()> {
        save_map(path.as_ref(), inputs, |w| self.write_to(w))
    }
}

/// Open the file at `path` to read a map or a part from it, refusing at
/// once what cannot be one: a directory, a FIFO (opening one waits for a
/// writer), a device or a socket.
pub(crate) fn open_map_file(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::FileTypeExt;
    let t = fs::metadata(path)?.file_type();
    let what = if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else if t.is_socket() {
        "a socket"
    } else {
        return File::open(path);
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what}, not a block map file"),
    ))
}

/// Write a map or a part to `path` with `write`, atomically, once the
/// guard let `path` be written in place of what it is ([`crate::guard`]).
pub(crate) fn save_map(
    path: &Path,
    inputs: &[crate::guard::Input<'_>],
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    crate::guard::check_outputs(&[crate::guard::Output::map(path)], inputs)?;
    write_atomic(path, write)
}

/// A piece of a map's records, as a [`MapReader`] delivers them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Piece<'a> {
    /// This many zero blocks.
    Zeros(u64),
    /// Data blocks: their digests, one after another (at most 1 MiB of
    /// them; a long run comes as several pieces).
    Data(&'a [u8]),
}

/// Reads a map's records as a stream, in memory bounded by 1 MiB whatever
/// the map's size: the header first, then pieces of records in block order,
/// and at the end the trailer is checked.
///
/// Every structural check of [`Map::read`] is made (the trailer's once the
/// last piece was read: a caller must read to the end, `Ok(None)`, before
/// trusting what it read); the checksum derived from the blocks is the
/// caller's to check.
///
/// ```
/// use blkhash::Options;
/// use blkmap::{Map, MapReader, Piece};
/// let mut data = vec![0u8; 4096];
/// data[0] = 1;
/// let map = Map::compute(Options::new().block_size(1024), &data).unwrap();
/// let bytes = map.to_bytes();
/// let mut r = MapReader::new(&bytes[..]).unwrap();
/// assert_eq!(r.header().size, 4096);
/// assert!(matches!(r.next_piece().unwrap(), Some(Piece::Data(d)) if d.len() == 32));
/// assert_eq!(r.next_piece().unwrap(), Some(Piece::Zeros(3)));
/// assert_eq!(r.next_piece().unwrap(), None);
/// ```
pub struct MapReader<R> {
    r: DigestReader<R>,
    header: Header,
    /// Blocks whose records were not read yet.
    left: u64,
    /// Digests still to deliver from the data record being read.
    in_data: u64,
    /// Whether the last record read was zeros.
    last_zero: bool,
    /// The trailer was checked.
    done: bool,
    chunk: Vec<u8>,
}

impl<R: Read> MapReader<R> {
    /// Read and check the header.
    pub fn new(r: R) -> Result<MapReader<R>, MapError> {
        MapReader::with(r, Some(Algorithm::Sha256.streaming()))
    }

    /// [`new`](MapReader::new) for a map known to be intact (read whole
    /// and checked before, unchanged since): every structural check is
    /// made, but not its trailer's, which costs a SHA-256 of its bytes.
    pub fn known_intact(r: R) -> Result<MapReader<R>, MapError> {
        MapReader::with(r, None)
    }

    fn with(r: R, digest: Option<Box<dyn Streaming>>) -> Result<MapReader<R>, MapError> {
        let mut r = DigestReader { inner: r, digest };
        let header = read_header(&mut r)?;
        Ok(MapReader {
            r,
            left: header.blocks(),
            header,
            in_data: 0,
            last_zero: false,
            done: false,
            chunk: Vec::new(),
        })
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The reader it reads from.
    pub fn into_inner(self) -> R {
        self.r.inner
    }

    /// The next piece of the records, or `None` once all were read and the
    /// trailer checked.
    pub fn next_piece(&mut self) -> Result<Option<Piece<'_>>, MapError> {
        let len = self.header.algorithm.output_len();
        if self.in_data == 0 {
            if self.left == 0 {
                self.finish()?;
                return Ok(None);
            }
            let at = self.header.blocks() - self.left;
            let tag = self.r.u8()?;
            let count = self.r.u64()?;
            if count == 0 || count > self.left {
                return Err(invalid(format!(
                    "a run of {count} blocks at block {at} of {}",
                    self.header.blocks()
                )));
            }
            self.left -= count;
            match tag {
                TAG_ZEROS => {
                    self.last_zero = true;
                    return Ok(Some(Piece::Zeros(count)));
                }
                TAG_DATA => {
                    self.last_zero = false;
                    self.in_data = count;
                }
                other => {
                    return Err(invalid(format!(
                        "unknown record tag {other:#04x} at block {at}"
                    )));
                }
            }
        }
        // Digest bytes are read, and memory grows, a chunk at a time: a
        // truncated map never costs what it claims.
        let n = self.in_data.min((READ_CHUNK / len) as u64);
        self.chunk.resize(n as usize * len, 0);
        self.r.get(&mut self.chunk)?;
        self.in_data -= n;
        Ok(Some(Piece::Data(&self.chunk)))
    }

    /// Check the end: the short last block, the trailer, nothing after it.
    fn finish(&mut self) -> Result<(), MapError> {
        if self.done {
            return Ok(());
        }
        let h = &self.header;
        let bs = h.block_size as u64;
        if h.range.end() == h.size && !h.size.is_multiple_of(bs) && self.last_zero {
            return Err(invalid("the short last block is marked as a zero block"));
        }
        let computed = (self.r.digest.as_mut())
            .map(|d| std::mem::replace(d, Algorithm::Sha256.streaming()).finalize());
        let mut trailer = [0u8; TRAILER];
        self.r.inner.read_exact(&mut trailer)?;
        if computed.is_some_and(|c| c != trailer) {
            return Err(MapError::Damaged);
        }
        let mut extra = [0u8; 1];
        loop {
            match self.r.inner.read(&mut extra) {
                Ok(0) => break,
                Ok(_) => return Err(invalid("bytes after the end of the map")),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e.into()),
            }
        }
        self.done = true;
        Ok(())
    }

    /// Read every record into memory, to the checked end.
    pub(crate) fn read_body(&mut self) -> Result<Body, MapError> {
        let mut body = Body::default();
        while let Some(piece) = self.next_piece()? {
            match piece {
                Piece::Zeros(n) => body.push_zeros(n),
                Piece::Data(d) => {
                    let at = body.digests.len();
                    body.digests.extend_from_slice(d);
                    body.open_data((d.len() / self.header.algorithm.output_len()) as u64, at);
                }
            }
        }
        Ok(body)
    }
}

/// Parse and check a header.
fn read_header<R: Read>(r: &mut DigestReader<R>) -> Result<Header, MapError> {
    let mut magic = [0u8; 8];
    match r.get(&mut magic) {
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(MapError::NotAMap),
        other => other?,
    }
    if magic != MAGIC {
        return Err(MapError::NotAMap);
    }
    let mut h = [0u8; FIXED_HEADER - 8];
    r.get(&mut h)?;
    // Fields by their offset in the map (`h` starts after the magic).
    let u32_at = |at: usize| u32::from_le_bytes(h[at - 8..at - 4].try_into().unwrap());
    let version = u32_at(8);
    if version != VERSION {
        return Err(MapError::Version(version));
    }
    let flags = u32_at(12);
    if flags & !(FLAG_PARTIAL | FLAG_IDENTITY) != 0 {
        return Err(invalid(format!("unknown flags {flags:#x}")));
    }
    let algorithm = read_algorithm(&h[16 - 8..16 - 8 + NAME_FIELD], u32_at(32))?;
    let len = algorithm.output_len();
    let block_size = u32_at(36) as usize;
    crate::check_params(algorithm, block_size)?;
    let size = u64::from_le_bytes(h[40 - 8..48 - 8].try_into().unwrap());
    let (range, checksum) = if flags & FLAG_PARTIAL != 0 {
        let offset = r.u64()?;
        let len = r.u64()?;
        (Range { offset, len }, None)
    } else {
        let mut checksum = vec![0u8; len];
        r.get(&mut checksum)?;
        let checksum =
            Checksum::from_bytes(algorithm, &checksum).map_err(|e| invalid(e.to_string()))?;
        (
            Range {
                offset: 0,
                len: size,
            },
            Some(checksum),
        )
    };
    let identity = match flags & FLAG_IDENTITY != 0 {
        true => Some(read_identity(r)?),
        false => None,
    };
    let header = Header {
        algorithm,
        block_size,
        size,
        range,
        checksum,
        identity,
    };
    header.check()?;
    Ok(header)
}

/// The digest named by the header's name field, whose length the header
/// says is `digest_len`.
fn read_algorithm(name_field: &[u8], digest_len: u32) -> Result<Algorithm, MapError> {
    let name_len = name_field
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(NAME_FIELD);
    if name_field[name_len..].iter().any(|&b| b != 0) {
        return Err(invalid("digest name not NUL-padded"));
    }
    let name = std::str::from_utf8(&name_field[..name_len])
        .map_err(|_| invalid("digest name not ASCII"))?;
    let algorithm: Algorithm = name
        .parse()
        .ok()
        .filter(|a: &Algorithm| a.name() == name)
        .ok_or_else(|| invalid(format!("unknown digest {name:?}")))?;
    let len = algorithm.output_len();
    if len == 0 {
        return Err(invalid(format!("digest {name} computes no block digests")));
    }
    if digest_len as usize != len {
        return Err(invalid(format!(
            "digest length {digest_len} for {name}, which has {len}"
        )));
    }
    Ok(algorithm)
}

/// The identity record: its length, checked before it is allocated, then
/// its bytes.
fn read_identity<R: Read>(r: &mut DigestReader<R>) -> Result<Vec<u8>, MapError> {
    let n = r.u32()? as usize;
    if n > MAX_IDENTITY {
        return Err(invalid(format!(
            "an identity record of {n} bytes (at most {MAX_IDENTITY})"
        )));
    }
    let mut id = vec![0u8; n];
    r.get(&mut id)?;
    Ok(id)
}

/// Write a file atomically: `write` fills a new temporary file in `path`'s
/// directory (created, never an existing file), which is flushed to disk
/// and renamed over `path`; then the directory is flushed. Whoever reads
/// `path` sees the old file or the new one, never a part of one.
///
/// ```
/// use std::io::Write;
/// let dir = std::env::temp_dir().join(format!("blkmap-doc-{}", std::process::id()));
/// std::fs::create_dir_all(&dir).unwrap();
/// let p = dir.join("out");
/// blkmap::write_atomic(&p, |w| w.write_all(b"hello")).unwrap();
/// assert_eq!(std::fs::read(&p).unwrap(), b"hello");
/// std::fs::remove_dir_all(&dir).unwrap();
/// ```
pub fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut BufWriter<File>) -> io::Result<()>,
) -> io::Result<()> {
    // The temporary file is removed if anything fails before the rename.
    let pending = crate::Pending::create(path)?;
    // BufWriter allocates its buffer infallibly: the room for it is asked
    // first, so that a memory limit ends in an error, not an abort (the
    // buffer freed is what BufWriter then gets).
    drop(blkhash::try_zeroed(WRITE_BUFFER, "a map's writes")?);
    let mut w = BufWriter::with_capacity(WRITE_BUFFER, pending.file().try_clone()?);
    write(&mut w)?;
    w.into_inner().map_err(|e| e.into_error())?;
    pending.commit()
}

/// The directory `path` is in (`.` for a bare name).
pub(crate) fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Remove the temporary files [`write_atomic`] left next to `path` in
/// runs that were killed (their process is gone); a file of a live process
/// is left alone. Returns how many were removed.
pub fn remove_stale_temps(path: &Path) -> io::Result<usize> {
    let Some(name) = path.file_name() else {
        return Ok(0);
    };
    let dir = dir_of(path);
    let mut prefix = std::ffi::OsString::from(".");
    prefix.push(name);
    prefix.push(".tmp-");
    let prefix = prefix.as_encoded_bytes().to_vec();
    let mut removed = 0;
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let file = entry.file_name();
        let Some(rest) = file.as_encoded_bytes().strip_prefix(&prefix[..]) else {
            continue;
        };
        let pid = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split_once('-'))
            .and_then(|(pid, n)| n.parse::<u32>().ok().and(pid.parse::<u32>().ok()));
        let Some(pid) = pid else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            fs::remove_file(entry.path())?;
            removed += 1;
        }
    }
    Ok(removed)
}

/// A new file `.NAME.tmp-PID-N` in `dir`.
pub(crate) fn create_temp(
    dir: &Path,
    name: &std::ffi::OsStr,
) -> io::Result<(std::path::PathBuf, File)> {
    let pid = std::process::id();
    for n in 0..1000 {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp-{pid}-{n}"));
        let tmp = dir.join(tmp_name);
        match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => return Ok((tmp, f)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary file name",
    ))
}
