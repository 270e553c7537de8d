//! The binary format: writing, reading and checking maps.
//!
//! All integers are little-endian. See `blkmap/README.md` for the layout.

use crate::{Body, Map, MapError};
use blkhash::{Algorithm, Streaming};
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::path::Path;

/// The first 8 bytes of every map. A non-ASCII first byte, CR LF and ^Z
/// catch transfers that mangle binary files (as PNG's signature does).
pub const MAGIC: [u8; 8] = *b"\x89BKM\r\n\x1a\n";
/// The format version written and read.
pub const VERSION: u32 = 1;

/// Bytes of the fixed part of the header.
const FIXED_HEADER: usize = 48;
/// Bytes of the digest-name field.
const NAME_FIELD: usize = 16;
/// Bytes of the trailer: SHA-256 of everything before it.
const TRAILER: usize = 32;
/// Record tags.
const TAG_ZEROS: u8 = b'Z';
const TAG_DATA: u8 = b'D';
/// Digest bytes read (and allocated) at a time.
const READ_CHUNK: usize = 1 << 20;

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

/// A writer that digests what goes through it.
struct DigestWriter<W> {
    inner: W,
    digest: Box<dyn Streaming>,
}

impl<W: Write> DigestWriter<W> {
    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.digest.update(b);
        self.inner.write_all(b)
    }
}

/// A reader that digests what it reads.
struct DigestReader<R> {
    inner: R,
    digest: Box<dyn Streaming>,
}

