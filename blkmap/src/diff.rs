//! Where two maps differ.

use crate::format::{Header, Piece};
use crate::stream::{Blocks, Pieces};
use crate::{Map, MapError, zero_digest};
use std::fmt;

/// A guest byte range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    /// The first byte's guest offset.
    pub offset: u64,
    /// Bytes in the range.
    pub len: u64,
}

impl Range {
    /// The offset just past the range.
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

impl fmt::Display for Range {
    /// `OFFSET+LENGTH`, in bytes.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}+{}", self.offset, self.len)
    }
}

/// Maps that cannot be compared.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mismatch {
    /// The two maps' digest names.
    Digest(String, String),
    /// The two maps' block sizes.
    BlockSize(usize, usize),
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Digest(a, b) => write!(f, "maps of different digests: {a} and {b}"),
            Mismatch::BlockSize(a, b) => {
                write!(f, "maps of different block sizes: {a} and {b}")
            }
        }
    }
}

impl std::error::Error for Mismatch {}

/// How a difference in size counts: the one rule of this crate for an
/// image compared with a larger one (a disk grown past its source, as CDI
/// grows a PVC after `qemu-img convert`), as `qemu-img compare` has it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SizeRule {
    /// The larger image's rest ([`Diff::tail`]) is compared with zeros:
    /// images whose common part is the same and whose tail reads as zeros
    /// (holes or written zeros) hold the same content, as `qemu-img
    /// compare` says of them without `-s`.
    #[default]
    ZeroTail,
    /// Any difference in size is a difference (`qemu-img compare -s`).
    Strict,
}

/// How two images differ.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diff {
    /// Differing ranges within the size both have, in order, adjacent
    /// differing blocks merged into one range.
    pub ranges: Vec<Range>,
    /// The first image's size.
    pub size_a: u64,
    /// The second image's size.
    pub size_b: u64,
    /// The offset of the first block of the [`tail`](Diff::tail) that does
    /// not read as zeros; `None` if the tail is all zeros (or there is no
    /// tail).
    pub tail_data: Option<u64>,
}

impl Diff {
    /// True if the images have the same size and content (the
    /// [`SizeRule::Strict`] verdict).
    pub fn is_same(&self) -> bool {
        self.same(SizeRule::Strict)
    }

    /// True if the images hold the same content under `rule`: no differing
    /// range, and the same size ([`SizeRule::Strict`]) or a tail of zeros
    /// ([`SizeRule::ZeroTail`]).
    ///
    /// ```
    /// use blkhash::Options;
    /// use blkmap::{Map, SizeRule, diff};
    /// let opts = Options::new().block_size(512);
    /// let source = Map::compute(opts.clone(), &[7u8; 1024]).unwrap();
    /// let mut grown = vec![7u8; 1024];
    /// grown.resize(4096, 0);
    /// let d = diff(&source, &Map::compute(opts, &grown).unwrap()).unwrap();
    /// assert!(d.same(SizeRule::ZeroTail));
    /// assert!(!d.same(SizeRule::Strict));
    /// assert_eq!(d.tail_data, None);
    /// ```
    pub fn same(&self, rule: SizeRule) -> bool {
        self.ranges.is_empty() && self.counted_tail(rule).is_none()
    }

    /// The [`tail`](Diff::tail) if it counts as a difference under `rule`:
    /// always with [`SizeRule::Strict`], only if it holds data with
    /// [`SizeRule::ZeroTail`].
    pub fn counted_tail(&self, rule: SizeRule) -> Option<Range> {
        self.tail()
            .filter(|_| rule == SizeRule::Strict || self.tail_data.is_some())
    }

    /// Bytes that differ under `rule`: the differing ranges and the
    /// [`counted_tail`](Diff::counted_tail).
    pub fn differing_bytes_under(&self, rule: SizeRule) -> u64 {
        self.ranges.iter().map(|r| r.len).sum::<u64>()
            + self.counted_tail(rule).map_or(0, |t| t.len)
    }

    /// The range only the larger image has, if the sizes differ.
    pub fn tail(&self) -> Option<Range> {
        let (lo, hi) = (self.size_a.min(self.size_b), self.size_a.max(self.size_b));
        (lo != hi).then_some(Range {
            offset: lo,
            len: hi - lo,
        })
    }

    /// Bytes in differing ranges, the tail included.
    pub fn differing_bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum::<u64>() + self.tail().map_or(0, |t| t.len)
    }
}

/// Where the images of maps `a` and `b` differ, block by block.
///
/// A hole and written zeros are the same content. Within the size both
/// have, each differing block is a differing range (clipped to that size);
/// if the sizes differ, the rest of the larger image is the
/// [`tail`](Diff::tail), whose blocks are compared with zeros
/// ([`Diff::tail_data`]; whether that counts is a [`SizeRule`]). When the
/// smaller size is not a multiple of the block size, its short last block
/// cannot be compared with the larger image's full block by digest, and is
/// reported as differing: a block size that divides the smaller size
/// compares it.
///
/// ```
/// use blkhash::Options;
/// use blkmap::{Map, Range, diff};
/// let opts = Options::new().block_size(512);
/// let a = vec![0u8; 4096];
/// let mut b = a.clone();
/// b[600] = 1;
/// b[1100] = 1;
/// let d = diff(&Map::compute(opts.clone(), &a).unwrap(), &Map::compute(opts, &b).unwrap()).unwrap();
/// assert_eq!(d.ranges, [Range { offset: 512, len: 1024 }]);
/// assert!(!d.is_same());
/// ```
pub fn diff(a: &Map, b: &Map) -> Result<Diff, Mismatch> {
    mismatch(&a.header(), &b.header())?;
    // Maps in memory read without error: only a mismatch can fail.
    diff_pieces(a.pieces(), b.pieces()).map_err(|e| match e {
        MapError::Mismatch(m) => m,
        other => unreachable!("a map in memory failed to read: {other}"),
    })
}

