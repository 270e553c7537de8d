//! Proxmox Backup Server fixed indexes (`.fidx`): the parser, here where
//! both the image layer (a backup read from its datastore) and the block
//! maps (`blkmap` reads an index as a map) read it.
//!
//! PBS stores a VM disk backup as a fixed index: the SHA-256 digest of
//! each fixed-size chunk of the disk, in order. An unencrypted chunk's
//! digest is the SHA-256 of its bytes (the last chunk shorter), so a fixed
//! index is the block map of the disk with `sha256` and the chunk size as
//! the block size, and its `index_csum` is the disk's checksum in the
//! [`Pbs`](blkhash::Construction::Pbs) construction. An encrypted backup's
//! digests are keyed: they cannot match any image's.
//!
//! The format (proxmox-backup's `docs/file-formats.rst`), all numbers
//! little-endian:
//!
//! | offset | bytes | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic: the first 8 bytes of SHA-256 of "Proxmox Backup fixed sized chunk index v1.0" |
//! | 8 | 16 | uuid |
//! | 24 | 8 | ctime (seconds since the epoch, signed) |
//! | 32 | 32 | `index_csum`: SHA-256 of the digests concatenated |
//! | 64 | 8 | size of the image in bytes |
//! | 72 | 8 | chunk size |
//! | 80 | 4016 | reserved (the header is 4096 bytes) |
//! | 4096 | 32 × n | the digests, `n = ceil(size / chunk size)` |
//!
//! [`FidxReader`] reads one as a stream, the digests in chunk order, a
//! bounded buffer at a time: what a header claims is never allocated. It
//! refuses a bad magic, a chunk size that is not a power of two from 512
//! bytes (blkhash's smallest block) to 64 MiB, a file whose length is not
//! the header's (when the caller knows it, before reading on; else at the
//! end), an `index_csum` that is not the digest of the digests, and a
//! short last chunk with the digest of a full chunk of zeros (which no
//! chunk of its length has, and a block map would take for a zero block).

use blkhash::{Algorithm, Checksum, Construction, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use std::fmt;
use std::io::{self, Read};

/// The magic: `SHA-256("Proxmox Backup fixed sized chunk index v1.0")[..8]`.
pub const FIDX_MAGIC: [u8; 8] = [47, 127, 65, 237, 145, 253, 15, 205];
/// Bytes of the header, before the digests.
pub const FIDX_HEADER_LEN: usize = 4096;
/// Bytes of one digest (SHA-256).
pub const DIGEST_LEN: usize = 32;
/// Digests handed out per [`FidxReader::next_digests`] call: 1 MiB.
const BATCH: usize = 32768;

/// True if `prefix` (a file's first bytes) starts with the fixed index magic.
///
/// ```
/// assert!(blkimage::pbs::is_fidx(&blkimage::pbs::FIDX_MAGIC));
/// assert!(!blkimage::pbs::is_fidx(b"\x89BKM\r\n\x1a\n"));
/// ```
pub fn is_fidx(prefix: &[u8]) -> bool {
    prefix.starts_with(&FIDX_MAGIC)
}

/// True if the file `path` starts with the fixed index magic (a `.fidx`,
/// whatever its name); false if it does not or cannot be read, and for
/// anything but a regular file: opening a FIFO waits for a writer, and
/// reading a pipe would take the bytes its reader needs (a piped index is
/// probed where the stream is read).
pub fn is_fidx_file(path: &std::path::Path) -> bool {
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return false;
    }
    let mut prefix = [0u8; 8];
    std::fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut prefix))
        .is_ok_and(|()| is_fidx(&prefix))
}

/// A fixed index's header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FidxHeader {
    /// The backup's unique id.
    pub uuid: [u8; 16],
    /// When the index was made (seconds since the epoch).
    pub ctime: i64,
    /// SHA-256 of the digests concatenated: the image's checksum in the
    /// `pbs` construction.
    pub index_csum: [u8; 32],
    /// The image's size in bytes.
    pub size: u64,
    /// Bytes per chunk: a power of two from 512 bytes to 64 MiB.
    pub chunk_size: usize,
}

