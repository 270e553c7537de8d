//! A saved map read where it lies: its header, its runs and any block's
//! digest read from the file when asked, and its pieces streamed, never
//! the map whole in memory.

use crate::format::{Header, MapReader, TAG_DATA, TAG_ZEROS, open_map_file};
use crate::stream::{Checked, Pieces};
use crate::{Block, Map, MapError};
use std::borrow::{Borrow, Cow};
use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;

/// The buffer in front of a map file's reader: its records' heads are
/// small reads; the digests are read in chunks of their own past it (a
/// read at least this long bypasses the buffer), so a larger one would
/// only hold a second copy of them (1 MiB each, several readers open in
/// an update).
const READ_BUFFER: usize = 64 << 10;

/// Records between two entries of the index: the index of a map of `r`
/// records holds `r / INDEX_EVERY` entries, and a look-up reads at most
/// this many record heads.
const INDEX_EVERY: u64 = 256;

/// A saved map (or part) opened for reading where it lies: what an
/// incremental update reads of its base. Opening reads the header and the
/// record heads (a tag and a count each; digests are skipped), keeping
/// one in 256 as an index: memory grows with the number of
/// runs over 256, never with the digests. The trailer and checksum are
/// checked by whoever reads [`pieces`](MapFile::pieces) to the end; until
/// then, what [`block`](MapFile::block) gives is not known to be intact.
///
/// ```
/// use blkhash::Options;
/// use blkmap::{Block, Map, MapFile};
/// let dir = tempfile::tempdir().unwrap();
/// let path = dir.path().join("disk.map");
/// let mut data = vec![0u8; 8192];
/// data[5000] = 1;
/// let map = Map::compute(Options::new().block_size(1024), &data).unwrap();
/// map.save(&path).unwrap();
/// let file = MapFile::open(&path).unwrap();
/// assert_eq!(file.header().size, 8192);
/// assert_eq!(file.block(0).unwrap(), None);
/// assert_eq!(file.block(4).unwrap().as_deref(), map.block(4).and_then(|b| match b {
///     Block::Data(d) => Some(d),
///     Block::Zero => None,
/// }));
/// let runs: Vec<_> = file.runs().map(Result::unwrap).collect();
/// assert_eq!(runs, [(0..4, false), (4..5, true), (5..8, false)]);
/// assert_eq!(blkmap::diff_pieces(file.pieces().unwrap(), map.pieces()).unwrap().ranges, []);
/// ```
pub struct MapFile {
    file: File,
    header: Header,
    /// Where the records start.
    records: u64,
    /// Every [`INDEX_EVERY`]th record: its first block and its offset.
    index: Vec<(u64, u64)>,
    /// The file's size and times when it was opened.
    stamp: Stamp,
}

/// What changes when a file is written: its size and modification time
/// (not its change time: a file removed or renamed while it is read, as
/// blksync removes its state before writing DST, is still the same).
#[derive(Debug, PartialEq, Eq)]
struct Stamp(u64, i64, i64);

impl Stamp {
    fn of(file: &File) -> io::Result<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = file.metadata()?;
        Ok(Stamp(m.len(), m.mtime(), m.mtime_nsec()))
    }
}

impl MapFile {
    /// Open the map or part at `path`: header and record heads checked
    /// (as [`MapReader`] checks them), digests left where they are.
    pub fn open(path: impl AsRef<Path>) -> Result<MapFile, MapError> {
        MapFile::from_file(open_map_file(path.as_ref())?)
    }

    /// [`open`](MapFile::open) a file already open (read from its start,
    /// whatever its position).
    pub fn from_file(file: File) -> Result<MapFile, MapError> {
        let stamp = Stamp::of(&file)?;
        let at = At {
            file: &file,
            pos: 0,
        };
        let header = MapReader::new(BufReader::new(at))?.header().clone();
        let records = header.encoded_len() as u64;
        let mut map = MapFile {
            file,
            header,
            records,
            index: Vec::new(),
            stamp,
        };
        let (mut n, mut index) = (0u64, Vec::new());
        let mut heads = map.heads(0, map.records);
        while let Some(head) = heads.next_head()? {
            if n.is_multiple_of(INDEX_EVERY) {
                index.push((head.first, head.at));
            }
            n += 1;
        }
        map.index = index;
        Ok(map)
    }