impl<R: Read> DigestReader<R> {
    fn get(&mut self, buf: &mut [u8]) -> io::Result<()> {
        self.inner.read_exact(buf)?;
        self.digest.update(buf);
        Ok(())
    }
    fn u8(&mut self) -> io::Result<u8> {
        let mut b = [0u8; 1];
        self.get(&mut b)?;
        Ok(b[0])
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

impl Map {
    /// Write the map in the binary format.
    pub fn write_to(&self, w: impl Write) -> io::Result<()> {
        let mut w = DigestWriter {
            inner: w,
            digest: Algorithm::Sha256.streaming(),
        };
        let len = self.algorithm.output_len();
        let mut header = [0u8; FIXED_HEADER];
        header[..8].copy_from_slice(&MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        // 12..16: flags, none.
        let name = self.algorithm.name().as_bytes();
        header[16..16 + name.len()].copy_from_slice(name);
        header[32..36].copy_from_slice(&(len as u32).to_le_bytes());
        header[36..40].copy_from_slice(&(self.block_size as u32).to_le_bytes());
        header[40..48].copy_from_slice(&self.size.to_le_bytes());
        w.put(&header)?;
        w.put(&self.checksum)?;
        for run in self.runs() {
            let tag = if run.digests.is_some() {
                TAG_DATA
            } else {
                TAG_ZEROS
            };
            w.put(&[tag])?;
            w.put(&run.count.to_le_bytes())?;
            if let Some(d) = run.digests {
                w.put(d)?;
            }
        }
        let trailer = w.digest.finalize();
        w.inner.write_all(&trailer)?;
        w.inner.flush()
    }

    /// The map in the binary format.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.encoded_len() as usize);
        self.write_to(&mut v).expect("writing to memory");
        v
    }

    /// Bytes of the map in the binary format.
    pub fn encoded_len(&self) -> u64 {
        let len = self.algorithm.output_len() as u64;
        (FIXED_HEADER + TRAILER) as u64
            + len
            + 9 * self.body.runs.len() as u64
            + self.body.digests.len() as u64
    }

    /// Read a map and check everything: magic, version, header fields,
    /// record lengths against the size, the digest of its contents, nothing
    /// after it, and the checksum derived from its block digests.
    ///
    /// Memory grows with the digests actually read, never with what a
    /// header claims.
    pub fn read(r: impl Read) -> Result<Map, MapError> {
        let (map_parts, body) = read_parts(r)?;
        let (algorithm, block_size, size, checksum) = map_parts;
        Map::assemble(algorithm, block_size, size, checksum, body)
    }

    /// [`read`](Map::read) from bytes in memory.
    pub fn from_bytes(bytes: &[u8]) -> Result<Map, MapError> {
        Map::read(bytes)
    }

    /// Read the map saved at `path`.
    pub fn load(path: impl AsRef<Path>) -> Result<Map, MapError> {
        Map::read(BufReader::with_capacity(1 << 20, File::open(path)?))
    }

    /// Save the map at `path` atomically: written to a temporary file in the
    /// same directory, flushed to disk, renamed over `path`, and the
    /// directory flushed. `path` is the old file or the new one, never a
    /// part of one.
    pub fn save(&self, path: impl AsRef<Path>) -> io::Result<()> {
        write_atomic(path.as_ref(), |w| self.write_to(w))
    }
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
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a file name"))?;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let (tmp, file) = create_temp(dir, name)?;
    let result = (|| {
        let mut w = BufWriter::with_capacity(1 << 20, file);
        write(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

/// A new file `.NAME.tmp-PID-N` in `dir`.
fn create_temp(dir: &Path, name: &std::ffi::OsStr) -> io::Result<(std::path::PathBuf, File)> {
    let pid = std::process::id();
    for n in 0..1000 {
        let mut tmp_name = std::ffi::OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".tmp-{pid}-{n}"));
        let tmp = dir.join(tmp_name);
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
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

type Header = (Algorithm, usize, u64, Vec<u8>);

/// Parse and check the structure and the trailer; the caller checks the
/// runs against the size and the checksum.
fn read_parts(r: impl Read) -> Result<(Header, Body), MapError> {
    let mut r = DigestReader {
        inner: r,
        digest: Algorithm::Sha256.streaming(),
    };
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
    if flags != 0 {
        return Err(invalid(format!("unknown flags {flags:#x}")));
    }
    let name_field = &h[16 - 8..16 - 8 + NAME_FIELD];
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
    let digest_len = u32_at(32);
    if digest_len as usize != len {
        return Err(invalid(format!(
            "digest length {digest_len} for {name}, which has {len}"
        )));
    }
    let block_size = u32_at(36) as usize;
    crate::check_params(algorithm, block_size)?;
    let size = u64::from_le_bytes(h[40 - 8..48 - 8].try_into().unwrap());
    let mut checksum = vec![0u8; len];
    r.get(&mut checksum)?;

    let blocks = size.div_ceil(block_size as u64);
    let mut body = Body::default();
    while body.blocks < blocks {
        let tag = r.u8()?;
        let count = r.u64()?;
        let left = blocks - body.blocks;
        if count == 0 || count > left {
            return Err(invalid(format!(
                "a run of {count} blocks at block {} of {blocks}",
                body.blocks
            )));
        }
        match tag {
            TAG_ZEROS => body.push_zeros(count),
            TAG_DATA => {
                // Digest bytes are read, and memory grows, a chunk at a
                // time: a truncated map never costs what it claims.
                let at = body.digests.len();
                let mut want = count * len as u64;
                while want > 0 {
                    let n = want.min(READ_CHUNK as u64) as usize;
                    let start = body.digests.len();
                    body.digests.resize(start + n, 0);
                    r.get(&mut body.digests[start..])?;
                    want -= n as u64;
                }
                body.open_data(count, at);
            }
            other => {
                return Err(invalid(format!(
                    "unknown record tag {other:#04x} at block {}",
                    body.blocks
                )));
            }
        }
    }
    let computed = r.digest.finalize();
    let mut trailer = [0u8; TRAILER];
    r.inner.read_exact(&mut trailer)?;
    if computed != trailer {
        return Err(MapError::Damaged);
    }
    let mut extra = [0u8; 1];
    loop {
        match r.inner.read(&mut extra) {
            Ok(0) => break,
            Ok(_) => return Err(invalid("bytes after the end of the map")),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(((algorithm, block_size, size, checksum), body))
}