/// Why a fixed index could not be read.
#[derive(Debug)]
pub enum FidxError {
    /// It is not a valid fixed index: the reason.
    Invalid(String),
    /// Reading it failed.
    Io(io::Error),
}

impl fmt::Display for FidxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FidxError::Invalid(why) => write!(f, "invalid PBS fixed index: {why}"),
            FidxError::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FidxError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FidxError::Io(e) => Some(e),
            FidxError::Invalid(_) => None,
        }
    }
}

/// An invalid index is invalid data; an I/O error stays what it was.
impl From<FidxError> for io::Error {
    fn from(e: FidxError) -> io::Error {
        match e {
            FidxError::Io(e) => e,
            e => io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
        }
    }
}

fn invalid(why: impl Into<String>) -> FidxError {
    FidxError::Invalid(why.into())
}

impl FidxHeader {
    /// Parse and check the 4096-byte header.
    ///
    /// ```
    /// use blkimage::pbs::{FidxHeader, FIDX_MAGIC};
    /// let mut h = [0u8; 4096];
    /// h[..8].copy_from_slice(&FIDX_MAGIC);
    /// h[64..72].copy_from_slice(&(10u64 << 20).to_le_bytes());
    /// h[72..80].copy_from_slice(&(4u64 << 20).to_le_bytes());
    /// let header = FidxHeader::parse(&h).unwrap();
    /// assert_eq!((header.chunks(), header.file_len()), (3, 4096 + 3 * 32));
    /// h[72..80].copy_from_slice(&(3u64 << 20).to_le_bytes());
    /// assert!(FidxHeader::parse(&h).is_err()); // not a power of two
    /// ```
    pub fn parse(bytes: &[u8]) -> Result<FidxHeader, FidxError> {
        if bytes.len() < FIDX_HEADER_LEN {
            return Err(invalid(format!(
                "{} bytes, shorter than its 4096-byte header",
                bytes.len()
            )));
        }
        if !is_fidx(bytes) {
            return Err(invalid("bad magic: not a Proxmox Backup fixed index"));
        }
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().unwrap());
        let chunk_size = u64_at(72);
        if !chunk_size.is_power_of_two()
            || !(MIN_BLOCK_SIZE as u64..=MAX_BLOCK_SIZE as u64).contains(&chunk_size)
        {
            return Err(invalid(format!(
                "chunk size {chunk_size}: not a power of two from 512 to 64 MiB"
            )));
        }
        Ok(FidxHeader {
            uuid: bytes[8..24].try_into().unwrap(),
            ctime: u64_at(24) as i64,
            index_csum: bytes[32..64].try_into().unwrap(),
            size: u64_at(64),
            chunk_size: chunk_size as usize,
        })
    }

    /// Chunks, and so digests: `ceil(size / chunk_size)`.
    pub fn chunks(&self) -> u64 {
        self.size.div_ceil(self.chunk_size as u64)
    }

    /// The length of the file the header describes: the header and one
    /// digest per chunk (saturating: a size no file has).
    pub fn file_len(&self) -> u64 {
        self.chunks()
            .saturating_mul(DIGEST_LEN as u64)
            .saturating_add(FIDX_HEADER_LEN as u64)
    }

    /// `index_csum` as a checksum of the `pbs` construction.
    pub fn index_checksum(&self) -> Checksum {
        Checksum::from_bytes(Algorithm::Sha256, &self.index_csum)
            .expect("32 bytes")
            .with_construction(Construction::Pbs)
    }
}