    /// The header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The runs, in order: blocks (counted from the first the records
    /// cover) and whether they hold data.
    pub fn runs(
        &self,
    ) -> impl Iterator<Item = Result<(std::ops::Range<u64>, bool), MapError>> + '_ {
        let mut heads = self.heads(0, self.records);
        std::iter::from_fn(move || {
            heads
                .next_head()
                .transpose()
                .map(|h| h.map(|h| (h.first..h.first + h.count, h.data)))
        })
    }

    /// The digest of block `index` (from the first the records cover), read
    /// from the file: `None` for a zero block. An error past the end.
    pub fn block(&self, index: u64) -> Result<Option<Vec<u8>>, MapError> {
        if index >= self.header.blocks() {
            return Err(MapError::Invalid(format!(
                "block {index} of a map of {} blocks",
                self.header.blocks()
            )));
        }
        let k = self.index.partition_point(|&(first, _)| first <= index) - 1;
        let (first, at) = self.index[k];
        let mut heads = self.heads(first, at);
        while let Some(h) = heads.next_head()? {
            if index < h.first + h.count {
                if !h.data {
                    return Ok(None);
                }
                let len = self.header.algorithm.output_len();
                let mut d = vec![0u8; len];
                let pos = h.at + 9 + (index - h.first) * len as u64;
                self.file.read_exact_at(&mut d, pos)?;
                return Ok(Some(d));
            }
        }
        Err(MapError::Truncated)
    }

    /// The map as pieces read from its start, every check of
    /// [`Map::read`](crate::Map::read) made as they are (the trailer and
    /// the checksum once the last was read).
    pub fn pieces(&self) -> Result<Checked<MapReader<BufReader<At<&File>>>>, MapError> {
        let at = At {
            file: &self.file,
            pos: 0,
        };
        let reader = MapReader::new(BufReader::with_capacity(READ_BUFFER, at))?;
        Ok(Checked::new(reader))
    }

    /// [`pieces`](MapFile::pieces) of a map already read whole through
    /// them and found intact: every structural check made, not the
    /// trailer's or the checksum's (they cost a SHA-256 of the file and
    /// a digest of its digests). Once read, [`unchanged`](MapFile::unchanged)
    /// says the file is still the one checked.
    pub fn pieces_known_intact(&self) -> Result<MapReader<BufReader<At<&File>>>, MapError> {
        let at = At {
            file: &self.file,
            pos: 0,
        };
        MapReader::known_intact(BufReader::with_capacity(READ_BUFFER, at))
    }

    /// An error if the file was written since it was opened (its size or
    /// times changed): what was read of it may not be what was checked.
    pub fn unchanged(&self) -> Result<(), MapError> {
        if Stamp::of(&self.file)? != self.stamp {
            return Err(MapError::Io(io::Error::other(
                "written by another program while this one read it",
            )));
        }
        Ok(())
    }

    /// [`pieces`](MapFile::pieces) read through a handle of their own (a
    /// duplicate of the file's, read at a position of its own), for a
    /// reader that must own them: a hasher's observer, on another thread.
    pub fn pieces_owned(&self) -> Result<Box<dyn Pieces + Send>, MapError> {
        let at = At {
            file: self.file.try_clone()?,
            pos: 0,
        };
        let reader = MapReader::new(BufReader::with_capacity(READ_BUFFER, at))?;
        Ok(Box::new(Checked::new(reader)))
    }

    fn heads(&self, block: u64, at: u64) -> Heads<&File> {
        let len = self.header.algorithm.output_len() as u64;
        Heads::new(&self.file, self.header.blocks(), len, block, at)
    }

    /// The blocks read by index, forward, from a handle of its own: only
    /// the digests asked for are read, never checked (the file is known
    /// intact only once [`pieces`](MapFile::pieces) was read to its end:
    /// read them first). What an update that has checked its state reads
    /// the state's blocks with, beside SRC's.
    pub fn lookup(&self) -> Result<Lookup, MapError> {
        let file = Arc::new(self.file.try_clone()?);
        let len = self.header.algorithm.output_len() as u64;
        Ok(Lookup {
            heads: Heads::new(file.clone(), self.header.blocks(), len, 0, self.records),
            file,
            index: self.index.clone(),
            head: None,
            len,
        })
    }
}

