//! Block maps: the block digests of a blkhash checksum, kept.
//!
//! A [`Map`] holds, for an image of a given size, hashed with a given digest
//! and block size, the digest of every block, or a marker for a block that
//! reads as zeros (runs of them stored as runs), and the image checksum. The
//! checksum follows from the map alone ([`Map::derive_checksum`]), and two
//! maps of the same digest and block size tell where two images differ
//! ([`diff`]).
//!
//! A map is built while hashing (a [`MapBuilder`] observing the
//! [`blkhash::Hasher`]), saved in a compact, versioned binary format (see
//! `blkmap/README.md`, byte by byte) and checked on load: magic, version,
//! lengths, a SHA-256 of its own contents, and the checksum derived from the
//! block digests against the one in its header. A damaged or truncated map is
//! an error, never a map.
//!
//! ```
//! use blkhash::{Hasher, Options};
//! use blkmap::{Map, MapBuilder};
//!
//! let mut h = Hasher::with_options(Options::new().block_size(4096)).unwrap();
//! let builder = MapBuilder::attach(&mut h).unwrap();
//! h.update(&[7u8; 10000]);
//! h.update_zeros(1 << 20);
//! let map = builder.finalize(h).unwrap();
//! assert_eq!(map.size(), 10000 + (1 << 20));
//!
//! // Saved and loaded, it is the same map, and its checksum is the image's.
//! let bytes = map.to_bytes();
//! let loaded = Map::from_bytes(&bytes).unwrap();
//! assert_eq!(loaded, map);
//! assert_eq!(&loaded.derive_checksum(), loaded.checksum());
//!
//! // Any damage is refused.
//! let mut bad = bytes.clone();
//! bad[60] ^= 1;
//! assert!(Map::from_bytes(&bad).is_err());
//! assert!(Map::from_bytes(&bytes[..bytes.len() - 1]).is_err());
//! ```

// Every public item says what it is (cargo doc is part of the API).
#![warn(missing_docs)]

mod builder;
mod diff;
mod fidx;
mod file;
mod format;
pub mod guard;
mod merge;
mod outer;
mod part;
mod splice;
mod stream;
pub mod temps;
mod writer;

pub use builder::{MapBuilder, Observed, Summary};
pub use diff::{Diff, Mismatch, Range, SizeRule, diff, diff_pieces};
pub use fidx::{
    FIDX_HEADER_LEN, FIDX_MAGIC, FidxError, FidxHeader, FidxReader, fidx_map, fidx_map_file,
    is_fidx, is_fidx_file, open_fidx,
};
pub use file::{Lookup, MapFile, MapLike};
pub use format::{
    Header, MAGIC, MAX_IDENTITY, MapReader, Piece, VERSION, check_range, is_map,
    remove_stale_temps, write_atomic,
};
pub use merge::{
    Input, Named, checksum_files_until, merge, merge_files, merge_files_until, merge_to_file,
    merge_to_file_until, merge_until,
};
pub(crate) use outer::Outer;
pub use outer::checksum_in;
pub use outer::zero_digest;
pub use part::Part;
pub use splice::{Splice, Spliced, splice};
pub use stream::{Checked, MapPieces, Pieces};
pub use writer::{Output, OutputError, Pending, RecordWriter, save_with};

use blkhash::{Algorithm, Checksum, Construction, MAX_BLOCK_SIZE, MIN_BLOCK_SIZE};
use std::fmt;
use std::io;

/// What a block holds, as the map knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Block<'a> {
    /// A full block that reads as zeros (a hole, or written zeros): its
    /// digest is the digest of a block of zeros.
    Zero,
    /// A block of data, with its digest (a short last block is always data).
    Data(&'a [u8]),
}

/// A run of blocks of one kind, as stored in a map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run<'a> {
    /// Index of the first block.
    pub first: u64,
    /// Number of blocks (at least 1).
    pub count: u64,
    /// `None` for zero blocks; else the `count` digests, one after another.
    pub digests: Option<&'a [u8]>,
}