/// A fixed index read as a stream: the header, then the digests in chunk
/// order, at most 1 MiB of them at a time; `index_csum` checked at the end.
///
/// ```
/// use blkimage::pbs::{FidxReader, FIDX_MAGIC};
/// use blkhash::{checksum_with, Algorithm, Construction};
/// // An index of a 5 MiB image of 4 MiB chunks, written as PBS writes one.
/// let data = vec![7u8; 5 << 20];
/// let mut digests = Vec::new();
/// for chunk in data.chunks(4 << 20) {
///     let mut d = [0u8; 32];
///     Algorithm::Sha256.digest_into(chunk, &mut d);
///     digests.extend_from_slice(&d);
/// }
/// let csum = checksum_with(Construction::Pbs, Algorithm::Sha256, 4 << 20, &data);
/// let mut file = vec![0u8; 4096];
/// file[..8].copy_from_slice(&FIDX_MAGIC);
/// file[32..64].copy_from_slice(csum.as_bytes());
/// file[64..72].copy_from_slice(&(5u64 << 20).to_le_bytes());
/// file[72..80].copy_from_slice(&(4u64 << 20).to_le_bytes());
/// file.extend_from_slice(&digests);
///
/// let mut r = FidxReader::new(&file[..]).unwrap();
/// let mut seen = Vec::new();
/// while let Some(d) = r.next_digests().unwrap() {
///     seen.extend_from_slice(d);
/// }
/// assert_eq!(seen, digests);
/// // The image's checksum in blkhash 0.11's construction follows too.
/// assert_eq!(r.checksum().unwrap(), blkhash::checksum_of(Algorithm::Sha256, 4 << 20, &data));
///
/// // An index_csum that lies is refused at the end.
/// file[40] ^= 1;
/// let mut r = FidxReader::new(&file[..]).unwrap();
/// let err = r.checksum().unwrap_err();
/// assert!(err.to_string().contains("index_csum is not the SHA-256 of its digests"));
/// ```
pub struct FidxReader<R> {
    r: R,
    header: FidxHeader,
    /// Digests handed out so far.
    done: u64,
    buf: Vec<u8>,
    /// SHA-256 of the digests: `index_csum`.
    csum: Box<dyn blkhash::Streaming>,
    /// SHA-256 of the digests and the size: blkhash 0.11's checksum.
    ours: Option<Box<dyn blkhash::Streaming>>,
    /// Both checksums, once the end was reached and checked.
    end: Option<Checksum>,
}

impl<R: Read> FidxReader<R> {
    /// Read and check the header.
    pub fn new(mut r: R) -> Result<FidxReader<R>, FidxError> {
        let mut head = vec![0u8; FIDX_HEADER_LEN];
        let mut got = 0;
        while got < FIDX_HEADER_LEN {
            match r.read(&mut head[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FidxError::Io(e)),
            }
        }
        if got >= 8 && !is_fidx(&head) {
            return Err(invalid("bad magic: not a Proxmox Backup fixed index"));
        }
        let header = FidxHeader::parse(&head[..got])?;
        Ok(FidxReader {
            r,
            header,
            done: 0,
            buf: Vec::new(),
            csum: Algorithm::Sha256.streaming(),
            ours: Some(Algorithm::Sha256.streaming()),
            end: None,
        })
    }

    /// The header.
    pub fn header(&self) -> &FidxHeader {
        &self.header
    }

