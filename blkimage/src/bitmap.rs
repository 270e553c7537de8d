//! Dirty bitmaps: which guest ranges were written since a point in time,
//! as QEMU records them (persistent in a qcow2 image, or exported over NBD
//! as the `qemu:dirty-bitmap:NAME` metadata context).

use std::io;
use std::ops::Range;

/// A dirty bitmap an image or export offers, as far as the source says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BitmapInfo {
    /// The bitmap's name.
    pub name: String,
    /// Bytes per bit; `None` when the source does not say (an NBD export).
    pub granularity: Option<u64>,
    /// QEMU's in-use flag: the image was not closed cleanly after the
    /// bitmap was loaded for writing, so it may miss writes (QEMU calls it
    /// inconsistent). `None` when the source does not say.
    pub in_use: Option<bool>,
    /// QEMU's auto flag: the bitmap records new writes. A disabled bitmap
    /// stopped recording when it was disabled. `None` when not known.
    pub enabled: Option<bool>,
}

/// The guest ranges a bitmap marks dirty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Dirty {
    /// The bitmap they come from.
    pub bitmap: BitmapInfo,
    /// Byte ranges in order, non-empty, neither overlapping nor adjacent,
    /// within the image's size.
    pub ranges: Vec<Range<u64>>,
}

impl Dirty {
    /// The dirty ranges widened to whole blocks of `block_size` (a block is
    /// dirty when any byte of it is), merged, in block indices.
    ///
    /// ```
    /// use blkimage::{BitmapInfo, Dirty};
    /// let bitmap = BitmapInfo { name: "b".into(), granularity: Some(512), in_use: None, enabled: None };
    /// let d = Dirty { bitmap, ranges: vec![0..512, 4096..4608, 8192..9216] };
    /// assert_eq!(d.blocks(4096), vec![0..3]);
    /// assert_eq!(d.blocks(1024), vec![0..1, 4..5, 8..9]);
    /// ```
    pub fn blocks(&self, block_size: usize) -> Vec<Range<u64>> {
        let bs = block_size as u64;
        let mut out: Vec<Range<u64>> = Vec::new();
        for r in &self.ranges {
            let (first, end) = (r.start / bs, r.end.div_ceil(bs));
            match out.last_mut() {
                Some(last) if last.end >= first => last.end = last.end.max(end),
                _ => out.push(first..end),
            }
        }
        out
    }

    /// Bytes the bitmap marks dirty.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }
}

/// The error for a source that has no dirty bitmaps (a raw file, a pipe).
pub(crate) fn unsupported(format: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("a {format} image has no dirty bitmaps (qcow2 images and NBD exports have)"),
    )
}