/// Why a map was refused.
#[derive(Debug)]
#[non_exhaustive]
pub enum MapError {
    /// The bytes do not start with the map magic.
    NotAMap,
    /// A format version this build does not read.
    Version(u32),
    /// The map ends early.
    Truncated,
    /// A field out of range, or lengths that do not add up.
    Invalid(String),
    /// The digest of the map's contents does not match its trailer.
    Damaged,
    /// The checksum derived from the block digests is not the header's.
    Checksum,
    /// A range that cannot be a part of the image.
    Range(String),
    /// A part where a complete map was wanted.
    Partial {
        /// The bytes the part covers.
        range: Range,
        /// The image's size.
        size: u64,
    },
    /// Parts that do not make a map: they disagree, overlap or leave a gap.
    Merge(String),
    /// A Proxmox Backup Server fixed index (`.fidx`) that is not one, or
    /// lies: why.
    Fidx(String),
    /// An error in one of several inputs, named.
    In(String, Box<MapError>),
    /// Maps that cannot be compared.
    Mismatch(Mismatch),
    /// Reading or writing failed.
    Io(io::Error),
}

impl MapError {
    /// This error, said of the input `name`.
    pub fn of(self, name: &str) -> MapError {
        MapError::In(name.to_string(), Box::new(self))
    }
}

impl fmt::Display for MapError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MapError::NotAMap => f.write_str("not a block map (bad magic)"),
            MapError::Version(v) => write!(
                f,
                "block map format version {v} is not supported (this build reads version {VERSION})"
            ),
            MapError::Truncated => f.write_str("truncated block map"),
            MapError::Fidx(why) => write!(f, "invalid PBS fixed index: {why}"),
            MapError::Invalid(why) => write!(f, "invalid block map: {why}"),
            MapError::Damaged => f.write_str(
                "damaged block map: the digest of its contents does not match its trailer",
            ),
            MapError::Checksum => f.write_str(
                "inconsistent block map: the checksum derived from its block digests is not the one in its header",
            ),
            MapError::Range(why) => f.write_str(why),
            MapError::Partial { range, size } => write!(
                f,
                "a part of a block map (bytes {}+{} of an image of {size} bytes), not a whole map: merge the parts first (blkmap merge)",
                range.offset, range.len
            ),
            MapError::Merge(why) => f.write_str(why),
            MapError::In(name, e) => write!(f, "{name}: {e}"),
            MapError::Mismatch(m) => write!(f, "{m}"),
            MapError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for MapError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            MapError::Io(e) => Some(e),
            MapError::In(_, e) => Some(e),
            _ => None,
        }
    }
}

impl From<io::Error> for MapError {
    fn from(e: io::Error) -> Self {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            MapError::Truncated
        } else {
            MapError::Io(e)
        }
    }
}

impl From<MapError> for io::Error {
    fn from(e: MapError) -> Self {
        match e {
            MapError::Io(e) => e,
            other => io::Error::new(io::ErrorKind::InvalidData, other),
        }
    }
}

/// A stored run: `data` is the byte offset of its digests in `Map::digests`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct RunEntry {
    first: u64,
    count: u64,
    data: Option<usize>,
}

/// Runs being collected, adjacent runs of one kind merged.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Body {
    runs: Vec<RunEntry>,
    digests: Vec<u8>,
    blocks: u64,
}

impl Body {
    fn push_zeros(&mut self, count: u64) {
        self.extend(count, None);
    }

    /// Start (or extend) a data run of `count` blocks whose digests the
    /// caller has appended to, or will append to, `digests`.
    fn open_data(&mut self, count: u64, at: usize) {
        self.extend(count, Some(at));
    }

    /// Add `count` blocks of a kind (`data`: where their digests start),
    /// merged into the last run when it is of the same kind.
    fn extend(&mut self, count: u64, data: Option<usize>) {
        if count == 0 {
            return;
        }
        match self.runs.last_mut() {
            Some(r) if r.data.is_some() == data.is_some() => r.count += count,
            _ => self.runs.push(RunEntry {
                first: self.blocks,
                count,
                data,
            }),
        }
        self.blocks += count;
    }