/// A saved map's blocks looked up by index, each at or after the last
/// asked for ([`MapFile::lookup`]): a record's head is found through the
/// map's index or by reading on, and only the digests asked for are read
/// from the file. Memory: the index and a 64 KiB buffer of heads.
pub struct Lookup {
    file: Arc<File>,
    heads: Heads<Arc<File>>,
    index: Vec<(u64, u64)>,
    /// The record holding the last block asked for.
    head: Option<Head>,
    len: u64,
}

impl Lookup {
    /// The run holding block `index`: its end and whether it holds data;
    /// `None` past the map's end. A block before the record of the last
    /// one asked for is an error: the map is read forward.
    pub fn run_at(&mut self, index: u64) -> Result<Option<(u64, bool)>, MapError> {
        if index >= self.heads.end {
            return Ok(None);
        }
        if let Some(h) = &self.head {
            if index < h.first {
                return Err(MapError::Invalid(format!(
                    "block {index} asked for after block {}: the map is read forward",
                    h.first
                )));
            }
            if index < h.first + h.count {
                return Ok(Some((h.first + h.count, h.data)));
            }
        }
        // Far ahead: start again from the index's last record at or
        // before the block, rather than reading every head between.
        let k = self.index.partition_point(|&(first, _)| first <= index) - 1;
        let (first, at) = self.index[k];
        if first > self.heads.block {
            let (end, len) = (self.heads.end, self.len);
            self.heads = Heads::new(self.file.clone(), end, len, first, at);
        }
        while let Some(h) = self.heads.next_head()? {
            if index < h.first + h.count {
                let run = (h.first + h.count, h.data);
                self.head = Some(h);
                return Ok(Some(run));
            }
        }
        Err(MapError::Truncated)
    }

    /// The digests of the `n` blocks from `index` on, all in the data run
    /// [`run_at`](Lookup::run_at) gave for `index`, read into `buf`
    /// (replacing what it held).
    pub fn digests(&mut self, index: u64, n: u64, buf: &mut Vec<u8>) -> Result<(), MapError> {
        let h = match self.run_at(index)? {
            Some((end, true)) if n <= end - index => self.head.as_ref().expect("a run"),
            _ => {
                return Err(MapError::Invalid(format!(
                    "digests of blocks {index}+{n} asked for outside a data run"
                )));
            }
        };
        buf.resize((n * self.len) as usize, 0);
        let pos = h.at + 9 + (index - h.first) * self.len;
        self.file.read_exact_at(buf, pos)?;
        Ok(())
    }
}

/// A file (`F`: the file, or a borrow of it) read from a position of its
/// own (`pread`): readers of one [`MapFile`] never move each other.
pub struct At<F> {
    file: F,
    pos: u64,
}

impl<F: Borrow<File>> Read for At<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.borrow().read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl<F: Borrow<File>> Seek for At<F> {
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        self.pos = match to {
            SeekFrom::Start(p) => p,
            SeekFrom::Current(d) => self.pos.checked_add_signed(d).ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, "seek before the start")
            })?,
            SeekFrom::End(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "seek from the end",
                ));
            }
        };
        Ok(self.pos)
    }
}

/// A record's head: its blocks, kind, and offset in the file.
struct Head {
    first: u64,
    count: u64,
    data: bool,
    at: u64,
}

/// Record heads read one after another, digests skipped.
struct Heads<F> {
    r: BufReader<At<F>>,
    /// The next record's offset.
    at: u64,
    /// The next record's first block.
    block: u64,
    end: u64,
    len: u64,
}