    /// The next digests (32 bytes each, at least one), in chunk order, or
    /// `None` after the last, once the index has been checked: nothing
    /// after the last digest, and `index_csum` the digest of them all.
    pub fn next_digests(&mut self) -> Result<Option<&[u8]>, FidxError> {
        let left = self.header.chunks() - self.done;
        if left == 0 {
            self.finish()?;
            return Ok(None);
        }
        let n = left.min(BATCH as u64) as usize;
        self.buf.resize(n * DIGEST_LEN, 0);
        let mut got = 0;
        while got < self.buf.len() {
            match self.r.read(&mut self.buf[got..]) {
                Ok(0) => {
                    return Err(invalid(format!(
                        "truncated: {} digests for {} chunks of {} bytes",
                        self.done + (got / DIGEST_LEN) as u64,
                        self.header.chunks(),
                        self.header.chunk_size
                    )));
                }
                Ok(k) => got += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FidxError::Io(e)),
            }
        }
        self.done += n as u64;
        if self.done == self.header.chunks() {
            self.check_short_last()?;
        }
        self.csum.update(&self.buf);
        if let Some(ours) = &mut self.ours {
            ours.update(&self.buf);
        }
        Ok(Some(&self.buf))
    }

    /// A short last chunk (the buffer's last digest) must not carry the
    /// digest of a full chunk of zeros: no chunk of its length has it, and
    /// a block map takes a block with that digest for a zero block, which
    /// a short last block never is.
    fn check_short_last(&self) -> Result<(), FidxError> {
        let bs = self.header.chunk_size;
        let tail = self.header.size % bs as u64;
        if tail == 0 {
            return Ok(());
        }
        let last = &self.buf[self.buf.len() - DIGEST_LEN..];
        if last == Algorithm::Sha256.digest_zeros(bs) {
            return Err(invalid(format!(
                "the short last chunk ({tail} bytes) has the digest of {bs} bytes of zeros: \
                 no chunk of its length has it"
            )));
        }
        Ok(())
    }

    /// At the end: nothing more in the file, and `index_csum` true.
    fn finish(&mut self) -> Result<(), FidxError> {
        if self.end.is_some() {
            return Ok(());
        }
        let mut more = [0u8; 1];
        loop {
            match self.r.read(&mut more) {
                Ok(0) => break,
                Ok(_) => {
                    return Err(invalid(format!(
                        "bytes after the {} digests its header's size of {} bytes calls for",
                        self.header.chunks(),
                        self.header.size
                    )));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(FidxError::Io(e)),
            }
        }
        let csum = std::mem::replace(&mut self.csum, Algorithm::Sha256.streaming()).finalize();
        if csum != self.header.index_csum {
            return Err(invalid(
                "index_csum is not the SHA-256 of its digests: damaged or forged",
            ));
        }
        let mut ours = self.ours.take().expect("finished once");
        ours.update(&self.header.size.to_le_bytes());
        self.end =
            Some(Checksum::from_bytes(Algorithm::Sha256, &ours.finalize()).expect("32 bytes"));
        Ok(())
    }

    /// Read what is left and check it; then the image's checksum in
    /// blkhash 0.11's construction (`blksum -d sha256 --block-size` the
    /// chunk size). The `pbs` one is [`FidxHeader::index_checksum`], now
    /// checked.
    pub fn checksum(&mut self) -> Result<Checksum, FidxError> {
        while self.next_digests()?.is_some() {}
        Ok(self.end.clone().expect("finished"))
    }

    /// The checksum in `construction`, reading what is left.
    pub fn checksum_in(&mut self, construction: Construction) -> Result<Checksum, FidxError> {
        let ours = self.checksum()?;
        Ok(match construction {
            Construction::Blkhash => ours,
            c => self.header.index_checksum().with_construction(c),
        })
    }
}

/// Open the fixed index `path` for reading: its header checked, and its
/// length against the header's before a digest is read.
pub fn open_fidx(
    path: &std::path::Path,
) -> Result<FidxReader<io::BufReader<std::fs::File>>, FidxError> {
    let f = std::fs::File::open(path).map_err(FidxError::Io)?;
    let len = f.metadata().map_err(FidxError::Io)?.len();
    let r = FidxReader::new(io::BufReader::new(f))?;
    if len != r.header().file_len() {
        return Err(invalid(format!(
            "{len} bytes, not the {} its header calls for ({} chunks of {} bytes for a size of {})",
            r.header().file_len(),
            r.header().chunks(),
            r.header().chunk_size,
            r.header().size
        )));
    }
    Ok(r)
}
