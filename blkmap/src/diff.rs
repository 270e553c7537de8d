//! Where two maps differ.

use crate::{Map, Run};
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
}

impl Diff {
    /// True if the images have the same size and content.
    pub fn is_same(&self) -> bool {
        self.ranges.is_empty() && self.size_a == self.size_b
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
/// [`tail`](Diff::tail). When the smaller size is not a multiple of the
/// block size, its short last block cannot be compared with the larger
/// image's full block by digest, and is reported as differing.
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
    if a.algorithm != b.algorithm {
        return Err(Mismatch::Digest(
            a.algorithm.name().into(),
            b.algorithm.name().into(),
        ));
    }
    if a.block_size != b.block_size {
        return Err(Mismatch::BlockSize(a.block_size, b.block_size));
    }
    let bs = a.block_size as u64;
    let len = a.algorithm.output_len();
    let common = a.size.min(b.size);
    let blocks = common.div_ceil(bs);
    let zero = &a.zero_digest[..];
    let mut ranges: Vec<Range> = Vec::new();
    let mut mark = |block: u64, count: u64| {
        let offset = block * bs;
        let end = ((block + count) * bs).min(common);
        match ranges.last_mut() {
            Some(r) if r.end() == offset => r.len = end - r.offset,
            _ => ranges.push(Range {
                offset,
                len: end - offset,
            }),
        }
    };
    let mut ra = a.runs().peekable();
    let mut rb = b.runs().peekable();
    let mut pos = 0u64;
    // The digest of block `i` of a run.
    fn digest<'a>(r: &Run<'a>, i: u64, len: usize, zero: &'a [u8]) -> &'a [u8] {
        match r.digests {
            Some(d) => &d[(i - r.first) as usize * len..][..len],
            None => zero,
        }
    }
    while pos < blocks {
        let (Some(x), Some(y)) = (ra.peek().copied(), rb.peek().copied()) else {
            break;
        };
        let end = (x.first + x.count).min(y.first + y.count).min(blocks);
        match (x.digests, y.digests) {
            (None, None) => {}
            (Some(dx), Some(dy)) => {
                for i in pos..end {
                    let ox = (i - x.first) as usize * len;
                    let oy = (i - y.first) as usize * len;
                    if dx[ox..ox + len] != dy[oy..oy + len] {
                        mark(i, 1);
                    }
                }
            }
            _ => {
                for i in pos..end {
                    if digest(&x, i, len, zero) != digest(&y, i, len, zero) {
                        mark(i, 1);
                    }
                }
            }
        }
        pos = end;
        if x.first + x.count == pos {
            ra.next();
        }
        if y.first + y.count == pos {
            rb.next();
        }
    }
    Ok(Diff {
        ranges,
        size_a: a.size,
        size_b: b.size,
    })
}