impl<F: Borrow<File>> Heads<F> {
    /// The heads of the records of a map of `end` blocks whose digests
    /// are `len` bytes, from the one at offset `at`, whose first block is
    /// `block`.
    fn new(file: F, end: u64, len: u64, block: u64, at: u64) -> Heads<F> {
        Heads {
            r: BufReader::with_capacity(64 << 10, At { file, pos: at }),
            at,
            block,
            end,
            len,
        }
    }

    fn next_head(&mut self) -> Result<Option<Head>, MapError> {
        if self.block >= self.end {
            return Ok(None);
        }
        let mut b = [0u8; 9];
        self.r.read_exact(&mut b)?;
        let count = u64::from_le_bytes(b[1..].try_into().expect("8 bytes"));
        if count == 0 || count > self.end - self.block {
            return Err(MapError::Invalid(format!(
                "a run of {count} blocks at block {} of {}",
                self.block, self.end
            )));
        }
        let data = match b[0] {
            TAG_DATA => true,
            TAG_ZEROS => false,
            other => {
                return Err(MapError::Invalid(format!(
                    "unknown record tag {other:#04x} at block {}",
                    self.block
                )));
            }
        };
        let head = Head {
            first: self.block,
            count,
            data,
            at: self.at,
        };
        let skip = if data { count * self.len } else { 0 };
        self.r.seek_relative(skip as i64)?;
        self.at += 9 + skip;
        self.block += count;
        Ok(Some(head))
    }
}

/// A map read by block index and as a stream: a map in memory, a saved
/// map read where it lies ([`MapFile`]), or another map-like file. What
/// an incremental update asks of its base: the header, the runs (whether
/// each block holds data), a block's digest now and then, and every
/// block once, in order.
pub trait MapLike {
    /// The header: digest, block size, size, range, checksum, identity.
    fn header(&self) -> Cow<'_, Header>;
    /// The runs in order: blocks (from the first the records cover), and
    /// whether they hold data.
    fn runs(&self) -> Box<dyn Iterator<Item = Result<(BlockRange, bool), MapError>> + '_>;
    /// The digest of block `index`; `None` for a zero block.
    fn block(&self, index: u64) -> Result<Option<Vec<u8>>, MapError>;
    /// Every block in order, checked as a load checks it once read to
    /// the end.
    fn pieces(&self) -> Result<Box<dyn Pieces + '_>, MapError>;
}

/// Block indexes.
type BlockRange = std::ops::Range<u64>;

impl MapLike for MapFile {
    fn header(&self) -> Cow<'_, Header> {
        Cow::Borrowed(&self.header)
    }
    fn runs(&self) -> Box<dyn Iterator<Item = Result<(BlockRange, bool), MapError>> + '_> {
        Box::new(MapFile::runs(self))
    }
    fn block(&self, index: u64) -> Result<Option<Vec<u8>>, MapError> {
        MapFile::block(self, index)
    }
    fn pieces(&self) -> Result<Box<dyn Pieces + '_>, MapError> {
        Ok(Box::new(MapFile::pieces(self)?))
    }
}

impl MapLike for Map {
    fn header(&self) -> Cow<'_, Header> {
        Cow::Owned(Map::header(self))
    }
    fn runs(&self) -> Box<dyn Iterator<Item = Result<(BlockRange, bool), MapError>> + '_> {
        Box::new(Map::runs(self).map(|r| Ok((r.first..r.first + r.count, r.digests.is_some()))))
    }
    fn block(&self, index: u64) -> Result<Option<Vec<u8>>, MapError> {
        match Map::block(self, index) {
            Some(Block::Zero) => Ok(None),
            Some(Block::Data(d)) => Ok(Some(d.to_vec())),
            None => Err(MapError::Invalid(format!(
                "block {index} of a map of {} blocks",
                self.blocks()
            ))),
        }
    }
    fn pieces(&self) -> Result<Box<dyn Pieces + '_>, MapError> {
        Ok(Box::new(Map::pieces(self)))
    }
}