/// Why maps of `a` and `b` cannot be compared, if they cannot.
fn mismatch(a: &Header, b: &Header) -> Result<(), Mismatch> {
    if a.algorithm != b.algorithm {
        return Err(Mismatch::Digest(
            a.algorithm.name().into(),
            b.algorithm.name().into(),
        ));
    }
    if a.block_size != b.block_size {
        return Err(Mismatch::BlockSize(a.block_size, b.block_size));
    }
    Ok(())
}

/// [`diff`] of two map-like sources read as streams, each read to its end
/// (so that its checks are made: give a saved map as a
/// [`Checked`](crate::Checked) [`MapReader`](crate::MapReader) to have
/// every check of a load). Memory: a piece of each, and the ranges found.
///
/// ```
/// use blkhash::Options;
/// use blkmap::{Checked, Map, MapReader, Range, diff_pieces};
/// let opts = Options::new().block_size(512);
/// let a = Map::compute(opts.clone(), &[1u8; 2048]).unwrap();
/// let mut b = vec![1u8; 2048];
/// b[1000] = 0;
/// let b = Map::compute(opts, &b).unwrap().to_bytes();
/// let saved = Checked::new(MapReader::new(&b[..]).unwrap());
/// let d = diff_pieces(a.pieces(), saved).unwrap();
/// assert_eq!(d.ranges, [Range { offset: 512, len: 512 }]);
/// ```
pub fn diff_pieces(a: impl Pieces, b: impl Pieces) -> Result<Diff, MapError> {
    mismatch(a.header(), b.header()).map_err(MapError::Mismatch)?;
    let (mut a, mut b) = (Blocks::new(a), Blocks::new(b));
    let (ha, hb) = (a.header(), b.header());
    let (size_a, size_b) = (ha.size, hb.size);
    for h in [ha, hb] {
        h.whole()?;
    }
    let bs = ha.block_size as u64;
    let len = ha.algorithm.output_len();
    let zero = zero_digest(ha.algorithm, ha.block_size);
    let common = size_a.min(size_b);
    let blocks = common.div_ceil(bs);
    let mut ranges: Vec<Range> = Vec::new();
    let mut mark = |block: u64| {
        let offset = block * bs;
        let end = ((block + 1) * bs).min(common);
        match ranges.last_mut() {
            Some(r) if r.end() == offset => r.len = end - r.offset,
            _ => ranges.push(Range {
                offset,
                len: end - offset,
            }),
        }
    };
    let mut pos = 0u64;
    while pos < blocks {
        let (Some((_, na)), Some((_, nb))) = (a.ready()?, b.ready()?) else {
            break;
        };
        let n = na.min(nb).min(blocks - pos);
        match (a.take(n), b.take(n)) {
            (Piece::Zeros(_), Piece::Zeros(_)) => {}
            (x, y) => {
                for i in 0..n as usize {
                    if digest(x, i, len, &zero) != digest(y, i, len, &zero) {
                        mark(pos + i as u64);
                    }
                }
            }
        }
        pos += n;
    }
    // The larger one's rest, compared with zeros; the smaller one read to
    // its end for its checks.
    let tail_data = if size_a > size_b {
        first_data(&mut a, pos, bs, size_a)?
    } else {
        first_data(&mut b, pos, bs, size_b)?
    };
    a.drain()?;
    b.drain()?;
    Ok(Diff {
        ranges,
        size_a,
        size_b,
        tail_data,
    })
}

/// The offset of the first block from block `pos` on that does not read
/// as zeros, in a source of `size` bytes and blocks of `bs`: a zero run, or
/// a digest of a block of zeros (a full block's, or the short last
/// block's).
fn first_data<P: Pieces>(
    blocks: &mut Blocks<P>,
    mut pos: u64,
    bs: u64,
    size: u64,
) -> Result<Option<u64>, MapError> {
    let h = blocks.header();
    let (algorithm, len) = (h.algorithm, h.algorithm.output_len());
    let zero = zero_digest(algorithm, h.block_size);
    let short = (!size.is_multiple_of(bs)).then(|| algorithm.digest_zeros((size % bs) as usize));
    let last = size.div_ceil(bs).saturating_sub(1);
    while let Some((_, n)) = blocks.ready()? {
        if let Piece::Data(d) = blocks.take(n) {
            for (i, got) in d.chunks(len).enumerate() {
                let block = pos + i as u64;
                let want = match &short {
                    Some(short) if block == last => short,
                    _ => &zero,
                };
                if got != &want[..] {
                    return Ok(Some(block * bs));
                }
            }
        }
        pos += n;
    }
    Ok(None)
}

/// The digest of block `i` of a piece (digests `len` bytes each).
fn digest<'a>(p: Piece<'a>, i: usize, len: usize, zero: &'a [u8]) -> &'a [u8] {
    match p {
        Piece::Data(d) => &d[i * len..][..len],
        Piece::Zeros(_) => zero,
    }
}