    /// Append blocks `from..to` of `src` (whose digests are `len` bytes
    /// each), a run at a time.
    fn copy(&mut self, src: &Body, len: usize, from: u64, to: u64) {
        let mut at = from;
        while at < to.min(src.blocks) {
            let r = &src.runs[src.runs.partition_point(|r| r.first <= at) - 1];
            let end = (r.first + r.count).min(to);
            let count = end - at;
            match r.data {
                None => self.push_zeros(count),
                Some(first) => {
                    let skip = first + (at - r.first) as usize * len;
                    let start = self.digests.len();
                    (self.digests)
                        .extend_from_slice(&src.digests[skip..skip + count as usize * len]);
                    self.open_data(count, start);
                }
            }
            at = end;
        }
    }

    /// The run that holds block `index` (digests `len` bytes each).
    fn run_at(&self, index: u64, len: usize) -> Option<Run<'_>> {
        if index >= self.blocks {
            return None;
        }
        let r = &self.runs[self.runs.partition_point(|r| r.first <= index) - 1];
        Some(Run {
            first: r.first,
            count: r.count,
            digests: r
                .data
                .map(|at| &self.digests[at..at + r.count as usize * len]),
        })
    }

    fn push_data(&mut self, digest: &[u8]) {
        let at = self.digests.len();
        self.digests.extend_from_slice(digest);
        self.open_data(1, at);
    }
}

/// The block digests of an image, its size and its checksum, and what
/// its writer recorded of the input it read (its identity, if any).
///
/// Two maps are equal if they describe the same content with the same
/// digest and block size, whatever identity each carries.
#[derive(Clone, Debug)]
pub struct Map {
    algorithm: Algorithm,
    block_size: usize,
    size: u64,
    checksum: Checksum,
    zero_digest: Vec<u8>,
    body: Body,
    identity: Option<Vec<u8>>,
}

impl PartialEq for Map {
    fn eq(&self, other: &Map) -> bool {
        (
            self.algorithm,
            self.block_size,
            self.size,
            &self.checksum,
            &self.body,
        ) == (
            other.algorithm,
            other.block_size,
            other.size,
            &other.checksum,
            &other.body,
        )
    }
}

impl Eq for Map {}

/// Check a digest and block size can make a map.
fn check_params(algorithm: Algorithm, block_size: usize) -> Result<(), MapError> {
    if algorithm.output_len() == 0 {
        return Err(MapError::Invalid(format!(
            "digest {algorithm} computes no block digests"
        )));
    }
    if !(MIN_BLOCK_SIZE..=MAX_BLOCK_SIZE).contains(&block_size) || !block_size.is_multiple_of(512) {
        return Err(MapError::Invalid(format!(
            "block size {block_size} is not a multiple of 512 from {MIN_BLOCK_SIZE} to {MAX_BLOCK_SIZE}"
        )));
    }
    Ok(())
}

impl Map {
    /// Assemble and check a map: the runs cover exactly the blocks of
    /// `size`, a short last block is data, and the checksum derived from the
    /// blocks is `checksum`.
    fn assemble(
        algorithm: Algorithm,
        block_size: usize,
        size: u64,
        checksum: Checksum,
        body: Body,
    ) -> Result<Map, MapError> {
        check_params(algorithm, block_size)?;
        let blocks = size.div_ceil(block_size as u64);
        if body.blocks != blocks {
            return Err(MapError::Invalid(format!(
                "{} blocks for a size of {size} bytes in {block_size}-byte blocks ({blocks} blocks)",
                body.blocks
            )));
        }
        if !size.is_multiple_of(block_size as u64)
            && body.runs.last().is_some_and(|r| r.data.is_none())
        {
            return Err(MapError::Invalid(
                "the short last block is marked as a zero block".into(),
            ));
        }
        if checksum.algorithm() != algorithm {
            return Err(MapError::Invalid("a checksum of another digest".into()));
        }
        let construction = checksum.construction();
        let mut map = Map {
            algorithm,
            block_size,
            size,
            checksum,
            zero_digest: zero_digest(algorithm, block_size),
            body,
            identity: None,
        };
        if map.derive_checksum_with(construction) != map.checksum {
            return Err(MapError::Checksum);
        }
        // A map keeps blkhash 0.11's checksum, whatever the hasher's
        // construction: the others follow from the same block digests.
        if construction != Construction::Blkhash {
            map.checksum = map.derive_checksum();
        }
        Ok(map)
    }

