//! An old map with some blocks replaced, written as a stream: what an
//! incremental update writes. One pass over the old map's pieces and the
//! new map's records; memory is a piece, the write buffer and the fresh
//! blocks.

use crate::Block;
use crate::format::{Header, Piece};
use crate::merge::placeholder;
use crate::stream::{Blocks, Pieces};
use crate::writer::{Output, RecordWriter};
use crate::{MapError, Outer, Part, Range, zero_digest};

/// Block indexes.
type BlockRange = std::ops::Range<u64>;

/// What to splice into an old map: the blocks `ranges` (block indexes, in
/// order, not overlapping) of `fresh`, a part covering the whole image
/// (what its blocks hold outside `ranges` does not matter); `compare`, a
/// subset of `ranges` whose fresh blocks are compared with the old ones
/// ([`Spliced::differ`]); `identity`, what the new map records of its
/// input.
pub struct Splice<'a> {
    /// The blocks that replace the old ones.
    pub fresh: &'a Part,
    /// Which blocks of `fresh` replace the old ones.
    pub ranges: &'a [BlockRange],
    /// Blocks among `ranges` to compare with the old map's.
    pub compare: &'a [BlockRange],
    /// The new map's identity record.
    pub identity: Option<Vec<u8>>,
}

/// A spliced map, written.
#[derive(Debug)]
pub struct Spliced {
    /// The new map's header, with its checksum.
    pub header: Header,
    /// Blocks of [`Splice::compare`] whose fresh digest is not the old one.
    pub differ: Vec<BlockRange>,
    /// The new map's data blocks.
    pub data_blocks: u64,
}

/// Write to `out` the map of `old` (a complete map, read to its end so
/// that its checks are made: give a saved map as a
/// [`Checked`](crate::Checked) reader, or one checked whole before as
/// [`MapFile::pieces_known_intact`](crate::MapFile::pieces_known_intact))
/// with the blocks `how.ranges` taken
/// from `how.fresh`; the checksum is derived anew. Byte for byte the map
/// [`Map::splice_part`](crate::Map::splice_part) gives, without either map
/// in memory.
///
/// ```
/// use blkhash::{Hasher, Options};
/// use blkmap::{Map, MapBuilder, Splice, splice};
/// let opts = Options::new().block_size(512);
/// let old = vec![1u8; 4096];
/// let mut new = old.clone();
/// new[100] = 7;
/// let mut h = Hasher::with_options(opts.clone()).unwrap();
/// let builder = MapBuilder::attach(&mut h).unwrap();
/// h.update(&new);
/// let fresh = builder.finalize_part(h, 4096, 0).unwrap();
/// let old_map = Map::compute(opts.clone(), &old).unwrap();
/// let how = Splice { fresh: &fresh, ranges: &[0..1], compare: &[], identity: None };
/// let (done, out) = splice(old_map.pieces(), how, std::io::Cursor::new(Vec::new())).unwrap();
/// let new_map = Map::compute(opts, &new).unwrap();
/// assert_eq!(done.header.checksum.as_ref(), Some(new_map.checksum()));
/// assert_eq!(out.into_inner(), new_map.to_bytes());
/// ```
pub fn splice<W: Output>(
    old: impl Pieces,
    how: Splice<'_>,
    out: W,
) -> Result<(Spliced, W), MapError> {
    let h = old.header().clone();
    check_fit(&h, how.fresh.header())?;
    let template = Header {
        checksum: Some(placeholder(h.algorithm)),
        identity: how.identity.clone(),
        ..h.clone()
    };
    let mut s = Splicer {
        old: Blocks::new(old),
        w: RecordWriter::new(out, &template)?,
        outer: Outer::new(h.algorithm, &zero_digest(h.algorithm, h.block_size)),
        differ: Vec::new(),
    };
    let blocks = h.blocks();
    let mut at = 0;
    for r in how.ranges {
        let (start, end) = (r.start.min(blocks), r.end.min(blocks));
        if start < at || end < start {
            return Err(MapError::Invalid(
                "block ranges to splice out of order or overlapping".into(),
            ));
        }
        s.copy_old(start - at)?;
        s.skip_old(start..end, how.fresh, how.compare)?;
        s.copy_fresh(how.fresh, start..end)?;
        at = end;
    }
    s.copy_old(blocks - at)?;
    s.old.drain()?;
    let header = Header {
        checksum: Some(s.outer.checksum(h.size)),
        ..template
    };
    let data_blocks = s.w.data_blocks();
    let out = s.w.finish(&header)?;
    let differ = s.differ;
    let done = Spliced {
        header,
        differ,
        data_blocks,
    };
    Ok((done, out))
}

