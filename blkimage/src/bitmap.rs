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
    /// within the image's size. Exactly the bitmap's, unless it is split
    /// into more than [`MAX_DIRTY_RANGES`] pieces: then the ranges are
    /// widened and merged until they are at most half that many, so they
    /// cover every dirty byte and some clean ones (hashed again, which is
    /// safe), and memory stays bounded whatever a file or server holds.
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
        self.clone().into_blocks(block_size)
    }

    /// [`Dirty::blocks`], in the memory of the ranges (no second list: a
    /// bitmap's ranges may be [`MAX_DIRTY_RANGES`] long).
    pub fn into_blocks(self, block_size: usize) -> Vec<Range<u64>> {
        let bs = block_size as u64;
        let mut v = self.ranges;
        for r in v.iter_mut() {
            *r = r.start / bs..r.end.div_ceil(bs);
        }
        merge_in_place(&mut v);
        v
    }

    /// Bytes the bitmap marks dirty.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.end - r.start).sum()
    }
}

/// The most ranges a [`Dirty`] holds (16 MiB of them: an update keeps a
/// few lists of this length at once, the dirty blocks, the blocks to read
/// and their byte ranges, so all of them stay under 64 MiB). A bitmap of
/// a TiB at QEMU's default 64 KiB granularity has 2^24 granules, so a
/// real one reaches this only when more than a sixteenth of them are
/// dirty runs of their own (64 GiB dirty, every dirty granule between
/// clean ones); a hostile image or server reaches it at will.
pub const MAX_DIRTY_RANGES: usize = 1 << 20;

/// Dirty byte ranges collected in order (each starting at or after the end
/// of the last), merged as they come, held to a bounded count: past the
/// limit every range is widened to a grain that doubles until at most half
/// the limit remain (a superset of the dirty bytes: never a dirty byte
/// lost, so never an old digest taken for a changed block).
pub(crate) struct RangeBuilder {
    out: Vec<Range<u64>>,
    size: u64,
    limit: usize,
    /// Ranges are widened to multiples of this (1: as given).
    grain: u64,
}

impl RangeBuilder {
    /// Ranges of an image of `size` bytes.
    pub(crate) fn new(size: u64) -> RangeBuilder {
        RangeBuilder::with_limit(size, MAX_DIRTY_RANGES)
    }

    fn with_limit(size: u64, limit: usize) -> RangeBuilder {
        RangeBuilder {
            out: Vec::new(),
            size,
            limit: limit.max(2),
            grain: 1,
        }
    }

    /// Bytes `start..end` are dirty (`start < end <= size`).
    pub(crate) fn push(&mut self, start: u64, end: u64) {
        let (start, end) = self.widen(start, end);
        append(&mut self.out, start..end);
        // At the limit, not past it: the list never grows beyond `limit`
        // (a power of two, so its capacity is the limit too).
        if self.out.len() >= self.limit {
            self.coarsen();
        }
    }

    fn widen(&self, start: u64, end: u64) -> (u64, u64) {
        widen_to((self.grain, self.size), start, end)
    }

    /// Double the grain and merge again until at most half the limit
    /// remain. Ranges widened to a grain G that still stand apart have a
    /// whole clean grain between them, so at most size / 2G + 1 remain:
    /// this ends.
    fn coarsen(&mut self) {
        while self.out.len() > self.limit / 2 {
            self.grain = self.grain.saturating_mul(2);
            let g = (self.grain, self.size);
            for r in self.out.iter_mut() {
                let (start, end) = widen_to(g, r.start, r.end);
                *r = start..end;
            }
            merge_in_place(&mut self.out);
        }
    }

    pub(crate) fn finish(self) -> Vec<Range<u64>> {
        self.out
    }
}

/// `start..end` widened to multiples of `grain`, within `size`.
fn widen_to((grain, size): (u64, u64), start: u64, end: u64) -> (u64, u64) {
    let start = start / grain * grain;
    // Saturating: a grain near 2^63 times a quotient of 2 overflows.
    (start, end.div_ceil(grain).saturating_mul(grain).min(size))
}

/// Merge ranges in order (each starting at or after the last's start)
/// that touch or overlap, in place.
fn merge_in_place(v: &mut Vec<Range<u64>>) {
    let mut w = 0;
    for i in 0..v.len() {
        let r = v[i].clone();
        if w > 0 && v[w - 1].end >= r.start {
            v[w - 1].end = v[w - 1].end.max(r.end);
        } else {
            v[w] = r;
            w += 1;
        }
    }
    v.truncate(w);
}

/// Append `r` to ranges in order, merged with the last when they touch or
/// overlap (`r` starts at or after the last's start).
fn append(out: &mut Vec<Range<u64>>, r: Range<u64>) {
    match out.last_mut() {
        Some(last) if last.end >= r.start => last.end = last.end.max(r.end),
        _ => out.push(r),
    }
}

/// The error for a source that has no dirty bitmaps (a raw file, a pipe).
pub(crate) fn unsupported(format: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("a {format} image has no dirty bitmaps (qcow2 images and NBD exports have)"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(ranges: &[Range<u64>], r: &Range<u64>) -> bool {
        ranges.iter().any(|o| o.start <= r.start && r.end <= o.end)
    }

    #[test]
    fn ranges_under_the_limit_are_kept_exactly() {
        let mut b = RangeBuilder::with_limit(1 << 20, 8);
        for r in [0..512, 512..1024, 4096..4608, 8192..9000] {
            b.push(r.start, r.end);
        }
        assert_eq!(b.finish(), vec![0..1024, 4096..4608, 8192..9000]);
    }

    #[test]
    fn past_the_limit_ranges_widen_and_still_cover_every_dirty_byte() {
        // Every other 512-byte granule of 64 MiB dirty: 65536 runs.
        let size = 64 << 20;
        let limit = 1000;
        let mut b = RangeBuilder::with_limit(size, limit);
        let dirty: Vec<Range<u64>> = (0..size / 1024).map(|i| i * 1024..i * 1024 + 512).collect();
        for r in &dirty {
            b.push(r.start, r.end);
            assert!(b.out.len() <= limit, "{} ranges held", b.out.len());
        }
        let got = b.finish();
        assert!(got.len() <= limit / 2 + 1, "{}", got.len());
        assert!(dirty.iter().all(|r| covers(&got, r)));
        assert!(got.windows(2).all(|w| w[0].end < w[1].start));
        assert!(got.iter().all(|r| r.start < r.end && r.end <= size));
    }

    #[test]
    fn a_huge_image_of_scattered_runs_stays_bounded() {
        // One dirty byte every 2^40 bytes of a 2^62-byte image (a server
        // may claim any size): the grain grows far, nothing overflows.
        let size = 1u64 << 62;
        let mut b = RangeBuilder::with_limit(size, 64);
        let mut n = 0u64;
        while n < size >> 40 {
            let at = n << 40;
            b.push(at, at + 1);
            n += 1;
        }
        b.push(size - 1, size);
        let got = b.finish();
        assert!(got.len() <= 33, "{}", got.len());
        assert_eq!(got.last().unwrap().end, size);
        assert!(covers(&got, &(0..1)) && covers(&got, &(size - 1..size)));
    }
}