    /// The map of `data`, hashed with `opts` (for tests and small inputs;
    /// images go through a [`MapBuilder`]).
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// use blkmap::{Block, Map};
    /// let opts = Options::new().block_size(512);
    /// let mut data = vec![0u8; 2048];
    /// data[1024] = 1;
    /// let map = Map::compute(opts.clone(), &data).unwrap();
    /// assert_eq!(map.blocks(), 4);
    /// assert_eq!(map.block(0), Some(Block::Zero));
    /// assert!(matches!(map.block(2), Some(Block::Data(_))));
    /// let mut h = Hasher::with_options(opts).unwrap();
    /// h.update(&data);
    /// assert_eq!(map.checksum(), &h.finalize());
    /// ```
    pub fn compute(opts: blkhash::Options, data: &[u8]) -> Result<Map, MapError> {
        let mut h =
            blkhash::Hasher::with_options(opts).map_err(|e| MapError::Invalid(e.to_string()))?;
        let builder = MapBuilder::attach(&mut h)?;
        h.update(data);
        Ok(builder.finalize(h)?)
    }

    /// The digest of blocks and checksum.
    pub fn algorithm(&self) -> Algorithm {
        self.algorithm
    }

    /// The block size in bytes.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The image's guest-visible size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The number of blocks: the size divided by the block size, rounded up.
    pub fn blocks(&self) -> u64 {
        self.body.blocks
    }

    /// The image checksum (checked against the block digests when the map
    /// was built or loaded).
    pub fn checksum(&self) -> &Checksum {
        &self.checksum
    }

    /// The digest of a full block of zeros, for this digest and block size.
    pub fn zero_digest(&self) -> &[u8] {
        &self.zero_digest
    }

    /// Blocks holding data (with a digest each).
    pub fn data_blocks(&self) -> u64 {
        (self.body.digests.len() / self.algorithm.output_len()) as u64
    }

    /// Blocks that read as zeros.
    pub fn zero_blocks(&self) -> u64 {
        self.blocks() - self.data_blocks()
    }

    /// The runs of blocks, in order.
    pub fn runs(&self) -> impl Iterator<Item = Run<'_>> + '_ {
        self.body.runs.iter().map(|r| self.run(r))
    }