/// Refuse an old map that is a part, or a fresh part of another image.
fn check_fit(old: &Header, fresh: &Header) -> Result<(), MapError> {
    old.whole()?;
    let whole = Range {
        offset: 0,
        len: old.size,
    };
    let theirs = (fresh.algorithm, fresh.block_size, fresh.size, fresh.range);
    if theirs != (old.algorithm, old.block_size, old.size, whole) {
        return Err(MapError::Invalid(format!(
            "blocks {}+{} of an image of {} bytes in {}-byte {} blocks \
             spliced into a map of {} bytes in {}-byte {} blocks",
            fresh.range.offset,
            fresh.range.len,
            fresh.size,
            fresh.block_size,
            fresh.algorithm,
            old.size,
            old.block_size,
            old.algorithm
        )));
    }
    Ok(())
}

struct Splicer<P, W: Output> {
    old: Blocks<P>,
    w: RecordWriter<W>,
    outer: Outer,
    differ: Vec<BlockRange>,
}

impl<P: Pieces, W: Output> Splicer<P, W> {
    fn put(&mut self, p: Piece<'_>) -> Result<(), MapError> {
        match p {
            Piece::Zeros(n) => {
                self.outer.zeros(n);
                self.w.zeros(n)?;
            }
            Piece::Data(d) => {
                self.outer.data(d);
                self.w.data(d)?;
            }
        }
        Ok(())
    }

    /// Copy the old map's next `n` blocks.
    fn copy_old(&mut self, mut n: u64) -> Result<(), MapError> {
        while n > 0 {
            let (_, k) = self.old.ready()?.ok_or(MapError::Truncated)?;
            let k = k.min(n);
            let p = self.old.take(k);
            match p {
                Piece::Zeros(c) => {
                    self.outer.zeros(c);
                    self.w.zeros(c)?;
                }
                Piece::Data(d) => {
                    self.outer.data(d);
                    self.w.data(d)?;
                }
            }
            n -= k;
        }
        Ok(())
    }

    /// Pass over the old map's blocks `r`, comparing those in `compare`
    /// with `fresh`'s.
    fn skip_old(
        &mut self,
        r: BlockRange,
        fresh: &Part,
        compare: &[BlockRange],
    ) -> Result<(), MapError> {
        let len = self.old.header().algorithm.output_len();
        let mut at = r.start;
        while at < r.end {
            let (_, k) = self.old.ready()?.ok_or(MapError::Truncated)?;
            let k = k.min(r.end - at);
            let p = self.old.take(k);
            for i in at..at + k {
                if !contains(compare, i) {
                    continue;
                }
                let old = match p {
                    Piece::Data(d) => Block::Data(&d[(i - at) as usize * len..][..len]),
                    Piece::Zeros(_) => Block::Zero,
                };
                if Some(old) != fresh.block(i) {
                    match self.differ.last_mut() {
                        Some(last) if last.end == i => last.end = i + 1,
                        _ => self.differ.push(i..i + 1),
                    }
                }
            }
            at += k;
        }
        Ok(())
    }

    /// Write `fresh`'s blocks `r`.
    fn copy_fresh(&mut self, fresh: &Part, r: BlockRange) -> Result<(), MapError> {
        let mut at = r.start;
        while at < r.end {
            let run = fresh.run_at(at).ok_or(MapError::Truncated)?;
            let end = (run.first + run.count).min(r.end);
            match run.digests {
                None => self.put(Piece::Zeros(end - at))?,
                Some(d) => {
                    let len = self.old.header().algorithm.output_len();
                    let from = (at - run.first) as usize * len;
                    let to = (end - run.first) as usize * len;
                    self.put(Piece::Data(&d[from..to]))?;
                }
            }
            at = end;
        }
        Ok(())
    }
}

/// Whether block `i` is in the ordered ranges `v`.
fn contains(v: &[BlockRange], i: u64) -> bool {
    let k = v.partition_point(|r| r.end <= i);
    v.get(k).is_some_and(|r| r.start <= i)
}