    fn run(&self, r: &RunEntry) -> Run<'_> {
        let len = self.algorithm.output_len();
        Run {
            first: r.first,
            count: r.count,
            digests: r
                .data
                .map(|at| &self.body.digests[at..at + r.count as usize * len]),
        }
    }

    /// Block `index`, or `None` past the end.
    pub fn block(&self, index: u64) -> Option<Block<'_>> {
        let r = self.run_at(index)?;
        Some(match r.digests {
            None => Block::Zero,
            Some(d) => {
                let len = self.algorithm.output_len();
                let start = (index - r.first) as usize * len;
                Block::Data(&d[start..start + len])
            }
        })
    }

    /// The run that holds block `index`, or `None` past the end: a walk
    /// over a range of blocks takes one look-up per run, not per block.
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// use blkmap::MapBuilder;
    /// let mut h = Hasher::with_options(Options::new().block_size(512)).unwrap();
    /// let builder = MapBuilder::attach(&mut h).unwrap();
    /// h.update(&[1u8; 1024]);
    /// h.update_zeros(1 << 20);
    /// let map = builder.finalize(h).unwrap();
    /// let zeros = map.run_at(5).unwrap();
    /// assert_eq!((zeros.first, zeros.count, zeros.digests), (2, 2048, None));
    /// assert_eq!(map.run_at(1).unwrap().digests.map(<[u8]>::len), Some(64));
    /// assert!(map.run_at(2050).is_none());
    /// ```
    pub fn run_at(&self, index: u64) -> Option<Run<'_>> {
        if index >= self.blocks() {
            return None;
        }
        let i = self.body.runs.partition_point(|r| r.first <= index) - 1;
        Some(self.run(&self.body.runs[i]))
    }

    /// The digest of block `index` (the zero-block digest for a zero block).
    pub fn block_digest(&self, index: u64) -> Option<&[u8]> {
        self.block(index).map(|b| match b {
            Block::Zero => &self.zero_digest[..],
            Block::Data(d) => d,
        })
    }

    /// The map of an image that differs from this map's only in the blocks
    /// `ranges` (block indexes, in order, not overlapping), whose blocks
    /// are `fresh`'s there: every other block is this map's. `fresh` is a
    /// map of the same digest, block size and size (what its blocks hold
    /// outside `ranges` does not matter). The checksum is derived anew.
    ///
    /// ```
    /// use blkhash::Options;
    /// use blkmap::Map;
    /// let opts = Options::new().block_size(512);
    /// let old = vec![1u8; 4096];
    /// let mut new = old.clone();
    /// new[1024..1536].fill(0);
    /// new[3584] = 9;
    /// let old_map = Map::compute(opts.clone(), &old).unwrap();
    /// let new_map = Map::compute(opts, &new).unwrap();
    /// let spliced = old_map.splice(&new_map, &[2..3, 7..8]).unwrap();
    /// assert_eq!(spliced, new_map);
    /// ```
    pub fn splice(&self, fresh: &Map, ranges: &[std::ops::Range<u64>]) -> Result<Map, MapError> {
        let whole = Range {
            offset: 0,
            len: fresh.size,
        };
        let theirs = (fresh.algorithm, fresh.block_size, fresh.size, whole);
        self.splice_body(theirs, &fresh.body, ranges)
    }

    /// [`Map::splice`] with the blocks of `fresh`, a part that covers the
    /// whole image (as [`MapBuilder::finish_part`] makes it of a hasher
    /// given every byte): no checksum of its own to derive and check, the
    /// cheaper way when most of its blocks are thrown away.
    ///
    /// ```
    /// use blkhash::{Hasher, Options};
    /// use blkmap::{Map, MapBuilder};
    /// let opts = Options::new().block_size(512);
    /// let old = vec![1u8; 4096];
    /// let mut new = old.clone();
    /// new[100] = 7;
    /// let mut h = Hasher::with_options(opts.clone()).unwrap();
    /// let builder = MapBuilder::attach(&mut h).unwrap();
    /// h.update(&new);
    /// let fresh = builder.finalize_part(h, 4096, 0).unwrap();
    /// let old_map = Map::compute(opts.clone(), &old).unwrap();
    /// let spliced = old_map.splice_part(&fresh, &[0..1]).unwrap();
    /// assert_eq!(spliced, Map::compute(opts, &new).unwrap());
    /// ```
    pub fn splice_part(
        &self,
        fresh: &Part,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Map, MapError> {
        let h = &fresh.header;
        let theirs = (h.algorithm, h.block_size, h.size, h.range);
        self.splice_body(theirs, &fresh.body, ranges)
    }

    fn splice_body(
        &self,
        (algorithm, block_size, size, range): (Algorithm, usize, u64, Range),
        fresh: &Body,
        ranges: &[std::ops::Range<u64>],
    ) -> Result<Map, MapError> {
        let whole = Range {
            offset: 0,
            len: self.size,
        };
        if (algorithm, block_size, size, range)
            != (self.algorithm, self.block_size, self.size, whole)
        {
            return Err(MapError::Invalid(format!(
                "blocks {}+{} of an image of {size} bytes in {block_size}-byte {algorithm} blocks \
                 spliced into a map of {} bytes in {}-byte {} blocks",
                range.offset, range.len, self.size, self.block_size, self.algorithm
            )));
        }
        let (blocks, len) = (self.blocks(), self.algorithm.output_len());
        let mut body = Body::default();
        let mut at = 0;
        for r in ranges {
            let (start, end) = (r.start.min(blocks), r.end.min(blocks));
            if start < at || end < start {
                return Err(MapError::Invalid(
                    "block ranges to splice out of order or overlapping".into(),
                ));
            }
            body.copy(&self.body, len, at, start);
            body.copy(fresh, len, start, end);
            at = end;
        }
        body.copy(&self.body, len, at, blocks);
        // Both were checked when they were made: runs of whole blocks, a
        // short last block as data. The checksum is derived once (not
        // derived again to check it, as assemble would: the outer digest
        // of every block digest is a good part of an update's time).
        let mut map = Map {
            algorithm: self.algorithm,
            block_size: self.block_size,
            size: self.size,
            checksum: self.checksum.clone(),
            zero_digest: self.zero_digest.clone(),
            body,
            identity: None,
        };
        map.checksum = map.derive_checksum();
        Ok(map)
    }

    /// What the map's writer recorded of the input it read (the files an
    /// image read, or the export it was: see `blkjob::record`), as bytes
    /// blkmap only keeps; `None` for a map written without one.
    pub fn identity(&self) -> Option<&[u8]> {
        self.identity.as_deref()
    }

    /// The map with `identity` recorded (at most
    /// [`MAX_IDENTITY`] bytes), or none.
    ///
    /// ```
    /// use blkmap::Map;
    /// let map = Map::compute(blkhash::Options::new().block_size(512), &[1; 512]).unwrap();
    /// let kept = map.clone().with_identity(Some(b"disk.qcow2".to_vec())).unwrap();
    /// let again = Map::from_bytes(&kept.to_bytes()).unwrap();
    /// assert_eq!(again.identity(), Some(&b"disk.qcow2"[..]));
    /// // Equal maps: the same content, whatever identity each carries.
    /// assert_eq!(again, map);
    /// ```
    pub fn with_identity(mut self, identity: Option<Vec<u8>>) -> Result<Map, MapError> {
        if identity
            .as_ref()
            .is_some_and(|i| i.len() > crate::MAX_IDENTITY)
        {
            return Err(MapError::Invalid(format!(
                "an identity record over {} bytes",
                crate::MAX_IDENTITY
            )));
        }
        self.identity = identity;
        Ok(self)
    }

    /// The image checksum computed from the map alone: the outer digest of
    /// every block digest (the zero-block digest for zero blocks) and the
    /// size as a little-endian u64, as the construction defines it.
    ///
    /// The cost is the outer digest's: about `size / block_size` digests
    /// hashed, zero blocks included, with no block read.
    pub fn derive_checksum(&self) -> Checksum {
        self.derive_checksum_with(Construction::Blkhash)
    }

    /// The image checksum in `construction`, from the map alone (a map
    /// keeps blkhash 0.11's; oVirt imageio's and PBS's `index_csum` are the
    /// same outer digest without the size).
    ///
    /// ```
    /// use blkhash::{checksum_with, Algorithm, Construction, Options};
    /// use blkmap::Map;
    /// let data = vec![5u8; 10_000];
    /// let map = Map::compute(Options::new().block_size(4096), &data).unwrap();
    /// let c = Construction::Imageio;
    /// assert_eq!(map.derive_checksum_with(c), checksum_with(c, Algorithm::Sha256, 4096, &data));
    /// ```
    pub fn derive_checksum_with(&self, construction: Construction) -> Checksum {
        let mut outer = Outer::new(self.algorithm, &self.zero_digest);
        for run in self.runs() {
            match run.digests {
                Some(d) => outer.data(d),
                None => outer.zeros(run.count),
            }
        }
        outer.checksum_with(construction, self.size)
    }

    /// The image checksum in `construction`: the saved one for blkhash
    /// 0.11's, else derived from the block digests.
    pub fn checksum_in(&self, construction: Construction) -> Checksum {
        match construction {
            Construction::Blkhash => self.checksum.clone(),
            c => self.derive_checksum_with(c),
        }
    }
}
